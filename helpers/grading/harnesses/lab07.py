"""Lab 07 (memory): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import math
import operator

import torch
from torch import nn


def memory_lab_model(width, depth, frozen, dtype) -> nn.Module:
    """memory.mlp(width, depth) in `dtype` with its first `frozen` layers frozen (requires_grad=False)."""
    from helpers.memory import mlp
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = mlp(width, depth).to(getattr(torch, dtype))
    for layer in list(model)[:frozen]:
        layer.requires_grad_(False)
    return model


def predict_for(fn, width, depth, frozen, dtype):
    return fn(memory_lab_model(width, depth, frozen, dtype))


def _accumulation_problem(width, depth, batch, seed):
    """Exercise 3's model (memory.mlp) and batch (x, y), made from `seed`."""
    from helpers.memory import mlp
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = mlp(width, depth)
    return model, torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)


def accumulated_grads(fn, width, depth, batch, micro, seed, stale_grads=False):
    """fn(model, x, y, micro) on a fresh model; the gradients it leaves (a list, None where absent).
    stale_grads: the parameters start with gradients from an earlier step."""
    model, x, y = _accumulation_problem(width, depth, batch, seed)
    if stale_grads:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
    fn(model, x, y, micro)
    return [p.grad for p in model.parameters()]


def only_last_chunk_counts(fn, width, depth, batch, micro, seed) -> bool:
    """Whether the gradients fn leaves are those of the last chunk alone (weighted by its share): what
    clearing the gradients inside the loop leaves."""
    def last_only(model, x, y, micro):
        model.zero_grad(set_to_none=True)
        xs, ys = x.chunk(micro)[-1], y.chunk(micro)[-1]
        (nn.functional.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()
    got, last = accumulated_grads(fn, width, depth, batch, micro, seed), \
        accumulated_grads(last_only, width, depth, batch, micro, seed)
    return all(g is not None and torch.allclose(g, w, atol=1e-6) for g, w in zip(got, last))


def accumulations_per_parameter(fn, width, depth, batch, micro, seed) -> int:
    """How many times a backward pass reached the first parameter while fn ran: one per chunk when
    backward() is called inside the loop, 1 when the chunks' losses are summed first."""
    model, x, y = _accumulation_problem(width, depth, batch, seed)
    calls = []
    handle = next(model.parameters()).register_post_accumulate_grad_hook(lambda p: calls.append(1))
    try:
        fn(model, x, y, micro)
    finally:
        handle.remove()
    return len(calls)


class _SavedActivations:
    """Bytes of the storages that tensors saved for backward hold, while they are held (saved-tensor hooks),
    and their peak; the storages of `given` tensors (the parameters, the batch) are not activations."""

    def __init__(self, given):
        self.given = {t.untyped_storage().data_ptr() for t in given}
        self.holders, self.live, self.peak = {}, 0, 0

    def pack(self, t):
        storage = t.untyped_storage()
        if storage.data_ptr() in self.given:
            return t
        return _Held(t, storage.data_ptr(), storage.nbytes(), self)

    def change(self, ptr, nbytes, by):
        held = self.holders.get(ptr, 0)
        self.holders[ptr] = held + by
        if (held == 0) != (held + by == 0):           # a storage saved for the first time, or released
            self.live += nbytes * by
            self.peak = max(self.peak, self.live)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack)


def _unpack(held):
    return held.t if isinstance(held, _Held) else held


class _Held:
    """A saved tensor, counted while autograd holds it (released after its backward)."""

    def __init__(self, t, ptr, nbytes, saved):
        self.t, self.ptr, self.nbytes, self.saved = t, ptr, nbytes, saved
        saved.change(ptr, nbytes, 1)

    def __del__(self):
        self.saved.change(self.ptr, self.nbytes, -1)


def _saved_activation_peak(fn, width, depth, batch, micro, seed) -> int:
    model, x, y = _accumulation_problem(width, depth, batch, seed)
    saved = _SavedActivations([*model.parameters(), x, y])
    with saved.hooks():
        fn(model, x, y, micro)
    return saved.peak


ONE_CHUNK_SAVED = "one chunk's activations saved for backward at a time"


