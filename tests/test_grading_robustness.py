"""One submission can neither stop, hang nor exhaust the grader: what it sends is bounded before it is read, a
message the grader cannot decode stops that sandbox at once, names and sizes are checked before use, and what a
killed grader left behind is removed by the next one."""
import base64
import io
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest
import torch

from helpers.grading import grade, messages
from helpers.grading.grade import find_submissions, run_attempt, student_name
from helpers.grading.messages import FRAME_HEADER, UNREADABLE


def frame(message) -> bytes:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    return FRAME_HEADER.pack(buffer.tell()) + buffer.getvalue()


def test_an_unknown_zip_version_is_unreadable_not_an_error():
    data = bytearray(frame({"at": "cell 1"})[FRAME_HEADER.size:])
    central = data.find(b"PK\x01\x02")
    data[central + 6:central + 8] = struct.pack("<H", 99)   # "version needed to extract": 9.9
    assert messages.read(bytes(data)) is UNREADABLE
    assert messages.read(frame({"at": "cell 1"})[FRAME_HEADER.size:]) == {"at": "cell 1"}


def test_a_large_pickle_is_refused_before_it_is_unpickled(monkeypatch):
    data = frame({"cells": [[] for _ in range(2_000_000)], "cell_cpu_seconds": [], "flags": []})[FRAME_HEADER.size:]
    monkeypatch.setattr(messages.torch, "load", lambda *a, **k: pytest.fail("unpickled a frame over the bound"))
    assert messages.read(data) is UNREADABLE


def test_a_frame_announced_too_large_is_unreadable_at_once():
    buffer = bytearray(FRAME_HEADER.pack(messages.MAX_FRAME_BYTES + 1) + b"x" * 100)
    assert messages.frames(buffer) == [UNREADABLE] and not buffer


FLOODER = r'''
import os, sys, time
fd = int(sys.argv[1])
os.write(fd, (12).to_bytes(8, "big") + b"not a zip!!!")
time.sleep(3600)
'''


def test_an_unreadable_message_stops_the_sandbox_and_the_grader_goes_on(monkeypatch):
    """The sandbox sends garbage and then waits forever: the attempt ends at once, marked unreadable."""
    def fake_sandbox(job, isolated, cgroup, work, scratch):
        read_fd, write_fd = os.pipe()
        proc = __import__("subprocess").Popen([sys.executable, "-c", FLOODER, str(write_fd)], pass_fds=(write_fd,),
                                              stdin=__import__("subprocess").PIPE, start_new_session=True)
        os.close(write_fd)
        return proc, read_fd
    monkeypatch.setattr(grade, "_sandbox_process", fake_sandbox)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.update(run_attempt(
        {"threads": 1}, b"", isolated=False, memory_limit_mb=2048, cpu_left=600, wall_left=600, scratch={},
        step_cpu=lambda marker: 600.0)), daemon=True)
    worker.start()
    worker.join(120)
    assert outcome, "the grader waited on a sandbox that sent it garbage"
    assert outcome["stopped"] == "unreadable" and outcome["messages"] == [UNREADABLE]


SLOW_START = r'''
import io, os, sys, time, torch
fd = int(sys.argv[1])
end = time.process_time() + float(sys.argv[2])      # a start-up that computes before its first message
while time.process_time() < end:
    pass
buffer = io.BytesIO()
torch.save({"at": "cell 0"}, buffer)
os.write(fd, len(buffer.getvalue()).to_bytes(8, "big") + buffer.getvalue())
'''


@pytest.mark.parametrize("start_limit, stopped", [(60.0, None), (0.1, "timeout")])
def test_the_start_up_is_a_step_with_its_own_measured_limit(monkeypatch, start_limit, stopped):
    """Before its first message the sandbox is in its start-up step, limited by the solution's own start-up
    (measured like every other step), not by a cell's limit."""
    def fake_sandbox(job, isolated, cgroup, work, scratch):
        read_fd, write_fd = os.pipe()
        proc = __import__("subprocess").Popen([sys.executable, "-c", SLOW_START, str(write_fd), "3"],
                                              pass_fds=(write_fd,), stdin=__import__("subprocess").PIPE,
                                              start_new_session=True)
        os.close(write_fd)
        return proc, read_fd
    monkeypatch.setattr(grade, "_sandbox_process", fake_sandbox)
    monkeypatch.setattr(grade, "STEP_SLACK_S", 0.5)
    asked = []

    def step_cpu(marker):
        asked.append(marker)
        return start_limit if marker == grade.START else 60.0
    outcome = run_attempt({"threads": 1}, b"", isolated=False, memory_limit_mb=4096, cpu_left=600, wall_left=600,
                          scratch={}, step_cpu=step_cpu)
    assert asked[0] == grade.START and outcome["stopped"] == stopped, (asked, outcome["stopped"])
    if stopped is None:
        assert outcome["start_cpu_seconds"] >= 2.5     # the start-up's CPU, up to its first message
    limits = grade.limits_from({"call_cpu_seconds": {}, "cell_cpu_seconds": {}, "cpu_seconds": 9.0, "wall_seconds": 9.0,
                                "start_cpu_seconds": 3.0}, cpu_factor=10, time_limit=None)
    assert limits["start_cpu_seconds"] == 30.0


