# %% [markdown]
# # 02 · Deep dive: horizontal fusion and combo kernels
#
# | | |
# |---|---|
# | **What you will learn** | reading Inductor's generated code (`fusion.inspect_compiled`) and the C++ backend's fusion limits; why a compiled first optimizer step compiles twice, and a learning-rate schedule every step; what a compiled call dispatches, counted with `torch.profiler`; the overhead model (fixed cost per call and cost per op, eager vs compiled, extrapolated and checked); other tools against overhead: `cpp_wrapper`, CUDA graphs (`mode="reduce-overhead"`); Inductor's combo kernels off vs on (the same C++ on a CPU; on a GPU, dispatch lines checked and four SGD steps timed); a combo kernel written by hand in Triton, both dispatch schemes, checked under Triton's interpreter and timed on a GPU with device time; the pitfalls |
# | **Prerequisites** | [lesson 02](02_horizontal_fusion.ipynb); reading a little C++ or Triton helps |
# | **Hardware** | any CPU with a C++ compiler; the hand-written kernels run under Triton's interpreter when Triton is installed. On a GPU with Triton: Inductor's combo kernels off vs on, and the hand-written kernels' speed; on NVIDIA/AMD: CUDA graphs on the optimizer step |
# | **Time** | 75 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the config names and the dispatch rule were read in the 2.10.0 and 2.13.0 wheels (`torch/_inductor/config.py`, `torch/_inductor/codegen/triton_combo_kernel.py`), and cells print them from the torch you run; combo kernels came in 2.5: foreach cases in pytorch#124969, the automatic horizontal fusion that `combo_kernels=True` turns on in #131675 (relanded as #133291) |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/02_horizontal_fusion_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
N_TENSORS = 30         # tensors in the optimizer-style update
BASE_SIZE = 1024       # elements of the first tensor; tensor i has BASE_SIZE + 37*i
SWEEP_COUNTS = [1, 4, 16, 64]   # numbers of tiny ops in the launch-overhead sweep
THREADS = 1            # CPU threads for everything compiled and timed here (see "Pitfalls" for why)

# %%
import contextlib
import io
import os

import plotly.graph_objects as go
import torch

from helpers import bench, fusion
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.set_num_threads(THREADS)   # before any compile: the thread count is part of what Dynamo guards
if DEVICE.type == "cpu":   # Triton's interpreter for the hand-written kernel, before anything imports Triton
    os.environ["TRITON_INTERPRET"] = "1"
if QUICK:
    N_TENSORS, BASE_SIZE, SWEEP_COUNTS = 6, 256, [1, 16]
REPEATS, MIN_RUN_S = (3, 0.05) if QUICK else (7, 0.2)   # timing repeats, seconds per repeat
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · quick mode: {QUICK} · CPU threads: {THREADS}")


def fresh_state():
    return fusion.make_sgd_state(N_TENSORS, BASE_SIZE, device=DEVICE, seed=1)


# %% [markdown]
# ## From your function to generated code
#
# ```
#  your Python function
#        │  Dynamo: captures the tensor operations as an FX graph (plus guards that decide reuse)
#        ▼
#  FX graph ── AOTAutograd: functional ATen ops (in-place updates become explicit copies)
#        │
#        ▼  Inductor lowering: each op becomes a loop body; pointwise chains are inlined into one
#  scheduler ── vertical fusion:   a → b → c      (b reads what a wrote)  → one loop
#        │      horizontal fusion: a   b   c      (independent)           → one kernel or one function
#        │      combo kernels (GPU, opt-in): independent Triton kernels   → one launch
#        ▼
#  generated code: C++/OpenMP functions `cpp_fused_*` (CPU) or Triton kernels `triton_*` (GPU),
#                  called from one Python wrapper `call(args)`
# ```
#
# The lesson read this with `TORCH_LOGS` and `TORCH_COMPILE_DEBUG`. In code, `fusion.inspect_compiled(fn,
# *args)` compiles a function, runs it once and returns what Inductor generated (via
# `torch._inductor.utils.run_and_get_code`), the kernel functions the wrapper calls, and
# `torch._inductor.metrics.generated_kernel_count` (`loop_kernels`).

# %%
def two_independent(a, b):
    return a.sin(), b.cos()


x = torch.randn(4096, device=DEVICE)
a, b = torch.randn(4096, device=DEVICE), torch.randn(4096, device=DEVICE)
chain = fusion.inspect_compiled(fusion.chain_ops, x, 4)
indep = fusion.inspect_compiled(two_independent, a, b)
for name, info in (("chain of 4", chain), ("2 independent", indep)):
    print(f"{name:>14}: kernel functions {info.kernel_functions} · loop kernels {info.loop_kernels} "
          f"· first call (compile included) {info.compile_s:.1f} s")
print("\nwhat the wrapper calls for the independent pair:")
print("\n".join(fusion.wrapper_calls(indep.code)))

# %% [markdown]
# The first compile in a fresh environment is by far the slowest (compare the "first call" times above
# with a second run of this notebook). Inductor keeps what it builds in an on-disk cache
# (`TORCHINDUCTOR_CACHE_DIR`), so later compiles, and later runs of this notebook, are faster.
#
# ### Check: the fusion we expect on the C++ backend
#
# On the CPU, Inductor's C++ backend puts consecutive loop nests into **one** `cpp_fused_*` function (one
# call, one OpenMP parallel region); it starts a new function only at a library call (a matmul, say) or
# past `CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM` kernel arguments. Independent nodes that read the *same*
# buffer can even share one loop (`a.sin(), a.cos()` becomes one loop; at most
# `torch._inductor.config.cpp.max_horizontal_fusion_size` nodes per loop; both limits are printed below);
# nodes with nothing in common stay two loops inside one function. `loop_kernels` counts the loop nests.

