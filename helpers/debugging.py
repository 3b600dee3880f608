"""Debugging and determinism: DebugMode traces and hash divergence, compile recompiles, a 2-process gloo job.

    trace = debugging.hash_trace(model, x)                   # [(op name, hash), ...] via DebugMode
    debugging.first_divergence(trace_a, trace_b)             # where two runs start to differ
    debugging.op_modules(model, x)[i]                        # the submodule that ran op i of the trace
    debugging.run_gloo_job("mismatched_shapes", timeout_s=3) # {"rank 0": "...error text...", ...}

DebugMode is `torch.utils._debug_mode.DebugMode` (new in 2.10, private: its module may move). The gloo
job runs two processes on 127.0.0.1 only, with a collective timeout and a hard wall-clock limit, so it
can never hang.
"""
from __future__ import annotations

import math
import os
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from helpers import bench


# --- DebugMode: op traces and tensor hashes ----------------------------------------------------

def op_trace(fn: Callable, *args) -> str:
    """The aten ops fn(*args) dispatches, as DebugMode prints them."""
    from torch.utils._debug_mode import DebugMode
    with DebugMode() as mode:
        fn(*args)
    return mode.debug_string()


def hash_trace(fn: Callable, *args, hash_fn: str = "norm") -> list[tuple[str, tuple[float | int, ...]]]:
    """One (op name, output hashes) pair per dispatched aten op, from DebugMode.log_tensor_hashes.

    hash_fn "norm" is a float summary (the L1 norm) that moves a little for a little numeric change;
    "hash_tensor" is torch.hash_tensor, an XOR over the bits of every element, kept as the 64-bit int it
    is (as a float it would lose the low bits, where a 1-ulp change of a float64 value lands). Different
    hashes mean different bits; equal hashes do not prove equal bits (an XOR cancels equal pairs).
    Only aten ops are kept: the Triton kernels DebugMode logs on a GPU carry their hashes elsewhere
    (`post_hashes`), and DebugMode.check_hash_mismatches(mode.logs, ...) compares those."""
    from torch.utils._debug_mode import DebugMode
    with DebugMode() as mode, DebugMode.log_tensor_hashes(hash_fn=hash_fn):
        fn(*args)
    trace = []
    for call in mode.operators:
        if call.log and "hash" in call.log:
            hashes = tuple(h if isinstance(h, int) else float(h) for h in tree_leaves(call.log["hash"])
                           if h is not None)
            trace.append((str(getattr(call, "op", call)), hashes))
    return trace


def op_modules(model: torch.nn.Module, *args) -> list[str]:
    """For each op hash_trace(model, *args) records, in the same order, the innermost submodule that ran
    it: its name in model.named_modules() ("" for model itself). DebugMode(record_nn_module=True) prints
    the same as "[nn.Mod]" lines; plain forward hooks read it here because DebugMode's log entries for
    modules changed class after 2.10."""
    from torch.utils._debug_mode import DebugMode
    stack = [""]

    def enter(name):
        return lambda module, inputs: stack.append(name)       # returns None: the inputs stay as they are

    def leave(module, inputs, output):
        stack.pop()                                             # returns None: the output stays as it is

    handles = []
    for name, module in model.named_modules():
        handles += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave)]

    def where(func, types, args, kwargs, result):
        return {"module": stack[-1]}

    try:
        with (DebugMode() as mode, DebugMode.log_tensor_hashes(),
              DebugMode.dispatch_hooks(log_hook=where)):
            model(*args)
    finally:
        for handle in handles:
            handle.remove()
    return [call.log["module"] for call in mode.operators if call.log and "hash" in call.log]


def _same_ops(a: list, b: list) -> None:
    if [name for name, _ in a] != [name for name, _ in b]:
        names_a, names_b = [n for n, _ in a], [n for n, _ in b]
        i = next((i for i, (x, y) in enumerate(zip(names_a, names_b)) if x != y), min(len(a), len(b)))
        raise ValueError(f"the runs dispatched different ops (first at index {i}: "
                         f"{names_a[i] if i < len(a) else 'end'} vs {names_b[i] if i < len(b) else 'end'}); "
                         f"compare runs of the same program")


def first_divergence(a: list, b: list, rtol: float = 0.0) -> dict | None:
    """The first op whose output hashes differ by more than rtol (relative); None if none does.
    Raises ValueError when the two runs did not dispatch the same ops (different programs)."""
    _same_ops(a, b)
    for i, ((name, ha), (_, hb)) in enumerate(zip(a, b)):
        for x, y in zip(ha, hb):
            rel = abs(x - y) / max(abs(x), abs(y), 1e-30)
            if rel > rtol or (math.isnan(x) != math.isnan(y)):
                return {"index": i, "op": name, "hash_a": x, "hash_b": y, "rel_diff": rel}
    return None


