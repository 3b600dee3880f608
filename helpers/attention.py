"""Attention kernels: which SDPA backend runs, ragged batches (padding, jagged, varlen, FlexAttention with a
document mask), training steps, memory and grouped-query attention per backend, compiled transformer blocks.

    from helpers import attention
    attention.backend_that_runs(q, k, v)                 # "FLASH_ATTENTION" on CPU for 4-D fp32 input
    outs = attention.jagged_attention(seqs)              # one output per sequence, no padding
    attention.check_against_reference(outs, seqs)

Shapes follow F.scaled_dot_product_attention: (batch, heads, seq, head_dim). A ragged batch is a list
of per-sequence tensors of shape (seq_len, heads, head_dim), the layout varlen_attn packs.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import tempfile
import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import bench

# The aten op each fused SDPA backend dispatches to (as OpOverload.name() spells it). MATH has no op of
# its own at dispatch level: it is a composition of ordinary ops (bmm or matmul, _safe_softmax).
BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "aten::_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "aten::_scaled_dot_product_fused_attention_overrideable": "OVERRIDEABLE",
    # the kernels' own ops, which CausalBias (causal_lower_right) and varlen_attn call directly
    "aten::_flash_attention_forward": "FLASH_ATTENTION",
    "aten::_efficient_attention_forward": "EFFICIENT_ATTENTION",
}
MATH_OPS = {"aten::bmm", "aten::matmul", "aten::_safe_softmax"}
BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


class OpNames(TorchDispatchMode):
    """Records the name of every aten op dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


def _backend(name: str) -> SDPBackend:
    if name not in SDPBackend.__members__ or name == "ERROR":
        raise ValueError(f"unknown SDPA backend {name!r}; use one of {', '.join(BACKENDS)}")
    return SDPBackend.__members__[name]


def backend_from_ops(names) -> str:
    """Name the SDPA backend from the aten ops one SDPA call dispatched."""
    fused = {BACKEND_OPS[n] for n in names if n in BACKEND_OPS}
    if len(fused) > 1:
        raise RuntimeError(f"expected one SDPA backend, found {sorted(fused)}")
    if fused:
        return fused.pop()
    if MATH_OPS & set(names):
        return "MATH"
    raise RuntimeError("no SDPA kernel ran (no fused attention op, no matmul)")


def backward_backend_from_ops(names) -> str:
    """Name the SDPA backend whose backward ran, from the aten ops one backward pass dispatched: a fused
    backend's backward is its forward op's name with `_backward`; MATH's is ordinary ops (bmm,
    _softmax_backward_data)."""
    fused = {BACKEND_OPS[n.removesuffix("_backward")] for n in names
             if n.endswith("_backward") and n.removesuffix("_backward") in BACKEND_OPS}
    if len(fused) > 1:
        raise RuntimeError(f"expected one SDPA backend's backward, found {sorted(fused)}")
    if fused:
        return fused.pop()
    if "aten::_softmax_backward_data" in names:
        return "MATH"
    raise RuntimeError("no SDPA backward ran (no fused attention backward, no softmax backward)")


def backend_that_runs(q, k, v, backends: list[str] | None = None, **sdpa_kwargs) -> str:
    """Run SDPA once, recording the aten ops it dispatches, and name the backend that ran.

    backends: restrict the choice, as `sdpa_kernel([...])` does; with none that fits the inputs, SDPA
    raises RuntimeError ("No viable backend ...").
    """
    allowed = [_backend(b) for b in (backends or BACKENDS)]
    with sdpa_kernel(allowed), OpNames() as ops:
        F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
    return backend_from_ops(ops.names)


def priority_order() -> list[str]:
    """The backends in the order SDPA tries them on CUDA (torch._C._get_sdp_priority_order(): per process,
    changed by sdpa_kernel(..., set_priority=True)). A CUDA build sets its default at the first SDPA call on
    the GPU: cuDNN first on sm90/sm100 when check_prefer_cudnn_attention() holds (sdp_utils.cpp), so read it
    after one call there. The CPU selector ignores it: flash, then MATH (sdp_utils_cpp.cpp)."""
    return [SDPBackend(int(i)).name for i in torch._C._get_sdp_priority_order()]


