"""Lab 02 (fusion): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import os
import sys

import torch

from helpers.device import capabilities
from helpers.grading.recorder import _unrecorded


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


def kernel_launches(fn, xs, blocks) -> int:
    """How many times fn(xs, blocks=blocks), lab 02's launch_three_part, launched the notebook's
    three_part_kernel (0 when it has none: the parts were computed some other way)."""
    namespace = getattr(fn, "__globals__", {})
    kernel = namespace.get("three_part_kernel")
    if kernel is None:
        triton_launch(fn, xs, blocks)
        return 0
    grids: list = []
    namespace["three_part_kernel"] = _CountedKernel(kernel, grids)
    try:
        triton_launch(fn, xs, blocks)
    finally:
        namespace["three_part_kernel"] = kernel
    return len(grids)


def combo_grid_reference(numels, blocks) -> tuple[int, list[int]]:
    """Lab 02's exercise 1, right: the programs of parts of numels[i] elements in blocks of blocks[i], and
    where each part's programs end."""
    ends, total = [], 0
    for n, block in zip(numels, blocks):
        total += -(-n // block)
        ends.append(total)
    return total, ends


def triton_launch(fn, xs, blocks):
    """fn(xs, blocks=blocks), lab 02's launch_three_part, where its Triton kernel runs: CPU tensors under
    Triton's interpreter (TRITON_INTERPRET=1, which the lab sets on a CPU), else tensors on the GPU (NVIDIA,
    AMD or Intel); returns CPU tensors.
    The notebook's combo_grid is the reference one meanwhile: exercise 2 (the kernel body) is graded on
    its own, whatever exercise 1 gives."""
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
        namespace["combo_grid"] = combo_grid_reference
    try:
        out = fn([x.to(device) for x in xs], blocks=tuple(blocks))
    finally:
        if own_grid is not missing:
            namespace["combo_grid"] = own_grid
    return [o.cpu() if isinstance(o, torch.Tensor) else o for o in out] if isinstance(out, (list, tuple)) else out


# --- Exercise 5: combo kernels on, off, or _foreach_, in the lab's cost model ---------------------

STEPS = ("foreach", "combo_off", "combo_on")   # the simpler first: no compile, the default, an experimental option
BOUNDS = ("host", "device")
FOREACH_CALLS = 4              # helpers.fusion.sgd_step_foreach makes 4 _foreach_ calls
TENSORS_PER_PARAMETER = 3      # a compiled sgd_step takes each parameter, its gradient and its momentum buffer
STEP_OK = "the step the model makes fastest (the simplest of those within 2% of it), and the side that sets its time"


def step_us(costs: dict, launches: dict, step: str) -> tuple[float, float]:
    """Lab 02's cost model: (host µs, device µs) of one SGD step taken as `step`. The parameters' sizes are
    the combo-off code's kernels, one per parameter. `_foreach_`: 4 calls, each foreach_us plus
    foreach_tensor_us per parameter on the host, and one kernel on the GPU (kernel_us plus foreach_program_us
    per block of every parameter). Compiled: call_us, guard_us per tensor taken (3 per parameter) and
    launch_us per kernel launched on the host; on the GPU, each kernel kernel_us plus program_us per busy
    program and idle_us per idle one, its programs as Inductor dispatches them."""
    from helpers.fusion import combo_launch_plan
    block = costs["block"]
    sizes = [n for kernel in launches["combo_off"] for n in kernel]
    if step == "foreach":
        host = FOREACH_CALLS * (costs["foreach_us"] + len(sizes) * costs["foreach_tensor_us"])
        programs = sum(-(-n // block) for n in sizes)
        return host, FOREACH_CALLS * (costs["kernel_us"] + programs * costs["foreach_program_us"])
    kernels = launches[step]
    host = costs["call_us"] + TENSORS_PER_PARAMETER * len(sizes) * costs["guard_us"] + len(kernels) * costs["launch_us"]
    device = 0.0
    for parts in kernels:
        _, programs, idle = combo_launch_plan(parts, block)
        device += costs["kernel_us"] + (programs - idle) * costs["program_us"] + idle * costs["idle_us"]
    return host, device


def step_verdict(fn, costs, launches) -> str:
    """Whether fn(costs, launches) names the step the model makes fastest, the simplest of those within 2% of
    the fastest, and the side (host or device) that sets that step's time; if not, how far off, without the
    answer."""
    choice = fn(dict(costs), {step: [list(k) for k in kernels] for step, kernels in launches.items()})
    if not (isinstance(choice, (tuple, list)) and len(choice) == 2):
        return f"a {type(choice).__name__}, not a tuple (step, bound)"
    step, bound = choice
    if step not in STEPS:
        return f"the step {str(step)[:40]!r} is none of {', '.join(map(repr, STEPS))}"
    if bound not in BOUNDS:
        return f"the bound {str(bound)[:40]!r} is neither 'host' nor 'device'"
    times = _unrecorded(lambda: {s: step_us(costs, launches, s) for s in STEPS})
    total = {s: max(host, device) for s, (host, device) in times.items()}
    fastest = min(total.values())
    if total[step] > 1.02 * fastest:
        return f"{step}: the model makes it {total[step] / fastest:.2f}x the fastest step"
    if any(total[s] <= 1.02 * fastest for s in STEPS[:STEPS.index(step)]):
        return f"{step}: as fast as a simpler step within the model's 2%, where the simpler one is wanted"
    host, device = times[step]
    if bound != ("host" if host >= device else "device"):
        return f"{step} is right, but its time is not set by the {bound}"
    return STEP_OK
