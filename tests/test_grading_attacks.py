"""Grading a class where some submissions attack the grader, each kind the red team found, beside two honest
classmates: every attack gets 0, the honest ones keep full marks, and the files the attacks aimed at are
untouched. The attacks that would damage the machine run only where the grader isolates submissions."""
import copy
import hashlib
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

import helpers
from helpers.grading import isolation
from helpers.grading.grade import grade_submissions, student_name

REPO = Path(__file__).resolve().parent.parent
SOLUTION = nbformat.read(str(REPO / "labs" / "solutions" / "00_warmup_lab.ipynb"), as_version=4)
ISOLATED = isolation.isolation_problem() is None
JUDGE = Path(helpers.__file__).parent / "grading" / "judge.py"
SPECS = Path(helpers.__file__).parent / "grading" / "specs" / "lab00.py"
WRONG = "def softmax(x, dim=-1):\n    raise RuntimeError('wrong on purpose')\n"
NOT_IMPLEMENTED = "def rms_norm(x, weight, eps=1e-6):\n    raise NotImplementedError\n"

# Each attack is the submission's softmax (its rms_norm is left undone), optionally after a cell of its own.
# An attack that works returns the right softmax; one that is stopped returns zeros or raises.
SHADOW_SANDBOX = '''import os, pathlib
fake = """import io, os, sys, torch
def main(fd):
    job = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)
    def send(m):
        b = io.BytesIO(); torch.save(m, b); d = b.getvalue()
        os.write(fd, len(d).to_bytes(8, 'big') + d)
    for name in job['exercises']:
        cases = []
        for c in job['inputs'][name]:
            x = c['args'][0]
            v = torch.softmax(x, c['kwargs'].get('dim', c['args'][1] if len(c['args']) > 1 else -1))
            cases.append({'value': v, 'raised': None, 'torch_calls': [], 'cpu_seconds': 0.0, 'tampered': []})
        send({'result': name, 'entry': {'defined': True, 'cases': cases}, 'flags': []})
    send({'done': True})
main(int(sys.argv[1]))
os._exit(0)
"""
for folder in ("helpers/grading", "helpers"):
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
pathlib.Path("helpers/__init__.py").write_text("")
pathlib.Path("helpers/grading/__init__.py").write_text("")
pathlib.Path("helpers/grading/sandbox.py").write_text(fake)
os._exit(0)   # the grader starts the sandbox again, in this folder
'''
SOLUTION_SOFTMAX = next(c.source for c in SOLUTION.cells if "def softmax" in c.source)
FROM_FILE = '''import json
def softmax(x, dim=-1):
    cells = json.loads({read})["cells"]
    ns = {{"torch": torch}}
    exec(next("".join(c["source"]) for c in cells if "def softmax" in "".join(c["source"])), ns)
    return ns["softmax"](x, dim)
'''
DIR_FD = FROM_FILE.format(read=f'''(lambda fd: open(__import__("os").open("solutions/00_warmup_lab.ipynb", __import__("os").O_RDONLY,
                                                   dir_fd=fd)).read())(__import__("os").open({str(REPO / "labs")!r}, __import__("os").O_RDONLY))''')
