# %% [markdown]
# # 05 · Quantization for deployment: int8 weight-only, calibration, QAT, FP8, torchao
#
# | | |
# |---|---|
# | **What you will learn** | why decode-size matmuls are limited by bytes, not FLOPs; int8 weight-only quantization per channel with `torch._weight_int8pack_mm` and the activation-dtype trap; choosing scales (min-max, percentile, MSE; per tensor vs per channel vs per group); symmetric vs asymmetric codes with a zero point; dynamic quantization the deprecated `torch.ao` way and the torchao way; static int8 with activation calibration (PT2E, and the `strict=True` export it needs); quantization-aware training with a straight-through estimator, by hand and with torchao's `QATConfig`; FP8 `scaled_mm` tensor-wise and row-wise; model sizes measured from the quantized tensors; torchao int4 weight-only (min-max and HQQ); accuracy on a real labelled task (scikit-learn digits) |
# | **Prerequisites** | lesson 00; `nn.Linear`, autograd, a training loop |
# | **Hardware** | any CPU (all numerics, including FP8, run on it). An FP8 GPU (NVIDIA sm_89+, AMD MI300+) runs the FP8 speed section; an Intel GPU runs the XPU int8 kernel section. torchao runs its sections (int4, QAT) and scikit-learn the digits section; each is skipped with a reason without them. Full mode's `torch.compile` rows need a C++ compiler (skipped without one) |
# | **Time** | 85 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); claims about 2.10 are checked against its release notes and source. torchao 0.16.0 is the release paired with torch 2.10 |
#
# **Card → parameters → device → idea → code → check → measure → plot → meaning → other hardware → pitfalls.**

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
SIZE = 4096            # N and K of the square decode-size weight
QAT_STEPS = 800        # training steps for the fp32 model of the QAT task

# %%
import copy
import warnings

import plotly.graph_objects as go
import torch
import torch.nn as nn
import torch.nn.functional as F
from plotly.subplots import make_subplots

from helpers import bench, quant
from helpers.device import capabilities, pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    SIZE, QAT_STEPS = 1024, 300
caps = capabilities()
THREADS = torch.get_num_threads()
print(f"torch {torch.__version__} · device {DEVICE} · {caps.device_name} · native bf16: {caps.bf16} · "
      f"threads: {THREADS} · quick: {QUICK} · weight {SIZE}x{SIZE}")

# %% [markdown]
# ## 1 · The idea: at batch 1, a linear layer is a memory read
#
# Generating one token runs every linear layer with a single row of activations (M = 1). Each weight
# is read once and used for one multiply-add: 2 FLOPs per 4 bytes in fp32. No processor computes that
# slowly, so the time is the time to *read the weight*. Halve the bytes (bf16) or quarter them (int8)
# and the read takes a half or a quarter of the time, if the kernel keeps up. That is the whole case for weight-only
# quantization in deployment; accuracy is what it costs, and the rest of the lesson is about keeping
# that cost small.
#
# First the ceiling: this machine's read bandwidth (`helpers.bench`, summing a large fp32 tensor).
# A weight read faster than that came from the cache, not from memory, so the timings below cycle
# through several copies of the weight, as a model's forward pass reads a different layer each time.

# %%
limits = bench.measure_limits(quick=True, device="cpu") if QUICK else bench.machine_limits(device="cpu")
BANDWIDTH = limits["read_bandwidth_gbs"]
print(f"read bandwidth: {BANDWIDTH:.1f} GB/s at {limits['threads']} threads")
print(f"fp32 weight {SIZE}x{SIZE}: {SIZE * SIZE * 4 / 2**20:.0f} MiB -> at least "
      f"{SIZE * SIZE * 4 / BANDWIDTH / 1e6:.2f} ms per read; int8: {SIZE * SIZE / 2**20:.0f} MiB -> "
      f"{SIZE * SIZE / BANDWIDTH / 1e6:.2f} ms")

# %% [markdown]
# ### Latency and "% of bandwidth" against batch size
#
# The same fp32 weight and its int8 copy, at growing batch sizes, timed side by side. "% of
# bandwidth" is weight bytes / time / measured bandwidth: close to the measured bandwidth the layer is
# memory-bound; as M grows the arithmetic takes over and the percentage falls.

# %%
torch.manual_seed(0)
COPIES = 2 if QUICK else 4                     # distinct weights cycled: together larger than the cache
weights = [torch.randn(SIZE, SIZE) / SIZE**0.5 for _ in range(COPIES)]
int8_layers = [quant.Int8WeightOnlyLinear(*quant.quantize_per_channel(w)) for w in weights]
batches = [1, 16] if QUICK else [1, 2, 4, 8, 16, 32, 64]
xs = {m: torch.randn(m, SIZE) for m in batches}
turn = {"i": 0}

