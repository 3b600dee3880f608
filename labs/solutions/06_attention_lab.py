# %% [markdown]
# # Lab 06 · Attention kernels: masks, packing, backends, buckets
#
# | | |
# |---|---|
# | **What you will learn** | derive the SDPA mask for causal attention over prompts padded on the left; unpad that batch into the packed layout `varlen_attn` wants; name the SDPA kernel that runs the backward pass from the aten ops it dispatches, and predict it; cut padding waste by bucketing sequences by length, and choose the bucket count from what a call costs on this machine; derive a FlexAttention `mask_mod` the lesson does not show (prefix-LM over packed documents) |
# | **Prerequisites** | lesson 06 |
# | **Hardware** | any CPU |
# | **Time** | 72 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each exercise cell is followed by a check cell. `check(LAB, function)` runs the visible cases of the
# lab's grading spec (`helpers/grading/specs/lab06.py`), as `python -m helpers grade` does before its
# hidden ones: `✅ ... passed`, or `❌` with a hint. The cells after a check show your function at work
# on this notebook's batch; the timings at the end are measured, not checked.

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
    os.environ["LABS_NOTEBOOK"] = "labs/06_attention_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode: small sizes (papermill: -p QUICK True)
LENGTHS = [33, 500, 61, 1024, 12, 700, 90, 256]

# %%
import torch
import torch.nn.functional as F

from helpers import attention
from helpers.device import pick_device, quick_mode
from helpers.grading.checks import check
from helpers.grading.harnesses.lab06 import padded_attention_calls
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    LENGTHS = [17, 40, 9, 128, 3]
HEADS, HEAD_DIM = 2, 16
seqs = attention.random_ragged(LENGTHS, HEADS, HEAD_DIM)     # each (length, heads, head_dim)


# %% [markdown]
# ## Exercise 1: the mask for left-padded prompts
#
# The lesson padded on the right and masked the padding keys. A generation server pads its prompts on the
# **left**, so that every prompt's last token sits in the last position and the next token of every
# prompt is read from one row; and its attention is causal. Write `generation_mask(lengths, max_len)`
# with tensor operations: a boolean `attn_mask` that broadcasts to `(batch, heads, max_len, max_len)`
# (queries, then keys) for a batch in which a prompt of length `n` fills the last `n` positions, and
# that gives each real query of a prompt exactly what causal attention over that prompt alone gives it.
# Work out which keys that is before you write it (True is kept, as SDPA reads a boolean mask). The
# queries of padding positions are not checked: nothing reads their outputs.

# %%
def generation_mask(lengths: list[int], max_len: int) -> torch.Tensor:
    ### BEGIN SOLUTION
    pos = torch.arange(max_len)
    real_key = pos[None, :] >= (max_len - torch.tensor(lengths))[:, None]     # (batch, keys)
    causal = pos[None, :] <= pos[:, None]                                      # (queries, keys)
    return (real_key[:, None, :] & causal[None])[:, None]                      # (batch, 1, queries, keys)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("06_attention_lab", generation_mask)

# %%
# your mask in use: one left-padded, masked SDPA call against causal attention on each prompt alone
max_len = max(LENGTHS)
left_padded = torch.stack([F.pad(s, (0, 0, 0, 0, max_len - len(s), 0)) for s in seqs]).transpose(1, 2)
out = F.scaled_dot_product_attention(left_padded, left_padded, left_padded,
                                     attn_mask=generation_mask(LENGTHS, max_len)).transpose(1, 2)
mine = [o[max_len - n:] for o, n in zip(out, LENGTHS)]
print(f"left-padded attention with your mask vs causal attention per prompt: "
      f"max error {attention.max_error(mine, seqs, causal=True):.1e}")


