"""Grade a folder of lab submissions: python -m helpers grade LAB SUBMISSIONS_DIR.

Each submission runs in its own process (helpers.runner.sandbox) under a time and memory limit; it
only returns what the student's functions give back on inputs drawn here from a secret seed. This
process computes the references (helpers.runner.grading_specs) and judges every case with
helpers.checks, outside the student's reach. A crash or a hang costs the exercise where it happened;
the exercises after it are graded in a fresh process.

Writes OUT/scores.csv (one row per student, one column per exercise) and OUT/feedback/STUDENT.md (each
check, passed or failed with its hint; hidden checks are named but their inputs are not shown).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import torch

from helpers.checks import CheckFailed, check_close, check_equal
from helpers.device import capabilities
from helpers.files import write_text_atomic
from helpers.interactive import HEADLESS_ENV
from helpers.lab_checks import expected_result
from helpers.runner.grading_specs import Case, Exercise, LabSpec, spec_for
from helpers.runner.job import REPO, _kill, _memory_mb, _tree

PROTECTED = [REPO / "labs" / "solutions", REPO / "helpers" / "runner" / "grading_specs.py"]


def find_submissions(folder: str | Path) -> dict[str, Path]:
    """student name -> notebook: NAME.ipynb in the folder, or one .ipynb inside a folder NAME/."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of submissions")
    found = {}
    for entry in sorted(folder.iterdir()):
        if entry.suffix == ".ipynb" and entry.is_file():
            found[entry.stem] = entry
        elif entry.is_dir() and entry.name not in ("graded", ".ipynb_checkpoints"):
            notebooks = sorted(entry.glob("*.ipynb"))
            if notebooks:
                found[entry.name] = notebooks[0]
    if not found:
        raise ValueError(f"no submissions in {folder}: expected NAME.ipynb files or NAME/ folders with one .ipynb")
    return found


