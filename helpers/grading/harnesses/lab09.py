"""Lab 09 (migration): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import math


from helpers.grading.recorder import _in_library, _unrecorded
from helpers.grading.judge import plain_name


INTERVAL_RTOL = 2e-4   # a t read from a printed table to 3 decimals moves an end by under 1e-4 in the lab's cases;
                       # each mistake named below moves one by 9e-4 or more


def interval_named(fn, rounds_a, rounds_b, better) -> tuple[str, float, float]:
    """fn's 95% interval as (what it is, low, high): "the 95% t interval on the paired log-gains" when its ends
    are that interval's, else the usual mistake nearest to them (each changes one ingredient), else "another
    interval". The grader compares all three with the reference's, so the ends decide, not these words."""
    import numpy as np

    from helpers.validation import stats
    _, low, high = fn(rounds_a, rounds_b, better)
    low, high = float(low), float(high)
    medians_a, medians_b = ([float(np.median(r)) for r in rounds] for rounds in (rounds_a, rounds_b))
    right = _unrecorded(lambda: stats.paired_interval(medians_a, medians_b, better))
    d = np.log(right["round_gains"])
    k = len(d)
    t = stats.t_quantile(0.975, k - 1)
    spread = right["sd_log"] / math.sqrt(k)

    def distance(ends):   # the larger relative difference of the two ends
        return max(abs(got - want) / abs(want) for got, want in zip((low, high), ends))

    def around_the_mean(half):
        return math.exp(d.mean() - half), math.exp(d.mean() + half)

    if distance((right["low"], right["high"])) <= INTERVAL_RTOL:
        return "the 95% t interval on the paired log-gains", low, high
    mistakes = {
        "an interval with the normal quantile 1.96: the noise's spread is estimated from only k pairs, which the "
        "normal quantile ignores": 1.96 * spread,
        "an interval whose standard deviation divides by k: with k pairs that understates the noise":
            t * float(d.std(ddof=0)) / math.sqrt(k),
        "an interval with Student's t at k degrees of freedom: one too many, as the spread is taken around a mean "
        "estimated from the same k pairs": stats.t_quantile(0.975, k) * spread,
        "an interval with t's 95% quantile: that interval covers 90%": stats.t_quantile(0.95, k - 1) * spread,
        "an interval from each side's spread on its own: a slow stretch shared by a pair stays in it":
            t * math.sqrt((np.log(medians_a).var(ddof=1) + np.log(medians_b).var(ddof=1)) / k),
    }
    gaps = {words: distance(around_the_mean(half)) for words, half in mistakes.items()}
    nearest = min(gaps, key=gaps.get)
    # 1e-4: 1.96 or 1.959964, a t read from a table
    return (nearest if gaps[nearest] <= 1e-4 else "another interval"), low, high


def own_value_error(fn, *args, **kwargs) -> str:
    """How fn refuses input it must refuse: "its own ValueError" when the ValueError is raised in the
    learner's code, else what happened instead: no error, another error, or a ValueError from inside a library
    it called (stats.t_quantile on 0 degrees of freedom is not a check of the learner's). A ValueError raised
    by C code (math.sqrt(-1)) has no frame of its own and counts as the learner's."""
    try:
        fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except ValueError as exc:
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        if _in_library(code.co_filename):
            return f"a ValueError raised inside {plain_name(code.co_name)}, not by a check of its own"
        return "its own ValueError"
    except Exception as exc:   # noqa: BLE001 (the wrong kind of error is this case's answer)
        if type(exc).__name__ == "CellTimeout":
            raise
        return plain_name(type(exc).__name__) + ", not a ValueError"
    return "no error"


def own_workload(fn, what: str, samples: int) -> str:
    """One property of a workload function, in words (`labcheck.workload_property`)."""
    from helpers.validation import labcheck
    return labcheck.workload_property(fn, what, samples)


def paired_interval(rounds_a, rounds_b, better) -> tuple[float, float, float]:
    """Exercise 1's function, right: what the grader runs in its place while it grades exercise 7
    (Exercise.substitutes), so a mistake in exercise 1 costs marks there only."""
    import numpy as np

    from helpers.validation import stats
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError(f"pairs need the same number of rounds on each side, at least two; got {len(rounds_a)} "
                         f"and {len(rounds_b)}")
    r = stats.paired_interval([float(np.median(x)) for x in rounds_a], [float(np.median(x)) for x in rounds_b],
                              better)
    return r["gain"], r["low"], r["high"]


# --- exercise 7: what a report allows across the board --------------------------------------------------

BOARD_KEYS = ("claim", "gain", "low", "high")
BOARD_GAIN = "the geometric mean of the distinct timed figures' gains, each figure once"
BOARD_INTERVAL = "the 95% interval of that gain, with the noise each round shares across the figures"


def board_figures(report: dict):
    """The distinct timed figures a report could tell (an interval; a rate seen as the same calls as a time
    left out) and their per-pair log-gains, figures by pairs."""
    import numpy as np
    told = [r for r in report["rows"] if r.get("low") is not None and not r.get("same_as")]
    return told, np.log(np.array([r["round_gains"] for r in told], dtype=float))


def _board_result(fn, report) -> dict | str:
    """fn's answer, or what is wrong with its shape."""
    result = fn(report)
    if not isinstance(result, dict) or set(result) != set(BOARD_KEYS):
        got = sorted(result) if isinstance(result, dict) else type(result).__name__
        return f"a dict with the keys {list(BOARD_KEYS)} (got {got})"
    return result


