"""Grade a folder of lab submissions: python -m helpers grade LAB SUBMISSIONS_DIR.

Each submission runs in its own sandbox process (helpers.grading.sandbox), isolated by the operating system
where the machine allows it (helpers.grading.isolation: namespaces and a cgroup; elsewhere a loud warning and
"not isolated" in every row). It only returns what the student's functions give back on inputs drawn here from
a secret seed; this process computes the references (helpers.grading.specs) and judges every case
(helpers.grading.judge) outside the student's reach. The job goes in over a pipe, the results come back over
another, read without ever blocking; a crash or a hang costs the exercise where it happened, and the exercises
after it are graded in a fresh process, all within one budget per submission.

Limits follow the lab's solution, graded first in the same run: a call may use CPU_FACTOR times the CPU time
of the solution's slowest case of that exercise (at least CALL_FLOOR_S), a cell CPU_FACTOR times its slowest
cell (at least CELL_FLOOR_S), the start-up (interpreter, torch, this package, up to the sandbox's first
message) CPU_FACTOR times the solution's own start-up (at least CELL_FLOOR_S), a submission CPU_FACTOR times
the solution's whole CPU time plus BUDGET_SLACK_S. CPU time, not wall time: a busy machine slows a submission's clock, not its CPU time, so the
same file gets the same score. Wall time only stops what waits without computing (a sleep, a blocked read):
`time_limit` seconds per submission, by default WALL_FACTOR times the solution's wall time, at least
WALL_FLOOR_S.

Writes OUT/scores.csv (one row per student, one column per exercise) and OUT/feedback/STUDENT.md (each
check, passed or failed with its hint; hidden checks are named but their inputs are not shown).
"""
from __future__ import annotations

import importlib.util
import io
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import torch

from helpers.device import capabilities, missing
from helpers.ext import CACHE_DIR
from helpers.files import write_text_atomic
from helpers.grading import isolation
from helpers.grading.checks import expected_result
from helpers.grading.judge import judge_case
from helpers.grading.report import feedback, scores_csv
from helpers.grading.scan import RUNTIME_INTERNALS, interpreter_internals, project_internals
from helpers.grading.messages import UNREADABLE, frames
from helpers.grading.specs import LabSpec, spec_for
from helpers.grading.specs.core import CENTRAL_CAP, SubmissionRefused
from helpers.env import HEADLESS_ENV
from helpers.processes import kill, memory_mb, process_tree

REPO = Path(__file__).resolve().parent.parent.parent
SOLUTIONS = REPO / "labs" / "solutions"
PROTECTED = [SOLUTIONS, REPO / "helpers" / "grading" / "specs", REPO / ".git", REPO / "runs"]
CPU_FACTOR = 10
CALL_FLOOR_S, CELL_FLOOR_S, BUDGET_SLACK_S = 2.0, 10.0, 60.0
WALL_FACTOR, WALL_FLOOR_S = 10, 120.0
MAX_SKIPPED_CELLS = 3
STEP_CPU_FACTOR, STEP_WALL_FACTOR, STEP_SLACK_S = 1.5, 5.0, 15.0
START = "start"   # the step before the sandbox's first message: the interpreter, torch and the package starting
BUILD_CPU_S = 300.0           # a compiler run (lab 04's extension): its own step, never the call's time
MAX_RESULTS_MB = 512          # what one sandbox may send back in all
MAX_NOTEBOOK_MB = 20          # a submitted notebook (the solutions are well under 1 MB)
MAX_NAME = 64                 # characters of a student's name
TEMP_PREFIX = "labs-grade-"   # then the grader's pid: what a dead grader left is found by it
POLL_S = 0.1
STOP_TEXT = {"timeout": "ran past the time limit and was stopped (look for a loop that never ends)",
             "memory": "used more memory than the limit and was stopped",
             "too much output": "sent back more than the grader reads and was stopped",
             "unreadable": "sent the grader a message it could not read and was stopped"}