def _run_sandbox(job: dict, time_limit: float, memory_limit_mb: float) -> str | None:
    """Run the sandbox once; returns why it stopped early ("timeout", "memory", "exit N") or None."""
    env = {**os.environ, HEADLESS_ENV: "1", "OMP_NUM_THREADS": str(job["threads"])}
    with open(Path(job["workdir"]) / "sandbox.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "helpers.runner.sandbox", job["path"]], cwd=job["workdir"],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    import psutil
    watched, deadline, stopped = psutil.Process(proc.pid), time.time() + time_limit, None
    while proc.poll() is None:
        tree = [watched] + _tree(watched)
        if _memory_mb(tree) > memory_limit_mb:
            stopped = "memory"
        elif time.time() > deadline:
            stopped = "timeout"
        if stopped:
            _kill(tree)
            proc.wait()
            return stopped
        time.sleep(0.1)
    code = proc.returncode
    if code == 0:
        return None
    if code < 0:
        import signal
        name = signal.Signals(-code).name
        return {"SIGXCPU": "timeout", "SIGKILL": "killed (SIGKILL)"}.get(name, f"crashed ({name})")
    return f"crashed (exit status {code})"


MAX_SKIPPED_CELLS = 3
STOP_TEXT = {"timeout": "ran past the time limit and was stopped (look for a loop that never ends)",
             "memory": "used more memory than the limit and was stopped"}


def run_submission(notebook: Path, spec: LabSpec, inputs_file: Path, protected: list[Path], *,
                   time_limit: float, memory_limit_mb: float, cell_timeout: float, call_timeout: float,
                   threads: int = 1) -> dict:
    """Returns {"results": {function: {...}}, "faults": {function: text}, "flags": [...], ...}."""
    with tempfile.TemporaryDirectory(prefix="labs-grade-") as tmp:
        work = Path(tmp)
        copy = work / "submission.ipynb"
        copy.write_bytes(notebook.read_bytes())
        remaining = [e.function for e in spec.exercises]
        faults, stops, skip, notes, results = {}, [], [], [], {}
        try:
            nbformat.validate(nbformat.read(str(copy), as_version=4))
        except Exception as exc:   # not JSON, not a notebook: nothing to run
            faults = {name: f"the submission is not a valid notebook ({type(exc).__name__})" for name in remaining}
            stops, remaining = ["malformed notebook"], []
        for _attempt in range(len(remaining) + MAX_SKIPPED_CELLS + 1):
            if not remaining:
                break
            job = {"skip_cells": skip, "workdir": str(work), "notebook": str(copy), "inputs": str(inputs_file),
                   "exercises": remaining, "protected": [str(p) for p in protected],
                   "memory_limit_mb": memory_limit_mb, "cpu_seconds": time_limit * threads + 5,
                   # a GPU build of torch maps gigabytes of libraries even with no GPU: its address space is
                   # no measure of memory, so there only the watcher's PSS limit applies
                   "address_space_limit_mb": memory_limit_mb if capabilities().build_accelerator is None else None,
                   "allow_processes": spec.allow_processes, "threads": threads,
                   "native_library_roots": _native_library_roots(spec),
                   "cell_timeout": cell_timeout, "call_timeout": call_timeout, "path": str(work / "job.json")}
            Path(job["path"]).write_text(json.dumps(job))
            stopped = _run_sandbox(job, time_limit, memory_limit_mb)
            results = _load_results(work / "results.pt")
            marker = (work / "current.txt").read_text().strip() if (work / "current.txt").exists() else "cells"
            if stopped:
                stops.append(stopped)
            if stopped is None and marker == "done":
                break
            why = STOP_TEXT.get(stopped, stopped) if stopped else "ended its process early"
            cell = re.fullmatch(r"cell (\d+)", marker)
            if cell and len(skip) < MAX_SKIPPED_CELLS:   # run again without that cell
                skip.append(int(cell.group(1)))
                notes.append(f"cell {skip[-1]} {why}; it was left out and the notebook run again")
                continue
            if marker not in remaining:   # while the cells ran (or a marker the submission wrote itself)
                for name in remaining:
                    if name not in results:
                        faults[name] = f"the notebook {why} while its cells ran"
                break
            faults[marker] = f"the function {why}"
            remaining = [n for n in remaining if n not in results and n not in faults]
        for name in remaining:
            if name not in results and name not in faults:
                faults[name] = "could not be graded: the notebook kept stopping early"
    return {"results": results, "faults": faults, "stops": stops, "flags": [str(f) for f in results.get("_flags", [])],
            "cell_errors": notes + [str(e) for e in results.get("_cell_errors", [])]}


def _native_library_roots(spec: LabSpec) -> list[str]:
    """Where a submission may load shared libraries from: the helpers' C++ extension cache, for labs that
    may start processes (they build their learner's kernel there, lab 04); nowhere for the others."""
    if not spec.allow_processes:
        return []
    from helpers.ext import CACHE_DIR
    return [str(CACHE_DIR)]


def _load_results(path: Path) -> dict:
    """The sandbox's results: weights-only (tensors and plain values, never code); {} when unreadable."""
    try:
        results = torch.load(path, weights_only=True) if path.exists() else {}
    except Exception:   # a file the submission wrote or broke itself
        return {"_flags": ["the results file was unreadable"]}
    return results if isinstance(results, dict) else {"_flags": ["the results file was not a mapping"]}


class _Placeholder:
    """Stands for a returned value that was not a tensor or plain value (its type name only)."""


def _returned(value):
    if isinstance(value, dict) and "type" in value:
        return type(value["type"], (_Placeholder,), {})()
    return value


def judge_case(exercise: Exercise, case: Case, expected, got: dict) -> str | None:
    """None when the case passes, else the feedback line (problem and hint). Runs in the grader."""
    what = f"{exercise.title}: {case.name}"
    used = sorted(set(got["torch_calls"]) & set(exercise.forbidden))
    if used:
        return (f"❌ {what}: calls {', '.join(used)}, which this exercise asks you to write yourself "
                f"(under any name: torch.X, torch.nn.functional.X, Tensor.X, torch.ops.aten.X, an import alias)\n"
                f"   Hint: {case.hint or 'use only the basic tensor operations'}")
    raised = got["raised"]
    try:
        if case.raises:
            if raised is None:
                return f"❌ {what}: did not raise {case.raises}\n   Hint: {case.hint or 'validate the input first'}"
            if raised["type"] != case.raises:
                return (f"❌ {what}: raised {raised['type']}: {raised['message']}, expected {case.raises}\n"
                        f"   Hint: {case.hint}")
            if case.match and case.match not in raised["message"]:
                return (f"❌ {what}: the {case.raises} message {raised['message']!r} does not mention "
                        f"{case.match!r}\n   Hint: say what was wrong and how to fix it")
            return None
        if raised is not None:
            if raised["type"] == "CellTimeout":
                return f"❌ {what}: ran past the time limit and was stopped\n   Hint: look for a loop that never ends"
            return (f"❌ {what}: raised {raised['type']}: {raised['message'][:300]}\n"
                    f"   Hint: {case.hint or 'run the function on this kind of input in your notebook'}")
        with _quiet():
            _compare(_returned(got["value"]), expected, what, case)
    except CheckFailed as failed:
        return str(failed)
    return None


def _compare(actual, expected, what: str, case: Case) -> None:
    """Tensors within the case's tolerance (floating) or equal; lists, tuples and dicts element by
    element (a list and a tuple are the same sequence); floats within tolerance; anything else equal."""
    if isinstance(expected, torch.Tensor):
        if expected.is_floating_point():
            check_close(actual, expected, what=what, atol=case.atol, rtol=case.rtol, hint=case.hint)
        else:
            check_equal(actual, expected, what=what, hint=case.hint)
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            got = f"{type(actual).__name__} of {len(actual)}" if isinstance(actual, (list, tuple)) else \
                type(actual).__name__
            check_equal(got, f"{type(expected).__name__} of {len(expected)}", what=what, hint=case.hint)
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, f"{what} [{i}]", case)
    elif isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            check_equal(sorted(actual) if isinstance(actual, dict) else type(actual).__name__, sorted(expected),
                        what=f"{what} (keys)", hint=case.hint)
        for key in expected:
            _compare(actual[key], expected[key], f"{what} [{key!r}]", case)
    elif isinstance(actual, torch.Tensor) and type(expected) in (int, float, bool):
        check_equal(f"a tensor of shape {tuple(actual.shape)}", f"a Python {type(expected).__name__}", what=what,
                    hint=f"{case.hint} (convert with int(...) or .item())" if case.hint else
                    "convert with int(...) or .item()")
    elif isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        if not math.isclose(actual, expected, rel_tol=case.rtol, abs_tol=case.atol):
            check_equal(actual, expected, what=what, hint=case.hint)
    else:
        check_equal(actual, expected, what=what, hint=case.hint)