def _nearest(value: float, candidates: dict, tolerance: float) -> str | None:
    gaps = {words: abs(value - want) / abs(want) for words, want in candidates.items() if want and math.isfinite(want)}
    nearest = min(gaps, key=gaps.get, default=None)
    return nearest if nearest is not None and gaps[nearest] <= tolerance else None


def board_gain_named(fn, report) -> tuple[str, float]:
    """fn's pooled gain as (what it is, gain): BOARD_GAIN when it is, else the usual mistake it matches (which
    rows enter, how each weighs, which way round), else "another gain"."""
    import numpy as np
    result = _board_result(fn, report)
    if isinstance(result, str):
        return result, float("nan")
    gain = float(result["gain"])
    told, logs = board_figures(report)
    right = math.exp(logs.mean())
    if abs(gain - right) <= 1e-6 * right:
        return BOARD_GAIN, gain
    rows = report["rows"]
    twins = [r for r in rows if r.get("low") is not None]
    with_gain = [r for r in rows if r.get("gain") is not None and not r.get("same_as")]
    flip = [(-1 if r["better"] == "lower" else 1) * np.log(r["round_gains"]) for r in told]
    se2 = logs.var(axis=1, ddof=1) / logs.shape[1]
    weights = 1 / np.maximum(se2, 1e-300)
    mistakes = {
        "a time and its rate both counted: the same calls weigh twice": math.exp(np.mean(
            [np.log(r["round_gains"]).mean() for r in twins])),
        "the gains of the times turned over: a report's gain is already B over A for a time as for a rate":
            math.exp(np.mean([f.mean() for f in flip])),
        "every gain turned over: a report's gain is above 1 when B is the better one": 1 / right,
        "figures weighted by how tight their own intervals are: each distinct figure was to weigh the same":
            math.exp(float((weights * logs.mean(axis=1)).sum() / weights.sum())),
        "the arithmetic mean of the figures' gains, not their geometric mean":
            float(np.mean([r["gain"] for r in told])),
        "figures the report could not time per pair of rounds counted too (an exact count of bytes, a single "
        "pair)": math.exp(np.mean([np.log(r["gain"]) for r in with_gain])),
        "every rate left out: a rate is the same calls as a time only where its row says so (same_as)":
            math.exp(np.mean([f.mean() for r, f in zip(told, logs) if r["better"] == "lower"] or [np.nan])),
    }
    return _nearest(gain, mistakes, 1e-6) or "another gain", gain


def board_interval_named(fn, report) -> tuple[str, float, float]:
    """fn's pooled interval as (what it is, low, high): BOARD_INTERVAL when its ends are that interval's, else
    the usual mistake nearest to them (each treats the evidence otherwise), else "another interval". The
    grader compares all three with the reference's, so the ends decide, not these words."""
    import numpy as np

    from helpers.validation import stats
    result = _board_result(fn, report)
    if isinstance(result, str):
        return result, float("nan"), float("nan")
    low, high = float(result["low"]), float(result["high"])
    told, logs = board_figures(report)
    m, k = logs.shape
    centre = float(logs.mean())
    per_round = logs.mean(axis=0)
    se = float(per_round.std(ddof=1)) / math.sqrt(k)
    t = stats.t_quantile(0.975, k - 1)

    def distance(ends):
        return max(abs(got - want) / abs(want) for got, want in zip((low, high), ends))

    def around(half, at=centre):
        return math.exp(at - half), math.exp(at + half)
    if distance(around(t * se)) <= INTERVAL_RTOL:
        return BOARD_INTERVAL, low, high
    figures = logs.mean(axis=1)
    workloads = {}
    for r, f in zip(told, figures):
        workloads.setdefault(r["workload"], []).append(f)
    by_workload = np.array([np.mean(v) for v in workloads.values()])
    se2 = logs.var(axis=1, ddof=1) / k
    weights = 1 / np.maximum(se2, 1e-300)
    mistakes = {
        "an interval that counts all the figures' pairs as independent observations: the figures of one round "
        "shared that round's machine": around(stats.t_quantile(0.975, m * k - 1) * float(logs.std(ddof=1))
                                              / math.sqrt(m * k)),
        "an interval that counts each figure as an independent observation: the figures were timed in the same "
        "rounds, and how they differ from one another is not the noise between runs":
            around(stats.t_quantile(0.975, m - 1) * float(figures.std(ddof=1)) / math.sqrt(m)) if m > 1 else None,
        "an interval that counts each workload as an independent observation: the workloads were timed in the "
        "same rounds, and how they differ from one another is not the noise between runs":
            around(stats.t_quantile(0.975, len(by_workload) - 1) * float(by_workload.std(ddof=1))
                   / math.sqrt(len(by_workload))) if len(by_workload) > 1 else None,
        "each figure's own interval combined as if the figures' noise were independent":
            around(1.959964 / math.sqrt(float(weights.sum())), float((weights * figures).sum() / weights.sum())),
        "a one-sided 95% bound on each side: together they cover 90%": around(stats.t_quantile(0.95, k - 1) * se),
        "the normal quantile 1.96: the noise between runs is estimated from only this report's pairs":
            around(1.959964 * se),
        "a spread that divides by the number of pairs: with a handful of pairs that understates the noise":
            around(t * float(per_round.std(ddof=0)) / math.sqrt(k)),
    }
    gaps = {words: distance(ends) for words, ends in mistakes.items() if ends is not None}
    nearest = min(gaps, key=gaps.get)
    return (nearest if gaps[nearest] <= 1e-4 else "another interval"), low, high


def board_claim(fn, report) -> str:
    """fn's claim ("faster", "slower" or "cannot tell"), or what is wrong with its answer's shape."""
    result = _board_result(fn, report)
    return result if isinstance(result, str) else result["claim"]