def student_name(raw: str) -> str:
    """A submission's name made safe for a file name, a terminal and a spreadsheet: its letters, digits and
    . _ - @ + (anything else becomes _), at most MAX_NAME characters, never empty nor a hidden file."""
    name = "".join(c if c.isalnum() or c in "._-@+" else "_" for c in raw)[:MAX_NAME].lstrip(".")
    return name or "unnamed"


def _remove_what_dead_graders_left() -> None:
    """The temp folders and cgroups of graders that were killed (their pid is gone), before this one adds its own."""
    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = folder.name[len(TEMP_PREFIX):].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    isolation.remove_stale_cgroups()


def _project_in(entry: Path) -> Path:
    """A submission's project folder (it holds __init__.py): the entry itself, else the one folder inside it
    that is one; else the entry, which the lab's spec then refuses, saying what it lacks (no project, or
    several: which one was meant is not guessed)."""
    if (entry / "__init__.py").is_file():
        return entry
    inside = [p for p in sorted(entry.iterdir()) if p.is_dir() and not p.is_symlink() and (p / "__init__.py").is_file()]
    return inside[0] if len(inside) == 1 else entry


def find_submissions(folder: str | Path, projects: bool = False) -> dict[str, Path]:
    """student name -> notebook: NAME.ipynb in the folder, or one .ipynb inside a folder NAME/; with
    `projects`, student name -> project folder: NAME/ holding __init__.py, or one folder inside NAME/ that
    does. Names are made safe (student_name); two submissions that would share a name (alice.ipynb and
    alice/) both stay, the later one as NAME~2."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of submissions")
    found = {}
    for entry in sorted(folder.iterdir()):
        notebook = None
        if projects:
            if entry.is_dir() and not entry.is_symlink() and entry.name != "graded":
                notebook, raw = _project_in(entry), entry.name
        elif entry.suffix == ".ipynb" and entry.is_file() and not entry.is_symlink():
            notebook, raw = entry, entry.stem
        elif entry.is_dir() and not entry.is_symlink() and entry.name not in ("graded", ".ipynb_checkpoints"):
            notebooks = sorted(p for p in entry.glob("*.ipynb") if p.is_file() and not p.is_symlink())
            notebook, raw = (notebooks[0], entry.name) if notebooks else (None, "")
        if notebook is None:
            continue
        name, copy = student_name(raw), 1
        while name in found:
            copy += 1
            name = f"{student_name(raw)[:MAX_NAME - 4]}~{copy}"
        found[name] = notebook
    if not found:
        raise ValueError(f"no submissions in {folder}: expected " + ("NAME/ project folders (each with __init__.py)"
                         if projects else "NAME.ipynb files or NAME/ folders with one .ipynb"))
    return found


# --- One sandbox process ---------------------------------------------------------------------------

class _Usage:
    """CPU time and memory of one sandbox: from its cgroup where there is one, else from its process tree
    (CPU time of ended processes kept as last seen)."""

    def __init__(self, root: psutil.Process, cgroup: dict | None):
        self.root, self.cgroup, self.cpu_seen = root, cgroup, {}

    def cpu_seconds(self) -> float:
        if self.cgroup is not None:
            return isolation.cgroup_cpu_seconds(self.cgroup)
        for p in [self.root] + process_tree(self.root):
            try:
                t = p.cpu_times()
                self.cpu_seen[p.pid] = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return sum(self.cpu_seen.values())

    def memory_mb(self) -> float:
        return memory_mb([self.root] + process_tree(self.root))


def _sandbox_process(job: dict, isolated: bool, cgroup: dict | None, work: Path, scratch: dict) -> tuple:
    """Start the sandbox: returns (process, the results pipe's read end)."""
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-I", "-m", "helpers.grading.sandbox", str(write_fd)]
    threads, extra = job["threads"], {HEADLESS_ENV: "1", "LABS_CACHE": str(CACHE_DIR.parent)}
    if isolated:
        argv = isolation.in_cgroup(cgroup, isolation.sandbox_argv(command, threads=threads, env=extra,
                                                                  scratch=scratch))
        env, cwd = None, "/"
    else:
        argv, cwd = command, work
        env = isolation.sandbox_env(threads, {**extra, "HOME": str(work), "TMPDIR": str(work)})
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, pass_fds=(write_fd,), start_new_session=True)
    os.close(write_fd)
    return proc, read_fd


