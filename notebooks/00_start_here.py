# %% [markdown]
# # 00 · Start here: what PyTorch 2.10 shipped, and what this machine can show
#
# | | |
# |---|---|
# | **What you will learn** | what your machine can run and why a section skips; why many small operations are slow; your path through the course, with times |
# | **Prerequisites** | Python and basic PyTorch (tensors, `nn.Module`) |
# | **Hardware** | any CPU; on a GPU the measurements run there |
# | **Time** | 20 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build), 2.14.1+cu130 (env latest: CUDA 13.0 build, no GPU) (make matrix, 2026-12-02) |
#
# Each lesson asks you to **predict before it measures**: a 🔮 cell asks a question (a control in
# JupyterLab); answer it, run on, and a later cell says whether you were right and why, on *this* machine.

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)

# %% [markdown]
# ## This machine, and what a skipped section looks like
#
# `helpers.device` is the only code that inspects hardware. A lesson asks it once for `DEVICE`, and asks
# `requires(...)` before a section that needs what a CPU lacks: a skipped section prints what is missing
# and what would run it, and the run's record keeps it. The table is `python -m helpers doctor`.

# %%
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

# %% [markdown]
# ## Many small operations, or one large one
#
# Every PyTorch call pays a fixed cost before any arithmetic: Python, the dispatcher, on a GPU a kernel
# launch. We add 1 to many small tensors: a loop of `add_`, one `torch._foreach_add_` over the list, one
# `add_` on a concatenated tensor. `helpers.bench.compare` times them interleaved: read the ratios.

# %% tags=["predict"]
foreach_guess = predict("How many times faster than the loop is the single _foreach_add_ call?", unit="x",
                        example=3.0)

# %% tags=["reveal"]
n_tensors, size = (16, 256) if QUICK else (64, 4096)
tensors = [torch.randn(size, device=DEVICE) for _ in range(n_tensors)]
flat = torch.cat(tensors)

def one_by_one():
    for t in tensors:
        t.add_(1.0)

result = bench.compare({"loop of add_": one_by_one,
                        "_foreach_add_": lambda: torch._foreach_add_(tensors, 1.0),
                        "one big add_": lambda: flat.add_(1.0)},
                       baseline="loop of add_", repeats=3 if QUICK else 7, device=DEVICE)
print(bench.table(result))
bench.plot(result, title=f"{n_tensors} tensors of {size} floats, +1 each").show()
how = ("on a CPU it still adds tensor by tensor in C++ (ATen's ForeachOpsKernels.cpp): it saves Python's share"
       if DEVICE.type == "cpu" else "on a GPU it launches a few fused kernels instead of one per tensor")
reveal(foreach_guess, result["results"]["_foreach_add_"]["ratio_to_baseline"],
       why=f"the loop makes {n_tensors} Python calls, _foreach_add_ one; {how}. One big add_ pays the per-call "
           f"cost once: {result['results']['one big add_']['ratio_to_baseline']:.1f}x. Lesson 02: torch.compile "
           "does this for you.")

# %% tags=["predict"]
size_guess = predict("With 16 tensors, where is _foreach_add_'s advantage over the loop larger?",
                     options=["at 2^4 floats per tensor", "at 2^18 floats per tensor", "about the same"],
                     example="at 2^4 floats per tensor")


# %% tags=["reveal"]
def foreach_speedup(log2_size: int) -> float:
    ts = [torch.randn(2 ** log2_size, device=DEVICE) for _ in range(16)]
    r = bench.compare({"loop": lambda: [t.add_(1.0) for t in ts], "foreach": lambda: torch._foreach_add_(ts, 1.0)},
                      repeats=3, min_run_time=0.02, device=DEVICE)
    return r["results"]["foreach"]["ratio_to_baseline"]

small, large = foreach_speedup(4), foreach_speedup(18)
measured = ("about the same" if max(small, large) / min(small, large) < 1.25
            else "at 2^4 floats per tensor" if small > large else "at 2^18 floats per tensor")
reveal(size_guess, measured, why=f"{small:.1f}x at 2^4 against {large:.1f}x at 2^18: with 16 floats the per-call "
       "cost is the whole time; with 2^18 each call streams a megabyte, and that traffic dominates.")

# %% [markdown]
# ## Your turn: where does the overhead stop mattering?

# %% tags=["your-turn"]
# With the slider (in JupyterLab), find the smallest even size from 4 to 18 at which _foreach_add_ is less
# than 1.5 times faster than the loop on this machine; set log2_size to it and run the check.
import ipywidgets as widgets

from helpers.interactive import interact

interact(lambda log2_size: print(f"2^{log2_size} floats per tensor: {foreach_speedup(log2_size):.1f}x"),
         log2_size=widgets.IntSlider(value=8, min=4, max=18, step=2));
log2_size = 4

# %%
from helpers.checks import fail, your_turn

def check_size():
    if log2_size not in range(4, 19, 2):
        fail("the size", f"{log2_size} is not an even number from 4 to 18", "use a value the slider offers")
    if foreach_speedup(log2_size) >= 1.5:
        fail("the size", f"at 2^{log2_size} _foreach_add_ is still 1.5x or more faster",
             "go larger: the arithmetic must outweigh the calls")
    if log2_size > 4 and foreach_speedup(log2_size - 2) < 1.5:
        fail("the size", f"2^{log2_size - 2} already qualifies", "go smaller: the smallest such size")

your_turn(check_size, what="where the per-call cost stops mattering")

# %% [markdown]
# ## Your path through the collection
#
# Each lesson, deep dive and lab with its time and what skips here. In a lab, a check after your code
# passes or names the mistake; lab 00 shows how.

# %% tags=["predict"]
skip_guess = predict("How many of the core lessons 01-08 skip at least one section on this machine?",
                     unit="lessons", example=8)

# %% tags=["reveal"]
from helpers.doctor import core_lessons_skipping, learning_path

print(learning_path(caps))
skipping = core_lessons_skipping(caps)
reveal(skip_guess, len(skipping), tolerance=1,
       why=f"{len(skipping)} ask for what this machine lacks (a GPU, Triton on a GPU, a free-threaded Python, ...). "
           "Each still runs to the end, and its skipped sections say what they need.")

# %% [markdown]
# ## Going further
#
# Open lesson 01 next, or the one your work needs. On a GPU, `DEVICE` is `cuda` (AMD GPUs too) or `xpu`
# and the skipped sections run; `environments/` has an install file per target.
#
# **Claims** are checked against PyTorch's source and release notes; each lesson corrects the articles on its
# topic. Here: 2.10 supports Python 3.10-3.14 (`Requires-Python >=3.10`), not "3.8 through 3.13".
#
# **What has run where.** CI has no GPU: its runs are on CPUs (the card's "Verified" row); on a GPU the GPU
# sections run first with you, and `make gpu-check` says what ran.
