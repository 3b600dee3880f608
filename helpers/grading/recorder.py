"""What an exercise's call reaches, recorded: the one recorder of the grader and of the notebooks' checks.

`record_calls(run, forbidden)` runs `run()` and names the forbidden functions it reached, on its own thread,
on every thread it starts and in thread pools: torch functions by name (torch.X, torch.nn.functional.X,
Tensor.X) and aten ops (torch.ops.aten.X, any alias that dispatches there), and Python functions given by
dotted path (helpers.moe.permute, torch.compile), recognised by their code whatever name reaches them. The
sandbox watches this module's functions as it watches the harnesses (helpers.grading.sandbox): a
submission that rebinds one is caught.
"""
from __future__ import annotations

import _thread
import contextlib
import dis
import functools
import importlib
import inspect
import os
import sys
import threading
import types
import warnings
from concurrent.futures import thread as futures_thread
from typing import Callable

import torch

from helpers.grading.judge import RECORDER_OFF


def _code_keys(target) -> list:
    """The keys of a function's code, or of every function defined in a class: (file, first line); for a
    function of some size, also its clone (CLONE, names it reads, bytecode, constants with the docstring), which
    a copy of its code object keeps (code.replace(co_firstlineno=...), another file name), and its body (BODY,
    names, its instructions as _instructions gives them), which a copy of its source shares under any file or
    function name, with its locals renamed, without its docstring, in a cell that imports torch elsewhere
    (short bodies, and a class's methods, are too common to tell a copy from a learner's own code)."""
    target = inspect.unwrap(target)
    if inspect.isclass(target):
        members = [inspect.unwrap(v) for v in vars(target).values() if inspect.isfunction(v)]
        return [(v.__code__.co_filename, v.__code__.co_firstlineno) for v in members if hasattr(v, "__code__")]
    code = getattr(target, "__code__", None)
    if code is None:
        return []
    body = _instructions(code)
    return [(code.co_filename, code.co_firstlineno)] + (
        [(CLONE, code.co_names, *_clone(code)), (BODY, code.co_names, body)] if len(body) >= MIN_BODY else [])


def _clone(code) -> tuple:
    return code.co_code, tuple(c for c in code.co_consts if not inspect.iscode(c))


CLONE, BODY, MIN_BODY = "clone", "body", 24
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


@functools.cache
def forbidden_code(forbidden: tuple) -> types.MappingProxyType:
    """The Python functions among `forbidden`, by their code keys: dotted names (helpers.moe.permute), and for
    each op name (softmax) its decompositions and other libraries' functions of that name (ALIAS_MODULES).
    Read once per tuple, as the functions are before any is graded: the sandbox computes them before it makes
    an exercise's helpers absent (helpers.grading.sandbox.absent_helpers swaps their code)."""
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
            # The grader's own right answers (helpers.grading) are refused when called or cloned, not when
            # their source is written again: a learner's own right answer may be the same few lines.
            for key in _code_keys(target):
                if not (key[0] == BODY and module.startswith("helpers.grading.")):
                    keys[key] = name
    return types.MappingProxyType(keys)


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


def record_calls(run: Callable[[], object], forbidden) -> tuple[object, list[str]]:
    """run() with the forbidden functions it reaches recorded, on its own thread and on every thread it
    starts and in thread pools; returns (its value, the names reached). torch's mode stacks found without
    the recorder at the end are reported as RECORDER_OFF. Exceptions propagate. Recording is off when nothing is forbidden (torch.compile
    then runs as usual)."""
    if not forbidden:
        return run(), []
    names: set[str] = set()
    codes = forbidden_code(tuple(forbidden))
    plain = {n for n in forbidden if "." not in n}

    bodies = {key[1] for key in codes if key[0] in (CLONE, BODY)}   # the names each reads: few calls share them

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            hit = codes.get((code.co_filename, code.co_firstlineno)) or (
                code.co_names in bodies and (codes.get((CLONE, code.co_names, *_clone(code)))
                                             or codes.get((BODY, code.co_names, _instructions(code)))))
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


def _unrecorded(run: Callable[[], object]) -> object:
    """run() with record_calls' profiler off: what a harness computes for itself (the truth it compares
    with) is not the learner's call of a forbidden function."""
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        return run()
    finally:
        sys.setprofile(previous)


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
