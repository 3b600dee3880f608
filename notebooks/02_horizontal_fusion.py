# %% [markdown]
# # 02 · Horizontal fusion and combo kernels: fewer launches, less overhead
#
# | | |
# |---|---|
# | **What you will learn** | how `torch.compile` turns many small operations into few generated kernels; vertical fusion (a chain) vs horizontal fusion (independent ops); how to read Inductor's generated code and count its kernels; the production horizontal fusion: `torch.optim`'s foreach step and a compiled `optimizer.step`, timed beside a hand-written step; what `combo_kernels` really does (GPU/Triton only, off by default, experimental); the two ways a combo kernel dispatches work by program id (sequential and round-robin), which one Inductor picks and why, in hand-written Triton kernels; what CUDA graphs remove that fusion does not |
# | **Prerequisites** | lesson 00; basic `torch.compile`; reading a little C++ or Triton helps |
# | **Hardware** | any CPU with a C++ compiler (Inductor's CPU backend generates C++ and compiles it; the hand-written Triton kernels run under Triton's interpreter when Triton is installed). On an NVIDIA/AMD/Intel GPU with Triton, three more sections run: the kernel's speed, and Inductor's combo kernels on and off |
# | **Time** | 35 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build), 2.14.1+cu130 (env latest: CUDA 13.0 build, no GPU) (make matrix, 2026-12-02); the config names and the dispatch rule were read in the 2.10.0 and 2.13.0 wheels (`torch/_inductor/config.py`, `torch/_inductor/codegen/triton_combo_kernel.py`), and a cell prints them from the torch you run; combo kernels came in 2.5: foreach cases in pytorch#124969, the automatic horizontal fusion that `combo_kernels=True` turns on in #131675 (relanded as #133291) |
#
# Card → parameters → device → idea → code → check → measure → plot → what the numbers mean →
# other hardware → pitfalls.

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
N_TENSORS = 30         # tensors in the optimizer-style update
BASE_SIZE = 1024       # elements of the first tensor; tensor i has BASE_SIZE + 37*i
SWEEP_COUNTS = [1, 4, 16, 64]   # numbers of tiny ops in the launch-overhead sweep
THREADS = 1            # CPU threads for everything compiled and timed here (see "Pitfalls" for why)

# %%
import os

import plotly.graph_objects as go
import torch

from helpers import bench, fusion
from helpers.device import capabilities, pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.set_num_threads(THREADS)   # before any compile: the thread count is part of what Dynamo guards
if DEVICE.type == "cpu":   # Triton's interpreter for the hand-written kernel; see its section
    os.environ["TRITON_INTERPRET"] = "1"
if QUICK:
    N_TENSORS, BASE_SIZE, SWEEP_COUNTS = 6, 256, [1, 16]
REPEATS, MIN_RUN_S = (3, 0.05) if QUICK else (7, 0.2)   # timing repeats, seconds per repeat
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · quick mode: {QUICK} · CPU threads: {THREADS}")


# %% [markdown]
# ## The idea: where the time of a small operation goes
#
# In eager mode every operation is a separate trip: Python → dispatcher → kernel (on a GPU, a kernel
# *launch*). For a tensor of a few thousand elements the arithmetic takes far less than the trip, so
# a model with many small tensors (an optimizer step over every parameter, a norm layer, a loss with
# several terms) is bound by **overhead per operation**, not by compute or memory.
#
# `torch.compile` removes trips by *fusing*:
#
# ```
#  your Python function
#        │  Dynamo: captures the tensor operations as an FX graph (plus guards that decide reuse)
#        ▼
#  FX graph ── AOTAutograd: functional ATen ops (in-place updates become explicit copies)
#        │
#        ▼  Inductor lowering: each op becomes a loop body ("node")
#  scheduler ── vertical fusion:   a → b → c      (b reads what a wrote)  → one loop
#        │      horizontal fusion: a   b   c      (independent)           → one kernel or one function
#        │      combo kernels (GPU, opt-in): independent Triton kernels   → one launch
#        ▼
#  generated code: C++/OpenMP functions `cpp_fused_*` (CPU) or Triton kernels `triton_*` (GPU),
#                  called from one Python wrapper `call(args)`
# ```
#
# `fusion.inspect_compiled(fn, *args)` compiles a function, runs it once and returns what Inductor
# generated (via `torch._inductor.utils.run_and_get_code`), the kernel functions the wrapper calls,
# and `torch._inductor.metrics.generated_kernel_count` (`loop_kernels`).

