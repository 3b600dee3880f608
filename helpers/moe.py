"""Mixture-of-experts around grouped GEMM: routing, token permutation, offsets, four ways to run the
expert GEMMs, and an MoE layer whose input checks turn torch's terse errors into clear ones.

    ids, gates = route(x @ router, k=2)                  # top-k experts per token
    xs, order, offs = permute(x, ids, num_experts)       # tokens sorted by expert; int32 END offsets
    ys = grouped_gemm(xs, w, offs)                       # F.grouped_mm with validated inputs
    y = unpermute(ys, order, gates)                      # back to token order, gate-weighted sum

Every implementation takes the same arguments (xs [M, K], w [E, K, N], offs int32 [E]) and returns
[M, N]; IMPLEMENTATIONS maps their names to them, `loop_gemm` is the reference. Rows past offs[-1]
(a buffer sized for more rows than were routed, as capacity-padded MoE code passes) belong to no
expert: every implementation returns them as zeros, and their gradient is zero (F.grouped_mm alone
leaves them uninitialised, forward and backward).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.bench import compare
from helpers.checks import fail, passed

GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# --- Routing and permutation ------------------------------------------------------------------

def route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k router: (expert ids [T, k] int64, gates [T, k]) with the gates softmax-normalised over
    the k chosen experts (in float32, returned in the logits' dtype)."""
    if logits.dim() != 2:
        raise ValueError(f"router logits must be 2D (tokens, experts), got shape {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k={k} must be between 1 and the number of experts ({logits.shape[1]})")
    top, ids = logits.float().topk(k, dim=-1)
    return ids, top.softmax(dim=-1).to(logits.dtype)


def offsets_from_counts(counts: torch.Tensor) -> torch.Tensor:
    """Tokens per expert -> the int32 cumulative END offsets grouped_mm takes ([3, 0, 2] -> [3, 3, 5])."""
    return counts.cumsum(0).to(torch.int32)


def counts_from_offsets(offs: torch.Tensor) -> torch.Tensor:
    """The inverse of offsets_from_counts: rows per group (int64)."""
    return torch.diff(offs.long(), prepend=offs.new_zeros(1).long())


def expert_counts(expert_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Rows per expert (int64 [num_experts]) with a scatter-add into zeros: unlike torch.bincount, whose
    CUDA kernel reads the ids' min and max back to the host, it never waits for the device."""
    flat = expert_ids.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def check_expert_ids(expert_ids: torch.Tensor, num_experts: int) -> None:
    if expert_ids.dtype.is_floating_point or expert_ids.dtype == torch.bool:
        raise TypeError(f"expert ids must be an integer tensor, got {expert_ids.dtype}")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= num_experts):
        bad = expert_ids[(expert_ids < 0) | (expert_ids >= num_experts)][0].item()
        raise ValueError(f"expert id {bad} is out of range for {num_experts} experts (valid: 0..{num_experts - 1}); "
                         f"the router's last dimension must equal the number of expert weights")