# %% [markdown]
# ## Exercise 2: from the padded batch to `varlen_attn`
#
# Padding costs a left-padded batch the same as a right-padded one: every score of the padded square is
# computed. `varlen_attn` takes the prompts packed instead, with no padding at all. Write
# `unpad(padded, lengths)` for a batch `(batch, width, heads, head_dim)` in which each prompt fills the last
# `length` positions of its row, padding first, as in exercise 1 (before its transpose to heads first);
# the padding rows may hold anything (a pad token's embedding is not zero), so the lengths alone say which
# rows are real. Return `(packed, cu_seq, max_len)`: the real tokens only, prompt after prompt, as
# `(total_tokens, heads, head_dim)`; the cumulative offsets `[0, n0, n0+n1, ...]` as **int32** (the flash
# kernel's type); and the longest prompt's length as a Python int (which need not be `width`).

# %%
def unpad(padded: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    ### BEGIN SOLUTION
    width, lengths = padded.shape[1], torch.tensor(lengths)
    real = torch.arange(width)[None, :] >= (width - lengths)[:, None]        # (batch, max_len)
    cu_seq = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seq[1:] = lengths.cumsum(0)
    return padded[real], cu_seq, int(lengths.max())
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("06_attention_lab", unpad)

# %% tags=["nbval-check-output"]
# your unpadding in use: exercise 1's left-padded batch, packed; varlen_attn accepts it (on the meta
# device: shapes only, no GPU needed)
from torch.nn.attention.varlen import varlen_attn

packed, cu_seq, max_len = unpad(left_padded.transpose(1, 2), LENGTHS)
meta = packed.to("meta", torch.bfloat16)
out = varlen_attn(meta, meta, meta, cu_seq.to("meta"), cu_seq.to("meta"), max_len, max_len)
print(f"varlen_attn on your packing: {tuple(packed.shape)} in, {tuple(out.shape)} out, "
      f"cu_seq {cu_seq.tolist()}, max_len {max_len}; the prompts' own tokens: {torch.equal(packed, torch.cat(seqs))}")

# %% [markdown]
# ## Exercise 3: what the backward runs
#
# Training runs SDPA twice: the forward, and its backward when `loss.backward()` reaches it. Which kernel
# runs the backward? Write `backward_ops(q, k, v, **kwargs)`: run `F.scaled_dot_product_attention(q, k, v,
# **kwargs)` on copies of `q`, `k`, `v` that require grad (the caller's tensors stay as they were), then
# record with a `TorchDispatchMode` of your own the name (`func.name()`) of every aten op that
# `out.backward(torch.ones_like(out))` dispatches, and return the names as a list: the backward's ops only,
# none of the forward's (make the gradient before or inside the mode, as you like). A dispatch mode's
# `__torch_dispatch__(self, func, types, args=(), kwargs=None)` sees each aten op and must run it:
# `return func(*args, **(kwargs or {}))`. `attention.backward_backend_from_ops(names)`
# names the backend from them: a fused backend's backward is one op of its own (its forward op's name with
# `_backward`), MATH's is ordinary ops (`bmm`, `_softmax_backward_data`). The check runs calls where the
# fused forward declines for a reason other than dropout, so only the ops that really ran give the right
# answer.
#
# On this CPU, `dropout_p=0.2` sends the forward to MATH (lesson 06). Before you write it:

# %% tags=["predict"]
backward_guess = predict("With dropout_p=0.2, which backend runs the backward of that SDPA call on this CPU?",
                         options=("FLASH_ATTENTION", "MATH"), example="FLASH_ATTENTION")

# %%
from torch.utils._python_dispatch import TorchDispatchMode

def backward_ops(q, k, v, **kwargs) -> list[str]:
    ### BEGIN SOLUTION
    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.name())
            return func(*args, **(kwargs or {}))

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    grad = torch.ones_like(out)
    with Record() as rec:
        out.backward(grad)
    return rec.names
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("06_attention_lab", backward_ops)

# %%
# your recorder in use: the forward's backend and the backward's, by default and with dropout
x = torch.randn(1, 2, 32, 16)
for kwargs in ({}, {"dropout_p": 0.2}):
    forward = attention.backend_that_runs(x, x, x, **kwargs)
    backward = attention.backward_backend_from_ops(backward_ops(x, x, x, **kwargs))
    print(f"{kwargs or 'defaults'}: forward {forward}, backward {backward}")

# %% tags=["reveal"]
reveal(backward_guess, backward,
       why=f"the forward ran on {forward}, and autograd recorded that forward's own derivative when it ran: the "
           f"backward is that, {backward}. A backend the forward declined never runs the backward, so what a "
           f"training step costs follows the forward's choice twice")


