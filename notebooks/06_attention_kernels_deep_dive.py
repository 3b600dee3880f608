# %% [markdown]
# # 06 · Deep dive: attention kernels
#
# | | |
# |---|---|
# | **What you will learn** | flash vs MATH as the sequence grows, in time and against the CPU's fp32 GEMM peak; forcing a backend with `sdpa_kernel`, the error when none fits and its reasons, and making flash eligible; the corners of backend choice (3-D inputs, `OVERRIDEABLE`, `set_priority`), in a widget too; the training step: each backend's backward checked against float64 and timed; grouped-query attention (`enable_gqa`) and `causal_lower_right` for decoding, and which GPU backend takes them; SDPA backends on an NVIDIA or AMD GPU: your wheel's priority order and why, accuracy, memory (MATH's fp32 scores), time, kernel names; the opt-in FA4 implementation; AOTriton vs Composable Kernel on ROCm, told apart by kernel names; what `torch.compile(create_block_mask)` saves; compiled FlexAttention timed against padding; FlexAttention's backward on a CPU; `varlen_attn` checked and timed against padding and nested tensors on a GPU, then in a training step with compiled FlexAttention; what `torch.compile` gives a transformer block; pitfalls |
# | **Prerequisites** | [lesson 06](06_attention_kernels.ipynb) |
# | **Hardware** | any CPU. On an NVIDIA or AMD GPU with a flash kernel the forcing section runs there, as in the lesson; an NVIDIA GPU runs the GPU backend, GQA and ragged-batch sections (A100 or newer for `varlen_attn`); an AMD GPU the backend and ROCm sections |
# | **Time** | 88 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); 2.10 facts from its release notes and sources (`torch/nn/attention/`) |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/06_attention_kernels_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes (papermill: -p QUICK True)
SEQ_LENS = [128, 256, 512, 1024, 2048]
HEADS, HEAD_DIM = 4, 64
RAGGED_LENGTHS = [33, 500, 61, 1024, 12, 700, 90, 256]

# %%
import inspect
import os
import time
import warnings

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import attention, bench
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SEQ_LENS, RAGGED_LENGTHS = [128, 256, 512], [17, 40, 9, 128, 300]
REPEATS, MIN_RUN_S = (3, 0.02) if QUICK else (5, 0.1)
TIMING_THREADS = 1      # CPU timings at one thread: other load on the machine spreads them less
# The forcing section runs where the lesson's backend story ran: on an NVIDIA or AMD GPU whose flash kernel
# runs, in bf16 (fp16 where the GPU has no bf16); elsewhere on the CPU in fp32.
GPU_DTYPE = torch.bfloat16 if capabilities().bf16 else torch.float16
STORY = DEVICE if DEVICE.type == "cuda" and attention.flash_runs_on(DEVICE, GPU_DTYPE) else torch.device("cpu")
STORY_DTYPE = GPU_DTYPE if STORY.type == "cuda" else torch.float32
torch.manual_seed(0)
q = torch.randn(2, HEADS, 64, 32)
print(f"torch {torch.__version__} · device {DEVICE} · the forcing section on {STORY} · quick={QUICK}")

# %% [markdown]
# ## Flash vs MATH as the sequence grows
#
# Causal self-attention, batch 1, fp32, each backend forced with `sdpa_kernel`, timed interleaved by
# `bench.compare` at `TIMING_THREADS` thread, with the spread (min-max) over the repeats. MATH's work and
# memory grow with seq²; flash also does O(seq²) arithmetic but in cache-sized tiles, without writing the
# score matrix. A causal call does half of the two seq × seq × head_dim matmuls; the share of this CPU's
# fp32 GEMM peak (measured by `helpers.bench` at the same thread count, as in lesson 00) says how close each
# backend gets to the hardware. Where the two spreads overlap, the line says so instead of a winner.

# %%
timing = attention.time_backends(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, repeats=REPEATS, min_run_time=MIN_RUN_S,
                                 threads=TIMING_THREADS)
memory = attention.forward_peak_memory(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM)
bench.save_json({"timing": timing, "memory": memory}, "runs/06_deep_sdpa_backends.json")
limits = (bench.measure_limits(TIMING_THREADS, quick=True, device="cpu") if QUICK else
          bench.machine_limits(TIMING_THREADS, device="cpu"))
print(f"this CPU's fp32 GEMM peak: {limits['fp32_gemm_gflops']:.0f} GFLOP/s ({limits['threads']} thread(s))")
for n in SEQ_LENS:
    t, lo, hi = (timing[k][n] for k in ("median_s", "min_s", "max_s"))
    gflops = {b: attention.attention_tflop(1, HEADS, n, HEAD_DIM) * 1e3 / t[b] for b in timing["backends"]}
    print(f"seq {n:>5}: " + "   ".join(f"{b} {t[b] * 1e3:7.2f} ms ({lo[b] * 1e3:.2f}-{hi[b] * 1e3:.2f}), "
                                       f"{g:6.1f} GFLOP/s "
                                       f"({bench.percent_of_limit(g, limits['fp32_gemm_gflops']):4.1f}% of peak)"
                                       for b, g in gflops.items())
          + ("" if timing["separated"][n] else f"   spreads overlap: {bench.NOISY}"))

# %%
fig = go.Figure([go.Scatter(x=SEQ_LENS, y=[timing["median_s"][n][b] * 1e3 for n in SEQ_LENS],
                            mode="lines+markers", name=f"{b}, ms") for b in timing["backends"]]
                + [go.Scatter(x=SEQ_LENS, y=[memory["peak_bytes"][n][b] / 2**20 for n in SEQ_LENS], yaxis="y2",
                              mode="lines", line_dash="dot", name=f"{b}, peak MiB") for b in memory["backends"]])
fig.update_layout(title=f"Causal SDPA on the CPU, {HEADS} heads × {HEAD_DIM}, fp32, {timing['threads']} thread(s)",
                  xaxis_title="sequence length", xaxis_type="log", yaxis_title="ms per call (log)", yaxis_type="log",
                  yaxis2={"title": "peak MiB (log)", "type": "log", "overlaying": "y", "side": "right"}, height=400)
