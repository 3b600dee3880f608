"""Lab 09 (migration): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import math


from helpers.grading.checks import _in_library, _unrecorded
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
        "an interval with the normal quantile 1.96 where Student's t with k - 1 degrees of freedom belongs "
        "(the noise's spread is estimated from only k pairs)": 1.96 * spread,
        "an interval whose standard deviation divides by k: the sample standard deviation of k log-gains "
        "divides by k - 1": t * float(d.std(ddof=0)) / math.sqrt(k),
        "an interval with Student's t at k degrees of freedom: the mean uses one of the k pairs' degrees of "
        "freedom, leaving k - 1": stats.t_quantile(0.975, k) * spread,
        "an interval with t's 95% quantile: a two-sided 95% interval leaves 2.5% in each tail, so the 97.5% "
        "quantile": stats.t_quantile(0.95, k - 1) * spread,
        "an interval from each side's spread on its own: the spread must be that of the per-pair log-gains, "
        "so that a slow stretch shared by a pair cancels":
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
