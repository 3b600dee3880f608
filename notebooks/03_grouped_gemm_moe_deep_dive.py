# %% [markdown]
# # 03 · Deep dive: grouped GEMM for mixture-of-experts
#
# | | |
# |---|---|
# | **What you will learn** | a fresh and a skewed router's tokens per expert; capacity and token dropping; the backward (two more grouped GEMMs) and a training step; routing's host syncs; a Triton grouped GEMM with a host-built tile list, then a persistent grid that reads `offs` on the device; which path runs on NVIDIA (CUTLASS), ROCm (fallback, CK) and XPU; what production adds (per-group M alignment, FP8 grouped GEMM, expert parallelism, `data_ptr % 16`); bf16 or fp32 on this CPU; eight pitfalls, each run, the three that cost the most first (int32 END offsets, uninitialised rows past `offs[-1]`, 16-byte row strides) |
# | **Prerequisites** | [lesson 03](03_grouped_gemm_moe.ipynb); reading a little Triton helps |
# | **Hardware** | any CPU: the Triton kernels run in Triton's interpreter where Triton is installed. On a GPU: the CUTLASS path (NVIDIA sm_90/sm_100), the ROCm fallback and CK paths (AMD), and both Triton kernels timed |
# | **Time** | 88 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the GPU paths are read from PyTorch's source (`GroupedBlas.cpp`, `GroupedMMUtils.h`, `native_functions.yaml`, `_inductor/kernel/mm_grouped.py` of the 2.10.0 and 2.13.0 wheels) and run only where that hardware is |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/03_grouped_gemm_moe_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False        # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
TOKENS = 1024        # tokens in the batch (batch x sequence, flattened)
D_MODEL = 512        # model width
D_FF = 1024          # expert hidden width
EXPERTS = 8
TOP_K = 2
THREADS = 1          # threads for timing

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

from helpers import bench, moe
from helpers.interactive import predict, reveal

if QUICK:
    TOKENS, D_MODEL, D_FF, EXPERTS = 256, 128, 256, 8
caps = capabilities()
torch.manual_seed(0)
params = moe.make_moe(D_MODEL, D_FF, EXPERTS, seed=0)
x = torch.randn(TOKENS, D_MODEL)
ids, gates = moe.route(x @ params["router"], TOP_K)
xs, order, offs = moe.permute(x, ids, EXPERTS)
hot = torch.zeros(EXPERTS)
hot[0], hot[1] = 2.0, 1.0
ids_skewed, _ = moe.route(x @ params["router"] + hot, TOP_K)      # a fresh router and a skewed one (plotted below)
counts_t = moe.skewed_counts(70, 8, 3.0)                          # a small skewed split with empty experts
offs_c = moe.offsets_from_counts(counts_t)
g = torch.Generator().manual_seed(0)
xs_c, w_c = torch.randn(70, 32, generator=g), torch.randn(8, 32, 48, generator=g)
reference = moe.loop_gemm(xs_c, w_c, offs_c)
print(f"torch {torch.__version__} · device: {DEVICE} · {caps.device_name} · quick={QUICK}")
print(f"sizes: {TOKENS} tokens, d_model {D_MODEL}, d_ff {D_FF}, {EXPERTS} experts, top-{TOP_K}; small split {counts_t.tolist()}")

# %% [markdown]
# ## A fresh router and a skewed one
#
# A freshly initialised router spreads tokens fairly evenly. Trained routers are often skewed: a few
# "hot" experts get many tokens, some get none (load-balancing losses exist to fight this). The set-up
# made a skewed router by raising two experts' logits; both are plotted here.

# %%
counts = moe.expert_counts(ids, EXPERTS)
counts_skewed = moe.expert_counts(ids_skewed, EXPERTS)
print("tokens per expert, fresh router: ", counts.tolist())
print("tokens per expert, skewed router:", counts_skewed.tolist())
if not QUICK:     # the figure (plotly's first figure costs seconds: quick mode prints the counts only)
    import plotly.graph_objects as go
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
# Rows beyond it are **dropped** (zero output; the residual connection carries the token). Slots go to
# first choices before second choices, then in token order, as in GShard. Fixed capacity buys static
# shapes (an `[E, capacity, d]` buffer and one `bmm`) at the price of dropped tokens and padding;
# *dropless* MoE computes every routed row: MegaBlocks (https://arxiv.org/abs/2211.15841) and grouped
# GEMMs like this lesson's. `moe.within_capacity` computes the mask on the device (a cumulative count
# per expert, no host sync). Before the table, the skewed router above: how much capacity would it
# need to drop nothing?

# %% tags=["predict"]
skewed_rows = moe.expert_counts(ids_skewed, EXPERTS)
fair = TOKENS * TOP_K / EXPERTS
print(f"skewed router: rows per expert {skewed_rows.tolist()}; fair share {fair:g} rows each")
factor_guess = predict("What is the smallest capacity factor at which the skewed router drops no routed row?",
                       unit="x", example=1.25)

