# %% [markdown]
# # 07 · Memory: the profiler's memory timeline, top allocations, CUDA snapshots and memory pools
#
# | | |
# |---|---|
# | **What you will learn** | profile a training step with `torch.profiler(profile_memory=True)`; export the memory timeline and plot it by category (parameters, activations, gradients, optimizer state); read the top-allocations table; trade memory for time with activation checkpointing; on a GPU, record allocator history snapshots, route allocations into nested `torch.cuda.MemPool`s, see fragmentation and what `expandable_segments` does about it, and dump a snapshot at an out-of-memory error |
# | **Prerequisites** | lesson 00; a training loop (forward, backward, optimizer step) |
# | **Hardware** | any CPU. The allocator-history, memory-pool, fragmentation and out-of-memory sections need an NVIDIA or AMD GPU |
# | **Time** | 30 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build), 2.14.1+cu130 (env latest: CUDA 13.0 build, no GPU) (make matrix, 2026-12-02); 2.10 facts from its release notes (nested `use_mem_pool`, PR #168382) |

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
BATCH, WIDTH, DEPTH = 1024, 512, 4

# %%
import plotly.graph_objects as go
import torch

from helpers import bench, memory
from helpers.device import pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    BATCH, WIDTH = 128, 128
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · quick={QUICK}")

# %% [markdown]
# ## The idea: memory has categories
#
# A training step holds several kinds of memory at once: the **parameters**, the **inputs**, the
# **activations** autograd saves for backward, the **gradients**, the **optimizer state** (Adam keeps two
# tensors per parameter), and short-lived **temporaries**. The profiler with `profile_memory=True`
# records every allocation and free; `export_memory_timeline` (torch/profiler/_memory_profiler.py) then
# assigns each tensor a category by following how autograd and the optimizer use it. It needs
# `profile_memory=True, record_shapes=True, with_stack=True`; `helpers.memory.profile_steps` turns all
# three on.

# %%
model = memory.mlp(WIDTH, DEPTH)
step = memory.training_step(model, BATCH, WIDTH)
prof = memory.profile_steps(step, steps=1)
top = memory.top_allocations(prof, 8)   # read key_averages() before exporting the timeline (pitfall 3)
tl = memory.timeline(prof)
n_params = sum(p.numel() for p in model.parameters())

# %% [markdown]
# (The profiler prints its own start/stop lines above.) The exporter raised these warnings, returned by
# `memory.timeline` rather than hidden:

# %% tags=["nbval-check-output"]
for w in tl["warnings"]:
    print(w)
print("torch.cuda.memory has _export_memory_snapshot:", hasattr(torch.cuda.memory, "_export_memory_snapshot"))
print("torch.cuda.memory has _dump_snapshot:         ", hasattr(torch.cuda.memory, "_dump_snapshot"))

# %% [markdown]
# `export_memory_timeline` is deprecated on this torch (FutureWarning) and will be removed. Its message
# recommends `torch.cuda.memory._export_memory_snapshot`, a function that does not exist; the
# allocator's snapshot functions are `torch.cuda.memory._snapshot()` and `_dump_snapshot(path)` (the GPU cell
# below writes the same pickle with `helpers.memory.dump_snapshot`, from the snapshot it has already taken). Both are CUDA-only, so on a CPU the deprecated exporter is still the way to get
# categorised memory. Its `.html` output embeds a matplotlib PNG and prints
# "export_memory_timeline_html failed because matplotlib was not found" when matplotlib is absent; we
# export `.json` and plot with plotly instead.
#
# ## Check: the categories add up to what we know

# %% tags=["nbval-check-output"]
param_bytes = 4 * n_params
print(f"parameters: {n_params} floats = {memory.mib(param_bytes)}")
assert memory.peak_bytes(tl, "parameter") == param_bytes, memory.peak_bytes(tl, "parameter")
print("timeline 'parameter' peak equals 4 bytes x parameter count: True")
n_tensors = len(list(model.parameters()))
assert memory.peak_bytes(tl, "optimizer_state") == 2 * param_bytes + 4 * n_tensors
print("'optimizer_state' peak is 2 x parameters (Adam's exp_avg and exp_avg_sq) "
      f"+ one 4-byte 'step' scalar per parameter tensor ({n_tensors}): True")