def test_names_are_safe_distinct_and_bounded(tmp_path):
    escape = "\x1b[2K\x1b[1Aeve"
    (tmp_path / f"{escape}.ipynb").write_text("{}")
    (tmp_path / "alice.ipynb").write_text("{}")
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "lab.ipynb").write_text("{}")
    (tmp_path / ("x" * 240 + ".ipynb")).write_text("{}")
    found = find_submissions(tmp_path)
    assert set(found) == {"alice", "alice~2", "__2K__1Aeve", "x" * grade.MAX_NAME}
    assert {found["alice"].name, found["alice~2"].name} == {"alice.ipynb", "lab.ipynb"}
    assert student_name("..hidden") == "hidden" and student_name("") == "unnamed"


def test_a_graded_symlink_is_refused(tmp_path):
    (tmp_path / "bob.ipynb").write_text("{}")
    target = tmp_path.parent / f"elsewhere-{tmp_path.name}"
    target.mkdir()
    (tmp_path / "graded").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        grade.grade_submissions("00_warmup_lab", tmp_path)
    assert not any(target.iterdir())


def test_a_notebook_over_the_size_limit_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(grade, "MAX_NOTEBOOK_MB", 0.001)
    big = tmp_path / "big.ipynb"
    big.write_text("x" * 5000)
    spec = grade.spec_for("00_warmup_lab")
    run = grade.run_submission(big, spec, {}, {"cell_cpu_seconds": []}, threads=1, memory_limit_mb=512,
                               isolated=False, protected=[])
    assert run["stops"] == ["malformed notebook"]
    assert all("clear its outputs" in why for why in run["faults"].values())


def test_what_a_killed_grader_left_is_removed():
    dead = next(pid for pid in range(4_000_000, 4_100_000) if not psutil.pid_exists(pid))
    left = Path(tempfile.gettempdir()) / f"{grade.TEMP_PREFIX}{dead}-abc"
    alive = Path(tempfile.mkdtemp(prefix=f"{grade.TEMP_PREFIX}{os.getpid()}-"))
    left.mkdir()
    try:
        grade._remove_what_dead_graders_left()
        assert not left.exists() and alive.exists()
    finally:
        alive.rmdir()


def test_a_wall_time_stop_is_graded_again_alone(tmp_path, monkeypatch):
    """A submission stopped by a wall-time limit in the class (the machine's load) is graded once more and keeps
    that grade; one stopped for CPU time is not."""
    import nbformat
    solution = nbformat.read(str(grade.SOLUTIONS / "00_warmup_lab.ipynb"), as_version=4)
    for name in ("first", "second"):
        nbformat.write(solution, str(tmp_path / f"{name}.ipynb"))
    real, calls = grade.run_submission, []

    def busy_class(notebook, *args, **kwargs):
        calls.append(notebook.stem)
        run = real(notebook, *args, **kwargs)
        if notebook.stem == "first" and calls.count("first") == 1:   # as if the class's load stopped it
            run.update(results={}, faults={e.function: "the function ran past the time limit" for e in
                                           grade.spec_for("00_warmup_lab").exercises}, stops=["timeout"],
                       wall_timeout=True)
        return run
    monkeypatch.setattr(grade, "run_submission", busy_class)
    result = grade.grade_submissions("00_warmup_lab", tmp_path, out_dir=tmp_path / "graded", workers=1, seed=5)
    rows = {r["student"]: r for r in result["students"]}
    assert calls.count("first") == 2 and calls.count("second") == 1
    assert rows["first"]["total"] == rows["second"]["total"] == 2.0 and rows["first"]["status"] == "ok"
    assert "Graded again, alone" in (tmp_path / "graded" / "feedback" / "first.md").read_text()


