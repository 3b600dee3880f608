# %% [markdown]
# # 05 · Deep dive: Quantization: kernel paths, calibration, QAT, PT2E lowering, FP8 and torchao on a GPU
#
# | | |
# |---|---|
# | **What you will learn** | the int8 kernel's devices and paths, and what fp32 activations cost it; the int4 CPU kernel's layout, checked; int4 per tensor, per channel and per group; calibrators and zero points; dynamic int8 with `torch.ao` (deprecated) and torchao; QAT by hand and with torchao's `QATConfig`, against an fp32 control; static int8 with PT2E, lowered through Inductor; FP8 `scaled_mm` row-wise vs tensor-wise, and on an FP8 GPU; torchao's int8, int4 and FP8 configs compiled on a GPU; choosing a format for a size and error budget; the CPU kernels' ISA pitfalls |
# | **Prerequisites** | [lesson 05](05_quantization.ipynb) |
# | **Hardware** | any CPU (every numeric section, FP8 included). torchao, a C++ compiler (full mode's compiled rows), an FP8 GPU (NVIDIA sm_89+, AMD MI300+) and an Intel GPU each run their sections; a section without them says what it skipped |
# | **Time** | 118 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); claims about 2.10 are checked against its release notes and source. torchao 0.16.0 is the release paired with torch 2.10 |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/05_quantization_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
SIZE = 4096            # N and K of the square decode-size weight
QAT_STEPS = 800        # training steps for the fp32 model of the QAT task

# %%
import copy
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import bench, quant
from helpers.device import capabilities, cpu_capability, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SIZE, QAT_STEPS = 1024, 300
REPEATS, MIN_RUN_S = (3, 0.02) if QUICK else (5, 0.1)
caps = capabilities()
THREADS = torch.get_num_threads()
torch.manual_seed(0)
weight = torch.randn(SIZE, SIZE) / SIZE**0.5                         # one decode-size layer
x1 = torch.randn(1, SIZE)
print(f"torch {torch.__version__} · device {DEVICE} · {caps.device_name} · CPU ISA {cpu_capability()} · "
      f"threads {THREADS} · quick: {QUICK} · weight {SIZE}x{SIZE}")

# %% [markdown]
# ## 1 · The int8 kernel: which devices, which path
#
# `torch._weight_int8pack_mm(x, w_int8[N, K], scales[N])` is PyTorch's int8 weight-only kernel (CPU,
# CUDA, MPS; 2.10 added XPU). On the CPU its scales must have x's dtype, and the dtype you choose for
# the activations picks the code path. The core lesson's `Int8WeightOnlyLinear` fed it bf16 activations.
# The timings run as the core lesson's do: at one thread, cycling through copies of the weight so that it
# comes from memory, trusting a ratio only when the min-max spreads do not overlap (`bench.separated`).

# %% tags=["predict"]
trap_guess = predict("The same int8 weights fed fp32 activations instead of bf16 (same answer): against fp32 "
                     "F.linear at M = 1 it will be...", options=["faster", "about as fast", "slower"],
                     example="faster")

# %%
TIMING_THREADS = 1        # timings run at this fixed count: all threads on a busy machine swing by several times
COPIES = 2 if QUICK else 4                     # distinct weights cycled, together larger than the cache
weights = [weight] + [torch.randn(SIZE, SIZE) / SIZE**0.5 for _ in range(COPIES - 1)]
int8_layers = [quant.Int8WeightOnlyLinear(*quant.quantize_per_channel(w)) for w in weights]
turn = {"i": 0}

def cycled(call):                              # each call reads the next copy's weight
    def run():
        turn["i"] = (turn["i"] + 1) % COPIES
        return call(turn["i"])
    return run

weights_bf16 = [w.bfloat16() for w in weights]
paths = {p: [quant.Int8WeightOnlyLinear(layer.q, layer.scales, path=p) for layer in int8_layers]
         for p in ("int8pack_bf16", "int8pack_fp32")}
trap = {"fp32 F.linear": cycled(lambda i: F.linear(x1, weights[i])),
        "bf16 F.linear": cycled(lambda i: F.linear(x1.bfloat16(), weights_bf16[i])),
        "int8, bf16 activations": cycled(lambda i: paths["int8pack_bf16"][i](x1)),
        "int8, fp32 activations": cycled(lambda i: paths["int8pack_fp32"][i](x1))}
with torch.no_grad():
    trap_result = bench.compare(trap, baseline="fp32 F.linear", repeats=REPEATS, min_run_time=MIN_RUN_S, device="cpu",
                                threads=TIMING_THREADS)
print(bench.table(trap_result))
fp32_act = trap_result["results"]["int8, fp32 activations"]["ratio_to_baseline"]

# %% tags=["reveal"]
bf16_act = trap_result["results"]["int8, bf16 activations"]["ratio_to_baseline"]
trap_apart = bench.separated(trap_result, "int8, fp32 activations", "fp32 F.linear")
trap_seen = ("about as fast" if not trap_apart else       # overlapping spreads: this run cannot tell them apart
             "faster" if fp32_act > 1.15 else "slower" if fp32_act < 0.87 else "about as fast")
reveal(trap_guess, trap_seen,
       why=("" if trap_apart else f"the two spreads overlapped, so this run counts them as about as fast: {bench.NOISY}. ")
           + f"Fed fp32, the int8 kernel ran at {fp32_act:.2f}x fp32 F.linear's speed; fed bf16, at {bf16_act:.2f}x. "
           "The CPU kernel (aten/src/ATen/native/cpu/int8mm_kernel.cpp) is compiled per ISA; on x86 (this CPU: "
           f"{cpu_capability()}) its vectorized loop is written for bf16 activations, and "
           + ("this run shows the trap: fp32 activations took the slower path. "
              if bench.separated(trap_result, "int8, fp32 activations", "int8, bf16 activations") and fp32_act < bf16_act
              else "yet here the fp32 path was not measurably the slower one (read the spread column, and run the cell "
              "again). ")
           + "The aarch64 build vectorizes fp32, fp16 and bf16 alike, so on Graviton or Apple silicon the trap may "
           "not exist: measure, as quant.choose_fastest_path does in the next cell.");

# %% [markdown]
# `torch._weight_int8pack_mm` is declared per device in torch's operator list; 2.10 added the XPU kernel
# (#160938). The cell reads that list and asks the dispatcher which kernels this build has. Since the fastest
# path depends on the device, its ISA and the build, `quant.choose_fastest_path` runs every path (bf16 or
# fp32 activations, dequantize then `F.linear`), drops any that is off the fp32 reference, and keeps the fastest
# median; when the two fastest spreads overlap, the cell says this run could not tell them apart.

# %%
import pathlib

import torchgen