class _quiet:
    """helpers.checks prints a line on success; the grader writes its own feedback instead."""
    def __enter__(self):
        self._stdout, sys.stdout = sys.stdout, io.StringIO()

    def __exit__(self, *exc):
        sys.stdout = self._stdout


def grade_one(student: str, run: dict, spec: LabSpec, cases: dict, expected: dict) -> dict:
    row = {"student": student, "scores": {}, "lines": [], "flags": run["flags"]}
    for ex in spec.exercises:
        got = run["results"].get(ex.function)
        lines, passed = [], 0
        if ex.function in run["faults"]:
            lines.append(f"❌ {ex.title}: {run['faults'][ex.function]}; no check could run")
        elif not got or not got["defined"]:
            lines.append(f"❌ {ex.title}: no function named {ex.function} was defined")
        else:
            for case, exp, result in zip(cases[ex.function], expected[ex.function], got["cases"]):
                problem = judge_case(ex, case, exp, result)
                label = f"{ex.title}: {case.name}" + (" (hidden check)" if case.hidden else "")
                if problem is not None and case.hidden:   # say so on the first line, before the hint
                    first, _, rest = problem.partition("\n")
                    problem = f"{first} (hidden check)" + (f"\n{rest}" if rest else "")
                lines.append(f"✅ {label}: passed" if problem is None else problem)
                passed += problem is None
        row["scores"][ex.title] = round(ex.points * passed / len(cases[ex.function]), 2)
        row["lines"] += lines
    row["total"] = round(sum(row["scores"].values()), 2)
    row["max"] = sum(e.points for e in spec.exercises)
    row["status"] = "; ".join(sorted(set(run["stops"]))) or "ok"
    return row


