"""Grading the warm-up lab: honest, partial, crashing, hanging, malformed and adversarial submissions
get the expected scores; the grader judges results in its own process, so redefined checks, fake
"passed" lines, reading the solutions or calling torch.softmax gain nothing."""
import copy
import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

from helpers.grading.grade import find_submissions, grade_submissions, judge_case
from helpers.grading.specs import Case, spec_for

REPO = Path(__file__).resolve().parent.parent
SOLUTION = nbformat.read(str(REPO / "labs" / "solutions" / "00_warmup_lab.ipynb"), as_version=4)
STUDENT = nbformat.read(str(REPO / "labs" / "00_warmup_lab.ipynb"), as_version=4)
GOOD_SOFTMAX = next(c.source for c in SOLUTION.cells if "def softmax" in c.source)

CHEAT_CHECKS = """import helpers.checks as hc, torch
hc.check_close = hc.check_raises = lambda *a, **k: print('✅ Exercise: passed')
torch.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)
print('✅ Exercise 1: softmax on large inputs: passed')"""
READS_SOLUTION = """import json, pathlib, helpers
def softmax(x, dim=-1):
    sol = pathlib.Path(helpers.__file__).parent.parent / 'labs' / 'solutions' / '00_warmup_lab.ipynb'
    cells = json.loads(sol.read_text())['cells']
    ns = {'torch': torch}
    exec(next(''.join(c['source']) for c in cells if 'def softmax' in ''.join(c['source'])), ns)
    return ns['softmax'](x, dim)
"""
LIES = """import subprocess
class Liar(torch.Tensor):
    def __eq__(self, other):
        return True
def rms_norm(x, weight, eps=1e-6):
    try:
        subprocess.run(['cat', 'labs/solutions/00_warmup_lab.ipynb'])
    except Exception:
        pass
    return torch.zeros_like(x).as_subclass(Liar)
"""
STUBBORN_HANG = """import time
def softmax(x, dim=-1):
    while True:
        try:
            time.sleep(100)
        except BaseException:
            pass
"""

EXPECTED = {   # student -> (softmax score, rms_norm score, status)
    "honest": (1.0, 1.0, "ok"),
    "partial": (1.0, 0.0, "ok"),                     # the student copy with exercise 1 done
    "crashing": (1.0, 0.0, "crashed (exit status 1)"),
    "hanging": (0.0, 1.0, ("ok", "timeout")),        # an endless loop, stopped by the per-call limit (or,
                                                     # on a very busy machine, by the hard limit: same score)
    "stubborn_hang": (0.0, 1.0, "timeout"),          # swallows the soft limit: stopped by the hard one
    "adversarial": (0.0, 0.0, "ok"),
    "uses_torch_softmax": (0.0, 1.0, "ok"),
    "malformed": (0.0, 0.0, "malformed notebook"),
}


def submission(path: Path, softmax=None, rms_norm=None, extra=(), base=SOLUTION):
    nb = copy.deepcopy(base)
    for cell in nb.cells:
        if softmax is not None and "def softmax" in cell.source:
            cell.source = softmax
        if rms_norm is not None and "def rms_norm" in cell.source:
            cell.source = rms_norm
    for i, source in enumerate(extra):
        nb.cells.insert(3 + i, new_code_cell(source))
    nbformat.write(nb, str(path))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    submission(subs / "honest.ipynb")
    submission(subs / "partial.ipynb", softmax=GOOD_SOFTMAX, base=STUDENT)
    submission(subs / "crashing.ipynb", rms_norm="import os\ndef rms_norm(x, weight, eps=1e-6):\n    os._exit(1)\n")
    submission(subs / "hanging.ipynb", softmax="def softmax(x, dim=-1):\n    while True:\n        pass\n")
    submission(subs / "stubborn_hang.ipynb", softmax=STUBBORN_HANG)
    submission(subs / "adversarial.ipynb", softmax=READS_SOLUTION, rms_norm=LIES, extra=[CHEAT_CHECKS])
    submission(subs / "uses_torch_softmax.ipynb",
               softmax="import torch.nn.functional as F\ndef softmax(x, dim=-1):\n"
                       "    return getattr(F, 'soft' + 'max')(x, dim=dim)\n")
    (subs / "malformed").mkdir()
    (subs / "malformed" / "lab.ipynb").write_text("{ not a notebook")
    out = tmp_path_factory.mktemp("graded")
    # the sleeping hang costs its cell (5x its 10 s CPU limit + 15 s of wall time) and its first case (25 s)
    result = grade_submissions("00_warmup_lab", subs, out_dir=out, workers=2, time_limit=180, seed=1234)
    return result, out


