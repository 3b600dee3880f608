# %% [markdown]
# # 03 · Grouped GEMM for mixture-of-experts: the fallback, padding, `F.grouped_mm` and a Triton kernel
#
# | | |
# |---|---|
# | **What you will learn** | how an MoE layer turns routing into ragged groups (top-k router → token permutation → int32 offsets → grouped GEMM → unpermute and combine); four ways to run the expert GEMMs (a loop of GEMMs, padded `bmm`, `torch.nn.functional.grouped_mm`, a Triton kernel) checked against one reference; how fast each is against a dense GEMM with the same FLOPs, as the number of experts and the skew change; the backward pass (two more grouped GEMMs, one of them 2D × 2D) and a training step measured; capacity factor and token dropping; the host synchronisations in routing and a sync-free alternative; a roofline of the grouped GEMM against this machine's measured limits; how Triton's tutorial and Inductor schedule tiles on the device; which path PyTorch 2.10 takes on ROCm (regular-GEMM fallback, or Composable Kernel with `ROCM_ALLOW_GROUP_GEMM_CK=1`), on NVIDIA sm90+ (CUTLASS) and on CPU; the gotchas of `grouped_mm`, each run and explained |
# | **Prerequisites** | lesson 00; matrix multiplication; what a mixture-of-experts layer is (a router sends each token to k of E expert MLPs) |
# | **Hardware** | any CPU (all of it runs: the Triton kernel runs in Triton's interpreter). On a GPU, sections for the CUTLASS path (NVIDIA sm90+), the ROCm fallback and CK paths (AMD) and Triton's real speed also run |
# | **Time** | 75 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the ROCm and CUDA paths are described from PyTorch's source (`GroupedBlas.cpp`, `GroupedMMUtils.h`) and the 2.10 release notes, and run only where that hardware is |
#
# **card → parameters → device → idea → code → check → measure → plot → what the numbers mean →
# other hardware → pitfalls.**

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
import os

from helpers.device import capabilities, pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
if DEVICE.type == "cpu":
    # Triton reads this when kernels are defined: it must be set before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from helpers import bench, moe

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
# keeps the top k; each token then goes through k experts and the outputs are summed with the router's
# weights (the *gates*). Each expert sees a different number of tokens, so the expert GEMMs are
# **ragged**: `[n_e, K] @ [K, N]` for e = 0..E-1, with `sum(n_e) = tokens × k`.
#
# The standard way to run them: sort the (token, choice) pairs by expert (**permute**), so each
# expert's rows are contiguous, and describe the groups by **offsets**: `offs[e]` is the row where
# expert e's rows *end*, as `int32`. Then one grouped GEMM computes every expert at once, and
# **unpermute** puts the rows back in token order and combines them with the gates.
#
# `helpers.moe` has each step as a small function: `route`, `permute`, `offsets_from_counts`,
# `unpermute`.

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
# "hot" experts get many tokens, some get none (load-balancing losses exist to fight this). We make a
# skewed router by raising one expert's logits and plot both.

# %%
hot = torch.zeros(EXPERTS)
hot[0], hot[1] = 2.0, 1.0
ids_skewed, _ = moe.route(x @ params["router"] + hot, TOP_K)
counts_skewed = torch.bincount(ids_skewed.reshape(-1), minlength=EXPERTS)
fig = go.Figure([go.Bar(name="fresh router", x=list(range(EXPERTS)), y=counts.tolist()),
                 go.Bar(name="skewed router (+2, +1 on experts 0, 1)", x=list(range(EXPERTS)), y=counts_skewed.tolist())])
fig.update_layout(title=f"Tokens per expert ({TOKENS} tokens, top-{TOP_K})", xaxis_title="expert",
                  yaxis_title="routed rows", barmode="group", height=360)
fig.show()

# %% [markdown]
# ## Capacity factor and token dropping
#
# Many MoE models give each expert a fixed number of slots, its **capacity**: the capacity factor
# times its fair share of the routed rows, `capacity = ceil(factor × tokens × k / E)` (Switch
# Transformer, https://arxiv.org/abs/2101.03961; GShard, https://arxiv.org/abs/2006.16668, for top-2).
# Rows beyond an expert's capacity are **dropped**: the layer gives them zero and the token's residual
# connection carries it past the layer. Slots go to every token's first choice before any second
# choice, then in token order, as in GShard. A fixed capacity buys static shapes (an
# `[E, capacity, d]` buffer and one `bmm`, which CUDA graphs and `torch.compile` like) at the price of
# dropped tokens, and of padding work when experts are below capacity. *Dropless* MoE computes every
# routed row instead: MegaBlocks' block-sparse kernels (https://arxiv.org/abs/2211.15841) and grouped
# GEMMs like this lesson's.
#
# `moe.expert_capacity` and `moe.within_capacity` compute it on the device (a cumulative count per
# expert, no host synchronisation). The dropped fraction against the capacity factor, for the two
# routers above:

# %%
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)
routers = {"fresh": ids, "skewed": ids_skewed}
dropped = {name: [] for name in routers}
for factor in FACTORS:
    capacity = moe.expert_capacity(TOKENS, TOP_K, EXPERTS, factor)
    for name, routed in routers.items():
        keep = moe.within_capacity(routed, EXPERTS, capacity)
        assert int(moe.expert_counts(routed[keep], EXPERTS).max()) <= capacity, "an expert over its slots"
        dropped[name].append(1 - keep.float().mean().item())
print(f"{'capacity factor':<24}" + "".join(f"{f:>7}" for f in FACTORS))
print(f"{'slots per expert':<24}" + "".join(f"{moe.expert_capacity(TOKENS, TOP_K, EXPERTS, f):>7}" for f in FACTORS))
for name, fractions in dropped.items():
    print(f"{'dropped, ' + name + ' router':<24}" + "".join(f"{100 * d:>6.1f}%" for d in fractions))
keep = moe.within_capacity(ids_skewed, EXPERTS, moe.expert_capacity(TOKENS, TOP_K, EXPERTS, 1.0))
print(f"skewed router at factor 1.0: {100 * (1 - keep[:, 0].float().mean()):.1f}% of first choices dropped, "
      f"{100 * (1 - keep[:, 1].float().mean()):.1f}% of second choices (first choices are served first)")
fig = go.Figure([go.Scatter(x=FACTORS, y=[100 * d for d in fractions], mode="lines+markers", name=f"{name} router")
                 for name, fractions in dropped.items()])
fig.update_layout(title=f"Routed rows dropped vs capacity factor ({TOKENS} tokens, top-{TOP_K}, {EXPERTS} experts)",
                  xaxis_title="capacity factor", yaxis_title="% of routed rows dropped", height=360)
fig.show()

# %% [markdown]
# ## Check: the pieces compose, and every implementation agrees with one reference
#
# Four implementations of the expert GEMM, each with the same arguments `(xs [M, K], w [E, K, N],
# offs int32 [E])`:
#
# - **`loop_gemm`**: one `mm` per expert on its slice of rows: the "regular GEMM fallback" (this is
#   literally what PyTorch's `_grouped_mm_fallback` does on CPU and, in 2.10, on ROCm). The reference.
# - **`padded_bmm`**: pad every expert to the busiest expert's count, one `bmm`, gather the real rows.
# - **`grouped_gemm`**: `F.grouped_mm(xs, w, offs=offs)` after input checks (below).
# - **`triton_gemm`**: a Triton kernel: one program per (tile of 32 rows of one expert, 32 columns),
#   with the tiles listed on the host, so an empty expert launches nothing.
#
# All four return `[M, N]`; rows past `offs[-1]`, which no expert owns, are zeros (pitfall 9).
#
# First the permutation itself: un-permuting the permuted tokens with all gates gives back each token
# times the sum of its gates (which is 1).

