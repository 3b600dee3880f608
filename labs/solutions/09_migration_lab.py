# %% [markdown]
# # Lab 09 · Migrating from 2.9 to 2.10: a performance and correctness validation pipeline
#
# | | |
# |---|---|
# | **What you will learn** | how to validate a torch upgrade with numbers: the same pipeline under 2.9.1 and 2.10.0 in two environments, run in interleaved rounds; a paired interval for every timing and the smallest change it could have seen; reference outputs that catch numerics drift; how to decide "regression", "no change of that size" or "cannot tell", find an injected slowdown and drift, add a workload of your own, plan the rounds a change needs and test the plan at that size, and what a whole report allows you to claim |
# | **Prerequisites** | lesson 00 (devices, timing), lesson 03 (`F.grouped_mm`), lesson 08 (reproducibility); basic `nn.Module` training; a logarithm and a standard deviation |
# | **Hardware** | any CPU (the driver's quick mode takes a few minutes on 2 cores after the downloads); the driver runs on the CPU unless given `--device` |
# | **Time** | 109 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); claims about 2.10 are checked against PyTorch's sources |
#
# The 2.10 article ends with a migration checklist: keep baselines for ResNet-50 training throughput,
# BERT latency over variable sequence lengths, DLRM memory with grouped GEMM and Stable Diffusion
# iteration time, and test quantization accuracy, custom extensions, AMP "with new scaled_mm operators"
# and DDP synchronisation. `helpers.validation` is that checklist as a pipeline, and its driver runs it
# under two torch versions, each in its own virtual environment, and compares them:
#
# ```bash
# python -m helpers validate matrix 2.9.1 2.10.0 --quick      # or: make validate-matrix
# python -m helpers validate matrix 2.10.0 2.10.0 --quick --same-venv   # A/A: what noise alone does
# ```
#
# The same code has to run on both versions. Where the versions differ in an API the pipeline probes
# each form and records which one ran (`F.grouped_mm` became public in 2.10, PR #168298; before, the op
# was the private `torch._grouped_mm`); the report lists the paths that differ first.
#
# In this lab you read a real 2.9.1 → 2.10.0 report, write the statistic that separates a change from
# noise and the decision it allows, find a slowdown and a numerics drift that the lab injects, add a
# workload of your own to the pipeline, plan how many rounds a change needs and see whether the plan
# holds, and decide what the whole report allows you to say.
#
# Each exercise cell is followed by a check cell: `check(LAB, function)` runs the grader's visible
# cases and prints `✅ ... passed`, or stops with `❌` and a hint.

# %% tags=["colab-setup"]
# Colab only (elsewhere this cell does nothing): clone the course once, install it beside Colab's own torch
# with torchao and torchdata matched to that torch, and work from this notebook's folder of the clone.
import sys

if "google.colab" in sys.modules:
    import os
    import shutil
    import subprocess
    clone = os.environ.get("LABS_COLAB_DIR", "/content/pytorch-210-labs")
    if not os.path.isdir(os.path.join(clone, ".git")):
        shutil.rmtree(clone, ignore_errors=True)   # a clone cut short
        source = os.environ.get("LABS_COLAB_SOURCE", "https://github.com/pytorch-210-labs/pytorch-210-labs")
        subprocess.run(["git", "clone", "--depth", "1", source, clone], check=True)
    subprocess.run([sys.executable, "-m", "helpers.colab", "setup"], cwd=clone, check=True)
    if clone not in sys.path:
        sys.path.insert(0, clone)
    os.environ["LABS_NOTEBOOK"] = "labs/09_migration_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False        # quick mode: fewer samples and pairs for the A/A and injected runs (papermill: -p QUICK True)
RUN_DRIVER = False   # True: run the driver from here (two venvs: minutes, and GBs of downloads the first time)
TORCH_A, TORCH_B = "2.9.1", "2.10.0"
SEED = 0             # which workload and outputs the injected changes touch (exercises 3 and 4), the draws after 6
WANTED = 0.10        # the smallest change worth acting on, as a fraction (exercise 2), and the one injected after 6

# %%
import json
from pathlib import Path

import numpy as np
import torch

from helpers.device import quick_mode
from helpers.grading.checks import check
from helpers.interactive import predict, reveal
from helpers.validation import NotComparable, chart, compare_runs, load_run, table, write_report
from helpers.validation import labcheck, stats
from helpers.validation.matrix import run_matrix

