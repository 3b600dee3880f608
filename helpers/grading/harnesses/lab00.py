"""Lab 00 (warm-up): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show."""
from __future__ import annotations

import math

import torch

from helpers.memory import tensors_made    # bound at import: the sandbox restores this module's names


def softmax_on_meta(fn, x, **kwargs) -> tuple:
    """fn on a meta tensor like x (shape and dtype, no values, no device memory): where, with what shape
    and dtype, its result lives. Code that makes a tensor on a fixed device, or reads a value back to
    Python (bool(), .item(), a Python `if` on a tensor), fails here as it would cost or fail on an
    accelerator."""
    out = fn(torch.empty(x.shape, dtype=x.dtype, device="meta"), **kwargs)
    return (out.device.type, list(out.shape), str(out.dtype)) if isinstance(out, torch.Tensor) else \
        (type(out).__name__,)


# --- Exercise 2: rms_norm in float16 and bfloat16, without a wider copy of x ------------------------------

NO_WIDER_COPY = "no tensor of x's size in a wider dtype"


def wider_copies(fn, x, weight, **kwargs) -> tuple[str, object]:
    """(NO_WIDER_COPY, or the first op of fn(x, weight) that made a tensor with as many elements as x in a dtype
    of more bytes an element than x's (x.float() of a float16 x, or a float16 tensor times a float32 one, which
    type promotion makes float32) and how many such tensors fn made; what fn returned)."""
    out, made = tensors_made(fn, x, weight, **kwargs)
    wide = [(op, dtype, shape) for op, dtype, shape in made
            if dtype.itemsize > x.element_size() and math.prod(shape) >= x.numel()]
    if not wide:
        return NO_WIDER_COPY, out
    op, dtype, shape = wide[0]
    return (f"{op} made a {str(dtype).removeprefix('torch.')} tensor of shape {shape} ({dtype.itemsize} bytes an "
            f"element, x has {x.element_size()}){f', and {len(wide) - 1} more like it' if len(wide) > 1 else ''}",
            out)
