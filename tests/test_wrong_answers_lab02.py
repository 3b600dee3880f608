"""Lab 02 (fusion): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.grading.specs import lab02 as spec02
from wrong_answers import L02, Wrong, lab_tests, prepared, run_cases, run_in_child, triton_solution_source


def combo_grid_floor(numels, blocks):
    # n // block: drops a part's last, partial block
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += n // block
        ends.append(total)
    return total, ends


def combo_grid_plus_one(numels, blocks):
    # n // block + 1: one program too many for an exact multiple (and for an empty part)
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += n // block + 1
        ends.append(total)
    return total, ends


def combo_grid_counts(numels, blocks):
    # ends are each part's own count, not running sums
    counts = [(n + b - 1) // b for n, b in zip(numels, blocks)]
    return sum(counts), counts


def combo_grid_skips_empty(numels, blocks):
    # an empty part gets no end
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        if n:
            total += (n + block - 1) // block
            ends.append(total)
    return total, ends


def combo_grid_at_least_one(numels, blocks):
    # every part gets a program, even an empty one
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += max(1, (n + block - 1) // block)
        ends.append(total)
    return total, ends


def combo_grid_one_block(numels, blocks):
    # the shared block of the helpers' kernel: every part counted in the first part's block
    ends, total = [], 0
    for n in numels:
        total += (n + blocks[0] - 1) // blocks[0]
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
    """The lab's launch_three_part around `kernel(pid, xs, ys, ns, alpha, blocks)`, a Python stand-in for the
    Triton kernel run once per program id."""
    def launch_three_part(xs, alpha=0.5, blocks=(256, 64, 1024)):
        flat = [x.contiguous().reshape(-1) for x in xs]
        outs = [torch.zeros_like(x) for x in flat]
        total, _ = spec02._combo_grid([x.numel() for x in flat], list(blocks))
        for pid in range(total):
            kernel(pid, flat, outs, [x.numel() for x in flat], alpha, blocks)
        return [o.view(x.shape) for o, x in zip(outs, xs)]
    return launch_three_part


def _kernel_global_pid(pid, xs, ys, ns, alpha, blocks):
    # passes the global program id to every part: parts 1 and 2 start mid-tensor
    end0 = _cdiv(ns[0], blocks[0])
    end1 = end0 + _cdiv(ns[1], blocks[1])
    part = 0 if pid < end0 else 1 if pid < end1 else 2
    _apply_part(xs[part], ys[part], ns[part], pid, alpha, part, blocks[part])


def _kernel_part2_from_end0(pid, xs, ys, ns, alpha, blocks):
    # part 2's local id subtracts end0, not end1
    end0 = _cdiv(ns[0], blocks[0])
    end1 = end0 + _cdiv(ns[1], blocks[1])
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, blocks[0])
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, blocks[1])
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end0, alpha, 2, blocks[2])


def _kernel_end1_not_cumulative(pid, xs, ys, ns, alpha, blocks):
    # end1 = cdiv(n1, BLOCK1): part 1's count, not where its programs end
    end0 = _cdiv(ns[0], blocks[0])
    end1 = _cdiv(ns[1], blocks[1])
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, blocks[0])
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, blocks[1])
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end1, alpha, 2, blocks[2])


def _kernel_floor_ends(pid, xs, ys, ns, alpha, blocks):
    # part boundaries with n // BLOCK: a partial last block goes to the next part
    end0 = ns[0] // blocks[0]
    end1 = end0 + ns[1] // blocks[1]
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, blocks[0])
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, blocks[1])
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end1, alpha, 2, blocks[2])


def _kernel_one_block(pid, xs, ys, ns, alpha, blocks):
    # the helpers' combo_kernel with its one BLOCK read as BLOCK0: every part in part 0's block
    block = blocks[0]
    end0 = _cdiv(ns[0], block)
    end1 = end0 + _cdiv(ns[1], block)
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, block)
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, block)
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end1, alpha, 2, block)


def _kernel_ends_in_own_block(pid, xs, ys, ns, alpha, blocks):
    # each part's blocks right, but the ends counted in part 0's block
    end0 = _cdiv(ns[0], blocks[0])
    end1 = end0 + _cdiv(ns[1], blocks[0])
    if pid < end0:
        _apply_part(xs[0], ys[0], ns[0], pid, alpha, 0, blocks[0])
    elif pid < end1:
        _apply_part(xs[1], ys[1], ns[1], pid - end0, alpha, 1, blocks[1])
    else:
        _apply_part(xs[2], ys[2], ns[2], pid - end1, alpha, 2, blocks[2])


launch_global_pid = _launcher(_kernel_global_pid)


launch_part2_from_end0 = _launcher(_kernel_part2_from_end0)


launch_end1_not_cumulative = _launcher(_kernel_end1_not_cumulative)


launch_floor_ends = _launcher(_kernel_floor_ends)


launch_one_block = _launcher(_kernel_one_block)


launch_ends_in_part0_block = _launcher(_kernel_ends_in_own_block)


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
        def launch(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK0, BLOCK1, BLOCK2):
            for pid in range(grid[0]):
                self.body(pid, [x0, x1, x2], [y0, y1, y2], [n0, n1, n2], alpha, (BLOCK0, BLOCK1, BLOCK2))
        return launch


def _kernel_sequential(pid, xs, ys, ns, alpha, blocks):
    end0 = _cdiv(ns[0], blocks[0])
    end1 = end0 + _cdiv(ns[1], blocks[1])
    part, start = (0, 0) if pid < end0 else (1, end0) if pid < end1 else (2, end1)
    _apply_part(xs[part], ys[part], ns[part], pid - start, alpha, part, blocks[part])


def _with_kernel(body, source: str):
    """launch_three_part defined by `source` in a namespace whose three_part_kernel is `body` as a kernel."""
    namespace = {"torch": torch, "F": F, "spec02": spec02, "three_part_kernel": _PyKernel(body)}
    exec(source, namespace)
    return namespace["launch_three_part"]


LAUNCH_ONCE = """
def launch_three_part(xs, alpha=0.5, blocks=(256, 64, 1024)):
    flat = [x.contiguous().reshape(-1) for x in xs]
    outs = [torch.empty_like(x) for x in flat]
    total, _ = spec02._combo_grid([x.numel() for x in flat], list(blocks))
    if total:
        three_part_kernel[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1], flat[1].numel(),
                                    flat[2], outs[2], flat[2].numel(), alpha,
                                    BLOCK0=blocks[0], BLOCK1=blocks[1], BLOCK2=blocks[2])
    return [o.view(x.shape) for o, x in zip(outs, xs)]