def permute(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int, *, validate: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, choice) pairs by expert.

    Returns xs [T*k, d] (row i is token order[i] // k), order [T*k] (positions in the flattened
    [T, k] choices, stable within an expert) and offs int32 [num_experts] (cumulative END offsets).
    validate=False skips check_expert_ids, the only step that reads the device's data on the host:
    the rest (argsort, gather, scatter-add, cumsum) never waits for the device.
    """
    if validate:
        check_expert_ids(expert_ids, num_experts)
    flat = expert_ids.reshape(-1)
    k = expert_ids.shape[-1] if expert_ids.dim() > 1 else 1
    order = torch.argsort(flat, stable=True)
    xs = x[order // k]
    offs = offsets_from_counts(expert_counts(flat, num_experts))
    return xs, order, offs


def unpermute(ys: torch.Tensor, order: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """Undo `permute` and combine: y[t] = sum_j gates[t, j] * ys[row of (t, j)]. Differentiable."""
    tokens, k = gates.shape
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    # an explicit width: view(tokens, k, -1) fails on an empty batch ("can be any value and is ambiguous")
    return (ys[back].view(tokens, k, ys.shape[-1]) * gates.unsqueeze(-1).to(ys.dtype)).sum(dim=1)


def expert_capacity(tokens: int, k: int, num_experts: int, factor: float) -> int:
    """Rows each expert may take: factor x its fair share of the tokens x k routed rows (Switch
    Transformer's capacity factor, https://arxiv.org/abs/2101.03961, with k choices per token)."""
    return math.ceil(factor * tokens * k / num_experts)


def within_capacity(expert_ids: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """bool [T, k]: which (token, choice) pairs an expert with `capacity` slots keeps. Slots go to every
    token's first choice before any second choice, then in token order (GShard's priority,
    https://arxiv.org/abs/2006.16668); the rest are dropped (the token's residual carries it past the layer).
    Computed on the device with a cumulative count: no host synchronisation."""
    by_priority = expert_ids.t().reshape(-1, 1)                               # choice-major
    # a one-hot by scatter: F.one_hot reads the ids' min and max on the host to check them (on CPU)
    one_hot = torch.zeros(by_priority.shape[0], num_experts, dtype=torch.long, device=expert_ids.device)
    one_hot.scatter_(1, by_priority, 1)
    slot = one_hot.cumsum(0).gather(1, by_priority).squeeze(1) - 1           # arrival rank in its expert
    return (slot < capacity).view(expert_ids.shape[1], -1).t()


def skewed_counts(total: int, num_experts: int, skew: float) -> torch.Tensor:
    """Deterministic tokens per expert, Zipf-like: expert i gets a share proportional to (i+1)**-skew.
    skew=0 is uniform; larger skew piles tokens on the first experts and can leave some with none."""
    share = torch.arange(1, num_experts + 1, dtype=torch.float64) ** -skew
    counts = torch.floor(total * share / share.sum()).long()
    counts[0] += total - int(counts.sum())
    return counts


# --- Host synchronisations -------------------------------------------------------------------------

# Ops that copy a device tensor's data to the host (on a GPU: wait for the queue to drain).
HOST_READS = {"_local_scalar_dense": ".item(), int(t), float(t), bool(t), or an `if` on a tensor",
              "bincount": "reads the ids' min and max to size its output (aten/src/ATen/native/cuda/SummaryOps.cu)",
              "repeat_interleave": "sums the repeats for the output size unless output_size= is given",
              "nonzero": "its output size depends on the data"}


class _OpLog(TorchDispatchMode):
    """Runs every op and records the ones `keep(name, args, kwargs, out)` returns a record for."""

    def __init__(self, keep):
        super().__init__()
        self.keep, self.records = keep, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        record = self.keep(func.overloadpacket.__name__, args, kwargs, out)
        if record is not None:
            self.records.append(record)
        return out


def _host_read(name, args, kwargs, out):
    if name in HOST_READS and not (name == "repeat_interleave" and kwargs.get("output_size") is not None):
        return name
    return None


def host_reads(fn) -> list[str]:
    """The ops in HOST_READS that fn() dispatches, in order, on any device (they are syncs on a GPU).
    Tensor.tolist() copies without going through the dispatcher: it is not counted, read the code."""
    with _OpLog(_host_read) as log:
        fn()
    return log.records


def _grouped_mm_call(name, args, kwargs, out):
    if name != "_grouped_mm":
        return None
    a, b = args[0], args[1]
    return {"a": tuple(a.shape), "b": tuple(b.shape), "out": tuple(out.shape),
            "form": f"{a.dim()}D x {b.dim()}D"}


def grouped_mm_calls(fn) -> list[dict]:
    """Every aten._grouped_mm that fn() dispatches (a backward included): operand and output shapes."""
    with _OpLog(_grouped_mm_call) as log:
        fn()
    return log.records


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side logs 'profiler_start/stop' lines to file descriptor 2: silence them."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def grouped_mm_path(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> dict:
    """Which path F.grouped_mm(xs, w, offs=offs) takes here, read from a profile of one call: the ops
    that aten::_grouped_mm itself dispatches. The regular-GEMM fallback (CPU; ROCm by default; NVIDIA
    outside sm90/sm100 or in fp32) shows one aten::mm per group and an aten::item per offset read on the
    host; a fused kernel (CUTLASS, CK) shows neither, and the profile names the GPU kernel instead."""
    if xs.device.type == "cpu":     # the legacy profiler: no Kineto start-up, which costs seconds on a first call
        with _quiet_stderr(), torch.autograd.profiler.profile(use_kineto=False) as prof:
            F.grouped_mm(xs, w, offs=offs)
        events = prof.function_events
    else:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU, ProfilerActivity.XPU if xs.device.type == "xpu" else ProfilerActivity.CUDA]
        with _quiet_stderr(), profile(activities=activities) as prof:
            F.grouped_mm(xs, w, offs=offs)
        events = prof.events()
    children = [e.name for e in events if e.cpu_parent is not None and e.cpu_parent.name == "aten::_grouped_mm"]
    kernels = sorted({e.name for e in events if e.device_type.name in ("CUDA", "XPU")})
    mm_calls = sum(name in ("aten::mm", "aten::mm_out") or name.startswith("aten::mm.") for name in children)
    return {"path": "loop of mm" if mm_calls else "fused kernel", "mm_calls": mm_calls,
            "host_reads": sum(name == "aten::item" for name in children), "gpu_kernels": kernels}


# --- Validation: torch's errors, said clearly ---------------------------------------------------

def check_grouped_inputs(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *, layout: bool = True) -> None:
    """Raise a clear error for every input F.grouped_mm (2D x 3D with offsets) rejects, or accepts
    silently although the result is wrong (offsets past the end or decreasing). layout=False skips
    the dtype and 16-byte-stride rules, which only grouped_mm itself has. A last offset below the
    number of rows is allowed (a buffer with room to spare): the implementations zero those rows.
    Reads the offsets on the host (two syncs on a GPU)."""
    if xs.dim() != 2 or w.dim() != 3:
        raise ValueError(f"expected tokens xs [M, K] and expert weights w [E, K, N], got shapes "
                         f"{tuple(xs.shape)} and {tuple(w.shape)}")
    if xs.dtype != w.dtype:
        raise TypeError(f"tokens are {xs.dtype} but weights are {w.dtype}: cast one explicitly "
                        f"(autocast does not cover grouped_mm)")
    if layout and xs.dtype not in GROUPED_MM_DTYPES:
        raise TypeError(f"grouped_mm supports float32, bfloat16 and float16, not {xs.dtype}")
    if xs.shape[1] != w.shape[1]:
        raise ValueError(f"tokens have K={xs.shape[1]} features but weights expect K={w.shape[1]} "
                         f"(w must be [E, K, N]; a Linear-style [E, N, K] weight needs .transpose(-2, -1))")
    if offs.dtype != torch.int32:
        raise TypeError(f"offsets must be torch.int32, got {offs.dtype}: grouped_mm only takes int32 "
                        f"(convert with offs.to(torch.int32))")
    if offs.dim() != 1 or offs.numel() != w.shape[0]:
        raise ValueError(f"offsets must be 1D with one END offset per expert ({w.shape[0]}), got shape "
                         f"{tuple(offs.shape)}")
    if offs.numel():
        counts = counts_from_offsets(offs)
        if int(counts.min()) < 0:
            raise ValueError(f"offsets must be cumulative END offsets, non-decreasing; got {offs.tolist()[:8]}... "
                             f"(group sizes? use offsets_from_counts(counts))")
        if int(offs[-1]) > xs.shape[0]:
            raise ValueError(f"the last offset ({int(offs[-1])}) is past the {xs.shape[0]} token rows: "
                             f"offsets are cumulative END offsets and the last one is the number of routed rows")
    if not layout:
        return
    for name, t in (("tokens", xs), ("weights", w)):
        (row_stride, col_stride), (rows, cols) = t.stride()[-2:], t.shape[-2:]
        if col_stride == 1 and row_stride >= max(1, cols):
            lead = row_stride                      # row-major
        elif row_stride == 1 and col_stride >= max(1, rows):
            lead = col_stride                      # column-major (a transposed view)
        else:
            raise ValueError(f"{name} {tuple(t.shape)} have strides {tuple(t.stride())}: grouped_mm needs a "
                             f"row- or column-major layout without broadcast (stride-0) dimensions; call .contiguous()")
        align = 16 // t.element_size()
        if lead % align:
            raise ValueError(f"{name} {tuple(t.shape)} in {t.dtype} have a leading stride of {lead} elements: "
                             f"grouped_mm needs it to be a multiple of 16 bytes ({align} elements); pad K and N "
                             f"to a multiple of {align} with pad_to_multiple(t, dim, {align})")


def pad_to_multiple(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """Zero-pad dimension `dim` of t up to a multiple of `multiple` (zeros do not change a matmul)."""
    extra = -t.shape[dim] % multiple
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - dim % t.dim() - 1) + [0, extra]
    return F.pad(t, pad)


# --- Four implementations of the expert GEMMs -----------------------------------------------------

def _bounds(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()
    return list(zip([0] + ends[:-1], ends))


def _unowned_rows(xs: torch.Tensor, offs: torch.Tensor, n: int) -> torch.Tensor:
    """Zeros for the rows past offs[-1], which no expert owns."""
    return xs.new_zeros(xs.shape[0] - (int(offs[-1]) if offs.numel() else 0), n)


def loop_gemm(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The regular-GEMM fallback: one matmul per expert on its slice of rows (the reference)."""
    check_grouped_inputs(xs, w, offs, layout=False)
    parts = [xs[start:end] @ w[e] for e, (start, end) in enumerate(_bounds(offs))]
    return torch.cat(parts + [_unowned_rows(xs, offs, w.shape[-1])])


def padded_bmm(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Pad every expert's rows to the busiest expert's count, one bmm, then gather the real rows.
    Cost: E * max(count) rows of work instead of sum(count)."""
    check_grouped_inputs(xs, w, offs, layout=False)
    counts = counts_from_offsets(offs)
    rows = int(offs[-1]) if offs.numel() else 0
    group = torch.repeat_interleave(torch.arange(len(counts), device=xs.device), counts)
    slot = torch.arange(rows, device=xs.device) - (offs.long() - counts)[group]
    padded = xs.new_zeros(w.shape[0], int(counts.max()) if len(counts) else 0, xs.shape[1])
    padded = padded.index_put((group, slot), xs[:rows])
    return torch.cat([torch.bmm(padded, w)[group, slot], _unowned_rows(xs, offs, w.shape[-1])])


def grouped_gemm_input_grad(w: torch.Tensor, offs: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dX = grouped_mm(dY, W^T, offs), 2D x 3D: each expert's rows of dY times its transposed weight.
    The rows past offs[-1] are zeroed (grouped_mm leaves them uninitialised)."""
    dx = F.grouped_mm(dy.contiguous(), w.transpose(-2, -1), offs=offs)
    dx[int(offs[-1]) if offs.numel() else 0:] = 0
    return dx


def grouped_gemm_weight_grad(xs: torch.Tensor, offs: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dW = grouped_mm(X^T, dY, offs), 2D x 2D: the groups run along the contracted dimension (the
    rows) and each gives one [K, N] gradient; an expert without rows gets zeros."""
    return F.grouped_mm(xs.contiguous().t(), dy.contiguous(), offs=offs)


class _GroupedMM(torch.autograd.Function):
    """F.grouped_mm with the unowned rows zeroed; its backward is the two grouped GEMMs above (the
    ones torch's own backward dispatches), with a contiguous dY: y.sum()'s stride-0 gradient would
    otherwise be rejected ("Invalid strides/sizes, got [0, 0]")."""

    @staticmethod
    def forward(ctx, xs, w, offs):
        ctx.save_for_backward(xs, w, offs)
        out = F.grouped_mm(xs, w, offs=offs)
        out[int(offs[-1]) if offs.numel() else 0:] = 0
        return out

    @staticmethod
    def backward(ctx, dy):
        xs, w, offs = ctx.saved_tensors
        dx = grouped_gemm_input_grad(w, offs, dy) if ctx.needs_input_grad[0] else None
        dw = grouped_gemm_weight_grad(xs, offs, dy) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def grouped_gemm(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.grouped_mm after check_grouped_inputs, with zeros in the rows past
    offs[-1] and a backward that accepts y.sum().backward()'s stride-0 gradient."""
    check_grouped_inputs(xs, w, offs)
    return _GroupedMM.apply(xs, w, offs)


def triton_gemm(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                block_m: int = 32, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """A Triton grouped GEMM (forward only). Tiles are scheduled per expert on the host, so an expert
    with no tokens launches nothing and a busy one gets many tiles. On CPU it runs in Triton's
    interpreter, which needs TRITON_INTERPRET=1 set before triton is imported: for correctness only."""
    check_grouped_inputs(xs, w, offs)
    if xs.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton kernel runs on CPU tensors only in Triton's interpreter: set "
                           "os.environ['TRITON_INTERPRET'] = '1' before anything imports triton (first cell), "
                           "or run it in a subprocess with that variable")
    if xs.requires_grad or w.requires_grad:
        raise RuntimeError("triton_gemm is forward-only: use grouped_gemm (or loop_gemm) where you need gradients")
    kernel = _triton_kernel()
    counts = counts_from_offsets(offs).tolist()
    starts = [end - c for end, c in zip(offs.tolist(), counts)]
    tile_expert, tile_row = [], []
    for e, (start, count) in enumerate(zip(starts, counts)):
        for row in range(start, start + count, block_m):
            tile_expert.append(e)
            tile_row.append(row)
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    if not tile_expert:
        return out
    as_index = lambda v: torch.tensor(v, dtype=torch.int32, device=xs.device)
    N, K = w.shape[2], w.shape[1]
    grid = (len(tile_expert), math.ceil(N / block_n))
    kernel[grid](xs, w, out, as_index(tile_expert), as_index(tile_row), offs, N, K,
                 xs.stride(0), xs.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1),
                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                 UPCAST=xs.device.type == "cpu" and xs.dtype != torch.float32, IEEE=xs.dtype == torch.float32)
    return out


@functools.cache
def _triton_kernel():
    """Defined on first use, after the caller has chosen the interpreter or a GPU."""
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_gemm_kernel(x_ptr, w_ptr, out_ptr, tile_expert_ptr, tile_row_ptr, group_end_ptr, N,
                            K: tl.constexpr,    # the loop bound as a Python int (Triton <= 3.6's interpreter
                                                # cannot loop over a runtime scalar with NumPy >= 2.4)
                            stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_on,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            UPCAST: tl.constexpr, IEEE: tl.constexpr):
        tile = tl.program_id(0)
        expert = tl.load(tile_expert_ptr + tile).to(tl.int64)    # int64 offsets: rows * K passes 2**31
        rows = tl.load(tile_row_ptr + tile).to(tl.int64) + tl.arange(0, BLOCK_M)    # at 512K rows x 4096
        row_end = tl.load(group_end_ptr + expert)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :] * stride_xk,
                        mask=(rows[:, None] < row_end) & ((k0 + ks)[None, :] < K), other=0.0)
            b = tl.load(w_ptr + expert * stride_we + (k0 + ks)[:, None] * stride_wk + cols[None, :] * stride_wn,
                        mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
            if UPCAST:   # the interpreter's tl.dot gives garbage for bf16 tiles (Triton 3.9)
                a, b = a.to(tl.float32), b.to(tl.float32)
            if IEEE:     # fp32 in full precision: tl.dot's default on NVIDIA is TF32 (10-bit mantissa)
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
                 acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < row_end) & (cols[None, :] < N))

    return grouped_gemm_kernel


def triton_gemm_persistent(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *, programs: int = 4,
                           block_m: int = 32, block_n: int = 32, block_k: int = 32,
                           validate: bool = True) -> torch.Tensor:
    """The same grouped GEMM with the schedule on the device: a fixed grid of `programs` persistent
    programs. Each walks the experts, reads the expert's start and end from `offs` on the device,
    counts its tiles and takes every `programs`-th tile, as Triton's tutorial 08 and Inductor's
    grouped-GEMM template do. The wrapper reads nothing from `offs` (validate=False skips even the input
    checks' host reads), and the grid does not depend on the routing. Forward only."""
    if validate:
        check_grouped_inputs(xs, w, offs)
    if xs.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton kernel runs on CPU tensors only in Triton's interpreter: set "
                           "os.environ['TRITON_INTERPRET'] = '1' before anything imports triton")
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    E, K, N = w.shape
    _persistent_kernel()[(programs,)](
        xs, w, out, offs, N, xs.stride(0), xs.stride(1), w.stride(0), w.stride(1), w.stride(2),
        out.stride(0), out.stride(1), E=E, K=K, PROGRAMS=programs, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, UPCAST=xs.device.type == "cpu" and xs.dtype != torch.float32,
        IEEE=xs.dtype == torch.float32)
    return out


