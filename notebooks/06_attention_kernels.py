# %% [markdown]
# # 06 · Attention kernels: SDPA backends, ragged batches, varlen_attn, and what torch.compile really gives
#
# | | |
# |---|---|
# | **What you will learn** | how `F.scaled_dot_product_attention` picks a kernel and how to see which one ran; restricting it with `torch.nn.attention.sdpa_kernel`; ragged batches three ways (padding + mask, jagged nested tensors, 2.10's `varlen_attn`); FlexAttention with a document mask on packed sequences (eager vs compiled, what runs on CPU); why a backend declined, from its warnings; forward + backward and peak memory of MATH vs flash, measured; grouped-query attention with `enable_gqa`; the ROCm flash library switch; an honest measurement of `torch.compile` on a transformer block |
# | **Prerequisites** | lesson 00; what attention computes (softmax(QKᵀ/√d)·V) |
# | **Hardware** | any CPU. An NVIDIA GPU (A100 or newer for `varlen_attn`) runs the GPU sections; an AMD GPU runs the ROCm section |
# | **Time** | 55 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build), 2.14.1+cu130 (env latest: CUDA 13.0 build, no GPU) (make matrix, 2026-12-02); 2.10 facts from its release notes and sources (`torch/nn/attention/`) |
#
# The 2.0 release called this "accelerated transformers": one function,
# `F.scaled_dot_product_attention` (SDPA), with several kernels behind it. 2.10 added
# `torch.nn.attention.varlen.varlen_attn` for packed variable-length batches ([PR #164502](https://github.com/pytorch/pytorch/pull/164502); release
# feature issue [#171814](https://github.com/pytorch/pytorch/issues/171814)).

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
SEQ_LENS = [128, 256, 512, 1024, 2048]
HEADS, HEAD_DIM = 4, 64
RAGGED_LENGTHS = [33, 500, 61, 1024, 12, 700, 90, 256]

# %%
import warnings

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import attention, bench
from helpers.device import capabilities, pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SEQ_LENS, RAGGED_LENGTHS = [128, 256, 512], [17, 40, 9, 128]
torch.manual_seed(0)
print(f"torch {torch.__version__} · device {DEVICE} · quick={QUICK}")

# %% [markdown]
# ## The idea: one function, several kernels
#
# `F.scaled_dot_product_attention(q, k, v)` takes `(batch, heads, seq, head_dim)` tensors. Behind it sit
# the backends of `torch.nn.attention.SDPBackend`: `MATH` (the plain composition of matmul, softmax,
# matmul, which materialises the seq × seq score matrix), `FLASH_ATTENTION` (tiled, never materialises
# it), `EFFICIENT_ATTENTION` (memory-efficient, CUDA/ROCm), `CUDNN_ATTENTION` (NVIDIA cuDNN). For each
# call, PyTorch checks the inputs against each backend's constraints and takes the first that fits.
#
# To *see* which ran, `helpers.attention.backend_that_runs` runs the call inside a small
# `TorchDispatchMode` that records the name of every aten op dispatched: a fused backend shows up as its
# own op (`aten::_scaled_dot_product_flash_attention_for_cpu`, ...), while `MATH` is a composition of
# ordinary ops (`bmm`, `_safe_softmax`). (`torch.profiler` shows the same, with the math path named
# `aten::_scaled_dot_product_attention_math`.) `sdpa_kernel([...])` restricts the choice.

# %%
q = torch.randn(2, HEADS, 64, 32)
choices = {"default choice, 4-D fp32": attention.backend_that_runs(q, q, q),
           "with dropout_p=0.1": attention.backend_that_runs(q, q, q, dropout_p=0.1),
           "3-D input (no batch dim)": attention.backend_that_runs(q[0], q[0], q[0]),
           "causal, bf16": attention.backend_that_runs(*(q.bfloat16(),) * 3, is_causal=True)}
alone = attention.backend_report(q, q, q)

# %%
print("backends torch knows:", [b for b in SDPBackend.__members__ if b != "ERROR"])
for label, backend in choices.items():
    print(f"{label:<26} {backend}")
print("\nEach backend alone, on this device:")
for name, outcome in alone.items():
    print(f"  {name:<20} {outcome}")

# %% [markdown]
# On the CPU build, `FLASH_ATTENTION` and `MATH` run; `EFFICIENT_ATTENTION` and `CUDNN_ATTENTION`
# have no CPU kernel, so allowing only them fails with the error above. Dropout makes the CPU flash
# kernel decline, and SDPA falls back to `MATH` (the CPU selection logic lives in
# `aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`). 3-D inputs depend on the release: torch 2.10
# and 2.13 send them to `MATH`, torch 2.14 runs them with the flash kernel (this collection's matrix of
# environments ran all three); the table above says what the installed torch did.
#
# `OVERRIDEABLE`, the last name in the list, is not a kernel of this build: it selects
# `aten::_scaled_dot_product_fused_attention_overrideable`, an op PyTorch declares with no real kernel
# of its own (its only in-tree registration is the generic `CompositeExplicitAutograd` one, see the
# headers under `torch/include/ATen/ops/`), so that a device backend shipped outside PyTorch can register
# its fused attention there, as `convolution_overrideable` does for convolutions. The enum's docstring
# calls it "The overridable backend for extension" (`torch/nn/attention/__init__.py`). On CPU and CUDA
# it never runs; allowing only it fails like `EFFICIENT_ATTENTION` (see "Why did a backend decline?").
#
# ## Check: every backend that runs agrees with a float64 reference