"""


LAUNCH_THRICE = """
def launch_three_part(xs, alpha=0.5, blocks=(256, 64, 1024)):
    # one launch per part, the other two parts empty: three launches, each kernel run for one part
    flat = [x.contiguous().reshape(-1) for x in xs]
    outs = [torch.empty_like(x) for x in flat]
    for part in range(3):
        args = []
        for i in range(3):
            args += [flat[i], outs[i], flat[i].numel() if i == part else 0]
        programs = (flat[part].numel() + blocks[part] - 1) // blocks[part]     # the other parts own no program
        if programs:
            three_part_kernel[(programs,)](*args, alpha, BLOCK0=blocks[0], BLOCK1=blocks[1], BLOCK2=blocks[2])
    return [o.view(x.shape) for o, x in zip(outs, xs)]
"""


launch_once_stand_in = _with_kernel(_kernel_sequential, LAUNCH_ONCE)     # a right answer: the harness's sanity


launch_three_launches = _with_kernel(_kernel_sequential, LAUNCH_THRICE)


def launch_eager(xs, alpha=0.5, blocks=(256, 64, 1024)):
    # no kernel at all: the three parts in eager PyTorch
    return [xs[0] * alpha, torch.relu(xs[1]), F.silu(xs[2])]


def launch_separate_kernels(xs, alpha=0.5, blocks=(256, 64, 1024)):
    # three launches of single-part kernels (fusion.separate_launches): right values, no combo kernel
    from helpers import fusion
    return fusion.separate_launches(xs, alpha=alpha, block=blocks[0])


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


STEPS = ("foreach", "combo_off", "combo_on")


def _chooser(mistake: str = ""):
    """choose_step as the solution writes it, with one mistake (named in the lab's own words)."""
    def choose_step(costs, launches):
        block = costs["block"]
        sizes = [n for kernel in launches["combo_off"] for n in kernel]
        foreach_host = 4 * (costs["foreach_us"] + (0 if mistake == "foreach-no-tensor" else
                                                   len(sizes) * costs["foreach_tensor_us"]))
        passes = 1 if mistake == "foreach-one-pass" else 4
        kernel_us = 0.0 if mistake == "no-kernel-us" else costs["kernel_us"]
        times = {"foreach": (foreach_host, passes * (kernel_us + sum(_cdiv(n, block) for n in sizes)
                                                     * costs["foreach_program_us"]))}
        guarded = {"no-guards": 0, "guards-per-param": 1}.get(mistake, 3) * len(sizes)
        for step in ("combo_off", "combo_on"):
            kernels = launches[step]
            if step == "combo_on" and mistake == "groups-of-8":
                kernels = [sizes[i:i + 8] for i in range(0, len(sizes), 8)]
            launched = len(sizes) if step == "combo_on" and mistake == "combo-launch-per-part" else len(kernels)
            host = costs["call_us"] + guarded * costs["guard_us"] + launched * costs["launch_us"]
            device = 0.0
            for parts in kernels:
                blocks = [_cdiv(n, block) for n in parts]
                if mistake == "always-round-robin":
                    programs = len(parts) * max(blocks)
                    idle = programs - sum(blocks)
                else:
                    _, programs, idle = spec02._combo_plan(parts, block)
                if mistake == "no-idle":
                    programs, idle = programs - idle, 0
                idle_us = costs["program_us"] if mistake == "idle-as-busy" else costs["idle_us"]
                device += kernel_us + (programs - idle) * costs["program_us"] + idle * idle_us
            times[step] = (host, device)
        total = {s: {"device-only": d, "host-only": h, "sum": h + d}.get(mistake, max(h, d))
                 for s, (h, d) in times.items()}
        fastest = min(total.values())
        if mistake == "tie-fastest":
            step = min(STEPS, key=total.get)
        else:
            step = next(s for s in STEPS if total[s] <= 1.02 * fastest)
        host, device = times[step]
        if mistake == "bound-by-choice":
            return step, "host" if step == "foreach" else "device"
        return step, "host" if host >= device else "device"
    choose_step.__name__ = f"choose_step_{mistake.replace('-', '_')}"
    return choose_step


def choose_step_second_solution(costs, launches):
    # a right answer written otherwise: each step's (host, device) from one table of counts, ties by sort order
    block = costs["block"]
    params = [n for kernel in launches["combo_off"] for n in kernel]
    foreach_programs = sum(math.ceil(n / block) for n in params)
    candidates = []
    for rank, step in enumerate(STEPS):
        if step == "foreach":
            host = 4 * costs["foreach_us"] + 4 * len(params) * costs["foreach_tensor_us"]
            device = 4 * costs["kernel_us"] + 4 * foreach_programs * costs["foreach_program_us"]
        else:
            host = costs["call_us"] + costs["guard_us"] * 3 * len(params) + costs["launch_us"] * len(launches[step])
            device = 0.0
            for parts in launches[step]:
                blocks = [math.ceil(n / block) for n in parts]
                round_robin = 5 * sum(parts) > 4 * len(parts) * max(parts)
                programs = len(parts) * max(blocks) if round_robin else sum(blocks)
                device += costs["kernel_us"] + sum(blocks) * costs["program_us"] + \
                    (programs - sum(blocks)) * costs["idle_us"]
        candidates.append((max(host, device), rank, step, "device" if device > host else "host"))
    fastest = min(c[0] for c in candidates)
    chosen = min((c for c in candidates if c[0] <= 1.02 * fastest), key=lambda c: c[1])
    return chosen[2], chosen[3]


SECOND_KERNEL = """@triton.jit
def three_part_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha,
                      BLOCK0: tl.constexpr, BLOCK1: tl.constexpr, BLOCK2: tl.constexpr):
    # the starts in integer arithmetic, the parts tested from the last one down
    pid = tl.program_id(axis=0)
    start1 = (n0 + BLOCK0 - 1) // BLOCK0
    start2 = start1 + (n1 + BLOCK1 - 1) // BLOCK1
    if pid >= start2:
        apply_part(x2, y2, n2, pid - start2, alpha, 2, BLOCK2)
    elif pid >= start1:
        apply_part(x1, y1, n1, pid - start1, alpha, 1, BLOCK1)
    else:
        apply_part(x0, y0, n0, pid, alpha, 0, BLOCK0)

"""


def helpers_kernel_source() -> str:
    """helpers.fusion_kernels.combo_kernel's source as the lab's three_part_kernel, copied as it stands (one
    BLOCK for the three parts) and with its BLOCK read as the lab's BLOCK0: exercise 2's kernel is not the
    helpers' one."""
    import ast
    import inspect
    import textwrap
    from helpers import fusion_kernels
    tree = ast.parse(inspect.getsource(fusion_kernels))
    kernel = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "combo_kernel")
    return "@triton.jit\n" + textwrap.dedent(ast.get_source_segment(inspect.getsource(fusion_kernels), kernel))


