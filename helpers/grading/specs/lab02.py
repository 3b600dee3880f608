"""Lab 02 (fusion): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.specs.core import Case, Exercise, LabSpec


def _combo_grid(numels, block):
    ends, total = [], 0
    for n in numels:
        total += (n + block - 1) // block
        ends.append(total)
    return total, ends


def _combo_grid_cases(gen):
    ceil = "ceil(n / block) is (n + block - 1) // block; ends are running sums"
    sizes = [int(v) for v in torch.randint(0, 5000, (4,), generator=gen)]
    return [
        Case("the example", ([1000, 1, 3075], 256), hint=ceil),
        Case("exact multiples", ([256, 512, 768], 256), hint="a part of exactly k*block elements needs k programs"),
        Case("empty parts", ([0, 5, 0], 4), hint="an empty part needs 0 programs, but still has an end"),
        Case("random sizes", (sizes, 128), hidden=True, hint=ceil),
        Case("every part empty", ([0, 0], 64), hidden=True, hint="no programs at all: (0, [0, 0])"),
        Case("block 1", ([3, 1, 2], 1), hidden=True, hint="one program per element when block is 1"),
        Case("one part", ([70000], 1024), hidden=True, hint=ceil),
    ]


def _combo_launch_cases(gen):
    hint = ("zeros or garbage in one part: that part's programs never ran, or ran with the wrong local id; "
            "subtract the start of the part (end0 for part 1, end1 for part 2)")
    once = ("the point of a combo kernel is ONE launch for all three parts: launch three_part_kernel once, on "
            "the grid combo_grid gives, with no other kernel and no eager PyTorch computing a part")
    cases = [Case(f"sizes {sizes}", ([torch.randn(n, generator=gen) for n in sizes],), hint=hint, hidden=hidden,
                  call="triton_launch")
             for sizes, hidden in (([1000, 1, 3075], False), ([256, 0, 300], False), ([5, 700, 1], True),
                                   ([0, 0, 513], True), ([257, 257, 0], True))]
    cases.insert(2, Case("one launch of three_part_kernel", ([torch.randn(n, generator=gen) for n in (700, 3, 300)],),
                         call="kernel_launches", expected=1, expect_value=True, hint=once))
    cases.append(Case("one launch, other sizes", ([torch.randn(n, generator=gen) for n in (33, 1030, 5)],),
                      call="kernel_launches", expected=1, expect_value=True, hidden=True, hint=once))
    return cases


def _combo_reference(xs):
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


SPEC = LabSpec("02_fusion_lab", (
    Exercise("Exercise 1: combo_grid", "combo_grid", _combo_grid_cases, _combo_grid,
             forbidden=("helpers.fusion.combo_grid",),
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
                        "helpers.fusion.inductor_dispatch_code",
                        "torch._inductor.codegen.triton_combo_kernel.ComboKernel"),
             refused="these helpers and Inductor's ComboKernel make the decision for you: apply Inductor's rule "
                     "to the sizes yourself"),
    Exercise("Exercise 4: predicted kernel counts", "predicted_kernel_functions",
             lambda gen: [Case("the four functions", (), call="sealed_counts",
                               hint="the name in brackets is a function you predicted wrong (both counts shown "
                                    "sealed, so as not to give them away): on the CPU, Inductor's "
                                    "C++ backend puts consecutive loops into one function, and only a call it "
                                    "does not generate itself splits them; reread each function for one, and predict "
                                    "without running torch.compile")],
             _kernel_counts,
             forbidden=("helpers.fusion.inspect_compiled", "torch.compile",
                        "torch._inductor.utils.run_and_get_code"),
             refused="compiling and counting measures the answer instead of predicting it: predict from each "
                     "function's operations and what Inductor generates itself"),
), allow_processes=True)