def cycled(call):
    def run():
        turn["i"] = (turn["i"] + 1) % COPIES
        return call(turn["i"])
    return run

sweep = {}
for m in batches:
    sweep[f"fp32 M={m}"] = cycled(lambda i, x=xs[m]: F.linear(x, weights[i]))
    sweep[f"int8 M={m}"] = cycled(lambda i, x=xs[m]: int8_layers[i](x))
with torch.no_grad():
    sweep_result = bench.compare(sweep, baseline="fp32 M=1", repeats=3, min_run_time=0.02 if QUICK else 0.1, device="cpu")
for name, r in sweep_result["results"].items():
    r["percent_of_bandwidth"] = SIZE * SIZE * (4 if name.startswith("fp32") else 1) / r["median_s"] / 1e9 / BANDWIDTH * 100
    print(f"{name:<12} {r['median_s'] * 1e3:8.3f} ms  {r['percent_of_bandwidth']:6.0f}% of read bandwidth")

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("latency per call (ms)", "% of measured read bandwidth"))
for kind, color in (("fp32", "#1f77b4"), ("int8", "#d62728")):
    rows = [sweep_result["results"][f"{kind} M={m}"] for m in batches]
    fig.add_trace(go.Scatter(x=batches, y=[r["median_s"] * 1e3 for r in rows], name=f"{kind} weights",
                             line=dict(color=color)), row=1, col=1)
    fig.add_trace(go.Scatter(x=batches, y=[r["percent_of_bandwidth"] for r in rows], showlegend=False,
                             line=dict(color=color)), row=1, col=2)
fig.update_xaxes(type="log", title="batch size M")
fig.update_layout(height=360, title=f"{SIZE}x{SIZE} linear on {DEVICE}, {THREADS} threads")
fig.show()

# %%
fp32_1 = sweep_result["results"]["fp32 M=1"]
print(f"fp32 F.linear at M = 1 read its weight at {fp32_1['percent_of_bandwidth']:.0f}% of the measured bandwidth")
for m in batches:
    fp32_m, int8_m = sweep_result["results"][f"fp32 M={m}"], sweep_result["results"][f"int8 M={m}"]
    print(f"M = {m:>2}: int8 runs at {fp32_m['median_s'] / int8_m['median_s']:.2f}x fp32's speed "
          f"({fp32_m['median_s'] / m * 1e3:.3f} ms per row in fp32)")
gone = [m for m in batches if sweep_result["results"][f"int8 M={m}"]["median_s"] >= sweep_result["results"][f"fp32 M={m}"]["median_s"]]
print(f"int8's advantage is gone from M = {gone[0]}" if gone else "int8 stayed ahead at every batch size timed here")

# %% [markdown]
# **What the numbers mean** (the cell above read them off this run). At M = 1 an fp32 layer can only get
# faster by reading fewer bytes, and its share of the measured bandwidth says how close it already is. The
# weight is read once for all M rows, so the time *per row* falls as M grows: that is why batching is the
# other half of cheap inference. The int8 layer reads a quarter of the bytes; its advantage is largest at
# M = 1 and shrinks as M grows, because with more rows the arithmetic, not the read, sets the time. In quick
# mode the weights are small enough to sit in the cache, so shares above the measured bandwidth appear: those
# are cache speeds, not memory speeds. On a machine busy with other work, the 2-thread numbers can be far
# slower and erratic: a parallel kernel waits for its slowest thread.
#
# ## 2 · Weight-only int8 per channel, from scratch
#
# One scale per output row (per channel): `scale = max|w_row| / 127`, `q = round(w / scale)`, stored as
# int8. `helpers.quant` has these as small functions with plain tensors in and out.
#

# %% tags=["nbval-check-output"]
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
print(f"SQNR at 8 bits: {quant.sqnr_db(w, w_hat):.0f} dB (about 6 dB per bit)")

# %% [markdown]
# ### The activation-dtype trap, as a runnable cell
#
# `torch._weight_int8pack_mm(x, w_int8[N, K], scales[N])` is PyTorch's int8 weight-only kernel; its
# XPU implementation is new in 2.10. Its scales must have x's dtype, and *which* dtype you choose decides
# which code path runs. Same weights, same answer, timed side by side at M = 1:

# %%
import pathlib
import torchgen

