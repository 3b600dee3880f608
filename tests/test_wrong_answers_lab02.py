"""Lab 02 (fusion): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.grading.specs import lab02 as spec02
from wrong_answers import L02, Wrong, lab_tests, prepared, run_cases, run_in_child, triton_solution_source


def combo_grid_floor(numels, block):
    # n // block: drops a part's last, partial block
    ends, total = [], 0
    for n in numels:
        total += n // block
        ends.append(total)
    return total, ends


def combo_grid_plus_one(numels, block):
    # n // block + 1: one program too many for an exact multiple (and for an empty part)
    ends, total = [], 0
    for n in numels:
        total += n // block + 1
        ends.append(total)
    return total, ends


def combo_grid_counts(numels, block):
    # ends are each part's own count, not running sums
    counts = [(n + block - 1) // block for n in numels]
    return sum(counts), counts


def combo_grid_skips_empty(numels, block):
    # an empty part gets no end
    ends, total = [], 0
    for n in numels:
        if n:
            total += (n + block - 1) // block
            ends.append(total)
    return total, ends


def combo_grid_at_least_one(numels, block):
    # every part gets a program, even an empty one
    ends, total = [], 0
    for n in numels:
        total += max(1, (n + block - 1) // block)
        ends.append(total)
    return total, ends


def _cdiv(n, block):
    return (n + block - 1) // block


def _apply_part(x, y, n, local_pid, alpha, part, block):
    """helpers.fusion_kernels.apply_part in eager PyTorch: one block of one part."""
    offsets = torch.arange(local_pid * block, (local_pid + 1) * block)
    offsets = offsets[(offsets >= 0) & (offsets < n)]
    v = x[offsets].float()
    y[offsets] = (v * alpha if part == 0 else v.clamp_min(0) if part == 1 else v * torch.sigmoid(v)).to(y.dtype)


def _launcher(kernel):
    """The lab's launch_three_part around `kernel(pid, xs, ys, ns, alpha, block)`, a Python stand-in for the
    Triton kernel run once per program id."""
    def launch_three_part(xs, alpha=0.5, block=256):
        flat = [x.contiguous().reshape(-1) for x in xs]
        outs = [torch.zeros_like(x) for x in flat]
        total, _ = spec02._combo_grid([x.numel() for x in flat], block)
        for pid in range(total):
            kernel(pid, flat, outs, [x.numel() for x in flat], alpha, block)
        return [o.view(x.shape) for o, x in zip(outs, xs)]
    return launch_three_part


def _kernel_global_pid(pid, xs, ys, ns, alpha, block):
    # passes the global program id to every part: parts 1 and 2 start mid-tensor
    end0 = _cdiv(ns[0], block)
    end1 = end0 + _cdiv(ns[1], block)
    part = 0 if pid < end0 else 1 if pid < end1 else 2
    _apply_part(xs[part], ys[part], ns[part], pid, alpha, part, block)


def _kernel_part2_from_end0(pid, xs, ys, ns, alpha, block):
    # part 2's local id subtracts end0, not end1
    end0 = _cdiv(ns[0], block)
    end1 = end0 + _cdiv(ns[1], block)
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, block)
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, block)
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end0, alpha, 2, block)


def _kernel_end1_not_cumulative(pid, xs, ys, ns, alpha, block):
    # end1 = cdiv(n1, BLOCK): part 1's count, not where its programs end
    end0 = _cdiv(ns[0], block)
    end1 = _cdiv(ns[1], block)
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, block)
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, block)
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end1, alpha, 2, block)


def _kernel_floor_ends(pid, xs, ys, ns, alpha, block):
    # part boundaries with n // BLOCK: a partial last block goes to the next part
    end0 = ns[0] // block
    end1 = end0 + ns[1] // block
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, block)
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, block)
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end1, alpha, 2, block)


launch_global_pid = _launcher(_kernel_global_pid)


launch_part2_from_end0 = _launcher(_kernel_part2_from_end0)


launch_end1_not_cumulative = _launcher(_kernel_end1_not_cumulative)


launch_floor_ends = _launcher(_kernel_floor_ends)


def predicted_gpu_habits():
    # one kernel per loop, as on a GPU: independent loops and a reduction counted separately
    return {"chain": 1, "independent": 2, "center": 2, "matmul_between": 2}


def predicted_matmul_fuses():
    # thinks the matmul fuses with the elementwise ops around it
    return {"chain": 1, "independent": 1, "center": 1, "matmul_between": 1}


def predicted_by_measuring():
    # the forbidden one-liner: measures instead of predicting
    from helpers import fusion
    from helpers.fusion import kernel_count_cases
    return {name: len(fusion.inspect_compiled(fn, *args).kernel_functions)
            for name, (fn, args) in kernel_count_cases().items()}


def predicted_one_per_op():
    # one function per operation written, as in eager
    return {"chain": 4, "independent": 2, "center": 2, "matmul_between": 3}


class _PyKernel:
    """A Python stand-in for a Triton kernel launched as kernel[grid](...): the body runs once per program id."""

    def __init__(self, body):
        self.body = body

    def __getitem__(self, grid):
        def launch(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK):
            for pid in range(grid[0]):
                self.body(pid, [x0, x1, x2], [y0, y1, y2], [n0, n1, n2], alpha, BLOCK)
        return launch


def _kernel_sequential(pid, xs, ys, ns, alpha, block):
    end0 = _cdiv(ns[0], block)
    end1 = end0 + _cdiv(ns[1], block)
    part, start = (0, 0) if pid < end0 else (1, end0) if pid < end1 else (2, end1)
    _apply_part(xs[part], ys[part], ns[part], pid - start, alpha, part, block)


def _with_kernel(body, source: str):
    """launch_three_part defined by `source` in a namespace whose three_part_kernel is `body` as a kernel."""
    namespace = {"torch": torch, "F": F, "spec02": spec02, "three_part_kernel": _PyKernel(body)}
    exec(source, namespace)
    return namespace["launch_three_part"]


LAUNCH_ONCE = """
def launch_three_part(xs, alpha=0.5, block=256):
    flat = [x.contiguous().reshape(-1) for x in xs]
    outs = [torch.empty_like(x) for x in flat]
    total, _ = spec02._combo_grid([x.numel() for x in flat], block)
    if total:
        three_part_kernel[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1], flat[1].numel(),
                                    flat[2], outs[2], flat[2].numel(), alpha, BLOCK=block)
    return [o.view(x.shape) for o, x in zip(outs, xs)]
