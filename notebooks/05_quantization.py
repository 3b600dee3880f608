# %% [markdown]
# # 05 · Quantization for deployment: int8 and int4 weight-only, scales, accuracy
#
# | | |
# |---|---|
# | **What you will learn** | why a batch-1 matmul is bound by its weight's bytes, measured against this machine's bandwidth; int8 weight-only per channel (`torch._weight_int8pack_mm`); int4 packed two codes per byte (`torch._weight_int4pack_mm_for_cpu`) and what its scales and zero points cost; a group size for a size and an accuracy budget; what each format costs on a labelled task (scikit-learn digits), and what to do when post-training quantization misses |
# | **Prerequisites** | lesson 00; `nn.Linear`, a training loop |
# | **Hardware** | any CPU: every kernel here is torch's own CPU kernel. scikit-learn runs the accuracy section (skipped with a reason without it) |
# | **Time** | 43 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); claims about 2.10 are checked against its release notes and source |
#
# The story: at batch 1 a layer's time is the time to read its weight → so store fewer bytes per weight:
# int8, then int4 → the scales decide what the fewer bits can represent → what that costs on a real task
# → what to do when it costs too much.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/05_quantization.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
SIZE = 4096            # N and K of the square decode-size weight
DIGITS_STEPS = 300     # training steps of the digits classifier

# %%
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import bench, quant
from helpers.device import cpu_capability, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SIZE, DIGITS_STEPS = 1024, 200
REPEATS, MIN_RUN_S = (5, 0.02) if QUICK else (7, 0.1)
THREADS = torch.get_num_threads()
TIMING_THREADS = 1        # every timing runs at this fixed count: all threads on a busy machine swing by several times
print(f"torch {torch.__version__} · device {DEVICE} · CPU ISA {cpu_capability()} · threads {THREADS} · "
      f"quick: {QUICK} · weight {SIZE}x{SIZE}")

# %% [markdown]
# ## 1 · At batch 1, a linear layer is a memory read
#
# Generating one token runs every linear layer on one row of activations (M = 1). Each weight is read
# once and used for one multiply-add: 2 FLOPs per 4 bytes of fp32. No processor computes that slowly, so
# the time is the time to read the weight. Fewer bytes per weight, less time: that is the case for
# weight-only quantization, and accuracy is its price. The lesson measures the CPU's read bandwidth first
# (`helpers.bench`, summing a large fp32 tensor). The timings cycle through several copies of the weight,
# as a forward pass reads a different layer each time, so the weight comes from memory, not from the
# cache (in full mode: quick mode's small weights can stay in the cache).
# Every timing runs at `TIMING_THREADS` thread, and a reveal trusts a ratio only when the two candidates'
# min-max spreads do not overlap (`bench.separated`).

# %%
limits = (bench.measure_limits(TIMING_THREADS, quick=True, device="cpu") if QUICK
          else bench.machine_limits(TIMING_THREADS, device="cpu"))
BANDWIDTH = limits["read_bandwidth_gbs"]
print(f"read bandwidth: {BANDWIDTH:.1f} GB/s at {limits['threads']} threads")
print(f"fp32 weight {SIZE}x{SIZE}: {SIZE * SIZE * 4 / 2**20:.0f} MiB, so at least "
      f"{SIZE * SIZE * 4 / BANDWIDTH / 1e6:.2f} ms per read; int8: {SIZE * SIZE / BANDWIDTH / 1e6:.2f} ms")

# %% tags=["predict"]
speed_guess = predict(f"The same {SIZE}x{SIZE} layer with int8 weights (a quarter of fp32's bytes), at M = 1: how "
                      "many times faster than fp32 F.linear will it run here?", unit="x", example=4.0)

# %%
torch.manual_seed(0)
COPIES = 2 if QUICK else 4                     # distinct weights cycled, together larger than the cache
weights = [torch.randn(SIZE, SIZE) / SIZE**0.5 for _ in range(COPIES)]
int8_layers = [quant.Int8WeightOnlyLinear(*quant.quantize_per_channel(w)) for w in weights]
batches = [1, 16] if QUICK else [1, 4, 16, 64]
turn = {"i": 0}