# %% tags=["nbval-check-output"]
small = moe.make_moe(32, 64, 6, seed=1)
xt = torch.randn(40, 32, generator=torch.Generator().manual_seed(1))
ids_t, gates_t = moe.route(xt @ small["router"], 2)
xs_t, order_t, offs_t = moe.permute(xt, ids_t, 6)
assert torch.allclose(moe.unpermute(xs_t, order_t, gates_t), xt, atol=1e-6), "permute/unpermute lost tokens"
assert int(offs_t[-1]) == 40 * 2 and offs_t.dtype == torch.int32
print("permute -> unpermute restores every token:", True, "| routed rows:", int(offs_t[-1]), "| offsets dtype:", offs_t.dtype)

# %% tags=["nbval-check-output"]
counts_t = moe.skewed_counts(70, 8, 3.0)       # skewed, with empty experts
offs_c = moe.offsets_from_counts(counts_t)
g = torch.Generator().manual_seed(0)
xs_c, w_c = torch.randn(70, 32, generator=g), torch.randn(8, 32, 48, generator=g)
reference = moe.loop_gemm(xs_c, w_c, offs_c)
print("tokens per expert:", counts_t.tolist())
for name in ("padded_bmm", "grouped_mm"):
    out = moe.IMPLEMENTATIONS[name](xs_c, w_c, offs_c)
    assert torch.allclose(out, reference, atol=1e-4), name
    print(f"{name:<11} matches the loop reference: True, shape {tuple(out.shape)}")

# %% [markdown]
# The Triton kernel. On a CPU, Triton's interpreter runs it (slowly, with NumPy: it is for
# correctness, never timed). On an NVIDIA, AMD or Intel GPU the same kernel is compiled.
#
# A finding with the Triton versions of this collection's environments (3.6 and 3.9): the
# interpreter's `tl.dot` returns garbage for bf16 tiles (errors of order 1e10 on a 16-by-16 product,
# where fp32 and fp16 tiles are right). The kernel therefore converts tiles to fp32 before `tl.dot`
# when it runs in the interpreter (`UPCAST`), and uses the native dtype on a GPU.

# %%
import inspect
print(inspect.getsource(moe._triton_kernel))

# %%
if requires("triton", section="Triton grouped GEMM: correctness"):
    where = "compiled for " + DEVICE.type if DEVICE.type != "cpu" else "in Triton's interpreter (TRITON_INTERPRET=1)"
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 0.25)):
        out = moe.triton_gemm(xs_c.to(DEVICE, dtype), w_c.to(DEVICE, dtype), offs_c.to(DEVICE))
        err = (out.float().cpu() - reference).abs().max().item()
        assert err < tol, f"Triton kernel differs from the loop reference by {err} in {dtype}"
        print(f"Triton kernel {where}, {dtype}: matches the loop reference (max abs error {err:.2g})")
    buffer = torch.cat([xs_c, torch.ones(9, xs_c.shape[1])])          # 9 rows past offs[-1], owned by no expert
    out = moe.triton_gemm(buffer.to(DEVICE), w_c.to(DEVICE), offs_c.to(DEVICE)).cpu()
    assert torch.allclose(out, moe.loop_gemm(buffer, w_c, offs_c), atol=1e-3) and not out[70:].any()
    print(f"Triton kernel {where}, 9 rows past offs[-1]: zeros there, as the other three implementations give")

# %% [markdown]
# ## The MoE layer, forward and backward
#
# `moe.moe_layer(x, params, k, impl)` runs the whole layer (router → permute → up-projection → GELU →
# down-projection → unpermute) with any of the implementations. `loop`, `padded_bmm` and `grouped_mm`
# are differentiable (`grouped_mm` has autograd on CPU); the Triton kernel here is forward-only.

# %% tags=["nbval-check-output"]
results = {}
for impl in ("loop", "padded_bmm", "grouped_mm"):
    p = moe.make_moe(32, 64, 6, seed=1, requires_grad=True)
    xg = xt.clone().requires_grad_()
    y = moe.moe_layer(xg, p, k=2, impl=impl)
    y.square().mean().backward()
    results[impl] = (y.detach(), xg.grad, p["w_up"].grad, p["w_down"].grad, p["router"].grad)
for impl in ("padded_bmm", "grouped_mm"):
    for a, b in zip(results[impl], results["loop"]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), impl
    print(f"{impl:<11}: output and all five gradients match the loop reference")

# %% [markdown]
# ### The backward pass is two more grouped GEMMs
#
# For `Y = grouped_mm(X, W, offs)`, expert e computes `Y_e = X_e W_e` on its rows, so its gradients are
# `dX_e = dY_e W_eᵀ` and `dW_e = X_eᵀ dY_e`. Both are grouped GEMMs over the same offsets:
#
# - `dX = grouped_mm(dY, Wᵀ, offs)`: the forward's 2D × 3D form, each expert's weight transposed;
# - `dW = grouped_mm(Xᵀ, dY, offs)`: the **2D × 2D** form (pitfall 4), where the groups run along the
#   contracted dimension (the rows) and each group gives one `[K, N]` weight gradient. An expert
#   without rows gets zeros.
#
# `_grouped_mm`'s entry in PyTorch's `tools/autograd/derivatives.yaml` calls
# `_grouped_mm_mat1_backward` and `_grouped_mm_mat2_backward`. The next cell logs the `_grouped_mm`
# calls that torch's backward dispatches (`moe.grouped_mm_calls`, a dispatch mode), then checks
# `moe.grouped_gemm_input_grad` and `moe.grouped_gemm_weight_grad` (the backward of
# `moe.grouped_gemm`) against torch's autograd and against autograd through the loop.

# %%
xb, wb = xs_c.clone().requires_grad_(), w_c.clone().requires_grad_()
yb = F.grouped_mm(xb, wb, offs=offs_c)
dy = torch.randn(yb.shape, generator=torch.Generator().manual_seed(2))
for call in moe.grouped_mm_calls(lambda: yb.backward(dy)):
    print(f"torch's backward dispatched _grouped_mm {call['form']}: {call['a']} x {call['b']} -> {call['out']}")

# %% tags=["nbval-check-output"]
xl, wl = xs_c.clone().requires_grad_(), w_c.clone().requires_grad_()
moe.loop_gemm(xl, wl, offs_c).backward(dy)
dx = moe.grouped_gemm_input_grad(w_c, offs_c, dy)
dw = moe.grouped_gemm_weight_grad(xs_c, offs_c, dy)
for name, mine, by_torch, by_loop in (("dX", dx, xb.grad, xl.grad), ("dW", dw, wb.grad, wl.grad)):
    assert torch.allclose(mine, by_loop, atol=1e-4) and torch.allclose(by_torch, by_loop, atol=1e-4), name
    print(f"{name} {tuple(mine.shape)}: the grouped GEMM = torch's autograd = autograd through the loop")
no_rows = counts_t == 0
assert torch.equal(dw[no_rows], torch.zeros_like(dw[no_rows]))
print(f"the {int(no_rows.sum())} experts without rows get a zero weight gradient")

