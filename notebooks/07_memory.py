# %% [markdown]
# # 07 · Memory: what a training step holds, where its peak is, and how to lower it
#
# | | |
# |---|---|
# | **What you will learn** | profile a training step with `torch.profiler.profile(profile_memory=True)` and read its memory timeline by category (parameters, input, activations, gradients, optimizer state); predict Adam's state before it is measured; find the peak and the operations that allocated it; lower the peak with activation checkpointing, measured in memory and in time, and choose which blocks to checkpoint to meet a memory budget |
# | **Prerequisites** | lesson 00; a training loop (forward, backward, optimizer step) |
# | **Hardware** | any CPU; on an NVIDIA or AMD GPU the step is profiled on the GPU. The GPU tools (allocator snapshots, memory pools, fragmentation, out-of-memory snapshots) are in the deep dive |
# | **Time** | 39 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the exporter's categories and Adam's CPU path read in the 2.10.0 and 2.13.0 wheels (`torch/profiler/_memory_profiler.py`, `torch/optim/adam.py`) |
#
# The story: a training step's memory comes in categories → predict one, then measure them all → the
# timeline and its peak → the operations behind the peak → lower the peak with activation checkpointing →
# your turn: checkpoint as few blocks as a memory budget allows.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/07_memory.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
BATCH, WIDTH, DEPTH = 2048, 256, 4     # rows per batch, model width, number of blocks

# %%
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers import bench, memory
from helpers.device import pick_device, quick_mode
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
# The step is profiled on an NVIDIA or AMD GPU when there is one (torch calls both "cuda"), else on the CPU:
# the exporter below categorises the memory of those two kinds of device.
STORY = DEVICE if DEVICE.type == "cuda" else torch.device("cpu")
TIMELINE_DEVICE = memory.timeline_device(STORY)
if QUICK:
    BATCH, WIDTH = 512, 128
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} (profiling on {TIMELINE_DEVICE}) · quick={QUICK}")


# %% [markdown]
# ## The training step
#
# A stack of `DEPTH` transformer feed-forward blocks (`memory.GatedMLP`: `x + down(gelu(up(x)) * gate(x))`,
# hidden size four times `WIDTH`), a linear head, a mean-squared-error loss and `torch.optim.Adam`.
# `memory.training_step` returns a closure that does one step: `zero_grad`, forward, `backward()`,
# `opt.step()`. The blocks whose index is in `checkpointed` run under activation checkpointing, which the
# second half of the lesson explains; until then, none. `profiled_step` runs one step unprofiled first,
# because Adam creates its state in its first step, then profiles the next one, which looks like every
# step after it.

