# %% [markdown]
# # 08 · Debugging and determinism: DebugMode, anomaly detection, deterministic compile, recompiles, distributed errors
#
# | | |
# |---|---|
# | **What you will learn** | trace the aten ops a model dispatches with 2.10's `DebugMode` and find where two runs diverge with tensor hashes; locate the op that produced a NaN gradient; what `torch.use_deterministic_algorithms(True)` does to Inductor's generated code; read recompilation logs, bound dynamic shapes with `mark_dynamic(min=, max=)` and avoid the thread-count recompile; make a recompile fail a CI run (`set_stance("fail_on_recompile")`) and keep batch 1 from recompiling (`mark_unbacked`); what a 2-process gloo job reports for a collective mismatch and a timeout; the TorchScript deprecation warnings and the `torch.export` migration with a dynamic batch (`dynamic_shapes`) |
# | **Prerequisites** | lesson 00; a training loop; what `torch.compile` does (lesson 06) |
# | **Hardware** | any CPU. On a GPU one extra section compares the same model on CPU and GPU |
# | **Time** | 50 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build), 2.14.1+cu130 (env latest: CUDA 13.0 build, no GPU) (make matrix, 2026-12-02); 2.10 facts from its release notes and sources (`torch/utils/_debug_mode`, `torch/_inductor`) |

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, fewer compiles and distributed runs (papermill: -p QUICK True)
WIDTH = 64

# %%
import warnings

import plotly.graph_objects as go
import torch
from torch import nn

from helpers import bench, debugging
from helpers.device import pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · quick={QUICK}")

# %% [markdown]
# ## DebugMode: what did my model actually run?
#
# `torch.utils._debug_mode.DebugMode` (new in 2.10; private module, so its path may change) is a
# `TorchDispatchMode` that records every aten op with the shapes and dtypes of its inputs and outputs.
# `debug_string()` prints the trace.

# %% tags=["nbval-check-output"]
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
x = torch.randn(4, 8)
print(debugging.op_trace(model, x))


# %% [markdown]
# ## Find where two runs diverge: tensor hashes
#
# `DebugMode.log_tensor_hashes()` adds a hash of every op's output to the trace ("norm": the L1 norm, a
# number that moves a little when values move a little; "hash_tensor": `torch.hash_tensor`, an XOR over
# the bits of every element). A different hash means different bits; the converse does not hold. An XOR
# ignores order and cancels equal pairs, so permuted or duplicated values collide (the next cell shows
# two collisions, and the DebugMode tutorial warns that tensors whose elements are all equal hash to
# 0). A divergence can hide behind equal hashes: use the hash to narrow the search, then compare the
# tensors. Two runs of the same program give two traces; the first op whose hash differs is
# where the numbers started to disagree. `helpers.debugging.first_divergence` finds it.
#
# A real case: a checkpoint in which one layer's weights went through bf16 (a mixed-precision save, a
# conversion script) while the others stayed fp32. The outputs differ slightly; which layer is to blame?

# %% tags=["nbval-check-output"]
def xor_hash(values):
    return torch.hash_tensor(torch.tensor(values)).item()

print("[1, 2, 3] and [3, 2, 1] hash alike:", xor_hash([1.0, 2.0, 3.0]) == xor_hash([3.0, 2.0, 1.0]))
print("[5, 5] hashes to", xor_hash([5.0, 5.0]), "and [7, 7] to", xor_hash([7.0, 7.0]))

# %%
torch.manual_seed(0)
net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(4)], nn.Linear(WIDTH, 1))
import copy

damaged = copy.deepcopy(net)
with torch.no_grad():
    damaged[2][0].weight.copy_(damaged[2][0].weight.bfloat16().float())   # layer 2 round-tripped via bf16
xb = torch.randn(16, WIDTH)
trace_good = debugging.hash_trace(net, xb, hash_fn="hash_tensor")
trace_bad = debugging.hash_trace(damaged, xb, hash_fn="hash_tensor")
norm_good, norm_bad = debugging.hash_trace(net, xb), debugging.hash_trace(damaged, xb)

