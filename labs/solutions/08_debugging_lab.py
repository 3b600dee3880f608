# %% [markdown]
# # Lab 08 · Debugging: find the divergence, fix the NaN, stop the recompiles, leave TorchScript
#
# | | |
# |---|---|
# | **What you will learn** | compare two DebugMode hash traces yourself; write a normalisation whose gradient has no NaN at zero (checked with anomaly mode); make a compiled function accept every batch size from 1 to 512 without recompiling (and see why `mark_dynamic` cannot); find the batch size `torch.jit.trace` silently baked into a module, and export a version whose program is the same for every batch size (1 to 512) with `torch.export`; find the layer whose compiled version breaks agreement with eager within a budget of runs, then run that search on blocks Inductor compiles and see what it does to a dropout |
# | **Prerequisites** | lesson 08 |
# | **Hardware** | any CPU with a C++ compiler (exercise 5's run compiles with Inductor, whose CPU backend builds C++) |
# | **Time** | 59 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04); exercise 5 came after that matrix run: its quick run passed on 2.13.0+cpu and 2.10.0+cu128 without a GPU, and on the H200 (2026-12-04) |
#
# Each exercise cell is followed by a check cell: `check(LAB, function)` runs the cases the grader's
# visible checks run (`python -m helpers grade` adds hidden ones) and prints `✅ ... passed`, or stops with `❌` and a hint.

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
    os.environ["LABS_NOTEBOOK"] = "labs/08_debugging_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode (papermill: -p QUICK True)

# %%
import copy
import math

import torch
from torch import nn

from helpers import debugging
from helpers.device import pick_device, quick_mode
from helpers.grading.checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
x = torch.randn(8, 16)


# %% [markdown]
# ## Exercise 1: where do two runs start to differ?
#
# A trace is a list of `(op_name, hashes)` pairs, `hashes` a tuple of floats (from
# `debugging.hash_trace`). Return the index of the first pair whose hashes differ by a relative amount
# larger than `rtol` (relative to the larger magnitude), or `None`. Raise `ValueError` if the op names
# of the two traces differ. A NaN hash (a NaN somewhere in that op's output) in one trace and a number
# in the other is a difference; two NaN hashes are not. An infinite hash (an overflow) is a value like any
# other: it differs from a finite one and from the other infinity. A hash can be 0.

# %%
def first_difference(a: list, b: list, rtol: float = 0.0) -> int | None:
    ### BEGIN SOLUTION
    def differ(p, q):
        if math.isnan(p) or math.isnan(q):
            return math.isnan(p) != math.isnan(q)
        if math.isinf(p) or math.isinf(q):      # |inf - x| > rtol * inf is never true: compare them as they are
            return p != q
        return abs(p - q) > rtol * max(abs(p), abs(q))   # a product, no division: hashes can be 0

    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(differ(p, q) for p, q in zip(ha, hb)):
            return i
    return None
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("08_debugging_lab", first_difference)

bad = copy.deepcopy(net)
with torch.no_grad():
    bad[4].weight.mul_(1 + 1e-4)                      # the last layer, slightly off
good_trace, bad_trace = debugging.hash_trace(net, x), debugging.hash_trace(bad, x)
i = first_difference(good_trace, bad_trace)
print(f"on the real traces of this net: the runs first differ at op {i} of {len(good_trace)}, {bad_trace[i][0]}")


# %% [markdown]
# ## Exercise 2: a normalisation without NaN gradients
#
# `v / v.norm()` gives NaN gradients when `v` is all zeros. Write `safe_normalize(v, eps)` that
# normalises the last dimension, equals `torch.nn.functional.normalize(v, dim=-1, eps=eps)` (values
# and gradients, for any `eps`) and has finite gradients everywhere, including at zero. Calling
# `normalize` itself is not allowed.

