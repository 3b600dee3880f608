"""Lab 03 (MoE): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import moe
from helpers.checks import CheckFailed
from helpers.grading.checks import check
from helpers.grading.specs import lab03 as spec03
from wrong_answers import FORBIDDEN_HINT, L03, Wrong, lab_tests


OWN_ROWS_FLOPS_CASE = "the FLOPs of each expert on its own rows, no more"


def permute_unstable(x, expert_ids, num_experts):
    # argsort without stable=True: ties in any order
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_unsorted(x, expert_ids, num_experts):
    # never sorts: tokens stay in arrival order
    flat = expert_ids.reshape(-1)
    order = torch.arange(flat.numel())
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_counts_not_offsets(x, expert_ids, num_experts):
    # returns the counts per expert, not the cumulative end offsets
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).int()




def permute_no_minlength(x, expert_ids, num_experts):
    # bincount without minlength: trailing experts with no token get no offset
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat).cumsum(0).int()


def permute_start_offsets(x, expert_ids, num_experts):
    # start offsets [0, c0, c0 + c1, ...] instead of end offsets
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return x[order // expert_ids.shape[1]], order, (counts.cumsum(0) - counts).int()


def permute_modulo(x, expert_ids, num_experts):
    # the token of slot order[i] taken as order[i] % k instead of order[i] // k
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order % expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_returns_input(x, expert_ids, num_experts):
    # does nothing clever: the tokens as they came, one slot each
    flat = expert_ids.reshape(-1)
    return x.repeat_interleave(expert_ids.shape[1], 0), torch.arange(flat.numel()), \
        torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_bincount(x, expert_ids, num_experts):
    # right values, but bincount reads the largest id back to size its output: a sync on a GPU
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_one_hot(x, expert_ids, num_experts):
    # a right answer: one_hot with num_classes given needs no value on the host (on a GPU it reads none)
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, F.one_hot(flat, num_experts).sum(0).cumsum(0).to(torch.int32)


def permute_unique_counts(x, expert_ids, num_experts):
    # right values, but unique's output size depends on the data: a sync on a GPU, though no .item() is called
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    present, counts = torch.unique(flat, return_counts=True)
    offs = torch.zeros(num_experts, dtype=torch.int64, device=x.device).index_add_(0, present, counts)
    return x[order // expert_ids.shape[1]], order, offs.cumsum(0).to(torch.int32)


def permute_tolist_loop(x, expert_ids, num_experts):
    # counts in a Python loop over the ids: every value comes back to the host
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = [0] * num_experts
    for e in flat.tolist():
        counts[e] += 1
    return x[order // expert_ids.shape[1]], order, torch.tensor(counts).cumsum(0).to(torch.int32)


def permute_calls_helper(x, expert_ids, num_experts):
    # the lesson's helper, the forbidden one-liner
    return moe.permute(x, expert_ids, num_experts)


def permute_second_solution(x, expert_ids, num_experts):
    # a right answer written differently: a stable sort of expert * (T*k) + position, counts by comparison
    flat = expert_ids.reshape(-1)
    key = flat * flat.numel() + torch.arange(flat.numel(), device=flat.device)
    order = torch.sort(key).indices
    offs = (flat[None, :] <= torch.arange(num_experts, device=flat.device)[:, None]).sum(1).to(torch.int32)
    return x.index_select(0, torch.div(order, expert_ids.shape[1], rounding_mode="floor")), order, offs


def ffn_second_solution(xs, params, offs):
    # a right answer written differently: one expert at a time, both projections per slice
    out, start = [], 0
    for e, end in enumerate(offs.tolist()):
        out.append(F.gelu(xs[start:end] @ params["w_up"][e]) @ params["w_down"][e])
        start = end
    return torch.cat(out)


def gemm_skips_first_expert(xs, w, offs):
    # pairs offs[e-1]:offs[e] for e >= 1 only: expert 0's rows are never computed
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    for e in range(1, len(offs)):
        out[offs[e - 1]:offs[e]] = xs[offs[e - 1]:offs[e]] @ w[e]
    return out


def gemm_off_by_one(xs, w, offs):
    # each expert starts one row after the previous expert's end
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = xs[start:end] @ w[e]
        start = end + 1
    return out


def gemm_offsets_as_counts(xs, w, offs):
    # reads offs as rows per expert
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, count in enumerate(offs.tolist()):
        out[start:start + count] = xs[start:start + count] @ w[e]
        start += count
    return out


def gemm_float32_out(xs, w, offs):
    # allocates the output in float32 whatever the inputs' dtype
    out = torch.zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (xs[start:end] @ w[e]).float()
        start = end
    return out


def gemm_calls_grouped_mm(xs, w, offs):
    # the library call the exercise asks to write a fallback for
    return F.grouped_mm(xs, w, offs=offs)


def gemm_calls_padded_bmm(xs, w, offs):
    # the lesson's padded helper: one bmm over every expert padded to the busiest
    return moe.padded_bmm(xs, w, offs)


def gemm_bmm_by_hand(xs, w, offs):
    # every row through every expert in one bmm, then each row's own expert picked
    counts = torch.diff(offs.long(), prepend=offs.new_zeros(1).long())
    group = torch.repeat_interleave(torch.arange(len(counts)), counts)
    rows = int(offs[-1])
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    out[:rows] = torch.bmm(xs[:rows].expand(len(counts), -1, -1), w)[group, torch.arange(rows)]
    return out


def gemm_empty_tail(xs, w, offs):
    # new_empty: the rows past offs[-1] are whatever the memory held
    out = xs.new_empty(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = xs[start:end] @ w[e]
        start = end
    return out


def gemm_every_expert_every_row(xs, w, offs):
    # one 2-D matmul of every row with every expert's weight, then each row keeps its own expert's columns
    experts, k, n = w.shape
    rows = torch.arange(xs.shape[0], dtype=offs.dtype)
    expert_of_row = torch.searchsorted(offs, rows, right=True)
    every = (xs @ w.permute(1, 0, 2).reshape(k, experts * n)).view(-1, experts, n)
    own = every[rows.long(), expert_of_row.clamp(max=experts - 1)]
    return torch.where((expert_of_row < experts)[:, None], own, torch.zeros_like(own))


def gemm_multiply_and_sum(xs, w, offs):
    # each expert on its own rows, but the product as a broadcast multiply and a sum: no matmul
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (xs[start:end, :, None] * w[e]).sum(1)
        start = end
    return out


def ffn_on(gemm):
    """Exercise 3 built on a grouped GEMM: the up projection, GELU, the down projection."""
    def expert_ffn(xs, params, offs):
        return gemm(F.gelu(gemm(xs, params["w_up"], offs)), params["w_down"], offs)
    return expert_ffn


def gemm_second_solution(xs, w, offs):
    # a right answer written differently: counts, split and cat, with a zero tail
    counts = torch.diff(offs.long(), prepend=offs.new_zeros(1).long()).tolist()
    parts = [chunk @ w[e] for e, chunk in enumerate(torch.split(xs[:int(offs[-1])], counts))]
    tail = xs.new_zeros(xs.shape[0] - int(offs[-1]), w.shape[2])
    return torch.cat(parts + [tail]).to(xs.dtype)


def ffn_padded_helper(xs, params, offs):
    # moe.padded_bmm: every expert padded to the busiest one
    return moe.padded_bmm(F.gelu(moe.padded_bmm(xs, params["w_up"], offs)), params["w_down"], offs)


def ffn_padded_by_hand(xs, params, offs):
    # pads every expert's rows to the busiest count and runs one batched matmul
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).tolist()
    starts = [int(o) - c for o, c in zip(offs.tolist(), counts)]
    width = max(counts)

    def padded(x, w):
        batch = x.new_zeros(len(counts), width, x.shape[1])
        for e, (s, c) in enumerate(zip(starts, counts)):
            batch[e, :c] = x[s:s + c]
        y = batch @ w
        return torch.cat([y[e, :c] for e, c in enumerate(counts)])
    return padded(F.gelu(padded(xs, params["w_up"])), params["w_down"])


def ffn_relu(xs, params, offs):
    # ReLU instead of GELU
    return spec03._fallback(torch.relu(spec03._fallback(xs, params["w_up"], offs)), params["w_down"], offs)


def ffn_gelu_tanh(xs, params, offs):
    # GELU's tanh approximation instead of the exact (erf) GELU
    return spec03._fallback(F.gelu(spec03._fallback(xs, params["w_up"], offs), approximate="tanh"), params["w_down"], offs)


def ffn_one_expert(xs, params, offs):
    # every row through expert 0's weights
    return F.gelu(xs @ params["w_up"][0]) @ params["w_down"][0]


def _expert_counts(flat, num_experts):
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def _padded_dest(flat, counts, sizes, stable=True):
    """Each position's row: its group's start plus its rank among its expert's positions."""
    order = torch.argsort(flat, stable=stable)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device))
    return (sizes.cumsum(0) - sizes)[flat] + rank - (counts.cumsum(0) - counts)[flat]