fig.show()

# %% [markdown]
# At short sequences the two are close: the score matrix fits in cache and per-call overhead dominates.
# As the sequence grows MATH writes and re-reads a seq × seq matrix per head and the gap widens. The ratio
# depends on the cache sizes and the thread count: re-run it on your machine before you rely on it.

# %% [markdown]
# ## Forcing one, and the error when none fits
#
# `with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):` restricts the choice to the listed backends
# (`set_priority=True` also makes the list's order the priority order). When none of them takes the
# inputs, SDPA raises `RuntimeError: No available kernel`. The reasons come just before it as warnings:
# the selector re-runs each backend's checks with debug on, and every failed check emits one
# (`sdp_utils_cpp.cpp`; `sdp_utils.cpp` on CUDA). `attention.decline_reasons` catches them. A backend with
# no kernel for the device at all fails with "No viable backend" and no reasons. The calls run on the
# lesson's device for its backend story (`STORY`, printed above).

# %%
qs = torch.randn(2, HEADS, 128, HEAD_DIM, device=STORY, dtype=STORY_DTYPE)       # the lesson's q
q8 = torch.randn(2, 8, 128, HEAD_DIM, device=STORY, dtype=STORY_DTYPE)
mask_128 = torch.ones(128, 128, dtype=torch.bool, device=STORY).tril()
forced = {"flash forced, 8 q heads, 2 k/v heads, no enable_gqa": (q8, qs[:, :2], qs[:, :2], ["FLASH_ATTENTION"], {})}
if STORY.type == "cuda":
    forced["flash forced, boolean mask"] = (qs, qs, qs, ["FLASH_ATTENTION"], {"attn_mask": mask_128})
    forced["flash forced, fp32"] = (qs.float(), qs.float(), qs.float(), ["FLASH_ATTENTION"], {})
else:
    forced["flash forced, dropout_p=0.1"] = (qs, qs, qs, ["FLASH_ATTENTION"], {"dropout_p": 0.1})
    forced["EFFICIENT_ATTENTION forced"] = (qs, qs, qs, ["EFFICIENT_ATTENTION"], {})
for label, (qq, kk, vv, allowed, kwargs) in forced.items():
    outcome, reasons = attention.decline_reasons(qq, kk, vv, allowed, **kwargs)
    print(f"{label}: {outcome}" + "".join(f"\n    warning: {r}" for r in reasons))

# %% tags=["nbval-check-output"]
q_cpu = qs.cpu().float()    # both CPU kernels take fp32 and masks: the float64 check runs on the CPU everywhere
mask = torch.rand(128, 128) > 0.2
mask.fill_diagonal_(True)       # every query keeps at least one key
for label, kwargs in {"plain": {}, "causal": {"is_causal": True}, "boolean mask": {"attn_mask": mask}}.items():
    ref = attention.sdpa_reference(q_cpu, q_cpu, q_cpu, **kwargs)
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel([backend]):
            err = (F.scaled_dot_product_attention(q_cpu, q_cpu, q_cpu, **kwargs) - ref).abs().max().item()
        assert err < 1e-5, (label, backend, err)
    print(f"{label:<13} MATH and FLASH_ATTENTION forced: both match the float64 reference (max error < 1e-5)")

# %% [markdown]
# ### Your turn: make flash eligible
#
# A model's attention call does not get `FLASH_ATTENTION` on this device (the GPU when there is one).
# Change **one** value in `MY_CALL` so that `FLASH_ATTENTION` runs. Keep 8 query heads and 2 key/value heads
# (grouped-query attention). The check prints the reasons flash gave: read them before you guess.

# %% tags=["your-turn"]
START_CALL = {"dtype": torch.bfloat16, "q_heads": 8, "kv_heads": 2, "enable_gqa": True, "v_head_dim": 48,
              "dropout_p": 0.0}
MY_CALL = {"dtype": torch.bfloat16, "q_heads": 8, "kv_heads": 2, "enable_gqa": True, "v_head_dim": 48,
           "dropout_p": 0.0}

# %%
from helpers.checks import check_equal, fail, your_turn


def check_call():
    changed = [key for key in START_CALL if MY_CALL.get(key) != START_CALL[key]]
    if len(changed) > 1 or (MY_CALL["q_heads"], MY_CALL["kv_heads"]) != (8, 2):
        fail("MY_CALL", f"changed {changed}", "change one value, and keep 8 query heads and 2 key/value heads")
    qq = torch.randn(1, 8, 64, 64, dtype=MY_CALL["dtype"], device=STORY)
    kk = torch.randn(1, 2, 64, 64, dtype=MY_CALL["dtype"], device=STORY)
    vv = torch.randn(1, 2, 64, MY_CALL["v_head_dim"], dtype=MY_CALL["dtype"], device=STORY)
    outcome, reasons = attention.decline_reasons(qq, kk, vv, ["FLASH_ATTENTION"], dropout_p=MY_CALL["dropout_p"],
                                                 enable_gqa=MY_CALL["enable_gqa"])
    check_equal(outcome, "ran FLASH_ATTENTION", what="flash forced on MY_CALL",
                hint="flash declined: " + " ".join(reasons[1:])[:300])


your_turn(check_call, what="make flash eligible");

# %% [markdown]
# ## Which kernel runs: the corners
#
# - **3-D inputs** (no batch dimension) depend on the release: torch 2.10 and 2.13 send them to `MATH`,
#   torch 2.14 runs them with the CPU flash kernel (this collection's matrix of environments ran all three).
# - **`OVERRIDEABLE`** is not a kernel of this build: it selects
#   `aten::_scaled_dot_product_fused_attention_overrideable`, an op PyTorch declares with no real kernel of
#   its own (its only in-tree registration is the generic `CompositeExplicitAutograd` one, see the headers
#   under `torch/include/ATen/ops/`), so that a device backend shipped outside PyTorch can register its fused
#   attention there, as `convolution_overrideable` does for convolutions. The enum's docstring calls it "The
#   overridable backend for extension" (`torch/nn/attention/__init__.py`). On CPU and CUDA it never runs.
# - **`set_priority=True`** makes `sdpa_kernel`'s list the priority order, on CUDA. The CPU selector has its
#   own fixed order (`priority_order_cpp` in `sdp_utils_cpp.cpp`: flash, then MATH), so on a CPU it changes
#   nothing, as the cell shows.

