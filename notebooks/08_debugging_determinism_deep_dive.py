# %% [markdown]
# # 08 · Deep dive: debugging and determinism
#
# | | |
# |---|---|
# | **What you will learn** | DebugMode as its 2.10 recipe uses it: a trace op by op, module names, input hashes, `check_hash_mismatches`, how far each op moved, what equal hashes do not prove; the NaN gradient fixed with `torch.linalg.vector_norm`; eager vs compiled op by op (`aot_eager`, then Inductor) and CPU vs GPU; deterministic compile on a GPU (atomic adds, Triton reduction configurations) and the switch that makes a compiled scatter-add reproducible on a CPU; what the thread count does to a sum's bits and to Dynamo's guards; three ways to mark a dynamic batch, batch 1 included, and a marked size out of range; TorchScript's deprecation and `torch.export` (a dynamic batch, a branch on data with `torch.cond`, what `jit.trace` bakes in); what a 2-process gloo job reports for a mismatched collective and a timeout; what the debugging tools cost; the pitfalls |
# | **Prerequisites** | [lesson 08](08_debugging_determinism.ipynb) |
# | **Hardware** | any CPU with a C++ compiler (Inductor's CPU backend compiles C++). On a GPU two more sections run: the same model on the CPU and the GPU, and deterministic compile with Triton |
# | **Time** | 83 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); 2.10 facts from its release notes and sources (`torch/utils/_debug_mode`, `torch/_inductor`) |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/08_debugging_determinism_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, fewer distributed runs (papermill: -p QUICK True)
WIDTH = 64

# %%
import contextlib
import copy
import io
import logging
import os
import tempfile
import warnings

import plotly.graph_objects as go
import torch
from torch import nn
from torch.utils._debug_mode import DebugMode

from helpers import bench, debugging
from helpers.device import pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · quick={QUICK}")

# the core lesson's case: block 2's Linear went through bf16
net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(4)], nn.Linear(WIDTH, 1))
damaged = copy.deepcopy(net)
with torch.no_grad():
    damaged[2][0].weight.copy_(damaged[2][0].weight.bfloat16().float())
xb = torch.randn(16, WIDTH)
trace_good = debugging.hash_trace(net, xb, hash_fn="hash_tensor")
norm_good, norm_bad = debugging.hash_trace(net, xb), debugging.hash_trace(damaged, xb)

# %% [markdown]
# ## DebugMode as its recipe uses it
#
# What DebugMode records for a small model (`debugging.op_trace`): every aten op it dispatches, with the
# shapes and dtypes of its inputs and outputs.

# %% tags=["nbval-check-output"]
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
print(debugging.op_trace(model, torch.randn(4, 8)))


# %% [markdown]
# The core lesson read DebugMode through two helpers. DebugMode itself (the recipe is pytorch/tutorials
# `recipes_source/debug_mode_tutorial.py`) does more in one run:
#
# - `record_nn_module=True` writes a `[nn.Mod] name` line when each module's forward starts, so the trace
#   names the layer of every op;
# - `log_tensor_hashes(hash_inputs=True)` hashes the inputs of each op too, before it runs (so an in-place
#   op cannot hide what it was given);
# - `DebugMode.check_hash_mismatches(logs1, logs2, compare_inputs=...)` (in 2.10's
#   `torch/utils/_debug_mode.py`) compares two runs' `mode.logs`: it raises when the runs dispatched
#   different ops, and returns every mismatch, where `debugging.first_divergence` returns the first;
# - `record_stack_trace=True` keeps the Python stack of every op (`debug_string(show_stack_trace=True)`).

# %%
def debug_run(model):
    with DebugMode(record_nn_module=True) as mode, DebugMode.log_tensor_hashes(hash_fn="hash_tensor", hash_inputs=True):
        model(xb)
    return mode

mode_good, mode_bad = debug_run(net), debug_run(damaged)
lines = mode_bad.debug_string().splitlines()
start = next(i for i, line in enumerate(lines) if line.strip().endswith(".2.0") and "[nn.Mod]" in line)
print("the damaged run's trace around block 2 (hashes cut):")
for line in lines[start - 1: start + 4]:
    print("   ", line.strip()[:110])

# %% tags=["nbval-check-output"]
outputs = DebugMode.check_hash_mismatches(mode_good.logs, mode_bad.logs)
both = DebugMode.check_hash_mismatches(mode_good.logs, mode_bad.logs, compare_inputs=True)
print(f"{len(outputs)} ops whose outputs differ:", [m["call"] for m in outputs])
first_input = next(m for m in both if m["is_input_hash"])
print(f"the first differing input: argument {first_input['pytree_path']} of {first_input['call']} (the weight)")
assert outputs[0]["call"] == "aten::t" and first_input["call"] == "aten::t"

