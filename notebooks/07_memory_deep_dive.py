# %% [markdown]
# # 07 · Deep dive: memory, from the profiler's categories to the CUDA allocator
#
# | | |
# |---|---|
# | **What you will learn** | what replaces the deprecated `export_memory_timeline`; what the "unknown" category holds, named by the operations that made it, and what Adam's foreach and fused updates make instead; selective activation checkpointing (a policy per operation) measured against full checkpointing; activation memory against the batch size; on an NVIDIA or AMD GPU: the same training step by category with allocated against reserved memory, the CUDA allocator's history snapshots for pytorch.org/memory_viz, nested `torch.cuda.MemPool`s (fixed in 2.10), fragmentation and the allocator setting that fits it, `expandable_segments` (set at start-up or at run time, and its limits), a snapshot dumped when memory runs out; other hardware; pitfalls |
# | **Prerequisites** | [lesson 07](07_memory.ipynb) |
# | **Hardware** | any CPU. The sections on the training step on a GPU, allocator history, memory pools, fragmentation and out-of-memory need an NVIDIA or AMD GPU; elsewhere they are skipped with the reason |
# | **Time** | 55 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04); the exporter's categories and Adam's CPU path read in the 2.10.0 and 2.13.0 wheels (`torch/profiler/_memory_profiler.py`, `torch/optim/adam.py`); 2.10 facts from its release notes (nested `use_mem_pool`, PR #168382) and its CUDA wheel (`torch/cuda/memory.py`, strings of `libc10_cuda.so`) |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/07_memory_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
BATCH, WIDTH, DEPTH = 1024, 512, 4

# %%
import plotly.graph_objects as go
import torch

from helpers import bench, memory
from helpers.device import pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    BATCH, WIDTH = 128, 128
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · quick={QUICK}")

# %% [markdown]
# ## The exporter, its warning, and what replaces it
#
# The step here is the plain MLP of lab 07 (`memory.mlp`: Linear and GELU layers), with Adam, profiled
# after one warm-up step as in the core lesson.

# %%
model = memory.mlp(WIDTH, DEPTH)
step = memory.training_step(model, BATCH, WIDTH)
step()                                   # Adam creates its state in its first step
prof = memory.profile_steps(step, steps=1)
tl = memory.timeline(prof)
for w in tl["warnings"]:
    print(w)

# %% tags=["nbval-check-output"]
print("export_memory_timeline warned that it is deprecated (FutureWarning):",
      any(w.startswith("FutureWarning: `export_memory_timeline` is deprecated") for w in tl["warnings"]))
print("torch.cuda.memory has _export_memory_snapshot:", hasattr(torch.cuda.memory, "_export_memory_snapshot"))
print("torch.cuda.memory has _dump_snapshot:         ", hasattr(torch.cuda.memory, "_dump_snapshot"))

# %% [markdown]
# `export_memory_timeline` is deprecated on this torch and will be removed. Its message recommends
# `torch.cuda.memory._export_memory_snapshot`, a function that does not exist; the allocator's snapshot
# functions are `torch.cuda.memory._snapshot()` and `_dump_snapshot(path)` (the GPU sections below write
# the same pickle with `helpers.memory.dump_snapshot`, from a snapshot already taken). Both are CUDA-only
# and have no categories, so on a CPU the deprecated exporter is still the way to get categorised memory.
# Its `.html` output embeds a matplotlib PNG and prints "export_memory_timeline_html failed because
# matplotlib was not found" when matplotlib is absent; `memory.timeline` exports `.json` and the course
# plots it with plotly.
#
# ## The memory no category claims
#
# The exporter's `MemoryProfile` (`torch/profiler/_memory_profiler.py`) gives categories by rules, one
# method each: gradients (from `AccumulateGrad` and `.grad`), temporaries, parameters (from the Python
# tracer and from the data flow), inputs, activations, optimizer state (from the optimizer's state dict)
# and `autograd_detail` (outputs of backward functions). A tensor that no rule claims is "unknown" in the
# timeline. Rather than guess what it is, `memory.uncategorized(prof)` reads the same `MemoryProfile`
# (a private API) and groups those tensors by the operation that allocated them and the Python function
# it ran in:

# %%
print(f"'unknown' peaks at {memory.mib(memory.peak_bytes(tl, 'unknown'))}; the tensors behind it:")
for g in memory.uncategorized(prof):
    print(f"  {g['bytes']:>10,} bytes in {g['tensors']:>3} tensors made by {g['op']:<12} in {g['caller']}")

# %% [markdown]
# On a CPU, `torch.optim.Adam` runs its loop over one parameter at a time (`_single_tensor_adam` in
# `torch/optim/adam.py`): the `foreach` implementation is its default only when every parameter is on a
# device with foreach kernels (CUDA, XPU, MTIA or a PrivateUse1 backend: `_default_to_fused_or_foreach` in
# `torch/optim/optimizer.py`, `_get_foreach_kernels_supported_devices` in `torch/utils/_foreach_utils.py`).
# The loop's `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` builds two new tensors per
# parameter, and no rule claims them: the `aten::sqrt` and `aten::div` lines above, temporaries of the
# update, alive for one parameter at a time. On a GPU, Adam takes the foreach path (`_multi_tensor_adam`),
# which runs each step of the update over the whole list of parameters in one call. `foreach=True` forces
# it here.

# %% tags=["predict"]
shapes = [tuple(p.shape) for p in model.parameters()]
foreach_guess = predict(f"Adam(foreach=True) on the same step ({len(shapes)} parameter tensors: {shapes}): its "
                        "'unknown' peak, in multiples of the for-loop's?", unit="x", example=1.0)

# %%
from torch import nn


def adam_step_profile(options: dict):
    """One profiled step (after a warm-up step) of the MLP above with torch.optim.Adam(**options)."""
    torch.manual_seed(0)
    net, gen = memory.mlp(WIDTH, DEPTH), torch.Generator().manual_seed(0)
    x, y = torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, 1, generator=gen)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, **options)

    def one_step():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    one_step()
    return memory.profile_steps(one_step, steps=1)


adam_tl = {name: memory.timeline(adam_step_profile(options))
           for name, options in (("for-loop", {}), ("foreach", {"foreach": True}))}
for name, t in adam_tl.items():
    print(f"{name:<9} 'unknown' peak {memory.mib(memory.peak_bytes(t, 'unknown')):>10}   "
          f"total peak {memory.mib(memory.peak_bytes(t)):>10}")

# %% tags=["reveal"]
unknown = {name: memory.peak_bytes(t, "unknown") for name, t in adam_tl.items()}
param_bytes = 4 * sum(p.numel() for p in model.parameters())
largest = 4 * max(p.numel() for p in model.parameters())
reveal(foreach_guess, unknown["foreach"] / unknown["for-loop"],
       why=f"the for-loop held {memory.mib(unknown['for-loop'])}, {unknown['for-loop'] / largest:.1f}x the largest "
           f"parameter: sqrt() and the quotient of one parameter at a time. foreach held "
           f"{memory.mib(unknown['foreach'])}, {unknown['foreach'] / param_bytes:.1f}x all the parameters "
           f"({memory.mib(param_bytes)}): torch._foreach_sqrt makes one new tensor per parameter, and the divisions "
           "that follow are in place (_multi_tensor_adam in torch/optim/adam.py). Adam's docstring says it: foreach "
           "'uses ~ sizeof(params) more peak memory than the for-loop version' (torch/optim/optimizer.py). The total "
           f"peak did not move ({memory.mib(memory.peak_bytes(adam_tl['for-loop']))} and "
           f"{memory.mib(memory.peak_bytes(adam_tl['foreach']))}): the update's temporaries are not alive at this "
           "step's peak. With a large model and a small batch the update can be the peak.");

# %% [markdown]
# ### Your turn: an Adam update that makes no temporaries
#
# Adam has a third implementation besides the for-loop and foreach (read its docstring:
# `help(torch.optim.Adam)`). Choose the keyword arguments so that the update creates no tensor of its own:
# the check profiles a step with `torch.optim.Adam(params, lr=1e-3, **ADAM_OPTIONS)` and counts the bytes of
# the unclaimed tensors that Adam's code made.

