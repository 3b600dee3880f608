"""Lab 02 (fusion): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab02 import STEP_OK
from helpers.grading.specs.core import Case, Exercise, LabSpec


def _combo_grid(numels, blocks):
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += (n + block - 1) // block
        ends.append(total)
    return total, ends


def _combo_grid_cases(gen):
    ceil = "ceil(n / block) is (n + block - 1) // block; ends are running sums"
    sizes = [int(v) for v in torch.randint(0, 5000, (4,), generator=gen)]
    blocks = [int(2 ** v) for v in torch.randint(4, 11, (4,), generator=gen)]
    return [
        Case("the example", ([1000, 1, 3075], [256, 64, 1024]), hint=ceil),
        Case("exact multiples", ([256, 512, 768], [256, 128, 256]),
             hint="a part of exactly k*block elements needs k programs"),
        Case("empty parts", ([0, 5, 0], [4, 4, 8]), hint="an empty part needs 0 programs, but still has an end"),
        Case("each part its own block", ([100, 100, 100], [64, 16, 128]),
             hint="each part has its own block: part i's programs come from numels[i] and blocks[i], not from "
                  "another part's block"),
        Case("random sizes and blocks", (sizes, blocks), hidden=True, hint=ceil),
        Case("every part empty", ([0, 0], [64, 16]), hidden=True, hint="no programs at all: (0, [0, 0])"),
        Case("block 1", ([3, 1, 2], [1, 1, 1]), hidden=True, hint="one program per element when block is 1"),
        Case("one part", ([70000], [1024]), hidden=True, hint=ceil),
    ]


def _combo_launch_cases(gen):
    hint = ("zeros or garbage in one part: that part's programs never ran, or ran with the wrong local id; each "
            "part's programs start where the previous part's end, counted in that part's own block (BLOCK0 for "
            "part 0, BLOCK1 for part 1), and its local id is its program id minus that start")
    once = ("the point of a combo kernel is ONE launch for all three parts: launch three_part_kernel once, on "
            "the grid combo_grid gives, with no other kernel and no eager PyTorch computing a part")

    def case(sizes, blocks, hidden, central=False):
        return Case(f"sizes {sizes}, blocks {blocks}", ([torch.randn(n, generator=gen) for n in sizes], blocks),
                    hint=hint, hidden=hidden, call="triton_launch", central=central)
    cases = [case(sizes, blocks, hidden, central=i == 0)     # the first: every part's own block and start
             for i, (sizes, blocks, hidden) in enumerate((([1000, 130, 3075], (256, 64, 1024), False),
                                                          ([256, 0, 300], (64, 32, 128), False),
                                                          ([5, 700, 1], (32, 256, 16), True),
                                                          ([0, 0, 513], (64, 64, 512), True),
                                                          ([257, 257, 0], (256, 16, 64), True)))]
    cases.insert(2, Case("one launch of three_part_kernel",
                         ([torch.randn(n, generator=gen) for n in (700, 3, 300)], (256, 64, 1024)),
                         call="kernel_launches", expected=1, expect_value=True, hint=once))
    cases.append(Case("one launch, other sizes", ([torch.randn(n, generator=gen) for n in (33, 1030, 5)],
                                                  (128, 32, 64)),
                      call="kernel_launches", expected=1, expect_value=True, hidden=True, hint=once))
    return cases


def _combo_reference(xs, blocks=None):
    from helpers.fusion import combo_reference
    return combo_reference(xs, alpha=0.5)


def _combo_plan(numels, block):
    blocks = [(n + block - 1) // block for n in numels]
    if sum(numels) / (max(numels) * len(numels)) > 0.8:
        return "round_robin", len(numels) * max(blocks), len(numels) * max(blocks) - sum(blocks)
    return "sequential", sum(blocks), 0


def _combo_plan_cases(gen):
    base = int(torch.randint(2000, 6000, (), generator=gen))
    close = [base, base - int(torch.randint(base // 10, base // 6, (), generator=gen)), base]
    small = [base, base, base, int(torch.randint(1, base // 5, (), generator=gen))]
    block = int(torch.tensor([128, 256, 512])[torch.randint(0, 3, (), generator=gen)])
    case = lambda name, args, hint, hidden=False: Case(name, args, call="combo_plan_errors",  # noqa: E731
                                                       expected="all three right",
                                                       expect_value=True, hidden=hidden, hint=hint)
    share = ("round-robin wins when the parts are close in size: the share of a round-robin launch that has work, "
             "computed as select_dispatch_strategy (lesson 02) computes it (the parts' total over the largest times "
             "their number), not the smallest part against the largest; below the bar the parts run one after "
             "another, with no idle program. Work it out yourself: helpers.fusion and Inductor's own functions "
             "would make the decision for you")
    strict = "the bar is strict: at exactly 0.8 Inductor does not pick round-robin"
    elements = ("Inductor measures the share in elements (each part's xnumel), not in blocks: a round-robin launch "
                "with no idle program can still fall below the bar")
    idle = ("count programs in blocks: a round-robin launch gives every part as many programs as the largest part "
            "has blocks, and a program past its part's last block has nothing to do; a sequential launch wastes none")
    return [
        case("parts of close sizes", ([4096, 4096, 4096, 3000], 1024), share),
        case("no idle block, yet below the bar", ([1024, 1024, 1024, 100], 1024), elements),
        case("one small part", ([4096, 4096, 4096, 512], 512), share),
        case("exactly at the bar", ([1280, 1280, 1280, 256], 256), strict),
        case("idle programs of a round-robin launch", ([2048, 2048, 2048, 1100, 1100], 1024), idle),
        case("close sizes, other numbers", (close, block), share, hidden=True),
        case("one small part, other numbers", (small, block), share, hidden=True),
        case("idle programs, other numbers", ([3000, 3072, 2500, 2900], 512), idle, hidden=True),
        case("one part", ([777], 256), idle, hidden=True),
    ]


def _kernel_counts() -> dict[str, int]:
    """helpers.fusion.kernel_counts, imported when lab 02 is graded (importing helpers.fusion loads torch's
    benchmark utilities, which log a CUDA_HOME warning under a CUDA build without a GPU)."""
    from helpers.fusion import kernel_counts
    return kernel_counts()


def _choose_step(costs, launches):
    """Lab 02's reference decision (exercise 5): the simplest step within 2% of the fastest in the cost model,
    and the side that sets its time."""
    from helpers.grading.harnesses.lab02 import STEPS, step_us
    times = {step: step_us(costs, launches, step) for step in STEPS}
    fastest = min(max(t) for t in times.values())
    step = next(s for s in STEPS if max(times[s]) <= 1.02 * fastest)
    host, device = times[step]
    return step, "host" if host >= device else "device"


def _launches(sizes, per_combo=8):
    """What the output code launches for these parameters' sizes: one kernel per parameter with combo kernels
    off; with them on, combo kernels of per_combo sub-kernels in order (8 in 2.10)."""
    return {"combo_off": [[n] for n in sizes],
            "combo_on": [list(sizes[i:i + per_combo]) for i in range(0, len(sizes), per_combo)]}


def _step_cases(gen):
    from helpers.grading.harnesses.lab02 import STEPS, step_us
    from helpers.fusion import H200_STEP_COSTS, launch_sizes, recorded_sgd_step
    recorded = {name: {step: launch_sizes(code) for step, code in w["code"].items()}
                for name, w in recorded_sgd_step()["workloads"].items()}
    M = 1 << 20

    def ramp(n, low, high):
        return [low + (high - low) * i // (n - 1) for i in range(n)]

    def case(name, launches, hint, hidden=False, **costs):
        return Case(name, ({**H200_STEP_COSTS, **costs}, launches), call="step_verdict", expected=STEP_OK,
                    expect_value=True, hidden=hidden, hint=hint)
    host = ("the host takes its time too: it runs each call, checks the compiled call's guards and launches every "
            "kernel while the GPU waits for work; with tiny tensors the host sets the step's time")
    device = ("the GPU takes its time too: _foreach_ makes 4 passes over every tensor, a kernel per _foreach_ "
              "call, where the compiled step makes one; with large tensors the GPU sets the step's time")
    cases = [
        case("the H200's step: 6 parameters of 256 to 441 elements (the lesson's quick run)", recorded["quick"],
             "within 2% of the fastest the model cannot tell two steps apart: take the simpler (_foreach_, then "
             "combo off, then combo on)"),
        case("the H200's step: 30 parameters of 1024 to 2097 elements", recorded["full"], host),
        case("12 parameters of 16K elements", _launches([16 * 1024] * 12),
             "a compiled call checks the guards of every tensor it takes, 3 per parameter (the parameter, its "
             "gradient and its momentum buffer), guard_us each"),
        case("30 parameters of 1M elements", _launches([M] * 30), device),
        case("8 parameters of 1M elements", _launches([M] * 8),
             "the bound is the side that takes longer in the step you chose: a compiled step can be host-bound, "
             "and _foreach_ device-bound"),
        case("12 parameters of 2M elements", _launches([2 * M] * 12),
             "a combo kernel is one launch from the host, however many sub-kernels it runs"),
        case("30 parameters of 4M elements", _launches([4 * M] * 30),
             "every kernel costs kernel_us on the GPU however little it does: combo kernels cut the number of "
             "kernels as well as the launches"),
        case("200 parameters of 64K elements", _launches([64 * 1024 + 37 * i for i in range(200)]),
             "each _foreach_ call costs foreach_tensor_us on the host for every parameter in its lists: with many "
             "parameters that adds up"),
        case("40 parameters of 560K elements", _launches([560 * 1024] * 40),
             "the host and the GPU work at the same time: a step takes the longer of the two, not their sum"),
        case("8 parameters of 8M to 10M elements, a GPU on which an idle program costs a busy one's time",
             _launches(ramp(8, 8 * M, 10 * M)),
             "a round-robin combo kernel launches as many programs for each part as the largest part has blocks: "
             "the smaller parts' extra programs are idle, and each costs idle_us", idle_us=0.0043),
        case("8 parameters of 8M to 10M elements", _launches(ramp(8, 8 * M, 10 * M)),
             "an idle program costs idle_us, not program_us: it finds no work and ends"),
        case("an embedding of 64M elements beside 7 parameters of 1M", _launches([64 * M] + [M] * 7),
             "below Inductor's bar a combo kernel dispatches sequentially, its parts one after another, with no "
             "idle program (exercise 3)"),
        case("30 parameters of 1024 to 2097 elements, combo kernels of 4 sub-kernels, guards at 0.2 us",
             _launches([1024 + 37 * i for i in range(30)], per_combo=4),
             "count the kernels the output code launches (launches['combo_on']): how many sub-kernels Inductor "
             "puts in a combo kernel depends on the torch and its options", guard_us=0.2),
    ]
    mixed = ("weigh every term of the model: the host's calls, guards and launches, the GPU's kernels and busy and "
             "idle programs, the longer side, and the simpler step within 2%; the verdict says how far off yours is")
    while len(cases) < 19:     # other costs, sizes and groupings, none on the edge of the 2% rule or of the bound
        n = int(torch.randint(4, 121, (), generator=gen))
        low = 10 ** float(torch.empty(()).uniform_(2.5, 7, generator=gen))
        sizes = [int(low * float(f)) for f in torch.empty(n).uniform_(1, 1.6, generator=gen)]
        costs = {k: v * 10 ** float(torch.empty(()).uniform_(-0.5, 0.5, generator=gen))
                 for k, v in H200_STEP_COSTS.items() if k != "block"}
        costs["block"] = int(torch.tensor([256, 512, 1024])[torch.randint(0, 3, (), generator=gen)])
        launches = _launches(sizes, per_combo=int(torch.tensor([4, 8, 8, 16])[torch.randint(0, 4, (), generator=gen)]))
        times = {s: step_us(costs, launches, s) for s in STEPS}
        fastest = min(max(t) for t in times.values())
        if all(abs(max(t) / fastest - 1.02) > 0.005 and abs(t[0] / t[1] - 1) > 0.005 for t in times.values()):
            cases.append(case(f"other costs {len(cases) - 12} ({n} parameters of {min(sizes)} to {max(sizes)} "
                              f"elements)", launches, mixed, hidden=True, **costs))
    return cases


SPEC = LabSpec("02_fusion_lab", (
    Exercise("Exercise 1: combo_grid", "combo_grid", _combo_grid_cases, _combo_grid,
             forbidden=("helpers.fusion.combo_grid", "helpers.grading.harnesses.lab02.combo_grid_reference"),
             refused="helpers.fusion.combo_grid sizes the grid for you: derive each part's programs from its "
                     "size and the block"),
    Exercise("Exercise 2: the combo kernel's dispatch", "launch_three_part", _combo_launch_cases, _combo_reference,
             needs=("triton_interpreter",),
             forbidden=("helpers.fusion.combo_reference", "helpers.fusion.combo_launch"),
             refused="the helpers' combo reference and launcher compute the answer for you: your kernel finds "
                     "its part from its own program id"),
    Exercise("Exercise 3: plan the combo launch", "plan_combo_launch", _combo_plan_cases, _combo_plan,
             forbidden=("helpers.fusion.inductor_combo_dispatch_strategy", "helpers.fusion.combo_dispatch_strategy",
                        "helpers.fusion.combo_utilization", "helpers.fusion.round_robin_grid",
                        "helpers.fusion.inductor_dispatch_code", "helpers.fusion.combo_launch_plan",
                        "torch._inductor.codegen.triton_combo_kernel.ComboKernel"),
             refused="these helpers and Inductor's ComboKernel make the decision for you: apply Inductor's rule "
                     "to the sizes yourself"),
    Exercise("Exercise 4: predicted kernel counts", "predicted_kernel_functions",
             lambda gen: [Case("the four functions", (), call="sealed_counts",
                               hint="the name in brackets is a function you predicted wrong (both counts shown "
                                    "sealed, so as not to give them away): lesson 02 counted the C++ functions of "
                                    "an independent pair, and its deep dive (the fusion we expect on the C++ "
                                    "backend) says what ends one cpp_fused_* function and starts the next; "
                                    "predict without running torch.compile")],
             _kernel_counts,
             forbidden=("helpers.fusion.inspect_compiled", "torch.compile",
                        "torch._inductor.utils.run_and_get_code"),
             refused="compiling and counting measures the answer instead of predicting it: predict from each "
                     "function's operations and what Inductor generates itself"),
    Exercise("Exercise 5: combo kernels on, off, or _foreach_", "choose_step", _step_cases, _choose_step,
             forbidden=("helpers.grading.harnesses.lab02.step_us",),
             refused="the grader's cost model answers for you: work out each step's host and GPU time from the "
                     "rules and the launches yourself",
             substitutes=(("plan_combo_launch", "helpers.fusion.combo_launch_plan"),)),
), allow_processes=True)
