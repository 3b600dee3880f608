# %% [markdown]
# # 06 · Attention kernels: which SDPA kernel runs, ragged batches, varlen_attn and FlexAttention
#
# | | |
# |---|---|
# | **What you will learn** | which kernel `F.scaled_dot_product_attention` runs and why: constraints, priority order (per release and cuDNN), forcing one with `sdpa_kernel`, the error when none fits and its reasons; the memory the MATH fallback spends, measured; ragged batches: padding + mask, jagged nested tensors, 2.10's `varlen_attn`; FlexAttention for masks SDPA cannot express: how `create_block_mask` builds its mask, measured against padding |
# | **Prerequisites** | lesson 00; what attention computes (softmax(QKᵀ/√d)·V) |
# | **Hardware** | any CPU. On an NVIDIA or AMD GPU with a flash kernel (not Colab's T4) the backend story runs there, in bf16; an NVIDIA GPU (A100 or newer) also runs `varlen_attn` against padding and nested tensors |
# | **Time** | 45 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02), and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04); 2.10 facts from its release notes and sources (`torch/nn/attention/`) |
#
# The story: one function, several kernels → which one runs, and why → what the fallback costs →
# batches of unequal lengths → masks SDPA cannot express. 2.10 added
# `torch.nn.attention.varlen.varlen_attn` for packed batches of unequal lengths
# ([PR #164502](https://github.com/pytorch/pytorch/pull/164502), release issue #171814).

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
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import attention, bench
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SEQ_LENS, RAGGED_LENGTHS = [256, 512], [17, 40, 9, 128, 300]
# The story runs on an NVIDIA or AMD GPU (torch calls both "cuda") whose flash kernel runs, in bf16 (fp16
# where the GPU has no bf16): CUDA's flash takes fp16/bf16 only. Elsewhere (a CPU, an Intel or Apple GPU, or
# a GPU without flash such as Colab's T4) it runs on the CPU in fp32.
GPU_DTYPE = torch.bfloat16 if capabilities().bf16 else torch.float16
GPU_FLASH = DEVICE.type == "cuda" and attention.flash_runs_on(DEVICE, GPU_DTYPE)
STORY = DEVICE if GPU_FLASH else torch.device("cpu")
STORY_DTYPE = GPU_DTYPE if GPU_FLASH else torch.float32
if DEVICE.type == "cuda" and not GPU_FLASH:
    print(f"SDPA's flash kernel does not run on this GPU ({capabilities().arch}; CUDA's needs sm80+), so the backend "
          "story below runs on the CPU; the ragged-batch section still uses the GPU where it can.")
if STORY.type == "cuda":
    SEQ_LENS = [1024, 4096] if QUICK else [1024, 2048, 4096, 8192]
REPEATS, MIN_RUN_S = (3, 0.02) if QUICK else (5, 0.1)
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
# the release and the cuDNN: cuDNN went first on sm90/sm100 GPUs with #162073 (for 2.9); since #171627
# (January 2026, in 2.10's `cuda/sdp_utils.cpp`) only if the cuDNN loaded at run time is newer than 9.15, and
# `TORCH_CUDNN_SDPA_DEPRIORITIZED=1` turns that off. Two wheels of one release can pick differently on the
# same H100: print the order where you run (the deep dive does, on a GPU).
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
# ## Forcing one, and the error when none fits
#
# `with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):` restricts the choice to the listed backends
# (`set_priority=True` also makes the list's order the priority order). When none of them takes the
# inputs, SDPA raises `RuntimeError: No available kernel`. The reasons come just before it as warnings:
# the selector re-runs each backend's checks with debug on, and every failed check emits one
# (`sdp_utils_cpp.cpp`; `sdp_utils.cpp` on CUDA). `attention.decline_reasons` catches them. A backend with
# no kernel for the device at all fails with "No viable backend" and no reasons.