def activations_of_one_chunk(fn, width, depth, batch, micro, seed) -> str:
    """Whether the activations fn's chunks save for backward peak at about one chunk's share of those of the
    whole batch in one chunk (within 1.5x): what running each chunk's backward before the next forward gives."""
    whole = _saved_activation_peak(fn, width, depth, batch, 1, seed)
    chunked = _saved_activation_peak(fn, width, depth, batch, micro, seed)
    largest = math.ceil(batch / micro)            # x.chunk's largest chunk
    if chunked <= 1.5 * whole * largest / batch:
        return ONE_CHUNK_SAVED
    return (f"the activations saved for backward peaked at {chunked / whole:.2f} of the whole batch's, with chunks "
            f"of at most {largest} of its {batch} rows")


def _gated_blocks(width, depth, policy, seed=0):
    """forward(x) through `depth` memory.GatedMLP blocks, each checkpointed with
    create_selective_checkpoint_contexts(policy); policy None: no checkpointing."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from helpers.memory import GatedMLP
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        blocks = nn.ModuleList(GatedMLP(width) for _ in range(depth))

    def forward(x):
        for block in blocks:
            if policy is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=False,
                               context_fn=lambda: create_selective_checkpoint_contexts(policy))
        return x
    return forward


class _OutputStorages(torch.utils._python_dispatch.TorchDispatchMode):
    """Every storage an op writes its output to, by weak reference: what is still alive afterwards is
    what the forward pass kept."""

    def __init__(self):
        super().__init__()
        self.storages = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.multiprocessing.reductions import StorageWeakRef
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                self.storages[s.data_ptr()] = (StorageWeakRef(s), s.nbytes())
        return out


def kept_bytes_and_backward_flops(policy, width, depth, batch) -> tuple[int, int]:
    """One forward and backward through `depth` GatedMLP blocks checkpointed with `policy` (None: no
    checkpointing): the bytes the forward pass keeps alive for backward (outputs of ops still alive when
    the loss is computed: saved activations, the policy's kept outputs, the blocks' inputs) and the
    matmul FLOPs of backward (torch.utils.flop_counter), recomputed forwards included."""
    from torch.utils.flop_counter import FlopCounterMode
    forward = _gated_blocks(width, depth, policy)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    with _OutputStorages() as outputs:
        loss = forward(x).square().mean()
    kept = sum(nbytes for ref, nbytes in outputs.storages.values() if not ref.expired())
    with FlopCounterMode(display=False) as flops:
        loss.backward()
    return kept, flops.get_total_flops()


def _keep_every_matmul(ctx, op, *args, **kwargs):
    """memory.save_matmuls, written again (a learner's call to the helper is what the exercise forbids)."""
    from torch.utils.checkpoint import CheckpointPolicy
    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE


def matmul_flops_recomputed(fn, width, depth, batch) -> int:
    """Backward's matmul FLOPs with policy fn, minus those without checkpointing: 0 when backward
    recomputes no matmul."""
    return kept_bytes_and_backward_flops(fn, width, depth, batch)[1] - \
        kept_bytes_and_backward_flops(None, width, depth, batch)[1]


def keeps_fewer_bytes_than_save_matmuls(fn, width, depth, batch) -> bool:
    return kept_bytes_and_backward_flops(fn, width, depth, batch)[0] < \
        kept_bytes_and_backward_flops(_keep_every_matmul, width, depth, batch)[0]


# --- Exercise 4: which blocks to checkpoint under a memory budget --------------------------------------

PLAN_OK = "fits the budget at the least recompute cost, or within 2% of it"


def _activation_peak(saved_bytes, chosen) -> int:
    """The most activation bytes held at one moment when the blocks in `chosen` are checkpointed, as exercise 4
    states it: backward runs from the last block to the first; a block not checkpointed holds its bytes from
    its forward until its backward is done; a checkpointed block holds none until backward reaches it, then
    rebuilds them all and holds them until its backward is done."""
    held, rebuilt = 0, 0
    for i, nbytes in enumerate(saved_bytes):
        if i in chosen:
            rebuilt = max(rebuilt, held + nbytes)     # rebuilt while the earlier blocks still hold theirs
        else:
            held += nbytes
    return max(held, rebuilt)                         # held: everything, when backward starts


def modelled_peak(saved_bytes, fixed_bytes, blocks) -> int:
    """The step's peak that exercise 4's model gives for checkpointing `blocks` (what the notebook compares
    with the profiler's)."""
    return fixed_bytes + _activation_peak(saved_bytes, set(blocks))


def _block_indices(plan, n: int) -> set[int] | str:
    """The blocks a plan names, or what is wrong with it (in words)."""
    if isinstance(plan, torch.Tensor):
        if plan.dtype == torch.bool:
            return "a boolean mask, not a list of block indices"
        plan = plan.flatten().tolist()
    if isinstance(plan, (str, bytes, dict)) or not hasattr(plan, "__iter__"):
        return f"a {type(plan).__name__}, not a list of block indices"
    chosen = set()
    for i in plan:
        try:
            i = operator.index(i) if not isinstance(i, bool) else None
        except TypeError:
            i = None
        if i is None:
            return "not a list of block indices: return the indices (ints) of the blocks to checkpoint"
        if not 0 <= i < n:
            return f"{i} is not a block index from 0 to {n - 1}"
        chosen.add(i)
    return chosen


def checkpoint_plan_verdict(fn, saved_bytes, recompute_cost, fixed_bytes, budget, cheapest) -> str:
    """Whether the blocks fn(saved_bytes, recompute_cost, fixed_bytes, budget) returns keep the modelled peak
    within the budget, and at what recompute cost against `cheapest` (the cheapest plan's, which the grader
    computes): PLAN_OK, or what is wrong, without the cheapest plan."""
    saved_bytes, recompute_cost = list(saved_bytes), list(recompute_cost)
    chosen = _block_indices(fn(list(saved_bytes), list(recompute_cost), fixed_bytes, budget), len(saved_bytes))
    if isinstance(chosen, str):
        return chosen
    peak = fixed_bytes + _activation_peak(saved_bytes, chosen)
    if peak > budget:
        return f"blocks {sorted(chosen)} checkpointed: the step peaks at {peak} bytes, {peak - budget} over the budget"
    cost = sum(recompute_cost[i] for i in chosen)
    if cost <= 1.02 * cheapest * (1 + 1e-9):
        return PLAN_OK
    if cheapest == 0:
        return f"blocks {sorted(chosen)} checkpointed: the step fits, but the cheapest plan that fits recomputes nothing"
    return (f"blocks {sorted(chosen)} checkpointed: the step fits, but recomputes {cost / cheapest:.2f}x what the "
            f"cheapest plan that fits does")


class SizedBlock(nn.Module):
    """x + down(gelu(up(x)) * gate(x)) (gated) or x + down(gelu(up(x))), with a hidden size of its own."""

    def __init__(self, width: int, hidden: int, gated: bool):
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.gate = nn.Linear(width, hidden) if gated else None

    def forward(self, x):
        h = nn.functional.gelu(self.up(x))
        return x + self.down(h * self.gate(x) if self.gate is not None else h)


def budget_stack(width: int, hidden: tuple[int, ...], checkpointed=(), seed: int = 0) -> nn.Module:
    """Exercise 4's model: one SizedBlock per entry of `hidden` (hidden size hidden[i] * width; the even-numbered
    blocks gated), then a linear head; the blocks in `checkpointed` run under activation checkpointing."""
    from torch.utils.checkpoint import checkpoint

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(SizedBlock(width, h * width, gated=i % 2 == 0) for i, h in enumerate(hidden))
            self.head = nn.Linear(width, 1)

        def forward(self, x):
            for i, block in enumerate(self.blocks):
                x = checkpoint(block, x, use_reentrant=False) if i in checkpointed else block(x)
            return self.head(x)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Stack()


def block_costs(width: int, hidden: tuple[int, ...], batch: int) -> tuple[list[int], list[int]]:
    """For each block of budget_stack(width, hidden): the bytes its forward saves for backward (the storages of
    the tensors autograd saves, less the parameters and the block's input, which the block keeps checkpointed
    or not) and the FLOPs of its forward (torch.utils.flop_counter), which checkpointing runs again in backward."""
    from torch.utils.flop_counter import FlopCounterMode
    saved, flops = [], []
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    for block in budget_stack(width, hidden).blocks:
        kept_anyway = {t.untyped_storage().data_ptr() for t in (x, *block.parameters())}
        storages = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in kept_anyway:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), FlopCounterMode(display=False) as counter:
            block(x)
        saved.append(sum(storages.values()))
        flops.append(counter.get_total_flops())
    return saved, flops


def measured_peak(width: int, hidden: tuple[int, ...], checkpointed, batch: int) -> int:
    """The profiler's peak (every category) of one Adam training step of budget_stack(width, hidden) with the
    blocks in `checkpointed` checkpointed, after one unprofiled step (Adam makes its state in its first)."""
    from helpers import memory
    step = memory.training_step(budget_stack(width, hidden, set(checkpointed)), batch, width)
    step()
    return memory.peak_bytes(memory.timeline(memory.profile_steps(step, steps=1)))