# %% [markdown]
# Block 3's and the output layer's `aten::t` are not in the list: their weights are the same in both runs.
# With input hashes the first mismatch is the weight itself, given to `aten::t`: the checkpoint, not the
# computation, differs. The "norm" hash tells how far each op moved: bitwise equal before the damaged layer,
# then a difference that flows through the rest of the network.

# %%
rel = [max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ha, hb)) for (_, ha), (_, hb) in zip(norm_good, norm_bad)]
fig = go.Figure(go.Bar(x=[f"{i}: {name.replace('aten.', '').replace('.default', '')}" for i, (name, _) in enumerate(norm_good)],
                       y=[max(r, 1e-12) for r in rel]))
fig.update_layout(title="Relative difference of the 'norm' hash per op (damaged vs original checkpoint)",
                  yaxis_type="log", yaxis_title="relative difference (floored at 1e-12)", height=380)
fig.show()


# %% [markdown]
# Read a hash one way only: a different hash means different bits, equal hashes do not prove equal bits.
# An XOR ignores order and cancels equal pairs, so permuted or duplicated values collide (the next cell; the
# DebugMode tutorial warns that tensors whose elements are all equal hash to 0). Use the hash to find the
# op, then compare the tensors themselves. `hash_fn="norm"` (the default, an L1 norm in float64) moves a
# little when values move a little: it says by how much, where `hash_tensor` says whether.

# %% tags=["nbval-check-output"]
def xor_hash(values):
    return torch.hash_tensor(torch.tensor(values)).item()

print("[1, 2, 3] and [3, 2, 1] hash alike:", xor_hash([1.0, 2.0, 3.0]) == xor_hash([3.0, 2.0, 1.0]))
print("[5, 5] hashes to", xor_hash([5.0, 5.0]), "and [7, 7] to", xor_hash([7.0, 7.0]))

# %% [markdown]
# ## A NaN gradient: the fix, checked
#
# The core lesson's pairwise distances, `sqrt(sum((a - b)**2))`, had a NaN gradient where two points
# coincide. `torch.linalg.vector_norm` defines the gradient at zero (as 0):

# %% tags=["nbval-check-output"]
points = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]], requires_grad=True)   # the core lesson's points
loss = (points[:, None, :] - points[None, :, :]).pow(2).sum(-1).sqrt().sum()      # its loss: a NaN gradient


def safe_distance_loss():
    diff = points[:, None, :] - points[None, :, :]
    return torch.linalg.vector_norm(diff, dim=-1).sum()

points.grad = None
safe_distance_loss().backward()
assert not torch.isnan(points.grad).any()
print("torch.linalg.vector_norm: same loss", torch.isclose(safe_distance_loss(), loss).item(),
      "| NaN in grad:", torch.isnan(points.grad).any().item())

# %% [markdown]
# ## Eager vs compiled: where does `torch.compile` change the bits?
#
# Bisect by backend. `backend="aot_eager"` captures the graph with Dynamo and AOTAutograd but runs the same
# aten kernels as eager: DebugMode sees every op, and every hash should match. Inductor generates code: on a
# CPU, DebugMode sees only the ops that code calls out to (the matmuls, `aten.addmm.out`), not the GELU
# kernels Inductor writes in C++. Comparing the matmuls one by one still brackets where the bits change.
#
# On a GPU, DebugMode also logs each Triton kernel Inductor launches, with hashes of its outputs
# (`record_triton_kernel` and `post_hashes` in `torch/utils/_debug_mode.py`). `debugging.hash_trace` keeps
# aten ops only; `DebugMode.check_hash_mismatches(mode.logs, ...)` compares the kernels too, so use it to name
# the first Triton kernel that differs.

# %% tags=["nbval-check-output"]
torch._dynamo.reset()
aot = torch.compile(net, backend="aot_eager")
aot(xb)                                                    # compile outside the trace
trace_aot = debugging.hash_trace(aot, xb, hash_fn="hash_tensor")
print("aot_eager: same ops as eager:", [n for n, _ in trace_aot] == [n for n, _ in trace_good],
      "| first bitwise difference:", debugging.first_divergence(trace_good, trace_aot))

# %% tags=["predict"]
MM_OPTIONS = ["all 5", "only the first", "none"]
mm_guess = predict("Compiled by Inductor, the net's 5 matmuls stay calls to aten's addmm and its 4 GELUs become "
                   "generated C++. Which matmuls' outputs will be bitwise equal to eager's?",
                   options=MM_OPTIONS, example="all 5")

# %%
from torch._inductor.utils import run_and_get_code