# %% [markdown]
# ### A training step, measured
#
# The backward does twice the forward's GEMM FLOPs (dX and dW), so the expert GEMMs of a training step
# cost about three forwards; the router, the permutation and the GELU add their own share. The whole
# layer (`moe.moe_layer`, the sizes of this lesson), forward alone and forward plus backward, for the
# three differentiable implementations, measured side by side:

# %%
layer = moe.make_moe(D_MODEL, D_FF, EXPERTS, seed=0, requires_grad=True)
x_train = torch.randn(TOKENS, D_MODEL, generator=torch.Generator().manual_seed(4))

def forward(impl):
    return moe.moe_layer(x_train, layer, k=TOP_K, impl=impl)

def train_step(impl):
    for p in layer.values():
        p.grad = None
    forward(impl).square().mean().backward()

candidates = {}
for impl in ("loop", "padded_bmm", "grouped_mm"):
    candidates[f"{impl} forward"] = lambda impl=impl: forward(impl)
    candidates[f"{impl} forward+backward"] = lambda impl=impl: train_step(impl)
step = bench.compare(candidates, baseline="grouped_mm forward+backward", threads=THREADS, device="cpu",
                     repeats=3 if QUICK else 5, min_run_time=0.01 if QUICK else 0.05)
print(bench.table(step))
times = {name: r["median_s"] for name, r in step["results"].items()}
for impl in ("loop", "padded_bmm", "grouped_mm"):
    print(f"{impl:<11}: forward+backward takes {times[impl + ' forward+backward'] / times[impl + ' forward']:.1f}x "
          f"its forward; training step {times[impl + ' forward+backward'] / times['grouped_mm forward+backward']:.2f}x grouped_mm's")

# %% [markdown]
# ## Measure: every implementation against a dense GEMM with the same FLOPs
#
# The reference is the **dense GEMM with the same FLOPs** (`[M, K] @ [K, N]`): one big problem instead
# of E smaller ones, reading one weight instead of E. It is usually faster, though not a law (tile
# shapes and wave quantisation can make an awkward dense shape lose to a grouped one), and it is not a
# hardware bound: the roofline section below computes that. We report each implementation's GFLOP/s as
# a percentage of the dense GEMM's, measured side by side in the same run (`helpers.bench.compare`,
# interleaved, median of repeats).
#
# The skew: expert i gets a share of tokens proportional to `(i+1)^-skew` (`moe.skewed_counts`):
# skew 0 is uniform, skew 3 puts most rows on expert 0 and leaves some experts empty.

# %%
EXPERT_COUNTS = (4, 16) if QUICK else (4, 8, 16, 32)
SKEWS = (0.0, 2.0) if QUICK else (0.0, 0.75, 1.5, 3.0)
ROWS = TOKENS * TOP_K
runs = []
for e in EXPERT_COUNTS:
    for skew in SKEWS:
        run = moe.measure_split(moe.skewed_counts(ROWS, e, skew), D_MODEL, D_FF, threads=THREADS,
                                dtype=getattr(torch, BENCH_DTYPE),
                                repeats=3, min_run_time=0.01 if QUICK else 0.05)
        runs.append({"skew": skew, **run})
        print(f"E={e:>2} skew={skew:<4} max/mean rows={max(run['counts']) * e / ROWS:4.1f}  dense "
              f"{run['gflops']['dense']:6.1f} GFLOP/s  | % of dense: " +
              "  ".join(f"{name} {100 * v:5.0f}%" for name, v in run["vs_dense"].items() if name != "dense"))
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

# %% [markdown]
# ### The targets, checked on what was just measured
#
# The collection sets two targets for this lesson on skewed splits: the grouped GEMM at a fraction of
# the dense GEMM's throughput, and at a multiple of padded `bmm`'s. The next cell prints both targets
# and, from the runs above, whether this machine reached them, with the time per call. In quick mode
# the problems are tiny and timer noise dominates: read the full-mode run. The roofline section below
# says when the dense fraction is reachable at all.

# %%
TARGET_VS_DENSE, TARGET_VS_PADDED = 0.9, 2.0
print(f"targets: grouped_mm >= {TARGET_VS_DENSE}x the dense GEMM's GFLOP/s, >= {TARGET_VS_PADDED}x padded bmm's")
skewed = [r for r in runs if r["skew"] >= 1.5]
for r in skewed:
    vs_dense = r["vs_dense"]["grouped_mm"]
    vs_padded = r["gflops"]["grouped_mm"] / r["gflops"]["padded_bmm"]
    print(f"E={r['experts']:>2} skew={r['skew']}: grouped_mm = {vs_dense:.2f}x dense "
          f"({'reached' if vs_dense >= TARGET_VS_DENSE else 'NOT reached'}), {vs_padded:.1f}x padded bmm "
          f"({'reached' if vs_padded >= TARGET_VS_PADDED else 'NOT reached'}); padded bmm does "
          f"{r['padded_rows'] / r['rows']:.1f}x the rows; grouped_mm {r['median_s']['grouped_mm'] * 1e6:.0f} us per call")

# %% [markdown]
# ## What the numbers mean
#
# - **`grouped_mm` on CPU is the loop.** `_grouped_mm_fallback` (in `aten/src/ATen/native/GroupedMMUtils.h`)
#   copies the offsets to the host and calls `mm_out` once per group. Its throughput follows the loop's:
#   close to dense when every group is large, lower when many groups are small (a GEMM with few rows
#   cannot use the machine as well as one big GEMM). Where it runs ahead of the Python loop it saves
#   the Python overhead and the final `torch.cat` (it writes each group's result in place).
# - **Padded `bmm` does `E × max(n_e)` rows of work** instead of `sum(n_e)`. With uniform routing that
#   is barely more, and one batched call competes with the loop of GEMMs (compare the two at skew 0
#   above): **padding can win only when the split is nearly even**. With a fixed capacity per expert
#   instead of the busiest expert's count (the capacity section above), its shapes are static, which
#   suits CUDA graphs and `torch.compile`. With skew, the busiest
#   expert sets the padded size and most of the work is multiplying zeros: **padding loses by roughly
#   the padding factor** printed above, and it also costs the memory of the padded copy.
# - **The dense GEMM is the reference**, not a competitor: an MoE layer exists to do *less* work than
#   the dense layer with the same parameters. The grouped GEMM's job is to lose as little as possible
#   to the raggedness.
# - The dense-fraction target is reachable only when groups are big enough for each `mm` to run near
#   peak; on skewed splits with many experts the small tail groups pull the average down, and the
#   roofline below shows why: they are memory-bound. Read the target lines above for what this machine
#   did; timings on a shared machine vary from run to run (every table here shows the spread of the
#   repeats), the ratios less.

# %% [markdown]
# ## A roofline for the grouped GEMM
#
# A roofline is a hardware bound: a kernel that does F FLOPs and must move B bytes takes at least
# `max(F / peak, B / bandwidth)`. F / B is its **arithmetic intensity**; below the machine's ridge point
# (peak / bandwidth) it is memory-bound. Per expert, `[n_e, K] @ [K, N]` does `2·n_e·K·N` FLOPs and moves
# at least its rows, its whole `K × N` weight and its output. The grouped GEMM reads **E weights**
# where the dense GEMM with the same FLOPs reads one, so its intensity is lower; and an expert with
# few rows is memory-bound however good the kernel: with `K, N ≫ n_e` its intensity is about `n_e`
# FLOPs per weight element (`n_e` FLOP/byte in bf16, `n_e / 2` in fp32).
#
# The next cell computes each expert's FLOPs, bytes and intensity for the most skewed split with the
# most experts measured above, and holds them against this machine's limits measured here
# (`helpers.bench`: fp32 GEMM peak and read bandwidth, at the benchmark's thread count; the peak is the higher of a
# square GEMM and the dense GEMM measured above, since a limit measured on a busy machine is a
# measurement too).