# %% [markdown]
# The dropped fraction for the two routers, factor by factor:

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
if not QUICK:     # the figure (plotly costs seconds: quick mode prints the table only)
    import plotly.graph_objects as go
    fig = go.Figure([go.Scatter(x=FACTORS, y=[100 * d for d in fractions], mode="lines+markers", name=f"{name} router")
                     for name, fractions in dropped.items()])
    fig.update_layout(title=f"Routed rows dropped vs capacity factor ({TOKENS} tokens, top-{TOP_K}, {EXPERTS} experts)",
                      xaxis_title="capacity factor", yaxis_title="% of routed rows dropped", height=360)
    fig.show()

# %% tags=["reveal"]
busiest = int(skewed_rows.max())
needed = busiest / fair
assert bool(moe.within_capacity(ids_skewed, EXPERTS, busiest).all())              # nothing dropped at `busiest` slots
assert not bool(moe.within_capacity(ids_skewed, EXPERTS, busiest - 1).all())      # one slot fewer drops a row
padding = 1 - TOKENS * TOP_K / (EXPERTS * busiest)
reveal(factor_guess, needed, tolerance=1.1,
       why=f"expert {int(skewed_rows.argmax())} receives {busiest} rows against a fair share of {fair:g}, so the "
           f"factor must reach {busiest} / {fair:g} = {needed:.2f} before its slots hold them all (checked: "
           f"within_capacity keeps every row at {busiest} slots and drops one at {busiest - 1}). The busiest expert "
           f"alone sets it; at that factor the [E, capacity, d] buffer is {100 * padding:.0f}% empty slots. Sized "
           f"for the average instead (factor 1.0), the skewed router drops "
           f"{100 * dropped['skewed'][FACTORS.index(1.0)]:.1f}% of its rows. A dropless grouped GEMM pays neither.");

# %% [markdown]
# ## Backward and training
#
# `moe.moe_layer(x, params, k, impl)` runs the whole layer (router → permute → up-projection → GELU →
# down-projection → unpermute) with any implementation. `loop`, `padded_bmm` and `grouped_mm` are
# differentiable (`grouped_mm` has autograd on CPU); the Triton kernels below are forward-only.

# %% tags=["nbval-check-output"]
xt = torch.randn(40, 32, generator=torch.Generator().manual_seed(1))
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
# `dX_e = dY_e W_eᵀ` and `dW_e = X_eᵀ dY_e`. `derivatives.yaml` maps `_grouped_mm` to
# `_grouped_mm_mat1_backward` and `_grouped_mm_mat2_backward`. The forward was the 2D × 3D form
# (`X` [rows, K], `W` [E, K, N], `offs`); the op accepts 2D or 3D for each operand. Which form computes
# the weight gradient, `[E, K, N]`?

# %% tags=["predict"]
form_guess = predict("Which form of _grouped_mm does torch's backward call for dW?",
                     options=["2D x 3D", "3D x 3D", "2D x 2D", "3D x 2D"], example="3D x 3D")

# %% [markdown]
# The next cell logs the `_grouped_mm` calls torch's backward dispatches (`moe.grouped_mm_calls`), then
# checks `moe.grouped_gemm_input_grad` / `weight_grad` against torch's autograd and the loop's.

# %%
xb, wb = xs_c.clone().requires_grad_(), w_c.clone().requires_grad_()
yb = F.grouped_mm(xb, wb, offs=offs_c)
dy = torch.randn(yb.shape, generator=torch.Generator().manual_seed(2))
calls = moe.grouped_mm_calls(lambda: yb.backward(dy))
for call in calls:
    print(f"torch's backward dispatched _grouped_mm {call['form']}: {call['a']} x {call['b']} -> {call['out']}")

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

# %% tags=["reveal"]
dw_call = next(c for c in calls if c["out"] == tuple(w_c.shape))
dx_call = next(c for c in calls if c["out"] == tuple(xs_c.shape))
reveal(form_guess, dw_call["form"],
       why=f"dW_e = X_eᵀ dY_e sums over expert e's rows, and the rows are the ragged dimension: torch passed Xᵀ "
           f"{dw_call['a']} and dY {dw_call['b']}, both 2D, with offs cutting the dimension the GEMM contracts "
           f"into groups, and got {dw_call['out']}: one [K, N] block per expert; the {int(no_rows.sum())} experts "
           f"without rows get zeros. dX = dY Wᵀ is the forward's form again ({dx_call['form']}: "
           f"{dx_call['a']} x {dx_call['b']}). So training runs both ragged forms, and the 2D x 2D one starts each "
           "group at an offset into a transposed operand: why production aligns the groups (below).");

# %% [markdown]
# ### A training step, measured
#
# The backward does twice the forward's GEMM FLOPs (dX and dW): a training step's expert GEMMs cost
# about three forwards. The whole layer, measured:

# %%
layer = moe.make_moe(D_MODEL, D_FF, EXPERTS, seed=0, requires_grad=True)
x_train = torch.randn(64 if QUICK else TOKENS, D_MODEL, generator=torch.Generator().manual_seed(4))

def forward(impl):
    return moe.moe_layer(x_train, layer, k=TOP_K, impl=impl)

def train_step(impl):
    for p in layer.values():
        p.grad = None
    forward(impl).square().mean().backward()

candidates = {}      # impl="grouped_mm" is moe.grouped_gemm: F.grouped_mm with input checks (host reads) and zeroed tail
for impl in ("loop", "padded_bmm", "grouped_mm"):
    candidates[f"{impl} forward"] = lambda impl=impl: forward(impl)
    candidates[f"{impl} forward+backward"] = lambda impl=impl: train_step(impl)