torch._dynamo.reset()
compiled_net = torch.compile(net)                          # Inductor: each GELU goes into a generated C++ kernel
_, generated = run_and_get_code(compiled_net, xb)          # one Inductor compile (seconds), and its source code
eager_mm = [h for op, h in trace_good if "addmm" in op]
compiled_mm = [h for op, h in debugging.hash_trace(compiled_net, xb, hash_fn="hash_tensor") if "addmm" in op]
print("matmuls DebugMode sees, eager / Inductor:", len(eager_mm), "/", len(compiled_mm))
same_bits = [a == b for a, b in zip(eager_mm, compiled_mm)]
print("bitwise equal, matmul by matmul:", same_bits)
print("max |Inductor - eager| of the output:", (compiled_net(xb) - net(xb)).abs().max().item())

# %% tags=["reveal"]
source = "\n".join(generated)
agree = next((i for i, same in enumerate(same_bits) if not same), len(same_bits))   # matmuls equal before the first change
erf_line = next((line.strip() for line in source.splitlines() if "erf()" in line), "none")
reveal(mm_guess, "all 5" if agree == 5 else "none" if agree == 0 else "only the first" if agree == 1
       else f"the first {agree}",
       why=f"equal bits, matmul by matmul: {same_bits}. The generated code calls `extern_kernels.addmm` "
           f"{source.count('extern_kernels.addmm(')} times: aten's own kernel, so a matmul fed the same input returns "
           "the same bits, and the first one reads the same x. Each GELU is Inductor's own C++: it writes out "
           f"the formula 0.5·x·(1 + erf(x/√2)) (a line of it: `{erf_line}`), vectorized its own way, and nothing "
           "makes that round exactly like eager's aten::gelu kernel. "
           + (f"Here it did not: a last-bit difference after GELU {agree} of 4 fed every later matmul, and the output "
              f"moved by {(compiled_net(xb) - net(xb)).abs().max().item():.1e}, rounding, not a bug. "
              if agree < len(same_bits) else "Here it did, so every matmul agreed. ")
           + "The bisection: aot_eager agrees, so the change is in Inductor's code generation; the first "
           "unequal matmul names the generated kernel just before it.");

# %% [markdown]
# ## The same model on a CPU and a GPU
#
# On a GPU the cell below compares every op's "norm" hash between the CPU run and the GPU run, with the
# state of TF32 (which lets fp32 matmuls round their inputs).