def _feed(proc: subprocess.Popen, blob: bytes) -> None:
    """Write the job to the sandbox's stdin on a side thread (it reads it whole once torch is imported)."""
    def write():
        try:
            proc.stdin.write(blob)
            proc.stdin.close()
        except OSError:   # the sandbox ended before reading it all
            pass
    threading.Thread(target=write, daemon=True).start()


def run_attempt(job: dict, blob: bytes, *, isolated: bool, memory_limit_mb: float, cpu_left: float,
                wall_left: float, scratch: dict, step_cpu) -> dict:
    """Run the sandbox once within what is left of the submission's budget, and each of its steps (the start,
    a cell, an exercise's calls: step_cpu(marker) is its CPU limit inside the sandbox) within STEP_CPU_FACTOR
    times that in CPU time and STEP_WALL_FACTOR times in wall time, plus STEP_SLACK_S: what ignores the
    sandbox's own limit, or waits without computing, costs only its step. Returns {"messages", "stopped"
    (None, "timeout", "memory", "too much output", "crashed (...)"), "cpu_seconds", "wall_seconds", "build_seconds", "cgroup"
    (whether the attempt ran in a cgroup of its own), "wall_timeout" (stopped by a wall-time limit)}."""
    cgroup = isolation.create_cgroup(f"{os.getpid()}-{secrets.token_hex(4)}", memory_mb=memory_limit_mb * 1.5,
                                     cpus=job["threads"]) if isolated else None
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        proc, fd = _sandbox_process(job, isolated, cgroup, Path(tmp), scratch)
        _feed(proc, blob)
        usage, buffer, messages, received, stopped = _Usage(psutil.Process(proc.pid), cgroup), bytearray(), [], 0, None
        eof, step_limit, step_wall, step_cpu_start, by_wall = False, step_cpu(START), start, 0.0, False
        building, build_s, start_cpu = False, 0.0, None
        try:
            while True:
                if eof:
                    time.sleep(POLL_S)
                readable = [] if eof else select.select([fd], [], [], POLL_S)[0]
                chunk = os.read(fd, 1 << 20) if readable else b""
                eof = eof or bool(readable) and not chunk   # every writer closed the pipe
                received += len(chunk)
                buffer += chunk
                now, cpu_now = time.monotonic(), usage.cpu_seconds()
                for message in frames(buffer):
                    messages.append(message)
                    if message is UNREADABLE:
                        stopped = "unreadable"
                    elif "at" in message:
                        start_cpu = cpu_now if start_cpu is None else start_cpu   # the start-up ends at the first step
                        build_s += now - step_wall if building else 0.0
                        building = message["at"] == "build"
                        step_limit, step_wall, step_cpu_start = step_cpu(message["at"]), now, cpu_now
                if stopped is None and eof and proc.poll() is not None:
                    break
                if stopped is None:
                    if received > MAX_RESULTS_MB * 2**20:
                        stopped = "too much output"
                    elif usage.memory_mb() > memory_limit_mb:
                        stopped = "memory"
                    elif cpu_now > cpu_left or cpu_now - step_cpu_start > STEP_CPU_FACTOR * step_limit + STEP_SLACK_S:
                        stopped = "timeout"
                    elif now - start > wall_left or now - step_wall > STEP_WALL_FACTOR * step_limit + STEP_SLACK_S:
                        stopped, by_wall = "timeout", True   # waited, or the machine was busy: see grade_submissions
                    elif proc.poll() is not None and not readable:
                        # ended, and nothing more in the pipe: a process it left holding the pipe open (only
                        # possible without isolation) gets one more poll, not a wait
                        if not select.select([fd], [], [], POLL_S)[0]:
                            break
                if stopped:
                    kill([usage.root] + process_tree(usage.root))
                    break
        except Exception as exc:   # the grader's own error while reading: the sandbox never outlives it
            stopped = f"grader error ({type(exc).__name__})"
        finally:
            os.close(fd)
            if proc.poll() is None:
                kill([usage.root] + process_tree(usage.root))
            proc.wait()
            cpu = usage.cpu_seconds()
            oom = cgroup is not None and isolation.cgroup_oom_killed(cgroup)
            isolation.remove_cgroup(cgroup)
    code = proc.returncode
    if isolated and code > 128:   # bwrap exits with 128 + the signal that ended the sandboxed process
        code = 128 - code
    if stopped is None and code != 0:
        if oom:
            stopped = "memory"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            stopped = {"SIGXCPU": "timeout", "SIGKILL": "killed (SIGKILL)"}.get(name, f"crashed ({name})")
        else:
            stopped = f"crashed (exit status {code})"
    return {"messages": messages, "stopped": stopped, "cpu_seconds": cpu, "wall_seconds": time.monotonic() - start,
            "cgroup": cgroup is not None, "wall_timeout": by_wall, "build_seconds": build_s, "start_cpu_seconds": start_cpu}


