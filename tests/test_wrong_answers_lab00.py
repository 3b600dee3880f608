"""Lab 00 (warm-up): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import pytest
import torch

from helpers.checks import CheckFailed
from helpers.grading.checks import check
from wrong_answers import FORBIDDEN_HINT, MATCH_HINT, L00, REPO, Wrong, lab_tests, prepared


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


def _checked(x, weight):
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")


def rms_norm_as_written(x, weight, eps=1e-6):
    # the formula in x's dtype: in float16 x**2 is inf past |x| = 256, and the row comes out as 0
    _checked(x, weight)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_float32_sum(x, weight, eps=1e-6):
    # accumulates the mean in float32, but the squares were taken in float16 and are inf already
    _checked(x, weight)
    mean_sq = x.pow(2).mean(-1, keepdim=True, dtype=torch.float32)
    return x * torch.rsqrt(mean_sq + eps).to(x.dtype) * weight


def rms_norm_half_norm(x, weight, eps=1e-6):
    # a norm in x's dtype: sqrt(sum of squares) passes 65504 long before the entries do
    _checked(x, weight)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * torch.rsqrt(norm * norm / x.shape[-1] + eps) * weight


def rms_norm_upcast(x, weight, eps=1e-6):
    # right values, through a float32 copy of x
    _checked(x, weight)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rms_norm_promoted(x, weight, eps=1e-6):
    # float32 statistics per row, but x times a float32 factor is float32 of x's size (type promotion)
    _checked(x, weight)
    s = x.abs().amax(-1, keepdim=True)
    s = torch.where(s == 0, torch.ones_like(s), s)
    mean_sq = (x / s).pow(2).mean(-1, keepdim=True).float() * s.float().pow(2)
    return (x * torch.rsqrt(mean_sq + eps) * weight).to(x.dtype)


def rms_norm_returns_float32(x, weight, eps=1e-6):
    # computes in float32 and returns it
    _checked(x, weight)
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_fixed_scale(x, weight, eps=1e-6):
    # one fixed factor keeps 6e4 squared finite, and sends the squares of small entries to 0
    _checked(x, weight)
    mean_sq = (x / 256).pow(2).mean(-1, keepdim=True, dtype=torch.float32) * 256**2
    return x * torch.rsqrt(mean_sq + eps).to(x.dtype) * weight


def rms_norm_eps_over_square(x, weight, eps=1e-6):
    # scales each row in x's dtype, but squares the small scale there: s**2 for s near 7e-4 is a float16
    # subnormal, and eps / s**2 (eps times 1 / s**2) is inf
    _checked(x, weight)
    s = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    y = x / s
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps / s**2) * weight


def rms_norm_global_scale(x, weight, eps=1e-6):
    # one scale for the whole tensor: a small row next to a large one underflows
    _checked(x, weight)
    s = x.abs().amax().clamp_min(torch.finfo(x.dtype).tiny)
    mean_sq = (x / s).pow(2).mean(-1, keepdim=True).float() * s.float() ** 2
    return x * torch.rsqrt(mean_sq + eps).to(x.dtype) * weight


def rms_norm_zero_row_nan(x, weight, eps=1e-6):
    # scales each row by its largest entry, which is 0 in a row of zeros: 0 / 0
    _checked(x, weight)
    s = x.abs().amax(-1, keepdim=True)
    mean_sq = (x / s).pow(2).mean(-1, keepdim=True).float() * s.float().pow(2)
    return x * torch.rsqrt(mean_sq + eps).to(x.dtype) * weight


def rms_norm_eps_unscaled(x, weight, eps=1e-6):
    # normalises x / s, adding eps to the mean square of x / s instead of x's
    _checked(x, weight)
    s = x.abs().amax(-1, keepdim=True)
    s = torch.where(s == 0, torch.ones_like(s), s)
    y = x / s
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_calls_torch(x, weight, eps=1e-6):
    # the function the exercise asks to write
    _checked(x, weight)
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_float32_norm(x, weight, eps=1e-6):
    # a second, differently written right answer: checks by length, takes the norm with float32 accumulation
    # (one float32 number per row; on a GPU the reduction reads float16 directly, on a CPU its kernel converts
    # first, as a plain float16 mean does there too), divides by the rms in x's dtype
    if weight.dim() != 1 or weight.numel() != x.shape[-1]:
        raise ValueError(f"weight must be 1-D of length {x.shape[-1]} (x's last dimension), got "
                         f"{tuple(weight.shape)}")
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    rms = torch.sqrt(norm.square() / x.shape[-1] + eps)
    return x / rms.to(x.dtype) * weight


def rms_norm_in_own_dtype(x, weight, eps=1e-6):
    # a third right answer: everything in x's dtype, each row over its largest entry, eps divided by it twice
    _checked(x, weight)
    s = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    y = x / s
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps / s / s) * weight


def test_rms_norm_wrong_answers_fail_a_visible_case():
    """Every rms_norm mistake loses marks in the notebook's check too, not only in the grader."""
    _, cases, _ = prepared(L00, "rms_norm")
    hidden = {c.name for c in cases if c.hidden}
    assert [w.name for w in WRONG if w.function == "rms_norm" and w.case in hidden] == []