# %%
if requires("gpu", "fp64", section="CPU vs GPU divergence"):   # DebugMode hashes in float64 on the device
    gpu_trace = debugging.hash_trace(copy.deepcopy(net).to(DEVICE), xb.to(DEVICE))
    try:
        diffs = debugging.op_differences(norm_good, gpu_trace)
    except ValueError as exc:      # a GPU kernel may dispatch another decomposition: then no op-by-op view
        print("the GPU run dispatched other ops than the CPU run:", exc)
    else:
        for d in diffs:
            print(f"{d['index']:>3}  {d['op']:<32} relative difference of the norm hash {d['rel_diff']:.1e}")
        worst = max(diffs, key=lambda d: d["rel_diff"])
        print(f"largest: op {worst['index']} ({worst['op']}), {worst['rel_diff']:.1e}; fp32 matmuls on "
              f"{DEVICE.type} with TF32 {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
        print("every op within 1e-5 of the CPU: the devices sum in different orders, no op is wrong"
              if worst["rel_diff"] < 1e-5 else "an op differs by more than rounding: look at it first")


# %% [markdown]
# ## Deterministic compile on a GPU
#
# The core lesson showed the CPU side: with `torch.use_deterministic_algorithms(True)`, Inductor calls the
# deterministic `aten.index_put_` kernel instead of generating atomic adds (pytorch/pytorch#101105). On a
# GPU two more things decide a compiled program's bits:
#
# - **atomic adds** in generated Triton code: the order in which thousands of threads add into one address
#   changes from run to run, and float addition is not associative;
# - **autotuning**: a reduction's Triton configuration (block sizes, warps) decides the order of its sums,
#   and the autotuner may pick another one in another process. What 2.10 changed (#164905, #165950): with
#   the switch on, Inductor writes `are_deterministic_algorithms_enabled` into each generated kernel's
#   metadata (`torch/_inductor/codegen/triton.py`), and `filter_reduction_configs_for_determinism`
#   (`torch/_inductor/runtime/triton_heuristics.py` in the 2.10 wheel) then keeps one configuration, as
#   `TORCHINDUCTOR_DETERMINISTIC=1` makes it do, so a reduction's bits do not depend on the tuning run.
#
# cuBLAS needs `CUBLAS_WORKSPACE_CONFIG=:4096:8` (set before the first matmul) or deterministic mode raises.
# The cell below runs a compiled scatter-add ten times with the switch off and on and counts the distinct
# results; it has not run on a GPU in this project's CI: run it and see.

# %%
def scatter_add(x, idx, v):
    return x.index_put((idx,), v, accumulate=True)

if requires("triton_gpu", section="Deterministic compile on the GPU"):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    idx = torch.randint(0, 64, (1 << 20,), device=DEVICE, generator=gen)     # a million adds into 64 bins
    vals = torch.randn(1 << 20, device=DEVICE, generator=gen)
    target = torch.zeros(64, device=DEVICE)
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        try:
            code = debugging.inductor_code(scatter_add, target, idx, vals)       # compiles fresh
            fn = torch.compile(scatter_add)
            results = {fn(target, idx, vals).cpu().numpy().tobytes() for _ in range(10)}
        finally:
            torch.use_deterministic_algorithms(False)
        print(f"deterministic={deterministic!s:<5}: {len(results)} distinct result(s) in 10 runs | atomic adds in "
              f"the Triton code: {'atomic_add' in code} | calls aten.index_put_: {'aten.index_put_(' in code}")
        if deterministic:
            assert len(results) == 1, "deterministic mode gave different bits from run to run"


# %% [markdown]
# ## Your turn: a reproducible scatter-add on this CPU
#
# The same scatter-add, compiled for this CPU, adds a quarter of a million values into 64 bins from all the
# server's threads. In `reproducible_setup`, write what makes its result the same, bit for bit, in every run,
# at that thread count. People reach for `torch.manual_seed(0)`, `torch.backends.cudnn.deterministic = True`,
# `torch._inductor.config.deterministic = True` (what `TORCHINDUCTOR_DETERMINISTIC=1` sets),
# `torch.set_num_threads(1)` or `torch.use_deterministic_algorithms(True)`. The check compiles afresh, runs it
# ten times, reads the generated C++, and puts every setting back afterwards.

# %% tags=["your-turn"]
def reproducible_setup():
    torch.manual_seed(0)


# %%
import torch._inductor.config as inductor_config

from helpers.checks import fail, your_turn

SERVE_THREADS = max(2, torch.get_num_threads())            # the server's threads (2 on a 1-core machine)
gen = torch.Generator().manual_seed(0)
cpu_idx, cpu_vals = torch.randint(0, 64, (1 << 18,), generator=gen), torch.randn(1 << 18, generator=gen)


def check_reproducible():
    saved = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(), inductor_config.deterministic,
             torch.backends.cudnn.deterministic)
    torch.set_num_threads(SERVE_THREADS)
    try:
        reproducible_setup()
        used = torch.get_num_threads()
        torch._dynamo.reset()
        compiled = torch.compile(scatter_add)                # compiled afresh, under the setup
        code = "\n".join(run_and_get_code(compiled, torch.zeros(64), cpu_idx, cpu_vals)[1])
        runs = {compiled(torch.zeros(64), cpu_idx, cpu_vals).numpy().tobytes() for _ in range(10)}
        print(f"{used} thread(s): {len(runs)} distinct result(s) in 10 runs · atomic adds in the generated C++: "
              f"{'atomic_add' in code} · calls the aten.index_put_ kernel: {'aten.index_put_(' in code}")
        if used < SERVE_THREADS:
            fail("thread count", f"the setup left {used} thread(s), the server has {SERVE_THREADS}",
                 "one thread is reproducible and slow: keep the threads, change how the bins are summed")
        if len(runs) > 1 or "atomic_add" in code:
            fail("reproducible bits", f"{len(runs)} distinct result(s) in 10 runs; the code still adds atomically",
                 "the threads' atomic adds land in another order each run (no seed orders them, and cuDNN is not "
                 "on a CPU): which switch does index_put's lowering read (torch/_inductor/lowering.py)?")
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.set_num_threads(saved[1])
        inductor_config.deterministic, torch.backends.cudnn.deterministic = saved[2], saved[3]
        torch._dynamo.reset()


your_turn(check_reproducible, what="a reproducible compiled scatter-add");

# %% [markdown]
# Inductor lowers an accumulating `index_put` to the deterministic aten kernel only when
# `torch.are_deterministic_algorithms_enabled()` ("Fallback in torch deterministic mode" in
# `torch/_inductor/lowering.py`). `torch._inductor.config.deterministic` is another switch: "a deterministic
# mode that skips any on device benchmarking in Inductor if we know they affect numerics" (its comment in
# `torch/_inductor/config.py`), which leaves the atomic adds. And `use_deterministic_algorithms` is in
# Dynamo's global-state guard (`GlobalStateGuard` in `torch/csrc/dynamo/guards.cpp`), so flipping it
# recompiles instead of reusing the atomic graph.

# %% [markdown]
# ## The thread count: other bits, and a recompile
#
# `torch.use_deterministic_algorithms(True)` asks for algorithms that, "given the same input, and when run on
# the same software and hardware, always produce the same output" (its docstring). Is the number of CPU
# threads part of "the same"?

