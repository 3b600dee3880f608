# %% [markdown]
# # 03 · Grouped GEMM for mixture-of-experts: the fallback, padding and `F.grouped_mm`
#
# | | |
# |---|---|
# | **What you will learn** | how an MoE layer turns routing into ragged groups (top-k router → token permutation → int32 END offsets → grouped GEMM → unpermute and combine); three ways to run the expert GEMMs (a loop of GEMMs, padded `bmm`, `torch.nn.functional.grouped_mm`) checked against one reference; which path `grouped_mm` takes on your machine; how fast each is against a dense GEMM with the same FLOPs, as the number of experts and the skew change; the roofline that says when an expert GEMM is memory-bound |
# | **Prerequisites** | lesson 00; matrix multiplication; what a mixture-of-experts layer is (a router sends each token to k of E expert MLPs) |
# | **Hardware** | any CPU: everything here runs on one. The GPU paths (CUTLASS on NVIDIA, the fallback and CK on ROCm), a Triton kernel and its device-side schedule are in the deep dive |
# | **Time** | 45 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the CPU fallback was read in `aten/src/ATen/native/GroupedMMUtils.h` and is shown by the profiler on the torch you run |
#
# The story: routing makes ragged groups → the offsets that describe them → three implementations, one
# reference → measured against a dense GEMM of the same FLOPs → the roofline that says when that
# comparison is unfair.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/03_grouped_gemm_moe.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False        # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
TOKENS = 1024        # tokens in the batch (batch x sequence, flattened)
D_MODEL = 512        # model width (K of the first expert GEMM)
D_FF = 1024          # expert hidden width (N of the first expert GEMM)
EXPERTS = 8
TOP_K = 2
THREADS = 1          # threads for timing: 1 gives stable numbers on a shared machine; try your core count
BENCH_DTYPE = "float32"   # "bfloat16" on a CPU with native bf16 (AVX512-BF16/AMX) or a GPU

# %%
import torch
import torch.nn.functional as F
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from helpers import bench, moe
from helpers.device import capabilities, pick_device, quick_mode
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if QUICK:
    TOKENS, D_MODEL, D_FF, EXPERTS = 256, 128, 256, 8
caps = capabilities()
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · {caps.device_name} · native bf16: {caps.bf16}")
print(f"sizes: {TOKENS} tokens, d_model {D_MODEL}, d_ff {D_FF}, {EXPERTS} experts, top-{TOP_K}; quick={QUICK}")

# %% [markdown]
# ## The idea: routing makes ragged groups
#
# An MoE feed-forward layer has E expert MLPs. A router scores every token against every expert and
# keeps the top k; each token goes through its k experts and the outputs are summed with the router's
# weights (the *gates*). Each expert sees a different number of tokens, so the expert GEMMs (GEMM:
# general matrix multiply, `C = A @ B`) are **ragged**: `[n_e, K] @ [K, N]` for e = 0..E-1, with
# `sum(n_e) = tokens × k`.
#
# The standard way to run them: sort the (token, choice) pairs by expert (**permute**), so each
# expert's rows are contiguous, and describe the groups by **offsets**: `offs[e]` is the row where
# expert e's rows *end*, as `int32` (counts `[3, 0, 2]` give `offs = [3, 3, 5]`). One grouped GEMM then computes every expert at once, and
# **unpermute** puts the rows back in token order and combines them with the gates. `helpers.moe` has
# each step as a small function: `route`, `permute`, `offsets_from_counts`, `unpermute`.

# %%
params = moe.make_moe(D_MODEL, D_FF, EXPERTS, seed=0)
x = torch.randn(TOKENS, D_MODEL)

ids, gates = moe.route(x @ params["router"], TOP_K)
xs, order, offs = moe.permute(x, ids, EXPERTS)
counts = moe.counts_from_offsets(offs)
print("expert ids of token 0:", ids[0].tolist(), " gates:", [round(g, 3) for g in gates[0].tolist()])
print("tokens per expert:    ", counts.tolist())
print("offsets (int32 ends): ", offs.tolist(), offs.dtype)

# %% [markdown]
# A freshly initialised router spreads tokens fairly evenly. Trained routers are often skewed: a few
# "hot" experts get many tokens, some get none (load-balancing losses exist to fight this); the deep
# dive plots such a router beside this one.

