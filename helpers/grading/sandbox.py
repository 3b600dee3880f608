"""The student's side of grading: one process per submission that runs the notebook's code cells and
calls the exercise functions on the grader's inputs. It decides nothing: it sends what the functions
returned (tensors and plain values) and the grader judges that in its own process.

    python -I -m helpers.grading.sandbox RESULTS_FD

The grader starts it isolated (helpers.grading.isolation: namespaces, a cgroup, nothing of the repository
but the package) with `-I`, so no folder the submission can write is on the import path. Its job arrives on
stdin (the notebook, the exercises, the inputs, the limits: one weights-only torch blob, read whole before
any student line runs); what it finds leaves by RESULTS_FD, a pipe only the grader reads, as frames (an
8-byte length, then a weights-only torch blob): {"at": "cell 3" or an exercise}, {"result": name, "entry":
...}, {"cells": errors, "flags": ...}, {"done": True}.

Guards inside, set before any student code runs: CPU-time limits per cell and per call (ITIMER_PROF, raised
as CellTimeout; the grader's budget stops what swallows it), RLIMIT_CPU and, on CPU-only torch builds,
RLIMIT_AS; an audit hook that refuses the protected paths, new processes (for labs that do not build code)
and native code; and a check, before each result leaves, that the harness, the recorder and what sends the
results are the objects imported before the student's cells (a result sent after they were replaced is
marked "tampered" and earns nothing). These are guards inside the student's own process, not a boundary: a
submission that reaches the grader's objects through the interpreter's introspection can still change what
this process reports. The boundary is the isolation around it, and the grader judging values itself.

One exception for native code: a lab that builds its learner's C++ (lab 04, with torch's cpp_extension)
must load what it built, so where the job names `native_library_roots` (labs with allow_processes=True
only) ctypes.dlopen of a library inside those folders is allowed, as torch.ops.load_library does it.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import operator
import os
import pickle
import resource
import signal
import sys
import threading
import time
import types

from helpers.grading.messages import FRAME_HEADER
from helpers.grading.recorder import GRADING_ROOT, _in_library, forbidden_code

BLOCKED_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                  "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
                  "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "ctypes.addressof")
# the object graph and other threads' frames: what would let a submission reach the grader's harness
INTROSPECTION_EVENTS = ("sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents")
# attributes that reach a frame (CPython audits these reads as "object.__getattr__"): read by the notebook's own
# code at run time, however the name was spelled, they are a frame walk towards the recorder
FRAME_ATTRIBUTES = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code")
PATH_EVENTS = ("open", "os.remove", "os.rename", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
               "os.link", "os.symlink", "os.listdir", "os.scandir", "shutil.rmtree", "shutil.copyfile",
               "shutil.move")
_SELF = sys.modules[__name__]   # IPython puts its own module in sys.modules["__main__"] later


class CellTimeout(Exception):
    """The cell or call used more CPU time than its limit."""


def _on_limit(signum, frame):
    raise CellTimeout("ran past the time limit")


def _limit(cpu_seconds: float) -> None:
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)


def _from_the_notebook(code) -> bool:
    """Whether a code object is the notebook's (a cell, or a string it ran), not a library file's."""
    return not os.path.isfile(code.co_filename) or "ipykernel" in code.co_filename


def install_guard(protected: list[str], flags: list[str], allow_processes: bool = False,
                  native_library_roots: list[str] = ()) -> None:
    """The audit hook: refuse protected paths, new processes and native code; note each refusal in
    `flags`. With allow_processes, processes may start, and ctypes.dlopen may load a library whose real
    path is inside one of `native_library_roots` (ignored without allow_processes)."""
    process_events = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                      "os.forkpty", "pty.spawn")
    roots = [os.path.realpath(p) for p in protected]
    specs_folder = os.sep + os.path.join("grading", "specs") + os.sep   # the references, wherever the package is
    native_roots = [os.path.realpath(p) for p in native_library_roots] if allow_processes else []

    def is_native_library(path) -> bool:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        real = os.path.realpath(os.fsdecode(path))
        return any(real.startswith(r + os.sep) for r in native_roots)

    def is_protected(path) -> bool:
        if isinstance(path, int):
            return False
        real = os.path.realpath(os.fsdecode(path))
        return any(real == r or real.startswith(r + os.sep) for r in roots) or specs_folder in real + os.sep

    sandbox_file = os.path.realpath(__file__)
    import threading

    from helpers.grading.scan import INTERNALS, RUNTIME_INTERNALS, internals_in_source
    inside = threading.local()     # the hook's own sys._getframe raises an event too: not judged again

    def hook(event, args):
        if getattr(inside, "hook", False):
            return
        inside.hook = True
        try:
            judge(event, args)
        finally:
            inside.hook = False

    def judge(event, args):
        if event == "compile" and args and isinstance(args[0], (str, bytes)) and str(args[1]) == "<string>" \
                and _from_the_notebook(sys._getframe(2).f_code):
            # code the notebook built at run time (exec of a decoded string): read as the grader reads the notebook
            for found in internals_in_source(os.fsdecode(args[0]) if isinstance(args[0], bytes) else args[0]):
                flags.append(f"{RUNTIME_INTERNALS} {found}")
        # a frame reached by the notebook's own code, the name spelled out or not (getattr(sys, "_get" + "frame"))
        reached = "_getframe" if event == "sys._getframe" else \
            args[1] if event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES else None
        flag = f"{RUNTIME_INTERNALS} {reached} ({INTERNALS.get(reached, 'frames')})"
        if reached and flag not in flags and _from_the_notebook(sys._getframe(2).f_code):
            flags.append(flag)
        # sys._getframe(k) straight to the frame that holds the job and the pipe
        if event in INTROSPECTION_EVENTS or (event == "sys._getframe" and args and
                                             os.path.realpath(args[0].f_code.co_filename) == sandbox_file):
            flags.append(f"blocked {event}")
            raise PermissionError(f"grading: {event} is not allowed in a submission")
        if allow_processes and (event in process_events or event.startswith(("os.exec", "os.spawn"))):
            return
        if event == "ctypes.dlopen" and args and is_native_library(args[0]):
            return
        if event in BLOCKED_EVENTS or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            flags.append(f"blocked {event}")
            raise PermissionError(f"grading: {event} is not allowed in a submission")
        if event in PATH_EVENTS and args and args[0] is not None and is_protected(args[0]):
            flags.append(f"blocked {event} of {os.fsdecode(args[0]) if not isinstance(args[0], int) else args[0]}")
            raise PermissionError(f"grading: a submission may not access {args[0]!r}")
    sys.addaudithook(hook)


def _checked_by_the_grader(lab, fn, function=None, seed=0) -> None:
    print(f"{function or getattr(fn, '__name__', fn)}: checked by the grader")


def _plain(value, depth: int = 0):
    """What travels back: tensors of exactly torch.Tensor (or nn.Parameter), plain values, and lists, tuples and
    dicts of them; anything else as its type name. A tensor subclass is refused, not converted: converting runs
    its own code after the recording stopped, where it could compute the answer unseen."""
    import torch
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return value.detach().cpu().clone()
    if isinstance(value, torch.Tensor):
        return {"type": f"{type(value).__name__}_refused_as_a_tensor_subclass"}
    if value is None or type(value) in (bool, int, float, str):
        return value
    if depth < 4 and type(value) in (list, tuple):
        return type(value)(_plain(v, depth + 1) for v in value)
    if depth < 4 and type(value) is dict and all(type(k) in (str, int) for k in value):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    return {"type": type(value).__name__}


def _fill_scratch(seeds: dict) -> None:
    """Copy each scratch folder's read-only starting copy in (a build cache): what this user may not read is
    left out, and a folder that fills up keeps what fit (a build then starts from scratch)."""
    import shutil
    for folder, seed in seeds.items():
        try:
            shutil.copytree(seed, folder, symlinks=True, dirs_exist_ok=True)
        except (shutil.Error, OSError):
            pass


def _sender(fd: int):
    import torch
    save, write = torch.save, os.write

    def send(message) -> None:
        buffer = io.BytesIO()
        save(message, buffer)
        data = memoryview(FRAME_HEADER.pack(buffer.tell()) + buffer.getvalue())
        while data:
            data = data[write(fd, data):]
    return send


WATCHED = ("sys.setprofile", "sys.getprofile", "threading.setprofile", "torch.save", "os.write",
           "time.perf_counter", "time.process_time", "time.thread_time", "resource.getrusage", "statistics.median",
           "subprocess.Popen", "subprocess.Popen.__init__", "subprocess.Popen._execute_child",
           "TorchFunctionMode.__enter__", "TorchFunctionMode.__exit__",
           "TorchDispatchMode.__enter__", "TorchDispatchMode.__exit__")


def _roots() -> dict:
    """The objects the watched labels start from, by the name that starts the label."""
    import statistics
    import subprocess
    import threading

    import torch

    import helpers.grading.harnesses as harnesses
    import helpers.grading.judge as judge
    return {"sys": sys, "threading": threading, "torch": torch, "os": os, "io": io, "pickle": pickle, "time": time,
            "resource": resource, "statistics": statistics,
            "subprocess": subprocess,
            "TorchFunctionMode": torch.overrides.TorchFunctionMode,
            "TorchDispatchMode": torch.utils._python_dispatch.TorchDispatchMode,
            **{m.__name__: m for m in _harness_modules()}, harnesses.__name__: harnesses, judge.__name__: judge,
            __name__: _SELF}


def _harness_modules() -> tuple:
    """The modules whose functions call the learner's code: the checks' core, the recorder, each lab's
    harnesses and the course modules they measure with."""
    import helpers.grading.checks as checks
    import helpers.grading.recorder as recorder
    from helpers.grading.harnesses import MEASURING, MODULES
    return (checks, recorder, *MODULES, *MEASURING)


def _originals() -> tuple:
    """What must still be the same object when a result leaves: the harness module's functions and their
    code, the recorder, the sender's tools, and what turns recording on and off."""
    roots = _roots()
    found = {label: _current(label, roots) for label in WATCHED + ("helpers.grading.harnesses.MODULES",)}
    # what torch.save reaches at call time, by module attribute: a patched private function forges results
    for prefix, module in (("torch.serialization", roots["torch"].serialization), ("io", roots["io"]),
                           ("pickle", roots["pickle"])):
        found |= {f"{prefix}.{name}": value for name, value in vars(module).items() if callable(value)}
    for module in (*_harness_modules(), roots["helpers.grading.judge"], _SELF):
        for name, value in vars(module).items():
            if callable(value) and getattr(value, "__module__", None) == module.__name__:
                found[f"{module.__name__}.{name}"] = value
                for part in FUNCTION_PARTS if hasattr(value, "__code__") else ():
                    found[f"{module.__name__}.{name}.{part}"] = _part(value, part)
                for attr, member in vars(value).items() if isinstance(value, type) else ():
                    if callable(member):
                        found[f"{module.__name__}.{name}.{attr}"] = member
    return tuple(found.items())


