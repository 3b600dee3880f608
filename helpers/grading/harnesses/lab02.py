"""Lab 02 (fusion): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import os
import sys

import torch

from helpers.device import capabilities
from helpers.grading.checks import _unrecorded


def combo_plan_errors(fn, numels, block) -> str:
    """Exercise 3: which of (scheme, programs, idle programs) fn(numels, block) gets wrong, against
    Inductor's ComboKernel.select_dispatch_strategy and the grid each scheme launches; the failure names
    the wrong fields, never the right values."""
    from helpers import fusion

    def truth():      # Inductor's rule as helpers.fusion re-implements it (importing Inductor here takes seconds);
        scheme = fusion.combo_dispatch_strategy(numels)      # the tests hold it to the installed Inductor's
        total, _ = fusion.combo_grid(numels, block)
        if scheme == "round_robin":
            return scheme, *fusion.round_robin_grid(numels, block)
        return scheme, total, 0
    got = fn(list(numels), block)
    want = _unrecorded(truth)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"a {type(got).__name__}, not a (scheme, programs, idle) tuple"
    wrong = [field for field, g, w in zip(("scheme", "programs", "idle"), got, want) if g != w]
    return f"wrong: {', '.join(wrong)}" if wrong else "all three right"


class _CountedKernel:
    """A kernel whose launches, kernel[grid](...), are recorded (grid by grid); anything else is the
    kernel's own."""

    def __init__(self, kernel, grids: list):
        self._kernel, self._grids = kernel, grids

    def __getitem__(self, grid):
        self._grids.append(grid)
        return self._kernel[grid]

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def kernel_launches(fn, xs) -> int:
    """How many times fn(xs), lab 02's launch_three_part, launched the notebook's three_part_kernel
    (0 when it has none: the parts were computed some other way)."""
    namespace = getattr(fn, "__globals__", {})
    kernel = namespace.get("three_part_kernel")
    if kernel is None:
        triton_launch(fn, xs)
        return 0
    grids: list = []
    namespace["three_part_kernel"] = _CountedKernel(kernel, grids)
    try:
        triton_launch(fn, xs)
    finally:
        namespace["three_part_kernel"] = kernel
    return len(grids)


def triton_launch(fn, xs):
    """fn(xs), lab 02's launch_three_part, where its Triton kernel runs: CPU tensors under Triton's
    interpreter (TRITON_INTERPRET=1, which the lab sets on a CPU), else tensors on the GPU (NVIDIA, AMD or
    Intel); returns CPU tensors.
    The notebook's combo_grid is the reference one meanwhile: exercise 2 (the kernel body) is graded on
    its own, whatever exercise 1 gives."""
    from helpers.fusion import combo_grid
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None)
    interpret = bool(knobs.runtime.interpret) if knobs is not None else \
        os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    accelerator = capabilities().device_type
    device = accelerator if not interpret and accelerator in ("cuda", "xpu") else "cpu"
    namespace = getattr(fn, "__globals__", {})
    missing = object()
    own_grid = namespace.get("combo_grid", missing)
    if own_grid is not missing:
        namespace["combo_grid"] = combo_grid
    try:
        out = fn([x.to(device) for x in xs])
    finally:
        if own_grid is not missing:
            namespace["combo_grid"] = own_grid
    return [o.cpu() if isinstance(o, torch.Tensor) else o for o in out] if isinstance(out, (list, tuple)) else out