# %% tags=["your-turn"]
ADAM_OPTIONS = {"foreach": True}

# %%
from helpers.checks import check_equal, fail, your_turn


def check_adam_options():
    try:
        groups = memory.uncategorized(adam_step_profile(ADAM_OPTIONS), n=100)
    except (TypeError, ValueError, RuntimeError, AssertionError) as exc:      # what Adam raises for bad options
        fail("ADAM_OPTIONS", f"torch.optim.Adam(..., **{ADAM_OPTIONS}) raised {type(exc).__name__}: {exc}",
             "pass keyword arguments that torch.optim.Adam accepts, and not two implementations at once")
    made = [g for g in groups if "adam" in g["caller"]]
    check_equal(sum(g["bytes"] for g in made), 0, what=f"bytes of temporaries made by Adam with {ADAM_OPTIONS}",
                hint="they came from " + ", ".join(f"{g['op']} ({g['bytes']:,} bytes)" for g in made)
                     + ": which implementation does the whole update in one op?")


your_turn(check_adam_options, what="an update without temporaries");

# %% [markdown]
# `fused=True` hands each device's and dtype's parameters to one op, `torch._fused_adam_`, which updates
# the parameters and both moments in place (`_fused_adam` in `torch/optim/adam.py`): no intermediate is a
# tensor of its own. The docstring calls it "theoretically fastest", and keeps it opt-in because "the fused
# implementation is relatively new"; it takes float64, float32, float16 and bfloat16, on the devices that
# `_get_fused_kernels_supported_devices()` lists (`torch/utils/_foreach_utils.py`; the CPU is one).
#
# ## Selective activation checkpointing
#
# The core lesson checkpointed whole blocks: `torch.utils.checkpoint.checkpoint(block, x,
# use_reentrant=False)` stores only the block's input and recomputes its inside during backward (**full**
# checkpointing). **Selective** activation checkpointing (`create_selective_checkpoint_contexts(policy)`,
# passed as `context_fn=` to the same `checkpoint`) lets a policy decide operation by operation:
# `memory.save_matmuls` marks the matmul outputs `MUST_SAVE` (expensive to redo) and everything else
# `PREFER_RECOMPUTE` (the pointwise operations, cheap). The model is the core's stack of `memory.GatedMLP`
# blocks, built by `memory.gated_stack`. Measured: the activation peak and the total peak from the
# timeline of a step after a warm-up step (as in the core), and the step time with `helpers.bench.compare`,
# for no checkpointing, full and selective.

# %%
ckpt = memory.checkpoint_comparison(BATCH, WIDTH, DEPTH, steps=1, repeats=3,
                                    min_run_time=0.02 if QUICK else 0.1)
bench.save_json(ckpt, "runs/07_checkpointing.json")
act = ckpt["activation_peak_bytes"]
assert act["full"] < act["selective"] < act["none"], act
for name in act:
    ratio = ckpt["timing"]["results"][name]["ratio_to_baseline"]
    speed = ("" if name == "none" else f"{ratio:.2f}x none's speed" if bench.separated(ckpt["timing"], name, "none")
             else "time: the spreads overlap with none's, too close to call here; run again")
    print(f"{name:<10} activation peak {memory.mib(act[name]):>10}   total peak "
          f"{memory.mib(ckpt['peak_bytes'][name]):>10}   {speed}")

# %%
fig = go.Figure([go.Bar(name="activation peak (MiB)", x=list(act), y=[v / 2**20 for v in act.values()]),
                 go.Bar(name="time per step (ms)", x=list(act),
                        y=[ckpt["timing"]["results"][n]["median_s"] * 1e3 for n in act])])
fig.update_layout(barmode="group", title="Activation checkpointing: memory saved, time paid", height=360)
fig.show()

