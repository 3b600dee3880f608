"""Judging one case: what a student's function returned (as the sandbox sent it) against what the
case expects. Runs where the submission cannot reach: in the grader, and in a notebook's own check."""
from __future__ import annotations

import io
import math
import re
import sys
from typing import TYPE_CHECKING

import torch

from helpers.checks import STUB_TEXT, CheckFailed, check_close, check_equal

if TYPE_CHECKING:   # the specs are not importable in a submission's sandbox, where this module runs
    from helpers.grading.specs import Case, Exercise


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
RECORDER_OFF = "the grader's recorder (switched off or replaced during the call)"


def untrusted(text: str, limit: int = 300) -> str:
    """A submission's text for the feedback: one line, no control characters, shortened, in a code span (no
    heading, link, emphasis or check mark of its own can start a line)."""
    flat = CONTROL.sub(" ", str(text).replace("\r", " ").replace("\n", " ⏎ "))[:limit]
    return "`" + flat.replace("`", "'") + "`"


def plain_name(text: str) -> str:
    """A class name from a submission: letters, digits, '_' and '.' only."""
    return re.sub(r"[^\w.]", "?", str(text))[:80]


class _Placeholder:
    """Stands for a returned value that was not a tensor or plain value (its type name only)."""


def _returned(value):
    if isinstance(value, dict) and "type" in value:
        return type(plain_name(value["type"]), (_Placeholder,), {})()
    return value


def judge_case(exercise: Exercise, case: Case, expected, got: dict, results: dict | None = None) -> str | None:
    """None when the case passes, else the feedback line (problem and hint). Runs in the grader. `results`:
    every exercise's results from the same run, for a judge that compares with another goal's measure."""
    what = f"{exercise.title}: {case.name}"
    if RECORDER_OFF in got["torch_calls"] or got.get("tampered"):
        return (f"❌ {what}: the grader could not trust its record of this call: its recorder or harness was "
                f"switched off or replaced, or code of yours ran where it does not record"
                f"{' (' + untrusted('; '.join(got['tampered'][:3])) + ')' if got.get('tampered') else ''}; a case "
                f"run that way counts for nothing\n   Hint: leave sys.setprofile, torch's mode stacks, torch.save and "
                f"helpers.grading alone, and do the exercise's work on the calling thread or in a thread pool")
    used = sorted(set(got["torch_calls"]) & set(exercise.forbidden))
    if used:
        aliases = (" (torch.X, torch.nn.functional.X, Tensor.X, torch.ops.aten.X, an import alias)"
                   if any("." not in name for name in used) else "")
        return (f"❌ {what}: calls {', '.join(used)}, refused in this exercise under any name{aliases}\n"
                f"   Hint: {exercise.refused or 'use only the basic tensor operations'}")
    raised = got["raised"]
    try:
        if case.raises:
            if raised is None:
                return f"❌ {what}: did not raise {case.raises}\n   Hint: {case.hint or 'validate the input first'}"
            if raised["type"] != case.raises:
                return (f"❌ {what}: raised {plain_name(raised['type'])}: {untrusted(raised['message'])}, expected {case.raises}\n"
                        f"   Hint: {case.hint}")
            if case.match and case.match not in raised["message"]:
                return (f"❌ {what}: the {case.raises} message {untrusted(raised['message'])} does not mention "
                        f"{case.match!r}\n   Hint: say what was wrong and how to fix it")
            return None
        if raised is not None:
            if raised["type"] == "NotImplementedError" and raised["message"].endswith(STUB_TEXT):
                number = exercise.title.split(":")[0]
                return (f"❌ {what}: not started: {exercise.function} still raises NotImplementedError\n"
                        f"   Task: write {exercise.function} in the cell of {number}, in place of the line that "
                        f"raises, then run the check again")
            if raised["type"] == "CellTimeout":
                return f"❌ {what}: ran past the time limit and was stopped\n   Hint: look for a loop that never ends"
            return (f"❌ {what}: raised {plain_name(raised['type'])}: {untrusted(raised['message'])}\n"
                    f"   Hint: {case.hint or 'run the function on this kind of input in your notebook'}")
        if exercise.judge is not None:
            return exercise.judge(exercise, case, got["value"], results or {})
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
        failures = []
        for key in expected:       # every wrong key named, not only the first (a prediction of four counts)
            try:
                _compare(actual[key], expected[key], f"{what} [{key!r}]", case)
            except CheckFailed as exc:
                failures.append((key, exc))
        if len(failures) == 1 or any(isinstance(expected[k], torch.Tensor) for k, _ in failures):
            raise failures[0][1]
        if failures:
            check_equal([actual[k] for k, _ in failures], [expected[k] for k, _ in failures], hint=case.hint,
                        what=f"{what} [{', '.join(repr(k) for k, _ in failures)}]")
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
