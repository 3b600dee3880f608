"""Lab checks shared by the notebooks and the grader: one source of truth for every exercise's cases.

    from helpers.lab_checks import check
    check("03_moe_lab", permute_tokens)     # the spec's visible cases, with their hints

`check` runs the visible cases of the exercise's spec (helpers/runner/grading_specs.py) on the learner's
function exactly as the grader does (same call, same recording of forbidden functions, same judge), so a
check cell and `python -m helpers grade` cannot disagree. The grader adds hidden cases on a secret seed.

`call_case` is the one way an exercise function is called: through the case's harness (a function of
this module named by `Case.call`, which builds what cannot travel as tensors: a generator, a model, a
file path) while recording the forbidden functions it reaches: torch functions by name (torch.X,
torch.nn.functional.X, Tensor.X) and aten ops (torch.ops.aten.X, any alias that dispatches there), and
Python functions given by dotted path (helpers.moe.permute, torch.compile), recognised by their code
whatever name reaches them.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import tempfile
import threading
import warnings
from typing import Callable

import torch
from torch import nn

from helpers.checks import CheckFailed
from helpers.device import capabilities


# --- Calling an exercise function and recording what it calls --------------------------------------

def _code_keys(target) -> list[tuple[str, int]]:
    """(file, first line) of a function's code, or of every function defined in a class."""
    target = inspect.unwrap(target)
    if inspect.isclass(target):
        return [k for v in vars(target).values() if inspect.isfunction(v) for k in _code_keys(v)]
    code = getattr(target, "__code__", None)
    return [(code.co_filename, code.co_firstlineno)] if code is not None else []


def forbidden_code(forbidden) -> dict[tuple[str, int], str]:
    """The dotted names among `forbidden` (helpers.moe.permute), resolved to their code keys."""
    keys = {}
    for name in forbidden:
        if "." not in name:
            continue
        module, _, attr = name.rpartition(".")
        try:
            target = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):   # optional packages: nothing to forbid where absent
            continue
        for key in _code_keys(target):
            keys[key] = name
    return keys


class _TorchNames(torch.overrides.TorchFunctionMode):
    def __init__(self, names: set):
        super().__init__()
        self.names = names

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _AtenNames(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, names: set):
        super().__init__()
        self.names = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def harness(name: str | None) -> Callable:
    """The function that calls an exercise: `name` of this module, or a plain call."""
    return globals()[name] if name else (lambda fn, *args, **kwargs: fn(*args, **kwargs))


def record_calls(run: Callable[[], object], forbidden) -> tuple[object, list[str]]:
    """run() with the forbidden functions it reaches recorded; returns (its value, the names reached).
    Exceptions propagate. Recording is off when nothing is forbidden (torch.compile then runs as usual)."""
    if not forbidden:
        return run(), []
    names: set[str] = set()
    codes = forbidden_code(forbidden)
    plain = {n for n in forbidden if "." not in n}

    def profile(frame, event, arg):
        if event == "call":
            hit = codes.get((frame.f_code.co_filename, frame.f_code.co_firstlineno))
            if hit:
                names.add(hit)

    previous = sys.getprofile()
    if codes:
        sys.setprofile(profile)
        threading.setprofile(profile)
    try:
        if plain:
            with _TorchNames(names), _AtenNames(names):
                value = run()
        else:
            value = run()
    finally:
        if codes:
            sys.setprofile(previous)
            threading.setprofile(None)
    return value, sorted(n for n in names if n in set(forbidden))


def call_case(fn: Callable, args, kwargs, call: str | None, forbidden=()) -> dict:
    """One case as the grader sees it: {"value", "raised", "torch_calls"}; the value as returned (the
    sandbox makes it plain before it travels)."""
    record = {"value": None, "raised": None, "torch_calls": []}
    calls: list[str] = []

    def run():
        value, reached = record_calls(lambda: harness(call)(fn, *args, **kwargs), forbidden)
        calls.extend(reached)
        return value
    try:
        record["value"] = run()
    except BaseException as exc:   # a learner's function may raise anything, SystemExit included
        if type(exc).__name__ == "CellTimeout":
            raise
        record["raised"] = {"type": type(exc).__name__, "message": str(exc)[:500]}
    record["torch_calls"] = calls
    return record


