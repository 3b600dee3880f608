"""Lab 07 (memory): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations


import torch

from helpers.grading.harnesses.lab07 import PLAN_OK, modelled_peak
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


def _plan_checkpointing(saved_bytes, recompute_cost, fixed_bytes, budget):
    """Every plan tried, in the order of the bits of 0 .. 2**n - 1, each priced with the harness's peak rule
    (the one the exercise states): the cheapest that fits, the first of equal ones."""
    n = len(saved_bytes)
    plans = [[i for i in range(n) if bits >> i & 1] for bits in range(2 ** n)]
    peaks = [modelled_peak(saved_bytes, fixed_bytes, plan) for plan in plans]
    fitting = [(sum(float(recompute_cost[i]) for i in plan), index) for index, (plan, peak)
               in enumerate(zip(plans, peaks)) if peak <= budget]
    if not fitting:
        raise ValueError(f"no plan fits a budget of {budget} bytes: the lowest peak a plan reaches is "
                         f"{min(peaks)} bytes; raise the budget or lower the batch size")
    return plans[min(fitting)[1]]


MIB, GFLOP = 2 ** 20, 1e9


def _plan_cases(gen):
    nothing = ("each checkpointed block costs one more forward through it whether the budget needed it or not: "
               "checkpoint only what the peak requires, and when the step fits as it is, nothing")
    fixed = ("the budget is for the step's whole peak: the parameters, gradients, Adam's state and the blocks' "
             "inputs (fixed_bytes) are held all along, and the activations must fit in what they leave")
    rebuild = ("a checkpointed block rebuilds all its activations when backward reaches it, while the blocks before "
               "it that are not checkpointed still hold theirs, and backward reaches the last block first: "
               "checkpointing a late block lowers the peak by less than its saved_bytes (the last block's, by "
               "nothing). Work out a plan's peak moment by moment through backward")
    biggest = ("checkpointing the biggest blocks first fits the budget, but not at the least cost: a big block can "
               "cost more to recompute than smaller ones that free enough together. The cheapest plan is a set of "
               "blocks, and taking one block at a time in a fixed order can miss it")
    ratio = ("taking first the blocks that free the most bytes per unit of recompute still misses the cheapest "
             "plan: the blocks taken early may free too little, and the block that then closes the gap costs more "
             "than one that would have fitted alone. Compare the total cost of plans that fit, not blocks one by one")
    equal = "a plan whose peak equals the budget fits it: the peak must be at most the budget, not below it"
    general = ("not the cheapest plan that fits: work out each plan's peak through backward (fixed_bytes counted, "
               "every rebuild where backward reaches it) and compare the total cost of the plans that fit; no fixed "
               "order of the blocks finds the cheapest set in general")
    none_fits = ("no plan fits this budget, and a plan returned anyway hides that from the caller: raise ValueError, "
                 "saying the lowest peak a plan can reach (in bytes) and what to do about it")

    def case(name, saved, cost, fixed_bytes, budget, hint, hidden=False):
        plan = _plan_checkpointing(saved, cost, fixed_bytes, budget)
        cheapest = sum(cost[i] for i in plan)
        return Case(name, (saved, cost, fixed_bytes, budget, cheapest), call="checkpoint_plan_verdict",
                    expected=PLAN_OK, expect_value=True, hidden=hidden, hint=hint)

    def visible(name, saved_mib, gflops, fixed_mib, budget_mib, hint):
        return case(name, [s * MIB for s in saved_mib], [g * GFLOP for g in gflops], fixed_mib * MIB,
                    budget_mib * MIB, hint)

    def blocks(n):
        """n blocks of 1 to 32 MiB each, with 0.25 to 1 GFLOP per MiB, and 64 to 512 MiB of fixed memory."""
        saved = [int(v) * 2 ** 18 for v in torch.randint(4, 129, (n,), generator=gen)]
        per_mib = torch.empty(n, dtype=torch.float64).uniform_(0.25, 1.0, generator=gen)
        cost = [round(s / MIB * float(r) * GFLOP, -6) for s, r in zip(saved, per_mib)]
        return saved, cost, int(torch.randint(64, 513, (), generator=gen)) * MIB

    def between(n, name, hint):
        saved, cost, fixed_bytes = blocks(n)
        lowest, none = fixed_bytes + max(saved), fixed_bytes + sum(saved)
        budget = lowest + int(float(torch.rand((), generator=gen)) * (none - lowest))
        return case(name, saved, cost, fixed_bytes, budget, hint, hidden=True)

    def at_a_plan(n, name, hint):
        saved, cost, fixed_bytes = blocks(n)
        plan = [i for i in range(n) if bool(torch.rand((), generator=gen) < 0.5)]
        return case(name, saved, cost, fixed_bytes, modelled_peak(saved, fixed_bytes, plan), hint, hidden=True)

    cases = [
        visible("the step fits as it is (4 blocks)", [3, 5, 2, 4], [3, 5, 2, 4], 10, 25, nothing),
        visible("fixed_bytes count against the budget (4 blocks)", [2, 5, 9, 3], [5, 2, 2, 6], 20, 37, fixed),
        visible("a large last block, cheap to recompute (4 blocks)", [2, 8, 7, 5], [4, 1, 4, 3], 8, 19, rebuild),
        visible("a big block that costs more than a small one (5 blocks)", [2, 4, 6, 3, 6], [7, 1, 2, 3, 4], 6, 25,
                biggest),
        visible("the most bytes per FLOP frees too little (5 blocks)", [8, 6, 4, 8, 6], [2, 1, 1, 8, 5], 5, 29,
                ratio),
        visible("a plan whose peak equals the budget (5 blocks)", [6, 7, 1, 3, 1], [7, 2, 2, 3, 7], 14, 27, equal),
        Case("no plan fits: ValueError with the lowest peak (3 blocks)",
             ([3 * MIB, 9 * MIB, 4 * MIB], [GFLOP] * 3, 10 * MIB, 18 * MIB), raises="ValueError",
             match=str(19 * MIB), hint=none_fits),
        between(8, "8 blocks, a budget between the lowest peak and none", general),
        between(10, "10 blocks, a budget between the lowest peak and none", general),
        between(12, "12 blocks, a budget between the lowest peak and none", general),
        at_a_plan(10, "10 blocks, a budget equal to one plan's peak", equal),
        at_a_plan(11, "11 blocks, a budget equal to another plan's peak", equal),
    ]
    saved, cost, fixed_bytes = blocks(9)
    cases += [
        case("9 blocks, a budget equal to the lowest peak", saved, cost, fixed_bytes, fixed_bytes + max(saved),
             equal, hidden=True),
        case("9 blocks, a budget equal to the peak without checkpointing", saved, cost, fixed_bytes,
             fixed_bytes + sum(saved), f"{equal}; and when the step fits as it is, checkpoint nothing", hidden=True),
        Case("one block, over the budget: checkpointing it lowers no peak",
             (saved[:1], cost[:1], fixed_bytes, fixed_bytes + saved[0] - 1), hidden=True, raises="ValueError",
             match=str(fixed_bytes + saved[0]), hint=f"{rebuild}. {none_fits}"),
    ]
    saved, cost, fixed_bytes = blocks(11)
    lowest = fixed_bytes + max(saved)
    cases.append(Case("11 blocks, no plan fits", (saved, cost, fixed_bytes, lowest - 1), hidden=True,
                      raises="ValueError", match=str(lowest), hint=none_fits))
    return cases


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
    Exercise("Exercise 4: plan_checkpointing", "plan_checkpointing", _plan_cases, _plan_checkpointing,
             forbidden=("helpers.grading.harnesses.lab07.modelled_peak",),
             refused="modelled_peak is the notebook's model of the peak, used after the check: work out a plan's "
                     "peak yourself, from when backward holds and rebuilds each block's activations"),
))