LAB = "09_migration_lab"
QUICK = quick_mode(QUICK)
OUT_DIR = Path("runs") / LAB
OUT_DIR.mkdir(parents=True, exist_ok=True)
if RUN_DRIVER:
    run_matrix([TORCH_A, TORCH_B], quick=True)
FOLDER, SOURCE = labcheck.find_matrix()
PATH_A, PATH_B = labcheck.matrix_paths(FOLDER)
run_a, run_b, report = labcheck.load_matrix(FOLDER)
record = json.loads((FOLDER / "matrix.json").read_text())
print(f"torch in this kernel: {torch.__version__} · quick: {QUICK}")
print(f"report: {SOURCE}")

# %% [markdown]
# ## What the driver did
#
# For each version it made a venv (`.venv-validate-<version>`), installed `torch==<version>` first and
# pinned (so pip never swaps in another build), then `environments/validate.txt` and the package with
# `--no-deps` (the package asks for torch >= 2.10, which would replace 2.9.1). Then it ran
# `python -m helpers validate run --quick` in each, with identical settings, **interleaved**: A B, B A,
# A B, B A. On a shared machine another process can slow a whole stretch of runs; interleaving puts A's
# round *i* and B's round *i* next to each other, so such a stretch hits both runs of a pair. The rounds
# of each version were merged (each sample remembering its round) and the two merged runs compared.

# %%
print(f"versions: {record['versions']} · rounds: {record['rounds']} · threads: {record['threads']} · "
      f"quick: {record['quick']}")
for r in record["runs"]:
    print(f"  {r['name']:<14} round {r['round']}: {r['seconds']:5.0f} s (exit {r['exit_code']})")
for run in (run_a, run_b):
    env = run["environment"]
    print(f"{run['label']}: torch {env['torch']} (CUDA build {env['cuda']}), python {env['python']}, {env['cpu']}")

# %% [markdown]
# ## What the pipeline runs
#
# | workload | model (random weights, nothing downloaded) | figures |
# |---|---|---|
# | `resnet50_train` | ResNet-50 v1.5 (quick: width 16, 64 px, batch 8), SGD, `channels_last`, bf16 autocast where the hardware has native bf16 | images/s, step time |
# | `bert_infer` | BERT-base-shaped encoder on variable-length batches | p50 and p99 latency at batch 1 and at a batch, padded vs jagged nested tensor (and `varlen_attn` where a kernel exists) |
# | `dlrm_moe_train` | DLRM: bottom MLP, `EmbeddingBag` tables, dot interactions, a top-1 mixture-of-experts top | examples/s, step time on this torch's MoE path and with a loop of matmuls on both, peak step memory |
# | `unet_attention` | Stable-Diffusion-style UNet with self- and cross-attention | iterations/s of one denoising step |
#
# | check | what it measures |
# |---|---|
# | `quantization` | int8 weight-only quantization (per channel, as lesson 05) of an MLP trained on scikit-learn's digits, against fp32; the eager `torch.ao.quantization` path too where that API exists |
# | `cpp_extension` | a C++ operator compiled with `load_inline` against *this* torch's headers, loaded, then `opcheck` |
# | `amp_scaled_mm` | autocast bf16 forward/backward against fp32, and an FP8 (e4m3) matmul through the scaled_mm API that runs here |
# | `ddp` | two gloo processes: identical gradients, equal to one process over the whole batch |
#
# Every workload builds its weights and inputs from numpy's PCG64 generator, not torch's, so both
# versions compute the same function on the same input and their outputs can be compared: the
# **reference outputs** stored beside each run. Each step's warnings are recorded too.

# %%
print(table(report))

# %% [markdown]
# Reading the report from the top: the **migration differences** (code paths that differ between the
# versions), then one row per figure: the gain of B over A (above 1: B is better, for a time as for a
# throughput), its 95% interval, the **detectable** change (the smallest change this run would have
# found 80% of the time) and a status. Then the numerics, each check's numbers side by side, the
# warnings B raised that A did not, and the rule the report applied, printed in full.
#
# `validate compare` refuses two runs made at different settings: their figures would not measure the
# same thing.

# %% tags=["nbval-check-output"]
other = json.loads(Path(PATH_B).read_text()) | {"_source": str(PATH_B)}
other["settings"]["quick"] = not other["settings"]["quick"]        # a full run against a quick one
other["settings"]["sizes"]["resnet50_train"]["image"] += 32         # at another image size
try:
    compare_runs(load_run(PATH_A), other)
except NotComparable as exc:
    print("NotComparable; what differs:", [d.split(":")[0] for d in str(exc).split(". Re-run")[0]
                                           .removeprefix("runs are not comparable: ").split("; ")])

