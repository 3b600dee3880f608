# %% [markdown]
# # 08 · Debugging and determinism: where two runs diverge, where a NaN comes from, deterministic compile, no recompiles
#
# | | |
# |---|---|
# | **What you will learn** | find the first op where two runs of a model diverge with 2.10's `DebugMode` tensor hashes, and the layer that ran it; find the forward line behind a NaN gradient with anomaly mode; what `torch.use_deterministic_algorithms(True)` changes in Inductor's generated code; read the recompile log, bound dynamic batch sizes with `mark_dynamic(min=, max=)` and make a recompile fail a CI run (`set_stance("fail_on_recompile")`) |
# | **Prerequisites** | lesson 00; a training loop; what `torch.compile` does (lesson 02) |
# | **Hardware** | any CPU with a C++ compiler (Inductor's CPU backend compiles C++). The GPU comparisons are in the deep dive |
# | **Time** | 43 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); 2.10 facts from its release notes and sources (`torch/utils/_debug_mode`, `torch/_inductor`) |
#
# The story: two runs of one model disagree → find the first op that differs, and its layer → a NaN
# gradient → the op, and the forward line, that made it → make a compiled program give the same bits on
# every run → make it compile once, and fail CI when it does not.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/08_debugging_determinism.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
WIDTH = 64             # width of the model whose two runs are compared

# %%
import copy
import logging
import warnings

import torch
from torch import nn

from helpers import debugging
from helpers.device import pick_device, quick_mode
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()       # everything in this lesson runs on the CPU; the deep dive compares devices
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · quick={QUICK}")

# %% [markdown]
# ## Where do two runs diverge? DebugMode and tensor hashes
#
# `torch.utils._debug_mode.DebugMode` (new in 2.10; a private module, so its path may change) is a
# `TorchDispatchMode`: it records every aten op a model dispatches, with the shapes and dtypes of its inputs
# and outputs (the deep dive prints such a trace).
#
# `DebugMode.log_tensor_hashes(hash_fn="hash_tensor")` adds a hash of every op's output:
# `torch.hash_tensor`, an XOR over the bits of every element. Run the two suspects on the same input, and
# the first op whose hash differs is where the numbers started to disagree
# (`debugging.first_divergence`); `debugging.op_modules` names the submodule that ran each op (what
# `DebugMode(record_nn_module=True)` prints).
#
# The case: a checkpoint in which one layer's weights went through bf16 (a mixed-precision save, a
# conversion script) while the others stayed fp32. The outputs differ slightly. Which op differs first?

# %%
torch.manual_seed(0)
net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(4)], nn.Linear(WIDTH, 1))
damaged = copy.deepcopy(net)
with torch.no_grad():
    damaged[2][0].weight.copy_(damaged[2][0].weight.bfloat16().float())   # block 2's Linear went through bf16
xb = torch.randn(16, WIDTH)
trace_good = debugging.hash_trace(net, xb, hash_fn="hash_tensor")
trace_bad = debugging.hash_trace(damaged, xb, hash_fn="hash_tensor")
print("ops per forward:", [name.replace("aten.", "").replace(".default", "") for name, _ in trace_good[:3]],
      f"per block, {len(trace_good)} in all")

# %% tags=["predict"]
op_options = ["aten.addmm in block 0", "aten.t in block 2", "aten.addmm in block 2", "aten.gelu in block 2"]
diverge_guess = predict("Comparing the two runs op by op: which op is the first whose output differs?",
                        options=op_options, example="aten.addmm in block 2")

# %% tags=["nbval-check-output"]
first = debugging.first_divergence(trace_good, trace_bad)
where = debugging.op_modules(net, xb)[first["index"]]
print(f"the first bitwise difference is op {first['index']} of {len(trace_good)}: {first['op']}, in module {where!r}")
assert first["op"] == "aten.t.default" and where == "2.0", (first, where)
print("outputs differ by at most 1e-2:", (net(xb) - damaged(xb)).abs().max().item() < 1e-2)

