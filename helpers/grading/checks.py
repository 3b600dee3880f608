"""Lab checks shared by the notebooks and the grader: one source of truth for every exercise's cases.

    from helpers.grading.checks import check
    check("03_moe_lab", permute_tokens)     # the spec's visible cases, with their hints

`check` runs the visible cases of the exercise's spec (helpers/grading/specs/labNN.py) on the learner's
function exactly as the grader does (same call, same recording of forbidden functions, same judge), so a
check cell and `python -m helpers grade` cannot disagree. The grader adds hidden cases on a secret seed.

`call_case` is the one way an exercise function is called: through the case's harness (a function named
by `Case.call`, of this module or of the lab's module in helpers/grading/harnesses/, which builds what
cannot travel as tensors: a generator, a model, a file path) while recording the forbidden functions it reaches: torch functions by name (torch.X,
torch.nn.functional.X, Tensor.X) and aten ops (torch.ops.aten.X, any alias that dispatches there), and
Python functions given by dotted path (helpers.moe.permute, torch.compile), recognised by their code
whatever name reaches them.
"""
from __future__ import annotations

import _thread
import contextlib
import dis
import importlib
import inspect
import os
import re
import sys
import threading
import types
import warnings
from concurrent.futures import thread as futures_thread
from typing import Callable

import torch

from helpers.checks import STUB_TEXT, CheckFailed
from helpers.grading.judge import RECORDER_OFF, judge_case


# --- Calling an exercise function and recording what it calls --------------------------------------

def _code_keys(target) -> list:
    """The keys of a function's code, or of every function defined in a class: (file, first line); for a
    function of some size, also its body (BODY, names it reads, its instructions as _instructions gives them),
    which a copy shares under any file or function name, with its locals renamed, without its docstring, in
    a cell that imports torch elsewhere (short bodies, and a class's methods, are too common to tell a copy
    from a learner's own code)."""
    target = inspect.unwrap(target)
    if inspect.isclass(target):
        members = [inspect.unwrap(v) for v in vars(target).values() if inspect.isfunction(v)]
        return [(v.__code__.co_filename, v.__code__.co_firstlineno) for v in members if hasattr(v, "__code__")]
    code = getattr(target, "__code__", None)
    if code is None:
        return []
    body = _instructions(code)
    return [(code.co_filename, code.co_firstlineno)] + ([(BODY, code.co_names, body)] if len(body) >= MIN_BODY else [])


BODY, MIN_BODY = "body", 24
# What differs between copies of one source: the compiler's choice of a method call or an attribute load (it
# depends on whether the module imports the name), the NULL it pushes for a call, bookkeeping instructions.
_SAME_AS = {"LOAD_METHOD": "LOAD_ATTR", "CALL_METHOD": "CALL"}
_IGNORED = {"NOP", "RESUME", "CACHE", "PUSH_NULL", "PRECALL", "EXTENDED_ARG", "COPY_FREE_VARS", "MAKE_CELL"}


def _instructions(code) -> tuple:
    """A function's instructions as a copy of its source keeps them whatever it renames: each opcode with the
    global, attribute or constant it uses (code objects by their own instructions), its locals numbered in
    order of first use, jumps without their targets."""
    locals_seen: dict = {}
    out = []
    for ins in dis.get_instructions(code):
        op = _SAME_AS.get(ins.opname, ins.opname)
        if op in _IGNORED:
            continue
        if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            out.append((op,))
        elif ins.opcode in dis.haslocal or ins.opcode in dis.hasfree:
            out.append((op, locals_seen.setdefault(ins.argval, len(locals_seen))))
        elif inspect.iscode(ins.argval):
            out.append((op, _instructions(ins.argval)))
        else:
            out.append((op, repr(ins.argval)))
    return tuple(out)


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
            # The grader's own right answers (helpers.grading) are refused when called, not when their code
            # is written again: a learner's own right answer may be the same few lines.
            for key in _code_keys(target):
                if not (key[0] == BODY and module.startswith("helpers.grading.")):
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
    """The function that calls an exercise: `name` of this module or of a lab's harness module, or a plain
    call. Looked up in the modules' namespaces at each call (the sandbox restores them before calling)."""
    if not name:
        return lambda fn, *args, **kwargs: fn(*args, **kwargs)
    from helpers.grading.harnesses import MODULES
    for module in (sys.modules[__name__], *MODULES):
        if name in vars(module):
            return vars(module)[name]
    raise KeyError(f"no harness named {name!r} in helpers.grading.checks or helpers.grading.harnesses")


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

    bodies = {key[1] for key in codes if key[0] == BODY}   # the names each body reads: few calls share them

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            hit = codes.get((code.co_filename, code.co_firstlineno)) or (
                code.co_names in bodies and codes.get((BODY, code.co_names, _instructions(code))))
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


@contextlib.contextmanager
def substituted(fn: Callable, substitutes):
    """fn's globals with each (name, dotted path) pair bound to that public function, as they were after."""
    # a plain function's own globals only: unwrapping would run a submission's properties outside the recording
    namespace = fn.__globals__ if substitutes and isinstance(fn, types.FunctionType) else None
    if namespace is None:
        yield
        return
    missing = object()
    before = {name: namespace.get(name, missing) for name, _ in substitutes}
    for name, dotted in substitutes:
        module, _, attr = dotted.rpartition(".")
        namespace[name] = getattr(importlib.import_module(module), attr)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def call_case(fn: Callable, args, kwargs, call: str | None, forbidden=(), substitutes=()) -> dict:
    """One case as the grader sees it: {"value", "raised", "torch_calls"}; the value as returned (the
    sandbox makes it plain before it travels). An untouched stub is not called (a harness could describe a
    failure it never had): it raised NotImplementedError, as it would. `substitutes`: the exercise's
    (global name, public function) pairs, bound in fn's globals while it runs (Exercise.substitutes)."""
    record = {"value": None, "raised": None, "torch_calls": []}
    if is_untouched_stub(fn):
        record["raised"] = {"type": "NotImplementedError", "message": f"not started{STUB_TEXT}"}
        return record
    calls: list[str] = []

    def run():
        with substituted(fn, substitutes):
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
        got = call_case(fn, case.args, case.kwargs, case.call, exercise.forbidden, exercise.substitutes)
        problem = judge_case(exercise, case, expected, got)
        if problem is not None:
            raise CheckFailed(problem)
        print(f"✅ {exercise.title}: {case.name}: passed")


# --- Harnesses every lab may name (Case.call); a lab's own live in helpers/grading/harnesses/ ----------

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


def dtype_of_second(fn, *args, **kwargs) -> str:
    return str(fn(*args, **kwargs)[1].dtype)


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