def expected_result(exercise, case):
    """What the case expects: nothing (it expects an exception), its stated value, or the reference's
    result through the same harness."""
    if case.raises:
        return None
    if case.expect_value:
        return case.expected
    return harness(case.call)(exercise.reference, *case.args, **case.kwargs)


def check(lab: str, fn: Callable, function: str | None = None, seed: int = 0) -> None:
    """Run the visible cases of `lab`'s exercise for `fn` (by its name, or `function`); print a line per
    case, or raise CheckFailed with the first problem and its hint."""
    from helpers.runner.grade import judge_case
    from helpers.runner.grading_specs import spec_for
    name = function or fn.__name__
    exercise = next((e for e in spec_for(lab).exercises if e.function == name), None)
    if exercise is None:
        raise ValueError(f"{lab} has no exercise named {name!r}")
    for case in [c for c in exercise.cases(torch.Generator().manual_seed(seed)) if not c.hidden]:
        expected = expected_result(exercise, case)
        got = call_case(fn, case.args, case.kwargs, case.call, exercise.forbidden)
        problem = judge_case(exercise, case, expected, got)
        if problem is not None:
            raise CheckFailed(problem)
        print(f"✅ {exercise.title}: {case.name}: passed")


# --- Harnesses: how a case calls the exercise function (named by Case.call) -------------------------

def first(fn, *args, **kwargs):
    """The first element of what fn returns (e.g. the codes of (codes, scales))."""
    return fn(*args, **kwargs)[0]


def second(fn, *args, **kwargs):
    return fn(*args, **kwargs)[1]


def dtype_of_first(fn, *args, **kwargs) -> str:
    return str(fn(*args, **kwargs)[0].dtype)


def first_as_float(fn, *args, **kwargs) -> torch.Tensor:
    return fn(*args, **kwargs)[0].float()


def dtype_of(fn, *args, **kwargs) -> str:
    return str(fn(*args, **kwargs).dtype)


# lab 01: data loading

def serial_items(fn, images, seed):
    """fn(image, rng) over the images in order, item i with data.item_generator(seed, i)."""
    from helpers.data import item_generator
    return [fn(image, item_generator(seed, i)) for i, image in enumerate(images)]


def threaded_runs(fn, images, seed, workers, runs):
    """`runs` runs of fn(image, rng) on `workers` threads (items seeded by index): a list per run."""
    from concurrent.futures import ThreadPoolExecutor

    from helpers.data import item_generator
    with ThreadPoolExecutor(workers) as pool:
        return [list(pool.map(lambda i: fn(images[i], item_generator(seed, i)), range(len(images))))
                for _ in range(runs)]


def globals_written(fn, images, seed) -> list[str]:
    """The module-level tensors of fn's notebook (or module) that a serial run of fn changed, compared
    after every call: an earlier case's run may have left a buffer as this run's last call leaves it."""
    from helpers.data import item_generator

    def same(a, b):
        return torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and
                                     torch.equal(a.nan_to_num(), b.nan_to_num()))
    tensors = {k: v for k, v in fn.__globals__.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in tensors.items()}
    written = set()
    for i, image in enumerate(images):
        fn(image, item_generator(seed, i))
        written |= {k for k, v in tensors.items() if k not in written and
                    (v.shape != before[k].shape or not same(v, before[k]))}
    return sorted(written)


def bounded_and_threaded(fn, images, workers, seed) -> bool:
    """fast_pipeline runs the notebook's `augment` on more than one thread, never more than `workers`
    calls at once."""
    import time
    namespace = fn.__globals__
    inner = namespace["augment"]
    lock, state = threading.Lock(), {"now": 0, "most": 0, "threads": set()}

    def counted(image, rng):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            state["threads"].add(threading.get_ident())
        try:
            time.sleep(0.002)      # long enough for an unbounded pool to overlap more calls
            return inner(image, rng)
        finally:
            with lock:
                state["now"] -= 1
    namespace["augment"] = counted
    try:
        fn(images, workers, seed=seed)
    finally:
        namespace["augment"] = inner
    return state["most"] <= workers and len(state["threads"]) > 1


# lab 02: fusion

