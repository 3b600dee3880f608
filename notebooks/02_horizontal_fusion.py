# %% [markdown]
# # 02 · Horizontal fusion and combo kernels: fewer launches, less overhead
#
# | | |
# |---|---|
# | **What you will learn** | why many small operations are slow; vertical vs horizontal fusion, read with Inductor's own tools (`TORCH_LOGS`, `TORCH_COMPILE_DEBUG`); the production case: `_foreach_` and a compiled `optimizer.step`; what `combo_kernels` does (GPU only, off by default) and which of its two dispatch schemes Inductor picks |
# | **Prerequisites** | lesson 00; basic `torch.compile` |
# | **Hardware** | any CPU with a C++ compiler (Inductor's CPU backend compiles C++); combo kernels on a GPU are measured in the deep dive |
# | **Time** | 43 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the config names and the dispatch rule were read in the 2.10.0 and 2.13.0 wheels (`torch/_inductor/config.py`, `torch/_inductor/codegen/triton_combo_kernel.py`), and cells print them from the torch you run; combo kernels came in 2.5: foreach cases in pytorch#124969, the automatic horizontal fusion that `combo_kernels=True` turns on in #131675 (relanded as #133291) |
#
# The story: many small ops cost a trip each → fusion removes trips (vertical and horizontal) → the
# optimizer step, where it matters most → combo kernels, horizontal fusion of GPU launches.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/02_horizontal_fusion.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
N_TENSORS = 30         # tensors in the optimizer step
BASE_SIZE = 1024       # elements of the first tensor; tensor i has BASE_SIZE + 37*i
THREADS = 1            # CPU threads for everything compiled and timed here

# %%
import contextlib
import io
import tempfile

import torch

from helpers import bench, fusion
from helpers.device import pick_device, quick_mode
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.set_num_threads(THREADS)   # before any compile: the thread count is part of what Dynamo guards
if QUICK:
    N_TENSORS, BASE_SIZE = 6, 256
REPEATS, MIN_RUN_S = (3, 0.05) if QUICK else (7, 0.2)   # timing repeats, seconds per repeat
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · quick mode: {QUICK} · CPU threads: {THREADS}")


def fresh_state():
    """params, grads, momentum buffers: N_TENSORS ragged 1-D tensors, like a small model's parameters."""
    return fusion.make_sgd_state(N_TENSORS, BASE_SIZE, device=DEVICE, seed=1)


# %% [markdown]
# ## Many small operations: the overhead story
#
# In eager mode every operation is a separate trip: Python → dispatcher → kernel (on a GPU, a kernel
# *launch*). For a tensor of a few thousand numbers the arithmetic takes less than the trip. An
# optimizer step is the classic case: SGD with momentum is five small ops per parameter
# (`fusion.sgd_step`), so a model with many parameters makes many trips. `torch._foreach_*` ops
# (`fusion.sgd_step_foreach`, what `torch.optim.SGD(foreach=True)` runs) take the whole list in one
# call: four calls per step. Lesson 00 timed one `add_`; here is a whole update.

# %% tags=["predict"]
loop_calls = 5 * N_TENSORS
foreach_guess = predict(f"The eager loop makes {loop_calls} small calls, _foreach_ makes 4. How many times "
                        f"faster is the _foreach_ step here?", unit="x", example=5.0)

# %%
state = fresh_state()
eager_result = bench.compare({"eager loop": lambda: fusion.sgd_step(*state),
                              "_foreach_": lambda: fusion.sgd_step_foreach(*state)},
                             baseline="eager loop", repeats=REPEATS, min_run_time=MIN_RUN_S, device=DEVICE)
print(bench.table(eager_result))

