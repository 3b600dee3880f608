# %% [markdown]
# # Lab 07 · Memory: predict it, choose what to keep, lower the peak
#
# | | |
# |---|---|
# | **What you will learn** | predict a training step's parameter, gradient and Adam-state bytes (frozen layers and bf16 parameters included) and compare them with the profiler's timeline; decide, op by op, what selective activation checkpointing keeps, so that backward recomputes no matmul and forward keeps less than `save_matmuls`; lower the activation peak with gradient accumulation while keeping the full-batch gradients, whatever the batch size; choose which blocks of different sizes to checkpoint so that a step fits a memory budget at the least recompute, then measure the plan |
# | **Prerequisites** | lesson 07 |
# | **Hardware** | any CPU |
# | **Time** | 50 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04) |
#
# Each exercise is followed by `check(...)`, which runs the grader's visible cases for that exercise:
# `✅ ... passed`, or `❌` with a hint. `python -m helpers grade` adds hidden cases (other models, dtypes, sizes).

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
    os.environ["LABS_NOTEBOOK"] = "labs/07_memory_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)
BATCH, WIDTH, DEPTH = 512, 256, 4

# %%
import torch
from torch import nn

from helpers import memory
from helpers.device import pick_device, quick_mode
from helpers.grading.checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    BATCH, WIDTH = 128, 64
torch.manual_seed(0)
model = memory.mlp(WIDTH, DEPTH)
model[0].requires_grad_(False)      # a frozen first layer, as in fine-tuning
prof = memory.profile_steps(memory.training_step(model, BATCH, WIDTH), steps=1)
tl = memory.timeline(prof)      # (the profiler prints its own start/stop lines)


# %% [markdown]
# ## Exercise 1: predict the bytes of a training step with Adam
#
# Return `{"parameter": ..., "gradient": ..., "optimizer_state": ...}` in bytes for `model` trained with
# `torch.optim.Adam` on the CPU. The model may have frozen layers (parameters with `requires_grad=False`,
# like the first layer of this lab's model) and parameters in other dtypes than float32 (e.g. bfloat16).
# Every parameter is stored; only a trainable one gets a gradient and Adam state. Adam keeps `exp_avg`
# and `exp_avg_sq` (each the size and dtype of the parameter) plus a `step` counter per trainable
# parameter tensor, a 0-d float32 tensor on the CPU. Count `numel() * element_size()`; use no profiler.

# %%
def predicted_bytes(model: nn.Module) -> dict[str, int]:
    ### BEGIN SOLUTION
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]

    def size(ps):
        return sum(p.numel() * p.element_size() for p in ps)
    return {"parameter": size(params), "gradient": size(trainable),
            "optimizer_state": 2 * size(trainable) + 4 * len(trainable)}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("07_memory_lab", predicted_bytes)

# %% [markdown]
# Your prediction for this lab's model (its first layer frozen) next to what the profiler measured in the
# training step above (the peak of each category in `tl`):

# %%
guess = predicted_bytes(model)
for category in ("parameter", "gradient", "optimizer_state"):
    measured = memory.peak_bytes(tl, category)
    verdict = "matches" if guess[category] == measured else "differs from"
    print(f"{category:<16} predicted {memory.mib(guess[category]):>10}, {verdict} the profiler's {memory.mib(measured)}")

# %% [markdown]
# ## Exercise 2: a selective-checkpointing policy under a budget
#
# Lesson 07's deep dive checkpoints every `memory.GatedMLP` block (`x + down(gelu(up(x)) * gate(x))`)
# with `create_selective_checkpoint_contexts(memory.save_matmuls)`: keep the output of every matmul
# (`aten.addmm`, `aten.mm`), recompute everything else in backward. Write your own policy,
# `keep_policy(ctx, op, *args, **kwargs)`, returning a `torch.utils.checkpoint.CheckpointPolicy` for
# each op of the block's forward (`args` are the op's inputs: for `aten.addmm`, the bias, the input and
# the transposed weight), that meets this budget with every block checkpointed by it:
#
# 1. backward recomputes **no matmul**: its matmul FLOPs are those of the step without checkpointing;
# 2. forward keeps **fewer bytes** for backward than `save_matmuls` does.
#
# Any width, depth and batch size (the grader uses others). Decide op by op what backward needs:
# `lab_checks.kept_bytes_and_backward_flops(policy, width, depth, batch)` measures both numbers for
# any policy (`None`: no checkpointing), and the cell after the check prints them for yours.
# Calling `memory.save_matmuls` is not allowed.

# %%
from torch.utils.checkpoint import CheckpointPolicy