# %% [markdown]
# ## Vertical vs horizontal fusion in generated code
#
# Two tiny functions: a **chain** of four multiplications (each reads the previous result), and two
# **independent** operations on two tensors.

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
# ## Check: same results, and the fusion we expect on this backend
#
# Compiled results must equal eager ones. On the CPU, Inductor's C++ backend puts consecutive loop
# nests into **one** `cpp_fused_*` function (one call, one OpenMP parallel region); it starts a new
# function only at a library call (a matmul, say) or past `CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM`
# kernel arguments. Independent nodes that read the *same* buffer can even
# share one loop (`a.sin(), a.cos()` becomes one loop; at most
# `torch._inductor.config.cpp.max_horizontal_fusion_size` nodes per loop; both limits are printed from
# your torch in the `combo_kernels` section); nodes with nothing in
# common, like our pair, stay two loops inside one function. So on CPU both functions become one
# `cpp_fused_*` function; `loop_kernels` counts the loop nests inside.

# %% tags=["nbval-check-output"]
torch.testing.assert_close(chain.result, fusion.chain_ops(x, 4))
for got, want in zip(indep.result, two_independent(a, b)):
    torch.testing.assert_close(got, want)
if DEVICE.type == "cpu":
    assert len(chain.kernel_functions) == 1 and len(indep.kernel_functions) == 1
    assert chain.loop_kernels == 1, "a chain of elementwise ops is one loop (vertical fusion)"
print("compiled == eager for the chain and the independent pair")

# %% [markdown]
# The chain's kernel, as generated (on CPU a C++ function; on a GPU a Triton kernel):

# %%
print(fusion.kernel_source(chain.code, chain.kernel_functions[0], max_lines=40))

# %% [markdown]
# ## `combo_kernels` on a CPU: nothing changes, and why
#
# Combo kernels (`torch._inductor.config.combo_kernels`, added in 2.5: pytorch#124969 for foreach cases,
# #131675 and its reland #133291 for the automatic pass this option turns on; still `False` by default and commented "(Experimental)" in `config.py`) merge *independent Triton kernels* into
# one launch. The scheduler's grouping skips CPU and MPS nodes outright
# (`_default_group_nodes_for_combo_kernels`: `if device.type == "mps" or device.type == "cpu": continue`).
# First the options as your torch has them (names change between releases: `combo_kernel_max_num_nodes`
# exists in 2.13 but not in 2.10, where the limit of 8 kernels is hard-coded), with the C++ backend's
# limits quoted above:

# %%
from torch._inductor.codegen.cpp import CppScheduling

COMBO_OPTIONS = ("combo_kernels", "benchmark_combo_kernel", "combo_kernels_autotune", "combo_kernel_allow_mixed_sizes",
                 "combo_kernel_max_num_args", "combo_kernel_max_num_nodes", "combo_kernel_foreach_dynamic_shapes",
                 "cpp.max_horizontal_fusion_size", "cpp.min_chunk_size")
for name, value in fusion.inductor_options(*COMBO_OPTIONS).items():
    print(f"torch._inductor.config.{name:<36} {'(not in this torch)' if value is None else value}")
print(f"CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM{'':<14} {CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM}")

# %% [markdown]
# Now the independent pair compiled for the CPU with combo kernels on and off, the decision pinned
# (`benchmark_combo_kernel=False`):

# %%
a_cpu, b_cpu = a.cpu(), b.cpu()
cpu_off = fusion.inspect_compiled(two_independent, a_cpu, b_cpu, options=fusion.COMBO_OFF)
cpu_on = fusion.inspect_compiled(two_independent, a_cpu, b_cpu, options=fusion.COMBO_ON)
print("combo off:", cpu_off.kernel_functions, "loop kernels", cpu_off.loop_kernels)
print("combo on: ", cpu_on.kernel_functions, "loop kernels", cpu_on.loop_kernels)