def cycled(call):                              # each call reads the next copy's weight
    def run():
        turn["i"] = (turn["i"] + 1) % COPIES
        return call(turn["i"])
    return run

sweep = {}
for m in batches:
    x_m = torch.randn(m, SIZE)
    sweep[f"fp32 M={m}"] = cycled(lambda i, x=x_m: F.linear(x, weights[i]))
    sweep[f"int8 M={m}"] = cycled(lambda i, x=x_m: int8_layers[i](x))
with torch.no_grad():
    sweep_result = bench.compare(sweep, baseline="fp32 M=1", repeats=REPEATS, min_run_time=MIN_RUN_S, device="cpu",
                                 threads=TIMING_THREADS)
speedup = {m: sweep_result["results"][f"fp32 M={m}"]["median_s"] / sweep_result["results"][f"int8 M={m}"]["median_s"]
           for m in batches}
apart = {m: bench.separated(sweep_result, f"fp32 M={m}", f"int8 M={m}") for m in batches}
print(bench.table(sweep_result))
for m in batches:
    fp32_s = sweep_result["results"][f"fp32 M={m}"]["median_s"]
    print(f"M = {m:>2}: fp32 {fp32_s * 1e3:7.3f} ms ({SIZE * SIZE * 4 / fp32_s / 1e9 / BANDWIDTH:4.0%} of the "
          f"read bandwidth), {fp32_s / m * 1e3:6.3f} ms per row · int8 {speedup[m]:.2f}x fp32's speed"
          + ("" if apart[m] else f" (spreads overlap: {bench.NOISY})"))

# %%
fp32_share = SIZE * SIZE * 4 / sweep_result["results"]["fp32 M=1"]["median_s"] / 1e9 / BANDWIDTH
if not apart[1]:
    verdict = f"fp32's and int8's min-max spreads overlapped, so that ratio is {bench.NOISY}"
elif speedup[1] >= 3:
    verdict = "close to the byte ratio: at M = 1 the int8 kernel kept up with memory"
elif speedup[1] >= 1:
    verdict = ("faster, but short of the byte ratio: besides reading a quarter of the bytes, the kernel converts "
               "every int8 weight to float and scales it, and that work, not the read, set part of the time")
else:
    verdict = ("slower, with the spreads apart: here the int8 kernel's conversion work cost more than the bytes "
               "it saved")
reveal(speed_guess, speedup[1],
       why=f"int8 ran at {speedup[1]:.2f}x fp32's speed: {verdict}. fp32 read its weight at {fp32_share:.0%} of the "
           "measured bandwidth" + (" (above 100%: a weight this small came from the cache, as in quick mode, or the "
                                    "bandwidth was measured under other load: rerun)" if fp32_share > 1 else "")
           + ". The weight is read once for all M rows, so the time per row falls as M grows; at M = "
           f"{batches[-1]} int8 ran at {speedup[batches[-1]]:.2f}x fp32's speed"
           + (": with many rows the arithmetic sets the time, not the read." if apart[batches[-1]] else
              f", but there too the spreads overlapped: {bench.NOISY}."));

# %% [markdown]
# ## 2 · int8 weight-only, per channel
#
# One scale per output row (per channel): `scale = max|w_row| / 127`, `q = round(w / scale)`, stored as
# int8. `helpers.quant` has these as small functions with plain tensors in and out, checked here against
# torch's own `torch.quantize_per_channel`.

# %% tags=["nbval-check-output"]
import warnings

torch.manual_seed(0)
w = torch.randn(6, 10)
q, scales = quant.quantize_per_channel(w)
w_hat = quant.dequantize_per_channel(q, scales)
assert q.dtype == torch.int8 and (q.abs().amax(1) == 127).all()
assert ((w_hat - w).abs() <= scales[:, None] / 2 + 1e-6).all(), "error above half a step"
with warnings.catch_warnings():               # quantized-tensor constructors warn that they are deprecated
    warnings.simplefilter("ignore")
    reference = torch.quantize_per_channel(w, scales.double(), torch.zeros(6, dtype=torch.long), 0, torch.qint8)