step = bench.compare(candidates, baseline="grouped_mm forward+backward", threads=THREADS, device="cpu",
                     repeats=2 if QUICK else 5, min_run_time=0.005 if QUICK else 0.05)
print(bench.table(step))
times = {name: r["median_s"] for name, r in step["results"].items()}
for impl in ("loop", "padded_bmm", "grouped_mm"):
    print(f"{impl:<11}: forward+backward takes {times[impl + ' forward+backward'] / times[impl + ' forward']:.1f}x "
          f"its forward; training step {times[impl + ' forward+backward'] / times['grouped_mm forward+backward']:.2f}x grouped_mm's")

# %% [markdown]
# ## Routing's host synchronisations
#
# On a GPU, an op that needs a device value on the host (`.item()`, `int(t)`, an `if` on a tensor, an
# output sized by the data) waits for the queue to drain: a **host synchronisation**, and a step that
# has one cannot be captured in a CUDA graph. A fused `grouped_mm` without a sync pays off only if the
# routing around it is sync-free too. In this lesson's code: `permute`'s id check (`min`, `max`);
# `torch.bincount` (its CUDA kernel reads the ids' min and max, `aten/src/ATen/native/cuda/SummaryOps.cu`);
# the helpers' input checks (`counts.min()`, `offs[-1]`); `loop_gemm`'s `offs.tolist()`; `padded_bmm`'s
# `counts.max()` and `repeat_interleave` without `output_size=`; the host tile list below; and the
# fallback's `offs.cpu()` inside ATen.
#
# `moe.host_reads(fn)` lists the reads it sees through a `TorchDispatchMode`, on any device (on a CPU
# they cost nothing; the list is the point). It misses `tolist()`, which does not dispatch an op, and
# every op that another op's kernel calls: those are named from the code, not counted. The sync-free
# alternative counts with a scatter-add (`moe.expert_counts`), checked equal to `bincount`, and skips
# the checks (`permute(..., validate=False)`).

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
print("F.grouped_mm shows none: its fallback's offs.cpu() and .item() run inside _grouped_mm's kernel, where the "
      "mode does not see them (the core lesson's profiler shows aten::item under aten::_grouped_mm)")

# %% [markdown]
# ## Tile scheduling: from a host-built tile list to a schedule on the device
#
# ### Step 1: the host builds the tile list
#
# `moe.triton_gemm` runs one Triton program per (block of `BLOCK_M` rows of one expert, block of
# `BLOCK_N` columns). Its wrapper reads the offsets (`tolist()`), lists every expert's row blocks in
# Python, copies the list to the device and launches one program per entry: an empty expert launches
# nothing, but every call pays a host sync and a copy, and the grid changes with the routing (no CUDA
# graph can hold it). On a CPU, Triton's interpreter runs it (for correctness, never timed). A finding
# with Triton 3.6 and 3.9: the interpreter's `tl.dot` returns garbage for bf16 tiles, so both kernels
# convert tiles to fp32 there (`UPCAST`); fp32 asks for `input_precision="ieee"` (Triton's NVIDIA
# default is TF32).

# %%
if requires("triton", section="Triton grouped GEMM: correctness"):
    where = "compiled for " + DEVICE.type if DEVICE.type != "cpu" else "in Triton's interpreter (TRITON_INTERPRET=1)"
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 0.25)):
        out = moe.triton_gemm(xs_c.to(DEVICE, dtype), w_c.to(DEVICE, dtype), offs_c.to(DEVICE))
        err = (out.float().cpu() - reference).abs().max().item()
        assert err < tol, f"Triton kernel differs from the loop reference by {err} in {dtype}"
        print(f"host-scheduled Triton kernel {where}, {dtype}: matches the loop reference (max abs error {err:.2g})")
    buffer = torch.cat([xs_c, torch.ones(9, xs_c.shape[1])])          # 9 rows past offs[-1], owned by no expert
    out = moe.triton_gemm(buffer.to(DEVICE), w_c.to(DEVICE), offs_c.to(DEVICE)).cpu()
    assert torch.allclose(out, moe.loop_gemm(buffer, w_c, offs_c), atol=1e-3) and not out[70:].any()
    print("9 rows past offs[-1]: zeros there, as the other implementations give")

# %% [markdown]
# ### How the peers schedule
#
# - **Triton's tutorial 08** (`python/tutorials/08-grouped-gemm.py`,
#   https://github.com/triton-lang/triton/blob/main/python/tutorials/08-grouped-gemm.py): a fixed grid
#   of `NUM_SM` persistent programs, each walking the groups and taking every `NUM_SM`-th tile. The
#   kernel schedules on the device, but its wrapper `group_gemm_fn` builds sizes, strides and pointers
#   from Python shapes and copies them to the device on every call, as step 1 does, and the kernel
#   "assume[s] full tile" (no masks): it cannot run ragged MoE groups as written.
# - **Inductor's grouped GEMM template** (`torch/_inductor/kernel/mm_grouped.py`, a
#   `torch.compile(mode="max-autotune")` choice) is the sync-free design: grid `(NUM_SMS, 1, 1)`,
#   `tidx += NUM_SMS`, group sizes read from `offs` on the device. In the 2.10 and 2.13 wheels
#   `can_use_triton_kernel` admits CUDA with capability 9.0 or more and **not ROCm**
#   (`and not torch.version.hip`); the cell prints the lines from the torch you run. Device-built
#   tile→expert maps (vLLM's `moe_align_block_size`) are the other sync-free answer.

