# %% [markdown]
# # 00 · Start here: what this machine can show, and how the course works
#
# | | |
# |---|---|
# | **What you will learn** | what your machine can run and why a section skips; why many small operations are slow; your path through the course, with times |
# | **Prerequisites** | Python and basic PyTorch (tensors, `nn.Module`) |
# | **Hardware** | any CPU; on a GPU the measurements run there |
# | **Time** | 20 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each lesson asks you to **predict before it measures**: a 🔮 cell asks a question (a control in
# JupyterLab); answer it, run on, and a later cell says whether you were right and why, on *this* machine.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/00_start_here.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)

# %% [markdown]
# ## This machine, and what a skipped section looks like
#
# `helpers.device` is the only code that inspects hardware. A lesson asks it once for `DEVICE`, and asks
# `requires(...)` before a section that needs what a CPU lacks: a skipped section prints what is missing
# and what would run it, and the run's record keeps it. The table is `python -m helpers doctor`: read it
# before the question under it.

# %% tags=["predict"]
import torch
from IPython.display import HTML, display

from helpers import bench
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.doctor import report_html
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)   # LABS_QUICK=1 in the environment also turns it on (the test suite does)
DEVICE = pick_device()
caps = capabilities()
print(f"torch {torch.__version__} · device: {DEVICE} · {caps.device_name}")
display(HTML(report_html(with_lessons=False)))
if requires("accelerator", section="Accelerator details"):
    print(f"{caps.device_name} ({caps.arch}): {caps.memory_gb} GiB, bf16 {caps.bf16}, fp8 {caps.fp8}")
skip_guess = predict("How many of the core lessons 01-08 skip at least one section on this machine?",
                     unit="lessons", example=8)

# %% [markdown]
# ## Many small operations, or one large one
#
# Every PyTorch call pays a fixed cost before any arithmetic: Python, the dispatcher, on a GPU a kernel
# launch. We add 1 to many small tensors: a loop of `add_`, one `torch._foreach_add_` over the list, one
# `add_` on a concatenated tensor. `helpers.bench.compare` times them interleaved: read the ratios.

# %% tags=["predict"]
foreach_guess = predict("How many times faster than the loop is the single _foreach_add_ call?", unit="x",
                        example=3.0)

# %% tags=["reveal", "predict"]
n_tensors, size = (16, 256) if QUICK else (64, 4096)
tensors = [torch.randn(size, device=DEVICE) for _ in range(n_tensors)]
flat = torch.cat(tensors)

result = bench.compare({"loop of add_": lambda: [t.add_(1.0) for t in tensors],
                        "_foreach_add_": lambda: torch._foreach_add_(tensors, 1.0),
                        "one big add_": lambda: flat.add_(1.0)},
                       baseline="loop of add_", repeats=3 if QUICK else 7, device=DEVICE)
print(bench.table(result))
bench.plot(result, title=f"{n_tensors} tensors of {size} floats, +1 each").show()
how = ("on a CPU it still adds tensor by tensor in C++ (ATen's ForeachOpsKernels.cpp): it saves Python's share"
       if DEVICE.type == "cpu" else "on a GPU it launches a few fused kernels instead of one per tensor")
spread = "" if bench.separated(result, "loop of add_", "_foreach_add_") else " Their spreads overlap: too close to call."
reveal(foreach_guess, result["results"]["_foreach_add_"]["ratio_to_baseline"],
       why=f"the loop makes {n_tensors} Python calls, _foreach_add_ one; {how}. One big add_ pays the per-call "
           f"cost once: {result['results']['one big add_']['ratio_to_baseline']:.1f}x.{spread}")
# A GPU pays microseconds of host time per launch and streams memory far faster than a CPU: its sweep goes larger.
SWEEP = range(4, 19, 2) if DEVICE.type == "cpu" else range(4, 25, 2)
TOP = SWEEP[-1]
size_guess = predict("With 16 tensors, where is _foreach_add_'s advantage over the loop larger?",
                     options=["at 2^4 floats per tensor", f"at 2^{TOP} floats per tensor", "about the same"],
                     example="at 2^4 floats per tensor")


# %% tags=["reveal"]
def foreach_point(n: int) -> dict:
    ts = [torch.randn(2 ** n, device=DEVICE) for _ in range(16)]
    return bench.compare({"loop": lambda: [t.add_(1.0) for t in ts], "foreach": lambda: torch._foreach_add_(ts, 1.0)},
                         repeats=3 if QUICK else 5, min_run_time=0.02 if QUICK else 0.05, device=DEVICE)["results"]


points = {n: foreach_point(n) for n in SWEEP}          # measured once; the check below reads it
sweep = {n: point["foreach"]["ratio_to_baseline"] for n, point in points.items()}
print(f"_foreach_add_ against the loop on {DEVICE.type}, 16 tensors of 2^n floats:\n"
      + "   ".join(f"2^{n}: {ratio:.2f}x" for n, ratio in sweep.items()))
