# %% [markdown]
# # Lab 09 · Migrating from 2.9 to 2.10: a performance and correctness validation pipeline
#
# | | |
# |---|---|
# | **What you will learn** | how to validate a torch upgrade with numbers: the same pipeline under 2.9.1 and 2.10.0 in two environments, a noise interval for every timing, reference outputs that catch numerics drift, checks compared number by number; how to tell a regression from noise and find a drift |
# | **Prerequisites** | lesson 00 (devices, timing), lesson 03 (`F.grouped_mm`), lesson 08 (reproducibility); basic `nn.Module` training |
# | **Hardware** | any CPU (the driver's quick mode takes a few minutes on 2 cores after the downloads); on a GPU the workloads and the AMP check run there |
# | **Time** | 45 minutes |
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
# ```
#
# The same code has to run on both versions. Where 2.10 added an API the pipeline uses it where it
# exists and the older form where it does not, and records which one ran: the DLRM's mixture of experts
# runs as one `F.grouped_mm` per layer on 2.10 and as a loop of matmuls on 2.9 (`F.grouped_mm` became
# public in 2.10, PR #168298); FP8 goes through `F.scaled_mm` where it runs and `torch._scaled_mm`
# otherwise; `varlen_attn` (2.10) is timed where it has a kernel. Those differences *are* the migration,
# and the report lists them first.
#
# In this lab you read a real 2.9.1 → 2.10.0 report, write the statistic that separates a regression from
# noise, read the migration off the report, and find a numerics drift that the lab injects.

# %% tags=["parameters"]
QUICK = False        # quick mode: the A/A demonstration uses fewer samples (papermill: -p QUICK True)
RUN_DRIVER = False   # True: run the driver from here (two venvs: minutes, and GBs of downloads the first time)
TORCH_A, TORCH_B = "2.9.1", "2.10.0"
SEED = 0             # which outputs the injected change touches in exercise 4

# %%
import json
from pathlib import Path

import torch

from helpers.device import quick_mode
from helpers.validation import NotComparable, chart, compare_runs, load_run, run_pipeline, table, write_report
from helpers.lab_checks import check
from helpers.validation import labcheck, stats
from helpers.validation.matrix import run_matrix

QUICK = quick_mode(QUICK)
OUT_DIR = Path("runs") / "09_migration_lab"
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
# A B, B A. On a shared machine another process can slow a whole stretch of runs; interleaving puts such
# a stretch on both sides rather than one. The rounds of each version were merged (their samples
# pooled, each sample remembering its round) and the two merged runs compared.

# %%
print(f"versions: {record['versions']} · rounds: {record['rounds']} · threads: {record['threads']} · "
      f"quick: {record['quick']}")
for r in record["runs"]:
    print(f"  {r['name']:<14} round {r['round']}: {r['seconds']:5.0f} s (exit {r['exit_code']})")
print(f"driver total: {record['total_seconds']:.0f} s")
for run in (run_a, run_b):
    env = run["environment"]
    print(f"{run['label']}: torch {env['torch']} (CUDA build {env['cuda']}), python {env['python']}, {env['cpu']}")

