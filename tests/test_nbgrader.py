"""The nbgrader export: every lab's cells carry valid nbgrader metadata (no nbgrader needed), and real
nbgrader turns lab 00 into a student release, then autogrades the solution to full marks and the
untouched release to zero."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.notebooks import BEGIN
from helpers.grading.specs import SPECS
from helpers.grading.nbgrader_export import GRADER_CHECK, SOLUTIONS, export_course
from helpers.manifest import notebook_graded_labs

REPO = Path(__file__).resolve().parent.parent
LABS = notebook_graded_labs()
LAB = "00_warmup_lab"


def test_every_lab_exports_with_consistent_nbgrader_metadata(tmp_path):
    assert len(LABS) == 10
    course = export_course(tmp_path / "course")
    assert (course / "nbgrader_config.py").is_file()
    for lab in LABS:
        solution = nbformat.read(str(SOLUTIONS / f"{lab}.ipynb"), as_version=4)
        nb = nbformat.read(str(course / "source" / lab / f"{lab}.ipynb"), as_version=4)
        assert [c.source.removeprefix(GRADER_CHECK) for c in nb.cells] == [c.source for c in solution.cells], lab
        assert all(c.source.startswith(GRADER_CHECK) == c.metadata["nbgrader"]["grade"] for c in nb.cells), lab
        metas = [c.metadata["nbgrader"] for c in nb.cells]
        ids = [m["grade_id"] for m in metas]
        assert len(ids) == len(set(ids)), f"{lab}: duplicate grade_ids"
        assert all(re.fullmatch(r"[A-Za-z0-9_-]+", i) for i in ids), lab
        assert all(m["schema_version"] == 3 for m in metas)
        solutions = [c for c in nb.cells if c.metadata["nbgrader"]["solution"]]
        assert len(solutions) == sum(c.cell_type == "code" and BEGIN in c.source for c in solution.cells), lab
        assert all(BEGIN in c.source and not c.metadata["nbgrader"]["locked"]
                   and not c.metadata["nbgrader"]["grade"] for c in solutions), lab
        tests = [c for c in nb.cells if c.metadata["nbgrader"]["grade"]]
        assert all(c.cell_type == "code" and BEGIN not in c.source and c.metadata["nbgrader"]["locked"]
                   and not c.metadata["nbgrader"]["solution"] and c.metadata["nbgrader"]["points"] > 0
                   for c in tests), lab
        others = [m for m in metas if not (m["solution"] or m["grade"])]
        assert all(m["locked"] and "points" not in m for m in others), lab
        # each exercise has test cells; their points add up to the spec's (1 without a spec)
        spec = {int(re.match(r"Exercise (\d+)", e.title).group(1)): e.points
                for e in (SPECS[lab].exercises if lab in SPECS else ())}
        per_exercise = {}
        for c in tests:
            n = int(re.match(r"ex(\d+)_check\d+$", c.metadata["nbgrader"]["grade_id"]).group(1))
            per_exercise[n] = per_exercise.get(n, 0) + c.metadata["nbgrader"]["points"]
            assert all(int(k) == n for k in re.findall(r"Exercise (\d+)", c.source)), (lab, c.source[:80])
        assert sorted(per_exercise) == list(range(1, len(solutions) + 1)), lab
        for n, total in per_exercise.items():
            assert total == pytest.approx(spec.get(n, 1.0)), (lab, n)


def test_a_test_cell_runs_the_graders_check_whatever_the_notebook_bound(tmp_path):
    nb = nbformat.read(str(export_course(tmp_path / "course", [LAB]) / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    test_cell = next(c.source for c in nb.cells if c.metadata["nbgrader"]["grade"] and "softmax" in c.source)
    namespace = {"check": lambda *a, **k: None}       # the one line that gave full marks
    exec("import torch\ndef softmax(x, dim=-1):\n    return torch.zeros_like(x)\n", namespace)
    with pytest.raises(AssertionError, match="softmax"):
        exec(test_cell, namespace)


def _nbgrader(course: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               LABS_QUICK="1", LABS_HEADLESS="1")
    # nbgrader runs its database migrations with the `alembic` command: this venv's, found on PATH
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_real_nbgrader_releases_and_autogrades_lab_00(tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader is not installed (pip install nbgrader)")
    from nbgrader.api import Gradebook

    course = export_course(tmp_path / "course", [LAB])
    _nbgrader(course, "generate_assignment", LAB, "--force")
    release = course / "release" / LAB / f"{LAB}.ipynb"
    text = release.read_text()
    assert BEGIN not in text and "x.amax(dim=dim" not in text and "raise NotImplementedError()" in text

    # "solved" fills the release copy's solution cells with the lab's solutions; "untouched" hands it in as is
    source = nbformat.read(str(course / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells}
    solved = nbformat.read(str(release), as_version=4)
    for cell in solved.cells:
        if cell.metadata["nbgrader"]["solution"]:
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    for student in ("solved", "untouched"):
        (course / "submitted" / student / LAB).mkdir(parents=True)
    nbformat.write(solved, str(course / "submitted" / "solved" / LAB / f"{LAB}.ipynb"))
    shutil.copy(release, course / "submitted" / "untouched" / LAB / f"{LAB}.ipynb")
    _nbgrader(course, "autograde", LAB, "--force")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        solved, untouched = gb.find_submission(LAB, "solved"), gb.find_submission(LAB, "untouched")
        assert solved.max_score == 2.0
        assert (solved.score, untouched.score) == (2.0, 0.0)