# %%
def safe_normalize(v: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    ### BEGIN SOLUTION
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(eps)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("08_debugging_lab", safe_normalize)


# %% [markdown]
# ## Exercise 3: stop the recompiles, batch 1 included
#
# `step` is compiled; every batch has a different size, from 1 to 512. Write `prepare(batch)` that
# marks dimension 0 so that `step` compiles once and never recompiles, whatever the sizes and their
# order, and returns the batch.
#
# The obvious answer is not enough. `torch._dynamo.mark_dynamic(batch, 0, min=1, max=512)` works until
# a batch of 1 arrives: Dynamo specialises sizes 0 and 1 (a size-1 dimension broadcasts, so the graph
# for 1 is a different program), and a dimension you declared dynamic that gets specialised is an error:
#
# ```
# ConstraintViolationError: Constraints violated (L['b'].size()[0])! ...
#   - You marked L['b'].size()[0] as dynamic but your code specialized it to be a constant (1).
#     If you're using mark_dynamic, either remove it or use maybe_mark_dynamic. ...
# ```
#
# `maybe_mark_dynamic` (or `mark_dynamic` without bounds) avoids the error but recompiles for the batch
# of 1. Find the marking in `torch._dynamo.decorators` that makes the size a symbol for every value, 0
# and 1 included (lesson 08's deep dive shows it), and use it. The cell after the check runs the three markings.

# %%
def prepare(batch: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    torch._dynamo.decorators.mark_unbacked(batch, 0)
    return batch
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("08_debugging_lab", prepare)

# %%
import logging

from helpers.grading.harnesses.lab08 import recompiles

def bounded(batch):
    torch._dynamo.mark_dynamic(batch, 0, min=1, max=512)
    return batch

def maybe(batch):
    torch._dynamo.maybe_mark_dynamic(batch, 0)
    return batch

logging.getLogger("torch._guards").setLevel(logging.CRITICAL)    # the failing guard is logged at length
for name, mark in (("mark_dynamic(min=1, max=512)", bounded), ("maybe_mark_dynamic", maybe), ("yours", prepare)):
    try:
        print(f"{name:30} sizes 8, 1, 512, 2: {recompiles(mark, (8, 1, 512, 2))} recompiles")
    except Exception as error:
        print(f"{name:30} sizes 8, 1, 512, 2: {type(error).__name__}: {str(error).splitlines()[0]}")

# %% [markdown]
# ## Exercise 4: leave TorchScript, and find what `jit.trace` baked in
#
# `TokenHead` (in `helpers.grading.checks`, printed below) reads a `(batch, tokens, features)` batch and,
# for each example, standardises every feature over the tokens, projects it and keeps each output's
# maximum over the tokens. It was shipped with `torch.jit.trace` at a batch of 8. The next cell calls
# the traced module on a batch of 12.

# %%
import inspect
import warnings

from helpers.grading.harnesses.lab08 import TokenHead, token_head

print(inspect.getsource(TokenHead.forward))
head = token_head()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    traced = torch.jit.trace(head, torch.randn(8, 6, 16))
batch12 = torch.randn(12, 6, 16)
print(f"eager: {tuple(head(batch12).shape)}, traced at batch 8: {tuple(traced(batch12).shape)}")
print("warnings while tracing:", sorted({type(w.message).__name__ for w in caught}) or "none")


# %% [markdown]
# No error, and no warning about the shape (only TorchScript's own deprecation): the tracer ran the
# Python loop 8 times and recorded 8 copies of its body, so the traced module returns 8 rows for any
# batch of at least 8 (and fails on a smaller one). Write `export_and_reload(module, example, path)`:
# export `module` (a `TokenHead`) with `example` using `torch.export`, save it to `path` (a `.pt2`
# file), load it back and return the loaded, callable module. It must accept **any batch size from 1
# to 512** and give `TokenHead`'s outputs on each. By default `torch.export` specialises every
# dimension to the example's size, and the loaded program refuses other sizes: declare the batch
# dimension with `dynamic_shapes` and a `torch.export.Dim`. Then read what export says about this
# module, and decide what to change so that the program it records is the same for every batch size.
# `torch.jit` is not allowed.

# %%
def export_and_reload(module: nn.Module, example: torch.Tensor, path: str):
    ### BEGIN SOLUTION
    class Batched(nn.Module):
        """TokenHead's forward on the whole batch at once, with its projection (the loop is what export
        refuses: it made the batch size a constant of the program)."""

        def __init__(self, proj):
            super().__init__()
            self.proj = proj

        def forward(self, x):
            return self.proj((x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5)).amax(1)

    batch = torch.export.Dim("batch", min=1, max=512)
    program = torch.export.export(Batched(module.proj), (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, path)
    return torch.export.load(path).module()
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("08_debugging_lab", export_and_reload)


# %% [markdown]
# ## Exercise 5: which layer does compiling break?
#
# A model gives other outputs once compiled, by more than rounding. To find the layer responsible, compile
# some of its layers and leave the others eager. `agrees(k)` runs the model with its first `k` layers
# compiled (layers 0 to k - 1) and the others eager, and says whether the output still matches the eager
# model's, within a tolerance. Three things are known without asking:
#
# - `agrees(0)` compiles nothing: it is the eager model itself, and it agrees;
# - agreement breaks once and stays broken: the first prefix that contains the responsible layer disagrees,
#   and so does every longer one;
# - nothing says that `agrees(n)` is False: the whole model compiled may agree.
#
# Each call of `agrees` compiles and runs a model, which can take minutes on a real one: the calls are the
# cost. Write `first_divergent(n, agrees)` that returns the layer (counted from 0) whose compiled version
# breaks agreement: the `i` for which layers 0 to i - 1 compiled agree and layers 0 to i compiled do not. It
# may call `agrees` at most `ceil(log2(n)) + 1` times, for any `n` of 1 or more and wherever that layer is;
# the grader counts the calls. When the whole model compiled agrees, there is no such layer: raise
# `ValueError` with a message that gives `n` and says where to look next. After the check, the notebook runs
# your function on a model that Inductor compiles.

# %%
def first_divergent(n: int, agrees) -> int:
    ### BEGIN SOLUTION
    if agrees(n):
        raise ValueError(f"all {n} layers compiled still agree with eager: no layer's compiled code breaks it; "
                         f"look at what runs outside the layers, or at the tolerance of the comparison")
    good, bad = 0, n        # agrees(good) holds (nothing compiled), agrees(bad) does not
    while bad - good > 1:   # each run halves the prefixes still in doubt
        mid = (good + bad) // 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
    return good             # layers 0 to good - 1 compiled agree; compiling layer `good` too breaks it
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("08_debugging_lab", first_divergent)

# %% [markdown]
# Your function on a real divergence: 24 residual blocks, `h + GELU(Linear(h))`, in training mode as a
# training step runs them; one of them also has a dropout. `agrees(k)` runs them with the first `k` blocks
# compiled by Inductor and the rest eager, from the seed of the eager run, and compares the outputs within a
# relative 1e-4. Each block is compiled once, when first called (blocks with the same code share a graph),
# so a run here costs little; the count of runs is what a real search pays for. Not bitwise: Inductor writes
# its own GELU, which rounds differently from eager's in the last bits (lesson 08's deep dive shows it), so
# a bitwise test would blame block 0.

# %%
import time

import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, h):
        return h + self.drop(F.gelu(self.linear(h)))


torch.manual_seed(0)
blocks = [Block(32, dropout=0.1 if i == 17 else 0.0) for i in range(24)]
compiled = [torch.compile(block) for block in blocks]     # each compiles on its first call
xb = torch.randn(64, 32)


@torch.no_grad()
def run(layers):
    torch.manual_seed(1)                                  # the eager run's dropout draws, every time
    h = xb
    for layer in layers:
        h = layer(h)
    return h


def off_by(k):
    """How far the output with the first k blocks compiled is from eager's, relative to its largest value."""
    out = run(compiled[:k] + blocks[k:])
    return ((out - eager).abs().max() / eager.abs().max()).item()


eager, asked = run(blocks), []


def agrees(k):
    asked.append(k)
    return off_by(k) <= 1e-4


start = time.perf_counter()
layer = first_divergent(len(blocks), agrees)
print(f"first_divergent: block {layer}, after {len(asked)} runs (k = {asked}), {time.perf_counter() - start:.1f} s "
      f"with Inductor's compiles; a scan from block 0 would run {layer + 1} models")
print(f"first {layer} blocks compiled: off by {off_by(layer):.1e}; first {layer + 1}: off by {off_by(layer + 1):.1e}")
print(f"block {layer}: {blocks[layer]}")

# %% [markdown]
# The block it names is the one with the dropout. Inductor does not call eager's dropout: it makes the mask
# in its own generated code, from a seed it draws from torch's generator, so the same seed gives the same
# mask on every compiled run, but not eager's mask. Nothing is broken, yet compiled and eager training part
# from the first step. `torch._inductor.config.fallback_random = True` makes compiled random ops call eager's
# (slower: it is meant for debugging). The next cell compiles the blocks again with it and runs your search.

# %%
torch._dynamo.reset()                                     # forget the compiled graphs: compile again
with torch._inductor.config.patch(fallback_random=True):
    compiled, asked = [torch.compile(block) for block in blocks], []
    try:
        print(f"fallback_random=True: block {first_divergent(len(blocks), agrees)}")
    except ValueError as error:
        runs = f"{len(asked)} run{'s' if len(asked) != 1 else ''}"
        print(f"fallback_random=True, {runs} (off by {off_by(len(blocks)):.1e}): ValueError: {error}")
torch._dynamo.reset()