# %% tags=["nbval-check-output"]
torch.testing.assert_close(chain.result, fusion.chain_ops(x, 4))
for got, want in zip(indep.result, two_independent(a, b)):
    torch.testing.assert_close(got, want)
if DEVICE.type == "cpu":
    assert len(chain.kernel_functions) == 1 and len(indep.kernel_functions) == 1
    assert chain.loop_kernels == 1, "a chain of elementwise ops is one loop (vertical fusion)"
print("compiled == eager for the chain and the independent pair")

# %% [markdown]
# The chain's kernel, as generated (on CPU a C++ function; on a GPU a Triton kernel), and the options
# and limits as your torch has them (names change between releases: `combo_kernel_max_num_nodes` exists
# in 2.13 but not in 2.10, where the limit of 8 kernels is hard-coded):

# %%
from torch._inductor.codegen.cpp import CppScheduling

print(fusion.kernel_source(chain.code, chain.kernel_functions[0], max_lines=40))
COMBO_OPTIONS = ("combo_kernels", "benchmark_combo_kernel", "combo_kernels_autotune", "combo_kernel_allow_mixed_sizes",
                 "combo_kernel_max_num_args", "combo_kernel_max_num_nodes", "combo_kernel_per_subkernel_blocks",
                 "combo_kernel_foreach_dynamic_shapes", "cpp.max_horizontal_fusion_size", "cpp.min_chunk_size")
print()
for name, value in fusion.inductor_options(*COMBO_OPTIONS).items():
    print(f"torch._inductor.config.{name:<36} {'(not in this torch)' if value is None else value}")
print(f"CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM{'':<14} {CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM}")

# %% [markdown]
# ## A compiled first optimizer step compiles twice
#
# PyTorch's recipe (https://docs.pytorch.org/tutorials/recipes/compiling_optimizer.html) compiles a function
# that calls `opt.step()` and warms it up with five calls before timing. It says nothing about the first
# step; what happens there, measured with Dynamo's counters and `TORCH_LOGS="recompiles"`:

# %%
from torch._dynamo.utils import counters

params, grads, _ = fresh_state()
opt, _ = fusion.sgd_optimizer(params, grads, foreach=True)
compiled_step = torch.compile(opt.step)
new_graphs, log = [], io.StringIO()
with contextlib.redirect_stderr(log):
    torch._logging.set_logs(recompiles=True)             # = TORCH_LOGS="recompiles"
    for _ in range(3):
        before = counters["stats"]["unique_graphs"]
        compiled_step()
        new_graphs.append(counters["stats"]["unique_graphs"] - before)
torch._logging.set_logs()
print("graphs compiled by calls 1, 2, 3:", new_graphs)
print("\n".join(fusion.torch_log_lines(log.getvalue(), "recompiles")))

# %% [markdown]
# The first call traces a step with no momentum buffers (SGD creates them then); the second finds them and
# fails a guard on the optimizer's state, so Dynamo compiles again. The recipe's warm-up absorbs it; the
# lesson took one eager step first instead, so its timed step was compiled once.
#
# SGD reads and writes `self.state` only when `momentum != 0` (`_init_group` and the end of `step` in
# `torch/optim/sgd.py`, since pytorch#122349): plain SGD keeps no state at all.

# %% tags=["predict"]
compiles_guess = predict("The same compiled step, but SGD with momentum=0: how many graphs do its first three "
                         "calls compile in all?", options=["1", "2", "3"], example="2")

# %% tags=["reveal"]
torch._dynamo.reset()   # Dynamo keeps a function's graphs per code object, at most recompile_limit (8): start afresh
params, grads, _ = fresh_state()
plain_opt, _ = fusion.sgd_optimizer(params, grads, foreach=True, momentum=0.0)
plain_step = torch.compile(plain_opt.step)
plain_graphs = []
for _ in range(3):
    before = counters["stats"]["unique_graphs"]
    plain_step()
    plain_graphs.append(counters["stats"]["unique_graphs"] - before)
print(f"momentum=0: graphs compiled by calls 1, 2, 3: {plain_graphs} (momentum=0.9 above: {new_graphs}); "
      f"optimizer state after 3 steps: {len(plain_opt.state)} entries")
reveal(compiles_guess, str(sum(plain_graphs)),
       why=f"{plain_graphs} against {new_graphs} with momentum. The recompile above came from a guard on the "
           "optimizer's state, empty when call 1 was traced and holding momentum buffers at call 2. With momentum=0 "
           f"the step never touches that state ({len(plain_opt.state)} entries after 3 steps), so nothing the trace "
           "depended on changes between calls. A compiled step recompiles when what it was traced with changes, "
           "not because it is the first step.");

# %% [markdown]
# ### Your turn: a learning-rate schedule without a compile per step
#
# Training changes the learning rate as it goes (`torch.optim.lr_scheduler`). The check takes one eager step
# (so the momentum buffers exist), compiles the step, and calls it three times, with an `ExponentialLR`
# schedule multiplying the rate by 0.9 after each call. With `START_LR = 0.01`, each of the three calls
# compiles a graph of its own; the check prints the guard that failed. Make the three calls compile **one**
# graph, starting from the same rate, by changing only how `START_LR` is given.

# %% tags=["your-turn"]
START_LR = 0.01      # the rate the schedule starts from: keep 0.01, change how it is given