"""


LAUNCH_THRICE = """
def launch_three_part(xs, alpha=0.5, block=256):
    # one launch per part, the other two parts empty: three launches, each kernel run for one part
    flat = [x.contiguous().reshape(-1) for x in xs]
    outs = [torch.empty_like(x) for x in flat]
    for part in range(3):
        args = []
        for i in range(3):
            args += [flat[i], outs[i], flat[i].numel() if i == part else 0]
        blocks = (flat[part].numel() + block - 1) // block     # the other parts own no program
        if blocks:
            three_part_kernel[(blocks,)](*args, alpha, BLOCK=block)
    return [o.view(x.shape) for o, x in zip(outs, xs)]
"""


launch_once_stand_in = _with_kernel(_kernel_sequential, LAUNCH_ONCE)     # a right answer: the harness's sanity


launch_three_launches = _with_kernel(_kernel_sequential, LAUNCH_THRICE)


def launch_eager(xs, alpha=0.5, block=256):
    # no kernel at all: the three parts in eager PyTorch
    return [xs[0] * alpha, torch.relu(xs[1]), F.silu(xs[2])]


def launch_separate_kernels(xs, alpha=0.5, block=256):
    # three launches of single-part kernels (fusion.separate_launches): right values, no combo kernel
    from helpers import fusion
    return fusion.separate_launches(xs, alpha=alpha, block=block)


def plan_always_sequential(numels, block):
    # do nothing clever: the sequential grid of exercise 1 whatever the sizes
    total, _ = spec02._combo_grid(numels, block)
    return "sequential", total, 0


def plan_min_over_max(numels, block):
    # "sizes close" read as the smallest part against the largest
    blocks = [_cdiv(n, block) for n in numels]
    if min(numels) / max(numels) > 0.8:
        return "round_robin", len(numels) * max(blocks), len(numels) * max(blocks) - sum(blocks)
    return "sequential", sum(blocks), 0


def plan_at_least(numels, block):
    # >= 0.8: round-robin at exactly the bar
    blocks = [_cdiv(n, block) for n in numels]
    if sum(numels) / (max(numels) * len(numels)) >= 0.8:
        return "round_robin", len(numels) * max(blocks), len(numels) * max(blocks) - sum(blocks)
    return "sequential", sum(blocks), 0


def plan_in_blocks(numels, block):
    # the share counted in blocks, not in elements
    blocks = [_cdiv(n, block) for n in numels]
    if sum(blocks) / (max(blocks) * len(blocks)) > 0.8:
        return "round_robin", len(numels) * max(blocks), len(numels) * max(blocks) - sum(blocks)
    return "sequential", sum(blocks), 0


def plan_idle_in_elements(numels, block):
    # idle programs from the idle elements, divided by the block: partial blocks are not idle programs
    blocks = [_cdiv(n, block) for n in numels]
    if sum(numels) / (max(numels) * len(numels)) > 0.8:
        return "round_robin", len(numels) * max(blocks), (len(numels) * max(numels) - sum(numels)) // block
    return "sequential", sum(blocks), 0


def plan_calls_inductor(numels, block):
    # the forbidden one-liner: asks the installed Inductor
    from helpers import fusion
    scheme = fusion.inductor_combo_dispatch_strategy(numels)
    if scheme == "round_robin":
        return (scheme, *fusion.round_robin_grid(numels, block))
    return scheme, spec02._combo_grid(numels, block)[0], 0


def plan_second_solution(numels, block):
    # a right answer written otherwise: integer arithmetic, no float division, programs counted one by one
    blocks = [math.ceil(n / block) for n in numels]
    rr = 5 * sum(numels) > 4 * len(numels) * max(numels)
    busy = sum(blocks)
    programs = len(blocks) * max(blocks) if rr else busy
    return ("round_robin" if rr else "sequential"), programs, programs - busy


def predicted_second_solution():
    # a right answer written otherwise: counted from the rule, one function at a time
    counts = {}
    for name, extern_calls in (("chain", 0), ("independent", 0), ("center", 0), ("matmul_between", 1)):
        counts[name] = extern_calls + 1
    return counts


SECOND_KERNEL = """@triton.jit
def three_part_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK: tl.constexpr):
    # the starts in integer arithmetic, the parts tested from the last one down
    pid = tl.program_id(axis=0)
    start1 = (n0 + BLOCK - 1) // BLOCK
    start2 = start1 + (n1 + BLOCK - 1) // BLOCK
    if pid >= start2:
        apply_part(x2, y2, n2, pid - start2, alpha, 2, BLOCK)
    elif pid >= start1:
        apply_part(x1, y1, n1, pid - start1, alpha, 1, BLOCK)
    else:
        apply_part(x0, y0, n0, pid, alpha, 0, BLOCK)

