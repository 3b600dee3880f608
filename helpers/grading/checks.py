"""Lab checks shared by the notebooks and the grader: one source of truth for every exercise's cases.

    from helpers.grading.checks import check
    check("03_moe_lab", permute_tokens)     # the spec's visible cases, with their hints

`check` runs the visible cases of the exercise's spec (helpers/grading/specs.py) on the learner's
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

import _thread
import contextlib
import importlib
import inspect
import math
import os
import re
import sys
import tempfile
import threading
import warnings
import weakref
from concurrent.futures import thread as futures_thread
from typing import Callable

import torch
from torch import nn

from helpers.checks import STUB_TEXT, CheckFailed
from helpers.grading.judge import RECORDER_OFF, judge_case, plain_name
from helpers.device import capabilities


# --- Calling an exercise function and recording what it calls --------------------------------------

def _code_keys(target) -> list:
    """The keys of a function's code, or of every function defined in a class: (file, first line); for a
    function of some size, also its code's body (bytecode, names, constants), which a copy compiled from the
    same source under another file name shares (short bodies, and a class's methods, are too common to tell
    a copy from a learner's own code)."""
    target = inspect.unwrap(target)
    if inspect.isclass(target):
        members = [inspect.unwrap(v) for v in vars(target).values() if inspect.isfunction(v)]
        return [(v.__code__.co_filename, v.__code__.co_firstlineno) for v in members if hasattr(v, "__code__")]
    code = getattr(target, "__code__", None)
    if code is None:
        return []
    return [(code.co_filename, code.co_firstlineno)] + ([_body(code)] if len(code.co_code) >= MIN_BODY_BYTES else [])


MIN_BODY_BYTES = 120


def _body(code) -> tuple:
    return code.co_code, code.co_names, tuple(c for c in code.co_consts if not inspect.iscode(c))


# Python functions that compute a torch op of the same name without dispatching it (decompositions), and
# other libraries' one-liners: forbidding the op forbids these too.
ALIAS_MODULES = ("torch._refs", "torch._refs.nn.functional", "torch._refs.special", "torch._decomp.decompositions",
                 "scipy.special")


def forbidden_code(forbidden) -> dict:
    """The Python functions among `forbidden`, by their code keys: dotted names (helpers.moe.permute), and for
    each op name (softmax) its decompositions and other libraries' functions of that name (ALIAS_MODULES)."""
    keys = {}
    for name in forbidden:
        if "." in name:
            module, _, attr = name.rpartition(".")
            candidates = [(module, attr)]
        else:
            candidates = [(module, name) for module in ALIAS_MODULES]
        for module, attr in candidates:
            try:
                with warnings.catch_warnings():   # a module's import-time warning is not the learner's output
                    warnings.simplefilter("ignore")
                    target = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):   # optional packages: nothing to forbid where absent
                continue
            for key in _code_keys(target):
                keys[key] = name
    return keys


THREAD_STARTS = ((threading, "_start_new_thread"), (_thread, "start_new_thread"),
                 (threading, "_start_joinable_thread"), (_thread, "start_joinable_thread"))


class _TorchNames(torch.overrides.TorchFunctionMode):
    def __init__(self, names: set):
        super().__init__()
        self.names = names

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


BATCHED_MATMULS = ("bmm", "baddbmm")


class _AtenNames(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, names: set):
        super().__init__()
        self.names = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        # a batch of one is a plain matmul: what einsum and matmul run on two-dimensional operands
        operand = args[1] if name == "baddbmm" and len(args) > 1 else args[0] if args else None
        if not (name in BATCHED_MATMULS and isinstance(operand, torch.Tensor) and operand.dim() == 3
                and operand.shape[0] == 1):
            self.names.add(name)
        return func(*args, **(kwargs or {}))


def harness(name: str | None) -> Callable:
    """The function that calls an exercise: `name` of this module, or a plain call."""
    return globals()[name] if name else (lambda fn, *args, **kwargs: fn(*args, **kwargs))


def record_calls(run: Callable[[], object], forbidden) -> tuple[object, list[str]]:
    """run() with the forbidden functions it reaches recorded, on its own thread and on every thread it
    starts and in thread pools; returns (its value, the names reached). torch's mode stacks found without
    the recorder at the end are reported as RECORDER_OFF. Exceptions propagate. Recording is off when nothing is forbidden (torch.compile
    then runs as usual)."""
    if not forbidden:
        return run(), []
    names: set[str] = set()
    codes = forbidden_code(forbidden)
    plain = {n for n in forbidden if "." not in n}

    def profile(frame, event, arg):
        if event == "call":
            hit = codes.get((frame.f_code.co_filename, frame.f_code.co_firstlineno)) or codes.get(_body(frame.f_code))
            if hit:
                names.add(hit)

    def recorded(function):
        """function, run on a new thread with the same recording (modes and profile are per thread)."""
        def on_thread(*args, **kwargs):
            if codes:
                sys.setprofile(profile)
            with (_TorchNames(names) if plain else contextlib.nullcontext()), \
                    (_AtenNames(names) if plain else contextlib.nullcontext()):
                return function(*args, **kwargs)
        return on_thread

    # what starts a thread: start_new_thread, and from Python 3.13 on start_joinable_thread (which threading uses)
    starts = {(module, name): getattr(module, name) for module, name in THREAD_STARTS if hasattr(module, name)}
    work_item_run = futures_thread._WorkItem.run

    def recording_start(start):
        return lambda function, *args, **kwargs: start(recorded(function), *args, **kwargs)

    def run_work_item(item):   # a thread pool's worker started before the call
        return recorded(work_item_run)(item)

    previous = sys.getprofile()
    for (module, name), start in starts.items():
        setattr(module, name, recording_start(start))
    futures_thread._WorkItem.run = run_work_item
    if codes:
        sys.setprofile(profile)
    try:
        if plain:
            with _TorchNames(names) as torch_names, _AtenNames(names) as aten_names:
                value = run()
                if not (_on_stack(torch_names, torch.overrides._get_current_function_mode_stack()) and
                        _on_stack(aten_names, torch.utils._python_dispatch._get_current_dispatch_mode_stack())):
                    names.add(RECORDER_OFF)
        else:
            value = run()
    finally:
        for (module, name), start in starts.items():
            setattr(module, name, start)
        futures_thread._WorkItem.run = work_item_run
        if codes:
            sys.setprofile(previous)
    return value, sorted(n for n in names if n in set(forbidden) or n == RECORDER_OFF)


def _on_stack(mode, stack) -> bool:
    return any(m is mode for m in stack)


def is_untouched_stub(fn) -> bool:
    """Whether fn is still the lab's stub: its code raises NotImplementedError with the stub's text."""
    code = getattr(fn, "__code__", None)
    return code is not None and "NotImplementedError" in code.co_names and \
        any(isinstance(c, str) and c.endswith(STUB_TEXT) for c in code.co_consts)


def call_case(fn: Callable, args, kwargs, call: str | None, forbidden=()) -> dict:
    """One case as the grader sees it: {"value", "raised", "torch_calls"}; the value as returned (the
    sandbox makes it plain before it travels). An untouched stub is not called (a harness could describe a
    failure it never had): it raised NotImplementedError, as it would."""
    record = {"value": None, "raised": None, "torch_calls": []}
    if is_untouched_stub(fn):
        record["raised"] = {"type": "NotImplementedError", "message": f"not started{STUB_TEXT}"}
        return record
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
    from helpers.grading.specs import spec_for
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


