"""Lab 00 (warm-up), solved independently.

Written from the student copy of the lab (labs/00_warmup_lab.ipynb), the lessons, the public helpers and
PyTorch's documentation alone, as a learner would: without the lab's solutions or the grader's reference
answers.
"""
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
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"rms_norm: weight has shape {tuple(weight.shape)} but x's last dimension is {x.shape[-1]}; "
            f"pass a 1-D weight of length {x.shape[-1]} (one factor per feature of x's last dimension)")
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight
