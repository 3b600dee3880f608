"""Lab 06 (attention): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import math
import sys

import torch


RIGHT_MASK = "no mistake"


def mask_mistakes(fn, lengths, max_len, heads) -> str:
    """What a mask for left-padded prompts gets wrong on the real queries' rows (a prompt of length n fills
    the last n positions), in words that name the mistake; RIGHT_MASK when there is none. The padding
    queries' rows are not judged: nothing reads their outputs."""
    mask = fn(lengths, max_len)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return (f"a {getattr(mask, 'dtype', type(mask).__name__)} mask: SDPA adds a float mask to the scores, "
                "and keeps the True positions of a boolean one")
    full = (len(lengths), heads, max_len, max_len)
    if mask.dim() == 3 and mask.shape[0] == len(lengths) > 1:   # broadcasts silently where batch equals heads
        return (f"a (batch, queries, keys) mask {tuple(mask.shape)}: a mask broadcasts from the right, so SDPA "
                "reads its first dimension as the heads; give it a head axis")
    try:
        mask = mask.expand(full)
    except RuntimeError:
        return f"shape {tuple(mask.shape)} does not broadcast to (batch, heads, queries, keys) = {full}"
    pos = torch.arange(max_len)
    pads = (max_len - torch.as_tensor(lengths))[:, None, None, None]
    query, key = pos[:, None], pos[None, :]
    want = (key >= pads) & (key <= query)
    real_rows = (query >= pads).expand(full)
    seen, hidden = mask & ~want & real_rows, ~mask & want & real_rows
    mistakes = [text for text, wrong in (
        ("a real query sees padding keys", (seen & (key < pads)).any()),
        ("a query sees keys after it", (seen & (key > query)).any()),
        ("a query misses real keys at or before it", hidden.any())) if wrong]
    return "; ".join(mistakes) or RIGHT_MASK


def left_padded_outputs(fn, lengths, max_len, seqs) -> list[torch.Tensor]:
    """SDPA on the prompts padded on the left with fn's mask; each prompt's real rows (batch, heads) out."""
    x = torch.stack([torch.nn.functional.pad(s, (0, 0, 0, 0, max_len - s.shape[0], 0)) for s in seqs]).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=fn(lengths, max_len))
    return [o[max_len - n:] for o, n in zip(out.transpose(1, 2), lengths)]


def offsets_as_int64(fn, *args) -> torch.Tensor:
    """unpad's offsets (its second result) as int64: their values, whatever their dtype."""
    return torch.as_tensor(fn(*args)[1]).to(torch.int64)


def offsets_dtype(fn, *args) -> str:
    """unpad's offsets' dtype, or what they are when they are not a tensor (a list, a numpy array)."""
    offsets = fn(*args)[1]
    return str(offsets.dtype) if isinstance(offsets, torch.Tensor) else f"a {type(offsets).__name__}, not a tensor"


def max_len_kind(fn, padded, lengths) -> str:
    """What unpad's third result is, in words that do not give the length away."""
    value = fn(padded, lengths)[2]
    if type(value) is not int:
        return f"a {type(value).__name__}, not a Python int"
    if value == max(lengths):
        return "the longest length"
    return "the padded width, not the longest prompt" if value == padded.shape[1] else "an int, not the longest length"


FORWARD_SIDE = ("aten::_safe_softmax", "aten::_softmax", "aten::sum")   # MATH's forward ops, and a loss's


def backward_backend_of(fn, q, k, v, **kwargs) -> str:
    """The backend whose backward fn's ops show, or what they show instead, in words that name the mistake:
    not a list of names, names not as func.name() gives them, the caller's tensors changed, forward ops
    recorded, only some of the backward's ops, no SDPA backward at all."""
    from helpers.attention import BACKEND_OPS, backward_backend_from_ops
    names = fn(q, k, v, **kwargs)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        kind = type(names).__name__ if not isinstance(names, list) else \
            f"list of {type(next(n for n in names if not isinstance(n, str))).__name__}"
        return f"a {kind}, not a list of the names func.name() gives"
    if any(t.requires_grad or t.grad is not None for t in (q, k, v)):
        return "the caller's q, k or v now require grad or hold a .grad: make copies that require grad"
    if names and not any(n.startswith("aten::") for n in names):
        return f"names such as {names[0]!r}: not aten ops as func.name() names them ('aten::bmm')"
    forward = sorted({n for n in names if n in BACKEND_OPS or n in FORWARD_SIDE})
    try:
        backend = backward_backend_from_ops(names)
    except RuntimeError:
        if forward:
            return f"only the forward's ops ({', '.join(forward)}): the backward ran outside your mode"
        return (f"no SDPA backward among the {len(names)} ops recorded" + (f" (the first: {', '.join(names[:3])})"
                if names else ": did q, k and v require grad, and did the backward run inside your mode?"))
    if forward:
        return f"the forward's ops recorded too ({', '.join(forward)})"
    if backend == "MATH" and "aten::bmm" not in names:
        return "some of MATH's backward ops, not every aten op the backward dispatched"
    return backend


