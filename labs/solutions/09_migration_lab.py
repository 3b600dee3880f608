# %% [markdown]
# # Lab 09 · Migrating from 2.9 to 2.10: a performance and correctness validation pipeline
#
# | | |
# |---|---|
# | **What you will learn** | how to validate a torch upgrade with numbers: the same pipeline under 2.9.1 and 2.10.0 in two environments, run in interleaved rounds; a paired interval for every timing and the smallest change it could have seen; reference outputs that catch numerics drift; how to decide "regression", "no change of that size" or "cannot tell", find an injected slowdown and drift, and add a workload of your own |
# | **Prerequisites** | lesson 00 (devices, timing), lesson 03 (`F.grouped_mm`), lesson 08 (reproducibility); basic `nn.Module` training; a logarithm and a standard deviation |
# | **Hardware** | any CPU (the driver's quick mode takes a few minutes on 2 cores after the downloads); the driver runs on the CPU unless given `--device` |
# | **Time** | 75 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04); claims about 2.10 are checked against PyTorch's sources |
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
# noise and the decision it allows, find a slowdown and a numerics drift that the lab injects, and add
# a workload of your own to the pipeline.
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
QUICK = False        # quick mode: exercise 5's A/A run takes fewer samples (papermill: -p QUICK True)
RUN_DRIVER = False   # True: run the driver from here (two venvs: minutes, and GBs of downloads the first time)
TORCH_A, TORCH_B = "2.9.1", "2.10.0"
SEED = 0             # which workload and which outputs the injected changes touch (exercises 3 and 4)
WANTED = 0.10        # the smallest change worth acting on, as a fraction (exercise 2)

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
# Write `paired_interval(rounds_a, rounds_b, better)` returning `(gain, low, high)`. `rounds_a` is a
# list of rounds, each a list of per-call samples (as above); `rounds_b` has B's rounds in the same
# order. Then:
#
# 1. each round is summarised by its **median**; round *i* of A and round *i* of B are a pair;
# 2. each pair's gain is A / B for a time (`better == "lower"`) and B / A for a throughput
#    (`"higher"`), so above 1 always means B is better;
# 3. on the log scale, the pairs' log-gains have mean *m* and sample standard deviation *s* (divide by
#    *k* − 1); with *k* pairs the gain is exp(*m*) and the 95% interval is
#    exp(*m* ± *t* · *s* / √*k*), where *t* is the 97.5% quantile of Student's t with *k* − 1 degrees
#    of freedom (`stats.t_quantile(0.975, k - 1)`, or `scipy.stats.t.ppf`);
# 4. a different number of rounds on the two sides, or fewer than two pairs, raises a `ValueError`
#    saying so (one pair says nothing about the noise between runs).
#
# Why a t interval on pairs: the pairing cancels a slow stretch that hit both runs of a pair, and with
# four to eight pairs a resampling of the pairs has too few distinct draws to trust its tails. The
# pipeline's own `stats.paired_interval` and `stats.compare_figure` are off limits here.

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
# `labcheck.inject_slowdown` makes run C: run B with every timing sample of **one** workload (chosen by
# `SEED`) slowed by the same factor in every round, a factor beyond what A against B could detect for
# that workload. Everything else is B's. Compare A with C beside A with B, and write
# `find_slowdown(report_ab, report_ac)` returning
# `{"workload": ..., "slowdowns": {figure: (slowdown, low, high), ...}}`:
#
# - the workload is the one whose figures **became** regressions: regressions in A against C that A
#   against B does not have (a real regression of torch's shows in both reports);
# - for each of its figures that is a regression in A against C: how many times slower C is than A,
#   with its 95% interval (from that row's gain and interval).
#
# A low gain alone is not a finding: a noisy row can have a lower gain than the injected one and still
# an interval that contains 1.

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
# new kernel might change them (a different accumulation order, a lower-precision path). The timings
# are B's. Compare B with it and write `find_drift(report)` returning
# `{"workload": ..., "output": ..., "max_rel_diff": ...}` for the output that drifted **beyond its
# tolerance**. A changed hash alone is not the answer: look at each numerics row's `status`
# (`"identical"`, `"within tolerance"` or `"drift"`) and `max_rel_diff` (max |D − B| / max |B|).

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
for side in ("A", "B", "B", "A", "A", "B"):          # interleaved, as the driver runs them
    rounds[side].append(run_pipeline(quick=True, device="cpu", workloads=[], checks=[], samples=n, progress=False,
                                     extra_workloads={"checkpoint": checkpoint_workload}))
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
# Did the plan hold? The next cell draws 2,000 comparisons of the planned number of pairs, each pair's
# log-gain the true change plus noise at the A/A spread, and decides each with your exercise 1 and 2
# functions: about 80% should come out a regression if the plan is right.

# %% tags=["predict"]
aa_gains = next(r["round_gains"] for r in aa["rows"] if r.get("round_gains"))
planned = pairs_needed(aa_gains, WANTED)
if planned is None or planned > 100:     # a busy machine's A/A run: too many pairs to simulate here
    print(f"this machine's A/A spread asks for {planned or 'more than 1000'} pairs; the plan below uses the recorded "
          "run's per-pair gains of its first timing row instead")
    aa_gains = next(r["round_gains"] for r in report["rows"] if r.get("round_gains"))
    planned = pairs_needed(aa_gains, WANTED)
plan_guess = predict(f"With the {planned} pairs planned for a {WANTED:.0%} slowdown, in what share of 2,000 simulated "
                     "comparisons will decide() say regression?", unit="%", example=95.0)

# %%
rng = np.random.default_rng(SEED)
spread = float(np.std(np.log(aa_gains), ddof=1))
found = 0
for _ in range(2000):
    log_gains = -np.log1p(WANTED) + spread * rng.standard_normal(planned)     # B slower by WANTED, plus noise
    gain, low, high = paired_interval([[1.0]] * planned, [[float(np.exp(-g))] for g in log_gains], "lower")
    found += decide({"gain": gain, "low": low, "high": high, "pairs": planned, "detectable": 0.0}, WANTED) == "regression"
print(f"A/A spread {spread:.3f} (log scale) over {len(aa_gains)} pairs -> {planned} pairs planned for {WANTED:.0%}: "
      f"found in {found / 20:.1f}% of 2,000 simulated comparisons")

# %% tags=["reveal"]
reveal(plan_guess, found / 20, tolerance=1.15,
       why=f"the plan is the fewest pairs with at least 80% power, so at least about 80% of comparisons find a true "
           f"{WANTED:.0%} change (2,000 draws put about 2 points of noise on that share). A whole number of pairs "
           "overshoots, and with few pairs the sum of t quantiles is cautious, so the share can land well above 80%. "
           "The spread was measured from only a few A/A pairs: a real run's own spread can differ, so measure it again "
           "once you have more pairs, and plan with the larger one.");

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