# %%
from pathlib import Path

inductor = Path(torch.__file__).parent / "_inductor"
LOOK_FOR = {"kernel/mm_grouped.py": ("get_device_capability() >=", "torch.version.hip", "tidx += NUM_SMS",
                                     "use_triton_template(", "NUM_SMS\": get_num_sms()"),
            "kernel/templates/triton_mm_grouped.py.jinja": ("tidx += NUM_SMS",)}
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
# ### Step 2: a persistent grid that reads `offs` on the device
#
# `moe.triton_gemm_persistent` moves step 1's schedule onto the device: a fixed grid of `programs`
# programs (one per SM on a GPU). Each walks the experts, loads each expert's end from `offs` on the
# device, counts its tiles and takes every `programs`-th tile of the running total, with step 1's
# masks, so ragged and empty experts work. The wrapper reads nothing from `offs`, and the grid is the
# same for every routing.

# %%
import inspect

print("\n".join(inspect.getsource(moe._persistent_kernel).splitlines()[6:30]))
if requires("triton", section="Triton grouped GEMM: a persistent grid"):
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 0.25)):
        out = moe.triton_gemm_persistent(xs_c.to(DEVICE, dtype), w_c.to(DEVICE, dtype), offs_c.to(DEVICE),
                                         programs=3, block_m=16, block_n=16, block_k=16)
        err = (out.float().cpu() - reference).abs().max().item()
        assert err < tol, f"the persistent kernel differs from the loop reference by {err} in {dtype}"
        print(f"persistent kernel (3 programs, 16x16x16 tiles), {dtype}: matches the loop reference (max abs error {err:.2g})")
    one_expert = moe.offsets_from_counts(torch.tensor([0] * 7 + [70]))     # every row on the last expert
    out = moe.triton_gemm_persistent(xs_c.to(DEVICE), w_c.to(DEVICE), one_expert.to(DEVICE), programs=3,
                                     block_m=16, block_n=16, block_k=16).cpu()
    assert torch.allclose(out, moe.loop_gemm(xs_c, w_c, one_expert), atol=1e-3)
    reads = moe.host_reads(lambda: moe.triton_gemm_persistent(xs_c.to(DEVICE), w_c.to(DEVICE), offs_c.to(DEVICE),
                                                              programs=3, block_m=16, block_n=16, block_k=16,
                                                              validate=False))
    print(f"every row on one expert: correct with the same grid; host reads dispatched with validate=False: {len(reads)}")


# %% [markdown]
# Both kernels timed on a GPU (16 experts, skew 1.5, bf16) next to `F.grouped_mm` and a dense GEMM of
# the same FLOPs; the persistent grid gets one program per SM. Neither is tuned: read the gap between
# them as the cost of the host-built schedule, not as a verdict on Triton.

# %%
def gpu_problem(dtype, experts=16, skew=1.5, rows=16384, k=2048, n=1408):
    c = moe.skewed_counts(rows, experts, skew)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    xs_ = torch.randn(rows, k, device=DEVICE, generator=g).to(dtype)
    w_ = torch.randn(experts, k, n, device=DEVICE, generator=g).to(dtype)
    return xs_, w_, moe.offsets_from_counts(c).to(DEVICE), moe.gemm_gflop(rows, k, n)

if requires("triton_gpu", section="Triton grouped GEMM speed on the GPU"):
    xs_g, w_g, offs_g, gflop = gpu_problem(torch.bfloat16)
    dense_w = w_g[0].clone()
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count if DEVICE.type == "cuda" else 64
    tile = dict(block_m=64, block_n=128, block_k=64)
    ref_g = F.grouped_mm(xs_g, w_g, offs=offs_g).float()
    for name, fn in (("host tile list", moe.triton_gemm), ("persistent", moe.triton_gemm_persistent)):
        kwargs = dict(tile, programs=sms, validate=False) if name == "persistent" else tile
        err = (fn(xs_g, w_g, offs_g, **kwargs).float() - ref_g).abs().max().item()
        print(f"Triton, {name}: max abs difference from F.grouped_mm {err:.3g}")
    r = bench.compare({"dense": lambda: xs_g @ dense_w, "F.grouped_mm": lambda: F.grouped_mm(xs_g, w_g, offs=offs_g),
                       "triton, host tile list": lambda: moe.triton_gemm(xs_g, w_g, offs_g, **tile),
                       "triton, persistent": lambda: moe.triton_gemm_persistent(xs_g, w_g, offs_g, programs=sms,
                                                                                 validate=False, **tile)},
                      baseline="dense", device=DEVICE, work=gflop)
    print(bench.table(r))