# what a function runs with besides its code: a default rebound (rounds=1) or a closure's cell refilled
# changes what it measures as surely as new code
FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__", "__closure__")


def _part(fn, part: str):
    """A function's part as a value that compares by identity: its code, its defaults tuple, and its keyword
    defaults (names and values) and closure cells' contents as tuples of the objects they hold, compared one by
    one (both can be changed in place)."""
    value = getattr(fn, part)
    if part == "__kwdefaults__" and value is not None:
        return tuple(x for item in value.items() for x in item)
    if part == "__closure__" and value is not None:
        return tuple(_contents(cell) for cell in value)
    return value


_EMPTY_CELL = object()


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:      # a cell not yet filled
        return _EMPTY_CELL


def _current(label: str, roots: dict):
    """The object `label` names now (as _originals named it)."""
    for prefix in sorted(roots, key=len, reverse=True):
        if label.startswith(prefix + "."):
            value = roots[prefix]
            for part in label[len(prefix) + 1:].split("."):   # as defined, not as looked up (no binding)
                value = _part(value, part) if part in FUNCTION_PARTS else vars(value)[part]
            return value
    raise KeyError(label)


def _notebook_threads(baseline: set) -> list[str]:
    """Threads the notebook started that are alive now and run code of its own: what they call during a
    graded call is not recorded (a thread pool's workers are: recorder.record_calls follows their work)."""
    import functools
    from concurrent.futures import thread as futures_thread
    found = []
    for t in threading.enumerate():
        target = getattr(t, "_target", None) or type(t).run
        while isinstance(target, functools.partial):
            target = target.func
        if t in baseline or target is futures_thread._worker:
            continue
        code = getattr(target, "__code__", None)
        if code is None or _from_the_notebook(code):
            found.append(f"a thread the notebook started ({t.name}) was running during the call")
    return found