def run_submission(notebook: Path, spec: LabSpec, inputs: dict, limits: dict, *, threads: int,
                   memory_limit_mb: float, isolated: bool, protected: list[Path]) -> dict:
    """Every attempt a submission needs, within one budget: returns {"results": {function: entry},
    "faults": {function: text}, "stops", "flags", "cell_errors", "cpu_seconds", "wall_seconds",
    "cell_cpu_seconds", "cgroup" (whether every attempt ran in a cgroup of its own), "wall_timeout" (whether
    a wall-time limit stopped an attempt or the budget)}."""
    remaining = [e.function for e in spec.exercises]
    faults, stops, skip, notes, results, flags, cell_errors, cell_cpu = {}, [], [], [], {}, set(), [], []
    cpu_used, wall_used, in_cgroups, wall_timeout, build_s, start_cpu = 0.0, 0.0, True, False, 0.0, 0.0
    try:
        if spec.submission is not None:   # a project folder: the notebook that measures it
            text = spec.submission(notebook)
        elif notebook.stat().st_size > MAX_NOTEBOOK_MB * 2**20:
            raise SubmissionRefused(f"it is {notebook.stat().st_size / 2**20:.0f} MB, more than the {MAX_NOTEBOOK_MB} MB a "
                             f"submission may be: clear its outputs before you hand it in")
        else:
            text = notebook.read_text()
        nbformat.validate(nbformat.reads(text, as_version=4))
    except Exception as exc:   # too large, not JSON, not a notebook, a project lacking a file: nothing to run
        why = str(exc) if isinstance(exc, SubmissionRefused) else \
            f"the submission is not a valid notebook ({type(exc).__name__})"
        faults = {name: why for name in remaining}
        stops, remaining = ["malformed notebook" if spec.submission is None else "refused project"], []
    scratch = _scratch_folders(spec, isolated)
    cell_limits = dict(limits["cell_cpu_seconds"])

    def step_cpu(marker: str) -> float:
        """The CPU limit of the step the sandbox says it is in: its start-up, an exercise's call, a build, or a cell."""
        if marker == "build":
            return BUILD_CPU_S
        if marker == START:
            return limits["start_cpu_seconds"]
        if marker in inputs:
            return limits["call_cpu_seconds"][marker]
        cell = re.fullmatch(r"cell (\d+)", marker)
        return cell_limits.get(int(cell.group(1)), limits["cell_cpu_default"]) if cell else limits["cell_cpu_default"]
    for _attempt in range(len(remaining) + MAX_SKIPPED_CELLS + 1):
        if not remaining:
            break
        if cpu_used >= limits["budget_cpu_seconds"] or wall_used >= limits["wall_seconds"]:
            wall_timeout = wall_timeout or wall_used >= limits["wall_seconds"]
            for name in remaining:
                faults.setdefault(name, "not run: the submission's time budget was spent")
            remaining = []
            break
        job = {"skip_cells": skip, "exercises": remaining, "notebook": text, "threads": threads,
               "inputs": {name: inputs[name] for name in remaining}, "limits": {
                   **limits, "address_space_mb": memory_limit_mb if capabilities().build_accelerator is None
                   else None},   # a GPU build maps gigabytes of libraries: only the watcher's limit applies
               "protected": [str(p) for p in protected], "allow_processes": spec.allow_processes,
               "native_library_roots": list(scratch) if spec.allow_processes else [],
               "scratch_seeds": isolation.scratch_seeds(scratch) if isolated else {}}
        buffer = io.BytesIO()
        torch.save(job, buffer)
        attempt = run_attempt(job, buffer.getvalue(), isolated=isolated, memory_limit_mb=memory_limit_mb,
                              cpu_left=limits["budget_cpu_seconds"] - cpu_used,
                              wall_left=limits["wall_seconds"] - wall_used, scratch=scratch, step_cpu=step_cpu)
        cpu_used += attempt["cpu_seconds"]
        in_cgroups = in_cgroups and attempt["cgroup"]
        wall_timeout = wall_timeout or attempt["wall_timeout"]
        build_s += attempt["build_seconds"]
        start_cpu = max(start_cpu, attempt["start_cpu_seconds"] or 0.0)
        wall_used += attempt["wall_seconds"]
        marker, done = "cells", False
        for message in attempt["messages"]:
            if message is UNREADABLE:
                flags.add("sent the grader a message it could not read")
            elif "at" in message:
                marker = message["at"]
            elif "cells" in message:
                cell_errors, cell_cpu = message["cells"], message["cell_cpu_seconds"]
                flags |= set(message["flags"])
            elif "result" in message and message["result"] in remaining:
                results[message["result"]] = message["entry"]
                flags |= set(message["flags"])
            elif message.get("done"):
                done = True
        stopped = attempt["stopped"]
        if stopped:
            stops.append(stopped)
        if stopped is None and done:
            break
        why = STOP_TEXT.get(stopped, stopped) if stopped else "ended its process early"
        cell = re.fullmatch(r"cell (\d+)", marker)
        if cell and len(skip) < MAX_SKIPPED_CELLS:   # run again without that cell
            skip.append(int(cell.group(1)))
            notes.append(f"cell {skip[-1]} {why}; it was left out and the notebook run again")
            continue
        if marker not in remaining:   # while the cells ran (or a marker the submission sent itself)
            for name in remaining:
                if name not in results:
                    faults[name] = f"the notebook {why} while its cells ran"
            break
        faults[marker] = f"the function {why}"
        remaining = [n for n in remaining if n not in results and n not in faults]
    for name in remaining:
        if name not in results and name not in faults:
            faults[name] = "could not be graded: the notebook kept stopping early"
    return {"results": results, "faults": faults, "stops": stops, "flags": sorted(flags),
            "cell_errors": notes + cell_errors, "cpu_seconds": cpu_used, "wall_seconds": wall_used,
            "cell_cpu_seconds": cell_cpu, "cgroup": in_cgroups, "wall_timeout": wall_timeout,
            "build_seconds": build_s, "start_cpu_seconds": start_cpu}