# %% [markdown]
# ## The unit of evidence is a pair of rounds
#
# A figure keeps one sample per timed call, and its `groups` say how many samples each round gave.
# Calls within a round share that round's quick or slow stretch, so they are not independent evidence;
# the pairs of rounds are. Here is one figure, round by round: each round's median on each side, and
# the gain of the pair (for a time, A's median over B's).

# %%
fig_a, fig_b = (run["workloads"]["unet_attention"]["figures"]["iteration_time"] for run in (run_a, run_b))
rounds_a, rounds_b = (stats.split_rounds(f["samples"], f.get("groups")) for f in (fig_a, fig_b))
for i, (ra, rb) in enumerate(zip(rounds_a, rounds_b), 1):
    ma, mb = np.median(ra), np.median(rb)
    print(f"round {i}: A {ma * 1e3:6.2f} ms ({len(ra)} calls)  B {mb * 1e3:6.2f} ms ({len(rb)} calls)  "
          f"gain {ma / mb:.3f}")


# %% [markdown]
# ## Exercise 1: the paired interval
#
# Write `paired_interval(rounds_a, rounds_b, better)` returning `(gain, low, high)` for one figure.
# `rounds_a` is a list of rounds, each a list of per-call samples (as above); `rounds_b` has B's rounds in
# the same order, B's round *i* made next to A's round *i*. `better` is `"lower"` for a time and
# `"higher"` for a throughput. What the three numbers must be:
#
# - `gain` is the one the report prints: the geometric mean of the pairs' gains, a pair's gain comparing
#   the two rounds' median calls, above 1 when B is the better one (for a time as for a throughput);
# - `low` and `high` bound a 95% interval for it that holds with as few as two pairs: when the pairs'
#   log-gains are normally distributed, 95% of such intervals contain the true gain, missing it as often
#   above as below, with the noise between runs known only from these pairs;
# - a slow stretch of the machine that hits both runs of a pair must not widen it, and the calls within
#   a round, which share that round's stretch, are not separate evidence;
# - a different number of rounds on the two sides, or fewer than two pairs, raises a `ValueError`
#   saying why (one pair says nothing about the noise between runs).
#
# How to get there is yours to decide. With four to eight pairs, a resampling of the pairs has too few
# distinct draws to trust its tails. `stats.t_quantile(p, df)` gives Student's t quantiles (so does
# `scipy.stats.t.ppf`); the pipeline's own `stats.paired_interval` and `stats.compare_figure` are off
# limits.

# %%
def paired_interval(rounds_a, rounds_b, better):
    ### BEGIN SOLUTION
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError(f"need the same number of rounds on each side, at least two; got {len(rounds_a)} "
                         f"and {len(rounds_b)}")
    med_a = np.array([np.median(r) for r in rounds_a])
    med_b = np.array([np.median(r) for r in rounds_b])
    log_gains = np.log(med_a / med_b) if better == "lower" else np.log(med_b / med_a)
    k = len(log_gains)
    half = stats.t_quantile(0.975, k - 1) * log_gains.std(ddof=1) / np.sqrt(k)
    m = log_gains.mean()
    return float(np.exp(m)), float(np.exp(m - half)), float(np.exp(m + half))
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, paired_interval)

# %%
gain, low, high = paired_interval(rounds_a, rounds_b, "lower")
row = next(r for r in report["rows"] if (r["workload"], r["figure"]) == ("unet_attention", "iteration_time"))
print(f"yours:      UNet step time, B over A {gain:.3f}x [{low:.3f}, {high:.3f}] from {len(rounds_a)} pairs")
print(f"the report: UNet step time, B over A {row['gain']:.3f}x [{row['low']:.3f}, {row['high']:.3f}], "
      f"detectable {row['detectable']:.0%}")


# %% [markdown]
# ## Exercise 2: what the interval lets you decide
#
# "Within noise" alone cannot be acted on: it may mean "no change" or "this run could not have seen
# one". Write `decide(row, wanted)`, where `row` has the keys `gain`, `low`, `high` (the 95% interval of
# exercise 1), `pairs` and `detectable` of a report row (its status removed: you decide), and `wanted` is
# the smallest change worth acting on (a fraction: 0.10 is 10%). `detectable` is the smallest change this
# run would have found 80% of the time, at its own noise. Return one of four words:
#
# - `"regression"` or `"improvement"`: the run shows, at 95% confidence, a change in that direction,
#   and the measured change is at least the pipeline's floor `stats.MIN_CHANGE` (a real but tiny change
#   is not worth a ticket);
# - `"no change of that size"`: it shows no such change, and had B changed by `wanted` it would have;
# - `"cannot tell"`: anything else, including a row without an interval (`low` is None).
#
# Which numbers of the row answer each question is yours to decide. `stats.verdict` is off limits.

