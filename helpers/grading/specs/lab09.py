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
    gain = ("the gain is the geometric mean of the per-round gains (each round's median; for a time A / B, for a "
            "throughput B / A), not a ratio of averages over all rounds")
    width = ("the interval's width: where the feedback names a mistake, that ingredient of step 3 differs; "
             "otherwise compare each ingredient in turn (a resampling of the pairs is not a t interval)")
    rounds = "one value per round (its median): the rounds are the pairs, not the calls within them"
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
    floor = (f"a change within {stats.MIN_CHANGE:.0%} is never a regression or an improvement, however tight its "
             f"interval")
    interval = "a regression needs the whole interval below 1, an improvement the whole interval above 1"
    seen = ("within noise, the run rules out a change of `wanted` only if it could have detected one that size "
            "(detectable <= wanted, both fractions)")
    pairs = "with no interval (fewer than two pairs, or a figure not reported) the data cannot tell"
    first = ("the interval decides first: a whole interval below 1 with the gain beyond the floor is a regression "
             "whatever the detectable change; detectable only splits the rest")
    on_gain = ("the 2% floor applies to the gain, not to the interval's end: the interval has only to lie wholly "
               "below (above) 1")
    inverse = (f"the floor below 1 is 1 / (1 + MIN_CHANGE) (B {stats.MIN_CHANGE:.0%} slower: A / B = 1 / "
               f"{1 + stats.MIN_CHANGE}), not 1 - MIN_CHANGE")
    strict = "an interval that ends at 1 contains 1: wholly below 1 is high < 1, wholly above 1 is low > 1"
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
              ("0.97x, interval [0.955, 0.985]", row(0.97, 0.955, 0.985, 0.02), 0.05, interval)]
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
    new = ("the injected workload is the one whose figures became regressions: regressions in A against C that "
           "A against B does not have; a low gain whose interval contains 1 is noise")
    inverse = ("a slowdown is how many times slower C is: the inverse of the gain, and the interval's ends swap "
               "places when inverted")
    reported = "only rows with an interval can be regressions: a figure not reported has no gain to invert"
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
                          injected(b_reg, "reg", workload=last), rtol=1e-9, atol=0, hint=new))
        # B with `first` noisy: its point gain the lowest of all, its intervals containing 1
        b_noisy = _noisy_b(path_a, path_b, tmp, first, told, injected(path_b, "last", workload=last)[1])
        cases.append(Case("B noisy in another workload: its gain is the lowest, but within noise",
                          injected(b_noisy, "noisy", workload=last), rtol=1e-9, atol=0, hint=new))
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
    hint = ("a changed hash alone is not a drift: return the numerics row whose status is 'drift', with its "
            "max_rel_diff")
    seeds = [0, 5, 6 + int(torch.randint(0, 1000, (), generator=gen))]   # seed 5: a row within tolerance comes first
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(seeds):
            report = compare_runs(load_run(path_b), load_run(labcheck.inject_drift(path_b, Path(tmp) / f"c{i}.json", seed)))
            cases.append(Case(f"the injected change, seed {seed if i < 2 else 'secret'}", (report,), rtol=1e-6,
                              atol=0, hidden=i > 0, hint=hint))
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
    spread = ("the noise is the spread of the pairs' log-gains with k - 1 in the denominator, as in exercise 1's "
              "interval: with a handful of pairs, dividing by k understates it")
    test = ("the plan sizes exercise 1's test, two-sided at 95%, to find the change 80% of the time: the change's log "
            "must exceed the 95% half-width plus the distance to the 80% point, not the half-width alone")
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


SPEC = LabSpec("09_migration_lab", (
    Exercise("Exercise 1: the paired interval", "paired_interval", _paired_cases, _paired_interval,
             forbidden=("helpers.validation.stats.paired_interval", "helpers.validation.stats.compare_figure"),
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
), allow_processes=True)    # the lab runs the pipeline, which records the git commit it ran from