RUNS_COPY = FROM_FILE.format(read='''open(next(__import__("pathlib").Path(RUNS).rglob("00_warmup_lab.ipynb"))).read()''')
UNAUDITED_PROCESS = f'''import os, _posixsubprocess, sys
def spawn(argv, stdout=-1):
    """A process through the call under subprocess, which raises no audit event (Python 3.11's signature)."""
    errpipe_read, errpipe_write = os.pipe()
    pid = _posixsubprocess.fork_exec(argv, [os.fsencode(argv[0])], True, (), None, None, -1, -1, -1, stdout,
                                     -1, -1, errpipe_read, errpipe_write, False, True, -1, None, None, None,
                                     -1, None, True)
    os.close(errpipe_write)
    return pid
def softmax(x, dim=-1):
    r, w = os.pipe()
    spawn(["/bin/cat", {str(SPECS)!r}], stdout=w)
    os.close(w)
    text = b"".join(iter(lambda: os.read(r, 1 << 16), b"")).decode()
    source = text[text.index("def _softmax_reference"):text.index("SOFTMAX =")]
    ns = {{"torch": torch}}
    exec(source, ns)
    return ns["_softmax_reference"](x, dim)
'''
THREAD = '''from concurrent.futures import ThreadPoolExecutor
POOL = ThreadPoolExecutor(2)
POOL.submit(int).result()
def softmax(x, dim=-1):
    return POOL.submit(torch.softmax, x, dim).result()
'''
RECORDER_OFF = '''def softmax(x, dim=-1):
    modes = []
    while torch._C._len_torch_function_stack():
        modes.append(torch._C._pop_torch_function_stack())
    return torch.softmax(x, dim)
'''
PATCHED_RECORDER = '''import helpers.grading.recorder as hc
hc._TorchNames.__torch_function__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))
hc._AtenNames.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))
def softmax(x, dim=-1):
    return torch.softmax(x, dim)
'''
PATCHED_SAVE = '''import torch
_save = torch.save
def save(obj, f, *a, **k):
    if isinstance(obj, dict) and "entry" in obj:
        for case in obj["entry"]["cases"]:
            case["torch_calls"], case["tampered"] = [], []
    return _save(obj, f, *a, **k)
torch.save = save
def softmax(x, dim=-1):
    return torch.softmax(x, dim)
'''
FORGED_VERDICT = '''import helpers.grading.checks as hc
def call_case(fn, args, kwargs, call, forbidden=()):
    return {"value": torch.softmax(args[0], kwargs.get("dim", args[1] if len(args) > 1 else -1)), "raised": None,
            "torch_calls": []}
hc.call_case.__code__ = call_case.__code__
def softmax(x, dim=-1):
    return x
'''
REFS = "import torch._refs\ndef softmax(x, dim=-1):\n    return torch._refs.softmax(x, dim)\n"
SCIPY = ("import scipy.special\ndef softmax(x, dim=-1):\n"
         "    return torch.from_numpy(scipy.special.softmax(x.double().numpy(), axis=dim)).to(x.dtype)\n")
KILL_EVERYONE = '''import os, signal
def softmax(x, dim=-1):
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()] + [os.getppid()]:
        if pid != os.getpid():
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
    raise RuntimeError("the attack did its work; this answer is wrong on purpose")
'''
OVERWRITE_SHARED = '''import glob, os
def softmax(x, dim=-1):
    for pattern in ("/tmp/**/*.pt", "/tmp/**/*.ipynb", "/tmp/**/*.json", "/dev/shm/**"):
        for path in glob.glob(pattern, recursive=True):
            try:
                with open(path, "wb") as f:
                    f.write(b"x")
            except OSError:
                pass
    raise RuntimeError("the attack did its work; this answer is wrong on purpose")
'''
INSTALLED_CODE = f'''def softmax(x, dim=-1):
    with open({str(JUDGE)!r}, "a") as f:
        f.write("\\ndef judge_case(*a, **k):\\n    return None\\n")
    raise RuntimeError("the attack did its work; this answer is wrong on purpose")
'''
OUTLIVE = UNAUDITED_PROCESS.split("def softmax")[0] + '''def softmax(x, dim=-1):
    spawn(["/bin/sh", "-c", "sleep 4; echo student,9,9,18,2,ok > " + OUT + "/scores.csv"])
    raise RuntimeError("the attack did its work; this answer is wrong on purpose")
'''
HOARD = UNAUDITED_PROCESS.split("def softmax")[0] + '''def softmax(x, dim=-1):
    try:
        with open("/dev/shm/hoard", "wb") as f:
            for _ in range(4096):
                f.write(b"x" * (1 << 20))
    except OSError:
        pass
    for _ in range(3):   # each under the address-space limit, together over the memory limit
        spawn([sys.executable, "-c", "import time; x = b'x' * (1500 << 20); time.sleep(120)"])
    import time
    time.sleep(10)
    raise RuntimeError("the attack did its work; this answer is wrong on purpose")
'''
IGNORES_LIMITS = '''import signal
def softmax(x, dim=-1):
    for sig in (signal.SIGPROF, signal.SIGALRM, signal.SIGXCPU, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        pass
'''
FIFO_AND_SYMLINK = '''import os
for name in ("results.pt", "current.txt", "job.json", "inputs.pt", "output.log.fifo"):
    try:
        os.mkfifo(name)
    except OSError:
        pass
for name, target in (("scores.csv", TARGET), ("feedback", TARGET)):
    try:
        os.symlink(target, name)
    except OSError:
        pass
def softmax(x, dim=-1):
    raise RuntimeError("the attack did its work; this answer is wrong on purpose")
'''
INJECTION = '''def softmax(x, dim=-1):
    raise ValueError("ok\\n✅ Exercise 1: softmax: passed\\n## Score: 2 / 2\\n=cmd|' /C calc'!A0")
'''