# %%
def decide(row, wanted):
    ### BEGIN SOLUTION
    if row.get("low") is None:
        return "cannot tell"
    if row["high"] < 1 and row["gain"] < 1 / (1 + stats.MIN_CHANGE):
        return "regression"
    if row["low"] > 1 and row["gain"] > 1 + stats.MIN_CHANGE:
        return "improvement"
    return "no change of that size" if row["detectable"] <= wanted else "cannot tell"
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, decide)

# %% [markdown]
# The recorded report's timing rows, decided at a `WANTED` change:

# %%
timed = [r for r in report["rows"] if r.get("pairs")]
decisions = {f"{r['workload']}/{r['figure']}": decide(r, WANTED) for r in timed}
for name, decision in decisions.items():
    row = next(r for r in timed if f"{r['workload']}/{r['figure']}" == name)
    detectable = "-" if row["detectable"] is None else f"{row['detectable']:.0%}"
    print(f"{name:<34} detectable {detectable:>6}  -> {decision}")
print({d: list(decisions.values()).count(d) for d in dict.fromkeys(decisions.values())})

# %% [markdown]
# ## Exercise 3: find the injected slowdown
#
# `labcheck.inject_slowdown` makes run C: run B with **one** workload (chosen by `SEED`) slowed in every
# round, by more than A against B could detect for it; everything else is B's. You are the reviewer who
# gets A against B and A against C. Write `find_slowdown(report_ab, report_ac)` returning
# `{"workload": ..., "slowdowns": {figure: (slowdown, low, high), ...}}`:
#
# - the workload that was slowed between B and C;
# - for each of its figures that A against C calls a regression: how many times slower C is than A
#   (1.5: C takes 1.5 times as long, or gets through 1 / 1.5 as much per second), with its 95% interval.
#
# What can mislead you: B may have regressions of its own (torch's), and a noisy figure can have a lower
# gain than the injected ones without being a finding.

# %%
PATH_C = labcheck.inject_slowdown(PATH_A, PATH_B, OUT_DIR / "run_c.json", seed=SEED)
run_c = load_run(PATH_C)
report_ac = compare_runs(run_a, run_c)


def find_slowdown(report_ab, report_ac):
    ### BEGIN SOLUTION
    before = {(r["workload"], r["figure"]) for r in report_ab["rows"] if r.get("status") == "regression"}
    new = [r for r in report_ac["rows"]
           if r.get("status") == "regression" and (r["workload"], r["figure"]) not in before]
    workload = new[0]["workload"]
    return {"workload": workload,
            "slowdowns": {r["figure"]: (1 / r["gain"], 1 / r["high"], 1 / r["low"]) for r in report_ac["rows"]
                          if r["workload"] == workload and r.get("status") == "regression"}}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, find_slowdown)

# %%
found = find_slowdown(report, report_ac)
for figure, (slowdown, low, high) in found["slowdowns"].items():
    print(f"{found['workload']}/{figure}: C is {slowdown:.2f}x slower than A [{low:.2f}, {high:.2f}]")
truth = compare_runs(run_b, run_c)      # B against C: the injected factor itself
factor = 1 / next(r["gain"] for r in truth["rows"] if r["workload"] == found["workload"] and r.get("pairs"))
print(f"the injected factor (B against C): {factor:.2f}; inside every interval above: "
      f"{all(low <= factor <= high for _, low, high in found['slowdowns'].values())}")

# %% [markdown]
# B against C recovers the factor exactly, with an interval of zero width: every round moved by the same
# factor, so the pairs agree perfectly. A against C measures it through the real run-to-run noise of
# the two versions, and that interval is what a real regression would come with.

# %% [markdown]
# ## Exercise 4: find the drift
#
# `labcheck.inject_drift` makes another run: run B with two of its reference outputs changed the way a
# new kernel might change them, one by a different accumulation order, one beyond what its dtype allows.
# The timings are B's. Compare B with it and write `find_drift(report)` returning
# `{"workload": ..., "output": ..., "max_rel_diff": ...}` for the output that drifted beyond its
# tolerance (`max_rel_diff`: the report's max |D − B| / max |B| of that output). The numerics rows of
# the report are in `report["numerics"]`; which of their fields answer the question is yours to find
# (print one).