def backend_report(q, k, v, **sdpa_kwargs) -> dict[str, str]:
    """For each backend alone: the backend that ran, or the first line of the error it raised."""
    report = {}
    for name in BACKENDS:
        try:
            report[name] = f"runs ({backend_that_runs(q, k, v, [name], **sdpa_kwargs)})"
        except RuntimeError as exc:
            report[name] = str(exc).splitlines()[0]
    return report


def sdpa_reference(q, k, v, attn_mask=None, is_causal: bool = False, scale: float | None = None):
    """softmax(q k^T * scale + mask) v, written out in float64: the reference every kernel is checked against.
    A boolean mask keeps the positions where it is True (SDPA's convention)."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = q64 @ k64.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.double()
    return (scores.softmax(-1) @ v64).to(q.dtype)


# --- Ragged batches ---------------------------------------------------------------------------

def random_ragged(lengths: list[int], heads: int, head_dim: int, *, dtype=torch.float32,
                  device="cpu", seed: int = 0) -> list[torch.Tensor]:
    """One (length, heads, head_dim) tensor per sequence."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of positive ints, got {lengths}")
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, head_dim, generator=gen).to(device=device, dtype=dtype) for n in lengths]


def pack(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Concatenate sequences into (total_tokens, heads, head_dim) with int32 cumulative offsets
    [0, n0, n0+n1, ...] and the longest length: the inputs of varlen_attn and of a jagged tensor."""
    lengths = torch.tensor([s.shape[0] for s in seqs])
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    offsets[1:] = lengths.cumsum(0)
    return torch.cat(seqs), offsets.to(seqs[0].device), int(lengths.max())


def pad_with_mask(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest sequence: (batch, heads, max_len, head_dim) and a boolean key mask
    (batch, 1, 1, max_len) that is True on real tokens, False on padding."""
    padded = nn.utils.rnn.pad_sequence(seqs, batch_first=True)          # (B, L, H, D)
    lengths = torch.tensor([s.shape[0] for s in seqs], device=padded.device)
    keep = torch.arange(padded.shape[1], device=padded.device)[None, :] < lengths[:, None]
    return padded.transpose(1, 2), keep[:, None, None, :]


def padded_attention(seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pad + mask, one SDPA call; returns each sequence's output with the padding cut off."""
    x, keep = pad_with_mask(seqs)
    out = F.scaled_dot_product_attention(x, x, x, attn_mask=keep).transpose(1, 2)   # (B, L, H, D)
    return [o[: s.shape[0]] for o, s in zip(out, seqs)]


def jagged_attention(seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A nested tensor with the jagged layout built from the packed values and offsets, one SDPA call."""
    values, offsets, _ = pack(seqs)
    nt = torch.nested.nested_tensor_from_jagged(values, offsets.to(torch.int64))     # (B, j, H, D)
    out = F.scaled_dot_product_attention(nt.transpose(1, 2), nt.transpose(1, 2), nt.transpose(1, 2))
    return list(out.transpose(1, 2).unbind())


def loop_attention(seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """One SDPA call per sequence: no padding, but one dispatch per sequence."""
    return [F.scaled_dot_product_attention(*(s.transpose(0, 1)[None],) * 3)[0].transpose(0, 1) for s in seqs]


def varlen_causal_kwargs() -> dict:
    """How the installed varlen_attn asks for causal masking: 2.10 documents `is_causal=True`;
    later releases replaced it with `window_size=(-1, 0)`."""
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    return {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}


def varlen_attention(seqs: list[torch.Tensor], causal: bool = False) -> list[torch.Tensor]:
    """torch.nn.attention.varlen.varlen_attn on the packed batch (CUDA, fp16/bf16; `meta` for shapes)."""
    from torch.nn.attention.varlen import varlen_attn
    packed, offsets, longest = pack(seqs)
    out = varlen_attn(packed, packed, packed, offsets, offsets, longest, longest,
                      **(varlen_causal_kwargs() if causal else {}))
    return list(out.split([s.shape[0] for s in seqs]))


def ragged_kernels(seqs: list[torch.Tensor], *, varlen: bool = True) -> dict[str, Callable[[], torch.Tensor]]:
    """The ragged-batch kernels alone, for timing: padding, packing, the nested tensor and the offsets'
    host-to-device copy are done here, once, so a timed call is one attention call. varlen=False leaves
    out varlen_attn (a CUDA kernel)."""
    x, keep = pad_with_mask(seqs)
    values, offsets, longest = pack(seqs)
    nt = torch.nested.nested_tensor_from_jagged(values, offsets.to(torch.int64)).transpose(1, 2)
    kernels = {"padded + mask": lambda: F.scaled_dot_product_attention(x, x, x, attn_mask=keep),
               "jagged nested": lambda: F.scaled_dot_product_attention(nt, nt, nt)}
    if varlen:
        from torch.nn.attention.varlen import varlen_attn
        kernels["varlen_attn"] = lambda: varlen_attn(values, values, values, offsets, offsets, longest, longest)
    return kernels


def ragged_training_fns(lengths: list[int], *, varlen: bool = True, flex: bool = True, device="cpu") -> dict:
    """Attention over a ragged batch as functions of the packed (total_tokens, heads, head_dim) q, k, v that
    return the packed output, every layout change inside them differentiable, so one training step is
    fn(q, k, v).backward(grad) and the gradients of every method compare directly. varlen=False leaves out
    varlen_attn and its compiled form (CUDA kernels), flex=False the compiled FlexAttention."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    offsets, longest = offsets.to(device), max(lengths)
    keep = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).to(device)[:, None, None, :]

    def padded(q, k, v):
        q, k, v = (nn.utils.rnn.pad_sequence(x.split(lengths), batch_first=True).transpose(1, 2) for x in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2)
        return torch.cat([o[:n] for o, n in zip(out, lengths)])

    fns = {"padded + mask": padded}
    if varlen:
        from torch.nn.attention.varlen import varlen_attn

        def packed(q, k, v):
            return varlen_attn(q, k, v, offsets, offsets, longest, longest)
        fns["varlen_attn"], fns["varlen_attn compiled"] = packed, torch.compile(packed)
    if flex:
        from torch.nn.attention.flex_attention import flex_attention
        block_mask = document_block_mask(lengths, device=device, compiled=True)
        flex_compiled = torch.compile(flex_attention)

        def flex(q, k, v):
            q, k, v = (x.transpose(0, 1)[None].contiguous() for x in (q, k, v))
            return flex_compiled(q, k, v, block_mask=block_mask)[0].transpose(0, 1)
        fns["flex compiled"] = flex
    return fns


def packed_grads(fn: Callable, q, k, v, grad_out) -> tuple[torch.Tensor, ...]:
    """(out, dq, dk, dv) of fn on leaves copied from q, k, v, for the upstream gradient grad_out."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out))


def loop_reference_fn(lengths: list[int], dtype=torch.float32) -> Callable:
    """Attention one sequence at a time in `dtype` (no padding, no packing): the gradients' reference."""
    def per_sequence(q, k, v):
        outs = [F.scaled_dot_product_attention(*(x.transpose(0, 1)[None].to(dtype) for x in s))[0].transpose(0, 1)
                for s in zip(q.split(lengths), k.split(lengths), v.split(lengths))]
        return torch.cat(outs).to(q.dtype)
    return per_sequence


def ragged_tflop(lengths: list[int], heads: int, head_dim: int) -> float:
    """The useful work of one non-causal attention forward over a ragged batch, in TFLOP:
    two matmuls of n x n x head_dim per sequence and head (padding not counted)."""
    return 4 * sum(n * n for n in lengths) * heads * head_dim / 1e12


def error_per_backend(q: torch.Tensor, backends=BACKENDS, *, causal: bool = True) -> dict[str, float | str]:
    """Max absolute difference from the float64 reference for each backend forced alone, or
    "declined: <torch's first line>" where the backend cannot take these inputs."""
    reference = sdpa_reference(q, q, q, is_causal=causal).double()
    errors = {}
    for name in backends:
        try:
            with sdpa_kernel([_backend(name)]):
                out = F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        except RuntimeError as exc:
            errors[name] = "declined: " + str(exc).strip().splitlines()[0][:120]
            continue
        errors[name] = (out.double() - reference).abs().max().item()
    return errors


def peak_memory_per_backend(q: torch.Tensor, backends, *, causal: bool = True) -> dict[str, int]:
    """Bytes one forward call allocates at its peak, beyond what is already held, per backend
    (torch.accelerator's peak statistics: an accelerator only). MATH materialises the seq x seq
    scores; the fused kernels never do."""
    peaks = {}
    for name in backends:
        torch.accelerator.synchronize(q.device)
        held = torch.accelerator.memory_allocated(q.device)
        torch.accelerator.reset_peak_memory_stats(q.device)
        with sdpa_kernel([_backend(name)]):
            out = F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        torch.accelerator.synchronize(q.device)
        peaks[name] = torch.accelerator.max_memory_allocated(q.device) - held
        del out
    return peaks


def gpu_kernel_names(fn: Callable[[], object]) -> set[str]:
    """The names of the GPU kernels fn launched, from torch.profiler (NVIDIA and AMD GPUs)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()    # every GPU of this process: the profiler reads them all
    return {e.name for e in prof.events() if e.device_type.name in ("CUDA", "PrivateUse1")}


def rocm_flash_library_that_ran(fn: Callable[[], object]) -> str:
    """Which ROCm flash-attention library fn's kernels came from, read from the profiler's kernel names:
    "ck" (Composable Kernel: ck_tile FmhaFwdKernel/FmhaBwd* kernels), "aotriton" (its Triton kernels
    attn_fwd/bwd_kernel*, or the AITER fmha_v3 assembly kernels it also dispatches), or "unknown: <names>".
    preferred_rocm_fa_library("ck") only warns when CK cannot be used, so the name is the proof."""
    return library_from_kernel_names(gpu_kernel_names(fn))


def library_from_kernel_names(names) -> str:
    """CK's kernels are ck_tile templates (ck_tile::FmhaFwdKernel, FmhaBwdDQDKDVKernel, ...). "fmha" alone
    does not say CK: AOTriton also dispatches AITER's fmha_v3 assembly kernels, forward and backward
    (ROCm/aotriton#158), whose names start with fmha_fwd/fmha_bwd too."""
    lowered = [n.lower() for n in names]
    if any("ck_tile" in n or "fmhafwdkernel" in n or "fmhabwd" in n for n in lowered):
        return "ck"
    if any("attn_fwd" in n or "bwd_kernel" in n or "aiter" in n for n in lowered):
        return "aotriton"
    return "unknown: " + ", ".join(sorted(names)[:5])


def reference_outputs(seqs: list[torch.Tensor], causal: bool = False) -> list[torch.Tensor]:
    return [sdpa_reference(*(s.transpose(0, 1),) * 3, is_causal=causal).transpose(0, 1) for s in seqs]


def max_error(outs: list[torch.Tensor], seqs: list[torch.Tensor], causal: bool = False) -> float:
    """Largest absolute difference from the float64 reference over all sequences."""
    if len(outs) != len(seqs):
        raise ValueError(f"{len(outs)} outputs for {len(seqs)} sequences")
    refs = reference_outputs(seqs, causal)
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    return max((o.double() - r.double()).abs().max().item() for o, r in zip(outs, refs))


def wasted_fraction(lengths: list[int]) -> float:
    """Share of a padded batch's attention scores (L_max^2 per sequence) spent on padding."""
    longest = max(lengths)
    return 1 - sum(n * n for n in lengths) / (len(lengths) * longest * longest)


# --- FlexAttention with a document mask ------------------------------------------------------

def document_ids(lengths: list[int], device="cpu") -> torch.Tensor:
    """The sequence (document) each token of the packed batch belongs to: [0]*n0 + [1]*n1 + ..."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)


def document_block_mask(lengths: list[int], *, block_size: int = 128, device="cpu", compiled: bool = False):
    """A FlexAttention BlockMask that lets a token attend only to tokens of its own sequence, for the
    packed batch of `lengths` seen as one row of sum(lengths) tokens. Eager create_block_mask evaluates the
    mask over the whole total x total grid (memory in total²); compiled=True builds it with
    torch.compile(create_block_mask), which never writes that dense mask (for long packed batches)."""
    from torch.nn.attention.flex_attention import create_block_mask
    doc = document_ids(lengths, device)

    def same_document(batch, head, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    total = sum(lengths)
    build = torch.compile(create_block_mask) if compiled else create_block_mask
    return build(same_document, None, None, total, total, device=device, BLOCK_SIZE=block_size)


def blocks_computed(block_mask) -> tuple[int, int]:
    """(blocks the kernel visits, blocks of the full score matrix): partial plus full blocks, per query
    block, summed over batch and heads of the mask."""
    visited = block_mask.kv_num_blocks.sum().item()
    if block_mask.full_kv_num_blocks is not None:
        visited += block_mask.full_kv_num_blocks.sum().item()
    rows, cols = block_mask.kv_indices.shape[-2:]
    return visited, rows * cols * block_mask.kv_num_blocks[..., 0].numel()


def packed_heads_first(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed batch as one (1, heads, total_tokens, head_dim) row, three separate contiguous
    tensors for q, k and v (the CPU FlexAttention template of torch 2.10 refuses one buffer for all three)."""
    values = pack(seqs)[0].transpose(0, 1)[None].contiguous()
    return values, values.clone(), values.clone()


def split_heads_first(out: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Undo packed_heads_first on an output: one (length, heads, head_dim) tensor per sequence."""
    return list(out[0].transpose(0, 1).split(lengths))


def compile_flex_attention(q, k, v, block_mask) -> tuple[Callable | None, float, str]:
    """torch.compile(flex_attention), tried on these inputs: (compiled function, seconds the first call
    took, "") where Inductor builds the fused kernel, else (None, seconds, the error's first line). On CPU
    the fused kernel needs AVX2 and not macOS, and serves inference only (torch/_inductor/kernel/flex/flex_cpu.py)."""
    from torch.nn.attention.flex_attention import flex_attention
    compiled = torch.compile(flex_attention)
    start = time.perf_counter()
    try:
        compiled(q, k, v, block_mask=block_mask)
    except Exception as exc:       # InductorError / BackendCompilerFailed wrap the real reason
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return None, time.perf_counter() - start, f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
    return compiled, time.perf_counter() - start, ""


def try_backward(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> str:
    """Run fn on copies of inputs that require grad, then backward: "ok", or the error's type and first line."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    try:
        fn(*leaves).sum().backward()
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]
    return "ok"


# --- Training: forward + backward per backend ------------------------------------------------

def attention_grads(q, k, v, backend: str | None = None, *, causal: bool = True, grad_out=None):
    """(dq, dk, dv) of sum(out * grad_out) for one SDPA call; backend forces one, None lets SDPA choose.
    A float64 q, k, v with backend=None through sdpa_reference gives the reference gradients."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    if backend is None:
        out = sdpa_reference(q, k, v, is_causal=causal)
    else:
        with sdpa_kernel([_backend(backend)]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad_out = torch.ones_like(out) if grad_out is None else grad_out.to(out.dtype)
    return torch.autograd.grad(out, (q, k, v), grad_out)


def gradient_error_per_backend(q, k, v, backends=("MATH", "FLASH_ATTENTION"), *, causal: bool = True,
                               seed: int = 0) -> dict[str, float]:
    """Largest absolute difference of dq, dk, dv from float64 autograd, per backend forced alone."""
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device)
    reference = attention_grads(q.double(), k.double(), v.double(), causal=causal, grad_out=grad_out)
    return {name: max((g.double() - r).abs().max().item()
                      for g, r in zip(attention_grads(q, k, v, name, causal=causal, grad_out=grad_out), reference))
            for name in backends}


def attention_tflop(batch: int, heads: int, seq: int, head_dim: int, *, causal: bool = True,
                    backward: bool = False) -> float:
    """Work of one attention call in TFLOP: two seq x seq x head_dim matmuls forward (half of them under a
    causal mask); forward + backward counts 3.5x the forward, as the FlashAttention benchmarks do
    (Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py)."""
    forward = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    return forward * (3.5 if backward else 1) / 1e12


def time_training_step(seq_lens: list[int], batch: int = 1, heads: int = 4, head_dim: int = 64,
                       backends=("MATH", "FLASH_ATTENTION"), repeats: int = 3, min_run_time: float = 0.05,
                       threads: int | None = None) -> dict:
    """Median time of forward + backward (causal self-attention, fp32, CPU) per backend and length,
    measured interleaved at `threads` threads (default: the current count); GFLOP/s counts the useful work
    of attention_tflop(backward=True). min_s/max_s and separated[n] as in time_backends."""
    threads = threads or torch.get_num_threads()
    rows, gflops, lows, highs, apart = {}, {}, {}, {}, {}
    for n in seq_lens:
        q, k, v = (torch.randn(batch, heads, n, head_dim, requires_grad=True) for _ in range(3))
        grad_out = torch.randn(batch, heads, n, head_dim)

        def step(b):
            return lambda: attention_grads(q, k, v, b, grad_out=grad_out)
        work = attention_tflop(batch, heads, n, head_dim, backward=True) * 1e3
        r = bench.compare({b: step(b) for b in backends}, baseline=backends[0], repeats=repeats,
                          min_run_time=min_run_time, device="cpu", threads=threads, work=work, work_unit="GFLOP")
        rows[n] = {b: r["results"][b]["median_s"] for b in backends}
        gflops[n] = {b: r["results"][b]["GFLOP_per_s"] for b in backends}
        lows[n] = {b: r["results"][b]["min_s"] for b in backends}
        highs[n] = {b: r["results"][b]["max_s"] for b in backends}
        apart[n] = len(backends) < 2 or bench.separated(r, backends[0], backends[1])
    return {"seq_lens": list(seq_lens), "backends": list(backends), "median_s": rows, "GFLOP_per_s": gflops,
            "min_s": lows, "max_s": highs, "separated": apart, "repeats": repeats,
            "batch": batch, "heads": heads, "head_dim": head_dim, "device": "cpu",
            "threads": threads, "torch": torch.__version__}


# --- Memory on the CPU ------------------------------------------------------------------------

def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Bytes fn allocates on the CPU at its peak beyond what was held before, read from the profiler's
    memory events ("Total Allocated" after each allocation and free, in its trace)."""
    from torch.profiler import ProfilerActivity, profile
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")     # torch 2.10 warns each time
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e["args"] for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    finally:
        os.remove(path)
    if not events:
        return 0
    held_before = events[0]["Total Allocated"] - events[0]["Bytes"]
    return max(e["Total Allocated"] for e in events) - held_before


def forward_peak_memory(seq_lens: list[int], batch: int = 1, heads: int = 4, head_dim: int = 64,
                        backends=("MATH", "FLASH_ATTENTION"), *, causal: bool = True, dtype=torch.float32,
                        device: torch.device | str = "cpu") -> dict:
    """Peak bytes of one causal forward per backend and sequence length, beyond its inputs: the profiler's
    memory events on a CPU, the accelerator's peak statistics elsewhere. score_matrix_bytes is one fp32
    score matrix: MATH keeps its scores in fp32 for fp16/bf16 inputs too (unless
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True))."""
    device = torch.device(device)
    peaks = {}
    for n in seq_lens:
        q, k, v = (torch.randn(batch, heads, n, head_dim, device=device).to(dtype) for _ in range(3))
        if device.type != "cpu":
            peaks[n] = peak_memory_per_backend(q, backends, causal=causal)
            continue

        def forward(b):
            def call():
                with sdpa_kernel([_backend(b)]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return call
        peaks[n] = {b: cpu_peak_bytes(forward(b)) for b in backends}
    return {"seq_lens": list(seq_lens), "backends": list(backends), "peak_bytes": peaks, "dtype": str(dtype),
            "device": str(device), "score_matrix_bytes": {n: batch * heads * n * n * 4 for n in seq_lens}}


# --- Grouped-query attention ------------------------------------------------------------------

def repeat_kv_heads(k: torch.Tensor, query_heads: int) -> torch.Tensor:
    """Each key/value head repeated for the query heads that share it: what enable_gqa=True spares."""
    if query_heads % k.shape[-3]:
        raise ValueError(f"{query_heads} query heads are not a multiple of {k.shape[-3]} key/value heads")
    return k.repeat_interleave(query_heads // k.shape[-3], dim=-3)


# --- Why a backend declined -------------------------------------------------------------------

def flash_runs_on(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether SDPA's FLASH_ATTENTION takes a small causal call in `dtype` on `device`, tried rather than
    inferred: CUDA's flash needs sm80+ (a T4, sm_75, has none) and fp16/bf16; ROCm's depends on the GPU."""
    q = torch.randn(1, 1, 16, 64, device=device, dtype=dtype)
    return decline_reasons(q, q, q, ["FLASH_ATTENTION"], is_causal=True)[0] == "ran FLASH_ATTENTION"


def decline_reasons(q, k, v, backends: list[str], **sdpa_kwargs) -> tuple[str, list[str]]:
    """Force `backends` and run SDPA: ("ran <backend>", []) or (the error's first line, the warnings
    torch emitted with it). When no allowed CPU backend fits, ATen re-runs the flash checks with debug
    on, and each failed check warns its reason (aten/src/ATen/native/transformers/sdp_utils_cpp.cpp)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome = f"ran {backend_that_runs(q, k, v, backends, **sdpa_kwargs)}"
        except RuntimeError as exc:
            outcome = str(exc).strip().splitlines()[0]
    return outcome, [str(w.message).split(" (Triggered internally")[0] for w in caught]


# --- A transformer block, eager and compiled --------------------------------------------------

class Block(nn.Module):
    """Pre-norm transformer block: attention through SDPA, then a 4x MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.norm2(x))


def compile_and_compare(batch: int, seq: int, dim: int = 128, heads: int = 4, *, repeats: int = 3,
                        min_run_time: float = 0.1) -> dict:
    """Eager vs torch.compile on one Block (inference, no_grad): compile time, max difference, timings."""
    torch.manual_seed(0)
    block = Block(dim, heads).eval()
    x = torch.randn(batch, seq, dim)
    compiled = torch.compile(block)
    with torch.no_grad():
        start = time.perf_counter()
        got = compiled(x)
        compile_s = time.perf_counter() - start
        diff = (got - block(x)).abs().max().item()
        result = bench.compare({"eager": lambda: block(x), "compiled": lambda: compiled(x)},
                               baseline="eager", repeats=repeats, min_run_time=min_run_time, device="cpu")
    result["compile_s"], result["max_abs_diff"], result["shape"] = compile_s, diff, [batch, seq, dim]
    return result


# --- Measurements -----------------------------------------------------------------------------

def time_backends(seq_lens: list[int], batch: int = 1, heads: int = 4, head_dim: int = 64,
                  backends=("MATH", "FLASH_ATTENTION"), repeats: int = 3, min_run_time: float = 0.05,
                  dtype=torch.float32, device=None, threads: int | None = None) -> dict:
    """Median time per backend at each sequence length (causal self-attention), measured interleaved at
    `threads` threads (default: the current count); min_s/max_s hold each one's spread over the repeats, and
    separated[n] whether the first two backends' spreads did not overlap (bench.separated)."""
    device = device or "cpu"
    threads = threads or torch.get_num_threads()
    rows, lows, highs, apart = {}, {}, {}, {}
    for n in seq_lens:
        q = torch.randn(batch, heads, n, head_dim, dtype=dtype, device=device)
        def run(b):
            def call():
                with sdpa_kernel([_backend(b)]):
                    F.scaled_dot_product_attention(q, q, q, is_causal=True)
            return call
        r = bench.compare({b: run(b) for b in backends}, baseline=backends[0], repeats=repeats,
                          min_run_time=min_run_time, device=device, threads=threads)
        rows[n] = {b: r["results"][b]["median_s"] for b in backends}
        lows[n] = {b: r["results"][b]["min_s"] for b in backends}
        highs[n] = {b: r["results"][b]["max_s"] for b in backends}
        apart[n] = len(backends) < 2 or bench.separated(r, backends[0], backends[1])
    return {"seq_lens": list(seq_lens), "backends": list(backends), "median_s": rows, "min_s": lows,
            "max_s": highs, "separated": apart, "repeats": repeats,
            "batch": batch, "heads": heads, "head_dim": head_dim, "dtype": str(dtype),
            "threads": threads, "torch": torch.__version__}


def time_ragged(lengths: list[int], heads: int = 4, head_dim: int = 64, repeats: int = 3,
                min_run_time: float = 0.05) -> dict:
    """Padded + mask vs jagged nested tensor vs a loop, on one ragged batch."""
    seqs = random_ragged(lengths, heads, head_dim)
    r = bench.compare({"padded + mask": lambda: padded_attention(seqs),
                       "jagged nested": lambda: jagged_attention(seqs),
                       "loop per sequence": lambda: loop_attention(seqs)},
                      baseline="padded + mask", repeats=repeats, min_run_time=min_run_time, device="cpu")
    r["lengths"], r["wasted_fraction"] = list(lengths), wasted_fraction(lengths)
    return r


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench attention`: backends vs sequence length, ragged batches, compiled block."""
    lens = [128, 512] if quick else [128, 256, 512, 1024, 2048]
    ragged = [17, 40, 9, 128] if quick else [33, 500, 61, 1024, 12, 700, 90, 256]
    return {"backends_vs_seq_len": time_backends(lens),
            "ragged": time_ragged(ragged),
            "compiled_block": compile_and_compare(1 if quick else 8, 32 if quick else 256)}
