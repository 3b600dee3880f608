"""Export the labs as an nbgrader course source, for instructors who grade with nbgrader.

    export_course(Path("course"))                    # every lab in labs/solutions
    export_course(Path("course"), ["00_warmup_lab"])

then, in course/: `nbgrader generate_assignment 00_warmup_lab`, release, collect, `nbgrader autograde
00_warmup_lab`. nbgrader uses the same `### BEGIN SOLUTION` / `### END SOLUTION` markers as the labs,
so generate_assignment replaces each solution with its own stub. Its autograder runs the labs' visible
check cells only; `python -m helpers grade` also runs the hidden cases of helpers/grading/specs/.

How cells are marked, in each solution notebook:
- a code cell with a `### BEGIN SOLUTION` line is the solution of the next exercise (Exercise 1, 2, ...,
  numbered as `python -m helpers labs build` numbers its stubs);
- a later code cell without one that calls a check (check..., fail, passed) is a test cell of the
  exercise before it, unless it catches AssertionError (a cell that shows what a failing check says);
  an exercise's points (its grading spec's `points`, 1 where the lab has no spec) are shared among its
  test cells, each of which first binds `check` to a fresh copy of the grader's (a submission that rebinds
  the name, `check = lambda *a, **k: None`, or patches the module, still meets the real one);
- every other cell is locked (read only).
"""
from __future__ import annotations

import re
from pathlib import Path

from helpers.notebooks import BEGIN, REPO, read, write
from helpers.files import write_text_atomic
from helpers.manifest import notebook_graded_labs
from helpers.grading.specs import SPECS

SOLUTIONS = REPO / "labs" / "solutions"
CHECK_CALL = re.compile(r"(?<!def )\b(check\w*|fail|passed)\s*\(")
GRADER_CHECK = ("import importlib as _importlib, helpers.grading.checks as _grader_checks  # the grader's own check\n"
                "check = _importlib.reload(_grader_checks).check\n")

CONFIG = '''\
# nbgrader configuration of the PyTorch 2.10 Labs course (written by helpers.grading.nbgrader_export).
import os

c = get_config()  # noqa: F821 (nbgrader defines it)
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.Execute.timeout = 300     # seconds per cell (nbgrader's default, 30, is short for a compiling cell)

# The labs import the course's `helpers` package. Where it is not installed (pip install -e REPO),
# the kernels nbgrader starts find it on PYTHONPATH, from the repository this course came from.
REPO = {repo!r}
if os.path.isdir(os.path.join(REPO, "helpers")):
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in paths if p != REPO])
# Grade in quick mode (small sizes, no speed targets), as the test suite runs the labs; set
# LABS_QUICK=0 before running nbgrader to grade at full size.
os.environ.setdefault("LABS_QUICK", "1")
'''


def _meta(grade_id: str, *, solution=False, grade=False, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution}
    if grade:
        meta["points"] = points
    return meta


def _shares(points: float, n: int) -> list[float]:
    """`points` split into n shares of two decimals that add up to it."""
    share = round(points / n, 2)
    return [share] * (n - 1) + [round(points - share * (n - 1), 2)]


def nbgrader_notebook(lab_id: str):
    """Lab `lab_id`'s solution notebook with nbgrader metadata on every cell (see the module docstring)."""
    nb = read(SOLUTIONS / f"{lab_id}.ipynb")
    spec = SPECS.get(lab_id)
    points = {int(m.group(1)): e.points for e in (spec.exercises if spec else ())
              if (m := re.match(r"Exercise (\d+)", e.title))}
    exercise, tests = 0, {}                      # exercise number -> its test cells
    for i, cell in enumerate(nb.cells):
        source = cell.source
        if cell.cell_type == "code" and BEGIN in source:
            exercise += 1
            cell.metadata["nbgrader"] = _meta(f"ex{exercise}_solution", solution=True)
        elif (cell.cell_type == "code" and exercise and CHECK_CALL.search(source)
              and "except AssertionError" not in source):
            tests.setdefault(exercise, []).append(cell)
        else:
            cell.metadata["nbgrader"] = _meta(f"cell{i:02d}_readonly")
    for n, cells in tests.items():
        for j, (cell, share) in enumerate(zip(cells, _shares(points.get(n, 1.0), len(cells))), 1):
            cell.metadata["nbgrader"] = _meta(f"ex{n}_check{j}", grade=True, points=share)
            cell.source = GRADER_CHECK + cell.source
    return nb


def export_course(dest: Path, labs: list[str] | None = None) -> Path:
    """Write an nbgrader course source into `dest`: nbgrader_config.py and
    source/<lab_id>/<lab_id>.ipynb for each lab id in `labs` (default: every lab graded on its notebook's
    functions; the capstone is graded on a project folder, which nbgrader cannot run),
    marked for nbgrader. Returns `dest`."""
    dest = Path(dest)
    labs = labs if labs is not None else notebook_graded_labs()
    for lab_id in labs:
        if not (SOLUTIONS / f"{lab_id}.ipynb").is_file():
            raise ValueError(f"no lab {lab_id!r} in {SOLUTIONS}")
        write(nbgrader_notebook(lab_id), dest / "source" / lab_id / f"{lab_id}.ipynb")
    write_text_atomic(CONFIG.format(repo=str(REPO)), dest / "nbgrader_config.py")
    return dest