# %%
PATH_D = labcheck.inject_drift(PATH_B, OUT_DIR / "run_d.json", seed=SEED)
report_d = compare_runs(load_run(PATH_B), load_run(PATH_D))


def find_drift(report):
    ### BEGIN SOLUTION
    row = next(n for n in report["numerics"] if n["status"] == "drift")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, find_drift)

# %%
for n in report_d["numerics"]:
    if n["status"] != "identical":
        print(f"{n['workload']}/{n['output']}: {n['status']}, max rel diff {n['max_rel_diff']:.1e} "
              f"(tolerance {n['tolerance']:.0e} for {n['dtype_a']}; compared: {n.get('compared', 'stored elements')})")

# %% [markdown]
# ## Exercise 5: a workload of your own
#
# The checklist leaves out serialisation: a checkpoint written by one version and read by another.
# Write `checkpoint_workload(quick, device, compile=False, samples=None)`, a workload the pipeline can
# run beside its own (`run_pipeline(extra_workloads={name: function})`):
#
# - a small model (e.g. `nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))`) with
#   weights from `models.seed_parameters_(model, seed=...)` and an input from `models.randn(...)`:
#   numpy's generator, the same on every torch, never torch's global random state;
# - one **round trip**: `torch.save` of its `state_dict` into an `io.BytesIO`, then
#   `torch.load(..., weights_only=True)` into a fresh model (`load_state_dict`); check that the
#   reloaded model computes what the original does, and raise an error if it does not;
# - `samples` round trips timed one call at a time (default 20), each call a whole round trip:
#   `workloads.sample_calls` does that;
#   `workloads.figure(seconds)` makes a time figure, `workloads.figure(seconds, unit="trips/s",
#   better="higher")` a rate;
# - the reloaded model's output recorded with `reference.record({"name": tensor})`, which returns
#   `(references, tensors)`;
# - returned as every workload's record: `{"config": {...}, "figures": {...}, "paths": {}, "notes": {},
#   "references": references, "_tensors": tensors}`.
#
# The check runs it as the pipeline would, and once A/A: two interleaved rounds a side, merged, compared.

# %%
import io

from torch import nn

from helpers.validation import merge_runs, models, reference, run_pipeline, workloads
from helpers.validation.pipeline import calibration


def checkpoint_workload(quick, device, compile=False, samples=None):
    ### BEGIN SOLUTION
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
    seconds = workloads.sample_calls({"round_trip": round_trip}, device, samples or 20)["round_trip"]
    references, tensors = reference.record({"reloaded_output": out})
    return {"config": {"layers": [64, 128, 10], "batch": 32}, "figures": {"round_trip_time": workloads.figure(seconds)},
            "paths": {}, "notes": {}, "references": references, "_tensors": tensors}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, checkpoint_workload)

# %%
n = 5 if QUICK else 30
rounds = {"A": [], "B": []}
for side in ("A", "B", "B", "A") * 2:                # interleaved, as the driver runs them
    # one thread, as the driver's quick rounds: each call is timed by its CPU time, which other work on the
    # machine does not stretch
    rounds[side].append(run_pipeline(quick=True, device="cpu", threads=1, workloads=[], checks=[], samples=n,
                                     progress=False, extra_workloads={"checkpoint": checkpoint_workload}))
aa = compare_runs(merge_runs(rounds["A"]), merge_runs(rounds["B"]))
for row in aa["rows"]:
    print(f"{row['figure']}: gain {row['gain']:.3f} [{row['low']:.3f}, {row['high']:.3f}], "
          f"detectable {row['detectable']:.0%} -> {row['status']}; decided at {WANTED:.0%}: {decide(row, WANTED)}")
    print("  per-pair gains:", [round(g, 2) for g in row["round_gains"]])
print("numerics:", [(r["output"], r["status"]) for r in aa["numerics"]])
print("A/A calibration:", calibration(aa))


# %% [markdown]
# Both sides are this kernel's torch, so any timing "finding" here would be a false alarm (the 95%
# interval allows one in twenty), and the outputs must be identical. To compare the workload across two
# versions it has to run in each version's environment, as the built-in ones do under the driver.

