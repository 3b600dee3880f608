"""The one benchmarking helper every lesson uses.

    result = compare({"eager": f, "compiled": g}, baseline="eager", device=DEVICE)
    print(table(result)); save_json(result, "bench.json"); plot(result).show()

Candidates are timed interleaved (A, B, A, B, ... in rotating order) with torch.utils.benchmark and an
explicit thread count, after warm-up. `device` is required: it is the device whose work is timed, and it
is written into the result and the table. On an accelerator the clock waits for the device at the start
and end of each timed block of calls (never inside one), so queued kernels are counted and launches
still overlap, as torch.utils.benchmark does for CUDA.
Each repeat gives one per-call time; the result holds the median and spread of the repeats and the
ratio of every candidate to the baseline. Speed is reported, never asserted.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import time
import timeit
from pathlib import Path
from typing import Callable

import torch
import torch.utils.benchmark as tbench

from helpers.device import SECTIONS, capabilities, pick_device, synchronize
from helpers.env import FIGURES_LOG_ENV
from helpers.files import write_text_atomic


def _clock(device: torch.device) -> Callable[[], float]:
    """timeit's clock, after waiting for the device's queued work (the CPU's clock as it is)."""
    if device.type == "cpu":
        return timeit.default_timer
    def synchronized_clock() -> float:
        synchronize(device)
        return timeit.default_timer()
    return synchronized_clock


def compare(candidates: dict[str, Callable[[], object]], *, baseline: str | None = None,
            repeats: int = 5, min_run_time: float = 0.1, warmup: int = 2,
            threads: int | None = None, device: torch.device | str,
            work: float | None = None, work_unit: str = "GFLOP") -> dict:
    """Time each zero-argument callable on `device` (where its tensors live); return a JSON-ready dict.

    work: the amount of work one call does (e.g. GFLOP or GB); adds a throughput per candidate.
    """
    if not candidates:
        raise ValueError("compare() needs at least one candidate")
    baseline = baseline or next(iter(candidates))
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not one of {list(candidates)}")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    device = torch.device(device)
    threads = threads or torch.get_num_threads()
    timers = {}
    for name, fn in candidates.items():
        for _ in range(warmup):
            fn()
        if device.type != "cpu":
            synchronize(device)
        timers[name] = tbench.Timer(stmt="run()", globals={"run": fn}, num_threads=threads,
                                    label=name, timer=_clock(device))
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]   # rotate so no one always goes first
        for name in order:
            samples[name].append(timers[name].blocked_autorange(min_run_time=min_run_time).median)
    base = statistics.median(samples[baseline])
    results = {}
    for name, times in samples.items():
        med = statistics.median(times)
        q = statistics.quantiles(times, n=4) if len(times) > 1 else [med, med, med]
        entry = {"median_s": med, "min_s": min(times), "max_s": max(times), "iqr_s": q[2] - q[0],
                 "repeats_s": times, "ratio_to_baseline": base / med}
        if work is not None:
            entry[f"{work_unit}_per_s"] = work / med
        results[name] = entry
    result = {"baseline": baseline, "threads": threads, "device": str(device), "repeats": repeats,
              "torch": torch.__version__, "machine": _machine_summary(), "results": results}
    _log_figures(result)
    return result


NOISY = "too noisy here to tell; run again or use fewer threads"   # what a reveal says when the spreads cannot tell


def speedup_range(results: dict, baseline: str, candidate: str) -> tuple[float, float]:
    """The lowest and highest speed-up of `candidate` over `baseline` the repeats allow (results: a compare's
    "results"): the baseline's fastest over the candidate's slowest, and its slowest over the candidate's fastest."""
    base, cand = results[baseline], results[candidate]
    return base["min_s"] / cand["max_s"], base["max_s"] / cand["min_s"]


def separated(result: dict, a: str, b: str) -> bool:
    """Whether two candidates' times did not overlap over the repeats (one's slowest repeat beat the
    other's fastest): a ratio between overlapping candidates is too close to call on this run."""
    ra, rb = result["results"][a], result["results"][b]
    return ra["max_s"] < rb["min_s"] or rb["max_s"] < ra["min_s"]




def _log_figures(result: dict) -> None:
    """When LABS_FIGURES_LOG names a file (the batch runner sets it), append the result to it as one JSON
    line with the lesson section it was measured in: how a run's figures reach its record."""
    log = os.environ.get(FIGURES_LOG_ENV)
    if log:
        section = SECTIONS[-1]["section"] if SECTIONS and SECTIONS[-1]["ran"] else None
        with open(log, "a") as f:
            f.write(json.dumps({"section": section, **result}) + "\n")


def _machine_summary() -> dict:
    c = capabilities()
    return {"accelerator": c.accelerator, "device_name": c.device_name, "arch": c.arch,
            "cpu": c.cpu_name, "cpu_count": c.cpu_count}