# %% [markdown]
# ## What the pipeline runs
#
# | workload | model (random weights, nothing downloaded) | figures |
# |---|---|---|
# | `resnet50_train` | ResNet-50 v1.5 (25.6 M parameters at width 64; quick: width 16, 64 px, batch 8), SGD, `channels_last`, bf16 autocast where the hardware has native bf16 | images/s, step time |
# | `bert_infer` | BERT-base-shaped encoder (768/12/12 in full mode) on variable-length batches | p50 and p99 latency at batch 1 and at a batch, padded (key-padding mask) vs jagged nested tensor vs `varlen_attn` on packed tokens (2.10, where a kernel exists) |
# | `dlrm_moe_train` | DLRM: bottom MLP, `EmbeddingBag` tables (sparse gradients, Adagrad), dot interactions, a top-1 mixture-of-experts top | examples/s, step time on this torch's MoE path and with the loop on both, peak step memory; table and optimizer-state bytes in its config |
# | `unet_attention` | Stable-Diffusion-style UNet: ResNet blocks and transformer blocks with self-attention, cross-attention to a 77-token text context, GEGLU | iterations/s of one denoising step |
#
# | check | what it measures |
# |---|---|
# | `quantization` | post-training quantization of an MLP trained on scikit-learn's digits (1,797 labelled 8×8 images shipped inside the package): fp32 vs dynamic int8 vs static int8 calibrated on training images |
# | `cpp_extension` | a C++ operator compiled with `load_inline` against *this* torch's headers (one build directory per torch version) and loaded into its libtorch, then `opcheck` |
# | `amp_scaled_mm` | autocast bf16 forward/backward against fp32, and an FP8 (e4m3) matmul with per-tensor scales through the scaled_mm API that runs here |
# | `ddp` | two gloo processes: bitwise-identical gradients, equal to one process over the whole batch |
#
# Every workload builds its weights and inputs from numpy's PCG64 generator, not torch's, so both
# versions compute the same function on the same input and their outputs can be compared: those are
# the **reference outputs** (hashes and tensors) stored beside each run.

# %%
print(table(report))

# %% [markdown]
# Reading the report from the top: the **migration differences** are code paths that differ between the
# two versions (the MoE's `grouped_mm` against the loop, the scaled_mm API, varlen attention). Then one
# row per figure: the gain of B over A (above 1: B is better, for a time as for a throughput), its 95%
# interval, and a verdict. Then the numerics: each reference output of B against A. Then each check
# with the numbers it measured on each side, not only pass or fail.
#
# `python -m helpers validate compare` refuses two runs made at different settings (quick mode, sizes,
# samples, compile, threads, device): their figures would not measure the same thing.

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
# ## Exercise 1: the noise interval
#
# Each figure stores one sample per timed call. The gain of B over A is `median(A) / median(B)` for a
# time (`better == "lower"`) and `median(B) / median(A)` for a throughput (`"higher"`). How sure are we
# of it? Resample: draw `len(A)` values from A *with replacement* and `len(B)` from B, compute the gain
# of the resampled medians, repeat `n_boot` times; the 2.5th and 97.5th percentiles of those gains are a
# 95% interval (a percentile bootstrap).
#
# Write `median_gain_interval(samples_a, samples_b, better)` returning `(gain, low, high)`, with
# `numpy.random.default_rng(seed)` for the draws. (The pipeline's own version, `stats.bootstrap_gain`,
# is two-level when a run has several rounds: it first draws rounds, then samples within them. You
# write the one-level version.)

# %%
import numpy as np


def median_gain_interval(samples_a, samples_b, better, n_boot=2000, seed=0):
    ### BEGIN SOLUTION
    a, b = np.asarray(samples_a, dtype=float), np.asarray(samples_b, dtype=float)
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, len(a), (n_boot, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (n_boot, len(b)))], axis=1)
    gains = ma / mb if better == "lower" else mb / ma
    gain = np.median(a) / np.median(b) if better == "lower" else np.median(b) / np.median(a)
    low, high = np.percentile(gains, [2.5, 97.5])
    return float(gain), float(low), float(high)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("09_migration_lab", median_gain_interval)


# %% [markdown]
# ## Exercise 2: a regression or noise?
#
# Write `verdict(gain, low, high)`: `"regression"` when the whole interval lies below 1 **and** the gain
# is below `1 / (1 + stats.MIN_CHANGE)` (a 2% floor: a real but tiny change is not worth a ticket);
# `"improvement"` when the whole interval lies above 1 and the gain is above `1 + stats.MIN_CHANGE`;
# otherwise `"within noise"`. An interval that contains 1 means the data cannot tell B from A.
#
# (The report adds one more condition when runs have rounds: every pair of rounds, A's round *i*
# against B's round *i*, must show the change in the same direction. A slow stretch that hit one round
# of one side then cannot pass for a regression.)

