"""The learner's progress (helpers.progress): the summary from events, the file the hooks write in a kernel,
nothing written in batch or test runs nor where the file cannot be written, start and finish from IPython's
cell events (a hook that never raises; lesson 00's finish before its summary), the notebook's name in Colab,
and `python -m helpers progress`."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
import torch

from helpers import notebooks, progress
from helpers.checks import CheckFailed, check_equal
from helpers.device import requires
from helpers.interactive import Prediction, reveal

REPO = Path(__file__).resolve().parent.parent
ENTRIES = [
    {"id": "01_topic", "kind": "lesson", "title": "Topic", "path": "notebooks/01_topic.ipynb"},
    {"id": "01_topic_deep_dive", "kind": "lesson", "deep_dive_of": "01_topic", "title": "Deep dive",
     "path": "notebooks/01_topic_deep_dive.ipynb"},
    {"id": "02_other", "kind": "lesson", "title": "Other", "path": "notebooks/02_other.ipynb"},
    {"id": "03_unopened", "kind": "lesson", "title": "Unopened", "path": "notebooks/03_unopened.ipynb"},
    {"id": "01_lab", "kind": "lab", "title": "Lab 01", "path": "labs/solutions/01_lab.ipynb"},
]
IN_THIS_PROCESS = progress.current_notebook
EXERCISES = {"01_lab": ["Exercise 1: permute", "Exercise 2: gemm", "Exercise 3: ffn"]}


def event(kind: str, notebook: str, **fields) -> dict:
    return {"event": kind, "notebook": f"/home/learner/course/{notebook}.ipynb", "torch": "2.10.0",
            "time": "2026-01-01T10:00:00", **fields}


SKIP_REASON = "needs cuda (this machine: cpu); to run it: an NVIDIA GPU"
EVENTS = [
    event("start", "01_topic"),
    event("section", "01_topic", section="GPU timing", ran=False, reason=SKIP_REASON),
    event("section", "01_topic", section="torchdata loader", ran=False, reason="needs torchdata"),
    event("section", "01_topic", section="torchdata loader", ran=True, reason=None),   # installed, run again
    event("prediction", "01_topic", question="How much faster?", held=False),
    event("prediction", "01_topic", question="How much faster?", held=True),          # the latest counts
    event("prediction", "01_topic", question="Which kernel?", held=None),              # not answered
    event("finish", "01_topic"),
    event("start", "01_topic_deep_dive"),
    event("section", "01_topic_deep_dive", section="C++", ran=True, reason=None),
    event("finish", "01_topic_deep_dive"),
    event("start", "02_other"),
    event("prediction", "02_other", question="How many?", held=False),
    event("start", "01_lab"),
    event("check", "01_lab", what="Exercise 1: permute: small case", passed=True),
    event("check", "01_lab", what="Exercise 1: permute: skewed case: raised ValueError: no", passed=False),
    event("check", "01_lab", what="Exercise 1: permute: small case", passed=True),     # fixed and checked again
    event("check", "01_lab", what="Exercise 2: gemm: empty group: 3 of 4 values differ", passed=False),
    {**event("check", "x", what="Exercise 1: elsewhere", passed=True), "notebook": progress.UNKNOWN_NOTEBOOK},
]


def test_summary_from_events():
    summary = progress.summarize(EVENTS, ENTRIES, EXERCISES)
    items = {item["id"]: item for item in summary["notebooks"]}
    lesson = items["01_topic"]
    assert lesson["status"] == "ran partly"
    assert lesson["skipped"] == [{"section": "GPU timing", "reason": SKIP_REASON}]   # the loader ran later
    assert lesson["predictions"] == {"revealed": 2, "answered": 1, "held": 1}
    assert items["01_topic_deep_dive"]["status"] == "ran fully"
    assert items["01_topic_deep_dive"]["kind"] == "deep dive"
    assert items["02_other"]["status"] == "opened"            # never ran its last cell
    assert items["03_unopened"]["status"] == "not opened"
    lab = items["01_lab"]
    assert lab["exercises"] == [{"exercise": "Exercise 1: permute", "passed": True},
                                {"exercise": "Exercise 2: gemm", "passed": False},
                                {"exercise": "Exercise 3: ffn", "passed": None}]
    assert summary["predictions"] == {"revealed": 3, "answered": 2, "held": 1}
    assert summary["other_notebooks"] == {progress.UNKNOWN_NOTEBOOK: 1}
    text = progress.summary_text(summary)
    assert f"skipped 'GPU timing': {SKIP_REASON}" in text
    assert "1 of 3 exercises passed" in text and "Exercise 2: gemm: not yet" in text
    assert "Predictions: 2 answered, 1 held (01_topic 1 of 1; 02_other 0 of 1)" in text


@pytest.fixture
def in_a_kernel(tmp_path, monkeypatch):
    """Recording on, as in a learner's kernel running notebooks/01_topic.ipynb; the file under tmp_path."""
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(progress.HEADLESS_ENV, raising=False)
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.setattr(progress, "current_notebook", lambda: str(tmp_path / "01_lab.ipynb"))
    return tmp_path / "state" / "progress.jsonl"