def third_as_int64(fn, *args, **kwargs) -> torch.Tensor:
    """The third element of what fn returns, as int64 (its values judged apart from its dtype)."""
    return torch.as_tensor(fn(*args, **kwargs)[2]).long()


def dtype_of_third(fn, *args, **kwargs) -> str:
    return str(fn(*args, **kwargs)[2].dtype)


# What a function that needs its tensors' values on the host raises on the meta device (shapes, no data)
META_REFUSALS = (("cannot be called on meta tensors", ".item(), int(), float(), bool() or an `if` on a tensor"),
                 ("Cannot copy out of meta tensor", ".tolist(), .numpy() or another copy to the host"),
                 ("without output_size", "repeat_interleave without output_size"),
                 ("same device", "a tensor made on another device inside the function (give it device=)"))


NO_HOST_READS = "nothing read back to the host"


def host_reads_of(fn, *args, **kwargs) -> str:
    """What fn needs from its tensors' values on the host (each a sync on a GPU), found by running it on the meta
    device, where tensors have shapes but no data: .item(), int(), an `if` on a tensor, .tolist(), and every op
    whose output size depends on the data (bincount, nonzero, unique, ...) cannot run there. The same answer on
    every device, decided by what fn needs, not by which op it calls: F.one_hot(ids, n) needs nothing,
    torch.unique(return_counts=True) needs the data. NO_HOST_READS when fn runs on meta, else what it read."""
    from torch.utils._pytree import tree_map
    on_meta = tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, (args, kwargs))
    try:
        fn(*on_meta[0], **on_meta[1])
    except Exception as exc:
        message = str(exc)
        op = re.search(r"(aten::\w+)", message)
        named = next((what for text, what in META_REFUSALS if text in message), None)
        return "reads back to the host: " + (named or (f"{op.group(1)} (its output size depends on the data)" if op
                                                       else f"{type(exc).__name__} on the meta device: {message[:120]}"))
    return NO_HOST_READS


def uninitialized_is_nan(fn, *args, **kwargs):
    """fn with every uninitialised allocation (torch.empty, new_empty, empty_like) filled with NaN, so that
    rows a function never writes show as NaN every time, not as whatever the memory held."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        return fn(*args, **kwargs)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.utils.deterministic.fill_uninitialized_memory = previous[2]


# lab 00: warm-up

def softmax_on_meta(fn, x, **kwargs) -> tuple:
    """fn on a meta tensor like x (shape and dtype, no values, no device memory): where, with what shape
    and dtype, its result lives. Code that makes a tensor on a fixed device, or reads a value back to
    Python (bool(), .item(), a Python `if` on a tensor), fails here as it would cost or fail on an
    accelerator."""
    out = fn(torch.empty(x.shape, dtype=x.dtype, device="meta"), **kwargs)
    return (out.device.type, list(out.shape), str(out.dtype)) if isinstance(out, torch.Tensor) else \
        (type(out).__name__,)


# lab 01: data loading

LAB01_BLUR = (torch.outer(torch.tensor([1.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 1.0])) / 16).expand(3, 1, 3, 3)
LAB01_WAIT_S = 3.0       # how long a call waits for other calls that a right answer starts at once; a right
                         # answer never waits it out, a wrong one (too few threads) waits it once


def _slow_augment(image):
    """Lab 01's given slow_augment (global RNG, a scratch buffer), run here, in the learner's process and
    with the learner's torch: the reference an augment must equal bit for bit."""
    import torch.nn.functional as F
    scratch = torch.empty(image.shape)
    flip = bool(torch.rand(()) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand(()))
    torch.mul(image, gain / 255.0, out=scratch)
    x = scratch.flip(-1) if flip else scratch
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), LAB01_BLUR, groups=3)[0].clone()