def test_an_untouched_stub_is_not_started_with_its_task_and_no_hint():
    import re

    from helpers.checks import CheckFailed
    from helpers.grading.checks import check, is_untouched_stub
    from helpers.notebooks import _stub
    stub = _stub(re.match(r"( *)", "    "), "Exercise 2")
    namespace = {}
    exec(f"def rms_norm(x, weight, eps=1e-6):\n{stub}", namespace)
    exec("def rms_norm_started(x, weight, eps=1e-6):\n    return x\n", namespace)
    assert is_untouched_stub(namespace["rms_norm"]) and not is_untouched_stub(namespace["rms_norm_started"])
    with pytest.raises(CheckFailed) as failed:
        check("00_warmup_lab", namespace["rms_norm"])
    assert "not started" in str(failed.value) and "Task: write rms_norm" in str(failed.value)
    assert "Hint" not in str(failed.value)


def test_an_exercise_the_grading_machine_cannot_run_is_not_gradable_not_zero(monkeypatch):
    from helpers.grading.report import feedback, scores_csv
    spec = grade.spec_for("05_quantization_lab")
    plan = next(e for e in spec.exercises if e.function == "choose_plan")
    first = spec.exercises[0]
    monkeypatch.setattr(grade, "missing", lambda *needs: [n for n in needs if n == "sklearn"])
    assert grade.not_gradable_here(plan, None) == "sklearn" and grade.not_gradable_here(first, None) is None
    imported = {"cases": [{"raised": {"type": "ModuleNotFoundError", "message": "No module named 'surely_absent_xyz'"}}]}
    present = {"cases": [{"raised": {"type": "ModuleNotFoundError", "message": "No module named 'torch'"}}]}
    assert "surely_absent_xyz" in grade.not_gradable_here(first, imported)
    assert grade.not_gradable_here(first, present) is None    # a module this machine has: the answer's own error
    run = {"results": {}, "faults": {}, "stops": [], "flags": [], "cell_errors": []}
    row = grade.grade_one("ana", run, spec, {e.function: [None] for e in spec.exercises}, {}, "isolated")
    needing = [e for e in spec.exercises if "sklearn" in e.needs]
    assert plan in needing and all(row["scores"][e.title] is None for e in needing)
    assert row["max"] == sum(e.points for e in spec.exercises) - sum(e.points for e in needing)
    assert "not gradable here: Exercise 4 needs sklearn" in row["status"]
    row["seconds"] = 1.0
    assert "not gradable here" in scores_csv([row], spec.exercises)
    assert f"- {plan.title}: not gradable here" in feedback(row, spec.lab, spec.exercises, run)


