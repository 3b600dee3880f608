"""Lab 10 (the capstone): graded on a project folder, goal by goal. Each goal is an exercise whose cases are
workloads (the visible one and hidden ones: other seeds, batches, lengths and the other corpus slice); the
sandbox runs the goal's measure on the submitted project (helpers.grading.harnesses.lab10) and the grader
judges what came back with the reference project at hand (helpers.capstone's judges). Grader side only: the
sandbox never sees this package, nor the reference."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from helpers import capstone
from helpers.grading.judge import untrusted
from helpers.grading.specs.core import Case, Exercise, LabSpec, SubmissionRefused

MAX_PROJECT_KB = 512          # the project's Python files together (the starting code is about 12 KB)
HIDDEN = 2                    # hidden workloads for the correctness goals; the others run on the first of them
CORRECTNESS = ("loss_curve", "causality", "batches_match", "serving_agreement", "served_size")
TIMED_ROUNDS = 8              # paired rounds per timed goal, on one thread
TITLES = {"batches_match": "the documented batches", "loss_curve": "loss curve", "causality": "the planted bug",
          "serving_agreement": "serving agreement", "served_size": "served size", "train_speed": "training speed",
          "serve_latency": "serving latency", "step_memory": "step memory", "deprecations": "no deprecations",
          "deterministic_repeat": "deterministic repeat", "graph_breaks": "no graph breaks",
          "report": "the report's claims"}


@functools.cache
def _reference():
    return capstone.load_project(capstone.REFERENCE)


def project_files(folder: Path) -> dict[str, str]:
    """The project's Python files (the folder's top level) and its report by name: SubmissionRefused when a
    module the starting code has is missing or they are too large."""
    folder = Path(folder)
    files = {p.name: p for p in sorted([*folder.glob("*.py"), folder / capstone.REPORT])
             if p.is_file() and not p.is_symlink()}
    missing = [f"{m}.py" for m in ("__init__", *capstone.MODULES) if f"{m}.py" not in files]
    if missing:
        raise SubmissionRefused(f"the project folder has no {', '.join(missing)}: hand in the whole folder you copied "
                         f"from 10_capstone/")
    size = sum(p.stat().st_size for p in files.values())
    if size > MAX_PROJECT_KB * 1024:
        raise SubmissionRefused(f"its Python files are {size // 1024} KB, more than the {MAX_PROJECT_KB} KB a project may be")
    return {name: p.read_text(errors="replace") for name, p in files.items()}


def project_notebook(folder: Path) -> str:
    """The notebook the sandbox runs for a project: one cell that writes the project's files and the starting
    code's, imports both, and defines each goal's measure on the project."""
    import nbformat   # here: a lab's check() imports every spec, and the GPU check runs labs without Jupyter
    source = ("from helpers.grading.harnesses.lab10 import install, measures\n"
              f"project, start = install({project_files(folder)!r}, {project_files(capstone.START)!r})\n"
              "globals().update(measures(project, start))\n")
    return nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]))


def _workloads(gen: torch.Generator) -> list[tuple[str, dict, bool]]:
    """(name, workload, hidden): the visible workload, then HIDDEN others, drawn from gen without advancing it,
    so every goal gets the same ones (and a measure that feeds several goals runs once per workload)."""
    state = gen.get_state()
    draws = torch.randint(0, 2**30, (HIDDEN, 3), generator=gen).tolist()
    gen.set_state(state)
    return [("the visible workload", capstone.VISIBLE, False)] + [
        (f"hidden workload {i + 1}", capstone.workload(seed=1 + seed % 9999, part=(i + 1) % 2,
                                                       batch_size=(8, 12, 24)[batch % 3],
                                                       seq_len=(40, 48, 80)[length % 3]), True)
        for i, (seed, batch, length) in enumerate(draws)]


_INPUTS: dict[str, dict] = {}


def _given(w: dict) -> dict:
    """The reference's inputs for a workload, made once per run (every goal's cases share the same tensors,
    which the job then carries once)."""
    key = repr(w)
    if key not in _INPUTS:
        _INPUTS[key] = capstone.reference_inputs(_reference(), w)
    return _INPUTS[key]


def _cases(goal: str):
    def cases(gen: torch.Generator) -> list[Case]:
        workloads = _workloads(gen)
        if goal not in CORRECTNESS:   # the report is judged beside the timed goals' own rounds
            workloads = workloads[1:2] if goal in (*capstone.TIMED, "report") else workloads[:2]
        options = {"threads_used": 1, "rounds": TIMED_ROUNDS} if goal in capstone.TIMED else {}
        return [Case(f"on {name}", (w, _given(w)), options, hidden=hidden,
                     hint=capstone.HINTS[goal]) for name, w, hidden in workloads]
    return cases


def _timed_here(results: dict, w: dict, given: dict) -> dict:
    """goal -> the grader's result for each timed goal this run measured untouched on the workload."""
    found = {}
    for goal in capstone.TIMED:
        cases = (results.get(goal) or {}).get("cases") or []
        if cases and cases[0]["raised"] is None and not cases[0]["tampered"]:
            found[goal] = capstone.judged(goal, cases[0]["value"], _reference(), w, given)
    return found


def _judge(goal: str):
    def judge(exercise: Exercise, case: Case, value, results: dict) -> str | None:
        w, given = case.args
        extra = {"timed": _timed_here(results, w, given)} if goal == "report" else {}
        result = capstone.judged(goal, value, _reference(), w, given, **extra)
        if goal in capstone.TIMED and result.get("clock", "cpu") != "cpu":   # asked on one thread: CPU time
            result = {"goal": goal, "passed": False, "error": f"timed on the {result['clock']} clock where the "
                      f"grader asked for one thread (the project changed its thread count)"}
        if result["passed"] is True:
            return None
        return (f"❌ {exercise.title}: {case.name}: missed: {untrusted(capstone.describe(result), 700)}\n"
                f"   Hint: {case.hint}")
    return judge


def _unused(*args, **kwargs):
    """The goals are judged (Exercise.judge), not compared with a reference's result."""


SPEC = LabSpec("10_capstone_lab", tuple(
    Exercise(f"Goal {i}: {TITLES[goal]}", goal, _cases(goal), _unused, judge=_judge(goal),
             crashed="the project crashed the process: a native crash in a custom kernel, or memory it was not given")
    for i, goal in enumerate(capstone.GOALS, 1)),
    allow_processes=True, submission=project_notebook, solution="10_capstone")