# %% tags=["nbval-check-output"]
assert cpu_on.kernel_functions == cpu_off.kernel_functions and cpu_on.loop_kernels == cpu_off.loop_kernels
assert fusion.kernel_source(cpu_on.code, cpu_on.kernel_functions[0]) == \
       fusion.kernel_source(cpu_off.code, cpu_off.kernel_functions[0]), "same C++ either way"
print("CPU: combo_kernels=True generated the same kernel source as combo_kernels=False")


# %% [markdown]
# ## The workload: an optimizer-style update over many small tensors
#
# SGD with momentum and weight decay, written as the loop a simple optimizer runs: five small ops per
# tensor (`fusion.sgd_step`). Three ways to run it:
#
# - **eager loop**: 5 ops × N tensors dispatches;
# - **`_foreach_`**: PyTorch's multi-tensor ops (`torch._foreach_add_` and friends, what
#   `torch.optim.SGD(foreach=True)` uses): 4 calls for the whole list;
# - **compiled**: `torch.compile(sgd_step)`: one generated function for everything.
#
# Then the same update as production code runs it: `torch.optim.SGD` with `foreach=False` (a Python loop
# over the tensors) and `foreach=True` (the default on GPUs), and its `step` compiled.

# %%
def fresh_state():
    return fusion.make_sgd_state(N_TENSORS, BASE_SIZE, device=DEVICE, seed=1)

state = fresh_state()
sgd = fusion.inspect_compiled(fusion.sgd_step, *state)   # compiles, and runs one step on `state`
print(f"{N_TENSORS} tensors of {BASE_SIZE}..{BASE_SIZE + 37 * (N_TENSORS - 1)} elements")
print(f"compiled: {len(sgd.kernel_functions)} kernel function(s) {sgd.kernel_functions[:3]}, "
      f"{sgd.loop_kernels} loop kernels, first call {sgd.compile_s:.1f} s")

# %% [markdown]
# ### Check: all three give the same parameters and momentum buffers

# %% tags=["nbval-check-output"]
ref, fe, co = fresh_state(), fresh_state(), fresh_state()
for _ in range(3):
    fusion.sgd_step(*ref)
    fusion.sgd_step_foreach(*fe)
    sgd.fn(*co)
for got in (fe, co):
    for got_list, ref_list in zip(got, ref):
        for g, r in zip(got_list, ref_list):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
if DEVICE.type == "cpu":
    assert len(sgd.kernel_functions) == 1, "on CPU the whole update is one cpp_fused function"
    assert sgd.loop_kernels == N_TENSORS, "one loop nest per (ragged) tensor inside it"
print("eager loop == _foreach_ == compiled after 3 steps (params, grads, momentum)")

# %% [markdown]
# The start of the generated function (one loop nest per tensor follows, each updating the momentum
# buffer and the parameter in one pass):

# %%
print(fusion.kernel_source(sgd.code, sgd.kernel_functions[0], max_lines=30))

# %% [markdown]
# ### The same step with a C++ wrapper (`cpp_wrapper`)
#
# Inductor's wrapper, the code that calls the generated kernels, is Python by default. With
# `cpp_wrapper=True` (`TORCHINDUCTOR_CPP_WRAPPER=1`) it is generated in C++ and compiled too, so a call
# goes through less Python. It is passed as a compile option (not a `torch._inductor.config.patch`
# around the first call), so the recompiles that later compiles trigger (`inspect_compiled` resets
# Dynamo) keep it. The cell prints its first-call time, checks it against the eager loop, and the
# timing below puts it beside the Python wrapper. CPU only here: on a GPU the C++ wrapper launches
# the Triton kernels, and this lesson does not compile it there.

# %%
caps = capabilities()
sgd_cpp = None
if DEVICE.type == "cpu" and caps.toolchains["cxx"]:
    sgd_cpp = fusion.inspect_compiled(fusion.sgd_step, *fresh_state(), options={"cpp_wrapper": True})
    print(f"compiled with cpp_wrapper: first call {sgd_cpp.compile_s:.1f} s "
          f"(Python wrapper above: {sgd.compile_s:.1f} s; both include compiling the C++ kernels)")
    ref, cw = fresh_state(), fresh_state()
    for _ in range(3):
        fusion.sgd_step(*ref)
        sgd_cpp.fn(*cw)
    for got_list, ref_list in zip(cw, ref):
        for g, r in zip(got_list, ref_list):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    print("eager loop == compiled with cpp_wrapper after 3 steps")