# %% [markdown]
# ## The GPU paths: which one runs where
#
# `native_functions.yaml` (2.10 and 2.13) gives `_grouped_mm` two kernels: `CUDA: _grouped_mm_cuda`
# (ROCm builds too) and `CompositeExplicitAutograd: _grouped_mm`, the regular-GEMM fallback elsewhere.
#
# | where | path | verified here? |
# |---|---|---|
# | CPU, XPU | `_grouped_mm_fallback` (`GroupedMMUtils.h`): `offs.cpu()`, one `mm_out` per group | CPU: profiled in the core lesson |
# | NVIDIA sm_90 / sm_100, bf16 | fused CUTLASS kernel (`bf16bf16_grouped_mm`), no host sync | `grouped_mm_cutlass` section, on such a GPU |
# | NVIDIA otherwise: fp32/fp16, sm_80, sm_120, and sm_110 (Jetson Thor) | the fallback loop (`offs` copied to the host) | `grouped_mm_cutlass` section (fp32) |
# | AMD ROCm, 2.10 default | the fallback (pytorch#162419) | `rocm` section |
# | AMD gfx942/gfx950, `ROCM_ALLOW_GROUP_GEMM_CK=1` | Composable Kernel (pytorch#166334; opt-in since pytorch#170159: not yet faster) | `rocm_ck` section |
#
# **sm_110 in 2.10.** pytorch#164836 added an sm_11x arm, but `_grouped_mm_cuda` gates CUTLASS on
# `_scaled_mm_allowed_device(true, true)` (major 9 or 10), so Thor takes the loop (pytorch#194227);
# `helpers.device.CUTLASS_GROUPED_MM_MAJORS` holds the same majors. The GPU rows are read from PyTorch's
# source and issues; each GPU section profiles `grouped_mm` (`moe.grouped_mm_path`) and prints the path taken.
# ROCm's CK branch is compiled only into builds with `USE_ROCM_CK_GEMM` (`#if defined(USE_ROCM_CK_GEMM)` in
# `GroupedBlas.cpp`); in a build without it, the variable changes nothing.
#
# ### Your turn: which path?
#
# The rule in `_grouped_mm_cuda` (`GroupedBlas.cpp`): CUTLASS when
# `_scaled_mm_allowed_device(/*sm90_only*/true, /*sm100_only*/true)` holds, that is compute capability
# major 9 or 10, **and** `mat_a`, `mat_b` and the output are all bf16; `_grouped_mm_fallback` otherwise.
# Decide each case below. The last needs a fact the table does not give: does autocast cast
# `grouped_mm`'s inputs? Ask the dispatcher: `torch._C._dispatch_dump_table("aten::_grouped_mm")` lists
# what runs for each dispatch key; `fallthrough` for `AutocastCUDA` means autocast passes the call on
# untouched.

# %% tags=["your-turn"]
# GPU, compute capability major, the tensors' dtype, inside torch.autocast("cuda", dtype=torch.bfloat16)?
# Your answer for each: "fused kernel" or "loop of mm". Change the answers.
MY_PATHS = {
    ("H200", 9, "bf16", False): "loop of mm",
    ("H100", 9, "fp16", False): "loop of mm",
    ("A100", 8, "bf16", False): "loop of mm",
    ("B200", 10, "bf16", False): "loop of mm",
    ("RTX 5090", 12, "bf16", False): "loop of mm",
    ("Jetson Thor", 11, "bf16", False): "loop of mm",
    ("H100", 9, "fp32", True): "loop of mm",
}

# %%
from helpers.checks import fail, your_turn
from helpers.device import CUTLASS_GROUPED_MM_MAJORS

autocast_cuda = next((line.split(" registered")[0] for line in torch._C._dispatch_dump_table("aten::_grouped_mm")
                     .splitlines() if line.startswith("AutocastCUDA:")), "AutocastCUDA: nothing registered")
autocast_casts = "fallthrough" not in autocast_cuda and "nothing" not in autocast_cuda


def path_taken(major, dtype):
    return "fused kernel" if major in CUTLASS_GROUPED_MM_MAJORS and dtype == "bf16" else "loop of mm"


def check_paths():
    cases = {("H200", 9, "bf16", False), ("H100", 9, "fp16", False), ("A100", 8, "bf16", False),
             ("B200", 10, "bf16", False), ("RTX 5090", 12, "bf16", False), ("Jetson Thor", 11, "bf16", False),
             ("H100", 9, "fp32", True)}
    if set(MY_PATHS) != cases:
        fail("which path", "the cases were changed", "change only the answers, not the cases")
    for (gpu, major, dtype, autocast), answer in MY_PATHS.items():
        if autocast and autocast_casts:       # 2.13 has a fallthrough; a torch with an autocast kernel is not graded
            print(f"torch {torch.__version__} registers {autocast_cuda}: the autocast case is not graded")
            continue
        truth = path_taken(major, dtype)      # with a fallthrough, fp32 tensors reach the kernel as fp32
        if answer != truth:
            why = (f"major {major} and bf16: both conditions hold" if truth == "fused kernel" else
                   f"major {major} is not 9 or 10" if major not in CUTLASS_GROUPED_MM_MAJORS else
                   f"{dtype} is not bf16: `a_b_and_out_are_bf16` is false" if not autocast else
                   f"this torch's dispatch table for aten::_grouped_mm says '{autocast_cuda}': "
                   "autocast passes the call on untouched, so which dtype reaches the kernel?")
            fail("which path", f"{gpu} (major {major}), {dtype}{', under autocast' if autocast else ''}: you said "
                 f"{answer!r}", why)