# %%
print("3-D input (no batch dim):", attention.backend_that_runs(q[0], q[0], q[0]))
for name, outcome in attention.backend_report(q, q, q).items():
    print(f"  {name:<20} alone: {outcome}")
print("OVERRIDEABLE alone:", attention.decline_reasons(q, q, q, ["OVERRIDEABLE"])[0])
with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
    print("priority order inside set_priority=True [MATH, FLASH]:", attention.priority_order()[:2],
          "| ran on this CPU:", attention.backend_that_runs(q, q, q, ["MATH", "FLASH_ATTENTION"]))

# %% [markdown]
# ### Try it: which kernel runs for which inputs?

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
# ## Training: forward and backward
#
# A training step runs the backward too. MATH's backward reads the probabilities it saved (the seq × seq
# matrix again); the CPU flash kernel saved only the output and the log-sum-exp per row and recomputes the
# scores tile by tile (`aten::_scaled_dot_product_flash_attention_for_cpu_backward`). First the check: the
# gradients of every backend against float64 autograd on the reference formula.

# %% tags=["nbval-check-output"]
qkv = [torch.randn(2, HEADS, 96, 32) for _ in range(3)]
for backend, err in attention.gradient_error_per_backend(*qkv).items():
    assert err < 1e-4, (backend, err)
    print(f"{backend:<16} dq, dk, dv match float64 autograd (max error < 1e-4)")

# %%
training = attention.time_training_step(SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, repeats=REPEATS,
                                        min_run_time=MIN_RUN_S, threads=TIMING_THREADS)
bench.save_json(training, "runs/06_sdpa_training_step.json")
for n in SEQ_LENS:
    t, rate, lo, hi = (training[k][n] for k in ("median_s", "GFLOP_per_s", "min_s", "max_s"))
    speed = t["MATH"] / t["FLASH_ATTENTION"]
    span = (f"{lo['MATH'] / hi['FLASH_ATTENTION']:.2f}x to {hi['MATH'] / lo['FLASH_ATTENTION']:.2f}x "
            "over the repeats")
    print(f"seq {n:>5}: forward + backward  MATH {t['MATH'] * 1e3:8.2f} ms ({rate['MATH']:5.1f} GFLOP/s)   "
          f"FLASH {t['FLASH_ATTENTION'] * 1e3:8.2f} ms ({rate['FLASH_ATTENTION']:5.1f} GFLOP/s)   "
          + (f"spreads overlap ({span}): {bench.NOISY}" if not training["separated"][n] else
             f"flash {speed:.2f}x faster ({span})" if speed > 1 else f"flash {1 / speed:.2f}x slower ({span})"))


# %% [markdown]
# GFLOP/s counts forward + backward as 3.5 times the forward's two matmuls, the convention of the
# FlashAttention benchmarks (Dao-AILab/flash-attention `benchmarks/benchmark_flash_attention.py`). In
# training, MATH's probabilities stay alive from the forward to the backward, so its seq² memory is held
# for the whole step, per layer.
#
# ## Grouped-query attention and decoding
#
# Llama-style models keep fewer key/value heads than query heads (GQA): each key/value head serves a group
# of query heads, so the KV cache shrinks by that factor. SDPA takes it with `enable_gqa=True` (PR #132689;
# present in torch 2.9.1, 2.10, 2.13 and 2.14 here). Without the flag the shapes do not broadcast. The
# written-out equivalent gives each query head a copy of the key/value head it reads, so that plain SDPA
# can run: code converted from one model to another often carries it, and it is easy to get silently wrong.
#
# ### Your turn: write the copy that `enable_gqa=True` stands for
#
# `my_repeat_kv(k, query_heads)` turns `(batch, kv_heads, seq, head_dim)` into
# `(batch, query_heads, seq, head_dim)`, head `h` being the key/value head that query head `h` reads. The
# start below has the right shape and the wrong heads. The check runs SDPA on your copies against
# `enable_gqa=True`, and says which key/value head each query head got from you and from SDPA.

# %% tags=["your-turn"]
def my_repeat_kv(k, query_heads):
    return k.repeat(1, query_heads // k.shape[1], 1, 1)


# %%
from helpers.checks import check_close


def check_repeat_kv():
    q8, k2, v2 = torch.randn(1, 8, 16, 32), torch.randn(1, 2, 16, 32), torch.randn(1, 2, 16, 32)
    head_ids = torch.arange(2.0).view(1, 2, 1, 1).expand(1, 2, 16, 32)     # v of k/v head j is all j
    read_by_sdpa = F.scaled_dot_product_attention(q8, k2, head_ids, enable_gqa=True)[0, :, 0, 0]
    mine = my_repeat_kv(head_ids, 8)
    if not isinstance(mine, torch.Tensor) or tuple(mine.shape) != (1, 8, 16, 32):
        fail("my_repeat_kv", f"returned {getattr(mine, 'shape', type(mine).__name__)}, expected (1, 8, 16, 32)",
             "keep the batch, sequence and head_dim dimensions; only the head dimension grows, 2 -> 8")
    check_equal(mine[0, :, 0, 0].round().int().tolist(), read_by_sdpa.round().int().tolist(),
                what="the key/value head each of the 8 query heads reads",
                hint="enable_gqa gives each key/value head a block of neighbouring query heads, while Tensor.repeat "
                     "tiles the heads (0, 1, 0, 1, ...): which torch function repeats each element in place?")
    check_close(F.scaled_dot_product_attention(q8, my_repeat_kv(k2, 8), my_repeat_kv(v2, 8)),
                F.scaled_dot_product_attention(q8, k2, v2, enable_gqa=True), atol=1e-5,
                what="SDPA on your copies against enable_gqa=True")


your_turn(check_repeat_kv, what="the copy enable_gqa stands for");

# %% [markdown]
# The SDPA docstring writes the equivalent with `repeat_interleave` on the head dimension
# (`torch/nn/functional.py`): query heads `0 .. g-1` read key/value head 0, the next `g` head 1, with
# `g = query_heads // kv_heads`. `attention.repeat_kv_heads` is that line. The cell checks both CPU backends
# against it; `k.repeat` would pair query head 1 with key/value head 1 and raise no error.

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
                    baseline="repeat k/v, then SDPA", repeats=REPEATS, min_run_time=MIN_RUN_S, device="cpu")