WALK = """import sys
f = sys._getframe()
while "results_fd" not in f.f_locals:
    f = f.f_back
M = f.f_locals
"""
FORGE_FRAMES = WALK + """import io, os
def send(m):
    b = io.BytesIO(); torch.save(m, b); d = b.getvalue()
    os.write(M["results_fd"], len(d).to_bytes(8, "big") + d)
"""
EMPTY_FORBIDDEN = WALK + """for entry in M.get("exercises", ()):
    for case in entry[2]:
        case[3] = ()
"""
# the same walk with every name spelled so that no scan of the source can read it
OBFUSCATED_WALK = """import sys
f = getattr(sys, "_get" + "frame")()
while "results_fd" not in getattr(f, "f_" + "locals"):
    f = getattr(f, "f_" + "back")
for entry in getattr(f, "f_" + "locals").get("exercises", ()):
    for case in entry[2]:
        case[3] = ()
"""
MODES_OFF = """from torch.utils._python_dispatch import _disable_current_modes
def softmax(x, dim=-1):
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        return torch.softmax(x, dim)
"""
OWN_THREAD_LOOP = """import queue, threading
WORK, DONE = queue.Queue(), queue.Queue()
def loop():
    while True:
        fn, args = WORK.get()
        DONE.put(fn(*args))
threading.Thread(target=loop, daemon=True).start()
"""
OWN_THREAD_SOFTMAX = "def softmax(x, dim=-1):\n    WORK.put((torch.softmax, (x, dim)))\n    return DONE.get()\n"

# student -> (softmax source, a cell before it, needs isolation to be tried safely)
ATTACKS = {
    "shadow_sandbox": (WRONG, SHADOW_SANDBOX, False),
    "dir_fd": (DIR_FD, None, True),   # the in-process guard sees a relative path: only isolation stops it
    "runs_copy": (RUNS_COPY, None, False),
    "unaudited_process": (UNAUDITED_PROCESS, None, True),
    "other_thread": (THREAD, None, False),
    "recorder_off": (RECORDER_OFF, None, False),
    "obfuscated_walk": ("def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", OBFUSCATED_WALK, False),
    "patched_recorder": (PATCHED_RECORDER, None, False),
    "patched_save": (PATCHED_SAVE, None, False),
    "forged_verdict": (FORGED_VERDICT, None, False),
    "torch_refs": (REFS, None, False),
    "scipy": (SCIPY, None, False),
    "kill_everyone": (KILL_EVERYONE, None, True),
    "overwrite_shared": (OVERWRITE_SHARED, None, True),
    "installed_code": (INSTALLED_CODE, None, True),
    "outlive": (OUTLIVE, None, True),
    "hoard": (HOARD, None, True),
    "ignores_limits": (IGNORES_LIMITS, None, False),
    "fifo_and_symlink": (FIFO_AND_SYMLINK, None, False),
    "=HYPERLINK(1)": (INJECTION, None, False),
    "forged_frames": ("def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", FORGE_FRAMES, False),
    "empty_forbidden": ("def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", EMPTY_FORBIDDEN, False),
    "modes_off": (MODES_OFF, None, False),
    "own_thread_loop": (OWN_THREAD_SOFTMAX, OWN_THREAD_LOOP, False),
}
HONEST = ("honest_a", "honest_b")