per_call_us, bandwidth_gbs = points[4]["loop"]["median_s"] / 16 * 1e6, 2**TOP * 128 / points[TOP]["foreach"]["median_s"] / 1e9
even_log2, small, large = torch.tensor(per_call_us * bandwidth_gbs * 1e3 / 8).log2().item(), sweep[4], sweep[TOP]
measured = ("about the same" if max(small, large) / min(small, large) < 1.25
            else "at 2^4 floats per tensor" if small > large else f"at 2^{TOP} floats per tensor")
(lo4, hi4), (lo_top, hi_top) = (bench.speedup_range(points[n], "loop", "foreach") for n in (4, TOP))
noisy = "Spreads overlap: too noisy here to tell; run again or use fewer threads. " if lo4 <= hi_top and lo_top <= hi4 else ""
reveal(size_guess, measured, why=noisy + f"{small:.1f}x at 2^4 against {large:.1f}x at 2^{TOP}. A call costs {per_call_us:.1f} "
       f"us here, and memory streams at {bandwidth_gbs:.3g} GB/s: one tensor's traffic equals one call's cost near "
       f"2^{even_log2:.1f} floats. Below that the calls are most of the time; above it the traffic is, and both "
       "ways add the same numbers." + (" Far below 1x is other load here: run the cell again." if large < 0.8 else ""))

# %% [markdown]
# ## Your turn: where does the overhead stop mattering?

# %% tags=["your-turn"]
# At which smallest size n of the sweep is _foreach_add_ less than 1.2 times faster than the loop? (Look
# above the size where the model puts traffic and call cost level.) Set log2_size and run the check, which
# reads the same sweep; the slider (in JupyterLab) re-measures one size live.
import ipywidgets as widgets

from helpers.interactive import interact

def live_point(n: int) -> None:
    point = foreach_point(n)
    lo, hi = bench.speedup_range(point, "loop", "foreach")
    print(f"2^{n} floats per tensor: {point['foreach']['ratio_to_baseline']:.1f}x ({lo:.1f}x to {hi:.1f}x over the "
          "repeats)" + ("" if bench.separated({"results": point}, "loop", "foreach") else f"; {bench.NOISY}"))


interact(live_point, n=widgets.IntSlider(value=8, min=SWEEP[0], max=TOP, step=2));
log2_size = None

# %%
from helpers.checks import fail, your_turn

def check_size():
    if not any(ratio < 1.2 for ratio in sweep.values()):
        fail("the sweep", f"no size up to 2^{TOP} got below 1.2x here", "other load? run the sweep cell again")
    if log2_size not in sweep:
        fail("the size", f"log2_size is {log2_size!r}", f"set it to an even number from {SWEEP[0]} to {TOP}")
    answer = min(n for n, ratio in sweep.items() if ratio < 1.2)
    ranges = [bench.speedup_range(points[n], "loop", "foreach") for n in (answer, log2_size)]
    if abs(log2_size - answer) == 2 and any(lo < 1.2 <= hi for lo, hi in ranges):
        return   # a neighbour whose range straddles 1.2x: either size is right on this run
    if sweep[log2_size] >= 1.2:
        fail("the size", f"at 2^{log2_size} the sweep has _foreach_add_ at {sweep[log2_size]:.2f}x, still 1.2x "
             "or more", "go larger: the arithmetic must outweigh the calls")
    if any(sweep[n] < 1.2 for n in sweep if n < log2_size):
        fail("the size", f"a smaller size than 2^{log2_size} already qualifies", "go smaller: the smallest such size")

your_turn(check_size, what="where the per-call cost stops mattering")

# %% [markdown]
# ## Your path through the collection
#
# Each lesson, deep dive and lab with its time and what skips here, then how far you are: what you ran,
# skipped, passed and predicted, as your notebooks noted it on this machine (`python -m helpers progress`).
# In a lab, a check after your code passes or names the mistake; lab 00 shows how.

# %% tags=["reveal"]
from helpers.doctor import core_lessons_skipping, learning_path
from helpers.progress import show_progress

print(learning_path(caps))
skipping = core_lessons_skipping(caps)
reveal(skip_guess, len(skipping), tolerance=1,
       why=f"{len(skipping)} ask for what this machine lacks (a GPU, Triton on a GPU, a free-threaded Python, ...). "
           "Each still runs to the end, and its skipped sections say what they need.")
show_progress()

# %% [markdown]
# ## Going further
#
# Open lesson 01 next, or the one your work needs. On a GPU, `DEVICE` is `cuda` (AMD GPUs too) or `xpu`
# and the skipped sections run; `environments/` has an install file per target.
#
# **Claims** are checked against PyTorch's source and release notes: 2.10 supports Python 3.10-3.14
# (`Requires-Python >=3.10`), not "3.8 through 3.13" as a widely read article says.
#
# **What has run where.** CI has no GPU: its runs are on CPUs (the card's "Verified" row); on a GPU the GPU
# sections run first with you, and `make gpu-check` says what ran.
