# %% [markdown]
# # 05 · Deep dive: Quantization: kernel paths, calibration, QAT, PT2E lowering, FP8 and torchao on a GPU
#
# | | |
# |---|---|
# | **What you will learn** | the int8 kernel's devices, paths and threads; calibrators and zero points; dynamic int8 with `torch.ao` (deprecated) and torchao, eager and compiled; QAT by hand and with torchao's `QATConfig`, against an fp32 control; static int8 with PT2E, lowered and timed through Inductor; FP8 `scaled_mm` row-wise vs tensor-wise, on an FP8 GPU at decode and prefill sizes; torchao's int8, int4 and FP8 configs compiled on a GPU; every format's size and latency on one MLP (torchao int4, HQQ, 8da4w); the ISA pitfalls of the CPU kernels |
# | **Prerequisites** | [lesson 05](05_quantization.ipynb) |
# | **Hardware** | any CPU (every numeric section, FP8 included). torchao, a C++ compiler (full mode's compiled rows and PT2E lowering), an FP8 GPU (NVIDIA sm_89+, AMD MI300+) and an Intel GPU each run their sections; without them the section says what it skipped and why |
# | **Time** | 68 minutes |
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

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SIZE, QAT_STEPS = 1024, 300
REPEATS, MIN_RUN_S = (3, 0.02) if QUICK else (5, 0.1)
caps = capabilities()
THREADS = torch.get_num_threads()
torch.manual_seed(0)
weights = [torch.randn(SIZE, SIZE) / SIZE**0.5 for _ in range(2)]   # two layers, cycled: read from memory
int8_layers = [quant.Int8WeightOnlyLinear(*quant.quantize_per_channel(w)) for w in weights]
x1 = torch.randn(1, SIZE)
print(f"torch {torch.__version__} · device {DEVICE} · {caps.device_name} · CPU ISA {cpu_capability()} · "
      f"threads {THREADS} · quick: {QUICK} · weight {SIZE}x{SIZE}")

# %% [markdown]
# ## 1 · The int8 kernel: which devices, which path, how many threads
#
# `torch._weight_int8pack_mm` is declared per device in torch's operator list; 2.10 added the XPU kernel
# (#160938). The cell reads that list and asks the dispatcher which kernels this build has. Then, since the
# fastest path depends on the device, its ISA and the build, `quant.choose_fastest_path` runs every path
# (bf16 activations, fp32 activations, dequantize then `F.linear`), drops any whose output is off the fp32
# reference, times the rest and keeps the winner.

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
    choice = quant.choose_fastest_path(quant.Int8WeightOnlyLinear(int8_layers[0].q, int8_layers[0].scales), x1)
print("chosen path:", choice["path"])
for path in quant.INT8_PATHS:
    err = choice["errors"][path]
    shown = f"{err:.1e}" if isinstance(err, float) else err
    print(f"  {path:<15} relative error {shown:<10} time {choice['times_s'].get(path, float('nan')) * 1e3:.3f} ms")

# %% [markdown]
# **Thread count** is the other knob: a GEMV splits the rows of the weight across threads, and at M = 1
# each thread's share is a stream from memory. The two weights are cycled so each call reads from memory.

# %%
turn = {"i": 0}

def cycled(call):
    def run():
        turn["i"] = (turn["i"] + 1) % len(weights)
        return call(turn["i"])
    return run

with torch.no_grad():
    for t in sorted({1, THREADS}):
        r = bench.compare({"fp32": cycled(lambda i: F.linear(x1, weights[i])),
                           "int8 bf16": cycled(lambda i: int8_layers[i](x1))},
                          threads=t, repeats=REPEATS, min_run_time=MIN_RUN_S, device="cpu")
        i8 = r["results"]["int8 bf16"]
        print(f"{t} thread(s): int8 {i8['median_s'] * 1e3:.3f} ms = {i8['ratio_to_baseline']:.2f}x fp32's speed, "
              f"{SIZE * SIZE / i8['median_s'] / 1e9:.1f} GB/s of int8 weights")