# %% tags=["reveal"]
short = first["op"].replace(".default", "")
reveal(diverge_guess, f"{short} in block {where.split('.')[0]}",
       why=f"the {first['index']} ops before it read the same weights and the same input: bitwise equal. "
           f"nn.Linear first transposes its weight ({short}) and then multiplies (addmm): the transpose is "
           f"the first op whose output holds a damaged number, so the hash names module {where!r}, the "
           "damaged Linear, before any activation has changed.");

# %% [markdown]
# The same comparison works between two dtypes, two machines, two torch versions, eager and compiled, as
# long as both runs dispatch the same ops (otherwise `first_divergence` refuses). The deep dive runs it
# between eager and `torch.compile` and between a CPU and a GPU.
#
# ## Where does a NaN come from? Anomaly mode
#
# Pairwise distances `sqrt(sum((a - b)**2))` are fine forward, but where `a == b` the gradient of `sqrt` at
# 0 is infinite. The loss looks healthy; the gradients are not.

# %% tags=["nbval-check-output"]
points = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]], requires_grad=True)

def distance_loss():
    diff = points[:, None, :] - points[None, :, :]
    return (diff ** 2).sum(-1).sqrt().sum()

loss = distance_loss()
loss.backward()
print("loss:", loss.item(), "| NaN in the gradient:", torch.isnan(points.grad).any().item())

# %% [markdown]
# `torch.autograd.detect_anomaly()` makes the backward pass check each function's output; on the first
# NaN it raises, naming that function, and warns with the traceback of the *forward* line that created it.

# %% tags=["predict"]
nan_guess = predict("Which backward function will anomaly mode name as the one that returned NaN?",
                    options=["SqrtBackward0", "PowBackward0", "SubBackward0", "SumBackward1"], example="SqrtBackward0")

# %% tags=["nbval-check-output"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    points.grad = None
    error = debugging.backward_error(distance_loss)           # loss.backward() under detect_anomaly()
print("detect_anomaly:", error)
forward_trace = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message)][0]
lines = forward_trace.splitlines()
# the last frames are torch's own wrappers (torch/_tensor.py for **): the line that matters is the
# last frame outside torch
user_frames = [i for i, line in enumerate(lines) if line.strip().startswith("File ") and "/torch/" not in line]
print("its warning points at the forward line:", lines[user_frames[-1] + 1].strip())

# %% tags=["reveal"]
named = error.split("'")[1]
reveal(nan_guess, named,
       why=f"{named}: the NaN is not born where the infinity is. sqrt's backward at distance 0 gives inf, "
           "which is not NaN, so it passes the check; the square's backward then multiplies that inf by "
           "2 * diff = 0, and inf * 0 is NaN. Anomaly mode names the first function whose output is NaN.");


# %% [markdown]
# Read the forward traceback from the bottom up to the last frame outside torch: the frames below it are
# torch's own operator wrappers (`torch/_tensor.py` for `**`), not your code. Anomaly mode records a
# traceback for every forward op and checks every backward output, so it is slow (the deep dive measures
# it): switch it on to find the bug, then off. The fix here: `torch.linalg.vector_norm`, which defines the
# gradient at zero (as 0; the deep dive checks it).

# %% [markdown]
# ## Deterministic compile
#
# `torch.use_deterministic_algorithms(True)` makes eager PyTorch pick deterministic kernels, or raise
# where there is none. Inductor follows it too, visibly on a CPU: an accumulating `index_put` (a
# scatter-add) is normally generated with atomic adds, whose order, and so the float rounding, can change
# from run to run; with the switch on it becomes a call to the deterministic aten kernel. That fallback
# dates from 2023 (pytorch/pytorch#101105). What 2.10 added (#164905, #165950) is on the GPU: the switch
# now also reaches the autotuner of the Triton kernels Inductor generates, so a compiled reduction keeps its
# configuration, and its bits, from run to run (the deep dive reads that code and runs it on a GPU).

# %%
def scatter_add(x, idx, v):
    return x.index_put((idx,), v, accumulate=True)