# %%
class Stack(nn.Module):
    def __init__(self, checkpointed=()):
        super().__init__()
        self.blocks = nn.ModuleList(memory.GatedMLP(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 1)
        self.checkpointed = set(checkpointed)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if i in self.checkpointed else block(x)
        return self.head(x)


def profiled_step(checkpointed=(), batch=BATCH):
    """A warm-up step, then one step under the profiler; returns the profile and the model."""
    torch.manual_seed(0)
    model = Stack(checkpointed).to(STORY)
    step = memory.training_step(model, batch, WIDTH, device=STORY)
    step()
    return memory.profile_steps(step, steps=1, device=STORY), model


def step_peak(checkpointed=(), batch=BATCH):
    """The peak of one profiled step, all categories together."""
    return memory.peak_bytes(memory.timeline(profiled_step(checkpointed, batch)[0], TIMELINE_DEVICE))


# %% [markdown]
# ## Memory has categories
#
# A training step holds several kinds of memory at once: the **parameters**; the **input** batch and its
# targets; the **activations** that autograd saves during forward for use in backward; the **gradients**;
# the **optimizer state**; and short-lived **temporaries**. The profiler with `profile_memory=True` records
# every allocation and free. `export_memory_timeline` (`torch/profiler/_memory_profiler.py`) then gives
# each tensor a category by following how autograd and the optimizer use it. For that it also needs
# `record_shapes=True` and `with_stack=True`; `memory.profile_steps` turns all three on, and
# `memory.timeline` returns the result as bytes per category over time. torch marks this exporter
# deprecated (a `FutureWarning`) in favour of the CUDA allocator's history, which only works on CUDA and
# has no categories. On a CPU the exporter is still the tool that sorts memory by category.
#
# First, a prediction. Adam adapts each parameter's step size from the history of its gradients, and it
# keeps that history in memory.

# %% tags=["predict"]
n_params = sum(p.numel() for p in Stack().parameters())
adam_guess = predict(f"The model has {n_params:,} float32 parameters (4 bytes each). How many bytes per "
                     "parameter does Adam's state add?", unit="bytes", example=4.0)

# %%
prof, model = profiled_step()
top = memory.top_allocations(prof, 6, device=STORY)   # the operations that allocated the most (shown below)
tl = memory.timeline(prof, TIMELINE_DEVICE)
for name, values in tl["bytes"].items():
    print(f"peak {name:<16} {memory.mib(max(values)):>12}")

# %% [markdown]
# (The profiler prints its start and stop lines, and may warn that a block allocated before profiling
# started was freed during it: the gradients of the warm-up step, for one, which `zero_grad` releases.) Three
# categories can be checked exactly against the model. On a GPU, "exactly" allows for the caching
# allocator, which hands out blocks in multiples of 512 bytes (`memory.allocated_bytes`), and Adam's `step`
# counters live on the CPU there unless the optimizer is `capturable` or `fused` (`_init_group` in
# `torch/optim/adam.py`).

# %% tags=["nbval-check-output"]
params = list(model.parameters())
param_bytes = 4 * sum(p.numel() for p in params)
step_counters = [torch.zeros((), device=STORY)] * len(params) if STORY.type == "cpu" else []
assert memory.peak_bytes(tl, "parameter") == memory.allocated_bytes(params, STORY)
assert memory.peak_bytes(tl, "gradient") == memory.allocated_bytes(params, STORY)
assert memory.peak_bytes(tl, "optimizer_state") == memory.allocated_bytes(params * 2 + step_counters, STORY)
assert memory.peak_bytes(tl, "input") >= 4 * BATCH * (WIDTH + 1)
print("'parameter' and 'gradient' peaks: 4 bytes x parameter count: True")
print(f"'optimizer_state': 2 x the parameters + 4 bytes per parameter tensor on this device "
      f"({len(step_counters)} tensors): True")
print("'input' holds at least the batch and its targets: True")

# %% tags=["reveal"]
reveal(adam_guess, round(memory.peak_bytes(tl, "optimizer_state") / n_params, 3), tolerance=1.2,
       why="Adam keeps two float32 tensors shaped like each parameter, exp_avg (the running mean of the "
           "gradients) and exp_avg_sq (of their squares): 8 bytes per parameter, plus a 4-byte `step` counter "
           f"per parameter tensor ({len(params)} here, " + ("on this CPU" if STORY.type == "cpu" else
                                                           "kept on the CPU, so not in this GPU's timeline")
           + "). With the weights and their gradients that is 16 bytes "
           f"per parameter before any activation: {memory.mib(16 * n_params)} for this model.");

# %% [markdown]
# ## The timeline and its peak
#
# The figure stacks the categories over the profiled step, time from left to right. Parameters and Adam's
# state are there from start to end. Activations pile up during forward and are released during backward,
# as the gradients appear. `autograd_detail` is what backward creates on its way (the gradients of the
# activations), and `unknown` is memory that no rule of the exporter claims (the deep dive names it).
# The peak is what decides whether a step fits on a device.

# %% tags=["predict"]
peak_guess = predict(f"At the peak of this step (batch {BATCH}, width {WIDTH}, {DEPTH} blocks), which "
                     "category holds the most memory?",
                     options=["parameter", "gradient", "optimizer_state", "activation"], example="optimizer_state")

# %%
total = memory.total_bytes(tl)
i_peak = total.index(max(total))
at_peak = {name: values[i_peak] for name, values in tl["bytes"].items() if values[i_peak]}
fig = memory.timeline_figure(tl, title=f"One Adam step of {DEPTH} GatedMLP blocks, batch {BATCH}, width {WIDTH}")
fig.add_vline(x=tl["times_us"][i_peak] / 1e3, line_dash="dot", annotation_text="peak")
fig.show()
print(f"peak {memory.mib(max(total))}, {tl['times_us'][i_peak] / 1e3:.1f} ms into the step:")
for name, nbytes in sorted(at_peak.items(), key=lambda kv: -kv[1]):
    print(f"  {name:<16} {memory.mib(nbytes):>12}  {nbytes / max(total):6.1%}")

# %% tags=["reveal"]
per_row = memory.peak_bytes(tl, "activation") / BATCH
reveal(peak_guess, max(at_peak, key=at_peak.get),
       why=f"every block saves its activations for backward, for every row of the batch: about "
           f"{per_row / 1024:.1f} KiB per row here, {memory.mib(at_peak.get('activation', 0))} at the peak. Adam's "
           f"state ({memory.mib(at_peak.get('optimizer_state', 0))}) depends on the parameters only. Below a batch "
           f"of about {at_peak.get('optimizer_state', 0) / per_row:.0f} rows the state would be the larger one.");

# %% [markdown]
# ## The operations behind the peak
#
# Which operations allocated it? `prof.key_averages()` gives each operation its **self memory** on the
# device (`self_cpu_memory_usage`, `self_device_memory_usage` on a GPU): the bytes it allocated itself minus
# those it freed, summed over its calls. `memory.top_allocations` keeps the largest.

# %%
for row in top:
    print(f"{row['op']:<24} {memory.mib(row['self_bytes']):>12}  in {row['calls']} calls")

# %% [markdown]
# In forward, `aten::addmm` (the Linear layers), `aten::gelu` and `aten::mul` (the gate's product) create
# the activations that autograd keeps for backward. In backward, `aten::mm`, `aten::gelu_backward` and
# `aten::mul` again create gradients, most of them released soon after. The table sums all calls; the
# timeline says what is alive at the same time. Big outputs of forward operations, kept until backward:
# that is what to shrink.
#
# ## Lower the peak: activation checkpointing
#
# `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` runs the block in forward without
# keeping its activations, only its input. In backward it runs the block again to get them back, then
# backpropagates through it. That is what `Stack` does for the blocks in `checkpointed`. It buys memory
# with compute: the parameters, gradients and Adam state do not change; only the activations do.

# %% tags=["predict"]
ckpt_guess = predict(f"Checkpoint all {DEPTH} blocks. By what factor does the peak of the step fall "
                     "(peak without checkpointing / peak with)?", unit="x", example=4.0)

# %%
all_blocks = tuple(range(DEPTH))
peak = {"none": max(total), "all blocks": step_peak(all_blocks), f"all blocks, batch {2 * BATCH}": step_peak(all_blocks, 2 * BATCH)}
for name, nbytes in peak.items():
    print(f"checkpointed: {name:<24} peak {memory.mib(nbytes):>12}")
timing = bench.compare({"none": memory.training_step(Stack().to(STORY), BATCH, WIDTH, device=STORY),
                        "all blocks": memory.training_step(Stack(all_blocks).to(STORY), BATCH, WIDTH, device=STORY)},
                       baseline="none", repeats=3, min_run_time=0.05 if QUICK else 0.2, threads=1, device=STORY)
print(bench.table(timing))

# %% tags=["reveal"]
floor = sum(memory.peak_bytes(tl, c) for c in ("parameter", "gradient", "optimizer_state"))
time_ratio = 1 / timing["results"]["all blocks"]["ratio_to_baseline"]
time_lo, time_hi = bench.speedup_range(timing["results"], "all blocks", "none")   # the time ratio's range
time_noisy = not bench.separated(timing, "none", "all blocks") or time_lo <= 2 <= time_hi
big = peak[f"all blocks, batch {2 * BATCH}"]
reveal(ckpt_guess, peak["none"] / peak["all blocks"], tolerance=1.25,
       why=f"the peak fell from {memory.mib(peak['none'])} to {memory.mib(peak['all blocks'])}, not to nothing: "
           f"the parameters, gradients and Adam state ({memory.mib(floor)}) stay, every block still keeps its "
           "input, and backward rebuilds one block's activations at a time. The price is one more forward per "
           f"block, so a step should take well under twice the time; here it took {time_ratio:.2f}x "
           f"({time_lo:.2f}x to {time_hi:.2f}x over the repeats"
           + (f": {bench.NOISY}" if time_noisy else
              "; far outside that: other load on this machine during the timing, rerun" if not 1 <= time_ratio <= 2
              else "") + f"). What it buys: batch {2 * BATCH}, checkpointed, peaks at "
           f"{memory.mib(big)}, {'below' if big < peak['none'] else 'above'} batch {BATCH} without checkpointing.");

# %% [markdown]
# ### Your turn: checkpoint as few blocks as the budget allows
#
# Each checkpointed block costs one more forward through it, so checkpoint no more than you must. The
# budget: the peak must fall by at least half of what checkpointing all the blocks saved, with at most
# `DEPTH // 2` blocks checkpointed. The starting choice is the last two blocks, the ones closest to the
# loss. Run the check; if it says "not yet", think about when, during backward, each checkpointed block
# rebuilds its activations, and what the other blocks hold at that moment.

# %% tags=["your-turn"]
CHECKPOINTED = {2, 3}     # your choice: block indices, 0 (first) to DEPTH - 1 (last), at most DEPTH // 2 of them

# %%
from helpers.checks import check_equal, fail, your_turn

budget = peak["none"] - (peak["none"] - peak["all blocks"]) / 2


def check_checkpointed():
    chosen = set(CHECKPOINTED)
    if not chosen <= set(all_blocks) or len(chosen) > DEPTH // 2:
        fail("CHECKPOINTED", f"{sorted(chosen)} is not a choice of at most {DEPTH // 2} blocks",
             f"use block indices from 0 to {DEPTH - 1}")
    measured = step_peak(chosen)
    print(f"blocks {sorted(chosen)} checkpointed: peak {memory.mib(measured)}, budget {memory.mib(budget)}")
    check_equal(measured <= budget, True, what=f"peak within the budget with blocks {sorted(chosen)} checkpointed",
                hint="backward goes from the last block to the first, and a checkpointed block rebuilds its "
                     "activations when backward reaches it, while every block before it still holds its own. "
                     "Which block's rebuild comes at the worst moment?")


your_turn(check_checkpointed, what="checkpoint under a budget");

# %% [markdown]
# ## What the numbers mean
#
# - **A floor and a part that scales.** float32 weights, gradients and Adam state cost 16 bytes per
#   parameter whatever the batch; activations grow with batch × width × depth. Find out which one your
#   peak is made of before choosing a fix: checkpointing only touches activations. Lower precision,
#   sharding the parameters, gradients and optimizer state over devices (FSDP), or a leaner optimizer
#   address the floor.
# - **Where the peak is matters as much as how much is saved.** The peak comes early in backward, when
#   every block still holds its activations. Backward starts at the last block, so checkpointing it
#   rebuilds its activations at that very moment and saves nothing at the peak; checkpointing an earlier
#   block frees its activations until backward reaches it, when the later blocks have released theirs.
# - **The cost is time.** Full checkpointing repeats each block's forward. The deep dive measures
#   *selective* checkpointing, which keeps the expensive matmul outputs and recomputes only the cheap
#   pointwise operations: less memory saved, less time paid.
#
# ## Going further
#
# [The deep dive](07_memory_deep_dive.ipynb) holds the rest, for whoever tunes memory on a GPU or writes
# training infrastructure: the exporter's deprecation and what replaces it; what the "unknown" category
# is, named by the operations that made it; selective activation checkpointing with a policy per
# operation, measured against full; activation memory against the batch size; and on an NVIDIA or AMD
# GPU, the same step by category with reserved against allocated memory, the CUDA allocator's history
# snapshots for pytorch.org/memory_viz, nested `torch.cuda.MemPool`s (fixed in 2.10), fragmentation and
# `expandable_segments`, and a snapshot taken when memory runs out; then the pitfalls. Then
# [lab 07](../labs/07_memory_lab.ipynb): predict a step's bytes with frozen layers and bf16 parameters, find
# what dominates the peak, and lower it with gradient accumulation.