assert torch.equal(q, reference.int_repr()), "codes differ from torch.quantize_per_channel"
print("codes:", q.dtype, tuple(q.shape), "· scales:", scales.dtype, tuple(scales.shape))
print("round-trip error <= scale / 2 in every row; codes equal torch.quantize_per_channel's")

# %% [markdown]
# `Int8WeightOnlyLinear` calls `torch._weight_int8pack_mm(x, w_int8[N, K], scales[N])`, PyTorch's int8
# weight-only kernel (CPU, CUDA, MPS; 2.10 added XPU), with bf16 activations: on x86 CPUs the kernel's
# vectorized loop is written for them (fp32 activations are correct too: the deep dive times that path).

# %% [markdown]
# ## 3 · int4 weight-only: two codes per byte
#
# Four bits give 16 codes. With so few, one scale per row is too coarse, so int4 formats keep one scale
# **per group** of consecutive inputs (32 here) and, since 16 codes leave no room to waste, an asymmetric
# grid: codes 0..15 and a zero point per group, `w ≈ (q - 8) · scale + zero`. Two codes share a byte.
# `quant.quantize_int4_packed` writes the layout of torch's CPU kernel `torch._weight_int4pack_mm_for_cpu`,
# a bf16 scale and zero per group (the deep dive checks it). Before measuring: what does a weight cost,
# scales included?

# %% tags=["predict"]
BYTES_OPTIONS = ["1 / 0.5 / 0.5", "1 / 0.5 / 0.625", "1 / 0.5 / 1", "1 / 1 / 1.125"]
bytes_guess = predict(f"Bytes per weight of the {SIZE}x{SIZE} layer at int8 per channel (fp32 scales) / int4 codes "
                      "alone / int4 with a bf16 scale and a bf16 zero per group of 32?",
                      options=BYTES_OPTIONS, example="1 / 0.5 / 0.5")

# %%
GROUP = 32
int4_layers = [quant.Int4WeightOnlyLinear(*quant.quantize_int4_packed(w, GROUP), group_size=GROUP) for w in weights]
layer4, n_weights = int4_layers[0], SIZE * SIZE
per_weight = {"fp32": 4.0, "int8 per channel": quant.model_bytes(int8_layers[0]) / n_weights,
              "int4 codes alone": quant.tensor_bytes(layer4.packed) / n_weights,
              "int4 with scales and zeros": quant.model_bytes(layer4) / n_weights}
for name, b in per_weight.items():
    print(f"{name:<28} {b:.4f} bytes per weight")
print("int4 tensors:", {name: (t.dtype, tuple(t.shape)) for name, t in layer4.named_buffers()})
x1 = torch.randn(1, SIZE)
at_m1 = {"fp32 F.linear": lambda i: F.linear(x1, weights[i]), "int8, bf16 activations": lambda i: int8_layers[i](x1),
         "int4, bf16 activations": lambda i: int4_layers[i](x1)}
with torch.no_grad():
    int4_result = bench.compare({k: cycled(f) for k, f in at_m1.items()}, baseline="fp32 F.linear", repeats=REPEATS,
                                min_run_time=MIN_RUN_S, device="cpu", threads=TIMING_THREADS)
print(bench.table(int4_result))

# %%
measured_bytes = (per_weight["int8 per channel"], per_weight["int4 codes alone"], per_weight["int4 with scales and zeros"])
closest = min(BYTES_OPTIONS, key=lambda o: sum(abs(float(a) - b) for a, b in zip(o.split(" / "), measured_bytes)))
speed_of = {k: f"{int4_result['results'][k]['ratio_to_baseline']:.2f}x fp32's speed"
               + ("" if bench.separated(int4_result, k, "fp32 F.linear") else " (spreads overlap fp32's)")
            for k in ("int4, bf16 activations", "int8, bf16 activations")}