print(bench.table(gqa))
print("enable_gqa=True vs repeating first: " + (
    f"{gqa['results']['enable_gqa=True']['ratio_to_baseline']:.2f}x the speed, the spreads apart"
    if bench.separated(gqa, "enable_gqa=True", "repeat k/v, then SDPA")
    else "the spreads overlap, too close to call here; run again"))
print(f"keys and values held: {(k_gqa.nbytes + v_gqa.nbytes) / 2**10:.0f} KiB with {kv_heads} heads, "
      f"{(k_rep.nbytes + v_rep.nbytes) / 2**10:.0f} KiB repeated to {q_heads}: the KV cache GQA saves")

# %% [markdown]
# **Decoding with a KV cache.** A step that adds `L` new queries to a cache of `S` keys needs each new query
# to see every cached key and the new keys up to itself: with `L = 4` and `S = 10`, the first new query
# (position 6) sees keys 0 to 6. The tempting call is `F.scaled_dot_product_attention(q_new, k_cache,
# v_cache, is_causal=True)`.

# %% tags=["predict"]
decode_guess = predict("4 new queries against a cache of 10 keys, is_causal=True: how many of the 10 keys does the "
                       "first new query attend to?", unit="keys", example=7)

# %% [markdown]
# `torch.nn.attention.bias.causal_lower_right(L, S)` is the mask a decoding step needs, a `CausalBias` that
# SDPA dispatches itself (`torch/nn/attention/bias.py`): on CUDA to the flash or memory-efficient kernel
# with the mask built in, elsewhere as a dense mask. The cell checks both calls against the float64
# reference with the mask written out.

# %% tags=["nbval-check-output"]
from torch.nn.attention.bias import causal_lower_right

q_new, k_cache = torch.randn(1, HEADS, 4, 32), torch.randn(1, HEADS, 10, 32)
lower_right = torch.ones(4, 10, dtype=torch.bool).tril(diagonal=10 - 4)
right = F.scaled_dot_product_attention(q_new, k_cache, k_cache, attn_mask=causal_lower_right(4, 10))
wrong = F.scaled_dot_product_attention(q_new, k_cache, k_cache, is_causal=True)
assert (right - attention.sdpa_reference(q_new, k_cache, k_cache, attn_mask=lower_right)).abs().max() < 1e-5
assert (wrong - attention.sdpa_reference(q_new, k_cache, k_cache, attn_mask=lower_right)).abs().max() > 1e-2
print("first new query sees", int(lower_right[0].sum()), "of 10 keys with causal_lower_right,",
      int(torch.ones(4, 10, dtype=torch.bool).tril()[0].sum()), "with is_causal=True")
print("causal_lower_right matches the float64 reference; is_causal=True does not")

# %% tags=["reveal"]
identity_v = torch.eye(10).expand(1, HEADS, 10, 10)      # each output row is then that query's softmax weights
calls = {"is_causal=True": {"is_causal": True}, "causal_lower_right": {"attn_mask": causal_lower_right(4, 10)}}
seen = {name: (F.scaled_dot_product_attention(q_new, k_cache, identity_v, **kw)[0, 0] > 0).sum(-1).tolist()
        for name, kw in calls.items()}
reveal(decode_guess, seen["is_causal=True"][0], tolerance=1,
       why=f"with v the identity, SDPA's output is its attention weights: the 4 new queries attended to "
           f"{seen['is_causal=True']} keys with is_causal=True and {seen['causal_lower_right']} with "
           "causal_lower_right. is_causal=True builds torch.ones(L, S).tril(): the upper-left triangle, which "
           "numbers the queries from position 0 whatever the cache holds (the SDPA docstring's reference code, "
           "torch/nn/functional.py; causal_upper_left in bias.py is 'equivalent to' it). No error, no warning, and "
           "the output has the right shape: only a comparison like the one above catches it.");

# %% [markdown]
# On a GPU the two questions are which backend takes grouped heads, and which takes the lower-right mask.
# The 2.10 SDPA docstring says GQA "currently works only for Flash_attention and math kernel on CUDA tensor"
# (`torch/nn/functional.py`); the cell asks the installed torch instead, each backend forced alone.

# %%
if requires("torch_cuda", section="GQA and decoding on the GPU"):
    qg = torch.randn(2, 32, 1024, 128, device=DEVICE, dtype=torch.float16)
    kg, vg = (torch.randn(2, 8, 1024, 128, device=DEVICE, dtype=torch.float16) for _ in range(2))
    print("32 query heads, 8 key/value heads, fp16, causal, enable_gqa=True; default choice:",
          attention.backend_that_runs(qg, kg, vg, is_causal=True, enable_gqa=True))
    for name, outcome in attention.backend_report(qg, kg, vg, is_causal=True, enable_gqa=True).items():
        print(f"  {name:<20} {outcome}")
    ref = attention.sdpa_reference(qg, attention.repeat_kv_heads(kg, 32), attention.repeat_kv_heads(vg, 32),
                                   is_causal=True)
    err = (F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True).double()
           - ref.double()).abs().max().item()
    assert err < 2e-2, err
    print(f"  default choice vs float64 on repeated heads: max error {err:.1e}")
    q_step = qg[:, :, -16:]                               # 16 new tokens against a cache of 1024 keys
    k_all, v_all = attention.repeat_kv_heads(kg, 32), attention.repeat_kv_heads(vg, 32)
    bias = causal_lower_right(16, 1024)
    print("decode step with causal_lower_right:", attention.backend_that_runs(q_step, k_all, v_all, attn_mask=bias))
    dense = torch.ones(16, 1024, dtype=torch.bool, device=DEVICE).tril(diagonal=1024 - 16)
    err = (F.scaled_dot_product_attention(q_step, k_all, v_all, attn_mask=bias).double()
           - attention.sdpa_reference(q_step, k_all, v_all, attn_mask=dense).double()).abs().max().item()
    assert err < 2e-2, err
    print(f"  vs float64 with the dense lower-right mask: max error {err:.1e}")

