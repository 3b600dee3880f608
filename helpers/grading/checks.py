"""Lab checks shared by the notebooks and the grader: one source of truth for every exercise's cases.

    from helpers.grading.checks import check
    check("03_moe_lab", permute_tokens)     # the spec's visible cases, with their hints

`check` runs the visible cases of the exercise's spec (helpers/grading/specs/labNN.py) on the learner's
function exactly as the grader does (same call, same recording of forbidden functions, same judge), so a
check cell and `python -m helpers grade` cannot disagree. The grader adds hidden cases on a secret seed.

`call_case` is the one way an exercise function is called: through the case's harness (a function named
by `Case.call`, of this module or of the lab's module in helpers/grading/harnesses/, which builds what
cannot travel as tensors: a generator, a model, a file path) while helpers.grading.recorder records the
forbidden functions it reaches.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import types
from typing import Callable

import torch

from helpers.checks import STUB_TEXT, CheckFailed
from helpers.grading.judge import judge_case
from helpers.grading.recorder import record_calls


# --- Calling an exercise function and recording what it calls --------------------------------------

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
    if case.raises or exercise.judge is not None:
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