# %% [markdown]
# **What the numbers mean.** Full checkpointing cuts the stored activations to the block inputs, at the
# price of a second forward pass through every block during backward. Selective checkpointing sits between
# the two: it keeps the matmul outputs, so backward recomputes only the cheap pointwise operations, and it
# saves less memory than full. The total peak falls by less than the activation peak: the parameters,
# gradients and Adam state do not move, and at a small batch they are most of it. On a busy CPU the times
# are noisy: a ratio is printed only where the spreads do not overlap, and one above 1 (faster than no
# checkpointing) is other load, not a saving; the recompute is real work on every device. (The core lesson
# showed what the memory buys: a batch twice as large under the peak of the step without checkpointing.)
#
# Under `torch.compile` the choice is the partitioner's. `torch._functorch.config.activation_memory_budget`
# (default 1.0) asks it for the fastest plan that saves no more than that fraction of the activations its
# default plan would save, 0.0 being the whole compiled region checkpointed; it solves a knapsack over
# the operations to recompute (the comment above the setting in 2.10's `torch/_functorch/config.py`). It
# bounds what forward saves; whether the peak falls as much depends on when backward rebuilds the rest,
# as the core's exercise showed for whole blocks.
#
# ## Try it: batch size vs activation memory

# %%
import ipywidgets as widgets

from helpers.interactive import interact


def activation_peak(batch=128, checkpointed=False):
    s = memory.training_step(memory.mlp(128, DEPTH, checkpointed=checkpointed), batch, 128)
    t = memory.timeline(memory.profile_steps(s, steps=1))
    print(f"batch {batch}, checkpointed={checkpointed}: activation peak "
          f"{memory.mib(memory.peak_bytes(t, 'activation'))}, total peak {memory.mib(memory.peak_bytes(t))}")


interact(activation_peak, batch=widgets.IntSlider(value=128, min=32, max=2048, step=32));

# %% [markdown]
# ## On an NVIDIA or AMD GPU: the same step, by category
#
# The exporter works for a CUDA device too: profile with `ProfilerActivity.CUDA` added, and export for
# `"cuda:0"` instead of `"cpu"`. The cell runs the MLP step above on the GPU, prints each category next to
# the CPU's, and then the allocator's own view: `max_memory_allocated` (its peak of memory handed to
# tensors), `memory_reserved` (what it holds from the driver: allocated plus its cache) and
# `memory_summary`. No GPU has run this cell in this project's CI: run it and see.

# %%
if requires("torch_cuda", section="The training step on the GPU, by category"):
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    gpu_model = memory.mlp(WIDTH, DEPTH).to(DEVICE)
    gpu_step = memory.training_step(gpu_model, BATCH, WIDTH, device=DEVICE)
    gpu_step()                                    # Adam's state exists from here on
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
                 record_shapes=True, with_stack=True) as gpu_prof:
        gpu_step()
        torch.cuda.synchronize()
    gpu_tl = memory.timeline(gpu_prof, device=f"cuda:{torch.cuda.current_device()}")
    for name in gpu_tl["bytes"]:
        print(f"peak {name:<16} cpu {memory.mib(memory.peak_bytes(tl, name)):>12}   "
              f"gpu {memory.mib(memory.peak_bytes(gpu_tl, name)):>12}")
    print("timeline peak", memory.mib(memory.peak_bytes(gpu_tl)), "· max_memory_allocated",
          memory.mib(torch.cuda.max_memory_allocated()), "· memory_reserved", memory.mib(torch.cuda.memory_reserved()))
    print(torch.cuda.memory_summary(abbreviated=True))

# %% [markdown]
# ## On an NVIDIA or AMD GPU: allocator history snapshots
#
# `torch.cuda.memory._record_memory_history()` makes the CUDA caching allocator record every alloc/free
# with a stack trace; `torch.cuda.memory._snapshot()` returns the segments, blocks and trace;
# `_dump_snapshot("x.pickle")` writes a file you can drop into https://pytorch.org/memory_viz (the cell
# writes `runs/07_memory_snapshot.pickle` and prints the lines of code behind the largest allocations,
# which is what the viewer shows on hover). ROCm builds of torch use the same API. These functions are
# private (underscore) but documented in "Understanding CUDA Memory Usage".

