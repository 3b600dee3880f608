# %% [markdown]
# # Lab 02 · A combo kernel's dispatch, and predicting kernel counts
#
# | | |
# |---|---|
# | **What you will learn** | how a combo kernel's launch grid is sized; how each program finds its part from its program id; when Inductor dispatches a combo kernel round-robin and what that costs in idle programs; how to predict, then measure, how many kernel functions `torch.compile` generates |
# | **Prerequisites** | lesson 02 (horizontal fusion and combo kernels) |
# | **Hardware** | any CPU. Exercise 2 needs Triton (`pip install triton`): on a CPU it runs under Triton's interpreter, on a GPU compiled |
# | **Time** | 35 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04) |
#
# Each exercise cell is followed by a check cell: `✅ ... passed`, or `❌` with a hint. `check(LAB, function)`
# runs the visible cases of the lab's grading spec (`helpers/grading/specs/lab02.py`); `python -m helpers
# grade` runs the same cases plus hidden ones.

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
    os.environ["LABS_NOTEBOOK"] = "labs/02_fusion_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)

# %%
import os

import torch

from helpers import fusion
from helpers.device import pick_device, quick_mode, requires
from helpers.grading.checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if DEVICE.type == "cpu":   # before anything imports Triton: its interpreter runs kernels on the CPU
    os.environ["TRITON_INTERPRET"] = "1"
torch.manual_seed(0)


# %% [markdown]
# ## Exercise 1: size the launch grid
#
# A combo kernel runs several parts in one launch. Part `i` works on `numels[i]` elements in blocks
# of `block` elements, so it needs `ceil(numels[i] / block)` programs. Return the total number of
# programs, and the cumulative **ends**: part `i` owns the program ids `ends[i-1] <= pid < ends[i]`
# (with `ends[-1]` taken as 0 for part 0). An empty part owns no programs.
#
# Example: `numels=[1000, 1, 3075]`, `block=256` → `(18, [4, 5, 18])`.

# %%
def combo_grid(numels: list[int], block: int) -> tuple[int, list[int]]:
    ### BEGIN SOLUTION
    ends, total = [], 0
    for n in numels:
        total += (n + block - 1) // block
        ends.append(total)
    return total, ends
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("02_fusion_lab", combo_grid)

# %% [markdown]
# ## Exercise 2: dispatch by program id, inside the kernel
#
# Write the body of `three_part_kernel`: every program reads its id with `tl.program_id(0)`, works out
# which part it belongs to (the ends from exercise 1, computed in the kernel with `tl.cdiv`), and
# calls `apply_part(x, y, n, local_pid, alpha, PART, BLOCK)` with its **local** program id (its id
# minus the start of its part). `apply_part` (from `helpers/fusion_kernels.py`) does one block of
# part `PART`: 0 is `x * alpha`, 1 is `relu`, 2 is `silu`. Use `if` / `elif` / `else` on `pid`.
#
# The launcher below, `launch_three_part`, is given: it sizes the grid with `combo_grid` and launches
# your kernel once. Triton looks up `apply_part` among this notebook's globals, which is why it is
# assigned at top level. The launch may not call `fusion.combo_launch` or `fusion.combo_reference`
# (they compute the answer for you).
#
# The check calls `launch_three_part` on three tensors of mixed sizes (empty parts included), compares
# each part with `fusion.combo_reference`, and counts the launches of `three_part_kernel`: exactly one,
# since one launch for three parts is the point. On a CPU the tensors stay on the CPU and the kernel
# runs under Triton's interpreter; on a GPU they go to the GPU. It runs the launcher with the reference
# `combo_grid`, so this exercise is judged on the kernel alone. Without Triton the exercise and its
# check are skipped, and the check cell says so.

# %%
HAVE_TRITON = requires("triton_interpreter", section="Lab: combo kernel under Triton")

# %%
if HAVE_TRITON:
    import triton
    import triton.language as tl

    apply_part = fusion.apply_part_kernel()

    @triton.jit
    def three_part_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK: tl.constexpr):
        ### BEGIN SOLUTION
        pid = tl.program_id(0)
        end0 = tl.cdiv(n0, BLOCK)
        end1 = end0 + tl.cdiv(n1, BLOCK)
        if pid < end0:
            apply_part(x0, y0, n0, pid, alpha, 0, BLOCK)
        elif pid < end1:
            apply_part(x1, y1, n1, pid - end0, alpha, 1, BLOCK)
        else:
            apply_part(x2, y2, n2, pid - end1, alpha, 2, BLOCK)
        ### END SOLUTION

    def launch_three_part(xs, alpha=0.5, block=256):
        flat = [x.contiguous().reshape(-1) for x in xs]
        outs = [torch.empty_like(x) for x in flat]
        total, _ = combo_grid([x.numel() for x in flat], block)
        if total:
            three_part_kernel[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1], flat[1].numel(),
                                        flat[2], outs[2], flat[2].numel(), alpha, BLOCK=block)
        return [o.view(x.shape) for o, x in zip(outs, xs)]