else:
    print("cpp_wrapper step not compiled: it needs the CPU device and a C++ compiler "
          f"(device {DEVICE.type}, c++ {caps.toolchains['cxx']})")

# %% [markdown]
# ## The production horizontal fusion: foreach kernels and a compiled `optimizer.step`
#
# What really runs in training is `torch.optim`. With `foreach=True` its step is a handful of
# `torch._foreach_*` calls over the whole parameter list, each one ATen call (on a GPU, few kernel
# launches per list: ATen's multi-tensor-apply packs many tensors into each launch). `torch.compile`
# of `opt.step` goes further: Inductor lowers every `_foreach_` op to a **foreach kernel** node
# (`ForeachKernelSchedulerNode` in `torch/_inductor/scheduler.py`), fuses the ops of one tensor
# vertically, and combines the tensors horizontally, *without* `combo_kernels=True` (the option's
# comment in `torch/_inductor/config.py` calls combo kernels "additional to foreach kernels"). On a GPU
# that is one Triton kernel per group of tensors; on a CPU one C++ function, as for the loop above.
#
# Two practical rules, from PyTorch's "compiling the optimizer" recipe
# (https://docs.pytorch.org/tutorials/recipes/compiling_optimizer.html): compile `opt.step` itself,
# and take one eager step first, because the first step creates the momentum buffers (compiling that
# step and then the next one compiles twice).

# %%
opt_state = fresh_state()
optimizers = {foreach: fusion.sgd_optimizer(opt_state[0], opt_state[1], foreach=foreach)[0]
              for foreach in (False, True)}
opt_compiled, params_compiled = fusion.sgd_optimizer(opt_state[0], opt_state[1], foreach=True)
opt_compiled.step()                                   # eager first step: creates the momentum buffers
step_info = fusion.inspect_compiled(opt_compiled.step)   # compiles, and runs step 2
print(f"compiled opt.step: {len(step_info.kernel_functions)} kernel function(s) {step_info.kernel_functions}, "
      f"{step_info.loop_kernels} loop kernels, first call {step_info.compile_s:.1f} s")
print("wrapper calls:", *fusion.wrapper_calls(step_info.code), sep="\n  ")

# %% [markdown]
# ### Check: `torch.optim` (loop, foreach, compiled) gives what `sgd_step` gives

# %% tags=["nbval-check-output"]
ref = fresh_state()
for _ in range(3):
    fusion.sgd_step(*ref)
    for opt in optimizers.values():
        opt.step()
step_info.fn()                                         # step 3 of the compiled optimizer (1 eager, 2 compiled)
for opt in (*optimizers.values(), opt_compiled):
    for p, r in zip(opt.param_groups[0]["params"], ref[0]):
        torch.testing.assert_close(p.detach(), r, rtol=1e-5, atol=1e-6)
if DEVICE.type == "cpu":
    assert len(step_info.kernel_functions) == 1, "on CPU the compiled foreach step is one cpp_fused function"
print("torch.optim.SGD foreach=False == foreach=True == compiled step == sgd_step after 3 steps")

# %% [markdown]
# ### Measure: the hand-written step and `torch.optim`, side by side
#
# One CPU thread (`THREADS`): these tensors hold a few thousand numbers each, too little work to
# share between threads, and it keeps the comparison fair (eager ATen runs such small ops on one
# thread anyway).

# %%
state = fresh_state()
candidates = {"eager loop": lambda: fusion.sgd_step(*state),
              "_foreach_": lambda: fusion.sgd_step_foreach(*state),
              "compiled": lambda: sgd.fn(*state),
              "torch.optim, foreach=False": optimizers[False].step,
              "torch.optim, foreach=True": optimizers[True].step,
              "torch.optim, compiled step": step_info.fn}
if sgd_cpp is not None:
    candidates["compiled, cpp_wrapper"] = lambda: sgd_cpp.fn(*state)
step_result = bench.compare(candidates, baseline="eager loop", repeats=REPEATS, min_run_time=MIN_RUN_S, device=DEVICE)
step_result["workload"] = {"n_tensors": N_TENSORS, "base_size": BASE_SIZE,
                           "kernel_functions": len(sgd.kernel_functions), "loop_kernels": sgd.loop_kernels}
