# %% [markdown]
# # 06 · Attention kernels: which SDPA kernel runs, ragged batches, varlen_attn and FlexAttention
#
# | | |
# |---|---|
# | **What you will learn** | which kernel `F.scaled_dot_product_attention` runs and why: constraints, priority order (per release and cuDNN); the memory the MATH fallback spends, measured; ragged batches: padding + mask, jagged nested tensors, 2.10's `varlen_attn`; FlexAttention for masks SDPA cannot express: how `create_block_mask` builds its mask, and a window mask of your own |
# | **Prerequisites** | lesson 00; what attention computes (softmax(QKᵀ/√d)·V) |
# | **Hardware** | any CPU. On an NVIDIA or AMD GPU with a flash kernel (not Colab's T4) the backend story runs there, in bf16 |
# | **Time** | 43 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); 2.10 facts from its release notes and sources (`torch/nn/attention/`) |
#
# The story: one function, several kernels → which one runs, and why → what the fallback costs →
# batches of unequal lengths (2.10's `varlen_attn`) → masks SDPA cannot express.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/06_attention_kernels.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
SEQ_LENS = [256, 512, 1024, 2048]
HEADS, HEAD_DIM = 4, 64
RAGGED_LENGTHS = [33, 500, 61, 1024, 12, 700, 90, 256]

# %%
import warnings

import torch
import torch.nn.functional as F

from helpers import attention, bench
from helpers.device import capabilities, pick_device, quick_mode
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SEQ_LENS, RAGGED_LENGTHS = [256, 512], [17, 40, 9, 128, 300]
# The story runs on an NVIDIA or AMD GPU ("cuda" to torch) whose flash kernel runs, in bf16 (fp16 without
# bf16: CUDA's flash takes fp16/bf16 only); elsewhere (CPU, Intel or Apple GPU, T4) on the CPU in fp32.
GPU_DTYPE = torch.bfloat16 if capabilities().bf16 else torch.float16
GPU_FLASH = DEVICE.type == "cuda" and attention.flash_runs_on(DEVICE, GPU_DTYPE)
STORY = DEVICE if GPU_FLASH else torch.device("cpu")
STORY_DTYPE = GPU_DTYPE if GPU_FLASH else torch.float32
if DEVICE.type == "cuda" and not GPU_FLASH:
    print(f"SDPA's flash kernel does not run on this GPU ({capabilities().arch}; CUDA's needs sm80+), so the backend "
          "story below runs on the CPU.")
if STORY.type == "cuda":
    SEQ_LENS = [1024, 4096] if QUICK else [1024, 2048, 4096, 8192]
MIN_RUN_S = 0.02 if QUICK else 0.1
TIMING_THREADS, TIMING_REPEATS = 1, 5 if QUICK else 7     # the timing a reveal quotes: fixed threads, more repeats
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · the backend story on {STORY} in "
      f"{str(STORY_DTYPE).removeprefix('torch.')} · quick={QUICK}")

# %% [markdown]
# ## One function, several kernels
#
# `F.scaled_dot_product_attention(q, k, v)` (SDPA) takes `(batch, heads, seq, head_dim)` tensors and runs
# one of the backends of `torch.nn.attention.SDPBackend`:
#
# | backend | what it is | where it exists |
# |---|---|---|
# | `MATH` | matmul → softmax → matmul in ordinary ops; writes the seq × seq scores; takes any input | every device |
# | `FLASH_ATTENTION` | tiled; never writes the scores | CPU (its own kernel); NVIDIA sm80+ in fp16/bf16; AMD |
# | `EFFICIENT_ATTENTION` | memory-efficient; takes masks and fp32 | NVIDIA, AMD |
# | `CUDNN_ATTENTION` | NVIDIA cuDNN's fused attention | NVIDIA |
#
# SDPA tries the backends in a **priority order** and runs the first whose checks the inputs pass (dtype,
# head size, mask, dropout, layout). On a CPU the order is fixed: flash, then MATH (`sdp_utils_cpp.cpp` in
# `aten/src/ATen/native/transformers/`). On CUDA it is `torch._C._get_sdp_priority_order()`, and it depends on
# the release and on the cuDNN loaded at run time (2.10 puts cuDNN first on sm90/sm100 only if it is newer
# than 9.15; the deep dive traces why): two wheels of one release can pick differently on the same H100, so
# print the order where you run.
#
# To see what ran, `torch.profiler` lists the ops of the call: a fused kernel under its own name, the
# fallback as `aten::_scaled_dot_product_attention_math`. `attention.backend_that_runs` records the ops
# with a `TorchDispatchMode` (lab 06 has you write it).

