"""Lab 06 (attention): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab06 import BUCKET_COUNT_OK
from helpers.grading.specs.core import Case, Exercise, LabSpec


def _generation_mask(lengths, max_len):
    pos = torch.arange(max_len)
    real_key = pos[None, :] >= (max_len - torch.tensor(lengths))[:, None]     # (batch, keys)
    return (real_key[:, None, :] & (pos[None, :] <= pos[:, None]))[:, None]    # (batch, 1, queries, keys)


def _generation_mask_cases(gen):
    rule = ("a prompt of length n fills the last n positions; each of its queries sees its real keys at or before "
            "it, no padding key and no later key; a (batch, 1, queries, keys) boolean mask broadcasts")
    outputs = "each prompt's rows must equal causal attention over that prompt alone: " + rule
    seqs = lambda lengths: [torch.randn(n, 2, 8, generator=gen) for n in lengths]   # noqa: E731
    return [
        Case("three prompts: which keys each real query sees", ([3, 1, 4], 4, 2), call="mask_mistakes", hint=rule),
        Case("three prompts: attention on the left-padded batch", ([3, 1, 4], 4, seqs([3, 1, 4])),
             call="left_padded_outputs", hint=outputs),
        Case("padding beyond the longest prompt", ([2, 5], 7, 3), call="mask_mistakes", hint=rule),
        Case("one prompt, no padding", ([6], 6, seqs([6])), call="left_padded_outputs", hidden=True, hint=outputs),
        Case("uneven prompts", ([5, 2, 7, 1], 9, seqs([5, 2, 7, 1])), call="left_padded_outputs", hidden=True,
             hint=outputs),
        Case("every prompt full", ([4, 4, 4], 4, 2), call="mask_mistakes", hidden=True, hint=rule),
        Case("as many prompts as heads", ([2, 5], 7, 2), call="mask_mistakes", hidden=True, hint=rule),
    ]


def _unpad(padded, lengths):
    width, lengths = padded.shape[1], torch.tensor(lengths)
    real = torch.arange(width)[None, :] >= (width - lengths)[:, None]
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return padded[real], cu, int(lengths.max())


def _unpad_cases(gen):
    tokens = ("packed holds each prompt's real tokens, prompt after prompt in batch order: a prompt of length n is "
              "the last n rows of its row of the batch, whatever the batch's width, the padding comes first, and "
              "only the lengths tell which rows are real")
    dtype = "cumsum of int64 lengths is int64, and the flash kernel's offsets are int32: convert them"
    offsets = ("varlen_attn reads sequence i as the packed rows from cu_seq[i] to cu_seq[i + 1], so cu_seq has one "
               "entry more than there are sequences, and its first and last entries bound the whole packed tensor")
    longest = ("max_len is the length of the longest prompt (not the total, not the padded width), as a Python "
               "int: a 0-d tensor is not an int, and the kernel takes it as an int argument")
    whole = "each part as the visible cases check it: the tokens, cu_seq's values and dtype, and max_len"

    def batch(lengths, width=None):
        """Prompts padded on the left to `width` with padding rows that hold values (a pad token's embedding
        is not zero): which rows are real follows from the lengths alone."""
        width = width or max(lengths)
        padded = torch.randn(len(lengths), width, 2, 4, generator=gen)
        return padded, list(lengths)
    three, wide = batch([3, 7, 2]), batch([4, 2], width=9)
    return [
        Case("three prompts: the packed tokens", three, call="first", hint=tokens),
        Case("three prompts: cu_seq's dtype", three, call="offsets_dtype", hint=dtype),
        Case("three prompts: cu_seq's values", three, call="offsets_as_int64", hint=offsets),
        Case("three prompts: max_len", three, call="max_len_kind", hint=longest),
        Case("padded wider than the longest prompt: the packed tokens", wide, call="first", hint=tokens),
        Case("padded wider than the longest prompt: max_len", wide, call="max_len_kind", hint=longest),
        Case("one prompt, no padding", batch([5]), hidden=True, hint=whole),
        Case("prompts of length 1", batch([1, 9, 1, 4], width=12), hidden=True, hint=whole),
    ]


def _backward_ops(q, k, v, **kwargs):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.name())
            return func(*args, **(kwargs or {}))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    grad = torch.ones_like(out)
    with Record() as rec:
        out.backward(grad)
    return rec.names


def _backward_cases(gen):
    x = torch.randn(1, 2, 32, 16, generator=gen)
    hint = ("record only what the backward pass dispatches (the forward runs before your mode is entered), each "
            "aten op named as func.name() names it, with every keyword argument passed on to SDPA")
    v_narrow = torch.randn(1, 2, 32, 8, generator=gen)
    return [
        Case("the default choice", (x, x, x), call="backward_backend_of", hint=hint),
        Case("dropout", (x, x, x), {"dropout_p": 0.2}, call="backward_backend_of", hint=hint),
        Case("v of another head dim", (x, x, v_narrow), call="backward_backend_of",
             hint="return the ops that really ran in the backward, recorded in __torch_dispatch__: the backend is "
                  "read off them, never guessed from the arguments (here no dropout, yet the fused CPU kernel "
                  "declines the forward, and the backward follows it)"),
        Case("a boolean mask", (x, x, x), {"attn_mask": torch.ones(32, 32, dtype=torch.bool).tril()},
             call="backward_backend_of", hidden=True, hint=hint),
        Case("causal, float64", (x.double(), x.double(), x.double()), {"is_causal": True},
             call="backward_backend_of", hidden=True, hint=hint),
    ]


def _bucketed(seqs, n_buckets):
    from helpers import attention
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs = [None] * len(seqs)
    for bucket in torch.tensor(order).tensor_split(n_buckets):   # exactly n_buckets runs (chunk can give fewer)
        idx = bucket.tolist()
        if not idx:
            continue
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs


def _bucket_cases(gen):
    lengths = [int(n) for n in torch.randint(1, 60, (7,), generator=gen)]
    seqs = lambda ls: [torch.randn(n, 2, 4, generator=gen) for n in ls]   # noqa: E731
    runs = ("sort the sequences by length first: a bucket of consecutive lengths pads least; call "
            "attention.padded_attention once per bucket")
    exact = ("the number of padded_attention calls must be n_buckets: a split by a bucket size rounded up (what "
             "torch.chunk does) leaves the last buckets empty, one rounded down leaves sequences out; split "
             "by the number of buckets")
    empty = ("with fewer sequences than buckets, some buckets are empty: skip them (padded_attention of an empty "
             "list fails), and still return one output per sequence")
    order = "remember each sequence's index when you sort, and put its output back there"
    few = [int(n) for n in torch.randint(1, 30, (2,), generator=gen)]
    nine = [int(n) for n in torch.randint(1, 60, (9,), generator=gen)]
    return [
        Case("values, in the original order", (seqs(lengths), 2), atol=1e-4, hint=order),
        Case("each bucket holds consecutive lengths", (seqs([40, 3, 35, 30, 5, 2]), 2), call="buckets_are_sorted_runs",
             expected=True, expect_value=True, hint=runs),
        Case("4 buckets for 6 sequences: exactly 4 runs", (seqs([12, 50, 7, 33, 21, 3]), 4),
             call="buckets_are_sorted_runs", expected=True, expect_value=True, hint=exact),
        Case("more buckets than sequences", (seqs([4, 9]), 3), atol=1e-4, hint=empty),
        Case("3 buckets, values", (seqs(lengths), 3), atol=1e-4, hidden=True, hint=order),
        Case("3 buckets hold consecutive lengths", (seqs(lengths), 3), call="buckets_are_sorted_runs", expected=True,
             expect_value=True, hidden=True, hint=runs),
        Case("more buckets than sequences, other lengths", (seqs(few), len(few) + 2), atol=1e-4, hidden=True,
             hint=empty),
        Case("4 buckets for 9 sequences: exactly 4 runs", (seqs(nine), 4), call="buckets_are_sorted_runs",
             expected=True, expect_value=True, hidden=True, hint=exact),
    ]


def _prefix_lm_mask_mod(lengths, prefix):
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    starts = torch.tensor([0] + list(lengths)).cumsum(0)[:-1]
    position = torch.arange(sum(lengths)) - starts[doc]        # each token's position inside its document

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & ((kv_idx <= q_idx) | (position[kv_idx] < prefix))
    return mask_mod


def _prefix_lm_cases(gen):
    causal = ("a token sees the keys of its own document up to and including itself; build the condition from "
              "tensor comparisons joined with & and | (no Python if, and, or: mask_mod runs once, under vmap, on "
              "index tensors)")
    prefix = ("the prefix is the first `prefix` tokens of EACH document, counted from that document's start (a "
              "position inside the document, not in the packed row), and only tokens of the same document see it")
    lengths = [int(n) for n in torch.randint(1, 12, (5,), generator=gen)]
    return [
        Case("prefix 0: causal inside each document", ([4, 3, 5], 0), call="dense_mask", hint=causal),
        Case("a prefix of 2 in each document", ([4, 3, 5], 2), call="dense_mask", hint=prefix),
        Case("a document shorter than the prefix", ([2, 6, 1], 3), call="dense_mask", hint=prefix),
        Case("random lengths, prefix 0", (lengths, 0), call="dense_mask", hidden=True, hint=causal),
        Case("random lengths, prefix 3", (lengths, 3), call="dense_mask", hidden=True, hint=prefix),
        Case("one document", ([9], 4), call="dense_mask", hidden=True, hint=prefix),
    ]


def _choose_bucket_count(lengths, call_cost, entry_cost, max_buckets):
    from helpers.grading.harnesses.lab06 import _bucketing_cost
    return min(range(1, max_buckets + 1), key=lambda n: _bucketing_cost(lengths, n, call_cost, entry_cost))


def _bucket_count_cases(gen):
    padding = ("a padded call scores every (query, key) pair of each sequence in it, padding included: its cost "
               "grows with the sequences it holds times the square of its longest length, so on skewed lengths "
               "the padding of a few large buckets costs more than the calls more buckets add")
    calls = ("each padded_attention call costs call_cost however few sequences it holds: a count whose extra calls "
             "cost more than the padding they remove is not the cheapest")
    alike = "with lengths all alike there is no padding to remove: every bucket past the first only adds a call"
    tail = ("on long-tailed lengths both costs matter: a call costs call_cost however small, and a padded call "
            "scores its longest length squared for every sequence it holds; the verdict says which your count "
            "underweights")
    skewed = [12, 20, 9, 300, 15, 31, 8, 260, 40, 18, 25, 11]

    def case(name, lengths, call_cost, entry_cost, max_buckets, hint, hidden=True):
        return Case(name, (lengths, call_cost, entry_cost, max_buckets), call="bucket_count_verdict",
                    expected=BUCKET_COUNT_OK, expect_value=True, hidden=hidden, hint=hint)

    def lognormal(n, mean):   # lengths as serving sees them: most short, a long tail
        return [min(2048, max(1, int(v))) for v in torch.randn(n, generator=gen).add(mean).exp()]

    cases = [
        case("skewed lengths, cheap calls", skewed, 2e-4, 1e-8, 5, padding, hidden=False),
        case("the same lengths, an expensive call", skewed, 2e-3, 1e-8, 8, calls, hidden=False),
        case("lengths all alike", [64] * 10, 1e-4, 1e-8, 8, alike, hidden=False),
        case("one long outlier", [30] * 15 + [1000], 5e-4, 1e-8, 8, padding),
        case("fewer sequences than max_buckets", [5, 200, 40], 1e-5, 1e-8, 8, padding),
        case("uniform lengths, an expensive call",
             [int(v) for v in torch.randint(1, 512, (24,), generator=gen)], 5e-3, 1e-8, 8, calls),
    ]
    for i in range(4):
        n, mean = int(torch.randint(8, 40, (), generator=gen)), 3.5 + i / 2
        call_cost, entry_cost = (10 ** float(torch.empty(()).uniform_(low, low + 2, generator=gen)) for low in (-5, -9))
        cases.append(case(f"long-tailed lengths {i + 1} ({n} sequences)", lognormal(n, mean), call_cost, entry_cost,
                          4 + i, tail))
    return cases


SPEC = LabSpec("06_attention_lab", (
    Exercise("Exercise 1: the mask for left-padded prompts", "generation_mask", _generation_mask_cases,
             _generation_mask),
    Exercise("Exercise 2: unpad for varlen_attn", "unpad", _unpad_cases, _unpad, forbidden=("helpers.attention.pack",),
             refused="helpers.attention.pack concatenates and computes the offsets for you: compute them yourself"),
    Exercise("Exercise 3: what the backward runs", "backward_ops", _backward_cases, _backward_ops,
             forbidden=("helpers.attention.OpNames", "helpers.attention.backend_that_runs",
                        "helpers.attention.backend_report"),
             refused="these helpers record the dispatched ops for you: write the dispatch mode that records them"),
    Exercise("Exercise 4: bucketed_attention", "bucketed_attention", _bucket_cases, _bucketed),
    Exercise("Exercise 5: a prefix-LM document mask", "prefix_lm_mask_mod", _prefix_lm_cases,
             _prefix_lm_mask_mod),
    Exercise("Exercise 6: choose the bucket count", "choose_bucket_count", _bucket_count_cases,
             _choose_bucket_count),
))