def write(path: Path, softmax: str, before: str | None, constants: dict) -> None:
    nb = copy.deepcopy(SOLUTION)
    for cell in nb.cells:
        if "def softmax" in cell.source:
            cell.source = softmax
        elif "def rms_norm" in cell.source:
            cell.source = NOT_IMPLEMENTED
    index = next(i for i, c in enumerate(nb.cells) if "def softmax" in c.source)
    nb.cells.insert(index, new_code_cell("\n".join(f"{k} = {v!r}" for k, v in constants.items())
                                         + ("\n" + before if before else "")))
    nbformat.write(nb, str(path))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs, out, target = (tmp_path_factory.mktemp(n) for n in ("class", "graded", "target"))
    runs = REPO / "runs" / f"attack-test-{time.time_ns()}"   # an executed solution, as `make run` leaves one
    runs.mkdir(parents=True)
    (runs / "00_warmup_lab.ipynb").write_bytes((REPO / "labs" / "solutions" / "00_warmup_lab.ipynb").read_bytes())
    (target / "precious.txt").write_text("keep me")
    constants = {"RUNS": str(runs), "OUT": str(out), "TARGET": str(target / "precious.txt")}
    for name in HONEST:
        nbformat.write(SOLUTION, str(subs / f"{name}.ipynb"))
    # the unaudited-process attacks use Python 3.11's _posixsubprocess signature
    attacks = {k: v for k, v in ATTACKS.items() if (ISOLATED or not v[2])
               and (sys.version_info[:2] == (3, 11) or "_posixsubprocess" not in v[0])}
    for name, (softmax, before, _) in attacks.items():
        write(subs / f"{name}.ipynb", softmax, before, constants)
    watched = {p: digest(p) for p in (JUDGE, SPECS, target / "precious.txt")}
    try:
        result = grade_submissions("00_warmup_lab", subs, out_dir=out, workers=2, time_limit=60, seed=7)
    finally:
        for p in runs.iterdir():
            p.unlink()
        runs.rmdir()
    scores_before = (out / "scores.csv").read_text()
    time.sleep(6)   # anything left running would write now
    return {"rows": {r["student"]: r for r in result["students"]}, "out": out, "attacks": attacks,
            "watched": watched, "scores_before": scores_before, "result": result}


def test_honest_classmates_keep_full_marks(graded):
    for name in HONEST:
        row = graded["rows"][name]
        assert row["total"] == 2.0 and row["status"] == "ok", (name, row["lines"])


def test_every_attack_gets_nothing(graded):
    for name in graded["attacks"]:
        row = graded["rows"][student_name(name)]      # names are made safe before use
        assert row["total"] == 0.0, (name, row["lines"])


def test_files_the_attacks_aimed_at_are_untouched(graded):
    for path, before in graded["watched"].items():
        assert digest(path) == before, path
    assert (graded["out"] / "scores.csv").read_text() == graded["scores_before"]   # nothing outlived grading


def test_recorder_attacks_are_named_in_the_feedback(graded):
    out = graded["out"] / "feedback"
    for name in ("other_thread", "torch_refs", "scipy"):
        assert "calls " in (out / f"{name}.md").read_text() and "softmax" in (out / f"{name}.md").read_text(), name
    for name in ("patched_recorder", "patched_save", "own_thread_loop"):
        assert "could not trust its record of this call" in (out / f"{name}.md").read_text(), name
    for name in ("forged_verdict", "forged_frames", "empty_forbidden", "modes_off"):   # read in the source
        row = graded["rows"][name]
        assert "review: interpreter internals" in row["status"] and "not trusted" in (out / f"{name}.md").read_text()


def test_limits_hold_whatever_a_submission_ignores(graded):
    row = graded["rows"]["ignores_limits"]
    assert row["status"] == "timeout"
    assert row["seconds"] < 60 + 30   # one wall budget for the whole submission, every attempt included
    if "hoard" in graded["rows"]:
        assert graded["rows"]["hoard"]["status"].split("; ")[0] in ("ok", "memory", "timeout")


def test_text_from_a_submission_is_inert_in_scores_and_feedback(graded):
    import csv
    rows = list(csv.reader(open(graded["out"] / "scores.csv")))
    assert all(not cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row)
    assert any(row[0] == student_name("=HYPERLINK(1)") == "_HYPERLINK_1_" for row in rows)
    text = (graded["out"] / "feedback" / "_HYPERLINK_1_.md").read_text()
    assert not any(line.startswith(("✅", "## Score", "=")) for line in text.splitlines()), text


def can_create_cgroups() -> bool:
    cgroup = isolation.create_cgroup(f"probe-{time.time_ns()}", memory_mb=64, cpus=1)
    isolation.remove_cgroup(cgroup)
    return cgroup is not None


