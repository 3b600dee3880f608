"""Lab 03 (mixture of experts): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab03 import NO_HOST_READS
from helpers.grading.specs.core import Case, Exercise, LabSpec


def _permute(x, expert_ids, num_experts):
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    return x[order // expert_ids.shape[1]], order, counts.cumsum(0).to(torch.int32)


def _permute_cases(gen):
    order = ("order sorts the flattened (token, slot) positions by expert; among positions with the same expert "
             "the earlier one comes first. A plain sort may swap equal keys: ask the sort to keep ties in order")
    rows = ("xs row i is the token of flattened position order[i]: with k slots per token, position p belongs to "
            "token p // k (slot p % k); reread how a [T, k] tensor is flattened")
    ends = ("offs[e] is the number of rows of experts 0..e together (where expert e's rows END), one entry per "
            "expert: not the count of each expert, not where it starts; an expert with no token repeats the "
            "previous end")
    int32 = "offs must be torch.int32, the dtype grouped_mm takes; a count or a cumulative sum comes out as int64"
    trailing = ("offs has num_experts entries even when the last experts get no token: a count of the ids that "
                "occur stops at the largest id; tell the counting how many experts there are")
    sync = ("the names listed read tensor values back to the host, a sync that stalls the GPU on every MoE layer: "
            "a count that sizes its output from the largest id reads that id back first, and so does any "
            ".tolist(), .item(), int() or Python loop over a tensor. Count with an op whose output size you give "
            "it (num_experts is a Python int already)")
    ids = torch.tensor([[0, 2], [2, 3], [0, 3], [3, 2], [0, 2], [2, 0], [3, 0], [0, 2], [2, 3], [3, 0], [0, 3], [2, 0]])
    x12 = torch.randn(12, 8, generator=gen)
    trail = (torch.randn(7, 5, generator=gen), torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1], [1, 0, 0],
                                                             [0, 1, 0], [1, 1, 1]]), 6)
    return [
        Case("order: sorted by expert, ties in arrival order", (x12, ids, 4), call="second", hint=order),
        Case("xs: the token of each sorted position", (x12, ids, 4), call="first", hint=rows),
        Case("offs: cumulative end offsets, expert 1 gets none", (x12, ids, 4), call="third_as_int64", hint=ends),
        Case("offs is torch.int32", (x12, ids, 4), call="dtype_of_third", hint=int32),
        Case("experts 2..5 get no token: 6 offsets", trail, call="third_as_int64", hint=trailing),
        Case("nothing is read back to the host (no sync on a GPU)", (x12, ids, 4), call="host_reads_of",
             expected=NO_HOST_READS, expect_value=True, hint=sync),
        Case("k=1, random experts", (torch.randn(9, 4, generator=gen), torch.randint(0, 3, (9, 1), generator=gen), 3),
             hint=ends),
        Case("every token to one expert", (torch.randn(5, 3, generator=gen), torch.full((5, 2), 1), 4), hidden=True,
             hint=ends),
        Case("one token", (torch.randn(1, 6, generator=gen), torch.tensor([[2, 0]]), 3), hidden=True, hint=rows),
        Case("trailing experts with no tokens, k=3", (torch.randn(7, 5, generator=gen),
                                                      torch.randint(0, 2, (7, 3), generator=gen), 6),
             call="third_as_int64", hidden=True, hint=trailing),
        Case("k=4, many ties", (torch.randn(10, 4, generator=gen), torch.randint(0, 3, (10, 4), generator=gen), 5),
             call="second", hidden=True, hint=order),
        Case("no host reads, k=1, 7 experts", (torch.randn(9, 4, generator=gen),
                                               torch.randint(0, 7, (9, 1), generator=gen), 7),
             call="host_reads_of", expected=NO_HOST_READS, expect_value=True, hidden=True, hint=sync),
    ]


def _fallback(xs, w, offs):
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = xs[start:end] @ w[e]
        start = end
    return out


def _fallback_cases(gen):
    from helpers.moe import offsets_from_counts, skewed_counts
    hint = ("expert e owns rows offs[e-1]:offs[e] (the first starts at 0); an empty slice is fine. One 2-D "
            "matmul per expert")
    tail = ("rows past offs[-1] belong to no expert: their output rows must be 0. Memory from an empty "
            "allocation holds whatever was there before (this check fills it with NaN)")
    cases = []
    for experts, skew, dtype, hidden in ((4, 0.0, torch.float32, False), (8, 3.0, torch.float32, False),
                                         (6, 1.0, torch.bfloat16, False), (1, 0.0, torch.float32, True),
                                         (5, 8.0, torch.float32, True), (3, 0.0, torch.float64, True)):
        counts = skewed_counts(40, experts, skew)
        low = dtype == torch.bfloat16
        cases.append(Case(f"{experts} experts, counts {counts.tolist()}, {dtype}",
                          (torch.randn(40, 16, generator=gen).to(dtype), torch.randn(experts, 16, 8, generator=gen).to(dtype),
                           offsets_from_counts(counts)), hidden=hidden, atol=0.1 if low else 1e-4,
                          rtol=2e-2 if low else 1e-3, call="uninitialized_is_nan",
                          hint=hint + "; keep the input's dtype"))
    # a capacity-padded buffer: offs[-1] < rows (each input its own allocation: F.grouped_mm wants
    # 16-byte aligned data, which a slice of a flat buffer may not have)
    for rows, counts, hidden in ((48, [10, 0, 20, 6], False), (33, [0, 7, 0], True), (64, [5, 9, 1, 0, 3], True)):
        cases.append(Case(f"{len(counts)} experts own {sum(counts)} of {rows} rows", (
            torch.randn(rows, 16, generator=gen), torch.randn(len(counts), 16, 8, generator=gen),
            offsets_from_counts(torch.tensor(counts))), hidden=hidden, atol=1e-4, rtol=1e-3,
            call="uninitialized_is_nan", hint=tail))
    return cases + _own_rows_cost_cases(cases, "grouped_gemm_flops")


OWN_ROWS_COST = ("each expert's matmul takes that expert's rows only: multiplying every row by every expert's "
                 "weight (then keeping each row's own expert) does num_experts times the work, and so does padding "
                 "every expert to the same rows; a product written as a multiply and a sum is no matmul")


def _own_rows_cost_cases(cases, call):
    """The FLOPs the matmuls do (counted by torch.utils.flop_counter) against each expert on its own rows: on
    the first visible case's inputs, and hidden on the last hidden case's."""
    visible = next(c for c in cases if not c.hidden)
    hidden = [c for c in cases if c.hidden][-1]
    return [Case(f"the FLOPs of each expert on its own rows, no more ({c.name})", c.args, hidden=c.hidden, call=call,
                 hint=OWN_ROWS_COST) for c in (visible, hidden)]


def _expert_ffn(xs, params, offs):
    import torch.nn.functional as F
    return _fallback(F.gelu(_fallback(xs, params["w_up"], offs)), params["w_down"], offs)


def _expert_ffn_cases(gen):
    from helpers.moe import offsets_from_counts, skewed_counts
    hint = ("up-projection, GELU, down-projection, each expert on its own rows only (no padding)")
    cases = []
    for rows, experts, skew, hidden in ((64, 4, 2.0, False), (48, 6, 0.0, True), (30, 5, 6.0, True)):
        params = {"w_up": torch.randn(experts, 16, 32, generator=gen) / 4,
                  "w_down": torch.randn(experts, 32, 16, generator=gen) / 6}
        counts = skewed_counts(rows, experts, skew)
        cases.append(Case(f"{experts} experts, counts {counts.tolist()}",
                          (torch.randn(rows, 16, generator=gen), params, offsets_from_counts(counts)),
                          hidden=hidden, atol=1e-4, rtol=1e-3, hint=hint))
    return cases + _own_rows_cost_cases(cases, "expert_ffn_flops")


def _padded_layout(expert_ids, num_experts, multiple=16):
    from helpers.moe import expert_counts
    flat = expert_ids.reshape(-1)
    slots = flat.numel()
    counts = expert_counts(flat, num_experts)
    sizes = (counts + multiple - 1) // multiple * multiple
    ends = sizes.cumsum(0)
    order = torch.argsort(flat, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(slots, device=flat.device))
    dest = (ends - sizes)[flat] + rank - (counts.cumsum(0) - counts)[flat]
    return dest, ends.to(torch.int32), (slots + num_experts * (multiple - 1)) // multiple * multiple


def _worst_rows(slots: int, num_experts: int, multiple: int) -> int:
    """The largest padded total any routing of `slots` slots to `num_experts` experts can give: every expert
    that can get a slot one row past a multiple."""
    return multiple * (min(slots, num_experts) + max(slots - num_experts, 0) // multiple)


def _routing(counts, k, gen):
    """Expert ids [T, k] in a shuffled order, with these counts per expert."""
    flat = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return flat[torch.randperm(flat.numel(), generator=gen)].reshape(-1, k)


def _layout_cases(gen):
    int32 = ("offs must be torch.int32, the dtype grouped_mm takes (`Offsets have to be int32`); a cumulative sum "
             "comes out as int64")
    starts = ("expert e's group starts where group e-1 ends, at offs[e-1]: every one of those starts must be a "
              "multiple, not only the total. Pad each group's end up to the next multiple")
    exact = ("a count that is already a multiple needs no padding row: round each count up to the next multiple "
             "only when it is not one already")
    empty = ("an expert with no token needs no row here (its group is empty, and grouped_mm takes an empty group): "
             "rounding 0 up to a multiple gives 0, not a whole group")
    rounded = ("each group is its own expert's count rounded up to a multiple (the last group too), and the offsets "
               "are the running total of those rounded counts: rounding the running total of the raw counts "
               "instead can leave an expert fewer rows than it has tokens")
    given = "use the multiple you are given: with multiple=1 nothing is padded and offs are the plain end offsets"
    by_position = ("dest is indexed like expert_ids.flatten(): dest[p] is the row of position p (token p // k), "
                   "inside the group of expert_ids.flatten()[p]; not the row of the p-th position in sorted order")
    in_group = ("dest[p] must fall inside its expert's padded group, offs[e-1] <= dest[p] < offs[e]: a position's rank in "
                "the unpadded sort is not its row once the groups before it are padded")
    one_row = "each position needs a row of its own: two positions on one row would overwrite each other's token"
    arrival = ("within one expert the earlier position gets the lower row (p < q gives dest[p] < dest[q]). A plain "
               "sort may swap equal keys: ask the sort to keep ties in order")
    sync = ("the names listed read tensor values back to the host, a sync that stalls the GPU on every MoE layer: a "
            "count that sizes its output from the data reads it back first, and so does any .tolist(), .item(), "
            "int() or Python loop over a tensor. Count with an op whose output size you give it, and size the "
            "buffer from the shapes")
    static = ("rows sizes a buffer allocated before any count is known: a Python int computed from the shapes, "
              "num_experts and multiple alone, not a tensor (turning a tensor into an int would read it back)")
    room = ("rows must hold the largest padded total that any routing of these T*k positions to num_experts experts "
            "could give, not only this routing's: how many padding rows can one expert need at most?")
    waste = ("rows is more than any routing can need: at most T*k + (num_experts + 1) * multiple, a buffer sized "
             "for the worst case that can happen, not for one that cannot")

    general = _routing([17, 15, 3, 13], 2, gen)            # no count a multiple of 16
    multiples = _routing([16, 32, 16, 16], 2, gen)         # every count a multiple, none empty
    empties = _routing([16, 0, 32, 0], 2, gen)             # empty experts, the others multiples
    one_each = torch.tensor([[3], [0], [5], [1], [7], [2]])  # one token per expert, some experts empty
    ties = _routing([30, 25, 25], 2, gen)

    def rows_cases(ids, num_experts, multiple, hidden):
        slots = ids.numel()
        shape = f"{slots} positions, {num_experts} experts, multiple {multiple}"
        return [
            Case(f"rows is a Python int ({shape})", (ids, num_experts, multiple), call="layout_rows_type",
                 hidden=hidden, hint=static),
            Case(f"rows has room for every routing ({shape})",
                 (ids, num_experts, multiple, _worst_rows(slots, num_experts, multiple)), call="layout_rows_room",
                 hidden=hidden, hint=room),
            Case(f"rows is no larger than T*k + (num_experts + 1) * multiple ({shape})",
                 (ids, num_experts, multiple, slots + (num_experts + 1) * multiple), call="layout_rows_waste",
                 hidden=hidden, hint=waste),
        ]

    r = torch.randint
    return [
        Case("offs is torch.int32", (general, 4, 16), call="dtype_of_second", hint=int32),
        Case("every group starts at a multiple of 16, counts [17, 15, 3, 13]", (general, 4, 16),
             call="layout_starts", hint=starts, central=True),
        Case("group sizes, counts [16, 32, 16, 16] (each already a multiple)", (multiples, 4, 16),
             call="layout_group_sizes", hint=exact),
        Case("group sizes, counts [16, 0, 32, 0] (two experts get no token)", (empties, 4, 16),
             call="layout_group_sizes", hint=empty),
        Case("group sizes, counts [17, 15, 3, 13]", (general, 4, 16), call="layout_group_sizes", hint=rounded),
        Case("group sizes, multiple=1", (general, 4, 1), call="layout_group_sizes", hint=given),
        Case("dest[p] is position p's row (one token per expert, multiple=1)", (one_each, 8, 1),
             call="layout_slots_outside", hint=by_position),
        Case("each position's row is inside its expert's group, counts [17, 15, 3, 13]", (general, 4, 16),
             call="layout_slots_outside", hint=in_group),
        Case("no two positions share a row", (general, 4, 16), call="layout_shared_rows", hint=one_row),
        Case("ties keep their arrival order, counts [30, 25, 25]", (ties, 3, 8), call="layout_arrival_order",
             hint=arrival),
        Case("nothing is read back to the host (no sync on a GPU)", (general, 4, 16), call="host_reads_of",
             expected=NO_HOST_READS, expect_value=True, hint=sync, central=True),
        *rows_cases(general, 4, 16, False),
        # hidden: other sizes, seeds and multiples
        Case("group sizes, random routing, 8 experts", (r(0, 8, (50, 2), generator=gen), 8, 16),
             call="layout_group_sizes", hidden=True, hint=rounded),
        Case("group sizes, k=4, 16 experts, multiple 8", (r(0, 16, (37, 4), generator=gen), 16, 8),
             call="layout_group_sizes", hidden=True, hint=rounded),
        Case("group sizes, k=1, 3 experts, multiple 32", (r(0, 3, (100, 1), generator=gen), 3, 32),
             call="layout_group_sizes", hidden=True, hint=rounded),
        Case("group sizes, every token to one expert", (torch.full((20, 1), 2), 4, 16), call="layout_group_sizes",
             hidden=True, hint=empty),
        Case("group sizes, experts 2..5 get no token", (r(0, 2, (9, 3), generator=gen), 6, 16),
             call="layout_group_sizes", hidden=True, hint=empty),
        Case("every group starts at a multiple of 8, 16 experts", (r(0, 16, (37, 4), generator=gen), 16, 8),
             call="layout_starts", hidden=True, hint=starts, central=True),
        Case("each position's row is inside its expert's group, 8 experts", (r(0, 8, (50, 2), generator=gen), 8, 16),
             call="layout_slots_outside", hidden=True, hint=in_group),
        Case("dest[p] is position p's row, one token per expert", (torch.randperm(12, generator=gen)[:9, None], 12, 4),
             call="layout_slots_outside", hidden=True, hint=by_position),
        Case("no two positions share a row, k=4", (r(0, 5, (21, 4), generator=gen), 5, 16), call="layout_shared_rows",
             hidden=True, hint=one_row),
        Case("ties keep their arrival order, 2 experts, k=1", (r(0, 2, (120, 1), generator=gen), 2, 16),
             call="layout_arrival_order", hidden=True, hint=arrival),
        Case("no host reads, k=1, 7 experts, multiple 8", (r(0, 7, (9, 1), generator=gen), 7, 8),
             call="host_reads_of", expected=NO_HOST_READS, expect_value=True, hidden=True, hint=sync, central=True),
        *rows_cases(r(0, 16, (3, 1), generator=gen), 16, 16, True),     # fewer slots than experts
        *rows_cases(r(0, 6, (200, 2), generator=gen), 6, 8, True),
    ]


SPEC = LabSpec("03_moe_lab", (
    Exercise("Exercise 1: permute_tokens", "permute_tokens", _permute_cases, _permute,
             forbidden=("helpers.moe.permute",),
             refused="helpers.moe.permute is the permutation you are writing: sort the positions by expert and "
                     "count each expert's rows yourself, without reading a count back to the CPU"),
    Exercise("Exercise 2: fallback_grouped_gemm", "fallback_grouped_gemm", _fallback_cases, _fallback,
             forbidden=("grouped_mm", "_grouped_mm", "bmm", "baddbmm", "helpers.moe.loop_gemm",
                        "helpers.moe.grouped_gemm", "helpers.moe.triton_gemm", "helpers.moe.padded_bmm"),
             refused="grouped_mm, bmm and the helpers' GEMMs are what this fallback stands in for: give each "
                     "expert one matmul on its own rows"),
    Exercise("Exercise 3: expert_ffn without padding", "expert_ffn", _expert_ffn_cases, _expert_ffn,
             forbidden=("bmm", "baddbmm", "helpers.moe.padded_bmm", "helpers.moe.moe_layer"),
             refused="a bmm needs every expert padded to the same number of rows, the waste this exercise "
                     "removes, and moe_layer runs the whole layer for you: run each expert on its own rows",
             # an expert FFN built on exercise 2's loop is graded with a right loop: a mistake there costs once
             substitutes=(("fallback_grouped_gemm", "helpers.moe.loop_gemm"),)),
    Exercise("Exercise 4: padded_layout", "padded_layout", _layout_cases, _padded_layout),
))