# %%
from helpers.checks import check_equal, fail, your_turn


def check_schedule():
    try:
        start = float(START_LR)
    except (TypeError, ValueError, RuntimeError):
        fail("START_LR", f"{START_LR!r} is not a number", "keep the rate 0.01; change only how it is given")
    if abs(start - 0.01) > 1e-6:
        fail("START_LR", f"starts at {start:g}", "keep the rate 0.01; change only how it is given")
    torch._dynamo.reset()
    params, grads, _ = fresh_state()
    opt, _ = fusion.sgd_optimizer(params, grads, foreach=True, lr=START_LR)
    schedule = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    opt.step()                                      # eager: creates the momentum buffers
    schedule.step()
    step, graphs, rates, log = torch.compile(opt.step), 0, [], io.StringIO()
    with contextlib.redirect_stderr(log):
        torch._logging.set_logs(recompiles=True)
        for _ in range(3):
            before = counters["stats"]["unique_graphs"]
            step()
            graphs += counters["stats"]["unique_graphs"] - before
            schedule.step()
            rates.append(f"{float(opt.param_groups[0]['lr']):.5f}")
    torch._logging.set_logs()
    failed = [line.split("#")[0].strip() for line in fusion.torch_log_lines(log.getvalue(), "recompiles")
              if "'lr'" in line]
    print(f"{type(START_LR).__name__} rate; after each call the schedule set {', '.join(rates)}; "
          f"graphs compiled: {graphs}" + (f"\nfirst guard that failed: {failed[0]}" if failed else ""))
    check_equal(graphs, 1, what="graphs compiled by three scheduled steps",
                hint="the failed guard compares the rate's value with the one traced: a Python float went into "
                     "the graph as a constant. Dynamo guards a tensor on its dtype, shape and device, not on the "
                     "numbers in it, and torch.optim.SGD accepts a one-element tensor as lr")


your_turn(check_schedule, what="a schedule without recompiles");

# %% [markdown]
# ## What a compiled call dispatches: `torch.profiler`
#
# **`torch.profiler` counts what a call dispatches.** Eager, every small op is an ATen call; compiled,
# no ATen op is left, only the layers of a compiled call. On a GPU, add `ProfilerActivity.CUDA` (`XPU` on
# Intel) to the activities to count the kernels too.

# %%
from torch.profiler import ProfilerActivity, profile

sgd = fusion.inspect_compiled(fusion.sgd_step, *fresh_state())   # the lesson's compiled SGD step (runs one step)


def events(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages()}


state = fresh_state()
eager_events, compiled_events = events(lambda: fusion.sgd_step(*state)), events(lambda: sgd.fn(*state))
aten_ops = {k: n for k, n in eager_events.items() if k in ("aten::add", "aten::add_", "aten::mul", "aten::mul_")}
print(f"eager step: {sum(aten_ops.values())} arithmetic ATen calls {aten_ops}, {sum(eager_events.values())} events in all")
print(f"compiled step: {sum(compiled_events.values())} events, "
      f"{sum(n for k, n in compiled_events.items() if k.startswith('aten::'))} of them ATen ops:")
for key in compiled_events:
    print("   ", key[:60])

# %% [markdown]
# The compiled call's events name its fixed costs: Dynamo's guard check (`TorchDynamo Cache Lookup`),
# AOTAutograd's runtime wrapper, and Inductor's generated wrapper (`Call CompiledFxGraph`); the names vary
# between releases; the overhead model below says what they cost.

# %% [markdown]
# ## The overhead model: time vs number of tiny ops
#
# If each eager op costs a fixed overhead `c`, n ops cost about `n·c`. A compiled function pays a
# fixed cost per call (guards, AOTAutograd's wrapper, Inductor's wrapper) plus whatever still grows with
# n. The sweep times n tiny ops on 16-element tensors two ways: as a **chain** on one tensor (vertical
# fusion makes it one loop) and as one in-place op on each of **n independent** tensors (only
# horizontal fusion can merge them; the compiled function still checks a guard per input tensor). It
# compiles two functions per n.

# %%
sweep = fusion.tiny_ops_sweep(SWEEP_COUNTS, device=DEVICE, repeats=REPEATS, min_run_time=MIN_RUN_S)
fig = go.Figure()
for name, ys in sweep["median_s"].items():
    fig.add_trace(go.Scatter(x=sweep["counts"], y=[y * 1e6 for y in ys], mode="lines+markers", name=name,
                             line=dict(dash="dot" if name.startswith("eager") else "solid"),
                             error_y=dict(type="data", symmetric=False,   # fastest to slowest repeat
                                          array=[(hi - y) * 1e6 for hi, y in zip(sweep["max_s"][name], ys)],
                                          arrayminus=[(y - lo) * 1e6 for lo, y in zip(sweep["min_s"][name], ys)])))
fig.update_layout(title=f"n tiny ops on {sweep['size']}-element tensors ({DEVICE.type})",
                  xaxis_title="number of ops n", yaxis_title="µs per call (median, bars: min-max)",
                  height=400)
fig.show()
print("straight lines fitted on each point's fastest repeat (the least disturbed by other load):")
for name, fit in sweep["fit"].items():
    print(f"{name:<22} fixed {fit['fixed_s'] * 1e6:7.1f} µs + {fit['per_op_s'] * 1e6:6.2f} µs per op")
one = {name: {key: sweep[key][name][0] for key in ("median_s", "min_s", "max_s")} for name in sweep["median_s"]}
us = {name: f"{r['median_s'] * 1e6:.1f} µs (min-max {r['min_s'] * 1e6:.1f}-{r['max_s'] * 1e6:.1f})"
      for name, r in one.items()}