# %% [markdown]
# ## SDPA backends on an NVIDIA or AMD GPU
#
# **The priority order of your wheel.** The default order is FLASH, EFFICIENT, MATH, CUDNN, OVERRIDEABLE
# (`aten/src/ATen/Context.h`). A CUDA build replaces it at its first SDPA call on the GPU
# (`priority_order` in `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`) with cuDNN, flash, efficient,
# MATH when `check_prefer_cudnn_attention()` holds. That function changed across releases:
#
# - #162073 (for 2.9): cuDNN first on sm90 and sm100 (H100/H200, B200) with cuDNN 9.9 or newer at build time;
#   #165801 reports 2.9 wheels that did not get it because they were built against an older cuDNN;
# - #171627 (January 2026, in 2.10): cuDNN first only if the cuDNN loaded at run time is newer than 9.15,
#   because older cuDNN mishandled sequence lengths that are not multiples of 128 (#169849);
#   `TORCH_CUDNN_SDPA_DEPRIORITIZED=1` turns the preference off.
#
# So a 2.10 CUDA 12.8 wheel, which loads cuDNN 9.10.2 (`cudnn: 91002` in this project's recorded 2.10.0
# environment, `helpers/validation/recorded/torch-2.10.0.json`), puts FLASH first on an H200, and a wheel
# with a newer cuDNN puts cuDNN first. The cell prints the order after one call, and the cuDNN version the
# process loaded.
#
# **MATH's memory on a GPU.** MATH upcasts fp16/bf16 inputs and keeps its intermediates in fp32 ("all
# intermediates are kept in torch.float", the SDPA docstring in `torch/nn/functional.py`, unless
# `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`), so the label below counts an fp32 score
# matrix; expect MATH's peak at a few of them (the scores, their softmax), as on the CPU in the lesson.
#
# **Another flash implementation.** `torch.nn.attention.list_flash_attention_impls()` names the registered
# ones (2.10: `FA4`; 2.13 adds `FA3`), none active by default; `activate_flash_attention_impl("FA4")` swaps
# FA4 into the flash backend. It needs the `flash_attn.cute` package (flash-attention's CuTe DSL
# implementation, installed separately) and a GPU of compute capability 9.x or 10.x, in fp16/bf16
# (`torch/nn/attention/_fa4.py`): elsewhere it raises.