# %%
from torch.profiler import profile


def attention_ops(q, k, v, **kwargs):
    """The ops of one SDPA call whose names mention attention, as torch.profiler lists them."""
    with profile() as prof:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    return [e.key for e in prof.key_averages() if "attention" in e.key]


q = torch.randn(2, HEADS, 128, HEAD_DIM, device=STORY, dtype=STORY_DTYPE)
story_dtype = str(STORY_DTYPE).removeprefix("torch.")
print(f"{story_dtype}, causal:", attention_ops(q, q, q, is_causal=True))
print("CUDA priority order in this build:", attention.priority_order())

# %% tags=["predict"]
# the question whose answer differs by device: each device's flash kernel refuses something the other takes
QUESTION, PROMPT, OPTIONS = (
    ("boolean mask", f"The same {story_dtype} call with a boolean attn_mask: which backend runs on this GPU?",
     ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]) if STORY.type == "cuda" else
    ("dropout_p=0.1", "The same fp32 call, in training, with dropout_p=0.1: which backend runs on this CPU?",
     ["FLASH_ATTENTION", "MATH", "an error"]))
backend_guess = predict(PROMPT, options=OPTIONS, example="FLASH_ATTENTION")

# %%
mask_128 = torch.ones(128, 128, dtype=torch.bool, device=STORY).tril()
cases = {"causal": (q, q, q, {"is_causal": True}),
         "dropout_p=0.1": (q, q, q, {"dropout_p": 0.1}),
         "boolean mask": (q, q, q, {"attn_mask": mask_128}),
         "8 q heads, 2 k/v heads": (torch.randn(2, 8, 128, HEAD_DIM, device=STORY, dtype=STORY_DTYPE), q[:, :2],
                                    q[:, :2], {"enable_gqa": True})}
if STORY.type == "cuda":
    cases["fp32, causal"] = (q.float(), q.float(), q.float(), {"is_causal": True})
else:
    cases["bf16, boolean mask"] = (q.bfloat16(),) * 3 + ({"attn_mask": mask_128},)
ran = {label: attention.backend_that_runs(qq, kk, vv, **kw) for label, (qq, kk, vv, kw) in cases.items()}
for label, backend in ran.items():
    print(f"{label if ',' in label else story_dtype + ', ' + label:<32} {backend}")

# %% tags=["reveal"]
if STORY.type == "cuda":
    backend_why = (f"CUDA's flash kernel takes no attn_mask at all (check_for_attn_mask is among its checks in "
                   f"cuda/sdp_utils.cpp), so SDPA went on down this build's priority order "
                   f"({', '.join(attention.priority_order())}) to the first backend whose checks the call passes. "
                   f"Dropout, which the CPU's flash refuses, CUDA's flash takes (dropout_p=0.1 ran "
                   f"{ran['dropout_p=0.1']}); fp32 it does not (fp32 ran {ran['fp32, causal']}): flash on CUDA "
                   "is fp16/bf16 only. On a CPU it is the other way round: the same call picks differently per device.")
else:
    backend_why = ("the CPU flash kernel has no dropout (check_for_dropout is among its checks in sdp_utils_cpp.cpp), "
                   "so SDPA fell back to MATH. Masks, bf16 and grouped k/v heads passed its checks. On CUDA, flash "
                   "does take dropout and takes no attn_mask at all: the same call picks differently per device.")
reveal(backend_guess, ran[QUESTION], why=backend_why);