# %% tags=["predict"]
THREAD_OPTIONS = ["the same bits", "different bits", "an error: sum has no deterministic mode"]
sum_guess = predict("With torch.use_deterministic_algorithms(True), the sum of 4M float32 values at 1 thread and "
                    "at 2 threads. The two results have...", options=THREAD_OPTIONS, example="the same bits")

# %% tags=["reveal"]
values, threads = torch.randn(1 << 22, generator=torch.Generator().manual_seed(0)), torch.get_num_threads()
torch.use_deterministic_algorithms(True)
try:
    sums = {t: [] for t in (1, 2)}
    for t in (1, 2, 1, 2):                                  # each thread count twice
        torch.set_num_threads(t)
        sums[t].append(values.sum().item())
    outcome = "the same bits" if sums[1][0] == sums[2][0] else "different bits"
except RuntimeError as exc:
    sums, outcome = {}, "an error: sum has no deterministic mode"
    print(exc)
finally:
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)
print({f"{t} thread(s)": [float.hex(v) for v in vs] for t, vs in sums.items()})
reveal(sum_guess, outcome,
       why=f"1 thread: {sums[1][0]!r}, 2 threads: {sums[2][0]!r}; each count twice gave "
           f"{'the same bits both times' if sums[1][0] == sums[1][1] and sums[2][0] == sums[2][1] else 'two results'}. "
           "At 1 thread the reduction runs serially; at 2, TensorIterator's parallel_reduce (two_pass_reduction in "
           "aten/src/ATen/native/TensorIteratorReduce.cpp) gives each thread a chunk and a partial sum, then adds "
           "the partials: another order of additions, and float addition is not associative. Deterministic mode "
           "promises the same bits run after run on the same setting, and the thread count is part of the setting. "
           "Dynamo treats it so too: it guards on it." if sums else "see the error above.");

# %% [markdown]
# The thread count is in the same `GlobalStateGuard`. A benchmark harness that times at another thread count (`torch.utils.benchmark.Timer` defaults to **one**
# thread) recompiles:

# %% tags=["nbval-check-output"]
torch._dynamo.reset()
f = torch.compile(lambda a: torch.sin(a) + 1, backend="eager")
a = torch.randn(32)
threads = torch.get_num_threads()
f(a)

def time_at_other_threads():
    torch.set_num_threads(1 if threads > 1 else 2)
    f(a)
    torch.set_num_threads(threads)

reasons = debugging.count_recompiles(time_at_other_threads)
print("recompiles after changing the thread count:", len(reasons))
print(reasons[0].splitlines()[-1].strip())
print("same thread count again:", len(debugging.count_recompiles(lambda: f(a))), "recompiles")

# %% [markdown]
# To avoid it: compile and warm up at the thread count you will time with, and give the timer that count
# (`helpers.bench.compare` passes `torch.get_num_threads()` to every `Timer`).
#
# ## Three ways to mark a dynamic batch
#
# Batch sizes that vary at run time, from 1 up, are where a `fail_on_recompile` test fails first. Dynamo
# *specialises* sizes 0 and 1 and guards that a dynamic size is at least 2. Three markings of dimension 0:
#
# - `mark_dynamic(t, 0, min=1, max=512)` promises a dynamic dimension; when the batch of 1 arrives, Dynamo
#   specialises it anyway, and a promise broken is a `ConstraintViolationError` (the core lesson);
# - `maybe_mark_dynamic(t, 0)` is a hint: no error, but batch 1 gets its own graph (one recompile);
# - `torch._dynamo.decorators.mark_unbacked(t, 0)` makes the size a symbol with no value Dynamo may look at
#   (as if it came from data), so nothing specialises on 0 or 1: one graph for every size. The price: code
#   that branches on the size cannot be traced, and Inductor tunes for a size it does not know.

# %% tags=["nbval-check-output"]
w_out = torch.randn(16, 3)
scores = torch.compile(lambda b: torch.softmax(b @ w_out, dim=-1).mean(0), backend="eager")
sizes = (32, 7, 1, 512)
markings = {
    "mark_dynamic(min=1, max=512)": lambda t: torch._dynamo.mark_dynamic(t, 0, min=1, max=512),
    "maybe_mark_dynamic": lambda t: torch._dynamo.maybe_mark_dynamic(t, 0),
    "mark_unbacked": lambda t: torch._dynamo.decorators.mark_unbacked(t, 0),
}

def marked_batches(mark):
    for n in sizes:
        t = torch.randn(n, 16)
        mark(t)
        assert torch.allclose(scores(t), torch.softmax(t @ w_out, dim=-1).mean(0))