def padded_attention_calls(fn, *args, **kwargs) -> list[list[int]]:
    """fn(*args, **kwargs) with the sequence lengths of each attention.padded_attention call it makes
    recorded: a list per call, in call order (how a bucketing function's buckets are seen)."""
    from helpers import attention
    code = attention.padded_attention.__code__
    buckets: list[list[int]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            buckets.append([s.shape[0] for s in frame.f_locals["seqs"]])
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return buckets


def buckets_are_sorted_runs(fn, seqs, n_buckets) -> bool:
    """The lengths of each attention.padded_attention call fn makes: n_buckets calls (fewer only when
    there are fewer sequences), each a run of consecutive lengths in sorted order."""
    buckets = sorted((b for b in padded_attention_calls(fn, seqs, n_buckets) if b), key=min)
    ordered = all(max(a) <= min(b) for a, b in zip(buckets, buckets[1:]))
    return ordered and len(buckets) == min(n_buckets, len(seqs)) and sum(map(len, buckets)) == len(seqs)


def dense_mask(fn, lengths, prefix) -> torch.Tensor:
    """The (total, total) boolean mask of the mask_mod fn(lengths, prefix) returns, built as
    create_block_mask builds it: create_mask, one vmapped call over every (q_idx, kv_idx) pair."""
    from torch.nn.attention.flex_attention import create_mask
    total = sum(lengths)
    return create_mask(fn(list(lengths), prefix), None, None, total, total, device="cpu")[0, 0]


BUCKET_COUNT_OK = "the cheapest count, or within 2% of it"


def _runs(lengths, n_buckets, split: str) -> list[list[int]]:
    """The sorted lengths cut into n_buckets runs, as exercise 4 accepts them: by tensor_split (the longer
    runs first), at the boundaries b * len // n_buckets, or where they leave the fewest padded scores."""
    ordered = sorted(lengths)
    if split == "least_padding":
        return _least_padding_runs(ordered, n_buckets)
    if split == "tensor_split":
        return [r.tolist() for r in torch.tensor(ordered).tensor_split(n_buckets)]
    return [ordered[b * len(ordered) // n_buckets:(b + 1) * len(ordered) // n_buckets] for b in range(n_buckets)]


def _least_padding_runs(ordered: list[int], n_buckets: int) -> list[list[int]]:
    """Consecutive runs of the sorted lengths, at most n_buckets, with the fewest scores computed (each run
    costs its size times its longest length squared): a split exercise 4 accepts as well."""
    size = len(ordered)
    best = [[math.inf] * (size + 1) for _ in range(n_buckets + 1)]
    cut = [[0] * (size + 1) for _ in range(n_buckets + 1)]
    best[0][0] = 0
    for runs in range(1, n_buckets + 1):
        for end in range(size + 1):
            for start in range(end + 1):
                cost = best[runs - 1][start] + ((end - start) * ordered[end - 1] ** 2 if end > start else 0)
                if cost < best[runs][end]:
                    best[runs][end], cut[runs][end] = cost, start
    found, end = [], size
    for runs in range(n_buckets, 0, -1):
        start = cut[runs][end]
        found.append(ordered[start:end])
        end = start
    return found[::-1]


def _bucketing_cost(lengths, n_buckets, call_cost, entry_cost, split: str = "tensor_split") -> float:
    """What exercise 4's buckets cost: per padded call, call_cost plus entry_cost per (query, key) score it
    computes, padding included (the bucket's size times its longest length squared)."""
    return sum(call_cost + entry_cost * len(r) * max(r) ** 2 for r in _runs(lengths, n_buckets, split) if r)


def bucket_count_verdict(fn, lengths, call_cost, entry_cost, max_buckets) -> str:
    """Whether the count fn chooses makes exercise 4's bucketing (under one of the splits it accepts: equal runs
    either way, or the least padding) cheapest under the two costs, and if not, which way it is off (without
    the count)."""
    count = fn(list(lengths), call_cost, entry_cost, max_buckets)
    if type(count) is not int:
        return f"a {type(count).__name__}, not a Python int"
    if not 1 <= count <= max_buckets:
        return f"{count} is not a count from 1 to max_buckets ({max_buckets})"
    ratios = {}
    for split in ("tensor_split", "boundaries", "least_padding"):
        costs = {n: _bucketing_cost(lengths, n, call_cost, entry_cost, split) for n in range(1, max_buckets + 1)}
        ratios[split] = costs[count] / min(costs.values()), min(costs, key=costs.get)
    if min(ratio for ratio, _ in ratios.values()) <= 1.02:
        return BUCKET_COUNT_OK
    ratio, cheapest = ratios["tensor_split"]
    side = ("too many buckets: the calls they add cost more than the padding they remove" if count > cheapest else
            "too few buckets: the padding they leave costs more than the calls they save")
    return f"{side} (your count costs {ratio:.2f}x the cheapest)"