# %% tags=["reveal"]
loop_s = eager_result["results"]["eager loop"]["median_s"]
foreach_ratio = eager_result["results"]["_foreach_"]["ratio_to_baseline"]
foreach_lo, foreach_hi = bench.speedup_range(eager_result["results"], "eager loop", "_foreach_")
reveal(foreach_guess, foreach_ratio,
       why=f"the loop costs {loop_s / loop_calls * 1e6:.1f} µs per call, most of it the trip, not the "
           f"arithmetic on ~{BASE_SIZE} numbers. _foreach_ pays 4 trips; on a CPU it still walks the "
           "tensors one by one in C++, on a GPU it packs many tensors into each launch. "
           f"Over the repeats _foreach_ ran at {foreach_lo:.2f}x to {foreach_hi:.2f}x the loop's speed"
           + ("." if bench.separated(eager_result, "eager loop", "_foreach_") else
              f": the spreads overlap, {bench.NOISY}."));


# %% [markdown]
# ## Fusion, seen with Inductor's own tools
#
# `torch.compile` removes trips by *fusing* operations into generated kernels (C++ functions
# `cpp_fused_*` on a CPU, Triton kernels on a GPU):
#
# - **vertical fusion**: a chain (`b` reads what `a` wrote) becomes one loop; the intermediate never
#   goes to memory;
# - **horizontal fusion**: independent operations share one kernel, so one trip does both.
#
# Three standard tools show what Inductor did; each works from the command line too:
#
# | Tool | In a script | In this notebook |
# |---|---|---|
# | logs | `TORCH_LOGS="output_code,fusion" python train.py` | `torch._logging.set_logs(output_code=True, fusion=True)` |
# | debug dump | `TORCH_COMPILE_DEBUG=1` (files under `./torch_compile_debug/`) | compile options `trace.enabled` (what that variable sets in `torch/_inductor/config.py`) and `trace.debug_dir` |
# | profiler | `torch.profiler.profile` | the same (in the deep dive) |
#
# Words: **Dynamo** captures your Python into a graph (and **guards** check, at each call, that the graph
# still applies); **AOTAutograd** traces it to ATen ops (and the backward); **Inductor** lowers those ops to
# IR nodes, which its **scheduler** fuses, then generates C++ or Triton code for them.
#
# The debug dump holds `ir_pre_fusion.txt` and `ir_post_fusion.txt`: the scheduler's nodes before and
# after it fused them. A compile served from Inductor's FX graph cache skips the scheduler and logs
# nothing, so these compiles turn that cache off.

# %%
def compile_with_tools(fn, *args):
    """Compile and run fn once with TORCH_LOGS="output_code,fusion" and TORCH_COMPILE_DEBUG=1's files."""
    debug_dir, log = tempfile.mkdtemp(prefix="inductor_debug_"), io.StringIO()
    with contextlib.redirect_stderr(log):                            # torch's log handlers write to stderr
        torch._logging.set_logs(output_code=True, fusion=True)       # = TORCH_LOGS="output_code,fusion"
        compiled = torch.compile(fn, options={"fx_graph_cache": False,            # a cache hit skips the scheduler
                                              "trace.enabled": True, "trace.debug_dir": debug_dir})
        result = compiled(*args)
    torch._logging.set_logs()                                        # back to the defaults
    nodes = {when: fusion.scheduler_nodes(fusion.debug_trace_file(debug_dir, f"ir_{when}_fusion.txt"))
             for when in ("pre", "post")}
    return result, log.getvalue(), nodes


# %% tags=["predict"]
def pair(a, b):             # two independent pointwise ops
    return a.sin(), b.cos()


a, b = torch.randn(4096), torch.randn(4096)   # on the CPU on every machine, so the answer is the same everywhere
kernel_guess = predict("How many generated kernel functions (cpp_fused_*) will Inductor emit on the CPU for "
                       "pair(a, b) = (a.sin(), b.cos())?", options=["1", "2"], example="2")

# %%
pair_out, pair_log, pair_nodes = compile_with_tools(pair, a, b)
fusion_log = fusion.torch_log_lines(pair_log, "fusion")
pair_code = "\n".join(fusion.torch_log_lines(pair_log, "output_code"))
print(f'TORCH_LOGS="fusion" printed {len(fusion_log)} lines; the first round:')
for line in fusion_log[:6]:
    print("   ", line if len(line) < 100 else line[:97] + "...")