print(bench.table(step_result))
bench.save_json(step_result, "../runs/02_horizontal_fusion_sgd.json")
bench.plot(step_result, title=f"SGD-momentum step over {N_TENSORS} tensors ({DEVICE.type})").show()

# %% [markdown]
# ## The overhead model: time vs number of tiny ops
#
# If each eager op costs a fixed overhead `c`, n ops cost about `n·c`. A compiled function pays a
# fixed cost per call (guards, the wrapper) plus whatever still grows with n. The sweep times n tiny
# ops on 16-element tensors two ways: as a **chain** on one tensor (vertical fusion makes it one loop)
# and as one in-place op on each of **n independent** tensors (only horizontal fusion can merge them;
# the compiled function still checks a guard per input tensor). It compiles two functions per n.

# %%
sweep = fusion.tiny_ops_sweep(SWEEP_COUNTS, device=DEVICE, repeats=REPEATS, min_run_time=MIN_RUN_S)
fig = go.Figure()
for name, ys in sweep["median_s"].items():
    fig.add_trace(go.Scatter(x=sweep["counts"], y=[y * 1e6 for y in ys], mode="lines+markers", name=name,
                             line=dict(dash="dot" if name.startswith("eager") else "solid")))
fig.update_layout(title=f"n tiny ops on {sweep['size']}-element tensors ({DEVICE.type})",
                  xaxis_title="number of ops n", yaxis_title="µs per call (median)", height=400)
fig.show()
for name, fit in sweep["fit"].items():
    print(f"{name:<22} fixed {fit['fixed_s'] * 1e6:7.1f} µs + {fit['per_op_s'] * 1e6:6.2f} µs per op")

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
# ## A combo kernel by hand, in Triton: two ways to dispatch
#
# A combo kernel runs several independent kernels in **one launch**; every program first works out
# which part it belongs to from its program id. Inductor has two schemes for that
# (`ComboKernel.SequentialDispatch` and `ComboKernel.RoundRobinDispatch` in
# `torch/_inductor/codegen/triton_combo_kernel.py`, the same in 2.10 and 2.13):
#
# - **sequential**: the grid is the *sum* of the blocks each part needs; part 0 owns the first program
#   ids, part 1 the next ones, ... (`num_xblocks_0 = tl.cdiv(xnumel_0, XBLOCK)`,
#   `num_xblocks_1 = num_xblocks_0 + ...`, then `if pid < num_xblocks_0: ... elif pid < num_xblocks_1:`).
#   No program is wasted, but the parts run roughly one after another across the GPU.
# - **round-robin**: the grid is *(the largest part's blocks) x (number of parts)*; program `pid` runs
#   part `pid % N`, block `pid // N` (`if pid % N == 0: pid_offset = pid // N elif ...`). The parts are
#   interleaved and run side by side, but a part smaller than the largest gets programs with nothing
#   to do (fully masked).
#
# `ComboKernel.select_dispatch_strategy` picks round-robin only when mixed sizes are allowed and the
# masked programs would be few: `sum(numels) / (max(numels) x number of parts) > BLOCK_UTILIZATION`
# (0.8 in that file). Mixed sizes are allowed for the combo kernels `combo_kernels=True` makes (they
# use the custom partition algorithm and `combo_kernel_allow_mixed_sizes` defaults to 1), not for the
# foreach kernels that `_foreach_` ops lower to, which always dispatch sequentially
# (`use_custom_partition_algo=False` in `scheduler.py`). The next cell asks the installed Inductor
# and `fusion.combo_dispatch_strategy` (the same rule, re-implemented) which one this lesson's SGD
# step gets.
#
# Ours has three parts on three tensors of unrelated sizes: `x * alpha`, `relu(x)`, `silu(x)`
# (`helpers/fusion_kernels.py`), in both schemes:
#
# ```python
# @triton.jit
# def combo_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK: tl.constexpr):   # sequential
#     pid = tl.program_id(0)
#     end0 = tl.cdiv(n0, BLOCK)              # part 0 owns programs [0, end0)
#     end1 = end0 + tl.cdiv(n1, BLOCK)       # part 1 owns [end0, end1), part 2 the rest
#     if pid < end0:
#         apply_part(x0, y0, n0, pid, alpha, 0, BLOCK)
#     elif pid < end1:
#         apply_part(x1, y1, n1, pid - end0, alpha, 1, BLOCK)
#     else:
#         apply_part(x2, y2, n2, pid - end1, alpha, 2, BLOCK)
#
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
# Without a GPU, Triton can still *run* them: with `TRITON_INTERPRET=1`, `triton.jit` builds an
# interpreter that executes each program with NumPy on the CPU: slow, but exact enough to check
# correctness. `triton.jit` reads the variable when it decorates a function, and Triton's own helpers
# (`tl.cdiv`, `tl.sigmoid`) are decorated when `triton` is first imported, which `torch.compile` does.
# So the set-up cell at the top set it, on CPU-only machines, before anything imported Triton. On a GPU
# it is left unset and the kernels are compiled for the GPU.

