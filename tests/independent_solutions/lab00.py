"""Lab 00 (warm-up), solved independently.

Written from the student copy of the lab (labs/00_warmup_lab.ipynb), the lessons, the public helpers and
PyTorch's documentation alone, as a learner would: without the lab's solutions or the grader's reference
answers.
"""
import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    # The stable recipe on a fully masked row: max = -inf, x - max = -inf - (-inf) = nan.
    # Shift by 0 there instead (exp(-inf - 0) = 0), and divide by 1 where the sum is 0 (0 / 1 = 0).
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension, written from the student copy's exercise 2 alone.

    Each row is scaled by a power of two, exact in any binary float dtype, that brings its largest magnitude
    into [0.5, 1): its squares then neither overflow (float16 squares entries from 256 up to inf) nor
    underflow (1e-4 squares to 1e-8, below float16's smallest normal). Only per-row statistics are made in
    float32; every tensor of x's size stays in x's dtype.
    """
    n = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(
            f"rms_norm: weight has shape {tuple(weight.shape)} but x's last dimension is {n}; "
            f"pass a 1-D weight of length {n} (one factor per feature of x's last dimension)")
    peak = torch.maximum(x.amax(dim=-1, keepdim=True), -x.amin(dim=-1, keepdim=True)).float()
    _, exponent = torch.frexp(peak)            # peak = m * 2**exponent, 0.5 <= m < 1; a row of zeros gives 0
    shift = max(0, (n.bit_length() - 14) // 2)  # long rows: keep the sum of squares within float16's range
    top = math.frexp(torch.finfo(x.dtype).max)[1] - 1   # the largest power of two x's dtype holds
    scale = torch.exp2((-exponent - shift).clamp(max=top).float())
    y = x * scale.to(x.dtype)
    # mean(x**2) + eps = (mean(y**2) + eps * scale**2) / scale**2; where eps * scale**2 overflows, the
    # true result is below 1e-19 and 0 is returned.
    ms = torch.linalg.vecdot(y, y, dim=-1).unsqueeze(-1).float() / n + eps * scale * scale
    inv = torch.where(ms > 0, torch.rsqrt(ms), 0.0)
    return y * inv.to(x.dtype) * weight