# %%
limits = (bench.measure_limits(THREADS, quick=True, device="cpu") if QUICK
          else bench.machine_limits(THREADS, device="cpu"))
run = max(runs, key=lambda r: (r["experts"], r["skew"]))
# a limit is a measurement too: on a busy machine the square GEMM can come out below the dense GEMM above
peak = max(limits["fp32_gemm_gflops"], run["gflops"]["dense"]) * 1e9
bandwidth = limits["read_bandwidth_gbs"] * 1e9
ridge = peak / bandwidth
traffic = moe.grouped_gemm_traffic(run["counts"], run["k"], run["n"], getattr(torch, BENCH_DTYPE).itemsize)
print(f"this CPU, {THREADS} thread(s): square fp32 GEMM {limits['fp32_gemm_gflops']:.1f} GFLOP/s, the dense GEMM above "
      f"{run['gflops']['dense']:.1f}: peak taken as {peak / 1e9:.1f} GFLOP/s; read {bandwidth / 1e9:.1f} GB/s, "
      f"ridge point {ridge:.1f} FLOP/byte" + ("" if BENCH_DTYPE == "float32" else f" (fp32 peak; the run is {BENCH_DTYPE})"))
print(f"E={run['experts']} skew={run['skew']}, [{run['rows']} rows, {run['k']}] x [E, {run['k']}, {run['n']}], {BENCH_DTYPE}:")
for e, (rows, intensity) in enumerate(zip(traffic["counts"][:16], traffic["intensity"])):
    print(f"  expert {e:>2}: {rows:>5} rows, {intensity:6.1f} FLOP/byte, {'memory' if intensity < ridge else 'compute'}-bound")
grouped_ai = traffic["total_flops"] / traffic["total_bytes"]
print(f"bytes moved: grouped {traffic['total_bytes'] / 1e6:.2f} MB vs dense {traffic['dense_bytes'] / 1e6:.2f} MB "
      f"({traffic['total_bytes'] / traffic['dense_bytes']:.1f}x); intensity {grouped_ai:.1f} vs {traffic['dense_intensity']:.1f} FLOP/byte")
bounds = {"grouped_mm": moe.roofline_seconds(traffic["flops"], traffic["bytes"], peak, bandwidth),
          "dense": moe.roofline_seconds([traffic["total_flops"]], [traffic["dense_bytes"]], peak, bandwidth)}
for name, bound in bounds.items():
    measured = run["median_s"][name]
    print(f"{name:<10}: roofline bound {bound * 1e6:9.1f} us, measured {measured * 1e6:9.1f} us "
          f"({100 * bound / measured:.0f}% of the bound reached)")

# %%
span = [min(0.5, min(i for i in traffic["intensity"] if i > 0) / 2), max(4 * ridge, 2 * traffic["dense_intensity"])]
grid = [span[0] * (span[1] / span[0]) ** (i / 60) for i in range(61)]
fig = go.Figure(go.Scatter(x=grid, y=[min(peak, a * bandwidth) / 1e9 for a in grid], mode="lines",
                           name="roofline: min(peak, intensity x bandwidth)", line_color="gray"))
groups = [(a, c) for a, c in zip(traffic["intensity"], traffic["counts"]) if c]
fig.add_trace(go.Scatter(x=[a for a, _ in groups], y=[min(peak, a * bandwidth) / 1e9 for a, _ in groups],
                         mode="markers", name="each expert's bound", text=[f"{c} rows" for _, c in groups]))
for name, intensity in (("grouped_mm", grouped_ai), ("dense", traffic["dense_intensity"])):
    fig.add_trace(go.Scatter(x=[intensity], y=[run["gflops"][name]], mode="markers", marker_size=12,
                             marker_symbol="diamond", name=f"{name}, measured"))
fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP/byte)")
fig.update_yaxes(type="log", title_text="GFLOP/s")
fig.update_layout(title=f"Roofline of this CPU ({THREADS} thread(s)) and the expert GEMMs of E={run['experts']}, "
                        f"skew {run['skew']}", height=420)
fig.show()

# %% [markdown]
# On a GPU the ridge point is much higher. The next cell does the same arithmetic with the spec-sheet
# figures of an H200 SXM, for example: 4.8 TB/s of HBM3e and 989 TFLOP/s of dense bf16 (NVIDIA lists
# 1,979 TFLOP/s with sparsity, https://www.nvidia.com/en-us/data-center/h200/), for the GPU sections'
# bf16 expert shape. It is computed, not measured: the rows per expert below which an expert GEMM
# cannot be compute-bound on such a GPU. That is why, for decode and small batches, the bar for a
# grouped GEMM is the weight bandwidth, not a fraction of the dense GEMM's FLOP rate.

# %%
H200_BF16_FLOPS, H200_BANDWIDTH = 989e12, 4.8e12       # NVIDIA's H200 SXM spec sheet (dense bf16, HBM3e)
gpu_ridge = H200_BF16_FLOPS / H200_BANDWIDTH
K_GPU, N_GPU = 2048, 1408                               # the GPU sections' expert GEMM
rows_needed = next(n for n in range(1, 10**5)
                   if moe.grouped_gemm_traffic([n], K_GPU, N_GPU, 2)["intensity"][0] >= gpu_ridge)
print(f"H200 ridge point: {gpu_ridge:.0f} FLOP/byte; a bf16 [n, {K_GPU}] x [{K_GPU}, {N_GPU}] expert GEMM is "
      f"memory-bound below {rows_needed} rows per expert")
print(f"this CPU's ridge point for comparison: {ridge:.1f} FLOP/byte (fp32)")

# %% [markdown]
# ## bf16 or fp32 on this CPU?
#
# A CPU with bf16 dot-product instructions (AVX512-BF16, AMX) multiplies bf16 natively; one without
# them converts each bf16 value in software, and bf16 matmuls can then be much slower than fp32. The
# device layer's `bf16` flag says which kind this CPU is. Measured here, side by side, and read by the
# cell:

# %%
k_, n_ = D_MODEL, D_FF
a32, b32 = torch.randn(ROWS, k_), torch.randn(k_, n_)
split = moe.skewed_counts(ROWS, EXPERTS, 1.0)
offs_s = moe.offsets_from_counts(split)
w32 = torch.randn(EXPERTS, k_, n_)
a16, b16, w16 = a32.bfloat16(), b32.bfloat16(), w32.bfloat16()
dtype_result = bench.compare({"dense fp32": lambda: a32 @ b32, "dense bf16": lambda: a16 @ b16,
                              "grouped_mm fp32": lambda: F.grouped_mm(a32, w32, offs=offs_s),
                              "grouped_mm bf16": lambda: F.grouped_mm(a16, w16, offs=offs_s)},
                             baseline="dense fp32", threads=THREADS, repeats=3 if QUICK else 5,
                             min_run_time=0.02 if QUICK else 0.05, work=moe.gemm_gflop(ROWS, k_, n_), device="cpu")