# %% [markdown]
# ## Exercise 4: bucket by length
#
# Padding everything to the longest sequence wastes most of the score matrix when lengths are uneven.
# Write `bucketed_attention(seqs, n_buckets)`: sort the sequences by length, split the sorted list into
# exactly `n_buckets` runs of consecutive lengths (fewer only when there are fewer sequences than
# buckets: skip the empty ones; and beware, `torch.chunk` can return fewer chunks than asked for), call
# `attention.padded_attention` once per bucket, and return the outputs **in the original order**. The
# check sees your buckets by recording the lengths of each `attention.padded_attention` call your
# function makes.

# %%
def bucketed_attention(seqs: list[torch.Tensor], n_buckets: int) -> list[torch.Tensor]:
    ### BEGIN SOLUTION
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs: list[torch.Tensor | None] = [None] * len(seqs)
    for bucket in torch.tensor(order).tensor_split(n_buckets):
        idx = bucket.tolist()
        if not idx:
            continue
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("06_attention_lab", bucketed_attention)

# %% tags=["nbval-check-output"]
# your buckets on this batch, recorded the way the check records them: the lengths of each
# attention.padded_attention call, and the share of their score entries spent on padding
buckets = [b for b in padded_attention_calls(bucketed_attention, seqs, 2) if b]
scores = lambda b: len(b) * max(b) ** 2      # the score entries of one padded call
print(f"lengths per padded_attention call: {buckets}")
if buckets:
    waste = sum(attention.wasted_fraction(b) * scores(b) for b in buckets) / sum(scores(b) for b in buckets)
    print(f"padding share of the scores: one padded batch {attention.wasted_fraction(LENGTHS):.0%}, "
          f"your {len(buckets)} buckets {waste:.0%}")


# %% [markdown]
# ## Exercise 5: a prefix-LM mask for packed documents (FlexAttention)
#
# Pack several documents into one row of `sum(lengths)` tokens, as for `varlen_attn`. Each document
# starts with a prompt of `prefix` tokens that is read **bidirectionally** (every token of the document,
# including earlier prompt tokens, sees the whole prompt), and the rest is causal: a token sees the keys
# of its own document up to and including itself, plus its document's prompt. A document shorter than
# `prefix` is all prompt. No token sees another document.
#
# Lesson 06's masks (same document, a sliding window) compare indices in the packed row. This one needs
# a token's position **inside its document**: derive it, as tensors built once outside `mask_mod`, then
# write `prefix_lm_mask_mod(lengths, prefix)` returning a `mask_mod(b, h, q_idx, kv_idx)`. The check
# builds the dense mask with `create_mask` (what `create_block_mask` calls) and compares it with the
# intended one; the cell after it runs `flex_attention` with your block mask.

# %%
def prefix_lm_mask_mod(lengths: list[int], prefix: int):
    ### BEGIN SOLUTION
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    starts = torch.tensor([0] + list(lengths)).cumsum(0)[:-1]
    position = torch.arange(sum(lengths)) - starts[doc]

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & ((kv_idx <= q_idx) | (position[kv_idx] < prefix))
    return mask_mod
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("06_attention_lab", prefix_lm_mask_mod)

# %%
# your mask in use: flex_attention on the packed batch with your block mask, against SDPA with the dense
# mask your mask_mod gives (eager flex_attention is FlexAttention's unfused reference: a check, not speed)
import warnings

from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

PREFIX = 8
total = sum(LENGTHS)
q_flex, k_flex, v_flex = attention.packed_heads_first(seqs)
mod = prefix_lm_mask_mod(LENGTHS, PREFIX)
block_mask = create_block_mask(mod, None, None, total, total, device="cpu")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    flex_out = flex_attention(q_flex, k_flex, v_flex, block_mask=block_mask)
dense = create_mask(mod, None, None, total, total, device="cpu")
sdpa_out = F.scaled_dot_product_attention(q_flex, k_flex, v_flex, attn_mask=dense)
visited, tiles = attention.blocks_computed(block_mask)
print(f"flex_attention with your prefix-LM mask vs SDPA with its dense mask: max error "
      f"{(flex_out - sdpa_out).abs().max():.1e}; the fused kernel would visit {visited} of {tiles} tiles")