# %%
sizes = [1000, 1, 3 * 1025]          # ragged on purpose: none is a multiple of the block
block = 256
total, ends = fusion.combo_grid(sizes, block)
rr_total, rr_masked = fusion.round_robin_grid(sizes, block)
print(f"parts {fusion.COMBO_PARTS}")
print(f"sizes {sizes}, block {block}: sequential: one launch of {total} programs; parts end at program ids {ends}")
print(f"round-robin: {rr_total} programs, {rr_masked} of them masked; Inductor would pick "
      f"{fusion.inductor_combo_dispatch_strategy(sizes)} for these sizes")

print("\nWhich dispatch Inductor picks for the SGD step's kernels (one per tensor, in groups of "
      f"{fusion.COMBO_MAX_NODES_2_10}):")
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
              f"{sum(group) / (max(group) * len(group)):.2f} -> combo kernel {combo}, foreach kernel {foreach}")

# %% [markdown]
# ### Check: the combo kernel against eager PyTorch

# %%
if requires("triton_interpreter", section="Hand-written combo kernel: correctness"):
    print("kernels run under Triton's interpreter:", fusion.kernels_interpreted() == (DEVICE.type == "cpu"))
    cases = [([1000, 1, 3075], torch.float32), ([0, 513, 2], torch.float32), ([0, 0, 0], torch.float32),
             ([777, 64, 1025], torch.float16), ([300, 5, 70], torch.bfloat16)]
    for case_sizes, dtype in cases:
        xs = [torch.randn(n, device=DEVICE).to(dtype) for n in case_sizes]
        got, want = fusion.combo_launch(xs, alpha=0.5, block=block), fusion.combo_reference(xs, alpha=0.5)
        sep = fusion.separate_launches(xs, alpha=0.5, block=block)
        rr = fusion.combo_launch_round_robin(xs, alpha=0.5, block=block)
        tol = {} if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        for g, s, r, w in zip(got, sep, rr, want):
            for out in (g, s, r):
                torch.testing.assert_close(out, w, **tol)
        print(f"sizes {case_sizes} {dtype}: sequential combo == round-robin combo == separate launches == eager")

# %%
if requires("triton_gpu", section="Hand-written combo kernel: speed"):
    xs = [torch.randn(n, device=DEVICE) for n in (4096, 16384, 1000)]
    kernel_result = bench.compare(
        {"eager (3 ops)": lambda: [xs[0] * 0.5, torch.relu(xs[1]), torch.nn.functional.silu(xs[2])],
         "3 Triton launches": lambda: fusion.separate_launches(xs, alpha=0.5),
         "1 combo launch": lambda: fusion.combo_launch(xs, alpha=0.5)},
        baseline="3 Triton launches", repeats=REPEATS, device=DEVICE)
    print(bench.table(kernel_result))
    bench.plot(kernel_result, title="Three tiny elementwise ops: one launch vs three").show()

# %% [markdown]
# ## Inductor's combo kernels on a GPU: off vs on, decision pinned
#
# The same SGD step, compiled for the GPU twice: `fusion.COMBO_OFF` and `fusion.COMBO_ON` (both set
# `benchmark_combo_kernel=False`, so whether kernels are combined does not depend on a timing taken
# during compilation). Inductor then combines independent kernels in groups of at most 8 kernels and
# `combo_kernel_max_num_args` buffers (both printed in the `combo_kernels` section). The 8 is hard-coded in torch 2.10 (`max_num_nodes = 8` in
# `torch/_inductor/scheduler.py`); later releases made it the option `combo_kernel_max_num_nodes` (in
# 2.13 and 2.14, default 8). Read the names from the `torch._inductor.config` you have before you set one. The dispatch cell above
# says whether each group comes out round-robin or sequential.