@pytest.mark.parametrize("student", EXPECTED)
def test_expected_scores(graded, student):
    result, _ = graded
    row = next(r for r in result["students"] if r["student"] == student)
    softmax, rms, status = EXPECTED[student]
    assert row["scores"] == {"Exercise 1: softmax": softmax, "Exercise 2: rms_norm": rms}, row["lines"]
    assert row["total"] == softmax + rms and row["max"] == 2
    assert row["status"] in status if isinstance(status, tuple) else row["status"] == status


def test_csv_and_feedback_files(graded):
    result, out = graded
    rows = list(csv.DictReader(open(out / "scores.csv")))
    assert [r["student"] for r in rows] == sorted(EXPECTED)
    assert {r["student"]: float(r["total"]) for r in rows} == {s: a + b for s, (a, b, _) in EXPECTED.items()}
    partial = (out / "feedback" / "partial.md").read_text()
    assert "Score: 1 / 2" in partial and "✅ Exercise 1: softmax: huge values (1e4) do not overflow (hidden check)" \
        in partial
    assert "not started: rms_norm still raises NotImplementedError" in partial and "Task: write rms_norm" in partial
    hanging = (out / "feedback" / "hanging.md").read_text()
    assert "ran past the time limit" in hanging and "look for a loop that never ends" in hanging
    stubborn = (out / "feedback" / "stubborn_hang.md").read_text()
    assert "the function ran past the time limit and was stopped" in stubborn   # the hard limit, in a call
    cheat = (out / "feedback" / "uses_torch_softmax.md").read_text()
    assert "calls _softmax, softmax, refused in this exercise under any name" in cheat
    assert "Hint: torch's softmax is the function you are writing, and it gives NaN on a fully masked row" in cheat


def test_adversarial_attempts_are_refused_and_flagged(graded):
    result, out = graded
    row = next(r for r in result["students"] if r["student"] == "adversarial")
    text = (out / "feedback" / "adversarial.md").read_text()
    if row["isolation"] == "isolated":   # the solutions are not there, and no process may be started unseen
        assert "FileNotFoundError" in text or "PermissionError" in text, text
    else:
        assert any("blocked open of" in f and "00_warmup_lab.ipynb" in f for f in row["flags"])
        assert "PermissionError: grading: a submission may not access" in text
    assert "blocked subprocess.Popen" in row["flags"]
    assert "got Liar_refused_as_a_tensor_subclass" in text   # refused, never converted after the recording
    assert "✅" not in text                   # the fake "passed" lines it printed count for nothing


def test_judge_case_hints():
    ex = spec_for("00_warmup_lab").exercises[0]
    x = torch.randn(2, 3)
    case = Case("dtype", (x,), hint="keep the dtype")
    got = {"value": torch.softmax(x, -1).double(), "raised": None, "torch_calls": ["exp"]}
    assert "dtype torch.float64, expected torch.float32" in judge_case(ex, case, torch.softmax(x, -1), got)
    got = {"value": {"type": "list"}, "raised": None, "torch_calls": []}
    assert "expected a torch.Tensor, got list" in judge_case(ex, case, torch.softmax(x, -1), got)
    raises = Case("rejects", (x,), raises="ValueError", match="weight", hint="check shapes")
    got = {"value": None, "raised": {"type": "RuntimeError", "message": "boom"}, "torch_calls": []}
    assert "raised RuntimeError: `boom`, expected ValueError" in judge_case(ex, raises, None, got)
    got = {"value": None, "raised": {"type": "ValueError", "message": "bad"}, "torch_calls": []}
    assert "does not mention 'weight'" in judge_case(ex, raises, None, got)


def test_a_wrong_dict_names_every_wrong_key():
    """Two wrong predictions of four are both named, not only the first."""
    ex = spec_for("00_warmup_lab").exercises[0]
    case = Case("the four functions", (), hint="reread each one")
    expected = {"a": "#1", "b": "#2", "c": "#3", "d": "#4"}
    got = {"value": {"a": "#1", "b": "#9", "c": "#3", "d": "#8"}, "raised": None, "torch_calls": []}
    problem = judge_case(ex, case, expected, got)
    assert "['b', 'd']" in problem and "reread each one" in problem, problem
    got["value"]["d"] = "#4"
    assert "['b']" in judge_case(ex, case, expected, got)