yaml_text = (pathlib.Path(torchgen.__file__).parent / "packaged/ATen/native/native_functions.yaml").read_text()
entry = yaml_text.split("- func: _weight_int8pack_mm(")[1].split("\n\n")[0]
declared = [line.split(":")[0].strip() for line in entry.splitlines()[2:]]
built = [key for key in declared if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", key)]
print(f"_weight_int8pack_mm kernels declared in torch {torch.__version__}: {', '.join(declared)}; "
      f"in this build: {', '.join(built)}")
with torch.no_grad():
    choice = quant.choose_fastest_path(quant.Int8WeightOnlyLinear(*quant.quantize_per_channel(weight)), x1,
                                       threads=TIMING_THREADS)
for path in quant.INT8_PATHS:
    err = choice["errors"][path]
    print(f"  {path:<15} relative error {f'{err:.1e}' if isinstance(err, float) else err}")
print(bench.table(choice["timing"]))
print("chosen path:", choice["path"]
      + (f" (its spread overlaps {choice['tied_with']}'s: which is faster is {bench.NOISY})" if choice["tied_with"] else ""))

# %% [markdown]
# ### The int4 CPU kernel's layout, checked
#
# The core lesson's `quant.quantize_int4_packed` writes exactly the layout of torch's CPU kernel
# `torch._weight_int4pack_mm_for_cpu` (codes packed by `torch._convert_weight_to_int4pack_for_cpu`, a bf16
# scale and zero per group), the layout torchao's CPU int4 format uses too. The check counts the bytes from
# the tensors, and runs the round trip and a matmul through the kernel.

# %% tags=["nbval-check-output"]
GROUP, n_weights = 32, SIZE * SIZE
layer4 = quant.Int4WeightOnlyLinear(*quant.quantize_int4_packed(weight, GROUP), group_size=GROUP)
assert quant.model_bytes(int8_layers[0]) == n_weights + 4 * SIZE                 # codes + one fp32 scale per row
assert quant.model_bytes(layer4) == n_weights // 2 + (SIZE // GROUP) * SIZE * 2 * 2  # packed codes + bf16 scale, zero
w_small = weights[0][:64, :256]                  # the round trip on a slice: unpacking reads the codes via the kernel
small4 = quant.Int4WeightOnlyLinear(*quant.quantize_int4_packed(w_small, GROUP), group_size=GROUP)
w_hat4 = quant.dequantize_int4_packed(small4.packed, small4.scale_and_zero)
group_range = w_small.reshape(64, -1, GROUP).aminmax(dim=-1)
step4 = (group_range.max - group_range.min) / 15
assert ((w_hat4 - w_small).abs().reshape(64, -1, GROUP) <= step4[..., None] * 0.51 + 1e-2).all()
y4, y4_ref = small4(x1[:, :256]), F.linear(x1[:, :256], w_hat4)
assert ((y4 - y4_ref).norm() / y4_ref.norm()) < 2e-2, "the int4 kernel disagrees with its dequantized weight"
print("bytes counted from the tensors: int8 = codes + scales, int4 = codes packed two per byte + scales + zeros")
print("int4 round trip within about half a step of its group; the kernel matches its dequantized weight")


# %% [markdown]
# ## 2 · Calibration: choosing the scale, and what a zero point buys
#
# The scale trades **rounding error** (a big scale makes coarse steps) against **clipping error** (a small
# scale clips the largest values). One outlier makes min-max pick a huge scale for everyone. Three
# calibrators in `helpers.quant`, each per tensor or per channel: **min-max** (never clips), **percentile**
# (clips above the 99.9th percentile of |x|), **MSE** (searches the scale with the least squared error).

# %%
def outlier_layer(outlier: float = 50.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 512, generator=g)
    w[3, 7] = outlier            # one large weight, as trained LLM layers have
    w[10] *= 8                   # one row much larger than the rest
    return w

def calibration_table(w: torch.Tensor, bits: int) -> dict:
    table = {}
    for axis, granularity in ((None, "per tensor"), (0, "per channel")):
        for method in quant.CALIBRATORS:
            scale = quant.calibrate(w, method, bits=bits, axis=axis)
            w_q = quant.fake_quantize(w, quant.broadcast_scale(scale, w, axis), bits)
            table[f"{granularity}, {method}"] = quant.sqnr_db(w, w_q)
    return table

w_out = outlier_layer()
tables = {bits: calibration_table(w_out, bits) for bits in (8, 4)}
print(f"{'SQNR in dB (higher is better)':<34}{'8 bits':>8}{'4 bits':>8}")
for name in tables[8]:
    print(f"{name:<34}{tables[8][name]:>8.1f}{tables[4][name]:>8.1f}")

# %% tags=["nbval-check-output"]
for bits, t in tables.items():
    for method in quant.CALIBRATORS:
        assert t[f"per channel, {method}"] > t[f"per tensor, {method}"], (bits, method)
    assert t["per tensor, mse"] >= t["per tensor, minmax"] - 1e-9
assert tables[4]["per tensor, percentile"] > tables[4]["per tensor, minmax"]
print("per channel beats per tensor for every calibrator, at 8 and 4 bits")
print("MSE is never worse than min-max; at 4 bits per tensor, clipping the outlier (percentile) beats min-max")


# %% [markdown]
# ### Granularity: per tensor, per channel, per group
#
# Min-max scales never clip, so one outlier stretches the grid for every weight that shares its scale. Below:
# the same layer rounded to 4 bits with a min-max scale per tensor, per row and per group, as the core
# lesson's your-turn does (`int4_sqnr`, the core lesson's function).

# %%
def int4_sqnr(w: torch.Tensor, group_size: int | None) -> float:
    """Symmetric 4-bit rounding: one scale per tensor (None) or per group of inputs (the row length: per channel)."""
    if group_size is None:
        return quant.sqnr_db(w, quant.fake_quantize(w, quant.minmax_scale(w, 4), 4))
    q4, s4 = quant.quantize_per_group(w, group_size, bits=4)
    return quant.sqnr_db(w, quant.dequantize_per_group(q4, s4))


granularity = {"per tensor": int4_sqnr(w_out, None), "per channel (group 512)": int4_sqnr(w_out, 512),
               "per group of 128": int4_sqnr(w_out, 128), "per group of 32": int4_sqnr(w_out, 32)}
for name, db in granularity.items():
    print(f"int4, one fp32 scale {name:<24} SQNR {db:5.1f} dB")

# %% tags=["nbval-check-output"]
values = list(granularity.values())
assert all(a < b for a, b in zip(values, values[1:])), granularity
print("int4 SQNR rises at every step: per tensor < per channel < per group of 128 < per group of 32")

# %% [markdown]
# Per tensor, the outlier sets the step for all 32,768 weights and most round to zero. Per channel, it
# spoils only its own row; per group, only its own group. Finer groups cost bytes: each group stores its
# scale (4 bytes in fp32 here).

# %% [markdown]
# ### Symmetric or asymmetric: what a zero point buys
#
# So far every code was symmetric, `scale = max|x| / 127`: that fits weights, not a ReLU's output, which is
# never negative and leaves the grid's negative half unused. Asymmetric (affine) quantization maps
# `[min, max]` onto the codes 0..255: `scale = (max - min) / 255`, `zero_point = round(-min / scale)` (the code
# that stands for 0, so zeros stay exact), `q = clamp(round(x / scale) + zero_point, 0, 255)`.
# `quant.asymmetric_qparams` computes it as torch's `MinMaxObserver` does for `quint8`; below, on a ReLU
# output and on a GELU output (which dips slightly below zero).

# %%
torch.manual_seed(0)
pre_activation = torch.randn(64, 1024)
asym_db = {}
for act_name, act in (("ReLU", F.relu), ("GELU", F.gelu)):
    a = act(pre_activation)
    s_sym = a.abs().amax() / 127                              # symmetric int8: codes -127..127
    q_sym = torch.clamp(torch.round(a / s_sym), -127, 127)
    s_asym, zp = quant.asymmetric_qparams(a, bits=8)          # uint8 codes 0..255 and a zero point
    q_asym = quant.quantize_asymmetric(a, s_asym, zp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = torch.quantize_per_tensor(a, s_asym.item(), int(zp), torch.quint8)
    assert torch.equal(q_asym, reference.int_repr()), "codes differ from torch.quantize_per_tensor"
    asym_db[act_name] = {"symmetric": quant.sqnr_db(a, q_sym * s_sym),
                         "asymmetric": quant.sqnr_db(a, quant.dequantize_asymmetric(q_asym, s_asym, zp))}
    print(f"{act_name} output in [{a.min():.3f}, {a.max():.3f}]: symmetric int8 uses {q_sym.unique().numel()} "
          f"of 255 codes, SQNR {asym_db[act_name]['symmetric']:.1f} dB; uint8 with scale {s_asym:.5f}, "
          f"zero_point {int(zp)} uses {q_asym.unique().numel()} of 256 codes, SQNR {asym_db[act_name]['asymmetric']:.1f} dB")

# %% tags=["nbval-check-output"]
for act_name, db in asym_db.items():
    assert db["asymmetric"] > db["symmetric"] + 3, (act_name, db)
print("on both one-sided activations the zero point buys more than 3 dB of SQNR (about half a bit)")
print("uint8 codes equal torch.quantize_per_tensor(..., torch.quint8)")


# %% [markdown]
# The zero point costs an extra term in the matmul (`x = scale * (q - zero_point)` multiplies the row sums
# of the other operand), which is why integer kernels use asymmetric activations and symmetric weights.

# %% [markdown]
# ## 3 · Dynamic quantization: the `torch.ao` way (deprecated) and the torchao way
#
# Dynamic quantization stores int8 weights and quantizes activations on the fly, per batch.
# `torch.ao.quantization.quantize_dynamic` is deprecated since 2.8; its warning says "will be removed in
# 2.10", and it was not (it ships in 2.10 and 2.13). New code uses torchao's `quantize_(model, config)`,
# built per torch release (**0.16.0** pairs with **2.10**); "Failed to load ..." lines at its import name
# optional GPU kernels, harmless here.

# %%
def make_mlp(seed: int = 0, width: int = 256 if QUICK else 1024) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)).eval()

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mlp_ao = torch.ao.quantization.quantize_dynamic(make_mlp(), {nn.Linear}, dtype=torch.qint8)
for warning in caught:
    print(f"{warning.category.__name__}: {str(warning.message).splitlines()[0]}")