def no_args(fn):
    return fn()


def kernel_counts() -> dict[str, int]:
    """Exercise 3's reference: the cpp_fused_* functions the compiled wrapper of each function calls. Here,
    not in the grading specs: torch.compile reads the source of the frames on its stack, and the sandbox
    refuses that file."""
    from helpers import fusion
    return {name: len(fusion.inspect_compiled(fn, *args).kernel_functions)
            for name, (fn, args) in kernel_count_cases().items()}


def kernel_count_cases() -> dict:
    """Exercise 3's four functions and their inputs, name -> (function, args), as the notebook shows them."""
    x, w = torch.randn(64, 128), torch.randn(128, 32)
    return {"chain": (_chain, (x,)), "independent": (_independent, (x, torch.randn(1000))),
            "center": (_center, (x,)), "matmul_between": (_matmul_between, (x, w))}


def _chain(x):
    return ((x * 2 + 1).sin() * 3).relu()


def _independent(a, b):
    return a.sin(), b.cos()


def _center(x):
    return x - x.mean(dim=-1, keepdim=True)


def _matmul_between(x, w):
    return torch.relu((x * 2) @ w) + 1


def triton_launch(fn, xs):
    """fn(xs), lab 02's launch_three_part, where its Triton kernel runs: CPU tensors under Triton's
    interpreter (TRITON_INTERPRET=1, which the lab sets on a CPU), else tensors on the GPU (NVIDIA, AMD or
    Intel); returns CPU tensors.
    The notebook's combo_grid is the reference one meanwhile: exercise 2 (the kernel body) is graded on
    its own, whatever exercise 1 gives."""
    from helpers.fusion import combo_grid
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None)
    interpret = bool(knobs.runtime.interpret) if knobs is not None else \
        os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    accelerator = capabilities().device_type
    device = accelerator if not interpret and accelerator in ("cuda", "xpu") else "cpu"
    namespace = getattr(fn, "__globals__", {})
    missing = object()
    own_grid = namespace.get("combo_grid", missing)
    if own_grid is not missing:
        namespace["combo_grid"] = combo_grid
    try:
        out = fn([x.to(device) for x in xs])
    finally:
        if own_grid is not missing:
            namespace["combo_grid"] = own_grid
    return [o.cpu() if isinstance(o, torch.Tensor) else o for o in out] if isinstance(out, (list, tuple)) else out


# lab 04: the C++ custom op

def _is_silu_mul_reference(fn, function: str) -> bool:
    specs = sys.modules.get("helpers.runner.grading_specs")   # never imported in a submission's sandbox
    return specs is not None and any(e.function == function and e.reference is fn
                                     for e in specs.spec_for("04_custom_op_lab").exercises)


def silu_mul_kernel(fn, gate, up):
    """Build the body fn() returns into the op's CPU kernel, then run the op. The spec's reference body
    is not built: its values are the PyTorch reference's. (Loading a library a second time registers
    nothing, so building the reference between two cases would leave the learner's kernel in place and
    compare it with itself; and the grader needs no compiler for the expected values.)"""
    from helpers.ext import lab
    if _is_silu_mul_reference(fn, "silu_mul_body"):
        return lab.silu_mul_reference(gate, up)
    lab.build_kernel(fn())
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))    # so at::parallel_for splits a large input into chunks
    try:
        return torch.ops.labs_ext.silu_mul(gate, up)
    finally:
        torch.set_num_threads(threads)


def on_meta(fn, gate, up):
    """fn on meta tensors with the inputs' shapes, strides and dtypes: (shape, strides, dtype)."""
    meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (gate, up)]
    out = fn(*meta)
    return list(out.shape), list(out.stride()), str(out.dtype)


def backward_of(fn, gate, up, grad):
    """fn(ctx, grad) with ctx holding (gate, up), as setup_context saves them."""
    ctx = type("Ctx", (), {"saved_tensors": (gate, up), "needs_input_grad": (True, True)})()
    return tuple(fn(ctx, grad))