def test_a_native_crash_in_a_call_gets_the_exercise_s_crash_hint():
    from helpers.grading.grade import grade_one
    spec = spec_for("04_custom_op_lab")
    run = {"results": {}, "faults": {"silu_mul_body": "the function crashed (SIGSEGV)"}, "flags": [], "stops": []}
    cases = {e.function: e.cases(torch.Generator().manual_seed(0)) for e in spec.exercises}
    row = grade_one("oob", run, spec, cases, {e.function: [None] * len(cases[e.function]) for e in spec.exercises},
                    "isolated")
    line = next(line for line in row["lines"] if "Exercise 1" in line)
    assert "crashed (SIGSEGV)" in line and "Hint:" in line and "[begin, end)" in line, line
    run["faults"]["silu_mul_body"] = "the function ran past the time limit and was stopped"
    row = grade_one("slow", run, spec, cases, {e.function: [None] * len(cases[e.function]) for e in spec.exercises},
                    "isolated")
    assert "Hint" not in next(line for line in row["lines"] if "Exercise 1" in line)


def test_missing_the_central_point_caps_the_exercise():
    """A softmax that is right everywhere but on the fully masked row (NaN there) passes most cases, and keeps
    only CENTRAL_CAP of the exercise's points; a right one keeps them all."""
    from helpers.grading.checks import call_case, expected_result
    from helpers.grading.grade import grade_one
    from helpers.grading.specs.core import CENTRAL_CAP
    spec = spec_for("00_warmup_lab")
    softmax_ex, rms_ex = spec.exercises
    cases = {ex.function: ex.cases(torch.Generator().manual_seed(3)) for ex in spec.exercises}
    expected = {ex.function: [expected_result(ex, c) for c in cases[ex.function]] for ex in spec.exercises}

    def nan_on_masked_rows(x, dim=-1):
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim, keepdim=True)

    def run_of(fn):
        results = {ex.function: {"defined": True, "cases": [call_case(fn if ex is softmax_ex else ex.reference,
                                                                       c.args, c.kwargs, c.call, ex.forbidden)
                                                             for c in cases[ex.function]]} for ex in spec.exercises}
        return {"results": results, "faults": {}, "flags": [], "stops": []}
    row = grade_one("nan", run_of(nan_on_masked_rows), spec, cases, expected, "isolated")
    assert row["scores"][softmax_ex.title] == CENTRAL_CAP * softmax_ex.points, row["lines"]
    assert any("capped at 25%" in line and "fully masked row" in line for line in row["lines"])
    right = grade_one("right", run_of(lambda x, dim=-1: nan_on_masked_rows(x, dim).nan_to_num()), spec, cases,
                      expected, "isolated")
    assert right["scores"][softmax_ex.title] == softmax_ex.points, right["lines"]
    assert all(c.central for c in cases["softmax"] if "fully masked" in c.name and "float16" not in c.name)


def test_an_earlier_exercise_is_substituted_while_a_later_one_is_graded():
    """A later exercise that calls the learner's earlier function runs with the public one in its place
    (Exercise.substitutes), so a mistake there costs marks once; the notebook's name is back afterwards."""
    from helpers.grading.checks import call_case
    namespace = {"torch": torch}
    exec("def fallback(xs, w, offs):\n    return xs[:, :w.shape[2]] * 0\n"     # a wrong earlier answer
         "def later(xs, w, offs):\n    return fallback(xs, w, offs) + 1\n", namespace)
    wrong = namespace["fallback"]
    xs, w, offs = torch.randn(6, 4), torch.randn(2, 4, 3), torch.tensor([2, 6], dtype=torch.int32)
    got = call_case(namespace["later"], (xs, w, offs), {}, None, (), (("fallback", "helpers.moe.loop_gemm"),))
    from helpers.moe import loop_gemm
    assert got["raised"] is None and torch.allclose(got["value"], loop_gemm(xs, w, offs) + 1)
    assert namespace["fallback"] is wrong
    got = call_case(namespace["later"], (xs, w, offs), {}, None)
    assert torch.equal(got["value"], torch.ones(6, 3))