def with_kernel(kernel: str) -> str:
    """The solution notebook's launch_three_part module with `kernel` in place of its three_part_kernel."""
    solution = triton_solution_source()
    head = solution[:solution.index("@triton.jit")]
    return head + kernel + "\n\n" + solution[solution.index("def launch_three_part"):]


@pytest.mark.slow
def test_slow_second_solutions_get_full_marks(tmp_path):
    """Lab 02's kernel written otherwise (Triton's interpreter, in a child) and its prediction written
    otherwise (compiles) get full marks."""
    assert run_cases("02_fusion_lab", predicted_second_solution, "predicted_kernel_functions") == []
    pytest.importorskip("triton")
    got = run_in_child("02_fusion_lab", "launch_three_part", {"second": with_kernel(SECOND_KERNEL)}, tmp_path,
                       env={"TRITON_INTERPRET": "1"})
    assert got["second"] == []


@pytest.mark.slow
def test_slow_the_helpers_combo_kernel_is_not_exercise_2s_answer(tmp_path):
    """The deep dive's combo kernel (helpers.fusion_kernels.combo_kernel), graded as the learner's
    three_part_kernel under Triton's interpreter, fails the visible cases: copied as it stands (its one
    BLOCK is not the launcher's BLOCK0, BLOCK1, BLOCK2) and with BLOCK renamed BLOCK0 (every part counted in
    part 0's block, which fails the central case: a quarter of the exercise's points at most)."""
    pytest.importorskip("triton")
    source = helpers_kernel_source().replace("def combo_kernel(", "def three_part_kernel(")
    renamed = source.replace("BLOCK: tl.constexpr", "BLOCK0: tl.constexpr, BLOCK1: tl.constexpr, "
                                                    "BLOCK2: tl.constexpr").replace("BLOCK)", "BLOCK0)")
    assert "BLOCK)" not in renamed and renamed.count("BLOCK0)") == 5
    got = run_in_child("02_fusion_lab", "launch_three_part", {"as is": with_kernel(source),
                                                               "renamed": with_kernel(renamed)},
                       tmp_path, env={"TRITON_INTERPRET": "1"})
    _, cases, _ = prepared(L02, "launch_three_part")
    visible = {c.name for c in cases if not c.hidden}
    for label, failed in got.items():
        assert visible & {name for name, _ in failed}, (label, failed)
    central = next(c.name for c in cases if c.central)
    assert any(name == central and "counted in that part's own block" in p for name, p in got["renamed"]), \
        got["renamed"]



