"""Lab 02 (a combo kernel's dispatch, kernel counts), solved independently.

Written from the student copy of the lab (labs/02_fusion_lab.ipynb), lesson 02, the public helpers and
PyTorch's documentation and source (Inductor's ComboKernel.select_dispatch_strategy and its grid
classes) alone, as a learner would: without the lab's solutions or the grader's reference answers.

Exercise 2's kernel needs Triton: on a machine without a GPU it runs under Triton's interpreter, which
is why TRITON_INTERPRET is set before Triton is first imported (as the notebook does). Without Triton,
`three_part_kernel` and `launch_three_part` are not defined.
"""
import os

import torch

from helpers import fusion
from helpers.device import pick_device

DEVICE = pick_device()
if DEVICE.type == "cpu":   # before anything imports Triton: its interpreter runs kernels on the CPU
    os.environ["TRITON_INTERPRET"] = "1"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Exercise 1 -------------------------------------------------------------------------------------------
def combo_grid(numels: list[int], blocks: list[int]) -> tuple[int, list[int]]:
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += _cdiv(n, block)
        ends.append(total)
    return total, ends


# Exercise 2 -------------------------------------------------------------------------------------------
try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

if HAVE_TRITON:
    apply_part = fusion.apply_part_kernel()

    @triton.jit
    def three_part_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha,
                          BLOCK0: tl.constexpr, BLOCK1: tl.constexpr, BLOCK2: tl.constexpr):
        # as helpers.fusion_kernels.combo_kernel, each part's programs counted in its own block
        pid = tl.program_id(0)
        end0 = tl.cdiv(n0, BLOCK0)
        end1 = end0 + tl.cdiv(n1, BLOCK1)
        if pid < end0:
            apply_part(x0, y0, n0, pid, alpha, 0, BLOCK0)
        elif pid < end1:
            apply_part(x1, y1, n1, pid - end0, alpha, 1, BLOCK1)
        else:
            apply_part(x2, y2, n2, pid - end1, alpha, 2, BLOCK2)

    def launch_three_part(xs, alpha=0.5, blocks=(256, 64, 1024)):   # given by the lab, unchanged
        flat = [x.contiguous().reshape(-1) for x in xs]
        outs = [torch.empty_like(x) for x in flat]
        total, _ = combo_grid([x.numel() for x in flat], list(blocks))
        if total:
            three_part_kernel[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1], flat[1].numel(),
                                        flat[2], outs[2], flat[2].numel(), alpha,
                                        BLOCK0=blocks[0], BLOCK1=blocks[1], BLOCK2=blocks[2])
        return [o.view(x.shape) for o, x in zip(outs, xs)]


# Exercise 3 -------------------------------------------------------------------------------------------
def plan_combo_launch(numels: list[int], block: int) -> tuple[str, int, int]:
    # Inductor's rule (select_dispatch_strategy, mixed sizes, static sizes) is decided in ELEMENTS:
    # round-robin when sum(numels) / (max(numels) * N) > 0.8, else sequential.
    # The launch is then counted in BLOCKS: round-robin launches N * ceil(max / block) programs
    # (RoundRobinComboKernelGrid), sequential the sum of each part's ceil(numel / block).
    numels = [abs(int(n)) for n in numels]
    blocks = [_cdiv(n, block) for n in numels]
    needed = sum(blocks)
    biggest = max(numels, default=0)
    if biggest and sum(numels) / (biggest * len(numels)) > 0.8:
        programs = _cdiv(biggest, block) * len(numels)
        return "round_robin", programs, programs - needed
    return "sequential", needed, 0


# Exercise 4 -------------------------------------------------------------------------------------------
def predicted_kernel_functions() -> dict[str, int]:
    # The C++ backend puts consecutive loop nests into one function and splits only around a call it does
    # not generate itself: the pointwise chain, the two independent ops and the mean-then-subtract are
    # each one function; the matmul goes to extern_kernels.mm, with x * 2 before it and relu + 1 after it.
    return {"chain": 1, "independent": 1, "center": 1, "matmul_between": 2}
