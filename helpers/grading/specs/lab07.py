"""Lab 07 (memory): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.specs.core import Case, Exercise, LabSpec


def _predicted_bytes(model):
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    size = lambda ps: sum(p.numel() * p.element_size() for p in ps)   # noqa: E731
    return {"parameter": size(params), "gradient": size(trainable),
            "optimizer_state": 2 * size(trainable) + 4 * len(trainable)}


def _predicted_cases(gen):
    frozen = ("a frozen parameter is stored but gets no gradient and no optimizer state: count gradients and "
              "Adam's state over the parameters with requires_grad only")
    dtype = ("a parameter's bytes depend on its dtype: a bfloat16 element takes 2 bytes, not 4; a gradient and "
             "Adam's moments take the dtype of their parameter (only the step counter is float32)")
    adam = ("Adam keeps more per trainable parameter than one tensor: reread what the exercise lists (and the "
            "lesson's reveal), the per-tensor counter included")
    width, depth = (int(v) for v in torch.randint(24, 64, (2,), generator=gen))
    depth = 2 + depth % 3
    return [
        Case("float32, every layer trainable", (32, 3, 0, "float32"), call="predict_for",
             hint=adam),
        Case("the first 2 layers frozen", (32, 3, 2, "float32"), call="predict_for", hint=frozen),
        Case("bfloat16 parameters", (48, 2, 1, "bfloat16"), call="predict_for", hint=dtype),
        Case("bfloat16, another model", (width, depth, 1, "bfloat16"), call="predict_for", hidden=True, hint=dtype),
        Case("everything frozen but the head", (16, 4, 4, "float32"), call="predict_for", hidden=True, hint=frozen),
    ]


def _keep_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    # keep a matmul's output only where it is wider than the matmul's input: up's and gate's, which
    # backward reads (gelu's and mul's backward); down's output is read by no backward formula
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and args[-1].shape[-1] > args[-2].shape[-1]:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _keep_policy_cases(gen):
    recomputes = ("backward recomputed a matmul: an output that backward reads and that you let be recomputed is "
                  "rebuilt from its inputs, and if a matmul made it, that is a matmul redone. Keep the matmul "
                  "outputs that backward needs; let only the cheap pointwise ops be recomputed")
    too_much = ("your policy keeps as many bytes as saving every matmul output, or more: at least one output it "
                "keeps is read by no backward formula. Recomputation stops once it has rebuilt the last tensor "
                "backward needs, so keeping such an output saves no work and costs its bytes in every block. Go "
                "through the block op by op and ask which saved tensor each op's backward reads")
    sizes = [(48, 2, 96), (64, 4, 200)]
    cases = [
        Case("no matmul recomputed in backward (width 32, 3 blocks, batch 128)", (32, 3, 128),
             call="matmul_flops_recomputed", expected=0, expect_value=True,
             hint=recomputes),
        Case("fewer bytes kept than save_matmuls (width 32, 3 blocks, batch 128)", (32, 3, 128),
             call="keeps_fewer_bytes_than_save_matmuls", expected=True, expect_value=True, hint=too_much),
    ]
    for width, depth, batch in sizes:
        cases += [
            Case(f"no matmul recomputed (width {width}, {depth} blocks, batch {batch})", (width, depth, batch),
                 call="matmul_flops_recomputed", expected=0, expect_value=True, hidden=True, hint=recomputes),
            Case(f"fewer bytes kept than save_matmuls (width {width}, {depth} blocks, batch {batch})",
                 (width, depth, batch), call="keeps_fewer_bytes_than_save_matmuls", expected=True,
                 expect_value=True, hidden=True, hint=too_much),
        ]
    return cases


def _accumulate(model, x, y, micro):
    from torch import nn
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (nn.functional.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


def _accumulate_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    weights = ("mse_loss is a mean over its own chunk: the sum of the chunks' losses is not the batch's mean "
               "loss until each chunk counts in proportion to the rows it holds")
    unequal = ("with unequal chunks, dividing by the number of chunks gives a small chunk the weight of a large "
               "one: weight each chunk by its share of the batch's rows instead")
    stale = ("the parameters held gradients from an earlier step, and yours were added to them: clear them once, "
             "before the first chunk")
    last = ("only the last chunk's gradients are left: clearing the gradients inside the loop throws away what "
            "the earlier chunks accumulated; clear them once, before the loop")
    once = ("backward ran fewer times than there are chunks: summing the chunks' losses and calling backward "
            "once keeps every chunk's activations alive until the end, the memory accumulation is meant to save. "
            "Call backward on each chunk's loss inside the loop")
    ahead = ("a forward keeps the activations its backward needs until that backward runs: forwards run ahead of "
             "their backwards (the losses kept for later, or a graph retained) hold several chunks' activations at "
             "once, the memory accumulation is meant to save")
    return [
        Case("4 equal chunks", (16, 2, 32, 4, seed), call="accumulated_grads", atol=1e-5, hint=weights),
        Case("a batch that 4 does not divide (10 rows)", (16, 2, 10, 4, seed), call="accumulated_grads", atol=1e-5,
             hint=unequal),
        Case("gradients left from an earlier step are not added", (8, 2, 12, 3, seed), {"stale_grads": True},
             call="accumulated_grads", atol=1e-5, hint=stale),
        Case("every chunk counts, not only the last", (16, 2, 32, 4, seed), call="only_last_chunk_counts",
             expected=False, expect_value=True, hint=last),
        Case("one backward per chunk", (16, 2, 10, 4, seed), call="accumulations_per_parameter", expected=4,
             expect_value=True, hint=once),
        Case("one chunk's activations alive at a time (4 chunks of 32 rows)", (16, 2, 32, 4, seed),
             call="activations_of_one_chunk", hint=ahead),
        Case("one chunk", (8, 3, 9, 1, seed), call="accumulated_grads", atol=1e-5, hidden=True, hint=weights),
        Case("7 rows in 3 chunks", (12, 2, 7, 3, seed), call="accumulated_grads", atol=1e-5, hidden=True, hint=unequal),
        Case("stale gradients, 7 rows in 3 chunks", (12, 2, 7, 3, seed + 1), {"stale_grads": True},
             call="accumulated_grads", atol=1e-5, hidden=True, hint=stale),
        Case("one backward per chunk, 3 chunks", (12, 2, 7, 3, seed), call="accumulations_per_parameter", expected=3,
             expect_value=True, hidden=True, hint=once),
        Case("one chunk's activations alive at a time, 7 rows in 3 chunks", (12, 2, 7, 3, seed),
             call="activations_of_one_chunk", hidden=True, hint=ahead),
    ]


SPEC = LabSpec("07_memory_lab", (
    Exercise("Exercise 1: predicted_bytes", "predicted_bytes", _predicted_cases, _predicted_bytes,
             forbidden=("helpers.memory.profile_steps", "helpers.memory.timeline"),
             refused="profiling measures the bytes instead of predicting them: count them from the parameters, "
                     "which ones train, and what Adam keeps"),
    Exercise("Exercise 2: keep_policy", "keep_policy", _keep_policy_cases, _keep_policy,
             forbidden=("helpers.memory.save_matmuls", "helpers.memory.gated_stack",
                        "helpers.memory.checkpoint_comparison"),
             refused="these helpers hold a ready policy: decide for each op yourself whether to keep its output "
                     "or recompute it"),
    Exercise("Exercise 3: accumulate_grads", "accumulate_grads", _accumulate_cases, _accumulate),
))
