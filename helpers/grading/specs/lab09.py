"""Lab 09 (migration): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab09 import INTERVAL_RTOL
from helpers.grading.specs.core import Case, Exercise, LabSpec


def _recorded_matrix():
    """(run A, run B, report) of the recorded 2.9.1 -> 2.10.0 driver run shipped with the package."""
    from helpers.validation import labcheck
    return labcheck.load_matrix(labcheck.RECORDED)


def _paired_interval(rounds_a, rounds_b, better):
    import numpy as np

    from helpers.validation import stats
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError(f"pairs need the same number of rounds on each side, at least two; got {len(rounds_a)} "
                         f"and {len(rounds_b)}")
    r = stats.paired_interval([float(np.median(x)) for x in rounds_a], [float(np.median(x)) for x in rounds_b],
                              better)
    return r["gain"], r["low"], r["high"]


def _rounds(gen, medians, shared, spread, n):
    """Per-call samples of rounds: round i's median times a slow stretch shared with the other side's
    round i (`shared[i]`), with independent per-call noise of `spread` (log scale)."""
    return [[float(m * s * v) for v in torch.exp(spread * torch.randn(n, generator=gen, dtype=torch.float64))]
            for m, s in zip(medians, shared)]


def _paired_cases(gen):
    from helpers.validation import stats
    run_a, run_b, _ = _recorded_matrix()
    unet = [stats.split_rounds(f["samples"], f.get("groups"))
            for f in (run["workloads"]["unet_attention"]["figures"]["iteration_time"] for run in (run_a, run_b))]
    gain = ("not the gain the report prints: a ratio of averages over all rounds is another number, and the gain "
            "is above 1 when B is the better one, for a throughput as for a time")
    width = ("the interval's width: where the feedback names what your interval is, that is the mistake; a "
             "resampling of a handful of pairs has too few distinct draws for its tails to hold 95%")
    rounds = ("the calls were taken as the evidence, or a round was summarised by a value its slow calls pull: a "
              "round is one observation, represented by its median call")
    slow = [1.0, 1.6, 0.9, 1.3, 1.0, 2.2]                  # slow stretches that hit both runs of a round pair
    jitter = (1 + 0.03 * torch.randn(6, generator=gen, dtype=torch.float64)).tolist()
    a6 = _rounds(gen, [0.020] * 6, slow, 0.05, 12)
    b6 = _rounds(gen, [0.022 * j for j in jitter], slow, 0.05, 12)
    a3 = _rounds(gen, [50.0] * 3, [1.0, 0.7, 1.2], 0.05, 9)
    b3 = _rounds(gen, [46.0, 47.5, 44.0], [1.0, 0.7, 1.2], 0.05, 9)
    skew = [[0.01, 0.011, 0.012, 0.5], [0.02, 0.021, 0.022, 0.9, 0.95]], [[0.011, 0.012, 0.013, 0.3],
                                                                       [0.025, 0.026, 0.027, 0.04, 0.05]]
    stub = "this case passes once the function runs without the pipeline's statistics"
    cases = [Case("written without stats.paired_interval or stats.compare_figure", (a6, b6, "lower"),
                  call="called", expected="called", expect_value=True, hint=stub)]
    for name, args, hidden, hint in (
            ("times, 6 rounds with slow stretches shared by each pair, B about 10% slower", (a6, b6, "lower"),
             False, gain),
            ("throughputs (better higher), 3 rounds", (a3, b3, "higher"), False, gain),
            ("3 pairs", (a3, b3, "higher"), False, gain),
            ("rounds of unequal length with slow outliers", (*skew, "lower"), False, rounds),
            ("the recorded UNet step times", (*unet, "lower"), False, gain),
            ("2 pairs", (a6[:2], b6[:2], "lower"), True, gain),
            ("8 pairs, throughputs", (_rounds(gen, [9.0] * 8, [1.0, 0.8] * 4, 0.1, 7),
                                      _rounds(gen, [10.0] * 8, [1.0, 0.8] * 4, 0.1, 7), "higher"), True, gain),
            ("identical rounds", ([[1.0, 2.0]] * 3, [[1.0, 2.0]] * 3, "lower"), True, gain)):
        cases.append(Case(f"{name}: the gain", args, call="first", rtol=1e-6, atol=0, hidden=hidden, hint=hint))
        cases.append(Case(f"{name}: the 95% interval", args, call="interval_named", rtol=INTERVAL_RTOL, atol=0,
                          hidden=hidden, hint=width))
    bad = "check that both sides have the same number of rounds, at least two, and say so in a ValueError"
    cases += [Case("3 rounds against 4: a ValueError", (a3, a6[:4], "lower"), raises="ValueError", hint=bad),
              Case("one round a side: a ValueError", (a3[:1], b3[:1], "higher"), call="own_value_error",
                   expected="its own ValueError", expect_value=True,
                   hint="check the number of pairs yourself before computing anything: with one pair, a library "
                        "call failing on zero degrees of freedom (or returning NaN) is not the ValueError that says "
                        "why"),
              Case("5 rounds against 2: a ValueError", (a6[:5], b6[:2], "lower"), raises="ValueError", hidden=True,
                   hint=bad)]
    return cases


def _decide(row, wanted):
    from helpers.validation import stats
    if row.get("low") is None:
        return "cannot tell"
    verdict = stats.verdict(row)
    if verdict != "within noise":
        return verdict
    return "no change of that size" if row["detectable"] <= wanted else "cannot tell"


def _decide_cases(gen):
    from helpers.validation import stats
    floor = (f"a change within the {stats.MIN_CHANGE:.0%} floor was called a regression or an improvement because "
             f"its interval is tight")
    interval = "a change was called while its interval still reaches past 1: at 95% the run does not show it"
    seen = ("'no change of that size' was said of a run that could not have seen a change of `wanted`, or not said "
            "of one that could (the detectable change is a fraction as `wanted` is)")
    pairs = "with no interval (fewer than two pairs, or a figure not reported) the data cannot tell"
    first = ("'cannot tell' was said of a row whose interval already shows a change beyond the floor: what the run "
             "could have detected matters where the interval shows none")
    on_gain = "the floor was applied to an end of the interval, not to the measured change"
    inverse = (f"a gain between {1 - stats.MIN_CHANGE} and 1 / {1 + stats.MIN_CHANGE} is B more than "
               f"{stats.MIN_CHANGE:.0%} slower, yet the floor below 1 was placed at {1 - stats.MIN_CHANGE}")
    strict = "an interval that ends at 1 contains 1, and was read as lying wholly on one side of it"
    inside = ("an interval inside ±`wanted` was read as 'no change of that size': the interval says where this run's "
              "gain lies, not whether this run would have found a change of `wanted`")
    floor_below = 1 / (1 + stats.MIN_CHANGE)

    def row(gain, low, high, detectable, pairs=4):
        return {"gain": gain, "low": low, "high": high, "detectable": detectable, "pairs": pairs}
    _, _, report = _recorded_matrix()
    told = [r for r in report["rows"] if r.get("low") is not None]
    recorded = min(told, key=lambda r: r["detectable"])
    visible = [
        ("0.85x, interval [0.80, 0.90]", row(0.85, 0.80, 0.90, 0.06), 0.10, interval),
        ("1.20x, interval [1.10, 1.31]", row(1.20, 1.10, 1.31, 0.08), 0.10, interval),
        ("0.90x, interval [0.78, 1.04]", row(0.90, 0.78, 1.04, 0.12), 0.05, interval),
        ("0.99x, interval [0.985, 0.995]", row(0.99, 0.985, 0.995, 0.02), 0.05, floor),
        ("0.80x, interval [0.68, 0.94], detectable 30%, wanted 10%", row(0.80, 0.68, 0.94, 0.30), 0.10, first),
        ("0.97x, interval [0.95, 0.99]", row(0.97, 0.95, 0.99, 0.03), 0.05, on_gain),
        (f"{(floor_below + 0.98) / 2:.4f}x (between 0.98 and 1 / 1.02), interval [0.975, 0.985]",
         row((floor_below + 0.98) / 2, 0.975, 0.985, 0.02), 0.05, inverse),
        ("0.95x, interval [0.90, 1.00] (ends at 1), detectable 30%, wanted 10%", row(0.95, 0.90, 1.0, 0.30), 0.10,
         strict),
        ("1.00x, interval [0.97, 1.03], detectable 4%, wanted 10%", row(1.0, 0.97, 1.03, 0.04), 0.10, seen),
        ("1.02x, interval [0.70, 1.49], detectable 55%, wanted 10%", row(1.02, 0.70, 1.49, 0.55), 0.10, seen),
        ("1.00x, interval [0.95, 1.05], detectable 10%, wanted 10%", row(1.0, 0.95, 1.05, 0.10), 0.10, seen),
        ("1.00x, interval [0.92, 1.087], detectable 12%, wanted 10%", row(1.0, 0.92, 1.087, 0.12, pairs=6), 0.10,
         inside),
        ("one pair of rounds", row(0.7, None, None, None, pairs=1), 0.10, pairs),
        ("a p99 not reported", row(None, None, None, None, pairs=None), 0.10, pairs),
        ("the recorded row with the smallest detectable change, wanted 10%",
         {k: recorded[k] for k in ("gain", "low", "high", "detectable", "pairs")}, 0.10, seen),
    ]
    hidden = [("1.015x, interval [1.01, 1.02]", row(1.015, 1.01, 1.02, 0.02), 0.05, floor),
              ("1.25x, interval [1.06, 1.47], detectable 30%, wanted 10%", row(1.25, 1.06, 1.47, 0.30), 0.10, first),
              ("1.03x, interval [1.01, 1.05]", row(1.03, 1.01, 1.05, 0.03), 0.05, on_gain),
              ("1.06x, interval [1.00, 1.12] (starts at 1), detectable 30%, wanted 10%", row(1.06, 1.0, 1.12, 0.30),
               0.10, strict),
              ("0.97x, interval [0.955, 0.985]", row(0.97, 0.955, 0.985, 0.02), 0.05, interval),
              ("1.01x, interval [0.94, 1.085], detectable 10.2%, wanted 10%", row(1.01, 0.94, 1.085, 0.102, pairs=6),
               0.10, inside)]
    for r in told:
        hidden.append((f"the recorded {r['workload']} {r['figure']}",
                       {k: r[k] for k in ("gain", "low", "high", "detectable", "pairs")},
                       float(0.05 + 0.5 * torch.rand((), generator=gen)), seen))
    return [Case(name, (r, wanted), hidden=i >= len(visible), hint=hint)
            for i, (name, r, wanted, hint) in enumerate(visible + hidden)]


def _find_slowdown(report_ab, report_ac):
    before = {(r["workload"], r["figure"]) for r in report_ab["rows"] if r.get("status") == "regression"}
    new = [r for r in report_ac["rows"] if r.get("status") == "regression" and (r["workload"], r["figure"]) not in before]
    workload = new[0]["workload"]
    return {"workload": workload,
            "slowdowns": {r["figure"]: (1 / r["gain"], 1 / r["high"], 1 / r["low"]) for r in report_ac["rows"]
                          if r["workload"] == workload and r.get("status") == "regression"}}


def _slowdown_cases(gen):
    import tempfile
    from pathlib import Path

    from helpers.validation import compare_runs, labcheck, load_run
    path_a, path_b = labcheck.matrix_paths(labcheck.RECORDED)
    run_a = load_run(path_a)
    report_ab = compare_runs(run_a, load_run(path_b))
    told = labcheck.told_rows(report_ab)
    new = "the workload named is not the one that changed between B and C"
    noisy = ("the workload of the lowest gain was named: its interval contains 1, so that low gain is noise, not a "
             "change")
    own = "a regression that A against B already shows was named: it came with B, not between B and C"
    inverse = ("the gains were returned as slowdowns, or their inverses with each end left in its place: a slowdown "
               "of 1.5 is C taking 1.5 times as long, and its interval starts below it")
    reported = "a figure the report did not report (it has no interval) was listed: it is no regression"
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def reports(b, c):
            return compare_runs(run_a, load_run(b)), compare_runs(run_a, load_run(c))

        def injected(b, name, **how):
            return reports(b, labcheck.inject_slowdown(path_a, b, tmp / f"c_{name}.json", **how))
        cases.append(Case("seed 0: the workload and its slowdowns", injected(path_b, "seed0", seed=0), rtol=1e-9,
                          atol=0, hint=inverse))
        order = [w for w in dict.fromkeys(r["workload"] for r in report_ab["rows"]) if w in told]
        first, last = order[0], order[-1]      # a distractor in `first` comes before the injection in `last`
        # B with a real regression of its own (torch's) in another workload, then C from it
        b_reg = labcheck.inject_slowdown(path_a, path_b, tmp / "b_reg.json", workload=first)
        cases.append(Case("B with a regression of its own in another workload: the new regressions are the injection",
                          injected(b_reg, "reg", workload=last), rtol=1e-9, atol=0, hint=own))
        # B with `first` noisy: its point gain the lowest of all, its intervals containing 1
        b_noisy = _noisy_b(path_a, path_b, tmp, first, told, injected(path_b, "last", workload=last)[1])
        cases.append(Case("B noisy in another workload: its gain is the lowest, but within noise",
                          injected(b_noisy, "noisy", workload=last), rtol=1e-9, atol=0, hint=noisy))
        if "bert_infer" in told:
            cases.append(Case("bert_infer slowed (its p99 rows are not reported)",
                              injected(path_b, "bert", workload="bert_infer"), rtol=1e-9, atol=0, hint=reported))
        secret = 1 + int(torch.randint(0, 1000, (), generator=gen))
        cases.append(Case("a secret seed", injected(path_b, "secret", seed=secret), rtol=1e-9, atol=0, hidden=True,
                          hint=new))
    return cases


def _noisy_b(path_a, path_b, tmp, other, told, report_ac):
    """Run B with workload `other` slowed by factors that swing from round to round: its lowest gain
    below every gain in report_ac, every one of its intervals containing 1."""
    from helpers.validation import compare_runs, labcheck, load_run
    lowest = min(r["gain"] for r in report_ac["rows"] if r.get("low") is not None)
    k = told[other][0]["pairs"]
    level = 1.5 * max(r["gain"] for r in told[other]) / lowest
    for swing in (2, 3, 5, 8, 13, 21, 34):
        factors = [level * swing, level / swing] * (k // 2) + [level] * (k % 2)
        b = labcheck.inject_slowdown(path_a, path_b, tmp / "b_noisy.json", workload=other, factors=factors)
        rows = [r for r in compare_runs(load_run(path_a), load_run(b))["rows"] if r["workload"] == other]
        if all(r["status"] != "regression" for r in rows):
            return b
    raise RuntimeError(f"could not make {other} noisy enough in the recorded run")


def _find_drift(report):
    row = next(n for n in report["numerics"] if n["status"] == "drift")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}


def _drift_cases(gen):
    import tempfile
    from pathlib import Path

    from helpers.validation import compare_runs, labcheck, load_run
    _, path_b = labcheck.matrix_paths(labcheck.RECORDED)
    hints = ["the answer is the output that moved beyond its tolerance, named by its workload and output, with how "
             "far it moved (its max_rel_diff), and nothing else",
             "an output that changed within its tolerance was named: a changed hash alone is not a drift, and the "
             "answer has to come from the report it is given",
             "the output named is not the one that moved beyond its tolerance"]
    seeds = [0, 5, 6 + int(torch.randint(0, 1000, (), generator=gen))]   # seed 5: a row within tolerance comes first
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(seeds):
            report = compare_runs(load_run(path_b), load_run(labcheck.inject_drift(path_b, Path(tmp) / f"c{i}.json", seed)))
            cases.append(Case(f"the injected change, seed {seed if i < 2 else 'secret'}", (report,), rtol=1e-6,
                              atol=0, hidden=i > 1, hint=hints[i]))
    return cases


def _pairs_needed(gains, change):
    import math

    from helpers.validation import stats
    if len(gains) < 2:
        raise ValueError(f"need the gains of at least two pairs, got {len(gains)}")
    logs = [math.log(g) for g in gains]
    mean = sum(logs) / len(logs)
    spread = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    pairs = stats.rounds_needed(spread, change)
    return None if pairs is None else float(pairs)    # a float: compared within the cases' tolerance


def _aa_gains(gen, spread, n):
    """n per-pair gains of an A/A comparison: log-normal noise of `spread` around 1."""
    return torch.exp(spread * torch.randn(n, generator=gen, dtype=torch.float64)).tolist()


def _pairs_needed_cases(gen):
    report = _recorded_matrix()[2]
    recorded = next(r["round_gains"] for r in report["rows"] if r.get("round_gains"))
    spread = ("the noise was taken with k in the denominator: with a handful of pairs that understates it, and the "
              "plan promises more than it delivers")
    test = ("the plan is not sized for exercise 1's test (two-sided at 95%) finding the change 80% of the time: a "
            "change that just reaches the 95% half-width is found about half the time")
    small = ("with few pairs Student's t is far from the normal quantiles, at both the 95% and the 80% point: a plan "
             "that uses the normal ones promises more than it delivers")
    stub = "this case passes once the function runs without stats.rounds_needed or the pipeline's plan"
    cases = [Case("written without stats.rounds_needed or the pipeline's plan", (_aa_gains(gen, 0.1, 6), 0.1),
                  call="called", expected="called", expect_value=True, hint=stub)]
    for name, args, hidden, hint in (
            ("6 A/A pairs at a spread of about 0.10, a 10% change", (_aa_gains(gen, 0.1, 6), 0.10), False, small),
            ("8 A/A pairs at about 0.16 (the recorded run's median), a 10% change", (_aa_gains(gen, 0.16, 8), 0.10),
             False, test),
            ("4 A/A pairs at about 0.2, a 5% change", (_aa_gains(gen, 0.2, 4), 0.05), False, spread),
            ("the per-pair gains of the recorded run's first timing row, a 25% change", (recorded, 0.25), False, test),
            ("a quiet machine: 5 pairs at about 0.03, a 10% change", (_aa_gains(gen, 0.03, 5), 0.10), False, small),
            ("12 pairs at about 0.05, a 5% change", (_aa_gains(gen, 0.05, 12), 0.05), True, test),
            ("3 pairs at about 0.25, a 10% change", (_aa_gains(gen, 0.25, 3), 0.10), True, spread),
            ("identical pairs: no noise, the fewest pairs", ([1.0, 1.0, 1.0], 0.10), True, small),
            ("a noisy machine and a 1% change: more than 1000 pairs", ([0.6, 1.0, 1.6], 0.01), True,
             "beyond 1000 pairs the answer is None")):
        cases.append(Case(name, args, rtol=0.12, atol=1, hidden=hidden, hint=hint))
    cases += [Case("one pair: a ValueError", ([1.02], 0.10), raises="ValueError",
                   hint="one gain says nothing about the noise: raise a ValueError saying that at least two are needed"),
              Case("no pairs: a ValueError", ([], 0.10), raises="ValueError", hidden=True,
                   hint="one gain says nothing about the noise: raise a ValueError saying that at least two are needed")]
    return cases


def _checkpoint_workload(quick, device, compile=False, samples=None):
    import io

    from torch import nn

    from helpers.validation import models, reference, workloads

    def mlp():
        return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    model = models.seed_parameters_(mlp(), seed=7).to(device)
    x = models.randn(32, 64, seed=8).to(device)

    def round_trip():
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        buffer.seek(0)
        copy = mlp().to(device)
        copy.load_state_dict(torch.load(buffer, weights_only=True))
        return copy

    with torch.no_grad():
        out = round_trip()(x)
        if not torch.equal(out, model(x)):
            raise RuntimeError("the reloaded model computes something else than the saved one")
    times = workloads.sample_calls({"round_trip": round_trip}, device, samples or 20)["round_trip"]
    references, tensors = reference.record({"reloaded_output": out})
    return {"config": {"layers": [64, 128, 10], "batch": 32}, "figures": {"round_trip_time": workloads.figure(times)},
            "paths": {}, "notes": {}, "references": references, "_tensors": tensors}


def _own_workload_cases(gen):
    record = ("return the record every workload returns (config, figures, paths, notes, references, _tensors), "
              "with a timed figure and the reloaded model's output as a reference")
    trip = ("time the whole round trip: each timed call runs torch.save of the state_dict and "
            "torch.load(..., weights_only=True), not the forward pass or the save alone")
    into = ("the reloaded state was never put into the model: copy.load_state_dict(torch.load(...)), else the "
            "fresh model keeps its own initial weights")
    checked = ("check that the reloaded model computes what the original does (torch.equal on their outputs), and "
               "raise if it does not: a round trip that changed the weights must not go unnoticed")
    recorded = ("record the reloaded model's output (what the fresh model, given the loaded state, returns), not "
                "the original model's: the reference is what the round trip gives")
    averaged = "one sample per timed call, not one averaged number: the noise statistic needs every call"
    samples = ("the number of samples is not what was asked: time `samples` calls (20 when it is None), not a "
               "fixed count")
    better = "a time (unit s) is better lower, a rate (unit .../s) better higher"
    refs = ("weights and inputs from numpy's generator (models.seed_parameters_, models.randn), not torch's "
            "global random state, so both versions compute the same thing")
    aa = "the same torch on both sides must give identical outputs and no new warning"
    n = int(torch.randint(3, 9, (), generator=gen))
    return [Case("a workload record", ("record", 5), call="own_workload", hint=record),
            Case("each timed call saves and loads (weights_only=True)", ("trip", 5), call="own_workload", hint=trip),
            Case("the loaded state goes into the fresh model", ("into model", 5), call="own_workload", hint=into),
            Case("a round trip that changes the weights is noticed", ("checked", 5), call="own_workload",
                 hint=checked),
            Case("the recorded output is the reloaded model's", ("recorded", 5), call="own_workload", hint=recorded),
            Case("5 samples asked: one per timed call", ("averaged", 5), call="own_workload", hint=averaged),
            Case("5 samples asked, 5 timed calls", ("samples", 5), call="own_workload", hint=samples),
            Case("better matches the unit", ("better", 5), call="own_workload", hint=better),
            Case("outputs independent of torch's seed", ("references", 3), call="own_workload", hint=refs),
            Case("A/A through the pipeline, rounds interleaved", ("aa", 3), call="own_workload", hint=aa),
            Case(f"{n} samples asked", ("samples", n), call="own_workload", hidden=True, hint=samples),
            Case(f"better, {n} samples", ("better", n), call="own_workload", hidden=True, hint=better)]

def _across_the_board(report):
    import math

    import numpy as np

    from helpers.validation import stats
    told = [r for r in report["rows"] if r.get("low") is not None and not r.get("same_as")]
    if not told:
        raise ValueError("no figure of this report has an interval (two or more pairs of rounds): nothing to pool")
    per_round = np.log(np.array([r["round_gains"] for r in told], dtype=float)).mean(axis=0)
    k = len(per_round)
    half = stats.t_quantile(0.975, k - 1) * float(per_round.std(ddof=1)) / math.sqrt(k)
    centre = float(per_round.mean())
    low, high = math.exp(centre - half), math.exp(centre + half)
    claim = "faster" if low > 1 else "slower" if high < 1 else "cannot tell"
    return {"claim": claim, "gain": math.exp(centre), "low": low, "high": high}


def _board_row(workload, figure, better, logs, same_as=None):
    """A report row (as compare_runs makes it) for a timed figure whose per-pair log-gains are `logs`."""
    import math

    from helpers.validation import stats
    gains = [math.exp(float(v)) for v in logs]
    b = [1 / g if better == "lower" else g for g in gains]       # A's rounds all 1: the gain is B's round
    r = stats.paired_interval([1.0] * len(b), b, better)
    return {"workload": workload, "figure": figure, "stat": "median", "unit": "s" if better == "lower" else "items/s",
            "better": better, "same_as": same_as, "status": stats.verdict(r), "why": ""} | r


def _board_extras(workload):
    """The rows a report also holds that say nothing about speed per pair: an exact count of bytes, a p99
    not reported, a figure whose rounds could not be paired."""
    blank = {"low": None, "high": None, "pairs": None, "detectable": None, "round_gains": None, "same_as": None}
    return [{"workload": workload, "figure": "peak_step_memory", "stat": "exact", "unit": "bytes", "better": "lower",
             "gain": 0.90, "status": "improvement", "why": "an exact figure: no noise, the floor alone decides"}
            | blank,
            {"workload": workload, "figure": "latency_p99", "stat": "p99", "unit": "s", "better": "lower",
             "gain": None, "status": "not reported", "why": "p99 needs at least 1000 samples per round"} | blank,
            _board_row(workload, "unpaired_time", "lower", [0.4])]


def _board_report(seed, figures, pairs, round_sd, figure_sd, twins=False, extras=False):
    """A drawn report: figures [(workload, figure, better, true log-gain)], each pair's log-gain that plus a
    slow or quick stretch shared by every figure of the round (round_sd) and the figure's own noise
    (figure_sd); twins: each time followed by its rate, the same calls; extras: _board_extras' rows."""
    import numpy as np
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, round_sd, pairs)
    rows = []
    for workload, figure, better, mu in figures:
        logs = mu + shared + rng.normal(0, figure_sd, pairs)
        rows.append(_board_row(workload, figure, better, logs))
        if twins and better == "lower":
            rows.append(_board_row(workload, figure.replace("time", "per_s"), "higher", logs, same_as=figure))
    if extras:
        rows += _board_extras(figures[0][0])
    return {"rows": rows}