def _scratch_folders(spec: LabSpec, isolated: bool) -> dict[str, Path | None]:
    """What a lab must write outside its working folder (the C++ extension cache of labs that build code):
    inside path -> the host folder it starts as a copy of. Isolated, a bounded tmpfs inside the sandbox that
    never reaches the host; without isolation, the host's own cache."""
    if not spec.allow_processes:
        return {}
    return {str(CACHE_DIR): CACHE_DIR if CACHE_DIR.is_dir() else None}


# --- Limits from the lab's solution ------------------------------------------------------------------

GENEROUS = {"call_cpu_s": 300.0, "cell_cpu_s": 600.0, "budget_cpu_s": 3600.0}


def measure_reference(spec: LabSpec, inputs: dict, *, threads: int, memory_limit_mb: float, isolated: bool,
                      wall_seconds: float) -> dict:
    """The lab's solution graded like a submission, under generous limits, on this run's inputs: its CPU
    seconds per exercise (slowest case), per cell (slowest), in all, and its wall time."""
    functions = [e.function for e in spec.exercises]
    limits = {"call_cpu_seconds": dict.fromkeys(functions, GENEROUS["call_cpu_s"]),
              "cell_cpu_seconds": {}, "cell_cpu_default": GENEROUS["cell_cpu_s"], "start_cpu_seconds": GENEROUS["cell_cpu_s"],
              "process_cpu_seconds": GENEROUS["budget_cpu_s"],
              "budget_cpu_seconds": GENEROUS["budget_cpu_s"], "wall_seconds": wall_seconds}
    run = run_submission(SOLUTIONS / (spec.solution or f"{spec.lab}.ipynb"), spec, inputs, limits, threads=threads,
                         memory_limit_mb=memory_limit_mb, isolated=isolated, protected=[])
    calls = {name: max((c.get("cpu_seconds", 0.0) for c in run["results"].get(name, {}).get("cases", [])),
                       default=0.0) for name in functions}
    return {"call_cpu_seconds": calls, "cell_cpu_seconds": {index: cpu for index, cpu in run["cell_cpu_seconds"]},
            "cpu_seconds": run["cpu_seconds"], "wall_seconds": run["wall_seconds"],
            "start_cpu_seconds": run["start_cpu_seconds"], "complete": not run["faults"] and not run["stops"]}


