# %% [markdown]
# # Lab 07 · Memory: predict it, choose what to keep, lower the peak
#
# | | |
# |---|---|
# | **What you will learn** | predict a training step's parameter, gradient and Adam-state bytes (frozen layers and bf16 parameters included) and compare them with the profiler's timeline; decide, op by op, what selective activation checkpointing keeps, so that backward recomputes no matmul and forward keeps less than `save_matmuls`; lower the activation peak with gradient accumulation while keeping the full-batch gradients, whatever the batch size |
# | **Prerequisites** | lesson 07 |
# | **Hardware** | any CPU |
# | **Time** | 35 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
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