"""


@pytest.mark.slow
def test_slow_second_solutions_get_full_marks(tmp_path):
    """Lab 02's kernel written otherwise (Triton's interpreter, in a child) and its prediction written
    otherwise (compiles) get full marks."""
    assert run_cases("02_fusion_lab", predicted_second_solution, "predicted_kernel_functions") == []
    pytest.importorskip("triton")
    solution = triton_solution_source()
    head = solution[:solution.index("@triton.jit")]
    kernel = head + SECOND_KERNEL + solution[solution.index("def launch_three_part"):]
    got = run_in_child("02_fusion_lab", "launch_three_part", {"second": kernel}, tmp_path,
                       env={"TRITON_INTERPRET": "1"})
    assert got["second"] == []



def test_plan_harness_follows_the_installed_inductor():
    """combo_plan_errors judges with helpers.fusion's re-implemented rule (no Inductor import in the
    learner's process): on every case of exercise 3 it is the installed Inductor's choice."""
    from helpers import fusion
    _, cases, _ = prepared("02_fusion_lab", "plan_combo_launch")
    for case in cases:
        numels = case.args[0]
        assert fusion.combo_dispatch_strategy(numels) == fusion.inductor_combo_dispatch_strategy(numels), case.name


def triton_solution_in_child(function, request, tmp_path):
    """launch_three_part is a Triton kernel: its interpreter runs it, in a fresh process."""
    if function != "launch_three_part":
        return None
    pytest.importorskip("triton")
    got = run_in_child(L02, function, {"solution": triton_solution_source()}, tmp_path, env={"TRITON_INTERPRET": "1"})
    return got["solution"]


WRONG = [
    Wrong(L02, "combo_grid", "floor", combo_grid_floor, "the example", "(n + block - 1) // block"),
    Wrong(L02, "combo_grid", "plus-one", combo_grid_plus_one, "exact multiples", "exactly k*block elements"),
    Wrong(L02, "combo_grid", "counts-not-ends", combo_grid_counts, "the example", "ends are running sums"),
    Wrong(L02, "combo_grid", "skips-empty", combo_grid_skips_empty, "empty parts", "still has an end"),
    Wrong(L02, "combo_grid", "at-least-one", combo_grid_at_least_one, "empty parts", "an empty part needs 0 programs"),
    Wrong(L02, "launch_three_part", "global-pid", launch_global_pid, "sizes [1000, 1, 3075]",
          "subtract the start of the part"),
    Wrong(L02, "launch_three_part", "part2-from-end0", launch_part2_from_end0, "sizes [1000, 1, 3075]",
          "end1 for part 2"),
    Wrong(L02, "launch_three_part", "end1-not-cumulative", launch_end1_not_cumulative, "sizes [1000, 1, 3075]",
          "that part's programs never ran"),
    Wrong(L02, "launch_three_part", "floor-ends", launch_floor_ends, "sizes [1000, 1, 3075]", "wrong local id"),
    Wrong(L02, "launch_three_part", "eager", launch_eager, "one launch of three_part_kernel",
          "ONE launch for all three parts"),
    Wrong(L02, "launch_three_part", "three-launches", launch_three_launches, "one launch of three_part_kernel",
          "launch three_part_kernel once"),
    Wrong(L02, "launch_three_part", "separate-kernels", launch_separate_kernels, "one launch of three_part_kernel",
          "no other kernel"),
    Wrong(L02, "plan_combo_launch", "always-sequential", plan_always_sequential, "parts of close sizes",
          "round-robin wins when the parts are close in size"),
    Wrong(L02, "plan_combo_launch", "min-over-max", plan_min_over_max, "parts of close sizes",
          "not the smallest part against the largest"),
    Wrong(L02, "plan_combo_launch", "at-least", plan_at_least, "exactly at the bar", "the bar is strict"),
    Wrong(L02, "plan_combo_launch", "in-blocks", plan_in_blocks, "no idle block, yet below the bar",
          "in elements (each part's xnumel), not in blocks"),
    Wrong(L02, "plan_combo_launch", "idle-in-elements", plan_idle_in_elements, "idle programs of a round-robin launch",
          "count programs in blocks"),
    Wrong(L02, "plan_combo_launch", "calls-inductor", plan_calls_inductor, "parts of close sizes",
          "helpers.fusion"),
    Wrong(L02, "predicted_kernel_functions", "gpu-habits", predicted_gpu_habits, "the four functions",
          "puts consecutive loops into one function", slow=True),
    Wrong(L02, "predicted_kernel_functions", "matmul-fuses", predicted_matmul_fuses, "the four functions",
          "only a call it does not generate itself splits them", slow=True),
    Wrong(L02, "predicted_kernel_functions", "one-per-op", predicted_one_per_op, "the four functions",
          "the name in brackets is a function you predicted wrong", slow=True),
    Wrong(L02, "predicted_kernel_functions", "measures", predicted_by_measuring, "the four functions",
          "torch.compile", slow=True),
]

SECOND_SOLUTIONS = [("plan_combo_launch", plan_second_solution), ("launch_three_part", launch_once_stand_in)]

globals().update(lab_tests(L02, WRONG, SECOND_SOLUTIONS, visible=True, solution=triton_solution_in_child,
                           reference_exempt={"launch_three_part": {"one launch of three_part_kernel", "one launch, other sizes"}},
                           slow_solutions=("predicted_kernel_functions", "launch_three_part")))
