"""Lab 10, the capstone: the goals of helpers.capstone on the starting code, the solution (the reference) and
wrong versions made here from them: the solution passes every goal and beats the starting code; the starting
code earns only the serving goal and fails the planted bug; each wrong version fails the goal it breaks.
Every goal on a workload other than the visible one is the guide notebook's last cell, whose stored output
(every untimed goal passed) the suite and each environment of the matrix compare."""
import shutil

import pytest

from helpers import capstone

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


def test_starting_code_earns_serving_but_not_the_planted_bug(start, reference):
    assert capstone.serving_agreement(start, reference, W)["passed"]
    leak = capstone.causality(start, W)
    assert not leak["passed"] and leak["leaking_positions"]
    curve = capstone.loss_curve(start, reference, W)
    assert not curve["passed"] and curve["worst_error"] > 3 * curve["rtol"]


def test_starting_code_fails_hygiene(start):
    found = capstone.deprecations(start.folder, W)["warnings"]
    assert any("torch.jit.script" in w for w in found) and any("torch.cpu.amp.autocast" in w for w in found)
    breaks = capstone.graph_breaks(start, W)
    assert not breaks["passed"] and breaks["graph_breaks"] > 0
    assert not capstone.deterministic_repeat(start, capstone.workload(steps=4))["passed"]


def test_fixing_only_the_bug_matches_the_reference_curve(bug_fixed, reference):
    curve = capstone.loss_curve(bug_fixed, reference, W)
    assert curve["passed"], curve["worst_error"]
    assert capstone.causality(bug_fixed, W)["passed"]
    assert not capstone.batches_match(bug_fixed, reference, W)["passed"]


def test_solution_passes_correctness_and_hygiene(reference):
    model = capstone.trained(reference, reference, W)
    for result in (capstone.causality(reference, W), capstone.batches_match(reference, reference, W),
                   capstone.serving_agreement(reference, reference, W, model=model),
                   capstone.deprecations(reference.folder, W), capstone.deterministic_repeat(reference, W),
                   capstone.graph_breaks(reference, W)):
        assert result["passed"], result


def test_solution_is_smaller_and_lighter(reference, start):
    size = capstone.served_size(reference, start, reference, W)
    assert size["passed"] and size["ratio"] < 0.3, size
    peak = capstone.step_memory(reference, start, W)
    assert peak["passed"], peak


@pytest.mark.slow
@pytest.mark.parametrize("goal", ["train_speed", "serve_latency"])
def test_solution_is_faster_in_paired_rounds(reference, start, goal):
    """The solution is never judged slower, on one thread (on a busy machine, two threads each wait on the
    slower one); when the interval clears 1 the goal is passed. Judged once more when the interval was too wide
    to tell. The suite never asserts wall time: a loaded machine may leave the gain within noise (seen: 1.15x
    "within noise" twice, beside the suite's other worker)."""
    for _ in range(2):
        result = getattr(capstone, goal)(reference, start, W, rounds=10, threads_used=1)
        if result["verdict"] != "within noise":
            break
    assert result["verdict"] != "regression", result
    assert result["passed"] == (result["low"] > 1 and result["verdict"] == "improvement"), result


def test_faster_but_nondeterministic_is_rejected(nondeterministic, reference):
    assert not capstone.deterministic_repeat(nondeterministic, W)["passed"]
    assert not capstone.batches_match(nondeterministic, reference, W)["passed"]
    assert capstone.loss_curve(nondeterministic, reference, W)["passed"]     # the model itself is right


def test_smaller_but_inaccurate_is_rejected(coarse, reference, start):
    model = capstone.trained(coarse, reference, W)
    size = capstone.served_size(coarse, start, reference, W, model=model)
    assert size["ratio"] <= size["budget"] and not size["passed"], size
    assert size["loss"] > size["fp32_loss"] * (1 + size["loss_rise_allowed"])
    assert not capstone.serving_agreement(coarse, reference, W, model=model)["passed"]


def test_a_fix_for_the_visible_workload_only_fails_a_hidden_one(visible_only):
    assert capstone.causality(visible_only, W)["passed"]
    assert not capstone.causality(visible_only, capstone.workload(seed=3, seq_len=48))["passed"]
