"""Lab 09 (migration): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers.checks import CheckFailed
from helpers.grading.checks import check
from helpers.grading.specs import lab09 as spec09
from wrong_answers import FORBIDDEN_HINT, L09, Wrong, lab_tests, solution_namespace


def _round_medians(rounds_a, rounds_b, stat=np.median):
    return np.array([stat(r) for r in rounds_a]), np.array([stat(r) for r in rounds_b])


SIX_ROUNDS = "times, 6 rounds with slow stretches shared by each pair, B about 10% slower"   # Ex 1's first data


T_TABLE_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
               10: 2.228}    # Student's t, 97.5% quantile by degrees of freedom, as a printed table gives it


def _paired_answer(stat=np.median, quantile=None, ddof=1, arithmetic=False, ignore_better=False, df_offset=-1,
                   level=0.975, min_pairs=2, table=None):
    """paired_interval with one thing changed (the right answer with the defaults)."""
    from helpers.validation import stats

    def paired_interval(rounds_a, rounds_b, better):
        if len(rounds_a) != len(rounds_b) or len(rounds_a) < min_pairs:
            raise ValueError("need the same number of rounds on each side, at least two")
        ma, mb = _round_medians(rounds_a, rounds_b, stat)
        lower = better == "lower" or ignore_better
        d = np.log(ma / mb) if lower else np.log(mb / ma)
        k = len(d)
        t = quantile or (table[k - 1] if table else stats.t_quantile(level, k + df_offset))
        half = t * d.std(ddof=ddof) / np.sqrt(k)
        gain = (ma.mean() / mb.mean() if lower else mb.mean() / ma.mean()) if arithmetic else np.exp(d.mean())
        return float(gain), float(np.exp(d.mean() - half)), float(np.exp(d.mean() + half))
    return paired_interval


paired_z = _paired_answer(quantile=1.96)                  # the normal quantile whatever the number of pairs


paired_ddof0 = _paired_answer(ddof=0)                     # the population standard deviation


paired_arithmetic = _paired_answer(arithmetic=True)       # the gain as a ratio of the mean round medians


paired_ignores_better = _paired_answer(ignore_better=True)  # A / B for a throughput too


paired_round_means = _paired_answer(stat=np.mean)         # each round summarised by its mean


paired_k_df = _paired_answer(df_offset=0)                 # k degrees of freedom, not k - 1


paired_t95 = _paired_answer(level=0.95)                   # the 95% quantile: a 90% two-sided interval


paired_t_table = _paired_answer(table=T_TABLE_975)       # right: t from a printed table, to 3 decimals


paired_no_pair_count = _paired_answer(min_pairs=1)        # one pair left to stats.t_quantile, whose ValueError


def paired_calls_stats(rounds_a, rounds_b, better):
    # the pipeline's own function, which the exercise asks to write
    from helpers.validation import stats
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError("need the same number of rounds on each side, at least two")
    r = stats.paired_interval([float(np.median(x)) for x in rounds_a], [float(np.median(x)) for x in rounds_b], better)
    return r["gain"], r["low"], r["high"]


def paired_unpaired(rounds_a, rounds_b, better):
    # each side's spread on its own (the old unpaired way): the shared slow stretches stay in the interval
    from helpers.validation import stats
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError("need the same number of rounds on each side, at least two")
    la, lb = (np.log(m) for m in _round_medians(rounds_a, rounds_b))
    d = (la.mean() - lb.mean()) * (1 if better == "lower" else -1)
    k = len(la)
    half = stats.t_quantile(0.975, k - 1) * np.sqrt(la.var(ddof=1) / k + lb.var(ddof=1) / k)
    return float(np.exp(d)), float(np.exp(d - half)), float(np.exp(d + half))


def paired_bootstrap(rounds_a, rounds_b, better):
    # a percentile bootstrap over the pairs: too few distinct resamples with a handful of pairs
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError("need the same number of rounds on each side, at least two")
    ma, mb = _round_medians(rounds_a, rounds_b)
    d = np.log(ma / mb) if better == "lower" else np.log(mb / ma)
    draws = np.random.default_rng(0).integers(0, len(d), (4000, len(d)))
    low, high = np.percentile(d[draws].mean(axis=1), [2.5, 97.5])
    return float(np.exp(d.mean())), float(np.exp(low)), float(np.exp(high))


def paired_per_call(rounds_a, rounds_b, better):
    # every call paired with the other side's call of the same index: calls are not the pairs
    from helpers.validation import stats
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError("need the same number of rounds on each side, at least two")
    a, b = sum(map(list, rounds_a), []), sum(map(list, rounds_b), [])
    n = min(len(a), len(b))
    d = np.log(np.array(a[:n]) / np.array(b[:n])) * (1 if better == "lower" else -1)
    half = stats.t_quantile(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n)
    return float(np.exp(d.mean())), float(np.exp(d.mean() - half)), float(np.exp(d.mean() + half))


def paired_second(rounds_a, rounds_b, better):
    # a second correct solution: scipy's t quantile, sums written out, a different sign convention
    import math
    from statistics import median

    from scipy.stats import t as student_t
    k = len(rounds_a)
    if k != len(rounds_b):
        raise ValueError(f"A has {k} rounds and B {len(rounds_b)}: pair them one to one")
    if k < 2:
        raise ValueError("one pair of rounds says nothing about the noise: run at least two")
    sign = 1.0 if better == "lower" else -1.0
    logs = [sign * (math.log(median(a)) - math.log(median(b))) for a, b in zip(rounds_a, rounds_b)]
    mean = sum(logs) / k
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (k - 1))
    half = student_t.ppf(0.975, k - 1) * sd / math.sqrt(k)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _decide_answer(floor=True, interval=True, detectable=True, fraction=True, no_interval=True,
                   detectable_first=False, floor_on="gain", floor_below="inverse", strict=True, inside=False):
    """decide with one rule dropped or changed (the right answer with the defaults)."""
    from helpers.validation import stats

    def decide(row, wanted):
        if no_interval and row.get("low") is None:
            return "cannot tell"
        if detectable_first and row["detectable"] > wanted:
            return "cannot tell"
        gain = row["gain"]
        if not interval:
            below, above = gain < 1, gain > 1
        elif strict:
            below, above = row["high"] < 1, row["low"] > 1
        else:
            below, above = row["high"] <= 1, row["low"] >= 1
        low_end, high_end = (gain, gain) if floor_on == "gain" else (row["high"], row["low"])
        limit = 1 / (1 + stats.MIN_CHANGE) if floor_below == "inverse" else 1 - stats.MIN_CHANGE
        if below and (low_end < limit or not floor):
            return "regression"
        if above and (high_end > 1 + stats.MIN_CHANGE or not floor):
            return "improvement"
        if not detectable:
            return "no change of that size"
        if inside:       # the interval within ±wanted read as ruling the change out
            return "no change of that size" if 1 / (1 + wanted) <= row["low"] and row["high"] <= 1 + wanted \
                else "cannot tell"
        return "no change of that size" if row["detectable"] <= (wanted if fraction else 1 + wanted) else "cannot tell"
    return decide


decide_no_floor = _decide_answer(floor=False)             # a 1% change with a tight interval called a change


decide_gain_only = _decide_answer(interval=False)         # a gain below 1 called a regression, interval ignored


decide_ignores_detectable = _decide_answer(detectable=False)   # within noise read as "no change"


decide_one_plus_wanted = _decide_answer(fraction=False)   # detectable compared with 1 + wanted


decide_needs_interval = _decide_answer(no_interval=False)  # assumes every row has an interval


decide_detectable_first = _decide_answer(detectable_first=True)   # "cannot tell" before the interval is read


decide_floor_on_interval = _decide_answer(floor_on="interval")    # the 2% floor on the interval's end


decide_one_minus_floor = _decide_answer(floor_below="subtracted")  # the floor below 1 as 1 - MIN_CHANGE


decide_non_strict = _decide_answer(strict=False)          # an interval ending at 1 taken as below 1


decide_interval_inside = _decide_answer(inside=True)      # the interval, not the detectable change, rules it out


def decide_second(row, wanted):
    # a second correct solution: the interval's position first, then the floor, then what the run could see
    from helpers.validation import stats
    low, high, gain = row.get("low"), row.get("high"), row.get("gain")
    if low is None or high is None:
        return "cannot tell"
    beyond_floor = abs(np.log(gain)) > np.log1p(stats.MIN_CHANGE)
    if beyond_floor and not low <= 1 <= high:
        return "regression" if high < 1 else "improvement"
    return "cannot tell" if row["detectable"] > wanted else "no change of that size"


def _slowdowns(report_ac, workload):
    return {r["figure"]: (1 / r["gain"], 1 / r["high"], 1 / r["low"]) for r in report_ac["rows"]
            if r["workload"] == workload and r.get("status") == "regression"}


def find_slowdown_lowest_gain(report_ab, report_ac):
    # the workload of the lowest point gain in A against C: a noisy row can be lower
    row = min((r for r in report_ac["rows"] if r.get("gain") is not None), key=lambda r: r["gain"])
    return {"workload": row["workload"], "slowdowns": _slowdowns(report_ac, row["workload"])}


def find_slowdown_first_regression(report_ab, report_ac):
    # the first regression in A against C, already there in A against B or not
    row = next(r for r in report_ac["rows"] if r.get("status") == "regression")
    return {"workload": row["workload"], "slowdowns": _slowdowns(report_ac, row["workload"])}


def find_slowdown_gains(report_ab, report_ac):
    # the gains and their intervals, not the slowdowns
    answer = spec09._find_slowdown(report_ab, report_ac)
    rows = {r["figure"]: r for r in report_ac["rows"] if r["workload"] == answer["workload"]}
    return answer | {"slowdowns": {f: (rows[f]["gain"], rows[f]["low"], rows[f]["high"]) for f in answer["slowdowns"]}}


def find_slowdown_ends_kept(report_ab, report_ac):
    # inverted, but each end kept in its place: the interval comes out upside down
    answer = spec09._find_slowdown(report_ab, report_ac)
    return answer | {"slowdowns": {f: (s, high, low) for f, (s, low, high) in answer["slowdowns"].items()}}


def find_slowdown_every_row(report_ab, report_ac):
    # every row of the workload, the p99 rows that are not reported too
    workload = spec09._find_slowdown(report_ab, report_ac)["workload"]
    return {"workload": workload, "slowdowns": {r["figure"]: (1 / r["gain"], 1 / r["high"], 1 / r["low"])
                                                for r in report_ac["rows"] if r["workload"] == workload
                                                and r.get("stat") != "exact"}}


def find_slowdown_second(report_ab, report_ac):
    # a second correct solution: the workloads whose regression count grew, read through a table
    def regressions(report):
        out = {}
        for r in report["rows"]:
            if r.get("status") == "regression":
                out.setdefault(r["workload"], {})[r["figure"]] = r
        return out
    before, after = regressions(report_ab), regressions(report_ac)
    (workload,) = [w for w in after if set(after[w]) - set(before.get(w, {}))]
    return {"workload": workload, "slowdowns": {f: tuple(float(1 / r[k]) for k in ("gain", "high", "low"))
                                                for f, r in after[workload].items()}}


def find_drift_first_changed(report):
    # the first row whose outputs changed at all: "within tolerance" is not a drift
    row = next(n for n in report["numerics"] if n["status"] != "identical")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}


def find_drift_typed(report):
    # the seed-0 answer typed in
    return {"workload": "dlrm_moe_train", "output": "logits", "max_rel_diff": 5.000026723224887e-04}


def find_drift_status_too(report):
    # returns the whole row
    return dict(next(n for n in report["numerics"] if n["status"] == "drift"))


def find_drift_second(report):
    # a second correct solution: the worst row over its tolerance
    over = [n for n in report["numerics"] if n.get("max_rel_diff", 0) > n.get("tolerance", float("inf"))
            or n["status"] == "drift"]
    row = max(over, key=lambda n: n.get("max_rel_diff", float("inf")))
    return {k: row[k] for k in ("workload", "output", "max_rel_diff")}


def _checkpoint_answer(averaged=False, better="lower", torch_inputs=False, only_figures=False, timed="trip",
                       checked=True, record="reloaded", weights_only=True, into_model=True, fixed_samples=None):
    """checkpoint_workload with one thing changed (the right answer with the defaults)."""
    import io

    from helpers.validation import models, reference, workloads

    def checkpoint_workload(quick, device, compile=False, samples=None):
        model = models.seed_parameters_(nn.Linear(16, 4), seed=3).to(device)
        x = (torch.randn(8, 16) if torch_inputs else models.randn(8, 16, seed=4)).to(device)

        def save():
            buffer = io.BytesIO()
            torch.save(model.state_dict(), buffer)
            buffer.seek(0)
            return buffer

        def round_trip():
            state = torch.load(save(), weights_only=True) if weights_only else torch.load(save())
            copy_ = nn.Linear(16, 4).to(device)
            if into_model:
                copy_.load_state_dict(state)
            return copy_
        with torch.no_grad():
            expected = model(x)
            out = round_trip()(x)
            if checked and not torch.equal(out, expected):
                raise RuntimeError("the reloaded model computes something else")
        call = {"trip": round_trip, "forward": lambda: model(x), "save": save}[timed]
        seconds = workloads.sample_calls({"trip": call}, device, fixed_samples or samples or 20)["trip"]
        if averaged:
            seconds = [sum(seconds) / len(seconds)]
        figures = {"trip_time": {**workloads.figure(seconds), "better": better}}
        if only_figures:
            return figures
        references, tensors = reference.record({"out": out if record == "reloaded" else expected})
        return {"config": {}, "figures": figures, "paths": {}, "notes": {}, "references": references,
                "_tensors": tensors}
    return checkpoint_workload


checkpoint_averaged = _checkpoint_answer(averaged=True)          # one averaged sample for all calls


checkpoint_better_reversed = _checkpoint_answer(better="higher")  # a time marked better higher


checkpoint_torch_randn = _checkpoint_answer(torch_inputs=True)   # inputs from torch's global random state


checkpoint_figures_only = _checkpoint_answer(only_figures=True)  # the figures alone, not a workload record


checkpoint_forward_only = _checkpoint_answer(timed="forward")     # times the forward pass, no save or load


checkpoint_save_only = _checkpoint_answer(timed="save")          # times torch.save alone


checkpoint_unchecked = _checkpoint_answer(checked=False)         # never compares the reloaded model


checkpoint_records_original = _checkpoint_answer(record="original")  # the original model's output recorded


checkpoint_unsafe_load = _checkpoint_answer(weights_only=False)  # torch.load without weights_only=True


checkpoint_no_load_state_dict = _checkpoint_answer(checked=False, into_model=False)  # the state never loaded


checkpoint_ignores_samples = _checkpoint_answer(fixed_samples=20)  # always 20 timed calls


def checkpoint_second(quick, device, compile=False, samples=None):
    # a second correct solution: a rate figure (better higher), its own timing loop, a file on disk, the
    # original output computed first and compared with assert_close at zero tolerance
    import tempfile
    import time

    from helpers.validation import models, reference
    from helpers.validation.workloads import figure
    model = models.seed_parameters_(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), seed=11).to(device)
    x = models.randn(4, 8, seed=12).to(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"

        def round_trip():
            torch.save(model.state_dict(), path)
            fresh = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).to(device)
            fresh.load_state_dict(torch.load(path, weights_only=True))
            return fresh
        seconds = []
        for _ in range(samples or 10):
            start = time.perf_counter()
            round_trip()
            seconds.append(time.perf_counter() - start)
        with torch.no_grad():
            expected = model(x)
            out = round_trip()(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    references, tensors = reference.record({"reloaded": out})
    return {"config": {"width": 8}, "figures": {"trips_per_s": figure(seconds, unit="trips/s", better="higher")},
            "paths": {"format": "torch.save zip file"}, "notes": {}, "references": references, "_tensors": tensors}


def _plan_from_logs(gains, change, spread_of, quantiles=(0.975, 0.8), normal=False):
    """pairs_needed with its ingredients chosen: how the spread is taken and which quantiles size the test."""
    from helpers.validation import stats
    if len(gains) < 2:
        raise ValueError("need at least two gains")
    spread = spread_of(np.log(np.asarray(gains, dtype=float)))
    z = {0.975: 1.959964, 0.95: 1.644854, 0.8: 0.841621}
    for k in range(2, 1001):
        reach = sum(z[q] if normal else stats.t_quantile(q, k - 1) for q in quantiles)
        if reach * spread / math.sqrt(k) <= math.log1p(change):
            return k
    return None


def pairs_z(gains, change):
    return _plan_from_logs(gains, change, lambda v: v.std(ddof=1), normal=True)


def pairs_no_power(gains, change):
    return _plan_from_logs(gains, change, lambda v: v.std(ddof=1), quantiles=(0.975,))


def pairs_one_sided(gains, change):
    return _plan_from_logs(gains, change, lambda v: v.std(ddof=1), quantiles=(0.95, 0.8))


def pairs_ddof0(gains, change):
    return _plan_from_logs(gains, change, lambda v: v.std())


def pairs_calls_stats(gains, change):
    from helpers.validation import stats
    return stats.rounds_needed(float(np.std(np.log(gains), ddof=1)), change)


def pairs_second(gains, change):
    # a second correct solution: torch's std (k - 1 by default), a search upward from the normal approximation,
    # which never asks for more pairs than Student's t does
    from helpers.validation import stats
    if len(gains) < 2:
        raise ValueError(f"{len(gains)} gain(s): the noise needs at least two pairs")
    spread = torch.tensor(gains, dtype=torch.float64).log().std().item()
    effect = math.log1p(change)
    k = max(2, math.floor(((1.96 + 0.84) * spread / effect) ** 2))
    while k <= 1000 and (stats.t_quantile(0.975, k - 1) + stats.t_quantile(0.8, k - 1)) * spread / math.sqrt(k) > effect:
        k += 1
    return k if k <= 1000 else None



def _board_told(report, twins=False, rates=True):
    return [r for r in report["rows"] if r.get("low") is not None and (twins or not r.get("same_as"))
            and (rates or r["better"] == "lower")]


def _board_answer(pool="rounds", claim="interval", twins=False, flip_times=False, quantile=0.975, normal=False,
                  ddof=1, floor=False, rates=True):
    """across_the_board with one thing changed (the right answer with the defaults)."""
    from helpers.validation import stats

    def across_the_board(report):
        told = _board_told(report, twins, rates)
        if not told:
            raise ValueError("no figure with an interval")
        logs = np.log(np.array([r["round_gains"] for r in told], dtype=float))
        if flip_times:
            logs = logs * np.array([[-1.0] if r["better"] == "lower" else [1.0] for r in told])
        k = logs.shape[1]
        centre = float(logs.mean())
        if pool == "fixed":          # inverse-variance weights, each figure's own standard error
            weights = k / logs.var(axis=1, ddof=1)
            centre = float((weights * logs.mean(axis=1)).sum() / weights.sum())
            half = 1.96 / math.sqrt(weights.sum())
        else:
            if pool == "workloads":
                by = {}
                for r, v in zip(told, logs.mean(axis=1)):
                    by.setdefault(r["workload"], []).append(v)
                values = np.array([np.mean(v) for v in by.values()])
            else:
                values = {"rounds": logs.mean(axis=0), "all": logs.ravel(), "figures": logs.mean(axis=1)}[pool]
            n = len(values)
            q = 1.96 if normal else stats.t_quantile(quantile, n - 1)
            half = q * float(values.std(ddof=ddof)) / math.sqrt(n)
        low, high = math.exp(centre - half), math.exp(centre + half)
        gains = [r["gain"] for r in told]
        if claim == "count":
            said = "faster" if all(g > 1 for g in gains) else "slower" if all(g < 1 for g in gains) else "cannot tell"
        elif claim == "gain":
            said = "faster" if centre > 0 else "slower" if centre < 0 else "cannot tell"
        elif claim == "each":
            said = ("faster" if all(r["low"] > 1 for r in told) else "slower" if all(r["high"] < 1 for r in told)
                    else "cannot tell")
        else:
            said = "faster" if low > 1 else "slower" if high < 1 else "cannot tell"
            if floor and abs(centre) < math.log1p(stats.MIN_CHANGE):
                said = "cannot tell"
        return {"claim": said, "gain": math.exp(centre), "low": low, "high": high}
    return across_the_board


board_count = _board_answer(claim="count")               # faster when every figure's gain is above 1


board_gain_only = _board_answer(claim="gain")            # faster when the pooled gain is above 1, interval unread


board_each_significant = _board_answer(claim="each")     # faster only when every figure's own interval says so


board_floor = _board_answer(floor=True)                  # exercise 2's 2% floor carried over to the claim


board_all_pairs = _board_answer(pool="all")              # every figure's every pair an independent observation


board_figures = _board_answer(pool="figures")            # each figure one independent observation


board_workloads = _board_answer(pool="workloads")        # each workload one independent observation


board_fixed = _board_answer(pool="fixed")                # inverse-variance (fixed-effect) pooling of the figures


board_one_sided = _board_answer(quantile=0.95)           # t's 95% quantile: a one-sided bound on each side


board_normal = _board_answer(normal=True)                # the normal quantile 1.96 over a handful of pairs


board_ddof0 = _board_answer(ddof=0)                      # the rounds' spread divided by k


board_twins = _board_answer(twins=True)                  # a time and its rate both counted


board_flip_times = _board_answer(flip_times=True)        # the gains of times turned over (read as B / A)


board_no_rates = _board_answer(rates=False)              # every rate dropped as if each were a time's twin


def board_no_check(report):
    # no check for a report without an interval: the empty pooling fails inside a library call
    from helpers.validation import stats
    logs = [[math.log(g) for g in r["round_gains"]] for r in _board_told(report)]
    per_round = [sum(column) / len(column) for column in zip(*logs)]
    k = len(per_round)
    half = stats.t_quantile(0.975, k - 1) * float(np.std(per_round, ddof=1)) / math.sqrt(k)
    centre = sum(per_round) / k
    low, high = math.exp(centre - half), math.exp(centre + half)
    return {"claim": "faster" if low > 1 else "slower" if high < 1 else "cannot tell",
            "gain": math.exp(centre), "low": low, "high": high}


def board_tuple(report):
    # the four numbers as a tuple, not the dict asked for
    return tuple(spec09._across_the_board(report).values())


def board_second(report):
    # a second correct solution: a two-way layout (figures fixed, rounds random) written with sums, scipy's t;
    # the rounds' mean square over m * k is the squared standard error of the grand mean
    from scipy.stats import t as student_t
    rows = [r for r in report["rows"] if r.get("round_gains") and r.get("low") is not None and r.get("same_as") is None]
    if not rows:
        raise ValueError("nothing to pool: no figure of this report has two or more pairs of rounds")
    logs = [[math.log(g) for g in r["round_gains"]] for r in rows]
    m, k = len(logs), len(logs[0])
    grand = sum(map(sum, logs)) / (m * k)
    round_means = [sum(f[i] for f in logs) / m for i in range(k)]
    mean_square = m * sum((x - grand) ** 2 for x in round_means) / (k - 1)
    half = student_t.ppf(0.975, k - 1) * math.sqrt(mean_square / (m * k))
    low, high = math.exp(grand - half), math.exp(grand + half)
    return {"gain": math.exp(grand), "low": low, "high": high,
            "claim": "slower" if high < 1 else "faster" if low > 1 else "cannot tell"}


def board_via_paired_interval(report):
    # a second correct solution: each round's pooled gain as a one-call round of a throughput, through
    # exercise 1's paired_interval (the grader binds a right one while it grades this exercise)
    rows = [r for r in report["rows"] if r.get("low") is not None and not r.get("same_as")]
    if not rows:
        raise ValueError("no figure with an interval in this report")
    pooled = [math.exp(sum(math.log(r["round_gains"][i]) for r in rows) / len(rows)) for i in range(rows[0]["pairs"])]
    gain, low, high = paired_interval([[1.0]] * len(pooled), [[g] for g in pooled], "higher")  # noqa: F821
    claim = "cannot tell" if low <= 1 <= high else ("faster" if gain > 1 else "slower")
    return {"claim": claim, "gain": gain, "low": low, "high": high}


LEARNER_VIEW_09 = [
    ("paired_interval", "normal-quantile", paired_z, "the normal quantile 1.96"),
    ("paired_interval", "ddof-0", paired_ddof0, "divides by k:"),
    ("paired_interval", "k-degrees", paired_k_df, "t at k degrees of freedom"),
    ("paired_interval", "t-at-0.95", paired_t95, "t's 95% quantile"),
    ("paired_interval", "unpaired", paired_unpaired, "each side's spread on its own"),
    ("paired_interval", "calls-stats", paired_calls_stats, "stats.paired_interval is the function you are writing"),
    ("decide", "detectable-first", decide_detectable_first, "already shows a change beyond the floor"),
    ("decide", "floor-on-interval", decide_floor_on_interval, "not to the measured change"),
    ("decide", "one-minus-floor", decide_one_minus_floor, "the floor below 1 was placed at 0.98"),
    ("decide", "interval-reaches-1", decide_non_strict, "an interval that ends at 1 contains 1"),
    ("checkpoint_workload", "forward-only", checkpoint_forward_only, "not the forward pass or the save alone"),
    ("checkpoint_workload", "save-only", checkpoint_save_only, "not the forward pass or the save alone"),
    ("checkpoint_workload", "unsafe-load", checkpoint_unsafe_load, "torch.load(..., weights_only=True)"),
    ("checkpoint_workload", "no-load-state-dict", checkpoint_no_load_state_dict, "never put into the model"),
    ("checkpoint_workload", "unchecked", checkpoint_unchecked, "must not go unnoticed"),
    ("checkpoint_workload", "records-original", checkpoint_records_original, "not the original model's"),
    ("checkpoint_workload", "ignores-samples", checkpoint_ignores_samples,
     "the number of samples is not what was asked"),
    ("pairs_needed", "normal-quantiles", pairs_z, "far from the normal quantiles"),
    ("pairs_needed", "no-power", pairs_no_power, "just reaches the 95% half-width"),
    ("pairs_needed", "one-sided", pairs_one_sided, "two-sided at 95%"),
    ("pairs_needed", "ddof-0", pairs_ddof0, "k in the denominator"),
    ("pairs_needed", "calls-stats", pairs_calls_stats, "stats.rounds_needed (and its plan, which calls it)"),
    ("decide", "interval-inside", decide_interval_inside, "an interval inside ±`wanted`"),
    ("across_the_board", "count", board_count, "every figure's own gain above 1"),
    ("across_the_board", "gain-only", board_gain_only, "whose interval reaches below 1 was called faster"),
    ("across_the_board", "each-significant", board_each_significant, "no figure is clearly faster on its own"),
    ("across_the_board", "floor", board_floor, "no floor below which"),
    ("across_the_board", "all-pairs", board_all_pairs, "counts all the figures' pairs as independent"),
    ("across_the_board", "figures", board_figures, "counts each figure as an independent observation"),
    ("across_the_board", "workloads", board_workloads, "counts each workload as an independent observation"),
    ("across_the_board", "fixed-effect", board_fixed, "weighted by how tight their own intervals are"),
    ("across_the_board", "one-sided", board_one_sided, "a one-sided 95% bound on each side"),
    ("across_the_board", "normal", board_normal, "the normal quantile 1.96"),
    ("across_the_board", "ddof-0", board_ddof0, "a spread that divides by the number of pairs"),
    ("across_the_board", "twins", board_twins, "a time and its rate both counted"),
    ("across_the_board", "times-turned-over", board_flip_times, "the gains of the times turned over"),
    ("across_the_board", "no-rates", board_no_rates, "every rate left out"),
    ("across_the_board", "no-check", board_no_check, "check for that yourself"),
    ("across_the_board", "tuple", board_tuple, "a dict with the keys"),
]


@pytest.mark.parametrize("function, name, fn, hint", LEARNER_VIEW_09,
                         ids=[f"{f}-{n}" for f, n, _, _ in LEARNER_VIEW_09])
def test_check_stops_with_the_mistakes_hint(function, name, fn, hint):
    """The notebook's check stops at the first visible case that fails: that case's hint names this mistake
    (not another case's, such as the gain's for a wrong interval)."""
    with pytest.raises(CheckFailed) as failed:
        check("09_migration_lab", fn, function)
    assert hint in str(failed.value), str(failed.value)


def test_a_slowed_workload_spins_in_its_timed_calls_or_scales_its_samples():
    """labcheck.slowed, the injection after exercise 6: a workload timed through workloads.sample_calls runs its
    calls (spun, not rescaled); one that times itself gets each timing sample made 1 + change slower."""
    from helpers.validation import labcheck
    record = labcheck.slowed(solution_namespace(L09)["checkpoint_workload"], 0.10)(True, torch.device("cpu"),
                                                                                     samples=3)
    assert "slowed" not in record["notes"] and len(record["figures"]["round_trip_time"]["samples"]) == 3

    def own_loop(quick, device, compile=False, samples=None):
        return {"figures": {"t": {"unit": "s", "better": "lower", "stat": "median", "samples": [1.0, 2.0, 4.0]},
                            "rate": {"unit": "x/s", "better": "higher", "stat": "median", "samples": [2.2]},
                            "bytes": {"unit": "bytes", "better": "lower", "stat": "exact", "samples": [5.0]}},
                "notes": {}}
    record = labcheck.slowed(own_loop, 0.10)(True, torch.device("cpu"))
    figures = record["figures"]
    assert record["notes"]["slowed"] == "scaled"
    assert figures["t"]["samples"] == pytest.approx([1.1, 2.2, 4.4]) and figures["t"]["value"] == pytest.approx(2.2)
    assert figures["rate"]["samples"] == pytest.approx([2.0]) and figures["bytes"]["samples"] == [5.0]


BOARD_FIRST = "B about 8% faster on every figure, times and rates, quiet rounds"          # exercise 7's first data
BOARD_GAIN_HINT = "where the feedback names what your gain is"
BOARD_WIDTH_HINT = "where the feedback names what your interval is"


WRONG = [
    Wrong(L09, "decide", "interval-inside", decide_interval_inside,
          "1.00x, interval [0.92, 1.087], detectable 12%, wanted 10%", "an interval inside ±`wanted`"),
    Wrong(L09, "across_the_board", "count", board_count, "the recorded 2.9.1 -> 2.10.0 report: the claim",
          "every figure's own gain above 1"),
    Wrong(L09, "across_the_board", "gain-only", board_gain_only,
          "figures on both sides of 1, their typical gain above 1: the claim",
          "whose interval reaches below 1 was called faster"),
    Wrong(L09, "across_the_board", "each-significant", board_each_significant,
          "every figure about 5% faster, none of them clearly on its own: the claim",
          "no figure is clearly faster on its own"),
    Wrong(L09, "across_the_board", "floor", board_floor, "B 1% faster on every figure, very quiet rounds: the claim",
          "no floor below which"),
    Wrong(L09, "across_the_board", "all-pairs", board_all_pairs, f"{BOARD_FIRST}: the 95% interval", BOARD_WIDTH_HINT),
    Wrong(L09, "across_the_board", "figures", board_figures, f"{BOARD_FIRST}: the 95% interval", BOARD_WIDTH_HINT),
    Wrong(L09, "across_the_board", "workloads", board_workloads, f"{BOARD_FIRST}: the 95% interval", BOARD_WIDTH_HINT),
    Wrong(L09, "across_the_board", "one-sided", board_one_sided, f"{BOARD_FIRST}: the 95% interval", BOARD_WIDTH_HINT),
    Wrong(L09, "across_the_board", "normal", board_normal, f"{BOARD_FIRST}: the 95% interval", BOARD_WIDTH_HINT),
    Wrong(L09, "across_the_board", "ddof-0", board_ddof0, f"{BOARD_FIRST}: the 95% interval", BOARD_WIDTH_HINT),
    Wrong(L09, "across_the_board", "fixed-effect", board_fixed, f"{BOARD_FIRST}: the gain", BOARD_GAIN_HINT),
    Wrong(L09, "across_the_board", "times-turned-over", board_flip_times, f"{BOARD_FIRST}: the gain", BOARD_GAIN_HINT),
    Wrong(L09, "across_the_board", "no-rates", board_no_rates, f"{BOARD_FIRST}: the gain", BOARD_GAIN_HINT),
    Wrong(L09, "across_the_board", "twins", board_twins, "the recorded 2.9.1 -> 2.10.0 report: the gain",
          BOARD_GAIN_HINT),
    Wrong(L09, "across_the_board", "no-check", board_no_check,
          "a report with no figure that has an interval: a ValueError", "check for that yourself"),
    Wrong(L09, "across_the_board", "tuple", board_tuple, f"{BOARD_FIRST}: the gain", BOARD_GAIN_HINT),
    Wrong(L09, "pairs_needed", "normal-quantiles", pairs_z, "6 A/A pairs at a spread of about 0.10, a 10% change",
          "far from the normal quantiles"),
    Wrong(L09, "pairs_needed", "no-power", pairs_no_power,
          "8 A/A pairs at about 0.16 (the recorded run's median), a 10% change", "just reaches the 95% half-width"),
    Wrong(L09, "pairs_needed", "ddof-0", pairs_ddof0, "4 A/A pairs at about 0.2, a 5% change",
          "k in the denominator"),
    Wrong(L09, "paired_interval", "unpaired", paired_unpaired, f"{SIX_ROUNDS}: the 95% interval",
          "each side's spread on its own"),
    Wrong(L09, "paired_interval", "bootstrap-pairs", paired_bootstrap, f"{SIX_ROUNDS}: the 95% interval",
          "too few distinct draws"),
    Wrong(L09, "paired_interval", "normal-quantile-first", paired_z, f"{SIX_ROUNDS}: the 95% interval",
          "the normal quantile 1.96"),
    Wrong(L09, "paired_interval", "k-degrees", paired_k_df, f"{SIX_ROUNDS}: the 95% interval",
          "t at k degrees of freedom"),
    Wrong(L09, "paired_interval", "t-at-0.95", paired_t95, f"{SIX_ROUNDS}: the 95% interval", "t's 95% quantile"),
    Wrong(L09, "paired_interval", "no-pair-count", paired_no_pair_count, "one round a side: a ValueError",
          "check the number of pairs yourself"),
    Wrong(L09, "paired_interval", "calls-stats", paired_calls_stats,
          "written without stats.paired_interval or stats.compare_figure", FORBIDDEN_HINT),
    Wrong(L09, "paired_interval", "normal-quantile", paired_z, "3 pairs: the 95% interval", "the normal quantile 1.96"),
    Wrong(L09, "paired_interval", "ddof-0", paired_ddof0, "3 pairs: the 95% interval", "divides by k:"),
    Wrong(L09, "paired_interval", "arithmetic-means", paired_arithmetic, f"{SIX_ROUNDS}: the gain",
          "a ratio of averages over all rounds is another number"),
    Wrong(L09, "paired_interval", "better-ignored", paired_ignores_better,
          "throughputs (better higher), 3 rounds: the gain", "for a throughput as for a time"),
    Wrong(L09, "paired_interval", "per-call-pairs", paired_per_call,
          "rounds of unequal length with slow outliers: the gain", "the calls were taken as the evidence"),
    Wrong(L09, "paired_interval", "round-means", paired_round_means,
          "rounds of unequal length with slow outliers: the gain", "represented by its median call"),
    Wrong(L09, "decide", "no-floor", decide_no_floor, "0.99x, interval [0.985, 0.995]", "within the 2% floor"),
    Wrong(L09, "decide", "gain-only", decide_gain_only, "0.90x, interval [0.78, 1.04]", "still reaches past 1"),
    Wrong(L09, "decide", "ignores-detectable", decide_ignores_detectable,
          "1.02x, interval [0.70, 1.49], detectable 55%, wanted 10%", "could not have seen a change of `wanted`"),
    Wrong(L09, "decide", "one-plus-wanted", decide_one_plus_wanted,
          "1.02x, interval [0.70, 1.49], detectable 55%, wanted 10%", "a fraction as `wanted` is"),
    Wrong(L09, "decide", "needs-interval", decide_needs_interval, "one pair of rounds", "fewer than two pairs"),
    Wrong(L09, "decide", "detectable-first", decide_detectable_first,
          "0.80x, interval [0.68, 0.94], detectable 30%, wanted 10%", "already shows a change beyond the floor"),
    Wrong(L09, "decide", "floor-on-interval", decide_floor_on_interval, "0.97x, interval [0.95, 0.99]",
          "not to the measured change"),
    Wrong(L09, "decide", "one-minus-floor", decide_one_minus_floor,
          "0.9802x (between 0.98 and 1 / 1.02), interval [0.975, 0.985]", "the floor below 1 was placed at 0.98"),
    Wrong(L09, "decide", "interval-reaches-1", decide_non_strict, "0.95x, interval [0.90, 1.00] (ends at 1), "
          "detectable 30%, wanted 10%", "an interval that ends at 1 contains 1"),
    Wrong(L09, "find_slowdown", "lowest-gain", find_slowdown_lowest_gain,
          "B noisy in another workload: its gain is the lowest, but within noise",
          "its interval contains 1, so that low gain is noise"),
    Wrong(L09, "find_slowdown", "first-regression", find_slowdown_first_regression,
          "B with a regression of its own in another workload: the new regressions are the injection",
          "it came with B, not between B and C"),
    Wrong(L09, "find_slowdown", "gains", find_slowdown_gains, "seed 0: the workload and its slowdowns",
          "the gains were returned as slowdowns"),
    Wrong(L09, "find_slowdown", "ends-kept", find_slowdown_ends_kept, "seed 0: the workload and its slowdowns",
          "each end left in its place"),
    Wrong(L09, "find_slowdown", "every-row", find_slowdown_every_row, "bert_infer slowed (its p99 rows are not reported)",
          "a figure the report did not report"),
    Wrong(L09, "find_drift", "first-changed-row", find_drift_first_changed, "the injected change, seed 5", "a changed hash alone is not a drift"),
    Wrong(L09, "find_drift", "typed-answer", find_drift_typed, "the injected change, seed 5",
          "the answer has to come from the report it is given"),
    Wrong(L09, "find_drift", "whole-row", find_drift_status_too, "the injected change, seed 0",
          "and nothing else"),
    Wrong(L09, "checkpoint_workload", "averaged", checkpoint_averaged, "5 samples asked: one per timed call",
          "not one averaged number"),
    Wrong(L09, "checkpoint_workload", "ignores-samples", checkpoint_ignores_samples, "5 samples asked, 5 timed calls",
          "the number of samples is not what was asked"),
    Wrong(L09, "checkpoint_workload", "forward-only", checkpoint_forward_only,
          "each timed call saves and loads (weights_only=True)", "not the forward pass or the save alone"),
    Wrong(L09, "checkpoint_workload", "save-only", checkpoint_save_only,
          "each timed call saves and loads (weights_only=True)", "not the forward pass or the save alone"),
    Wrong(L09, "checkpoint_workload", "unsafe-load", checkpoint_unsafe_load,
          "each timed call saves and loads (weights_only=True)", "torch.load(..., weights_only=True)"),
    Wrong(L09, "checkpoint_workload", "no-load-state-dict", checkpoint_no_load_state_dict,
          "the loaded state goes into the fresh model", "never put into the model"),
    Wrong(L09, "checkpoint_workload", "unchecked", checkpoint_unchecked,
          "a round trip that changes the weights is noticed", "must not go unnoticed"),
    Wrong(L09, "checkpoint_workload", "records-original", checkpoint_records_original,
          "the recorded output is the reloaded model's", "not the original model's"),
    Wrong(L09, "checkpoint_workload", "better-reversed", checkpoint_better_reversed, "better matches the unit",
          "a time (unit s) is better lower"),
    Wrong(L09, "checkpoint_workload", "torch-randn", checkpoint_torch_randn, "outputs independent of torch's seed",
          "not torch's global random state"),
    Wrong(L09, "checkpoint_workload", "figures-only", checkpoint_figures_only, "a workload record",
          "return the record every workload returns"),
]

SECOND_SOLUTIONS = [("paired_interval", paired_second), ("paired_interval", paired_t_table), ("decide", decide_second),
                    ("find_slowdown", find_slowdown_second), ("find_drift", find_drift_second),
                    ("checkpoint_workload", checkpoint_second), ("pairs_needed", pairs_second),
                    ("across_the_board", board_second), ("across_the_board", board_via_paired_interval)]

globals().update(lab_tests(L09, WRONG, SECOND_SOLUTIONS, visible=True))
