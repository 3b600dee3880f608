# %% [markdown]
# # Lab 02 · A combo kernel's dispatch, predicting kernel counts, and when combo kernels pay
#
# | | |
# |---|---|
# | **What you will learn** | how a combo kernel's launch grid is sized when each part has its own block size; how each program finds its part from its program id; when Inductor dispatches a combo kernel round-robin and what that costs in idle programs; how to predict, then measure, how many kernel functions `torch.compile` generates; whether to turn `combo_kernels` on for an optimizer step, decided from the launches in Inductor's output code and what a step costs on the host and on the GPU, then held against an H200's measurements |
# | **Prerequisites** | lesson 02 (horizontal fusion and combo kernels) |
# | **Hardware** | any CPU. Exercise 2 needs Triton (`pip install triton`): on a CPU it runs under Triton's interpreter, on a GPU compiled |
# | **Time** | 64 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-04) |
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
# of `blocks[i]` elements (each part its own block size, as the combo kernel of exercise 2 has them), so it
# needs `ceil(numels[i] / blocks[i])` programs. Return the total number of programs, and the cumulative
# **ends**: part `i` owns the program ids `ends[i-1] <= pid < ends[i]` (with `ends[-1]` taken as 0 for
# part 0). An empty part owns no programs.
#
# Example: `numels=[1000, 1, 3075]`, `blocks=[256, 64, 1024]` → `(9, [4, 5, 9])`.

# %%
def combo_grid(numels: list[int], blocks: list[int]) -> tuple[int, list[int]]:
    ### BEGIN SOLUTION
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += (n + block - 1) // block
        ends.append(total)
    return total, ends
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("02_fusion_lab", combo_grid)

# %% [markdown]
# ## Exercise 2: dispatch by program id, inside the kernel
#
# The deep dive's hand-written combo kernel (`combo_kernel` in `helpers/fusion_kernels.py`) runs three
# parts that share one block size, `BLOCK`. Yours gives each part its own: part 0 runs in blocks of
# `BLOCK0` elements, part 1 of `BLOCK1`, part 2 of `BLOCK2`, as Inductor's combo kernels do in releases
# after 2.10 with `combo_kernel_per_subkernel_blocks` (off by default), which gives each sub-kernel its own
# `XBLOCK_i`. Read that kernel, then write the body of `three_part_kernel`: every program reads its id with
# `tl.program_id(0)`, works out which part it belongs to (the ends of exercise 1, computed in the kernel
# with `tl.cdiv`), and calls `apply_part(x, y, n, local_pid, alpha, PART, BLOCK)` with its **local**
# program id (its id minus the start of its part) and its part's block size. `apply_part` (from
# `helpers/fusion_kernels.py`) does one block of part `PART`: 0 is `x * alpha`, 1 is `relu`, 2 is `silu`.
# Use `if` / `elif` / `else` on `pid`.
#
# The launcher below, `launch_three_part`, is given: it sizes the grid with `combo_grid` and launches
# your kernel once. Triton looks up `apply_part` among this notebook's globals, which is why it is
# assigned at top level. The launch may not call `fusion.combo_launch` or `fusion.combo_reference`
# (they compute the answer for you).
#
# The check calls `launch_three_part` on three tensors of mixed sizes (empty parts included) with blocks
# of three different sizes, compares each part with `fusion.combo_reference`, and counts the launches of
# `three_part_kernel`: exactly one, since one launch for three parts is the point. On a CPU the tensors
# stay on the CPU and the kernel runs under Triton's interpreter; on a GPU they go to the GPU. It runs the
# launcher with a right `combo_grid`, so this exercise is judged on the kernel alone. Without Triton the
# exercise and its check are skipped, and the check cell says so.

# %%
HAVE_TRITON = requires("triton_interpreter", section="Lab: combo kernel under Triton")