# %% [markdown]
# ## What the fallback costs: the score matrix
#
# MATH writes the `batch × heads × seq × seq` scores, then their softmax, before the second matmul; flash
# keeps one tile per thread and writes only the output and one log-sum-exp per row.
# `attention.forward_peak_memory` reads the peak one causal forward held beyond its inputs
# (`torch.profiler(profile_memory=True)` on a CPU, the allocator's statistics on a GPU).
# `attention.time_backends` times both (on a CPU at `TIMING_THREADS` thread).

# %% tags=["predict"]
memory_guess = predict(f"At seq {SEQ_LENS[-1]} ({HEADS} heads × {HEAD_DIM}, {story_dtype}, on {STORY.type}), how many "
                       "times flash's peak memory will MATH's forward hold?", unit="x", example=4.0)

# %% tags=["predict"]
bf16_guess = predict(f"Halve the bytes per element: the same MATH forward in bf16 at seq {SEQ_LENS[-1]}. Its peak "
                     "memory against fp32's?", options=["about half", "about the same", "about double"],
                     example="about half")

# %%
memory = attention.forward_peak_memory(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, dtype=STORY_DTYPE, device=STORY)
math_dtypes = {story_dtype: memory["peak_bytes"][SEQ_LENS[-1]]["MATH"]}
for other in {torch.bfloat16, torch.float32} - {STORY_DTYPE}:     # MATH in the other dtype, at the longest length
    math_dtypes[str(other).removeprefix("torch.")] = attention.forward_peak_memory(
        SEQ_LENS[-1:], heads=HEADS, head_dim=HEAD_DIM, backends=("MATH",), dtype=other, device=STORY
    )["peak_bytes"][SEQ_LENS[-1]]["MATH"]
timing = attention.time_backends(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, repeats=TIMING_REPEATS,
                                 min_run_time=MIN_RUN_S, dtype=STORY_DTYPE, device=STORY, threads=TIMING_THREADS)
bench.save_json({"memory": memory, "timing": timing}, "runs/06_sdpa_math_vs_flash.json")
ms = {k: {n: {b: timing[k][n][b] * 1e3 for b in ("MATH", "FLASH_ATTENTION")} for n in SEQ_LENS}
      for k in ("median_s", "min_s", "max_s")}
where = f"at {timing['threads']} thread(s)" if STORY.type == "cpu" else f"on {capabilities().device_name}"
print(f"{story_dtype} on {STORY.type}; time: median (min-max) of {TIMING_REPEATS} repeats {where}")
for n in SEQ_LENS:
    peak, t, lo, hi = memory["peak_bytes"][n], ms["median_s"][n], ms["min_s"][n], ms["max_s"][n]
    print(f"seq {n:>5}: MATH {peak['MATH'] / 2**20:6.1f} MiB, {t['MATH']:.3g} ms ({lo['MATH']:.3g}-{hi['MATH']:.3g})   "
          f"FLASH {peak['FLASH_ATTENTION'] / 2**20:5.2f} MiB, {t['FLASH_ATTENTION']:.3g} ms "
          f"({lo['FLASH_ATTENTION']:.3g}-{hi['FLASH_ATTENTION']:.3g})   "
          f"(one fp32 score matrix: {memory['score_matrix_bytes'][n] / 2**20:5.1f} MiB)")
longest = SEQ_LENS[-1]
assert memory["peak_bytes"][longest]["MATH"] >= memory["score_matrix_bytes"][longest], "MATH holds the scores"
assert memory["peak_bytes"][longest]["FLASH_ATTENTION"] < memory["score_matrix_bytes"][longest], "flash never does"
bf16_ratio = math_dtypes["bfloat16"] / math_dtypes["float32"]
print(f"MATH at seq {longest}: bf16 {math_dtypes['bfloat16'] / 2**20:.1f} MiB, fp32 {math_dtypes['float32'] / 2**20:.1f} "
      f"MiB: bf16 holds {bf16_ratio:.2f} of fp32's")