# %% [markdown]
# ## Exercise 6: how many rounds?
#
# The A/A run above gave a spread of per-pair gains, and with it a detectable change that is likely far
# above `WANTED`. Before the next comparison, plan it: write `pairs_needed(gains, change)`, where `gains`
# are the per-pair gains of an A/A comparison (a row's `round_gains`: what noise alone does between the
# two sides) and `change` a fraction. Return the fewest pairs of rounds (at least 2) with which the paired
# test of exercise 1, at 95%, finds a true change of `change` in a figure with this noise at least 80% of
# the time; `None` if more than 1000 would be needed. Fewer than two gains say nothing about the noise:
# raise a `ValueError` saying so. `stats.rounds_needed` and the pipeline's `plan` are off limits.

# %%
def pairs_needed(gains, change):
    ### BEGIN SOLUTION
    if len(gains) < 2:
        raise ValueError(f"need the gains of at least two pairs to measure the noise, got {len(gains)}")
    spread = float(np.std(np.log(gains), ddof=1))
    effect = np.log1p(change)
    for k in range(2, 1001):
        if (stats.t_quantile(0.975, k - 1) + stats.t_quantile(0.8, k - 1)) * spread / np.sqrt(k) <= effect:
            return k
    return None
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, pairs_needed)

# %% [markdown]
# ## Did the plan hold? A slowdown of the planned size
#
# A plan is a promise about a run not made yet: with the pairs it asks for, a true change of `WANTED` is
# found at least 80% of the time, if the noise is what the A/A run measured. Put it to the test at the
# size it was made for (a 2x slowdown would prove nothing: any plan finds that). The next cells plan from
# the A/A run above, make B `WANTED` slower (each timed round trip of your workload is followed, inside
# its timed call, by a spin that uses `WANTED` times the CPU time the round trip used), run the planned
# pairs interleaved, and decide with your exercise 1 and 2 functions.

# %%
aa_gains = next(r["round_gains"] for r in aa["rows"] if r.get("round_gains"))
planned = pairs_needed(aa_gains, WANTED)
AFFORD = 30 if QUICK else 150            # the most pairs this notebook runs (each pair: two runs of the workload)
pairs = min(planned or AFFORD, AFFORD)
plan_spread = float(np.std(np.log(aa_gains), ddof=1))
print(f"A/A: {len(aa_gains)} pairs, spread {plan_spread:.3f} (log scale) -> {planned or 'more than 1000'} pairs "
      f"planned for a {WANTED:.0%} change; this run: {pairs} pairs")
if pairs != planned:
    print("this machine's A/A noise asks for more pairs than this notebook runs: the run below is smaller than "
          "the plan, so expect it to find the change less often than 80% of the time")

# %% tags=["predict"]
plan_guess = predict(f"B is now {WANTED:.0%} slower. With {pairs} pairs of rounds, what will your decide() say "
                     f"at a wanted change of {WANTED:.0%}?",
                     options=["regression", "cannot tell", "no change of that size", "improvement"],
                     example="regression")

# %%
slower = labcheck.slowed(checkpoint_workload, WANTED)
rounds = {"A": [], "B": []}
for i in range(pairs):
    for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
        workload = slower if side == "B" else checkpoint_workload
        rounds[side].append(run_pipeline(quick=True, device="cpu", threads=1, workloads=[], checks=[], samples=n,
                                         progress=False, extra_workloads={"checkpoint": workload}))
injected = next(r for r in compare_runs(merge_runs(rounds["A"]), merge_runs(rounds["B"]))["rows"]
                if r.get("round_gains"))
outcome = decide(injected, WANTED)


def share_found(spread, k, draws=2000):
    """The share of simulated runs of k pairs, each pair's log-gain a true WANTED slowdown plus noise at
    `spread`, that the report's rule calls a regression."""
    d = -np.log1p(WANTED) + spread * np.random.default_rng(SEED).standard_normal((draws, k))
    half = stats.t_quantile(0.975, k - 1) * d.std(axis=1, ddof=1) / np.sqrt(k)
    return float(np.mean((d.mean(axis=1) + half < 0) & (d.mean(axis=1) < -np.log1p(stats.MIN_CHANGE))))


at_plan, at_run = share_found(plan_spread, pairs), share_found(injected["sd_log"], pairs)
truth = 1 / (1 + WANTED)                  # B over A for a time B takes 1 + WANTED times as long
covered = injected["low"] <= truth <= injected["high"]
# how far the injected change lies from the measured gain, in half-widths of the interval (beyond 1: outside)
off = abs(np.log(injected["gain"] / truth)) / np.log(injected["high"] / injected["gain"])
print(f"B over A: {injected['gain']:.3f}x [{injected['low']:.3f}, {injected['high']:.3f}] from {pairs} pairs "
      f"(injected: {truth:.3f}x), detectable {injected['detectable']:.0%} -> your decide(): {outcome}")
