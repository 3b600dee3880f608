# %% [markdown]
# # Lab 07 · Memory: predict it, find the peak, lower it
#
# | | |
# |---|---|
# | **What you will learn** | predict a training step's parameter, gradient and Adam-state bytes (frozen layers and bf16 parameters included) and compare them with the profiler's timeline; find what dominates at the peak; lower the activation peak with gradient accumulation while keeping the full-batch gradients, whatever the batch size |
# | **Prerequisites** | lesson 07 |
# | **Hardware** | any CPU |
# | **Time** | 25 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each exercise is followed by `check(...)`, which runs the grader's visible cases for that exercise:
# `✅ ... passed`, or `❌` with a hint. `python -m helpers grade` adds hidden cases (other models, dtypes, sizes).

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)
BATCH, WIDTH, DEPTH = 512, 256, 4

# %%
import torch
from torch import nn

from helpers import memory
from helpers.device import pick_device, quick_mode
from helpers.lab_checks import check

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
# ## Exercise 2: what is in memory at the peak?
#
# `tl["times_us"]` is a list of times and `tl["bytes"]` maps each category to a list of the same length.
# Return `(time_us, breakdown)` at the first moment the total (the sum over categories) is highest, where
# `breakdown` maps every category to its bytes at that moment.

# %%
def at_peak(tl: dict) -> tuple[int, dict[str, int]]:
    ### BEGIN SOLUTION
    totals = [sum(col) for col in zip(*tl["bytes"].values())]
    i = totals.index(max(totals))
    return tl["times_us"][i], {name: values[i] for name, values in tl["bytes"].items()}
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("07_memory_lab", at_peak)

# %%
t_peak, breakdown = at_peak(tl)
print(f"the peak of this lab's training step, at {t_peak} us: {memory.mib(sum(breakdown.values()))}")
for name, nbytes in sorted(breakdown.items(), key=lambda kv: -kv[1]):
    if nbytes:
        print(f"  {name:<16} {memory.mib(nbytes)}")


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
# Only one chunk's activations are alive at a time: call `backward()` inside the loop.

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