@functools.cache
def _persistent_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def persistent_grouped_gemm_kernel(x_ptr, w_ptr, out_ptr, group_end_ptr, N,
                                       stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_on,
                                       E: tl.constexpr, K: tl.constexpr, PROGRAMS: tl.constexpr,
                                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                       UPCAST: tl.constexpr, IEEE: tl.constexpr):
        tile = tl.program_id(0)                   # this program's next tile, numbered over all experts
        tiles_before = 0                          # tiles of the experts already walked
        row_start = 0
        n_tiles = tl.cdiv(N, BLOCK_N)
        for expert in range(E):
            row_end = tl.load(group_end_ptr + expert)             # read on the device: no host sync
            m_tiles = tl.cdiv(row_end - row_start, BLOCK_M)
            tiles = m_tiles * n_tiles
            while tile >= tiles_before and tile < tiles_before + tiles:
                local = tile - tiles_before
                rows = (row_start + (local // n_tiles) * BLOCK_M).to(tl.int64) + tl.arange(0, BLOCK_M)
                cols = (local % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
                ks = tl.arange(0, BLOCK_K)
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    a = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :] * stride_xk,
                                mask=(rows[:, None] < row_end) & ((k0 + ks)[None, :] < K), other=0.0)
                    b = tl.load(w_ptr + expert * stride_we + (k0 + ks)[:, None] * stride_wk
                                + cols[None, :] * stride_wn,
                                mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
                    if UPCAST:
                        a, b = a.to(tl.float32), b.to(tl.float32)
                    if IEEE:
                        acc = tl.dot(a, b, acc, input_precision="ieee")
                    else:
                        acc = tl.dot(a, b, acc)
                tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
                         acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < row_end) & (cols[None, :] < N))
                tile += PROGRAMS
            tiles_before += tiles
            row_start = row_end

    return persistent_grouped_gemm_kernel