def _bit_equal(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def global_rng_use(fn, images, seed) -> str:
    """Whether fn(image, rng) over the images moved torch's global random generator."""
    from helpers.data import item_generator
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(20261202)
        before = torch.get_rng_state()
        for i, image in enumerate(images):
            fn(image, item_generator(seed, i))
        moved = not torch.equal(before, torch.get_rng_state())
    return "draws from the global RNG" if moved else "draws only from rng"


def not_bit_equal(fn, images, seed) -> str:
    """The items i where fn(image, data.item_generator(seed, i)) is not bit-for-bit slow_augment(image)
    with the global RNG seeded for item i (torch.manual_seed(data.item_seed(seed, i)), as slow_pipeline
    does)."""
    from helpers.data import item_generator, item_seed
    differ = []
    with torch.random.fork_rng(devices=[]):
        for i, image in enumerate(images):
            torch.manual_seed(item_seed(seed, i))
            want = _slow_augment(image)
            if not _bit_equal(fn(image, item_generator(seed, i)), want):
                differ.append(i)
    return f"items {differ} differ from slow_augment's" if differ else "every item bit-for-bit equal"


def globals_written(fn, images, seed) -> str:
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
    return f"writes into {', '.join(sorted(written))}" if written else "writes into no module-level tensor"


class _AfterOperation(torch.overrides.TorchFunctionMode):
    """Calls `between()` once, right after the k-th torch operation (0-based) of the code run under it."""
    def __init__(self, k: int, between: Callable[[], None]):
        super().__init__()
        self.k, self.between, self.seen, self.fired = k, between, 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.seen == self.k:
            self.fired = True
            self.between()
        self.seen += 1
        return out


def changed_by_a_call_between(fn, images, seed) -> str:
    """The race of two threads, made to happen every time. Each item is computed alone; then again once
    for every torch operation k of its call, with a whole call on the next item run on another thread
    right after operation k (the first call waits for it, up to a second): what a second thread does to a
    first one that the scheduler pauses there. Returns the items whose result changed at any k. A call
    that shares nothing (a buffer, a generator) with other calls cannot change."""
    from helpers.data import item_generator
    alone = [fn(image, item_generator(seed, i)) for i, image in enumerate(images)]
    changed = []
    for i, image in enumerate(images):
        j = (i + 1) % len(images)
        for k in range(500):
            others: list[threading.Thread] = []

            def between():
                other = threading.Thread(target=fn, args=(images[j], item_generator(seed, j)), daemon=True)
                other.start()
                other.join(1.0)           # a lock held by this call may keep the other waiting: go on
                others.append(other)
            pause = _AfterOperation(k, between)
            with pause:
                out = fn(image, item_generator(seed, i))
            for other in others:
                other.join()
            if not pause.fired:
                break
            if not _bit_equal(out, alone[i]):
                changed.append(i)
                break
    return f"items {changed} changed when another call ran in between" if changed else "no item changed"


def _lab01_transform(x, rng):
    """The transform lab 01's loader checks hand to ordered_map: the item plus noise from its generator."""
    return x + torch.rand(x.shape, generator=rng)


def _lab01_items(n: int, counter: list | None = None):
    """A one-shot stream of n small tensors (item i is filled with i); counts what is pulled."""
    for i in range(n):
        if counter is not None:
            counter[0] += 1
        yield torch.full((2,), float(i))


def loader_results(fn, items, workers, prefetch, seed, stream=False):
    """list(fn(transform, items, workers, prefetch=prefetch, seed=seed)), where item 0's call finishes only
    after item 1's (it waits up to LAB01_WAIT_S when 2 or more calls can run at once): a later item
    finishes first, as on a busy machine. stream: items come from a one-shot generator."""
    second_done = threading.Event()
    first, second = (items[0], items[1]) if len(items) > 1 else (None, None)
    overlap = workers > 1 and (prefetch is None or prefetch > 1)

    def transform(x, rng):
        if x is first and overlap:
            second_done.wait(LAB01_WAIT_S)
        out = _lab01_transform(x, rng)
        if x is second:
            second_done.set()
        return out
    source = (x for x in items) if stream else items
    return list(fn(transform, source, workers, prefetch=prefetch, seed=seed))


def calls_at_once(fn, n, workers, prefetch, seed) -> str:
    """The most calls of the transform that fn ran at the same time, loading n items. The first calls wait
    (up to LAB01_WAIT_S) until min(workers, n) run together; with prefetch above workers they then wait a
    second more for any call beyond `workers`, which a pool of more threads than `workers` starts."""
    cond = threading.Condition()
    state = {"now": 0, "most": 0, "arrived": 0, "gave_up": False}
    wave = min(workers, n)

    def transform(x, rng):
        with cond:
            state["now"] += 1
            state["arrived"] += 1
            state["most"] = max(state["most"], state["now"])
            first_wave = state["arrived"] <= wave
            cond.notify_all()
            if first_wave and not state["gave_up"]:
                if not cond.wait_for(lambda: state["most"] >= wave, timeout=LAB01_WAIT_S):
                    state["gave_up"] = True          # fewer at once than `workers`: the later calls go on
                elif prefetch > workers:
                    cond.wait_for(lambda: state["most"] > workers, timeout=1.0)
        try:
            return _lab01_transform(x, rng)
        finally:
            with cond:
                state["now"] -= 1
    for _ in fn(transform, _lab01_items(n), workers, prefetch=prefetch, seed=seed):
        pass
    return f"{state['most']} call{'' if state['most'] == 1 else 's'} at once"


def _most_read_ahead(fn, n, workers, seed, **prefetch) -> int:
    """The most items fn had taken from a stream of n and not yet yielded, over the run."""
    pulled, most = [0], 0
    for j, _ in enumerate(fn(_lab01_transform, _lab01_items(n, pulled), workers, seed=seed, **prefetch)):
        most = max(most, pulled[0] - j)      # result j arrives: items 0..j-1 were yielded before it
    return most


def read_ahead(fn, n, workers, prefetch, seed) -> str:
    most = _most_read_ahead(fn, n, workers, seed, prefetch=prefetch)
    return f"at most {prefetch} items read ahead" if most <= prefetch else f"{most} items read ahead"


DEFAULT_READ_AHEAD_OK = "every worker had an item while a result was held, at most 2 x workers held"


def default_read_ahead(fn, n, workers, seed) -> str:
    """ordered_map without a prefetch, consumed as a training loop would: while the loop holds result j, the
    items taken and not yet yielded are all the workers can run (the generator is suspended), so each must
    be at least `workers` while the stream has more; at most 2 x workers items may be held at once; and the
    results the loop already took and dropped are not kept alive by the loader, beyond what a local variable
    holds until it is reassigned (the generator's last one, one per worker thread)."""
    pulled, left, most, kept, taken = [0], [], 0, 0, []
    for j, result in enumerate(fn(_lab01_transform, _lab01_items(n, pulled), workers, seed=seed)):
        kept = max(kept, sum(ref() is not None for ref in taken[:-1]))
        most = max(most, pulled[0] - j)
        if pulled[0] < n:                    # the stream has more: a worker without an item waits idle
            left.append(pulled[0] - (j + 1))
        taken.append(weakref.ref(result))
        del result                           # the loop is done with it
    if kept > workers:
        return (f"{kept} results the training loop had already taken were still held by the loader: memory grows "
                f"with every item unless the loader lets go of a result once it is yielded")
    if left and min(left) < workers:
        return (f"while the training loop held a result, {min(left)} item(s) were left to run for {workers} "
                f"workers: {workers - min(left)} worker(s) waited idle through the step")
    if most > 2 * workers:
        return f"{most} items held at once for {workers} workers: more than 2 x workers in memory"
    return DEFAULT_READ_AHEAD_OK


# lab 02: fusion

def sealed_counts(fn) -> dict[str, str] | str:
    """Exercise 4: fn()'s prediction with each count sealed (a short hash of name and count), so a failing
    case names the functions predicted wrong without printing the counts measured. The reference's counts
    are sealed the same way, where they are measured: in the grader, or in the notebook's check."""
    import hashlib
    predicted = fn()
    if not isinstance(predicted, dict):
        return f"a {type(predicted).__name__}, not a dict of name -> count"
    return {str(name): "#" + hashlib.sha256(f"{name}={count!r}".encode()).hexdigest()[:8]
            for name, count in predicted.items()}


def _unrecorded(run: Callable[[], object]) -> object:
    """run() with record_calls' profiler off: what a harness computes for itself (the truth it compares
    with) is not the learner's call of a forbidden function."""
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        return run()
    finally:
        sys.setprofile(previous)


def combo_plan_errors(fn, numels, block) -> str:
    """Exercise 3: which of (scheme, programs, idle programs) fn(numels, block) gets wrong, against
    Inductor's ComboKernel.select_dispatch_strategy and the grid each scheme launches; the failure names
    the wrong fields, never the right values."""
    from helpers import fusion

    def truth():      # Inductor's rule as helpers.fusion re-implements it (importing Inductor here takes seconds);
        scheme = fusion.combo_dispatch_strategy(numels)      # the tests hold it to the installed Inductor's
        total, _ = fusion.combo_grid(numels, block)
        if scheme == "round_robin":
            return scheme, *fusion.round_robin_grid(numels, block)
        return scheme, total, 0
    got = fn(list(numels), block)
    want = _unrecorded(truth)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"a {type(got).__name__}, not a (scheme, programs, idle) tuple"
    wrong = [field for field, g, w in zip(("scheme", "programs", "idle"), got, want) if g != w]
    return f"wrong: {', '.join(wrong)}" if wrong else "all three right"


class _CountedKernel:
    """A kernel whose launches, kernel[grid](...), are recorded (grid by grid); anything else is the
    kernel's own."""

    def __init__(self, kernel, grids: list):
        self._kernel, self._grids = kernel, grids

    def __getitem__(self, grid):
        self._grids.append(grid)
        return self._kernel[grid]

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def kernel_launches(fn, xs) -> int:
    """How many times fn(xs), lab 02's launch_three_part, launched the notebook's three_part_kernel
    (0 when it has none: the parts were computed some other way)."""
    namespace = getattr(fn, "__globals__", {})
    kernel = namespace.get("three_part_kernel")
    if kernel is None:
        triton_launch(fn, xs)
        return 0
    grids: list = []
    namespace["three_part_kernel"] = _CountedKernel(kernel, grids)
    try:
        triton_launch(fn, xs)
    finally:
        namespace["three_part_kernel"] = kernel
    return len(grids)


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


# lab 03: mixture of experts

FLOPS_SLACK = 1.5        # how many times the FLOPs of each expert on its own rows a right answer may do
OWN_ROWS_FLOPS = "matmul FLOPs of each expert on its own rows (within 1.5x)"


def _grouped_mm_flops(a, b, *args, offs=None, out_val=None, **kwargs) -> int:
    """F.grouped_mm's FLOPs, which torch's counter does not count: with offs, each group's rows times its
    expert's [K, N]; otherwise (batched) each output element's K products."""
    if offs is not None and a.dim() == 2 and b.dim() == 3:
        return 2 * int(offs[-1]) * a.shape[1] * b.shape[2]
    return 2 * out_val.numel() * a.shape[-1]


_grouped_mm_flops._get_raw = True     # the counter passes tensors (offs' values), not only shapes


def _matmul_flops(run: Callable[[], object]) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: _grouped_mm_flops}) as counter:
        run()
    return counter.get_total_flops()


