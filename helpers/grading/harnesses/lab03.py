"""Lab 03 (mixture of experts): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import re
from typing import Callable

import torch
from torch.utils._pytree import tree_map


META_REFUSALS = (("cannot be called on meta tensors", ".item(), int(), float(), bool() or an `if` on a tensor"),
                 ("Cannot copy out of meta tensor", ".tolist(), .numpy() or another copy to the host"),
                 ("without output_size", "repeat_interleave without output_size"),
                 ("same device", "a tensor made on another device inside the function (give it device=)"))


NO_HOST_READS = "nothing read back to the host"


def host_reads_of(fn, *args, **kwargs) -> str:
    """What fn needs from its tensors' values on the host (each a sync on a GPU), found by running it on the meta
    device, where tensors have shapes but no data: .item(), int(), an `if` on a tensor, .tolist(), and every op
    whose output size depends on the data (bincount, nonzero, unique, ...) cannot run there. The same answer on
    every device, decided by what fn needs, not by which op it calls: F.one_hot(ids, n) needs nothing,
    torch.unique(return_counts=True) needs the data. NO_HOST_READS when fn runs on meta, else what it read."""
    on_meta = tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, (args, kwargs))
    try:
        fn(*on_meta[0], **on_meta[1])
    except Exception as exc:
        message = str(exc)
        op = re.search(r"(aten::\w+)", message)
        named = next((what for text, what in META_REFUSALS if text in message), None)
        return "reads back to the host: " + (named or (f"{op.group(1)} (its output size depends on the data)" if op
                                                       else f"{type(exc).__name__} on the meta device: {message[:120]}"))
    return NO_HOST_READS


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


# --- Exercise 4: padded_layout, judged by properties of what it returns -----------------------------------

def _layout(fn, expert_ids, num_experts, multiple):
    dest, offs, rows = fn(expert_ids, num_experts, multiple)
    return torch.as_tensor(dest).long().reshape(-1), torch.as_tensor(offs).long().reshape(-1), rows


def _group_bounds(offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each group starts and ends: group e is rows offs[e-1]:offs[e], the first from row 0."""
    return torch.cat([offs.new_zeros(1), offs[:-1]]), offs


def layout_starts(fn, expert_ids, num_experts, multiple) -> str:
    """The first group whose start (offs[e-1], 0 for the first) is not a multiple of `multiple`, or that none is."""
    _, offs, _ = _layout(fn, expert_ids, num_experts, multiple)
    starts, _ = _group_bounds(offs)
    off = (starts % multiple).nonzero()
    if len(off):
        e = int(off[0])
        return f"expert {e}'s group starts at row {int(starts[e])}, not a multiple of {multiple}"
    return f"every group starts at a multiple of {multiple}"


def layout_group_sizes(fn, expert_ids, num_experts, multiple) -> torch.Tensor:
    """The rows of each group, padding included (int64): the differences of the offsets."""
    from helpers.moe import counts_from_offsets
    _, offs, _ = _layout(fn, expert_ids, num_experts, multiple)
    return counts_from_offsets(offs)


def layout_slots_outside(fn, expert_ids, num_experts, multiple) -> str:
    """Whether every flattened position's row lies in its own expert's group, by fn's own offsets."""
    dest, offs, _ = _layout(fn, expert_ids, num_experts, multiple)
    flat = expert_ids.reshape(-1).long()
    if dest.shape != flat.shape:
        return f"dest has {dest.numel()} entries for {flat.numel()} positions"
    starts, ends = _group_bounds(offs)
    outside = ((dest < starts[flat]) | (dest >= ends[flat])).nonzero()
    if len(outside):
        p = int(outside[0])
        e = int(flat[p])
        return (f"{len(outside)} of {flat.numel()} positions land outside their expert's group (first: position {p}, "
                f"expert {e}, row {int(dest[p])}, group rows {int(starts[e])}:{int(ends[e])})")
    return "every position lands in its expert's group"


def layout_shared_rows(fn, expert_ids, num_experts, multiple) -> str:
    dest, _, _ = _layout(fn, expert_ids, num_experts, multiple)
    shared = dest.numel() - torch.unique(dest).numel()
    return f"{shared} positions share a row with another" if shared else "every position has a row of its own"


def layout_arrival_order(fn, expert_ids, num_experts, multiple) -> str:
    """Whether, for every expert, its positions' rows rise with the positions."""
    dest, _, _ = _layout(fn, expert_ids, num_experts, multiple)
    flat = expert_ids.reshape(-1).long()
    for e in range(num_experts):
        rows = dest[flat == e]
        if len(rows) > 1 and not bool((rows[1:] > rows[:-1]).all()):
            return f"expert {e}'s positions are not in arrival order in their rows"
    return "every expert's positions keep their arrival order"


def layout_rows_type(fn, expert_ids, num_experts, multiple) -> str:
    _, _, rows = fn(expert_ids, num_experts, multiple)
    return "a Python int" if type(rows) is int else f"a {type(rows).__name__}"


def layout_rows_room(fn, expert_ids, num_experts, multiple, fewest) -> str:
    """Whether the buffer's rows hold `fewest`, the grader's largest padded total for these shapes."""
    _, _, rows = fn(expert_ids, num_experts, multiple)
    if int(rows) >= fewest:
        return "room for every routing of these shapes"
    return f"{int(rows)} rows: too few for some routing of these shapes"


def layout_rows_waste(fn, expert_ids, num_experts, multiple, most) -> str:
    _, _, rows = fn(expert_ids, num_experts, multiple)
    if int(rows) <= most:
        return "no more rows than T*k + (num_experts + 1) * multiple"
    return f"{int(rows)} rows: more than T*k + (num_experts + 1) * multiple = {most}"