def op_differences(a: list, b: list) -> list[dict]:
    """Every op with the largest relative difference between the two runs' output hashes (0.0 where
    they are equal): the whole picture, where first_divergence gives the first op past a threshold.
    Raises ValueError when the two runs did not dispatch the same ops."""
    _same_ops(a, b)
    return [{"index": i, "op": name,
             "rel_diff": max((abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(ha, hb)), default=0.0)}
            for i, ((name, ha), (_, hb)) in enumerate(zip(a, b))]


# --- Autograd anomaly detection ----------------------------------------------------------------

def backward_error(loss_fn: Callable[[], torch.Tensor]) -> str | None:
    """Run loss_fn().backward() under torch.autograd.detect_anomaly; the error text, or None."""
    try:
        with torch.autograd.detect_anomaly():
            loss_fn().backward()
    except RuntimeError as exc:
        return str(exc)
    return None


# --- torch.compile: recompiles and generated code ----------------------------------------------

def count_recompiles(fn: Callable[[], object]) -> list[str]:
    """Run fn and return the guard-failure reasons of every recompile it triggered (the messages
    TORCH_LOGS=recompiles prints; here collected instead of printed)."""
    import logging

    reasons: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            reasons.append(record.getMessage())

    torch._logging.set_logs(recompiles=True)
    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    saved = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [Collect()], False
    try:
        fn()
    finally:
        logger.handlers, logger.propagate = saved
        torch._logging.set_logs()
    return reasons


def inductor_code(fn: Callable, *args) -> str:
    """The Python/C++ source Inductor generated for fn(*args) (compiled fresh)."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(fn), *args)
    return "\n".join(code)


# --- A 2-process gloo job on 127.0.0.1 ---------------------------------------------------------

def run_gloo_job(scenario: str, *, world_size: int = 2, timeout_s: float = 3.0, wall_limit_s: float = 60.0,
                 env: dict | None = None) -> dict:
    """Run `scenario` on `world_size` gloo processes on 127.0.0.1; returns, per rank, the status, the
    text of its result or error, and what it printed to stderr (C++ aborts land there).

    The ranks are spawned by a separate launcher process (`python -m helpers.gloo`, which imports no
    torch: one torch process fewer beside the notebook's kernel and the two ranks), so nothing of
    the job (processes, queues, pipes) lives in the caller, e.g. a notebook kernel; the launcher's whole
    process group is killed after wall_limit_s. timeout_s: the process group's collective timeout.
    env: extra environment for the ranks (e.g. TORCH_DISTRIBUTED_DEBUG), set before they start because
    torch reads some switches at import.
    """
    import json
    import signal
    import subprocess
    import sys
    from helpers.gloo import SCENARIOS
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; use one of {', '.join(SCENARIOS)}")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        raise RuntimeError("this torch build has no gloo backend (torch.distributed.is_gloo_available() is False)")
    cmd = [sys.executable, "-m", "helpers.gloo", scenario, str(world_size), str(timeout_s), str(wall_limit_s)]
    launcher = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, **(env or {})}, start_new_session=True, text=True,
                                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out, err = launcher.communicate(timeout=wall_limit_s + 30)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()
        return {f"rank {r}": {"status": "killed", "text": f"job still running after {wall_limit_s:.0f} s",
                              "stderr": []} for r in range(world_size)}
    if launcher.returncode != 0:
        raise RuntimeError(f"the gloo launcher failed (exit {launcher.returncode}): {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


# --- TorchScript deprecation -------------------------------------------------------------------

def torchscript_warnings(module: torch.nn.Module, example: torch.Tensor, path: str) -> list[str]:
    """Script, trace, save and load `module`; return the warnings torch emitted, in order, once each."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.script(module)
        traced = torch.jit.trace(module, example)
        torch.jit.save(traced, path)
        torch.jit.load(path)
    seen: list[str] = []
    for w in caught:
        line = f"{w.category.__name__}: {w.message}"
        if line not in seen:
            seen.append(line)
    return seen


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench debugging`: what DebugMode and anomaly detection cost on a small MLP."""
    from torch.utils._debug_mode import DebugMode
    width = 64 if quick else 256
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 1))
    x = torch.randn(32, width)

    def plain():
        model(x).sum().backward()

    def debug_mode():
        with DebugMode():
            model(x).sum().backward()

    def hashes():
        with DebugMode(), DebugMode.log_tensor_hashes():
            model(x).sum().backward()

    def anomaly():
        with torch.autograd.detect_anomaly(check_nan=True):
            model(x).sum().backward()

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # detect_anomaly warns on every entry
        return bench.compare({"plain": plain, "DebugMode": debug_mode, "DebugMode + hashes": hashes,
                              "detect_anomaly": anomaly}, repeats=3 if quick else 5,
                             min_run_time=0.02 if quick else 0.1, device="cpu")
