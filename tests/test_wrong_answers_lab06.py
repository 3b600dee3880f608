"""Lab 06 (attention): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from helpers import attention
from wrong_answers import FORBIDDEN_HINT, L06, Wrong, lab_tests


def _pads(lengths, max_len):
    return (max_len - torch.tensor(lengths))[:, None]


def mask_right_padded(lengths, max_len):
    # the lesson's mask: real keys are the first n, as when padding on the right
    pos = torch.arange(max_len)
    real = pos[None, :] < torch.tensor(lengths)[:, None]
    return (real[:, None, :] & (pos[None, :] <= pos[:, None]))[:, None]


def mask_causal_only(lengths, max_len):
    # the causal triangle alone: the padding keys at the front stay visible
    return torch.ones(max_len, max_len, dtype=torch.bool).tril().expand(len(lengths), 1, max_len, max_len)


def mask_padding_only(lengths, max_len):
    # the padding masked, the future not
    real = torch.arange(max_len)[None, :] >= _pads(lengths, max_len)
    return real[:, None, None, :]


def mask_strict_causal(lengths, max_len):
    # key < query: a query no longer sees itself
    pos = torch.arange(max_len)
    real = pos[None, :] >= _pads(lengths, max_len)
    return (real[:, None, :] & (pos[None, :] < pos[:, None]))[:, None]


def mask_inverted(lengths, max_len):
    # True on what is masked out, as nn.MultiheadAttention's masks mean
    pos = torch.arange(max_len)
    real = pos[None, :] >= _pads(lengths, max_len)
    return ~(real[:, None, :] & (pos[None, :] <= pos[:, None]))[:, None]


def mask_float(lengths, max_len):
    # a float 0 / -inf mask: SDPA adds it, but it is not the boolean mask asked for
    pos = torch.arange(max_len)
    keep = ((pos[None, :] >= _pads(lengths, max_len))[:, None, :] & (pos[None, :] <= pos[:, None]))[:, None]
    return torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))


def mask_without_head_axis(lengths, max_len):
    # (batch, queries, keys): the batch lines up with the heads
    pos = torch.arange(max_len)
    return (pos[None, :] >= _pads(lengths, max_len))[:, None, :] & (pos[None, :] <= pos[:, None])


def _real_rows(padded, lengths):
    width = padded.shape[1]
    return torch.arange(width)[None, :] >= (width - torch.tensor(lengths))[:, None]


def _offsets(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu


def unpad_right_padded(padded, lengths):
    # the first n rows of each prompt, as if padded on the right: padding taken, tokens left out
    return torch.cat([row[:n] for row, n in zip(padded, lengths)]), _offsets(lengths), max(lengths)


def unpad_keeps_padding(padded, lengths):
    # every row of the batch flattened: the padding rows become tokens
    return padded.flatten(0, 1), _offsets(lengths), max(lengths)


def unpad_no_leading_zero(padded, lengths):
    # N offsets (the ends), without the leading 0
    return padded[_real_rows(padded, lengths)], torch.tensor(lengths).cumsum(0).int(), max(lengths)


def unpad_counts(padded, lengths):
    # the lengths themselves, not their running sum
    return padded[_real_rows(padded, lengths)], torch.tensor([0] + lengths, dtype=torch.int32), max(lengths)


def unpad_offsets_as_list(padded, lengths):
    # the running sum as a Python list
    return padded[_real_rows(padded, lengths)], [sum(lengths[:i]) for i in range(len(lengths) + 1)], max(lengths)


def unpad_int64_offsets(padded, lengths):
    # the running sum left in int64
    return padded[_real_rows(padded, lengths)], torch.tensor([0] + lengths).cumsum(0), max(lengths)


def unpad_tensor_max(padded, lengths):
    # the longest length as a 0-d tensor, not a Python int
    return padded[_real_rows(padded, lengths)], _offsets(lengths), torch.tensor(lengths).max()


def unpad_width_as_max(padded, lengths):
    # the padded width as max_len: right only when the longest prompt fills it
    return padded[_real_rows(padded, lengths)], _offsets(lengths), padded.shape[1]


def unpad_total_as_max(padded, lengths):
    # the total number of tokens as max_len
    return padded[_real_rows(padded, lengths)], _offsets(lengths), sum(lengths)


def unpad_through_pack(padded, lengths):
    # each prompt's tail cut off, then the helper left to concatenate and count
    return attention.pack([row[row.shape[0] - n:] for row, n in zip(padded, lengths)])


def unpad_from_the_longest(padded, lengths):
    # each prompt's rows counted back from the longest prompt, not from the row's end
    longest = max(lengths)
    return torch.cat([row[longest - n:longest] for row, n in zip(padded, lengths)]), _offsets(lengths), longest


def unpad_zero_rows_as_padding(padded, lengths):
    # padding found as the all-zero rows, the lengths unused
    real = padded.abs().sum((-1, -2)) != 0
    counts = real.sum(1)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = counts.cumsum(0)
    return padded[real], cu, int(counts.max())


def unpad_second_solution(padded, lengths):
    # a right answer written differently: each prompt's tail sliced off, offsets from a Python running sum
    ends, total = [0], 0
    for n in lengths:
        total += n
        ends.append(total)
    tails = [row[row.shape[0] - n:] for row, n in zip(padded, lengths)]
    return torch.cat(tails), torch.tensor(ends, dtype=torch.int32), max(lengths)


class _Record(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, name):
        super().__init__()
        self.name, self.names = name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(self.name(func))
        return func(*args, **(kwargs or {}))


def _leaves(*tensors):
    return [t.detach().requires_grad_() for t in tensors]


def backward_drops_kwargs(q, k, v, **kwargs):
    # records the backward correctly but runs SDPA without the keyword arguments
    q, k, v = _leaves(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v)
    with _Record(lambda f: f.name()) as rec:
        out.backward(torch.ones_like(out))
    return rec.names


def backward_str_names(q, k, v, **kwargs):
    # str(func) ("aten.bmm.default") instead of func.name() ("aten::bmm")
    q, k, v = _leaves(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with _Record(str) as rec:
        out.backward(torch.ones_like(out))
    return rec.names


def backward_torch_function_mode(q, k, v, **kwargs):
    # a TorchFunctionMode: sees Python-level calls, not the aten ops the backward dispatches
    names = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))
    q, k, v = _leaves(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with Record():
        out.backward(torch.ones_like(out))
    return names


def backward_with_the_forward(q, k, v, **kwargs):
    # the whole training step recorded: the forward's ops come back with the backward's
    q, k, v = _leaves(q, k, v)
    with _Record(lambda f: f.name()) as rec:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        out.backward(torch.ones_like(out))
    return rec.names


def backward_outside_the_mode(q, k, v, **kwargs):
    # the forward recorded, the backward run after the mode closed
    q, k, v = _leaves(q, k, v)
    with _Record(lambda f: f.name()) as rec:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    out.backward(torch.ones_like(out))
    return rec.names


def backward_without_grad(q, k, v, **kwargs):
    # no input requires grad, so there is no backward to record (and .backward() would raise): returns nothing
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with _Record(lambda f: f.name()) as rec:
        if out.requires_grad:
            out.backward(torch.ones_like(out))
    return rec.names


def bucketed_unsorted(seqs, n_buckets):
    # splits in the input order: buckets mix short and long sequences
    outs = []
    for bucket in torch.arange(len(seqs)).chunk(n_buckets):
        outs += attention.padded_attention([seqs[i] for i in bucket.tolist()])
    return outs


def bucketed_sorted_order(seqs, n_buckets):
    # returns the outputs in sorted order, not the input's
    ordered = sorted(seqs, key=lambda s: s.shape[0])
    outs = []
    for bucket in torch.arange(len(ordered)).chunk(n_buckets):
        outs += attention.padded_attention([ordered[i] for i in bucket.tolist()])
    return outs


def bucketed_floor_size(seqs, n_buckets):
    # bucket size len // n_buckets: the remainder is dropped
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    size = max(1, len(seqs) // n_buckets)
    outs = [None] * len(seqs)
    for b in range(n_buckets):
        idx = order[b * size:(b + 1) * size]
        if idx:
            for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
                outs[i] = o
    return outs


def bucketed_empty_buckets(seqs, n_buckets):
    # even split points: with fewer sequences than buckets some buckets are empty, and still run
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs = [None] * len(seqs)
    for b in range(n_buckets):
        idx = order[b * len(seqs) // n_buckets:(b + 1) * len(seqs) // n_buckets]
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs


def bucketed_chunk(seqs, n_buckets):
    # sorted, but split with torch.chunk: 6 sequences into 4 buckets give 3 chunks of 2
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs = [None] * len(seqs)
    for bucket in torch.tensor(order).chunk(n_buckets):
        idx = bucket.tolist()
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs


def bucketed_one_batch(seqs, n_buckets):
    # do nothing clever: one padded batch, whatever n_buckets says
    return attention.padded_attention(seqs)


def bucketed_second_solution(seqs, n_buckets):
    # a right answer written otherwise: bucket boundaries by integer arithmetic, outputs placed by a dict
    ranked = sorted(enumerate(seqs), key=lambda item: item[1].shape[0])
    n = len(ranked)
    placed = {}
    for b in range(n_buckets):
        bucket = ranked[b * n // n_buckets:(b + 1) * n // n_buckets]
        if bucket:
            placed.update(zip([i for i, _ in bucket], attention.padded_attention([s for _, s in bucket])))
    return [placed[i] for i in range(n)]


def backward_of_the_loss(q, k, v, **kwargs):
    # out.sum().backward() inside the mode: the loss's forward (aten::sum) recorded with the backward
    q, k, v = _leaves(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with _Record(lambda f: f.name()) as rec:
        out.sum().backward()
    return rec.names


def backward_on_the_callers_tensors(q, k, v, **kwargs):
    # requires_grad_ on the caller's own tensors: right names, but the caller's q, k, v now carry grads
    for t in (q, k, v):
        t.requires_grad_()
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with _Record(lambda f: f.name()) as rec:
        out.backward(torch.ones_like(out))
    return rec.names


def backward_kernel_names_only(q, k, v, **kwargs):
    # keeps only the names that say "backward": MATH's bmm calls are dropped
    return [n for n in backward_ops_reference(q, k, v, **kwargs) if "backward" in n]


def backward_as_a_set(q, k, v, **kwargs):
    # a set of names: order and repeats lost
    return set(backward_ops_reference(q, k, v, **kwargs))


def backward_ops_reference(q, k, v, **kwargs):
    q, k, v = _leaves(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with _Record(lambda f: f.name()) as rec:
        out.backward(torch.ones_like(out))
    return rec.names


def backward_guess_from_kwargs(q, k, v, **kwargs):
    # review m13: names the backend from the arguments, without recording anything
    return (["aten::bmm", "aten::_softmax_backward_data"] if kwargs.get("dropout_p")
            else ["aten::_scaled_dot_product_flash_attention_for_cpu_backward"])


def backward_second_solution(q, k, v, **kwargs):
    # a right answer written otherwise: the gradient taken with torch.autograd.grad, the mode entered by hand
    names = []

    class Names(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            names.append(func.name())
            return out
    leaves = [t.clone().detach().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, **kwargs)
    grad = torch.ones_like(out)
    mode = Names()
    mode.__enter__()
    try:
        torch.autograd.grad(out, leaves, grad)
    finally:
        mode.__exit__(None, None, None)
    return names


def _documents(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def prefix_lm_doc_causal(lengths, prefix):
    # the lesson's document mask made causal: the prefix is ignored
    doc = _documents(lengths)
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv <= q)


def prefix_lm_global_prefix(lengths, prefix):
    # the prefix counted from the start of the packed row: only the first document gets one
    doc = _documents(lengths)
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & ((kv <= q) | (kv < prefix))


def prefix_lm_prefix_across_documents(lengths, prefix):
    # every token sees every document's prefix
    doc = _documents(lengths)
    start = torch.tensor([0] + list(lengths)).cumsum(0)[:-1]
    position = torch.arange(sum(lengths)) - start[doc]
    return lambda b, h, q, kv: ((doc[q] == doc[kv]) & (kv <= q)) | (position[kv] < prefix)


def prefix_lm_python_and(lengths, prefix):
    # Python `and` / `or` on tensors: data-dependent control flow under vmap
    doc = _documents(lengths)
    start = torch.tensor([0] + list(lengths)).cumsum(0)[:-1]
    position = torch.arange(sum(lengths)) - start[doc]
    return lambda b, h, q, kv: doc[q] == doc[kv] and (kv <= q or position[kv] < prefix)


def prefix_lm_everything(lengths, prefix):
    # do nothing clever: every key visible
    return lambda b, h, q, kv: q >= 0


def prefix_lm_off_by_one(lengths, prefix):
    # position <= prefix: one token too many in each prompt
    doc = _documents(lengths)
    start = torch.tensor([0] + list(lengths)).cumsum(0)[:-1]
    position = torch.arange(sum(lengths)) - start[doc]
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & ((kv <= q) | (position[kv] <= prefix))


def prefix_lm_second_solution(lengths, prefix):
    # a right answer written otherwise: searchsorted for the document, and_masks / or_masks to combine
    from torch.nn.attention.flex_attention import and_masks, or_masks
    ends = torch.tensor(lengths).cumsum(0)
    doc = torch.searchsorted(ends, torch.arange(int(ends[-1])), right=True)
    first = torch.cat([torch.zeros(1, dtype=ends.dtype), ends[:-1]])[doc]

    def same_doc(b, h, q, kv):
        return doc[q] == doc[kv]

    def causal(b, h, q, kv):
        return q >= kv

    def in_prompt(b, h, q, kv):
        return kv - first[kv] < prefix
    return and_masks(same_doc, or_masks(causal, in_prompt))


def _bucket_cost(lengths, n_buckets, call_cost, entry_cost, longest=lambda run: int(run.max()) ** 2):
    runs = torch.tensor(sorted(lengths)).tensor_split(n_buckets)
    return sum(call_cost + entry_cost * len(run) * longest(run) for run in runs if len(run))


def bucket_count_most(lengths, call_cost, entry_cost, max_buckets):
    # the more buckets, the less padding: always the most allowed
    return max_buckets


def bucket_count_one(lengths, call_cost, entry_cost, max_buckets):
    # every call costs the same overhead: one call is cheapest
    return 1


def bucket_count_tokens(lengths, call_cost, entry_cost, max_buckets):
    # a padded call priced by its padded tokens, not its (query, key) scores
    return min(range(1, max_buckets + 1),
               key=lambda n: _bucket_cost(lengths, n, call_cost, entry_cost, longest=lambda run: int(run.max())))


def bucket_count_second_solution(lengths, call_cost, entry_cost, max_buckets):
    # a right answer written otherwise: the runs cut at b * len // n, plain Python
    ordered = sorted(lengths)

    def cost(n):
        runs = [ordered[b * len(ordered) // n:(b + 1) * len(ordered) // n] for b in range(n)]
        return sum(call_cost + entry_cost * len(run) * run[-1] ** 2 for run in runs if run)
    return min(range(1, max_buckets + 1), key=cost)


def bucket_count_least_padding(lengths, call_cost, entry_cost, max_buckets):
    # a right answer for a learner whose exercise 4 cuts the sorted lengths where the runs waste the least
    # padding (exercise 4 accepts any consecutive runs): the count priced with that split
    ordered = sorted(lengths)

    @functools.lru_cache(maxsize=None)
    def padded(start, runs):        # fewest scores for ordered[start:] in at most `runs` runs
        if start == len(ordered):
            return 0
        if runs == 0:
            return math.inf
        return min((end - start) * ordered[end - 1] ** 2 + padded(end, runs - 1)
                   for end in range(start + 1, len(ordered) + 1))

    def cost(n):
        return n * call_cost + entry_cost * padded(0, n)
    return min(range(1, max_buckets + 1), key=cost)


WRONG = [
    Wrong(L06, "generation_mask", "right-padded", mask_right_padded, "three prompts: which keys each real query sees",
          "a real query sees padding keys"),
    Wrong(L06, "generation_mask", "causal-only", mask_causal_only, "three prompts: which keys each real query sees",
          "a real query sees padding keys"),
    Wrong(L06, "generation_mask", "padding-only", mask_padding_only, "three prompts: which keys each real query sees",
          "a query sees keys after it"),
    Wrong(L06, "generation_mask", "strict-causal", mask_strict_causal,
          "three prompts: which keys each real query sees", "a query misses real keys at or before it"),
    Wrong(L06, "generation_mask", "inverted", mask_inverted, "three prompts: which keys each real query sees",
          "a real query sees padding keys"),
    Wrong(L06, "generation_mask", "float-mask", mask_float, "three prompts: which keys each real query sees",
          "SDPA adds a float mask"),
    Wrong(L06, "generation_mask", "no-head-axis", mask_without_head_axis,
          "three prompts: which keys each real query sees", "give it a head axis"),
    Wrong(L06, "unpad", "right-padded", unpad_right_padded, "three prompts: the packed tokens",
          "the padding comes first"),
    Wrong(L06, "unpad", "keeps-padding", unpad_keeps_padding, "three prompts: the packed tokens",
          "each prompt's real tokens"),
    Wrong(L06, "unpad", "no-leading-zero", unpad_no_leading_zero, "three prompts: cu_seq's values",
          "one entry more than there are sequences"),
    Wrong(L06, "unpad", "counts-not-offsets", unpad_counts, "three prompts: cu_seq's values",
          "from cu_seq[i] to cu_seq[i + 1]"),
    Wrong(L06, "unpad", "int64-offsets", unpad_int64_offsets, "three prompts: cu_seq's dtype", "int32"),
    Wrong(L06, "unpad", "offsets-as-list", unpad_offsets_as_list, "three prompts: cu_seq's dtype", "a list, not a tensor"),
    Wrong(L06, "unpad", "tensor-max-len", unpad_tensor_max, "three prompts: max_len", "a 0-d tensor is not an int"),
    Wrong(L06, "unpad", "width-as-max", unpad_width_as_max, "padded wider than the longest prompt: max_len",
          "not the padded width"),
    Wrong(L06, "unpad", "total-as-max", unpad_total_as_max, "three prompts: max_len", "not the total"),
    Wrong(L06, "unpad", "calls-pack", unpad_through_pack, "three prompts: the packed tokens", FORBIDDEN_HINT),
    Wrong(L06, "unpad", "from-the-longest", unpad_from_the_longest,
          "padded wider than the longest prompt: the packed tokens", "whatever the batch's width"),
    Wrong(L06, "unpad", "zero-rows-as-padding", unpad_zero_rows_as_padding, "three prompts: the packed tokens",
          "only the lengths tell which rows are real"),
    Wrong(L06, "backward_ops", "drops-kwargs", backward_drops_kwargs, "dropout", "every keyword argument passed on"),
    Wrong(L06, "backward_ops", "str-names", backward_str_names, "the default choice", "named as func.name() names it"),
    Wrong(L06, "backward_ops", "torch-function-mode", backward_torch_function_mode, "the default choice",
          "each aten op named as func.name() names it"),
    Wrong(L06, "backward_ops", "with-the-forward", backward_with_the_forward, "the default choice",
          "the forward's ops recorded too"),
    Wrong(L06, "backward_ops", "forward-only", backward_outside_the_mode, "the default choice",
          "only the forward's ops"),
    Wrong(L06, "backward_ops", "loss-recorded", backward_of_the_loss, "the default choice",
          "the forward's ops recorded too (aten::sum)"),
    Wrong(L06, "backward_ops", "callers-tensors", backward_on_the_callers_tensors, "the default choice",
          "make copies that require grad"),
    Wrong(L06, "backward_ops", "kernel-names-only", backward_kernel_names_only, "dropout",
          "not every aten op the backward dispatched"),
    Wrong(L06, "backward_ops", "a-set", backward_as_a_set, "the default choice", "a set, not a list"),
    Wrong(L06, "backward_ops", "no-grad", backward_without_grad, "the default choice",
          "no SDPA backward among the 0 ops recorded"),
    Wrong(L06, "backward_ops", "guess-from-kwargs", backward_guess_from_kwargs, "v of another head dim",
          "never guessed from the arguments"),
    Wrong(L06, "bucketed_attention", "unsorted", bucketed_unsorted, "each bucket holds consecutive lengths",
          "sort the sequences by length"),
    Wrong(L06, "bucketed_attention", "sorted-output", bucketed_sorted_order, "values, in the original order",
          "put its output back there"),
    Wrong(L06, "bucketed_attention", "floor-size", bucketed_floor_size, "4 buckets for 6 sequences: exactly 4 runs",
          "one rounded down leaves sequences out"),
    Wrong(L06, "bucketed_attention", "chunk", bucketed_chunk, "4 buckets for 6 sequences: exactly 4 runs",
          "what torch.chunk does"),
    Wrong(L06, "bucketed_attention", "empty-buckets", bucketed_empty_buckets, "more buckets than sequences",
          "some buckets are empty: skip them"),
    Wrong(L06, "bucketed_attention", "one-batch", bucketed_one_batch, "each bucket holds consecutive lengths",
          "call attention.padded_attention once per bucket"),
    Wrong(L06, "prefix_lm_mask_mod", "document-causal", prefix_lm_doc_causal, "a prefix of 2 in each document",
          "the first `prefix` tokens of EACH document"),
    Wrong(L06, "prefix_lm_mask_mod", "global-prefix", prefix_lm_global_prefix, "a prefix of 2 in each document",
          "not in the packed row"),
    Wrong(L06, "prefix_lm_mask_mod", "prefix-across-documents", prefix_lm_prefix_across_documents,
          "a prefix of 2 in each document", "only tokens of the same document see it"),
    Wrong(L06, "prefix_lm_mask_mod", "python-and", prefix_lm_python_and, "prefix 0: causal inside each document",
          "no Python if, and, or"),
    Wrong(L06, "prefix_lm_mask_mod", "everything", prefix_lm_everything, "prefix 0: causal inside each document",
          "a token sees the keys of its own document"),
    Wrong(L06, "prefix_lm_mask_mod", "off-by-one", prefix_lm_off_by_one, "a document shorter than the prefix",
          "counted from that document's start"),
    Wrong(L06, "choose_bucket_count", "most-buckets", bucket_count_most, "the same lengths, an expensive call",
          "costs call_cost however few sequences it holds"),
    Wrong(L06, "choose_bucket_count", "one-bucket", bucket_count_one, "skewed lengths, cheap calls",
          "padding included"),
    Wrong(L06, "choose_bucket_count", "padded-tokens", bucket_count_tokens, "skewed lengths, cheap calls",
          "the square of its longest length"),
]

SECOND_SOLUTIONS = [("unpad", unpad_second_solution), ("backward_ops", backward_second_solution),
                    ("bucketed_attention", bucketed_second_solution), ("prefix_lm_mask_mod", prefix_lm_second_solution),
                    ("choose_bucket_count", bucket_count_second_solution),
                    ("choose_bucket_count", bucket_count_least_padding)]

globals().update(lab_tests(L06, WRONG, SECOND_SOLUTIONS, visible=True))