def limits_from(reference: dict, cpu_factor: float, time_limit: float | None) -> dict:
    """The submissions' limits: cpu_factor times the reference's CPU time (with floors), and the wall backstop."""
    cells = reference["cell_cpu_seconds"]
    return {"call_cpu_seconds": {name: max(CALL_FLOOR_S, cpu_factor * s)
                                 for name, s in reference["call_cpu_seconds"].items()},
            # a cell: its own index in the solution or a neighbour's (a cell added or removed before it)
            "cell_cpu_seconds": [[i, max(CELL_FLOOR_S, cpu_factor * max(cells.get(j, 0.0) for j in (i - 1, i, i + 1)))]
                                 for i in cells],
            "cell_cpu_default": max(CELL_FLOOR_S, cpu_factor * max(cells.values(), default=0.0)),
            "start_cpu_seconds": max(CELL_FLOOR_S, cpu_factor * reference["start_cpu_seconds"]),
            "budget_cpu_seconds": cpu_factor * reference["cpu_seconds"] + BUDGET_SLACK_S,
            "process_cpu_seconds": cpu_factor * reference["cpu_seconds"] + BUDGET_SLACK_S,
            "wall_seconds": time_limit or max(WALL_FLOOR_S, WALL_FACTOR * reference["wall_seconds"])}


# --- Judging and the class -------------------------------------------------------------------------

