# %% [markdown]
# # Lab 00 · Warm-up: exercises, stubs and checks
#
# | | |
# |---|---|
# | **What you will learn** | how a lab works: write code where a stub raises `NotImplementedError`, run the check below it, read its hint |
# | **Prerequisites** | lesson 00 |
# | **Hardware** | any CPU; the same code runs on any accelerator |
# | **Time** | 10 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each exercise cell is followed by a check cell. A check prints `✅ ... passed`, or stops with `❌` and
# a hint saying what was wrong (type, shape, dtype, values). `check(LAB, function)` runs the visible
# cases of the lab's grading spec (`helpers/runner/grading_specs.py`); `python -m helpers grade` runs the
# same cases plus hidden ones (other sizes, dtypes, edge cases the task states) on a secret seed.

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)

# %%
import torch

from helpers.device import pick_device, quick_mode
from helpers.lab_checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0);


# %% [markdown]
# ## Exercise 1: a numerically stable softmax
#
# Write `softmax(x, dim)` with plain tensor operations (no `torch.softmax`). Subtract the maximum
# along `dim` before `exp`, or large inputs overflow to `inf` and the result becomes `nan`.

# %%
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    ### BEGIN SOLUTION
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("00_warmup_lab", softmax)


# %% [markdown]
# ## Exercise 2: reject bad input with a clear error
#
# `rms_norm(x, weight, eps)` normalises the last dimension: `x / sqrt(mean(x**2) + eps) * weight`,
# with plain tensor operations (no `torch.nn.functional.rms_norm`).
# Raise a `ValueError` that says what to do when `weight`'s length does not match `x`'s last dimension.

# %%
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    ### BEGIN SOLUTION
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight has shape {tuple(weight.shape)} but x's last dimension is {x.shape[-1]}: "
                         f"pass a weight of shape ({x.shape[-1]},)")
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("00_warmup_lab", rms_norm)