slower = one["compiled chain"]["median_s"] > one["eager chain"]["median_s"]
print(f"one tiny op (n={sweep['counts'][0]}): compiled chain {us['compiled chain']} vs eager {us['eager chain']}: "
      + (f"compiled is {'slower' if slower else 'faster'} here"
         if bench.separated({"results": one}, "compiled chain", "eager chain") else
         f"the spreads overlap, {bench.NOISY}"))

# %% [markdown]
# - **Eager cost grows with the number of ops**, at a few microseconds each, whatever the op does
#   with 16 numbers: that is the per-op overhead. `_foreach_` removes most of it by handing a whole
#   list to one call.
# - **A compiled chain's cost hardly grows with n**: vertical fusion leaves one loop, and the call's
#   fixed cost dominates. That fixed cost can be larger than one eager op: the last line above says
#   whether, for a single tiny op, compiled code was slower than eager on this machine.
# - **Independent tensors still cost something per tensor when compiled**, even though the work is
#   one function: Dynamo's guards check every input tensor, and AOTAutograd's runtime wrapper and the
#   generated wrapper handle each one. Where the rest of a small compiled call goes: the profiler
#   above listed `TorchDynamo Cache Lookup`, the AOTDispatcher wrapper and `Call CompiledFxGraph`;
#   PyTorch's maintainers say AOTAutograd is "a lot, if not most, of the overhead" (pytorch#161783). In
#   one example in #150488, a small CUDA-graphed call spent 176 µs in Dynamo's cache lookup and other
#   torch.compile overhead, 128 µs in CUDA-graph tree bookkeeping, 41 µs in the graph launch and 72 µs in
#   the kernels. Much of what remains of "launch overhead" in compiled code is host-side work.
#
# The two fitted lines are a model: eager about `F_e + c_e·n`, the compiled chain `F_c + c_c·n`. A model is
# worth what it predicts outside the points it was fitted on.

# %% tags=["predict"]
N_FAR = 4 * max(SWEEP_COUNTS)
far_guess = predict(f"Extend the chain's two fitted lines to n = {N_FAR} ops: how many times faster than eager "
                    "will the compiled chain be there (eager time / compiled time)?", unit="x", example=3.0)

# %% tags=["reveal"]
fits = {name: sweep["fit"][f"{name} chain"] for name in ("eager", "compiled")}
model_s = {name: fit["fixed_s"] + fit["per_op_s"] * N_FAR for name, fit in fits.items()}
x_far = torch.randn(sweep["size"], device=DEVICE)
chain_far = torch.compile(fusion.chain_ops, dynamic=False)
far = bench.compare({"eager chain": lambda: fusion.chain_ops(x_far, N_FAR),
                     "compiled chain": lambda: chain_far(x_far, N_FAR)},
                    baseline="eager chain", repeats=REPEATS, min_run_time=MIN_RUN_S, device=DEVICE)
print(bench.table(far))
fastest = {name: far["results"][f"{name} chain"]["min_s"] for name in ("eager", "compiled")}
far_ratio, model_ratio = fastest["eager"] / fastest["compiled"], model_s["eager"] / model_s["compiled"]
c_e, c_c, f_e, f_c = (fits["eager"]["per_op_s"] * 1e6, fits["compiled"]["per_op_s"] * 1e6,
                      fits["eager"]["fixed_s"] * 1e6, fits["compiled"]["fixed_s"] * 1e6)
even = f" (the lines cross near n = {(f_c - f_e) / (c_e - c_c):.0f})" if c_e > c_c else ""
spread = ("" if bench.separated(far, "eager chain", "compiled chain")
          else " The two overlapped over the repeats: too close to call here; run again.")
bent = (" A negative time means other load disturbed the sweep: run the sweep cell again."
        if min(model_s.values()) <= 0 else "")
slope = (f"a cost per op too small to measure here (fitted: {c_c:.2f} µs)" if c_c < 0.1
         else f"a fitted {c_c:.2f} µs per op")
off = max(model_ratio / far_ratio, far_ratio / model_ratio) if model_ratio > 0 else float("inf")
reveal(far_guess, far_ratio,
       why=f"the lines predicted {model_s['eager'] * 1e6:.0f} µs against {model_s['compiled'] * 1e6:.0f} µs, "
           f"{model_ratio:.1f}x; measured (fastest repeats, as the lines were fitted) {fastest['eager'] * 1e6:.0f} "
           f"against {fastest['compiled'] * 1e6:.0f} µs, {far_ratio:.1f}x: the model was off by a factor "
           f"{off:.1f}.{spread}{bent} Eager pays about {c_e:.1f} µs per op, a trip through Python and the "
           f"dispatcher whatever the op does with {sweep['size']} numbers. The compiled chain is one call of one "
           f"loop: a fixed {f_c:.0f} µs (guards, wrappers) plus {slope}, so the ratio keeps "
           f"growing with n: compiled wins once the trips outweigh its fixed cost{even}. Lines fitted on "
           f"{len(sweep['counts'])} points extrapolate only as well as those points were measured.");

# %% [markdown]
# ## Other tools against overhead
#
# ### A C++ wrapper (`cpp_wrapper`, CPU here)
#
# Inductor's wrapper, the code that calls the generated kernels, is Python by default. With
# `cpp_wrapper=True` (`TORCHINDUCTOR_CPP_WRAPPER=1`) it is generated in C++ and compiled too, so a call
# goes through less Python. It is passed as a compile option, so the recompiles that later compiles
# trigger (`inspect_compiled` resets Dynamo) keep it. CPU only here: on a GPU the C++ wrapper launches
# the Triton kernels, and this notebook does not compile it there.