def tampered(originals: tuple) -> list[str]:
    """The labels of `originals` that name another object now."""
    try:
        roots = _roots()
    except Exception:   # a cell broke a path the roots are reached by: nothing can be vouched for
        return [label for label, _ in originals]
    changed = []
    for label, original in originals:
        try:
            now = _current(label, roots)
            same = now is original or (label.endswith(("__kwdefaults__", "__closure__")) and isinstance(original, tuple)
                                       and len(now) == len(original) and all(map(operator.is_, now, original)))
        except Exception:
            same = False
        if not same:
            changed.append(label)
    return changed


# --- The course helper that is an exercise's answer is absent while that exercise is graded -------------

ABSENT = "__labs_absent__"   # in a helper's module while its stand-in is in place: the dispatchers, by function


class AbsentHelper(RuntimeError):
    """A course helper that is the answer, called by the submission while its exercise is graded."""


def _helper_functions(name: str) -> list:
    """The Python functions behind a forbidden course helper (helpers.X.f, or each method of a class):
    none for torch's own functions, which the recorder refuses by name."""
    if not name.startswith("helpers."):
        return []
    module, _, attr = name.rpartition(".")
    try:
        target = inspect.unwrap(getattr(importlib.import_module(module), attr))
    except (ImportError, AttributeError):
        return []
    if inspect.isclass(target):
        return [v for v in vars(target).values() if inspect.isfunction(v)]
    return [target] if inspect.isfunction(target) else []