def keep_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    ### BEGIN SOLUTION
    # up's and gate's outputs (wider than their input) are read by gelu's and mul's backward: keep them.
    # down's output is read by no backward formula (the residual add's backward needs no input), and
    # recomputation stops at the last tensor backward needs: keeping it costs bytes and saves nothing.
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and args[-1].shape[-1] > args[-2].shape[-1]:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("07_memory_lab", keep_policy)

# %% [markdown]
# What each policy keeps and what backward pays, on blocks of this lab's width (the step without
# checkpointing, full checkpointing, `save_matmuls`'s rule and yours):

# %%
from helpers.grading.harnesses.lab07 import kept_bytes_and_backward_flops

policies = {"no checkpointing": None, "full (recompute all)": lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE,
            "save_matmuls": memory.save_matmuls, "keep_policy": keep_policy}
base_flops = kept_bytes_and_backward_flops(None, WIDTH, DEPTH, BATCH)[1]
for name, policy in policies.items():
    kept, flops = kept_bytes_and_backward_flops(policy, WIDTH, DEPTH, BATCH)
    print(f"{name:<22} kept for backward {memory.mib(kept):>10}   matmul FLOPs recomputed "
          f"{(flops - base_flops) / 1e6:8.1f} M")


# %% [markdown]
# ## Exercise 3: gradient accumulation
#
# `accumulate_grads(model, x, y, micro)`: split the batch into `micro` chunks (`x.chunk(micro)`), run
# forward and backward on each, and scale each chunk's loss so that the accumulated gradients equal the
# gradients of `mse_loss(model(x), y)` over the whole batch. The batch size need not be divisible by
# `micro`: 10 rows in 4 chunks are chunks of 3, 3, 3 and 1 rows. `mse_loss` is a mean over its chunk's
# rows, so dividing every chunk's loss by `micro` is right only when the chunks are equal; with unequal
# chunks, the one-row chunk would count as much as a three-row one. Gradients the parameters hold from an
# earlier step must not be added: start from none. Leave the result in `.grad` (no optimizer step).
# Only one chunk's activations are alive at a time: call `backward()` inside the loop (the check measures
# the activations saved for backward while your function runs).

# %%
def accumulate_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int) -> None:
    ### BEGIN SOLUTION
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        share = xs.shape[0] / x.shape[0]          # this chunk's rows / the batch's rows
        (nn.functional.mse_loss(model(xs), ys) * share).backward()
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("07_memory_lab", accumulate_grads)

# %% [markdown]
# What accumulation buys: the activation peak of one backward over the whole batch against 4 chunks of
# it, measured by the profiler in this run.

# %%
x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
full_tl = memory.timeline(memory.profile_steps(lambda: accumulate_grads(model, x, y, 1), steps=1))
micro_tl = memory.timeline(memory.profile_steps(lambda: accumulate_grads(model, x, y, 4), steps=1))
full_act, micro_act = memory.peak_bytes(full_tl, "activation"), memory.peak_bytes(micro_tl, "activation")
print(f"activation peak: one batch {memory.mib(full_act)}, 4 micro-batches {memory.mib(micro_act)}")
if micro_act >= full_act:
    print("the micro-batches did not lower the activation peak: run backward() inside the loop, so each "
          "chunk's activations are freed before the next forward")


# %% [markdown]
# ## Exercise 4: fit a memory budget at the least recompute
#
# Lesson 07 chose which of four equal blocks to checkpoint. Here the blocks differ in size: checkpointing
# each one frees a different number of bytes at a different price. For block `i` of a model, in forward
# order, you get:
#
# - `saved_bytes[i]`: the bytes of activations the block keeps for backward when it is not checkpointed
#   (checkpointed, it keeps only its input, which the model keeps either way);
# - `recompute_cost[i]`: what checkpointing it costs: the FLOPs of its forward, run again in backward;
# - `fixed_bytes`: the rest of the step's peak (parameters, gradients, Adam's state, the batch, the blocks'
#   inputs).
#
# How the activations come and go: backward runs through the blocks from the last to the first. A block
# that is not checkpointed holds its `saved_bytes` from its forward until its own backward is done. A
# checkpointed block holds none of them until backward reaches it; then it rebuilds them all and holds them
# until its backward is done. The step's peak is `fixed_bytes` plus the most activation bytes held at any
# one moment.
#
# Write `plan_checkpointing(saved_bytes, recompute_cost, fixed_bytes, budget)`: return the indices of the
# blocks to checkpoint (ints, in any order) so that the step's peak is at most `budget` bytes, at the least
# total recompute cost (within 2% of the cheapest plan that fits). When no plan fits, raise `ValueError`
# with a message that gives the lowest peak a plan can reach, in bytes (a plain integer), and what to do.
# Up to 12 blocks; the grader uses other sizes, costs and budgets. After the check, the notebook plans for
# this lab's model with your function and runs the plan under the profiler (`modelled_peak`, which it uses
# there, is not allowed in your function).