print(f"CPU: {caps.cpu_name} · vector ISA seen by the device layer: {caps.arch} · native bf16: {caps.bf16}")
print(bench.table(dtype_result))
speed = {name: r["median_s"] for name, r in dtype_result["results"].items()}
dense_gain, grouped_gain = (speed["dense fp32"] / speed["dense bf16"], speed["grouped_mm fp32"] / speed["grouped_mm bf16"])
print(f"bf16 vs fp32 on this CPU: the dense GEMM is {dense_gain:.2f}x as fast in bf16, grouped_mm {grouped_gain:.2f}x: "
      f"bf16 is {'faster' if dense_gain > 1 else 'slower'} here (native bf16 according to the device layer: {caps.bf16})")
bench.plot(dtype_result, title="fp32 vs bf16, dense and grouped (same FLOPs)").show()

# %% [markdown]
# The last line reads this run's numbers. `grouped_mm` follows the dense GEMM's dtype behaviour
# (the two ratios are close) because on CPU it *is* a loop of the same `mm`. Where bf16 came out
# faster, rerun the benchmark above with `BENCH_DTYPE = "bfloat16"`; compare the spreads of the two
# dtypes in the table too.
#
# ## Try it: how much work does padding waste?
#
# No timing here, just arithmetic: move the sliders to see the rows per expert and the work padded
# `bmm` does relative to the real rows.

# %%
import ipywidgets as widgets

from helpers.interactive import interact

def padding_waste(experts=8, skew=1.0):
    c = moe.skewed_counts(ROWS, experts, skew)
    print(f"{experts} experts, skew {skew}: padded bmm does {experts * int(c.max()) / ROWS:.1f}x the rows; "
          f"{int((c == 0).sum())} experts get no rows")
    for e, n in enumerate(c.tolist()[:16]):
        print(f"expert {e:>2} {'#' * round(40 * n / int(c.max())):<40} {n}")
    if experts > 16:
        print(f"... and {experts - 16} more experts with {int(c[16:].sum())} rows between them")

interact(padding_waste, experts=widgets.IntSlider(value=8, min=2, max=64, step=2),
                 skew=widgets.FloatSlider(value=1.0, min=0.0, max=4.0, step=0.25));


# %% [markdown]
# ## What changes on other hardware: which path runs where
#
# `torch.nn.functional.grouped_mm(mat_a, mat_b, *, offs=None, bias=None, out_dtype=None)` (public in
# 2.10; `torch._grouped_mm` is the private op underneath) dispatches per device:
#
# | where | path | verified here? |
# |---|---|---|
# | CPU | `_grouped_mm_fallback`: a loop of `mm_out` (fp32, bf16, fp16) | yes, every cell above |
# | NVIDIA sm90/sm100 (2.10 adds sm_110, Jetson Thor: #164836), inputs and output bf16 | fused CUTLASS grouped kernel (`bf16bf16_grouped_mm`), no host sync | runs in the `grouped_mm_cutlass` section below, on such a GPU (the capability admits compute capability 9.x and 10.x, the check `_grouped_mm_cuda` makes) |
# | NVIDIA otherwise (fp32 or fp16 inputs, older GPUs) | the fallback loop, which copies `offs` to the host (a device-to-host sync) | the `grouped_mm_cutlass` section times fp32 next to bf16; sm_120 (RTX 50xx) takes this loop for bf16 too |
# | AMD ROCm, 2.10 default | the regular-GEMM fallback (#162419) | `rocm` section below |
# | AMD gfx942/gfx950 with `ROCM_ALLOW_GROUP_GEMM_CK=1` | Composable Kernel grouped GEMM (#166334; opt-in since #170159 because it was not yet faster) | `rocm_ck` section below |
# | ROCm builds without CK (e.g. Windows ROCm) | always the fallback | – |
#
# What is verified where: the CPU rows on this machine; the GPU rows are read from PyTorch's
# `GroupedBlas.cpp` and the 2.10 release notes, and the sections below measure them when they run on
# such a GPU (on this CPU they are skipped and say so).

# %%
def gpu_problem(dtype, experts=16, skew=1.5, rows=16384, k=2048, n=1408):
    c = moe.skewed_counts(rows, experts, skew)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    xs_ = torch.randn(rows, k, device=DEVICE, generator=g).to(dtype)
    w_ = torch.randn(experts, k, n, device=DEVICE, generator=g).to(dtype)
    return xs_, w_, moe.offsets_from_counts(c).to(DEVICE), moe.gemm_gflop(rows, k, n)

if requires("grouped_mm_cutlass", section="CUTLASS grouped GEMM on NVIDIA sm_90 and sm_100"):
    for dtype in (torch.bfloat16, torch.float32):
        xs_g, w_g, offs_g, gflop = gpu_problem(dtype)
        dense_w = w_g[0].clone()
        r = bench.compare({"dense": lambda: xs_g @ dense_w, "grouped_mm": lambda: F.grouped_mm(xs_g, w_g, offs=offs_g),
                           "loop": lambda: moe.loop_gemm(xs_g, w_g, offs_g),
                           "padded_bmm": lambda: moe.padded_bmm(xs_g, w_g, offs_g)},
                          baseline="dense", device=DEVICE, work=gflop)
        path = "the CUTLASS kernel" if dtype == torch.bfloat16 else "the fallback loop (offs copied to the host)"
        print(f"{dtype} on {caps.device_name} ({caps.arch}): {path}")
        print(bench.table(r))

# %%
if requires("rocm", section="ROCm grouped GEMM: the fallback"):
    print(f"HIP {caps.hip_version}, {caps.device_name} ({caps.arch}); ROCM_ALLOW_GROUP_GEMM_CK="
          f"{os.environ.get('ROCM_ALLOW_GROUP_GEMM_CK', '(unset)')}")
    xs_g, w_g, offs_g, gflop = gpu_problem(torch.bfloat16)
    dense_w = w_g[0].clone()
    r = bench.compare({"dense": lambda: xs_g @ dense_w, "grouped_mm": lambda: F.grouped_mm(xs_g, w_g, offs=offs_g),
                       "loop": lambda: moe.loop_gemm(xs_g, w_g, offs_g)}, baseline="dense", device=DEVICE, work=gflop)
    print(bench.table(r))
    if os.environ.get("ROCM_ALLOW_GROUP_GEMM_CK") == "1":
        print("ROCM_ALLOW_GROUP_GEMM_CK=1 is set: on gfx942/gfx950 grouped_mm above took the CK kernel")
    else:
        print("Without the CK switch, grouped_mm should time like the loop: it is the same regular-GEMM fallback.")

# %% [markdown]
# The CK switch is read by ATen's global context, so the comparison runs each setting in a fresh
# Python process with the variable set or unset.

# %%
CK_SCRIPT = """
import json, torch, torch.nn.functional as F
from helpers import bench, moe
c = moe.skewed_counts(16384, 16, 1.5)
xs = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.randn(16, 2048, 1408, device="cuda", dtype=torch.bfloat16)
offs = moe.offsets_from_counts(c).cuda()
out = F.grouped_mm(xs, w, offs=offs)
err = (out.float() - moe.loop_gemm(xs, w, offs).float()).abs().max().item()
r = bench.compare({"grouped_mm": lambda: F.grouped_mm(xs, w, offs=offs)}, device="cuda",
                  work=moe.gemm_gflop(16384, 2048, 1408))
print(json.dumps({"max_err_vs_loop": err, "gflops": r["results"]["grouped_mm"]["GFLOP_per_s"]}))
"""