# %%
if requires("torch_cuda", section="CUDA allocator history"):
    gpu_model = memory.mlp(WIDTH, DEPTH).to(DEVICE)
    x_gpu = torch.randn(BATCH, WIDTH, device=DEVICE)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()      # the peak below is this step's, not the process's
    snap = memory.record_history(lambda: gpu_model(x_gpu).sum().backward())
    summary = memory.snapshot_summary(snap)
    print("segments:", summary["segments"], "reserved:", memory.mib(summary["reserved_bytes"]),
          "allocated:", memory.mib(summary["allocated_bytes"]))
    print("recorded allocator events:", summary["events"])
    print("max allocated during the step:", memory.mib(torch.cuda.max_memory_allocated()))
    for a in memory.largest_allocations(snap):
        print(f"  {memory.mib(a['bytes']):>10} allocated at {a['where']}")
    path = memory.dump_snapshot(snap, "runs/07_memory_snapshot.pickle")
    print(f"snapshot written to {path}: drag it onto https://pytorch.org/memory_viz")

# %% [markdown]
# ## On an NVIDIA or AMD GPU: memory pools, nested
#
# `torch.cuda.MemPool` (since about 2.5) is a separate pool in the caching allocator;
# `with torch.cuda.use_mem_pool(pool):` routes this thread's allocations into it (for example memory from
# a custom allocator, kept apart from the rest). Only this thread's: the docstring of `use_mem_pool` warns
# that a thread started inside the block, such as the one that runs backward, does not allocate from the
# pool. A pool made with `MemPool(use_on_oom=True)` is also a last resort: an allocation outside it that
# would fail for lack of memory may take memory from it (the `MemPool` docstring, `torch/cuda/memory.py`).
#
# 2.10 fixed **nesting** (PR #168382): before it, inside an inner `use_mem_pool` the allocations still went
# to the *outer* pool, because the allocator searched the active pools front to back and the first one
# entered won, so the inner pool got nothing (issue #161193); #168382 reverses the search order. Leaving the
# inner block returned allocations to the outer pool before and after the fix. The cell allocates in both
# and checks each pool's share. The 2.10 article's "5-15% overhead, 40-60% faster allocation" for nested
# pools is not from PyTorch and is not measured anywhere we could find.

# %%
if requires("torch_cuda", section="Nested memory pools"):
    held = memory.nested_pools(1 << 20)
    print("bytes held per pool:", held)
    assert held["inner"] >= 2 << 20, f"the inner pool got nothing: the nesting bug fixed in 2.10 (#161193): {held}"
    assert held["outer"] >= 2 << 20, f"the outer pool holds what was allocated before and after the inner block: {held}"

# %% [markdown]
# ## On an NVIDIA or AMD GPU: reserved vs allocated, fragmentation, expandable segments
#
# The caching allocator asks the driver for *segments* and cuts them into blocks. A freed block goes back to
# the allocator, not to the driver: `torch.cuda.memory_allocated()` is what tensors hold,
# `torch.cuda.memory_reserved()` what the allocator holds.
#
# When each step asks for blocks a little larger than the ones the last step freed (a growing batch, a
# growing KV cache), the freed blocks cannot serve the new requests. The allocator opens new segments, and
# reserved grows past allocated: that gap is **fragmentation**, memory no tensor uses but that no one else
# gets either, and the usual cause of an out-of-memory error while `memory_allocated()` says there is room.
#
# The allocator takes its settings from `PYTORCH_ALLOC_CONF` (the older name `PYTORCH_CUDA_ALLOC_CONF` is
# also read; both names are in 2.10's `libc10`), as `key:value` pairs. Three of them, in the words of
# [PyTorch's CUDA notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF"](https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf):
#
# - `max_split_size_mb:N` "prevents the native allocator from splitting blocks larger than this size";
# - `garbage_collection_threshold:F`: "the allocator will start reclaiming GPU memory blocks if the GPU
#   memory capacity usage exceeds the threshold", F of "the total memory allocated to the GPU application";
# - `expandable_segments:True` makes a segment a virtual address range that can grow by mapping more pages.
#
# The workload below (`memory.fragmentation_workload`, the pattern of the allocator notes, notes/cuda.rst)
# asks, at each of 8 steps, for 8 blocks a little larger than the last step's, and frees them after the step.