# %% tags=["reveal"]
math_peak, flash_peak = (memory["peak_bytes"][longest][b] for b in ("MATH", "FLASH_ATTENTION"))
speed = timing["median_s"][longest]["MATH"] / timing["median_s"][longest]["FLASH_ATTENTION"]
if not timing["separated"][longest]:          # the min-max ranges overlap: no direction can be read from this run
    time_verdict = ("Time: MATH and flash's spreads overlapped at that length, too noisy here to tell; run again"
                    + (" or use fewer threads." if STORY.type == "cpu" else "."))
else:
    time_verdict = (f"Time: flash was {speed:.1f}x faster here at that length (spreads apart)." if speed > 1 else
                    f"Time: flash was {1 / speed:.1f}x slower here at that length (spreads apart).")
reveal(memory_guess, math_peak / flash_peak,
       why=f"MATH held {math_peak / memory['score_matrix_bytes'][longest]:.1f} score matrices at once (the scores, "
           f"their softmax, a temporary); flash held {flash_peak / 2**20:.2f} MiB, a few tiles and the output. "
           f"The gap grows with seq²: from seq {SEQ_LENS[0]} to {longest} MATH's peak grew "
           f"{math_peak / memory['peak_bytes'][SEQ_LENS[0]]['MATH']:.0f}x. In training it stays alive until the "
           "backward, per layer. " + time_verdict);
reveal(bf16_guess, "about half" if bf16_ratio < 0.75 else "about the same" if bf16_ratio < 1.5 else "about double",
       why=f"bf16 held {bf16_ratio:.2f} of fp32's peak. MATH upcasts fp16/bf16 inputs and keeps every intermediate "
           "in fp32 (the SDPA docstring in torch/nn/functional.py; "
           f"torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() is "
           f"{torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()}), plus fp32 copies of q, k and v, measured "
           f"here on {STORY.type}: a half-precision call that falls back to MATH costs fp32 scores.");

# %% [markdown]
# ## Ragged batches: padding, jagged nested tensors, varlen_attn
#
# Real batches hold sequences of different lengths. Three ways to run attention over them:
#
# 1. **Pad + mask**: pad to the longest, pass a boolean `attn_mask` that is `True` on real keys. Simple,
#    but the kernel computes scores for the padding too, `batch × longest²` of them.
# 2. **Jagged nested tensor**: `torch.nested.nested_tensor_from_jagged(values, offsets)` holds the packed
#    tokens and their offsets; SDPA takes it directly, no padding stored.
# 3. **`torch.nn.attention.varlen.varlen_attn`** (new in 2.10,
#    [PR #164502](https://github.com/pytorch/pytorch/pull/164502), release issue #171814): the same packed
#    tokens and int32 offsets (`cu_seq_q`, `cu_seq_k`) go to a flash kernel that never sees padding. NVIDIA
#    only (A100 or newer), fp16/bf16.
#
# `attention.pack` builds the packed `(total_tokens, heads, head_dim)` tensor and the offsets that 2 and 3 use.

# %%
seqs = attention.random_ragged(RAGGED_LENGTHS, HEADS, HEAD_DIM)
packed, offsets, longest_seq = attention.pack(seqs)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")                  # on a CPU the jagged path warns "prototype stage"
    outs = {"padded + mask": attention.padded_attention(seqs), "jagged nested": attention.jagged_attention(seqs)}
    jagged_backend = attention.backend_that_runs(*(torch.nested.nested_tensor_from_jagged(packed, offsets.long())
                                                   .transpose(1, 2),) * 3)

# %% tags=["nbval-check-output"]
print("lengths:", RAGGED_LENGTHS)
print("packed:", tuple(packed.shape), "offsets:", offsets.tolist(), offsets.dtype, "longest:", longest_seq)
print(f"share of a padded batch's scores spent on padding: {attention.wasted_fraction(RAGGED_LENGTHS):.0%}")
for name, out in outs.items():
    err = attention.max_error(out, seqs)
    assert err < 1e-4, (name, err)
    print(f"{name:<14} matches the per-sequence float64 reference (max error < 1e-4)")