assert memory.peak_bytes(tl, "gradient") == param_bytes
print("'gradient' peak equals the parameters (one grad per parameter): True")
assert memory.peak_bytes(tl, "input") >= 4 * BATCH * (WIDTH + 1)
print("'input' holds at least the batch and its targets: True")

# %% [markdown]
# ## Plot: the timeline

# %%
memory.timeline_figure(tl, title=f"One Adam step of a {DEPTH}-layer MLP, batch {BATCH}, width {WIDTH}").show()
print("peak total:", memory.mib(memory.peak_bytes(tl)))
for name, values in tl["bytes"].items():
    print(f"  peak {name:<16} {memory.mib(max(values))}")

# %% [markdown]
# Read it left to right: parameters are there from the start; activations pile up during forward and
# are freed during backward as gradients appear; the optimizer state appears at the first `opt.step()`
# and stays (a second step would show the same shape again, with the optimizer state already
# there). ("unknown" is memory the profiler could not attribute, e.g. allocations inside the
# optimizer's foreach kernels.)
#
# ## The top allocations table
#
# `prof.key_averages()` has per-op "self CPU memory": bytes an op allocated itself (net of what it
# freed). Sorting by it shows who allocates.

# %%
for row in top:
    print(f"{row['op']:<34} {memory.mib(row['self_bytes']):>12}  in {row['calls']} calls")

# %% [markdown]
# ## Trade memory for time: activation checkpointing, full and selective
#
# `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` stores only the block's input and
# recomputes its inside during backward (**full** checkpointing). **Selective** activation checkpointing
# (`create_selective_checkpoint_contexts(policy)`, passed as `context_fn=` to the same `checkpoint`)
# lets a policy decide op by op: `memory.save_matmuls` marks the matmul outputs `MUST_SAVE` (expensive
# to redo) and everything else `PREFER_RECOMPUTE` (the pointwise ops, cheap). The model is a stack of
# transformer feed-forward blocks (`memory.GatedMLP`: up, gate and down projections with a GELU and a
# product between them). Measured: the activation peak from the timeline, and the step time with
# `helpers.bench.compare`, for no checkpointing, full and selective.
#

# %%
ckpt = memory.checkpoint_comparison(BATCH, WIDTH, DEPTH, steps=1, repeats=3,
                                    min_run_time=0.02 if QUICK else 0.1)
bench.save_json(ckpt, "runs/07_checkpointing.json")
act = ckpt["activation_peak_bytes"]
assert act["full"] < act["selective"] < act["none"], act
for name in act:
    print(f"{name:<10} activation peak {memory.mib(act[name]):>10}   total peak "
          f"{memory.mib(ckpt['peak_bytes'][name]):>10}   speed vs none "
          f"{ckpt['timing']['results'][name]['ratio_to_baseline']:.2f}x")

# %%
fig = go.Figure([go.Bar(name="activation peak (MiB)", x=list(act), y=[v / 2**20 for v in act.values()]),
                 go.Bar(name="time per step (ms)", x=list(act),
                        y=[ckpt["timing"]["results"][n]["median_s"] * 1e3 for n in act])])
fig.update_layout(barmode="group", title="Activation checkpointing: memory saved, time paid", height=360)
fig.show()