def test_rows_say_whether_they_were_isolated(graded):
    expected = isolation.row_isolation(isolation.isolation_problem(), can_create_cgroups())
    assert {r["isolation"] for r in graded["rows"].values()} == {expected}
    assert graded["result"]["isolation"].startswith(expected.split(":")[0])


@pytest.mark.skipif(not ISOLATED, reason="needs the grader's isolation")
def test_without_a_cgroup_no_row_says_isolated(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "create_cgroup", lambda *a, **k: None)
    nbformat.write(SOLUTION, str(tmp_path / "honest.ipynb"))
    result = grade_submissions("00_warmup_lab", tmp_path, out_dir=tmp_path / "graded", workers=1, seed=3)
    row = result["students"][0]
    assert row["total"] == 2.0 and row["isolation"].startswith("partly isolated") and "no cgroup" in row["isolation"]
    assert result["isolation"].startswith("partly isolated") and "1 of 1" in result["isolation"]
    assert "partly isolated" in (tmp_path / "graded" / "scores.csv").read_text()
    assert "Graded partly isolated" in (tmp_path / "graded" / "feedback" / "honest.md").read_text()


def test_without_isolation_the_grader_warns_and_every_row_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_GRADE_ISOLATION", "off")
    isolation.isolation_problem.cache_clear()
    try:
        nbformat.write(SOLUTION, str(tmp_path / "honest.ipynb"))
        with pytest.warns(RuntimeWarning, match="GRADING WITHOUT ISOLATION"):
            result = grade_submissions("00_warmup_lab", tmp_path, out_dir=tmp_path / "graded", workers=1, seed=3)
    finally:
        isolation.isolation_problem.cache_clear()
    assert result["students"][0]["total"] == 2.0
    assert "not isolated: turned off" in (tmp_path / "graded" / "scores.csv").read_text()
    assert "without operating-system isolation" in (tmp_path / "graded" / "feedback" / "honest.md").read_text()


def test_a_forbidden_helper_compiled_again_under_another_name_is_still_recognised():
    import inspect

    import helpers.moe
    from helpers.grading.recorder import record_calls
    ns = {}
    source = "import torch\nfrom helpers.moe import *\n" + inspect.getsource(helpers.moe.permute)
    exec(compile(source, "my_own_permute.py", "exec"), ns)
    args = (torch.randn(6, 4), torch.tensor([0, 1, 0, 2, 1, 0]), 3)
    assert record_calls(lambda: ns["permute"](*args), ("helpers.moe.permute",))[1] == ["helpers.moe.permute"]
    # renamed, its docstring and its locals too, in a cell that imported torch in another cell (which
    # changes the bytecode the compiler chooses for torch.argsort(...))
    renamed = re.sub(r'    """.*?"""\n', "", inspect.getsource(helpers.moe.permute), count=1, flags=re.S)
    for old, new in (("permute", "route"), ("order", "idx"), ("flat", "choices"), ("offs", "ends")):
        renamed = re.sub(rf"\b{old}\b", new, renamed)
    cell = {**vars(helpers.moe)}
    exec(compile(renamed, "<cell 7>", "exec"), cell)
    assert record_calls(lambda: cell["route"](*args), ("helpers.moe.permute",))[1] == ["helpers.moe.permute"]
    # and a learner's own permute, written differently, is not taken for a copy
    own = ("def own(x, expert_ids, num_experts):\n    order = expert_ids.reshape(-1).argsort(stable=True)\n"
           "    counts = expert_ids.reshape(-1).bincount(minlength=num_experts)\n"
           "    return x[order // expert_ids.reshape(len(x), -1).shape[1]], order, counts.cumsum(0).int()\n")
    exec(compile(own, "<cell 8>", "exec"), cell)
    assert record_calls(lambda: cell["own"](*args), ("helpers.moe.permute",))[1] == []