# %% [markdown]
# ## Exercise 6: choose the bucket count
#
# Exercise 4 took `n_buckets` as given; serving code has to choose it. The cell below measures, on this
# machine, the two costs of an `attention.padded_attention` call: `CALL_COST`, the seconds a call costs
# however little it holds, and `ENTRY_COST`, the seconds per (query, key) score it computes for one
# sequence (all heads together), padding included. Write
# `choose_bucket_count(lengths, call_cost, entry_cost, max_buckets)`: the count, from 1 to `max_buckets`,
# that makes your `bucketed_attention` cheapest on sequences of these lengths under these two costs, as a
# Python int. The check holds your count against the cheapest on lengths and costs it does not show
# you; the cell after it times every count on this notebook's batch.

# %%
from helpers import bench

TINY, LONG = [1], [128 if QUICK else 512]
tiny, long = attention.random_ragged(TINY, HEADS, HEAD_DIM), attention.random_ragged(LONG, HEADS, HEAD_DIM)
r = bench.compare({"a 1-token call": lambda: attention.padded_attention(tiny),
                   f"a {LONG[0]}-token call": lambda: attention.padded_attention(long)},
                  repeats=5, min_run_time=0.01 if QUICK else 0.1, device="cpu")
CALL_COST = r["results"]["a 1-token call"]["median_s"]
ENTRY_COST = max(r["results"][f"a {LONG[0]}-token call"]["median_s"] - CALL_COST, 0.0) / LONG[0] ** 2
MAX_BUCKETS = min(8, len(LENGTHS))
print(bench.table(r))
print(f"CALL_COST {CALL_COST * 1e6:.1f} us, ENTRY_COST {ENTRY_COST * 1e9:.3f} ns per score")


# %%
def choose_bucket_count(lengths: list[int], call_cost: float, entry_cost: float, max_buckets: int) -> int:
    ### BEGIN SOLUTION
    def cost(n_buckets):   # exercise 4's buckets: one call each, every score of the padded bucket paid
        runs = torch.tensor(sorted(lengths)).tensor_split(n_buckets)
        return sum(call_cost + entry_cost * len(run) * int(run.max()) ** 2 for run in runs if len(run))
    return min(range(1, max_buckets + 1), key=cost)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("06_attention_lab", choose_bucket_count)

# %%
# your count on this notebook's batch, against the time of every count (the spread decides what can be read)
chosen = choose_bucket_count(LENGTHS, CALL_COST, ENTRY_COST, MAX_BUCKETS)
name = lambda n: f"{n} bucket{'s' if n > 1 else ''}"
r = bench.compare({name(n): (lambda n=n: bucketed_attention(seqs, n)) for n in range(1, MAX_BUCKETS + 1)},
                  baseline=name(chosen), repeats=5, min_run_time=0.01 if QUICK else 0.1, device="cpu")
print(bench.table(r))
fastest = min(r["results"], key=lambda n: r["results"][n]["median_s"])
if fastest == name(chosen):
    print(f"your count, {chosen}, was the fastest measured")
elif not bench.separated(r, fastest, name(chosen)):
    print(f"your count, {chosen}, and the fastest, {fastest}, overlap over the repeats: too noisy here to tell; "
          f"run again or use fewer threads")
else:
    print(f"the fastest was {fastest}, not your {chosen}: the two costs leave out the work a call does per token "
          f"(pad_sequence's copy, the mask, the outputs cut back), which weighs most where lengths are short")

# %% [markdown]
# ## Measure (not checked): one padded batch vs buckets vs jagged

# %%
r = bench.compare({"one padded batch": lambda: attention.padded_attention(seqs),
                   f"your {name(chosen)}": lambda: bucketed_attention(seqs, chosen),
                   "jagged nested": lambda: attention.jagged_attention(seqs)},
                  repeats=3, min_run_time=0.01 if QUICK else 0.1, device="cpu")
print(bench.table(r))
