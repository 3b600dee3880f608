"""Lab 07 (memory): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from helpers.checks import CheckFailed
from helpers.grading.checks import check
from wrong_answers import FORBIDDEN_HINT, MATCH_HINT, L07, Wrong, lab_tests


def _nbytes(ps):
    return sum(p.numel() * p.element_size() for p in ps)


def predicted_one_adam_state(model):
    # Adam keeps two moments per parameter; counts one
    ps = [p for p in model.parameters() if p.requires_grad]
    return {"parameter": _nbytes(model.parameters()), "gradient": _nbytes(ps),
            "optimizer_state": _nbytes(ps) + 4 * len(ps)}


def predicted_ignores_frozen(model):
    # gradients and optimizer state for frozen parameters too
    ps = list(model.parameters())
    return {"parameter": _nbytes(ps), "gradient": _nbytes(ps), "optimizer_state": 2 * _nbytes(ps) + 4 * len(ps)}


def predicted_no_step(model):
    # forgets Adam's 4-byte step per tensor
    ps = [p for p in model.parameters() if p.requires_grad]
    return {"parameter": _nbytes(model.parameters()), "gradient": _nbytes(ps), "optimizer_state": 2 * _nbytes(ps)}


def predicted_four_bytes(model):
    # 4 bytes per element whatever the dtype
    ps = [p for p in model.parameters() if p.requires_grad]
    size = lambda group: sum(4 * p.numel() for p in group)   # noqa: E731
    return {"parameter": size(model.parameters()), "gradient": size(ps), "optimizer_state": 2 * size(ps) + 4 * len(ps)}


def predicted_by_profiling(model):
    # measures instead of predicting: the profiler the exercise rules out
    from helpers import memory
    tl = memory.timeline(memory.profile_steps(memory.training_step(model, 4, model[0][0].in_features), steps=1))
    return {c: memory.peak_bytes(tl, c) for c in ("parameter", "gradient", "optimizer_state")}


def _policy(keep):
    """A selective-checkpointing policy: MUST_SAVE where keep(op, args) is true, else PREFER_RECOMPUTE."""
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if keep(op, args) else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


# recomputes everything: full checkpointing, every matmul redone ("do nothing clever")
keep_nothing = _policy(lambda op, args: False)


# saves every op's output: keeps more than no checkpointing
keep_everything = _policy(lambda op, args: True)


# the deep dive's rule written again: down's output is kept though no backward reads it
keep_every_matmul = _policy(lambda op, args: op in MATMULS)


# keeps only the narrow matmul output (down's): up and gate are recomputed
keep_narrow_matmul = _policy(lambda op, args: op in MATMULS and args[-1].shape[-1] < args[-2].shape[-1])


# keeps the pointwise outputs, recomputes the matmuls: the costly ops redone, the cheap ones kept
keep_pointwise = _policy(lambda op, args: op not in MATMULS)


def keep_calls_save_matmuls(ctx, op, *args, **kwargs):
    # the lesson's policy itself: forbidden
    from helpers import memory
    return memory.save_matmuls(ctx, op, *args, **kwargs)


def accumulate_not_divided(model, x, y, micro):
    # sums the chunks' mean losses: gradients `micro` times too large
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        F.mse_loss(model(xs), ys).backward()


def accumulate_divided_by_micro(model, x, y, micro):
    # divides by the number of chunks: right only when the chunks are equal
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (F.mse_loss(model(xs), ys) / micro).backward()


def accumulate_stale(model, x, y, micro):
    # never zeroes the gradients: an earlier step's are added in
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


def accumulate_zero_in_loop(model, x, y, micro):
    # zeroes the gradients before every chunk: only the last chunk's remain
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        model.zero_grad(set_to_none=True)
        (F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


def accumulate_one_backward(model, x, y, micro):
    # right gradients, but one backward on the summed losses: every chunk's activations alive at once
    model.zero_grad(set_to_none=True)
    total = sum(F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0]) for xs, ys in zip(x.chunk(micro), y.chunk(micro)))
    total.backward()


def accumulate_forwards_first(model, x, y, micro):
    # one backward per chunk, but every chunk's forward first: all their activations alive at once
    model.zero_grad(set_to_none=True)
    losses = [F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0]) for xs, ys in zip(x.chunk(micro), y.chunk(micro))]
    for loss in losses:
        loss.backward()


def accumulate_retain_graph(model, x, y, micro):
    # backward inside the loop with retain_graph=True "to be safe": each chunk's activations outlive its backward
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        loss = F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])
        loss.backward(retain_graph=True)


def _plan_peak(saved, fixed, plan, rebuild=True, backward_from="last"):
    """A plan's peak as the exercise states it (rebuild=True, backward from the last block), or as a mistake
    works it out: no rebuild, or backward taken to start at the first block."""
    held = sum(s for i, s in enumerate(saved) if i not in plan)
    if not rebuild:
        return fixed + held
    before, rebuilt = 0, 0
    for i in (range(len(saved)) if backward_from == "last" else reversed(range(len(saved)))):
        if i in plan:
            rebuilt = max(rebuilt, before + saved[i])
        else:
            before += saved[i]
    return fixed + max(held, rebuilt)


def _cheapest_plan(saved, cost, fits, when_none=None):
    """The cheapest set of blocks for which fits(plan) holds, every set tried; when_none: what to return when
    none does (None: raise, with the lowest peak)."""
    plans = [set(c) for k in range(len(saved) + 1) for c in itertools.combinations(range(len(saved)), k)]
    fitting = [p for p in plans if fits(p)]
    if not fitting:
        if when_none is not None:
            return when_none
        raise ValueError(f"no plan fits: the lowest peak a plan reaches is {min(_plan_peak(saved, 0, p) for p in plans)}")
    return sorted(min(fitting, key=lambda p: sum(cost[i] for i in p)))


def plan_everything(saved_bytes, recompute_cost, fixed_bytes, budget):
    # checkpoints every block: the lowest peak, at the highest cost
    if fixed_bytes + max(saved_bytes) > budget:
        raise ValueError(f"no plan fits: the lowest peak a plan reaches is {fixed_bytes + max(saved_bytes)} bytes")
    return list(range(len(saved_bytes)))


def plan_ignores_fixed(saved_bytes, recompute_cost, fixed_bytes, budget):
    # fits the activations alone into the budget
    return _cheapest_plan(saved_bytes, recompute_cost, lambda p: _plan_peak(saved_bytes, 0, p) <= budget)


def plan_ignores_rebuild(saved_bytes, recompute_cost, fixed_bytes, budget):
    # a checkpointed block's bytes taken as gone for the whole step: its rebuild in backward forgotten
    return _cheapest_plan(saved_bytes, recompute_cost,
                          lambda p: _plan_peak(saved_bytes, fixed_bytes, p, rebuild=False) <= budget)


def plan_backward_from_first(saved_bytes, recompute_cost, fixed_bytes, budget):
    # the rebuild counted, but backward taken to run from the first block to the last
    return _cheapest_plan(saved_bytes, recompute_cost,
                          lambda p: _plan_peak(saved_bytes, fixed_bytes, p, backward_from="first") <= budget)


def _greedy_plan(order):
    """Blocks taken one at a time in order(saved, cost) until the peak fits."""
    def plan(saved_bytes, recompute_cost, fixed_bytes, budget):
        chosen = set()
        for i in order(saved_bytes, recompute_cost):
            if _plan_peak(saved_bytes, fixed_bytes, chosen) <= budget:
                break
            chosen.add(i)
        if _plan_peak(saved_bytes, fixed_bytes, chosen) > budget:
            raise ValueError(f"no plan fits: the lowest peak a plan reaches is {fixed_bytes + max(saved_bytes)} bytes")
        return sorted(chosen)
    return plan


# the biggest blocks first, until the peak fits
plan_biggest_first = _greedy_plan(lambda saved, cost: sorted(range(len(saved)), key=lambda i: -saved[i]))


# the most bytes freed per FLOP recomputed first, until the peak fits
plan_best_ratio_first = _greedy_plan(lambda saved, cost: sorted(range(len(saved)), key=lambda i: -saved[i] / cost[i]))


def plan_strictly_below(saved_bytes, recompute_cost, fixed_bytes, budget):
    # a peak equal to the budget taken as over it
    return _cheapest_plan(saved_bytes, recompute_cost, lambda p: _plan_peak(saved_bytes, fixed_bytes, p) < budget)


def plan_when_none_fits(saved_bytes, recompute_cost, fixed_bytes, budget):
    # when no plan fits, returns every block (the lowest peak) instead of saying so
    return _cheapest_plan(saved_bytes, recompute_cost, lambda p: _plan_peak(saved_bytes, fixed_bytes, p) <= budget,
                          when_none=list(range(len(saved_bytes))))


def plan_calls_modelled_peak(saved_bytes, recompute_cost, fixed_bytes, budget):
    # every plan tried, each peak taken from the notebook's model: refused
    from helpers.grading.harnesses.lab07 import modelled_peak
    return _cheapest_plan(saved_bytes, recompute_cost, lambda p: modelled_peak(saved_bytes, fixed_bytes, p) <= budget)


def plan_vague_error(saved_bytes, recompute_cost, fixed_bytes, budget):
    # raises when no plan fits, but with no number to act on
    plan = plan_when_none_fits(saved_bytes, recompute_cost, fixed_bytes, budget)
    if _plan_peak(saved_bytes, fixed_bytes, set(plan)) > budget:
        raise ValueError("the budget is too small")
    return plan


def predicted_bytes_second(model):
    from collections import Counter
    counts = Counter()
    for _, p in model.named_parameters():
        nbytes = p.nelement() * torch.finfo(p.dtype).bits // 8
        counts["parameter"] += nbytes
        if p.requires_grad:
            counts["gradient"] += nbytes
            counts["optimizer_state"] += 2 * nbytes + torch.tensor(0.0).element_size()
    return {k: counts[k] for k in ("parameter", "gradient", "optimizer_state")}


def keep_policy_second(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    if op.overloadpacket in (torch.ops.aten.addmm, torch.ops.aten.mm):
        weight = args[-1]                                   # (in, out): the transposed weight
        if weight.shape[1] >= 2 * weight.shape[0]:          # the up-projections (4x wider out than in)
            return CheckpointPolicy.PREFER_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def accumulate_grads_second(model, x, y, micro):
    for p in model.parameters():
        p.grad = None
    n, size = len(x), -(-len(x) // micro)
    for start in range(0, n, size):
        xs, ys = x[start:start + size], y[start:start + size]
        (F.mse_loss(model(xs), ys, reduction="sum") / (n * ys.shape[1])).backward()


def plan_checkpointing_second(saved_bytes, recompute_cost, fixed_bytes, budget):
    # depth-first over the blocks in forward order, carrying what the earlier blocks hold and the worst rebuild
    # so far; a branch stops once it is over the budget or costs as much as the best plan found
    lowest = fixed_bytes + max(saved_bytes)
    if lowest > budget:
        raise ValueError(f"even with every block checkpointed the step peaks at {lowest} bytes, over the budget of "
                         f"{budget}: raise the budget or shrink the batch")
    room, best = budget - fixed_bytes, [math.inf, None]

    def visit(i, held, worst, cost, chosen):
        if cost >= best[0] or worst > room:
            return
        if i == len(saved_bytes):
            if held <= room:
                best[:] = [cost, chosen]
            return
        visit(i + 1, held + saved_bytes[i], worst, cost, chosen)
        visit(i + 1, held, max(worst, held + saved_bytes[i]), cost + recompute_cost[i], chosen + (i,))
    visit(0, 0, 0, 0.0, ())
    return best[1]


def test_check_raises_the_hint():
    with pytest.raises(CheckFailed) as failed:
        check(L07, accumulate_divided_by_micro, function="accumulate_grads")
    assert "dividing by the number of chunks" in str(failed.value)


WRONG = [
    Wrong(L07, "predicted_bytes", "one-adam-state", predicted_one_adam_state, "float32, every layer trainable",
          "Adam keeps more per trainable parameter than one tensor"),
    Wrong(L07, "predicted_bytes", "ignores-frozen", predicted_ignores_frozen, "the first 2 layers frozen",
          "over the parameters with requires_grad only"),
    Wrong(L07, "predicted_bytes", "no-step", predicted_no_step, "float32, every layer trainable",
          "the per-tensor counter included"),
    Wrong(L07, "predicted_bytes", "four-bytes", predicted_four_bytes, "bfloat16 parameters",
          "a bfloat16 element takes 2 bytes"),
    Wrong(L07, "predicted_bytes", "profiles", predicted_by_profiling, "float32, every layer trainable",
          FORBIDDEN_HINT),
    Wrong(L07, "keep_policy", "keep-nothing", keep_nothing,
          "no matmul recomputed in backward (width 32, 3 blocks, batch 128)", "backward recomputed a matmul"),
    Wrong(L07, "keep_policy", "calls-save-matmuls", keep_calls_save_matmuls,
          "no matmul recomputed in backward (width 32, 3 blocks, batch 128)", FORBIDDEN_HINT),
    Wrong(L07, "keep_policy", "every-matmul", keep_every_matmul,
          "fewer bytes kept than save_matmuls (width 32, 3 blocks, batch 128)", "is read by no backward formula"),
    Wrong(L07, "keep_policy", "everything", keep_everything,
          "fewer bytes kept than save_matmuls (width 32, 3 blocks, batch 128)", "as many bytes as saving every matmul"),
    Wrong(L07, "keep_policy", "narrow-matmul", keep_narrow_matmul,
          "no matmul recomputed in backward (width 32, 3 blocks, batch 128)", "a matmul redone"),
    Wrong(L07, "keep_policy", "pointwise", keep_pointwise,
          "no matmul recomputed in backward (width 32, 3 blocks, batch 128)", "let only the cheap pointwise ops"),
    Wrong(L07, "accumulate_grads", "not-divided", accumulate_not_divided, "4 equal chunks",
          "mse_loss is a mean over its own chunk"),
    Wrong(L07, "accumulate_grads", "divided-by-micro", accumulate_divided_by_micro,
          "a batch that 4 does not divide (10 rows)", "dividing by the number of chunks"),
    Wrong(L07, "accumulate_grads", "stale-grads", accumulate_stale, "gradients left from an earlier step are not added",
          "clear them once, before the first chunk"),
    Wrong(L07, "accumulate_grads", "zero-in-loop", accumulate_zero_in_loop, "every chunk counts, not only the last",
          "clearing the gradients inside the loop"),
    Wrong(L07, "accumulate_grads", "one-backward", accumulate_one_backward, "one backward per chunk",
          "backward ran fewer times than there are chunks"),
    Wrong(L07, "accumulate_grads", "forwards-first", accumulate_forwards_first,
          "one chunk's activations alive at a time (4 chunks of 32 rows)", "forwards run ahead of their backwards"),
    Wrong(L07, "accumulate_grads", "retain-graph", accumulate_retain_graph,
          "one chunk's activations alive at a time (4 chunks of 32 rows)", "or a graph retained"),
    Wrong(L07, "plan_checkpointing", "everything", plan_everything, "the step fits as it is (4 blocks)",
          "checkpoint only what the peak requires"),
    Wrong(L07, "plan_checkpointing", "ignores-fixed", plan_ignores_fixed,
          "fixed_bytes count against the budget (4 blocks)", "the budget is for the step's whole peak"),
    Wrong(L07, "plan_checkpointing", "ignores-rebuild", plan_ignores_rebuild,
          "a large last block, cheap to recompute (4 blocks)", "rebuilds all its activations when backward reaches it"),
    Wrong(L07, "plan_checkpointing", "backward-from-first", plan_backward_from_first,
          "a large last block, cheap to recompute (4 blocks)", "backward reaches the last block first"),
    Wrong(L07, "plan_checkpointing", "biggest-first", plan_biggest_first,
          "a big block that costs more than a small one (5 blocks)", "checkpointing the biggest blocks first"),
    Wrong(L07, "plan_checkpointing", "best-ratio-first", plan_best_ratio_first,
          "the most bytes per FLOP frees too little (5 blocks)", "the most bytes per unit of recompute"),
    Wrong(L07, "plan_checkpointing", "strictly-below", plan_strictly_below,
          "a plan whose peak equals the budget (5 blocks)", "at most the budget, not below it"),
    Wrong(L07, "plan_checkpointing", "plan-when-none-fits", plan_when_none_fits,
          "no plan fits: ValueError with the lowest peak (3 blocks)", "a plan returned anyway hides that"),
    Wrong(L07, "plan_checkpointing", "vague-error", plan_vague_error,
          "no plan fits: ValueError with the lowest peak (3 blocks)", MATCH_HINT),
    Wrong(L07, "plan_checkpointing", "calls-modelled-peak", plan_calls_modelled_peak, "the step fits as it is (4 blocks)",
          FORBIDDEN_HINT),
]

SECOND_SOLUTIONS = [("predicted_bytes", predicted_bytes_second), ("keep_policy", keep_policy_second),
                    ("accumulate_grads", accumulate_grads_second), ("plan_checkpointing", plan_checkpointing_second)]

globals().update(lab_tests(L07, WRONG, SECOND_SOLUTIONS))