print(f"spread of this run's pairs {injected['sd_log']:.3f}, the plan's {plan_spread:.3f}; found in {at_plan:.0%} of "
      f"2,000 simulated runs at the plan's spread, {at_run:.0%} at this run's")

# %% tags=["reveal"]
reveal(plan_guess, outcome,
       why=f"{'the slowdown was found' if outcome == 'regression' else 'the slowdown was missed'} in this one run, "
           f"and its interval {'contains' if covered else 'misses'} the injected {truth:.3f}x"
           + ("" if covered else
              f" by {off:.1f} half-widths, which a 95% interval does in one run in twenty when its assumptions hold. "
              "Where other work keeps the cores busy they need not: the two runs of a pair no longer share one "
              "stretch of the machine, and no plan holds there (measure where nothing else runs)")
           + f". A plan at 80% power misses a true {WANTED:.0%} change in up to one run in five, so one run neither "
           f"proves nor breaks it; the simulation says how often: {pairs} pairs find it in {at_plan:.0%} of runs at "
           f"the spread the plan assumed and in {at_run:.0%} at the spread this run had (2,000 draws put about 1 "
           f"point of noise on each share). The plan's spread came from {len(aa_gains)} A/A pairs; "
           + ("this run had fewer pairs than the plan asked for, so 80% was never promised here."
              if pairs != planned else
              "this run was noisier than that, so the plan promised more than it could keep; plan from more A/A "
              "pairs, or with the larger spread." if at_run < 0.8 and injected["sd_log"] > plan_spread else
              "at this run's noise the plan's promise held; a few A/A pairs can misjudge the noise either way, so "
              "measure it again once you have more pairs."));


# %% [markdown]
# ## Exercise 7: faster across the board?
#
# Release notes and upgrade tickets ask one question of a whole report: is B faster across the board?
# Write `across_the_board(report)` returning `{"claim": ..., "gain": ..., "low": ..., "high": ...}`, where
# `report` is a report as `compare_runs` makes it:
#
# - `gain`: B's typical gain over the report's distinct timed figures, the geometric mean of their gains,
#   each figure weighing the same. Only the figures with an interval enter (a count of bytes, a p99 not
#   reported or a figure whose rounds could not be paired says nothing here), and a time and its rate are
#   the same calls, counted once (the report marks the rate's row with `same_as`);
# - `low`, `high`: a 95% interval for that gain. A row's `round_gains` are its per-pair gains in round
#   order, and every figure has the same pairs: round *i* of every figure comes from the same two runs,
#   so a stretch that slowed B's run of a pair could slow all its figures. The interval must hold with
#   that: 95% of such intervals contain the true typical gain, however much of their noise the figures
#   of a round share;
# - `claim`: `"faster"` or `"slower"` when the run shows, at that 95%, on which side of 1 B's typical gain
#   lies; `"cannot tell"` when it does not;
# - a report with no figure that has an interval raises a `ValueError` saying so.
#
# Your `paired_interval` of exercise 1 may help; while it grades this exercise, the grader runs a right one
# in its place, so a mistake there costs marks in exercise 1 only.

# %%
def across_the_board(report):
    ### BEGIN SOLUTION
    told = [r for r in report["rows"] if r.get("low") is not None and not r.get("same_as")]
    if not told:
        raise ValueError("no figure of this report has an interval (two or more pairs of rounds): nothing to pool")
    # one value per pair of rounds, the figures' mean log-gain: the pairs, not the figures, are independent
    per_round = np.log(np.array([r["round_gains"] for r in told])).mean(axis=0)
    k = len(per_round)
    half = stats.t_quantile(0.975, k - 1) * per_round.std(ddof=1) / np.sqrt(k)
    gain, low, high = (float(np.exp(per_round.mean() + h)) for h in (0, -half, half))
    claim = "faster" if low > 1 else "slower" if high < 1 else "cannot tell"
    return {"claim": claim, "gain": gain, "low": low, "high": high}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check(LAB, across_the_board)

# %% tags=["predict"]
distinct = [r for r in report["rows"] if r.get("low") is not None and not r.get("same_as")]
above = sum(r["gain"] > 1 for r in distinct)
board_guess = predict(f"{above} of this report's {len(distinct)} distinct timed figures have a gain above 1, "
                      f"{sum(r['status'] == 'improvement' for r in distinct)} of them a finding on its own. Is "
                      f"{TORCH_B} faster than {TORCH_A} across the board?",
                      options=["faster", "slower", "cannot tell"], example="faster")