# %%
def verdict(gain, low, high):
    ### BEGIN SOLUTION
    if high < 1 and gain < 1 / (1 + stats.MIN_CHANGE):
        return "regression"
    if low > 1 and gain > 1 + stats.MIN_CHANGE:
        return "improvement"
    return "within noise"
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("09_migration_lab", verdict)

# %% [markdown]
# ### What noise alone looks like
#
# Two runs of the same workload in this kernel, one after the other: an A/A comparison. Every gain here
# is noise, and its interval should contain 1. Run the cell a few times: on a busy machine you will see
# gains of ±10% or more with intervals that still contain 1, and now and then one that does not (a 95%
# interval misses 5% of the time; the pipeline's 2% floor and the round rule remove most of those).

# %%
n = 6 if QUICK else 20
aa = [run_pipeline(quick=True, threads=1, workloads=["unet_attention"], checks=[], samples=n, progress=False)
      for _ in range(2)]
for row in compare_runs(*aa)["rows"]:
    print(f"{row['figure']:<18} gain {row['gain']:.3f}  interval [{row['low']:.3f}, {row['high']:.3f}]  {row['status']}")


# %% [markdown]
# ## Exercise 3: read the migration off the report
#
# Write `read_migration(run_a, run_b, report)` returning a dict with these keys, each read from its
# arguments (no numbers typed by hand; the grader also calls it on other runs):
#
# - `"moe_path"`: `(A, B)` (A from `run_a`, B from `run_b`), the DLRM's MoE path in each run (`run["workloads"]["dlrm_moe_train"]["paths"]["moe"]`);
# - `"scaled_mm_path"`: `(A, B)`, the scaled_mm API the AMP check ran (`run["checks"]["amp_scaled_mm"]["paths"]["scaled_mm"]`);
# - `"static_int8_accuracy"`: `(A, B)`, the quantization check's static int8 test accuracy (in its `details`);
# - `"dlrm_step"`: `(gain, low, high, status)` of the report row `dlrm_moe_train` / `step_time`;
# - `"regressions"`: the `(workload, figure)` pairs of the report's rows whose status is `"regression"`.

# %%
def read_migration(run_a: dict, run_b: dict, report: dict) -> dict:
    ### BEGIN SOLUTION
    rows = {(r["workload"], r["figure"]): r for r in report["rows"]}
    step = rows[("dlrm_moe_train", "step_time")]
    return {
        "moe_path": tuple(r["workloads"]["dlrm_moe_train"]["paths"]["moe"] for r in (run_a, run_b)),
        "scaled_mm_path": tuple(r["checks"]["amp_scaled_mm"]["paths"]["scaled_mm"] for r in (run_a, run_b)),
        "static_int8_accuracy": tuple(r["checks"]["quantization"]["details"]["static_int8_accuracy"]
                                      for r in (run_a, run_b)),
        "dlrm_step": (step["gain"], step["low"], step["high"], step["status"]),
        "regressions": [(r["workload"], r["figure"]) for r in report["rows"] if r.get("status") == "regression"],
    }
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("09_migration_lab", read_migration)

# %%
answers = read_migration(run_a, run_b, report)
rows = {(r["workload"], r["figure"]): r for r in report["rows"]}
step, loop = rows[("dlrm_moe_train", "step_time")], rows[("dlrm_moe_train", "loop_step_time")]
print(f"MoE: {answers['moe_path'][0]} on {run_a['torch']}, {answers['moe_path'][1]} on {run_b['torch']}")
print(f"DLRM step, each version's own MoE path: B/A gain {step['gain']:.2f} "
      f"[{step['low']:.2f}, {step['high']:.2f}] -> {step['status']}")
print(f"DLRM step, the loop on both:             B/A gain {loop['gain']:.2f} "
      f"[{loop['low']:.2f}, {loop['high']:.2f}] -> {loop['status']}")
print(f"FP8 matmul: {answers['scaled_mm_path'][0]} on A, {answers['scaled_mm_path'][1]} on B")
print(f"static int8 accuracy on digits: A {answers['static_int8_accuracy'][0]:.4f}, "
      f"B {answers['static_int8_accuracy'][1]:.4f}")