# %%
if HAVE_TRITON:
    check("02_fusion_lab", launch_three_part)
else:
    print("Exercise 2 skipped: Triton cannot run here (the section message above says why), "
          "so its check did not run.")


# %% [markdown]
# ## Exercise 3: plan Inductor's combo launch
#
# Your kernel dispatches sequentially. Inductor's combo kernels can also dispatch **round-robin**
# (program `pid` runs part `pid % N`, block `pid // N`), and `ComboKernel.select_dispatch_strategy`
# (printed in lesson 02) picks one of the two for each combo kernel. Write
# `plan_combo_launch(numels, block)` for a combo kernel that `combo_kernels=True` made (mixed sizes
# allowed, sizes known at compile time) whose parts all use blocks of `block` elements. Return
# `(scheme, programs, idle)`: the scheme Inductor picks (`"round_robin"` or `"sequential"`), how many
# programs that launch has, and how many of them have no element to work on.
#
# Decide it from the rule, not by trial: the lesson ran the rule on one group of sizes; the check asks
# about groups near its edge, where counting in elements and counting in blocks disagree. A failing case
# names the fields you got wrong (`scheme`, `programs`, `idle`), not their values.

# %%
def plan_combo_launch(numels: list[int], block: int) -> tuple[str, int, int]:
    ### BEGIN SOLUTION
    blocks = [(n + block - 1) // block for n in numels]
    if sum(numels) / (max(numels) * len(numels)) > 0.8:
        programs = len(numels) * max(blocks)
        return "round_robin", programs, programs - sum(blocks)
    return "sequential", sum(blocks), 0
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("02_fusion_lab", plan_combo_launch)

# %% [markdown]
# Your plan for the SGD step's groups of 8 kernels (lesson 02), at two block sizes: how many programs
# would sit idle in each launch.

# %%
sgd_sizes = [1024 + 37 * i for i in range(30)]
for group in fusion.combo_groups(sgd_sizes):
    plans = {b: plan_combo_launch(group, b) for b in (256, 1024)}
    print(f"{len(group)} parts of {group[0]}..{group[-1]}: " + "; ".join(
        f"block {b}: {scheme}, {programs} programs, {idle} idle" for b, (scheme, programs, idle) in plans.items()))


# %% [markdown]
# ## Exercise 4: predict, then measure, how many kernels `torch.compile` generates
#
# Four functions, compiled for the **CPU** (Inductor's C++ backend, the same on every machine). For
# each, predict how many generated kernel functions (`cpp_fused_*`) the compiled wrapper calls.
# Remember from lesson 02 and its deep dive: the C++ backend groups consecutive loop nests into one function, and
# starts a new function only around a call it does not generate itself (a matmul goes to a library:
# `extern_kernels.mm`). A failing check names a function you predicted wrong, not its count.

# %%
def chain(x):
    return ((x * 2 + 1).sin() * 3).relu()

def independent(a, b):
    return a.sin(), b.cos()

def center(x):
    return x - x.mean(dim=-1, keepdim=True)

def matmul_between(x, w):
    return torch.relu((x * 2) @ w) + 1

x, w = torch.randn(64, 128), torch.randn(128, 32)
CASES = {"chain": (chain, (x,)), "independent": (independent, (x, torch.randn(1000))),
         "center": (center, (x,)), "matmul_between": (matmul_between, (x, w))}

def predicted_kernel_functions() -> dict[str, int]:
    """Your prediction: name -> number of cpp_fused_* functions the compiled wrapper calls."""
    ### BEGIN SOLUTION
    return {"chain": 1, "independent": 1, "center": 1, "matmul_between": 2}
    ### END SOLUTION

PREDICTED = predicted_kernel_functions()

# %% tags=["nbval-check-output"]
check("02_fusion_lab", predicted_kernel_functions)

# %% [markdown]
# What the check measured, here with each compiled result compared with eager, your prediction
# beside the count, and the loop nests inside each function (`loop_kernels`) and library calls:

# %%
for name, (fn, args) in CASES.items():
    info = fusion.inspect_compiled(fn, *args)
    torch.testing.assert_close(info.result, fn(*args))
    print(f"{name:<15} predicted {PREDICTED.get(name)}  measured {len(info.kernel_functions)}: "
          f"functions {info.kernel_functions}  loop kernels {info.loop_kernels}  "
          f"library calls {info.extern_calls}")

# %% [markdown]
# ## Going further (on a GPU)
#
# On a GPU the same functions become Triton kernels, each a separate launch, so the counts can
# change: independent ops that the C++ backend put into one function may become separate kernels,
# which is what `combo_kernels=True` can merge (pin the decision with `benchmark_combo_kernel=False`).
# Predict first, then measure with
# `fusion.inspect_compiled(fn, *[a.to(DEVICE) for a in args], options=fusion.COMBO_ON)` and `COMBO_OFF`.
