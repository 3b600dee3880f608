"""The paths that differ between torch releases, chosen by what the installed torch has (never by its
version number), so the same pipeline runs on 2.9 and on 2.10+ and records which path ran.

    moe_path(device)        "grouped_mm" (F.grouped_mm, public from 2.10), "_grouped_mm" (the private
                            op, CUDA on 2.9), or "loop" (one matmul per expert)
    grouped_mm(x, w, offs)  through the first of those that exists
    varlen_attn()           torch.nn.attention.varlen.varlen_attn (2.10+), or None
    scaled_mm_attempts(...) F.scaled_mm (2.10+) then torch._scaled_mm: every attempt with its outcome
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def has_public_grouped_mm() -> bool:
    return hasattr(F, "grouped_mm")


@functools.lru_cache(maxsize=None)
def moe_path(device_type: str = "cpu") -> str:
    """How a mixture of experts runs its experts here: one grouped GEMM when this torch has one for this
    device, else a loop. On 2.9 `torch._grouped_mm` exists but only for CUDA (sm90+, bf16): probed, not
    assumed."""
    if has_public_grouped_mm():
        return "grouped_mm"
    if hasattr(torch, "_grouped_mm") and device_type != "cpu":
        try:
            x = torch.randn(4, 16, device=device_type, dtype=torch.bfloat16)
            w = torch.randn(2, 16, 16, device=device_type, dtype=torch.bfloat16)
            torch._grouped_mm(x, w, offs=torch.tensor([2, 4], dtype=torch.int32, device=device_type))
            return "_grouped_mm"
        except Exception:
            pass
    return "loop"


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, path: str) -> torch.Tensor:
    """x (tokens, K) sorted by group, w (groups, K, N), offs: cumulative END offsets (int32)."""
    if path == "grouped_mm":
        return F.grouped_mm(x, w, offs=offs)
    if path == "_grouped_mm":
        return torch._grouped_mm(x, w, offs=offs)
    raise ValueError(f"no grouped GEMM on path {path!r}")


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