your_turn(check_paths, what="which path");

# %%
print("CUTLASS grouped_mm majors in helpers.device:", CUTLASS_GROUPED_MM_MAJORS)
if requires("grouped_mm_cutlass", section="CUTLASS grouped GEMM on NVIDIA sm_90 and sm_100"):
    for dtype in (torch.bfloat16, torch.float32):
        xs_g, w_g, offs_g, gflop = gpu_problem(dtype)
        dense_w = w_g[0].clone()
        path = moe.grouped_mm_path(xs_g, w_g, offs_g)
        print(f"{dtype} on {caps.device_name} ({caps.arch}): {path['path']} ({path['mm_calls']} aten::mm; "
              f"GPU kernels: {', '.join(k[:60] for k in path['gpu_kernels'][:2])})")
        r = bench.compare({"dense": lambda: xs_g @ dense_w, "F.grouped_mm": lambda: F.grouped_mm(xs_g, w_g, offs=offs_g),
                           "loop": lambda: moe.loop_gemm(xs_g, w_g, offs_g),
                           "padded_bmm": lambda: moe.padded_bmm(xs_g, w_g, offs_g)},
                          baseline="dense", device=DEVICE, work=gflop)
        print(bench.table(r))

# %%
if requires("rocm", section="ROCm grouped GEMM: the fallback"):
    print(f"HIP {caps.hip_version}, {caps.device_name} ({caps.arch}); ROCM_ALLOW_GROUP_GEMM_CK="
          f"{os.environ.get('ROCM_ALLOW_GROUP_GEMM_CK', '(unset)')}")
    xs_g, w_g, offs_g, gflop = gpu_problem(torch.bfloat16)
    dense_w = w_g[0].clone()
    path = moe.grouped_mm_path(xs_g, w_g, offs_g)
    print(f"grouped_mm took: {path['path']} ({path['mm_calls']} aten::mm inside aten::_grouped_mm)")
    r = bench.compare({"dense": lambda: xs_g @ dense_w, "F.grouped_mm": lambda: F.grouped_mm(xs_g, w_g, offs=offs_g),
                       "loop": lambda: moe.loop_gemm(xs_g, w_g, offs_g)}, baseline="dense", device=DEVICE, work=gflop)
    print(bench.table(r))

# %% [markdown]
# The CK switch is read by ATen's global context, so the comparison runs each setting in a fresh
# Python process with the variable set or unset, and profiles which path ran (`mm_calls` 0: CK).

# %%
CK_SCRIPT = """
import json, torch, torch.nn.functional as F
from helpers import bench, moe
c = moe.skewed_counts(16384, 16, 1.5)
xs = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.randn(16, 2048, 1408, device="cuda", dtype=torch.bfloat16)
offs = moe.offsets_from_counts(c).cuda()
path = moe.grouped_mm_path(xs, w, offs)
out = F.grouped_mm(xs, w, offs=offs)
err = (out.float() - moe.loop_gemm(xs, w, offs).float()).abs().max().item()
r = bench.compare({"grouped_mm": lambda: F.grouped_mm(xs, w, offs=offs)}, device="cuda",
                  work=moe.gemm_gflop(16384, 2048, 1408))
timing = r["results"]["grouped_mm"]
print(json.dumps({"path": path["path"], "mm_calls": path["mm_calls"], "max_err_vs_loop": err,
                  "gflops": timing["GFLOP_per_s"], **{k: timing[k] for k in ("median_s", "min_s", "max_s")}}))
"""

if requires("rocm_ck", section="ROCm Composable Kernel grouped GEMM (ROCM_ALLOW_GROUP_GEMM_CK=1)"):
    import json, subprocess, sys
    ck_runs = {}
    for ck in ("0", "1"):
        env = dict(os.environ, ROCM_ALLOW_GROUP_GEMM_CK=ck)
        done = subprocess.run([sys.executable, "-c", CK_SCRIPT], env=env, capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(moe.__file__)))
        if done.returncode:
            print(f"ROCM_ALLOW_GROUP_GEMM_CK={ck}: failed:\n{done.stderr[-1500:]}")
        else:
            print(f"ROCM_ALLOW_GROUP_GEMM_CK={ck}: {done.stdout.strip().splitlines()[-1]}")
            ck_runs[ck] = json.loads(done.stdout.strip().splitlines()[-1])
            if done.stderr.strip():     # a warning from CK or hipBLASLt would otherwise go unseen
                print(f"  stderr: {done.stderr.strip()[-600:]}")
    if len(ck_runs) == 2:               # the two processes' repeats, min-max, decide which is faster
        spread = {ck: f"{r['median_s'] * 1e3:.3f} ms ({r['min_s'] * 1e3:.3f}-{r['max_s'] * 1e3:.3f})"
                  for ck, r in ck_runs.items()}
        faster = "CK on" if ck_runs["1"]["median_s"] < ck_runs["0"]["median_s"] else "CK off"
        print(f"CK on {spread['1']} vs off {spread['0']}: "
              + (f"{faster} is faster here" if bench.separated({"results": ck_runs}, "0", "1") else
                 f"the spreads overlap, {bench.NOISY}"))