# %% tags=["predict"]
SETTINGS = ["expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.8", "none of these"]
alloc_guess = predict("On a GPU with memory to spare, which one setting keeps this workload's peak reserved memory "
                      "close to its peak allocated?", options=SETTINGS, example="max_split_size_mb:64")

# %% [markdown]
# With `expandable_segments:True` a larger request extends the segment instead of opening a new one. It is
# not only a textbook case: a vLLM pull request reports more fragmentation at start-up and CUDA-graph
# capture after moving from torch 2.9 to 2.10, fixed with this setting (vllm-project/vllm#41158).
#
# **When it is read, and how to change it.** The environment variable is read when the allocator starts,
# at the first CUDA allocation. The setting can also be changed while the program runs:
# `torch._C._accelerator_setAllocatorSettings("expandable_segments:True")` in 2.10, where the older
# `torch.cuda.memory._set_allocator_settings` (the name torch's own error messages still give) now warns
# that it is deprecated and calls it (`torch/cuda/memory.py`). A change applies to segments created after
# it; the segments already in the cache stay as they were. So the cell runs the same workload
# (`memory.fragmentation_workload`) in fresh processes (`memory.run_fresh`), each starting with an empty
# cache: one with no setting, one with each of the three.
# `expandable` is read from each process's snapshot, so it says what the allocator did. False means the
# allocator did not turn it on: a build or platform without support, or torch 2.9.1, which ignores the
# setting under the name `PYTORCH_ALLOC_CONF` and honours only `PYTORCH_CUDA_ALLOC_CONF`
# (pytorch/pytorch#183387): try the older name before concluding.
#
# **Its limit: tensors shared between processes.** A CUDA tensor sent to another process
# (`torch.multiprocessing`, a queue between workers) from an expandable segment is shared through a file
# descriptor that the receiving process fetches with the `pidfd_getfd` system call (PR #130890, IPC for
# expandable segments). Where the kernel lacks that call or a container forbids it, sharing fails
# (pytorch/pytorch#165685), and torch's error message suggests `expandable_segments:False` for those
# allocations.

# %%
frag = {}                       # setting -> what the allocator did, in a fresh process (on a GPU)
if requires("torch_cuda", section="Fragmentation and expandable segments"):
    frag["default"] = memory.run_fresh("fragmentation_workload")
    for setting in SETTINGS[:3]:
        frag[setting] = memory.run_fresh("fragmentation_workload", env={"PYTORCH_ALLOC_CONF": setting})
    for label, r in frag.items():
        print(f"{label:<34} peak allocated {memory.mib(r['peak_allocated_bytes']):>10}   peak reserved "
              f"{memory.mib(r['peak_reserved_bytes']):>10} "
              f"({r['peak_reserved_bytes'] / r['peak_allocated_bytes']:.2f}x allocated)   "
              f"segments {r['segments']}, expandable: {r['expandable']}")

# %% tags=["reveal"]
docs = ("The notes' own example is this pattern: a batch one row larger each time needs blocks slightly larger "
        "than the cached ones, so each step opens new segments and the freed ones stay cached; an expandable "
        "segment grows by mapping pages at its end instead, and the larger blocks tile into it. "
        "max_split_size_mb stops the splitting of large cached blocks, a last resort the notes give for 'a large "
        "amount of inactive split blocks': here every cached block is smaller than the next request, and there is "
        "nothing to split. "
        "garbage_collection_threshold acts only when a process has a memory fraction set "
        "(torch.cuda.set_per_process_memory_fraction: malloc in c10/cuda/CUDACachingAllocator.cpp checks "
        "set_fraction before it collects), and even then only past F of it.")
if frag:
    ratio = {label: r["peak_reserved_bytes"] / r["peak_allocated_bytes"] for label, r in frag.items()}
    best = min(SETTINGS[:3], key=ratio.get)
    measured = best if ratio[best] < 0.8 * ratio["default"] else "none of these"
    reveal(alloc_guess, measured, why="peak reserved / peak allocated here: " + ", ".join(
        f"{label} {x:.2f}x" for label, x in ratio.items()) + ". " + docs)
