"""Lab 03 (mixture of experts): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

from typing import Callable

import torch


FLOPS_SLACK = 1.5        # how many times the FLOPs of each expert on its own rows a right answer may do
OWN_ROWS_FLOPS = "matmul FLOPs of each expert on its own rows (within 1.5x)"


def _grouped_mm_flops(a, b, *args, offs=None, out_val=None, **kwargs) -> int:
    """F.grouped_mm's FLOPs, which torch's counter does not count: with offs, each group's rows times its
    expert's [K, N]; otherwise (batched) each output element's K products."""
    if offs is not None and a.dim() == 2 and b.dim() == 3:
        return 2 * int(offs[-1]) * a.shape[1] * b.shape[2]
    return 2 * out_val.numel() * a.shape[-1]


_grouped_mm_flops._get_raw = True     # the counter passes tensors (offs' values), not only shapes


def _matmul_flops(run: Callable[[], object]) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: _grouped_mm_flops}) as counter:
        run()
    return counter.get_total_flops()


def _flops_verdict(flops: int, needed: int) -> str:
    """OWN_ROWS_FLOPS, or how far the FLOPs counted are from `needed` (each expert on its own rows)."""
    if needed <= flops <= FLOPS_SLACK * needed:
        return OWN_ROWS_FLOPS
    return f"{flops / needed:.2f}x the matmul FLOPs of each expert on its own rows"


def grouped_gemm_flops(fn, xs, w, offs) -> str:
    """Exercise 2's cost: the FLOPs fn's matmuls do, against one [rows, K] x [K, N] per expert."""
    return _flops_verdict(_matmul_flops(lambda: fn(xs, w, offs)), 2 * int(offs[-1]) * w.shape[1] * w.shape[2])


def expert_ffn_flops(fn, xs, params, offs) -> str:
    """Exercise 3's cost: the FLOPs fn's matmuls do, against the up and the down projection of each expert's
    own rows."""
    _, k, hidden = params["w_up"].shape
    needed = 2 * int(offs[-1]) * (k * hidden + hidden * params["w_down"].shape[2])
    return _flops_verdict(_matmul_flops(lambda: fn(xs, params, offs)), needed)
