"""What every lab's wrong-answer tests share (tests/test_wrong_answers_labNN.py): running an exercise's
cases as the grader does, the solution notebooks' functions, one factory per kind of mistake that turns a
right answer into it (tests/test_wrong_answer_kinds.py applies each wherever a spec checks that property),
the row of a wrong answer, and `lab_tests`, the one factory of the tests each lab runs.

For every exercise of every lab in helpers.grading.specs.SPECS, plausible wrong answers (the mistakes
learners make) fail at least one case, visible or hidden, and the feedback carries the hint meant for that
mistake; the spec's reference, the solution notebook's function and a second solution written otherwise
pass every case, so a failure there is the wrong answer's, not the spec's.

Cases run as helpers.grading.checks.check runs them (call_case, then judge_case), hidden ones included.
Lab 04's C++ kernel bodies and lab 02's Triton solution run in a child process (a build, and Triton's
interpreter, change process-wide state). A wrong answer the spec accepts is xfail(strict=True,
reason="spec accepts: ..."); one caught only elsewhere, or caught with a generic hint instead of its own,
xfails with that reason and fails once it is caught with its hint (so the note can go)."""
from __future__ import annotations

import ast
import copy
import functools
import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from helpers.grading.checks import call_case, expected_result
from helpers.grading.judge import judge_case
from helpers.grading.specs import SPECS

REPO = Path(__file__).resolve().parent.parent
SEED = 0
MATCH_HINT = "say what was wrong and how to fix it"      # judge_case's hint when a message lacks `match`
FORBIDDEN_HINT = "refused in this exercise under any name"   # judge_case's line for a forbidden call
NAMING_HARNESSES = ("interval_named", "default_read_ahead", "streams", "mask_mistakes", "offsets_dtype",
                    "backward_backend_of")   # harnesses whose result names the mistake (the hint is more general)
# judge_case compares through helpers.checks.check_close / check_equal, whose type, shape and dtype
# checks (check_tensor) fail with their own generic hint and drop the case's
HINT_DROPPED = ("hint dropped: a wrong type, shape or dtype fails in helpers.checks.check_tensor, whose "
                "generic hint replaces the case's")

L00, L01, L02, L03, L04, L05, L06, L07, L08, L09 = (
    "00_warmup_lab", "01_data_loading_lab", "02_fusion_lab", "03_moe_lab", "04_custom_op_lab",
    "05_quantization_lab", "06_attention_lab", "07_memory_lab", "08_debugging_lab", "09_migration_lab")


# --- Running an exercise's cases, as the grader does ---------------------------------------------

def exercise_of(lab: str, function: str):
    return next(e for e in SPECS[lab].exercises if e.function == function)


@functools.lru_cache(maxsize=None)
def prepared(lab: str, function: str):
    """The exercise, its cases (visible and hidden) on SEED and their expected results, computed once."""
    exercise = exercise_of(lab, function)
    cases = exercise.cases(torch.Generator().manual_seed(SEED))
    return exercise, cases, [expected_result(exercise, case) for case in cases]


def run_cases(lab: str, fn, function: str, reference: bool = False, only: tuple[str, ...] = ()
              ) -> list[tuple[str, str]]:
    """(case name, problem) for every case, visible or hidden, that fn fails (with `only`, the cases of
    those names). reference: fn is the spec's reference, which may call what the learner may not, and is
    not what the cases expecting an exception call."""
    exercise, cases, expected = prepared(lab, function)
    failed = []
    for case, want in zip(cases, expected):
        if (reference and case.raises) or (only and case.name not in only):
            continue
        args, kwargs = copy.deepcopy((case.args, case.kwargs))      # a wrong answer may write into its inputs
        got = call_case(fn, args, kwargs, case.call, () if reference else exercise.forbidden,
                        () if reference else exercise.substitutes)
        problem = judge_case(exercise, case, want, got)
        if problem is not None:
            failed.append((case.name, problem))
    return failed