# %%
forced = {"flash forced, 8 q heads, 2 k/v heads, no enable_gqa": (cases["8 q heads, 2 k/v heads"][0], q[:, :2],
                                                                q[:, :2], ["FLASH_ATTENTION"], {})}
if STORY.type == "cuda":
    forced["flash forced, boolean mask"] = (q, q, q, ["FLASH_ATTENTION"], {"attn_mask": mask_128})
    forced["flash forced, fp32"] = (q.float(), q.float(), q.float(), ["FLASH_ATTENTION"], {})
else:
    forced["flash forced, dropout_p=0.1"] = (q, q, q, ["FLASH_ATTENTION"], {"dropout_p": 0.1})
    forced["EFFICIENT_ATTENTION forced"] = (q, q, q, ["EFFICIENT_ATTENTION"], {})
for label, (qq, kk, vv, allowed, kwargs) in forced.items():
    outcome, reasons = attention.decline_reasons(qq, kk, vv, allowed, **kwargs)
    print(f"{label}: {outcome}" + "".join(f"\n    warning: {r}" for r in reasons))

# %% tags=["nbval-check-output"]
q_cpu = q.cpu().float()    # both CPU kernels take fp32 and masks: the float64 check runs on the CPU everywhere
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
# ## What the fallback costs: the score matrix
#
# MATH writes the `batch × heads × seq × seq` scores, then their softmax, before the second matmul; flash
# keeps one tile per thread and writes only the output and one log-sum-exp per row.
# `attention.forward_peak_memory` reads the peak one causal forward held beyond its inputs
# (`torch.profiler(profile_memory=True)` on a CPU, the allocator's statistics on a GPU).
# `attention.time_backends` times both (on a CPU at `TIMING_THREADS` thread); the reveal quotes a speed
# ratio only when the two min-max spreads do not overlap.

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

# %% tags=["reveal"]
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
# 3. **`varlen_attn`** (2.10): the same packed tokens and int32 offsets (`cu_seq_q`, `cu_seq_k`) go to a
#    flash kernel that never sees padding. NVIDIA only (A100 or newer), fp16/bf16.
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
#
# On an NVIDIA GPU the next cell checks `varlen_attn` against float64 and times the three ways at sizes
# where the kernels, not Python, dominate: every input is padded or packed beforehand, so a timed call is
# one attention call.

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
# fused kernel: Triton on a GPU, a C++ template on a CPU (AVX2, not macOS, inference only:
# `torch/_inductor/kernel/flex/flex_cpu.py`). torch 2.10's CPU template refuses one tensor passed as q, k
# and v, so `attention.packed_heads_first` makes three.

# %%
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
# ### Your turn: a sliding window inside each document
#
# Local attention: a token sees itself and the `WINDOW - 1` tokens before it, and only within its own
# document. Edit the one `return` line of `my_mask_mod`. The check builds the mask with `create_mask` and
# compares it with a dense one written with ordinary tensor code, then runs `flex_attention` with your block
# mask against SDPA with that dense mask.

# %% tags=["your-turn"]
WINDOW = 32


def my_mask_mod(b, h, q_idx, kv_idx):
    return doc[q_idx] == doc[kv_idx]


# %%
from torch.nn.attention.flex_attention import create_mask

from helpers.checks import check_close


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
# allows: flash vs MATH speed against the CPU's peak; the backward per backend; grouped-query attention and
# `causal_lower_right` for decoding; SDPA backends on an NVIDIA GPU (your wheel's priority order, accuracy,
# memory, time) and the opt-in FA4; AOTriton vs Composable Kernel on ROCm; what
# `torch.compile(create_block_mask)` saves; `varlen_attn` and FlexAttention training on a GPU; what
# `torch.compile` gives a transformer block; pitfalls. Read it before you choose attention kernels for
# training or move to AMD GPUs. Then [lab 06](../labs/06_attention_lab.ipynb): build the key mask, pack for
# `varlen_attn`, write the op recorder that names the kernel, bucket by length.
