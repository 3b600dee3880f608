"""Horizontal fusion: what torch.compile generates, and a hand-written Triton combo kernel.

    info = inspect_compiled(fn, *args)                 # compile, run once, keep the generated code
    print(info.kernel_functions, info.loop_kernels)    # cpp_fused_* / triton_* functions; kernels generated
    torch_log_lines(stderr_text, "fusion")             # what TORCH_LOGS="fusion" printed, prefixes cut
    scheduler_nodes(debug_trace_file(d, "ir_post_fusion.txt"))   # what TORCH_COMPILE_DEBUG=1 wrote
    combo_dispatches(info.code)                        # each combo kernel: its dispatch and sub-kernel sizes
    outs = combo_launch([x0, x1, x2], alpha=0.5)       # three elementwise ops in ONE Triton launch
    refs = combo_reference([x0, x1, x2], alpha=0.5)    # the same in eager PyTorch

Triton is optional (`pip install triton`). The kernels live in helpers.fusion_kernels, imported on
first use; Triton decides at that import whether they run compiled or under its interpreter
(`triton.jit` reads TRITON_INTERPRET when it decorates a function). On a CPU-only machine set
os.environ["TRITON_INTERPRET"] = "1" before the first combo_launch / separate_launches call.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from helpers.bench import compare

# Inductor options for the GPU comparison: combo kernels on or off, with the decision pinned.
# benchmark_combo_kernel=True would time each candidate group and keep only faster ones, so whether
# kernels get combined would depend on the run; False makes the generated code deterministic.
COMBO_OFF = {"combo_kernels": False, "benchmark_combo_kernel": False}
COMBO_ON = {"combo_kernels": True, "benchmark_combo_kernel": False}

COMBO_PARTS = ("scale: x * alpha", "relu: max(x, 0)", "silu: x * sigmoid(x)")
COMBO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.M)
_EXTERN_CALL = re.compile(r"\bextern_kernels\.(\w+)\(")


# --- What torch.compile generates --------------------------------------------------------------

@dataclass(frozen=True)
class CompiledCode:
    fn: Callable                  # the compiled function (reuse it: calling it again does not recompile)
    result: object                # what the first call returned
    code: str                     # Inductor's generated Python module(s): wrapper plus kernel sources
    kernel_functions: list[str]   # generated kernels the wrapper calls (cpp_fused_*, triton_*), in order
    extern_calls: list[str]       # library calls the wrapper makes instead (mm, convolution, ...)
    loop_kernels: int             # torch._inductor.metrics.generated_kernel_count for this compile
    compile_s: float              # wall time of the first call, compile included


def kernel_functions(code: str) -> list[str]:
    """Names of the kernels defined in Inductor output code (one per C++ function or Triton kernel)."""
    return _KERNEL_DEF.findall(code)


def inspect_compiled(fn: Callable, *args, options: dict | None = None, dynamic: bool = False,
                     **kwargs) -> CompiledCode:
    """Compile fn with torch.compile (Inductor), call it once on args, and return the generated code.

    options: Inductor config overrides for this compile only, e.g. COMBO_ON (an unknown name raises).
    Uses torch._inductor.utils.run_and_get_code, which calls torch._dynamo.reset() first: functions
    compiled earlier recompile on their next call (cheap when Inductor's cache has them).
    loop_kernels counts kernels as Inductor generates them: on CPU every loop nest, even when several
    share one cpp_fused_* function; on GPU every Triton kernel (a combo kernel counts once).
    """
    from torch._inductor import metrics
    from torch._inductor.utils import run_and_get_code

    if not callable(fn):
        raise TypeError(f"inspect_compiled needs a function, got {type(fn).__name__}")
    compiled = torch.compile(fn, options=dict(options or {}), dynamic=dynamic)
    metrics.reset()
    start = time.perf_counter()
    result, codes = run_and_get_code(compiled, *args, **kwargs)
    elapsed = time.perf_counter() - start
    if not codes:
        raise RuntimeError("torch.compile produced no Inductor code for this function (did it run in eager "
                           "because of a graph break, or does it contain no tensor operations?)")
    code = "\n".join(codes)
    return CompiledCode(fn=compiled, result=result, code=code, kernel_functions=kernel_functions(code),
                        extern_calls=_EXTERN_CALL.findall(code), loop_kernels=metrics.generated_kernel_count,
                        compile_s=elapsed)


def kernel_source(code: str, name: str, max_lines: int | None = None) -> str:
    """The source of one generated kernel (by name) from Inductor output code."""
    start = code.find(f"{name} = async_compile.")
    if start < 0:
        raise KeyError(f"no kernel named {name!r} in this code; kernels: {kernel_functions(code)}")
    opening = code.find("'''", start)                     # r''' (C++) or ''' (Triton) opens the source
    closing = code.find("'''", opening + 3)
    end = code.find("\n", closing)
    lines = code[start:end if end >= 0 else len(code)].splitlines()
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines] + [f"    ... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


def wrapper_calls(code: str) -> list[str]:
    """The lines of the generated `call` function that launch kernels or library calls."""
    names = set(kernel_functions(code))
    calls = []
    for line in code.splitlines():
        stripped = line.strip()
        head = stripped.split("(")[0].split(".")[0]
        if head in names or stripped.startswith("extern_kernels."):
            calls.append(stripped)
    return calls


# --- Inductor's own tools: TORCH_LOGS and TORCH_COMPILE_DEBUG -------------------------------------

# torch's log format: "V1202 08:19:29.462000 4639 torch/_inductor/scheduler.py:4995] [0/0] [__fusion] text";
# an artifact turned on with TORCH_LOGS="fusion" (or torch._logging.set_logs(fusion=True)) is tagged [__fusion].
_LOG_LINE = re.compile(r"^[A-Z]\d{4} \S+ \d+ \S+\](?: \[[^\]]*\])*? \[__(\w+)\] ?(.*)$")


def torch_log_lines(text: str, artifact: str) -> list[str]:
    """The messages of one log artifact ("fusion", "output_code", ...) in what torch's logs printed,
    without the level/time/file prefix torch puts before every line."""
    found = []
    for line in text.splitlines():
        match = _LOG_LINE.match(line)
        if match and match.group(1) == artifact:
            found.append(match.group(2))
    return found


def debug_trace_file(debug_dir: str | os.PathLike, name: str) -> str:
    """The text of one file Inductor's debug trace wrote (TORCH_COMPILE_DEBUG=1, or the compile options
    {"trace.enabled": True, "trace.debug_dir": debug_dir}): ir_pre_fusion.txt, ir_post_fusion.txt,
    output_code.py, ... If several graphs were compiled into debug_dir, the last one written."""
    paths = sorted(Path(debug_dir).glob(f"**/{name}"), key=lambda p: p.stat().st_mtime)
    if not paths:
        raise FileNotFoundError(f"no {name} under {debug_dir}: did the compile hit Inductor's FX graph cache? "
                                f"A cache hit skips the scheduler, so nothing is written (compile with "
                                f"options={{'fx_graph_cache': False, ...}})")
    return paths[-1].read_text()


_NODE_HEADER = re.compile(r"^(\w+): (\w*SchedulerNode)\(")


def scheduler_nodes(ir_text: str) -> list[str]:
    """The scheduler nodes listed in an ir_pre_fusion.txt / ir_post_fusion.txt, as "op0: SchedulerNode"
    or "op0_op1: FusedSchedulerNode" (the nodes inside a fused node are not listed again)."""
    nodes, previous = [], ""
    for line in ir_text.splitlines():
        match = _NODE_HEADER.match(line)
        if match and not previous.rstrip().endswith("="):     # "op0_op1.snodes[0] =" precedes a member
            nodes.append(f"{match.group(1)}: {match.group(2)}")
        if line.strip():
            previous = line
    return nodes


# --- The workloads: an optimizer-style update, and many tiny independent ops --------------------

def make_sgd_state(n_tensors: int, base_size: int = 1024, device: torch.device | str = "cpu",
                   seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """params, grads, momentum buffers: n_tensors ragged 1-D tensors (sizes base_size + 37*i), like
    the parameters of a small model."""
    if n_tensors < 1 or base_size < 1:
        raise ValueError(f"n_tensors and base_size must be >= 1, got {n_tensors} and {base_size}")
    gen = torch.Generator().manual_seed(seed)
    sizes = [base_size + 37 * i for i in range(n_tensors)]
    params = [torch.randn(s, generator=gen).to(device) for s in sizes]
    grads = [torch.randn(s, generator=gen).to(device) for s in sizes]
    bufs = [torch.zeros(s, device=device) for s in sizes]
    return params, grads, bufs


def sgd_step(params, grads, bufs, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-4) -> None:
    """SGD with momentum and weight decay, one tensor at a time (what a for-loop optimizer does):
    5 small ops per tensor in eager mode."""
    for p, g, b in zip(params, grads, bufs):
        d = g + weight_decay * p
        b.mul_(momentum).add_(d)
        p.add_(b, alpha=-lr)


def sgd_step_foreach(params, grads, bufs, lr: float = 0.01, momentum: float = 0.9,
                     weight_decay: float = 1e-4) -> None:
    """The same update with torch._foreach_* ops: one call per op for the whole list."""
    d = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, d)
    torch._foreach_add_(params, bufs, alpha=-lr)


def chain_ops(x: torch.Tensor, n_ops: int) -> torch.Tensor:
    """n_ops tiny ops in a chain, each using the previous result: vertical fusion makes them one loop."""
    for _ in range(n_ops):
        x = x * 1.0001
    return x


def independent_ops(tensors: Sequence[torch.Tensor]) -> None:
    """One tiny in-place op per tensor, none depending on another: only horizontal fusion can merge them."""
    for t in tensors:
        t.add_(1.0)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs: the fixed cost and the cost per op."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("fit_line needs two equally long sequences of at least 2 points")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_line needs at least two different x values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def tiny_ops_sweep(counts: Sequence[int], *, size: int = 16, device: torch.device | str = "cpu",
                   repeats: int = 3, min_run_time: float = 0.05) -> dict:
    """Time n tiny ops on `size`-element tensors, eager vs compiled, for each n in counts: as a chain
    on one tensor (chain_ops) and as one op on each of n tensors (independent_ops).

    Compiles twice per n (n is part of each graph). Returns per-n medians, fastest and slowest repeats in
    seconds, by candidate (the spread a verdict at one n is checked against), and a straight-line fit
    (fixed cost + cost per op) for each candidate when there are 2+ counts, fitted on the fastest repeats:
    the times least disturbed by other load on the machine."""
    if not counts or min(counts) < 1:
        raise ValueError(f"counts must be a non-empty list of positive ints, got {list(counts)}")
    times: dict[str, list[float]] = {"eager chain": [], "compiled chain": [],
                                     "eager independent": [], "compiled independent": []}
    fastest: dict[str, list[float]] = {name: [] for name in times}
    slowest: dict[str, list[float]] = {name: [] for name in times}
    for n in counts:
        x = torch.randn(size, device=device)
        tensors = [torch.randn(size, device=device) for _ in range(n)]
        chain_c = torch.compile(chain_ops, dynamic=False)
        indep_c = torch.compile(independent_ops, dynamic=False)
        r = compare({"eager chain": lambda: chain_ops(x, n), "compiled chain": lambda: chain_c(x, n),
                     "eager independent": lambda: independent_ops(tensors),
                     "compiled independent": lambda: indep_c(tensors)},
                    baseline="eager chain", repeats=repeats, min_run_time=min_run_time, device=device)
        for name in times:
            times[name].append(r["results"][name]["median_s"])
            fastest[name].append(r["results"][name]["min_s"])
            slowest[name].append(r["results"][name]["max_s"])
    fits = {}
    if len(counts) >= 2:
        for name, ys in fastest.items():
            fixed, per_op = fit_line(list(counts), ys)
            fits[name] = {"fixed_s": fixed, "per_op_s": per_op}
    return {"counts": list(counts), "size": size, "device": str(device), "median_s": times, "min_s": fastest,
            "max_s": slowest, "fit": fits}


# --- The hand-written Triton combo kernel --------------------------------------------------------

def combo_reference(xs: Sequence[torch.Tensor], alpha: float = 0.5) -> list[torch.Tensor]:
    """What the combo kernel computes, in eager PyTorch: part 0 x*alpha, part 1 relu, part 2 silu
    (computed in fp32, returned in each input's dtype)."""
    x0, x1, x2 = _check_combo_inputs(xs)
    return [(x0.float() * alpha).to(x0.dtype), torch.relu(x1.float()).to(x1.dtype),
            torch.nn.functional.silu(x2.float()).to(x2.dtype)]


def _check_combo_inputs(xs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if len(xs) != 3:
        raise ValueError(f"the combo kernel takes exactly 3 tensors (one per part: {', '.join(COMBO_PARTS)}), "
                         f"got {len(xs)}")
    for i, x in enumerate(xs):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"item {i} is a {type(x).__name__}, not a tensor: pass 3 tensors "
                             f"(torch.as_tensor(...) converts a list)")
    devices = {x.device for x in xs}
    if len(devices) != 1:
        raise ValueError(f"all 3 tensors must be on one device, got {sorted(map(str, devices))}: "
                         f"move them with .to(device)")
    for i, x in enumerate(xs):
        if x.dtype not in COMBO_DTYPES:
            raise TypeError(f"tensor {i} has dtype {x.dtype}; the combo kernel takes float32, float16 or "
                            f"bfloat16 (convert with x.float())")
    return xs[0], xs[1], xs[2]


def combo_grid(numels: Sequence[int], block: int) -> tuple[int, list[int]]:
    """Programs to launch for a combo kernel, and where each part's programs end (cumulative).

    Each part needs ceil(numel / block) programs; the launch is their sum. Part i owns program ids
    ends[i-1] <= pid < ends[i]. This is Inductor's sequential combo grid (num_xblocks_0, _1, ...);
    round_robin_grid is the other one."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    ends, total = [], 0
    for n in numels:
        if n < 0:
            raise ValueError(f"numels must be >= 0, got {list(numels)}")
        total += -(-n // block)
        ends.append(total)
    return total, ends


# Inductor's choice of how a combo kernel dispatches its programs (ComboKernel.select_dispatch_strategy in
# torch/_inductor/codegen/triton_combo_kernel.py). 2.10 has two schemes: round-robin when every sub-kernel
# is within BLOCK_UTILIZATION of the largest on average (at most 20% of the programs masked out), else
# sequential. Later releases add a third, SequentialFlattenGridDispatch, used only when
# config.combo_kernel_per_subkernel_blocks is on (pytorch#172527, after 2.10; off by default in 2.13).
COMBO_BLOCK_UTILIZATION = 0.8
COMBO_MAX_NODES_2_10 = 8      # kernels per combo kernel: hard-coded in 2.10's scheduler.py (max_num_nodes = 8)
_DISPATCH_NAMES = {"RoundRobinDispatch": "round_robin", "SequentialDispatch": "sequential",
                   "SequentialFlattenGridDispatch": "sequential_flatten"}


def combo_groups(numels: Sequence[int], max_nodes: int = COMBO_MAX_NODES_2_10) -> list[list[int]]:
    """The groups Inductor's default grouping makes of independent kernels in order: chunks of max_nodes.
    (Newer releases can split a group further: combo_kernel_max_distance, a peak-memory gate.)"""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    numels = list(numels)
    return [numels[i:i + max_nodes] for i in range(0, len(numels), max_nodes)]


def combo_dispatch_strategy(numels: Sequence[int], mixed_sizes: bool = True) -> str:
    """'round_robin' or 'sequential': Inductor's rule, re-implemented (per-sub-kernel blocks off).

    mixed_sizes is True for combo kernels made by combo_kernels=True (the custom partition algorithm) and
    False for foreach kernels (torch._foreach_* ops), with the default combo_kernel_allow_mixed_sizes=1.
    Round-robin needs mixed sizes and sum(numels) / (max(numels) * len(numels)) > 0.8."""
    numels = [abs(int(n)) for n in numels]
    if not numels:
        raise ValueError("combo_dispatch_strategy needs at least one sub-kernel size")
    if not mixed_sizes or max(numels) == 0:
        return "sequential"
    utilization = sum(numels) / (max(numels) * len(numels))
    return "round_robin" if utilization > COMBO_BLOCK_UTILIZATION else "sequential"


def combo_utilization(numels: Sequence[int]) -> float:
    """sum(numels) / (max(numels) * len(numels)): the share of a round-robin launch's programs with work."""
    numels = [abs(int(n)) for n in numels]
    if not numels or max(numels) == 0:
        raise ValueError(f"combo_utilization needs at least one non-empty sub-kernel, got {numels}")
    return sum(numels) / (max(numels) * len(numels))


def inductor_combo_dispatch_strategy(numels: Sequence[int], mixed_sizes: bool = True,
                                     per_subkernel_blocks: bool | None = None) -> str:
    """The same decision, made by the installed Inductor's own ComboKernel.select_dispatch_strategy
    (called on a stand-in object that holds only the attributes it reads; no GPU or Triton needed):
    'round_robin', 'sequential', or 'sequential_flatten' (a torch after 2.10, per-sub-kernel blocks on).

    per_subkernel_blocks=None: as torch.compile's combo kernels get it, from the installed config's
    combo_kernel_per_subkernel_blocks (False where the option does not exist); foreach kernels
    (mixed_sizes=False) never use it."""
    from types import SimpleNamespace

    from torch._inductor.codegen.triton_combo_kernel import ComboKernel

    if per_subkernel_blocks is None:
        per_subkernel_blocks = mixed_sizes and bool(
            inductor_options("combo_kernel_per_subkernel_blocks")["combo_kernel_per_subkernel_blocks"])
    stand_in = SimpleNamespace(dispatch_class=None, per_subkernel_blocks=per_subkernel_blocks,
                               mixed_sizes=mixed_sizes, x_numels_list=[int(n) for n in numels])
    ComboKernel.select_dispatch_strategy(stand_in)
    name = stand_in.dispatch_class.__name__
    return _DISPATCH_NAMES.get(name, name)


def inductor_dispatch_code(numels: Sequence[int], show: int | None = None) -> str:
    """The program-id dispatch the installed Inductor writes at the top of a combo kernel whose sub-kernels
    have these (positive, static) x sizes: its own codegen_pid_range, run on a stand-in kernel. Each
    sub-kernel's body is elided to its `xnumel = ...` line, which Inductor writes there too.
    show: write the branches of only the first `show` sub-kernels (the rest become one comment line)."""
    from types import SimpleNamespace

    from torch._inductor.codegen.common import IndentedBuffer
    from torch._inductor.codegen.triton_combo_kernel import ComboKernel

    numels = [int(n) for n in numels]
    if not numels or min(numels) < 1:
        raise ValueError(f"inductor_dispatch_code needs positive sizes, got {numels}")
    scheme = inductor_combo_dispatch_strategy(numels, per_subkernel_blocks=False)
    dispatch = ComboKernel.RoundRobinDispatch if scheme == "round_robin" else ComboKernel.SequentialDispatch
    stand_in = SimpleNamespace(x_numels_list=numels, min_x_blocks_list=[0] * len(numels),
                               sub_kernels=[None] * len(numels))
    code = IndentedBuffer()
    code.writeline("pid = tl.program_id(0)")
    shown = len(numels) if show is None else max(1, min(show, len(numels)))
    for num, n in enumerate(numels[:shown]):
        dispatch.codegen_pid_range(stand_in, num, code)
        with code.indent():
            code.writeline(f"xnumel = {n}")
            code.writeline(f"...   # sub-kernel {num}: its own code, with pid_offset as its program id")
    if shown < len(numels):
        code.writeline(f"# ... the same for sub-kernels {shown} to {len(numels) - 1}")
    code.writeline("else:")
    with code.indent():
        code.writeline("pass")
    return code.getvalue().rstrip("\n")


@dataclass(frozen=True)
class ComboDispatch:
    name: str               # the generated Triton kernel
    scheme: str             # "sequential", "round_robin" or "sequential_flatten", read from its dispatch lines
    numels: list[int]       # each sub-kernel's static xnumel, in dispatch order


_DISPATCH_LINES = (("round_robin", re.compile(r"^\s*if pid % \d+ == 0:", re.M)),
                   ("sequential", re.compile(r"^\s*if pid < num_xblocks_0:", re.M)),
                   ("sequential_flatten", re.compile(r"^\s*if pid < num_blocks_0:", re.M)))
_BRANCH = re.compile(r"^\s*(?:if|elif) pid (?:%|<) .*$", re.M)    # one per sub-kernel
_XNUMEL = re.compile(r"^\s*xnumel = (\d+)\s*$", re.M)


def combo_dispatches(code: str) -> list[ComboDispatch]:
    """The combo kernels (and foreach kernels, which share their code generator) in Inductor output code:
    for each, the dispatch its program-id lines show and its sub-kernels' sizes (the first `xnumel = N`
    Inductor writes in each sub-kernel's branch; a dynamic size has none and is left out)."""
    found = []
    for name in kernel_functions(code):
        source = kernel_source(code, name)
        scheme = next((s for s, pattern in _DISPATCH_LINES if pattern.search(source)), None)
        if scheme is not None:
            branches = _BRANCH.split(source)[1:]
            numels = [int(m.group(1)) for m in (_XNUMEL.search(b) for b in branches) if m]
            found.append(ComboDispatch(name, scheme, numels))
    return found


def launch_sizes(code: str) -> list[list[int]]:
    """The kernels the generated wrapper launches, in its order, each as its sub-kernels' static sizes: one size
    for a plain Triton kernel, one per sub-kernel for a combo (or foreach) kernel (the `xnumel = N` lines of
    its source). A kernel of dynamic size, or a C++ function, gives an empty list."""
    names = set(kernel_functions(code))
    launched = [line.split(".run(")[0] for line in wrapper_calls(code) if line.split(".run(")[0] in names]
    return [[int(n) for n in _XNUMEL.findall(kernel_source(code, name))] for name in launched]


RECORDED_SGD_STEP = Path(__file__).parent / "recorded" / "sgd_step_output_code_h200.json.gz"


# Lab 02's cost model of one SGD step on that H200, in microseconds. The host's costs are fitted to the 8 step
# times recorded there (within 3%); the GPU's are assumed, not measured: 3 us a kernel, and a program at the
# H200's 4.8 TB/s (a compiled program moves 1024 float32 elements of 5 tensors, 20 KiB; a _foreach_ program
# those of 2 or 3), an idle program a tenth of a busy one, in blocks of 1024 (XBLOCK is autotuned at run time).
H200_STEP_COSTS = {"call_us": 40.5, "guard_us": 1.07, "launch_us": 6.3, "foreach_us": 15.3, "foreach_tensor_us": 0.22,
                   "kernel_us": 3.0, "program_us": 0.0043, "idle_us": 0.0005, "foreach_program_us": 0.0023,
                   "block": 1024}


def recorded_sgd_step() -> dict:
    """Inductor's output code for sgd_step on an NVIDIA H200, combo kernels off and on, and the step times
    measured there (lab 02): {"about", "torch", "device", "workloads": {"quick" | "full": {"sizes", "code":
    {"combo_off", "combo_on"}, "measured_us", "measured"}}}."""
    import gzip
    import json
    with gzip.open(RECORDED_SGD_STEP, "rt", encoding="utf-8") as f:
        return json.load(f)


def round_robin_grid(numels: Sequence[int], block: int) -> tuple[int, int]:
    """Programs of a round-robin combo launch (max blocks of any part, times the number of parts) and how
    many of them are fully masked (a part with fewer blocks gets program ids it has no work for).
    Program pid runs part pid % len(numels), block pid // len(numels) of it."""
    total_sequential, _ = combo_grid(numels, block)
    most = max((-(-n // block) for n in numels), default=0)
    total = most * len(numels)
    return total, total - total_sequential


def combo_launch_plan(numels: Sequence[int], block: int) -> tuple[str, int, int]:
    """(scheme, programs, idle programs) of a combo kernel that combo_kernels=True makes of sub-kernels of these
    static sizes, every one in blocks of `block` elements: the dispatch combo_dispatch_strategy picks and the
    grid that scheme launches (round_robin_grid, or combo_grid with no idle program)."""
    scheme = combo_dispatch_strategy(numels)
    if scheme == "round_robin":
        return (scheme, *round_robin_grid(numels, block))
    return scheme, combo_grid(numels, block)[0], 0


def inductor_options(*names: str) -> dict[str, object]:
    """Current values of these torch._inductor.config options in the installed torch; a name it does not
    have maps to None (names differ between releases: combo_kernel_max_num_nodes is not in 2.10)."""
    from torch._inductor import config
    values = config.get_config_copy()
    return {name: values.get(name) for name in names}


def sgd_optimizer(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], *, foreach: bool,
                  lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-4):
    """torch.optim.SGD over copies of params (as nn.Parameters, .grad set to copies of grads), with the
    hyper-parameters of sgd_step. Returns (optimizer, parameters). foreach=False runs a Python loop over
    the tensors; foreach=True runs torch._foreach_* ops."""
    parameters = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, g in zip(parameters, grads, strict=True):
        p.grad = g.detach().clone()
    opt = torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay, foreach=foreach)
    return opt, parameters


def kernels_interpreted() -> bool:
    """Whether the combo kernels run under Triton's interpreter (decided when they were first built)."""
    return _kernels().INTERPRETED


def _kernels():
    """The Triton kernels, imported on first use (Triton reads TRITON_INTERPRET at that import)."""
    import importlib
    return importlib.import_module("helpers.fusion_kernels")


def apply_part_kernel():
    """The @triton.jit device function for one block of one part (for kernels written in the lab)."""
    return _kernels().apply_part


def _prepare(xs: Sequence[torch.Tensor], block: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    _check_combo_inputs(xs)
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16 (Triton's tl.arange needs one), got {block}")
    kernels = _kernels()
    if xs[0].device.type == "cpu" and not kernels.INTERPRETED:
        raise RuntimeError("these tensors are on the CPU but the Triton kernels were built for a GPU: set "
                           "os.environ['TRITON_INTERPRET'] = '1' at the start of a fresh process, or move "
                           "the tensors to the GPU")
    if kernels.INTERPRETED and not kernels.LANGUAGE_INTERPRETED:
        raise RuntimeError("Triton was imported before TRITON_INTERPRET=1 was set (torch.compile imports "
                           "it), so its own helpers are not interpreted: set os.environ['TRITON_INTERPRET'] "
                           "= '1' at the start of the process, before torch.compile or import triton")
    flat = [x.contiguous().reshape(-1) for x in xs]
    return flat, [torch.empty_like(x) for x in flat]


def combo_launch(xs: Sequence[torch.Tensor], alpha: float = 0.5, block: int = 1024) -> list[torch.Tensor]:
    """Run the three parts (x*alpha, relu, silu) on three tensors of any sizes with ONE kernel launch.
    Returns new tensors shaped like the inputs."""
    flat, outs = _prepare(xs, block)
    total, _ = combo_grid([x.numel() for x in flat], block)
    if total > 0:
        _kernels().combo_kernel[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1], flat[1].numel(),
                                      flat[2], outs[2], flat[2].numel(), alpha, BLOCK=block)
    return [o.view(x.shape) for o, x in zip(outs, xs)]


def combo_launch_round_robin(xs: Sequence[torch.Tensor], alpha: float = 0.5,
                             block: int = 1024) -> list[torch.Tensor]:
    """The same one launch with round-robin dispatch: program pid runs part pid % 3, block pid // 3."""
    flat, outs = _prepare(xs, block)
    total, _ = round_robin_grid([x.numel() for x in flat], block)
    if total > 0:
        _kernels().combo_kernel_round_robin[(total,)](flat[0], outs[0], flat[0].numel(), flat[1], outs[1],
                                                      flat[1].numel(), flat[2], outs[2], flat[2].numel(),
                                                      alpha, BLOCK=block)
    return [o.view(x.shape) for o, x in zip(outs, xs)]


def separate_launches(xs: Sequence[torch.Tensor], alpha: float = 0.5, block: int = 1024) -> list[torch.Tensor]:
    """The same three parts as three kernel launches (the baseline a combo kernel removes)."""
    flat, outs = _prepare(xs, block)
    single = _kernels().single_kernel
    for part, (x, y) in enumerate(zip(flat, outs)):
        programs = -(-x.numel() // block)
        if programs:
            single[(programs,)](x, y, x.numel(), alpha, PART=part, BLOCK=block)
    return [o.view(x.shape) for o, x in zip(outs, xs)]


# --- `python -m helpers bench fusion` -------------------------------------------------------------

def benchmark(quick: bool = False, device: torch.device | str | None = None, threads: int = 1) -> dict:
    """Eager loop vs _foreach_ vs compiled for an SGD-momentum step over many small tensors, and the
    tiny-ops launch-overhead sweep. JSON-ready; speed is measured, never asserted.

    Compiles and times with `threads` CPU threads (restored afterwards): these tensors are too small to
    share between threads, and the generated code's OpenMP barriers stall on a busy machine."""
    from helpers.device import pick_device

    device = torch.device(device) if device is not None else pick_device()
    n_tensors, base = (10, 256) if quick else (30, 1024)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        state = make_sgd_state(n_tensors, base, device=device)
        info = inspect_compiled(sgd_step, *state)
        result = compare({"eager loop": lambda: sgd_step(*state),
                          "_foreach_": lambda: sgd_step_foreach(*state),
                          "compiled": lambda: info.fn(*state)},
                         baseline="eager loop", repeats=3 if quick else 7, device=device)
        result["workload"] = {"n_tensors": n_tensors, "sizes": [p.numel() for p in state[0]],
                              "kernel_functions": len(info.kernel_functions), "loop_kernels": info.loop_kernels,
                              "compile_s": info.compile_s}
        sweep = tiny_ops_sweep((1, 16) if quick else (1, 4, 16, 64), device=device)
    finally:
        torch.set_num_threads(old_threads)
    return {"sgd_step": result, "tiny_ops_sweep": sweep}


# --- Lab 02: the four functions whose kernel counts the learner predicts ---------------------------

def kernel_count_cases() -> dict:
    """Lab 02's four functions for predicting kernel counts, name -> (function, args), as the lab shows them."""
    x, w = torch.randn(64, 128), torch.randn(128, 32)
    return {"chain": (_chain, (x,)), "independent": (_independent, (x, torch.randn(1000))),
            "center": (_center, (x,)), "matmul_between": (_matmul_between, (x, w))}


def _chain(x):
    return ((x * 2 + 1).sin() * 3).relu()


def _independent(a, b):
    return a.sin(), b.cos()


def _center(x):
    return x - x.mean(dim=-1, keepdim=True)


def _matmul_between(x, w):
    return torch.relu((x * 2) @ w) + 1


def kernel_counts() -> dict[str, int]:
    """Lab 02's reference for predicted kernel counts: the cpp_fused_* functions the compiled wrapper of
    each function of kernel_count_cases() calls."""
    return {name: len(inspect_compiled(fn, *args).kernel_functions)
            for name, (fn, args) in kernel_count_cases().items()}
