"""What the grader checks, per lab (one module each, labNN.py): the functions a student writes, the inputs
they are called on (visible ones, as in the lab's check cells, and hidden ones the student copy does not
show), and the reference each result is compared with. The grader computes the references itself; nothing
here runs in the student's process, and the sandbox does not see this package.

To make a lab gradable, add a module with its SPEC, a LabSpec with one Exercise per function the lab asks
for, and list it in LABS below. An Exercise's `cases(gen)` returns Case objects whose args are tensors or
plain values (they travel to the student's process as a weights-only torch file); `reference(*args,
**kwargs)` computes the expected result, or a Case names the exception it expects (`raises`, `match`).
A case that needs more than a plain call names a harness (`Case.call`), which runs in the student's
process: helpers/grading/harnesses/. A lab graded on a project folder (the capstone) names how its folder
becomes the notebook the sandbox runs (LabSpec.submission) and judges each case itself (Exercise.judge).
"""
from __future__ import annotations

from helpers.grading.specs.core import Case, Exercise, LabSpec
from helpers.grading.specs import lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10

__all__ = ["Case", "Exercise", "LabSpec", "SPECS", "spec_for"]
LABS = (lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10)
SPECS: dict[str, LabSpec] = {module.SPEC.lab: module.SPEC for module in LABS}


def spec_for(lab: str) -> LabSpec:
    """The spec of a lab given by id (00_warmup_lab) or by its notebook path."""
    from pathlib import Path
    name = Path(lab).stem if lab.endswith(".ipynb") else lab
    if name not in SPECS:
        raise ValueError(f"no grading spec for lab {lab!r}; gradable labs: {', '.join(sorted(SPECS))} "
                         f"(add one to helpers/grading/specs/)")
    return SPECS[name]