class _silu_mul_reference_kernel:
    """Exercise 4 is graded on its own: while its cases run, the PyTorch reference is the op's CPU kernel,
    whatever exercise 1 registered (a wrong kernel, or none); the previous kernel is back afterwards."""
    def __enter__(self):
        from helpers.ext import lab
        self.lib = torch.library.Library("labs_ext", "IMPL")
        with warnings.catch_warnings():    # "Overriding a previously registered kernel": on purpose
            warnings.simplefilter("ignore")
            self.lib.impl("silu_mul", lab.silu_mul_reference, "CPU", allow_override=True)

    def __exit__(self, *exc):
        self.lib._destroy()


def swiglu_values(fn, x, w_gate, w_up, w_down):
    with _silu_mul_reference_kernel():
        return fn(x, w_gate, w_up, w_down)


def compiled_with_grads(fn, x, w_gate, w_up, w_down):
    """fn compiled with fullgraph=True (aot_eager: tracing, fake kernel, autograd); its output and the
    gradients of x and the three weights. The spec's reference runs eagerly: compiling it would make
    Dynamo read grading_specs.py, which a check cell in the grader's sandbox may not open."""
    with _silu_mul_reference_kernel():
        torch._dynamo.reset()
        inputs = [t.clone().requires_grad_() for t in (x, w_gate, w_up, w_down)]
        run = fn if _is_silu_mul_reference(fn, "swiglu_mlp") else torch.compile(fn, backend="aot_eager", fullgraph=True)
        out = run(*inputs)
        out.sum().backward()
        return [out.detach()] + [t.grad for t in inputs]


def uses_silu_mul(fn, x, w_gate, w_up, w_down) -> bool:
    names: set[str] = set()
    with _silu_mul_reference_kernel(), _AtenNames(names):
        fn(x, w_gate, w_up, w_down)
    return "silu_mul" in names


# lab 05: quantization

class ChannelScale(nn.Module):
    """Multiplies each channel by a fixed factor (like a normalization layer's weight)."""
    def __init__(self, factor: torch.Tensor):
        super().__init__()
        self.register_buffer("factor", factor)

    def forward(self, x):
        return x * self.factor