def _board_figures(n, mus):
    """n figures over three workloads, times and rates in turn, with true log-gains mus (cycled)."""
    names = ("train", "serve", "embed")
    return [(names[i % 3], f"figure{i}_time" if i % 2 == 0 else f"figure{i}_per_s", "lower" if i % 2 == 0 else
             "higher", mus[i % len(mus)]) for i in range(n)]


def _board_cases(gen):
    import math

    _, _, recorded = _recorded_matrix()
    log = math.log
    gain = ("B's typical gain over the report's distinct timed figures, each weighing the same: where the feedback "
            "names what your gain is, that is the mistake")
    width = ("the interval's width: where the feedback names what your interval is, that is how it treats the "
             "evidence; otherwise ask what changes from one run of the whole report to the next")
    general = ("a claim says what the interval you returned shows at 95% confidence about B's typical gain: which "
               "side of 1 it lies on, if it lies on one side")
    visible = [
        ("B about 8% faster on every figure, times and rates, quiet rounds",
         _board_report(11, _board_figures(6, [log(1.08)]), 6, 0.01, 0.02), general),
        ("figures on both sides of 1, their typical gain above 1",
         _board_report(12, _board_figures(8, [log(0.94), log(1.12), log(1.03), log(1.08)]), 6, 0.05, 0.05),
         "a typical gain above 1 whose interval reaches below 1 was called faster: this run does not show that"),
        ("the recorded 2.9.1 -> 2.10.0 report", recorded,
         "every figure's own gain above 1 was read as faster across the board: the figures share the same rounds, "
         "so ten gains above 1 are not ten independent pieces of evidence"),
        ("every figure about 5% faster, none of them clearly on its own",
         _board_report(14, _board_figures(10, [log(1.05)]), 6, 0.005, 0.06),
         "cannot tell was said because no figure is clearly faster on its own: the claim is about the figures "
         "together, and together they can show what none shows alone"),
        ("B about 6% slower on every figure", _board_report(15, _board_figures(6, [-log(1.06)]), 6, 0.02, 0.03),
         general),
        ("B 1% faster on every figure, very quiet rounds",
         _board_report(16, _board_figures(6, [log(1.01)]), 8, 0.002, 0.004),
         "a small but clear gain was not called faster: the claim is about the direction the interval shows, with "
         "no floor below which a change is too small to state"),
        ("a time and its rate for each figure, with rows that have no interval",
         _board_report(17, _board_figures(5, [log(0.97), log(1.10), log(1.04)]), 5, 0.03, 0.04, twins=True,
                       extras=True), general),
    ]
    hidden = []
    for i in range(3):
        seed = int(torch.randint(0, 2**31 - 1, (), generator=gen))
        n, pairs = 3 + int(torch.randint(0, 9, (), generator=gen)), 3 + int(torch.randint(0, 6, (), generator=gen))
        mus = (0.1 * torch.randn(3, generator=gen, dtype=torch.float64)).tolist()
        hidden.append((f"a drawn report ({n} figures, {pairs} pairs)",
                       _board_report(seed, _board_figures(n, mus), pairs, 0.04, 0.04, twins=i != 1, extras=i != 2),
                       general))
    bert = {"rows": [r for r in recorded["rows"] if r["workload"] == "bert_infer"]}
    hidden.append(("the recorded report's bert_infer rows", bert, general))
    cases = []
    for i, (name, report, hint) in enumerate(visible + hidden):
        hide = i >= len(visible)
        cases += [Case(f"{name}: the gain", (report,), call="board_gain_named", rtol=1e-6, atol=0, hidden=hide,
                       hint=gain),
                  Case(f"{name}: the 95% interval", (report,), call="board_interval_named", rtol=INTERVAL_RTOL,
                       atol=0, hidden=hide, hint=width),
                  Case(f"{name}: the claim", (report,), call="board_claim", hidden=hide, hint=hint)]
    nothing = {"rows": _board_extras("train") + [r for r in recorded["rows"] if r.get("low") is None]}
    cases.append(Case("a report with no figure that has an interval: a ValueError", (nothing,),
                      call="own_value_error", expected="its own ValueError", expect_value=True,
                      hint="with no figure that has an interval there is nothing to pool: check for that yourself and "
                           "say so in a ValueError, before a library call fails on an empty list (or returns NaN)"))
    return cases