def _stand_in_code(fn, key: str):
    """Code with fn's free variables (its function keeps its closure) that hands its arguments to the
    dispatcher `key` of fn's module."""
    free = fn.__code__.co_freevars
    source = ("def outer():\n" + "".join(f"    {v} = None\n" for v in free) +
              "    def stand_in(*absent_args, **absent_kwargs):\n" +
              (f"        ({', '.join(free)},)\n" if free else "") +
              f"        return {ABSENT}[{key!r}](absent_args, absent_kwargs)\n    return stand_in\n")
    namespace: dict = {}
    exec(compile(source, f"<absent {key}>", "exec"), namespace)
    return namespace["outer"]().__code__


def _dispatcher(original, name: str, exercise: str, reached: list):
    """Runs `original` for the grader's harnesses (the first caller outside libraries is in helpers/grading);
    for anything else, the submission's code, notes `name` in `reached` and raises AbsentHelper."""
    def dispatch(args, kwargs):
        frame = sys._getframe(2)   # the stand-in's caller
        while frame is not None and _in_library(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(GRADING_ROOT):
            return original(*args, **kwargs)
        reached.append(name)
        raise AbsentHelper(f"{name} is not available while {exercise} is graded: the exercise asks for your "
                           f"own code")
    return dispatch


@contextlib.contextmanager
def absent_helpers(forbidden, exercise: str, reached: list):
    """While the block runs, the course's helpers among `forbidden` are absent for the submission: their code
    is swapped for a stand-in, so every reference the notebook holds (an import, an alias, a method of a
    subclass) reaches it; a call from the submission's code raises AbsentHelper and is noted in `reached`,
    a call by the grader's harness runs the helper as before. Restored when the block ends."""
    forbidden_code(tuple(forbidden))   # the recorder's keys, read from the helpers' own code first
    swapped, seen = [], set()
    try:
        for name in forbidden:
            for fn in _helper_functions(name):
                if id(fn) in seen:
                    continue
                seen.add(id(fn))
                original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                                              fn.__closure__)
                original.__kwdefaults__ = fn.__kwdefaults__
                key = f"{fn.__module__}.{fn.__qualname__}"
                fn.__globals__.setdefault(ABSENT, {})[key] = _dispatcher(original, name, exercise, reached)
                swapped.append((fn, fn.__code__))
                fn.__code__ = _stand_in_code(fn, key)
        yield
    finally:
        for fn, code in reversed(swapped):
            fn.__code__ = code
            fn.__globals__.pop(ABSENT, None)


