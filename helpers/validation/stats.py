"""The noise statistic: a paired t interval on the per-round log-gains of B over A, the smallest change it
could have detected, and the rule that calls a regression.

A figure stores one sample per timed call and, once rounds are merged, how many samples each round gave
(its "groups"). The driver (`validate matrix`) makes A's round i and B's round i next to each other in
time (A B, B A, A B, ...), so a slow stretch of the machine hits both runs of a pair. The unit of
evidence is therefore the pair, not the call:

    g_i = stat(A's round i) / stat(B's round i)      for a time (lower is better)
    g_i = stat(B's round i) / stat(A's round i)      for a throughput

so g_i > 1 always means B is better. On the log scale the d_i = log g_i have mean m and standard
deviation s; with k pairs the 95% interval of the gain is exp(m ± t(0.975, k-1) · s / sqrt(k)).

Why a t interval and not a bootstrap over the pairs: with 4 to 8 pairs a bootstrap has few distinct
resamples (35 for 4 pairs), and its percentile interval is too narrow at that size, so it raises false
alarms; t's interval is exact when the log-gains are normal, and it is what was calibrated (A/A false
alarms near 5%, tests/test_validation_stats.py). Why not samples: calls within one round share that
round's slow or quick stretch, so treating them as independent makes the interval far too narrow
between runs, and resampling rounds of each side separately throws the pairing away.

The rule: a figure is a regression (improvement) when the whole interval lies below (above) 1 and the
gain itself is beyond MIN_CHANGE, and its paired t test stays significant after Holm's correction across the
report's distinct figures (family_verdicts): one report, one 5% chance of a false alarm however many figures it
holds (Holm controls the family-wise rate under any dependence between figures; a time and its rate, the same
calls seen twice, count once). Why Holm and not a confirmation run: it needs no second run, and it never flags
less than Bonferroni would. Fewer than two pairs: "cannot tell" (there is no estimate of the
run-to-run noise). A figure that is counted, not timed (peak bytes: stat "exact"), has no noise: beyond
MIN_CHANGE it is a regression or an improvement, else "unchanged". A tail percentile is reported only with enough samples per round for it
(`min_samples`: 1,000 for p99). Each figure also states its detectable change: the smallest true change
that this many pairs, at this noise, would find 80% of the time, so "within noise" can be read.
"""
from __future__ import annotations

import functools
import math

import numpy as np

CONFIDENCE = 0.95
POWER = 0.80
MIN_CHANGE = 0.02     # a change under 2% is never flagged, however tight the interval
MIN_PAIRS = 2


def statistic(samples, stat: str = "median") -> float:
    values = np.asarray(samples, dtype=float)
    if stat in ("median", "exact"):
        return float(np.median(values))
    if stat.startswith("p") and stat[1:].isdigit():
        return float(np.percentile(values, int(stat[1:])))
    raise ValueError(f"unknown statistic {stat!r} (median, p50, p90, p99)")


def gain(a: float, b: float, better: str) -> float:
    """How many times better B is than A: a / b for a time, b / a for a throughput."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' (a time) or 'higher' (a throughput), got {better!r}")
    return a / b if better == "lower" else b / a


def min_samples(stat: str) -> int:
    """Samples per round a statistic needs to be more than its sample's extreme: about ten beyond the
    percentile (p99: 1,000; p90: 100); a median needs one."""
    if stat in ("median", "exact", "p50"):
        return 1
    q = int(stat[1:]) / 100
    return math.ceil(10 / (1 - q) - 1e-9)


def split_rounds(samples, groups: list[int] | None) -> list[list[float]]:
    """The samples of each round, in order (one round when groups is None)."""
    samples = list(samples)
    groups = groups or [len(samples)]
    if sum(groups) != len(samples) or any(n < 1 for n in groups):
        raise ValueError(f"groups {groups} do not add up to the {len(samples)} samples")
    edges = np.cumsum([0] + list(groups))
    return [samples[s:e] for s, e in zip(edges[:-1], edges[1:])]


def _t_cdf(x: float, df: int) -> float:
    """Student's t distribution function, by Simpson's rule on its density (no scipy needed)."""
    if x < 0:
        return 1 - _t_cdf(-x, df)
    grid = np.linspace(0, x, 2001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    dens = np.exp(log_c - (df + 1) / 2 * np.log1p(grid ** 2 / df))
    h = grid[1] - grid[0]
    return 0.5 + h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (bisection; p in (0.5, 1))."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def paired_interval(rounds_a: list[float], rounds_b: list[float], better: str, confidence: float = CONFIDENCE,
                    power: float = POWER) -> dict:
    """The gain of B over A from paired round statistics (A's round i made next to B's round i):
    {"gain", "low", "high", "pairs", "sd_log", "detectable", "round_gains"}. With one pair, low, high,
    sd_log and detectable are None: there is no estimate of the noise between runs."""
    if len(rounds_a) != len(rounds_b) or not rounds_a:
        raise ValueError(f"paired rounds need the same number on each side, got {len(rounds_a)} and {len(rounds_b)}")
    gains = [gain(a, b, better) for a, b in zip(rounds_a, rounds_b)]
    d = np.log(gains)
    k = len(d)
    out = {"gain": float(np.exp(d.mean())), "low": None, "high": None, "pairs": k, "sd_log": None,
           "detectable": None, "round_gains": [float(g) for g in gains]}
    if k < MIN_PAIRS:
        return out
    se = float(d.std(ddof=1)) / math.sqrt(k)
    t = t_quantile(1 - (1 - confidence) / 2, k - 1)
    reach = (t + t_quantile(power, k - 1)) * se
    t_stat = float(d.mean()) / se if se > 0 else math.copysign(math.inf, float(d.mean()) or 1.0)
    p_value = 2 * (1 - _t_cdf(abs(t_stat), k - 1)) if math.isfinite(t_stat) else 0.0
    return out | {"low": float(np.exp(d.mean() - t * se)), "high": float(np.exp(d.mean() + t * se)),
                  "sd_log": float(d.std(ddof=1)), "detectable": max(float(np.expm1(reach)), MIN_CHANGE),
                  "p_value": float(min(max(p_value, 0.0), 1.0))}


def verdict(interval: dict, min_change: float = MIN_CHANGE) -> str:
    """"regression", "improvement", "within noise", or "cannot tell" (fewer than two pairs), from a
    paired_interval result: the whole interval below (above) 1 and the gain beyond min_change."""
    if interval.get("low") is None:
        return "cannot tell"
    if interval["high"] < 1 and interval["gain"] < 1 / (1 + min_change):
        return "regression"
    if interval["low"] > 1 and interval["gain"] > 1 + min_change:
        return "improvement"
    return "within noise"


def rounds_needed(sd_log: float, change: float, alpha: float = 1 - CONFIDENCE, power: float = POWER,
                  most: int = 1000) -> int | None:
    """The fewest pairs of rounds whose paired t test finds a true change of `change` (0.10: 10%) with
    probability `power` at two-sided level `alpha`, at a per-pair spread of sd_log; None beyond `most`."""
    effect = math.log1p(change)
    for k in range(MIN_PAIRS, most + 1):
        if (t_quantile(1 - alpha / 2, k - 1) + t_quantile(power, k - 1)) * sd_log / math.sqrt(k) <= effect:
            return k
    return None


def holm(p_values: list[float], alpha: float = 1 - CONFIDENCE) -> list[bool]:
    """Holm's step-down test: which hypotheses are rejected with a family-wise error rate of at most alpha."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