def grade_one(student: str, run: dict, spec: LabSpec, cases: dict, expected: dict, isolation_text: str,
              internals: list[str] = ()) -> dict:
    """The row of one student. `internals`: what interpreter_internals found in the notebook (or
    project_internals in a project's files); then the exercises that forbid calls score 0 (the recorder inside
    the sandbox cannot be trusted), every goal of a project too (its measures run beside the project's code),
    and the status asks for a review."""
    row = {"student": student, "scores": {}, "lines": [], "flags": run["flags"], "isolation": isolation_text}
    not_gradable = []
    for ex in spec.exercises:
        got = run["results"].get(ex.function)
        lines, passed, missed = [], 0, []
        lacking = not_gradable_here(ex, got)
        if lacking:
            not_gradable.append(f"{ex.title.split(':')[0]} needs {lacking}")
            row["scores"][ex.title] = None
            row["lines"].append(f"⏸ {ex.title}: not gradable here: it needs {lacking}, which the grading machine "
                                f"lacks; no marks counted for or against it")
            continue
        if internals and spec.submission is not None:
            lines.append(f"❌ {ex.title}: not trusted: the project uses interpreter internals that can reach the "
                         f"grader's measures in its process ({'; '.join(internals[:3])}); scored 0 until your "
                         f"instructor reviews it")
        elif internals and ex.forbidden:
            lines.append(f"❌ {ex.title}: not trusted: the notebook uses interpreter internals that can hide a "
                         f"forbidden call from the grader ({'; '.join(internals[:3])}); scored 0 until your "
                         f"instructor reviews it")
        elif ex.function in run["faults"]:
            fault = run["faults"][ex.function]
            lines.append(f"❌ {ex.title}: {fault}; no check could run"
                         + (f"\n   Hint: {ex.crashed}" if ex.crashed and "crashed (SIG" in fault else ""))
        elif not got or not got.get("defined"):
            lines.append(f"❌ {ex.title}: no function named {ex.function} was defined")
        else:
            for case, exp, result in zip(cases[ex.function], expected[ex.function], got["cases"]):
                problem = judge_case(ex, case, exp, result, run["results"])
                label = f"{ex.title}: {case.name}" + (" (hidden check)" if case.hidden else "")
                if problem is not None and case.hidden:   # say so on the first line, before the hint
                    first, _, rest = problem.partition("\n")
                    problem = f"{first} (hidden check)" + (f"\n{rest}" if rest else "")
                lines.append(f"✅ {label}: passed" if problem is None else problem)
                passed += problem is None
                if problem is not None and case.central:
                    missed.append(case.name)
        score = ex.points * passed / len(cases[ex.function])
        if missed and score > CENTRAL_CAP * ex.points:
            score = CENTRAL_CAP * ex.points
            lines.append(f"⚠ {ex.title}: capped at {CENTRAL_CAP:.0%} of its points: it misses the exercise's central "
                         f"point ({missed[0]})")
        row["scores"][ex.title] = round(score, 2)
        row["lines"] += lines
    row["total"] = round(sum(s for s in row["scores"].values() if s is not None), 2)
    row["max"] = sum(e.points for e in spec.exercises if row["scores"][e.title] is not None)
    row["status"] = "; ".join(sorted(set(run["stops"])) + (["review: interpreter internals"] if internals else [])
                              + ([f"not gradable here: {', '.join(not_gradable)}"] if not_gradable else [])) or "ok"
    return row


def not_gradable_here(exercise, got: dict | None) -> str | None:
    """What the grading machine lacks for this exercise: a capability the exercise needs (its spec's `needs`),
    or a module the submission imported that is not installed here (ModuleNotFoundError in a case, for a
    module this machine truly lacks). None when it can be graded."""
    lacking = missing(*exercise.needs) if exercise.needs else []
    for case in (got or {}).get("cases", []):
        raised = case.get("raised") or {}
        module = re.fullmatch(r"No module named '([\w.]+)'", raised.get("message", ""))
        if raised.get("type") == "ModuleNotFoundError" and module and \
                importlib.util.find_spec(module.group(1).split(".")[0]) is None:
            lacking.append(f"the module {module.group(1)}, which your answer imports")
    return ", ".join(dict.fromkeys(lacking)) or None