def test_the_hooks_write_events_that_read_back(in_a_kernel, capsys):
    ran = requires("cuda", section="GPU timing")
    check_equal(2, 2, what="Exercise 1: permute: small case")
    with pytest.raises(CheckFailed):
        check_equal(1, 2, what="Exercise 2: gemm: a case")
    assert reveal(Prediction("How many?", None, "x", 3.0), 3.5, why="because") is True
    events = progress.read_events(in_a_kernel)
    assert [e["event"] for e in events] == ["section", "check", "check", "prediction"]
    assert all(e["notebook"].endswith("01_lab.ipynb") and e["torch"] == torch.__version__ and e["time"]
               for e in events)
    assert (events[0]["section"], events[0]["ran"]) == ("GPU timing", ran)
    assert (events[2]["what"], events[2]["passed"]) == ("Exercise 2: gemm: a case: got 1, expected 2", False)
    assert (events[3]["question"], events[3]["held"]) == ("How many?", True)
    lab = progress.summarize(events, ENTRIES, EXERCISES)["notebooks"][-1]
    assert [e["passed"] for e in lab["exercises"]] == [True, False, None]
    assert progress.reset(in_a_kernel) and not in_a_kernel.exists() and not progress.reset(in_a_kernel)


def test_a_lab_check_records_every_kind_of_failure_then_the_pass(in_a_kernel):
    """The lab's check raises CheckFailed itself for a function that raises (no fail() call on that path)."""
    from helpers.grading.checks import check

    def softmax(x, dim=-1):
        raise ValueError("not written yet")
    with pytest.raises(CheckFailed):
        check("00_warmup_lab", softmax)
    assert progress.summarize(progress.read_events(in_a_kernel), ENTRIES, EXERCISES)["notebooks"][-1][
        "exercises"][0]["passed"] is False

    def softmax(x, dim=-1):   # noqa: F811 (the learner's second attempt)
        e = (x - x.amax(dim, keepdim=True)).exp()
        return (e / e.sum(dim, keepdim=True)).nan_to_num(0.0)
    check("00_warmup_lab", softmax)
    assert progress.summarize(progress.read_events(in_a_kernel), ENTRIES, EXERCISES)["notebooks"][-1][
        "exercises"][0]["passed"] is True


@pytest.mark.parametrize("setting", ["off", "headless", "no kernel"])
def test_nothing_is_recorded_off_headless_or_outside_a_kernel(in_a_kernel, monkeypatch, setting):
    if setting == "off":
        monkeypatch.setenv(progress.PROGRESS_ENV, "off")
    elif setting == "headless":
        monkeypatch.setenv(progress.HEADLESS_ENV, "1")
    else:
        monkeypatch.setattr(progress, "current_notebook", IN_THIS_PROCESS)   # pytest is no Jupyter kernel
    requires("cuda", section="GPU timing")
    check_equal(2, 2, what="Exercise 1: permute: small case")
    assert not in_a_kernel.exists()


def test_a_file_that_cannot_be_written_records_nothing_and_raises_nothing(in_a_kernel, monkeypatch, tmp_path):
    blocker = tmp_path / "a file, not a folder"
    blocker.write_text("")
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(blocker / "state"))
    check_equal(2, 2, what="Exercise 1: permute: small case")     # mkdir fails: an OSError, swallowed
    assert progress.read_events(blocker / "state" / "progress.jsonl") == []
    in_a_kernel.parent.mkdir(parents=True)
    in_a_kernel.write_text('{"event": "start", "notebook": "a.ipynb"}\n{"event": "che')   # cut off mid-write
    assert progress.read_events(in_a_kernel) == [{"event": "start", "notebook": "a.ipynb"}]