def timed_on(result: dict) -> str:
    """What a result timed, in words: "cpu (2 threads)" or "cuda:0 (NVIDIA H200)"."""
    m = result["machine"]
    if result["device"].startswith("cpu"):
        return f"cpu ({result['threads']} threads, {m['cpu']})"
    return f"{result['device']} ({m['device_name']})"


def table(result: dict) -> str:
    """A plain-text table: median, spread, and speed relative to the baseline; a ratio whose spread overlaps
    the baseline's is marked as a tie on this run (its direction cannot be read from it)."""
    base = result["baseline"]
    rows = [f"timed on {timed_on(result)}",
            f"{'candidate':<28}{'median':>12}{'spread (min-max)':>24} {'vs ' + base:>13}"]
    for name, r in result["results"].items():
        tie = "  (spreads overlap: a tie here)" if name != base and not separated(result, name, base) else ""
        rows.append(f"{name:<28}{_fmt(r['median_s']):>12}{_fmt(r['min_s']) + ' - ' + _fmt(r['max_s']):>24}"
                    f"{r['ratio_to_baseline']:>13.2f}x{tie}")
    return "\n".join(rows)


def _fmt(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def save_json(result: dict, path: str | os.PathLike) -> Path:
    """Write atomically (temporary file, then rename)."""
    return write_text_atomic(json.dumps(result, indent=2), path)


def plot(result: dict, title: str = "Median time per call (error bars: min to max over repeats)"):
    """A plotly bar chart of the medians with min-max error bars."""
    import plotly.graph_objects as go
    names = list(result["results"])
    med = [result["results"][n]["median_s"] * 1e3 for n in names]
    fig = go.Figure(go.Bar(
        x=names, y=med,
        error_y=dict(type="data", symmetric=False,
                     array=[result["results"][n]["max_s"] * 1e3 - m for n, m in zip(names, med)],
                     arrayminus=[m - result["results"][n]["min_s"] * 1e3 for n, m in zip(names, med)]),
        text=[f"{result['results'][n]['ratio_to_baseline']:.2f}x" for n in names], textposition="outside"))
    fig.update_layout(title=title, yaxis_title="ms per call (lower is better)", height=380)
    return fig


# --- This machine's limits -------------------------------------------------------------------

LIMITS_CACHE = Path(os.environ.get("LABS_CACHE", Path.home() / ".cache" / "pytorch-210-labs")) / "limits.json"


def measure_limits(threads: int | None = None, *, device: torch.device | str, quick: bool = False) -> dict:
    """Measure memory read bandwidth (GB/s, a sum over a large fp32 tensor) and fp32 GEMM peak
    (GFLOP/s, square matmul) on `device`, with the given thread count: the medians of the repeats, and
    each one's range over them ("..._range": slowest repeat, fastest repeat)."""
    device = torch.device(device)
    threads = threads or torch.get_num_threads()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n_bytes = (64 if quick else 512) * 2**20 if device.type == "cpu" else 2 * 2**30
        x = torch.ones(n_bytes // 4, device=device)
        n = 1024 if quick or device.type == "cpu" else 8192
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        result = compare({"read": lambda: x.sum(), "gemm": lambda: a @ b}, repeats=3 if quick else 5,
                         threads=threads, device=device)
    finally:
        torch.set_num_threads(old_threads)
    read, gemm = result["results"]["read"], result["results"]["gemm"]
    return {"device": str(device), "threads": threads, "torch": torch.__version__,
            "read_bandwidth_gbs": n_bytes / read["median_s"] / 1e9,
            "fp32_gemm_gflops": 2 * n**3 / gemm["median_s"] / 1e9,
            "read_bandwidth_gbs_range": [n_bytes / read["max_s"] / 1e9, n_bytes / read["min_s"] / 1e9],
            "fp32_gemm_gflops_range": [2 * n**3 / gemm["max_s"] / 1e9, 2 * n**3 / gemm["min_s"] / 1e9],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "quick": quick}


@functools.cache
def machine_limits(threads: int | None = None, *, device: str) -> dict:
    """This machine's limits on `device`, measured once and cached on disk per device, thread count and
    torch."""
    dev = str(torch.device(device))
    threads = threads or torch.get_num_threads()
    name = capabilities().cpu_name if dev == "cpu" else capabilities().device_name
    key = f"{name}|{dev}|{threads}|{torch.__version__}"
    cache = json.loads(LIMITS_CACHE.read_text()) if LIMITS_CACHE.exists() else {}
    if "fp32_gemm_gflops_range" not in cache.get(key, {}):     # absent, or cached before the ranges were kept
        cache[key] = measure_limits(threads=threads, device=dev)
        save_json(cache, LIMITS_CACHE)
    return cache[key]


def percent_of_limit(value: float, limit: float) -> float:
    return 100.0 * value / limit


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench bench`: this machine's limits on its default device, freshly measured."""
    return measure_limits(quick=quick, device=pick_device())