def _flops_verdict(flops: int, needed: int) -> str:
    """OWN_ROWS_FLOPS, or how far the FLOPs counted are from `needed` (each expert on its own rows)."""
    if needed <= flops <= FLOPS_SLACK * needed:
        return OWN_ROWS_FLOPS
    return f"{flops / needed:.2f}x the matmul FLOPs of each expert on its own rows"


def grouped_gemm_flops(fn, xs, w, offs) -> str:
    """Exercise 2's cost: the FLOPs fn's matmuls do, against one [rows, K] x [K, N] per expert."""
    return _flops_verdict(_matmul_flops(lambda: fn(xs, w, offs)), 2 * int(offs[-1]) * w.shape[1] * w.shape[2])


def expert_ffn_flops(fn, xs, params, offs) -> str:
    """Exercise 3's cost: the FLOPs fn's matmuls do, against the up and the down projection of each expert's
    own rows."""
    _, k, hidden = params["w_up"].shape
    needed = 2 * int(offs[-1]) * (k * hidden + hidden * params["w_down"].shape[2])
    return _flops_verdict(_matmul_flops(lambda: fn(xs, params, offs)), needed)


# lab 04: the C++ custom op

def _is_silu_mul_reference(fn, function: str) -> bool:
    specs = sys.modules.get("helpers.grading.specs")   # never imported in a submission's sandbox
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


CHUNK_PROBE = r"""// Lab 04's check of one chunk: the learner's body alone, called on [begin, end) of an out full of NaN.
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/full.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace labs_lab {
template <typename scalar_t>
void silu_mul_chunk(const scalar_t* gate, const scalar_t* up, scalar_t* out, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;
BODY
}

at::Tensor chunk_probe(const at::Tensor& gate, const at::Tensor& up, int64_t begin, int64_t end) {
  // room past the inputs: a body that runs past its end writes there
  at::Tensor out = at::full({gate.numel() + 4096}, std::numeric_limits<float>::quiet_NaN(), gate.options());
  silu_mul_chunk<float>(gate.const_data_ptr<float>(), up.const_data_ptr<float>(), out.mutable_data_ptr<float>(),
                        begin, end);
  return out;
}
}  // namespace labs_lab

TORCH_LIBRARY(NAMESPACE, m) {
  m.def("chunk(Tensor gate, Tensor up, int begin, int end) -> Tensor", &labs_lab::chunk_probe);
}
"""


def chunk_writes(fn, n, begin, end) -> list[int]:
    """Build the body fn() returns into a bare chunk function (no threads; its own op namespace, one per
    body), call it once on the chunk [begin, end) of n float32 elements with `out` filled with NaN, and
    return [first written index, last written index + 1, number written]: a body that loops from 0, not
    from begin, writes elements of other chunks, which a whole-tensor run cannot show (same values)."""
    if _is_silu_mul_reference(fn, "silu_mul_body"):
        return [begin, end, end - begin]
    import hashlib

    from helpers.ext import build_and_load
    body = fn().rstrip("\n")
    namespace = "labs_probe_" + hashlib.sha256(body.encode()).hexdigest()[:16]
    if not hasattr(torch.ops, namespace) or not hasattr(getattr(torch.ops, namespace), "chunk"):
        build_and_load("labs_chunk_probe", CHUNK_PROBE.replace("BODY", body).replace("NAMESPACE", namespace),
                       extra_cflags=("-O1",))
    gen = torch.Generator().manual_seed(n)
    gate, up = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    out = getattr(torch.ops, namespace).chunk(gate, up, begin, end)
    written = (~out.isnan()).nonzero().flatten().tolist()
    return [written[0], written[-1] + 1, len(written)] if written else [0, 0, 0]


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


def silu_mul_record_kernel(gate, up, out, amax):
    """Lab 04's recording kernel: out = silu(gate) * up, and amax raised to the largest |out| seen so far
    (a running maximum a scaling recipe can read). It computes the sigmoid in gate's storage to save a
    temporary."""
    out.copy_(gate)
    gate.sigmoid_()
    out.mul_(gate).mul_(up)
    torch.maximum(amax, out.abs().amax().reshape(1), out=amax)


_RECORD_OPS: dict[str, object] = {}


