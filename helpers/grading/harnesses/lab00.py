"""Lab 00 (warm-up): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations


import torch


def softmax_on_meta(fn, x, **kwargs) -> tuple:
    """fn on a meta tensor like x (shape and dtype, no values, no device memory): where, with what shape
    and dtype, its result lives. Code that makes a tensor on a fixed device, or reads a value back to
    Python (bool(), .item(), a Python `if` on a tensor), fails here as it would cost or fail on an
    accelerator."""
    out = fn(torch.empty(x.shape, dtype=x.dtype, device="meta"), **kwargs)
    return (out.device.type, list(out.shape), str(out.dtype)) if isinstance(out, torch.Tensor) else \
        (type(out).__name__,)