# %%
caps = capabilities()
if DEVICE.type == "cpu" and caps.toolchains["cxx"]:
    sgd_cpp = fusion.inspect_compiled(fusion.sgd_step, *fresh_state(), options={"cpp_wrapper": True})
    print(f"compiled with cpp_wrapper: first call {sgd_cpp.compile_s:.1f} s "
          f"(Python wrapper: {sgd.compile_s:.1f} s; both include compiling or loading the C++ kernels)")
    ref, cw = fresh_state(), fresh_state()
    for _ in range(3):
        fusion.sgd_step(*ref)
        sgd_cpp.fn(*cw)
    for got_list, ref_list in zip(cw, ref):
        for g, r in zip(got_list, ref_list):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    state = fresh_state()
    wrapper_result = bench.compare({"eager loop": lambda: fusion.sgd_step(*state),
                                    "compiled, Python wrapper": lambda: sgd.fn(*state),
                                    "compiled, cpp_wrapper": lambda: sgd_cpp.fn(*state)},
                                   baseline="eager loop", repeats=REPEATS, min_run_time=MIN_RUN_S, device=DEVICE)
    print("eager loop == compiled with cpp_wrapper after 3 steps\n" + bench.table(wrapper_result))
else:
    print("cpp_wrapper step not compiled: it needs the CPU device and a C++ compiler "
          f"(device {DEVICE.type}, c++ {caps.toolchains['cxx']})")

# %% [markdown]
# ### CUDA graphs (`mode="reduce-overhead"`)
#
# Fusion cuts the number of kernels and the bytes moved between them. A CUDA graph keeps every kernel but
# records the sequence once and replays it with a single `cudaGraphLaunch`, so the CPU no longer pays per
# kernel (the driver call, and the wrapper code between launches), and the GPU does not wait for a CPU that
# falls behind (PyTorch's CUDA notes, https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs).
# `torch.compile(mode="reduce-overhead")` does this for compiled code with CUDA graph trees
# (`torch/_inductor/cudagraph_trees.py`). The price: static shapes and memory addresses (inputs that are not
# static are copied into the graph's buffers), no CPU synchronisation inside, more memory held. Dynamo's
# guards still run on every call.
#
# **It does not graph a function that mutates its inputs**, unless those inputs are static (parameters,
# buffers, tensors marked with `torch._dynamo.mark_static_address`) or outputs of an earlier CUDA graph:
# `check_for_mutation` in
# `torch/_inductor/cudagraph_utils.py` skips the graph ("skipping cudagraphs due to mutated inputs"). The
# hand-written `sgd_step` on plain tensors is exactly that case. A compiled `torch.optim` step is not:
# Dynamo marks the parameters and the optimizer's state as static addresses
# (`torch/_dynamo/variables/optimizer.py`), so its in-place updates can be graphed. The cell below
# (CUDA and ROCm builds) measures both. As in the core lesson, each optimizer takes **one eager step
# before it is compiled**, so its momentum buffers exist before any graph is recorded. Compiled from its
# very first call instead, the reduce-overhead step creates them inside that call's graph, and the next
# call (recompiled, since the optimizer's state changed) raises `RuntimeError: Error: accessing tensor
# output of CUDAGraphs that has been overwritten by a subsequent run` (seen on an H200;
# `torch.compiler.cudagraph_mark_step_begin()` before each call does not help; the eager step does, with no
# graph skipped). Five calls then warm both up.