print("quantized engine:", torch.backends.quantized.engine, "·", mlp_ao[0])
HAVE_TORCHAO = requires("torchao", section="torchao: quantize_ configs, QAT and int4")
mlp_fp32 = make_mlp()
torchao_mlps = {}      # name -> (quantized model, activation dtype)
if HAVE_TORCHAO:
    import torchao
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8DynamicActivationIntxWeightConfig,
                                      Int8WeightOnlyConfig, PerGroup, quantize_)
    from torchao.quantization.qat import QATConfig

    mlp_torchao_dyn = make_mlp()
    quantize_(mlp_torchao_dyn, Int8DynamicActivationInt8WeightConfig())
    mlp_torchao_wo = make_mlp().bfloat16()
    quantize_(mlp_torchao_wo, Int8WeightOnlyConfig())
    print(f"torchao {torchao.__version__} · weight after quantize_: {type(mlp_torchao_wo[0].weight).__name__}")
    torchao_mlps = {"torchao dynamic int8": (mlp_torchao_dyn, torch.float32),
                    "torchao int8 wo (bf16 model)": (mlp_torchao_wo, torch.bfloat16)}

# %%
x_mlp = torch.randn(1, mlp_fp32[0].in_features)
dyn = {"fp32": lambda: mlp_fp32(x_mlp), "torch.ao dynamic int8": lambda: mlp_ao(x_mlp)}
dyn.update({f"{name}, eager": (lambda m=m, dt=dt: m(x_mlp.to(dt))) for name, (m, dt) in torchao_mlps.items()})
if not QUICK and caps.toolchains["cxx"]:   # compiling takes tens of seconds on a small CPU: full mode only;
    # Inductor's CPU backend generates C++, so it needs a compiler
    compiled_bf16 = torch.compile(make_mlp().bfloat16())
    with torch.no_grad():
        compiled_bf16(x_mlp.bfloat16())
    dyn["bf16, compiled"] = lambda: compiled_bf16(x_mlp.bfloat16())
    if HAVE_TORCHAO:
        compiled_wo = torch.compile(mlp_torchao_wo)
        with torch.no_grad():
            compiled_wo(x_mlp.bfloat16())
        dyn["torchao int8 wo (bf16 model), compiled"] = lambda: compiled_wo(x_mlp.bfloat16())
else:
    print("the torch.compile rows run with QUICK = False and a C++ compiler (Inductor's CPU backend generates C++)")
with torch.no_grad():
    dyn_result = bench.compare(dyn, baseline="fp32", repeats=3, min_run_time=0.01 if QUICK else 0.1, device="cpu")
print(bench.table(dyn_result))
slower = [name for name, r in dyn_result["results"].items() if "eager" in name and r["ratio_to_baseline"] < 1]
print(f"torchao rows slower than fp32 in eager mode, spreads apart: "
      f"{', '.join(n for n in slower if bench.separated(dyn_result, n, 'fp32')) or 'none'}; too close to call "
      f"(run again): {', '.join(n for n in slower if not bench.separated(dyn_result, n, 'fp32')) or 'none'}")

# %% [markdown]
# **What the numbers mean.** torchao's quantized weights are tensor subclasses: in eager mode every matmul
# goes through Python dispatch, which can make them slower than fp32. Their speed comes with `torch.compile`:
# for int8 weight-only on a CPU, Inductor's patterns (`_register_woq_mm_int8_pattern*` in
# `torch/_inductor/fx_passes/quantization.py`) turn dequantize-then-matmul into `_weight_int8pack_mm`. The
# `torch.ao` module calls a dedicated kernel with no compile, one reason people keep it.

# %% [markdown]
# ## 4 · Quantization-aware training: when rounding after training is not enough
#
# Post-training quantization (PTQ) rounds a trained model's weights: cheap at 8 bits and at 4 bits per group,
# costly below. QAT trains *with* the rounding in the forward pass. Rounding has zero gradient almost
# everywhere, so the backward pretends it was the identity: the **straight-through estimator** (STE),
# gradient 1 inside the grid's range, 0 where the value was clipped.

# %% tags=["nbval-check-output"]
x_ste = torch.linspace(-1.2, 1.2, 9, requires_grad=True)
scale = torch.tensor(0.25)                 # 3 bits: codes -3..3, so the range is +-0.75
y_ste = quant.fake_quant_ste(x_ste, scale, bits=3)
y_ste.sum().backward()
x_ref = x_ste.detach().clone().requires_grad_()
y_ref_ste = torch.fake_quantize_per_tensor_affine(x_ref, 0.25, 0, -3, 3)
y_ref_ste.sum().backward()
assert torch.equal(y_ste, y_ref_ste) and torch.equal(x_ste.grad, x_ref.grad)
print("x        ", [round(v, 2) for v in x_ste.tolist()])
print("forward  ", y_ste.tolist())
print("gradient ", x_ste.grad.tolist())
print("equal to torch.fake_quantize_per_tensor_affine, forward and backward")

# %% [markdown]
# A task where bits matter: a small classifier on synthetic data (a random "teacher" network labels Gaussian
# inputs into 4 classes), seeded. The cell trains it in fp32, rounds it (PTQ) to 4, 3 and 2 bits per group
# of 16, and fine-tunes a copy with 2-bit rounding in its forward (QAT, `quant.FakeQuantLinear`). Did QAT
# merely train longer? A **control** gets the same fine-tuning without the rounding, then 2-bit PTQ.

# %% tags=["predict"]
qat_guess = predict("At 2 bits (three levels per weight, per group of 16): QAT against the control (the same "
                    "fine-tuning without rounding, then 2-bit PTQ). Which ends with the higher test accuracy?",
                    options=["QAT, by more than 1 point", "within 1 point of each other",
                             "the control, by more than 1 point"], example="within 1 point of each other")

# %%
torch.set_num_threads(1)                       # bitwise-reproducible training on CPU
D, HIDDEN, CLASSES = 16, 64, 4

def teacher_data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(D, 64, generator=g) / D**0.5, torch.randn(64, CLASSES, generator=g) / 8
    x = torch.randn(n, D, generator=g)
    return x, (torch.tanh(x @ w1 * 2) @ w2).argmax(-1)

def classifier(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))