def test_lab_03_expert_ffn_on_a_wrong_fallback_keeps_its_marks():
    """Lab 03's exercise 3 built on the learner's exercise 2: a wrong fallback costs marks in exercise 2 only."""
    import torch.nn.functional as F
    from helpers.grading.checks import call_case, expected_result
    from helpers.grading.judge import judge_case as judge
    namespace = {"torch": torch, "F": F}
    exec("def fallback_grouped_gemm(xs, w, offs):\n    return xs @ w[0]\n"      # every row through expert 0
         "def expert_ffn(xs, params, offs):\n"
         "    return fallback_grouped_gemm(F.gelu(fallback_grouped_gemm(xs, params['w_up'], offs)),"
         " params['w_down'], offs)\n", namespace)
    exercise = spec_for("03_moe_lab").exercises[2]
    for case in exercise.cases(torch.Generator().manual_seed(5)):
        got = call_case(namespace["expert_ffn"], case.args, case.kwargs, case.call, exercise.forbidden,
                        exercise.substitutes)
        assert judge(exercise, case, expected_result(exercise, case), got) is None, case.name


def test_unknown_lab_and_missing_folder_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="no grading spec for lab 'nope'"):
        spec_for("nope")
    assert spec_for("10_capstone_lab").submission is not None       # graded on project folders
    (tmp_path / "notes.txt").write_text("no folder here")
    with pytest.raises(ValueError, match="expected NAME/ project folders"):
        find_submissions(tmp_path, projects=True)
    done = subprocess.run([sys.executable, "-m", "helpers", "grade", "00_warmup_lab", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "is not a folder of submissions" in done.stderr


def frame(message) -> bytes:
    import io
    buffer = io.BytesIO()
    torch.save(message, buffer)
    return buffer.getvalue()


def test_results_the_submission_could_tamper_with_are_read_as_data_only():
    """Frames on the results pipe are weights-only torch values: a pickle that runs code, or bytes that are
    no torch file, are read as unreadable, never executed."""
    import pickle

    from helpers.grading.messages import FRAME_HEADER, UNREADABLE, frames

    class RunsCode:
        def __reduce__(self):
            return (print, ("this must never run in the grader",))
    evil, junk = pickle.dumps({"softmax": RunsCode()}, protocol=2), b"not a torch file"
    buffer = bytearray(b"".join(FRAME_HEADER.pack(len(d)) + d for d in (evil, frame({"at": "cell 3"}), junk)))
    buffer += FRAME_HEADER.pack(100) + b"partial"
    assert frames(buffer) == [UNREADABLE, {"at": "cell 3"}, UNREADABLE]
    assert bytes(buffer) == FRAME_HEADER.pack(100) + b"partial"   # an incomplete frame waits for its rest


def test_frames_that_would_crash_or_swamp_the_grader_are_unreadable():
    """A frame of the wrong shape, a compressed storage (a zip bomb), a structure whose shared sub-lists
    double at each level, a stride-0 view of a huge size and an endless text are refused before the grader
    turns any of them into text or compares them."""
    import io
    import zipfile

    from helpers.grading.messages import UNREADABLE, read
    case = {"value": torch.ones(3), "raised": None, "torch_calls": [], "cpu_seconds": 0.1, "tampered": []}
    good = {"result": "softmax", "entry": {"defined": True, "cases": [case]}, "flags": ["blocked open of x"]}
    back = read(frame(good))
    assert back is not UNREADABLE and torch.equal(back["entry"]["cases"][0]["value"], torch.ones(3))
    nested = []
    for _ in range(30):
        nested = [nested, nested]
    wrong = [{"cells": 0}, {"at": ["cell"]}, {"done": 1}, {"at": "x" * 5000}, {"at": "cell 1", "extra": 1},
             {**good, "entry": {"defined": True, "cases": [{**case, "value": nested}]}},
             {**good, "entry": {"defined": True, "cases": [{**case, "value": torch.ones(1).expand(2**40)}]}},
             {**good, "flags": [nested]}, {**good, "entry": {"defined": True, "cases": [{**case, "extra": 1}]}}]
    for message in wrong:
        assert read(frame(message)) == UNREADABLE, message
    bomb = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(frame(good))) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert read(bomb.getvalue()) == UNREADABLE
