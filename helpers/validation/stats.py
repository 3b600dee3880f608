"""The noise statistic: a percentile-bootstrap interval of the ratio of two runs' statistic (median or a
percentile) over their per-call samples.

A figure stores every sample (one timed call each, candidates interleaved call by call). For A vs B the
gain is stat(A) / stat(B) for a time (lower is better) and stat(B) / stat(A) for a throughput, so a gain
above 1 always means B is better. Resampling both sample sets with replacement N_BOOT times gives the
distribution of that gain; its 2.5th and 97.5th percentiles are the 95% interval. A change is a
regression (or improvement) only when the whole interval lies below (above) 1 and the gain itself is
beyond MIN_CHANGE: an interval that contains 1 is noise.

Caveat, stated in the report: the bootstrap treats the samples as independent. Samples taken one after
another on a busy machine are not quite, so the driver interleaves whole runs (A, B, A, B) and pools
them, which spreads slow periods over both sides.
"""
from __future__ import annotations

import numpy as np

N_BOOT = 2000
CONFIDENCE = 0.95
MIN_CHANGE = 0.02     # a change under 2% is never flagged, however tight the interval


def statistic(samples, stat: str = "median") -> float:
    values = np.asarray(samples, dtype=float)
    if stat == "median":
        return float(np.median(values))
    if stat.startswith("p") and stat[1:].isdigit():
        return float(np.percentile(values, int(stat[1:])))
    raise ValueError(f"unknown statistic {stat!r} (median, p50, p90, p99)")


def gain(a: float, b: float, better: str) -> float:
    return a / b if better == "lower" else b / a


def bootstrap_gain(samples_a, samples_b, better: str, stat: str = "median", n_boot: int = N_BOOT,
                   confidence: float = CONFIDENCE, seed: int = 0) -> dict:
    """{"gain", "low", "high", "stat", "n_boot", "confidence"}: the gain of B over A and its interval."""
    a, b = np.asarray(samples_a, dtype=float), np.asarray(samples_b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("both runs need at least one sample")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, len(a), size=(n_boot, len(a)))
    ib = rng.integers(0, len(b), size=(n_boot, len(b)))
    if stat == "median":
        sa, sb = np.median(a[ia], axis=1), np.median(b[ib], axis=1)
    else:
        q = int(stat[1:])
        sa, sb = np.percentile(a[ia], q, axis=1), np.percentile(b[ib], q, axis=1)
    gains = sa / sb if better == "lower" else sb / sa
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(gains, [tail, 100 - tail])
    return {"gain": gain(statistic(a, stat), statistic(b, stat), better), "low": float(low), "high": float(high),
            "stat": stat, "n_boot": n_boot, "confidence": confidence, "n_a": len(a), "n_b": len(b)}


def verdict(interval: dict, min_change: float = MIN_CHANGE) -> str:
    """"regression", "improvement" or "within noise" from a bootstrap_gain result."""
    if interval["high"] < 1 and interval["gain"] < 1 / (1 + min_change):
        return "regression"
    if interval["low"] > 1 and interval["gain"] > 1 + min_change:
        return "improvement"
    return "within noise"
