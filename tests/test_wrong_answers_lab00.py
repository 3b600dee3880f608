"""Lab 00 (warm-up): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import pytest
import torch

from helpers.checks import CheckFailed
from helpers.grading.checks import check
from wrong_answers import FORBIDDEN_HINT, MATCH_HINT, L00, Wrong, lab_tests


def softmax_no_max(x, dim=-1):
    # exp without subtracting the maximum: overflows to inf / inf
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_last_dim_only(x, dim=-1):
    # reduces over the last dimension whatever `dim` says
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def softmax_global_max(x, dim=-1):
    # subtracts the maximum of the whole tensor, not of each row: rows far below it underflow to 0 / 0
    e = (x - x.max()).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_float32(x, dim=-1):
    # converts to float32 first
    x = x.float()
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_calls_torch(x, dim=-1):
    # the function the exercise asks to write, under another name
    return torch.nn.functional.softmax(x, dim=dim)


def rms_norm_no_eps(x, weight, eps=1e-6):
    # eps forgotten
    if weight.shape != x.shape[-1:]:
        raise ValueError("weight must have shape (x.shape[-1],)")
    return x / x.pow(2).mean(-1, keepdim=True).sqrt() * weight


def rms_norm_eps_outside(x, weight, eps=1e-6):
    # eps added after the square root
    if weight.shape != x.shape[-1:]:
        raise ValueError("weight must have shape (x.shape[-1],)")
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight


def rms_norm_no_check(x, weight, eps=1e-6):
    # never validates the weight: broadcasting raises RuntimeError, or silently works
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_vague_error(x, weight, eps=1e-6):
    # raises, but the message does not say what was wrong
    if weight.shape != x.shape[-1:]:
        raise ValueError("shapes do not match")
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_whole_tensor(x, weight, eps=1e-6):
    # the mean over every element, not over the last dimension
    if weight.shape != x.shape[-1:]:
        raise ValueError("weight must have shape (x.shape[-1],)")
    return x * torch.rsqrt(x.pow(2).mean() + eps) * weight


def softmax_unmasked(x, dim=-1):
    # the stable recipe and nothing more: a fully masked row gives nan
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_finite_mask(x, dim=-1):
    # replaces -inf with a large finite number, as older attention code does: a fully masked row gives 1/n
    x = x.masked_fill(torch.isneginf(x), -1e9)
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_float32_stand_ins(x, dim=-1):
    # keeps a fully masked row finite with stand-ins sized for float32: in float16 -1e30 is -inf and 1e-30 is 0
    m = x.amax(dim=dim, keepdim=True).clamp(min=-1e30)
    e = (x - m).exp()
    return e / e.sum(dim=dim, keepdim=True).clamp(min=1e-30)


def softmax_fixed_device(x, dim=-1):
    # right values on the CPU, but builds the stand-in maximum on a fixed device (the CPU)
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros(m.shape, dtype=x.dtype), m)
    e = (x - m).exp()
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def softmax_python_branch(x, dim=-1):
    # right values, but asks the tensor a yes/no question in Python: a host round trip on an accelerator
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    out = e / e.sum(dim=dim, keepdim=True)
    if torch.isnan(out).any():
        out = torch.where(torch.isnan(out), torch.zeros_like(out), out)
    return out


def softmax_nan_to_num(x, dim=-1):
    # a second, differently written right answer: the stable recipe, then nan -> 0 (only a fully masked row
    # makes nan here), with the maximum and the sum taken by other calls
    m = torch.max(x, dim=dim, keepdim=True).values
    e = torch.exp(x - m)
    return torch.nan_to_num(e / torch.sum(e, dim=dim, keepdim=True), nan=0.0)


def rms_norm_fp32_stats(x, weight, eps=1e-6):
    # a second, differently written right answer: checks by length, divides by a square root
    if weight.dim() != 1 or weight.numel() != x.shape[-1]:
        raise ValueError(f"weight must be 1-D of length {x.shape[-1]} (x's last dimension), got "
                         f"{tuple(weight.shape)}")
    return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * weight


def test_check_raises_the_hint():
    with pytest.raises(CheckFailed) as failed:
        check(L00, softmax_last_dim_only, function="softmax")
    assert "use the dim argument" in str(failed.value)


WRONG = [
    Wrong(L00, "softmax", "no-max", softmax_no_max, "huge values (1e4) do not overflow", "subtract the maximum first"),
    Wrong(L00, "softmax", "no-max-visible", softmax_no_max, "large values, last dim", "subtract x.amax"),
    Wrong(L00, "softmax", "last-dim-only", softmax_last_dim_only, "along dim 0", "use the dim argument"),
    Wrong(L00, "softmax", "global-max", softmax_global_max, "huge values (1e4) do not overflow",
          "subtract the maximum first"),
    Wrong(L00, "softmax", "float32", softmax_float32, "float64 keeps its dtype", "do not convert to float32"),
    Wrong(L00, "softmax", "calls-torch", softmax_calls_torch, "large values, last dim", FORBIDDEN_HINT),
    Wrong(L00, "softmax", "unmasked", softmax_unmasked, "a fully masked row gives zeros", "Not NaN"),
    Wrong(L00, "softmax", "finite-mask", softmax_finite_mask, "a fully masked row gives zeros", "and not 1/n"),
    Wrong(L00, "softmax", "float32-stand-ins", softmax_float32_stand_ins, "a fully masked row in float16",
          "is -inf or 0 in float16"),
    Wrong(L00, "softmax", "fixed-device", softmax_fixed_device,
          "runs on any device, keeps the dtype (a float64 meta tensor)", "never on a fixed device"),
    Wrong(L00, "softmax", "python-branch", softmax_python_branch,
          "runs on any device, keeps the dtype (a float64 meta tensor)", "never read a value back to Python"),
    Wrong(L00, "rms_norm", "no-eps", rms_norm_no_eps, "eps is used", "add eps inside the square root"),
    Wrong(L00, "rms_norm", "eps-outside-sqrt", rms_norm_eps_outside, "eps is used", "add eps inside the square root"),
    Wrong(L00, "rms_norm", "no-weight-check", rms_norm_no_check, "a mismatched weight is rejected",
          "compare weight.shape with x.shape[-1:]"),
    Wrong(L00, "rms_norm", "vague-error", rms_norm_vague_error, "a mismatched weight is rejected", MATCH_HINT),
    Wrong(L00, "rms_norm", "whole-tensor-mean", rms_norm_whole_tensor, "values", "mean(x**2 over the last dim)"),
]

SECOND_SOLUTIONS = [("softmax", softmax_nan_to_num), ("rms_norm", rms_norm_fp32_stats)]

globals().update(lab_tests(L00, WRONG, SECOND_SOLUTIONS))