# %%
if HAVE_TRITON:
    import triton
    import triton.language as tl

    apply_part = fusion.apply_part_kernel()

    @triton.jit
    def three_part_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha,
                          BLOCK0: tl.constexpr, BLOCK1: tl.constexpr, BLOCK2: tl.constexpr):
        ### BEGIN SOLUTION
        pid = tl.program_id(0)
        end0 = tl.cdiv(n0, BLOCK0)
        end1 = end0 + tl.cdiv(n1, BLOCK1)
        if pid < end0:
            apply_part(x0, y0, n0, pid, alpha, 0, BLOCK0)
        elif pid < end1:
            apply_part(x1, y1, n1, pid - end0, alpha, 1, BLOCK1)
        else:
            apply_part(x2, y2, n2, pid - end1, alpha, 2, BLOCK2)
        ### END SOLUTION

    def launch_three_part(xs, alpha=0.5, blocks=(256, 64, 1024)):
        flat = [x.contiguous().reshape(-1) for x in xs]
        outs = [torch.empty_like(x) for x in flat]
        total, _ = combo_grid([x.numel() for x in flat], list(blocks))
        if total:
            three_part_kernel[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1], flat[1].numel(),
                                        flat[2], outs[2], flat[2].numel(), alpha,
                                        BLOCK0=blocks[0], BLOCK1=blocks[1], BLOCK2=blocks[2])
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
# Your kernel dispatches sequentially. In 2.10 the pointwise sub-kernels of one of Inductor's combo kernels
# share one block size, `XBLOCK`, and such a kernel can also dispatch **round-robin**
# (program `pid` runs part `pid % N`, block `pid // N`); `ComboKernel.select_dispatch_strategy`
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
# each, predict how many generated kernel functions (`cpp_fused_*`) the compiled wrapper calls, from what
# lesson 02 and its deep dive showed of the code that backend writes; the check refuses `torch.compile`,
# so predict first. A failing check names a function you predicted wrong, not its count.

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
# ## Exercise 5: combo kernels on, off, or `_foreach_`?
#
# `combo_kernels` is off by default in 2.10 and marked experimental: whether to turn it on for a training
# step is its user's decision, and so is checking what it did. Lesson 02 timed the SGD step four ways on an
# NVIDIA H200. Here is what Inductor generated for that step there, the code `TORCH_LOGS="output_code"`
# prints, kept with the times the H200 measured (`fusion.recorded_sgd_step()`: torch 2.10's code for 30
# parameters of 1024 to 2097 elements and for the lesson's quick run of 6, combo kernels off and on). Read it
# first: the wrapper's `call` launches each kernel with `.run(...)`, and a combo kernel's source begins with
# its dispatch, one branch per sub-kernel, each with that sub-kernel's size (`xnumel = ...`).

# %%
record = fusion.recorded_sgd_step()
full = record["workloads"]["full"]
for step in ("combo_off", "combo_on"):
    runs = [line for line in fusion.wrapper_calls(full["code"][step]) if ".run(" in line]
    print(f"{step}: the wrapper launches {len(runs)} kernels; the first: {runs[0][:80]} ...")
first = fusion.kernel_functions(full["code"]["combo_on"])[0]
dispatch = [line for line in fusion.kernel_source(full["code"]["combo_on"], first).splitlines()
            if "pid" in line or "xnumel = " in line]
print(f"\nthe first lines of {first}'s dispatch:")
print("\n".join(dispatch[:12]))
LAUNCHES = {step: fusion.launch_sizes(code) for step, code in full["code"].items()}
print(f"\nLAUNCHES['combo_off']: {len(LAUNCHES['combo_off'])} kernels of one parameter each; LAUNCHES['combo_on']: "
      f"{len(LAUNCHES['combo_on'])} kernels of {[len(k) for k in LAUNCHES['combo_on']]} sub-kernels")