CHILD = r"""
import json, runpy, sys
import torch
from helpers.grading.checks import call_case, expected_result
from helpers.grading.judge import judge_case
from helpers.grading.specs import SPECS
job = json.loads(sys.stdin.read())
exercise = next(e for e in SPECS[job["lab"]].exercises if e.function == job["function"])
cases = exercise.cases(torch.Generator().manual_seed(job["seed"]))
expected = [expected_result(exercise, c) for c in cases]   # before any candidate's kernel is built
results = {}
for label, path in job["candidates"].items():
    fn = runpy.run_path(path)[job["function"]]
    problems = [(c.name, judge_case(exercise, c, e, call_case(fn, c.args, c.kwargs, c.call, exercise.forbidden)))
                for c, e in zip(cases, expected)]
    results[label] = [[name, p] for name, p in problems if p is not None]
print("RESULTS" + json.dumps(results))
"""


def run_in_child(lab: str, function: str, candidates: dict[str, str], tmp: Path, env: dict | None = None) -> dict:
    """Every case for each candidate (label -> Python source defining `function`) in one fresh process
    with one OpenMP thread, as the grader's sandbox runs by default: label -> [(case name, problem)]."""
    paths = {}
    for i, (label, source) in enumerate(candidates.items()):
        paths[label] = str(tmp / f"candidate_{i}.py")
        Path(paths[label]).write_text(source)
    job = json.dumps({"lab": lab, "function": function, "seed": SEED, "candidates": paths})
    done = subprocess.run([sys.executable, "-c", CHILD], input=job, capture_output=True, text=True, timeout=900,
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULTS"))
    return {label: [tuple(p) for p in problems] for label, problems in json.loads(line[len("RESULTS"):]).items()}


# --- The solution notebooks' functions -----------------------------------------------------------

def _cells(lab: str) -> list[ast.Module]:
    nb = json.loads((REPO / "labs" / "solutions" / f"{lab}.ipynb").read_text())
    return [ast.parse("".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "code"]


def _strip_library_decorators(node):
    """register_fake(...) registers as it defines; the test calls the function itself."""
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = [d for d in node.decorator_list if "torch.library" not in ast.unparse(d)]
    return node


@functools.lru_cache(maxsize=None)
def solution_namespace(lab: str) -> dict:
    """The notebook's imports, top-level functions and classes, and the constants they use (BLUR),
    executed without its other cells (no data made, no model trained, nothing registered)."""
    wanted = {"BLUR"}
    body = []
    for tree in _cells(lab):
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
                body.append(_strip_library_decorators(node))
            elif isinstance(node, ast.Assign) and {ast.unparse(t) for t in node.targets} & wanted:
                body.append(node)
    module = types.ModuleType(f"solution_{lab}")    # importable by name: torch.compile may import a function's
    sys.modules[module.__name__] = module              # module to read its globals (torch 2.10 does)
    exec(compile(ast.Module(body, type_ignores=[]), f"<{lab} solution>", "exec"), module.__dict__)
    return module.__dict__


def triton_solution_source() -> str:
    """Lab 02's launch_three_part as a module: the notebook's imports, combo_grid and its `if HAVE_TRITON:`
    block (the Triton kernel and the launcher)."""
    parts = []
    for tree in _cells("02_fusion_lab"):
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                parts.append(ast.unparse(node))
            elif isinstance(node, ast.FunctionDef) and node.name == "combo_grid":
                parts.append(ast.unparse(node))
            elif isinstance(node, ast.If) and ast.unparse(node.test) == "HAVE_TRITON" and any(
                    isinstance(n, ast.FunctionDef) for n in node.body):
                parts.extend(ast.unparse(n) for n in node.body)
    return "\n\n".join(parts) + "\n"



# --- Kinds of mistake: one factory each, turning a right answer into that mistake ---------------------
# tests/test_wrong_answer_kinds.py applies each to every exercise whose spec checks the property it breaks.

def _tensors(args) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def reads_back_to_the_host(fn):
    """The cost kind: fn after sizing something from its input's largest value, read on the host (a sync
    on a GPU): the right values, a wait the exercise says it has not."""
    def wrong(*args, **kwargs):
        int(_tensors(args)[-1].max())
        return fn(*args, **kwargs)
    return wrong


def does_the_work_twice(fn):
    """The cost kind: fn's result computed twice, the second kept: the right values, twice the FLOPs."""
    def wrong(*args, **kwargs):
        fn(*args, **kwargs)
        return fn(*args, **kwargs)
    return wrong


def returns_another_dtype(fn, index: int | None):
    """The dtype kind: fn's result (or its element `index`) in another dtype of the same family: integers
    wider or narrower, floats in float64 or float32 (the values stay right)."""
    def other(t: torch.Tensor) -> torch.Tensor:
        if t.dtype.is_floating_point:
            return t.to(torch.float32 if t.dtype == torch.float64 else torch.float64)
        return t.to(torch.int32 if t.dtype == torch.int64 else torch.int64)

    def wrong(*args, **kwargs):
        out = fn(*args, **kwargs)
        if index is None:
            return other(out)
        out = list(out)
        out[index] = other(torch.as_tensor(out[index]))
        return tuple(out)
    return wrong


def message_without_the_fix(fn):
    """The error-message kind: fn refusing the same bad input with the same exception type, in words that
    say only that it is invalid (not what was wrong nor what to do)."""
    def wrong(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise type(exc)("invalid input") from None
    return wrong


def collects_before_yielding(fn):
    """The streaming kind: a loader that runs every item before it yields the first (the right items, in
    order, none streamed)."""
    def wrong(*args, **kwargs):
        return iter(list(fn(*args, **kwargs)))
    return wrong


_BUFFER = torch.zeros(0)   # the module-level tensor writes_into_a_shared_buffer reuses


def writes_into_a_shared_buffer(fn):
    """The shared-state kind: fn's result copied into one buffer of the module, reused by every call (and
    every thread): the right values, until two calls overlap."""
    def wrong(*args, **kwargs):
        out = fn(*args, **kwargs)
        _BUFFER.resize_(out.shape).copy_(out)
        return _BUFFER
    return wrong


def draws_from_the_global_generator(fn):
    """The reproducibility kind: fn after a draw from torch's global generator (the default init, a global
    seed) where the exercise gives its own generator."""
    def wrong(*args, **kwargs):
        torch.rand(1)
        return fn(*args, **kwargs)
    return wrong


# --- A wrong answer's row, and the tests every lab runs -------------------------------------------

@dataclass(frozen=True)
class Wrong:
    lab: str
    function: str
    name: str                   # the id's last part
    fn: object                  # the wrong answer (a callable; for silu_mul_body, the C++ body)
    case: str | None            # the case that must fail (None: any; only with `accepts`)
    hint: str                   # a substring of that case's hint the feedback must contain
    accepts: str | None = None  # why the spec accepts it (the test is then an xfail)
    known: str | None = None    # another known shortfall: the case meant for it passes, or its hint is lost
    slow: bool = False

    @property
    def id(self):
        return f"{self.lab}-{self.function}-{self.name}"


def _param(w: Wrong):
    marks = [pytest.mark.slow] if w.slow else []
    if w.accepts:
        marks.append(pytest.mark.xfail(strict=True, reason=f"spec accepts: {w.accepts}"))
    return pytest.param(w, id=w.id, marks=marks)


def assert_fails_with_its_hint(w: Wrong, failures: dict[str, str]):
    """w fails its case with its hint (or, for a wrong answer the spec accepts, any case: an xfail)."""
    _, cases, _ = prepared(w.lab, w.function)
    if w.accepts:            # xfail(strict) until a case, any case, catches it with the hint
        assert failures, f"{w.id}: every case passed"
        assert any(w.hint in p for p in failures.values()), failures
        return
    case = next(c for c in cases if c.name == w.case)
    assert w.hint in case.hint or w.hint in (MATCH_HINT, FORBIDDEN_HINT) or case.call in NAMING_HARNESSES, \
        f"the table's hint is not the case's: {case.hint!r}"
    caught = w.case in failures and w.hint in failures[w.case]
    if w.known:              # caught elsewhere, or caught without its hint: an xfail until that is fixed
        assert not caught, f"{w.id} is now caught with its hint: drop known= ({w.known})"
        if w.known == HINT_DROPPED:
            assert w.case in failures, f"{w.id}: the case {w.case!r} passed; failures: {failures}"
        pytest.xfail(w.known)
    assert w.case in failures, f"{w.id}: the case {w.case!r} passed; failures: {failures}"
    assert caught, failures[w.case]
    if w.hint == FORBIDDEN_HINT:   # and the hint is why this exercise refuses the call
        assert exercise_of(w.lab, w.function).refused in failures[w.case]


def lab_tests(lab: str, wrong: list[Wrong], second_solutions: list[tuple[str, Callable]], *,
              failures: Callable | None = None, solution: Callable | None = None, visible: bool = False,
              fixtures: dict[str, str] | None = None, no_reference: dict[str, str] | None = None,
              reference_exempt: dict[str, set[str]] | None = None, slow_solutions: tuple[str, ...] = ()) -> dict:
    """The tests every lab's file runs, for `module.update(lab_tests(...))`:
    - each wrong answer fails its case with its hint (`failures(w, request)` -> {case: problem}; by default
      run_cases in this process); with visible=True that case is one the notebook's check() runs too;
    - every exercise has a wrong answer the spec rejects, and every refusal says why;
    - the spec's reference, the solution notebook's function (`solution(function, request, tmp_path)` may
      run it otherwise, returning its failures or None to run it here) and each second solution pass every
      case; reference_exempt names cases a reference is not meant for (function -> case names), no_reference
      the exercises whose reference is not run here (function -> why);
    - fixtures: function -> the fixture its cases need (requested before they run)."""
    functions = [e.function for e in SPECS[lab].exercises]
    fixtures, no_reference, reference_exempt = fixtures or {}, no_reference or {}, reference_exempt or {}

    def prepare(function, request):
        if function in fixtures:
            request.getfixturevalue(fixtures[function])

    def failures_here(w, request):
        return dict(run_cases(w.lab, w.fn, w.function))
    failures = failures or failures_here

    @pytest.mark.parametrize("w", [_param(w) for w in wrong])
    def test_wrong_answer_fails_with_its_hint(w, request):
        prepare(w.function, request)
        assert_fails_with_its_hint(w, failures(w, request))

    def test_every_exercise_has_a_wrong_answer():
        covered = {w.function for w in wrong if not w.accepts}
        assert [f for f in functions if f not in covered] == [], "exercises without a wrong answer the spec rejects"
        assert all(w.lab == lab for w in wrong)

    def test_every_refusal_says_why():
        """An exercise that refuses calls says why, in words of its own (the hint of a forbidden call)."""
        exercises = SPECS[lab].exercises
        assert [e.title for e in exercises if bool(e.forbidden) != bool(e.refused)] == []
        refusals = [e.refused for e in exercises if e.refused]
        assert len(set(refusals)) == len(refusals)

    @pytest.mark.parametrize("function", functions)
    def test_spec_reference_passes_every_case(function, request):
        if function in no_reference:
            pytest.skip(no_reference[function])
        prepare(function, request)
        failed = run_cases(lab, exercise_of(lab, function).reference, function, reference=True)
        assert [(name, p) for name, p in failed if name not in reference_exempt.get(function, ())] == []

    @pytest.mark.parametrize("function", [pytest.param(f, marks=[pytest.mark.slow] if f in slow_solutions else [])
                                          for f in functions])
    def test_solution_notebook_passes_every_case(function, request, tmp_path):
        prepare(function, request)
        failed = solution(function, request, tmp_path) if solution else None
        if failed is None:
            failed = run_cases(lab, solution_namespace(lab)[function], function)
        assert failed == []

    @pytest.mark.parametrize("function, fn", second_solutions,
                             ids=[f"{function}-{fn.__name__}" for function, fn in second_solutions])
    def test_second_solution_gets_full_marks(function, fn, request):
        """A right answer written otherwise than the solution's passes every case, visible and hidden."""
        prepare(function, request)
        assert run_cases(lab, fn, function) == []

    tests = {name: test for name, test in locals().items() if name.startswith("test_")}
    if visible:
        def test_wrong_answers_fail_a_visible_case():
            """Every wrong answer loses marks in the notebook's check too, not only in the grader: the case it
            is tested on is visible."""
            for w in wrong:
                if not w.accepts and not w.known:
                    _, cases, _ = prepared(w.lab, w.function)
                    assert not next(c for c in cases if c.name == w.case).hidden, w.id
        tests["test_wrong_answers_fail_a_visible_case"] = test_wrong_answers_fail_a_visible_case
    return tests
