"""Lab 03 (mixture of experts): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.checks import NO_HOST_READS
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
                     "removes, and moe_layer runs the whole layer for you: run each expert on its own rows"),
))