args = (torch.zeros(8), torch.tensor([0, 1, 1, 3]), torch.ones(4))
codes = {"default": debugging.inductor_code(scatter_add, *args)}   # the C++ Inductor generates (one compile each)
torch.use_deterministic_algorithms(True)
try:
    codes["deterministic"] = debugging.inductor_code(scatter_add, *args)
finally:
    torch.use_deterministic_algorithms(False)
for name, code in codes.items():
    print(f"{name:<13}: atomic adds: {'atomic_add' in code} | calls the aten.index_put_ kernel: {'aten.index_put_(' in code}")

# %% tags=["nbval-check-output"]
det = codes["deterministic"]
assert "aten.index_put_(" in det and "atomic_add" not in det
print("deterministic: the generated code calls aten.index_put_ and has no atomic adds")

# %% [markdown]
# ## Recompiles: read the log, then stop them
#
# `torch.compile` guards every graph on what it assumed (tensor sizes, dtypes, global state such as the
# number of threads). When a guard fails, Dynamo compiles again and, with `TORCH_LOGS=recompiles`, says
# why; `debugging.count_recompiles` collects those messages. The cells below compile with a backend of
# three lines that counts the graphs Dynamo hands it and runs them as they are: guards and recompiles
# without Inductor's compile time.

# %%
graphs = []

def counting_backend(graph_module, example_inputs):     # a torch.compile backend: called once per graph
    graphs.append(graph_module)
    return graph_module.forward                         # run the captured graph as it is (like backend="eager")

w_out = torch.randn(16, 4)

def head(batch):
    return torch.softmax(batch @ w_out, dim=-1).mean(0)

def fresh_compile():
    torch._dynamo.reset()                               # forget every graph compiled so far
    graphs.clear()
    return torch.compile(head, backend=counting_backend)

def marked(n, low, high):
    t = torch.randn(n, 16)
    torch._dynamo.mark_dynamic(t, 0, min=low, max=high)    # dimension 0 is dynamic, within [low, high]
    return t


# %% tags=["predict"]
compile_guess = predict("A compiled function gets batches of 1, 2, ..., 8 rows. How many graphs does Dynamo "
                        "compile without marking / with mark_dynamic(t, 0, min=1, max=8) on every batch?",
                        options=["8 / 1", "2 / 1", "1 / 1", "2 / an error"], example="8 / 1")

# %% tags=["nbval-check-output"]
guards_log = logging.getLogger("torch._guards")
guards_log.setLevel(logging.CRITICAL)                     # a failing guard is also logged there, at length
compiled = fresh_compile()
reasons = debugging.count_recompiles(lambda: [compiled(torch.randn(n, 16)) for n in range(1, 9)])
unmarked = len(graphs)
print(f"batches 1..8, unmarked: {unmarked} graphs; the recompile log says:")
for r in reasons:
    print("   ", r.splitlines()[-1].strip(" -"))

compiled = fresh_compile()
try:
    for n in range(1, 9):
        compiled(marked(n, 1, 8))
    with_mark = f"{len(graphs)} graph(s)"
except Exception as exc:                                   # ConstraintViolationError (torch.fx.experimental)
    with_mark = "an error"
    promise = [line.strip(" -") for line in str(exc).splitlines() if "You marked" in line][0]
    print(f"batches 1..8, mark_dynamic(min=1, max=8): {type(exc).__name__} at batch {n}")
    print("   ", promise.split(". ")[0] + ".")

# %% tags=["reveal"]
reveal(compile_guess, f"{unmarked} / {with_mark}",
       why="unmarked, the first call compiles a graph for exactly 1 row. Batch 2 fails its size guard: Dynamo "
           "recompiles and, seeing the size change, makes it a symbol ('automatic dynamic'), so batches 3 to "
           "8 reuse that graph. Marked, the batch of 1 breaks the promise: Dynamo specialises sizes 0 and 1 "
           "(a size-1 dimension broadcasts, so its graph is another program), and a size you declared "
           "dynamic that gets specialised is an error, not a recompile.");