print("jagged SDPA on this CPU ran:", jagged_backend)

# %% [markdown]
# On a CPU the jagged path is `MATH` over a conversion to the older strided nested layout
# (`torch/nested/_internal/sdpa.py`, which is what warns "prototype stage"); on CUDA it can use the flash
# and memory-efficient kernels without padding. `varlen_attn` has no CPU kernel (`NotImplementedError`); on
# the `meta` device its shape function runs, which checks the contract here: packed in, packed out.

# %%
from torch.nn.attention.varlen import varlen_attn

meta_out = attention.varlen_attention([s.to("meta", torch.bfloat16) for s in seqs], causal=True)
assert [o.shape for o in meta_out] == [s.shape for s in seqs]
print("varlen_attn on meta: one", tuple(meta_out[0].shape[1:]), "output per token,", meta_out[0].dtype)
print("causal is asked with", attention.varlen_causal_kwargs(), "in torch", torch.__version__)
try:
    varlen_attn(packed.bfloat16(), packed.bfloat16(), packed.bfloat16(), offsets, offsets, longest_seq, longest_seq)
except NotImplementedError as exc:
    print("on CPU:", type(exc).__name__ + ":", str(exc).split(". ")[0])

# %% [markdown]
# The signature changed after 2.10: 2.10's `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
# is_causal=False, return_aux=None)` (`torch/nn/attention/varlen.py`) asks for causal masking with
# `is_causal=True`; later releases dropped `is_causal` for `window_size=(-1, 0)`.
# `attention.varlen_causal_kwargs()` reads the installed signature.

# %% [markdown]
# ## FlexAttention: the masks SDPA cannot express
#
# SDPA knows two masks by name: `is_causal=True` (aligned to the top left) and, through `attn_mask`, the
# `causal_lower_right` bias of `torch.nn.attention.bias`. Anything else is a dense `attn_mask`: `seq × seq`
# values in memory, and every block of scores computed, even where the mask removes all of them. Pack a
# ragged batch into one row of `total` tokens and a token may only see its own sequence: a block-diagonal
# **document mask**, mostly empty. Sliding windows and prefix-LM masks are the same story.
#
# `torch.nn.attention.flex_attention` (since 2.5) takes the mask as a function,
# `mask_mod(b, h, q_idx, kv_idx) -> bool`; `create_block_mask` turns it into a `BlockMask`. How, in
# `torch/nn/attention/flex_attention.py` (2.10 and 2.13 alike):
#
# - it calls `mask_mod` **once**, vmapped over index tensors for the whole `Q_LEN × KV_LEN` grid
#   (`create_mask`), which builds the full boolean mask; so `mask_mod` is tensor code, no Python `if`;
# - it sums that mask per `BLOCK_SIZE × BLOCK_SIZE` tile (128 by default): a tile with no `True` is
#   skipped, an all-`True` one is "full" (no mask applied), the rest "partial" (the kernel applies
#   `mask_mod` per element there).
#
# Building the mask thus costs time and memory in `Q_LEN × KV_LEN`: build it once per batch, share it
# across layers, and for long sequences compile it, `torch.compile(create_block_mask)` (2.10's own warning
# for `_compile=True` recommends it; the deep dive measures it). The kernel then visits only non-empty tiles.

# %%
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

doc = attention.document_ids(RAGGED_LENGTHS)       # the sequence each packed token belongs to
total = sum(RAGGED_LENGTHS)


def same_document(b, h, q_idx, kv_idx):
    return doc[q_idx] == doc[kv_idx]


calls = []
def counted(b, h, q_idx, kv_idx):                   # the same mask, counting its Python calls
    calls.append(tuple(q_idx.shape))
    return same_document(b, h, q_idx, kv_idx)


mask_bytes = attention.cpu_peak_bytes(lambda: create_block_mask(counted, None, None, total, total, device="cpu"))
doc_mask = create_block_mask(same_document, None, None, total, total, device="cpu")
visited, total_blocks = attention.blocks_computed(doc_mask)
print(f"{len(RAGGED_LENGTHS)} sequences packed into {total} tokens: create_block_mask called mask_mod {len(calls)} "
      f"time(s), q_idx of shape {calls[0]} under vmap; peak memory {mask_bytes / 2**20:.1f} MiB "
      f"({total}² booleans are {total**2 / 2**20:.1f} MiB)")