else:
    reveal(alloc_guess, "expandable_segments:True",
           why="no GPU here, so this is the documented answer, not a measurement (a GPU runs the cell above). " + docs)

# %% [markdown]
# ## On an NVIDIA or AMD GPU: a snapshot when memory runs out
#
# `torch._C._cuda_attach_out_of_memory_observer(fn)` (private; present in 2.10's CUDA build) registers a
# function that the caching allocator calls just before it raises `OutOfMemoryError`, with the device, the
# bytes requested, the bytes allowed and the bytes free (`c10/cuda/CUDACachingAllocator.cpp`). With the
# allocator history on, the observer can `_dump_snapshot` the state at the failure: the file to open in
# memory_viz after a crash. `memory.oom_snapshot` caps the process with
# `torch.cuda.set_per_process_memory_fraction`, attaches the observer and allocates until the cap is hit. It
# runs in a fresh process, because an observer cannot be detached and the cap is process-wide.

# %%
if requires("torch_cuda", section="Out-of-memory observer"):
    import os
    os.makedirs("runs", exist_ok=True)
    # run_fresh runs in the repository root: give it an absolute path
    oom = memory.run_fresh("oom_snapshot", path=os.path.abspath("runs/07_oom_snapshot.pickle"))
    print("OutOfMemoryError:", (oom["error"] or "none raised").splitlines()[0][:200])
    assert oom["observer_calls"], f"the observer was not called before the error: {oom}"
    call = oom["observer_calls"][0]
    print(f"the observer saw: requested {memory.mib(call['requested_bytes'])}, allowed "
          f"{memory.mib(call['allowed_bytes'])}, free on the device {memory.mib(call['device_free_bytes'])}")
    for a in oom["largest_allocations"]:
        print(f"  {memory.mib(a['bytes']):>10} allocated at {a['where']}")
    print(f"snapshot at the failure: {oom['snapshot_path']}: drag it onto https://pytorch.org/memory_viz")

# %% [markdown]
# ## What changes on other hardware
#
# - **NVIDIA GPU**: the exporter works for `cuda:0` (above) but is deprecated; the maintained tools are
#   `_record_memory_history` + `_snapshot` / memory_viz, and `torch.cuda.max_memory_allocated()`,
#   `memory_reserved()` and `memory_summary()` for the allocator's view.
# - **AMD GPU**: the same `torch.cuda.memory` API works on ROCm builds (HIP's caching allocator).
# - **Intel GPU**: `torch.xpu.memory_allocated()` / `max_memory_allocated()`; 2.10 added
#   `torch.xpu.set_per_process_memory_fraction` (PR #165510).
#
# ## Pitfalls

# %%
# 1. The timeline needs all three profiler options; with one missing it refuses.
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as bare:
    torch.ones(10) + 1
try:
    memory.timeline(bare)
except ValueError as exc:
    print("1.", type(exc).__name__ + ":", exc)

# %%
# 2. MemPool and the allocator history are CUDA-only: on a CPU build they fail like this.
if not torch.cuda.is_available():
    for label, call in (("torch.cuda.MemPool()", torch.cuda.MemPool),
                        ("_record_memory_history", lambda: torch.cuda.memory._record_memory_history(max_entries=10))):
        try:
            call()
        except (AttributeError, RuntimeError) as exc:
            print(f"2. {label} -> {type(exc).__name__}: {exc}")

# %% [markdown]
# 3. Reading back a `with_stack=True` profile can fail with `UnicodeDecodeError: 'utf-8' codec can't
#    decode byte ...` inside `torch/autograd/profiler.py`: an open profiler bug, reported with
#    `with_stack=True` as the trigger (pytorch/pytorch#136040, and #64345 before it). Its cause has not
#    been pinned down upstream, so read the events right after profiling and profile again if it happens:
#    `helpers.memory.profile_steps` does that.
# 4. `use_mem_pool` routes only the current thread's allocations: a thread started inside the block, for
#    example by calling `backward()`, allocates outside the pool (the `use_mem_pool` docstring,
#    `torch/cuda/memory.py`).
