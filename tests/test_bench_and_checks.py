"""bench.compare's result shape and ratios; lab checks pass and fail with hints."""
import json
import time

import pytest
import torch

from helpers import bench
from helpers.checks import CheckFailed, check_close, check_equal, check_raises, check_tensor


def test_compare_reports_medians_spread_and_ratios(tmp_path):
    result = bench.compare({"slow": lambda: time.sleep(0.002), "fast": lambda: None},
                           baseline="slow", repeats=3, min_run_time=0.01, work=1.0, device="cpu")
    slow, fast = result["results"]["slow"], result["results"]["fast"]
    assert result["threads"] == torch.get_num_threads() and result["baseline"] == "slow"
    assert len(slow["repeats_s"]) == 3 and slow["min_s"] <= slow["median_s"] <= slow["max_s"]
    assert slow["median_s"] >= 0.002
    assert slow["ratio_to_baseline"] == 1.0 and fast["ratio_to_baseline"] > 10
    assert fast["GFLOP_per_s"] == pytest.approx(1.0 / fast["median_s"])
    path = bench.save_json(result, tmp_path / "out" / "r.json")
    assert json.loads(path.read_text())["results"]["fast"]["median_s"] == fast["median_s"]
    assert "slow" in bench.table(result) and bench.plot(result).data[0].x == ("slow", "fast")
    assert bench.table(result).startswith(f"timed on cpu ({result['threads']} threads")


def test_compare_requires_the_device_it_times():
    with pytest.raises(TypeError, match="device"):
        bench.compare({"a": lambda: None})


def test_accelerator_timing_waits_for_the_device_per_block_not_per_call(monkeypatch):
    syncs, calls = [], []
    monkeypatch.setattr(bench, "synchronize", lambda device: syncs.append(str(device)))
    result = bench.compare({"a": lambda: calls.append(1)}, repeats=2, min_run_time=0.01, warmup=1,
                           device="cuda")
    assert result["device"] == "cuda" and set(syncs) == {"cuda"}
    assert len(calls) > 100 and len(syncs) < len(calls) / 10      # a block of many calls per pair of waits
    assert bench.table(result).startswith("timed on cuda (")


def test_cpu_timing_never_touches_an_accelerator(monkeypatch):
    monkeypatch.setattr(bench, "synchronize", lambda device: pytest.fail("synchronized a CPU timing"))
    bench.compare({"a": lambda: None}, repeats=1, min_run_time=0.001, device="cpu")


def test_compare_uses_the_thread_count_it_is_given():
    seen = []
    bench.compare({"a": lambda: seen.append(torch.get_num_threads())}, threads=1, repeats=1, min_run_time=0.001,
                  device="cpu")
    assert set(seen[2:]) == {1}       # after the warm-up calls, the Timer's own thread setting applies


@pytest.mark.parametrize("kwargs, text", [({}, "at least one"), ({"baseline": "zz"}, "baseline"),
                                          ({"repeats": 0}, "repeats")])
def test_compare_rejects_bad_arguments(kwargs, text):
    candidates = {} if not kwargs else {"a": lambda: None}
    with pytest.raises(ValueError, match=text):
        bench.compare(candidates, device="cpu", **kwargs)


def test_measured_limits_are_plausible():
    limits = bench.measure_limits(quick=True, device="cpu")
    assert 0.5 < limits["read_bandwidth_gbs"] < 5000 and 1 < limits["fp32_gemm_gflops"] < 1e6
    for name in ("read_bandwidth_gbs", "fp32_gemm_gflops"):
        slowest, fastest = limits[f"{name}_range"]
        assert slowest <= limits[name] <= fastest


def test_cached_limits_without_their_range_are_measured_again(tmp_path, monkeypatch):
    fresh = {"fp32_gemm_gflops": 2.0, "fp32_gemm_gflops_range": [1.0, 3.0]}
    monkeypatch.setattr(bench, "measure_limits", lambda **kwargs: fresh)
    monkeypatch.setattr(bench, "LIMITS_CACHE", tmp_path / "limits.json")
    caps = bench.capabilities()
    key = f"{caps.cpu_name}|cpu|1|{torch.__version__}"
    bench.save_json({key: {"fp32_gemm_gflops": 9.0}}, bench.LIMITS_CACHE)     # cached before ranges were kept
    assert bench.machine_limits.__wrapped__(1, device="cpu") == fresh
    assert json.loads(bench.LIMITS_CACHE.read_text())[key] == fresh


def test_check_close_passes_and_prints(capsys):
    check_close(torch.ones(3), torch.ones(3), what="ex")
    assert "✅ ex: passed" in capsys.readouterr().out