# %% [markdown]
# ## Three implementations, one reference
#
# Each takes the same arguments `(xs [M, K], w [E, K, N], offs int32 [E])` and returns `[M, N]`:
#
# - **`moe.loop_gemm`**: one `mm` per expert on its slice of rows, the reference;
# - **`moe.padded_bmm`**: pad every expert to the busiest expert's count, one `bmm`, gather the real rows;
# - **`F.grouped_mm(xs, w, offs=offs)`**: PyTorch's grouped GEMM (public in 2.10; `torch._grouped_mm` is
#   the op underneath). `moe.grouped_gemm` is the same call after input checks; it is used where the
#   checks matter, never in the timings.
#
# First the permutation: un-permuting the permuted tokens with the gates gives back each token times
# the sum of its gates (which is 1). Then all three on a skewed split with empty experts.

# %% tags=["nbval-check-output"]
small = moe.make_moe(32, 64, 6, seed=1)
xt = torch.randn(40, 32, generator=torch.Generator().manual_seed(1))
ids_t, gates_t = moe.route(xt @ small["router"], 2)
xs_t, order_t, offs_t = moe.permute(xt, ids_t, 6)
assert torch.allclose(moe.unpermute(xs_t, order_t, gates_t), xt, atol=1e-6), "permute/unpermute lost tokens"
assert int(offs_t[-1]) == 40 * 2 and offs_t.dtype == torch.int32
print("permute -> unpermute restores every token:", True, "| routed rows:", int(offs_t[-1]), "| offsets dtype:", offs_t.dtype)

counts_c = moe.skewed_counts(70, 8, 3.0)       # skewed, with empty experts
offs_c = moe.offsets_from_counts(counts_c)
g = torch.Generator().manual_seed(0)
xs_c, w_c = torch.randn(70, 32, generator=g), torch.randn(8, 32, 48, generator=g)
reference = moe.loop_gemm(xs_c, w_c, offs_c)
print("tokens per expert:", counts_c.tolist())
for name, out in (("padded_bmm", moe.padded_bmm(xs_c, w_c, offs_c)), ("F.grouped_mm", F.grouped_mm(xs_c, w_c, offs=offs_c))):
    assert torch.allclose(out, reference, atol=1e-4), name
    print(f"{name:<12} matches the loop reference: True, shape {tuple(out.shape)}")

# %% [markdown]
# ## Predict, then measure against a dense GEMM with the same FLOPs
#
# The sweep below runs each implementation on splits of `TOKENS × k` rows over E experts, with a skew:
# expert i gets a share proportional to `(i+1)^-skew` (`moe.skewed_counts`; skew 0 is uniform, skew 2
# leaves some experts nearly empty): a stand-in for a trained router's skew, with the skew as a dial.
# "% of dense" counts useful FLOPs only: padded `bmm` gets no credit for the zeros it multiplies. The reference is the **dense GEMM with the same FLOPs**
# (`[M, K] @ [K, N]`): one big problem, one weight. It is not a hardware bound (the roofline below is);
# it is what the grouped GEMM would cost if the raggedness were free.
#
# Two questions first. Padded `bmm` computes `E × max(n_e)` rows however many are real. And
# `F.grouped_mm` may run one fused kernel or fall back to one `mm` per group; the profiler will tell.

# %% tags=["predict"]
E_ASK, SKEW_ASK = 16, 2.0
ROWS = TOKENS * TOP_K
pad_guess = predict(f"{ROWS} routed rows over {E_ASK} experts with skew {SKEW_ASK}: padded bmm multiplies how "
                    f"many times the real rows?", unit="x", example=2.0)

# %% tags=["predict"]
path_guess = predict(f"Which path does F.grouped_mm take on this machine ({DEVICE.type}) in {BENCH_DTYPE}?",
                     options=["fused kernel", "loop of mm"], example="fused kernel")

# %%
EXPERT_COUNTS = (4, E_ASK) if QUICK else (4, 8, E_ASK, 32)
SKEWS = (0.0, SKEW_ASK) if QUICK else (0.0, 0.75, 1.5, SKEW_ASK, 3.0)
runs, any_tie = [], False
for e in EXPERT_COUNTS:
    for skew in SKEWS:
        run = moe.measure_split(moe.skewed_counts(ROWS, e, skew), D_MODEL, D_FF, threads=THREADS,
                                dtype=getattr(torch, BENCH_DTYPE), repeats=3, min_run_time=0.01 if QUICK else 0.05)
        runs.append({"skew": skew, **run})
        tie = {name: not bench.separated(run["result"], name, "dense") for name in run["vs_dense"] if name != "dense"}
        any_tie = any_tie or any(tie.values())
        print(f"E={e:>2} skew={skew:<4} padded rows / real rows={run['padded_rows'] / ROWS:4.1f}  dense "
              f"{run['gflops']['dense']:6.1f} GFLOP/s | % of dense: " +
              "  ".join(f"{name} {'~' * tie[name] + f'{100 * v:.0f}':>4}%" for name, v in run["vs_dense"].items()
                        if name != "dense"))
if any_tie:
    print("~ its spread over the repeats overlaps the dense GEMM's: a tie here")
saved = bench.save_json({"threads": THREADS, "rows": ROWS, "k": D_MODEL, "n": D_FF, "runs": runs}, "runs/03_grouped_gemm_moe.json")
print("JSON:", saved)

# %%
fig = make_subplots(rows=1, cols=len(EXPERT_COUNTS), shared_yaxes=True,
                    subplot_titles=[f"{e} experts" for e in EXPERT_COUNTS])
colors = {"loop": "#636efa", "padded_bmm": "#ef553b", "grouped_mm": "#00cc96"}
for col, e in enumerate(EXPERT_COUNTS, start=1):
    mine = [r for r in runs if r["experts"] == e]
    for name, color in colors.items():
        fig.add_trace(go.Scatter(x=[r["skew"] for r in mine], y=[100 * r["vs_dense"][name] for r in mine],
                                 mode="lines+markers", name=name, line_color=color, showlegend=col == 1),
                      row=1, col=col)
    fig.add_hline(y=100, line_dash="dot", line_color="gray", row=1, col=col)
    fig.update_xaxes(title_text="skew", row=1, col=col)
fig.update_yaxes(title_text="% of dense GEMM GFLOP/s (same FLOPs)", row=1, col=1)
fig.update_layout(title=f"Expert GEMM [{ROWS} rows, {D_MODEL}] x [E, {D_MODEL}, {D_FF}], {BENCH_DTYPE}, {THREADS} thread(s)",
                  height=420)
fig.show()

# %% tags=["reveal"]
asked = next(r for r in runs if r["experts"] == E_ASK and r["skew"] == SKEW_ASK)
reveal(pad_guess, asked["padded_rows"] / asked["rows"],
       why=f"the busiest expert got {max(asked['counts'])} of {asked['rows']} rows, so padding to it makes "
           f"{E_ASK} x {max(asked['counts'])} = {asked['padded_rows']} rows; padded bmm ran at "
           f"{100 * asked['vs_dense']['padded_bmm']:.0f}% of dense, the loop at {100 * asked['vs_dense']['loop']:.0f}%"
           + ("" if bench.separated(asked["result"], "padded_bmm", "loop") else
              f" (their spreads overlap: which is faster is {bench.NOISY})")
           + ". Skew is what padding pays for, not the number of experts alone.");

# %% tags=["reveal"]
dt = getattr(torch, BENCH_DTYPE)
path = moe.grouped_mm_path(torch.randn(ROWS, D_MODEL, device=DEVICE).to(dt), torch.randn(E_ASK, D_MODEL, D_FF, device=DEVICE).to(dt),
                           moe.offsets_from_counts(torch.tensor(asked["counts"])).to(DEVICE))
reveal(path_guess, path["path"],
       why=(f"the profiler saw {path['mm_calls']} aten::mm and {path['host_reads']} aten::item calls inside "
            f"aten::_grouped_mm for {E_ASK} experts: `_grouped_mm_fallback` (aten/src/ATen/native/GroupedMMUtils.h) "
            "copies offs to the host (offs.cpu(): a sync on a GPU), reads each end with .item() and calls mm_out "
            "once per group, empty groups too. The CPU, ROCm by default, and NVIDIA GPUs outside sm_90/sm_100 or "
            "in fp32 take it."
            if path["path"] == "loop of mm" else
            f"no aten::mm inside aten::_grouped_mm; the GPU ran {', '.join(path['gpu_kernels'][:2]) or 'one kernel'}.")
           + " The fused kernels (CUTLASS, CK) and when they run are in the deep dive.");