# %% tags=["nbval-check-output"]
mask = torch.rand(64, 64) > 0.2
mask.fill_diagonal_(True)       # every query keeps at least one key
cases = {"plain": {}, "causal": {"is_causal": True}, "boolean mask": {"attn_mask": mask}}
for label, kwargs in cases.items():
    ref = attention.sdpa_reference(q, q, q, **kwargs)
    for backend in ("MATH", "FLASH_ATTENTION"):
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            out = F.scaled_dot_product_attention(q, q, q, **kwargs)
        err = (out - ref).abs().max().item()
        assert err < 1e-5, (label, backend, err)
        print(f"{label:<13} {backend:<16} matches the reference (max error < 1e-5)")

# %% [markdown]
# ## Measure: flash vs math as the sequence grows
#
# Causal self-attention, batch 1, fp32, each backend forced with `sdpa_kernel`, timed interleaved by
# `helpers.bench.compare`. MATH's work and memory grow with seq²; flash also does O(seq²) arithmetic
# but in cache-sized tiles, without writing the score matrix to memory.

# %%
timing = attention.time_backends(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, repeats=3,
                                 min_run_time=0.02 if QUICK else 0.1)
bench.save_json(timing, "runs/06_sdpa_backends.json")
for n in SEQ_LENS:
    t = timing["median_s"][n]
    print(f"seq {n:>5}: MATH {t['MATH'] * 1e3:8.2f} ms   FLASH {t['FLASH_ATTENTION'] * 1e3:8.2f} ms   "
          f"flash is {t['MATH'] / t['FLASH_ATTENTION']:.1f}x faster")

# %%
fig = go.Figure([go.Scatter(x=SEQ_LENS, y=[timing["median_s"][n][b] * 1e3 for n in SEQ_LENS],
                            mode="lines+markers", name=b) for b in timing["backends"]])
fig.update_layout(title=f"Causal SDPA on the CPU, {HEADS} heads × {HEAD_DIM}, fp32, "
                        f"{timing['threads']} threads", xaxis_title="sequence length",
                  yaxis_title="ms per call (log)", yaxis_type="log", xaxis_type="log", height=380)
fig.show()

# %% [markdown]
# **What the numbers mean.** At short sequences the two are close: the score matrix fits in cache and
# per-call overhead dominates. As the sequence grows MATH writes and re-reads a seq × seq matrix per
# head, and the gap widens. How wide it got here, and what share of this CPU's fp32 GEMM peak
# (measured by `helpers.bench`, as in lesson 00) each backend reached; a causal call does half of the
# two seq × seq × head_dim matmuls:

# %%
limits = bench.measure_limits(quick=True, device="cpu") if QUICK else bench.machine_limits(device="cpu")
flash_gain = {n: timing["median_s"][n]["MATH"] / timing["median_s"][n]["FLASH_ATTENTION"] for n in SEQ_LENS}
print(f"flash over math on this machine ({timing['threads']} threads): "
      + ", ".join(f"{gain:.2f}x at {n} tokens" for n, gain in flash_gain.items()))
print(f"this CPU's fp32 GEMM peak: {limits['fp32_gemm_gflops']:.0f} GFLOP/s ({limits['threads']} threads)")
for n in SEQ_LENS:
    gflops = {b: attention.attention_tflop(1, HEADS, n, HEAD_DIM) * 1e3 / timing["median_s"][n][b] for b in timing["backends"]}
    print(f"seq {n:>5}: " + "   ".join(f"{b} {g:6.1f} GFLOP/s ({bench.percent_of_limit(g, limits['fp32_gemm_gflops']):4.1f}% of peak)"
                                       for b, g in gflops.items()))

# %% [markdown]
# The ratio depends on the cache sizes and the thread count: re-run on your machine before you rely
# on it.

# %% [markdown]
# ## Memory: the score matrix MATH writes
#
# The claim above, measured: `helpers.attention.cpu_peak_bytes` runs one call under `torch.profiler`
# with `profile_memory=True` and reads the "Total Allocated" counter the profiler records after every
# allocation and free (in its trace), so the peak is what the call itself held at once, beyond its
# inputs. MATH builds the `batch × heads × seq × seq` score matrix (and its softmax); the flash kernel
# keeps one tile per thread and writes only the output and the log-sum-exp per row.

# %%
memory = attention.cpu_peak_memory_per_backend(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM)
bench.save_json(memory, "runs/06_sdpa_memory.json")
for n in SEQ_LENS:
    peak, scores = memory["peak_bytes"][n], memory["score_matrix_bytes"][n]
    print(f"seq {n:>5}: MATH {peak['MATH'] / 2**20:7.2f} MiB   FLASH {peak['FLASH_ATTENTION'] / 2**20:6.2f} MiB   "
          f"(one fp32 score matrix: {scores / 2**20:6.2f} MiB)")
longest = SEQ_LENS[-1]
assert memory["peak_bytes"][longest]["MATH"] >= memory["score_matrix_bytes"][longest], "MATH holds the scores"
assert memory["peak_bytes"][longest]["FLASH_ATTENTION"] < memory["score_matrix_bytes"][longest], "flash never does"
growth = {b: memory["peak_bytes"][longest][b] / memory["peak_bytes"][SEQ_LENS[0]][b] for b in memory["backends"]}
print(f"from seq {SEQ_LENS[0]} to {longest} ({longest // SEQ_LENS[0]}x longer, {(longest // SEQ_LENS[0])**2}x the "
      f"scores): MATH's peak grew {growth['MATH']:.1f}x, flash's {growth['FLASH_ATTENTION']:.1f}x")

