"""Lab 06 (attention kernels), solved independently.

Written from the student copy of the lab (labs/06_attention_lab.ipynb), lesson 06, the public helpers
and PyTorch's documentation alone, as a learner would: without the lab's solutions or the grader's
reference answers.
"""
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import attention


# Exercise 1 -------------------------------------------------------------------------------------------
def generation_mask(lengths: list[int], max_len: int) -> torch.Tensor:
    first_real = max_len - torch.as_tensor(lengths)                        # where each prompt starts
    q = torch.arange(max_len).view(1, max_len, 1)
    k = torch.arange(max_len).view(1, 1, max_len)
    keep = (k >= first_real.view(-1, 1, 1)) & (k <= q)                       # (batch, queries, keys)
    return keep.unsqueeze(1)


# Exercise 2 -------------------------------------------------------------------------------------------
def unpad(padded: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    lengths_t = torch.as_tensor(lengths)
    starts = padded.shape[1] - lengths_t                                  # where each prompt's tokens begin
    keep = torch.arange(padded.shape[1]).expand(len(lengths), -1) >= starts[:, None]
    cu_seq = torch.cat([torch.zeros(1, dtype=torch.int32), lengths_t.cumsum(0).to(torch.int32)])
    return padded[keep], cu_seq, int(lengths_t.max())


# Exercise 3 -------------------------------------------------------------------------------------------
class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


def backward_ops(q, k, v, **kwargs) -> list[str]:
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, **kwargs)
    seed = torch.ones_like(out)
    with _Recorder() as recorder:
        out.backward(seed)
    return recorder.names


# Exercise 4 -------------------------------------------------------------------------------------------
def _buckets(lengths: list[int], n_buckets: int) -> list[list[int]]:
    """Indices of the sequences, sorted by length, cut into min(n_buckets, len) runs whose sizes differ
    by at most one (the longer runs first, as numpy.array_split does)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = min(n_buckets, len(order))
    if n == 0:
        return []
    size, extra = divmod(len(order), n)
    runs, start = [], 0
    for b in range(n):
        end = start + size + (1 if b < extra else 0)
        runs.append(order[start:end])
        start = end
    return [r for r in runs if r]


def bucketed_attention(seqs: list[torch.Tensor], n_buckets: int) -> list[torch.Tensor]:
    outs: list[torch.Tensor | None] = [None] * len(seqs)
    for run in _buckets([s.shape[0] for s in seqs], n_buckets):
        for i, o in zip(run, attention.padded_attention([seqs[i] for i in run])):
            outs[i] = o
    return outs


# Exercise 5 -------------------------------------------------------------------------------------------
def prefix_lm_mask_mod(lengths: list[int], prefix: int):
    lengths_t = torch.as_tensor(lengths, dtype=torch.int64)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths_t)       # document of each token
    starts = torch.cumsum(lengths_t, 0) - lengths_t                             # first token of each document
    pos = torch.arange(int(lengths_t.sum())) - starts[doc]                      # position inside its document

    def mask_mod(b, h, q_idx, kv_idx):
        same_doc = doc[q_idx] == doc[kv_idx]
        causal = pos[kv_idx] <= pos[q_idx]
        prompt = pos[kv_idx] < prefix
        return same_doc & (causal | prompt)

    return mask_mod


# Exercise 6 -------------------------------------------------------------------------------------------
def choose_bucket_count(lengths: list[int], call_cost: float, entry_cost: float, max_buckets: int) -> int:
    # One padded_attention call on a bucket costs call_cost + entry_cost * len(bucket) * max(bucket)**2
    # (every sequence of the bucket is padded to its longest). Sum over the buckets bucketed_attention
    # makes, for every count, and keep the cheapest (the fewest buckets on a tie).
    # The answer depends on how exercise 4 splits: this one cuts equal-size runs (_buckets); a split that
    # places the cuts to minimise padding, which exercise 4's text and check also allow, can make fewer
    # buckets cheapest.
    best, best_cost = 1, None
    for n in range(1, max_buckets + 1):
        cost = 0.0
        for run in _buckets(lengths, n):
            longest = max(lengths[i] for i in run)
            cost += call_cost + entry_cost * len(run) * longest ** 2
        if best_cost is None or cost < best_cost:
            best, best_cost = n, cost
    return best