SPEC = LabSpec("09_migration_lab", (
    Exercise("Exercise 1: the paired interval", "paired_interval", _paired_cases, _paired_interval,
             forbidden=("helpers.validation.stats.paired_interval", "helpers.validation.stats.compare_figure",
                        "helpers.grading.harnesses.lab09.paired_interval"),
             refused="the pipeline's stats.paired_interval is the function you are writing (and compare_figure calls"
                     " it): compute it from the rounds yourself"),
    Exercise("Exercise 2: the decision", "decide", _decide_cases, _decide,
             forbidden=("helpers.validation.stats.verdict", "helpers.validation.stats.compare_figure"),
             refused="the pipeline's stats.verdict makes the decision for you (and compare_figure calls it): decide "
                     "from the interval and the detectable change yourself"),
    Exercise("Exercise 3: find the injected slowdown", "find_slowdown", _slowdown_cases, _find_slowdown),
    Exercise("Exercise 4: find the drift", "find_drift", _drift_cases, _find_drift),
    Exercise("Exercise 5: a workload of your own", "checkpoint_workload", _own_workload_cases, _checkpoint_workload),
    Exercise("Exercise 6: how many rounds", "pairs_needed", _pairs_needed_cases, _pairs_needed,
             forbidden=("helpers.validation.stats.rounds_needed", "helpers.validation.pipeline.plan"),
             refused="the pipeline's stats.rounds_needed (and its plan, which calls it) is the function you are "
                     "writing: plan from the gains yourself"),
    Exercise("Exercise 7: faster across the board?", "across_the_board", _board_cases, _across_the_board,
             # a pooling built on exercise 1's function is graded with a right one: a mistake there costs once
             substitutes=(("paired_interval", "helpers.grading.harnesses.lab09.paired_interval"),)),
), allow_processes=True)    # the lab runs the pipeline, which records the git commit it ran from