# %%
fig = go.Figure([go.Scatter(x=SEQ_LENS, y=[memory["peak_bytes"][n][b] / 2**20 for n in SEQ_LENS],
                            mode="lines+markers", name=b) for b in memory["backends"]]
                + [go.Scatter(x=SEQ_LENS, y=[memory["score_matrix_bytes"][n] / 2**20 for n in SEQ_LENS],
                              mode="lines", line_dash="dot", name="one score matrix (seq²)")])
fig.update_layout(title=f"Peak memory of one causal forward on the CPU, {HEADS} heads × {HEAD_DIM}, fp32",
                  xaxis_title="sequence length", yaxis_title="MiB (log)", xaxis_type="log", yaxis_type="log",
                  height=380)
fig.show()

# %% [markdown]
# ## Training: forward and backward
#
# Inference is half the story: a training step runs the backward too. MATH's backward reads the
# probabilities it saved (the seq × seq matrix again); the CPU flash kernel saved only the output and
# the log-sum-exp per row and recomputes the scores tile by tile
# (`aten::_scaled_dot_product_flash_attention_for_cpu_backward`). First the check: the gradients of
# every backend against float64 autograd on the reference formula.

# %% tags=["nbval-check-output"]
qkv = [torch.randn(2, HEADS, 96, 32) for _ in range(3)]
for backend, err in attention.gradient_error_per_backend(*qkv).items():
    assert err < 1e-4, (backend, err)
    print(f"{backend:<16} dq, dk, dv match float64 autograd (max error < 1e-4)")

# %%
training = attention.time_training_step(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, repeats=3,
                                        min_run_time=0.02 if QUICK else 0.1)
bench.save_json(training, "runs/06_sdpa_training_step.json")
for n in SEQ_LENS:
    t, rate = training["median_s"][n], training["GFLOP_per_s"][n]
    print(f"seq {n:>5}: forward + backward  MATH {t['MATH'] * 1e3:8.2f} ms ({rate['MATH']:5.1f} GFLOP/s)   "
          f"FLASH {t['FLASH_ATTENTION'] * 1e3:8.2f} ms ({rate['FLASH_ATTENTION']:5.1f} GFLOP/s)   "
          f"flash {t['MATH'] / t['FLASH_ATTENTION']:.2f}x faster")
fig = go.Figure([go.Scatter(x=SEQ_LENS, y=[training["median_s"][n][b] * 1e3 for n in SEQ_LENS],
                            mode="lines+markers", name=b) for b in training["backends"]])
fig.update_layout(title=f"Causal SDPA forward + backward on the CPU, {HEADS} heads × {HEAD_DIM}, fp32, "
                        f"{training['threads']} threads", xaxis_title="sequence length",
                  yaxis_title="ms per step (log)", yaxis_type="log", xaxis_type="log", height=380)
fig.show()

# %% [markdown]
# GFLOP/s counts forward + backward as 3.5 times the forward's two matmuls, the convention of the
# FlashAttention benchmarks (Dao-AILab/flash-attention `benchmarks/benchmark_flash_attention.py`).
# In training, MATH's probabilities also stay alive from the forward to the backward, so the seq² memory
# measured above is held for the whole step, per layer.

# %% [markdown]
# ## Grouped-query attention: fewer key/value heads
#
# Llama-style models keep fewer key/value heads than query heads (GQA): each key/value head serves a
# group of query heads, so the KV cache shrinks by that factor. SDPA takes it with `enable_gqa=True`
# (added by PR #132689; present in torch 2.9.1, 2.10, 2.13 and 2.14 here): `key` and `value` may have
# `query_heads / groups` heads. Without the flag the shapes do not broadcast (the error below). The
# written-out equivalent repeats each key/value head for its group (`repeat_interleave` on the head
# dimension, as the SDPA docs show), which is what the check compares against. On CPU both backends
# take it: the flash checks in `sdp_utils_cpp.cpp` accept grouped heads.

# %%
q_heads, kv_heads = 8, 2
q_gqa = torch.randn(2, q_heads, 128, 32)
k_gqa, v_gqa = torch.randn(2, kv_heads, 128, 32), torch.randn(2, kv_heads, 128, 32)
k_rep, v_rep = attention.repeat_kv_heads(k_gqa, q_heads), attention.repeat_kv_heads(v_gqa, q_heads)
reference = attention.sdpa_reference(q_gqa, k_rep, v_rep, is_causal=True)
for backend in ("MATH", "FLASH_ATTENTION"):
    ran = attention.backend_that_runs(q_gqa, k_gqa, v_gqa, [backend], is_causal=True, enable_gqa=True)
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        out = F.scaled_dot_product_attention(q_gqa, k_gqa, v_gqa, is_causal=True, enable_gqa=True)
    err = (out - reference).abs().max().item()
    assert ran == backend and err < 1e-5, (backend, ran, err)
    print(f"enable_gqa=True with {backend:<16} ran {ran}, matches repeated k/v heads (max error < 1e-5)")
try:
    F.scaled_dot_product_attention(q_gqa, k_gqa, v_gqa)
except RuntimeError as exc:
    print("without enable_gqa:", type(exc).__name__ + ":", str(exc).splitlines()[0])