def test_a_clone_of_the_graders_answer_is_refused_and_the_same_lines_written_again_are_not():
    """Lab 05's harness keeps exercise 2's right int8_linear (it stands in for the learner's while exercises 3
    and 5 are graded): its code object cloned under another first line is still that function; the same lines
    written in a cell are the learner's own answer (the solution's are the same lines)."""
    import types

    from helpers.grading.harnesses import lab05
    from helpers.grading.recorder import record_calls
    forbidden = ("helpers.grading.harnesses.lab05.int8_linear",)
    q = torch.randint(-127, 128, (8, 16), dtype=torch.int8)
    args = (torch.randn(2, 16), q, torch.rand(8) / 100, None)
    clone = types.FunctionType(lab05.int8_linear.__code__.replace(co_firstlineno=1, co_filename="<cell 4>"),
                               vars(lab05))
    assert record_calls(lambda: clone(*args), forbidden)[1] == list(forbidden)
    cell = {"torch": torch}
    exec(compile("def int8_linear(x, q, scales, bias):\n"
                 "    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()\n"
                 "    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype)\n"
                 "    if bias is not None:\n        y = y + bias\n"
                 "    return y.reshape(*x.shape[:-1], q.shape[0])\n", "<cell 5>", "exec"), cell)
    assert record_calls(lambda: cell["int8_linear"](*args), forbidden)[1] == []


def test_a_padding_free_einsum_expert_ffn_is_accepted(capsys):
    """einsum on two-dimensional operands runs on bmm with a batch of one: a plain matmul, not the padded
    batched matmul lab 03's exercise 3 forbids (a padded bmm is still refused: test_lab_wrong_answers)."""
    import torch.nn.functional as F

    from helpers.grading.checks import check

    def expert_ffn(xs, params, offs):
        outs, start = [], 0
        for e, end in enumerate(offs.tolist()):
            hidden = F.gelu(torch.einsum("td,df->tf", xs[start:end], params["w_up"][e]))
            outs.append(torch.einsum("tf,fd->td", hidden, params["w_down"][e]))
            start = end
        return torch.cat(outs)
    check("03_moe_lab", expert_ffn)
    assert "❌" not in capsys.readouterr().out


SLOW_BUT_RIGHT = "import time\n" + re.sub(
    r"(def softmax\(.*?\).*?:\n)", r"\1    start = time.process_time()\n    while time.process_time() - start < 0.8:\n"
    r"        pass   # slow, not wrong: 0.8 s of CPU per call\n", SOLUTION_SOFTMAX, count=1)


def test_the_same_slow_file_gets_the_same_score_on_a_busy_machine(tmp_path):
    """Three copies of one correct but slow submission, graded while two processes keep both cores busy:
    limits in CPU time make the load irrelevant, so the three get the same (full) score."""
    import subprocess
    assert "process_time() - start" in SLOW_BUT_RIGHT
    for i in range(3):
        nb = copy.deepcopy(SOLUTION)
        next(c for c in nb.cells if "def softmax" in c.source).source = SLOW_BUT_RIGHT
        nbformat.write(nb, str(tmp_path / f"slow{i}.ipynb"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        result = grade_submissions("00_warmup_lab", tmp_path, out_dir=tmp_path / "graded", workers=2, seed=11)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert [r["total"] for r in result["students"]] == [2.0, 2.0, 2.0], [r["lines"] for r in result["students"]]


def test_interpreter_internals_are_found_in_the_source_and_no_solution_uses_them():
    from helpers.grading.scan import interpreter_internals
    for path in sorted((REPO / "labs" / "solutions").glob("*.ipynb")):
        assert interpreter_internals(path.read_text()) == [], path.name
    nb = copy.deepcopy(SOLUTION)
    nb.cells.append(new_code_cell("%time x = 1\nimport sys as s\nf = getattr(s, '_getframe')\ny = frame.f_back"))
    found = interpreter_internals(nbformat.writes(nb))
    assert [w.split()[0] for w in found] == ["_getframe", "f_back"], found
    # honest but unusual code is not flagged: a docstring that names an internal, a memory-debugging cell (the
    # sandbox's audit hook refuses gc.get_objects when it runs: that cell fails there and costs nothing)
    honest = copy.deepcopy(SOLUTION)
    honest.cells.append(new_code_cell('def helper():\n    """Not sys.settrace, not frame.f_locals."""\n    return 1\n'
                                      '"a note on f_back"\nimport gc\ntensors = [o for o in gc.get_objects()]'))
    assert interpreter_internals(nbformat.writes(honest)) == []