if requires("rocm_ck", section="ROCm Composable Kernel grouped GEMM (ROCM_ALLOW_GROUP_GEMM_CK=1)"):
    import subprocess, sys
    for ck in ("0", "1"):
        env = dict(os.environ, ROCM_ALLOW_GROUP_GEMM_CK=ck)
        done = subprocess.run([sys.executable, "-c", CK_SCRIPT], env=env, capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(moe.__file__)))
        if done.returncode:
            print(f"ROCM_ALLOW_GROUP_GEMM_CK={ck}: failed:\n{done.stderr[-1500:]}")
        else:
            print(f"ROCM_ALLOW_GROUP_GEMM_CK={ck}: {done.stdout.strip().splitlines()[-1]}")
            if done.stderr.strip():     # a warning from CK or hipBLASLt would otherwise go unseen
                print(f"  stderr: {done.stderr.strip()[-600:]}")

# %%
if requires("triton_gpu", section="Triton grouped GEMM speed on the GPU"):
    xs_g, w_g, offs_g, gflop = gpu_problem(torch.bfloat16)
    dense_w = w_g[0].clone()
    r = bench.compare({"dense": lambda: xs_g @ dense_w, "grouped_mm": lambda: F.grouped_mm(xs_g, w_g, offs=offs_g),
                       "triton": lambda: moe.triton_gemm(xs_g, w_g, offs_g, block_m=64, block_n=128, block_k=64)},
                      baseline="dense", device=DEVICE, work=gflop)
    print(bench.table(r))
    print("An untuned 64x128x64 tile with the tile list built on the host each call; see the exercises in the lab.")

# %% [markdown]
# ## Host synchronisations: what the routing waits for
#
# On a GPU, an op that needs a device value on the host (`.item()`, `int(t)`, an `if` on a tensor, an
# output whose size depends on the data) waits for every queued kernel to finish: a **host
# synchronisation**. It drains the launch queue, and a step that has one cannot be captured in a CUDA
# graph. The CUTLASS path's "no host sync" in the table above pays off only if the routing around it is
# sync-free too. In this lesson's code:
#
# - `moe.check_expert_ids` (in `permute`): `int(expert_ids.min())` and `int(expert_ids.max())`;
# - `torch.bincount`, the usual way to count tokens per expert: its CUDA kernel reads the ids' min
#   and max on the host (`aten/src/ATen/native/cuda/SummaryOps.cu`);
# - `moe.check_grouped_inputs` (in all four implementations): `int(counts.min())` and `int(offs[-1])`;
#   `grouped_gemm` reads `offs[-1]` once more to zero the rows past it;
# - `loop_gemm`'s `offs.tolist()`; `padded_bmm`'s `int(counts.max())` and `repeat_interleave` without
#   `output_size=`; the Triton wrapper's tile list (`tolist()`); and `grouped_mm`'s fallback (CPU, ROCm,
#   NVIDIA without CUTLASS), which copies `offs` to the host inside ATen.
#
# `moe.host_reads(fn)` lists the ops of the first kind that `fn` dispatches, on any device (on a CPU they
# cost nothing; the list is the point). `tolist()` and ATen's internal copies do not pass through the
# dispatcher: those are named from the code above, not counted. The sync-free alternative counts with a
# scatter-add into `zeros(E)` (`moe.expert_counts`), checked equal to `bincount`, and skips the host-side
# validation (`permute(..., validate=False)`); the capacity mask is sync-free as well.

# %%
flat_ids = ids.reshape(-1)
assert torch.equal(moe.expert_counts(ids, EXPERTS), torch.bincount(flat_ids, minlength=EXPERTS))
print("scatter-add counts equal bincount:", True)
steps = {"route (topk, softmax)": lambda: moe.route(x @ params["router"], TOP_K),
         "torch.bincount": lambda: torch.bincount(flat_ids, minlength=EXPERTS),
         "moe.permute": lambda: moe.permute(x, ids, EXPERTS),
         "moe.permute(validate=False)": lambda: moe.permute(x, ids, EXPERTS, validate=False),
         "moe.within_capacity": lambda: moe.within_capacity(ids, EXPERTS, 8),
         "moe.padded_bmm": lambda: moe.padded_bmm(xs, params["w_up"], offs),
         "moe.grouped_gemm": lambda: moe.grouped_gemm(xs, params["w_up"], offs),
         "F.grouped_mm": lambda: F.grouped_mm(xs, params["w_up"], offs=offs)}
for name, fn in steps.items():
    reads = moe.host_reads(fn)
    print(f"{name:<28} {len(reads)} host reads {', '.join(reads)}")
assert moe.host_reads(steps["moe.permute(validate=False)"]) == []
print("F.grouped_mm shows none: its fallback's copy of offs happens inside ATen, below the dispatcher")

# %% [markdown]
# ## How production kernels schedule the tiles
#
# This lesson's Triton kernel gets its work list from the host: `triton_gemm` reads the offsets
# (`tolist()`), builds one entry per (expert, block of rows) in Python, copies the list to the device
# and launches one program per entry. That is a host synchronisation and a copy on every call, and the
# grid changes with the routing. The peers schedule on the device:
#
# - **Triton's grouped GEMM tutorial** (`python/tutorials/08-grouped-gemm.py`,
#   https://github.com/triton-lang/triton/blob/main/python/tutorials/08-grouped-gemm.py) launches a
#   fixed grid of `NUM_SM` programs (autotuned). Each program walks the groups, computes each group's
#   tile count from sizes held in a device tensor, and takes every `NUM_SM`-th tile
#   (`tile_idx += NUM_SM`): a **persistent** kernel whose schedule is computed on the device, so the
#   launch does not depend on the routing and nothing is read back.
# - **Inductor's grouped GEMM template** (`torch/_inductor/kernel/mm_grouped.py` in 2.10) is the same
#   persistent design: grid `(NUM_SMS, 1, 1)`, `tidx += NUM_SMS`, group sizes read from `offs` on the
#   device, TMA loads where Triton has tensor descriptors. It is a `torch.compile(mode="max-autotune")`
#   choice beside the ATen kernel (`use_triton_template` needs `max_autotune`). In 2.10
#   `can_use_triton_kernel` admits CUDA with compute capability 9.0 or more and not ROCm. The next cell
#   prints those lines from the torch installed here (later releases moved the kernel into
#   `templates/triton_mm_grouped.py.jinja` and, in the ones checked, admit ROCm too).

# %%
from pathlib import Path

inductor = Path(torch.__file__).parent / "_inductor"
LOOK_FOR = {"kernel/mm_grouped.py": ("get_device_capability() >=", "torch.version.hip", "tidx += NUM_SMS",
                                     "use_triton_template(", "NUM_SMS\": get_num_sms()"),
            "kernel/templates/triton_mm_grouped.py.jinja": ("tidx += NUM_SMS",),
            "kernel/mm_common.py": ("return (meta[\"NUM_SMS\"], 1, 1)",),
            "utils.py": ("config.max_autotune_gemm or not check_max_autotune",)}
print(f"torch {torch.__version__}:")
for relative, needles in LOOK_FOR.items():
    path = inductor / relative
    if not path.exists():
        print(f"  _inductor/{relative}: not in this torch")
        continue
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if any(needle in line for needle in needles):
            print(f"  _inductor/{relative}:{number}: {line.strip()}")


# %% [markdown]
# ## Pitfalls, each run here
#
# Every cell runs the failing call on CPU tensors, catches the exception and prints torch's real
# message, then the fix. `moe.grouped_gemm` (the validated wrapper) is shown where it says more.

