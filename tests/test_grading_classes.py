"""Every gradable lab graded as a small class: the solution (full marks), the untouched student copy
(zero), a partial one (exercise 1 only); in the labs whose last exercise runs where others' do not (lab 01:
threads and worker processes; lab 04: a C++ build), also one that crashes, one that hangs and one adversarial
(all three in the last exercise, which no other exercise calls): the grader handles those three the same way
in every lab, so the other labs leave them out to keep the suite's time (lab 02's Triton kernel is its
exercise 2, not its last). The grader's scores.csv, with its seconds column, is the table of
the closing notes."""
import copy
import csv
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from helpers.notebooks import BEGIN, END
from helpers.grading.grade import grade_submissions
from helpers.grading.specs import SPECS, spec_for

REPO = Path(__file__).resolve().parent.parent
# lab 00's class (solution, partial, crash, hangs, adversarial and more) is tests/test_grading.py's
LABS = sorted(lab for lab, spec in SPECS.items() if spec.submission is None and lab != "00_warmup_lab")  # lab 10: test_capstone_grading.py
FULL_CLASS_LABS = ("01_data_loading_lab", "04_custom_op_lab")
FAILING_KINDS = ("crash", "hang", "adversarial")
BLOCK = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*$", re.S | re.M)

HANG = "while True:\n    pass"
CRASH = "import os\nos._exit(1)"
READS_SOLUTION = """import json, pathlib, helpers
solutions = pathlib.Path(helpers.__file__).parent.parent / "labs" / "solutions"
return json.loads(next(solutions.glob("{lab}*.ipynb")).read_text())"""
CHEATS = """import torch, helpers.checks, helpers.grading.checks
helpers.grading.checks.check = lambda *a, **k: print("✅ Exercise: passed")
helpers.checks.check_close = helpers.checks.check_equal = lambda *a, **k: print("✅ Exercise: passed")
torch.allclose = lambda *a, **k: True
print("✅ every exercise: passed")"""


def solution_cell(nb, function: str) -> int:
    """The index of the code cell whose solution block defines `function`."""
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and BEGIN in c.source
                and re.search(rf"^\s*def {function}\b", c.source, re.M))


def with_body(source: str, body: str) -> str:
    """The cell with its solution block replaced by `body` at the block's indentation."""
    return BLOCK.sub(lambda m: "\n".join(m.group(1) + line for line in body.splitlines()), source, count=1)


def write_class(lab: str, folder, failing_kinds=FAILING_KINDS) -> None:
    solution = nbformat.read(str(REPO / "labs" / "solutions" / f"{lab}.ipynb"), as_version=4)
    student = nbformat.read(str(REPO / "labs" / f"{lab}.ipynb"), as_version=4)
    first, last = (e.function for e in (spec_for(lab).exercises[0], spec_for(lab).exercises[-1]))
    nbformat.write(solution, str(folder / "solution.ipynb"))
    nbformat.write(student, str(folder / "untouched.ipynb"))

    partial = copy.deepcopy(student)
    partial.cells[solution_cell(solution, first)] = copy.deepcopy(solution.cells[solution_cell(solution, first)])
    nbformat.write(partial, str(folder / "partial.ipynb"))

    for name, body in (("crash", CRASH), ("hang", HANG), ("adversarial", READS_SOLUTION.format(lab=lab[:2]))):
        if name not in failing_kinds:
            continue
        nb = copy.deepcopy(solution)
        cell = nb.cells[solution_cell(solution, last)]
        cell.source = with_body(cell.source, body)
        if name == "adversarial":
            nb.cells.append(new_code_cell(CHEATS))
        nbformat.write(nb, str(folder / f"{name}.ipynb"))


def build_lab_04_kernel() -> None:
    """Lab 04 builds the learner's C++ body in the grader's first call: build the solution's once, in a
    process of its own, so that the class's calls find it in the extension cache under a short limit."""
    solution = nbformat.read(str(REPO / "labs" / "solutions" / "04_custom_op_lab.ipynb"), as_version=4)
    body = solution.cells[solution_cell(solution, "silu_mul_body")].source
    code = (f"import torch\nfrom helpers.grading.harnesses import lab04 as lab_checks\n{body}\n"
            "lab_checks.silu_mul_kernel(silu_mul_body, torch.rand(4), torch.rand(4))")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=600)


@pytest.fixture(scope="module", params=LABS)
def graded(request, tmp_path_factory):
    lab = request.param
    folder = tmp_path_factory.mktemp(lab)
    write_class(lab, folder, FAILING_KINDS if lab in FULL_CLASS_LABS else ())
    if lab == "04_custom_op_lab":
        from helpers.device import capabilities
        if not (capabilities().toolchains["cxx"] and capabilities().toolchains["ninja"]):
            pytest.skip("lab 04's class needs a C++ compiler and ninja to build the learner's kernel")
        build_lab_04_kernel()
    # the hang stops at the per-call CPU limit: 10x the solution's slowest case there, at least 2 s; the wall
    # backstop is generous, since a busy machine slows every submission's clock (the crash reruns the cells)
    result = grade_submissions(lab, folder, out_dir=folder / "graded", workers=2, time_limit=900, seed=20261202)
    rows = {r["student"]: r for r in result["students"]}
    return lab, rows, list(csv.DictReader(open(folder / "graded" / "scores.csv")))


def test_a_class_gets_the_scores_its_work_deserves(graded):
    lab, rows, table = graded
    exercises = spec_for(lab).exercises
    full = {e.title: e.points for e in exercises}
    last = exercises[-1].title
    expected = {
        "solution": full,
        "untouched": dict.fromkeys(full, 0.0),
        "partial": {t: (p if t == exercises[0].title else 0.0) for t, p in full.items()},
        "crash": {**full, last: 0.0},
        "hang": {**full, last: 0.0},
        "adversarial": {**full, last: 0.0},
    }
    assert set(rows) == {*expected} - (set() if lab in FULL_CLASS_LABS else set(FAILING_KINDS))
    for student in rows:
        assert rows[student]["scores"] == expected[student], (student, rows[student]["lines"])
    if lab in FULL_CLASS_LABS:
        assert rows["crash"]["status"].startswith("crashed")
        assert rows["hang"]["status"] in ("ok", "timeout")
        if rows["adversarial"]["isolation"] != "isolated":   # the guard refuses the path; isolated, it is not there
            assert any("labs/solutions" in f for f in rows["adversarial"]["flags"]), rows["adversarial"]["flags"]
    assert not rows["solution"]["flags"], rows["solution"]["flags"]
    assert all(float(r["seconds"]) > 0 for r in table)
