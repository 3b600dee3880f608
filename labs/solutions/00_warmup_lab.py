# %% [markdown]
# # Lab 00 · Warm-up: exercises, stubs and checks
#
# | | |
# |---|---|
# | **What you will learn** | how a lab works: write code where a stub raises `NotImplementedError`, run the check below it, read its hint; what a softmax must do with a fully masked row; how to write a function that runs on any device without reading values back to Python |
# | **Prerequisites** | lesson 00 |
# | **Hardware** | any CPU; exercise 1 is also checked on the meta device, which shows whether the code would run on an accelerator unchanged |
# | **Time** | 15 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04) |
#
# Each exercise cell is followed by a check cell. A check prints `✅ ... passed`, or stops with `❌` and
# a hint saying what was wrong (type, shape, dtype, values). `check(LAB, function)` runs the visible
# cases of the lab's grading spec (`helpers/grading/specs/lab00.py`); `python -m helpers grade` runs the
# same cases plus hidden ones on a secret seed: other sizes, dtypes and values, never a requirement the
# text does not state. To grade your own notebook as the instructor does, put it in a folder and run
# `python -m helpers grade 00_warmup_lab FOLDER`.

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
    os.environ["LABS_NOTEBOOK"] = "labs/00_warmup_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)

# %%
import torch

from helpers.device import pick_device, quick_mode
from helpers.grading.checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0);


# %% [markdown]
# ## Exercise 1: a numerically stable softmax that survives a fully masked row
#
# Write `softmax(x, dim)` with plain tensor operations (no `torch.softmax`):
#
# - subtract the maximum along `dim` before `exp`, or large inputs overflow to `inf` and the result
#   becomes `nan`;
# - reduce along `dim` (any dimension, not only the last);
# - a row (a slice along `dim`) whose every entry is `-inf` gives all zeros. Attention masks padding with
#   `-inf`, and a query whose every key is padding produces such a row; `torch.softmax` returns `nan`
#   there, and the `nan` then spreads through everything computed from it. Work out what the stable recipe
#   computes in that row, step by step, and change only what goes wrong; a row with some `-inf` entries
#   must still give 0 exactly there;
# - keep `x`'s dtype and device, and run on any device: make new tensors from `x` (or use Python numbers),
#   and never read a value back to Python (`bool(...)`, `.item()`, an `if` on a tensor), which on an
#   accelerator waits for the device. The check runs your function once on the `meta` device, which has
#   shapes and dtypes but no values: code that makes a tensor on a fixed device or reads a value fails
#   there.

# %%
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    ### BEGIN SOLUTION
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)    # fully masked: -inf - (-inf) would be nan
    e = (x - m).exp()                                             # there every exp is 0 ...
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)         # ... and 0 / 1 keeps the row at 0
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("00_warmup_lab", softmax)

# %% [markdown]
# The same function on `DEVICE`, with a padded batch of attention scores: the second query's keys are
# all padding.

# %%
scores = torch.randn(2, 4, device=DEVICE)
scores[1] = float("-inf")
print(DEVICE, softmax(scores, dim=-1).cpu())


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