def train(model: nn.Module, x, y, steps: int, lr: float, seed: int) -> nn.Module:
    opt, g = torch.optim.Adam(model.parameters(), lr=lr), torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (128,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()

x_all, y_all = teacher_data(12_000)
x_train, y_train, x_test, y_test = x_all[:10_000], y_all[:10_000], x_all[10_000:], y_all[10_000:]
fp32_model = train(classifier(), x_train, y_train, QAT_STEPS, lr=3e-3, seed=0)
acc = {"fp32": quant.accuracy(fp32_model, x_test, y_test)}
QAT_FINETUNE = QAT_STEPS * 3 // 8
for bits in (4, 3, 2):
    ptq = quant.quantize_model_per_group(copy.deepcopy(fp32_model), bits=bits, group_size=16)
    acc[f"PTQ int{bits}"] = quant.accuracy(ptq, x_test, y_test)
qat_model = quant.swap_linears(copy.deepcopy(fp32_model).train(),
                               lambda l: quant.FakeQuantLinear.from_linear(l, bits=2, group_size=16))
train(qat_model, x_train, y_train, QAT_FINETUNE, lr=1e-3, seed=1)
acc["QAT int2 (by hand)"] = quant.accuracy(qat_model, x_test, y_test)
# the control: the same fine-tuning (steps, learning rate, batches) without the rounding, then PTQ
control = train(copy.deepcopy(fp32_model).train(), x_train, y_train, QAT_FINETUNE, lr=1e-3, seed=1)
acc["fp32 fine-tuned (control)"] = quant.accuracy(control, x_test, y_test)
acc["control, then PTQ int2"] = quant.accuracy(quant.quantize_model_per_group(control, bits=2, group_size=16),
                                               x_test, y_test)
torch.set_num_threads(THREADS)
for name, a in acc.items():
    print(f"{name:<20} test accuracy {a:.4f}")

# %% tags=["reveal"]
qat, ctl, tuned = acc["QAT int2 (by hand)"], acc["control, then PTQ int2"], acc["fp32 fine-tuned (control)"]
gain = qat - ctl
reveal(qat_guess, "QAT, by more than 1 point" if gain > 0.01 else "the control, by more than 1 point" if gain < -0.01
       else "within 1 point of each other",
       why=f"QAT ended at {qat:.1%}, the control at {ctl:.1%} ({gain * 100:+.1f} points). The control's fine-tuning "
           f"(fp32 {acc['fp32']:.1%} -> {tuned:.1%}) moved the weights blind to the rounding, and 2-bit rounding "
           f"then cost it {(tuned - ctl) * 100:.1f} points"
           + (f", more than rounding the original model did (PTQ int2: {acc['PTQ int2']:.1%})" if ctl < acc["PTQ int2"]
              else "") + ". QAT's forward ran on the rounded weights, so its loss measured the model that ships, "
           "and the straight-through gradient moved the float weights to where their rounding works. At 4 bits PTQ "
           f"alone gets {acc['PTQ int4']:.1%} (fp32: {acc['fp32']:.1%}): reach for QAT at the bit width where PTQ "
           "misses your accuracy budget, not before.");

# %% [markdown]
# To deploy the hand-written QAT model, round once (`quantize_model_per_group`). torchao packages the idea:
# `QATConfig(base_config, step="prepare")` swaps in fake-quantized linears (here int4 per-group weights and
# int8 per-token activations), you train, and `step="convert"` installs `base_config`'s real format.

# %%
if HAVE_TORCHAO:
    torch.set_num_threads(1)
    base_config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(16))
    ao_qat = copy.deepcopy(fp32_model).train()
    quantize_(ao_qat, QATConfig(base_config, step="prepare"))
    print(type(ao_qat[0]).__name__, "after prepare")
    train(ao_qat, x_train, y_train, QAT_FINETUNE, lr=1e-3, seed=1)
    quantize_(ao_qat, QATConfig(base_config, step="convert"))
    print(type(ao_qat[0].weight).__name__, "after convert")
    acc["QAT int4 (torchao)"] = quant.accuracy(ao_qat, x_test, y_test)
    ao_ptq = copy.deepcopy(fp32_model)
    quantize_(ao_ptq, base_config)
    acc["PTQ int4 (torchao)"] = quant.accuracy(ao_ptq, x_test, y_test)
    for name in ("PTQ int4 (torchao)", "QAT int4 (torchao)"):
        print(f"{name:<20} test accuracy {acc[name]:.4f}")
    torch.set_num_threads(THREADS)
else:
    print("torchao's QATConfig skipped: torchao is not installed (see section 3); the hand-written QAT above is the same idea")

# %% tags=["nbval-check-output"]
assert acc["fp32"] > 0.6, "the fp32 model did not learn the task"
assert acc["PTQ int2"] < acc["fp32"] - 0.02, "2-bit PTQ should cost accuracy on this task"
assert abs(acc["PTQ int4"] - acc["fp32"]) < 0.03, "4-bit per-group PTQ should cost little"
margin = 0.005 if QUICK else 0.03      # quick mode trains briefly: a small gain, the same on 2.10 and 2.13
assert acc["QAT int2 (by hand)"] > acc["PTQ int2"] + margin, acc
assert acc["QAT int2 (by hand)"] > acc["control, then PTQ int2"] + margin, acc   # not just more training
if HAVE_TORCHAO:
    assert min(acc["PTQ int4 (torchao)"], acc["QAT int4 (torchao)"]) > acc["fp32"] - 0.03, acc
print("2-bit PTQ loses accuracy; 4-bit per-group PTQ stays close to fp32; 2-bit QAT beats 2-bit PTQ, "
      "and beats the control (the same fine-tuning without rounding, then PTQ)")

# %% [markdown]
# ## 5 · Static int8 with activation calibration: PT2E
#
# **Static** quantization fixes the activation scales ahead of time, from a **calibration set** run through
# the model with observers attached. torchao's PT2E flow (`torchao.quantization.pt2e`): `torch.export`;
# `prepare_pt2e` with `X86InductorQuantizer` (default config: activations `uint8` per tensor from a
# `HistogramObserver`, weights `int8` per channel) inserts observers; calibration runs; `convert_pt2e` turns
# each observer into a quantize/dequantize (Q/DQ) pair: a *reference* graph, fast once Inductor lowers it.
#
# **Pitfall: `strict=True`.** `torch.export` defaults to non-strict. The quantizer finds linears with
# `get_source_partitions` (`torch/fx/passes/utils/source_matcher_utils.py`), which reads each node's
# `source_fn_stack`; a non-strict export does not record it. In torch 2.10 that function has no fallback, so
# with torchao 0.16 a non-strict graph comes back unquantized, silently; 2.13 falls back to `nn_module_stack`.
# The cell exports both ways and counts the Q/DQ ops: count them before trusting a converted model.

# %%
HAVE_PT2E = requires("torchao", section="PT2E static int8 with calibration")
if HAVE_PT2E:
    import collections

    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    torch.manual_seed(0)
    mlp_static = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    g_static = torch.Generator().manual_seed(1)
    STATIC_BATCH = 32                  # export fixes the batch size: every batch below has this shape
    calib_batches = [torch.randn(STATIC_BATCH, 64, generator=g_static) for _ in range(32)]
    held_out = [torch.randn(STATIC_BATCH, 64, generator=g_static) for _ in range(8)]   # never calibrated on

    def export_static(strict: bool = True) -> torch.fx.GraphModule:
        return torch.export.export(mlp_static, (calib_batches[0],), strict=strict).module()

    def calibrate_and_convert(exported: torch.fx.GraphModule, batches) -> torch.fx.GraphModule:
        quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for batch in batches:          # calibration: observers record the activation ranges
                prepared(batch)
        return convert_pt2e(prepared)

    def qdq_ops(gm: torch.fx.GraphModule) -> collections.Counter:
        return collections.Counter(str(n.target).split(".")[1] for n in gm.graph.nodes
                                   if n.op == "call_function" and "quantize_per" in str(n.target))

    strict_trap = {}
    for strict in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exported = export_static(strict)
            tagged = sum("source_fn_stack" in n.meta for n in exported.graph.nodes)
            converted = calibrate_and_convert(exported, calib_batches[:4])
        ops = qdq_ops(converted)
        strict_trap[strict] = sum(ops.values())
        print(f"strict={strict!s:<5} nodes with source_fn_stack: {tagged:>2} · Q/DQ ops after convert_pt2e: "
              f"{sum(ops.values())} {dict(ops)} · {quant.model_bytes(converted)} bytes "
              f"(fp32 {quant.model_bytes(mlp_static)}) · Python warnings: {len(caught)}")
    print(f"torch {torch.__version__} + torchao {torchao.__version__}: " + ("the non-strict export was not quantized "
          "at all, silently; strict=True was" if strict_trap[False] == 0 else "both exports were quantized here"))
    assert strict_trap[True] > 0, "strict export: convert_pt2e inserted no quantize/dequantize ops"

# %%
static_results = {}
if HAVE_PT2E:
    with torch.no_grad():
        y_held = torch.cat([mlp_static(b) for b in held_out])

    def versus_fp32(model) -> dict:
        with torch.no_grad():
            y = torch.cat([model(b) for b in held_out])
        return {"agreement": (y.argmax(-1) == y_held.argmax(-1)).float().mean().item(),
                "rel. error": ((y - y_held).norm() / y_held.norm()).item(), "bytes": quant.model_bytes(model)}

    calibrations = {"1 batch": calib_batches[:1],
                    f"{len(calib_batches)} batches": calib_batches,
                    f"{len(calib_batches)} batches of inputs x 0.1 (wrong scale)": [b * 0.1 for b in calib_batches]}
    static_results["fp32"] = versus_fp32(mlp_static)
    for name, batches in calibrations.items():
        static_int8 = calibrate_and_convert(export_static(strict=True), batches)
        assert sum(qdq_ops(static_int8).values()) > 0, name
        static_results[f"static int8, {name}"] = versus_fp32(static_int8)
    print(f"{'held-out inputs: ' + str(len(held_out) * STATIC_BATCH):<58} {'agreement':>9} {'rel. error':>10} {'bytes':>7}")
    for name, r in static_results.items():
        print(f"{name:<58} {r['agreement']:>9.4f} {r['rel. error']:>10.4f} {r['bytes']:>7}")
    enough = static_results[f"static int8, {len(calib_batches)} batches"]
    wrong = static_results[f"static int8, {len(calib_batches)} batches of inputs x 0.1 (wrong scale)"]
    assert enough["agreement"] > 0.95 and enough["rel. error"] < 0.05, enough
    assert wrong["rel. error"] > 5 * enough["rel. error"], (wrong, enough)
    assert enough["bytes"] < static_results["fp32"]["bytes"] / 3, enough
    print(f"calibrated on inputs like the deployed ones, static int8 agrees with fp32 on "
          f"{enough['agreement']:.1%} of held-out inputs at {enough['bytes'] / static_results['fp32']['bytes']:.0%} "
          f"of its bytes; calibrated on inputs a tenth the size, the activation scales clip and agreement "
          f"falls to {wrong['agreement']:.1%}")