guards_log = logging.getLogger("torch._guards")
for name, mark in markings.items():
    torch._dynamo.reset()
    level = guards_log.level
    guards_log.setLevel(logging.CRITICAL)                     # the failing guard is logged at length
    try:
        found = debugging.count_recompiles(lambda: marked_batches(mark))
        print(f"{name:<29} sizes {sizes}: {len(found)} recompile(s)")
        for r in found:                                        # the guard that failed, without the source line
            print(f"{'':<31}because of the guard {r.splitlines()[-1].split('#')[0].strip(' -')}")
    except Exception as exc:
        lines = str(exc).splitlines()
        promised = [line.strip() for line in lines if "You marked" in line]
        print(f"{name:<29} sizes {sizes}: {type(exc).__name__}: {lines[0]}")
        for sentence in (promised[0].strip(" -").split(". ")[:2] if promised else []):
            print(f"{'':<31}{sentence.rstrip('.')}.")
    finally:
        guards_log.setLevel(level)

# %% [markdown]
# Bounds that leave batch 1 out keep one graph, and a marked size outside them is an error (the core
# lesson's compiled function, set up again: a backend that counts the graphs Dynamo hands it):

# %% tags=["nbval-check-output"]
graphs = []

def counting_backend(graph_module, example_inputs):     # a torch.compile backend: called once per graph
    graphs.append(graph_module)
    return graph_module.forward

def fresh_compile():
    torch._dynamo.reset()
    graphs.clear()
    return torch.compile(lambda b: torch.softmax(b @ w_out, dim=-1).mean(0), backend=counting_backend)

def marked(n, low, high):
    t = torch.randn(n, 16)
    torch._dynamo.mark_dynamic(t, 0, min=low, max=high)    # dimension 0 is dynamic, within [low, high]
    return t

compiled = fresh_compile()
for n in range(2, 9):
    compiled(marked(n, 2, 8))
print("batches 2..8, mark_dynamic(min=2, max=8):", len(graphs), "graph")
try:
    compiled(marked(9, 2, 8))
except Exception as exc:
    print("a marked batch of 9:", type(exc).__name__ + ":", str(exc).splitlines()[0])

# %% [markdown]
# ## TorchScript is deprecated: the warnings, and the move to `torch.export`
#
# Each `torch.jit` entry point warns. Which warning depends on the release: torch 2.10 and 2.13 raise a
# `DeprecationWarning`, which Python hides by default outside `__main__`, so most scripts never show it;
# 2.14 raises the same text as a `FutureWarning`, which is shown. The helper records warnings of every
# category, so the cell prints them whichever torch runs it.

# %%
small = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
example = torch.randn(2, 4)
with tempfile.TemporaryDirectory() as tmp:
    for line in debugging.torchscript_warnings(small, example, os.path.join(tmp, "small.pt")):
        print(line)

# %%
from torch.export import Dim

pinned = torch.export.export(small, (example,))                 # every dimension fixed to the example's
try:
    pinned.module()(torch.randn(5, 4))
    pinned_at_5 = "ran"
except Exception as exc:                                         # the pitfall: the batch was pinned to 2
    pinned_at_5 = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
# `input` is nn.Sequential.forward's parameter name; dimension 0 may be anything from 1 to 512
exported = torch.export.export(small, (example,), dynamic_shapes={"input": {0: Dim("batch", min=1, max=512)}})
with tempfile.TemporaryDirectory() as tmp:
    torch.export.save(exported, os.path.join(tmp, "small.pt2"))
    reloaded = torch.export.load(os.path.join(tmp, "small.pt2"))
    batches = [example] + [torch.randn(n, 4) for n in (1, 5, 512)]
    same = all(torch.allclose(reloaded.module()(b), small(b)) for b in batches)
    try:
        reloaded.module()(torch.randn(513, 4))
        at_513 = "ran"
    except Exception as exc:
        at_513 = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
print("exported without dynamic_shapes, called at batch 5:", pinned_at_5)
print("with dynamic_shapes, the range the graph assumes:", list(exported.range_constraints.values()))
print("with dynamic_shapes, called at batch 513:", at_513)
print(exported.graph_module.code.strip().splitlines()[0])

# %% tags=["nbval-check-output"]
print("torch.export round trip gives the same output at batch 2, 1, 5 and 512:", same)