# %%
gqa = bench.compare({"enable_gqa=True": lambda: F.scaled_dot_product_attention(q_gqa, k_gqa, v_gqa, is_causal=True,
                                                                               enable_gqa=True),
                     "repeat k/v, then SDPA": lambda: F.scaled_dot_product_attention(
                         q_gqa, attention.repeat_kv_heads(k_gqa, q_heads), attention.repeat_kv_heads(v_gqa, q_heads),
                         is_causal=True)},
                    baseline="repeat k/v, then SDPA", repeats=3, min_run_time=0.02 if QUICK else 0.1, device="cpu")
print(bench.table(gqa))
print(f"keys and values held: {(k_gqa.nbytes + v_gqa.nbytes) / 2**10:.0f} KiB with {kv_heads} heads, "
      f"{(k_rep.nbytes + v_rep.nbytes) / 2**10:.0f} KiB repeated to {q_heads}: the KV cache GQA saves")

# %% [markdown]
# ## Try it: which kernel runs for which inputs?

# %%
import ipywidgets as widgets

from helpers.interactive import interact

def which_kernel(seq=64, dropout=False, three_d=False, bf16=False, restrict_to="(any)"):
    x = torch.randn(1, 2, seq, 32, dtype=torch.bfloat16 if bf16 else torch.float32)
    x = x[0] if three_d else x
    allowed = None if restrict_to == "(any)" else [restrict_to]
    try:
        print("ran:", attention.backend_that_runs(x, x, x, allowed, dropout_p=0.1 if dropout else 0.0))
    except RuntimeError as exc:
        print("error:", str(exc).splitlines()[0])

interact(which_kernel, seq=widgets.IntSlider(value=64, min=16, max=512, step=16),
                 restrict_to=widgets.Dropdown(options=["(any)", *attention.BACKENDS]));

# %% [markdown]
# ## Why did a backend decline?
#
# `sdpa_kernel([...])` restricts the choice; when no allowed backend fits, SDPA raises. On CPU the
# selection is `select_sdp_backend_cpp` in `aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`: it
# tries flash, then MATH if allowed; if neither was taken it **re-runs the flash checks with debug on**,
# so each failed check emits its reason with `TORCH_WARN`, which Python receives as a `UserWarning`
# before the `RuntimeError`. Catch the warnings (`helpers.attention.decline_reasons` does) to read them.
# Two cases give no reasons: allowing only backends with no CPU kernel (`EFFICIENT_ATTENTION`,
# `CUDNN_ATTENTION`, `OVERRIDEABLE`: the CPU selector returns an error before checking anything), and a
# shape error MATH itself raises. On CUDA the same mechanism (`sdp_utils.cpp`) warns per backend, and
# `torch.backends.cuda.can_use_flash_attention(SDPAParams(...), debug=True)` runs one backend's checks
# alone: for CUDA tensors only (on CPU tensors it says they must be on a CUDA device, or returns False on
# a CPU-only build).

# %%
q_odd_dim = torch.randn(1, 2, 16, 32)
cases = {"flash, dropout_p=0.1": (q, q, q, ["FLASH_ATTENTION"], {"dropout_p": 0.1}),
         "flash, v head_dim 16": (q_odd_dim, q_odd_dim, q_odd_dim[..., :16], ["FLASH_ATTENTION"], {}),
         "flash, 8 q heads / 2 kv heads, no enable_gqa": (q_gqa, k_gqa, v_gqa, ["FLASH_ATTENTION"], {}),
         "EFFICIENT_ATTENTION alone": (q, q, q, ["EFFICIENT_ATTENTION"], {}),
         "OVERRIDEABLE alone": (q, q, q, ["OVERRIDEABLE"], {})}
for label, (qq, kk, vv, allowed, kwargs) in cases.items():
    outcome, reasons = attention.decline_reasons(qq, kk, vv, allowed, **kwargs)
    print(f"{label}: {outcome}")
    for reason in reasons:
        print(f"    warning: {reason}")

# %% [markdown]
# ## Ragged batches: padding, jagged nested tensors, and varlen
#
# Real batches hold sequences of different lengths. Three ways to run attention over them:
#
# 1. **Pad + mask**: pad every sequence to the longest, pass a boolean `attn_mask` that is `True` on
#    real keys. Simple, but the kernel computes scores for the padding too.
# 2. **Jagged nested tensor**: `torch.nested.nested_tensor_from_jagged(values, offsets)` holds the
#    packed tokens plus offsets; SDPA accepts it directly. No padding is stored.
# 3. **`varlen_attn`** (2.10): the same packed tokens and int32 offsets (`cu_seq_q`, `cu_seq_k`) go to a
#    flash kernel that never sees padding. CUDA only, fp16/bf16, A100 or newer.
#
# `helpers.attention.pack` builds the packed `(total_tokens, heads, head_dim)` tensor and the offsets
# that both 2 and 3 use.

# %%
seqs = attention.random_ragged(RAGGED_LENGTHS, HEADS, HEAD_DIM)
packed, offsets, longest = attention.pack(seqs)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outs = {"padded + mask": attention.padded_attention(seqs),
            "jagged nested": attention.jagged_attention(seqs),
            "loop per sequence": attention.loop_attention(seqs)}
jagged_backend = attention.backend_that_runs(
    *(torch.nested.nested_tensor_from_jagged(packed, offsets.long()).transpose(1, 2),) * 3)