def test_plan_harness_follows_the_installed_inductor():
    """combo_plan_errors judges with helpers.fusion's re-implemented rule (no Inductor import in the
    learner's process): on every case of exercise 3 it is the installed Inductor's choice."""
    from helpers import fusion
    _, cases, _ = prepared("02_fusion_lab", "plan_combo_launch")
    for case in cases:
        numels = case.args[0]
        assert fusion.combo_dispatch_strategy(numels) == fusion.inductor_combo_dispatch_strategy(numels), case.name


def test_recorded_output_code_launches_what_the_lab_says():
    """Exercise 5's record: the combo-off code launches one kernel per parameter, the combo-on code combo
    kernels of 8 in order, each dispatched as the installed Inductor's rule says (quick: one sequential,
    full: four round-robin, as printed on the H200); the H200's costs model its 8 measured steps within 3%;
    the code names no machine's paths."""
    from helpers import fusion
    from helpers.grading.harnesses.lab02 import step_us
    record = fusion.recorded_sgd_step()
    schemes = {"quick": ["sequential"], "full": ["round_robin"] * 4}
    measured = {"foreach": "_foreach_", "combo_off": "compiled, combo off", "combo_on": "compiled, combo on"}
    for name, w in record["workloads"].items():
        launches = {step: fusion.launch_sizes(code) for step, code in w["code"].items()}
        assert launches == {"combo_off": [[n] for n in w["sizes"]], "combo_on": fusion.combo_groups(w["sizes"])}
        combos = fusion.combo_dispatches(w["code"]["combo_on"])
        assert [c.scheme for c in combos] == schemes[name]
        assert [fusion.inductor_combo_dispatch_strategy(c.numels) for c in combos] == schemes[name]
        for step, label in measured.items():
            modelled = max(step_us(fusion.H200_STEP_COSTS, launches, step))
            assert abs(modelled / w["measured_us"][label] - 1) < 0.03, (name, step)
        assert not any(marker in code for code in w["code"].values() for marker in ("/tmp/", "/home/", "/root"))