def family_verdicts(intervals: list[dict], min_change: float = MIN_CHANGE) -> list[str]:
    """The verdict of each of a report's distinct figures (paired_interval results): its own verdict, kept as a
    regression or an improvement only if Holm's test across the figures that could be told still rejects it."""
    own = [verdict(i, min_change) for i in intervals]
    told = [j for j, i in enumerate(intervals) if i.get("p_value") is not None]
    kept = dict(zip(told, holm([intervals[j]["p_value"] for j in told])))
    return [v if v not in ("regression", "improvement") or kept.get(j) else "within noise" for j, v in enumerate(own)]


def compare_figure(samples_a, samples_b, better: str, stat: str = "median", groups_a: list[int] | None = None,
                   groups_b: list[int] | None = None, min_change: float = MIN_CHANGE) -> dict:
    """One figure of A against B: the paired interval over rounds, the verdict, and why when there is
    none. {"gain", "low", "high", "pairs", "detectable", "round_gains", "status", "why", "stat"}."""
    if stat == "exact":                                 # counted, not timed (bytes): no noise to estimate
        g = gain(statistic(samples_a), statistic(samples_b), better)
        status = ("regression" if g < 1 / (1 + min_change) else "improvement" if g > 1 + min_change else "unchanged")
        return {"stat": stat, "gain": g, "low": None, "high": None, "pairs": None, "detectable": None,
                "round_gains": None, "status": status, "why": "an exact figure: no noise, the floor alone decides"}
    ra, rb = split_rounds(samples_a, groups_a), split_rounds(samples_b, groups_b)
    fewest = min(len(r) for r in ra + rb)
    if fewest < min_samples(stat):
        return {"stat": stat, "gain": None, "low": None, "high": None, "pairs": None, "detectable": None,
                "round_gains": None, "status": "not reported",
                "why": f"{stat} needs at least {min_samples(stat)} samples per round, the fewest here is {fewest}"}
    if len(ra) != len(rb):
        ra, rb = [sum(ra, [])], [sum(rb, [])]           # rounds that cannot be paired: one per side
    interval = paired_interval([statistic(r, stat) for r in ra], [statistic(r, stat) for r in rb], better)
    status = verdict(interval, min_change)
    why = ("one round per side: the noise between runs is unknown; compare interleaved rounds (`validate matrix`, "
           "or rounds made alternately: A1.json,A2.json B1.json,B2.json)" if status == "cannot tell" else "")
    return interval | {"stat": stat, "status": status, "why": why}


RULE = (f"gain of B over A per figure: the geometric mean of its per-round gains (A's round i against B's round "
        f"i, made next to each other), with a {int(CONFIDENCE * 100)}% paired t interval on their logarithms; a "
        f"regression (improvement) when the whole interval lies below (above) 1 and the gain is beyond "
        f"{MIN_CHANGE:.0%}, and its paired t test significant after Holm's correction across the report's "
        f"distinct figures (a time and its rate count once): at most a {1 - CONFIDENCE:.0%} chance that an "
        f"A/A report flags anything; 'cannot tell' with fewer than {MIN_PAIRS} pairs of rounds; a percentile reported "
        f"only with enough samples per round (p99: {min_samples('p99')}); 'detectable': the smallest change "
        f"these pairs would find {int(POWER * 100)}% of the time at their noise")