yaml_text = (pathlib.Path(torchgen.__file__).parent / "packaged/ATen/native/native_functions.yaml").read_text()
entry = yaml_text.split("- func: _weight_int8pack_mm(")[1].split("\n\n")[0]
declared = [line.split(":")[0].strip() for line in entry.splitlines()[2:]]
built = [key for key in declared if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", key)]
print(f"_weight_int8pack_mm kernels declared in torch {torch.__version__}: {', '.join(declared)}; "
      f"in this build: {', '.join(built)}")
x1 = torch.randn(1, SIZE)
layer_paths = {p: [quant.Int8WeightOnlyLinear(l.q, l.scales, path=p) for l in int8_layers]
               for p in quant.INT8_PATHS}
weights_bf16 = [w.bfloat16() for w in weights]
trap = {"fp32 F.linear": cycled(lambda i: F.linear(x1, weights[i])),
        "bf16 F.linear": cycled(lambda i: F.linear(x1.bfloat16(), weights_bf16[i]))}
trap.update({f"int8 {p}": cycled(lambda i, p=p: layer_paths[p][i](x1)) for p in quant.INT8_PATHS})
with torch.no_grad():
    trap_result = bench.compare(trap, baseline="fp32 F.linear", repeats=3 if QUICK else 5,
                                min_run_time=0.02 if QUICK else 0.2, device="cpu")
print(bench.table(trap_result))
bench.plot(trap_result, title=f"M=1, {SIZE}x{SIZE}: the same int8 weights through three paths").show()

# %% [markdown]
# Which path is fastest is a property of the device and the torch build, so the helper measures instead
# of guessing: `quant.choose_fastest_path` runs every path, drops any whose output is off the fp32
# reference, times the rest and keeps the winner.

# %%
with torch.no_grad():
    choice = quant.choose_fastest_path(quant.Int8WeightOnlyLinear(int8_layers[0].q, int8_layers[0].scales), x1)
print("chosen path:", choice["path"])
for path in quant.INT8_PATHS:
    err = choice["errors"][path]
    shown = f"{err:.1e}" if isinstance(err, float) else err
    print(f"  {path:<15} relative error {shown:<10} time {choice['times_s'].get(path, float('nan')) * 1e3:.3f} ms")

# %% [markdown]
# **Thread count** is the other knob: a GEMV splits the rows of the weight across threads, and at M = 1
# each thread's share is a pure stream from memory.

# %%
thread_counts = sorted({1, THREADS})
per_threads = {}
with torch.no_grad():
    for t in thread_counts:
        r = bench.compare({"fp32": trap["fp32 F.linear"], "int8 bf16": trap["int8 int8pack_bf16"]},
                          threads=t, repeats=3, min_run_time=0.02 if QUICK else 0.2, device="cpu")
        per_threads[t] = r
        i8 = r["results"]["int8 bf16"]
        print(f"{t} thread(s): int8 bf16 {i8['median_s'] * 1e3:.3f} ms = {i8['ratio_to_baseline']:.2f}x fp32, "
              f"{SIZE * SIZE / i8['median_s'] / 1e9:.1f} GB/s of int8 weights "
              f"({SIZE * SIZE / i8['median_s'] / 1e9 / BANDWIDTH * 100:.0f}% of the {THREADS}-thread bandwidth)")

# %%
ratio = {name: r["ratio_to_baseline"] for name, r in trap_result["results"].items()}
trap_weight_bytes = {name: SIZE * SIZE * (1 if name.startswith("int8") else 2 if "bf16" in name else 4) for name in trap}
read_share = {name: bench.percent_of_limit(trap_weight_bytes[name] / r["median_s"] / 1e9, BANDWIDTH)
              for name, r in trap_result["results"].items()}
for name in trap_result["results"]:
    print(f"{name:<22} {ratio[name]:5.2f}x the speed of fp32 F.linear, weight read at {read_share[name]:4.0f}% of the measured bandwidth")
fastest = max(ratio, key=ratio.get)
print(f"fastest here: {fastest}; int8 with fp32 activations is "
      f"{'slower' if ratio['int8 int8pack_fp32'] < 1 else 'not slower'} than fp32 F.linear")


# %% [markdown]
# **What the numbers mean** (the cell above computed them from this run's tables). The kernel fed **bf16**
# activations is the path the kernel was written for; fed **fp32** activations it can be a correct answer
# through a slow loop, slower than fp32 `F.linear` itself. Dequantizing and calling `F.linear` materialises
# the fp32 weight on every call. bf16 `F.linear` reads half the bytes of fp32; how close it comes to the
# halved time depends on whether this CPU computes bf16 natively. The int8 kernel's share of the bandwidth
# against fp32 `F.linear`'s says what limits it: when it falls short, the int8-to-float conversion per weight,
# not memory, is the limit. The collection's benchmark (`python -m helpers bench quant`) records each
# variant's latency and "% of bandwidth" at 1 thread and at all threads in one JSON file.
#
# ## 3 · Calibration: choosing the scale
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

# %%
fig = go.Figure()
for bits, t in tables.items():
    fig.add_trace(go.Bar(x=list(t), y=list(t.values()), name=f"{bits} bits"))
fig.update_layout(title="Calibration on a layer with an outlier: SQNR (dB)", yaxis_title="dB", height=380)
fig.show()

# %% [markdown]
# **Try it**: move the outlier and watch per-tensor min-max collapse while per-channel barely notices
# (widgets need a live kernel; in a batch run the cell shows the control).

# %%
import ipywidgets as widgets

from helpers.interactive import interact

def show_calibration(outlier=50.0, bits=4):
    t = calibration_table(outlier_layer(outlier), bits)
    for name, db in t.items():
        print(f"{name:<28} {db:6.1f} dB")

interact(show_calibration, outlier=widgets.FloatLogSlider(value=50, base=10, min=0.5, max=3),
                 bits=widgets.IntSlider(value=4, min=2, max=8));

# %% [markdown]
# Per group goes finer still: one scale per 32 consecutive inputs of a row (`quant.quantize_per_group`),
# the usual layout for int4 weights. The scales cost 1 fp32 per 32 weights (one extra bit per weight);
# in exchange an outlier spoils only its own group.

# %% tags=["nbval-check-output"]
per_group_db = {}
for gs in (512, 128, 32):
    q4, s4 = quant.quantize_per_group(w_out, group_size=gs, bits=4)
    per_group_db[gs] = quant.sqnr_db(w_out, quant.dequantize_per_group(q4, s4))
assert per_group_db[32] > per_group_db[128] > per_group_db[512]
print("int4 SQNR rises as groups shrink: 512 (= per channel) < 128 < 32")

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
# ## 4 · Dynamic quantization: the `torch.ao` way (deprecated) and the torchao way
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

# %%
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

# %% [markdown]
# **What the numbers mean.** torchao's quantized weights are tensor subclasses: in eager mode every
# matmul goes through Python dispatch and a generic path, and on the verifying CPU both torchao variants
# in eager mode were *slower than fp32*. Its speed comes with `torch.compile`, which fuses the
# dequantization into the matmul: compiled, the int8 weight-only model was the fastest row of our full
# run (compare the compiled rows in full mode; the exact ratio varies run to run on a shared machine). The old `torch.ao` dynamic module calls a dedicated
# x86 kernel and needs no compile, which is one reason people keep using it, but it is the deprecated
# path and not where new work goes. Static quantization moved too, to `torchao.quantization.pt2e`
# (`prepare_pt2e`, `convert_pt2e`) instead of `torch.ao.quantization.quantize_fx`: the next section runs it.

# %% [markdown]
# ### Static int8 with activation calibration: PT2E
#
# Dynamic quantization measures each activation's range at run time, batch by batch. **Static**
# quantization fixes the activation scales and zero points ahead of time, from a **calibration set**: a
# few batches of representative inputs run through the model with observers attached. torchao's PT2E
# flow (`torchao.quantization.pt2e`, the same modules in torchao 0.16 and 0.18) takes four steps:
#
# 1. `torch.export.export(model, (example,), strict=True).module()` captures the model as an ATen graph;
# 2. `prepare_pt2e(graph, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))`
#    annotates the linears and inserts observers. The default config (`x86_inductor_quantizer.py`):
#    activations `uint8` per tensor with a zero point, observed by a `HistogramObserver`; weights `int8`
#    per output channel, symmetric;
# 3. the calibration batches run through the prepared graph, and the observers record what they see;
# 4. `convert_pt2e(prepared)` replaces each observer with a quantize/dequantize (Q/DQ) pair holding the
#    scale it chose, and folds the weights to int8.
#
# The converted graph is a *reference* model: int8 weights, Q/DQ around each fp32 op. Speed comes when
# `torch.compile` (Inductor) fuses each Q/DQ pattern into an x86 int8 kernel; that needs a C++ compiler
# and is not run here. The model is a small `64 -> 128 -> 10` MLP with a ReLU.
#
# **Pitfall: `strict=True`.** `torch.export` defaults to non-strict tracing. The quantizer finds the
# linears to annotate with `get_source_partitions` (`torch/fx/passes/utils/source_matcher_utils.py`),
# which reads each node's `source_fn_stack` metadata, and a non-strict export does not record it. In
# torch 2.10 that function has no `nn_module_stack` fallback, so with torchao 0.16 the non-strict graph matches no linear
# and `convert_pt2e` returns the model unquantized, fp32 bytes and all, with no error and no warning. A
# later torch falls back to `nn_module_stack` when `source_fn_stack` is missing (the 2.13 source says so,
# "e.g. strict=False export"). The cell below exports both ways and prints, per export, the nodes that
# carry the metadata and the Q/DQ ops after conversion: export with `strict=True`, and count the Q/DQ
# nodes before trusting a converted model.
#

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
else:
    print("PT2E static quantization skipped: torchao is not installed")

# %%
if HAVE_PT2E:
    enough = static_results[f"static int8, {len(calib_batches)} batches"]
    wrong = static_results[f"static int8, {len(calib_batches)} batches of inputs x 0.1 (wrong scale)"]
    assert enough["agreement"] > 0.95 and enough["rel. error"] < 0.05, enough
    assert wrong["rel. error"] > 5 * enough["rel. error"], (wrong, enough)
    assert enough["bytes"] < static_results["fp32"]["bytes"] / 3, enough
    print(f"calibrated on inputs like the deployed ones, static int8 agrees with fp32 on "
          f"{enough['agreement']:.1%} of held-out inputs at {enough['bytes'] / static_results['fp32']['bytes']:.0%} "
          f"of its bytes; calibrated on inputs a tenth the size, the activation scales clip and agreement "
          f"falls to {wrong['agreement']:.1%}")

# %% [markdown]
# **What the numbers mean** (printed above). Calibration sets the activation ranges once, for good:
# what matters is that the calibration inputs look like the deployed ones. On these Gaussian inputs one
# batch already gives the histogram observer nearly the range that many batches give; compare the first
# two int8 rows. Inputs of the wrong scale (a preprocessing step missing from the calibration pipeline,
# say) make every activation scale too small, so deployed activations clip at the top code, and the
# model stops agreeing with fp32. The bytes are the int8 weights, their per-channel scales and zero points, and the fp32
# biases, counted from the tensors the converted graph reads (activation qparams are constants in the
# Q/DQ calls).

# %% [markdown]
# ## 5 · Quantization-aware training: when rounding after training is not enough
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
    print("torchao's QATConfig skipped: torchao is not installed (see section 4); the hand-written QAT above is the same idea")

# %% tags=["nbval-check-output"]
assert acc["fp32"] > 0.6, "the fp32 model did not learn the task"
assert acc["PTQ int2"] < acc["fp32"] - 0.02, "2-bit PTQ should cost accuracy on this task"
assert abs(acc["PTQ int4"] - acc["fp32"]) < 0.03, "4-bit per-group PTQ should cost little"
assert acc["QAT int2 (by hand)"] >= acc["PTQ int2"], acc          # the direction, in quick mode too
if not QUICK:   # with the full training budget the gap is large and stable across runs
    assert acc["QAT int2 (by hand)"] > acc["PTQ int2"] + 0.03, acc
if HAVE_TORCHAO:
    assert min(acc["PTQ int4 (torchao)"], acc["QAT int4 (torchao)"]) > acc["fp32"] - 0.03, acc
print("2-bit PTQ loses accuracy; 4-bit per-group PTQ stays close to fp32; 2-bit QAT is not worse than 2-bit PTQ"
      + ("" if QUICK else " and wins most of the loss back"))

# %%
fig = go.Figure(go.Bar(x=list(acc), y=[a * 100 for a in acc.values()],
                       text=[f"{a * 100:.1f}%" for a in acc.values()], textposition="outside"))
fig.add_hline(y=acc["fp32"] * 100, line_dash="dot", annotation_text="fp32")
fig.update_layout(title="Test accuracy: PTQ vs QAT", yaxis_title="% correct",
                  yaxis_range=[min(acc.values()) * 100 - 10, 100], height=380)
fig.show()

# %% [markdown]
# **What the numbers mean.** On this task 4 bits per group of 16 is nearly free: PTQ is enough and QAT
# has little to win. At 2 bits (three levels per weight), PTQ loses several points and, with the full
# training budget (QUICK = False), QAT recovers most of them in a few hundred steps; quick mode trains
# too briefly to show more than the direction. That is the general shape: reach for QAT when PTQ at the bit width
# you need misses the accuracy budget, not before.
#
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
# machine: a CPU has no FP8 arithmetic, so FP8 on a CPU is for checking numerics. The speed is on GPUs with FP8 matrix units:
# NVIDIA sm_89+ (L4, H100, H200, B200) and AMD MI300+; 2.10 added tensor-wise and row-wise FP8
# `scaled_mm` on Intel XPU.

# %%
if requires("fp8", section="FP8 matmul on fast FP8 hardware"):
    m_gpu = 4096 if not QUICK else 1024
    a_gpu = torch.randn(m_gpu, m_gpu, device=DEVICE)
    b_gpu = torch.randn(m_gpu, m_gpu, device=DEVICE)
    a_bf16, b_bf16 = a_gpu.bfloat16(), b_gpu.bfloat16()
    for granularity in ("row-wise", "tensor-wise"):     # row-wise where this GPU's kernel takes it
        aq, sa = quant.to_fp8(a_gpu, rowwise=granularity == "row-wise")
        bq, sb = quant.to_fp8(b_gpu, rowwise=granularity == "row-wise")
        try:
            fp8_out = quant.fp8_matmul(aq, sa, bq, sb)     # bf16 output: what CUDA's row-wise kernel requires
            break
        except RuntimeError as exc:
            print(f"{granularity} FP8 _scaled_mm is refused here: {str(exc).splitlines()[0][:160]}")
    print(f"FP8 format on {caps.device_name} ({caps.arch}): {aq.dtype}, {granularity} scales")
    gpu_result = bench.compare({"bf16 matmul": lambda: a_bf16 @ b_bf16.t(),
                                f"fp8 {granularity} _scaled_mm": lambda: quant.fp8_matmul(aq, sa, bq, sb)},
                               repeats=5, device=DEVICE, work=2 * m_gpu**3 / 1e9, work_unit="GFLOP")
    print(bench.table(gpu_result))
    exact = a_gpu.double() @ b_gpu.double().t()
    err = ((fp8_out.double() - exact).norm() / exact.norm()).item()
    print(f"relative error of FP8 vs float64: {err:.4f}")
    assert err < 0.1, f"FP8 _scaled_mm is off by {err:.3f} relative to float64: scales or layout are wrong"

# %% [markdown]
# The XPU int8 kernel: 2.10 added an XPU implementation of `_weight_int8pack_mm`, so the same
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
# ## 7 · Summary: size, latency, accuracy
#
# One table for the MLP of section 4 (`1024 -> 4096 -> 1024` in full mode): bytes the model holds, summed from its tensors
# (`quant.model_bytes`: codes, scales, zero points, biases), batch-1 latency measured side by side, and how often each variant's top class agrees with fp32 on 500 random
# inputs (200 in quick mode; a task-free accuracy proxy). The 8da4w row (int8 dynamic activations, int4 per-group weights stored one code per byte in
# torchao's reference layout) is what section 5's torchao QAT model converts to; the int4 weight-only rows
# are torchao's packed CPU format (two codes per byte, a scale and a zero point per group of 32, for
# `torch._weight_int4pack_mm_for_cpu`), once with min-max scales and once with HQQ, which chooses scales
# and zero points by an optimisation on the weights alone, no calibration data
# ([HQQ](https://mobiusml.github.io/hqq_blog/)). The calibrated methods need activations from real inputs:
# [GPTQ](https://arxiv.org/abs/2210.17323) (rounds column by column, correcting the error with second-order
# information), [AWQ](https://arxiv.org/abs/2306.00978) (scales up the channels that large activations
# hit) and [SmoothQuant](https://arxiv.org/abs/2211.10438) (moves activation outliers into the weights so
# both quantize to int8); torchao ships them as prototypes (`torchao/prototype/{gptq,awq,smoothquant}` in
# 0.16, see [torchao's docs](https://docs.pytorch.org/ao/stable/)).

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
    print("torchao rows skipped (8da4w, int4 weight-only min-max and HQQ): torchao is not installed (section 4)")
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

# %% tags=["nbval-check-output"]
assert summary["fp32"]["agreement"] == 1.0
assert all(s["agreement"] > 0.8 for s in summary.values()), {k: s["agreement"] for k, s in summary.items()}
assert summary["bf16"]["MiB"] == summary["fp32"]["MiB"] / 2
for name in ("int8 weight-only (helpers)", "dynamic int8 (torch.ao)", FP8_NAME):   # 8-bit codes plus their scales
    assert summary[name]["MiB"] < summary["fp32"]["MiB"] / 3.5, (name, summary[name]["MiB"])
int4_rows = [name for name in summary if name.startswith("int4 weight-only")]
for name in int4_rows:                      # packed int4: fewer bytes than any 8-bit row
    assert summary[name]["MiB"] < summary["int8 weight-only (helpers)"]["MiB"], (name, summary[name]["MiB"])
    assert summary[name]["MiB"] < summary["int8 act. + int4 weight (torchao 8da4w, QAT's target)"]["MiB"]
print("every variant agrees with fp32 on more than 80% of inputs; sizes measured from the tensors:")
print("bf16 holds half of fp32's bytes, each 8-bit variant under 1/3.5 of them (codes plus scales), packed int4 fewer")

# %%
fig = go.Figure(go.Scatter(x=[s["MiB"] for s in summary.values()], y=[s["ms"] for s in summary.values()],
                           mode="markers+text", text=list(summary), textposition="top center",
                           marker=dict(size=[6 + 20 * s["agreement"] for s in summary.values()])))
fig.update_layout(title="Size vs batch-1 latency (marker size: agreement with fp32)",
                  xaxis_title="weights (MiB)", yaxis_title="ms per call", height=420)
fig.show()

# %%
fp32_ms = summary["fp32"]["ms"]
faster = [name for name, s in summary.items() if name != "fp32" and s["ms"] < fp32_ms]
slower = [f"{name} ({s['ms'] / fp32_ms:.1f}x the time)" for name, s in summary.items()
          if name != "fp32" and s["ms"] >= fp32_ms]
print(f"faster than fp32 at batch 1 here: {', '.join(faster) or 'none'}")
print(f"not faster: {', '.join(slower) or 'none'}")

# %% [markdown]
# **What the numbers mean.** Size follows the bit width plus what each format stores beside the codes
# (scales, zero points; torchao's 8da4w target keeps its int4 codes unpacked, one per byte, so it can hold
# more than the 8-bit rows): read the MiB column. Latency follows it only where a kernel turns
# fewer bytes into less time at batch 1 on this device: the cell above lists which variants beat fp32 in
# this run and which did not. Accuracy loss at 8 bits is small; at 4 bits per group it is visible in the
# agreement figure, and QAT is how you buy it back.

# %% [markdown]
# ### Accuracy on a real labelled task: scikit-learn digits
#
# Agreement on random inputs says how far a variant moved from fp32, not what that costs on a task. The
# handwritten digits bundled with scikit-learn (8x8 images, ten classes; `load_digits` needs no download)
# are small enough to train an MLP in a second or two and large enough to have a test split. The cell
# trains it in fp32, quantizes the same weights several ways, and counts test images each variant gets
# wrong. Without scikit-learn (the minimal environment) the section is skipped and says why.

# %%
HAVE_SKLEARN = requires("sklearn", section="Accuracy on scikit-learn digits")
digits_acc = {}
if HAVE_SKLEARN:
    from helpers.validation.upgrade import digits_split

    dx_train, dy_train, dx_test, dy_test = digits_split(seed=0)    # 8x8 images as 64 features in [0, 1]
    torch.set_num_threads(1)                       # bitwise-reproducible training, as in section 5
    torch.manual_seed(0)
    digits_fp32 = train(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                      nn.Linear(128, 10)), dx_train, dy_train, steps=200, lr=3e-3, seed=0)
    digits_models = {
        "fp32": digits_fp32,
        "int8 per channel (helpers)": quant.swap_linears(copy.deepcopy(digits_fp32),
                                                         quant.Int8WeightOnlyLinear.from_linear),
        "int4 per channel (by hand, fp32 storage)": quant.quantize_model_per_group(copy.deepcopy(digits_fp32), bits=4, group_size=None),
        "int4 per group of 16 (by hand, fp32 storage)": quant.quantize_model_per_group(copy.deepcopy(digits_fp32), bits=4, group_size=16),
    }
    if HAVE_TORCHAO:
        # the int4 CPU kernel needs out_features divisible by 16: the 10-class head stays fp32
        divisible = lambda module, fqn: isinstance(module, nn.Linear) and module.out_features % 16 == 0
        for algorithm, label in (("tinygemm", "min-max"), ("hqq", "HQQ")):
            try:
                int4_config = quant.torchao_int4_cpu_config(group_size=32, algorithm=algorithm)
            except ImportError as exc:
                print("torchao int4 weight-only skipped:", exc)
                break
            digits_int4 = copy.deepcopy(digits_fp32)
            quantize_(digits_int4, int4_config, filter_fn=divisible)
            digits_models[f"int4 weight-only, {label} (torchao, head fp32)"] = digits_int4
    else:
        print("torchao int4 weight-only rows skipped: torchao is not installed (section 4)")
    print("by hand = the rounded weights kept in fp32 (section 5's quantize_model_per_group): accuracy, not size")
    print(f"{'digits, ' + str(len(dx_test)) + ' test images':<46}{'test accuracy':>14}{'wrong':>7}{'KiB held':>10}")
    for name, m in digits_models.items():
        digits_acc[name] = quant.accuracy(m, dx_test, dy_test)
        wrong = round((1 - digits_acc[name]) * len(dx_test))
        print(f"{name:<46}{digits_acc[name]:>14.4f}{wrong:>7}{quant.model_bytes(m) / 1024:>10.1f}")
    torch.set_num_threads(THREADS)
    assert digits_acc["fp32"] > 0.9, "the digits MLP did not learn"
    assert digits_acc["int8 per channel (helpers)"] >= digits_acc["fp32"] - 0.01, digits_acc
    assert all(a >= digits_acc["fp32"] - 0.03 for a in digits_acc.values()), digits_acc
    print("checked: int8 per channel within 1 point of fp32's test accuracy, every int4 variant within 3")