def quant_lab_model(width: int, seed: int = 0) -> nn.Module:
    """Lab 05's classifier: each hidden layer's output channels scaled by r (spread over 1000x) and
    scaled back by 1 / r after the ReLU: the same function, but weight rows that differ by 1000x."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers = [nn.Linear(width, 4 * width), nn.Linear(4 * width, 4 * width)]
        head = nn.Linear(4 * width, 4)
    blocks = []
    with torch.no_grad():
        for layer in layers:
            r = torch.logspace(-1.5, 1.5, layer.out_features)[torch.randperm(layer.out_features, generator=gen)]
            layer.weight.mul_(r[:, None])
            layer.bias.mul_(r)
            blocks += [layer, nn.ReLU(), ChannelScale(1 / r)]
    return nn.Sequential(*blocks, head).eval()


def activation_dtype_of_int8_kernel(fn, *args) -> str:
    """The dtype of the activations fn hands to torch._weight_int8pack_mm ("not called" if it does not)."""
    seen: list[str] = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            if func.overloadpacket.__name__ == "_weight_int8pack_mm":
                seen.append(str(a[0].dtype))
            return func(*a, **(kw or {}))
    with Spy():
        fn(*args)
    return seen[0] if seen else "not called"


def _quantized(fn, width, seed, nested=False):
    model = quant_lab_model(width, seed)
    if nested:      # the Linears one level down: only a recursive walk reaches them
        model = nn.Sequential(model).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return model, state, fn(model)


def linears_left(fn, width, seed, nested=False) -> int:
    return sum(isinstance(m, nn.Linear) for m in _quantized(fn, width, seed, nested)[2].modules())


def original_untouched(fn, width, seed) -> bool:
    model, state, _ = _quantized(fn, width, seed)
    return all(isinstance(m, (nn.Linear, nn.ReLU, ChannelScale, nn.Sequential)) for m in model.modules()) and \
        all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def agreement_with_fp32(fn, width, seed, n_inputs) -> bool:
    """The quantized model's argmax agrees with fp32's on at least 97% of random inputs: per-channel int8
    keeps 98% or more on every seed tried, per-tensor scales 92% at most."""
    model, _, quantized = _quantized(fn, width, seed)
    inputs = torch.randn(n_inputs, width, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        agree = (quantized(inputs).argmax(-1) == model(inputs).argmax(-1)).float().mean().item()
    return agree >= 0.97


def at_least_3x_smaller(fn, width, seed) -> bool:
    from helpers.quant import model_bytes
    model, _, quantized = _quantized(fn, width, seed)
    return model_bytes(quantized) * 3 < model_bytes(model)


# lab 06: attention

def broadcast_mask(fn, lengths, max_len, heads):
    """The mask broadcast to (batch, heads, max_len, max_len), as SDPA broadcasts it."""
    mask = fn(lengths, max_len)
    return mask.expand(len(lengths), heads, max_len, max_len)


def backend_of(fn, q, k, v, **kwargs) -> str:
    from helpers.attention import backend_from_ops
    return backend_from_ops(fn(q, k, v, **kwargs))


def padded_attention_calls(fn, *args, **kwargs) -> list[list[int]]:
    """fn(*args, **kwargs) with the sequence lengths of each attention.padded_attention call it makes
    recorded: a list per call, in call order (how a bucketing function's buckets are seen)."""
    from helpers import attention
    code = attention.padded_attention.__code__
    buckets: list[list[int]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            buckets.append([s.shape[0] for s in frame.f_locals["seqs"]])
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return buckets


def buckets_are_sorted_runs(fn, seqs, n_buckets) -> bool:
    """The lengths of each attention.padded_attention call fn makes: n_buckets calls (fewer only when
    there are fewer sequences), each a run of consecutive lengths in sorted order."""
    buckets = sorted((b for b in padded_attention_calls(fn, seqs, n_buckets) if b), key=min)
    ordered = all(max(a) <= min(b) for a, b in zip(buckets, buckets[1:]))
    return ordered and len(buckets) == min(n_buckets, len(seqs)) and sum(map(len, buckets)) == len(seqs)


# lab 07: memory

def memory_lab_model(width, depth, frozen, dtype) -> nn.Module:
    """memory.mlp(width, depth) in `dtype` with its first `frozen` layers frozen (requires_grad=False)."""
    from helpers.memory import mlp
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = mlp(width, depth).to(getattr(torch, dtype))
    for layer in list(model)[:frozen]:
        layer.requires_grad_(False)
    return model


def predict_for(fn, width, depth, frozen, dtype):
    return fn(memory_lab_model(width, depth, frozen, dtype))


def accumulated_grads(fn, width, depth, batch, micro, seed, stale_grads=False):
    """fn(model, x, y, micro) on a fresh model; the gradients it leaves (a list, None where absent).
    stale_grads: the parameters start with gradients from an earlier step."""
    from helpers.memory import mlp
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = mlp(width, depth)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)
    if stale_grads:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
    fn(model, x, y, micro)
    return [p.grad for p in model.parameters()]


# lab 08: debugging

def grad_of_sum(fn, v, **kwargs):
    """The gradient of fn(v).sum() with respect to v."""
    v = v.clone().requires_grad_()
    fn(v, **kwargs).sum().backward()
    return v.grad


def recompiles(fn, sizes) -> int:
    """A compiled step called on fn(batch) for each batch size in turn: the number of recompiles."""
    from helpers.debugging import count_recompiles
    torch._dynamo.reset()
    step = torch.compile(lambda b: torch.tanh(b @ b.T).sum(), backend="eager")
    return len(count_recompiles(lambda: [step(fn(torch.randn(n, 16))) for n in sizes]))


def debugging_lab_net(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))


def exported_outputs(fn, seed, example_batch, batches):
    """fn(net, example, path) exports, saves and reloads the net; the reloaded module's outputs on
    each batch size in `batches`."""
    net = debugging_lab_net(seed)
    gen = torch.Generator().manual_seed(seed)
    example = torch.randn(example_batch, 16, generator=gen)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reloaded = fn(net, example, os.path.join(tmp, "net.pt2"))
        with torch.no_grad():
            return [reloaded(torch.randn(n, 16, generator=gen)) for n in batches]


# lab 09: migration

def interval_of(fn, *args, **kwargs):
    """The (low, high) of what fn returns as (gain, low, high)."""
    _, low, high = fn(*args, **kwargs)
    return float(low), float(high)