# %%
if requires("triton_gpu", section="Combo kernels in Inductor (GPU)"):
    gpu_off = fusion.inspect_compiled(fusion.sgd_step, *fresh_state(), options=fusion.COMBO_OFF)
    gpu_on = fusion.inspect_compiled(fusion.sgd_step, *fresh_state(), options=fusion.COMBO_ON)
    print(f"combo off: {len(gpu_off.kernel_functions)} Triton kernels · combo on: "
          f"{len(gpu_on.kernel_functions)} Triton kernels")
    assert len(gpu_on.kernel_functions) <= len(gpu_off.kernel_functions)
    ref, s_off, s_on = fresh_state(), fresh_state(), fresh_state()
    fusion.sgd_step(*ref); gpu_off.fn(*s_off); gpu_on.fn(*s_on)
    for got in (s_off, s_on):
        for g, r in zip(got[0], ref[0]):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    state = fresh_state()
    combo_result = bench.compare({"eager loop": lambda: fusion.sgd_step(*state),
                                  "_foreach_": lambda: fusion.sgd_step_foreach(*state),
                                  "compiled, combo off": lambda: gpu_off.fn(*state),
                                  "compiled, combo on": lambda: gpu_on.fn(*state)},
                                 baseline="eager loop", repeats=REPEATS, device=DEVICE)
    print(bench.table(combo_result))
    bench.save_json(combo_result, "../runs/02_horizontal_fusion_combo_gpu.json")
    bench.plot(combo_result, title=f"SGD step over {N_TENSORS} tensors on {DEVICE}").show()

# %% [markdown]
# ## What the numbers mean
#
# The summary below is printed from this run's measurements (nothing is typed in by hand):

# %%
r = step_result["results"]
eager_us = r["eager loop"]["median_s"] * 1e6
print(f"SGD step, {N_TENSORS} tensors on {DEVICE.type}, eager loop {eager_us:.0f} µs; ratio to it (higher is faster):")
for name, row in r.items():
    print(f"  {name:<28} {row['ratio_to_baseline']:5.1f}x  ({row['median_s'] * 1e6:.0f} µs)")
print(f"generated: hand-written step {len(sgd.kernel_functions)} kernel function(s), {sgd.loop_kernels} loop kernels; "
      f"compiled opt.step {len(step_info.kernel_functions)} kernel function(s), {step_info.loop_kernels} loop kernels")
if sweep["fit"]:
    f = sweep["fit"]
    print(f"per extra tiny op: eager chain {f['eager chain']['per_op_s'] * 1e6:.2f} µs, compiled chain "
          f"{f['compiled chain']['per_op_s'] * 1e6:.2f} µs; independent tensors: eager "
          f"{f['eager independent']['per_op_s'] * 1e6:.2f} µs, compiled {f['compiled independent']['per_op_s'] * 1e6:.2f} µs")
one = {name: ys[0] for name, ys in sweep["median_s"].items()}
print(f"one tiny op (n={sweep['counts'][0]}): compiled chain {one['compiled chain'] * 1e6:.1f} µs vs eager "
      f"{one['eager chain'] * 1e6:.1f} µs: compiled is {'slower' if one['compiled chain'] > one['eager chain'] else 'faster'} here")