# %% [markdown]
# ## What production adds
#
# **Per-group M alignment.** torchtitan pads every expert's group of rows to a multiple of
# `TOKEN_GROUP_ALIGN_SIZE_M` before `torch._grouped_mm` (`generate_permute_indices` in
# `torchtitan/models/moe/kernels.py`: `clamp_min(counts, alignment)`, then round up; the padding slots
# point at a zero row). Its docstring (`set_token_group_alignment_size_m`) gives the values: 8 for bf16
# (16 bytes / 2 bytes per element), 16 for FP8, 32 for MXFP8 (the scaling block). The reason is the
# backward: `dW = grouped_mm(Xᵀ, dY, offs)` has its groups along the contracted dimension, so each
# group starts at an offset into a transposed operand, and the GPU kernels want every group's start
# 16-byte aligned (the `data_ptr % 16` rule below). Computed on the device, it costs rows of zeros:

# %%
for multiple in (8, 16, 32):
    for name, routed in (("fresh", ids), ("skewed", ids_skewed)):
        c = moe.expert_counts(routed, EXPERTS)
        aligned = moe.align_groups(c, multiple)
        assert torch.all(aligned % multiple == 0) and torch.all(aligned >= c)
        print(f"align {multiple:>2}, {name:<6} router: {int(c.sum())} rows -> {int(aligned.sum())} "
              f"({100 * (int(aligned.sum()) / int(c.sum()) - 1):.1f}% more rows); host reads: "
              f"{len(moe.host_reads(lambda: moe.align_groups(c, multiple)))}")

# %% [markdown]
# **FP8 grouped GEMM.** `torch._scaled_grouped_mm` is the scaled (FP8) sibling, and the public
# `torch.nn.functional.scaled_grouped_mm` (scaling recipes as `ScalingType`) calls
# `_scaled_grouped_mm_v2`; `native_functions.yaml` registers both for `CUDA` only (2.10 and 2.13).
# torchao's prototype `torchao.prototype.moe_training` trains with it: a config applied with `quantize_`
# (`MoETrainingConfig` in torchao 0.16, `Float8TrainingOpConfig` in 0.18) swaps the 3D expert weights
# for a tensor subclass that intercepts `torch._grouped_mm` and quantizes both operands to FP8
# (row-wise) or MXFP8, forward and backward.
#
# **Expert parallelism.** Each rank holds E / ranks experts. A step exchanges the token counts per
# expert (an all-to-all), sends every routed row to its expert's rank (a variable-size
# `all_to_all_single`, whose split sizes are read on the host), runs the local grouped GEMM on rows from
# every rank (`generate_permute_indices` takes `[ranks × local experts]` counts for this) and sends the
# results back (a third all-to-all). The grouped GEMM is unchanged; where its rows come from is not.

# %% [markdown]
# **The `data_ptr % 16` rule.** `check_valid_strides_and_return_transposed` in `GroupedMMUtils.h`
# checks each operand's `data_ptr() % 16 == 0`: on every device in the 2.10 wheel, on all but the CPU
# in the 2.13 wheel (`is_cpu || ...`). A view that starts inside a row (a slice of a flat buffer) passes
# on one and fails on the other, and on any GPU. The cell prints your torch's line, tries such a view,
# and shows where `_scaled_grouped_mm` is registered:

# %%
header = Path(torch.__file__).parent / "include/ATen/native/GroupedMMUtils.h"
if header.exists():
    print(next(line.strip() for line in header.read_text().splitlines() if "data_ptr()) % 16" in line))
flat = torch.randn(1 + 10 * 16)
shifted = flat[1:].view(10, 16)                                     # starts 4 bytes into the buffer
print("data_ptr % 16 of the shifted view:", shifted.data_ptr() % 16)
try:
    F.grouped_mm(shifted, torch.randn(4, 16, 8), offs=torch.tensor([3, 3, 7, 10], dtype=torch.int32))
    print(f"torch {torch.__version__} on CPU: accepted")
except RuntimeError as exc:
    print(f"torch {torch.__version__} on CPU: {str(exc).splitlines()[0]}")
print("fix: .clone() copies into a fresh, aligned allocation:", shifted.clone().data_ptr() % 16 == 0)
yaml = Path(torch.__file__).parent.parent / "torchgen/packaged/ATen/native/native_functions.yaml"
if yaml.exists():
    lines = yaml.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("- func: _scaled_grouped_mm("))
    print(f"torch {torch.__version__}: _scaled_grouped_mm dispatch:", [ln.strip() for ln in lines[at + 2:at + 5] if ":" in ln])
print("torch._scaled_grouped_mm exists here:", hasattr(torch, "_scaled_grouped_mm"),
      "| F.scaled_grouped_mm:", hasattr(F, "scaled_grouped_mm"))


# %% [markdown]
# ## Pitfalls, each run here
#
# Eight, the three that cost the most first: torch's real message, then the fix.

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
# **1. Offsets are int32 cumulative ENDS, and torch does not check their values.** int64 offsets (what
# `cumsum` of int64 counts gives) are rejected. Worse, passing the group *sizes*, or offsets past the
# last row, runs without an error on CPU and gives a wrong result. `moe.grouped_gemm` validates them.