else:
    print("PT2E static quantization skipped: torchao is not installed")

# %% [markdown]
# **What the numbers mean.** Calibration fixes the activation ranges, so its inputs must look like the
# deployed ones: one batch of these Gaussian inputs gives nearly the range of many, while inputs of the wrong
# scale (a preprocessing step missing from calibration) make every scale too small, and activations clip.

# %% [markdown]
# ### Lowering it: the int8 kernels come from Inductor
#
# In eager mode the Q/DQ pairs run as separate fp32 ops. `torch.compile` with
# `torch._inductor.config.freezing = True` lowers them: the patterns that replace each Q/DQ → linear with a
# oneDNN int8 linear (`onednn.qlinear_pointwise`) are freezing patterns (`register_freezing_graph_pattern` in
# `torch/_inductor/fx_passes/quantization.py`). The cell lowers section 3's MLP at batch 64 (compute-bound,
# where int8 arithmetic pays), checks the generated code and times it: full mode with a C++ compiler only.

# %%
if HAVE_PT2E and not QUICK and caps.toolchains["cxx"]:
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    mlp_big = make_mlp()
    x_big = torch.randn(64, mlp_big[0].in_features)
    exported_big = torch.export.export(mlp_big, (x_big,), strict=True).module()
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared_big = prepare_pt2e(exported_big, quantizer)
    with torch.no_grad():
        for _ in range(4):
            prepared_big(torch.randn(64, mlp_big[0].in_features))
    static_big = convert_pt2e(prepared_big)
    with torch.no_grad(), inductor_config.patch(freezing=True):
        lowered = torch.compile(static_big)
        _, code = run_and_get_code(lowered, x_big)
        compiled_fp32 = torch.compile(mlp_big)
        compiled_fp32(x_big)
        lowered_error = ((lowered(x_big) - mlp_big(x_big)).norm() / mlp_big(x_big).norm()).item()
        lowering = bench.compare({"fp32 eager": lambda: mlp_big(x_big), "fp32 compiled": lambda: compiled_fp32(x_big),
                                  "static int8, reference graph (eager)": lambda: static_big(x_big),
                                  "static int8, lowered by Inductor": lambda: lowered(x_big)},
                                 baseline="fp32 eager", repeats=REPEATS, min_run_time=MIN_RUN_S, device="cpu")
    print(bench.table(lowering))
    print(f"generated code calls qlinear_pointwise: {'qlinear_pointwise' in ''.join(code)} · relative error vs fp32: "
          f"{lowered_error:.4f}")
    assert "qlinear_pointwise" in "".join(code), "Inductor did not lower the Q/DQ linears to the int8 kernel"
    assert lowered_error < 0.05, lowered_error
elif HAVE_PT2E:
    print("the lowering runs with QUICK = False and a C++ compiler (compiling takes tens of seconds; "
          f"C++ compiler found: {bool(caps.toolchains['cxx'])})")

# %% [markdown]
# ## 6 · FP8: `scaled_mm`, tensor-wise and row-wise
#
# FP8 (`float8_e4m3fn`: 3 mantissa bits, largest value 448, smallest positive 2^-9, a subnormal) is a float
# format: it needs a scale only to use its range well. `torch._scaled_mm(a, b, scale_a, scale_b)` (and the
# newer `F.scaled_mm`) multiplies FP8 operands with fp32 scales, one per tensor (tensor-wise) or one per row
# of `a` and per column of `b` (row-wise: [M, 1] and [1, N]); `b` column-major, hence `w.t()`. torch 2.10's
# CPU kernel takes tensor-wise scales only ("Now _scaled_mm only supports per-tensor scaling for CPU
# backend"), 2.13's both; without the row-wise kernel, `quant.fp8_matmul_reference` writes out the same
# arithmetic, and the cell says which ran.

# %% tags=["predict"]
fp8_guess = predict("One scale for the whole weight (tensor-wise FP8) while the weight's rows span 1e2, 1e4 or 1e6 "
                    "in magnitude: from which span on does some output column lose more than 10% (relative error)?",
                    options=["already at 1e2", "from 1e4", "from 1e6", "not even at 1e6"], example="from 1e4")

# %%
FP8_ROWWISE = requires("fp8_rowwise_cpu", section="Row-wise FP8 _scaled_mm on CPU")
FP8_NAME = "fp8 row-wise" if FP8_ROWWISE else "fp8 tensor-wise"
torch.manual_seed(0)
x8 = torch.randn(32, 256)
fp8_err = {}
for decades in (2, 4, 6):               # weight rows spanning 10^decades in magnitude
    w8 = torch.randn(128, 256) * torch.logspace(-decades, 0, 128)[:, None]
    y8_ref = x8 @ w8.t()
    for rowwise in (False, True):
        # without the row-wise kernel, the same arithmetic from the dequantized operands
        y8 = quant.fp8_linear(x8, w8, rowwise=rowwise, kernel=FP8_ROWWISE or not rowwise)
        err = (y8.float() - y8_ref).norm(dim=0) / y8_ref.norm(dim=0)      # per output column = per weight row
        fp8_err[decades, "row-wise" if rowwise else "tensor-wise"] = err.max().item()
        print(f"rows spanning 1e{decades}: {'row-wise' if rowwise else 'tensor-wise':<12} "
              f"worst relative error of an output column {err.max():.4f}")
if FP8_ROWWISE:
    xq8, sx8 = quant.to_fp8(x8, rowwise=True)
    wq8, sw8 = quant.to_fp8(w8, rowwise=True)
    y_new_api = F.scaled_mm(xq8, wq8.t(), sx8, F.ScalingType.RowWise, sw8.t(), F.ScalingType.RowWise,
                            output_dtype=torch.bfloat16)
    assert torch.equal(y_new_api, quant.fp8_matmul(xq8, sx8, wq8, sw8)), "F.scaled_mm and _scaled_mm disagree"
    print("F.scaled_mm (RowWise) equals torch._scaled_mm")

# %% tags=["reveal"]
e4m3 = torch.finfo(torch.float8_e4m3fn)
tiniest = e4m3.tiny * e4m3.eps                  # the smallest subnormal, 2^-9
broken = [d for d in (2, 4, 6) if fp8_err[d, "tensor-wise"] > 0.1]
reveal(fp8_guess, f"from 1e{broken[0]}" if broken and broken[0] > 2 else "already at 1e2" if broken else "not even at 1e6",
       why=f"tensor-wise, the worst column's error was {fp8_err[2, 'tensor-wise']:.1%}, {fp8_err[4, 'tensor-wise']:.1%} "
           f"and {fp8_err[6, 'tensor-wise']:.1%} at spans 1e2, 1e4, 1e6 (row-wise: at most "
           f"{max(fp8_err[d, 'row-wise'] for d in (2, 4, 6)):.1%}). Each FP8 value keeps its own exponent, so "
           f"one scale serves rows of any size down to the format's floor: the scale maps the largest weight to "
           f"{e4m3.max:g}, and e4m3 reaches down to {tiniest:.2g} (2^-9), a span of {e4m3.max / tiniest:.1e}. Rows "
           "1e4 smaller land low in that range, with fewer mantissa bits (subnormals), and lose a little; rows 1e6 "
           "smaller fall below half the smallest subnormal, round to 0, and their outputs are lost. Row-wise scales "
           "give every row the whole range.");

# %% tags=["nbval-check-output"]
assert all(fp8_err[d, "row-wise"] < 0.1 for d in (2, 4, 6))
assert fp8_err[6, "tensor-wise"] > 2 * fp8_err[6, "row-wise"]
print("row-wise stays accurate for every row; tensor-wise breaks down once rows span 1e6")

