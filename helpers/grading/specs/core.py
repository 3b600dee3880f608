"""The shapes every lab's spec is written in: a Case (one call of the learner's function, with what is
checked), an Exercise (one function the lab asks for, its cases and reference, what it refuses) and a LabSpec
(a lab's exercises)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


CENTRAL_CAP = 0.25    # the most of an exercise's points an answer that misses its central point keeps


class SubmissionRefused(ValueError):
    """A submission the grader does not run, with what to do about it (too large, a project lacking a file)."""


@dataclass(frozen=True)
class Case:
    name: str                          # what is checked, shown in the feedback
    args: tuple
    kwargs: dict = field(default_factory=dict)
    hidden: bool = False               # not among the student copy's checks
    raises: str | None = None          # the exception class name expected instead of a result
    match: str | None = None           # ... whose message contains this
    atol: float = 1e-5
    rtol: float = 1e-4
    hint: str = ""
    call: str | None = None            # a harness (helpers.grading.checks or the lab's module
                                       # of helpers.grading.harnesses) that calls the function (builds a
                                       # generator, a model, a path); None: function(*args, **kwargs)
    expected: object = None            # with expect_value: this value, not the reference's result
    expect_value: bool = False
    central: bool = False              # checks the exercise's central point: failing it caps the exercise at
                                       # CENTRAL_CAP of its points, whatever else passed


@dataclass(frozen=True)
class Exercise:
    title: str                         # "Exercise 1: softmax"
    function: str                      # the name the student's notebook defines
    cases: Callable[[torch.Generator], list[Case]]
    reference: Callable[..., object]
    points: float = 1.0
    forbidden: tuple[str, ...] = ()    # what the exercise asks the student to write without: torch function
                                       # and aten op names (softmax, _softmax), or dotted paths of Python
                                       # functions and classes (helpers.moe.permute, torch.compile)
    refused: str = ""                  # why they are refused, and what the exercise wants instead: the hint
                                       # of a case that reached one of them
    needs: tuple[str, ...] = ()        # capabilities (helpers.device's names, as the lab's requires()) without
                                       # which the exercise is not gradable on the grading machine
    crashed: str = ""                  # the hint when a call kills the process with a signal (a native crash):
                                       # the usual mistake that does that, never the code
    substitutes: tuple[tuple[str, str], ...] = ()   # (name, dotted path of a public function): while this
                                       # exercise's cases run, the learner's global `name` (an earlier
                                       # exercise's function) is that function, so an earlier mistake costs
                                       # marks in its own exercise only
    judge: Callable | None = None      # judge(exercise, case, value, results) -> None (passed) or the feedback
                                       # line (results: the run's other exercises' results, as sent back):
                                       # for a goal measured in the sandbox and decided here (the capstone),
                                       # in place of comparing with the reference's result


@dataclass(frozen=True)
class LabSpec:
    lab: str                           # the manifest id
    exercises: tuple[Exercise, ...]
    allow_processes: bool = False      # True for labs whose code starts processes (Triton, torch.compile
                                       # workers, C++ builds); a submission could then read files that way
    submission: Callable | None = None   # graded on a project folder: submission(folder) -> the notebook the
                                       # sandbox runs for it (SubmissionRefused says what the folder lacks)
    solution: str = ""                 # what the grader grades first, under labs/solutions/ (default LAB.ipynb)