def align_groups(counts: torch.Tensor, multiple: int) -> torch.Tensor:
    """Per-group M alignment, as torchtitan's generate_permute_indices does with TOKEN_GROUP_ALIGN_SIZE_M:
    every group's row count rounded up to a multiple of `multiple`, empty groups given `multiple` rows
    (clamp_min), on the device (no host read). Returns the padded counts; their cumsum are the offsets."""
    padded = torch.clamp_min(counts, multiple)
    return ((padded + multiple - 1) // multiple * multiple).to(counts.dtype)


IMPLEMENTATIONS = {"loop": loop_gemm, "padded_bmm": padded_bmm, "grouped_mm": grouped_gemm, "triton": triton_gemm}


# --- The MoE layer --------------------------------------------------------------------------------

def make_moe(d_model: int, d_ff: int, num_experts: int, *, dtype: torch.dtype = torch.float32,
             device: torch.device | str = "cpu", seed: int = 0, requires_grad: bool = False) -> dict:
    """Router [d_model, E] and expert weights w_up [E, d_model, d_ff], w_down [E, d_ff, d_model]."""
    g = torch.Generator().manual_seed(seed)
    def init(*shape, fan_in):
        t = (torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(dtype=dtype, device=device)
        return t.requires_grad_(requires_grad)
    return {"router": init(d_model, num_experts, fan_in=d_model),
            "w_up": init(num_experts, d_model, d_ff, fan_in=d_model),
            "w_down": init(num_experts, d_ff, d_model, fan_in=d_ff)}


def moe_layer(x: torch.Tensor, params: dict, *, k: int = 2, impl: str = "grouped_mm") -> torch.Tensor:
    """An MoE feed-forward layer: route each token to k experts, run each expert's
    up -> GELU -> down on its tokens with `impl`, and combine with the gates. x: [T, d_model].
    An empty batch (T = 0) gives an empty [0, d_model] result, as an expert with no tokens does."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    router, w_up, w_down = params["router"], params["w_up"], params["w_down"]
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, d_model], got shape {tuple(x.shape)}; flatten batch and "
                         f"sequence first (x.reshape(-1, d_model))")
    if x.shape[1] != router.shape[0]:
        raise ValueError(f"x has d_model={x.shape[1]} but the router expects {router.shape[0]}")
    if router.shape[1] != w_up.shape[0]:
        raise ValueError(f"the router scores {router.shape[1]} experts but there are {w_up.shape[0]} expert "
                         f"weights: out-of-range expert ids would follow")
    gemm = IMPLEMENTATIONS[impl]
    ids, gates = route(x @ router, k)
    xs, order, offs = permute(x, ids, w_up.shape[0])
    hidden = F.gelu(gemm(xs, w_up, offs))
    return unpermute(gemm(hidden, w_down, offs), order, gates)


# --- Lab checks built on helpers.checks ----------------------------------------------------------

def check_offsets(offs, counts: torch.Tensor, *, what: str) -> None:
    """The learner's offsets are int32 cumulative END offsets for these per-expert counts."""
    expected = offsets_from_counts(counts)
    if not isinstance(offs, torch.Tensor):
        fail(what, f"expected a tensor of offsets, got {type(offs).__name__}")
    if offs.dtype != torch.int32:
        fail(what, f"offsets are {offs.dtype}", "grouped_mm only accepts torch.int32 offsets: .to(torch.int32)")
    if offs.shape != expected.shape:
        fail(what, f"{offs.numel()} offsets for {len(counts)} experts",
             "one offset per expert, empty experts included: bincount(..., minlength=num_experts)")
    if torch.equal(offs.long(), counts):
        fail(what, f"these are the group sizes {offs.tolist()[:8]}, not offsets",
             "offsets are cumulative END positions: counts.cumsum(0)")
    if not torch.equal(offs, expected):
        fail(what, f"got {offs.tolist()[:8]}, expected {expected.tolist()[:8]}",
             "offs[i] is the row where expert i's tokens end (exclusive): the running total of tokens")
    passed(what)


# --- Benchmark ------------------------------------------------------------------------------------

def gemm_gflop(rows: int, k: int, n: int) -> float:
    return 2 * rows * k * n / 1e9


def grouped_gemm_traffic(counts, k: int, n: int, element_bytes: int) -> dict:
    """FLOPs and the bytes that must move at least once, per expert group of [n_e, K] @ [K, N]: its
    rows, its whole weight and its output. Arithmetic intensity = FLOPs / bytes. The grouped GEMM
    reads E weights where the dense GEMM of the same FLOPs reads one."""
    counts = [int(c) for c in counts]
    flops = [2 * c * k * n for c in counts]
    nbytes = [element_bytes * (c * k + k * n + c * n) for c in counts]
    rows = sum(counts)
    dense_bytes = element_bytes * (rows * k + k * n + rows * n)
    return {"counts": counts, "flops": flops, "bytes": nbytes,
            "intensity": [f / b for f, b in zip(flops, nbytes)],
            "total_flops": sum(flops), "total_bytes": sum(nbytes),
            "dense_bytes": dense_bytes, "dense_intensity": 2 * rows * k * n / dense_bytes}


def roofline_seconds(flops, nbytes, peak_flops: float, bandwidth: float) -> float:
    """The least time the groups can take one after another, each bound by compute or by memory."""
    return sum(max(f / peak_flops, b / bandwidth) for f, b in zip(flops, nbytes))


def measure_split(counts: torch.Tensor, k: int, n: int, *, dtype: torch.dtype = torch.float32,
                  threads: int = 1, repeats: int = 5, min_run_time: float = 0.05, seed: int = 0) -> dict:
    """GFLOP/s of loop, padded bmm, grouped_mm and a dense GEMM with the same FLOPs, measured
    side by side; 'vs_dense' is each one's throughput as a fraction of the dense GEMM's, 'result' the
    bench.compare result (each one's spread over the repeats). "grouped_mm" is
    torch.nn.functional.grouped_mm itself, called directly (not the validated `grouped_gemm`)."""
    g = torch.Generator().manual_seed(seed)
    rows = int(counts.sum())
    xs = torch.randn(rows, k, generator=g).to(dtype)
    w = torch.randn(len(counts), k, n, generator=g).to(dtype)
    dense_w = w[0].clone()
    offs = offsets_from_counts(counts)
    candidates = {"dense": lambda: xs @ dense_w, "loop": lambda: loop_gemm(xs, w, offs),
                  "padded_bmm": lambda: padded_bmm(xs, w, offs), "grouped_mm": lambda: F.grouped_mm(xs, w, offs=offs)}
    work = gemm_gflop(rows, k, n)
    result = compare(candidates, baseline="dense", repeats=repeats, min_run_time=min_run_time, threads=threads,
                     device="cpu", work=work)
    dense = result["results"]["dense"]["GFLOP_per_s"]
    return {"experts": len(counts), "counts": counts.tolist(), "rows": rows, "k": k, "n": n, "dtype": str(dtype),
            "gflop": work, "padded_rows": len(counts) * int(counts.max()),
            "gflops": {name: r["GFLOP_per_s"] for name, r in result["results"].items()},
            "vs_dense": {name: r["GFLOP_per_s"] / dense for name, r in result["results"].items()},
            "median_s": {name: r["median_s"] for name, r in result["results"].items()}, "result": result}


def benchmark(quick: bool = False, threads: int = 1) -> dict:
    """`python -m helpers bench moe`: GFLOP/s of every CPU implementation and the dense GEMM with the
    same FLOPs, measured in the same run, over expert counts and skews, in float32 and bfloat16.
    The Triton kernel is not timed on CPU (its interpreter is for correctness only)."""
    tokens, k, n = (512, 256, 512) if quick else (2048, 512, 1024)
    experts = (4, 16) if quick else (4, 8, 16, 32)
    skews = (0.0, 1.5) if quick else (0.0, 0.75, 1.5, 3.0)
    runs = []
    for dtype in (torch.float32, torch.bfloat16):
        for e in experts:
            for skew in skews:
                run = measure_split(skewed_counts(tokens, e, skew), k, n, dtype=dtype, threads=threads,
                                    repeats=3, min_run_time=0.02 if quick else 0.05)
                runs.append({"skew": skew, **run})
    return {"what": "expert GEMM [rows, K] x [E, K, N] vs one dense GEMM of the same FLOPs", "threads": threads,
            "torch": torch.__version__, "quick": quick, "triton": "not timed on CPU (interpreter: correctness only)",
            "runs": runs}