# %% tags=["nbval-check-output"]
sizes = moe.counts_from_offsets(offs_p).to(torch.int32)      # [3, 0, 4, 3]
show("torch, int64 offsets", lambda: F.grouped_mm(xs_p, w_p, offs=offs_p.long()))
print("torch with group sizes as offsets: no error; equals the right result:",
      torch.allclose(F.grouped_mm(xs_p, w_p, offs=sizes), F.grouped_mm(xs_p, w_p, offs=offs_p)))
show("helpers, group sizes as offsets", lambda: moe.grouped_gemm(xs_p, w_p, sizes))

# %% [markdown]
# **2. Rows past `offs[-1]` are uninitialised.** A static-shape MoE keeps a buffer of `tokens × k`
# rows and sends dropped (token, choice) pairs past the last expert: the experts end below the number
# of rows. `grouped_mm` allocates its output with `at::empty_strided` (`create_grouped_gemm_output_tensor`
# in `aten/src/ATen/native/GroupedMMUtils.h`) and writes only the groups' rows, so the tail holds
# whatever was in that memory. The helpers return zeros there; with `F.grouped_mm`, slice to `offs[-1]`.

# %% tags=["nbval-check-output"]
buffer = torch.cat([xs_c, torch.ones(9, xs_c.shape[1])])          # 9 rows past offs[-1], owned by no expert
raw = F.grouped_mm(buffer, w_c, offs=offs_c)
print(f"F.grouped_mm: {buffer.shape[0]} rows in, {int(offs_c[-1])} owned by experts; the tail is never written "
      f"(we read it only through the helpers, which zero it)")
for name in ("loop", "padded_bmm", "grouped_mm"):
    out = moe.IMPLEMENTATIONS[name](buffer, w_c, offs_c)
    assert not out[70:].any() and torch.allclose(out[:70], raw[:70], atol=1e-4), name
print("moe.loop_gemm, padded_bmm, grouped_gemm: same rows as F.grouped_mm, zeros past offs[-1]")

# %% [markdown]
# **3. Row strides must be multiples of 16 bytes** (4 fp32 or 8 bf16 elements), for K and N, even on
# CPU: a rule of the GPU kernels (TMA), checked on every device. Zero-pad K (and N): zeros do not
# change the product. Each operand's `data_ptr` must be 16-byte aligned too: on a GPU always, and on the
# CPU in 2.10 (2.13 exempts CPU tensors; both read in `GroupedMMUtils.h`, shown in "What production
# adds" above).

# %% tags=["nbval-check-output"]
xs7, w7 = torch.randn(10, 7, generator=g), torch.randn(4, 7, 8, generator=g)
show("torch, K=7 in fp32", lambda: F.grouped_mm(xs7, w7, offs=offs_p))
padded_out = F.grouped_mm(moe.pad_to_multiple(xs7, 1, 4), moe.pad_to_multiple(w7, 1, 4), offs=offs_p)
print("fixed by zero-padding K to 8: matches the loop:", torch.allclose(padded_out, moe.loop_gemm(xs7, w7, offs_p), atol=1e-5))

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
# ## bf16 or fp32 on this CPU?
#
# A CPU with bf16 dot-product instructions (AVX512-BF16, AMX) multiplies bf16 natively; one without
# converts every value in software and can be much slower in bf16 than in fp32. Measured side by side:

# %%
from helpers.device import cpu_capability

ROWS = TOKENS * TOP_K
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
print(f"CPU: {caps.cpu_name} · torch's CPU capability: {cpu_capability()} · native bf16: {caps.bf16}")
print(bench.table(dtype_result))
speed = {name: r["median_s"] for name, r in dtype_result["results"].items()}
dense_gain, grouped_gain = (speed["dense fp32"] / speed["dense bf16"], speed["grouped_mm fp32"] / speed["grouped_mm bf16"])
dense_verdict = (f"bf16 is {'faster' if dense_gain > 1 else 'slower'} here"
                 if bench.separated(dtype_result, "dense fp32", "dense bf16") else
                 f"the dense spreads overlap, {bench.NOISY}")
print(f"bf16 vs fp32 on this CPU: the dense GEMM is {dense_gain:.2f}x as fast in bf16, grouped_mm {grouped_gain:.2f}x: "
      f"{dense_verdict} (native bf16 according to the device layer: {caps.bf16})")
if not QUICK:
    bench.plot(dtype_result, title="fp32 vs bf16, dense and grouped (same FLOPs)").show()

# %% [markdown]
# `grouped_mm` follows the dense GEMM's dtype behaviour because on CPU it *is* a loop of the same `mm`.
# Where bf16 came out faster, rerun the core lesson's sweep with `BENCH_DTYPE = "bfloat16"`.

# %% [markdown]
# ## What the articles got wrong
#
# One widely read 2.10 article says grouped GEMM on ROCm came "via both regular GEMM fallback and
# Composable Kernel (CK) implementations, significantly improving batch processing efficiency". In 2.10
# the CK path is **opt-in** (`ROCM_ALLOW_GROUP_GEMM_CK=1`, gfx942/gfx950) because it was not yet faster,
# and the default is the same `_grouped_mm_fallback` the CPU runs. This collection has measured that
# fallback on CPUs only, where it performs like the loop, not better; the `rocm` section measures it on
# an AMD GPU when it runs on one. `grouped_mm`'s own docstring names its purpose: mixture-of-experts
# layers, with jagged token counts per expert.