# %% tags=["nbval-check-output"]
first = debugging.first_divergence(trace_good, trace_bad)
print(f"{len(trace_good)} ops traced; the first bitwise difference is op {first['index']}: {first['op']}")
ops = [name for name, _ in trace_good]
print("the ops before it:", ops[: first["index"]])
assert first["op"] == "aten.t.default" and ops[: first["index"]].count("aten.addmm.default") == 2, first
print("-> the transpose of the third Linear's weight: layer 2's weights differ, the input to it did not")
print("outputs differ by at most 1e-2:", (net(xb) - damaged(xb)).abs().max().item() < 1e-2)

# %%
rel = [max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ha, hb)) for (_, ha), (_, hb) in zip(norm_good, norm_bad)]
fig = go.Figure(go.Bar(x=[f"{i}: {name.replace('aten.', '').replace('.default', '')}" for i, (name, _) in enumerate(norm_good)],
                       y=[max(r, 1e-12) for r in rel]))
fig.update_layout(title="Relative difference of the 'norm' hash per op (damaged vs original checkpoint)",
                  yaxis_type="log", yaxis_title="relative difference (floored at 1e-12)", height=380)
fig.show()

# %% [markdown]
# Everything before the damaged layer is bitwise equal; from its weight on, the difference appears
# and flows through the rest of the network. The same comparison works for two dtypes, two machines
# or two library versions, as long as both runs dispatch the same ops (otherwise
# `first_divergence` says so). `DebugMode.check_hash_mismatches(logs1, logs2)` (already in 2.10,
# `torch/utils/_debug_mode.py`) does the same job on `mode.logs`: it raises when the two runs' ops
# differ and returns every mismatch, where `first_divergence` returns the first.

# %%
if requires("gpu", section="CPU vs GPU divergence"):
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
# ### Eager vs compiled: where does `torch.compile` change the bits?
#
# The same comparison works between eager and Inductor. Under `torch.compile`, DebugMode sees only the ops
# the generated code calls out to (here the matmuls, `aten.addmm.out`); the fused GELU kernels Inductor
# writes in C++ are invisible to it. Comparing the matmuls one by one still brackets where the bits change:
# the first matmul is fed the same input, the later ones are fed what the fused GELU produced. On a GPU the
# same trace also lists each Triton kernel Inductor launches, with hashes of its outputs
# (`record_triton_kernel` in `torch/utils/_debug_mode.py`), so the first differing kernel can be named.

# %%
if not QUICK:                                  # one Inductor compile takes tens of seconds on 2 cores
    compiled_net = torch.compile(net)          # Inductor: each GELU goes into a generated C++ kernel
    compiled_net(xb)                           # compile outside the trace
    eager_mm = [h for op, h in trace_good if "addmm" in op]
    compiled_mm = [h for op, h in debugging.hash_trace(compiled_net, xb, hash_fn="hash_tensor") if "addmm" in op]
    print("matmuls DebugMode sees, eager / compiled:", len(eager_mm), "/", len(compiled_mm))
    same_bits = [a == b for a, b in zip(eager_mm, compiled_mm)]
    print("bitwise equal, matmul by matmul:", same_bits)
    if False in same_bits:
        print(f"-> the first {same_bits.index(False)} matmul(s) agree; the difference enters just before "
              f"matmul {same_bits.index(False)}, in the fused GELU that feeds it")
    print("max |compiled - eager| of the output:", (compiled_net(xb) - net(xb)).abs().max().item())
else:
    print("quick mode: the Inductor compile is skipped (it takes tens of seconds on 2 cores)")

# %% [markdown]
# ## Autograd anomaly detection on a real NaN
#
# Pairwise distances `sqrt(sum((a - b)**2))` are fine forward, but where `a == b` the gradient of
# `sqrt` at 0 is infinite, and `inf * 0` becomes NaN. The loss looks healthy; the gradients are not.

# %%
points = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]], requires_grad=True)

def distance_loss():
    diff = points[:, None, :] - points[None, :, :]
    return (diff ** 2).sum(-1).sqrt().sum()

loss = distance_loss()
loss.backward()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    points.grad = None
    error = debugging.backward_error(distance_loss)