def _feedback(row: dict, spec: LabSpec, run: dict) -> str:
    text = [f"# {spec.lab}: feedback for {row['student']}", "",
            f"Score: {row['total']:g} / {row['max']:g}", ""]
    for ex in spec.exercises:
        text.append(f"- {ex.title}: {row['scores'][ex.title]:g} / {ex.points:g}")
    text += ["", "## Checks", ""] + [line.replace("\n", "\n    ") for line in row["lines"]]
    if run["cell_errors"]:
        text += ["", "## Cells that failed while your notebook ran", ""] + [f"- {e}" for e in run["cell_errors"]]
    if row["flags"]:
        text += ["", "## Refused", "", "Grading runs your code without access to the solutions, the grader or "
                 "other files it protects; these attempts were refused:", ""] + [f"- {f}" for f in row["flags"]]
    return "\n".join(text) + "\n"



def grade_submissions(lab: str, submissions: str | Path, *, out_dir: str | Path | None = None,
                      workers: int | None = None, time_limit: float = 120, memory_limit_mb: float = 2048,
                      cell_timeout: float | None = None, call_timeout: float | None = None,
                      seed: int | None = None, progress: bool = False) -> dict:
    """Grade every submission in `submissions`; writes scores.csv and feedback/ into out_dir."""
    from tqdm.auto import tqdm

    from helpers.runner.execute import default_workers
    spec = spec_for(lab)
    found = find_submissions(submissions)
    out = Path(out_dir) if out_dir else Path(submissions) / "graded"
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(secrets.randbits(62) if seed is None else seed)
    cases = {ex.function: ex.cases(gen) for ex in spec.exercises}
    expected = {ex.function: [expected_result(ex, c) for c in cases[ex.function]] for ex in spec.exercises}
    protected = PROTECTED + [Path(submissions).resolve(), out.resolve()]
    workers = workers or default_workers()
    threads = max(1, capabilities().cpu_count // workers)
    with tempfile.TemporaryDirectory(prefix="labs-grade-inputs-") as tmp:
        inputs_file = Path(tmp) / "inputs.pt"
        forbidden = {ex.function: list(ex.forbidden) for ex in spec.exercises}
        torch.save({name: [{"args": list(c.args), "kwargs": dict(c.kwargs), "call": c.call,
                            "forbidden": forbidden[name]} for c in cs]
                    for name, cs in cases.items()}, inputs_file)

        def grade(item):
            student, notebook = item
            start = time.perf_counter()
            run = run_submission(notebook, spec, inputs_file, protected, time_limit=time_limit,
                                 memory_limit_mb=memory_limit_mb,
                                 cell_timeout=cell_timeout or max(time_limit / 4, 1),
                                 call_timeout=call_timeout or max(time_limit / 8, 1), threads=threads)
            try:
                row = grade_one(student, run, spec, cases, expected)
            except Exception as exc:   # results shaped by a submission that tampered with them: no points
                row = {"student": student, "scores": {e.title: 0.0 for e in spec.exercises}, "total": 0.0,
                       "max": sum(e.points for e in spec.exercises), "status": "results unreadable",
                       "flags": run["flags"], "lines": [f"❌ the grader could not read the results ({exc})"]}
            row["seconds"] = round(time.perf_counter() - start, 1)
            write_text_atomic(_feedback(row, spec, run), out / "feedback" / f"{student}.md")
            return row

        with ThreadPoolExecutor(max_workers=workers) as pool, \
                tqdm(total=len(found), desc="submissions", disable=not progress) as bar:
            rows = []
            for row in pool.map(grade, found.items()):
                rows.append(row)
                bar.update()
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    titles = [e.title for e in spec.exercises]
    writer.writerow(["student", *titles, "total", "max", "status", "seconds", "flags"])
    for row in rows:
        writer.writerow([row["student"], *[row["scores"][t] for t in titles], row["total"], row["max"],
                         row["status"], row["seconds"], "; ".join(row["flags"])])
    write_text_atomic(buffer.getvalue(), out / "scores.csv")
    return {"students": rows, "csv": str(out / "scores.csv"), "feedback_dir": str(out / "feedback")}