# %% [markdown]
# **What the numbers mean.** The wrong-answer column is the honest unit: the test split is a few hundred
# images, so one image moves accuracy by a fraction of a point, and differences of one or two images are
# noise, not a ranking. The check above holds int8 to fp32's accuracy within a point and int4 within three;
# on a task this easy, fine-grained scales (per group, or torchao's groups of 32) leave little to lose, and
# section 5's 2-bit rows show what happens further down. A deployment makes the same measurement on its
# own validation set, not on random inputs.

# %% [markdown]
# ## What changes on other hardware
#
# - **NVIDIA / AMD GPUs**: bandwidth is terabytes per second (e.g. 4.8 TB/s on an H200,
#   https://www.nvidia.com/en-us/data-center/h200/), so decode is still memory-bound and weight-only int8 or
#   int4 still pays; use torchao configs with `torch.compile`. FP8 `scaled_mm` is fast on sm_89+ and
#   MI300+ (the FP8 section runs there). Row-wise scales, `b` column-major, dimensions divisible by 16.
# - **Intel GPUs (XPU)**: 2.10 added the XPU `_weight_int8pack_mm` kernel and FP8 tensor-wise/row-wise
#   `scaled_mm`; the XPU section above runs there. IPEX is no longer needed.
# - **CPUs without AVX512-BF16 or AMX**: bf16 matmuls are slow, but the int8 kernel only converts bf16,
#   so its bf16 path can still be the fast one: measure with `choose_fastest_path`.
# - **Apple (MPS)**: `_weight_int8pack_mm` has an MPS kernel (N and K multiples of 32).
#
# ## Pitfalls (each one run here, with its real error)
#
# **Scales in the wrong dtype.** The kernel's message does not say which argument is wrong:

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