def grade_submissions(lab: str, submissions: str | Path, *, out_dir: str | Path | None = None,
                      workers: int | None = None, time_limit: float | None = None, memory_limit_mb: float = 2048,
                      cpu_factor: float = CPU_FACTOR, seed: int | None = None, progress: bool = False) -> dict:
    """Grade every submission in `submissions`; writes scores.csv and feedback/ into out_dir. time_limit:
    the wall seconds a submission may take in all (default: from the solution's time, see the module)."""
    from tqdm.auto import tqdm

    from helpers.runner.execute import default_workers
    spec = spec_for(lab)
    found = find_submissions(submissions, projects=spec.submission is not None)
    out = Path(out_dir) if out_dir else Path(submissions) / "graded"
    if any(p.is_symlink() or p.exists() and not p.is_dir() for p in (out, out / "feedback")):
        raise ValueError(f"{out} or its feedback folder is a symbolic link or a file (a submission may have "
                         "put it there): remove it, or give the grader another --out")
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    _remove_what_dead_graders_left()
    problem = isolation.isolation_problem()
    if problem is not None:
        message = (f"GRADING WITHOUT ISOLATION: {problem}. Submissions run with the in-process guards only: a "
                   f"hostile one may read files this user can read or disturb the run. Every row says 'not isolated'.")
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        print(f"\n*** {message} ***\n", file=sys.stderr)
    gen = torch.Generator().manual_seed(secrets.randbits(62) if seed is None else seed)
    cases = {ex.function: ex.cases(gen) for ex in spec.exercises}
    expected = {ex.function: [expected_result(ex, c) for c in cases[ex.function]] for ex in spec.exercises}
    inputs = {name: [{"args": list(c.args), "kwargs": dict(c.kwargs), "call": c.call,
                      "forbidden": list(ex.forbidden), "substitutes": [list(p) for p in ex.substitutes]} for c in cs]
              for ex in spec.exercises for name, cs in [(ex.function, cases[ex.function])]}
    protected = PROTECTED + [Path(submissions).resolve(), out.resolve()]
    workers = workers or default_workers()
    threads = max(1, capabilities().cpu_count // workers)
    reference = measure_reference(spec, inputs, threads=threads, memory_limit_mb=memory_limit_mb,
                                  isolated=problem is None, wall_seconds=max(time_limit or 0, 900.0))
    limits = limits_from(reference, cpu_factor, time_limit)

    def grade(item):
        student, notebook = item
        start = time.perf_counter()
        run = {"flags": [], "cell_errors": [], "cpu_seconds": 0.0}
        try:
            run = run_submission(notebook, spec, inputs, limits, threads=threads, memory_limit_mb=memory_limit_mb,
                                 isolated=problem is None, protected=protected)
            if run["stops"] in (["malformed notebook"], ["refused project"]):
                internals = []
            elif spec.submission is not None:
                internals = project_internals(notebook)
            else:
                internals = interpreter_internals(notebook.read_text(errors="replace"))
            internals += [f.removeprefix(RUNTIME_INTERNALS).strip() + " (compiled at run time)" for f in run["flags"]
                          if f.startswith(RUNTIME_INTERNALS)]
            row = grade_one(student, run, spec, cases, expected, isolation.row_isolation(problem, run["cgroup"]),
                            internals)
        except Exception as exc:   # one submission never stops the class: it gets 0, and the row says why
            row = {"student": student, "scores": {e.title: 0.0 for e in spec.exercises}, "total": 0.0,
                   "max": sum(e.points for e in spec.exercises), "status": f"grading failed ({type(exc).__name__})",
                   "flags": run["flags"], "isolation": isolation.row_isolation(problem, run.get("cgroup", False)),
                   "lines": [f"❌ the grader could not grade this submission ({type(exc).__name__}: {exc}"[:300] + ")"]}
        row["seconds"] = round(time.perf_counter() - start, 1)
        row["cpu_seconds"] = round(run["cpu_seconds"], 1)
        return row, run

    def write(row, run):
        write_text_atomic(feedback(row, spec.lab, spec.exercises, run), out / "feedback" / f"{row['student']}.md")

    with ThreadPoolExecutor(max_workers=workers) as pool, \
            tqdm(total=len(found), desc="submissions", disable=not progress) as bar:
        graded = {}
        for item, (row, run) in zip(found.items(), pool.map(grade, found.items())):
            graded[item[0]] = (row, run)
            bar.update()
    # A wall-time stop may be the class's load, not the code (CPU time is the sandbox's own): such a
    # submission is graded once more, alone, and keeps that grade
    for student, (row, run) in graded.items():
        if run.get("wall_timeout"):
            again, run = grade((student, found[student]))
            again["lines"].insert(0, "Graded again, alone: a wall-time limit stopped it while the class was graded.")
            graded[student] = (again, run)
    for row, run in graded.values():
        write(row, run)
    rows = [row for row, _ in graded.values()]
    write_text_atomic(scores_csv(rows, spec.exercises), out / "scores.csv")
    return {"students": rows, "csv": str(out / "scores.csv"), "feedback_dir": str(out / "feedback"),
            "limits": limits, "reference": reference, "isolation": isolation.class_isolation(problem, rows)}
