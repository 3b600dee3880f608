# %% [markdown]
# # Lab 00 · Warm-up: exercises, stubs and checks
#
# | | |
# |---|---|
# | **What you will learn** | how a lab works: write code where a stub raises `NotImplementedError`, run the check below it, read its hint; what a softmax must do with a fully masked row; how to write a function that runs on any device without reading values back to Python; where float16's range breaks a formula that is right in float32, and how to stay accurate without a float32 copy of the input |
# | **Prerequisites** | lesson 00 |
# | **Hardware** | any CPU; exercise 1 is also checked on the meta device, which shows whether the code would run on an accelerator unchanged |
# | **Time** | 34 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
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
from helpers.interactive import predict, reveal
from helpers.memory import tensors_made

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
# ## Exercise 2: an RMSNorm that float16 does not break
#
# `rms_norm(x, weight, eps)` normalises the last dimension: `x / sqrt(mean(x**2) + eps) * weight`, with plain
# tensor operations (no `torch.nn.functional.rms_norm`). It must:
#
# - raise a `ValueError` that says what to do when `weight`'s length does not match `x`'s last dimension;
# - take `x` in float32, float16 or bfloat16 (`weight` in the same dtype), whose rows may be small (entries
#   around 1e-4) or large (entries up to 60000), and return `x`'s dtype: within a few roundings of that dtype
#   of the formula computed in float64 (the check allows a relative 4e-3 in float16 and 2e-2 in bfloat16, plus
#   2e-3 and 1.6e-2 absolute);
# - give zeros for a row of zeros;
# - make no tensor as large as `x` in a wider dtype (`x.float()` of a float16 `x` is one). On a GPU an RMSNorm
#   takes the time its bytes take to move: the function itself reads `x` and writes the result, and a float32
#   copy of `x` writes twice `x`'s bytes and reads them back. The check records the tensors your function's
#   operations return (what one operation's kernel does inside is its own: a reduction given
#   `dtype=torch.float32` reads float16 on a GPU and accumulates in float32, where a CPU kernel may convert
#   first).
#
# Before you choose how to compute it, work out what the formula as written does in each dtype, at both ends
# of that range.

# %%
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    ### BEGIN SOLUTION
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight has shape {tuple(weight.shape)} but x's last dimension is {x.shape[-1]}: "
                         f"pass a weight of shape ({x.shape[-1]},)")
    # float16's squares are inf past |x| = 256 and lose their digits below about 8e-3: square x over its row's
    # largest |entry| (in [-1, 1]), and put that scale back on one float32 number per row
    s = x.abs().amax(-1, keepdim=True)
    s = torch.where(s == 0, torch.ones_like(s), s)                  # a row of zeros: 0 / 1, not 0 / 0
    mean_sq = (x / s).pow(2).mean(-1, keepdim=True).float() * s.float().pow(2)
    return x * torch.rsqrt(mean_sq + eps).to(x.dtype) * weight       # cast first: x times float32 is float32
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("00_warmup_lab", rms_norm)

# %% [markdown]
# ### Where float16 runs out
#
# The formula as written squares `x` in its own dtype. Before you run the next cells:

# %% tags=["predict"]
overflow_guess = predict("From what size of entry is x**2 inf in float16?", unit="", example=1000)

# %%
candidates = torch.arange(200, 300, 0.25, dtype=torch.float16)
first_inf = candidates[torch.isinf(candidates * candidates)][0].item()
print(f"float16's largest value: {torch.finfo(torch.float16).max:.0f}; the first entry whose square is inf: "
      f"{first_inf:g}; bfloat16's largest value: {torch.finfo(torch.bfloat16).max:.3g}")

# %% tags=["reveal"]
reveal(overflow_guess, first_inf,
       why="float16 has 5 exponent bits: its largest value is 65504, and the square root of that is 255.9, so an "
           "entry of 256 already squares to inf, and the formula as written returns zeros for its row. bfloat16 "
           "has float32's 8 exponent bits (largest 3.4e38) and only 8 bits of precision: its squares overflow "
           "nowhere near these sizes, its roundings are what cost accuracy.", tolerance=1.05);

# %% [markdown]
# The formula as written, a float32 copy, torch's own `rms_norm` and yours, on a float16 batch on `DEVICE`
# whose row 3 holds entries of about 1000: each one's largest error against the formula in float64 (on the
# CPU), and the tensors of `x`'s size its operations make in float32 (`tensors_made`, what the check records).

# %%
import math

x16 = torch.randn(8, 4096, device=DEVICE).half()
x16[3] *= 1000
w16 = torch.rand(4096, device=DEVICE).half() + 0.5
xd = x16.cpu().double()
exact = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w16.cpu().double()


def as_written(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def float32_copy(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def torch_rms_norm(x, weight, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


for name, fn in [("as written", as_written), ("float32 copy", float32_copy), ("torch's rms_norm", torch_rms_norm),
                 ("yours", rms_norm)]:
    out, made = tensors_made(fn, x16, w16)
    wide = [shape for _, dtype, shape in made if dtype.itemsize > 2 and math.prod(shape) >= x16.numel()]
    error = (out.cpu().double() - exact).abs().max().item()
    print(f"{name:>16}: largest error {error:9.3g}, {len(wide)} float32 tensor(s) of x's size "
          f"({len(wide) * x16.numel() * 4 / 2**10:.0f} KiB)")

# %% [markdown]
# Where the line for torch's own `rms_norm` shows float32 tensors of `x`'s size, its unfused path upcasts
# `x` as a whole (on the CPU, in 2.10 and 2.13): accurate, at the price of those bytes. A fused kernel's upcast
# costs no memory traffic: it loads float16 and computes in float32 in registers, as Inductor's Triton kernels do
# (`torch._inductor.config.triton.codegen_upcast_to_fp32`, True by default in 2.10). In eager mode every
# operation writes its whole result to memory, so there the choice of what to compute in which dtype is
# yours.