# %% [markdown]
# ## 2 · Calibration: choosing the scale, and what a zero point buys
#
# The scale trades **rounding error** (a big scale makes coarse steps) against **clipping error** (a small
# scale clips the largest values). One outlier makes min-max pick a huge scale for everyone. Three
# calibrators in `helpers.quant`: **min-max** (never clips), **percentile** (clips above `percentile=99.9`
# of |x|, the default of `percentile_scale`), **MSE** (searches the scale with the least squared error);
# each per tensor or per channel.
#

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
# ### Symmetric or asymmetric: what a zero point buys
#
# So far every code was symmetric: signed, centred on 0, `scale = max|x| / 127`. Weights are roughly
# symmetric, so that fits them. Activations often are not: a ReLU's output is never negative, so a
# symmetric int8 grid leaves its whole negative half unused. Asymmetric (affine) quantization maps
# `[min, max]` onto the unsigned codes 0..255: `scale = (max - min) / 255`, `zero_point = round(-min / scale)`,
# `q = clamp(round(x / scale) + zero_point, 0, 255)`. The range always contains 0 (so ReLU's zeros and
# padding stay exact), and the zero point is the code that stands for 0. `quant.asymmetric_qparams` computes
# it as torch's `MinMaxObserver` does for `quint8`; below it is measured on a ReLU output and on a GELU
# output (which dips slightly below zero, so its zero point is not 0).

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
# An all-positive tensor gets `zero_point = 0` and simply uses all 256 codes for `[0, max]`: one more bit
# of resolution, about 6 dB. The cost is an extra term in the matmul (`x = scale * (q - zero_point)`, so
# the zero point multiplies the row sums of the other operand), which is why integer kernels use
# asymmetric activations and symmetric weights. torchao's int4 formats below store a zero point per group.
#

# %% [markdown]
# ## 3 · Dynamic quantization: the `torch.ao` way (deprecated) and the torchao way
#
# Dynamic quantization stores int8 weights and quantizes activations on the fly, per batch.
# `torch.ao.quantization.quantize_dynamic` still works, but has been deprecated since 2.8; its warning
# says "will be removed in 2.10", and it was not (it ships in 2.10 and in the 2.13 running here).
# New code uses torchao: `quantize_(model, config)`. Here is the warning, as printed:

# %%
def make_mlp(seed: int = 0, width: int = 256 if QUICK else 1024) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)).eval()

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mlp_ao = torch.ao.quantization.quantize_dynamic(make_mlp(), {nn.Linear}, dtype=torch.qint8)
for warning in caught:
    print(f"{warning.category.__name__}: {str(warning.message).splitlines()[0]}")
print("quantized engine:", torch.backends.quantized.engine)
print(mlp_ao)

# %% [markdown]
# torchao is a separate package whose C++ kernels are built per torch release: torchao **0.16.0** pairs
# with torch **2.10**, and newer torchao needs newer torch. Importing it prints what it prints; lines like
# "Failed to load ..." name optional GPU kernels that a CPU build cannot load, and are harmless here.

# %%
HAVE_TORCHAO = requires("torchao", section="torchao: quantize_ configs, QAT and int4")
mlp_fp32 = make_mlp()
torchao_mlps = {}      # name -> (quantized model, activation dtype)
if HAVE_TORCHAO:
    import torchao
    from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8DynamicActivationIntxWeightConfig,
                                      Int8WeightOnlyConfig, PerGroup, quantize_)
    from torchao.quantization.qat import QATConfig

    print("torchao", torchao.__version__)
    mlp_torchao_dyn = make_mlp()
    quantize_(mlp_torchao_dyn, Int8DynamicActivationInt8WeightConfig())
    mlp_torchao_wo = make_mlp().bfloat16()
    quantize_(mlp_torchao_wo, Int8WeightOnlyConfig())
    print("weight after quantize_:", type(mlp_torchao_wo[0].weight).__name__)
    torchao_mlps = {"torchao dynamic int8": (mlp_torchao_dyn, torch.float32),
                    "torchao int8 wo (bf16 model)": (mlp_torchao_wo, torch.bfloat16)}