def test_combo_launch_plan_is_exercise_3s_rule():
    """The public plan that stands in for the learner's plan_combo_launch while exercise 5 is graded."""
    from helpers import fusion
    _, cases, _ = prepared(L02, "plan_combo_launch")
    for numels in [c.args[0] for c in cases] + [[777], [1024] * 3 + [1]]:
        for block in (128, 256, 1024):
            assert fusion.combo_launch_plan(numels, block) == spec02._combo_plan(numels, block)


def triton_solution_in_child(function, request, tmp_path):
    """launch_three_part is a Triton kernel: its interpreter runs it, in a fresh process."""
    if function != "launch_three_part":
        return None
    pytest.importorskip("triton")
    got = run_in_child(L02, function, {"solution": triton_solution_source()}, tmp_path, env={"TRITON_INTERPRET": "1"})
    return got["solution"]


CASE_1 = "sizes [1000, 130, 3075], blocks (256, 64, 1024)"

WRONG = [
    Wrong(L02, "combo_grid", "floor", combo_grid_floor, "the example", "(n + block - 1) // block"),
    Wrong(L02, "combo_grid", "plus-one", combo_grid_plus_one, "exact multiples", "exactly k*block elements"),
    Wrong(L02, "combo_grid", "counts-not-ends", combo_grid_counts, "the example", "ends are running sums"),
    Wrong(L02, "combo_grid", "skips-empty", combo_grid_skips_empty, "empty parts", "still has an end"),
    Wrong(L02, "combo_grid", "at-least-one", combo_grid_at_least_one, "empty parts", "an empty part needs 0 programs"),
    Wrong(L02, "combo_grid", "one-block", combo_grid_one_block, "each part its own block",
          "each part has its own block"),
    Wrong(L02, "launch_three_part", "global-pid", launch_global_pid, CASE_1,
          "its local id is its program id minus that start"),
    Wrong(L02, "launch_three_part", "part2-from-end0", launch_part2_from_end0, CASE_1,
          "start where the previous part's end"),
    Wrong(L02, "launch_three_part", "end1-not-cumulative", launch_end1_not_cumulative, CASE_1,
          "that part's programs never ran"),
    Wrong(L02, "launch_three_part", "floor-ends", launch_floor_ends, CASE_1, "wrong local id"),
    Wrong(L02, "launch_three_part", "one-block", launch_one_block, CASE_1, "(BLOCK0 for part 0, BLOCK1 for part 1)"),
    Wrong(L02, "launch_three_part", "ends-in-part0-block", launch_ends_in_part0_block, CASE_1,
          "counted in that part's own block"),
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
          "lesson 02 counted the C++ functions of an independent pair", slow=True),
    Wrong(L02, "predicted_kernel_functions", "matmul-fuses", predicted_matmul_fuses, "the four functions",
          "says what ends one cpp_fused_* function and starts the next", slow=True),
    Wrong(L02, "predicted_kernel_functions", "one-per-op", predicted_one_per_op, "the four functions",
          "the name in brackets is a function you predicted wrong", slow=True),
    Wrong(L02, "predicted_kernel_functions", "measures", predicted_by_measuring, "the four functions",
          "torch.compile", slow=True),
    Wrong(L02, "choose_step", "tie-fastest", _chooser("tie-fastest"),
          "the H200's step: 6 parameters of 256 to 441 elements (the lesson's quick run)", "take the simpler"),
    Wrong(L02, "choose_step", "device-only", _chooser("device-only"),
          "the H200's step: 30 parameters of 1024 to 2097 elements", "the host takes its time too"),
    Wrong(L02, "choose_step", "no-guards", _chooser("no-guards"), "12 parameters of 16K elements",
          "checks the guards of every tensor it takes"),
    Wrong(L02, "choose_step", "guards-per-param", _chooser("guards-per-param"), "12 parameters of 16K elements",
          "3 per parameter"),
    Wrong(L02, "choose_step", "host-only", _chooser("host-only"), "30 parameters of 1M elements",
          "the GPU takes its time too"),
    Wrong(L02, "choose_step", "foreach-one-pass", _chooser("foreach-one-pass"), "30 parameters of 1M elements",
          "a kernel per _foreach_ call"),
    Wrong(L02, "choose_step", "bound-by-choice", _chooser("bound-by-choice"), "8 parameters of 1M elements",
          "the bound is the side that takes longer in the step you chose"),
    Wrong(L02, "choose_step", "combo-launch-per-part", _chooser("combo-launch-per-part"),
          "12 parameters of 2M elements", "a combo kernel is one launch from the host"),
    Wrong(L02, "choose_step", "no-kernel-us", _chooser("no-kernel-us"), "30 parameters of 4M elements",
          "every kernel costs kernel_us on the GPU"),
    Wrong(L02, "choose_step", "foreach-no-tensor", _chooser("foreach-no-tensor"), "200 parameters of 64K elements",
          "foreach_tensor_us on the host for every parameter"),
    Wrong(L02, "choose_step", "sum", _chooser("sum"), "40 parameters of 560K elements",
          "the longer of the two, not their sum"),
    Wrong(L02, "choose_step", "no-idle", _chooser("no-idle"),
          "8 parameters of 8M to 10M elements, a GPU on which an idle program costs a busy one's time",
          "the smaller parts' extra programs are idle"),
    Wrong(L02, "choose_step", "idle-as-busy", _chooser("idle-as-busy"), "8 parameters of 8M to 10M elements",
          "an idle program costs idle_us, not program_us"),
    Wrong(L02, "choose_step", "always-round-robin", _chooser("always-round-robin"),
          "an embedding of 64M elements beside 7 parameters of 1M", "dispatches sequentially"),
    Wrong(L02, "choose_step", "groups-of-8", _chooser("groups-of-8"),
          "30 parameters of 1024 to 2097 elements, combo kernels of 4 sub-kernels, guards at 0.2 us",
          "count the kernels the output code launches"),
]

SECOND_SOLUTIONS = [("plan_combo_launch", plan_second_solution), ("launch_three_part", launch_once_stand_in),
                    ("choose_step", choose_step_second_solution), ("choose_step", _chooser())]

globals().update(lab_tests(L02, WRONG, SECOND_SOLUTIONS, visible=True, solution=triton_solution_in_child,
                           reference_exempt={"launch_three_part": {"one launch of three_part_kernel", "one launch, other sizes"}},
                           slow_solutions=("predicted_kernel_functions", "launch_three_part")))