print("ir_pre_fusion.txt: ", pair_nodes["pre"])
print("ir_post_fusion.txt:", pair_nodes["post"])
print('TORCH_LOGS="output_code": kernels', fusion.kernel_functions(pair_code), "called as",
      fusion.wrapper_calls(pair_code))

# %% tags=["reveal"]
n_functions = len(fusion.kernel_functions(pair_code))
reveal(kernel_guess, str(n_functions),
       why=f"the scheduler found no fusion (the nodes share no buffer: {len(pair_nodes['post'])} nodes after "
           f"fusion), yet the C++ backend put consecutive loop nests into one function: "
           f"{n_functions} function, {len(pair_nodes['post'])} loops. On a GPU each node would be its own "
           "Triton kernel, a launch each.");


# %% [markdown]
# What makes the *scheduler* fuse: a chain, which lowering already turns into one node (vertical), and
# nodes that read the same buffer (horizontal: `y.sin()` and `y.cos()` load `y` once):

# %%
def mixed(x, y):
    return (x * 2 + 1).relu(), y.sin(), y.cos()


x, y = torch.randn(4096), torch.randn(4096)
mixed_out, _, mixed_nodes = compile_with_tools(mixed, x, y)
print("ir_pre_fusion.txt: ", mixed_nodes["pre"])
print("ir_post_fusion.txt:", mixed_nodes["post"])

# %% tags=["nbval-check-output"]
for got, want in [*zip(pair_out, pair(a, b)), *zip(mixed_out, mixed(x, y))]:
    torch.testing.assert_close(got, want)
assert len(fusion.kernel_functions(pair_code)) == 1, "one cpp_fused function for the independent pair"
assert len(pair_nodes["pre"]) == len(pair_nodes["post"]) == 2, "no shared buffer: nothing for the scheduler to fuse"
assert len(mixed_nodes["pre"]) == 3 and len(mixed_nodes["post"]) == 2, "sin and cos of y fused into one node"
print("compiled == eager; pair: 2 nodes before and after fusion, 1 C++ function; mixed: 3 nodes, then 2")

# %% [markdown]
# ## The production case: `_foreach_` and a compiled `optimizer.step`
#
# Compiling the hand-written loop (`torch.compile(fusion.sgd_step)`) fuses each tensor's five ops
# vertically and, on the CPU, all tensors into one function. What training really runs is `torch.optim`.
# Compiled, its `foreach` step lowers each `_foreach_` op to a **foreach kernel** node
# (`ForeachKernelSchedulerNode` in `torch/_inductor/scheduler.py`) that combines the tensors
# horizontally, without any option. PyTorch's recipe
# (https://docs.pytorch.org/tutorials/recipes/compiling_optimizer.html) compiles a function that calls
# `opt.step()` and warms it up with five calls; we take one eager step first instead, which creates the
# momentum buffers (the deep dive shows why a compiled first step compiles twice).

# %%
sgd = fusion.inspect_compiled(fusion.sgd_step, *fresh_state())   # compiles, and runs one step
opt_state = fresh_state()
optimizers = {foreach: fusion.sgd_optimizer(opt_state[0], opt_state[1], foreach=foreach)[0] for foreach in (False, True)}
opt_compiled, _ = fusion.sgd_optimizer(opt_state[0], opt_state[1], foreach=True)
opt_compiled.step()                                          # eager first step: creates the momentum buffers
step_info = fusion.inspect_compiled(opt_compiled.step)       # compiles, and runs step 2
for name, info in {"compiled sgd_step": sgd, "compiled opt.step": step_info}.items():
    print(f"{name}: {len(info.kernel_functions)} kernel function(s) holding {info.loop_kernels} loop nests, "
          f"first call (compile included) {info.compile_s:.1f} s")

# %% tags=["nbval-check-output"]
ref, fe, co = fresh_state(), fresh_state(), fresh_state()
for _ in range(3):
    fusion.sgd_step(*ref)
    fusion.sgd_step_foreach(*fe)
    sgd.fn(*co)
    for opt in optimizers.values():
        opt.step()