def _worst_case_rows(slots, num_experts, multiple):
    return (slots + num_experts * (multiple - 1)) // multiple * multiple


def _layout_from_sizes(flat, counts, sizes, num_experts, multiple, stable=True):
    return (_padded_dest(flat, counts, sizes, stable), sizes.cumsum(0).to(torch.int32),
            _worst_case_rows(flat.numel(), num_experts, multiple))


def _right_layout(expert_ids, num_experts, multiple):
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    return _layout_from_sizes(flat, counts, (counts + multiple - 1) // multiple * multiple, num_experts, multiple)


def layout_bincount(expert_ids, num_experts, multiple=16):
    # right values, but bincount reads the largest id back to size its output: a sync on a GPU
    flat = expert_ids.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts)
    return _layout_from_sizes(flat, counts, (counts + multiple - 1) // multiple * multiple, num_experts, multiple)


def layout_unique_counts(expert_ids, num_experts, multiple=16):
    # right values, but unique's output size depends on the data: a sync on a GPU
    flat = expert_ids.reshape(-1)
    present, found = torch.unique(flat, return_counts=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).index_add_(0, present, found)
    return _layout_from_sizes(flat, counts, (counts + multiple - 1) // multiple * multiple, num_experts, multiple)


def layout_rows_read_back(expert_ids, num_experts, multiple=16):
    # sizes the buffer from this routing's padded total, read back with int()
    dest, offs, _ = _right_layout(expert_ids, num_experts, multiple)
    return dest, offs, int(offs[-1])


def layout_tolist_loop(expert_ids, num_experts, multiple=16):
    # counts and ranks in a Python loop over the ids: every value comes back to the host
    flat = expert_ids.reshape(-1)
    counts, rank = [0] * num_experts, []
    for e in flat.tolist():
        rank.append(counts[e])
        counts[e] += 1
    sizes = [-(-c // multiple) * multiple for c in counts]
    starts = [sum(sizes[:e]) for e in range(num_experts)]
    dest = torch.tensor([starts[e] + r for e, r in zip(flat.tolist(), rank)])
    return dest, torch.tensor(sizes).cumsum(0).to(torch.int32), _worst_case_rows(flat.numel(), num_experts, multiple)


def layout_round_running_total(expert_ids, num_experts, multiple=16):
    # rounds the cumulative offsets up instead of each expert's count
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    ends = (counts.cumsum(0) + multiple - 1) // multiple * multiple
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    return _layout_from_sizes(flat, counts, sizes, num_experts, multiple)


def layout_pad_end_only(expert_ids, num_experts, multiple=16):
    # the unpadded layout, with only the last offset rounded up
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    sizes = counts.clone()
    sizes[-1] += (-counts.sum()) % multiple
    return _layout_from_sizes(flat, counts, sizes, num_experts, multiple)


def layout_unstable(expert_ids, num_experts, multiple=16):
    # argsort without stable=True: an expert's positions in any order
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    return _layout_from_sizes(flat, counts, (counts + multiple - 1) // multiple * multiple, num_experts, multiple,
                              stable=False)




def layout_pads_exact_multiples(expert_ids, num_experts, multiple=16):
    # (count // multiple + 1) * multiple: a count already a multiple gets a whole group of padding
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    return _layout_from_sizes(flat, counts, (counts // multiple + 1) * multiple, num_experts, multiple)


def layout_clamp_min(expert_ids, num_experts, multiple=16):
    # the lesson's align_groups (torchtitan's clamp_min): an empty expert gets a whole group of padding
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    return _layout_from_sizes(flat, counts, moe.align_groups(counts, multiple), num_experts, multiple)


def layout_sorted_order(expert_ids, num_experts, multiple=16):
    # dest in sorted order: entry i is the row of the i-th position of the sort, not of position i
    flat = expert_ids.reshape(-1)
    counts = _expert_counts(flat, num_experts)
    sizes = (counts + multiple - 1) // multiple * multiple
    by_expert = flat[torch.argsort(flat, stable=True)]
    dest = (sizes.cumsum(0) - sizes)[by_expert] + torch.arange(flat.numel(), device=flat.device) \
        - (counts.cumsum(0) - counts)[by_expert]
    return dest, sizes.cumsum(0).to(torch.int32), _worst_case_rows(flat.numel(), num_experts, multiple)


def layout_unpadded_dest(expert_ids, num_experts, multiple=16):
    # padded offsets, but each position's row is its place in the unpadded sort
    flat = expert_ids.reshape(-1)
    dest, offs, rows = _right_layout(expert_ids, num_experts, multiple)
    order = torch.argsort(flat, stable=True)
    return torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device)), offs, rows


def layout_group_start_only(expert_ids, num_experts, multiple=16):
    # every position of an expert on its group's first row
    flat = expert_ids.reshape(-1)
    _, offs, rows = _right_layout(expert_ids, num_experts, multiple)
    starts = torch.cat([offs.new_zeros(1), offs[:-1]]).long()
    return starts[flat], offs, rows


def layout_always_16(expert_ids, num_experts, multiple=16):
    # the multiple fixed at 16, whatever the argument
    return _right_layout(expert_ids, num_experts, 16)


def layout_rows_unpadded(expert_ids, num_experts, multiple=16):
    # a buffer of T*k rows: no room for padding
    dest, offs, _ = _right_layout(expert_ids, num_experts, multiple)
    return dest, offs, expert_ids.numel()


def layout_rows_round_total(expert_ids, num_experts, multiple=16):
    # T*k rounded up to a multiple: room for one group's padding, not for every expert's
    dest, offs, _ = _right_layout(expert_ids, num_experts, multiple)
    return dest, offs, -(-expert_ids.numel() // multiple) * multiple


def layout_rows_tensor(expert_ids, num_experts, multiple=16):
    # this routing's total, left on the device: no size to allocate a buffer with
    dest, offs, _ = _right_layout(expert_ids, num_experts, multiple)
    return dest, offs, offs[-1]


def layout_rows_every_position_alone(expert_ids, num_experts, multiple=16):
    # room for every position in a group of its own: far more than any routing of num_experts experts needs
    dest, offs, _ = _right_layout(expert_ids, num_experts, multiple)
    return dest, offs, expert_ids.numel() * multiple


def layout_second_solution(expert_ids, num_experts, multiple=16):
    # a right answer written differently: one_hot's running sum ranks each position, the tightest static bound
    flat = expert_ids.reshape(-1)
    hot = F.one_hot(flat, num_experts)
    rank = hot.cumsum(0).gather(1, flat[:, None]).squeeze(1) - 1
    sizes = -(-hot.sum(0) // multiple) * multiple
    ends = sizes.cumsum(0)
    slots = flat.numel()
    rows = multiple * (min(slots, num_experts) + max(slots - num_experts, 0) // multiple)
    return (ends - sizes)[flat] + rank, ends.to(torch.int32), rows


@pytest.mark.parametrize("fn, hint", [(permute_counts_not_offsets, "not the count of each expert"),
                                      (permute_bincount, "reads back to the host: aten::bincount")],
                         ids=["counts-not-offsets", "names-the-host-read"])
def test_check_raises_the_hint(fn, hint):
    with pytest.raises(CheckFailed) as failed:
        check(L03, fn, function="permute_tokens")
    assert hint in str(failed.value)


WRONG = [
    Wrong(L03, "permute_tokens", "unstable", permute_unstable, "order: sorted by expert, ties in arrival order",
          "keep ties in order"),
    Wrong(L03, "permute_tokens", "unsorted", permute_unsorted, "order: sorted by expert, ties in arrival order",
          "sorts the flattened (token, slot) positions by expert"),
    Wrong(L03, "permute_tokens", "counts-not-offsets", permute_counts_not_offsets,
          "offs: cumulative end offsets, expert 1 gets none", "not the count of each expert"),
    Wrong(L03, "permute_tokens", "no-minlength", permute_no_minlength, "experts 2..5 get no token: 6 offsets",
          "tell the counting how many experts there are"),
    Wrong(L03, "permute_tokens", "start-offsets", permute_start_offsets, "offs: cumulative end offsets, expert 1 gets none",
          "not where it starts"),
    Wrong(L03, "permute_tokens", "modulo-k", permute_modulo, "xs: the token of each sorted position",
          "position p belongs to token p // k"),
    Wrong(L03, "permute_tokens", "returns-input", permute_returns_input, "order: sorted by expert, ties in arrival order",
          "sorts the flattened (token, slot) positions by expert"),
    Wrong(L03, "permute_tokens", "bincount-reads-back", permute_bincount, "nothing is read back to the host (no sync on a GPU)",
          "sizes its output from the largest id"),
    Wrong(L03, "permute_tokens", "tolist-loop", permute_tolist_loop, "nothing is read back to the host (no sync on a GPU)",
          ".tolist(), .item(), int() or Python loop"),
    Wrong(L03, "permute_tokens", "unique-counts", permute_unique_counts,
          "nothing is read back to the host (no sync on a GPU)", "sizes its output from the"),
    Wrong(L03, "permute_tokens", "calls-helper", permute_calls_helper, "order: sorted by expert, ties in arrival order",
          FORBIDDEN_HINT),
    Wrong(L03, "fallback_grouped_gemm", "skips-expert-0", gemm_skips_first_expert,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "the first starts at 0"),
    Wrong(L03, "fallback_grouped_gemm", "off-by-one", gemm_off_by_one,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "expert e owns rows offs[e-1]:offs[e]"),
    Wrong(L03, "fallback_grouped_gemm", "offsets-as-counts", gemm_offsets_as_counts,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "expert e owns rows offs[e-1]:offs[e]"),
    Wrong(L03, "fallback_grouped_gemm", "float32-output", gemm_float32_out,
          "6 experts, counts [18, 8, 5, 4, 3, 2], torch.bfloat16", "keep the input's dtype"),
    Wrong(L03, "fallback_grouped_gemm", "calls-grouped-mm", gemm_calls_grouped_mm,
          "4 experts, counts [10, 10, 10, 10], torch.float32", FORBIDDEN_HINT),
    Wrong(L03, "fallback_grouped_gemm", "padded-bmm", gemm_calls_padded_bmm,
          "4 experts, counts [10, 10, 10, 10], torch.float32", FORBIDDEN_HINT),
    Wrong(L03, "fallback_grouped_gemm", "bmm-by-hand", gemm_bmm_by_hand,
          "4 experts, counts [10, 10, 10, 10], torch.float32", FORBIDDEN_HINT),
    Wrong(L03, "fallback_grouped_gemm", "empty-tail", gemm_empty_tail,
          "4 experts own 36 of 48 rows", "their output rows must be 0"),
    Wrong(L03, "fallback_grouped_gemm", "every-expert-every-row", gemm_every_expert_every_row,
          f"{OWN_ROWS_FLOPS_CASE} (4 experts, counts [10, 10, 10, 10], torch.float32)", "num_experts times the work"),
    Wrong(L03, "fallback_grouped_gemm", "multiply-and-sum", gemm_multiply_and_sum,
          f"{OWN_ROWS_FLOPS_CASE} (4 experts, counts [10, 10, 10, 10], torch.float32)", "is no matmul"),
    Wrong(L03, "expert_ffn", "every-expert-every-row", ffn_on(gemm_every_expert_every_row),
          f"{OWN_ROWS_FLOPS_CASE} (4 experts, counts [47, 11, 4, 2])", "num_experts times the work"),
    Wrong(L03, "expert_ffn", "padded-helper", ffn_padded_helper, "4 experts, counts [47, 11, 4, 2]", FORBIDDEN_HINT),
    Wrong(L03, "expert_ffn", "padded-by-hand", ffn_padded_by_hand, "4 experts, counts [47, 11, 4, 2]", FORBIDDEN_HINT),
    Wrong(L03, "expert_ffn", "relu", ffn_relu, "4 experts, counts [47, 11, 4, 2]", "up-projection, GELU"),
    Wrong(L03, "expert_ffn", "gelu-tanh", ffn_gelu_tanh, "4 experts, counts [47, 11, 4, 2]", "GELU"),
    Wrong(L03, "expert_ffn", "one-expert", ffn_one_expert, "4 experts, counts [47, 11, 4, 2]",
          "each expert on its own rows"),
    Wrong(L03, "padded_layout", "bincount-reads-back", layout_bincount,
          "nothing is read back to the host (no sync on a GPU)", "sizes its output from the data"),
    Wrong(L03, "padded_layout", "unique-counts", layout_unique_counts,
          "nothing is read back to the host (no sync on a GPU)", "sizes its output from the data"),
    Wrong(L03, "padded_layout", "rows-read-back", layout_rows_read_back,
          "nothing is read back to the host (no sync on a GPU)", ".item(), int() or Python loop"),
    Wrong(L03, "padded_layout", "tolist-loop", layout_tolist_loop,
          "nothing is read back to the host (no sync on a GPU)", ".tolist(), .item()"),
    Wrong(L03, "padded_layout", "round-running-total", layout_round_running_total,
          "group sizes, counts [17, 15, 3, 13]", "rounding the running total of the raw counts"),
    Wrong(L03, "padded_layout", "pad-end-only", layout_pad_end_only,
          "every group starts at a multiple of 16, counts [17, 15, 3, 13]", "not only the total"),
    Wrong(L03, "padded_layout", "unstable", layout_unstable, "ties keep their arrival order, counts [30, 25, 25]",
          "keep ties in order"),
    Wrong(L03, "padded_layout", "pads-exact-multiples", layout_pads_exact_multiples,
          "group sizes, counts [16, 32, 16, 16] (each already a multiple)", "a multiple needs no padding row"),
    Wrong(L03, "padded_layout", "clamp-min", layout_clamp_min,
          "group sizes, counts [16, 0, 32, 0] (two experts get no token)", "an expert with no token needs no row"),
    Wrong(L03, "padded_layout", "sorted-order", layout_sorted_order,
          "dest[p] is position p's row (one token per expert, multiple=1)", "not the row of the p-th position in sorted"),
    Wrong(L03, "padded_layout", "unpadded-dest", layout_unpadded_dest,
          "each position's row is inside its expert's group, counts [17, 15, 3, 13]", "unpadded sort"),
    Wrong(L03, "padded_layout", "group-start-only", layout_group_start_only, "no two positions share a row",
          "a row of its own"),
    Wrong(L03, "padded_layout", "always-16", layout_always_16, "group sizes, multiple=1",
          "use the multiple you are given"),
    Wrong(L03, "padded_layout", "rows-unpadded", layout_rows_unpadded,
          "rows has room for every routing (48 positions, 4 experts, multiple 16)", "not only this routing's"),
    Wrong(L03, "padded_layout", "rows-round-total", layout_rows_round_total,
          "rows has room for every routing (48 positions, 4 experts, multiple 16)", "how many padding rows"),
    Wrong(L03, "padded_layout", "rows-tensor", layout_rows_tensor,
          "rows is a Python int (48 positions, 4 experts, multiple 16)", "not a tensor"),
    Wrong(L03, "padded_layout", "rows-every-position-alone", layout_rows_every_position_alone,
          "rows is no larger than T*k + (num_experts + 1) * multiple (48 positions, 4 experts, multiple 16)",
          "not for one that cannot"),
]

SECOND_SOLUTIONS = [("permute_tokens", permute_second_solution), ("permute_tokens", permute_one_hot),
                    ("fallback_grouped_gemm", gemm_second_solution), ("expert_ffn", ffn_second_solution),
                    ("padded_layout", layout_second_solution)]

globals().update(lab_tests(L03, WRONG, SECOND_SOLUTIONS, visible=True))