# %%
x_mlp = torch.randn(1, mlp_fp32[0].in_features)
with torch.no_grad():
    y_ref = mlp_fp32(x_mlp)
    rel = lambda y: ((y.float() - y_ref).norm() / y_ref.norm()).item()
    errors = {"torch.ao dynamic int8": rel(mlp_ao(x_mlp))}
    errors.update({name: rel(m(x_mlp.to(dt))) for name, (m, dt) in torchao_mlps.items()})
for name, e in errors.items():
    print(f"{name:<40} relative error vs fp32: {e:.4f}")
assert all(e < 0.05 for e in errors.values()), errors
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
elif QUICK:
    print("quick mode: the torch.compile variants run with QUICK = False")
else:
    print("no C++ compiler: the torch.compile rows are skipped (Inductor's CPU backend generates C++)")
with torch.no_grad():
    dyn_result = bench.compare(dyn, baseline="fp32", repeats=3, min_run_time=0.01 if QUICK else 0.1, device="cpu")
print(bench.table(dyn_result))
ratios = {name: r["ratio_to_baseline"] for name, r in dyn_result["results"].items() if name != "fp32"}
eager_slower = [name for name in ratios if "torchao" in name and "eager" in name and ratios[name] < 1]
print(f"torchao rows slower than fp32 in eager mode here: {', '.join(eager_slower) or 'none'}; "
      f"fastest row of this run: {max(ratios, key=ratios.get)}")

# %% [markdown]
# **What the numbers mean** (the last lines above are this run's verdict). torchao's quantized weights are
# tensor subclasses: in eager mode every matmul goes through Python dispatch and a generic path, which can
# make them slower than fp32. Their speed comes with `torch.compile`, which fuses the dequantization into
# the matmul; the compiled rows run in full mode, with a C++ compiler (timings vary run to run on a shared
# machine). The old `torch.ao` dynamic module calls a dedicated x86 kernel and needs no compile, which is
# one reason people keep using it, but it is the deprecated path. Static quantization moved too, to
# `torchao.quantization.pt2e` (`prepare_pt2e`, `convert_pt2e`): section 5 runs it.

# %% [markdown]
# ## 4 · Quantization-aware training: when rounding after training is not enough
#
# Post-training quantization (PTQ) rounds a trained model's weights. At 8 bits and at 4 bits per group
# that usually costs little; at fewer bits it can cost a lot. QAT trains *with* the rounding in the
# forward pass so the model learns weights that survive it. Rounding has zero gradient almost
# everywhere, so the backward pass pretends it was the identity: the **straight-through estimator**
# (STE), gradient 1 inside the grid's range, 0 where the value was clipped.

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
# A task where bits matter: a small classifier on synthetic data (a fixed random "teacher" network labels
# Gaussian inputs into 4 classes), trained in seconds. Every seed is fixed.

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

# %% [markdown]
# The hand-written QAT model above keeps its float weights and rounds them in every forward pass; to
# deploy it, round once (`quantize_model_per_group` on it gives the same outputs, a test checks this).
# torchao packages the same idea: `QATConfig(base_config, step="prepare")` swaps in fake-quantized
# linears (int4 per-group weights, and here int8 per-token activations), you train, and
# `step="convert"` replaces them with the real quantized format of `base_config`.

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
# **What the numbers mean.** On this task 4 bits per group of 16 is nearly free: PTQ is enough and QAT
# has little to win. At 2 bits (three levels per weight), PTQ loses several points and QAT wins part of
# them back, more with the full training budget (QUICK = False). The control row answers the obvious
# doubt: the fp32 model fine-tuned for the same steps and then rounded does not recover them, so the gain
# comes from training with the rounding in the loop, not from more training. Reach for QAT when PTQ at the
# bit width you need misses the accuracy budget, not before.