# %% [markdown]
# A CPU has no FP8 arithmetic: there FP8 is for checking numerics. The speed is on GPUs with FP8 matrix units,
# NVIDIA sm_89+ and AMD MI300+; 2.10 added tensor-wise and row-wise FP8 `scaled_mm` on Intel XPU (#165978,
# #167518). FP8 saves twice over against bf16: the weight is read in 1 byte per value instead of 2, and the
# FP8 matrix units do about twice bf16's operations per cycle. What it costs, the way inference runs it, is
# quantizing the activations on every call: `quant.to_fp8` takes the absolute maximum per row, divides,
# clamps and casts, several small kernels that each read the activations, before the matmul starts.
#
# The next cell, on an FP8 GPU, times one `FP8_SIZE x FP8_SIZE` weight (`8192 x 8192` values, so many that
# reading them takes real time; a GPU has that time in quick mode too) at batch rows `M`
# from decode (16) to prefill (8192): bf16 `F.linear`; FP8 with the activations quantized beforehand (the
# kernel alone); FP8 with them quantized per call, eagerly and under `torch.compile`
# (`quant.time_fp8_against_bf16`). Its float64 reference runs on the CPU (Intel Arc has no fp64). Without an
# FP8 GPU it shows the figures recorded on one, labelled as such.

# %% tags=["predict"]
FP8_SIZE, FP8_ROWS = 8192, (16, 128, 1024, 8192)
crossover_guess = predict(f"A bf16 layer with an {FP8_SIZE} x {FP8_SIZE} weight, on an FP8 GPU. With the activations "
                          "quantized to FP8 on every call, from which batch rows M on is FP8 faster than bf16?",
                          options=[str(m) for m in FP8_ROWS] + [quant.FP8_SLOWER], example="16")


# %%
def print_fp8_rows(rows: dict) -> None:
    for m, r in rows.items():
        print(f"M = {m:>5}: " + " · ".join(f"{name} {t[0] * 1e6:8.1f} us ({t[1] * 1e6:.1f}-{t[2] * 1e6:.1f})"
                                           for name, t in r.items())
              + f" · FP8 per call / bf16 time {r['fp8 per call'][0] / r['bf16'][0]:.2f}")


if requires("fp8", section="FP8 matmul on fast FP8 hardware"):
    w_gpu = torch.randn(FP8_SIZE, FP8_SIZE, device=DEVICE) / FP8_SIZE**0.5
    for granularity in ("row-wise", "tensor-wise"):     # row-wise where this GPU's kernel takes it
        wq, sw = quant.to_fp8(w_gpu, rowwise=granularity == "row-wise")
        try:   # bf16 output: what CUDA's row-wise kernel requires
            quant.fp8_matmul(*quant.to_fp8(torch.randn(16, FP8_SIZE, device=DEVICE), granularity == "row-wise"), wq, sw)
            break
        except RuntimeError as exc:
            print(f"{granularity} FP8 _scaled_mm is refused here: {str(exc).splitlines()[0][:160]}")
    rowwise_gpu = granularity == "row-wise"
    print(f"FP8 on {caps.device_name} ({caps.arch}): {wq.dtype}, {granularity} scales; median (min-max) of 5 repeats")
    fp8_rows = quant.time_fp8_against_bf16(w_gpu, FP8_ROWS, rowwise=rowwise_gpu)
    print_fp8_rows(fp8_rows)
    where, measured_on = f"measured here on {caps.device_name}", "here"
    bench.save_json({"device": caps.device_name, "arch": caps.arch, "torch": torch.__version__, "size": FP8_SIZE,
                     "granularity": granularity, "rows": fp8_rows}, "runs/05_fp8_crossover.json")
    a_bf16 = torch.randn(256, FP8_SIZE, device=DEVICE).bfloat16()
    fp8_out = quant.fp8_matmul(*quant.to_fp8(a_bf16, rowwise_gpu), wq, sw)
    exact = a_bf16.cpu().double() @ w_gpu.cpu().double().t()           # the reference on the CPU
    err = ((fp8_out.cpu().double() - exact).norm() / exact.norm()).item()
    print(f"relative error of FP8 vs float64 (computed on the CPU): {err:.4f}")
    assert err < 0.1, f"FP8 _scaled_mm is off by {err:.3f} relative to float64: scales or layout are wrong"
else:
    recorded = quant.recorded_fp8_crossover()
    fp8_rows = recorded["rows"]
    where = (f"not measured here: recorded on an {recorded['device']} ({recorded['arch']}), torch {recorded['torch']}, "
             f"{recorded['recorded']}, {recorded['granularity']} scales")
    measured_on = f"on the recorded {recorded['device']}"
    print(f"FP8 {where}; median (min-max) of 5 repeats")
    print_fp8_rows(fp8_rows)

# %% tags=["reveal"]
first, last = FP8_ROWS[0], FP8_ROWS[-1]
kernel_vs_bf16 = {m: fp8_rows[m]["fp8 kernel alone"][0] / fp8_rows[m]["bf16"][0] for m in (first, last)}
quant_share = {m: 1 - fp8_rows[m]["fp8 kernel alone"][0] / fp8_rows[m]["fp8 per call"][0] for m in (first, last)}
compiled_vs_bf16 = fp8_rows[last]["fp8 per call, compiled"][0] / fp8_rows[last]["bf16"][0]


def faster_from(candidate):
    m = quant.fp8_crossover(fp8_rows, candidate)
    return "never faster here" if m == quant.FP8_SLOWER else f"first faster from M = {m}"


reveal(crossover_guess, quant.fp8_crossover(fp8_rows),
       why=f"({where}) the FP8 kernel alone took {kernel_vs_bf16[first]:.2f} of bf16's time at M = {first} and "
           f"{kernel_vs_bf16[last]:.2f} at M = {last} ({faster_from('fp8 kernel alone')}): the weight read in half "
           f"the bytes, the matrix units twice as fast. Quantizing the activations on every call was "
           f"{quant_share[first]:.0%} of the FP8 call's time at M = {first} and {quant_share[last]:.0%} at M = {last}: "
           "several extra kernels, each launched from Python and each reading the activations. Compiled, those "
           f"passes fuse and FP8 per call took {compiled_vs_bf16:.2f} of bf16's time at M = {last} "
           f"({faster_from('fp8 per call, compiled')}); at small M what is left is the launches. FP8 pays where "
           "the matmul is large, and only with its quantization fused or its activation scales fixed.",
       where=measured_on);

# %% [markdown]
# ### The production way on a GPU: torchao configs, compiled
#
# torchao's configs, each compiled: `Int8WeightOnlyConfig`; int4 weight-only in the `tile_packed_to_4d`
# format, which calls tinygemm's `_weight_int4pack_mm` (NVIDIA sm_80+, `int4_tile_packed_to_4d_tensor.py` in
# torchao 0.16); FP8 with row-wise scales (`Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())`).
# In torchao 0.16 (`quant_api.py`) row-wise FP8 needs bf16 weights and an sm_89+ or MI300 GPU, and both
# configs silently leave a layer whose shape they cannot take unquantized: the cell checks every weight's type.
# It times section 3's MLP at decode (M = 16) and prefill (M = 4096).