# %% [markdown]
# `torch.jit.script` and `trace` point to `torch.compile` (to run faster in Python) or `torch.export` (to get
# a graph you can save and run elsewhere); `save`/`load` point to `torch.export` (`torch.export.save`/`load`,
# `.pt2` files). Exported programs run from Python, AOTInductor or ExecuTorch; a TorchScript `.pt` file still
# loads, with the warning.
#
# Without `dynamic_shapes`, export specialises every dimension to the example input, and the loaded program
# refuses any other batch with the guard it recorded (the first line printed above). `Dim("batch", min=1,
# max=512)` declares the range instead, and the program then runs at batch 1, 5 and 512: unlike
# `mark_dynamic` (the core lesson, and the markings above), export accepts 1 inside the range. A batch above
# the declared maximum fails the same way as the pinned export.
#
# For this module `torch.jit.trace` would have run at any batch: export is the stricter of the two. Where
# trace is wrong is code whose Python depends on a size or a value: trace runs the Python once and records
# the branch it took. Export refuses such code instead, and `torch.cond` writes the branch into the graph.

# %%
class OddPad(nn.Module):                      # a branch on a size
    def forward(self, x):
        if x.shape[0] % 2:                    # an odd batch: repeat the last row
            x = torch.cat([x, x[-1:]])
        return x.sum(1)

class Rescale(nn.Module):                     # a branch on the data
    def forward(self, x):
        if x.abs().max() > 1:
            return x / x.abs().max()
        return x

class RescaleCond(nn.Module):                 # the same, with the branch in the graph
    def forward(self, x):
        peak = x.abs().max()
        return torch.cond(peak > 1, lambda x, peak: x / peak, lambda x, peak: x.clone(), (x, peak))

def export_error(module, example, **kwargs):
    """What torch.export raises, in one line; None if it exports. (On failure export also prints the
    partial graph to stderr: kept out of the way here.)"""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            torch.export.export(module, (example,), **kwargs)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:80]}"
    return None

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    traced = torch.jit.trace(OddPad(), torch.randn(8, 4))              # traced at an even batch
odd = torch.randn(5, 4)
trace_shape, eager_shape = tuple(traced(odd).shape), tuple(OddPad()(odd).shape)
print(f"jit.trace at batch 8, called at 5: shape {trace_shape}, eager gives {eager_shape}; the trace warned:",
      sorted({w.category.__name__ for w in caught} - {"DeprecationWarning", "FutureWarning"}))
logging.getLogger("torch.fx.experimental.symbolic_shapes").setLevel(logging.ERROR)   # "Unable to find user code"
pad_error = export_error(OddPad(), torch.randn(8, 4), dynamic_shapes={"x": {0: Dim("batch", min=1, max=512)}})
print("export with a dynamic batch:", pad_error)
big, small_values = torch.randn(8, 4) * 3, torch.rand(8, 4) * 0.5
branch_errors = {strict: export_error(Rescale(), big, strict=strict) for strict in (False, True)}
for strict, error in branch_errors.items():
    print(f"export(strict={strict}) of the branch on data:", error)
with_cond = torch.export.export(RescaleCond(), (big,)).module()
cond_right = (torch.allclose(with_cond(big), Rescale()(big)), torch.allclose(with_cond(small_values), small_values))

# %% tags=["nbval-check-output"]
print("jit.trace returns a wrong shape at an odd batch:", trace_shape != eager_shape)
print("export refuses the branch on a size and the branch on data (non-strict and strict):",
      pad_error is not None, all(e is not None for e in branch_errors.values()))
print("torch.cond: right on both sides of the branch:", cond_right)

# %% [markdown]
# Traced at an even batch, `OddPad` returns a wrong shape at an odd one; the `TracerWarning` came once, at
# trace time. Export with a dynamic batch refuses (the branch would pin the batch's parity). For the branch
# on data, non-strict export (the default, `strict=False` in `torch/export/__init__.py`, which runs your
# Python and records the ops) stops at the first value it cannot know; strict export (Dynamo, as in
# `torch.compile(fullgraph=True)`) stops on the branch itself. `torch.cond` records both branches, and the
# exported program chooses at run time.
#
# The C++ replacement for `torch::jit::load` is AOTInductor: lesson 04 compiles an exported program with
# `torch._inductor.aoti_compile_and_package` and loads it with `aoti_load_package`.
#
# ## Distributed diagnostics: a 2-process gloo job on this machine
#
# `debugging.run_gloo_job` spawns two processes, each joins a gloo process group on 127.0.0.1 (never another
# machine) with a collective timeout of a few seconds, runs a scenario, and reports what each rank returned or
# raised; a hard wall-clock limit kills anything left. Three switches matter when a job misbehaves:
#
# - `TORCH_DISTRIBUTED_DEBUG=DETAIL` wraps the process group so that every collective first checks that all
#   ranks call the same collective with the same shapes (a fingerprint exchange), and reports a mismatch by
#   name instead of hanging or crashing;
# - the `timeout=` of `init_process_group` bounds how long a rank waits for the others;
# - `TORCH_CPP_LOG_LEVEL=INFO` and `TORCH_SHOW_CPP_STACKTRACES=1` show the C++ side.
#
# The bug: rank 0 all-reduces 4 floats, rank 1 all-reduces 5.

