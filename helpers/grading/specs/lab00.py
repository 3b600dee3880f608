"""Lab 00 (warm-up): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab00 import NO_WIDER_COPY
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

    def rows(scales, dtype=torch.float16, width=64):
        """A row of normal entries for each scale (a list, or a list of lists for 3-D), clamped to 6e4."""
        sizes = torch.tensor(scales).unsqueeze(-1)
        return (torch.randn(*sizes.shape[:-1], width, generator=gen) * sizes).clamp(-6e4, 6e4).to(dtype)

    def weight(width=64, dtype=torch.float16):
        return (torch.rand(width, generator=gen) + 0.5).to(dtype)

    w16, wb16 = weight(), weight(128, torch.bfloat16)
    big, small, mixed = rows([1.5e4, 2e4, 1e4, 3e4]), rows([3e-4, 2e-4, 4e-4, 3e-4]), rows([3e4, 3e-4, 1.0, 300.0])
    zero = rows([100.0, 1.0, 30.0])
    zero[1] = 0
    big_3d = rows([[2e4, 1e3, 5e3], [3e4, 300.0, 1e4]], width=128)
    tiny = rows([1e-4, 2e-4, 1e-4])
    at_max = rows([1e4, 1e4])
    at_max[0, ::3], at_max[1, 1] = 65504, -65504
    mixed_bf16 = rows([[3e4, 3e-4], [1.0, 1e3]], torch.bfloat16, 128)
    zero_bf16 = rows([[50.0, 1.0], [2.0, 7e3]], torch.bfloat16, 128)
    zero_bf16[1, 0] = 0
    fp16, bf16 = {"atol": 2e-3, "rtol": 4e-3}, {"atol": 1.6e-2, "rtol": 2e-2}
    eps = ("add eps inside the square root, to the mean of the squares of x itself (whatever you compute it "
           "from): it matters when values are tiny")
    overflow = ("float16's largest value is 65504: x**2 is inf once |x| passes 256, and so is a sum of squares, or a "
                "norm, past that size; summing in float32 after squaring in float16 comes too late, and the row "
                "comes out as 0")
    underflow = ("float16 keeps its 3 digits only down to 6e-5, and nothing below 6e-8: squares of entries near 3e-4 "
                 "lose their digits or vanish, and a fixed factor that shrinks x before squaring (to keep the largest "
                 "squares finite) sends them further down")
    one_scale = ("rows of 3e4 and of 3e-4 in one tensor: a single factor for the whole tensor that keeps the large "
                 "row's squares finite sends the small row's squares below what float16 holds")
    zeros = ("a row of zeros: its mean square is 0 and x / sqrt(0 + eps) is 0, not NaN (0 / 0): decide what you "
             "divide by in that row")
    wider = ("the right values (as in the cases above) with no tensor of x's size in a wider dtype: x.float() (or "
             ".to(torch.float32)) is a copy of x at twice its bytes, and so is a float16 tensor times a float32 one "
             "(type promotion makes the product float32): keep every tensor of x's size in x's dtype")
    keep = ("return x's dtype; bfloat16 has float32's range, so its squares stay finite, but it keeps only 2 to 3 "
            "digits: the check allows 2%")
    return [
        Case("values", (x, w), hint="x / sqrt(mean(x**2 over the last dim) + eps) * weight"),
        Case("eps is used", (torch.randn(4, 16, generator=gen) * 1e-3, w), {"eps": 1e-2}, hint=eps),
        Case("a mismatched weight is rejected", (x, torch.ones(8)), raises="ValueError", match="weight",
             hint="compare weight.shape with x.shape[-1:] before computing"),
        Case("float16, entries up to 6e4", (big, w16), **fp16, hint=overflow, central=True),
        Case("float16, entries near 3e-4", (small, w16), {"eps": 1e-9}, **fp16, hint=underflow),
        Case("float16, rows of very different sizes", (mixed, w16), **fp16, hint=one_scale),
        Case("float16, a row of zeros gives zeros", (zero, w16), **fp16, hint=zeros),
        Case("bfloat16, entries up to 3e4: keeps x's dtype", (rows([1e4, 3e4, 1.0, 1e-3], torch.bfloat16),
                                                              weight(dtype=torch.bfloat16)), **bf16, hint=keep),
        Case("no float32 copy of a float16 x", (big, w16), call="wider_copies",
             expected=(NO_WIDER_COPY, _rms_norm_reference(big, w16)), expect_value=True, **fp16, hint=wider,
             central=True),
        Case("1-D input", (torch.randn(16, generator=gen), w), hidden=True,
             hint="normalise over the last dimension whatever the number of dimensions"),
        Case("eps is used, a 3-D input", (torch.randn(2, 3, 16, generator=gen) * 1e-3, w), {"eps": 1e-3},
             hidden=True, hint=eps),
        Case("a mismatched weight on a 1-D input is rejected", (torch.randn(16, generator=gen), torch.ones(15)),
             raises="ValueError", hidden=True, hint="compare weight.shape with x.shape[-1:] before computing"),
        Case("float16 3-D, entries up to 6e4", (big_3d, weight(128)), **fp16, hidden=True, hint=overflow,
             central=True),
        Case("float16, entries at its largest (65504)", (at_max, w16), **fp16, hidden=True, hint=overflow),
        Case("float16, entries near 1e-4, where eps counts", (tiny, w16), **fp16, hidden=True, hint=underflow),
        Case("bfloat16 3-D, rows of very different sizes", (mixed_bf16, wb16), **bf16, hidden=True, hint=one_scale),
        Case("bfloat16 3-D, a row of zeros gives zeros", (zero_bf16, wb16), **bf16, hidden=True, hint=zeros),
        Case("no float32 copy of a bfloat16 3-D x", (zero_bf16, wb16), call="wider_copies",
             expected=(NO_WIDER_COPY, _rms_norm_reference(zero_bf16, wb16)), expect_value=True, **bf16, hidden=True,
             hint=wider, central=True),
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
    """The formula in float64, rounded to x's dtype."""
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


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