# %% tags=["nbval-check-output"]
print("lengths:", RAGGED_LENGTHS)
print("packed:", tuple(packed.shape), "offsets:", offsets.tolist(), "dtype", offsets.dtype, "longest:", longest)
print(f"share of a padded batch's scores spent on padding: {attention.wasted_fraction(RAGGED_LENGTHS):.0%}")
for name, out in outs.items():
    err = attention.max_error(out, seqs)
    assert err < 1e-4, (name, err)
    print(f"{name:<18} matches the per-sequence float64 reference (max error < 1e-4)")
print("jagged SDPA on CPU ran:", jagged_backend)
for w in {str(w.message).split(".")[0] for w in caught}:
    print("warning raised inside torch:", w)

# %% [markdown]
# On CPU, SDPA on a jagged tensor takes the `MATH` branch, which converts the jagged tensor to the
# older strided nested layout (`torch/nested/_internal/sdpa.py`); that conversion is what prints the
# "prototype stage" warning, although we did use the jagged layout. On CUDA the jagged path can use the
# flash and memory-efficient kernels without padding.

# %%
ragged = attention.time_ragged(RAGGED_LENGTHS, HEADS, HEAD_DIM, repeats=3, min_run_time=0.01 if QUICK else 0.1)
bench.save_json(ragged, "runs/06_ragged.json")
print(bench.table(ragged))
bench.plot(ragged, title=f"Ragged batch {RAGGED_LENGTHS} on the CPU").show()

# %% [markdown]
# **What the numbers mean.** Which wins depends on the lengths. The padded call computes scores for
# the padding; the loop computes none but pays one dispatch per sequence; on CPU the jagged path is the
# MATH fallback plus layout conversions. The padded score matrix is also where memory goes: it grows
# with `batch × longest²`. On a GPU, `varlen_attn` does neither padding nor per-sequence launches. This
# run, with its share of padding:

# %%
fastest = max(ragged["results"], key=lambda name: ragged["results"][name]["ratio_to_baseline"])
print(f"{ragged['wasted_fraction']:.0%} of the padded scores are padding; against the padded batch: "
      + ", ".join(f"{name} {r['ratio_to_baseline']:.2f}x" for name, r in ragged["results"].items())
      + f"; fastest here: {fastest}")

# %% [markdown]
# ## FlexAttention with a document mask: packed sequences without padding
#
# `torch.nn.attention.flex_attention` (since 2.5) takes the mask as a Python function. For a ragged
# batch, pack all sequences into **one** row of `total_tokens` (as `varlen_attn` does) and let a token
# see only the tokens of its own sequence: `mask_mod(b, h, q_idx, kv_idx) = doc[q_idx] == doc[kv_idx]`,
# with `doc` the sequence id of each packed token. `create_block_mask` evaluates it once per
# `BLOCK_SIZE × BLOCK_SIZE` tile (128 by default) and records, per query block, which key blocks are
# empty (skipped), full (no mask needed) or partial: the kernel then visits only the blocks near the
# diagonal.
#
# What runs where, read from the sources (`torch/nn/attention/flex_attention.py`,
# `torch/_inductor/kernel/flex/flex_cpu.py`) and tried below:
# - **eager** `flex_attention(...)` warns and runs an unfused implementation that materialises the
#   whole `total × total` score matrix (traced with `torch.compile(backend="eager")`): for checking a
#   mask, not for speed;
# - **`torch.compile(flex_attention)`** lowers to a fused kernel. On CPU it is a C++ template that tiles
#   by the mask's blocks and skips the empty ones; it needs AVX2 and not macOS, and serves inference
#   only (it raises for `return_lse`). torch 2.10's template also refuses one tensor passed as q, k and
#   v ("Unsupported for now if query, key, value are the same buffer"), so we pass three;
# - **backward on CPU**: torch 2.13 refuses any CPU input that requires grad ("FlexAttention does not
#   support backward on CPU"); torch 2.10 has no such check: its eager path differentiates, its compiled
#   one fails inside Inductor. The cell after the timing shows what the installed torch does.

# %%
from torch.nn.attention.flex_attention import flex_attention

doc_mask = attention.document_block_mask(RAGGED_LENGTHS)
q_flex, k_flex, v_flex = attention.packed_heads_first(seqs)          # (1, heads, total_tokens, head_dim) each
visited, total_blocks = attention.blocks_computed(doc_mask)
print(f"{len(RAGGED_LENGTHS)} sequences packed into {sum(RAGGED_LENGTHS)} tokens; block mask {doc_mask.BLOCK_SIZE}: "
      f"the kernel visits {visited} of {total_blocks} blocks")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    flex_eager_out = flex_attention(q_flex, k_flex, v_flex, block_mask=doc_mask)
for w in caught:
    print("eager flex_attention warns:", str(w.message).splitlines()[0])
flex_compiled, compile_s, compile_error = attention.compile_flex_attention(q_flex, k_flex, v_flex, doc_mask)
print(f"torch.compile(flex_attention): first call {compile_s:.1f} s, "
      + ("a fused CPU kernel" if flex_compiled else f"not available here: {compile_error}"))

# %%
flex_outs = {"flex eager": flex_eager_out}
if flex_compiled:
    flex_outs["flex compiled"] = flex_compiled(q_flex, k_flex, v_flex, block_mask=doc_mask)
for name, out in flex_outs.items():
    err = attention.max_error(attention.split_heads_first(out, RAGGED_LENGTHS), seqs)
    assert err < 1e-4, (name, err)
    print(f"{name:<14} matches the per-sequence float64 reference (max error {err:.1e})")