# %% [markdown]
# **The cost model.** A step runs on two sides at once. The host (the CPU) runs the step's Python, checks what
# must be checked and launches the kernels; the GPU runs the kernels behind it, in order. A step takes the
# **longer** of the host's time and the GPU's: it is *host-bound* when the host's is longer (the GPU waits for
# work), *device-bound* when the GPU's is. In this exercise, in microseconds (`costs[...]`):
#
# - the `_foreach_` step (`fusion.sgd_step_foreach`) makes 4 `_foreach_` calls. Each costs the host
#   `foreach_us`, plus `foreach_tensor_us` for each parameter in its lists, and launches one kernel whose
#   programs each do one op on a block of `block` elements of one parameter, `foreach_program_us` each;
# - a compiled step costs the host `call_us` per call (Dynamo's cache lookup and the wrappers), `guard_us`
#   for each tensor the step takes (its guards, and the output code's `assert_size_stride`, check every one:
#   the parameter, its gradient and its momentum buffer), and `launch_us` for each kernel its code launches;
# - on the GPU every kernel costs `kernel_us`, however little it does, plus its programs. A compiled
#   kernel's program does a block of `block` elements of one parameter (its three tensors): `program_us`
#   when it has work, `idle_us` when it has none (it reads its program id, finds nothing to do, and ends).
#   A combo kernel's programs are those its dispatch launches;
# - `launches` is what each compiled step's output code launches: `launches["combo_off"]` and
#   `launches["combo_on"]`, each a list of kernels, each kernel a list of its sub-kernels' sizes (a plain
#   kernel has one; with combo kernels off there is one kernel per parameter), as `LAUNCHES` above.
#
# **Your decision.** Write `choose_step(costs, launches)`: the fastest step under this model, `"foreach"`,
# `"combo_off"` or `"combo_on"`, and the side that sets its time, `"host"` or `"device"` (`"host"` when the
# two are equal), as a tuple. The model cannot tell apart steps within 2% of the fastest: of those, take the
# simplest, `_foreach_` (no compile), then combo kernels off (`torch.compile`'s default), then on (an
# experimental option). Your `plan_combo_launch` of exercise 3 is graded with a right one in its place here.
# The check holds your answer against the model on the H200's costs and on costs and sizes of its own.
#
# The H200's costs (`fusion.H200_STEP_COSTS`): the host's are fitted to the 8 times it measured (below). The
# GPU's were not measured there, they are assumed: 3 µs a kernel, and a program at the H200's 4.8 TB/s of
# memory bandwidth (a compiled program moves 1024 float32 elements of 5 tensors, 20 KiB, in 4.3 ns; a
# `_foreach_` program those of 2 or 3), an idle program a tenth of a busy one, blocks of 1024 elements
# (Inductor picks `XBLOCK` at run time, by autotuning: the code does not say).

# %%
H200_COSTS = dict(fusion.H200_STEP_COSTS)
print(H200_COSTS)