def main(results_fd: int) -> int:
    import torch
    job = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    limits = job["limits"]
    if limits["address_space_mb"]:   # CPU-only torch builds: GPU builds map far more address space
        limit_bytes = int(limits["address_space_mb"] * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    cpu = int(limits["process_cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    signal.signal(signal.SIGPROF, _on_limit)
    send = _sender(results_fd)

    # everything the harness needs is imported before the first student line runs
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell

    import helpers.grading.checks
    import helpers.grading.recorder
    from helpers.grading.checks import call_case
    # The notebook's check cells would run the visible cases from the grading specs, which a submission
    # may not read: here they only say that the grader checks.
    helpers.grading.checks.check = _checked_by_the_grader
    if not (torch.cuda.is_available() or torch.xpu.is_available()):
        # Triton builds its own helpers (tl.cdiv, tl.sigmoid) when first imported, and torch._dynamo imports
        # it just below: on a machine without a GPU they must be built for the interpreter, as a lab sets
        # TRITON_INTERPRET=1 there before its first import, or a learner's interpreted kernel cannot call them
        os.environ.setdefault("TRITON_INTERPRET", "1")
    helpers.grading.recorder.record_calls(lambda: torch.zeros(1) + 1, ("add",))   # imports torch._dynamo, once
    harness_state = {m: dict(vars(m)) for m in _harness_modules()}   # restored before the calls: cells may rebind names
    originals = _originals()
    baseline_threads = set(threading.enumerate())

    nb = nbformat.reads(job["notebook"], as_version=4)
    # what the calls use, as tuples: a submission that reaches this frame cannot change them
    exercises = tuple((name, limits["call_cpu_seconds"][name],
                       tuple((tuple(c["args"]), tuple(c["kwargs"].items()), c["call"], tuple(c["forbidden"]),
                              tuple(tuple(p) for p in c["substitutes"])) for c in job["inputs"][name]))
                      for name in job["exercises"])
    cell_limits, cell_default = dict(limits["cell_cpu_seconds"]), limits["cell_cpu_default"]
    skip_cells = tuple(job["skip_cells"])
    protected, allow_processes = tuple(job["protected"]), job["allow_processes"]
    native_roots = tuple(job["native_library_roots"])
    _fill_scratch(job["scratch_seeds"])
    del job, limits
    log = os.open("output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    shell = InteractiveShell.instance()
    flags: list[str] = []
    install_guard(list(protected), flags, allow_processes, list(native_roots))

    cell_errors, cell_cpu = [], []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or index in skip_cells:
            continue
        send({"at": f"cell {index}"})
        start = time.process_time()
        _limit(cell_limits.get(index, cell_default))
        try:
            outcome = shell.run_cell(cell.source, store_history=False)
        except CellTimeout:
            outcome = None
        finally:
            _limit(0)
        cell_cpu.append([index, time.process_time() - start])
        if outcome is None or not outcome.success:
            err = None if outcome is None else (outcome.error_in_exec or outcome.error_before_exec)
            cell_errors.append(f"cell {index}: {type(err).__name__ if err else 'CellTimeout'}: {err or ''}"[:300])
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            shell.run_cell("QUICK = True", store_history=False)
    send({"cells": cell_errors, "cell_cpu_seconds": cell_cpu, "flags": sorted(set(flags))})

    for module, state in harness_state.items():
        vars(module).update(state)
    building_for = [None]     # a compiler run inside a call is a step of its own for the grader's limits
    import helpers.ext
    helpers.ext.BUILD_LISTENERS.append(lambda phase: send({"at": "build" if phase == "start" else building_for[0]}))
    for name, call_cpu_limit, cases in exercises:
        building_for[0] = name
        send({"at": name})
        fn = shell.user_ns.get(name)
        entry = {"defined": callable(fn), "cases": []}
        for args, kwargs, call, forbidden, substitutes in cases if callable(fn) else ():
            send({"at": name})   # each case is a step of its own for the grader's limits
            record = {"value": None, "raised": None, "torch_calls": [], "cpu_seconds": 0.0, "tampered": []}
            last = entry["cases"][-1]["raised"] if entry["cases"] else None
            if last and last["type"] == "CellTimeout":   # one hang is enough: the other cases are not run
                record["raised"] = {"type": "CellTimeout",
                                    "message": "not run: an earlier case ran past the time limit"}
                entry["cases"].append(record)
                continue
            start = time.process_time()
            reached: list[str] = []
            try:
                with absent_helpers(forbidden, name, reached):
                    _limit(call_cpu_limit)
                    try:
                        record.update(call_case(fn, list(args), dict(kwargs), call, forbidden, substitutes))
                    finally:
                        _limit(0)
                record["value"] = _plain(record["value"])
            except BaseException as exc:   # the time limit (CellTimeout), or a failure of the harness itself
                _limit(0)
                record["value"], record["raised"] = None, {"type": type(exc).__name__, "message": str(exc)[:500]}
            record["torch_calls"] = sorted(set(record["torch_calls"]) | set(reached))
            record["cpu_seconds"] = time.process_time() - start
            record["tampered"] = tampered(originals) + _notebook_threads(baseline_threads)
            entry["cases"].append(record)
        send({"result": name, "entry": entry, "flags": sorted(set(flags))})
    send({"done": True})
    return 0


if __name__ == "__main__":
    os._exit(main(int(sys.argv[1])))