int4_noisy = "(spreads overlap" in speed_of["int4, bf16 activations"] + speed_of["int8, bf16 activations"]
reveal(bytes_guess, closest,
       why=f"measured {measured_bytes[0]:.4f} / {measured_bytes[1]:.4f} / {measured_bytes[2]:.4f}. int8 per channel "
           f"adds one 4-byte scale per row of {SIZE} weights: negligible. int4 per group adds a 2-byte scale and a "
           f"2-byte zero per {GROUP} weights, 2 / {GROUP} of a byte each, 4 / {GROUP} together: a quarter more than "
           f"the codes. At M = 1 int4 ran at {speed_of['int4, bf16 activations']} here, int8 at "
           f"{speed_of['int8, bf16 activations']}"
           + (f": where spreads overlap, the ratio is {bench.NOISY}." if int4_noisy else
              ": where a kernel keeps up with memory, fewer bytes mean less time; where a ratio falls short of the "
              "byte ratio, the kernel's unpacking and scaling set the time."));


# %% [markdown]
# ## 4 · Scales and granularity
#
# A scale trades rounding error (a big scale makes coarse steps) against clipping (a small scale clips the
# largest values). Min-max scales never clip, so one outlier coarsens the steps of every weight that
# shares its scale: per tensor all of them, per channel its row, per group its group. Finer groups cost
# bytes: each group stores its scale. The layer below has one large weight and one row eight times larger
# than the rest. The error is the signal-to-quantization-noise ratio, SQNR = 10·log10(‖w‖² / ‖w − ŵ‖²) in
# dB: each extra bit adds about 6 dB. (The deep dive measures each granularity on this layer.)

# %%
def outlier_layer(outlier: float = 50.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 512, generator=g)
    w[3, 7] = outlier            # one large weight, as trained LLM layers have
    w[10] *= 8                   # one row much larger than the rest
    return w

def int4_sqnr(w: torch.Tensor, group_size: int | None) -> float:
    """Symmetric 4-bit rounding: one scale per tensor (None) or per group of inputs (the row length: per channel)."""
    if group_size is None:
        return quant.sqnr_db(w, quant.fake_quantize(w, quant.minmax_scale(w, 4), 4))
    q4, s4 = quant.quantize_per_group(w, group_size, bits=4)
    return quant.sqnr_db(w, quant.dequantize_per_group(q4, s4))

w_out = outlier_layer()

# %% [markdown]
# ### Your turn: meet a size budget and an accuracy budget
#
# The layer above must ship at int4 with **SQNR of at least 20 dB** and **at most 0.7 bytes per weight**,
# scales included (the codes alone are 0.5 bytes; each scale here is 4 bytes, fp32). Change `GROUP_SIZE`
# (a divisor of 512).

# %% tags=["your-turn"]
GROUP_SIZE = 512

# %%
from helpers.checks import fail, your_turn

def check_budget():
    if 512 % GROUP_SIZE:
        fail("GROUP_SIZE", f"{GROUP_SIZE} does not divide the 512 inputs of a row", "pick a divisor of 512")
    db, size = int4_sqnr(w_out, GROUP_SIZE), 0.5 + 4 / GROUP_SIZE
    print(f"group {GROUP_SIZE}: SQNR {db:.1f} dB, {size:.3f} bytes per weight")
    if size > 0.7:
        fail("size budget", f"{size:.3f} bytes per weight",
             "every group stores its own 4-byte scale: too many groups cost more than the budget allows")
    if db < 20:
        fail("accuracy budget", f"SQNR {db:.1f} dB",
             "a scale shared by too many weights is stretched by the largest of them")

your_turn(check_budget, what="an int4 group size within both budgets");