# %% [markdown]
# `mark_dynamic(t, dim, min=, max=)` asks for a symbolic size from the first call, with a range the graph may
# assume (the bounds date from 2024, pytorch/pytorch#119737). Inside the range one graph serves every size;
# a marked tensor outside it is an error; an unmarked one fails the guard and recompiles. A batch of 1 is
# special (the compiler specializes sizes 0 and 1): keep it out of the calls; if batch 1 must share the graph, lab 08 has you find the marking that
# allows it (the deep dive compares the three markings and shows a size out of range).

# %% [markdown]
# A recompile in a benchmark or a serving loop is a silent cost. `torch.compiler.set_stance("fail_on_recompile")`
# makes it an error (the stance is in 2.10's `torch/compiler/__init__.py`, the check that raises in
# `torch/_dynamo/eval_frame.py`): compile and warm up first, then run the loop, or a CI test, under the
# stance. Code whose guards still hold runs as before.

# %% tags=["nbval-check-output"]
compiled = fresh_compile()
compiled(torch.randn(8, 16))                                    # compiled before the stance is set
with torch.compiler.set_stance("fail_on_recompile"):
    compiled(torch.randn(8, 16))                                # same guards: runs
    try:
        compiled(torch.randn(8, 16, dtype=torch.float64))       # a new dtype would recompile
    except RuntimeError as exc:
        print("fail_on_recompile raised", type(exc).__name__ + ":", str(exc).split(". ")[0])
        print("  and says why:", str(exc).splitlines()[-1].strip())

# %% [markdown]
# ## Your turn: one graph for a serving loop
#
# A server warms its compiled function up once, on a batch marked with `mark_dynamic`, then serves the
# batch sizes 3, 17, 48, 2, 33, 8 (`SERVED`, in that order) under `fail_on_recompile`. Change the bounds in
# the next cell so that the loop runs on the one graph of the warm-up; the check says which guard failed
# when it does not.

# %% tags=["your-turn"]
BATCH_MIN, BATCH_MAX = 2, 32              # your change: the range mark_dynamic declares at warm-up

# %%
from helpers.checks import check_equal, fail, your_turn

SERVED = [3, 17, 48, 2, 33, 8]            # the batch sizes the server will see, in this order


def serve_on_one_graph():
    compiled = fresh_compile()
    compiled(marked(8, BATCH_MIN, BATCH_MAX))                   # the warm-up compiles the one graph
    with torch.compiler.set_stance("fail_on_recompile"):
        for n in SERVED:
            try:
                compiled(torch.randn(n, 16))
            except RuntimeError as exc:
                fail("the serving loop", f"batch {n} would recompile; the guard that failed: "
                     f"{str(exc).splitlines()[-1].strip(' -').split('#')[0].strip()}",
                     "the declared range must hold every size in SERVED")
    check_equal(len(graphs), 1, what="graphs compiled for the warm-up and the whole loop")


your_turn(serve_on_one_graph, what="one graph for a serving loop");

# %% [markdown]
# ## Going further
#
# [The deep dive](08_debugging_determinism_deep_dive.ipynb) has the rest, for whoever debugs compiled or
# distributed code: DebugMode as its recipe uses it (a trace op by op, the damaged layer named in it,
# `check_hash_mismatches`, how far each op moved, what equal hashes do not prove); the NaN fix, checked;
# eager vs compiled, op by op, with `aot_eager` and with Inductor; the same model on a CPU and a GPU;
# deterministic compile on a GPU; the thread-count recompile, three ways to mark a dynamic batch (batch 1
# included) and a marked size out of range; what a 2-process gloo job reports for a mismatched
# collective and a timeout; TorchScript's deprecation and the move to `torch.export` with a dynamic batch;
# what the debugging tools cost; the pitfalls. Then [lab 08](../labs/08_debugging_lab.ipynb) has you compare
# hash traces yourself, write a NaN-free normalisation, stop the recompiles with batch 1 included, and leave
# TorchScript.