def _record_op(schema: str):
    """labs_record_<n>::silu_mul_record defined with `schema`, the recording kernel as its kernel and a
    fake kernel that returns nothing; one namespace per schema (an op name is defined once per process)."""
    if schema not in _RECORD_OPS:
        namespace = f"labs_record_{len(_RECORD_OPS)}"
        lib = torch.library.Library(namespace, "DEF")
        lib.define("silu_mul_record" + schema)
        lib.impl("silu_mul_record", silu_mul_record_kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{namespace}::silu_mul_record", lambda *args, **kwargs: None, lib=lib)
        _RECORD_OPS[schema] = (lib, getattr(torch.ops, namespace).silu_mul_record.default)
    return _RECORD_OPS[schema][1]


def _record_schema(fn) -> tuple[str, object]:
    """fn()'s schema text and torch's parse of it (the op's name is added here); raises ValueError for
    what is not a schema of the kernel's four arguments."""
    schema = fn()
    if not isinstance(schema, str):
        raise ValueError(f"return the schema as a str, got {type(schema).__name__}")
    schema = schema.strip()
    if not schema.startswith("("):
        raise ValueError("write the schema from its argument list on, '(...) -> ...', without the op's name")
    try:
        parsed = torch._C.parse_schema("silu_mul_record" + schema)
    except RuntimeError as exc:
        raise ValueError(f"torch cannot parse the schema: {str(exc).splitlines()[0]}") from None
    names = [a.name for a in parsed.arguments]
    if names != ["gate", "up", "out", "amax"]:
        raise ValueError(f"the schema's arguments are {names}; the kernel's are gate, up, out, amax, in that order")
    return schema, parsed


def _record_args(shape, dtype):
    gen = torch.Generator().manual_seed(len(shape))
    return {"gate": torch.randn(shape, generator=gen).to(dtype), "up": torch.randn(shape, generator=gen).to(dtype),
            "out": torch.empty(shape, dtype=dtype), "amax": torch.zeros(1, dtype=dtype)}


def record_arguments(fn) -> str:
    _, parsed = _record_schema(fn)
    return ", ".join(a.name for a in parsed.arguments)


def record_returns(fn) -> str:
    _, parsed = _record_schema(fn)
    return "returns nothing" if not parsed.returns else f"returns {len(parsed.returns)} value(s)"


def record_aliased_returns(fn) -> str:
    _, parsed = _record_schema(fn)
    aliased = sum(r.alias_info is not None for r in parsed.returns)
    return "no output aliases an argument" if not aliased else f"{aliased} output(s) alias an argument"


def record_letters(fn) -> str:
    """Whether the schema's annotated arguments each have an alias letter of their own (a letter shared says
    the arguments may be one tensor)."""
    _, parsed = _record_schema(fn)
    by_letter: dict[str, list[str]] = {}
    for a in parsed.arguments:
        for letter in a.alias_info.before_set if a.alias_info is not None else ():
            by_letter.setdefault(letter, []).append(a.name)
    shared = {letter: names for letter, names in by_letter.items() if len(names) > 1}
    if not shared:
        return "a letter of its own for each written argument"
    return "; ".join(f"the letter {letter!r} on {', '.join(names)}" for letter, names in shared.items())


def record_opcheck(fn, shape, dtype: str) -> str:
    """torch.library.opcheck on the recording op defined with fn()'s argument list and '-> ()' (the
    returns have cases of their own), called as the schema says (keyword-only arguments by name): "every
    opcheck test passes", or the first failing test and the first line of its message."""
    schema, parsed = _record_schema(fn)
    arguments = schema[:schema.rindex("->")].rstrip()
    args = _record_args(shape, getattr(torch, dtype))
    positional = tuple(args[a.name] for a in parsed.arguments if not a.kwarg_only)
    keywords = {a.name: args[a.name] for a in parsed.arguments if a.kwarg_only}
    result = torch.library.opcheck(_record_op(arguments + " -> ()"), positional, keywords, raise_exception=False)
    failed = [(test, outcome) for test, outcome in result.items() if outcome != "SUCCESS"]
    if not failed:
        return "every opcheck test passes"
    test, outcome = failed[0]
    return f"{test} fails: {str(outcome).splitlines()[0][:200]}"


def record_declarations(fn) -> str:
    """How the schema's written arguments (an alias annotation with '!') compare with the ones the kernel
    writes, in counts only (naming them would give the answer away)."""
    _, parsed = _record_schema(fn)
    declared = {a.name for a in parsed.arguments if a.alias_info is not None and a.alias_info.is_write}
    args = {**_record_args((4, 6), torch.float32), "out": torch.zeros(4, 6)}
    before = {name: t.clone() for name, t in args.items()}
    silu_mul_record_kernel(**args)
    written = {name for name, t in args.items() if not torch.equal(t, before[name])}
    missing, extra = len(written - declared), len(declared - written)
    if not missing and not extra:
        return "declares exactly the arguments the kernel writes"
    return f"{missing} argument(s) written but not declared, {extra} declared but only read"


# lab 05: quantization

class _FloatToIntegerCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """The integer dtypes that a floating tensor holding NaN or an infinity was converted to: what such a
    value becomes depends on the CPU and the kernel (0 here, -128 there), so a right answer never casts one."""

    CASTS = ("_to_copy", "copy_")

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.CASTS:
            source = args[1] if func.overloadpacket.__name__ == "copy_" else args[0]
            if source.is_floating_point() and not (out.is_floating_point() or out.is_complex() or
                                                   out.dtype == torch.bool) and not source.isfinite().all():
                self.dtypes.append(str(out.dtype))
        return out


def non_finite_cast_to_integer(fn, *args, **kwargs) -> str:
    with _FloatToIntegerCasts() as casts:
        fn(*args, **kwargs)
    if casts.dtypes:
        return f"NaN or an infinity converted to {casts.dtypes[0]}"
    return "no NaN or infinity converted to an integer"


def dtype_of_second(fn, *args, **kwargs) -> str:
    return str(fn(*args, **kwargs)[1].dtype)


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


def int8_kernel_path(fn, *args) -> str:
    """"fast path" when fn hands torch._weight_int8pack_mm activations its CPU kernel vectorizes here: on x86
    (AVX2, AVX512: int8mm_kernel.cpp's bf16 branch) only bfloat16; elsewhere (aarch64's NEON overloads take
    float, half and bfloat16 alike; DEFAULT builds have no vector branch) fp32 and bf16 both. Else what it got."""
    from helpers.device import cpu_capability
    dtype = activation_dtype_of_int8_kernel(fn, *args)
    if dtype == "not called":
        return dtype
    x86 = cpu_capability().upper().startswith("AVX")
    fast = {"torch.bfloat16"} if x86 else {"torch.bfloat16", "torch.float32", "torch.float16"}
    return "fast path" if dtype in fast else f"{dtype} activations (a scalar loop on this {cpu_capability()} CPU)"


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


# lab 05, exercise 4: one (granularity, bits) per layer under a size and an accuracy budget, on digits

PLAN_LAYERS = ("fc1", "fc2", "fc3")
GRANULARITIES = ("tensor", "channel", "group")
GROUP_SIZE = 16
PLAN_MAX_BYTES = 23_000
PLAN_MAX_EXTRA_WRONG = 4        # more wrong test images than fp32, of digits' 450: under 1 point of accuracy


class DigitsMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


_DIGITS_MODELS: dict[int, tuple] = {}


def _digits_model(seed: int):
    if seed not in _DIGITS_MODELS:
        _DIGITS_MODELS[seed] = _train_digits_model(seed)
    return _DIGITS_MODELS[seed]


def _train_digits_model(seed: int):
    from helpers.validation.upgrade import digits_split
    x_train, y_train, x_test, y_test = digits_split(seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # bitwise-reproducible training
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = DigitsMLP()
        opt, gen = torch.optim.Adam(model.parameters(), lr=3e-3), torch.Generator().manual_seed(seed)
        for _ in range(300):
            idx = torch.randint(0, len(x_train), (128,), generator=gen)
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():    # fc1's output channels times 0.1 to 10, fc2's inputs scaled back: the same function
        r = torch.logspace(-1, 1, 128)[torch.randperm(128, generator=torch.Generator().manual_seed(1000 + seed))]
        model.fc1.weight.mul_(r[:, None])
        model.fc1.bias.mul_(r)
        model.fc2.weight.div_(r[None, :])
    return model.eval().requires_grad_(False), x_test, y_test


def digits_model(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Lab 05's trained digits classifier (a copy) with its test images and labels."""
    import copy
    model, x_test, y_test = _digits_model(seed)
    return copy.deepcopy(model), x_test, y_test


def check_plan(plan) -> None:
    """Raise ValueError unless plan maps fc1, fc2 and fc3 each to (granularity, bits)."""
    if not isinstance(plan, dict) or set(plan) != set(PLAN_LAYERS):
        raise ValueError(f"the plan must be a dict with the keys {', '.join(PLAN_LAYERS)}, got "
                         f"{sorted(plan) if isinstance(plan, dict) else type(plan).__name__}")
    for layer, choice in plan.items():
        if not (isinstance(choice, (tuple, list)) and len(choice) == 2 and choice[0] in GRANULARITIES
                and choice[1] in (2, 4, 8)):
            raise ValueError(f"{layer}: {choice!r} is not (granularity, bits) with granularity one of "
                             f"{GRANULARITIES} and bits 2, 4 or 8")


def fake_quantize_weight(w: torch.Tensor, granularity: str, bits: int) -> torch.Tensor:
    """w rounded to symmetric `bits`-bit codes and back, one scale per tensor, per row (output channel) or
    per GROUP_SIZE consecutive inputs of a row."""
    qmax = 2 ** (bits - 1) - 1
    n, k = w.shape
    blocks = {"tensor": w.reshape(1, -1), "channel": w, "group": w.reshape(-1, GROUP_SIZE)}[granularity]
    scales = blocks.abs().amax(dim=1, keepdim=True) / qmax
    codes = torch.clamp(torch.round(blocks / scales.clamp(min=1e-12)), -qmax, qmax)
    return (codes * scales).reshape(n, k)


def weight_bytes(shape, granularity: str, bits: int) -> int:
    """Bytes of a quantized weight: its codes packed at `bits` bits each, plus one fp32 scale per tensor,
    per row or per group."""
    n, k = shape
    scales = {"tensor": 1, "channel": n, "group": n * k // GROUP_SIZE}[granularity]
    return (n * k * bits + 7) // 8 + 4 * scales


def _wrong_images(model, x, y) -> int:
    with torch.no_grad():
        return int((model(x).argmax(-1) != y).sum())


def plan_report(plan, seed: int = 0) -> dict:
    """What `plan` costs on the digits model of `seed`: bytes per layer and in all, and the test images
    wrong beyond the fp32 model's, with all layers quantized and with each layer quantized alone."""
    import copy
    check_plan(plan)
    model, x, y = digits_model(seed)
    base = _wrong_images(model, x, y)
    quantized, alone = copy.deepcopy(model), {}
    for layer, (granularity, bits) in plan.items():
        w = getattr(model, layer).weight
        getattr(quantized, layer).weight.copy_(fake_quantize_weight(w, granularity, int(bits)))
        single = copy.deepcopy(model)
        getattr(single, layer).weight.copy_(fake_quantize_weight(w, granularity, int(bits)))
        alone[layer] = _wrong_images(single, x, y) - base
    sizes = {layer: weight_bytes(getattr(model, layer).weight.shape, g, int(b)) for layer, (g, b) in plan.items()}
    return {"bytes": sum(sizes.values()), "bytes_per_layer": sizes,
            "extra_wrong": _wrong_images(quantized, x, y) - base, "extra_wrong_alone": alone}


def plan_is_valid(fn) -> str:
    check_plan(fn())
    return "a (granularity, bits) for each of fc1, fc2, fc3"


def plan_size(fn, seed) -> str:
    total = plan_report(fn(), seed)["bytes"]
    if total <= PLAN_MAX_BYTES:
        return "within the size budget"
    return f"{total:,} bytes of weights, over the budget"


def plan_accuracy(fn, seed) -> str:
    report = plan_report(fn(), seed)
    if report["extra_wrong"] <= PLAN_MAX_EXTRA_WRONG:
        return "within the accuracy budget"
    worst = max(report["extra_wrong_alone"], key=report["extra_wrong_alone"].get)
    return (f"{report['extra_wrong']} more test images wrong than fp32, over the budget; the costliest "
            f"choice is {worst}'s")


# lab 06: attention

def broadcast_mask(fn, lengths, max_len, heads):
    """The mask broadcast to (batch, heads, max_len, max_len), as SDPA broadcasts it."""
    mask = fn(lengths, max_len)
    return mask.expand(len(lengths), heads, max_len, max_len)


def offsets_as_int64(fn, seqs) -> torch.Tensor:
    """pack's offsets (its second result) as int64: their values, whatever their dtype."""
    return torch.as_tensor(fn(seqs)[1]).to(torch.int64)


def offsets_dtype(fn, seqs) -> str:
    return str(torch.as_tensor(fn(seqs)[1]).dtype)


def max_len_kind(fn, seqs) -> str:
    """What pack's third result is, in words that do not give the length away."""
    value = fn(seqs)[2]
    if type(value) is not int:
        return f"a {type(value).__name__}, not a Python int"
    return "the longest length" if value == max(s.shape[0] for s in seqs) else "an int, not the longest length"


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


def dense_mask(fn, lengths, prefix) -> torch.Tensor:
    """The (total, total) boolean mask of the mask_mod fn(lengths, prefix) returns, built as
    create_block_mask builds it: create_mask, one vmapped call over every (q_idx, kv_idx) pair."""
    from torch.nn.attention.flex_attention import create_mask
    total = sum(lengths)
    return create_mask(fn(list(lengths), prefix), None, None, total, total, device="cpu")[0, 0]


BUCKET_COUNT_OK = "the cheapest count, or within 2% of it"


def _runs(lengths, n_buckets, split: str) -> list[list[int]]:
    """The sorted lengths cut into n_buckets runs, as exercise 4 accepts them: by tensor_split (the longer
    runs first), or at the boundaries b * len // n_buckets."""
    ordered = sorted(lengths)
    if split == "tensor_split":
        return [r.tolist() for r in torch.tensor(ordered).tensor_split(n_buckets)]
    return [ordered[b * len(ordered) // n_buckets:(b + 1) * len(ordered) // n_buckets] for b in range(n_buckets)]


def _bucketing_cost(lengths, n_buckets, call_cost, entry_cost, split: str = "tensor_split") -> float:
    """What exercise 4's buckets cost: per padded call, call_cost plus entry_cost per (query, key) score it
    computes, padding included (the bucket's size times its longest length squared)."""
    return sum(call_cost + entry_cost * len(r) * max(r) ** 2 for r in _runs(lengths, n_buckets, split) if r)


def bucket_count_verdict(fn, lengths, call_cost, entry_cost, max_buckets) -> str:
    """Whether the count fn chooses makes exercise 4's bucketing (either split it accepts) cheapest under the two
    costs, and if not, which way it is off (without the count)."""
    count = fn(list(lengths), call_cost, entry_cost, max_buckets)
    if type(count) is not int:
        return f"a {type(count).__name__}, not a Python int"
    if not 1 <= count <= max_buckets:
        return f"{count} is not a count from 1 to max_buckets ({max_buckets})"
    ratios = {}
    for split in ("tensor_split", "boundaries"):
        costs = {n: _bucketing_cost(lengths, n, call_cost, entry_cost, split) for n in range(1, max_buckets + 1)}
        ratios[split] = costs[count] / min(costs.values()), min(costs, key=costs.get)
    if min(ratio for ratio, _ in ratios.values()) <= 1.02:
        return BUCKET_COUNT_OK
    ratio, cheapest = ratios["tensor_split"]
    side = ("too many buckets: the calls they add cost more than the padding they remove" if count > cheapest else
            "too few buckets: the padding they leave costs more than the calls they save")
    return f"{side} (your count costs {ratio:.2f}x the cheapest)"


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


def _accumulation_problem(width, depth, batch, seed):
    """Exercise 3's model (memory.mlp) and batch (x, y), made from `seed`."""
    from helpers.memory import mlp
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = mlp(width, depth)
    return model, torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)


def accumulated_grads(fn, width, depth, batch, micro, seed, stale_grads=False):
    """fn(model, x, y, micro) on a fresh model; the gradients it leaves (a list, None where absent).
    stale_grads: the parameters start with gradients from an earlier step."""
    model, x, y = _accumulation_problem(width, depth, batch, seed)
    if stale_grads:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
    fn(model, x, y, micro)
    return [p.grad for p in model.parameters()]


def only_last_chunk_counts(fn, width, depth, batch, micro, seed) -> bool:
    """Whether the gradients fn leaves are those of the last chunk alone (weighted by its share): what
    clearing the gradients inside the loop leaves."""
    def last_only(model, x, y, micro):
        model.zero_grad(set_to_none=True)
        xs, ys = x.chunk(micro)[-1], y.chunk(micro)[-1]
        (nn.functional.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()
    got, last = accumulated_grads(fn, width, depth, batch, micro, seed), \
        accumulated_grads(last_only, width, depth, batch, micro, seed)
    return all(g is not None and torch.allclose(g, w, atol=1e-6) for g, w in zip(got, last))


def accumulations_per_parameter(fn, width, depth, batch, micro, seed) -> int:
    """How many times a backward pass reached the first parameter while fn ran: one per chunk when
    backward() is called inside the loop, 1 when the chunks' losses are summed first."""
    model, x, y = _accumulation_problem(width, depth, batch, seed)
    calls = []
    handle = next(model.parameters()).register_post_accumulate_grad_hook(lambda p: calls.append(1))
    try:
        fn(model, x, y, micro)
    finally:
        handle.remove()
    return len(calls)


class _SavedActivations:
    """Bytes of the storages that tensors saved for backward hold, while they are held (saved-tensor hooks),
    and their peak; the storages of `given` tensors (the parameters, the batch) are not activations."""

    def __init__(self, given):
        self.given = {t.untyped_storage().data_ptr() for t in given}
        self.holders, self.live, self.peak = {}, 0, 0

    def pack(self, t):
        storage = t.untyped_storage()
        if storage.data_ptr() in self.given:
            return t
        return _Held(t, storage.data_ptr(), storage.nbytes(), self)

    def change(self, ptr, nbytes, by):
        held = self.holders.get(ptr, 0)
        self.holders[ptr] = held + by
        if (held == 0) != (held + by == 0):           # a storage saved for the first time, or released
            self.live += nbytes * by
            self.peak = max(self.peak, self.live)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack)


def _unpack(held):
    return held.t if isinstance(held, _Held) else held


class _Held:
    """A saved tensor, counted while autograd holds it (released after its backward)."""

    def __init__(self, t, ptr, nbytes, saved):
        self.t, self.ptr, self.nbytes, self.saved = t, ptr, nbytes, saved
        saved.change(ptr, nbytes, 1)

    def __del__(self):
        self.saved.change(self.ptr, self.nbytes, -1)


def _saved_activation_peak(fn, width, depth, batch, micro, seed) -> int:
    model, x, y = _accumulation_problem(width, depth, batch, seed)
    saved = _SavedActivations([*model.parameters(), x, y])
    with saved.hooks():
        fn(model, x, y, micro)
    return saved.peak


ONE_CHUNK_SAVED = "one chunk's activations saved for backward at a time"


def activations_of_one_chunk(fn, width, depth, batch, micro, seed) -> str:
    """Whether the activations fn's chunks save for backward peak at about one chunk's share of those of the
    whole batch in one chunk (within 1.5x): what running each chunk's backward before the next forward gives."""
    whole = _saved_activation_peak(fn, width, depth, batch, 1, seed)
    chunked = _saved_activation_peak(fn, width, depth, batch, micro, seed)
    largest = math.ceil(batch / micro)            # x.chunk's largest chunk
    if chunked <= 1.5 * whole * largest / batch:
        return ONE_CHUNK_SAVED
    return (f"the activations saved for backward peaked at {chunked / whole:.2f} of the whole batch's, with chunks "
            f"of at most {largest} of its {batch} rows")


def _gated_blocks(width, depth, policy, seed=0):
    """forward(x) through `depth` memory.GatedMLP blocks, each checkpointed with
    create_selective_checkpoint_contexts(policy); policy None: no checkpointing."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from helpers.memory import GatedMLP
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        blocks = nn.ModuleList(GatedMLP(width) for _ in range(depth))

    def forward(x):
        for block in blocks:
            if policy is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=False,
                               context_fn=lambda: create_selective_checkpoint_contexts(policy))
        return x
    return forward


class _OutputStorages(torch.utils._python_dispatch.TorchDispatchMode):
    """Every storage an op writes its output to, by weak reference: what is still alive afterwards is
    what the forward pass kept."""

    def __init__(self):
        super().__init__()
        self.storages = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.multiprocessing.reductions import StorageWeakRef
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                self.storages[s.data_ptr()] = (StorageWeakRef(s), s.nbytes())
        return out


def kept_bytes_and_backward_flops(policy, width, depth, batch) -> tuple[int, int]:
    """One forward and backward through `depth` GatedMLP blocks checkpointed with `policy` (None: no
    checkpointing): the bytes the forward pass keeps alive for backward (outputs of ops still alive when
    the loss is computed: saved activations, the policy's kept outputs, the blocks' inputs) and the
    matmul FLOPs of backward (torch.utils.flop_counter), recomputed forwards included."""
    from torch.utils.flop_counter import FlopCounterMode
    forward = _gated_blocks(width, depth, policy)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    with _OutputStorages() as outputs:
        loss = forward(x).square().mean()
    kept = sum(nbytes for ref, nbytes in outputs.storages.values() if not ref.expired())
    with FlopCounterMode(display=False) as flops:
        loss.backward()
    return kept, flops.get_total_flops()


def _keep_every_matmul(ctx, op, *args, **kwargs):
    """memory.save_matmuls, written again (a learner's call to the helper is what the exercise forbids)."""
    from torch.utils.checkpoint import CheckpointPolicy
    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE


def matmul_flops_recomputed(fn, width, depth, batch) -> int:
    """Backward's matmul FLOPs with policy fn, minus those without checkpointing: 0 when backward
    recomputes no matmul."""
    return kept_bytes_and_backward_flops(fn, width, depth, batch)[1] - \
        kept_bytes_and_backward_flops(None, width, depth, batch)[1]


def keeps_fewer_bytes_than_save_matmuls(fn, width, depth, batch) -> bool:
    return kept_bytes_and_backward_flops(fn, width, depth, batch)[0] < \
        kept_bytes_and_backward_flops(_keep_every_matmul, width, depth, batch)[0]



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


def grad_is_finite(fn, v, **kwargs) -> bool:
    """Whether every element of the gradient of fn(v).sum() is finite (no NaN, no inf)."""
    return bool(torch.isfinite(grad_of_sum(fn, v, **kwargs)).all())


TOKENS, FEATURES = 6, 16


class TokenHead(nn.Module):
    """Lab 08's module to migrate: for each example of a (batch, tokens, features) input, standardise
    every feature over the tokens, project, and keep each output's maximum over the tokens. Written as a
    loop over the examples, which torch.jit.trace unrolls for the example's batch size."""

    def __init__(self, features: int = FEATURES, out: int = 4):
        super().__init__()
        self.proj = nn.Linear(features, out)

    def forward(self, x):
        rows = []
        for i in range(x.shape[0]):
            xi = x[i]                                            # (tokens, features)
            rows.append(self.proj((xi - xi.mean(0)) / (xi.std(0) + 1e-5)).amax(0))
        return torch.stack(rows)


def token_head(seed: int = 0) -> TokenHead:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TokenHead()


def _export_run(fn, seed, example_batch, batches, from_file: bool):
    """fn(head, example, path) exports, saves and reloads a TokenHead; the outputs, on a batch of each
    size in `batches`, of the module fn returned, or (from_file) of torch.export.load(path).module(),
    the program fn saved."""
    head = token_head(seed)
    gen = torch.Generator().manual_seed(seed)
    example = torch.randn(example_batch, TOKENS, FEATURES, generator=gen)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = os.path.join(tmp, "head.pt2")
        module = fn(head, example, path)
        if from_file:
            module = torch.export.load(path).module()
        with torch.no_grad():
            return [module(torch.randn(n, TOKENS, FEATURES, generator=gen)) for n in batches]


def exported_outputs(fn, seed, example_batch, batches):
    """The outputs of the module fn returns, on each batch size in `batches`."""
    return _export_run(fn, seed, example_batch, batches, from_file=False)


def saved_program_outputs(fn, seed, example_batch, batches):
    """The outputs of the program fn saved at its path, loaded again with torch.export.load."""
    return _export_run(fn, seed, example_batch, batches, from_file=True)


def returns_a_module(fn, seed, example_batch) -> bool:
    """Whether what fn returns is a module (callable), not the ExportedProgram torch.export.load gives."""
    head = token_head(seed)
    example = torch.randn(example_batch, TOKENS, FEATURES, generator=torch.Generator().manual_seed(seed))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return isinstance(fn(head, example, os.path.join(tmp, "head.pt2")), nn.Module)


def export_specialised_the_batch(fn, seed, example_batch) -> bool:
    """Whether fn failed because torch.export found the batch dimension, declared dynamic, specialised
    to the example's size by the code (a loop over it); other errors propagate."""
    try:
        _export_run(fn, seed, example_batch, [example_batch], from_file=False)
    except Exception as error:      # torch._dynamo.exc.UserError: Constraints violated ... specialized it
        if "specialized it to be a constant" in str(error) or "specialised it to be a constant" in str(error):
            return True
        raise
    return False


# lab 09: migration

def called(fn, *args, **kwargs) -> str:
    """fn called for what it calls alone: "called", whatever it returns or raises (the case fails only
    on a forbidden call, with its own hint; the other cases judge the values), except a stub's
    NotImplementedError: a function not written yet has earned nothing."""
    try:
        fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:        # noqa: BLE001 (a wrong value or error is another case's to report)
        if type(exc).__name__ == "CellTimeout":
            raise
    return "called"


def interval_named(fn, rounds_a, rounds_b, better) -> tuple[str, float, float]:
    """fn's 95% interval as (what it is, low, high): "the 95% t interval on the paired log-gains" when its ends
    are that interval's, else the usual mistake nearest to them (each changes one ingredient), else "another
    interval". The grader compares all three with the reference's, so the ends decide, not these words."""
    import numpy as np

    from helpers.validation import stats
    _, low, high = fn(rounds_a, rounds_b, better)
    low, high = float(low), float(high)
    medians_a, medians_b = ([float(np.median(r)) for r in rounds] for rounds in (rounds_a, rounds_b))
    right = _unrecorded(lambda: stats.paired_interval(medians_a, medians_b, better))
    d = np.log(right["round_gains"])
    k = len(d)
    t = stats.t_quantile(0.975, k - 1)
    spread = right["sd_log"] / math.sqrt(k)

    def distance(ends):   # the larger relative difference of the two ends
        return max(abs(got - want) / abs(want) for got, want in zip((low, high), ends))

    def around_the_mean(half):
        return math.exp(d.mean() - half), math.exp(d.mean() + half)

    if distance((right["low"], right["high"])) <= 1e-6:
        return "the 95% t interval on the paired log-gains", low, high
    mistakes = {
        "an interval with the normal quantile 1.96 where Student's t with k - 1 degrees of freedom belongs "
        "(the noise's spread is estimated from only k pairs)": 1.96 * spread,
        "an interval whose standard deviation divides by k: the sample standard deviation of k log-gains "
        "divides by k - 1": t * float(d.std(ddof=0)) / math.sqrt(k),
        "an interval with Student's t at k degrees of freedom: the mean uses one of the k pairs' degrees of "
        "freedom, leaving k - 1": stats.t_quantile(0.975, k) * spread,
        "an interval with t's 95% quantile: a two-sided 95% interval leaves 2.5% in each tail, so the 97.5% "
        "quantile": stats.t_quantile(0.95, k - 1) * spread,
        "an interval from each side's spread on its own: the spread must be that of the per-pair log-gains, "
        "so that a slow stretch shared by a pair cancels":
            t * math.sqrt((np.log(medians_a).var(ddof=1) + np.log(medians_b).var(ddof=1)) / k),
    }
    gaps = {words: distance(around_the_mean(half)) for words, half in mistakes.items()}
    nearest = min(gaps, key=gaps.get)
    # 1e-4: 1.96 or 1.959964, a t read from a table
    return (nearest if gaps[nearest] <= 1e-4 else "another interval"), low, high


def own_value_error(fn, *args, **kwargs) -> str:
    """How fn refuses input it must refuse: "its own ValueError" when the ValueError is raised in the
    learner's code, else what happened instead: no error, another error, or a ValueError from inside a library
    it called (stats.t_quantile on 0 degrees of freedom is not a check of the learner's). A ValueError raised
    by C code (math.sqrt(-1)) has no frame of its own and counts as the learner's."""
    try:
        fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except ValueError as exc:
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        if _in_library(code.co_filename):
            return f"a ValueError raised inside {plain_name(code.co_name)}, not by a check of its own"
        return "its own ValueError"
    except Exception as exc:   # noqa: BLE001 (the wrong kind of error is this case's answer)
        if type(exc).__name__ == "CellTimeout":
            raise
        return plain_name(type(exc).__name__) + ", not a ValueError"
    return "no error"


def _library_roots() -> tuple[str, ...]:
    """Where libraries live: Python's, installed packages (the environment's and the user's), this course's
    helpers (not helpers/grading, where the references are). Taken when this module loads, before a cell runs."""
    import site
    import sysconfig
    paths = sysconfig.get_paths()
    found = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), paths["stdlib"],
             paths["purelib"], paths["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return tuple(os.path.realpath(p) + os.sep for p in found)


LIBRARY_ROOTS = _library_roots()
GRADING_ROOT = os.path.dirname(os.path.realpath(__file__)) + os.sep
_realpath = os.path.realpath   # as this module loads: a cell may rebind os.path's


def _in_library(filename: str) -> bool:
    """Whether code in `filename` is a library's, not the notebook's nor the grading references'."""
    if filename.startswith("<frozen "):
        return True
    real = _realpath(filename)
    return not real.startswith(GRADING_ROOT) and real.startswith(LIBRARY_ROOTS)


def own_workload(fn, what: str, samples: int) -> str:
    """One property of a workload function, in words (`labcheck.workload_property`)."""
    from helpers.validation import labcheck
    return labcheck.workload_property(fn, what, samples)