# %%
ragged_candidates = attention.ragged_kernels(seqs, varlen=False)      # inputs padded and packed once
ragged_candidates["flex eager (dense)"] = lambda: flex_attention(q_flex, k_flex, v_flex, block_mask=doc_mask)
if flex_compiled:
    ragged_candidates["flex compiled"] = lambda: flex_compiled(q_flex, k_flex, v_flex, block_mask=doc_mask)
flex_timing = bench.compare(ragged_candidates, baseline="padded + mask", repeats=3,
                            min_run_time=0.02 if QUICK else 0.1, device="cpu",
                            work=attention.ragged_tflop(RAGGED_LENGTHS, HEADS, HEAD_DIM) * 1e3, work_unit="GFLOP")
bench.save_json(flex_timing, "runs/06_ragged_flex.json")
print(bench.table(flex_timing))
for name, res in flex_timing["results"].items():
    print(f"{name:<20} {res['GFLOP_per_s']:6.2f} useful GFLOP/s (padding and skipped blocks not counted)")
bench.plot(flex_timing, title=f"Ragged batch {RAGGED_LENGTHS}, kernels only, on the CPU").show()

# %%
backward_outcomes = {"flex eager": attention.try_backward(
    lambda q, k, v: flex_attention(q, k, v, block_mask=doc_mask), q_flex, k_flex, v_flex)}
if flex_compiled:
    backward_outcomes["flex compiled"] = attention.try_backward(
        lambda q, k, v: flex_compiled(q, k, v, block_mask=doc_mask), q_flex, k_flex, v_flex)
for name, outcome in backward_outcomes.items():
    print(f"backward through {name} on CPU (torch {torch.__version__}): {outcome}")

# %% [markdown]
# **What the numbers mean.** The eager path computes and stores the full `total × total` scores, so it
# is the slowest and only good for checking a mask. The compiled kernel skips the blocks the document
# mask rules out, so its work follows the share of blocks printed above: with long sequences and a
# small block size most of the padding-free saving shows up; with short sequences most blocks on the
# diagonal are partial and it computes more than the useful work. On a GPU `torch.compile(flex_attention)`
# generates Triton kernels for forward and backward, in bf16, and this comparison is varlen_attn vs
# FlexAttention vs jagged vs padding (attention-gym has the mask library: https://github.com/meta-pytorch/attention-gym).

# %% [markdown]
# ## `varlen_attn`: shapes anywhere, numbers on a GPU
#
# On the CPU build, `varlen_attn` raises `NotImplementedError` (its flash kernel is CUDA-only). On the
# `meta` device it runs the op's shape function, so we can check the contract without a GPU: packed
# `(total_tokens, heads, head_dim)` in, the same shape out.

# %%
import inspect

from torch.nn.attention.varlen import varlen_attn

params = inspect.signature(varlen_attn).parameters
print(f"torch {torch.__version__}, installed signature: varlen_attn" + str(inspect.signature(varlen_attn)).split(" ->")[0])
keyword_only = [name for name, p in params.items() if p.kind is p.KEYWORD_ONLY]
print("keyword-only parameters:", ", ".join(keyword_only) or "none", "| has is_causal:", "is_causal" in params)
print("causal is requested with:", attention.varlen_causal_kwargs())
meta_seqs = [s.to("meta", torch.bfloat16) for s in seqs]
meta_out = attention.varlen_attention(meta_seqs, causal=True)
assert [o.shape for o in meta_out] == [s.shape for s in seqs]
print("meta output per sequence:", [tuple(o.shape) for o in meta_out][:3], "...", meta_out[0].dtype)
try:
    varlen_attn(packed.bfloat16(), packed.bfloat16(), packed.bfloat16(), offsets, offsets, longest, longest)
except NotImplementedError as exc:
    print("on CPU:", type(exc).__name__ + ":", str(exc).split(". ")[0])

# %% [markdown]
# The signature changed between 2.10 and 2.13. In the 2.10.0 wheel (`torch/nn/attention/varlen.py`) it is
# `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None)`:
# no keyword-only parameters, and causal masking is `is_causal=True`. In 2.13.0's source `is_causal` is
# gone; `return_aux`, `scale`, `window_size`, `enable_gqa`, `seqused_k`, `block_table` and `num_splits`
# are keyword-only, and causal masking is `window_size=(-1, 0)`. The cell above prints what the installed
# torch has. `attention.varlen_causal_kwargs()` reads that signature, so the same code runs on both.