# %% [markdown]
# ## 5 · Static int8 with activation calibration: PT2E
#
# Dynamic quantization measures each activation's range at run time. **Static** quantization fixes the
# activation scales and zero points ahead of time, from a **calibration set** of representative inputs run
# through the model with observers attached. torchao's PT2E flow (`torchao.quantization.pt2e`, the same
# modules in 0.16 and 0.18): `torch.export.export(model, (example,), strict=True)`; `prepare_pt2e` with
# `X86InductorQuantizer` (its default config, `x86_inductor_quantizer.py`: activations `uint8` per tensor
# with a zero point from a `HistogramObserver`, weights `int8` per channel, symmetric) inserts observers; the
# calibration batches run; `convert_pt2e` replaces each observer with a quantize/dequantize (Q/DQ) pair and
# folds the weights to int8. The result is a *reference* graph; speed comes when Inductor lowers it (the
# last cell of this section). The model: a small `64 -> 128 -> 10` MLP with a ReLU.
#
# **Pitfall: `strict=True`.** `torch.export` defaults to non-strict tracing. The quantizer finds linears
# with `get_source_partitions` (`torch/fx/passes/utils/source_matcher_utils.py`), which reads each node's
# `source_fn_stack`, and a non-strict export does not record it. torch 2.10's function has no fallback, so
# with torchao 0.16 the non-strict graph matches no linear and `convert_pt2e` returns it unquantized, with
# no error and no warning; the 2.13 source falls back to `nn_module_stack` ("e.g. strict=False export").
# The cell exports both ways and counts the Q/DQ ops: export with `strict=True`, and count them before
# trusting a converted model.

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
    if strict_trap[False] == 0:
        print(f"torch {torch.__version__} + torchao {torchao.__version__}: the non-strict export was not "
              "quantized at all, silently; strict=True was")
    else:
        print(f"torch {torch.__version__} + torchao {torchao.__version__}: both exports were quantized here")
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
# **What the numbers mean** (printed above). Calibration fixes the activation ranges for good, so the
# calibration inputs must look like the deployed ones: on these Gaussian inputs one batch already gives
# nearly the range many batches give, while inputs of the wrong scale (a preprocessing step missing from
# the calibration pipeline) make every activation scale too small, deployed activations clip, and
# agreement falls. The bytes are what the converted graph reads: int8 weights, their scales, fp32 biases.

# %% [markdown]
# ### Lowering it: the int8 kernels come from Inductor
#
# The converted graph runs its Q/DQ pairs as separate fp32 ops, so in eager mode it is slower than the
# fp32 model. `torch.compile` lowers it, with `torch._inductor.config.freezing = True`: the patterns that
# replace each Q/DQ → linear with a oneDNN int8 linear (`onednn.qlinear_pointwise`) are freezing patterns
# (`register_freezing_graph_pattern` in `torch/_inductor/fx_passes/quantization.py`), which fold the int8
# weights into constants. The cell quantizes section 3's larger MLP at batch 64, where the multiply is
# compute-bound and int8 arithmetic pays, checks that the generated code calls the int8 kernel, and times
# it against fp32, eager and compiled. Compiling takes tens of seconds and Inductor's CPU backend generates
# C++: full mode with a C++ compiler only.

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
# FP8 (`float8_e4m3fn`: 4 exponent bits, 3 mantissa bits, max 448) is a float format, so it needs a
# scale only to use its range well. `torch._scaled_mm(a, b, scale_a, scale_b)` (and the newer
# `F.scaled_mm` with explicit scaling recipes) multiplies FP8 operands with fp32 scales: one per tensor
# (tensor-wise) or one per row of `a` and per column of `b` (row-wise, scales shaped [M, 1] and [1, N]).
# `b` must be column-major, hence the `w.t()`. The numerics run on CPU, with one version gap: torch 2.10's
# CPU kernel takes tensor-wise scales only (`RuntimeError: ... Now _scaled_mm only supports per-tensor
# scaling for CPU backend`); the torch 2.13 that `environments/cpu.txt` pins takes both. Where the row-wise
# kernel is missing, the row-wise rows below come from `quant.fp8_matmul_reference`: the same arithmetic
# written out (FP8 values times their scales, multiplied in fp32), and the next cell says which ran.

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