# %% tags=["nbval-check-output"]
print("loss:", loss.item(), "| NaN in grad without anomaly mode:", torch.isnan(points.grad if points.grad is not None else torch.tensor(float("nan"))).any().item())
print("with detect_anomaly:", error)
forward_trace = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message)][0]
lines = forward_trace.splitlines()
# the last frames are torch's own wrappers (torch/_tensor.py for **): the line that matters is the
# last frame outside torch
user_frames = [i for i, line in enumerate(lines) if line.strip().startswith("File ") and "/torch/" not in line]
print("its warning points at the forward line:", lines[user_frames[-1] + 1].strip())


# %% tags=["nbval-check-output"]
def safe_distance_loss():
    diff = points[:, None, :] - points[None, :, :]
    return torch.linalg.vector_norm(diff, dim=-1).sum()

points.grad = None
safe_distance_loss().backward()
assert not torch.isnan(points.grad).any()
print("torch.linalg.vector_norm: same loss", torch.isclose(safe_distance_loss(), loss).item(),
      "| NaN in grad:", torch.isnan(points.grad).any().item())


# %% [markdown]
# `detect_anomaly()` makes the backward pass check every function's output for NaN and, on the first,
# raises naming the function and warns with the traceback of the *forward* line that created it. Read
# that traceback from the bottom up to the last frame outside torch: the frames below it are torch's
# own operator wrappers (`torch/_tensor.py` for `**`), not your code. Here
# it is `PowBackward0`: `sqrt`'s backward gave `inf` at distance 0 (not NaN, so it passed the check),
# and the square's backward multiplied that `inf` by `2 * diff = 0`. It slows everything down (measured below): switch it on to find the bug, then off.
# `torch.linalg.vector_norm` defines the gradient at zero (as 0), so it is the fix here.
#
# ## Deterministic mode and Inductor
#
# `torch.use_deterministic_algorithms(True)` makes eager PyTorch pick deterministic kernels or raise,
# and Inductor has long followed it in one place you can see on a CPU: an accumulating `index_put` (a
# scatter-add), which Inductor normally generates with atomic adds, whose order (and float rounding) can
# vary between runs, becomes a call to the deterministic aten kernel. That fallback is not new: it dates
# from 2023 (pytorch/pytorch#101105). What 2.10 changed (#164905, #165950) is on the Triton side: with the
# switch on, Inductor writes it into each generated Triton kernel's metadata, and the autotuner then
# filters the reduction configurations as `TORCHINDUCTOR_DETERMINISTIC=1` makes it do (`_inductor/runtime/
# triton_heuristics.py` in the 2.10 wheel), so a compiled reduction does not change its configuration,
# and with it its bits, from run to run. That is GPU code: on a CPU the visible effect is the older
# fallback below.

# %%
def scatter_add(x, idx, v):
    return x.index_put((idx,), v, accumulate=True)

args = (torch.zeros(8), torch.tensor([0, 1, 1, 3]), torch.ones(4))
codes = {}
if not QUICK:
    codes["default"] = debugging.inductor_code(scatter_add, *args)
torch.use_deterministic_algorithms(True)
try:
    codes["deterministic"] = debugging.inductor_code(scatter_add, *args)
finally:
    torch.use_deterministic_algorithms(False)

# %% tags=["nbval-check-output"]
det = codes["deterministic"]
print("deterministic: calls aten.index_put_ fallback:", "aten.index_put_(" in det, "| atomic adds:", "atomic_add" in det)
assert "aten.index_put_(" in det and "atomic_add" not in det

# %%
if "default" in codes:
    print("default:       calls aten.index_put_ fallback:", "aten.index_put_(" in codes["default"],
          "| atomic adds:", "atomic_add" in codes["default"])
else:
    print("quick mode: the default compile is skipped (one Inductor compile costs seconds on 2 cores)")

# %% [markdown]
# ## Recompiles: read the log, then avoid them
#
# `torch.compile` guards every graph on what it assumed: tensor sizes, dtypes, and global state
# including the **number of threads**. When a guard fails, Dynamo recompiles and, with
# `TORCH_LOGS=recompiles` (or `torch._logging.set_logs(recompiles=True)`), says why.
# `debugging.count_recompiles` collects those messages. Here with `backend="eager"` (Dynamo only, no
# code generation), which is enough to see guards and costs no compile time.
#
# A benchmark harness that times at another thread count (`torch.utils.benchmark.Timer` defaults to
# **one** thread) triggers exactly this:

# %% tags=["nbval-check-output"]
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
# To avoid it: compile and warm up at the thread count you will time with, and give the timer that
# count (`helpers.bench.compare` passes `torch.get_num_threads()` to every `Timer`). Lesson 06's
# compiled block is timed that way.
#
# ## Dynamic shapes with bounds: `mark_dynamic(t, dim, min=, max=)`
#
# A new size recompiles once; then Dynamo's "automatic dynamic" makes that dimension symbolic.
# `torch._dynamo.mark_dynamic(t, 0, min=2, max=64)` (the `min`/`max` bounds are not new: they date from early
# 2024, pytorch/pytorch#119737) asks for a dynamic dimension from the first call, with a range the graph may assume.

# %% tags=["nbval-check-output"]
torch._dynamo.reset()
g = torch.compile(lambda a: torch.cos(a) * 2, backend="eager")
unmarked = debugging.count_recompiles(lambda: [g(torch.randn(n)) for n in (16, 17, 40)])
print("sizes 16, 17, 40 unmarked:", len(unmarked), "recompile:", unmarked[0].splitlines()[-1].strip())

torch._dynamo.reset()
def marked_calls():
    for n in (16, 17, 40):
        t = torch.randn(n)
        torch._dynamo.mark_dynamic(t, 0, min=2, max=64)
        g(t)
print("sizes 16, 17, 40 marked dynamic in [2, 64]:", len(debugging.count_recompiles(marked_calls)), "recompiles")

too_big = torch.randn(100)
torch._dynamo.mark_dynamic(too_big, 0, min=2, max=64)
try:
    g(too_big)
except Exception as exc:
    print("size 100 outside the declared range:", type(exc).__name__ + ":", str(exc).splitlines()[0])

# %% [markdown]
# ## Recompiles in CI: make them fail, and keep batch 1 from recompiling
#
# A recompile in a benchmark or a serving loop is a silent cost. `torch.compiler.set_stance("fail_on_recompile")`
# turns it into an error (the stance is in 2.10's `torch/compiler/__init__.py`; the check that raises is in
# `torch/_dynamo/eval_frame.py`): compile and warm up first, then run the loop, or a CI test, under the stance.
# Code that is already compiled and whose guards still hold runs as before.

# %% tags=["nbval-check-output"]
torch._dynamo.reset()
h = torch.compile(lambda a: torch.tanh(a) * 3, backend="eager")
h(torch.randn(8))                                            # compiled before the stance is set
with torch.compiler.set_stance("fail_on_recompile"):
    h(torch.randn(8))                                        # same guards: runs
    try:
        h(torch.randn(8, dtype=torch.float64))               # a new dtype would recompile
    except RuntimeError as exc:
        print("fail_on_recompile raised", type(exc).__name__ + ":", str(exc).split(". ")[0])
        print("  and says why:", str(exc).splitlines()[-1].strip())

# %% [markdown]
# Batch sizes that vary at run time, from 1 up, are where such a test fails first. Dynamo *specialises* sizes
# 0 and 1 (a size-1 dimension broadcasts, so its graph is another program) and guards that a dynamic size is
# at least 2. Three markings of dimension 0, on a function the marked batches go through:
#
# - `mark_dynamic(t, 0, min=1, max=512)` promises a dynamic dimension; when the batch of 1 arrives, Dynamo
#   specialises it anyway, and a promise broken is a `ConstraintViolationError`;
# - `maybe_mark_dynamic(t, 0)` is a hint: no error, but batch 1 gets its own graph (one recompile);
# - `torch._dynamo.decorators.mark_unbacked(t, 0)` makes the size a symbol with no value Dynamo may look at
#   (as if it came from data), so nothing specialises on 0 or 1: one graph for every size. The price: code
#   that branches on the size cannot be traced, and Inductor tunes for a size it does not know.
#
# The failing guard is also logged at length by `torch._guards`; the cell silences that logger around the call.

