"""Lab 00 (warm-up): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.specs.core import Case, Exercise, LabSpec


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    x = torch.randn(4, 7, generator=gen) * 50
    x[0, 0] = 100.0                    # exp(100) overflows float32: only a max-subtracted softmax survives it
    masked = torch.randn(3, 6, generator=gen) * 5
    masked[1] = float("-inf")          # every key of row 1 masked out
    masked[2, ::2] = float("-inf")     # half of row 2's keys masked out
    masked_3d = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    masked_3d[1, :, 2] = float("-inf")  # along dim 1: one slice entirely masked
    empty = ("in a fully masked row the maximum is -inf and every exp(x) is 0: no probability is left to "
             "share out, so every entry is 0. Not NaN (-inf minus -inf, or 0 / 0), and not 1/n (what a "
             "large finite stand-in for -inf gives): decide what to subtract and what to divide by there")
    half = ("float16 holds no magnitude above 65504 and none below about 6e-8 but 0: a stand-in sized for "
            "float32 (a huge negative for -inf, a tiny eps against 0 / 0) is -inf or 0 in float16, and the fully "
            "masked row is NaN again")
    device = ("build every new tensor from x (zeros_like, a Python number, x.new_...), never on a fixed "
              "device, and never read a value back to Python (bool(), .item(), an `if` on a tensor): the "
              "check runs your function on the meta device, which has no values, as an accelerator would "
              "run it without a round trip to the host; and keep x's dtype")
    return [
        Case("large values, last dim", (x,), hint="subtract x.amax(dim, keepdim=True) before exp"),
        Case("along dim 0", (x,), {"dim": 0}, hint="use the dim argument in every reduction, with keepdim=True"),
        Case("a fully masked row gives zeros", (masked,), hint=empty, central=True),
        Case("a fully masked row in float16", (masked.half(),), atol=2e-3, rtol=1e-2, hint=half),
        Case("runs on any device, keeps the dtype (a float64 meta tensor)", (x.double(),),
             call="softmax_on_meta", hint=device),
        Case("3-D input along dim 1", (torch.randn(2, 3, 5, generator=gen) * 10,), {"dim": 1}, hidden=True,
             hint="reduce over `dim` only, keeping it (keepdim=True) so the division broadcasts"),
        Case("float64 keeps its dtype", (torch.randn(3, 4, generator=gen, dtype=torch.float64) * 100,),
             hidden=True, hint="do not convert to float32; every op here keeps the input dtype"),
        Case("huge values (1e4) do not overflow", (torch.randn(2, 6, generator=gen) * 1e4,), hidden=True,
             hint="exp(1e4) is inf in any float type: subtract the maximum first"),
        Case("a fully masked slice along dim 1, float64", (masked_3d,), {"dim": 1}, hidden=True, hint=empty,
             central=True),
        Case("a fully masked slice along dim 1, float16", (masked_3d.half(),), {"dim": 1}, hidden=True, atol=2e-3,
             rtol=1e-2, hint=half),
        Case("any device, 3-D bfloat16 along dim 0", (torch.randn(3, 2, 5, generator=gen).bfloat16(),),
             {"dim": 0}, call="softmax_on_meta", hidden=True, hint=device),
    ]


def _rms_norm_cases(gen: torch.Generator) -> list[Case]:
    x, w = torch.randn(3, 5, 16, generator=gen), torch.rand(16, generator=gen)
    eps = "add eps inside the square root, to the mean of the squares: it matters when values are tiny"
    return [
        Case("values", (x, w), hint="x / sqrt(mean(x**2 over the last dim) + eps) * weight"),
        Case("eps is used", (torch.randn(4, 16, generator=gen) * 1e-3, w), {"eps": 1e-2}, hint=eps),
        Case("a mismatched weight is rejected", (x, torch.ones(8)), raises="ValueError", match="weight",
             hint="compare weight.shape with x.shape[-1:] before computing"),
        Case("1-D input", (torch.randn(16, generator=gen), w), hidden=True,
             hint="normalise over the last dimension whatever the number of dimensions"),
        Case("eps is used, a 3-D input", (torch.randn(2, 3, 16, generator=gen) * 1e-3, w), {"eps": 1e-3},
             hidden=True, hint=eps),
        Case("a mismatched weight on a 1-D input is rejected", (torch.randn(16, generator=gen), torch.ones(15)),
             raises="ValueError", hidden=True, hint="compare weight.shape with x.shape[-1:] before computing"),
    ]


def _softmax_reference(x, dim=-1):
    """torch.softmax, with 0 (not NaN) in a row whose every entry is -inf."""
    out = torch.softmax(x, dim=dim)
    return torch.where(torch.isneginf(x).all(dim=dim, keepdim=True), torch.zeros_like(out), out)


SOFTMAX = ("softmax", "_softmax", "log_softmax", "_log_softmax", "special_softmax", "_safe_softmax",
           # attention computes a softmax inside: with a query of ones and an identity value it returns one
           "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
           "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def _rms_norm_reference(x, weight, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=eps)


SPEC = LabSpec("00_warmup_lab", (
    Exercise("Exercise 1: softmax", "softmax", _softmax_cases, _softmax_reference, forbidden=SOFTMAX,
             refused="torch's softmax is the function you are writing, and it gives NaN on a fully masked row: "
                     "build yours from exp, a max and a sum, and decide that row yourself"),
    Exercise("Exercise 2: rms_norm", "rms_norm", _rms_norm_cases, _rms_norm_reference,
             forbidden=("rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm", "group_norm",
                        "native_group_norm", "batch_norm", "instance_norm"),
             refused="torch's rms_norm, and the other norms that can be made to compute it, are the function you "
                     "are writing: take the mean of the squares yourself, with eps and the weight"),
))
