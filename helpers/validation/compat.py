"""The paths that differ between torch releases, chosen by what the installed torch runs (never by its
version number), so the same pipeline runs on 2.9 and on 2.10+ and records which path ran.

    moe_probes(device, dtype)  every grouped GEMM API tried here: {"F.grouped_mm": "ran" | "absent" | error,
                               "torch._grouped_mm": ..., "loop": "ran"}
    moe_path(device, dtype)    the first that ran: "grouped_mm" (F.grouped_mm, public from 2.10), "_grouped_mm"
                               (the private op: 2.9 runs it on CPU and CUDA), else "loop" (a matmul per expert)
    grouped_mm_kernel(...)     the kernel torch's dispatch picks for those operands (CUTLASS or one mm per group)
    grouped_mm(x, w, offs)     through the path moe_path chose
    varlen_attn()              torch.nn.attention.varlen.varlen_attn (2.10+), or None
    scaled_mm_attempts(...)    F.scaled_mm (2.10+) then torch._scaled_mm: every attempt with its outcome

F.grouped_mm (2.10) is a Python function that calls torch._grouped_mm, so the two run the same kernel: the
2.9 -> 2.10 change is the name, not the kernel.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

GROUPED_MM_APIS = {"F.grouped_mm": "grouped_mm", "torch._grouped_mm": "_grouped_mm"}   # API -> path name


def _grouped_mm_api(api: str):
    return getattr(F, "grouped_mm", None) if api == "F.grouped_mm" else getattr(torch, "_grouped_mm", None)


def _probe(fn, device_type: str, dtype: torch.dtype) -> str:
    """"ran" when fn runs forward and backward on a small problem of this device and dtype with 16-byte
    aligned rows (the kernels' stride rule), else the error's first line."""
    try:
        x = torch.randn(8, 16, device=device_type, dtype=dtype, requires_grad=True)
        w = torch.randn(2, 16, 16, device=device_type, dtype=dtype, requires_grad=True)
        y = fn(x, w, offs=torch.tensor([3, 8], dtype=torch.int32, device=device_type))
        y.float().square().sum().backward()       # a contiguous gradient, as a loss gives (not sum()'s expanded one)
        return "ran"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) else type(exc).__name__


@functools.lru_cache(maxsize=None)
def moe_probes(device_type: str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, str]:
    """Each grouped GEMM API tried on this device and dtype ("absent" when this torch lacks it); the
    per-expert loop runs everywhere."""
    probes = {}
    for api in GROUPED_MM_APIS:
        fn = _grouped_mm_api(api)
        probes[api] = "absent" if fn is None else _probe(fn, device_type, dtype)
    return probes | {"loop": "ran"}


def moe_path(device_type: str = "cpu", dtype: torch.dtype = torch.float32) -> str:
    """How a mixture of experts runs its experts here: the public API when it runs, else the private op
    when it runs, else a loop."""
    probes = moe_probes(device_type, dtype)
    return next((path for api, path in GROUPED_MM_APIS.items() if probes[api] == "ran"), "loop")


def grouped_mm_kernel(path: str, device: torch.device, dtype: torch.dtype) -> str:
    """The kernel behind a grouped GEMM path, by torch's own rule. torch._grouped_mm has two kernels in
    2.9 and 2.10 (native_functions.yaml): CompositeExplicitAutograd, which runs one mm per group
    (_grouped_mm_fallback), for every device but CUDA; and _grouped_mm_cuda, which takes the CUTLASS bf16
    grouped GEMM only when mat_a, mat_b and the output are bf16 and the GPU's compute capability major is
    9 or 10 (_scaled_mm_allowed_device(sm90_only, sm100_only)), else the same fallback; on ROCm the
    fallback unless torch was built with CK for the GPU."""
    if path == "loop":
        return "loop: one matmul per expert, in Python"
    if device.type == "cuda" and torch.version.hip is None:
        major = torch.cuda.get_device_capability(device)[0]
        if dtype == torch.bfloat16 and major in (9, 10):
            return f"CUTLASS bf16 grouped GEMM (sm{major}0, bf16 operands)"
        why = "operands are not bf16" if dtype != torch.bfloat16 else f"compute capability {major}.x is not 9.x or 10.x"
        return f"fallback: one mm per group inside ATen ({why})"
    if device.type == "cuda":
        return "fallback: one mm per group inside ATen, or CK grouped GEMM where torch was built with it (ROCm)"
    return f"fallback: one mm per group inside ATen ({device.type})"


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, path: str) -> torch.Tensor:
    """x (tokens, K) sorted by group, w (groups, K, N), offs: cumulative END offsets (int32)."""
    if path == "grouped_mm":
        return F.grouped_mm(x, w, offs=offs)
    if path == "_grouped_mm":
        return torch._grouped_mm(x, w, offs=offs)
    raise ValueError(f"no grouped GEMM on path {path!r}; use 'grouped_mm' or '_grouped_mm'")


def varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn as fn
    except ImportError:
        return None
    return fn


def scaled_mm_attempts(a8: torch.Tensor, b8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       out_dtype: torch.dtype = torch.bfloat16) -> tuple[str | None, torch.Tensor | None, dict]:
    """FP8 matmul with per-tensor scales through the first API that runs here. Returns (path, output,
    {api: "ran" or why it did not}). F.scaled_mm is 2.10's public API (its CPU kernel came later);
    torch._scaled_mm is the private op both 2.9 and 2.10 have (CPU: tensor-wise scales)."""
    tried: dict[str, str] = {}
    if hasattr(F, "scaled_mm"):
        try:
            st = getattr(F, "ScalingType", None) or F._ScalingType
            out = F.scaled_mm(a8, b8, scale_a, st.TensorWise, scale_b, st.TensorWise, output_dtype=out_dtype)
            tried["F.scaled_mm"] = "ran"
            return "F.scaled_mm", out, tried
        except Exception as exc:
            tried["F.scaled_mm"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    else:
        tried["F.scaled_mm"] = "not in this torch (public from 2.10)"
    if hasattr(torch, "_scaled_mm"):
        try:
            out = torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
            tried["torch._scaled_mm"] = "ran"
            return "torch._scaled_mm", out, tried
        except Exception as exc:
            tried["torch._scaled_mm"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    else:
        tried["torch._scaled_mm"] = "not in this torch"
    return None, None, tried