def choose_step(costs: dict, launches: dict) -> tuple[str, str]:
    ### BEGIN SOLUTION
    block = costs["block"]
    sizes = [n for kernel in launches["combo_off"] for n in kernel]
    blocks = sum((n + block - 1) // block for n in sizes)
    times = {"foreach": (4 * (costs["foreach_us"] + len(sizes) * costs["foreach_tensor_us"]),
                         4 * (costs["kernel_us"] + blocks * costs["foreach_program_us"]))}
    for step in ("combo_off", "combo_on"):
        host = costs["call_us"] + 3 * len(sizes) * costs["guard_us"] + len(launches[step]) * costs["launch_us"]
        device = 0.0
        for parts in launches[step]:
            _, programs, idle = plan_combo_launch(parts, block)
            device += costs["kernel_us"] + (programs - idle) * costs["program_us"] + idle * costs["idle_us"]
        times[step] = (host, device)
    fastest = min(max(t) for t in times.values())
    step = next(s for s in ("foreach", "combo_off", "combo_on") if max(times[s]) <= 1.02 * fastest)
    host, device = times[step]
    return step, "host" if host >= device else "device"
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("02_fusion_lab", choose_step)

# %% [markdown]
# Your choice for the H200's two recorded steps, with what the model makes of each step beside what the H200
# measured (torch 2.11.0+cu130, 2026-12-04; the code above is 2.10's, and the kernels and dispatches it
# generated there are the same), then each combo kernel of the 30-parameter step: the dispatch its code
# shows, against your plan of exercise 3.

# %%
from helpers.grading.harnesses.lab02 import step_us

MEASURED = {"foreach": "_foreach_", "combo_off": "compiled, combo off", "combo_on": "compiled, combo on"}
for w in record["workloads"].values():
    launches = {step: fusion.launch_sizes(code) for step, code in w["code"].items()}
    step, bound = choose_step(H200_COSTS, launches)
    print(f"{len(w['sizes'])} parameters of {w['sizes'][0]} to {w['sizes'][-1]} elements: your choice "
          f"{step}, {bound}-bound")
    for name, measured in MEASURED.items():
        host, device = step_us(H200_COSTS, launches, name)
        print(f"    {name:<10} model: host {host:6.1f} µs, GPU {device:5.1f} µs -> {max(host, device):6.1f} µs"
              f"    measured {w['measured_us'][measured]:6.1f} µs")
for k in fusion.combo_dispatches(full["code"]["combo_on"]):
    scheme, programs, idle = plan_combo_launch(k.numels, H200_COSTS["block"])
    print(f"{k.name}: {len(k.numels)} sub-kernels of {k.numels[0]} to {k.numels[-1]}: the code dispatches "
          f"{k.scheme}, your plan {scheme}, {programs} programs of which {idle} idle at XBLOCK 1024")
M = 1 << 20
for label, sizes in (("30 parameters of 4M elements", [4 * M] * 30),
                     ("100 parameters of 256K elements", [256 * 1024] * 100),
                     ("an embedding of 64M beside 7 parameters of 1M", [64 * M] + [M] * 7)):
    print(f"your choice on the H200's costs for {label}: "
          f"{choose_step(H200_COSTS, {'combo_off': [[n] for n in sizes], 'combo_on': fusion.combo_groups(sizes)})}")

# %% [markdown]
# The H200's times are medians of one run each, recorded without their spread, so only a gap far larger than
# a run's usual few percent is read here as a difference. The H200 agrees with the model where it was
# measured, and both steps were host-bound. With 6 tiny parameters combo kernels on and `_foreach_` cannot be
# told apart (66 and 67.5 µs); with 30, combo kernels did what they
# promise against the compiled step without them, 30 launches down to 4 (316 to 162 µs), and still took
# nearly twice `_foreach_`'s 88 µs: a compiled call's host work grows with every tensor it takes (90 here),
# `_foreach_`'s 4 calls much less. Combo kernels pay against `_foreach_` where the GPU's work sets the time
# (large tensors: one compiled kernel per parameter passes over its tensors once, `_foreach_`'s four
# kernels four times) or where the host's cost per tensor is small. To see what happened in your own step:
# `TORCH_LOGS="output_code"` shows the launches (`.run(` in `call`) and each combo kernel's dispatch
# (`if pid < num_xblocks_0` sequential, `if pid % N == 0` round-robin); a profiler trace of a host-bound
# step shows the GPU idle between short kernels.

# %% [markdown]
# ## Going further (on a GPU)
#
# On a GPU the same functions become Triton kernels, each a separate launch, so the counts can
# change: independent ops that the C++ backend put into one function may become separate kernels,
# which is what `combo_kernels=True` can merge (pin the decision with `benchmark_combo_kernel=False`).
# Predict first, then measure with
# `fusion.inspect_compiled(fn, *[a.to(DEVICE) for a in args], options=fusion.COMBO_ON)` and `COMBO_OFF`.