# %% [markdown]
# **What the numbers mean.** Full checkpointing cuts the stored activations to the block inputs, at
# the price of a second forward pass through every block during backward. Selective checkpointing sits
# between the two: it keeps the matmul outputs, so backward recomputes only the cheap pointwise ops, and
# saves less memory than full. With a model this small the saving is modest and the recompute plus
# wrapper overhead shows in the speed column; checkpointing pays off for deep models with big
# activations (long sequences, attention) where memory, not time, is the limit.
#
# ## Try it: batch size vs activation memory
#

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
# ## On an NVIDIA or AMD GPU: allocator history snapshots
#
# `torch.cuda.memory._record_memory_history()` makes the CUDA caching allocator record every
# alloc/free with a stack trace; `torch.cuda.memory._snapshot()` returns the segments, blocks and
# trace; `_dump_snapshot("x.pickle")` writes a file you can drop into https://pytorch.org/memory_viz
# (the cell writes `runs/07_memory_snapshot.pickle` and prints the lines of code behind the largest
# allocations, which is what the viewer shows on hover). ROCm builds of torch use the same API.
# These functions are private (underscore) but documented in "Understanding CUDA Memory Usage".

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
# `with torch.cuda.use_mem_pool(pool):` routes this thread's allocations into it (for example memory
# from a custom allocator, kept apart from the rest). 2.10 fixed **nesting** (PR #168382): before it,
# inside an inner `use_mem_pool` the allocations still went to the *outer* pool, because the allocator
# searched the active pools front to back and the first one entered won, so the inner pool got nothing
# (issue #161193); #168382 reverses the search order. Leaving the inner block returned allocations to the
# outer pool before and after the fix. The cell allocates in both and checks each pool's share. The 2.10
# article's "5-15% overhead, 40-60% faster allocation" for nested pools is not from PyTorch and is not
# measured anywhere we could find.

# %%
if requires("torch_cuda", section="Nested memory pools"):
    held = memory.nested_pools(1 << 20)
    print("bytes held per pool:", held)
    assert held["inner"] >= 2 << 20, f"the inner pool got nothing: the nesting bug fixed in 2.10 (#161193): {held}"
    assert held["outer"] >= 2 << 20, f"the outer pool holds what was allocated before and after the inner block: {held}"

# %% [markdown]
# ## On an NVIDIA or AMD GPU: reserved vs allocated, fragmentation, expandable segments
#
# The caching allocator asks the driver for *segments* and cuts them into blocks. A freed block goes back
# to the allocator, not to the driver: `torch.cuda.memory_allocated()` is what tensors hold,
# `torch.cuda.memory_reserved()` what the allocator holds (the allocator-history cell above prints both).
#
# When each step asks for blocks a little larger than the ones the last step freed (a growing batch, a
# growing KV cache), the freed blocks cannot serve the new requests. The allocator opens new segments, and
# reserved grows past allocated: that gap is **fragmentation**, memory no tensor uses but that no one else
# gets either, and the usual cause of an out-of-memory error while `memory_allocated()` says there is room.
#
# `PYTORCH_ALLOC_CONF=expandable_segments:True` (the older name `PYTORCH_CUDA_ALLOC_CONF` is also read;
# both names are in 2.10's `libc10`) makes a segment a virtual address range that grows by mapping more
# pages. A larger request then extends the segment instead of opening a new one
# ([PyTorch's CUDA notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF"](https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)).
#
# The setting is read once, at the first CUDA allocation, so the cell runs the same workload
# (`memory.fragmentation_workload`: tensors a little larger each step, freed after it) in two fresh
# processes (`memory.run_fresh`). `expandable` is read from each process's snapshot, so it says what the
# allocator did: False where the build does not support the setting.

# %%
if requires("torch_cuda", section="Fragmentation and expandable segments"):
    frag = {"default": memory.run_fresh("fragmentation_workload"),
            "expandable_segments:True": memory.run_fresh(
                "fragmentation_workload", env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"})}
    for label, r in frag.items():
        print(f"{label:<26} peak allocated {memory.mib(r['peak_allocated_bytes']):>10}   peak reserved "
              f"{memory.mib(r['peak_reserved_bytes']):>10} "
              f"({r['peak_reserved_bytes'] / r['peak_allocated_bytes']:.2f}x allocated)   "
              f"segments {r['segments']}, expandable: {r['expandable']}")

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
# - **NVIDIA GPU**: use `_record_memory_history` + `_snapshot` / memory_viz instead of the deprecated
#   exporter; `torch.cuda.max_memory_allocated()` and `memory_summary()` give the allocator's view.
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
# 3. Reading a profile can fail on this torch. In our runs, reading the events raised
#    `UnicodeDecodeError` inside `torch/autograd/profiler.py` (the event names read back were garbage):
#    when `prof.key_averages()` came *after* `export_memory_timeline`, and on the first `with_stack`
#    profile after a `TorchDispatchMode` (such as lesson 08's DebugMode) had run in the process.
#    `helpers.memory.profile_steps` reads the events right after profiling and profiles once more if
#    that happens; read the tables first and export the timeline last, as the cells above do.