# %% [markdown]
# ## What the numbers mean
#
# - **`grouped_mm` on CPU is the loop**, done in C++: its throughput follows the Python loop's, close to
#   dense when every group is large, lower when many groups are small (a GEMM with few rows cannot use
#   the machine as well as one big GEMM). Where it runs ahead of the loop it saves the Python overhead
#   and the final `torch.cat` (it writes each group's result in place).
# - **Padded `bmm` does `E × max(n_e)` rows of work** instead of `sum(n_e)`. With uniform routing that
#   is barely more, and one batched call competes with the loop (compare them at skew 0): **padding can
#   win only when the split is nearly even**. With skew the busiest expert sets the padded size and
#   most of the work multiplies zeros: padding loses by roughly the factor printed above, and it costs
#   the memory of the padded copy too.
# - **The dense GEMM is a reference, not a competitor**: an MoE layer exists to do *less* work than the
#   dense layer with the same parameters. The grouped GEMM's job is to lose as little as possible to
#   the raggedness, and the roofline says how little that can be.
#
# The sweep prints medians of its repeats, and marks ~ a share whose spread overlaps the dense GEMM's; on
# a shared machine timings vary from run to run, the ratios less: if a ratio looks odd, run the sweep again.

# %% [markdown]
# ## A roofline: when is an expert GEMM memory-bound?
#
# A kernel that does F FLOPs and must move B bytes takes at least `max(F / peak, B / bandwidth)`.
# F / B is its **arithmetic intensity**; below the machine's ridge point (peak / bandwidth) it is
# memory-bound. Per expert, `[n_e, K] @ [K, N]` does `2·n_e·K·N` FLOPs and moves at least its rows, its
# whole `K × N` weight and its output. With `K, N ≫ n_e` the weight dominates the bytes, so the
# intensity is about `2·n_e` FLOPs per weight element (`n_e / 2` FLOP per byte in fp32, `n_e` in bf16):
# it grows with the rows. The grouped GEMM reads
# **E weights** where the dense GEMM with the same FLOPs reads one.
#
# The next cell measures this CPU's limits (`helpers.bench`: an fp32 GEMM's FLOP rate and the read
# bandwidth, at the benchmark's thread count). Before it runs, a guess about one expert of the split
# above, the third busiest:

# %% tags=["predict"]
n_small = sorted(asked["counts"], reverse=True)[2]
bound_guess = predict(f"The third-busiest expert of that split has {n_small} rows ([{n_small}, {D_MODEL}] x "
                      f"[{D_MODEL}, {D_FF}]). On this CPU, is its GEMM memory-bound or compute-bound?",
                      options=["memory-bound", "compute-bound"], example="compute-bound")

# %%
limits = (bench.measure_limits(THREADS, quick=True, device="cpu") if QUICK
          else bench.machine_limits(THREADS, device="cpu"))
# a limit is a measurement too: on a busy machine the square GEMM can come out below the dense GEMM above
peak = max(limits["fp32_gemm_gflops"], asked["gflops"]["dense"]) * 1e9
bandwidth = limits["read_bandwidth_gbs"] * 1e9
ridge = peak / bandwidth
# the ridge point's range over the repeats: the slowest and the fastest peak, over the fastest and the slowest read
dense_timing = asked["result"]["results"]["dense"]
peak_range = [max(gflops, asked["gflop"] / t) * 1e9
              for gflops, t in zip(limits["fp32_gemm_gflops_range"], (dense_timing["max_s"], dense_timing["min_s"]))]
ridge_range = (peak_range[0] / (limits["read_bandwidth_gbs_range"][1] * 1e9),
               peak_range[1] / (limits["read_bandwidth_gbs_range"][0] * 1e9))
traffic = moe.grouped_gemm_traffic(asked["counts"], D_MODEL, D_FF, getattr(torch, BENCH_DTYPE).itemsize)
print(f"this CPU, {THREADS} thread(s): peak {peak / 1e9:.1f} GFLOP/s, read {bandwidth / 1e9:.1f} GB/s, "
      f"ridge point {ridge:.1f} FLOP/byte ({ridge_range[0]:.1f} to {ridge_range[1]:.1f} over the repeats; "
      f"{BENCH_DTYPE} bytes)")
for e, (rows, intensity) in enumerate(zip(traffic["counts"], traffic["intensity"])):
    print(f"  expert {e:>2}: {rows:>5} rows, {intensity:6.1f} FLOP/byte, {'memory' if intensity < ridge else 'compute'}-bound")