# %% [markdown]
# **A weight laid out [K, N] instead of [N, K]** (the transposed `nn.Linear` convention):

# %% tags=["nbval-check-output"]
try:
    torch._weight_int8pack_mm(torch.randn(2, 64), q_p.t().contiguous(), torch.ones(16))
except RuntimeError as exc:
    print(type(exc).__name__ + ":", str(exc).splitlines()[0])

# %% [markdown]
# **K not a multiple of 8 with bf16 activations.** On the CPU that verified this lesson, torch 2.13's
# `_weight_int8pack_mm` with bf16 input and K = 36 did not raise: it crashed the process (a segmentation
# fault). Run in a child process so this notebook survives; the helper refuses such shapes up front.

# %%
import subprocess
import sys

crash = subprocess.run([sys.executable, "-c",
                        "import torch; torch._weight_int8pack_mm(torch.randn(2, 36, dtype=torch.bfloat16), "
                        "torch.ones(8, 36, dtype=torch.int8), torch.ones(8, dtype=torch.bfloat16)); print('ran')"],
                       capture_output=True, text=True, timeout=120)
print("child process return code:", crash.returncode, "(-11 is SIGSEGV)" if crash.returncode == -11 else "",
      crash.stdout.strip())
try:
    quant.Int8WeightOnlyLinear.from_linear(nn.Linear(36, 8), path="int8pack_bf16")
except ValueError as exc:
    print("helpers:", exc)

# %% [markdown]
# **The deprecation warning that says 2.10.** `torch.ao.quantization` warns "will be removed in 2.10"
# (printed in section 4); it was not removed. Migrate anyway: `quantize_dynamic` -> torchao `quantize_`,
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
# (printed from torch's own operator list in section 2).