def test_in_process_tricks_are_refused_or_seen():
    """A returned tensor subclass is refused, not converted (its own code would run after the recording); a
    patched private function that torch.save calls is seen as tampering; code decoded and run at run time is
    read as the notebook is."""
    from helpers.grading import sandbox
    from helpers.grading.scan import RUNTIME_INTERNALS

    class Lazy(torch.Tensor):
        pass
    assert sandbox._plain(torch.zeros(2).as_subclass(Lazy))["type"] == "Lazy_refused_as_a_tensor_subclass"
    assert type(sandbox._plain(torch.nn.Parameter(torch.ones(2)))) is torch.Tensor
    originals = sandbox._originals()
    saved = torch.serialization._save
    try:
        torch.serialization._save = lambda *a, **k: None
        assert "torch.serialization._save" in sandbox.tampered(originals)
    finally:
        torch.serialization._save = saved
    assert sandbox.tampered(originals) == []
    from helpers import capstone
    from helpers.validation import workloads
    clock, rounds, getrusage = workloads.cpu_seconds, capstone.measure_train_speed.__defaults__, resource.getrusage
    try:   # the capstone's clock, a measure's default rounds, what the clock reads: each seen
        workloads.cpu_seconds = lambda: 0.0
        capstone.measure_train_speed.__defaults__ = (1, 1, 0, None)
        resource.getrusage = lambda who: getrusage(who)
        assert {"helpers.validation.workloads.cpu_seconds", "helpers.capstone.measure_train_speed.__defaults__",
                "resource.getrusage"} <= set(sandbox.tampered(originals))
    finally:
        workloads.cpu_seconds, capstone.measure_train_speed.__defaults__, resource.getrusage = clock, rounds, getrusage
    judge = capstone.judge_train_speed
    goal_cell = judge.__closure__[0]
    saved_goal = goal_cell.cell_contents
    try:   # a closure's cell refilled in place
        goal_cell.cell_contents = "serve_latency"
        assert "helpers.capstone.judge_train_speed.__closure__" in sandbox.tampered(originals)
    finally:
        goal_cell.cell_contents = saved_goal
    assert sandbox.tampered(originals) == []
    code = "import base64\nexec(base64.b64decode(%r).decode())" % base64.b64encode(
        b"import sys\nf = sys._getframe().f_back").decode()
    done = subprocess.run([sys.executable, "-c", (
        "import sys, json\nfrom helpers.grading import sandbox\nflags = []\nsandbox.install_guard([], flags)\n"
        f"exec({code!r})\nprint(json.dumps(flags))")], capture_output=True, text=True, timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert any(f.startswith(RUNTIME_INTERNALS) and "f_back" in f for f in found), (found, done.stderr[-800:])


@pytest.mark.parametrize("walk, reached", [
    ("f = getattr(sys, '_get' + 'frame')()", "_getframe"),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    f = getattr(e.__traceback__, 'tb_' + 'frame')", "tb_frame"),
    ("g = (i for i in [1])\nf = getattr(g, 'gi_' + 'frame')", "gi_frame"),
])
def test_a_frame_walk_spelled_so_the_scan_cannot_read_it_is_seen_when_it_runs(walk, reached):
    """The notebook's own code reaching a frame, however the name is spelled, is flagged as run-time
    internals (its exercises with forbidden calls go to review); a library doing the same is not."""
    from helpers.grading.scan import RUNTIME_INTERNALS
    done = subprocess.run([sys.executable, "-c", (
        "import sys, json, traceback, typing\nfrom helpers.grading import sandbox\nflags = []\n"
        "sandbox.install_guard([], flags)\ntraceback.extract_stack(); typing.NamedTuple('P', [('x', int)])\n"
        "library_flags = list(flags)\n" + walk + "\nprint(json.dumps([library_flags, flags]))")],
        capture_output=True, text=True, timeout=120)
    library_flags, found = json.loads(done.stdout.strip().splitlines()[-1])
    assert library_flags == [], library_flags
    assert [f for f in found if f.startswith(RUNTIME_INTERNALS)] == [f"{RUNTIME_INTERNALS} {reached} (frames)"], \
        (found, done.stderr[-800:])


def test_a_helper_that_is_the_answer_is_absent_while_its_exercise_is_graded():
    """Every reference a submission holds to a forbidden course helper (an import taken before, a subclass of
    a forbidden class) raises while the exercise is graded and is noted as reached; the grader's harness still
    runs the helper; everything is as before afterwards. torch's own functions are left to the recorder."""
    import inspect

    import helpers.moe
    import helpers.quant
    from helpers.grading import checks, sandbox
    from helpers.grading.recorder import record_calls
    from helpers.moe import permute as imported

    class MyLinear(helpers.quant.Int8WeightOnlyLinear):
        pass
    x, ids = torch.randn(6, 4), torch.tensor([[1, 0], [2, 1], [0, 0], [1, 2], [2, 2], [0, 1]])
    expected = helpers.moe.permute(x, ids, 3)
    q, scales = torch.randint(-127, 128, (3, 4), dtype=torch.int8), torch.rand(3) + 0.1
    reached: list[str] = []
    forbidden = ("helpers.moe.permute", "helpers.quant.Int8WeightOnlyLinear", "torch.compile", "bmm")
    source = inspect.getsource(helpers.moe.permute)
    with sandbox.absent_helpers(forbidden, "permute", reached):
        with pytest.raises(sandbox.AbsentHelper, match="helpers.moe.permute is not available while permute is graded"):
            imported(x, ids, 3)
        with pytest.raises(sandbox.AbsentHelper, match="Int8WeightOnlyLinear"):
            MyLinear(q, scales)
        assert torch.equal(checks.first(helpers.moe.permute, x, ids, 3), expected[0])   # the harness's call
        assert torch.compile is not None and torch.bmm(torch.ones(1, 2, 2), torch.ones(1, 2, 2)).sum() == 8
        pasted: dict = {}   # a copy of the helper's source is still recognised by the recorder meanwhile
        exec("import torch\nfrom helpers.moe import *\n" + source, pasted)
        assert record_calls(lambda: pasted["permute"](x, ids, 3), forbidden)[1] == ["helpers.moe.permute"]
    assert reached == ["helpers.moe.permute", "helpers.quant.Int8WeightOnlyLinear"]
    assert all(torch.equal(a, b) for a, b in zip(imported(x, ids, 3), expected))
    assert MyLinear(q, scales, path="dequant")(torch.ones(2, 4)).shape == (2, 3)
    assert sandbox.ABSENT not in vars(helpers.moe) and sandbox.ABSENT not in vars(helpers.quant)