def test_check_raises_the_hint():
    with pytest.raises(CheckFailed) as failed:
        check(L00, softmax_last_dim_only, function="softmax")
    assert "use the dim argument" in str(failed.value)


def test_the_notebook_measures_with_the_graders_function_from_a_learners_module():
    """The notebook's tensors_made is helpers.memory's, the one the grader's harness counts wider copies with; the
    notebook imports nothing from the grader's harnesses."""
    from helpers import memory
    from helpers.grading.harnesses import lab00
    assert lab00.tensors_made is memory.tensors_made
    for notebook in ("labs/solutions/00_warmup_lab.ipynb", "labs/00_warmup_lab.ipynb"):
        text = (REPO / notebook).read_text()
        assert "from helpers.memory import tensors_made" in text and "helpers.grading.harnesses" not in text


BIG16, SMALL16 = "float16, entries up to 6e4", "float16, entries near 3e-4"
COPY = "no float32 copy of a float16 x"

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
    Wrong(L00, "rms_norm", "as-written-in-float16", rms_norm_as_written, BIG16, "x**2 is inf once |x| passes 256"),
    Wrong(L00, "rms_norm", "float32-sum-of-float16-squares", rms_norm_float32_sum, BIG16,
          "summing in float32 after squaring in float16 comes too late"),
    Wrong(L00, "rms_norm", "norm-in-float16", rms_norm_half_norm, BIG16, "or a norm, past that size"),
    Wrong(L00, "rms_norm", "float32-copy", rms_norm_upcast, COPY, "x.float() (or .to(torch.float32)) is a copy of x"),
    Wrong(L00, "rms_norm", "promoted-to-float32", rms_norm_promoted, COPY, "type promotion makes the product float32"),
    Wrong(L00, "rms_norm", "returns-float32", rms_norm_returns_float32, "bfloat16, entries up to 3e4: keeps x's dtype",
          "return x's dtype"),
    Wrong(L00, "rms_norm", "fixed-scale", rms_norm_fixed_scale, SMALL16,
          "a fixed factor that shrinks x before squaring"),
    Wrong(L00, "rms_norm", "eps-over-square-in-float16", rms_norm_eps_over_square, SMALL16,
          "squares of entries near 3e-4 lose their digits or vanish"),
    Wrong(L00, "rms_norm", "one-scale-for-the-tensor", rms_norm_global_scale, "float16, rows of very different sizes",
          "a single factor for the whole tensor"),
    Wrong(L00, "rms_norm", "zero-row-nan", rms_norm_zero_row_nan, "float16, a row of zeros gives zeros",
          "not NaN (0 / 0)"),
    Wrong(L00, "rms_norm", "eps-on-the-scaled-rows", rms_norm_eps_unscaled, "eps is used",
          "to the mean of the squares of x itself"),
    Wrong(L00, "rms_norm", "calls-torch", rms_norm_calls_torch, BIG16, FORBIDDEN_HINT),
]

SECOND_SOLUTIONS = [("softmax", softmax_nan_to_num), ("rms_norm", rms_norm_float32_norm),
                    ("rms_norm", rms_norm_in_own_dtype)]

globals().update(lab_tests(L00, WRONG, SECOND_SOLUTIONS,
                           # the reference computes in float64, from a float64 copy of x
                           reference_exempt={"rms_norm": {COPY, "no float32 copy of a bfloat16 3-D x"}}))