# %%
jobs = {"mismatch, TORCH_DISTRIBUTED_DEBUG=DETAIL": debugging.run_gloo_job(
    "mismatched_shapes", timeout_s=3, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})}
if not QUICK:
    jobs["mismatch, no debug switch"] = debugging.run_gloo_job("mismatched_shapes", timeout_s=3)
    jobs["rank 1 skips the collective"] = debugging.run_gloo_job("missing_collective", timeout_s=3)
for label, outcome in jobs.items():
    print(f"--- {label}")
    for rank, r in outcome.items():
        print(f"{rank}: {r['status']}: {r['text'][:400]}")
        for line in r["stderr"][-2:]:
            print(f"   {rank} stderr: {line[:300]}")

# %% tags=["nbval-check-output"]
detail = jobs["mismatch, TORCH_DISTRIBUTED_DEBUG=DETAIL"]
assert all("Detected mismatch between collectives on ranks" in r["text"] for r in detail.values()), detail
print("with DETAIL, both ranks raise:", detail["rank 0"]["text"].split(". Rank")[0])
print("rank 0 sees shape", detail["rank 0"]["text"].split("TensorShape=")[1].split(",")[0],
      "and rank 1's", detail["rank 0"]["text"].split("TensorShape=")[2].split(",")[0])

# %% [markdown]
# Without the debug switch (full mode), gloo itself notices the size difference in its transport
# ("Received data size doesn't match expected size. Is there a distributed collective mismatch in your
# code?") and *aborts* that rank's process (C++ `terminate`, exit code -6), while the other rank gets
# "Connection reset by peer". When a rank never calls the collective, the others wait until the timeout:
# "Timed out waiting 3000ms for recv operation to complete". The 2.10 article's "improved NCCL and Gloo
# error reporting" gives no specifics; what you see here is what this torch prints.
#
# ## Measure: what the debugging tools cost

# %%
cost = debugging.benchmark(quick=QUICK)
bench.save_json(cost, "runs/08_debug_cost.json")
print(bench.table(cost))
bench.plot(cost, title="Forward + backward of a small MLP, with each debugging aid on").show()

# %% [markdown]
# **What the numbers mean.** DebugMode runs Python for every op, hashing adds a reduction per output, and
# anomaly mode checks every backward output and records forward tracebacks: all are for finding a bug, not
# for training.
#
# ## Try it: how much does one damaged layer change the output?

# %%
import ipywidgets as widgets

from helpers.interactive import interact

def damage(layer=2, dtype="bfloat16"):
    bad = copy.deepcopy(net)
    with torch.no_grad():
        w = bad[layer][0].weight if layer < 4 else bad[4].weight
        w.copy_(w.to(getattr(torch, dtype)).float())
    d = debugging.first_divergence(trace_good, debugging.hash_trace(bad, xb, hash_fn="hash_tensor"))
    print(f"first differing op: {d['index']} ({d['op']}); max output change "
          f"{(bad(xb) - net(xb)).abs().max().item():.2e}")

interact(damage, layer=widgets.IntSlider(value=2, min=0, max=4), dtype=["bfloat16", "float16"]);

# %% [markdown]
# ## What changes on other hardware
#
# - **GPU**: `use_deterministic_algorithms(True)` also affects cuBLAS (set `CUBLAS_WORKSPACE_CONFIG=:4096:8`
#   or it raises) and the Triton kernels Inductor generates (above); NCCL replaces gloo
#   (`TORCH_NCCL_ASYNC_ERROR_HANDLING`, `TORCH_NCCL_TRACE_BUFFER_SIZE` for the flight recorder). DebugMode
#   also logs the Triton kernels Inductor launches.
# - **CPU**: what you saw above.
#
# ## Pitfalls

# %% tags=["nbval-check-output"]
# 1. Deterministic mode also fills uninitialised memory (torch.empty) with NaN, or the largest integer
#    (torch.utils.deterministic.fill_uninitialized_memory): code that read torch.empty garbage breaks visibly.
torch.use_deterministic_algorithms(True)
try:
    print("1.", torch.empty(3).tolist(), torch.empty(2, dtype=torch.int64).tolist(),
          "| fill_uninitialized_memory:", torch.utils.deterministic.fill_uninitialized_memory)
finally:
    torch.use_deterministic_algorithms(False)

# 2. Comparing traces of different programs is meaningless: first_divergence refuses.
try:
    debugging.first_divergence(trace_good, debugging.hash_trace(nn.Sequential(nn.Linear(WIDTH, 1)), xb))
except ValueError as exc:
    print("2.", exc)

# 3. A scenario name that does not exist is rejected before any process starts.
try:
    debugging.run_gloo_job("all_gather_typo")
except ValueError as exc:
    print("3.", exc)