# %%
def show(what, call):
    try:
        call()
        print(f"{what}: no error")
    except Exception as exc:
        print(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}")

g = torch.Generator().manual_seed(0)
xs_p, w_p = torch.randn(10, 16, generator=g), torch.randn(4, 16, 8, generator=g)
offs_p = torch.tensor([3, 3, 7, 10], dtype=torch.int32)     # expert 1 is empty

# %% [markdown]
# **1. Offsets must be int32.** `cumsum` of int64 counts gives int64; convert.

# %% tags=["nbval-check-output"]
show("torch, int64 offsets", lambda: F.grouped_mm(xs_p, w_p, offs=offs_p.long()))
show("helpers, int64 offsets", lambda: moe.grouped_gemm(xs_p, w_p, offs_p.long()))
print("fixed:", tuple(F.grouped_mm(xs_p, w_p, offs=offs_p.long().to(torch.int32)).shape))

# %% [markdown]
# **2. Offsets are cumulative ends, not group sizes, and torch does not check them.** Passing the
# sizes, offsets past the last row, or decreasing offsets runs without an error (the CPU fallback just
# slices, clamping at the end) and gives a wrong result. The validated wrapper rejects them.

# %% tags=["nbval-check-output"]
sizes = moe.counts_from_offsets(offs_p).to(torch.int32)          # [3, 0, 4, 3]
wrong = F.grouped_mm(xs_p, w_p, offs=sizes)
print("torch with group sizes as offsets: no error; equals the right result:",
      torch.allclose(wrong, F.grouped_mm(xs_p, w_p, offs=offs_p)))
show("torch, offsets past the end [3, 3, 7, 12]", lambda: F.grouped_mm(xs_p, w_p, offs=torch.tensor([3, 3, 7, 12], dtype=torch.int32)))
show("helpers, group sizes as offsets", lambda: moe.grouped_gemm(xs_p, w_p, sizes))
show("helpers, offsets past the end", lambda: moe.grouped_gemm(xs_p, w_p, torch.tensor([3, 3, 7, 12], dtype=torch.int32)))

# %% [markdown]
# **3. Row strides must be multiples of 16 bytes** (4 fp32 or 8 bf16 elements), for K and N, even on
# CPU: a rule the GPU kernels (TMA) need, checked for every device. Zero-pad K (and N) instead:
# zeros do not change the product.

# %% tags=["nbval-check-output"]
xs7, w7 = torch.randn(10, 7, generator=g), torch.randn(4, 7, 8, generator=g)
show("torch, K=7 in fp32", lambda: F.grouped_mm(xs7, w7, offs=offs_p))
show("helpers, K=7 in fp32", lambda: moe.grouped_gemm(xs7, w7, offs_p))
padded_out = moe.grouped_gemm(moe.pad_to_multiple(xs7, 1, 4), moe.pad_to_multiple(w7, 1, 4), offs_p)
print("fixed by zero-padding K to 8: matches the loop:", torch.allclose(padded_out, moe.loop_gemm(xs7, w7, offs_p), atol=1e-5))
show("torch, a broadcast (stride-0) input", lambda: F.grouped_mm(xs_p[:1].expand(10, 16), w_p, offs=offs_p))

# %% [markdown]
# **4. Which operand shapes are accepted.** 2D×3D with offsets (the MoE forward), 3D×3D without
# (a plain batched matmul), 2D×2D with offsets (the weight-gradient form: groups along K, one output
# per group) and 3D×2D with offsets. Offsets with two 3D operands, or none with a 2D one, are rejected.

# %% tags=["nbval-check-output"]
offs12 = torch.tensor([3, 3, 7, 12], dtype=torch.int32)
print("2D x 3D + offs:", tuple(F.grouped_mm(xs_p, w_p, offs=offs_p).shape))
print("3D x 3D      :", tuple(F.grouped_mm(torch.randn(4, 5, 16), w_p).shape))
print("2D x 2D + offs:", tuple(F.grouped_mm(torch.randn(16, 12), torch.randn(12, 8), offs=offs12).shape))
print("3D x 2D + offs:", tuple(F.grouped_mm(torch.randn(4, 5, 16), torch.randn(16, 12), offs=offs12).shape))
show("2D x 3D without offs", lambda: F.grouped_mm(xs_p, w_p))
show("empty groups (all rows in the last expert)", lambda: F.grouped_mm(xs_p, w_p, offs=torch.tensor([0, 0, 0, 10], dtype=torch.int32)))

# %% [markdown]
# **5. `bias=` is in the signature but not supported**, and `out_dtype` must equal the input dtype
# (the docstring describes `out_dtype=torch.float32` for bf16 inputs; it is rejected). Both operands
# must have the same dtype, and autocast does not convert them for you (it does for `mm`). Add a
# per-expert bias after the GEMM by indexing it with each row's expert.

# %% tags=["nbval-check-output"]
bias = torch.randn(4, 8, generator=g)
show("torch, bias=", lambda: F.grouped_mm(xs_p, w_p, offs=offs_p, bias=bias))
show("torch, bf16 in, out_dtype=float32", lambda: F.grouped_mm(xs_p.bfloat16(), w_p.bfloat16(), offs=offs_p, out_dtype=torch.float32))
show("torch, bf16 tokens with fp32 weights", lambda: F.grouped_mm(xs_p.bfloat16(), w_p, offs=offs_p))
with torch.autocast("cpu", dtype=torch.bfloat16):
    print("under autocast(bf16): mm gives", (xs_p @ w_p[0]).dtype, "| grouped_mm gives",
          F.grouped_mm(xs_p, w_p, offs=offs_p).dtype)
row_expert = torch.repeat_interleave(torch.arange(4), moe.counts_from_offsets(offs_p))
with_bias = F.grouped_mm(xs_p, w_p, offs=offs_p) + bias[row_expert]
print("bias added per row's expert: matches the loop + bias:", torch.allclose(with_bias, moe.loop_gemm(xs_p, w_p, offs_p) + bias[row_expert], atol=1e-5))

# %% [markdown]
# **6. Autograd works, except for a stride-0 gradient.** `y.sum().backward()` sends an expanded
# gradient of ones with strides `[0, 0]`, which the backward's grouped GEMM rejects. Pass a real
# gradient, or use `moe.grouped_gemm`, which makes the incoming gradient contiguous.

# %% tags=["nbval-check-output"]
xr, wr = xs_p.clone().requires_grad_(), w_p.clone().requires_grad_()
show("torch, y.sum().backward()", lambda: F.grouped_mm(xr, wr, offs=offs_p).sum().backward())
y = F.grouped_mm(xr, wr, offs=offs_p)
y.backward(torch.ones_like(y))
print("y.backward(torch.ones_like(y)): works, grad shapes", tuple(xr.grad.shape), tuple(wr.grad.shape))
xr.grad = wr.grad = None
moe.grouped_gemm(xr, wr, offs_p).sum().backward()
print("moe.grouped_gemm(...).sum().backward(): works; empty expert 1 gets a zero weight gradient:",
      bool(wr.grad[1].abs().sum() == 0))

# %% [markdown]
# **7. Under `torch.compile`, the meta kernel demands bf16.** Eager CPU accepts fp32, but the shape
# function that `torch.compile` runs (`meta_grouped_mm` in `torch/_meta_registrations.py`) checks for
# bf16 inputs, so compiled fp32 code fails while eager fp32 works. Calling the op on `meta` tensors
# runs exactly that function, instantly:

# %%
meta = dict(device="meta")
show("meta (what torch.compile runs), fp32", lambda: F.grouped_mm(xs_p.to(**meta), w_p.to(**meta), offs=offs_p.to(**meta)))
print("meta, bf16:", tuple(F.grouped_mm(xs_p.to(**meta).bfloat16(), w_p.to(**meta).bfloat16(), offs=offs_p.to(**meta)).shape))

# %%
if QUICK:
    print("quick mode: the real torch.compile run is skipped (importing Dynamo and tracing takes several seconds); "
          "run with QUICK = False to see it")
else:
    import logging
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)   # it logs a traceback before raising
    compiled = torch.compile(lambda a, b, o: F.grouped_mm(a, b, offs=o), backend="eager")
    show("torch.compile, fp32", lambda: compiled(xs_p, w_p, offs_p))
    print("torch.compile, bf16:", tuple(compiled(xs_p.bfloat16(), w_p.bfloat16(), offs_p).shape))

# %% [markdown]
# **8. Out-of-range expert ids and empty batches.** A router with more outputs than there are expert
# weights produces ids the offsets cannot describe; torch's message does not say why. A batch with no
# tokens breaks the common `view(tokens, k, -1)` in the combine step. The layer checks the first and
# handles the second (an empty batch gives an empty result, as an expert without tokens does).

# %% tags=["nbval-check-output"]
bad_ids = torch.tensor([0, 9, 2, 9, 1, 3, 3, 2, 0, 1])            # 9 is not one of 8 experts
bad_offs = torch.bincount(bad_ids, minlength=8).cumsum(0).to(torch.int32)
show("torch, offsets built from an id of 9 with 8 experts", lambda: F.grouped_mm(xs_p, torch.randn(8, 16, 8), offs=bad_offs))
show("helpers, the same ids", lambda: moe.permute(xs_p, bad_ids[:, None], 8))
empty = torch.zeros(0, 16)
show("common idiom on an empty batch", lambda: torch.zeros(0, 8).view(0, 2, -1))
print("moe.moe_layer on an empty batch:", tuple(moe.moe_layer(empty, moe.make_moe(16, 32, 4)).shape))

# %% [markdown]
# **9. Rows past `offs[-1]` are uninitialised.** A static-shape MoE keeps its buffer at `tokens × k`
# rows and sends the dropped (token, choice) pairs to a virtual expert E, which sorts them last: the
# real experts end at `offs[E-1]`, below the number of rows. `grouped_mm` allocates its output with
# `at::empty_strided` (`create_grouped_gemm_output_tensor` in `aten/src/ATen/native/GroupedMMUtils.h`)
# and writes only the groups' rows, so the rows past the last offset hold whatever was in that memory,
# and so do those of the input gradient. Here, with the skewed router at capacity factor 1:

# %%
keep = moe.within_capacity(ids_skewed, EXPERTS, moe.expert_capacity(TOKENS, TOP_K, EXPERTS, 1.0))
virtual_ids = torch.where(keep, ids_skewed, EXPERTS)                  # dropped pairs: expert E, sorted last
xs_buf, _, offs_all = moe.permute(x, virtual_ids, EXPERTS + 1, validate=False)
offs_kept, w_buf = offs_all[:EXPERTS], params["w_up"]                 # the real experts' ends
kept = int(offs_kept[-1])
assert kept < xs_buf.shape[0], "no pair was dropped: lower the capacity factor"
print(f"buffer of {xs_buf.shape[0]} rows; the experts own the first {kept}, then {xs_buf.shape[0] - kept} dropped rows")
xr = xs_buf.clone().requires_grad_()
raw = F.grouped_mm(xr, w_buf, offs=offs_kept)
raw.backward(torch.ones_like(raw))
for what, tail in (("output", raw[kept:].detach()), ("input gradient", xr.grad[kept:])):
    print(f"F.grouped_mm {what} past offs[-1]: {int((tail != 0).sum())} of {tail.numel()} values nonzero, "
          f"{int((~torch.isfinite(tail)).sum())} not finite, largest |value| {tail.abs().nan_to_num(posinf=float('inf')).max().item():.3g}")

# %% tags=["nbval-check-output"]
outs = {name: moe.IMPLEMENTATIONS[name](xs_buf, w_buf, offs_kept) for name in ("loop", "padded_bmm", "grouped_mm")}
for name, out in outs.items():
    assert out.shape == (xs_buf.shape[0], w_buf.shape[2]) and not out[kept:].any(), name
    assert torch.allclose(out, outs["loop"], atol=1e-4), name
xg = xs_buf.clone().requires_grad_()
moe.grouped_gemm(xg, w_buf, offs_kept).sum().backward()
assert not xg.grad[kept:].any()
print("loop, padded_bmm and moe.grouped_gemm: the same [M, N] result, zeros past offs[-1] (and zero gradient there)")

# %% [markdown]
# The helpers choose zeros, documented in `helpers/moe.py`: a buffer with room to spare is what
# capacity-padded MoE code passes, so an error would refuse correct programs. The Triton kernel writes
# into a zeroed output and masks rows by their expert's end, so it agrees too (checked in its section
# and in `tests/test_moe.py`). If you call `F.grouped_mm` yourself, slice the result to `offs[-1]` rows
# or zero the rest, and never reduce over the whole buffer.

# %% [markdown]
# ## What the articles got wrong
#
# One widely read 2.10 article says grouped GEMM on ROCm came "via both regular GEMM fallback and
# Composable Kernel (CK) implementations, significantly improving batch processing efficiency". Both
# paths exist, but in 2.10 the CK path is **opt-in** (`ROCM_ALLOW_GROUP_GEMM_CK=1`, gfx942/gfx950)
# precisely because it was not yet faster, and the default fallback is a loop of regular GEMMs, which
# this lesson measured: it performs like the loop, not better. The same article places this under
# "ROCm 6.0": 2.10's ROCm build is 7.1. It suggests judging grouped GEMM by DLRM memory consumption;
# `grouped_mm`'s own docstring names what it is for: mixture-of-experts layers, with jagged token
# counts per expert. It saves launches, and the padded copy with its memory; the weights stay what they are.
#
# ## Summary
#
# - MoE layer = route → permute → ragged GEMMs described by int32 end offsets → unpermute and combine.
# - On CPU and by default on ROCm in 2.10, `grouped_mm` is a loop of GEMMs; the fused kernels are
#   CUTLASS on NVIDIA sm90/sm100 with bf16, and CK on gfx942/gfx950 when you opt in.
# - Padded `bmm` only makes sense for near-uniform routing with small groups; with skew it multiplies
#   zeros.
# - Validate inputs: torch accepts wrong offsets silently, leaves rows past `offs[-1]` uninitialised,
#   and its stride and gradient errors do not say what to do.
# - Training needs two more grouped GEMMs per forward one: `dX = grouped_mm(dY, Wᵀ, offs)` and the
#   2D × 2D `dW = grouped_mm(Xᵀ, dY, offs)`.
# - Capacity factors trade dropped tokens for static shapes; dropless grouped GEMMs compute every row.
# - An expert GEMM with few rows is memory-bound (it reads its whole weight): judge it against the
#   bandwidth roofline, not the dense GEMM's FLOP rate.
# - The fast paths pay off only with sync-free routing (no `.item()`, `bincount` or `tolist()` on the
#   hot path) and a tile schedule computed on the device.