# %% [markdown]
# ## 5 · Accuracy on a real labelled task: scikit-learn digits
#
# SQNR says how far the weights moved, not what that costs on a task. The handwritten digits bundled with
# scikit-learn (8x8 images, ten classes; `load_digits` downloads nothing) train a small MLP in seconds
# and have a test split. The cell trains it in fp32, quantizes the same weights several ways and counts
# the test images each variant gets wrong. The int4 kernel needs out_features divisible by 16, so the
# 10-class head stays int8 in the int4 row. The last row rounds to 2 bits (three levels) per group of 16,
# to see what a miss looks like. Without scikit-learn (the minimal environment) the section is skipped.

# %% tags=["predict"]
DIGITS_OPTIONS = ["none more, or fewer", "1 to 5 more", "6 to 20 more", "more than 20 more"]
int4_task_guess = predict("Packed int4 (group 32, head int8) against fp32 on the same test images: how many more "
                          "will it get wrong?", options=DIGITS_OPTIONS, example="1 to 5 more")

# %%
HAVE_SKLEARN = requires("sklearn", section="Accuracy on scikit-learn digits")
digits = {}
if HAVE_SKLEARN:
    from helpers.validation.upgrade import digits_split

    dx_train, dy_train, dx_test, dy_test = digits_split(seed=0)   # 8x8 images as 64 features in [0, 1]
    torch.set_num_threads(1)                                       # bitwise-reproducible training
    torch.manual_seed(0)
    digits_fp32 = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    opt, g = torch.optim.Adam(digits_fp32.parameters(), lr=3e-3), torch.Generator().manual_seed(0)
    for _ in range(DIGITS_STEPS):
        idx = torch.randint(0, len(dx_train), (128,), generator=g)
        loss = F.cross_entropy(digits_fp32(dx_train[idx]), dy_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    digits_fp32.eval()
    int4_or_int8 = lambda lin: (quant.Int4WeightOnlyLinear.from_linear(lin, 32) if lin.out_features % 16 == 0
                                else quant.Int8WeightOnlyLinear.from_linear(lin))
    digits_models = {
        "fp32": digits_fp32,
        "int8 per channel": quant.swap_linears(copy.deepcopy(digits_fp32), quant.Int8WeightOnlyLinear.from_linear),
        "int4 packed, group 32 (head int8)": quant.swap_linears(copy.deepcopy(digits_fp32), int4_or_int8),
        "int4 per channel (rounded, kept fp32)": quant.quantize_model_per_group(copy.deepcopy(digits_fp32), 4, None),
        "int2 per group of 16 (rounded, kept fp32)": quant.quantize_model_per_group(copy.deepcopy(digits_fp32), 2, 16),
    }
    print(f"{'digits: ' + str(len(dx_test)) + ' test images':<44}{'accuracy':>9}{'wrong':>7}{'KiB held':>10}")
    for name, m in digits_models.items():
        acc = quant.accuracy(m, dx_test, dy_test)
        digits[name] = {"accuracy": acc, "wrong": round((1 - acc) * len(dx_test)), "KiB": quant.model_bytes(m) / 1024}
        print(f"{name:<44}{acc:>9.4f}{digits[name]['wrong']:>7}{digits[name]['KiB']:>10.1f}")
    torch.set_num_threads(THREADS)

# %%
if HAVE_SKLEARN:
    base = digits["fp32"]["accuracy"]
    assert base > 0.9, "the digits MLP did not learn"
    assert digits["int8 per channel"]["accuracy"] >= base - 0.01, digits
    assert digits["int4 packed, group 32 (head int8)"]["accuracy"] >= base - 0.03, digits
    assert digits["int2 per group of 16 (rounded, kept fp32)"]["accuracy"] < base - 0.02, digits
    print("int8 within 1 point of fp32's test accuracy, packed int4 within 3; 2-bit rounding loses more than 2")
    more = digits["int4 packed, group 32 (head int8)"]["wrong"] - digits["fp32"]["wrong"]
    reveal(int4_task_guess, DIGITS_OPTIONS[(more > 0) + (more > 5) + (more > 20)],
           why=f"wrong answers on {len(dx_test)} test images: "
               + "; ".join(f"{name} {d['wrong']}" for name, d in digits.items())
               + ". A scale per group of 32 moves each weight at most half a step of its own group's grid.");
else:
    print("no reveal: the digits section was skipped (scikit-learn is not installed)")

# %% [markdown]
# **What the numbers mean.** The wrong-answer column is the honest unit: one image moves the accuracy by
# a fraction of a point, so a difference of one or two images is noise, not a ranking. ("Rounded, kept
# fp32" rows store the rounded weights as floats: they measure accuracy, not size.) A deployment makes the
# same measurement on its own validation set, never on random inputs.
#
# ## 6 · When post-training quantization misses
#
# Everything above is post-training quantization (PTQ): round a trained model's weights. When it misses
# the accuracy budget, as the 2-bit row does, the remedies in order of cost:
#
# 1. **More bits or finer groups** for the layers that lose the most (measure one layer at a time).
# 2. **Calibrated PTQ**, which looks at activations from a few real inputs to round better:
#    [GPTQ](https://arxiv.org/abs/2210.17323) and [AWQ](https://arxiv.org/abs/2306.00978), torchao
#    prototypes in 0.16 (the deep dive says how each works).
# 3. **Quantization-aware training (QAT)**: fine-tune with the rounding in the forward pass, so the
#    weights learn to survive it. The deep dive runs it against a fair control: the fp32 model fine-tuned
#    for the same steps.
#
# Weight-only quantization speeds up the memory-bound batch-1 case. When batches are large, the matmul
# is compute-bound and the activations must be quantized too, so the multiply itself runs in int8 or FP8
# (dynamic or static int8, FP8: the deep dive).
#
# ## 7 · Summary
#
# What this run measured, in one table (speed at M = 1 on the `SIZE x SIZE` layer).

# %%
timed = int4_result["results"]
rows = {"fp32": ("fp32 F.linear", 4.0, "fp32"),
        "int8 weight-only, per channel": ("int8, bf16 activations", per_weight["int8 per channel"], "int8 per channel"),
        "int4 weight-only, packed, group 32": ("int4, bf16 activations", per_weight["int4 with scales and zeros"],
                                               "int4 packed, group 32 (head int8)")}
print(f"{'format':<36}{'bytes/weight':>13}{'M=1 speed vs fp32':>19}{'digits accuracy':>17}")
for name, (timing, b, task) in rows.items():
    acc = f"{digits[task]['accuracy']:.4f}" if task in digits else "skipped"
    reliable = timing == "fp32 F.linear" or bench.separated(int4_result, timing, "fp32 F.linear")
    speed = f"{timed[timing]['ratio_to_baseline']:.2f}x" if reliable else "too noisy*"
    print(f"{name:<36}{b:>13.3f}{speed:>19}{acc:>17}")
if int4_noisy:
    print(f"* its min-max spread overlaps fp32's: {bench.NOISY}")

# %% [markdown]
# On a GPU decode stays memory-bound (an H200 reads 4.8 TB/s, https://www.nvidia.com/en-us/data-center/h200/),
# and the production path is torchao's `quantize_(model, Int8WeightOnlyConfig())` or, on NVIDIA GPUs,
# `Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")`, then `torch.compile`,
# which fuses the dequantization into the matmul.
#
# ## Going further
#
# [The deep dive](05_quantization_deep_dive.ipynb) holds the rest: the int8 kernel's paths, among them
# the trap of feeding it fp32 activations, the int4 layout checked, and the ISA pitfalls; SQNR per
# tensor, channel and group on section 4's layer, calibrators and zero points; dynamic int8, QAT, static
# int8 with PT2E lowered through Inductor, FP8; torchao's configs compiled on a
# GPU and on the CPU (int4, HQQ); the XPU kernel. Read it before you deploy a quantized model. Then
# [lab 05](../labs/05_quantization_lab.ipynb): quantize a model to a size and agreement budget.
