"""Lab 10 graded as every lab is, on project folders: `python -m helpers grade 10_capstone_lab SUBMISSIONS`
runs each goal's measure on a submitted project in the sandbox and judges what comes back in the grader, where
the reference is. A class of four, on the goals that need no timing, each on its first workload: the solution
(with the report recorded in its folder) earns every point, the starting code only what it already earns, the planted bug fixed alone what that fixes,
and a project that replaces the clock during a call nothing from then on."""
import dataclasses
import shutil

import pytest
import torch

from helpers import capstone
from helpers.grading.grade import find_submissions, grade_submissions
from helpers.grading.specs import SPECS, lab10
from helpers.grading.specs.core import SubmissionRefused

UNTIMED_CHEAP = ("loss_curve", "causality", "batches_match", "serving_agreement", "served_size", "graph_breaks",
                 "report")   # the report judged on its own rounds (no timed goal in this run)


def project(base, folder, edits: dict[str, list[tuple[str, str]]] = {}):
    """A copy of the project in `base` with each (old, new) replacement made once in its file."""
    shutil.copytree(base, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name, replacements in edits.items():
        text = (folder / name).read_text()
        for old, new in replacements:
            assert text.count(old) == 1, f"{old!r} is not exactly once in {name}"
            text = text.replace(old, new)
        (folder / name).write_text(text)
    return folder


def test_a_project_lacking_a_module_is_refused_with_what_to_do(tmp_path):
    folder = project(capstone.START, tmp_path / "p")
    (folder / "serve.py").unlink()
    with pytest.raises(SubmissionRefused, match=r"no serve\.py: hand in the whole folder"):
        lab10.project_files(folder)
    (folder / "serve.py").write_text("x = 1\n" * 100_000)
    with pytest.raises(SubmissionRefused, match="more than the 512 KB"):
        lab10.project_files(folder)


def test_submissions_are_project_folders_or_one_inside_a_folder(tmp_path):
    project(capstone.START, tmp_path / "alice")
    project(capstone.START, tmp_path / "bob" / "my_capstone")
    (tmp_path / "carol").mkdir()
    (tmp_path / "carol" / "notes.txt").write_text("no project here")
    project(capstone.START, tmp_path / "dan" / "10_capstone")
    project(capstone.START, tmp_path / "dan" / "my_capstone")
    found = find_submissions(tmp_path, projects=True)
    # carol and dan get a row that says what is missing (no project; two, and which one is not guessed)
    assert found == {"alice": tmp_path / "alice", "bob": tmp_path / "bob" / "my_capstone",
                     "carol": tmp_path / "carol", "dan": tmp_path / "dan"}
    with pytest.raises(SubmissionRefused, match="no __init__.py"):
        lab10.project_files(found["dan"])


def test_every_goal_gets_the_same_hidden_workloads_and_another_seed_other_ones():
    def workloads(seed, goal):
        exercise = next(e for e in lab10.SPEC.exercises if e.function == goal)
        return [(c.args[0], c.hidden) for c in exercise.cases(torch.Generator().manual_seed(seed))]
    loss, size = workloads(1, "loss_curve"), workloads(1, "served_size")
    assert loss == size and len(loss) == 1 + lab10.HIDDEN
    assert loss[0] == (capstone.VISIBLE, False) and all(hidden for _, hidden in loss[1:])
    assert {w["part"] for w, _ in loss[1:]} == {0, 1}          # both corpus slices
    assert workloads(1, "train_speed") == loss[1:2]           # timed: one hidden workload
    assert workloads(2, "loss_curve")[1:] != loss[1:]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    project(capstone.REFERENCE, folder / "solution")
    project(capstone.START, folder / "start")
    project(capstone.START, folder / "bug_fixed" / "my_capstone", {"model.py": [("tril(diagonal=1)", "tril()")]})
    project(capstone.REFERENCE, folder / "clock", {"model.py": [
        ("def build_model(", "def build_model(*args, **kwargs):\n    import time\n    time.perf_counter = lambda: 0.0\n"
                             "    return _build_model(*args, **kwargs)\n\n\ndef _build_model(")]})
    project(capstone.REFERENCE, folder / "frames", {"data.py": [
        ("def corpus(", "def _caller():\n    import sys\n    return sys._getframe(2)\n\n\ndef corpus(")]})
    visible = tuple(dataclasses.replace(e, cases=lambda gen, cases=e.cases: cases(gen)[:1])
                    for e in lab10.SPEC.exercises if e.function in UNTIMED_CHEAP)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(SPECS, "10_capstone_lab", dataclasses.replace(lab10.SPEC, exercises=visible))
        result = grade_submissions("10_capstone_lab", folder, out_dir=folder / "graded", workers=1)
    return {row["student"]: row for row in result["students"]}, folder / "graded"


def scores(row) -> dict[str, float]:
    return {title.split(": ")[1]: score for title, score in row["scores"].items()}


@pytest.mark.slow
def test_the_solution_earns_every_point(graded):
    row = graded[0]["solution"]
    assert row["total"] == row["max"] == len(UNTIMED_CHEAP) and row["status"] == "ok", row["lines"]


@pytest.mark.slow
def test_the_starting_code_earns_only_serving_agreement(graded):
    row = graded[0]["start"]
    assert [goal for goal, score in scores(row).items() if score] == ["serving agreement"], row["lines"]
    leak = next(line for line in row["lines"] if "the planted bug" in line)
    assert "leaking_positions" in leak and f"Hint: {capstone.HINTS['causality']}" in leak


@pytest.mark.slow
def test_fixing_the_planted_bug_alone_earns_what_it_fixes(graded):
    assert {goal for goal, score in scores(graded[0]["bug_fixed"]).items() if score} == {
        "loss curve", "the planted bug", "serving agreement"}


@pytest.mark.slow
def test_a_project_that_replaces_the_clock_earns_nothing_after_it_did(graded):
    """Its build_model replaces time.perf_counter: the documented batches, measured before any model is built,
    keep their point; every goal after it counts for nothing."""
    row = graded[0]["clock"]
    assert {goal for goal, score in scores(row).items() if score} == {"the documented batches"}, row["lines"]
    assert all("could not trust" in line for line in row["lines"] if line.startswith("❌")), row["lines"]
    assert "time.perf_counter" in (graded[1] / "feedback" / "clock.md").read_text()


@pytest.mark.slow
def test_a_project_naming_interpreter_internals_is_not_trusted_until_reviewed(graded):
    """Its measures run in the project's process, where frames reach them: every goal scored 0 and the row
    asks for a review, naming what was found and where."""
    row = graded[0]["frames"]
    assert row["total"] == 0 and "review: interpreter internals" in row["status"], row
    assert all("not trusted" in line and "_getframe (frames) in data.py" in line
               for line in row["lines"] if line.startswith("❌")), row["lines"]
