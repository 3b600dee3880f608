"""Lab 10, the capstone: the goals of helpers.capstone on the starting code, the solution (the reference) and
wrong versions made here from them: the solution passes every goal and beats the starting code; the starting
code earns only the serving goal and fails the planted bug; each wrong version fails the goal it breaks.
Every goal on a workload other than the visible one is the guide notebook's last cell, whose stored output
(every untimed goal passed) the suite and each environment of the matrix compare."""
import json
import os
import shutil
import sys
import threading
import time

import pytest
import torch

from helpers import capstone, capstone_timing

W = capstone.VISIBLE


@pytest.fixture(scope="module")
def start():
    return capstone.load_project(capstone.START)


@pytest.fixture(scope="module")
def reference():
    return capstone.load_project(capstone.REFERENCE)


def variant(base, folder, edits: dict[str, list[tuple[str, str]]]):
    """A copy of the project in `base` with each (old, new) replacement made once in its file, loaded."""
    shutil.copytree(base, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name, replacements in edits.items():
        path = folder / name
        text = path.read_text()
        for old, new in replacements:
            assert text.count(old) == 1, f"{old!r} is not exactly once in {name}"
            text = text.replace(old, new)
        path.write_text(text)
    return capstone.load_project(folder)


@pytest.fixture(scope="module")
def bug_fixed(tmp_path_factory):
    """The starting code with only its causal mask corrected."""
    return variant(capstone.START, tmp_path_factory.mktemp("fixed") / "project",
                   {"model.py": [("tril(diagonal=1)", "tril()")]})


@pytest.fixture(scope="module")
def nondeterministic(tmp_path_factory):
    """Faster but nondeterministic: the solution, its windows drawn from an unseeded generator."""
    return variant(capstone.REFERENCE, tmp_path_factory.mktemp("nondeterministic") / "project",
                   {"data.py": [("(steps, batch_size), generator=torch.Generator().manual_seed(seed))\n",
                                 "(steps, batch_size))\n")]})


@pytest.fixture(scope="module")
def coarse(tmp_path_factory):
    """Smaller but inaccurate: the solution's file with 2-bit weights (-1, 0, 1 times a scale)."""
    return variant(capstone.REFERENCE, tmp_path_factory.mktemp("coarse") / "project",
                   {"serve.py": [("clamp(min=1e-12) / 127", "clamp(min=1e-12)"),
                                 ("clamp(-127, 127)", "clamp(-1, 1)")]})


@pytest.fixture(scope="module")
def visible_only(tmp_path_factory):
    """Special-cases the visible workload: the starting code with its mask corrected only at length 64."""
    return variant(capstone.START, tmp_path_factory.mktemp("visible_only") / "project",
                   {"model.py": [("tril(diagonal=1)", "tril(diagonal=0 if length == 64 else 1)")]})


def goal(name, project, reference, w=W, start=None, **options):
    """One goal of the project (the starting code as its own baseline where none is given)."""
    return capstone.goal(name, project, start or project, reference, w, options=options)


@pytest.fixture(scope="module")
def weight_decay_off(tmp_path_factory):
    """The solution with AdamW's documented weight decay (0.01) set to 0."""
    return variant(capstone.REFERENCE, tmp_path_factory.mktemp("weight_decay_off") / "project",
                   {"train.py": [("weight_decay=0.01", "weight_decay=0.0")]})


@pytest.fixture(scope="module")
def exact_gelu(tmp_path_factory):
    """The solution with the exact GELU in place of the documented tanh approximation."""
    return variant(capstone.REFERENCE, tmp_path_factory.mktemp("exact_gelu") / "project",
                   {"model.py": [(', approximate="tanh")', ")")]})


def test_starting_code_earns_serving_but_not_the_planted_bug(start, reference):
    assert goal("serving_agreement", start, reference)["passed"]
    leak = goal("causality", start, reference)
    assert not leak["passed"] and leak["leaking_positions"]
    curve = goal("loss_curve", start, reference)
    assert not curve["passed"] and curve["worst_error"] > 3 * curve["rtol"]


def test_starting_code_fails_hygiene(start, reference):
    found = goal("deprecations", start, reference)["warnings"]
    assert any("torch.jit.script" in w for w in found) and any("torch.cpu.amp.autocast" in w for w in found)
    breaks = goal("graph_breaks", start, reference)
    assert not breaks["passed"] and breaks["graph_breaks"] > 0
    assert not goal("deterministic_repeat", start, reference, capstone.workload(steps=4))["passed"]


def test_fixing_only_the_bug_matches_the_reference_curve(bug_fixed, reference):
    curve = goal("loss_curve", bug_fixed, reference)
    assert curve["passed"], (curve["worst_error"], curve["trained_error"])
    assert goal("causality", bug_fixed, reference)["passed"]
    assert not goal("batches_match", bug_fixed, reference)["passed"]


def test_a_changed_setting_that_barely_moves_the_loss_fails_the_curve(weight_decay_off, reference):
    """Weight decay 0.01 -> 0: every loss within LOSS_RTOL's reach of the reference's, but the trained model's
    predictions part from the reference's by more than TRAINED_RTOL of training's move."""
    curve = goal("loss_curve", weight_decay_off, reference)
    assert not curve["passed"] and curve["trained_error"] > 3 * curve["trained_rtol"], curve["trained_error"]


def test_a_changed_activation_the_losses_cannot_see_fails_on_what_training_learned(exact_gelu, reference):
    """Exact GELU for the documented tanh one: every loss within LOSS_RTOL (5.8e-6 measured), the trained
    model's held-out logits 2.7e-5 of training's move from the reference's, over TRAINED_RTOL."""
    curve = goal("loss_curve", exact_gelu, reference)
    assert curve["worst_error"] <= curve["rtol"] and curve["trained_error"] > 3 * curve["trained_rtol"], curve
    assert not curve["passed"]


def test_solution_passes_correctness_and_hygiene(reference):
    results = capstone.goals(["loss_curve", "causality", "batches_match", "serving_agreement", "deprecations",
                              "deterministic_repeat", "graph_breaks"], reference, reference, reference, W)
    for result in results:
        assert result["passed"], result


def test_solution_is_smaller_and_lighter(reference, start):
    size, peak = capstone.goals(["served_size", "step_memory"], reference, start, reference, W)
    assert size["passed"] and size["ratio"] < 0.3, size
    assert peak["passed"], peak


def test_a_dataset_kept_as_a_tensor_is_not_step_memory(reference, start):
    """The transient peak is measured above what stays alive through the step: the solution keeps its token
    ids in one tensor, which counted as step memory before (0.521 of the starting code's on this workload,
    over the budget; 0.448 with the same ids in a numpy array)."""
    peak = goal("step_memory", reference, reference, capstone.workload(seed=5, part=1, batch_size=8, seq_len=48),
                start=start)
    assert peak["passed"] and peak["resident_bytes"] > 0, peak


@pytest.mark.slow
@pytest.mark.parametrize("name", capstone.TIMED)
def test_solution_is_faster_in_paired_rounds(reference, start, name):
    """The solution is never judged slower, on one thread (on a busy machine, two threads each wait on the
    slower one); when the interval clears 1 the goal is passed. Judged once more when the interval was too wide
    to tell. The suite never asserts wall time: a loaded machine may leave the gain within noise (seen: 1.15x
    "within noise" twice, beside the suite's other worker)."""
    for _ in range(2):
        result = goal(name, reference, reference, start=start, rounds=10, threads_used=1)
        if result["verdict"] != "within noise":
            break
    assert result["verdict"] != "regression", result
    assert result["passed"] == (result["verdict"] == "improvement" and result["gain"] >= 1 + capstone.SPEED_GAIN), result


def test_training_measured_on_other_threads_than_the_judge_stays_within_the_tolerance(reference, start):
    """The sandbox trains on the threads it is given, the grader's judge runs the reference on its own: the
    solution trained on one thread against the reference on two moved its trained logits 1.6e-7 of training's
    move here (TRAINED_RTOL 3e-6) and its losses 1.0e-7 (LOSS_RTOL 1e-5)."""
    given = capstone.reference_inputs(reference, W)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        measured = capstone.measure_training(reference, start, W, given)
        torch.set_num_threads(2)
        capstone._REFERENCE_RUNS.pop((reference.folder, repr(W)), None)
        result = capstone.judged("loss_curve", measured, reference, W, given)
    finally:
        torch.set_num_threads(before)
    assert result["passed"], result
    assert result["trained_error"] <= capstone.TRAINED_RTOL / 4 and result["worst_error"] <= capstone.LOSS_RTOL / 4


def test_submissions_judged_on_threads_are_judged_one_at_a_time(monkeypatch):
    """The grader judges submissions on threads; the reference's training, computed by the first judge that needs
    it, draws its initial weights from torch's global generator: two trainings at once on two threads lost up to
    3% of their losses to each other's draws, and the solution, graded beside another submission, missed its
    loss curve on a hidden workload (5.1e-5 relative). capstone.judged lets one judge run at a time."""
    active, most = [0], [0]

    def slow_judge(*args, **kwargs):
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(0.05)
        active[0] -= 1
        return {"goal": "loss_curve", "passed": True}
    monkeypatch.setitem(capstone.GOALS, "loss_curve", (capstone.measure_training, slow_judge))
    judges = [threading.Thread(target=capstone.judged, args=("loss_curve", {}, None, W, {})) for _ in range(3)]
    for thread in judges:
        thread.start()
    for thread in judges:
        thread.join()
    assert most[0] == 1


def test_faster_but_nondeterministic_is_rejected(nondeterministic, reference):
    assert not goal("deterministic_repeat", nondeterministic, reference)["passed"]
    assert not goal("batches_match", nondeterministic, reference)["passed"]
    assert goal("loss_curve", nondeterministic, reference)["passed"]     # the model itself is right


def test_smaller_but_inaccurate_is_rejected(coarse, reference, start):
    size, agreement = capstone.goals(["served_size", "serving_agreement"], coarse, start, reference, W)
    assert size["ratio"] <= size["budget"] and not size["passed"], size
    assert size["loss"] > size["fp32_loss"] * (1 + size["loss_rise_allowed"])
    assert not agreement["passed"], agreement


def test_a_fix_for_the_visible_workload_only_fails_a_hidden_one(visible_only, reference):
    assert goal("causality", visible_only, reference)["passed"]
    assert not goal("causality", visible_only, reference, capstone.workload(seed=3, seq_len=48))["passed"]


# Three ways a project could forge a timed gain: slow the starting code from inside the grader's process (each
# side now runs in a process of its own, helpers.capstone_timing), or do its own work where the process's CPU
# clock does not see it (another thread, another process: each side now pays for both).
SLOWER_LOSS = [("import torch.nn.functional as F\n",
                "import time\n\nimport torch.nn.functional as F\n\n_ORIGINAL = F.cross_entropy\n\n\n"
                "def _costly(*args, **kwargs):   # what the starting code calls, 20 ms slower\n"
                "    t0 = time.process_time()\n    while time.process_time() - t0 < 0.02:\n        pass\n"
                "    return _ORIGINAL(*args, **kwargs)\n\n\nF.cross_entropy = _costly\n"),
               ("return F.cross_entropy(", "return _ORIGINAL(")]
SPINNING = [("import torch.nn.functional as F\n",
             "import threading\nimport time\n\nimport torch.nn.functional as F\n\nOWN, STOP = threading.Event(), threading.Event()\n\n\n"
             "def _spin():   # burns CPU whenever the project's own step is not running\n"
             "    while not STOP.is_set():\n        if OWN.is_set():\n            time.sleep(0.0002)\n"
             "        else:\n            sum(range(10_000))\n\n\n"
             "threading.Thread(target=_spin, daemon=True).start()\n"),
            ("        inputs, targets = next(self.batches)\n",
             "        OWN.set()\n        try:\n            return self._step()\n        finally:\n            OWN.clear()\n\n"
             "    def _step(self) -> float:\n        inputs, targets = next(self.batches)\n")]


IN_A_WORKER = {"data.py": [("num_workers=2, worker_init_fn=seed_worker, in_order=False", "num_workers=0")],
               "train.py": [("import torch\n", "import concurrent.futures\nimport multiprocessing\n\nimport torch\n"),
                            ("    def step(self) -> float:\n",
                             "    def step(self) -> float:   # the real step, in a forked worker process\n"
                             "        if not hasattr(self, 'pool'):\n            Trainer.current = self\n"
                             "            self.pool = concurrent.futures.ProcessPoolExecutor(\n"
                             "                1, mp_context=multiprocessing.get_context('fork'))\n"
                             "        return self.pool.submit(_step_there).result()\n\n"
                             "    def _step(self) -> float:\n"),
                            ("def make_trainer(", "def _step_there():\n    return Trainer.current._step()\n\n\n"
                                                  "def make_trainer(")]}


FORGED_BELOW = 1.35   # the forgeries earned 1.58x and more; the starting code against itself gave 0.88-1.11x


@pytest.mark.parametrize("edits", [{"train.py": SLOWER_LOSS}, {"train.py": SPINNING}, IN_A_WORKER],
                         ids=["slows-what-the-start-calls", "spins-a-thread", "steps-in-a-worker-process"])
def test_a_forged_speed_earns_nothing(tmp_path, reference, start, edits):
    """Each forged a training 'gain' of the starting code over itself (measured with side A in the project's
    process and only the process's own CPU counted: 1.58x, 42.5x and 80.2x here): a torch function only the starting
    code calls made slower, a thread burning CPU whenever the project's own step is not running, the step run
    in a worker process. Now the first cannot reach side A, and the CPU the other two spend outside the
    project's timed calls, or in its other processes, is charged to its rounds."""
    before = torch.nn.functional.cross_entropy
    forged = variant(capstone.START, tmp_path / "project", edits)
    try:
        result = goal("train_speed", forged, reference, start=start, rounds=4, threads_used=1)
    finally:
        torch.nn.functional.cross_entropy = before
        getattr(forged.train, "STOP", threading.Event()).set()
    assert "error" not in result and not result["passed"] and result["gain"] < FORGED_BELOW, result


def test_a_server_that_knows_it_is_timed_fails_on_its_outputs(tmp_path, reference, start):
    """A timing process is easy to recognise (python -I); a server that reads only the last token there is
    several times faster and wrong. Its timed calls' outputs are compared with the same calls run untimed,
    where the goals' process loaded the project."""
    knowing = variant(capstone.START, tmp_path / "project", {"serve.py": [
        ("import torch\n", "import sys\n\nimport torch\n"),
        ("        return served(ids)[:, -1]", "        return served(ids[:, -1:] if sys.flags.isolated else ids)[:, -1]")]})
    result = goal("serve_latency", knowing, reference, start=start, rounds=4, threads_used=1)
    assert result["gain"] > 1.5 and not result["passed"], result
    assert result["outputs"].startswith("differ from the same calls untimed from number 0"), result
    honest = goal("serve_latency", reference, reference, start=start, rounds=2, threads_used=1)
    assert honest["outputs"] == "same as untimed", honest


def test_a_cached_answer_earns_no_serving_speed(tmp_path, reference, start):
    """functools.lru_cache on next_token_logits answered every timed call after the first from its cache while
    each call got the same prompt object; each call now gets a prompt of its own."""
    cached = variant(capstone.START, tmp_path / "project", {"serve.py": [
        ("def next_token_logits(", "import functools\n\n\n@functools.lru_cache(maxsize=None)\ndef next_token_logits(")]})
    result = goal("serve_latency", cached, reference, start=start, rounds=4, threads_used=1)
    assert "error" not in result and not result["passed"] and result["gain"] < FORGED_BELOW, result


def test_a_line_written_into_a_sides_reply_pipe_is_refused(start):
    """The reply pipe can be reopened through /proc by anything in this process: a line that is not the
    request's nonce with the count of calls the side ran is refused."""
    with capstone_timing.started(start.sources, "serve_latency", W, calls=6, warmup=1) as side:
        side(2)
        with open(f"/proc/self/fd/{side.process.stdout.fileno()}", "w") as forged:
            forged.write("9 9\n")
        with pytest.raises(RuntimeError, match="was not the request's nonce and 4 calls in all"):
            side(2)


def test_a_side_takes_no_request_that_would_resync_its_count(start):
    """A request for no calls or fewer (which could undo the count of calls injected into its pipe) ends the
    side, and so does any request after its outputs were read."""
    for requests in ([0], [1, "outputs", 1]):
        with capstone_timing.started(start.sources, "serve_latency", W, calls=4, warmup=1) as side:
            with pytest.raises(RuntimeError, match="it ended"):
                for request in requests:
                    side.outputs() if request == "outputs" else side(request)


def test_outputs_that_are_not_finite_or_part_fail():
    """_outputs_checked: the same outputs pass; a NaN, or a call that parts beyond float noise (relative to the
    outputs' size), fails; untimed runs that differ are not compared."""
    same = [6.3, 6.2, 6.0]
    check = capstone._outputs_checked
    assert check({"project_outputs": same, "outputs_here": [same, same]}) == "same as untimed"
    assert check({"project_outputs": [6.3, 6.2 + 1e-6, 6.0], "outputs_here": [same]}) == "same as untimed"
    assert check({"project_outputs": [6.3, float("nan"), 6.0], "outputs_here": [same]}).startswith("differ: an output")
    assert check({"project_outputs": [6.3, 6.1, 6.0], "outputs_here": [same]}).endswith("from number 1 on")
    assert check({"project_outputs": [0.0] * 3, "outputs_here": [same, [6.3, 6.2, 5.9]]}).startswith("not compared")


BURNS = """import os, sys, threading, time
def burn(seconds):
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass
worker = threading.Thread(target=burn, args=(0.3,))
worker.start(); worker.join()            # a thread that ended
if os.fork() == 0:
    burn(0.3); os._exit(0)
os.wait()                                # a child reaped
if os.fork() == 0:
    if os.fork() == 0:
        burn(0.3); os._exit(0)           # an orphan: the subreaper keeps it below
    os._exit(0)
os.wait()
time.sleep(0.6)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not capstone_timing.COUNTED, reason="another process's CPU is read from Linux's /proc")
def test_a_sides_cpu_counts_ended_threads_reaped_children_and_orphans():
    """A side's CPU is read by the kernel over its process tree: a thread that ended, a child it reaped and an
    orphan a child left (its subreaper adopts it, as a timing child does) count, 0.3 s each. Summing the live
    threads of the side's descendants, as before, saw none of the three."""
    import subprocess
    code = "import ctypes\nctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n" + BURNS
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = capstone_timing.tree_cpu_seconds(child.pid)[0]
        assert child.stdout.readline() == "done\n"
        rest, side = capstone_timing.tree_cpu_seconds(os.getpid(), child.pid)
        assert side - before >= 0.9 * 0.95, (before, side)
    finally:
        child.stdin.close()
        child.wait()


def test_without_proc_the_timed_goals_use_wall_time_and_read_no_proc(monkeypatch, reference, start):
    """Where another process's CPU cannot be read (no /proc: macOS, Windows) the rounds are timed on the wall
    clock and /proc is not read at all."""
    monkeypatch.setattr(capstone_timing, "COUNTED", False)
    monkeypatch.setattr(capstone_timing, "tree_cpu_seconds", lambda *args: pytest.fail("/proc was read"))
    result = goal("serve_latency", reference, reference, start=start, rounds=2, threads_used=1)
    assert result["clock"] == "wall" and "error" not in result, result


@pytest.mark.skipif(not capstone_timing.COUNTED, reason="the subreaper and /proc are Linux's")
def test_a_daemon_that_left_its_parent_is_charged_to_its_side(tmp_path):
    """A process that forks twice leaves its parent; its orphan would be adopted outside the side's tree and its
    CPU lost. A timing child is its descendants' subreaper: here each serving call leaves an orphan that burns
    0.25 s, and the side is charged for it (forking the process costs about 0.07 s a call here)."""
    orphaning = variant(capstone.START, tmp_path / "project", {"serve.py": [(
        '    """Logits of the token after each row of `ids` ([batch, length] -> [batch, vocab_size])."""\n',
        '    """Logits of the token after each row of `ids` ([batch, length] -> [batch, vocab_size])."""\n'
        "    if os.fork() == 0:\n        if os.fork() == 0:\n            t0 = time.process_time()\n"
        "            while time.process_time() - t0 < 0.25:\n                pass\n        os._exit(0)\n"
        "    os.wait()\n"), ("import torch\n", "import os\nimport time\n\nimport torch\n")]})
    with capstone_timing.started(orphaning.sources, "serve_latency", W, calls=4, warmup=0) as side:
        before = capstone_timing.tree_cpu_seconds(os.getpid(), side.pid)[1]
        side(4)
        time.sleep(1.5)
        assert capstone_timing.tree_cpu_seconds(os.getpid(), side.pid)[1] - before >= 4 * 0.25 * 0.95


def test_the_starting_codes_job_is_checked_by_the_judge(reference, start):
    """The starting code's process echoes the job it read: a job altered in the grading process (a larger
    batch, two threads, no warmup for the starting code only) fails the goal; the job as sent passes."""
    measured = capstone.measured("serve_latency", reference, start, W, {}, rounds=2, threads_used=1)
    assert "error" not in capstone.judged("serve_latency", measured, reference, W, {})
    job = measured["start_job"]
    for altered in ({"workload": job["workload"] | {"seq_len": 128}}, {"threads": 2}, {"warmup": 0}):
        result = capstone.judged("serve_latency", measured | {"start_job": job | altered}, reference, W, {})
        assert "not timed on this goal's job" in result.get("error", ""), (altered, result)


def test_a_project_runs_the_sources_it_was_loaded_from(tmp_path):
    """What a timed goal's process imports, and what the starting code's digest is of, are the sources read
    when the project was loaded: a file rewritten on disk afterwards, or between a child writing its copy and
    importing it, changes nothing that runs."""
    shutil.copytree(capstone.START, tmp_path / "project", ignore=shutil.ignore_patterns("__pycache__"))
    sources = capstone_timing.sources(tmp_path / "project")
    marked = sources | {"serve.py": sources["serve.py"] + "\nMARK = 'read at load'\n"}
    (tmp_path / "project" / "serve.py").write_text("raise RuntimeError('the file on disk ran')\n")
    project = capstone.load_project(tmp_path / "project", marked)
    assert project.serve.MARK == "read at load" and project.sources == marked
    assert not hasattr(capstone.load_project(tmp_path / "project", sources).serve, "MARK")


def test_the_starting_code_timed_must_be_the_starting_code(tmp_path, reference, start):
    """Side A's process reports a digest of the sources it ran; a copy of the starting code rewritten in the
    sandbox (here: the solution handed in as the starting code) fails the goal."""
    result = goal("serve_latency", reference, reference, start=reference, rounds=2, threads_used=1)
    assert not result["passed"] and "is not the starting code" in result["error"], result


def rounds_result(name, start_rounds, project_rounds):
    return capstone.speed_verdict(name, start_rounds, project_rounds)


def test_a_timed_goal_asks_a_gain_beyond_two_copies_of_the_same_code():
    """A tight 5% gain is the pipeline's improvement, which the report states, and not the goal's: the
    starting code timed against itself differs by a few percent. 15% with its interval above 1 passes; 15%
    whose interval reaches below 1 does not."""
    tight = rounds_result("train_speed", [1.05, 1.051, 1.049, 1.05, 1.052, 1.048], [1.0] * 6)
    assert tight["verdict"] == "improvement" and not tight["passed"], tight
    clear = rounds_result("train_speed", [1.15, 1.16, 1.14, 1.15, 1.17, 1.13], [1.0] * 6)
    assert clear["passed"] and clear["least"] == 1 + capstone.SPEED_GAIN, clear
    wide = rounds_result("train_speed", [1.6, 0.9, 1.5, 0.95, 1.4, 0.97], [1.0] * 6)
    assert wide["gain"] >= 1 + capstone.SPEED_GAIN and not wide["passed"], wide


def test_work_piled_into_one_round_pays_in_full():
    """The typical gain of rounds (their geometric mean) rewards a project that does every round's work in the
    first: 8 rounds of the same total time gain 325x there; the total time's ratio, which the goal asks too,
    is 1.0."""
    piled = rounds_result("train_speed", [1.0] * 8, [7.993] + [0.001] * 7)
    assert piled["gain"] > 10 and piled["total_gain"] == pytest.approx(1.0) and not piled["passed"], piled


def test_a_report_claiming_a_gain_its_rounds_do_not_show_is_refused(tmp_path, reference):
    """The report's point: each timed goal claimed, each claim what its own rounds give; an improvement the
    grader measured as a regression is contradicted, one it could not confirm stands."""
    noisy = [rounds_result(name, [1.0, 1.2, 0.9, 1.1], [1.05, 0.95, 1.0, 1.1]) for name in capstone.TIMED]
    clear = [rounds_result(name, [2.0, 2.1, 1.9, 2.05], [1.0, 1.02, 0.98, 1.01]) for name in capstone.TIMED]
    assert {r["verdict"] for r in noisy} == {"within noise"} and {r["verdict"] for r in clear} == {"improvement"}
    report = json.loads(capstone.write_report(clear, tmp_path).read_text())

    def judge(report, timed=None):
        measured = {"found": report is not None, "claims": (report or {}).get("claims")}
        return capstone.judged("report", measured, reference, W, {}, timed=timed)
    assert judge(report)["passed"]
    assert judge(report, {r["goal"]: r for r in noisy})["passed"]        # not confirmed there: stands
    regressed = {r["goal"]: rounds_result(r["goal"], r["project_rounds"], r["start_rounds"]) for r in clear}
    assert "the grader measured regression" in "; ".join(judge(report, regressed)["problems"])
    typed = json.loads(capstone.write_report(noisy, tmp_path).read_text())
    typed["claims"]["train_speed"]["verdict"] = "improvement"             # a verdict typed over its rounds
    assert "its rounds give within noise" in judge(typed)["problems"][0]
    inflated = json.loads(json.dumps(report))
    inflated["claims"]["serve_latency"]["gain"] *= 1.5                     # a gain from another run
    assert not judge(inflated)["passed"]
    del report["claims"]["serve_latency"]
    assert judge(report)["problems"] == ["serve_latency: no claim with " + ", ".join(capstone.CLAIMED)]
    assert judge(None)["problems"] == ["no report.json in the project folder"]


def test_a_forged_measurement_fails_its_goal_without_costing_the_grader(reference):
    """What a measure returns comes from the submission's process: a judge reads it as data, bounded, and
    decides itself (a 'passed' sent along counts for nothing; sizes come from the judge's own starting code)."""
    huge = torch.zeros(10**7, dtype=torch.uint8)      # iterated, one tensor object per element
    assert "expected a list" in capstone.judged("loss_curve", {"losses": huge, "logits": huge}, reference, W, {})["error"]
    leak = capstone.judged("causality", {"leaking_positions": {"3": 1.0}, "passed": True}, reference, W, {})
    assert leak["passed"] is False
    assert not capstone.judged("graph_breaks", {"graph_breaks": torch.zeros(()), "passed": True}, reference, W, {})["passed"]
    size = capstone.judged("served_size", {"served_bytes": 0, "start_bytes": 3, "state": {}, "served_logits": huge},
                           reference, W, {"prompts": None, "next_tokens": None})
    assert not size["passed"] and "0 bytes" in size["error"]
    speed = capstone.judged("train_speed", {"start": huge, "project": huge, "threads": 1, "clock": "cpu"}, reference, W, {})
    assert "expected a list" in speed["error"]