print("regressions beyond the noise:", answers["regressions"] or "none")

# %% [markdown]
# Two DLRM rows, on purpose: `step_time` runs each version's own MoE path (the migration: a loop on
# 2.9, `grouped_mm` on 2.10), `loop_step_time` runs the same loop on both (the same code, a different
# torch). If only the first moves, the change comes from the new path; if both move, from torch itself.
# On a CPU `grouped_mm` is a loop of matmuls inside ATen (its CPU fallback), so a large gain is not to be
# expected there; on a Hopper or Blackwell GPU with bf16 operands it is one CUTLASS grouped GEMM.

# %% [markdown]
# ## Exercise 4: find the drift
#
# `labcheck.inject_drift` makes run C: run B with two of its reference outputs changed the way a new
# kernel might change them (a different accumulation order, a lower-precision path). The timings are
# B's. Compare B with C and write `find_drift(report)` returning
# `{"workload": ..., "output": ..., "max_rel_diff": ...}` for the output that drifted **beyond its
# tolerance**. A changed hash alone is not the answer: look at each numerics row's `status`
# (`"identical"`, `"within tolerance"` or `"drift"`) and `max_rel_diff` (max |C − B| / max |B|).

# %%
PATH_C = labcheck.inject_drift(PATH_B, OUT_DIR / "run_c.json", seed=SEED)
report_c = compare_runs(load_run(PATH_B), load_run(PATH_C))


def find_drift(report):
    ### BEGIN SOLUTION
    row = next(n for n in report["numerics"] if n["status"] == "drift")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("09_migration_lab", find_drift)
answer = find_drift(report_c)
print(f"this run C: {answer['workload']}/{answer['output']} drifted, max relative difference {answer['max_rel_diff']:.1e}")
print("timing rows still within noise:", all(r["status"] == "within noise" for r in report_c["rows"]))

# %%
for n in report_c["numerics"]:
    if n["status"] != "identical":
        print(f"{n['workload']}/{n['output']}: {n['status']}, max rel diff {n['max_rel_diff']:.1e} "
              f"(tolerance {n['tolerance']:.0e} for {n['dtype_a']})")

# %% [markdown]
# ## What the numbers mean
#
# - **Numerics first.** Before any timing, a migration has to show that the same weights on the same
#   input give the same output. In the recorded 2.9.1 → 2.10.0 run on a CPU most outputs are bit-identical
#   and the rest differ by about 1e-7 to 1e-6 relative (different kernels or accumulation order), far
#   inside the fp32 tolerance of 1e-4. A hash comparison alone would have called those "changed"; a
#   tolerance alone would miss a bit-identical guarantee that breaks. The report gives both.
# - **Noise.** The machine this ran on is shared. Some rounds were slowed by other work: that shows as a
#   wide interval and per-round gains that disagree (one round at 0.1x, the others near 1). A p99 is
#   far more sensitive to that than a median; read tails only from a quiet machine or many rounds.
# - **The migration rows.** The paths that differ between A and B are listed before the timings, so a
#   change in a figure can be traced to a changed path (grouped_mm) or to torch itself (the loop row).
# - **Checks as numbers.** The quantization check compares accuracies, not just pass/fail; the C++
#   extension check records the torch it was built against and its ABI flag, and is rebuilt per version
#   (a library built against 2.9's headers is not loaded into 2.10: its symbols may not exist there).
# - **What it does not cover yet.** NCCL (it needs two GPUs: the DDP check says so), compile-time and
#   recompile counts per workload, serialisation across versions (`torch.load` of a 2.9 checkpoint,
#   `.pt2` archives), and a diff of deprecation warnings.
#
# Open the full report (chart with the intervals, each check's numbers, the environment differences):

# %%
print(FOLDER / "report.html" if (FOLDER / "report.html").exists() else "(recorded run: no HTML shipped)")
REPORT_PATH = write_report(report, OUT_DIR / "report.html")
print("written:", REPORT_PATH)
chart(report).show()