def test_start_and_finish_come_from_the_cells_run(in_a_kernel, monkeypatch, tmp_path):
    path = tmp_path / "01_topic.ipynb"
    cells = [nbformat.v4.new_code_cell("import helpers"), nbformat.v4.new_code_cell("print('last')"),
             nbformat.v4.new_markdown_cell("The end.")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    monkeypatch.setattr(progress, "current_notebook", lambda: str(path))
    callbacks = []
    shell = SimpleNamespace(user_ns={"__session__": str(path)},
                            events=SimpleNamespace(register=lambda name, fn: callbacks.append((name, fn))))
    progress.watch(shell)
    (name, after_cell), = callbacks
    assert name == "post_run_cell"

    def run(source, cell_id=None, success=True):
        after_cell(SimpleNamespace(success=success, info=SimpleNamespace(raw_cell=source, cell_id=cell_id)))
    run("import helpers", cells[0].id)
    run("print('last')  # edited, not saved", cells[1].id, success=False)   # raised: not finished
    assert [e["event"] for e in progress.read_events(in_a_kernel)] == ["start"]
    run("print('last')  # edited, not saved", cells[1].id)                   # by the cell's id
    run("print('last')\n")                                                   # a front end without ids
    assert [e["event"] for e in progress.read_events(in_a_kernel)] == ["start", "finish", "finish"]


def test_a_numpy_prediction_is_recorded_and_an_unwritable_field_raises_nothing(in_a_kernel, capsys):
    """reveal compares numpy scalars to a numpy.bool_, which JSON cannot hold: reveal records a bool, and
    record() drops an event it cannot write instead of raising in the learner's lesson."""
    assert reveal(Prediction("How many?", None, "x", 3.0), np.float64(3.5), why="because") is True
    assert progress.read_events(in_a_kernel)[-1]["held"] is True
    progress.record("prediction", question="Which?", held=np.bool_(True))
    assert len(progress.read_events(in_a_kernel)) == 1


def test_the_cell_hook_never_raises(in_a_kernel, monkeypatch):
    callbacks = []
    shell = SimpleNamespace(user_ns={}, events=SimpleNamespace(register=lambda name, fn: callbacks.append(fn)))
    progress.watch(shell)
    (after_cell,) = callbacks

    def broken(*args, **kwargs):
        raise KeyError("broken")
    monkeypatch.setattr(progress, "record", broken)
    after_cell(SimpleNamespace(success=True, info=None))            # the start: record raises
    monkeypatch.setattr(progress, "is_last_code_cell", broken)
    after_cell(SimpleNamespace(success=True, info=None))            # the finish's test raises
    after_cell(None)                                                # not an ExecutionResult


def test_a_notebook_jupyter_does_not_name_is_the_one_the_colab_cell_names(monkeypatch):
    shell = SimpleNamespace(user_ns={})
    monkeypatch.delenv(progress.NOTEBOOK_ENV, raising=False)
    assert progress.notebook_of(shell) == progress.UNKNOWN_NOTEBOOK
    monkeypatch.setenv(progress.NOTEBOOK_ENV, "notebooks/01_topic.ipynb")
    assert progress.notebook_of(shell) == "notebooks/01_topic.ipynb"
    shell.user_ns["__session__"] = "/home/learner/course/notebooks/01_topic.ipynb"   # Jupyter's name first
    assert progress.notebook_of(shell) == shell.user_ns["__session__"]


@pytest.mark.parametrize("named, entry", [
    ("/home/learner/course/notebooks/01_topic.ipynb", "01_topic"),   # JupyterLab: absolute
    ("course/notebooks/01_topic.ipynb", "01_topic"),                 # relative to the server root
    ("notebooks/01_topic.ipynb", "01_topic"),                        # the repository path (Colab)
    ("labs/01_lab.ipynb", "01_lab"),                                 # a lab's student copy
])
def test_the_summary_matches_each_way_a_notebook_is_named(named, entry):
    events = [{**event(kind, entry), "notebook": named} for kind in ("start", "finish")]
    summary = progress.summarize(events, ENTRIES, EXERCISES)
    assert next(n for n in summary["notebooks"] if n["id"] == entry)["status"] != "opened"
    assert summary["other_notebooks"] == {}


LESSON_00 = REPO / "notebooks" / "00_start_here.ipynb"


def last_code_cell(path: Path) -> str:
    return [c.source for c in notebooks.read(path).cells if c.cell_type == "code" and c.source.strip()][-1]


@pytest.mark.parametrize("cwd, named", [
    ("notebooks", "notebooks/00_start_here.ipynb"),             # Colab: the clone's notebook folder, LABS_NOTEBOOK
    ("notebooks", "course/notebooks/00_start_here.ipynb"),      # relative to a server started above the clone
    (None, "notebooks/00_start_here.ipynb"),                    # any folder: from the repository root
])
def test_the_last_cell_is_found_however_the_notebook_is_named(monkeypatch, tmp_path, cwd, named):
    monkeypatch.chdir(REPO / cwd if cwd else tmp_path)
    assert progress.notebook_file(named).resolve() == LESSON_00
    assert progress.is_last_code_cell(named, SimpleNamespace(raw_cell=last_code_cell(LESSON_00), cell_id=None))


def test_lesson_00_records_its_finish_before_its_summary(in_a_kernel, monkeypatch, capsys):
    """show_progress() runs in lesson 00's last code cell, before that cell's own finish is recorded."""
    assert "show_progress()" in last_code_cell(LESSON_00)
    monkeypatch.setattr(progress, "current_notebook", lambda: str(LESSON_00))
    progress.show_progress()
    assert re.search(r"00_start_here +ran fully", capsys.readouterr().out)
    assert [e["event"] for e in progress.read_events(in_a_kernel)] == ["finish"]


def test_show_progress_in_a_headless_run_prints_one_fixed_line(monkeypatch, capsys):
    monkeypatch.setenv(progress.HEADLESS_ENV, "1")
    progress.show_progress()
    assert capsys.readouterr().out == progress.HEADLESS_LINE + "\n"


def test_cli_json_text_and_reset(tmp_path):
    lab_events = [e for e in EVENTS if "01_lab" in e["notebook"]]
    renamed = [{**e, "notebook": e["notebook"].replace("01_lab", "00_warmup_lab")} for e in lab_events]
    (tmp_path / "progress.jsonl").write_text("".join(json.dumps(e) + "\n" for e in renamed))
    env = {**os.environ, progress.PROGRESS_DIR_ENV: str(tmp_path)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "helpers", "progress", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, check=True).stdout
    summary = json.loads(cli("--json"))
    assert summary["file"] == str(tmp_path / "progress.jsonl")
    lab = next(n for n in summary["notebooks"] if n["id"] == "00_warmup_lab")
    assert lab["exercises"] == [{"exercise": "Exercise 1: softmax", "passed": True},
                                {"exercise": "Exercise 2: rms_norm", "passed": False}]
    assert next(n for n in summary["notebooks"] if n["id"] == "00_start_here")["status"] == "not opened"
    assert "1 of 2 exercises passed" in cli()
    assert "cleared" in cli("--reset") and not (tmp_path / "progress.jsonl").exists()


def test_a_batch_run_records_nothing(tmp_path, monkeypatch):
    """The batch runner's kernels run with LABS_PROGRESS=off (and headless), whatever the caller's environment."""
    from helpers.runner import run_collection
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(progress.HEADLESS_ENV, raising=False)
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(tmp_path / "state"))
    cells = [nbformat.v4.new_code_cell("QUICK = False"),
             nbformat.v4.new_code_cell("import os\nfrom helpers.checks import passed\n"
                                       "assert os.environ['LABS_PROGRESS'] == 'off'\npassed('Exercise 1: batch')")]
    cells[0].metadata["tags"] = ["parameters"]
    notebook = tmp_path / "01_lab.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3",
                   "display_name": "Python 3", "language": "python"}}), notebook)
    summary = run_collection([str(notebook)], out_dir=tmp_path / "run", parameters={"QUICK": True}, workers=1,
                             progress=False)
    assert summary["passed"] == 1, summary["notebooks"][0]["detail"]
    assert not (tmp_path / "state").exists()


def test_the_manifest_names_each_lab_s_exercises_as_the_grader_does():
    """The summary's exercise titles come from the manifest (the progress log never imports the grader)."""
    from helpers.grading.specs import SPECS
    from helpers.manifest import entries, notebook_graded_labs
    labs = {entry["id"]: entry["exercises"] for entry in entries() if entry["kind"] == "lab"}
    graded = {lab: labs.pop(lab) for lab in notebook_graded_labs()}
    assert graded == {lab: [exercise.title for exercise in spec.exercises] for lab, spec in SPECS.items()
                      if spec.submission is None}
    assert list(labs) == ["10_capstone_lab"] and SPECS["10_capstone_lab"].submission   # graded on a project folder


def test_import_helpers_subscribes_the_log_without_torch():
    """Whichever module a notebook imports first, `import helpers` subscribes the log; it stays light (the
    Colab cell runs `python -m helpers.colab setup` before torch's companions are installed)."""
    program = ("import sys, helpers, helpers.events as e, helpers.progress as p\n"
               "assert p.record in e._listeners and 'torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", program], cwd=REPO, check=True)