# %% [markdown]
# - **Eager cost grows with the number of ops**, at a few microseconds each, whatever the op does
#   with 16 numbers: that is the per-op overhead. `_foreach_` removes most of it by handing a whole
#   list to one call.
# - **A compiled chain's cost hardly grows with n**: vertical fusion leaves one loop, and the call's
#   fixed cost (guards, wrapper) dominates. That fixed cost can be larger than one eager op: the last
#   line above says whether, for a single tiny op, compiled code was slower than eager on this machine.
# - **Independent tensors still cost something per tensor when compiled**, even though the work is
#   one function: Dynamo's guards check every input tensor and the wrapper handles each one. Much of
#   what remains of "launch overhead" in compiled code is this host-side work, not kernel launches
#   (pytorch#161783 and #150488 measured it on GPUs).
# - **`torch.optim` is the production case.** Its foreach step and its compiled step are the same
#   horizontal fusion as the hand-written versions: compare their rows above. The compiled step
#   lowers `_foreach_` ops to foreach kernels without any option.
# - **On a CPU, "horizontal fusion" means less than on a GPU.** The C++ backend puts independent loop
#   nests into one `cpp_fused_*` function, but they still run one after another: what it saves is the
#   per-call overhead (and, with more than one thread, separate OpenMP regions). On a GPU it means one
#   launch whose blocks run concurrently. So `combo_kernels` has nothing to do here. Machines differ
#   and this one is shared: compare the ratios, not the absolute times.
# - **What CUDA graphs remove beside fusion.** Fusion cuts the number of kernels and the bytes moved
#   between them. A CUDA graph keeps every kernel but records the sequence once and replays it with a
#   single `cudaGraphLaunch`, so the CPU no longer pays per kernel (the driver call, and Inductor's
#   Python wrapper code between launches), and the GPU does not wait for a CPU that falls behind
#   (PyTorch's CUDA notes, https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs, and
#   https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/). `torch.compile(mode="reduce-overhead")`
#   does this for compiled code (CUDA graph trees, `torch/_inductor/cudagraph_trees.py`). The price:
#   static shapes and memory addresses (inputs are copied into the graph's buffers), no CPU
#   synchronisation inside, more memory held. Dynamo's guards still run on every call, so a graph
#   does not remove the per-tensor guard cost seen in the sweep. The two combine: fuse first, then
#   graph what is left. On a CPU, `cpp_wrapper=True` (`TORCHINDUCTOR_CPP_WRAPPER=1`) is the nearest
#   thing: the wrapper that calls the kernels is generated in C++ instead of Python. Its row above ("compiled,
#   cpp_wrapper") shows what that changes for this step on this machine.
#
# ## What changes on other hardware
#
# - **NVIDIA/AMD GPUs**: every Triton kernel the wrapper calls is a separate launch. Kernels of
#   different tensors share no buffers and have different sizes, so without combo kernels Inductor
#   keeps them apart; with `combo_kernels=True` it launches independent kernels together, up to
#   8 kernels per combo kernel (fixed in 2.10, the option `combo_kernel_max_num_nodes` later). The two GPU sections above print the real kernel
#   counts and times. `mode="reduce-overhead"` (CUDA graphs) is the other tool against launch overhead.
#   The hand-written kernel's speed section times calls from Python (`bench.compare` waits for the
#   device at the end of each timed block): at these sizes that measures mostly the host side, Triton's
#   Python launcher binding arguments for each launch, which is what one launch instead of three
#   saves; per-kernel device time needs `torch.profiler` or CUDA events.
# - **Intel GPUs (XPU)** use Inductor's Triton backend too, and the combo-kernel grouping does not
#   exclude them; it skips only **MPS** and the CPU.
# - **Triton absent** (a CPU-only install without the `triton` extra): the hand-written kernel's
#   section prints that it was skipped and why; everything else runs. `pip install triton` adds it.
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
#   `config.cpp.min_chunk_size` = 512 elements per thread). A parallel loop nest is an OpenMP
#   `#pragma omp for`, which ends with a barrier: every thread waits for the slowest. On a shared or
#   oversubscribed machine (CI runners, Binder, a busy laptop) a descheduled thread stalls every
#   barrier, and the compiled step's time per call jumps by orders of magnitude in bursts (try
#   `THREADS = 2` on a busy 2-core machine and watch the spread column). Set the thread count *before* compiling: changing it afterwards makes
#   Dynamo recompile (`GLOBAL_STATE changed: num_threads`, visible with `TORCH_LOGS=recompiles`).
# - **`run_and_get_code` resets Dynamo** (`torch._dynamo.reset()`): functions compiled before it
#   recompile on their next call; Inductor's on-disk cache makes that fast.
#
# **What the 2.10 article gets wrong here**: it presents "combo-kernel horizontal fusion" as new in
# 2.10 and working "on all supported hardware platforms". Combo kernels date from 2.5 (pytorch#124969),
# are off by default and experimental in 2.10, and apply only to Triton-generated GPU code: on a CPU
# the setting changes nothing (shown above), because the C++ backend already groups independent loops
# into one function.
