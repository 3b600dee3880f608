# %% [markdown]
# # Lab 03 · Mixture-of-experts: token permutation, the fallback loop, an expert FFN without padding, and aligned groups
#
# | | |
# |---|---|
# | **What you will learn** | to write the MoE token permutation (sort by expert, int32 END offsets) and the regular-GEMM fallback that `grouped_mm` uses on CPU and ROCm; to run the expert feed-forward on each expert's own rows, without padding, and measure it against padded `bmm` on a skewed split; to lay the routed rows out in groups that start at a multiple of 16, as the GPU's grouped GEMM needs for some layouts, with no value read back to the host |
# | **Prerequisites** | lesson 03 (grouped GEMM for mixture-of-experts) |
# | **Hardware** | any CPU; the same code runs on a GPU |
# | **Time** | 51 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each exercise cell is followed by a check cell. `check(LAB, function)` runs the visible cases of the
# lab's grading spec (`helpers/grading/specs/lab03.py`), as `python -m helpers grade` does before its
# hidden ones: it prints `✅ ... passed`, or stops with `❌` and a hint (wrong offsets, wrong dtype, wrong
# values, or a call to the function the exercise asks you to write). The timing after exercise 3 is
# measured and printed, not checked; after exercise 4 you predict how many padding rows the layer's groups
# get, then count them.

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
    os.environ["LABS_NOTEBOOK"] = "labs/03_moe_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)

# %%
import torch
import torch.nn.functional as F

from helpers import bench, moe
from helpers.checks import check_close
from helpers.device import pick_device, quick_mode
from helpers.grading.checks import check
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0)


# %% [markdown]
# ## Exercise 1: token permutation
#
# The router gave each of T tokens k expert ids (`expert_ids`, shape `[T, k]`). Write
# `permute_tokens(x, expert_ids, num_experts)` with tensor operations (a sort, a gather, a count per
# expert), returning
#
# - `xs` `[T*k, d]`: the token rows sorted by expert (row i is token `order[i] // k`),
# - `order` `[T*k]`: positions in the flattened `expert_ids`, sorted by expert, **stable** (ties keep
#   their original order),
# - `offs` `[num_experts]`, **int32**: the cumulative END offset of each expert's rows, with an entry
#   for every expert, also those that got no token.
#
# One more requirement, and it is the decision of this exercise: **nothing may be read back to the
# host**. On a GPU every value that comes back to Python (`.item()`, `.tolist()`, `int(t)`, a loop over a
# tensor, or an op that must know a value to size its output) stops the CPU until the GPU has caught up,
# once per MoE layer per step. Lesson 03's deep dive shows which library calls read back; here you choose
# the sort and the count that do not. The check runs your function under `helpers.moe.host_reads` (plus
# the Python reads it cannot see) and lists what it found.