# %% tags=["nbval-check-output"]
assert all(fp8_err[d, "row-wise"] < 0.1 for d in (2, 4, 6))
assert fp8_err[6, "tensor-wise"] > 2 * fp8_err[6, "row-wise"]
print("row-wise stays accurate for every row; tensor-wise breaks down once rows span 1e6")

# %% [markdown]
# FP8 is a float format, so one tensor-wise scale copes with rows spanning `1e2` or even `1e4` (the cell above):
# each value keeps its own exponent. Only when magnitudes span more than the format's exponent range
# (e4m3: about 2^-9 to 448, counting subnormals) do the small rows underflow, and row-wise scales fix it.

# %%
x_fp8 = torch.randn(16, SIZE)
xq_fp8, sx_fp8 = quant.to_fp8(x_fp8, rowwise=FP8_ROWWISE)
wq_fp8, sw_fp8 = quant.to_fp8(weights[0], rowwise=FP8_ROWWISE)
with torch.no_grad():
    fp8_result = bench.compare({"fp32 F.linear": lambda: F.linear(x_fp8, weights[0]),
                                f"{FP8_NAME} _scaled_mm": lambda: quant.fp8_matmul(xq_fp8, sx_fp8, wq_fp8, sw_fp8)},
                               repeats=3, min_run_time=0.02 if QUICK else 0.1, device="cpu")
print(bench.table(fp8_result))

# %% [markdown]
# On a CPU `_scaled_mm` works, and the table above shows what it costs against fp32 `F.linear` on this
# machine: a CPU has no FP8 arithmetic, so FP8 on a CPU is for checking numerics. The speed is on GPUs
# with FP8 matrix units: NVIDIA sm_89+ (L4, H100, H200, B200) and AMD MI300+; 2.10 added tensor-wise and
# row-wise FP8 `scaled_mm` on Intel XPU (#165978, #167518).
#
# On an FP8 GPU the next cell times one `SIZE x SIZE` weight at three batch sizes: decode (M = 16) and a
# small batch, where the weight read dominates, and prefill (M = 4096), where the arithmetic does. Each
# FP8 row includes quantizing the activations on every call (what FP8 inference pays), and the decode rows
# report the share of the GPU's measured read bandwidth. The float64 reference is computed on the CPU,
# because not every GPU the FP8 probe admits has fp64 arithmetic (Intel Arc has none).