grouped_ai = traffic["total_flops"] / traffic["total_bytes"]
print(f"bytes moved: grouped {traffic['total_bytes'] / 1e6:.2f} MB vs dense {traffic['dense_bytes'] / 1e6:.2f} MB; "
      f"intensity {grouped_ai:.1f} vs {traffic['dense_intensity']:.1f} FLOP/byte")
bounds = {"grouped_mm": moe.roofline_seconds(traffic["flops"], traffic["bytes"], peak, bandwidth),
          "dense": moe.roofline_seconds([traffic["total_flops"]], [traffic["dense_bytes"]], peak, bandwidth)}
for name, bound in bounds.items():
    measured = asked["result"]["results"][name]
    print(f"{name:<10}: roofline bound {bound * 1e6:9.1f} us, measured {measured['median_s'] * 1e6:9.1f} us "
          f"({measured['min_s'] * 1e6:.1f} to {measured['max_s'] * 1e6:.1f} us over the repeats; "
          f"{100 * bound / measured['median_s']:.0f}% of the bound reached)")
print("(above 100%: the data came from the caches, faster than the read bandwidth measured from memory; "
      "the bound assumes every byte comes from memory)" if any(b > asked["median_s"][n] for n, b in bounds.items()) else "")

# %%
span = [min(0.5, min(i for i in traffic["intensity"] if i > 0) / 2), max(4 * ridge, 2 * traffic["dense_intensity"])]
grid = [span[0] * (span[1] / span[0]) ** (i / 60) for i in range(61)]
fig = go.Figure(go.Scatter(x=grid, y=[min(peak, a * bandwidth) / 1e9 for a in grid], mode="lines",
                           name="roofline: min(peak, intensity x bandwidth)", line_color="gray"))
groups = [(a, c) for a, c in zip(traffic["intensity"], traffic["counts"]) if c]
fig.add_trace(go.Scatter(x=[a for a, _ in groups], y=[min(peak, a * bandwidth) / 1e9 for a, _ in groups],
                         mode="markers", name="each expert's bound", text=[f"{c} rows" for _, c in groups]))
for name, intensity in (("grouped_mm", grouped_ai), ("dense", traffic["dense_intensity"])):
    fig.add_trace(go.Scatter(x=[intensity], y=[asked["gflops"][name]], mode="markers", marker_size=12,
                             marker_symbol="diamond", name=f"{name}, measured"))
fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP/byte)")
fig.update_yaxes(type="log", title_text="GFLOP/s")
fig.update_layout(title=f"Roofline of this CPU ({THREADS} thread(s)) and the expert GEMMs of E={E_ASK}, skew {SKEW_ASK}",
                  height=420)
fig.show()

# %% tags=["reveal"]
small_ai = moe.grouped_gemm_traffic([n_small], D_MODEL, D_FF, getattr(torch, BENCH_DTYPE).itemsize)["intensity"][0]
reveal(bound_guess, "memory-bound" if small_ai < ridge else "compute-bound",
       why=f"{n_small} rows give {small_ai:.1f} FLOP/byte against this CPU's ridge point of {ridge:.1f}: "
           f"the expert reads its whole {D_MODEL}x{D_FF} weight once for its {n_small} rows, and the intensity grows "
           f"with the rows. Here {sum(i < ridge for i, c in zip(traffic['intensity'], traffic['counts']) if c)} of the "
           f"{sum(c > 0 for c in traffic['counts'])} non-empty experts are memory-bound. A CPU's ridge point is low; "
           "a GPU's is far higher, as the next cell computes."
           + (f" But {small_ai:.1f} lies inside the ridge point's range over the repeats ({ridge_range[0]:.1f} to "
              f"{ridge_range[1]:.1f}): which side it falls on is {bench.NOISY}."
              if ridge_range[0] <= small_ai <= ridge_range[1] else ""));

# %% [markdown]
# On a GPU the ridge point is much higher. The same arithmetic with the spec-sheet figures of an H200
# SXM, for example: 4.8 TB/s of HBM3e and 989 TFLOP/s of dense bf16 (NVIDIA lists 1,979 TFLOP/s with
# sparsity, https://www.nvidia.com/en-us/data-center/h200/), for a bf16 expert of DeepSeek-like width
# `[n, 2048] x [2048, 1408]`. Computed, not measured: the rows per expert below which such an expert
# GEMM cannot be compute-bound. That is why, for decode and small batches, the bar for a grouped GEMM
# is the weight bandwidth, not a fraction of the dense GEMM's FLOP rate.

