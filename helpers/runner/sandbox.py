"""The student's side of grading: one process per submission that runs the notebook's code cells and
calls the exercise functions on the grader's inputs. It decides nothing: it writes what the functions
returned (tensors and plain values, a weights-only torch file) and the grader judges that in its own
process. So a submission that redefines the checks or prints "passed" changes nothing that is read.

    python -m helpers.runner.sandbox JOB.json

Guards, set before any student code runs: address-space (on CPU-only machines) and CPU-time limits
(setrlimit; the grader also watches resident memory and wall time), a soft timeout per
cell and per call (SIGALRM), and an audit hook that refuses to open the protected paths (the lab
solutions, the grading specs, the other submissions, the grader's output) and to start processes or
load native code. Audit hooks are a guard against the ordinary ways, not a security boundary: for a
hostile class, also run the grader where the solutions are not on disk.

One exception for native code: a lab that builds its learner's C++ (lab 04, with torch's cpp_extension)
must load what it built, so where the job names `native_library_roots` (the grader passes the helpers'
extension cache, helpers.ext.CACHE_DIR, for labs with allow_processes=True only) ctypes.dlopen of a
library inside those folders is allowed, as torch.ops.load_library does it. Nothing else about ctypes
is: no dlsym, no calls through ctypes. That adds nothing a submission could not already do in such a
lab, which may start processes (the compiler) and so run native code in them anyway.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

BLOCKED_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                  "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
                  "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "ctypes.addressof")
PATH_EVENTS = ("open", "os.remove", "os.rename", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
               "os.link", "os.symlink", "os.listdir", "os.scandir", "shutil.rmtree", "shutil.copyfile",
               "shutil.move")


class CellTimeout(Exception):
    """The cell or call ran past its time limit."""


def _on_alarm(signum, frame):
    raise CellTimeout("ran past the time limit")


def _limit(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, seconds)


def install_guard(protected: list[str], flags: list[str], allow_processes: bool = False,
                  native_library_roots: list[str] = ()) -> None:
    """The audit hook: refuse protected paths, new processes and native code; note each refusal in
    `flags`. With allow_processes, processes may start, and ctypes.dlopen may load a library whose real
    path is inside one of `native_library_roots` (ignored without allow_processes)."""
    process_events = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                      "os.forkpty", "pty.spawn")
    roots = [os.path.realpath(p) for p in protected]
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
        return any(real == r or real.startswith(r + os.sep) for r in roots) or \
            os.path.basename(real).startswith("grading_specs")

    def hook(event, args):
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
    """What travels back: plain tensors (a subclass loses its class), plain values, and lists, tuples and
    dicts of them; anything else as its type name."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().as_subclass(torch.Tensor).clone()
    if value is None or type(value) in (bool, int, float, str):
        return value
    if depth < 4 and type(value) in (list, tuple):
        return type(value)(_plain(v, depth + 1) for v in value)
    if depth < 4 and type(value) is dict and all(type(k) in (str, int) for k in value):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    return {"type": type(value).__name__}


def _save(results: dict, path: Path) -> None:
    import torch
    tmp = path.with_name(path.name + ".tmp")
    torch.save(results, tmp)
    os.replace(tmp, path)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    work = Path(job["workdir"])
    if job["address_space_limit_mb"]:   # CPU-only torch builds: GPU builds map far more address space
        limit_bytes = int(job["address_space_limit_mb"] * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    cpu = int(job["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    signal.signal(signal.SIGALRM, _on_alarm)

    # everything the harness needs is imported before the first student line runs
    import nbformat
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    import helpers.lab_checks
    from helpers.lab_checks import call_case
    # The notebook's check cells would run the visible cases from the grading specs, which a submission
    # may not read (nor import: the guard refuses the file): here they only say that the grader checks.
    helpers.lab_checks.check = _checked_by_the_grader
    harness_state = dict(vars(helpers.lab_checks))   # restored before the calls: cells may patch it
    if not (torch.cuda.is_available() or torch.xpu.is_available()):
        # Triton builds its own helpers (tl.cdiv, tl.sigmoid) when first imported, and torch._dynamo imports
        # it just below: on a machine without a GPU they must be built for the interpreter, as a lab sets
        # TRITON_INTERPRET=1 there before its first import, or a learner's interpreted kernel cannot call them
        os.environ.setdefault("TRITON_INTERPRET", "1")
    helpers.lab_checks.record_calls(lambda: torch.zeros(1) + 1, ("add",))   # imports torch._dynamo, once

    nb = nbformat.read(job["notebook"], as_version=4)
    inputs = torch.load(job["inputs"], weights_only=True)
    results_path, marker = work / "results.pt", work / "current.txt"
    results = torch.load(results_path, weights_only=True) if results_path.exists() else {}
    log = open(work / "output.log", "a")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    shell = InteractiveShell.instance()
    flags: list[str] = []
    install_guard(job["protected"], flags, job["allow_processes"], job.get("native_library_roots", []))

    cell_errors = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or index in job["skip_cells"]:
            continue
        marker.write_text(f"cell {index}")
        _limit(job["cell_timeout"])
        try:
            outcome = shell.run_cell(cell.source, store_history=False)
        except CellTimeout:
            outcome = None
        finally:
            _limit(0)
        if outcome is None or not outcome.success:
            err = None if outcome is None else (outcome.error_in_exec or outcome.error_before_exec)
            cell_errors.append(f"cell {index}: {type(err).__name__ if err else 'CellTimeout'}: {err or ''}"[:300])
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            shell.run_cell("QUICK = True", store_history=False)

    vars(helpers.lab_checks).update(harness_state)
    for name in job["exercises"]:
        marker.write_text(name)
        fn = shell.user_ns.get(name)
        entry = {"defined": callable(fn), "cases": []}
        for case in inputs[name] if callable(fn) else []:
            record = {"value": None, "raised": None, "torch_calls": [], "seconds": 0.0}
            last = entry["cases"][-1]["raised"] if entry["cases"] else None
            if last and last["type"] == "CellTimeout":   # one hang is enough: the other cases are not run
                record["raised"] = {"type": "CellTimeout",
                                    "message": "not run: an earlier case ran past the time limit"}
                entry["cases"].append(record)
                continue
            start = time.perf_counter()
            _limit(job["call_timeout"])
            try:
                record.update(call_case(fn, case["args"], case["kwargs"], case["call"], case["forbidden"]))
                _limit(0)
                record["value"] = _plain(record["value"])
            except BaseException as exc:   # the time limit (CellTimeout), or a failure of the harness itself
                _limit(0)
                record["value"], record["raised"] = None, {"type": type(exc).__name__, "message": str(exc)[:500]}
            record["seconds"] = time.perf_counter() - start
            entry["cases"].append(record)
        results[name] = entry
        results["_flags"] = sorted(set(results.get("_flags", [])) | set(flags))
        results["_cell_errors"] = cell_errors
        _save(results, results_path)
    results["_flags"] = sorted(set(results.get("_flags", [])) | set(flags))
    results["_cell_errors"] = cell_errors
    _save(results, results_path)
    marker.write_text("done")
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1]))