# %%
if requires("torchao", "torch_cuda", section="torchao configs on a GPU"):
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig,
                                      Int8WeightOnlyConfig, PerRow, quantize_)

    gpu_bw = bench.measure_limits(quick=True, device=DEVICE)["read_bandwidth_gbs"]
    configs = {"int8 weight-only": Int8WeightOnlyConfig()}
    if caps.accelerator == "cuda" and int(caps.arch[3:]) >= 80:
        configs["int4 weight-only, group 128"] = Int4WeightOnlyConfig(group_size=128,
                                                                      int4_packing_format="tile_packed_to_4d")
    else:
        print("int4 weight-only skipped: tinygemm's int4 kernel needs an NVIDIA GPU, sm_80 or newer")
    if caps.fp8:
        configs["fp8 per row"] = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    else:
        print("fp8 skipped: needs an FP8 GPU (NVIDIA sm_89+, AMD MI300+)")
    mlp_bf16 = make_mlp().to(DEVICE).bfloat16()
    models = {"bf16": mlp_bf16}
    for name, config in configs.items():
        models[name] = copy.deepcopy(mlp_bf16)
        quantize_(models[name], config)
        kinds = {type(layer.weight).__name__ for layer in models[name] if isinstance(layer, nn.Linear)}
        assert not kinds & {"Parameter", "Tensor"}, f"{name}: a linear was left in bf16 ({kinds})"
        print(f"{name:<28} weights: {', '.join(sorted(kinds))} · {quant.model_bytes(models[name]) / 2**20:.2f} MiB "
              f"(bf16 {quant.model_bytes(mlp_bf16) / 2**20:.2f} MiB)")
    compiled = {name: torch.compile(m) for name, m in models.items()}
    for m_rows in (16, 4096):
        xb = torch.randn(m_rows, mlp_bf16[0].in_features, device=DEVICE, dtype=torch.bfloat16)
        with torch.no_grad():
            y_ref = mlp_bf16(xb).float()
            for name, model in compiled.items():
                err = ((model(xb).float() - y_ref).norm() / y_ref.norm()).item()
                assert err < 0.1, f"{name} at M = {m_rows}: relative error {err:.3f} against bf16"
            r = bench.compare({name: (lambda model=model: model(xb)) for name, model in compiled.items()},
                              baseline="bf16", repeats=5, device=DEVICE)
        print(f"M = {m_rows}, compiled:")
        for name, res in r["results"].items():
            share = quant.model_bytes(models[name]) / res["median_s"] / 1e9 / gpu_bw
            print(f"  {name:<28} {res['median_s'] * 1e6:9.1f} us ({res['min_s'] * 1e6:.1f}-{res['max_s'] * 1e6:.1f})"
                  f"  {res['ratio_to_baseline']:5.2f}x bf16's speed"
                  + (f"  weights read at {share:4.0%} of {gpu_bw:.0f} GB/s" if m_rows == 16 else "")
                  + ("  (spreads overlap: a tie here)" if name != "bf16" and not bench.separated(r, name, "bf16") else ""))

# %% [markdown]
# ### The XPU int8 kernel
#
# 2.10 added an XPU implementation of `_weight_int8pack_mm` (#160938), so the same
# `Int8WeightOnlyLinear` runs on an Intel GPU, with the fastest path chosen by measurement.

# %%
if requires("xpu", section="int8 weight-only kernel on Intel GPU"):
    lin_xpu = nn.Linear(SIZE, SIZE, bias=False).to(DEVICE)
    q_xpu, s_xpu = quant.quantize_per_channel(lin_xpu.weight.detach())
    layer_xpu = quant.Int8WeightOnlyLinear(q_xpu, s_xpu)
    x_xpu = torch.randn(1, SIZE, device=DEVICE)
    with torch.no_grad():
        report = quant.choose_fastest_path(layer_xpu, x_xpu)
        xpu_result = bench.compare({"fp32 F.linear": lambda: lin_xpu(x_xpu), "int8 weight-only": lambda: layer_xpu(x_xpu)},
                                   repeats=5, device=DEVICE)
    print(bench.table(report["timing"]))
    print("errors:", report["errors"])
    print("chosen path:", report["path"]
          + (f" (its spread overlaps {report['tied_with']}'s: which is faster is {bench.NOISY})" if report["tied_with"] else ""))
    print(bench.table(xpu_result))


# %% [markdown]
# ## 7 · Every format on one MLP, and one to ship
#
# Section 3's MLP (`1024 -> 4096 -> 1024` in full mode) in every format above. 8da4w (int8 dynamic activations,
# int4 per-group weights stored one code per byte) is what section 4's torchao QAT converts to. The int4
# weight-only variants use torch's packed CPU kernel, with min-max scales or
# [HQQ](https://mobiusml.github.io/hqq_blog/)'s, optimised on the weights alone. Calibrated methods
# ([GPTQ](https://arxiv.org/abs/2210.17323), [AWQ](https://arxiv.org/abs/2306.00978),
# [SmoothQuant](https://arxiv.org/abs/2211.10438)) are torchao prototypes (`torchao/prototype/` in 0.16):
# GPTQ rounds a layer's weights column by column and corrects the error it leaves with second-order
# information; AWQ scales up the input channels that large activations hit before rounding.

# %%
def swapped(make_layer) -> nn.Module:
    return quant.swap_linears(make_mlp(), make_layer)

class FP8Linear(nn.Module):
    """FP8 weights (row-wise scales where this torch's CPU kernel takes them); activations quantized per
    call (what FP8 inference does)."""
    def __init__(self, linear: nn.Linear):
        super().__init__()
        wq, sw = quant.to_fp8(linear.weight.detach(), rowwise=FP8_ROWWISE)
        self.register_buffer("wq", wq)   # buffers: state_dict (so quant.model_bytes, and saving) sees them
        self.register_buffer("sw", sw)
        self.register_buffer("bias", linear.bias.detach().clone())
    def forward(self, x):
        xq, sx = quant.to_fp8(x, rowwise=FP8_ROWWISE)
        # bf16 output: CUDA row-wise scaling outside sm_90 accepts no other, so this runs on any FP8 GPU
        return quant.fp8_matmul(xq, sx, self.wq, self.sw, out_dtype=torch.bfloat16).float() + self.bias

variants = {"fp32": (mlp_fp32, torch.float32), "bf16": (make_mlp().bfloat16(), torch.bfloat16),
            "int8 weight-only (helpers)": (swapped(quant.Int8WeightOnlyLinear.from_linear), torch.float32),
            "int4 weight-only, packed (helpers)": (swapped(quant.Int4WeightOnlyLinear.from_linear), torch.float32),
            "dynamic int8 (torch.ao)": (mlp_ao, torch.float32),
            FP8_NAME: (swapped(FP8Linear), torch.float32)}
if HAVE_TORCHAO:
    variants["dynamic int8, per-token activations (torchao)"] = (mlp_torchao_dyn, torch.float32)
    mlp_int4 = make_mlp()
    quantize_(mlp_int4, base_config)
    variants["int8 act. + int4 weight (torchao 8da4w, QAT's target)"] = (mlp_int4, torch.float32)
    for algorithm in ("tinygemm", "hqq"):        # min-max (tinygemm's) scales and zeros, or HQQ's
        try:
            int4_config = quant.torchao_int4_cpu_config(group_size=32, algorithm=algorithm)
        except ImportError as exc:
            print("torchao int4 weight-only skipped:", exc)
            break
        mlp_int4wo = make_mlp().bfloat16()
        quantize_(mlp_int4wo, int4_config)
        label = "min-max" if algorithm == "tinygemm" else "HQQ"
        variants[f"int4 weight-only, {label} (torchao, packed)"] = (mlp_int4wo, torch.bfloat16)
else:
    print("torchao variants skipped (dynamic int8, 8da4w, int4 min-max and HQQ): torchao is not installed (section 3)")
n_weights = sum(l.weight.numel() for l in mlp_fp32 if isinstance(l, nn.Linear))
probe = torch.randn(500, mlp_fp32[0].in_features, generator=torch.Generator().manual_seed(5))
with torch.no_grad():
    y_probe = mlp_fp32(probe)

def output_error(model, dtype) -> float:
    """Relative L2 error of the model's outputs against fp32 on the 500 probe inputs."""
    with torch.no_grad():
        return ((model(probe.to(dtype)).float() - y_probe).norm() / y_probe.norm()).item()

print("variants built:", *variants, sep="\n  ")

# %% [markdown]
# ### Your turn: pick the format to ship
#
# This MLP must ship in **at most 1.1 bytes per weight** (everything the two linears hold: codes, scales,
# zero points, biases) with outputs within a relative error of **0.01** of fp32 on the probe inputs. Before the
# table below measures them all, set `PICK` to the variant you would ship: weigh what each one stores per
# weight, and which operands it rounds (weights only, or activations too) and to how many levels.

# %% tags=["your-turn"]
PICK = "dynamic int8 (torch.ao)"

# %%
from helpers.checks import fail, your_turn


def check_pick():
    if PICK not in variants:
        fail("PICK", f"{PICK!r} is not one of the variants built here", "copy a name from the list printed above")
    model, dtype = variants[PICK]
    size, err = quant.model_bytes(model) / n_weights, output_error(model, dtype)
    print(f"{PICK}: {size:.3f} bytes per weight, relative output error {err:.2%}")
    if size > 1.1:
        fail("size budget", f"{size:.3f} bytes per weight, over 1.1",
             "count what the format stores per weight: a 16-bit value is 2 bytes, and an int4 code kept one per "
             "byte is still a byte")
    if err > 0.01:
        fail("error budget", f"{err:.2%} relative error, over 1%",
             "every operand rounded adds its error: a format that also quantizes the activations, or keeps "
             "fewer levels per value (FP8 e4m3 has 3 mantissa bits, int4 16 codes), moves the outputs more")