# %%
if requires("fp8", section="FP8 matmul on fast FP8 hardware"):
    gpu_bw = bench.measure_limits(quick=True, device=DEVICE)["read_bandwidth_gbs"]
    w_gpu = torch.randn(SIZE, SIZE, device=DEVICE) / SIZE**0.5
    w_bf16 = w_gpu.bfloat16()
    for granularity in ("row-wise", "tensor-wise"):     # row-wise where this GPU's kernel takes it
        wq, sw = quant.to_fp8(w_gpu, rowwise=granularity == "row-wise")
        try:   # bf16 output: what CUDA's row-wise kernel requires
            quant.fp8_matmul(*quant.to_fp8(torch.randn(16, SIZE, device=DEVICE), granularity == "row-wise"), wq, sw)
            break
        except RuntimeError as exc:
            print(f"{granularity} FP8 _scaled_mm is refused here: {str(exc).splitlines()[0][:160]}")
    rowwise_gpu = granularity == "row-wise"
    print(f"FP8 format on {caps.device_name} ({caps.arch}): {wq.dtype}, {granularity} scales; "
          f"measured read bandwidth {gpu_bw:.0f} GB/s")
    for m in (16, 64, 4096):
        a = torch.randn(m, SIZE, device=DEVICE)
        a_bf16 = a.bfloat16()
        r = bench.compare({"bf16 F.linear": lambda: F.linear(a_bf16, w_bf16),
                           f"fp8 {granularity}, activations quantized per call":
                               lambda: quant.fp8_matmul(*quant.to_fp8(a, rowwise_gpu), wq, sw)},
                          repeats=5, device=DEVICE)
        times = {name: res["median_s"] for name, res in r["results"].items()}
        shares = {name: SIZE * SIZE * (2 if name.startswith("bf16") else 1) / t / 1e9 / gpu_bw for name, t in times.items()}
        print(f"M = {m:>4}: " + " · ".join(f"{name} {t * 1e6:8.1f} us ({shares[name]:4.0%} of the read bandwidth "
                                           "for the weight alone)" for name, t in times.items()))
    fp8_out = quant.fp8_matmul(*quant.to_fp8(a, rowwise_gpu), wq, sw)
    rows = slice(0, 256)                                 # the reference on the CPU, for 256 rows
    exact = a[rows].cpu().double() @ w_gpu.cpu().double().t()
    err = ((fp8_out[rows].cpu().double() - exact).norm() / exact.norm()).item()
    print(f"relative error of FP8 vs float64 (computed on the CPU): {err:.4f}")
    assert err < 0.1, f"FP8 _scaled_mm is off by {err:.3f} relative to float64: scales or layout are wrong"

# %% [markdown]
# ### The production way on a GPU: torchao configs, compiled
#
# On a GPU the lesson's thesis is tested with torchao's configs, each followed by `torch.compile`: int8
# weight-only (`Int8WeightOnlyConfig`), int4 weight-only with the `tile_packed_to_4d` format, which calls
# tinygemm's `_weight_int4pack_mm` (NVIDIA sm_80+: `int4_tile_packed_to_4d_tensor.py` in torchao 0.16; the
# default `plain` format needs other kernels), and FP8 with a scale per row for weights and activations
# (`Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())`, `_scaled_mm` underneath). In torchao
# 0.16 (`torchao/quantization/quant_api.py`) row-wise FP8 needs bf16 weights and an sm_89+ or MI300 GPU,
# and both configs silently leave a layer whose shape they cannot take unquantized, so the cell checks
# every weight's type after `quantize_`. It times the MLP of section 3 at a decode batch (M = 16,
# memory-bound) and at prefill (M = 4096), with the share of the measured read bandwidth at decode.

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
            print(f"  {name:<28} {res['median_s'] * 1e6:9.1f} us  {res['ratio_to_baseline']:5.2f}x bf16's speed"
                  + (f"  weights read at {share:4.0%} of {gpu_bw:.0f} GB/s" if m_rows == 16 else ""))

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
    print("chosen path:", report["path"], "· errors:", report["errors"])
    print(bench.table(xpu_result))


# %% [markdown]
# ## 7 · Every format on one MLP: torchao int4 and HQQ, 8da4w, FP8
#
# One table for section 3's MLP (`1024 -> 4096 -> 1024` in full mode): bytes held, summed from the tensors
# (`quant.model_bytes`: codes, scales, zero points, biases), batch-1 latency side by side, and how often each
# variant's top class agrees with fp32 on random inputs (a task-free proxy; the core lesson measured accuracy
# on digits). The 8da4w row (int8 dynamic activations, int4 per-group weights stored one code per byte in
# torchao's reference layout) is what section 4's torchao QAT model converts to. The int4 weight-only rows use
# torch's packed CPU kernel: the lesson's `Int4WeightOnlyLinear`, and torchao's format with min-max scales or
# with [HQQ](https://mobiusml.github.io/hqq_blog/), which chooses scales and zero points by an optimisation
# on the weights alone, no calibration data. The calibrated methods need activations from real inputs:
# [GPTQ](https://arxiv.org/abs/2210.17323), [AWQ](https://arxiv.org/abs/2306.00978) and
# [SmoothQuant](https://arxiv.org/abs/2211.10438) (moves activation outliers into the weights so both
# quantize to int8); torchao ships them as prototypes (`torchao/prototype/{gptq,awq,smoothquant}` in 0.16).