# %% tags=["nbval-check-output"]
import logging

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
        marked = [line.strip() for line in lines if "You marked" in line]
        print(f"{name:<29} sizes {sizes}: {type(exc).__name__}: {lines[0]}")
        for sentence in (marked[0].strip(" -").split(". ")[:2] if marked else []):
            print(f"{'':<31}{sentence.rstrip('.')}.")
    finally:
        guards_log.setLevel(level)

# %% [markdown]
# ## Distributed diagnostics: a 2-process gloo job on this machine
#
# `debugging.run_gloo_job` spawns two processes, each joins a gloo process group on 127.0.0.1 (never
# another machine) with a collective timeout of a few seconds, runs a scenario, and reports what
# each rank returned or raised; a hard wall-clock limit kills anything left. Three switches matter
# when a job misbehaves:
#
# - `TORCH_DISTRIBUTED_DEBUG=DETAIL` wraps the process group so that every collective first checks
#   that all ranks call the same collective with the same shapes (a fingerprint exchange), and reports
#   a mismatch by name instead of hanging or crashing;
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
# "Connection reset by peer". When a rank never calls the collective, the others wait until the
# timeout: "Timed out waiting 3000ms for recv operation to complete". The 2.10 article's "improved
# NCCL and Gloo error reporting" gives no specifics; what you see here is what this torch prints.
#
# ## TorchScript is deprecated: the warnings, and the move to `torch.export`
#
# Each `torch.jit` entry point warns. Which warning depends on the release: torch 2.10 and 2.13 raise a
# `DeprecationWarning`, which Python hides by default outside `__main__`, so most scripts never show it;
# 2.14 raises the same text as a `FutureWarning`, which is shown. The helper records warnings of every
# category, so the cell prints them whichever torch runs it.

# %%
import os
import tempfile

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
# `torch.jit.script` and `trace` point to `torch.compile` (to run faster in Python) or `torch.export`
# (to get a graph you can save and run elsewhere); `save`/`load` point to `torch.export`
# (`torch.export.save`/`load`, `.pt2` files). Exported programs run from Python, AOTInductor or
# ExecuTorch; a TorchScript `.pt` file still loads, with the warning.
#
# Without `dynamic_shapes`, export specialises every dimension to the example input, and the loaded
# program refuses any other batch with the guard it recorded (the first line printed above; `torch.jit.trace`
# did not check at all). `Dim("batch", min=1, max=512)` declares the range instead, and the program then runs
# at batch 1, 5 and 512; unlike `mark_dynamic` below, export accepts 1 inside the range. A batch above the
# declared maximum fails the same way as the pinned export.
#
# - `torch.export.export` is non-strict by default (`strict=False`, `torch/export/__init__.py`): it runs
#   your Python and records the ops. Control flow that depends on tensor values still cannot be captured
#   as a branch; write it with `torch.cond`.
# - The C++ replacement for `torch::jit::load` is AOTInductor: lesson 04 compiles an exported program with
#   `torch._inductor.aoti_compile_and_package` and loads it with `aoti_load_package`.
#
# ## Measure: what the debugging tools cost

# %%
cost = debugging.benchmark(quick=QUICK)
bench.save_json(cost, "runs/08_debug_cost.json")
print(bench.table(cost))
bench.plot(cost, title="Forward + backward of a small MLP, with each debugging aid on").show()

# %% [markdown]
# **What the numbers mean.** DebugMode runs Python for every op, hashing adds a reduction per output,
# and anomaly mode checks every backward output and records forward tracebacks: all are for finding a
# bug, not for training.
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
# - **GPU**: `use_deterministic_algorithms(True)` also affects cuBLAS (set
#   `CUBLAS_WORKSPACE_CONFIG=:4096:8` or it raises) and Triton kernels Inductor generates; NCCL replaces
#   gloo (`TORCH_NCCL_ASYNC_ERROR_HANDLING`, `TORCH_NCCL_TRACE_BUFFER_SIZE` for the flight recorder).
#   DebugMode also logs Triton kernels Inductor launches.
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
