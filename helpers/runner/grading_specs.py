"""What the grader checks, per lab: the functions a student writes, the inputs they are called on
(visible ones, as in the lab's check cells, and hidden ones the student copy does not show), and the
reference each result is compared with. The grader computes the references itself; nothing here
runs in the student's process.

To make a lab gradable, add a LabSpec to SPECS: one Exercise per function the lab asks for. An
Exercise's `cases(gen)` returns Case objects whose args are tensors or plain values (they travel to
the student's process as a weights-only torch file); `reference(*args, **kwargs)` computes the
expected result, or a Case names the exception it expects (`raises`, `match`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


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


@dataclass(frozen=True)
class Exercise:
    title: str                         # "Exercise 1: softmax"
    function: str                      # the name the student's notebook defines
    cases: Callable[[torch.Generator], list[Case]]
    reference: Callable[..., object]
    points: float = 1.0
    forbidden: tuple[str, ...] = ()    # torch functions the exercise asks the student to write without


@dataclass(frozen=True)
class LabSpec:
    lab: str                           # the manifest id
    exercises: tuple[Exercise, ...]
    allow_processes: bool = False      # True for labs whose code starts processes (Triton, torch.compile
                                       # workers, C++ builds); a submission could then read files that way


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    x = torch.randn(4, 7, generator=gen) * 50
    return [
        Case("large values, last dim", (x,), hint="subtract x.amax(dim, keepdim=True) before exp"),
        Case("along dim 0", (x,), {"dim": 0}, hint="use the dim argument in every reduction, with keepdim=True"),
        Case("3-D input along dim 1", (torch.randn(2, 3, 5, generator=gen) * 10,), {"dim": 1}, hidden=True,
             hint="reduce over `dim` only, keeping it (keepdim=True) so the division broadcasts"),
        Case("float64 keeps its dtype", (torch.randn(3, 4, generator=gen, dtype=torch.float64) * 100,),
             hidden=True, hint="do not convert to float32; every op here keeps the input dtype"),
        Case("huge values (1e4) do not overflow", (torch.randn(2, 6, generator=gen) * 1e4,), hidden=True,
             hint="exp(1e4) is inf in any float type: subtract the maximum first"),
    ]


def _rms_norm_cases(gen: torch.Generator) -> list[Case]:
    x, w = torch.randn(3, 5, 16, generator=gen), torch.rand(16, generator=gen)
    return [
        Case("values", (x, w), hint="x / sqrt(mean(x**2 over the last dim) + eps) * weight"),
        Case("a mismatched weight is rejected", (x, torch.ones(8)), raises="ValueError", match="weight",
             hint="compare weight.shape with x.shape[-1:] before computing"),
        Case("1-D input", (torch.randn(16, generator=gen), w), hidden=True,
             hint="normalise over the last dimension whatever the number of dimensions"),
        Case("eps is used", (torch.randn(4, 16, generator=gen) * 1e-3, w), {"eps": 1e-2}, hidden=True,
             hint="add eps inside the square root: it matters when values are tiny"),
        Case("a 2-D weight is rejected", (x, torch.ones(1, 16)), raises="ValueError", hidden=True,
             hint="the weight must have exactly the shape (x.shape[-1],)"),
    ]


def _rms_norm_reference(x, weight, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=eps)


SPECS: dict[str, LabSpec] = {
    "00_warmup_lab": LabSpec("00_warmup_lab", (
        Exercise("Exercise 1: softmax", "softmax", _softmax_cases,
                 lambda x, dim=-1: torch.softmax(x, dim=dim), forbidden=("softmax", "log_softmax", "_softmax")),
        Exercise("Exercise 2: rms_norm", "rms_norm", _rms_norm_cases, _rms_norm_reference),
    )),
}


def spec_for(lab: str) -> LabSpec:
    """The spec of a lab given by id (00_warmup_lab) or by its notebook path."""
    from pathlib import Path
    name = Path(lab).stem if lab.endswith(".ipynb") else lab
    if name not in SPECS:
        raise ValueError(f"no grading spec for lab {lab!r}; gradable labs: {', '.join(sorted(SPECS))} "
                         f"(add one to helpers/runner/grading_specs.py)")
    return SPECS[name]