# %%
def swapped(make_layer) -> nn.Module:
    return quant.swap_linears(make_mlp(), make_layer)

class FP8Linear(nn.Module):
    """FP8 weights (row-wise scales where this torch's CPU kernel takes them); activations quantized per
    call (what FP8 inference does)."""
    def __init__(self, linear: nn.Linear):
        super().__init__()
        wq, sw = quant.to_fp8(linear.weight.detach(), rowwise=FP8_ROWWISE)
        # buffers, not plain attributes: state_dict (and so quant.model_bytes, and saving) sees them
        self.register_buffer("wq", wq)
        self.register_buffer("sw", sw)
        self.register_buffer("bias", linear.bias.detach().clone())
    def forward(self, x):
        xq, sx = quant.to_fp8(x, rowwise=FP8_ROWWISE)
        # bf16 output: CUDA row-wise scaling outside sm_90 accepts no other ("Only bf16 high precision output
        # types are supported for row-wise scaling."), so this class runs on any FP8 GPU as it is
        return quant.fp8_matmul(xq, sx, self.wq, self.sw, out_dtype=torch.bfloat16).float() + self.bias

variants = {"fp32": (mlp_fp32, torch.float32), "bf16": (make_mlp().bfloat16(), torch.bfloat16),
            "int8 weight-only (helpers)": (swapped(quant.Int8WeightOnlyLinear.from_linear), torch.float32),
            "int4 weight-only, packed (helpers)": (swapped(quant.Int4WeightOnlyLinear.from_linear), torch.float32),
            "dynamic int8 (torch.ao)": (mlp_ao, torch.float32),
            FP8_NAME: (swapped(FP8Linear), torch.float32)}
if HAVE_TORCHAO:
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
    print("torchao rows skipped (8da4w, int4 weight-only min-max and HQQ): torchao is not installed (section 3)")
n_weights = sum(l.weight.numel() for l in mlp_fp32 if isinstance(l, nn.Linear))
probe = torch.randn(200 if QUICK else 500, mlp_fp32[0].in_features)
with torch.no_grad():
    top_ref = mlp_fp32(probe).argmax(-1)
    summary = {name: {"MiB": quant.model_bytes(m) / 2**20, "bytes/weight": quant.model_bytes(m) / n_weights,
                      "agreement": (m(probe.to(dt)).argmax(-1) == top_ref).float().mean().item()}
               for name, (m, dt) in variants.items()}
    one = torch.randn(1, mlp_fp32[0].in_features)
    latency = bench.compare({name: (lambda m=m, dt=dt: m(one.to(dt))) for name, (m, dt) in variants.items()},
                            baseline="fp32", repeats=3, min_run_time=0.01 if QUICK else 0.1, device="cpu")
print(f"{'variant':<54}{'MiB held':>9}{'B/weight':>9}{'batch-1 ms':>12}{'vs fp32':>9}{'top-1 agreement':>17}")
for name, s in summary.items():
    r = latency["results"][name]
    s["ms"], s["speedup"] = r["median_s"] * 1e3, r["ratio_to_baseline"]
    print(f"{name:<54}{s['MiB']:>9.3f}{s['bytes/weight']:>9.3f}{s['ms']:>12.3f}{s['speedup']:>8.2f}x{s['agreement'] * 100:>16.1f}%")
print("B/weight: bytes held (codes, scales, zero points and biases) per weight of the two linears")
faster = [name for name, s in summary.items() if name != "fp32" and s["ms"] < summary["fp32"]["ms"]]
print(f"faster than fp32 at batch 1 here: {', '.join(faster) or 'none'}")

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
# **What the numbers mean.** Size follows the bit width plus what each format stores beside the codes
# (scales, zero points; torchao's 8da4w target keeps its int4 codes unpacked, one per byte, so it can hold
# more than the 8-bit rows): read the MiB column. Latency follows it only where a kernel turns
# fewer bytes into less time at batch 1 on this device: the cell above lists which variants beat fp32 in
# this run and which did not. Accuracy loss at 8 bits is small; at 4 bits per group it is visible in the
# agreement figure, and QAT is how you buy it back.

