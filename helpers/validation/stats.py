"""The noise statistic: a percentile-bootstrap interval of the ratio of two runs' statistic (median or a
percentile) over their per-call samples; two-level when a run is made of several rounds.

A figure stores every sample (one timed call each, candidates interleaved call by call). For A vs B the
gain is stat(A) / stat(B) for a time (lower is better) and stat(B) / stat(A) for a throughput, so a gain
above 1 always means B is better. Resampling both sample sets with replacement N_BOOT times gives the
distribution of that gain; its 2.5th and 97.5th percentiles are the 95% interval. A change is a
regression (or improvement) only when the whole interval lies below (above) 1 and the gain itself is
beyond MIN_CHANGE: an interval that contains 1 is noise.

Samples taken one after another on a busy machine are not independent: another process that takes a
core for half a minute slows a whole stretch of them. So the driver interleaves whole runs (A B, B A,
A B) and keeps which round each sample came from (a figure's "groups": samples per round), and the
bootstrap is then two-level: each resample first draws rounds with replacement, then samples within the
drawn rounds. A slow stretch that hit one round of one side widens the interval instead of becoming a
"regression"; a change seen in every round keeps it narrow. With one round per side it is the plain
bootstrap. And with rounds, a change is a finding only if every pair of rounds (A's round i against B's
round i, made next to each other) shows it in the same direction.
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


def _resample_index(n: int, groups: list[int] | None, rng, n_boot: int) -> np.ndarray:
    """(n_boot, n) indices: plain bootstrap, or two-level when groups (samples per round) has 2+ rounds."""
    if not groups or len(groups) < 2:
        return rng.integers(0, n, size=(n_boot, n))
    sizes = np.asarray(groups)
    if sizes.sum() != n or (sizes < 1).any():
        raise ValueError(f"groups {groups} do not add up to the {n} samples")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    k = len(sizes)
    drawn = rng.integers(0, k, size=(n_boot, k))                           # rounds, with replacement
    which = np.take_along_axis(drawn, rng.integers(0, k, size=(n_boot, n)), axis=1)
    return starts[which] + (rng.random((n_boot, n)) * sizes[which]).astype(int)


def bootstrap_gain(samples_a, samples_b, better: str, stat: str = "median", n_boot: int = N_BOOT,
                   confidence: float = CONFIDENCE, seed: int = 0, groups_a: list[int] | None = None,
                   groups_b: list[int] | None = None) -> dict:
    """{"gain", "low", "high", "stat", "n_boot", "confidence", "n_a", "n_b", "levels"}: the gain of B over A
    and its interval. groups_a / groups_b: samples per round, for the two-level bootstrap."""
    a, b = np.asarray(samples_a, dtype=float), np.asarray(samples_b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("both runs need at least one sample")
    rng = np.random.default_rng(seed)
    ia = _resample_index(len(a), groups_a, rng, n_boot)
    ib = _resample_index(len(b), groups_b, rng, n_boot)
    if stat == "median":
        sa, sb = np.median(a[ia], axis=1), np.median(b[ib], axis=1)
    else:
        q = int(stat[1:])
        sa, sb = np.percentile(a[ia], q, axis=1), np.percentile(b[ib], q, axis=1)
    gains = sa / sb if better == "lower" else sb / sa
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(gains, [tail, 100 - tail])
    return {"gain": gain(statistic(a, stat), statistic(b, stat), better), "low": float(low), "high": float(high),
            "stat": stat, "n_boot": n_boot, "confidence": confidence, "n_a": len(a), "n_b": len(b),
            "levels": 2 if (groups_a and len(groups_a) > 1) or (groups_b and len(groups_b) > 1) else 1}


def round_gains(samples_a, samples_b, groups_a, groups_b, better: str, stat: str = "median") -> list[float] | None:
    """The gain round by round (A's round i against B's round i, made next to each other in time), when
    both runs have the same number (2+) of rounds; else None."""
    if not groups_a or not groups_b or len(groups_a) != len(groups_b) or len(groups_a) < 2:
        return None
    out, ia, ib = [], 0, 0
    for na, nb in zip(groups_a, groups_b):
        out.append(gain(statistic(samples_a[ia:ia + na], stat), statistic(samples_b[ib:ib + nb], stat), better))
        ia, ib = ia + na, ib + nb
    return out


def verdict(interval: dict, min_change: float = MIN_CHANGE, per_round: list[float] | None = None) -> str:
    """"regression", "improvement" or "within noise" from a bootstrap_gain result: the interval excludes 1,
    the gain is beyond min_change, and (with rounds) every round shows the change in the same direction."""
    if interval["high"] < 1 and interval["gain"] < 1 / (1 + min_change) and all(g < 1 for g in per_round or []):
        return "regression"
    if interval["low"] > 1 and interval["gain"] > 1 + min_change and all(g > 1 for g in per_round or []):
        return "improvement"
    return "within noise"