# %%
board = across_the_board(report)
print(f"B over A across the board: {board['gain']:.3f}x [{board['low']:.3f}, {board['high']:.3f}] over "
      f"{distinct[0]['pairs']} pairs of rounds -> {board['claim']}")
print("each figure's gain:", [round(r["gain"], 3) for r in distinct])

# %% tags=["reveal"]
reveal(board_guess, board["claim"],
       why=f"{above} gains above 1 out of {len(distinct)} are not {len(distinct)} pieces of evidence: the figures were "
           f"timed in the same {distinct[0]['pairs']} pairs of rounds and share whatever those rounds did to the "
           f"machine. Pooled over those pairs, B's typical gain is {board['gain']:.3f}x with a 95% interval "
           f"of [{board['low']:.3f}, {board['high']:.3f}]. What that allows you to say: "
           + (f"on these workloads, at this size and on this machine, {TORCH_B} is faster on average, by "
              f"{board['low'] - 1:.1%} to {board['high'] - 1:.1%}." if board["claim"] == "faster" else
              f"on these workloads, at this size and on this machine, {TORCH_B} is slower on average, its typical "
              f"gain between {board['low']:.3f}x and {board['high']:.3f}x." if board["claim"] == "slower" else
              f"on these workloads, at this size and on this machine, {TORCH_B} is not slower on average by more "
              f"than {1 / board['low'] - 1:.1%} nor faster by more than {board['high'] - 1:.1%}; not that it is "
              f"faster across the board. More pairs of rounds narrow that interval; more figures timed in the same "
              f"rounds narrow only the part of the noise they do not share."));

# %% [markdown]
# ## What the numbers mean
#
# Every figure below is computed from the report this notebook loaded.

# %%
told = [r for r in report["rows"] if r.get("low") is not None]
gains = [g for r in told for g in r["round_gains"]]
statuses = [n["status"] for n in report["numerics"]]
print(f"numerics: {statuses.count('identical')} of {len(statuses)} outputs bit-identical, "
      f"{statuses.count('within tolerance')} within tolerance, {statuses.count('drift')} drifted")
print(f"per-pair gains over every timing row: {min(gains):.2f} to {max(gains):.2f}")
print(f"detectable change per row: {min(r['detectable'] for r in told):.0%} to "
      f"{max(r['detectable'] for r in told):.0%} (median {np.median([r['detectable'] for r in told]):.0%})")
print(f"rows not reported: {sum(r.get('status') == 'not reported' for r in report['rows'])}; findings: "
      f"{len(report['regressions'])}; warnings new or gone in B: {len(report['warnings'])}")
for w in report["warnings"]:
    print(f"  {w['status']}: {w['step']} {w['category']}: {w['message'][:90]}")
for m in report["migrations"]:
    print(f"  path {m['workload']} {m['what']}: {m['a']} -> {m['b']}")

# %% [markdown]
# - **Numerics first.** Before any timing, the same weights on the same input must give the same
#   output. The report says which outputs are bit-identical and how far the others moved against their
#   tolerance; a hash alone would call every changed bit a difference, a tolerance alone would miss a
#   bit-identical guarantee that breaks.
# - **Noise.** The spread of the per-pair gains printed above is the run-to-run noise of this machine,
#   and the detectable change is what it costs: a row "within noise" says nothing about changes
#   smaller than its detectable change. More rounds, or a quieter machine, lower it.
# - **Across the board.** The figures of a report share its rounds, so their gains move together: a
#   claim about all of them rests on the pairs of rounds, pooled, not on how many figures came out
#   above 1 (exercise 7).
# - **Tails.** A p99 from too few calls per round is little more than the slowest call; the report
#   leaves it out until a round has enough calls for it, and says how many it had.
# - **Paths and warnings.** A changed code path or a new deprecation warning is listed before the
#   timings, so a change in a figure can be traced to it, and an API on its way out is seen while it
#   still works. A warning both versions raise is no difference, yet it can still be a finding: one that
#   names a removal version B has already reached.
# - **What it does not cover yet.** NCCL (it needs two GPUs: the DDP check says so), compile times and
#   recompile counts per workload, and a checkpoint written by one version and read by the other
#   (exercise 5 times the round trip within one version).
#
# Open the full report (chart with the intervals, each check's numbers, the environment differences):

# %%
REPORT_PATH = write_report(report, OUT_DIR / "report.html")
print("written:", REPORT_PATH)
chart(report).show()