# %% [markdown]
# ## What changes on other hardware
#
# - **NVIDIA / AMD GPUs**: bandwidth is terabytes per second (e.g. 4.8 TB/s on an H200,
#   https://www.nvidia.com/en-us/data-center/h200/), so decode is still memory-bound and weight-only int8 or
#   int4 still pays; use torchao configs (`Int8WeightOnlyConfig`, `Int4WeightOnlyConfig`) with
#   `torch.compile`. FP8 `scaled_mm` runs on sm_89+ and MI300+ (section 6): row-wise scales, `b`
#   column-major, dimensions divisible by 16.
# - **Intel GPUs (XPU)**: 2.10 added the XPU `_weight_int8pack_mm` kernel and FP8 tensor-wise/row-wise
#   `scaled_mm`; section 6's XPU cell runs there. IPEX is no longer needed.
# - **Arm CPUs (Graviton, Apple silicon)**: the aarch64 build of `int8mm_kernel.cpp` vectorizes fp32, fp16 and
#   bf16 activations alike, so the core lesson's fp32-activation trap may not exist there: measure with
#   `choose_fastest_path`.
# - **Apple (MPS)**: `_weight_int8pack_mm` has an MPS kernel (N and K multiples of 32).
#
# ## Pitfalls (each one run here, with its real error)
#
# **Scales in the wrong dtype.** The CPU kernel reads the scales as the activations' type, and its message
# does not say which argument is wrong. This is a CPU rule: CUDA's kernel (`aten/src/ATen/native/cuda/int8mm.cu`)
# computes with float `x` and `scale` pointers, converting both first. The second error below comes from a
# weight laid out [K, N] instead of `nn.Linear`'s [N, K].

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
# is compiled per ISA. Its AVX512 build steps k by 16 with aligned loads; with bf16 activations a K that is
# not a multiple of 16 (K = 24 on an AVX512 host, K = 36 on both AVX512 and AVX2 hosts, with torch 2.10 and
# 2.13) does not raise: it crashes the process (a segmentation fault) or returns wrong numbers. The
# cell runs K = 36 in a child process (full mode) so this notebook survives; `quant.bf16_k_multiple()` reads the ISA
# from `helpers.device.cpu_capability()` and the helper refuses such shapes up front.

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
# **The deprecation warning that says 2.10.** `torch.ao.quantization` warns "will be removed in 2.10"
# (printed in section 3); it was not removed. Migrate anyway: `quantize_dynamic` -> torchao `quantize_`,
# FX -> `torchao.quantization.pt2e`; do not mix the two flows in one model.
#
# **Old torchao names.** torchao moved from functions to configs: `int8_weight_only()` became
# `Int8WeightOnlyConfig()`. And a torchao built for another torch prints "Skipping import of cpp
# extensions..." or worse: match the versions (2.10 with 0.16.0).
#
# ## What the articles got wrong
#
# The 2.10 article's quantization paragraph lists "per-channel calibration improvements for convolutional
# networks and vision transformers", "enhanced gradient propagation through fake quantization nodes" and
# "hardware-specific quantization schemas". None of these appears in what 2.10 shipped as checked for this
# collection. What 2.10 did ship for quantization is narrower: the XPU kernel for `_weight_int8pack_mm`
# and FP8 `scaled_mm` on XPU; the quantization *workflows* (PTQ, QAT, PT2E) live in torchao, and
# `torch.ao.quantization` is deprecated, not improved. Its sentence on `_weight_int8pack_mm` is right
# that it came to Intel GPUs, but the op is older: torch declares CPU, CUDA and MPS kernels for it too
# (printed from torch's own operator list in section 1).