@pytest.mark.parametrize("actual, problem", [
    (None, "expected a torch.Tensor, got NoneType"),
    (torch.ones(3, 2), "shape (3, 2), expected (2, 3)"),
    (torch.ones(2, 3, dtype=torch.float64), "dtype torch.float64, expected torch.float32"),
    (torch.full((2, 3), float("nan")), "NaN values"),
    (torch.ones(2, 3) * 1.1, "6 of 6 values differ (first at index (0, 0): got 1.1"),
])
def test_check_close_fails_with_what_was_wrong(actual, problem):
    with pytest.raises(CheckFailed) as info:
        check_close(actual, torch.ones(2, 3), what="Exercise 9")
    assert problem in str(info.value) and "Exercise 9" in str(info.value) and "Hint:" in str(info.value)


def test_check_close_shows_digits_that_differ():
    """A float64 value off by a float32 rounding shows as two different numbers, with the dtype."""
    with pytest.raises(CheckFailed) as info:
        check_close(torch.tensor([-0.05235551], dtype=torch.float64), torch.tensor([-0.0523555], dtype=torch.float64),
                    what="Exercise 9", atol=1e-10, rtol=1e-10)
    assert "got -0.05235551, expected -0.0523555 in torch.float64" in str(info.value)


def test_check_equal_and_raises():
    check_equal(3, 3, what="int")
    with pytest.raises(CheckFailed, match="got 2, expected 3"):
        check_equal(2, 3, what="int")
    with pytest.raises(CheckFailed, match="1 of 3 values differ"):
        check_equal(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]), what="t")
    check_raises(lambda: int("x"), ValueError, what="raises")
    with pytest.raises(CheckFailed, match="did not raise ValueError"):
        check_raises(lambda: 1, ValueError, what="quiet")
    with pytest.raises(CheckFailed, match="does not mention 'weight'"):
        check_raises(lambda: int("x"), ValueError, match="weight", what="message")
    with pytest.raises(CheckFailed, match="raised KeyError"):
        check_raises(lambda: {}["k"], ValueError, what="wrong kind")
    with pytest.raises(CheckFailed):
        check_tensor([1.0], torch.ones(1), what="list")


def test_results_reach_the_figures_log_with_their_section(tmp_path, monkeypatch, capsys):
    from helpers import device
    log = tmp_path / "figures.jsonl"
    monkeypatch.setenv("LABS_FIGURES_LOG", str(log))
    monkeypatch.setattr(device, "SECTIONS", [])
    monkeypatch.setattr(bench, "SECTIONS", device.SECTIONS)
    bench.compare({"a": lambda: None}, repeats=1, min_run_time=0.001, device="cpu")
    device.SECTIONS.append({"section": "On this CPU", "needs": ["cxx"], "ran": True, "reason": None})
    bench.compare({"b": lambda: None}, repeats=1, min_run_time=0.001, device="cpu")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(f["section"], list(f["results"])) for f in lines] == [(None, ["a"]), ("On this CPU", ["b"])]


def test_your_turn_reports_not_yet_without_stopping_the_lesson(capsys):
    from helpers.checks import check_equal, your_turn
    assert your_turn(lambda: check_equal(3, 4, what="the size", hint="try a power of two"), what="the size") is False
    out = capsys.readouterr().out
    assert "Not yet." in out and "try a power of two" in out
    assert your_turn(lambda: check_equal(4, 4, what="the size"), what="the size") is True
    assert "done" in capsys.readouterr().out


def test_separated_tells_overlapping_spreads_from_distinct_ones():
    from helpers.bench import separated
    result = {"results": {"a": {"min_s": 1.0, "max_s": 2.0}, "b": {"min_s": 1.5, "max_s": 3.0},
                          "c": {"min_s": 2.5, "max_s": 4.0}}}
    assert not separated(result, "a", "b") and not separated(result, "b", "c")
    assert separated(result, "a", "c") and separated(result, "c", "a")


def test_speedup_range_spans_what_the_repeats_allow():
    results = {"loop": {"min_s": 2.0, "max_s": 3.0}, "foreach": {"min_s": 1.0, "max_s": 1.5}}
    assert bench.speedup_range(results, "loop", "foreach") == (2.0 / 1.5, 3.0)


def test_table_marks_a_ratio_whose_spread_overlaps_the_baselines_as_a_tie():
    result = {"baseline": "a", "device": "cpu", "threads": 1, "machine": {"cpu": "a CPU"},
              "results": {"a": {"median_s": 1.0, "min_s": 0.9, "max_s": 1.1, "ratio_to_baseline": 1.0},
                          "b": {"median_s": 0.95, "min_s": 0.8, "max_s": 1.0, "ratio_to_baseline": 1.05},
                          "c": {"median_s": 0.5, "min_s": 0.45, "max_s": 0.55, "ratio_to_baseline": 2.0}}}
    rows = {line.split()[0]: line for line in bench.table(result).splitlines()[2:]}
    assert "a tie here" in rows["b"] and "a tie here" not in rows["c"] and "a tie here" not in rows["a"]