step_info.fn()                                               # step 3 of the compiled optimizer
for got in (fe, co):
    for got_list, ref_list in zip(got, ref):
        for g, r in zip(got_list, ref_list):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
for opt in (*optimizers.values(), opt_compiled):
    for p, r in zip(opt.param_groups[0]["params"], ref[0]):
        torch.testing.assert_close(p.detach(), r, rtol=1e-5, atol=1e-6)
if DEVICE.type == "cpu":
    assert len(sgd.kernel_functions) == len(step_info.kernel_functions) == 1, "one cpp_fused function each"
    assert sgd.loop_kernels == N_TENSORS, "one loop nest per tensor inside it"
print("eager loop == _foreach_ == compiled == torch.optim (loop, foreach, compiled step) after 3 steps")

# %% [markdown]
# The time, hand-written and `torch.optim` side by side:

# %%
state = fresh_state()
step_result = bench.compare({"eager loop": lambda: fusion.sgd_step(*state),
                             "_foreach_": lambda: fusion.sgd_step_foreach(*state),
                             "compiled sgd_step": lambda: sgd.fn(*state),
                             "torch.optim, foreach=False": optimizers[False].step,
                             "torch.optim, foreach=True": optimizers[True].step,
                             "torch.optim, compiled step": step_info.fn},
                            baseline="eager loop", repeats=REPEATS, min_run_time=MIN_RUN_S, device=DEVICE)
print(bench.table(step_result))
bench.save_json(step_result, "../runs/02_horizontal_fusion_sgd.json")
bench.plot(step_result, title=f"SGD-momentum step over {N_TENSORS} tensors ({DEVICE.type})").show()

# %% [markdown]
# A compiled step that comes out *slower* than the eager loop here is paying its fixed cost per call (the
# guard check and the wrappers; the deep dive's profiler names them) on a step of only a few small
# tensors; the cost stays the same as the model grows while the trips it saves grow with it, and on a GPU
# each trip saved is a launch.
# On a CPU the generated function still runs the tensors' loops one after another: horizontal fusion
# saves the trips, not the work. On a GPU the compiled `sgd_step` becomes one Triton kernel per tensor, a
# launch each (the compiled `torch.optim` step fewer: its foreach kernels already pack many tensors into
# each kernel): the gap that combo kernels close.
#
# ## Combo kernels: horizontal fusion of GPU launches
#
# `torch._inductor.config.combo_kernels = True` (added in 2.5, pytorch#124969 and #131675; still off by
# default and marked "(Experimental)" in 2.10's `config.py`) merges up to 8 *independent Triton kernels*
# into one launch (8 is hard-coded in 2.10's `scheduler.py`, the option `combo_kernel_max_num_nodes`
# in later releases). The scheduler's grouping skips CPU and MPS nodes outright
# (`_default_group_nodes_for_combo_kernels` in `torch/_inductor/scheduler.py`), so on a CPU the option
# changes nothing (the deep dive checks it).

# %% [markdown]
# ### One launch, two ways to share it out
#
# In a combo kernel every program reads its id and works out which sub-kernel it serves
# (`ComboKernel.SequentialDispatch` and `RoundRobinDispatch` in
# `torch/_inductor/codegen/triton_combo_kernel.py`, paraphrasing their docstrings):
#
# ```
# sequential:   grid = sum of the blocks each part needs       round-robin: grid = N parts x (largest part's blocks)
#   part 0 owns programs [0, end0), part 1 [end0, end1), ...     program pid runs part pid % N, block pid // N
#   no program idle; the parts run roughly one after another     parts interleaved; smaller parts get idle programs
# ```
#
# The rule, as the installed Inductor has it (on 2.13 a third scheme appears first, used only with
# `combo_kernel_per_subkernel_blocks`, off by default, added after 2.10 in pytorch#172527):

# %%
import inspect

from torch._inductor.codegen.triton_combo_kernel import ComboKernel