your_turn(check_pick, what="a format within the size and error budgets");

# %%
with torch.no_grad():
    top_ref = y_probe.argmax(-1)
    summary = {name: {"MiB": quant.model_bytes(m) / 2**20, "bytes/weight": quant.model_bytes(m) / n_weights,
                      "error": output_error(m, dt),
                      "agreement": (m(probe.to(dt)).argmax(-1) == top_ref).float().mean().item()}
               for name, (m, dt) in variants.items()}
    one = torch.randn(1, mlp_fp32[0].in_features)
    latency = bench.compare({name: (lambda m=m, dt=dt: m(one.to(dt))) for name, (m, dt) in variants.items()},
                            baseline="fp32", repeats=3, min_run_time=0.01 if QUICK else 0.1, device="cpu")
print(f"{'variant':<54}{'B/weight':>9}{'rel. error':>11}{'top-1 agrees':>13}{'batch-1 ms':>11}{'vs fp32':>8}")
for name, s in summary.items():
    r = latency["results"][name]
    s["ms"], s["speedup"] = r["median_s"] * 1e3, r["ratio_to_baseline"]
    print(f"{name:<54}{s['bytes/weight']:>9.3f}{s['error']:>10.2%}{s['agreement']:>12.1%}{s['ms']:>11.3f}"
          f"{s['speedup']:>7.2f}x")
print("B/weight: bytes held (codes, scales, zero points and biases) per weight of the two linears; ms: median")
within = [name for name, s in summary.items() if s["bytes/weight"] <= 1.1 and s["error"] <= 0.01]
print(f"within both budgets of the your-turn: {', '.join(within) or 'none'}")
faster = [name for name, s in summary.items() if name != "fp32" and s["ms"] < summary["fp32"]["ms"]]
print(f"faster than fp32 at batch 1, spreads apart: {', '.join(n for n in faster if bench.separated(latency, n, 'fp32')) or 'none'}"
      f"; too close to call here (run again): {', '.join(n for n in faster if not bench.separated(latency, n, 'fp32')) or 'none'}")

# %% tags=["nbval-check-output"]
assert summary["fp32"]["agreement"] == 1.0
assert all(s["agreement"] > 0.8 for s in summary.values()), {k: s["agreement"] for k, s in summary.items()}
assert summary["bf16"]["MiB"] == summary["fp32"]["MiB"] / 2
for name in ("int8 weight-only (helpers)", "dynamic int8 (torch.ao)", FP8_NAME):   # 8-bit codes plus their scales
    assert summary[name]["MiB"] < summary["fp32"]["MiB"] / 3.5, (name, summary[name]["MiB"])
int4_rows = [name for name in summary if name.startswith("int4 weight-only")]
for name in int4_rows:                      # packed int4: fewer bytes than any 8-bit row
    assert summary[name]["MiB"] < summary["int8 weight-only (helpers)"]["MiB"], (name, summary[name]["MiB"])
    if HAVE_TORCHAO:
        assert summary[name]["MiB"] < summary["int8 act. + int4 weight (torchao 8da4w, QAT's target)"]["MiB"]
print("every variant agrees with fp32 on more than 80% of inputs; sizes measured from the tensors:")
print("bf16 holds half of fp32's bytes, each 8-bit variant under 1/3.5 of them (codes plus scales), packed int4 fewer")

# %% [markdown]
# **What the numbers mean.** Bytes follow the bit width plus what a format stores beside its codes (8da4w's
# int4 codes take a byte each). Error follows what is rounded, and how finely: int8 weight-only rounds only
# the weights, to 255 levels per row; dynamic int8 rounds the activations too, with one scale per input tensor
# in `torch.ao` (`qlinear_dynamic.cpp`, fbgemm and oneDNN paths) and one per token in torchao (the
# `Int8DynamicActivationInt8WeightConfig` docstring); FP8 keeps 3 mantissa bits of both operands; int4 16
# codes per group. Latency follows bytes only where a kernel turns them into time (the last line above).

# %% [markdown]
# ## What changes on other hardware
#
# - **NVIDIA / AMD GPUs**: at terabytes per second (4.8 TB/s on an H200,
#   https://www.nvidia.com/en-us/data-center/h200/) decode is still memory-bound: weight-only int8 or int4
#   still pays (section 6). **Intel GPUs**: section 6's XPU cell; IPEX is no longer needed.
# - **Arm CPUs**: the aarch64 build of `int8mm_kernel.cpp` vectorizes fp32, fp16 and bf16 activations alike,
#   so section 1's fp32-activation trap may not exist there: measure with `choose_fastest_path`.
# - **Apple (MPS)**: `_weight_int8pack_mm` has an MPS kernel (N and K multiples of 32).
#
# ## Pitfalls (each one run here, with its real error)
#
# **Scales in the wrong dtype.** The CPU kernel reads the scales as the activations' type, and its message
# does not say which argument is wrong (CUDA's `int8mm.cu` converts both to float first). The last error
# comes from a weight laid out [K, N] instead of `nn.Linear`'s [N, K].

# %% tags=["nbval-check-output"]
q_p = torch.randint(-127, 128, (16, 64), dtype=torch.int8)
x_p = torch.randn(2, 64, dtype=torch.bfloat16)
try:
    torch._weight_int8pack_mm(x_p, q_p, torch.ones(16))
except RuntimeError as exc:
    print("torch:  ", exc)
try:
    quant.int8_weight_only_mm(x_p, q_p, torch.ones(16))
except TypeError as exc:
    print("helpers:", exc)
try:                                           # a weight laid out [K, N] instead of nn.Linear's [N, K]
    torch._weight_int8pack_mm(torch.randn(2, 64), q_p.t().contiguous(), torch.ones(16))
except RuntimeError as exc:
    print(type(exc).__name__ + ":", str(exc).splitlines()[0])

# %% [markdown]
# **K that the bf16 kernel's ISA cannot step through.** The CPU kernel (`aten/src/ATen/native/cpu/int8mm_kernel.cpp`)
# is compiled per ISA; its AVX512 build steps k by 16. With bf16 activations a K that is not a multiple of 16
# (K = 24 on AVX512, K = 36 on AVX512 and AVX2, torch 2.10 and 2.13) does not raise: it crashes the process or
# returns wrong numbers. The cell runs K = 36 in a child process (full mode); the helper refuses such shapes
# up front (`quant.bf16_k_multiple()` reads the ISA).

# %%
import subprocess
import sys

print(f"CPU ISA: {cpu_capability()} · the helper's K multiple for bf16 activations: {quant.bf16_k_multiple()}")
if QUICK:
    print("quick mode: the child process (a second torch import, seconds) runs with QUICK = False")
else:
    crash = subprocess.run([sys.executable, "-c",
                            "import torch; torch._weight_int8pack_mm(torch.randn(2, 36, dtype=torch.bfloat16), "
                            "torch.ones(16, 36, dtype=torch.int8), torch.ones(16, dtype=torch.bfloat16)); print('ran')"],
                           capture_output=True, text=True, timeout=120)
    print("K = 36: child process return code", crash.returncode, "(-11 is SIGSEGV)" if crash.returncode == -11 else "",
          crash.stdout.strip())
for k in (24, 36):
    try:
        quant.Int8WeightOnlyLinear.from_linear(nn.Linear(k, 16), path="int8pack_bf16")
        print(f"K = {k}: the helper accepts it on this ISA")
    except ValueError as exc:
        print("helpers:", exc)

# %% [markdown]
# **The deprecation that says 2.10** (section 3): migrate anyway, `quantize_dynamic` -> torchao `quantize_`,
# FX -> `torchao.quantization.pt2e`, and do not mix the two flows in one model. **Old torchao names**:
# `int8_weight_only()` became `Int8WeightOnlyConfig()`; a torchao built for another torch prints "Skipping
# import of cpp extensions..." or worse: match the versions (2.10 with 0.16.0).
#
# ## What the articles got wrong
#
# The 2.10 article's quantization paragraph lists "per-channel calibration improvements for convolutional
# networks and vision transformers", "enhanced gradient propagation through fake quantization nodes" and
# "hardware-specific quantization schemas": none appears in what 2.10 shipped. What it did ship is narrower:
# the XPU kernel for `_weight_int8pack_mm` (an older op, with CPU, CUDA and MPS kernels too: section 1) and
# FP8 `scaled_mm` on XPU. The workflows (PTQ, QAT, PT2E) live in torchao; `torch.ao.quantization` is
# deprecated, not improved.