# %%
H200_BF16_FLOPS, H200_BANDWIDTH = 989e12, 4.8e12       # NVIDIA's H200 SXM spec sheet (dense bf16, HBM3e)
gpu_ridge = H200_BF16_FLOPS / H200_BANDWIDTH
K_GPU, N_GPU = 2048, 1408

def gpu_intensity(rows):
    return moe.grouped_gemm_traffic([rows], K_GPU, N_GPU, 2)["intensity"][0]

rows_needed = next(n for n in range(1, 10**5) if gpu_intensity(n) >= gpu_ridge)
print(f"H200 ridge point: {gpu_ridge:.0f} FLOP/byte; a bf16 [n, {K_GPU}] x [{K_GPU}, {N_GPU}] expert GEMM is "
      f"memory-bound below {rows_needed} rows per expert (this CPU's ridge: {ridge:.1f} FLOP/byte)")

# %% [markdown]
# ### Your turn: batch enough tokens
#
# A model serves a batch of `BATCH_TOKENS` tokens, top-2 routing over 64 experts, evenly spread: each
# expert gets `BATCH_TOKENS × 2 / 64` rows. Change `BATCH_TOKENS` to the smallest power of two for which
# every expert GEMM of the H200 example above is compute-bound, then run the check.

# %% tags=["your-turn"]
BATCH_TOKENS = 256        # change this number

# %%
from helpers.checks import fail, your_turn


def check_batch():
    if BATCH_TOKENS < 1 or BATCH_TOKENS & (BATCH_TOKENS - 1):
        fail(f"{BATCH_TOKENS} tokens", "not a power of two", "serving batches here come in powers of two: "
             "1, 2, 4, ... (BATCH_TOKENS & (BATCH_TOKENS - 1) == 0)")
    rows = BATCH_TOKENS * 2 // 64
    if gpu_intensity(rows) < gpu_ridge:
        fail(f"{BATCH_TOKENS} tokens", f"{rows} rows per expert give {gpu_intensity(rows):.0f} FLOP/byte, under "
             f"the ridge of {gpu_ridge:.0f}: memory-bound", "each row adds FLOPs while the weight's bytes stay "
             "the same: which way must the batch move?")
    if gpu_intensity(rows // 2) >= gpu_ridge:
        fail(f"{BATCH_TOKENS} tokens", "half this batch is compute-bound too", "look for the smallest power of two")


your_turn(check_batch, what="batch enough tokens");

# %% [markdown]
# ## Try it: how much work does padding waste?
#
# Arithmetic only: move the sliders to see the rows per expert and the work padded `bmm` does.

# %%
import ipywidgets as widgets

from helpers.interactive import interact

def padding_waste(experts=8, skew=1.0):
    c = moe.skewed_counts(ROWS, experts, skew)
    print(f"{experts} experts, skew {skew}: padded bmm does {experts * int(c.max()) / ROWS:.1f}x the rows; "
          f"{int((c == 0).sum())} experts get no rows")
    for e, n in enumerate(c.tolist()[:16]):
        print(f"expert {e:>2} {'#' * round(40 * n / int(c.max())):<40} {n}")

interact(padding_waste, experts=widgets.IntSlider(value=8, min=2, max=64, step=2),
         skew=widgets.FloatSlider(value=1.0, min=0.0, max=4.0, step=0.25));

# %% [markdown]
# ## Going further
#
# [The deep dive](03_grouped_gemm_moe_deep_dive.ipynb) is for whoever trains or serves an MoE on a GPU:
# a skewed router plotted beside a fresh one, capacity factors and token dropping; the backward (two
# more grouped GEMMs, one 2D × 2D) and a training step measured; routing's host synchronisations and a
# sync-free alternative; a Triton grouped GEMM with a host-built tile list, then a persistent kernel
# that reads `offs` on the device; which path runs on NVIDIA (CUTLASS on sm_90/sm_100), ROCm (the
# fallback, and CK when you opt in) and XPU, profiled and timed on NVIDIA and AMD GPUs where they are;
# what production adds (per-group M alignment, FP8 grouped GEMM, expert parallelism, the `data_ptr % 16`
# rule); and the pitfalls, each run, starting with the three that cost the most (int32 END offsets that
# torch does not check, the uninitialised rows past `offs[-1]`, 16-byte row strides). Then
# [lab 03](../labs/03_moe_lab.ipynb): write the permutation and the fallback loop yourself and measure
# an expert FFN against padding.