# %%
print("flash-attention implementations registered:", torch.nn.attention.list_flash_attention_impls())
if requires("torch_cuda", section="SDPA backends on the GPU"):
    qg = torch.randn(4, HEADS, 1024, HEAD_DIM, device=DEVICE, dtype=torch.float16)
    print("default choice, fp16:", attention.backend_that_runs(qg, qg, qg))
    print("priority order after that call:", attention.priority_order())
    print("cuDNN (MIOpen on ROCm) loaded:", torch.backends.cudnn.version(), "| TORCH_CUDNN_SDPA_DEPRIORITIZED:",
          os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "unset"))
    kernels = attention.gpu_kernel_names(lambda: F.scaled_dot_product_attention(qg, qg, qg, is_causal=True))
    print("GPU kernels of the default causal call:", sorted(name[:90] for name in kernels))
    for name, outcome in attention.backend_report(qg, qg, qg).items():
        print(f"  {name:<20} {outcome}")
    for name, err in attention.error_per_backend(qg).items():      # each backend forced, against float64
        print(f"  {name:<20} " + (err if isinstance(err, str) else f"max abs error vs float64 {err:.1e}"))
        assert isinstance(err, str) or err < 2e-2, f"{name} is off by {err} in fp16"
    q_long = torch.randn(1, HEADS, 8192, HEAD_DIM, device=DEVICE, dtype=torch.float16)
    peaks = attention.peak_memory_per_backend(q_long, ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"))
    scores_fp32_mib = HEADS * 8192**2 * 4 / 2**20
    print(f"peak memory of one causal fp16 forward at seq 8192 (MATH's scores are fp32: one score matrix is "
          f"{scores_fp32_mib:.0f} MiB): " + ", ".join(f"{b} {p / 2**20:.0f} MiB" for b, p in peaks.items()))
    gpu_timing = attention.time_backends([512, 2048, 8192], heads=HEADS, head_dim=HEAD_DIM, dtype=torch.float16,
                                         backends=("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"),
                                         device=DEVICE)
    for n, t in gpu_timing["median_s"].items():
        print(f"seq {n:>5}: " + "   ".join(f"{b} {s * 1e3:.3f} ms, "
                                           f"{attention.attention_tflop(1, HEADS, n, HEAD_DIM) / s:.1f} TFLOP/s"
                                           for b, s in t.items()))

# %% [markdown]
# At batch 1 and 4 heads the GPU is far from busy at short sequences: the times there measure launches
# more than kernels. Scale batch and heads to your model before you compare backends.
#
# ## On ROCm: AOTriton or Composable Kernel
#
# On AMD GPUs the flash and memory-efficient backends come from a library chosen by
# `torch.backends.cuda.preferred_rocm_fa_library()`: AOTriton (ahead-of-time compiled Triton kernels, the
# default) or CK (Composable Kernel), where the build includes it. This is not new in 2.10, whatever the
# article says about "AOTriton integration" (see the facts file). On other builds the call just reports
# the setting. Asking for CK does not prove CK ran: the setter only warns when CK cannot be used
# ("Attempting to use CK on an unsupported architecture! Cannot set backend to CK", in c10's `Context.cpp`),
# and both libraries run behind the same aten op. The cell reads the kernels' names from the profiler: CK's
# are `ck_tile` templates (`FmhaFwdKernel`); AOTriton's are its Triton kernels (`attn_fwd`) or, in newer
# releases, AITER's `fmha_v3` assembly kernels, which it also dispatches (ROCm/aotriton#158), so a name with
# "fmha" alone does not mean CK. It times only the libraries that ran, side by side (interleaved repeats, the
# preference set before each call), and says which is faster only when their spreads are apart.

# %%
print("preferred ROCm flash-attention library here:", torch.backends.cuda.preferred_rocm_fa_library())
if requires("rocm", section="AOTriton vs CK on ROCm"):
    qr = torch.randn(4, HEADS, 2048, HEAD_DIM, device=DEVICE, dtype=torch.float16)
    before = torch.backends.cuda.preferred_rocm_fa_library()
    call = lambda: F.scaled_dot_product_attention(qr, qr, qr, is_causal=True)
    ran_here = []

    def with_library(lib):
        def run():
            torch.backends.cuda.preferred_rocm_fa_library(lib)
            return call()
        return run
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
            if ran == lib:
                ran_here.append(lib)
            else:
                print(f"  {lib} did not run here, so it is not timed")
        rocm_timing = bench.compare({lib: with_library(lib) for lib in ran_here}, repeats=REPEATS,
                                    device=DEVICE) if ran_here else None
    finally:
        torch.backends.cuda.preferred_rocm_fa_library(before)
    if rocm_timing:
        print(bench.table(rocm_timing))
    if len(ran_here) == 2:
        fast = min(ran_here, key=lambda lib: rocm_timing["results"][lib]["median_s"])
        print(f"{fast} was faster here" if bench.separated(rocm_timing, *ran_here) else bench.NOISY)

# %% [markdown]
# ## FlexAttention: what building the block mask costs
#
# The lesson showed that `create_block_mask` calls `mask_mod` once over the whole `Q_LEN × KV_LEN` grid and
# reduces the dense mask per tile. Compiled, `torch.compile(create_block_mask)` fuses the evaluation and the
# per-tile reduction, so the dense mask is never written (2.10's deprecation warning for `_compile=True` in
# `torch/nn/attention/flex_attention.py` says to do exactly this). Below, the document mask of a longer
# packed batch, eager and compiled: the same block mask, the time of a call after the first, and the peak
# memory.

# %%
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

long_lengths = RAGGED_LENGTHS * (2 if QUICK else 4)
doc = attention.document_ids(long_lengths)
total = sum(long_lengths)


def same_document(b, h, q_idx, kv_idx):
    return doc[q_idx] == doc[kv_idx]


# %% tags=["predict"]
block_mask_guess = predict(f"create_block_mask, eager, over these {total} tokens: its peak memory, in multiples of the "
                           f"{total}² bytes of the dense boolean mask?", unit="x", example=1.0)

# %%
build = {"eager": create_block_mask, "compiled": torch.compile(create_block_mask)}
start = time.perf_counter()
masks = {name: fn(same_document, None, None, total, total, device="cpu") for name, fn in build.items()}
print(f"first calls (the compiled one compiles): {time.perf_counter() - start:.1f} s")
assert torch.equal(masks["eager"].to_dense(), masks["compiled"].to_dense()), "same block mask"
mask_cost = bench.compare({name: lambda fn=fn: fn(same_document, None, None, total, total, device="cpu")
                           for name, fn in build.items()}, baseline="eager", repeats=REPEATS,
                          min_run_time=MIN_RUN_S, device="cpu")
print(bench.table(mask_cost))
mask_peak = {}
for name, fn in build.items():
    mask_peak[name] = attention.cpu_peak_bytes(lambda: fn(same_document, None, None, total, total, device="cpu"))
    print(f"{name:<9} create_block_mask over {total} tokens: peak {mask_peak[name] / 2**10:9.1f} KiB "
          f"({total}² booleans are {total**2 / 2**10:.0f} KiB)")

# %% tags=["reveal"]
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as mask_prof:
    create_block_mask(same_document, None, None, total, total, device="cpu")
ops = [e for e in mask_prof.key_averages(group_by_input_shape=True) if not e.key.startswith("aten::empty")]
biggest = max(ops, key=lambda e: e.cpu_memory_usage)
padded = -(-total // 128) * 128                          # the mask padded to whole 128 x 128 tiles
per_pair = biggest.cpu_memory_usage / padded**2
reveal(block_mask_guess, mask_peak["eager"] / total**2,
       why=f"the largest allocation was {biggest.key} on a {biggest.input_shapes[0]} tensor, "
           f"{biggest.cpu_memory_usage / 2**10:.0f} KiB: {per_pair:.1f} bytes per (query, key) pair of the mask "
           f"padded to {padded}². "
           + ("That is the per-tile count: _convert_mask_to_block_mask (torch/nn/attention/flex_attention.py) "
              "sums each 128 x 128 tile with mask.sum, and summing booleans gives int64 (here "
              f"{torch.ones(2, dtype=torch.bool).sum().dtype}), so the tile view is copied to 8 bytes a pair. Add "
              f"the boolean mask ({total}², 1 byte a pair) and its padded copy ({padded}², 1 byte a pair): "
              f"{(9 * padded**2 + total**2) / total**2:.1f}x. " if round(per_pair) == 8 else "")
           + f"Compiled, the same call held {mask_peak['compiled'] / 2**10:.1f} KiB: Inductor fuses mask_mod's "
             "evaluation with the per-tile count, and none of these is written.");

# %% [markdown]
# **The compiled kernel against padding.** `flex_attention` called eagerly runs an unfused reference that
# computes the whole `total × total` score matrix (it warns): good for checking a mask, not for speed.
# `torch.compile(flex_attention)` generates the fused kernel: Triton on a GPU, a C++ template on a CPU (AVX2,
# not macOS, inference only: `torch/_inductor/kernel/flex/flex_cpu.py`). torch 2.10's CPU template refuses
# one tensor passed as q, k and v, so `attention.packed_heads_first` makes three. The cell runs the lesson's
# packed batch both ways against the per-sequence float64 reference, then times them against padding and a
# loop.

# %%
seqs = attention.random_ragged(RAGGED_LENGTHS, HEADS, HEAD_DIM)
doc_mask = attention.document_block_mask(RAGGED_LENGTHS)
packed, offsets, longest_seq = attention.pack(seqs)
visited, total_blocks = attention.blocks_computed(doc_mask)
q_flex, k_flex, v_flex = attention.packed_heads_first(seqs)          # (1, heads, total, head_dim) each
with warnings.catch_warnings():
    warnings.simplefilter("ignore")                                  # eager flex warns that it is unfused
    flex_outs = {"flex eager": flex_attention(q_flex, k_flex, v_flex, block_mask=doc_mask)}
flex_compiled, compile_s, compile_error = attention.compile_flex_attention(q_flex, k_flex, v_flex, doc_mask)
print(f"torch.compile(flex_attention): first call {compile_s:.1f} s, "
      + ("a fused CPU kernel" if flex_compiled else f"not available here: {compile_error}"))
candidates = attention.ragged_kernels(seqs, varlen=False)            # inputs padded and packed once
candidates["loop per sequence"] = lambda: attention.loop_attention(seqs)
if flex_compiled:
    flex_outs["flex compiled"] = flex_compiled(q_flex, k_flex, v_flex, block_mask=doc_mask)
    candidates["flex compiled"] = lambda: flex_compiled(q_flex, k_flex, v_flex, block_mask=doc_mask)
for name, out in flex_outs.items():
    err = attention.max_error(attention.split_heads_first(out, RAGGED_LENGTHS), seqs)
    assert err < 1e-4, (name, err)
    print(f"{name:<14} matches the per-sequence float64 reference (max error {err:.1e})")
flex_timing = bench.compare(candidates, baseline="padded + mask", repeats=REPEATS, min_run_time=MIN_RUN_S, device="cpu",
                            work=attention.ragged_tflop(RAGGED_LENGTHS, HEADS, HEAD_DIM) * 1e3, work_unit="GFLOP")
bench.save_json(flex_timing, "runs/06_ragged_flex.json")
print(bench.table(flex_timing))
tile = doc_mask.BLOCK_SIZE[0] * doc_mask.BLOCK_SIZE[1]
print(f"padded: {len(RAGGED_LENGTHS)} × {longest_seq}² scores, {attention.wasted_fraction(RAGGED_LENGTHS):.0%} "
      f"of them padding; compiled flex: {visited} of {total_blocks} tiles "
      f"({visited * tile / sum(n * n for n in RAGGED_LENGTHS):.1f}x the useful scores)")

# %% [markdown]
# **What the numbers mean.** The compiled kernel's work follows the tiles it visits, not the tokens: long
# sequences show most of the padding-free saving; short ones leave partial tiles along the diagonal that
# cost more than the useful work. The loop computes no padding but pays one call per sequence. On a GPU,
# compiled FlexAttention also trains (Triton forward and backward).
#
# **Backward on a CPU.** torch 2.13 refuses any CPU input that requires grad ("FlexAttention does not
# support backward on CPU"); torch 2.10 has no such check: its eager path differentiates, its compiled one
# fails inside Inductor. The cell shows what the installed torch does. On a GPU both train (next section).

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore")                                  # eager flex warns that it is unfused
    outcomes = {"flex eager": attention.try_backward(
        lambda q, k, v: flex_attention(q, k, v, block_mask=doc_mask), q_flex, k_flex, v_flex)}
if flex_compiled:
    outcomes["flex compiled"] = attention.try_backward(
        lambda q, k, v: flex_compiled(q, k, v, block_mask=doc_mask), q_flex, k_flex, v_flex)
for name, outcome in outcomes.items():
    print(f"backward through {name} on CPU (torch {torch.__version__}): {outcome}")

# %% [markdown]
# ## Ragged batches on a GPU: varlen_attn, then a training step
#
# On an NVIDIA GPU the next cell checks `varlen_attn` against float64 and times the lesson's three ways
# (padding + mask, jagged nested, `varlen_attn`) at sizes where the kernels, not Python, dominate: every
# input is padded or packed beforehand, so a timed call is one attention call.

# %%
if requires("cuda", "bf16", section="varlen_attn on the GPU"):
    gpu_seqs = attention.random_ragged(RAGGED_LENGTHS, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
    for causal in (False, True):
        err = attention.max_error(attention.varlen_attention(gpu_seqs, causal=causal), gpu_seqs, causal=causal)
        assert err < 3e-2, err
        print(f"varlen_attn causal={causal}: max error vs float64 reference {err:.2e} (bf16)")
    gpu_heads, gpu_head_dim = (16, 128) if QUICK else (32, 128)
    gpu_lengths = torch.randint(128, 2048 if QUICK else 4096, (8 if QUICK else 16,),
                                generator=torch.Generator().manual_seed(0)).tolist()
    big = attention.random_ragged(gpu_lengths, gpu_heads, gpu_head_dim, dtype=torch.bfloat16, device=DEVICE)
    r = bench.compare(attention.ragged_kernels(big), baseline="padded + mask", repeats=5, device=DEVICE,
                      work=attention.ragged_tflop(gpu_lengths, gpu_heads, gpu_head_dim), work_unit="TFLOP")
    print(f"{len(gpu_lengths)} sequences, {sum(gpu_lengths)} tokens, {gpu_heads} heads x {gpu_head_dim}; padding "
          f"would waste {attention.wasted_fraction(gpu_lengths):.0%} of a padded batch's scores")
    print(bench.table(r))
    for name, res in r["results"].items():
        print(f"{name:<16} {res['TFLOP_per_s']:6.1f} useful TFLOP/s (padding not counted)")
    bench.plot(r, title=f"Ragged batch on {capabilities().device_name}, bf16, kernels only").show()

# %% [markdown]
# `varlen_attn` has a backward, and it compiles (the official tutorial,
# pytorch/tutorials `intermediate_source/variable_length_attention_tutorial.py`, does both); compiled
# FlexAttention generates Triton kernels for the forward and the backward. `attention.ragged_training_fns`
# writes each method as a function of the packed `(total_tokens, heads, head_dim)` q, k, v, every layout
# change inside it, so their gradients compare directly with attention run one sequence at a time in fp32.
# Then one training step each (forward + backward, bf16, layout changes included) is timed against padding.

# %%
from torch.nn.attention.varlen import varlen_attn

print("varlen_attn in this torch: varlen_attn" + str(inspect.signature(varlen_attn)).split(" ->")[0])
if requires("cuda", "bf16", section="Ragged training step on the GPU"):
    gen = torch.Generator().manual_seed(0)
    train_lengths = torch.randint(256, 2048 if QUICK else 8192, (8 if QUICK else 16,), generator=gen).tolist()
    heads, head_dim = 16, 128
    packed_g = [attention.pack(attention.random_ragged(train_lengths, heads, head_dim, dtype=torch.bfloat16,
                                                       device=DEVICE, seed=i))[0] for i in range(3)]
    grad_out = torch.randn(packed_g[0].shape, generator=gen).to(DEVICE, torch.bfloat16)
    fns = attention.ragged_training_fns(train_lengths, device=DEVICE)
    ref = attention.packed_grads(attention.loop_reference_fn(train_lengths), *packed_g, grad_out)
    for name, fn in fns.items():
        got = attention.packed_grads(fn, *packed_g, grad_out)
        errs = [((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(got, ref)]
        print(f"{name:<22} out, dq, dk, dv vs fp32 per sequence: relative max error "
              + ", ".join(f"{e:.1e}" for e in errs))
        assert max(errs) < 5e-2, (name, errs)
    leaves = [x.detach().requires_grad_() for x in packed_g]
    step = bench.compare({name: (lambda fn=fn: fn(*leaves).backward(grad_out)) for name, fn in fns.items()},
                         baseline="padded + mask", repeats=5, device=DEVICE,
                         work=attention.ragged_tflop(train_lengths, heads, head_dim) * 3.5, work_unit="TFLOP")
    print(f"{len(train_lengths)} sequences, {sum(train_lengths)} tokens, {heads} heads x {head_dim}, bf16, "
          f"forward + backward; padding wastes {attention.wasted_fraction(train_lengths):.0%} of a padded batch")
    print(bench.table(step))
    for name, res in step["results"].items():
        print(f"{name:<22} {res['TFLOP_per_s']:6.1f} useful TFLOP/s")
    bench.plot(step, title=f"Ragged training step on {capabilities().device_name}, bf16").show()

# %% [markdown]
# ## torch.compile on a transformer block: the honest picture
#
# The 2.0 article quotes "a speedup between 1.5x and 2x in training Transformers models" from one line.
# That was a Hugging Face maintainer's quote. PyTorch's own 2.0 page
# (https://pytorch.org/get-started/pytorch-2.0/) reports, across 163 open-source models on an A100, training
# 43% faster on average (21% in fp32, 51% with AMP), and the numbers vary widely per model and shape. Here:
# a pre-norm block (LayerNorm, QKV projection, SDPA, MLP), inference, eager vs `torch.compile` at default
# settings. The first compiled call compiles; that time is reported separately. Timings use the thread
# count the block was compiled at: changing it later would trigger a recompile (lesson 08 shows it). This
# is inference under `no_grad`; the page's figures are training steps on a GPU, so they do not predict
# this number, and neither does this number predict theirs.

# %%
shapes = [(1, 32)] if QUICK else [(1, 32), (8, 256)]
compiled_runs = [attention.compile_and_compare(b, t, repeats=REPEATS, min_run_time=0.02 if QUICK else 0.2)
                 for b, t in shapes]
for r in compiled_runs:
    assert r["max_abs_diff"] < 1e-3, r["max_abs_diff"]
    ratio = r["results"]["compiled"]["ratio_to_baseline"]
    lo, hi = bench.speedup_range(r["results"], "eager", "compiled")
    verdict = (("faster" if ratio > 1 else "slower") if bench.separated(r, "eager", "compiled")
               else f"the spreads overlap: {bench.NOISY}")
    print(f"batch {r['shape'][0]} x {r['shape'][1]} tokens: compile {r['compile_s']:.1f} s, compiled runs at "
          f"{ratio:.2f}x eager's speed ({lo:.2f}x to {hi:.2f}x over the repeats; {verdict}), "
          f"max |compiled - eager| {r['max_abs_diff']:.1e}")
bench.save_json(compiled_runs, "runs/06_compiled_block.json")
if QUICK:
    print("quick mode times one small shape; QUICK = False adds batch 8 x 256 tokens")

# %% [markdown]
# Compilation costs seconds up front (less on a second run: Inductor caches compiled graphs on disk). The
# speed-up is small and shape-dependent: at small shapes the guards and wrappers around the compiled graph
# can cost as much as the arithmetic, and compiled can be *slower* than eager; at larger shapes fusion
# starts to pay. Shared machines add noise (thread contention hurts eager's many small ops most), so re-run
# before concluding. The only honest statement is a measured one, per model, shape and machine.
#
# ## What changes on other hardware
#
# - **NVIDIA GPU**: fp16/bf16 inputs pick `FLASH_ATTENTION` (sm80+) or `CUDNN_ATTENTION` (sm90/sm100, by the
#   rule above); `EFFICIENT_ATTENTION` covers fp32 and masks; `varlen_attn` runs (A100 or newer). The
#   declines warn per backend (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`), and
#   `torch.backends.cuda.can_use_flash_attention(SDPAParams(...), debug=True)` runs one backend's checks
#   alone, for CUDA tensors. `torch.compile(flex_attention)` trains there.
# - **AMD GPU**: flash and memory-efficient backends come from AOTriton by default, CK if selected.
# - **CPU**: only `MATH` and the CPU flash kernel; bf16 helps where the CPU has native bf16, and MATH keeps
#   fp32 scores either way.
#
# ## Pitfalls

# %% tags=["nbval-check-output"]
# 1. Forcing a backend with no CPU kernel: "No viable backend", and no reason is warned (the CPU selector
#    gives up before any check runs).
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
packed, offsets, _ = attention.pack(seqs)
sliced = torch.nested.nested_tensor_from_jagged(packed[:, :1], offsets.long()).transpose(1, 2)
try:
    F.scaled_dot_product_attention(sliced, sliced, sliced)
except RuntimeError as exc:
    print("5.", type(exc).__name__ + ":", str(exc))