print(f"block mask {doc_mask.BLOCK_SIZE}: the kernel visits {visited} of {total_blocks} tiles")

# %% [markdown]
# `flex_attention` called eagerly runs an unfused reference that computes the whole `total × total` score
# matrix (it warns): good for checking a mask, not for speed. `torch.compile(flex_attention)` generates the
# fused kernel; the deep dive times it against padding.

# %%
q_flex, k_flex, v_flex = attention.packed_heads_first(seqs)          # (1, heads, total, head_dim) each
with warnings.catch_warnings():
    warnings.simplefilter("ignore")                                  # eager flex warns that it is unfused
    flex_out = flex_attention(q_flex, k_flex, v_flex, block_mask=doc_mask)
err = attention.max_error(attention.split_heads_first(flex_out, RAGGED_LENGTHS), seqs)
assert err < 1e-4, err
print(f"flex eager matches the per-sequence float64 reference (max error {err:.1e})")

# %% [markdown]
# ### Your turn: a sliding window inside each document
#
# Local attention: a token sees itself and the `WINDOW - 1` tokens before it, and only within its own
# document. Edit the one `return` line of `my_mask_mod`. The check compares your mask (via `create_mask`) with
# a dense one written in ordinary tensor code, then `flex_attention` with your block mask against SDPA with it.

# %% tags=["your-turn"]
WINDOW = 32


def my_mask_mod(b, h, q_idx, kv_idx):
    return doc[q_idx] == doc[kv_idx]


# %%
from torch.nn.attention.flex_attention import create_mask

from helpers.checks import check_close, check_equal, your_turn


def check_window():
    i, j = torch.arange(total)[:, None], torch.arange(total)[None, :]
    dense = (doc[:, None] == doc[None, :]) & (j <= i) & (i - j < WINDOW)
    mine = create_mask(my_mask_mod, None, None, total, total, device="cpu")[0, 0]
    check_equal(mine, dense, what="my_mask_mod against the dense window mask",
                hint=f"{int((mine & ~dense).sum())} pairs allowed that should not be, {int((dense & ~mine).sum())} "
                     "missing; combine conditions with &, and compare q_idx with kv_idx")
    block_mask = create_block_mask(my_mask_mod, None, None, total, total, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex_attention(q_flex, k_flex, v_flex, block_mask=block_mask)
    check_close(got, F.scaled_dot_product_attention(q_flex, k_flex, v_flex, attn_mask=dense), atol=1e-4,
                what="flex_attention with your block mask against SDPA with the dense mask")
    print(f"your window mask visits {attention.blocks_computed(block_mask)[0]} of {total_blocks} tiles")


your_turn(check_window, what="a sliding-window document mask");

# %% [markdown]
# ## Going further
#
# [The deep dive](06_attention_kernels_deep_dive.ipynb) holds the rest, measured or run where the hardware
# allows: flash vs MATH speed against the CPU's peak; forcing a backend with `sdpa_kernel`, the error when
# none fits and its reasons, and a your-turn that makes flash eligible; the backward per backend;
# grouped-query attention and `causal_lower_right` for decoding; SDPA backends on an NVIDIA GPU (your wheel's
# priority order, accuracy, memory, time) and the opt-in FA4; AOTriton vs Composable Kernel on ROCm; what
# `torch.compile(create_block_mask)` saves; compiled FlexAttention timed against padding; `varlen_attn`
# checked and timed on a GPU, and ragged training there; what `torch.compile` gives a transformer block;
# pitfalls. Read it before you choose attention kernels for
# training or move to AMD GPUs. Then [lab 06](../labs/06_attention_lab.ipynb): build the key mask, pack for
# `varlen_attn`, write the op recorder that names the kernel, bucket by length.
