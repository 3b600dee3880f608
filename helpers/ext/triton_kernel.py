"""RMSNorm as a Triton kernel wrapped with torch.library.triton_op: the cross-vendor route to a custom kernel.

Triton compiles the same source for NVIDIA, AMD and Intel GPUs (the triton, triton-rocm and triton-xpu
builds). `torch.library.triton_op` makes it an op `labs_triton::rms_norm` whose kernel torch.compile can SEE:
the body is traced with fake tensors (no fake kernel to write) and the Triton kernel inside `wrap_triton`
is handed to Inductor as a user-defined kernel, instead of an opaque call.

Importing this module imports Triton and decorates the kernel, so import it only where a GPU runs it.
Triton's CPU interpreter (TRITON_INTERPRET=1) does not serve: torch 2.10's `wrap_triton` accepts only
`JITFunction`/`Autotuner` and raises on the interpreter's `InterpretedFunction`; 2.13 runs it in eager but
still cannot trace it with fake tensors (opcheck's test_faketensor fails).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from helpers import ext


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)                      # one program per row
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    tl.store(y_ptr + row * n + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton_op("labs_triton::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    ext.check_inputs(x, weight)
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.shape[-1]
    if x.numel():
        wrap_triton(rms_norm_kernel)[(x.numel() // n,)](x, weight.contiguous(), y, n, eps,
                                                         BLOCK=triton.next_power_of_2(n))
    return y


rms_norm.register_autograd(ext._backward, setup_context=ext._setup_context)   # the same formula as labs_ext