# %%
if requires("torch_cuda", section="CUDA graphs on the optimizer step"):
    params, grads, _ = fresh_state()
    opt_default, _ = fusion.sgd_optimizer(params, grads, foreach=True)
    opt_graphed, _ = fusion.sgd_optimizer(params, grads, foreach=True)
    for opt in (opt_default, opt_graphed):
        opt.step()                            # eager first step: the momentum buffers exist before any graph
    step_default = torch.compile(opt_default.step)
    step_graphed = torch.compile(opt_graphed.step, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(5):
        step_default()
        step_graphed()
    step_skips = counters["inductor"]["cudagraph_skips"] - skips
    state = fresh_state()
    loop_graphed = torch.compile(fusion.sgd_step, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        loop_graphed(*state)
    loop_skips = counters["inductor"]["cudagraph_skips"] - skips
    print(f"graphs skipped: compiled torch.optim step {step_skips}, compiled sgd_step on plain tensors {loop_skips}")
    eager_opt, _ = fusion.sgd_optimizer(params, grads, foreach=True)
    graph_result = bench.compare({"torch.optim, foreach=True": eager_opt.step,
                                  "compiled step": step_default,
                                  "compiled step, reduce-overhead": step_graphed,
                                  "compiled sgd_step, reduce-overhead": lambda: loop_graphed(*state)},
                                 baseline="torch.optim, foreach=True", repeats=REPEATS, device=DEVICE)
    print(bench.table(graph_result))
    bench.save_json(graph_result, "../runs/02_horizontal_fusion_cudagraphs.json")

# %% [markdown]
# ## Inductor's combo kernels, off vs on
#
# The lesson said that `combo_kernels=True` changes nothing on a CPU, because the scheduler's grouping
# skips CPU nodes. The independent pair, compiled for the CPU with combo kernels off and on
# (`fusion.COMBO_ON`, which also sets `benchmark_combo_kernel=False`: otherwise Inductor keeps a
# combination only if it timed faster during compilation, and the generated code can differ between runs):

# %%
a_cpu, b_cpu = a.cpu(), b.cpu()   # the lesson's independent pair, on the CPU on every machine
cpu_off = fusion.inspect_compiled(two_independent, a_cpu, b_cpu)
cpu_on = fusion.inspect_compiled(two_independent, a_cpu, b_cpu, options=fusion.COMBO_ON)
assert cpu_on.kernel_functions == cpu_off.kernel_functions
assert fusion.kernel_source(cpu_on.code, cpu_on.kernel_functions[0]) == \
       fusion.kernel_source(cpu_off.code, cpu_off.kernel_functions[0]), "same C++ either way"
print("CPU: combo_kernels=True generated the same kernel source as the default")

# %% [markdown]
# ### On a GPU
#
# The SGD step compiled for the GPU with combo kernels off and on: the cell checks each combo kernel's
# dispatch lines (`if pid % N == ...` round-robin, `if pid < num_xblocks_0` sequential) against the rule
# the lesson printed (`select_dispatch_strategy`), then times four steps.

# %% tags=["predict"]
STEPS = ["eager loop", "_foreach_", "compiled, combo off", "compiled, combo on"]
groups = fusion.combo_groups([p.numel() for p in fresh_state()[0]])   # the SGD step's kernels, in groups of 8
step_guess = predict("On a GPU, which SGD step of 30 small tensors is fastest?", options=STEPS,
                     example="compiled, combo on")

# %%
if requires("triton_gpu", section="Combo kernels in Inductor (GPU)"):
    gpu_off = fusion.inspect_compiled(fusion.sgd_step, *fresh_state(), options=fusion.COMBO_OFF)
    gpu_on = fusion.inspect_compiled(fusion.sgd_step, *fresh_state(), options=fusion.COMBO_ON)
    combos = fusion.combo_dispatches(gpu_on.code)
    print(f"combo off: {len(gpu_off.kernel_functions)} Triton kernels · combo on: "
          f"{len(gpu_on.kernel_functions)}, {len(combos)} of them combo kernels")
    assert combos, "combo_kernels=True made no combo kernel of the SGD step"
    for k in combos:
        rule = fusion.inductor_combo_dispatch_strategy(k.numels)
        print(f"  {k.name}: sub-kernel sizes {k.numels}: dispatch lines say {k.scheme}, the rule says {rule}")
        assert k.scheme == rule, f"{k.name}: generated {k.scheme}, the rule predicts {rule}"
    print("in groups of 8, in order, as predicted:", [k.numels for k in combos] == groups)
    ref, s_on = fresh_state(), fresh_state()
    fusion.sgd_step(*ref)
    gpu_on.fn(*s_on)
    for g, r in zip(s_on[0], ref[0]):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    state = fresh_state()
    combo_result = bench.compare({"eager loop": lambda: fusion.sgd_step(*state),
                                  "_foreach_": lambda: fusion.sgd_step_foreach(*state),
                                  "compiled, combo off": lambda: gpu_off.fn(*state),
                                  "compiled, combo on": lambda: gpu_on.fn(*state)},
                                 baseline="eager loop", repeats=REPEATS, device=DEVICE)
    print(bench.table(combo_result))
    bench.save_json(combo_result, "../runs/02_horizontal_fusion_combo_gpu.json")
    first, second = sorted(STEPS, key=lambda k: combo_result["results"][k]["median_s"])[:2]
    tie = "" if bench.separated(combo_result, first, second) else f" ({first} and {second} tie within their spreads)"
    reveal(step_guess, first, why=f"{first} was fastest here{tie}. The eager loop launches a kernel per op and "
           "tensor (150); _foreach_ packs many tensors into each launch; compiled, combo off runs one fused kernel "
           "per tensor (30), combo on a few; and every compiled call first checks Dynamo's guards on its 90 "
           "tensors on the CPU, a cost that tiny tensors do not hide.")
else:
    print("Not measured here. On an H200 (torch 2.11, quick, 2026-12-04), median (min-max): eager loop 336 us, "
          "_foreach_ 67.5 (50.6-72), combo off 99.6, combo on 66 (60.3-68.7): _foreach_ and combo on, the fastest, tie.")

# %% [markdown]
# ## A combo kernel by hand, in Triton
#
# A combo kernel runs several independent kernels in **one launch**; every program first works out
# which part it belongs to from its program id. Ours has three parts on three tensors of unrelated
# sizes: `x * alpha`, `relu(x)`, `silu(x)` (`helpers/fusion_kernels.py`), in both of Inductor's schemes.
# The **sequential** one, in words (writing it is lab 02's exercise): the grid is the sum of the blocks
# each part needs; a program below the end of part 0 works on part 0 with its own id, one below the end of
# part 1 on part 1 with its id minus part 0's blocks, and so on. No program is wasted. The
# **round-robin** one, as `helpers/fusion_kernels.py` has it (`apply_part` does one block of one part,
# masked past the part's end):
#
# ```python
# @triton.jit
# def combo_kernel_round_robin(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK: tl.constexpr):
#     pid = tl.program_id(0)
#     local_pid = pid // 3                   # grid: 3 x the largest part's blocks
#     if pid % 3 == 0:
#         apply_part(x0, y0, n0, local_pid, alpha, 0, BLOCK)   # masked past n0
#     elif pid % 3 == 1:
#         apply_part(x1, y1, n1, local_pid, alpha, 1, BLOCK)
#     else:
#         apply_part(x2, y2, n2, local_pid, alpha, 2, BLOCK)
# ```
#
# Inductor picks round-robin only when mixed sizes are allowed and few programs would be idle
# (`select_dispatch_strategy`, printed in the lesson). Mixed sizes are allowed for the combo kernels
# `combo_kernels=True` makes (the custom partition algorithm, `combo_kernel_allow_mixed_sizes` = 1), not
# for the foreach kernels `_foreach_` ops lower to (`use_custom_partition_algo=False` in `scheduler.py`).
#
# Without a GPU, Triton can still *run* the kernels: with `TRITON_INTERPRET=1`, `triton.jit` builds an
# interpreter that executes each program with NumPy on the CPU: slow, but exact enough to check
# correctness. `triton.jit` reads the variable when it decorates a function, and Triton's own helpers
# (`tl.cdiv`, `tl.sigmoid`) are decorated when `triton` is first imported, which `torch.compile` does.
# So the set-up cell set it, on CPU-only machines, before anything imported Triton.

# %%
sizes = [1000, 1, 3 * 1025]          # ragged on purpose: none is a multiple of the block
block = 256
total, ends = fusion.combo_grid(sizes, block)
rr_total, rr_masked = fusion.round_robin_grid(sizes, block)
print(f"parts {fusion.COMBO_PARTS}")
print(f"sizes {sizes}, block {block}: sequential: one launch of {total} programs; parts end at program ids {ends}")
print(f"round-robin: {rr_total} programs, {rr_masked} of them masked; Inductor would pick "
      f"{fusion.inductor_combo_dispatch_strategy(sizes)} for these sizes")
print(f"\nthe SGD step's kernels, one per tensor, in groups of {fusion.COMBO_MAX_NODES_2_10}:")
sgd_sizes = [p.numel() for p in fresh_state()[0]]
full_sizes = [1024 + 37 * i for i in range(30)]      # the full-mode workload (parameters cell defaults)
for label, all_sizes in {"this run": sgd_sizes, "full mode": full_sizes}.items():
    if label == "full mode" and all_sizes == sgd_sizes:
        continue
    for group in fusion.combo_groups(all_sizes):
        combo = fusion.inductor_combo_dispatch_strategy(group)
        assert combo == fusion.combo_dispatch_strategy(group), "the re-implemented rule disagrees with Inductor"
        foreach = fusion.inductor_combo_dispatch_strategy(group, mixed_sizes=False)
        print(f"  {label}: {len(group)} kernels of {group[0]}..{group[-1]} elements, utilization "
              f"{fusion.combo_utilization(group):.2f} -> combo kernel {combo}, foreach kernel {foreach}")

# %% [markdown]
# ### Check: the hand-written kernels against eager PyTorch

# %%
if requires("triton_interpreter", section="Hand-written combo kernel: correctness"):
    interpreted = fusion.kernels_interpreted()
    print(f"kernels run under Triton's interpreter: {interpreted} (expected: {DEVICE.type == 'cpu'})")
    assert interpreted == (DEVICE.type == "cpu")
    cases = [([1000, 1, 3075], torch.float32), ([0, 513, 2], torch.float32), ([0, 0, 0], torch.float32),
             ([777, 64, 1025], torch.float16), ([300, 5, 70], torch.bfloat16)]
    for case_sizes, dtype in cases:
        xs = [torch.randn(n, device=DEVICE).to(dtype) for n in case_sizes]
        want = fusion.combo_reference(xs, alpha=0.5)
        outs = (fusion.combo_launch(xs, alpha=0.5, block=block), fusion.combo_launch_round_robin(xs, alpha=0.5, block=block),
                fusion.separate_launches(xs, alpha=0.5, block=block))
        tol = {} if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        for out in outs:
            for g, w in zip(out, want):
                torch.testing.assert_close(g, w, **tol)
        print(f"sizes {case_sizes} {dtype}: sequential combo == round-robin combo == separate launches == eager")

# %% [markdown]
# ### Speed on a GPU: host time and device time
#
# `bench.compare` times calls from Python (it waits for the device at the end of each timed block): at
# these sizes that is mostly host-side work, Triton's launcher binding arguments for each launch, which is
# what one launch instead of three saves. `triton.testing.do_bench` records device events around each
# call (it flushes the L2 cache before each, `triton/testing.py`) and reports their median: time on the
# device's clock, which still includes any wait for the host between launches. For each kernel on its
# own, use `torch.profiler` with the device activity. The cell prints both numbers.

# %%
if requires("triton_gpu", section="Hand-written combo kernel: speed"):
    import triton.testing

    xs = [torch.randn(n, device=DEVICE) for n in (4096, 16384, 1000)]
    kernels = {"eager (3 ops)": lambda: [xs[0] * 0.5, torch.relu(xs[1]), torch.nn.functional.silu(xs[2])],
               "3 Triton launches": lambda: fusion.separate_launches(xs, alpha=0.5),
               "1 combo launch (sequential)": lambda: fusion.combo_launch(xs, alpha=0.5),
               "1 combo launch (round-robin)": lambda: fusion.combo_launch_round_robin(xs, alpha=0.5)}
    kernel_result = bench.compare(kernels, baseline="3 Triton launches", repeats=REPEATS, device=DEVICE)
    print(bench.table(kernel_result))
    for name, fn in kernels.items():
        print(f"{name:<30} device time (do_bench, median) {triton.testing.do_bench(fn, return_mode='median') * 1e3:8.1f} µs")

# %% [markdown]
# ## Look at the code yourself
#
# Pick a function to see what its wrapper calls and the start of its first kernel. (Widgets need a
# live kernel; in a batch run the cell just shows the control.)

# %%
import ipywidgets as widgets

from helpers.interactive import interact

INSPECTED = {"chain of 4 ops": chain, "2 independent ops": indep, f"SGD step, {N_TENSORS} tensors": sgd}


def show_code(which="chain of 4 ops", lines=25):
    info = INSPECTED[which]
    print("wrapper calls:", *fusion.wrapper_calls(info.code)[:8], sep="\n  ")
    print(fusion.kernel_source(info.code, info.kernel_functions[0], max_lines=lines))


interact(show_code, which=widgets.Dropdown(options=list(INSPECTED)),
         lines=widgets.IntSlider(value=25, min=10, max=120, step=5));

# %% [markdown]
# ## What changes on other hardware
#
# - **NVIDIA/AMD GPUs**: every Triton kernel the wrapper calls is a separate launch. Kernels of
#   different tensors share no buffers and have different sizes, so without combo kernels Inductor
#   keeps them apart; with `combo_kernels=True` it launches independent kernels together, up to
#   8 per combo kernel (fixed in 2.10, the option `combo_kernel_max_num_nodes` later). The GPU
#   section above prints the real kernel counts and dispatch lines.
# - **Intel GPUs (XPU)** use Inductor's Triton backend too, and the combo-kernel grouping does not
#   exclude them; it skips only **MPS** and the CPU.
# - **Triton absent** (a CPU-only install without the `triton` extra): the hand-written kernel's
#   sections print that they were skipped and why; everything else runs. `pip install triton` adds it.
# - **Newer releases** add grouping options to combo kernels (2.13: `combo_kernel_max_distance`, a
#   peak-memory gate, `combo_kernel_autotune_grouping`, per-sub-kernel block sizes with a third dispatch
#   scheme); the options cell above prints what your torch has.
#
# ## Pitfalls
#
# **A misspelled option fails at `torch.compile` time** (the list of valid names that follows the
# message is long; first line only):

# %% tags=["nbval-check-output"]
try:
    torch.compile(two_independent, options={"combo_kernel": True})   # the real name ends in "s"
except RuntimeError as err:
    print("RuntimeError:", str(err).split(",")[0])

# %% [markdown]
# **The combo kernel's wrapper rejects what it cannot run** (checked before Triton is touched):

# %% tags=["nbval-check-output"]
for bad in ([torch.randn(8)] * 2, [torch.randn(8), torch.arange(8), torch.randn(8)]):
    try:
        fusion.combo_launch(bad)
    except (ValueError, TypeError) as err:
        print(f"{type(err).__name__}: {err}")

# %% [markdown]
# - **Never assert that kernels were combined unless the decision is pinned.** With
#   `benchmark_combo_kernel=True`, Inductor times each candidate group during compilation and keeps it
#   only if it is faster, so the generated code can differ between runs and machines. Tests and
#   lessons set it to `False` (as `fusion.COMBO_ON` does).
# - **Combo kernels are experimental in 2.10** and off by default (a PR to turn them on by default,
#   pytorch#168050, was closed). Known 2.10-era failures: a recompile with a new shape can hit
#   `Dynamic shape on reduction dimension is not supported` (use `dynamic=False` or turn combo off;
#   fixed after 2.10, pytorch#187275); combined random ops failed to compile (pytorch#168124).
# - **A cache hit logs nothing.** `TORCH_LOGS="fusion"` and `TORCH_COMPILE_DEBUG`'s `ir_*_fusion.txt`
#   come from the scheduler, which a compile served from Inductor's FX graph cache skips: turn the cache
#   off for the compile you inspect (`fx_graph_cache=False`, or `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`).
# - **`TRITON_INTERPRET=1` must be set before `triton` is imported**: `triton.jit` checks it when it
#   decorates a function, and `triton.language` decorates its helpers at import. Set it later (after a
#   `torch.compile`, say) and the interpreted kernel fails with `Cannot call @triton.jit'd outside of
#   the scope of a kernel`; `fusion.combo_launch` detects this and says what to do. Set it only on
#   machines without a GPU: in a GPU process it would also make Inductor's Triton kernels run
#   interpreted.
# - **`loop_kernels` is not the number of launches on a CPU**: `generated_kernel_count` counts every
#   loop nest Inductor generates, while the wrapper calls one `cpp_fused_*` function holding all of
#   them. Count `kernel_functions` (or read `wrapper_calls`) for calls.
# - **Threads and generated CPU code.** Inductor decides at compile time whether a loop is split
#   across threads (`torch.get_num_threads()`, `config.cpp.threads`, and at least
#   `config.cpp.min_chunk_size` elements per thread, printed above). A parallel loop nest is an OpenMP
#   `#pragma omp for`, which ends with a barrier: every thread waits for the slowest. On a shared or
#   oversubscribed machine (CI runners, Binder, a busy laptop) a descheduled thread stalls every
#   barrier, and the compiled step's time per call jumps by orders of magnitude in bursts (try
#   `THREADS = 2` on a busy 2-core machine and watch the spread column). Set the thread count *before*
#   compiling: changing it afterwards makes Dynamo recompile (`GLOBAL_STATE changed: num_threads`,
#   visible with `TORCH_LOGS=recompiles`).
# - **`run_and_get_code` resets Dynamo** (`torch._dynamo.reset()`): functions compiled before it
#   recompile on their next call; Inductor's on-disk cache makes that fast.
#
# Back to [the lesson](02_horizontal_fusion.ipynb), or on to [lab 02](../labs/02_fusion_lab.ipynb).