# %%
def permute_tokens(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int):
    ### BEGIN SOLUTION
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    xs = x[order // expert_ids.shape[1]]
    # bincount would read the largest id back to size its output: scatter into num_experts slots instead
    counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    return xs, order, offs
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("03_moe_lab", permute_tokens)


# %% [markdown]
# ## Exercise 2: the regular-GEMM fallback
#
# Write `fallback_grouped_gemm(xs, w, offs)` as a Python loop with one matmul per expert: rows
# `offs[e-1]:offs[e]` of `xs` (the first expert starts at row 0) times `w[e]` (`[K, N]`). This is what
# PyTorch's `_grouped_mm_fallback` does on CPU and, by default in 2.10, on ROCm; write the loop itself,
# with 2-D matmuls only: no `F.grouped_mm`, no `bmm` and none of `helpers.moe`'s GEMMs. Experts with no
# rows must work, and the result keeps the input's dtype.
#
# A capacity-padded buffer has more rows than tokens: `offs[-1]` can be smaller than `xs.shape[0]`, and
# the rows past it belong to no expert. `F.grouped_mm` leaves those output rows uninitialised; yours
# must return **zeros** there (as `helpers.moe.grouped_gemm` does), so that nothing downstream reads
# garbage. The check fills every uninitialised allocation with NaN, so a row you never write shows,
# and it counts your matmuls' FLOPs (`torch.utils.flop_counter`): each expert on its own rows, no more.

# %%
def fallback_grouped_gemm(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    out = xs.new_zeros(xs.shape[0], w.shape[2])    # rows past offs[-1] stay 0
    start = 0
    for e, end in enumerate(offs.tolist()):
        torch.mm(xs[start:end], w[e], out=out[start:end])
        start = end
    return out
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("03_moe_lab", fallback_grouped_gemm)


# %% [markdown]
# ## Exercise 3: an expert feed-forward without padding
#
# Each expert is an MLP: `down(gelu(up(x)))`. Below is a version that pads every expert to the
# busiest expert's count and runs one `bmm`. With a skewed router most of its work multiplies zeros.
# Write `expert_ffn(xs, params, offs)` that computes the same result on each expert's own rows only:
# no padding and no `bmm`. Your fallback from exercise 2 or `F.grouped_mm(xs, w, offs=offs)` (same
# arguments) does each projection. The check counts the FLOPs, as in exercise 2.

# %%
def expert_ffn_padded(xs, params, offs):
    return moe.padded_bmm(F.gelu(moe.padded_bmm(xs, params["w_up"], offs)), params["w_down"], offs)

def expert_ffn(xs: torch.Tensor, params: dict, offs: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    hidden = F.gelu(F.grouped_mm(xs, params["w_up"], offs=offs))
    return F.grouped_mm(hidden, params["w_down"], offs=offs)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("03_moe_lab", expert_ffn)

# %% tags=["nbval-check-output"]
ROWS, D_MODEL, D_FF, EXPERTS = (1024, 128, 256, 16) if QUICK else (4096, 256, 512, 16)
skewed = moe.skewed_counts(ROWS, EXPERTS, 2.0)
offs_s = moe.offsets_from_counts(skewed).to(DEVICE)
params = moe.make_moe(D_MODEL, D_FF, EXPERTS, device=DEVICE)
xs_s = torch.randn(ROWS, D_MODEL, device=DEVICE)
print(f"{EXPERTS} experts, the busiest has {int(skewed.max())} of {ROWS} rows: "
      f"padding does {EXPERTS * int(skewed.max()) / ROWS:.1f}x the work")

# %% [markdown]
# ### Measured, not checked: your expert FFN against padded `bmm` on this split
#
# Both run in this process, on the same inputs, and the cell prints the ratio; no speed is required.
# How much skipping the padding wins depends on the machine: in fp32, `grouped_mm` is the fallback
# loop on CPU, on ROCm by default and on NVIDIA GPUs too (lesson 03's deep dive: the fused CUTLASS kernel takes
# bf16), and on a GPU the loop's launch per expert and its host read of `offs` count against it, so the
# ratio there can be far from the padding factor printed above.

# %%
# one thread on CPU: multi-threaded timings on a busy machine swing by several times
r = bench.compare({"padded bmm": lambda: expert_ffn_padded(xs_s, params, offs_s),
                   "your expert_ffn": lambda: expert_ffn(xs_s, params, offs_s)},
                  baseline="padded bmm", repeats=3 if QUICK else 5, min_run_time=0.02 if QUICK else 0.1,
                  threads=1, device=DEVICE)
print(bench.table(r))
print(f"your expert_ffn runs at {r['results']['your expert_ffn']['ratio_to_baseline']:.2f}x the speed of "
      f"padded bmm here (measured, not checked)"
      + ("" if bench.separated(r, "padded bmm", "your expert_ffn") else f"; {bench.NOISY}"))


# %% [markdown]
# ## Putting it together
#
# Your permutation and expert FFN, with the router and combine step from `helpers.moe`, make a whole MoE
# layer. It agrees with the library's layer.

# %% tags=["nbval-check-output"]
def my_moe_layer(x, params, k=2):
    ids, gates = moe.route(x @ params["router"], k)
    xs, order, offs = permute_tokens(x, ids, params["w_up"].shape[0])
    return moe.unpermute(expert_ffn(xs, params, offs), order, gates)

x_layer = torch.randn(300, D_MODEL, device=DEVICE)
check_close(my_moe_layer(x_layer, params), moe.moe_layer(x_layer, params, k=2, impl="loop"),
            what="Your MoE layer vs helpers.moe.moe_layer", atol=1e-4, rtol=1e-3)


# %% [markdown]
# ## Exercise 4: aligned groups, without reading a count back
#
# On the NVIDIA GPUs where it runs (lesson 03's deep dive), `grouped_mm`'s fused CUTLASS kernel loads each
# group with TMA (Hopper's bulk-copy engine), and "TMA transfers require global memory tensor addresses to
# be aligned to 16 bytes" (a comment in PyTorch's `aten/src/ATen/native/cuda/GroupMMCommon.cuh`). PyTorch
# 2.10 checks it on the device before the GEMM (`prepare_grouped_gemm_data`, in its sm_90 build): where the
# groups run along an operand's contiguous dimension, every group but the last must span a multiple of 16
# bytes, 8 elements in bf16 and 16 in FP8, or the kernel stops with `expected input tensor dynamic dimension
# byte size to be non-negative multiple of 16`. The forward's `xs [M, K]` is row-major: its groups are whole
# rows, and the rule does not apply. The weight gradient contracts over the tokens (`Xᵀ · dY`, 2D × 2D,
# lesson 03's deep dive), and the FP8 grouped GEMM (`torch._scaled_grouped_mm`) takes its first operand
# row-major and its second column-major: in its weight gradient the tokens are the contiguous dimension of
# both. So MoE training code pads each expert's rows to a multiple once, where it lays the tokens out, and
# every GEMM of the layer inherits the alignment (torchtitan's `TOKEN_GROUP_ALIGN_SIZE_M`, in the deep
# dive). The CPU fallback has no such rule; the layout is the same on every device.
#
# Write `padded_layout(expert_ids, num_experts, multiple=16)`. For the router's `expert_ids` `[T, k]` it
# returns `(dest, offs, rows)`, the layout of a buffer in which expert e owns group e, rows
# `offs[e-1]:offs[e]` (the first from row 0):
#
# - `dest` `[T*k]`: the buffer row of each flattened (token, slot) position p (its token is `p // k`, its
#   expert `expert_ids.flatten()[p]`): a row of its own, inside its expert's group, and within one expert
#   the earlier position gets the lower row. The group's other rows are padding (zeros in the buffer).
# - `offs` `[num_experts]`, **int32**: where each group ends. A group has its expert's count of positions
#   rounded up to the next multiple of `multiple`, and no more: an expert with no position gets no row, a
#   count that is a multiple already gets no padding, and the last group is rounded too. So every group
#   starts at a multiple.
# - `rows`: how many rows to allocate for the buffer. It is allocated before any count is known: a Python
#   int from the shapes, `num_experts` and `multiple` alone, with room for the padded total of any routing
#   these T·k positions could have, and at most `T*k + (num_experts + 1) * multiple`.
#
# As in exercise 1, **nothing may be read back to the host**: the check runs your function on the meta
# device, where tensors have shapes and no values, and names what needed one.

# %%
def padded_layout(expert_ids: torch.Tensor, num_experts: int, multiple: int = 16):
    ### BEGIN SOLUTION
    flat = expert_ids.reshape(-1)
    slots = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    sizes = (counts + multiple - 1) // multiple * multiple       # each group rounded up, not the running total
    ends = sizes.cumsum(0)
    order = torch.argsort(flat, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(slots, device=flat.device))   # place in the sort
    dest = (ends - sizes)[flat] + rank - (counts.cumsum(0) - counts)[flat]   # group start + rank within the expert
    # the worst routing pads every expert by multiple - 1 rows; the padded total is a multiple, so round down
    rows = (slots + num_experts * (multiple - 1)) // multiple * multiple
    return dest, ends.to(torch.int32), rows
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("03_moe_lab", padded_layout)

# %% [markdown]
# ### The layer on aligned groups
#
# The layer of "Putting it together" routes 300 tokens to 2 of 16 experts: 600 positions. Laid out with
# your function, each expert's group grows to a multiple of 16, and the grouped GEMM computes those padding
# rows too (zeros in, zeros out). Before you run it:

# %% tags=["predict"]
pad_guess = predict("How many padding rows will the 16 groups hold in all (offs[-1] minus the 600 positions)?",
                    unit="rows", example=240)

# %%
ids_l, gates_l = moe.route(x_layer @ params["router"], 2)
dest, offs_pad, rows = padded_layout(ids_l, EXPERTS)
buffer = x_layer.new_zeros(rows, D_MODEL)
buffer[dest] = x_layer.repeat_interleave(2, dim=0)          # position p holds token p // 2
ys = expert_ffn(buffer, params, offs_pad)[dest]            # each position's output, in position order
y_aligned = (ys.view(-1, 2, D_MODEL) * gates_l[..., None]).sum(1)
routed, used = ids_l.numel(), int(offs_pad[-1])
padding = used - routed
most = (routed + 16 * 15) // 16 * 16 - routed             # 15 an expert at most, and the total is a multiple of 16
print(f"{routed} positions in 16 groups of a multiple of 16: {used} rows ({padding} padding), "
      f"{rows} allocated; offs {offs_pad.tolist()[:6]}...")
check_close(y_aligned, my_moe_layer(x_layer, params), what="The layer on aligned groups vs your unpadded layer",
            atol=1e-4, rtol=1e-3)

# %% tags=["reveal"]
reveal(pad_guess, padding,
       why=f"an expert pads its count up to the next multiple of 16: 16 - count % 16 rows unless the count is a "
           f"multiple already, anywhere from 0 to 15. With counts that fall anywhere modulo 16 that is about 7.5 "
           f"an expert, about 120 for 16 experts: here {padding}. The most is 15 an expert, and since the padded "
           f"total is a multiple of 16, {most} for 600 positions: your `rows` makes room for it ({rows} rows "
           f"allocated, {rows - used} of them past offs[-1] this time, where no GEMM reads). "
           f"The grouped GEMM computes the padding rows: {padding / routed:.0%} more rows than were routed, the "
           "price of aligned groups, paid so that the weight gradient and an FP8 GEMM can run on the same layout.");