# %%
if requires("cuda", "bf16", section="varlen_attn on the GPU"):
    gpu_seqs = attention.random_ragged(RAGGED_LENGTHS, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    for causal in (False, True):
        err = attention.max_error(attention.varlen_attention(gpu_seqs, causal=causal), gpu_seqs, causal=causal)
        assert err < 3e-2, err
        print(f"varlen_attn causal={causal}: max error vs float64 reference {err:.2e} (bf16)")
    # Timing at sizes where the kernels, not Python, dominate: inputs packed and padded beforehand, so a
    # timed call is one attention call (no packing, no host-to-device copy of the offsets)
    gpu_heads, gpu_head_dim = (16, 128) if QUICK else (32, 128)
    gpu_lengths = torch.randint(128, 2048 if QUICK else 4096, (8 if QUICK else 16,),
                                generator=torch.Generator().manual_seed(0)).tolist()
    big = attention.random_ragged(gpu_lengths, gpu_heads, gpu_head_dim, dtype=torch.bfloat16, device=DEVICE)
    r = bench.compare(attention.ragged_kernels(big), baseline="padded + mask", repeats=5, device=DEVICE,
                      work=attention.ragged_tflop(gpu_lengths, gpu_heads, gpu_head_dim), work_unit="TFLOP")
    print(f"{len(gpu_lengths)} sequences, {sum(gpu_lengths)} tokens, {gpu_heads} heads x {gpu_head_dim}; "
          f"padding would waste {attention.wasted_fraction(gpu_lengths):.0%} of a padded batch's scores")
    print(bench.table(r))
    for name, res in r["results"].items():
        print(f"{name:<16} {res['TFLOP_per_s']:6.1f} useful TFLOP/s (padding not counted)")
    bench.plot(r, title=f"Ragged batch on {capabilities().device_name}, bf16, kernels only").show()

# %%
if requires("torch_cuda", section="SDPA backends on the GPU"):
    qg = torch.randn(4, HEADS, 1024, HEAD_DIM, device=DEVICE, dtype=torch.float16)
    print("default choice, fp16:", attention.backend_that_runs(qg, qg, qg))
    for name, outcome in attention.backend_report(qg, qg, qg).items():
        print(f"  {name:<20} {outcome}")
    for name, err in attention.error_per_backend(qg).items():      # each backend forced, against float64
        print(f"  {name:<20} " + (err if isinstance(err, str) else f"max abs error vs float64 {err:.1e}"))
        assert isinstance(err, str) or err < 2e-2, f"{name} is off by {err} in fp16"
    q_long = torch.randn(1, HEADS, 8192, HEAD_DIM, device=DEVICE, dtype=torch.float16)
    peaks = attention.peak_memory_per_backend(q_long, ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"))
    scores_mib = HEADS * 8192**2 * 2 / 2**20
    print(f"peak memory of one causal forward at seq 8192 (one fp16 score matrix: {scores_mib:.0f} MiB): "
          + ", ".join(f"{b} {p / 2**20:.0f} MiB" for b, p in peaks.items()))
    gpu_timing = attention.time_backends([512, 2048, 8192], heads=HEADS, head_dim=HEAD_DIM, dtype=torch.float16,
                                         backends=("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"),
                                         device=DEVICE)
    for n, t in gpu_timing["median_s"].items():
        print(n, {b: f"{s * 1e3:.3f} ms" for b, s in t.items()})

# %% [markdown]
# ## On ROCm: AOTriton or Composable Kernel
#
# On AMD GPUs the flash and memory-efficient SDPA backends come from a library chosen by
# `torch.backends.cuda.preferred_rocm_fa_library()`: AOTriton (ahead-of-time compiled Triton kernels,
# the default) or CK (Composable Kernel), where the build includes it. This is not new in 2.10,
# whatever the article says about "AOTriton integration" (see the facts file). On other builds the
# call just reports the setting. Asking for CK does not prove CK ran: the setter only warns when CK
# cannot be used ("Attempting to use CK on an unsupported architecture! Cannot set backend to CK", in
# c10's `Context.cpp`), and both libraries run behind the same aten op. The cell below reads the
# kernels' names from the profiler (`fmha`/`ck_tile` for CK, `attn_fwd` for AOTriton) and times only a
# library that ran.

# %%
print("preferred ROCm flash-attention library here:", torch.backends.cuda.preferred_rocm_fa_library())
if requires("rocm", section="AOTriton vs CK on ROCm"):
    qr = torch.randn(4, HEADS, 2048, HEAD_DIM, device=DEVICE, dtype=torch.float16)
    before = torch.backends.cuda.preferred_rocm_fa_library()
    call = lambda: F.scaled_dot_product_attention(qr, qr, qr, is_causal=True)
    rocm_timing = {}
    try:     # the preference is global: restored whatever happens
        for lib in ("aotriton", "ck"):
            torch.backends.cuda.preferred_rocm_fa_library(lib)    # only warns when it cannot comply
            try:
                call()
            except RuntimeError as exc:
                print(f"{lib}: {str(exc).splitlines()[0]}")
                continue
            ran = attention.rocm_flash_library_that_ran(call)     # proof from the kernels' names
            print(f"asked for {lib}: the kernels came from {ran}")
            if ran != lib:
                print(f"  {lib} did not run here, so it is not timed")
                continue
            rocm_timing[lib] = bench.compare({lib: call}, repeats=5, device=DEVICE)["results"][lib]["median_s"]
    finally:
        torch.backends.cuda.preferred_rocm_fa_library(before)
    print("median per call (each library timed on its own, the preference set once):",
          {lib: f"{s * 1e3:.3f} ms" for lib, s in rocm_timing.items()})

# %% [markdown]
# ## torch.compile on a transformer block: the honest picture
#
# The 2.0 article quotes "a speedup between 1.5x and 2x in training Transformers models" from one line.
# That was a Hugging Face maintainer's quote. PyTorch's own 2.0 page
# (https://pytorch.org/get-started/pytorch-2.0/) reports, across 163 open-source models on an A100, training 43%
# faster on average (21% in fp32, 51% with AMP), and the numbers vary widely per model and shape. Here: a pre-norm block (LayerNorm, QKV projection, SDPA, MLP), inference, eager vs
# `torch.compile` at default settings. The first compiled call compiles; that time is reported
# separately. Timings use the thread count the block was compiled at: changing it later would trigger
# a recompile (lesson 08 shows it). This is inference under `no_grad`; the page's figures are training
# steps on a GPU, so they do not predict this number, and neither does this number predict theirs.

# %%
shapes = [(1, 32)] if QUICK else [(1, 32), (8, 256)]
compiled_runs = [attention.compile_and_compare(b, t, repeats=3, min_run_time=0.02 if QUICK else 0.2)
                 for b, t in shapes]
for r in compiled_runs:
    assert r["max_abs_diff"] < 1e-3, r["max_abs_diff"]
    print(f"batch {r['shape'][0]}, seq {r['shape'][1]}: compile {r['compile_s']:.1f} s, "
          f"compiled/eager speed {r['results']['compiled']['ratio_to_baseline']:.2f}x, "
          f"max |compiled - eager| {r['max_abs_diff']:.1e}")
bench.save_json(compiled_runs, "runs/06_compiled_block.json")

# %%
fig = go.Figure(go.Bar(x=[f"B={r['shape'][0]}, T={r['shape'][1]}" for r in compiled_runs],
                       y=[r["results"]["compiled"]["ratio_to_baseline"] for r in compiled_runs]))
fig.add_hline(y=1.0, line_dash="dash", annotation_text="eager")
fig.update_layout(title="torch.compile speed-up on one transformer block (above 1: compiled is faster)",
                  yaxis_title="eager time / compiled time", height=360)
fig.show()

# %% [markdown]
# **What the numbers mean.** Compilation costs seconds up front (less on a second run: Inductor caches
# compiled graphs on disk). The speed-up is small and shape-dependent: at small shapes the guards and
# wrappers around the compiled graph can cost as much as the arithmetic, and compiled can be *slower*
# than eager; at larger shapes fusion starts to pay. This run:

# %%
for r in compiled_runs:
    ratio = r["results"]["compiled"]["ratio_to_baseline"]
    print(f"batch {r['shape'][0]} x {r['shape'][1]} tokens: compiled runs at {ratio:.2f}x eager's speed "
          f"({'faster' if ratio > 1 else 'slower'}), after {r['compile_s']:.1f} s of compiling")
if QUICK:
    print("quick mode times one small shape; QUICK = False adds batch 8 x 256 tokens")

# %% [markdown]
# Shared machines add noise (thread contention hurts eager's many small ops most), so re-run before
# concluding. The only honest statement is a measured one, per model, shape and machine.
#
# ## What changes on other hardware
#
# - **NVIDIA GPU**: fp16/bf16 inputs pick `FLASH_ATTENTION` (sm80+), `EFFICIENT_ATTENTION` covers fp32
#   and masks, `CUDNN_ATTENTION` is used on recent GPUs; `varlen_attn` runs (A100 or newer). The
#   declines warn per backend (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`), and
#   `torch.nn.attention.list_flash_attention_impls()` / `activate_flash_attention_impl(...)` (present in
#   2.10 and 2.13; 2.10 lists `FA4`, 2.13 `FA3` and `FA4`, none active by default) swap in another registered flash-attention
#   implementation, opt-in (`torch/nn/attention/__init__.py`).
#   `torch.compile(flex_attention)` generates Triton kernels with a backward, so the document mask trains
#   there; on CPU it is inference only.
# - **AMD GPU**: flash and memory-efficient backends come from AOTriton by default, CK if selected.
# - **CPU**: only `MATH` and the CPU flash kernel; bf16 benefits where the CPU has native bf16.
#
# ## Pitfalls

# %% tags=["nbval-check-output"]
# 1. Forcing a backend with no CPU kernel: "No viable backend", and no reason is warned (the CPU selector
#    gives up before any check runs). For flash, the reasons come as warnings: see "Why did a backend decline?".
try:
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        F.scaled_dot_product_attention(q, q, q)
except RuntimeError as exc:
    print("1.", type(exc).__name__ + ":", str(exc).splitlines()[0])

# 2. The old context manager still works but warns: use torch.nn.attention.sdpa_kernel.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.backends.cuda.sdp_kernel(enable_math=True):
        pass
print("2.", caught[0].category.__name__ + ":", str(caught[0].message))

# 3. Boolean masks mean opposite things: SDPA keeps True, nn.MultiheadAttention's key_padding_mask
#    ignores True. Passing a padding mask (True = pad) to SDPA attends to the padding only.
x, keep = attention.pad_with_mask(seqs[:2])
wrong = F.scaled_dot_product_attention(x, x, x, attn_mask=~keep).transpose(1, 2)[0, : seqs[0].shape[0]]
right = F.scaled_dot_product_attention(x, x, x, attn_mask=keep).transpose(1, 2)[0, : seqs[0].shape[0]]
print("3. inverted mask changes the result:", not torch.allclose(wrong, right, atol=1e-3))

# 4. A query row whose keys are all masked: this torch returns zeros for it, not NaN.
all_masked = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
print("4. fully masked rows give:", F.scaled_dot_product_attention(q[:1, :1, :4], q[:1, :1, :4], q[:1, :1, :4],
                                                                      attn_mask=all_masked)[0, 0, 0, :3].tolist())

# %%
# 5. Jagged tensors must be contiguous after the heads/sequence transpose; a sliced view is not, and every
#    backend declines (the reasons go to the log, the exception only says "No viable backend").
sliced = torch.nested.nested_tensor_from_jagged(packed[:, :1], offsets.long()).transpose(1, 2)
try:
    F.scaled_dot_product_attention(sliced, sliced, sliced)
except RuntimeError as exc:
    print("5.", type(exc).__name__ + ":", str(exc))