print(inspect.getsource(ComboKernel.select_dispatch_strategy))

# %% [markdown]
# `mixed_sizes` is true for the combo kernels `combo_kernels=True` makes and false for foreach kernels,
# which always dispatch sequentially. So round-robin needs the parts' sizes to be close: their sum
# over (the largest × their number) above 0.8, in that file. The SGD step on a GPU is one kernel per
# tensor, in groups of 8.

# %% tags=["predict"]
sizes = [p.numel() for p in fresh_state()[0]]
groups = fusion.combo_groups(sizes)
dispatch_guess = predict(f"Which dispatch will Inductor pick for the first group of {len(groups[0])} kernels, "
                         f"sizes {groups[0][0]}..{groups[0][-1]}?", options=["sequential", "round_robin"],
                         example="round_robin")

# %% tags=["reveal"]
for group in groups:
    print(f"{len(group)} kernels of {group[0]}..{group[-1]} elements: utilization "
          f"{fusion.combo_utilization(group):.2f} -> {fusion.inductor_combo_dispatch_strategy(group)}")
print("\nthe dispatch lines the installed Inductor writes for the first group:")
print(fusion.inductor_dispatch_code(groups[0], show=2))
first = groups[0]
reveal(dispatch_guess, fusion.inductor_combo_dispatch_strategy(first),
       why=f"sum {sum(first)} / ({max(first)} x {len(first)}) = {fusion.combo_utilization(first):.2f}, against "
           "the bar of 0.8: " + ("above it, round-robin's idle programs are few enough to run the parts side by side."
                                 if fusion.combo_utilization(first) > 0.8 else "below it, round-robin would leave "
                                 "too many programs idle, so the parts run one after another.")
           + " Quick mode's smaller tensors give other sizes, and maybe the other answer.");

# %% [markdown]
# ### Your turn: flip the dispatch
#
# Four kernels, three large and one small: Inductor dispatches them sequentially. Change **one** size so
# that it picks round-robin, then run the check.

# %% tags=["your-turn"]
START_GROUP = [4096, 4096, 4096, 512]
my_group = [4096, 4096, 4096, 512]      # change one number

# %%
from helpers.checks import check_equal, fail, your_turn


def check_group():
    changed = sum(m != s for m, s in zip(my_group, START_GROUP))
    if len(my_group) != len(START_GROUP) or changed != 1:
        fail("my_group", f"{changed} of the sizes changed (or the length did)", "keep four sizes; change exactly one")
    check_equal(fusion.inductor_combo_dispatch_strategy(my_group), "round_robin", what="Inductor's dispatch for my_group",
                hint=f"utilization is {fusion.combo_utilization(my_group):.2f}; round-robin needs more than 0.8 "
                     "(what if the small one grew? what if a large one grew instead?)")


your_turn(check_group, what="flip the dispatch");

# %% [markdown]
# **What the 2.10 article gets wrong**: it presents "combo-kernel horizontal fusion" as new in 2.10 and
# working "on all supported hardware platforms". Combo kernels date from 2.5 (pytorch#124969), are off by
# default and experimental in 2.10, and apply only to Triton-generated GPU code: on a CPU the setting
# changes nothing (the deep dive shows it), because the C++ backend already groups independent loops
# into one function.
#
# ## Going further
#
# [The deep dive](02_horizontal_fusion_deep_dive.ipynb) holds the rest, for whoever tunes compiled code
# or writes kernels: reading generated code and the C++ backend's limits; why a compiled first optimizer
# step compiles twice; what a compiled call dispatches (`torch.profiler`); the overhead model (time
# against the number of tiny ops); `cpp_wrapper` and CUDA graphs (`mode="reduce-overhead"`); Inductor's
# combo kernels off vs on, on a CPU and timed on a GPU; a combo kernel written by hand in Triton; and the
# pitfalls. Then [lab 02](../labs/02_fusion_lab.ipynb): write a combo kernel's grid and dispatch
# yourself, and predict kernel counts.