# %%
def plan_checkpointing(saved_bytes: list[int], recompute_cost: list[float], fixed_bytes: int,
                       budget: int) -> list[int]:
    ### BEGIN SOLUTION
    from itertools import combinations
    n = len(saved_bytes)

    def peak(plan):
        held, rebuilt = 0, 0
        for i, nbytes in enumerate(saved_bytes):
            if i in plan:       # rebuilt when backward reaches it, while the blocks before it still hold theirs
                rebuilt = max(rebuilt, held + nbytes)
            else:
                held += nbytes
        return fixed_bytes + max(held, rebuilt)     # held: every block's, when backward starts

    # Every plan (2**n of them, a few thousand at most here). Neither the biggest blocks first nor the most
    # bytes per FLOP first finds the cheapest set in general, and a late block frees less than its bytes.
    plans = (set(blocks) for k in range(n + 1) for blocks in combinations(range(n), k))
    fitting = [plan for plan in plans if peak(plan) <= budget]
    if not fitting:
        # each block's bytes are held at some moment, whatever the plan: every block checkpointed is the lowest
        lowest = fixed_bytes + max(saved_bytes)
        raise ValueError(f"no plan fits a budget of {budget} bytes: the lowest peak a plan reaches is {lowest} "
                         f"bytes, with every block checkpointed; raise the budget or lower the batch size")
    return sorted(min(fitting, key=lambda plan: sum(recompute_cost[i] for i in plan)))
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("07_memory_lab", plan_checkpointing)

# %% [markdown]
# Your plan for this lab's model: six blocks whose hidden sizes are `HIDDEN` times `WIDTH` (the
# even-numbered ones gated, like `memory.GatedMLP`), what each saves and costs measured here
# (`block_costs`: the saved-tensor hooks and the FLOP counter), `fixed_bytes` read off the profiler's peak
# without checkpointing, and a budget halfway between that peak and the lowest a plan can reach.

# %%
from helpers.grading.harnesses.lab07 import block_costs, measured_peak, modelled_peak

HIDDEN = (2, 6, 1, 4, 8, 3)
saved, flops = block_costs(WIDTH, HIDDEN, BATCH)
no_checkpointing = measured_peak(WIDTH, HIDDEN, (), BATCH)
fixed = no_checkpointing - sum(saved)
budget = no_checkpointing - (no_checkpointing - fixed - max(saved)) // 2
plan = sorted(plan_checkpointing(saved, flops, fixed, budget))
for i, (h, nbytes, f) in enumerate(zip(HIDDEN, saved, flops)):
    print(f"block {i}: hidden {h * WIDTH:>5}, saves {memory.mib(nbytes):>10}, recompute {f / 1e6:8.1f} MFLOP"
          + ("   <- checkpointed" if i in plan else ""))
print(f"fixed {memory.mib(fixed)}, budget {memory.mib(budget)}, peak without checkpointing {memory.mib(no_checkpointing)}")

# %% [markdown]
# The plan, run: one training step with those blocks under `torch.utils.checkpoint`, its peak measured by
# the profiler, against the budget and against what the model of the exercise predicted.

# %%
measured, modelled = measured_peak(WIDTH, HIDDEN, plan, BATCH), modelled_peak(saved, fixed, plan)
print(f"blocks {plan} checkpointed: measured peak {memory.mib(measured)}, budget {memory.mib(budget)}: "
      + ("fits" if measured <= budget else f"over by {memory.mib(measured - budget)}"))
print(f"the model predicted {memory.mib(modelled)}: off by {memory.mib(measured - modelled)} "
      f"({(measured - modelled) / measured:+.1%} of the peak)")
print(f"recomputed {sum(flops[i] for i in plan) / 1e6:.1f} MFLOP, "
      f"{sum(flops[i] for i in plan) / sum(flops):.0%} of what checkpointing every block costs")
if measured > budget:
    print(f"plan again for {memory.mib(budget - (measured - modelled))} (the budget less what the model missed)")

# %% [markdown]
# What the model leaves out: backward through a block also holds the gradients it computes on the way (the
# profiler's `autograd_detail`, a few of the block's activations in size) and the parameter gradients made so
# far. `fixed_bytes`, read off the peak without checkpointing, holds them as they were at that peak; a plan
# whose peak comes in another block's backward is off by the difference. A plan right at the budget needs
# that much room to spare.
