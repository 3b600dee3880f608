"""The grader's cases can fail: for every exercise of every lab in grading_specs.SPECS, plausible wrong
answers (the mistakes learners make) fail at least one case, visible or hidden, and the feedback
carries the hint meant for that mistake; the spec's reference and the solution notebook's function
pass every case, so a failure here is the wrong answer's, not the spec's.

Cases run as helpers.lab_checks.check runs them (call_case, then judge_case), hidden ones included.
Lab 04's C++ kernel bodies and lab 02's Triton solution run in a child process (a build, and Triton's
interpreter, change process-wide state); the wrong combo kernels are Python stand-ins for the Triton
kernel's dispatch. A wrong answer the spec accepts is xfail(strict=True, reason="spec accepts: ...");
one caught only elsewhere, or caught with a generic hint instead of its own, xfails with that reason
and fails once it is caught with its hint (so the note can go)."""
from __future__ import annotations

import ast
import copy
import functools
import json
import os
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import attention, moe
from helpers.checks import CheckFailed
from helpers.data import item_generator
from helpers.lab_checks import call_case, check, expected_result
from helpers.runner import grading_specs as gs
from helpers.runner.grade import judge_case
from helpers.runner.grading_specs import SPECS

REPO = Path(__file__).resolve().parent.parent
SEED = 0
MATCH_HINT = "say what was wrong and how to fix it"      # judge_case's hint when a message lacks `match`


# --- Running an exercise's cases, as the grader does ---------------------------------------------

def exercise_of(lab: str, function: str):
    return next(e for e in SPECS[lab].exercises if e.function == function)


@functools.lru_cache(maxsize=None)
def prepared(lab: str, function: str):
    """The exercise, its cases (visible and hidden) on SEED and their expected results, computed once."""
    exercise = exercise_of(lab, function)
    cases = exercise.cases(torch.Generator().manual_seed(SEED))
    return exercise, cases, [expected_result(exercise, case) for case in cases]


def run_cases(lab: str, fn, function: str, reference: bool = False) -> list[tuple[str, str]]:
    """(case name, problem) for every case, visible or hidden, that fn fails. reference: fn is the spec's
    reference, which may call what the learner may not, and is not what the cases expecting an
    exception call."""
    exercise, cases, expected = prepared(lab, function)
    failed = []
    for case, want in zip(cases, expected):
        if reference and case.raises:
            continue
        args, kwargs = copy.deepcopy((case.args, case.kwargs))      # a wrong answer may write into its inputs
        got = call_case(fn, args, kwargs, case.call, () if reference else exercise.forbidden)
        problem = judge_case(exercise, case, want, got)
        if problem is not None:
            failed.append((case.name, problem))
    return failed


CHILD = r"""
import json, runpy, sys
import torch
from helpers.lab_checks import call_case, expected_result
from helpers.runner.grade import judge_case
from helpers.runner.grading_specs import SPECS
job = json.loads(sys.stdin.read())
exercise = next(e for e in SPECS[job["lab"]].exercises if e.function == job["function"])
cases = exercise.cases(torch.Generator().manual_seed(job["seed"]))
expected = [expected_result(exercise, c) for c in cases]   # before any candidate's kernel is built
results = {}
for label, path in job["candidates"].items():
    fn = runpy.run_path(path)[job["function"]]
    problems = [(c.name, judge_case(exercise, c, e, call_case(fn, c.args, c.kwargs, c.call, exercise.forbidden)))
                for c, e in zip(cases, expected)]
    results[label] = [[name, p] for name, p in problems if p is not None]
print("RESULTS" + json.dumps(results))
"""


def run_in_child(lab: str, function: str, candidates: dict[str, str], tmp: Path, env: dict | None = None) -> dict:
    """Every case for each candidate (label -> Python source defining `function`) in one fresh process
    with one OpenMP thread, as the grader's sandbox runs by default: label -> [(case name, problem)]."""
    paths = {}
    for i, (label, source) in enumerate(candidates.items()):
        paths[label] = str(tmp / f"candidate_{i}.py")
        Path(paths[label]).write_text(source)
    job = json.dumps({"lab": lab, "function": function, "seed": SEED, "candidates": paths})
    done = subprocess.run([sys.executable, "-c", CHILD], input=job, capture_output=True, text=True, timeout=900,
                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULTS"))
    return {label: [tuple(p) for p in problems] for label, problems in json.loads(line[len("RESULTS"):]).items()}


# --- The solution notebooks' functions -----------------------------------------------------------

def _cells(lab: str) -> list[ast.Module]:
    nb = json.loads((REPO / "labs" / "solutions" / f"{lab}.ipynb").read_text())
    return [ast.parse("".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "code"]


def _strip_library_decorators(node):
    """register_fake(...) registers as it defines; the test calls the function itself."""
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = [d for d in node.decorator_list if "torch.library" not in ast.unparse(d)]
    return node


@functools.lru_cache(maxsize=None)
def solution_namespace(lab: str) -> dict:
    """The notebook's imports, top-level functions and classes, and the constants they use (BLUR),
    executed without its other cells (no data made, no model trained, nothing registered)."""
    wanted = {"BLUR"}
    body = []
    for tree in _cells(lab):
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
                body.append(_strip_library_decorators(node))
            elif isinstance(node, ast.Assign) and {ast.unparse(t) for t in node.targets} & wanted:
                body.append(node)
    module = types.ModuleType(f"solution_{lab}")    # importable by name: torch.compile may import a function's
    sys.modules[module.__name__] = module              # module to read its globals (torch 2.10 does)
    exec(compile(ast.Module(body, type_ignores=[]), f"<{lab} solution>", "exec"), module.__dict__)
    return module.__dict__


def triton_solution_source() -> str:
    """Lab 02's launch_three_part as a module: the notebook's imports, combo_grid and its `if HAVE_TRITON:`
    block (the Triton kernel and the launcher)."""
    parts = []
    for tree in _cells("02_fusion_lab"):
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                parts.append(ast.unparse(node))
            elif isinstance(node, ast.FunctionDef) and node.name == "combo_grid":
                parts.append(ast.unparse(node))
            elif isinstance(node, ast.If) and ast.unparse(node.test) == "HAVE_TRITON" and any(
                    isinstance(n, ast.FunctionDef) for n in node.body):
                parts.extend(ast.unparse(n) for n in node.body)
    return "\n\n".join(parts) + "\n"


# --- Lab 00: warm-up -----------------------------------------------------------------------------

def softmax_no_max(x, dim=-1):
    # exp without subtracting the maximum: overflows to inf / inf
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_last_dim_only(x, dim=-1):
    # reduces over the last dimension whatever `dim` says
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def softmax_global_max(x, dim=-1):
    # subtracts the maximum of the whole tensor, not of each row: rows far below it underflow to 0 / 0
    e = (x - x.max()).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_float32(x, dim=-1):
    # converts to float32 first
    x = x.float()
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_calls_torch(x, dim=-1):
    # the function the exercise asks to write, under another name
    return torch.nn.functional.softmax(x, dim=dim)


def rms_norm_no_eps(x, weight, eps=1e-6):
    # eps forgotten
    if weight.shape != x.shape[-1:]:
        raise ValueError("weight must have shape (x.shape[-1],)")
    return x / x.pow(2).mean(-1, keepdim=True).sqrt() * weight


def rms_norm_eps_outside(x, weight, eps=1e-6):
    # eps added after the square root
    if weight.shape != x.shape[-1:]:
        raise ValueError("weight must have shape (x.shape[-1],)")
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight


def rms_norm_no_check(x, weight, eps=1e-6):
    # never validates the weight: broadcasting raises RuntimeError, or silently works
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_vague_error(x, weight, eps=1e-6):
    # raises, but the message does not say what was wrong
    if weight.shape != x.shape[-1:]:
        raise ValueError("shapes do not match")
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_whole_tensor(x, weight, eps=1e-6):
    # the mean over every element, not over the last dimension
    if weight.shape != x.shape[-1:]:
        raise ValueError("weight must have shape (x.shape[-1],)")
    return x * torch.rsqrt(x.pow(2).mean() + eps) * weight


# --- Lab 01: data loading ------------------------------------------------------------------------

BLUR = gs.BLUR
SCRATCH = torch.empty(3, 24, 24)
augment = gs.augment          # the module-level `augment` the fast_pipeline answers call (and the harness wraps)


def _blur(x):
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), BLUR, groups=3)[0]


def augment_global_rng(image, rng):
    # draws from the global RNG: shared by every thread
    flip = bool(torch.rand(()) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand(()))
    x = torch.mul(image, gain / 255.0)
    return _blur(x.flip(-1) if flip else x)


def augment_gain_first(image, rng):
    # draws the gain before the flip: other numbers than slow_augment's
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    flip = bool(torch.rand((), generator=rng) < 0.5)
    x = torch.mul(image, gain / 255.0)
    return _blur(x.flip(-1) if flip else x)


def augment_scratch(image, rng):
    # keeps slow_augment's module-level buffer: threads overwrite each other's pixels
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    torch.mul(image, gain / 255.0, out=SCRATCH)
    return _blur(SCRATCH.flip(-1) if flip else SCRATCH).clone()


def augment_flip_height(image, rng):
    # flips the height (dim -2), not the width
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    x = torch.mul(image, gain / 255.0)
    return _blur(x.flip(-2) if flip else x)


def fast_pipeline_serial(images, workers, seed=0):
    # forgets the pool: one thread does everything
    return [augment(image, item_generator(seed, i)) for i, image in enumerate(images)]


def fast_pipeline_unbounded(images, workers, seed=0):
    # a pool of the default size, not `workers`
    with ThreadPoolExecutor() as pool:
        return list(pool.map(lambda i: augment(images[i], item_generator(seed, i)), range(len(images))))


def fast_pipeline_strided(images, workers, seed=0):
    # worker w takes items w, w + workers, ...; results concatenated per worker: out of order
    def part(w):
        return [augment(images[i], item_generator(seed, i)) for i in range(w, len(images), workers)]
    with ThreadPoolExecutor(workers) as pool:
        return [out for chunk in pool.map(part, range(workers)) for out in chunk]


def fast_pipeline_seed_zero(images, workers, seed=0):
    # seeds every item from 0, whatever `seed` says
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda i: augment(images[i], item_generator(0, i)), range(len(images))))


def fast_pipeline_one_rng(images, workers, seed=0):
    # one generator for the whole run, shared by the threads
    rng = torch.Generator().manual_seed(seed)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda image: augment(image, rng), images))


# --- Lab 02: fusion ------------------------------------------------------------------------------

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
        total, _ = gs._combo_grid([x.numel() for x in flat], block)
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


# --- Lab 03: MoE ---------------------------------------------------------------------------------

def permute_unstable(x, expert_ids, num_experts):
    # argsort without stable=True: ties in any order
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_unsorted(x, expert_ids, num_experts):
    # never sorts: tokens stay in arrival order
    flat = expert_ids.reshape(-1)
    order = torch.arange(flat.numel())
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def permute_counts_not_offsets(x, expert_ids, num_experts):
    # returns the counts per expert, not the cumulative end offsets
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).int()


def permute_int64_offsets(x, expert_ids, num_experts):
    # cumsum's int64 kept: grouped_mm wants int32
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0)


def permute_no_minlength(x, expert_ids, num_experts):
    # bincount without minlength: trailing experts with no token get no offset
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order // expert_ids.shape[1]], order, torch.bincount(flat).cumsum(0).int()


def permute_start_offsets(x, expert_ids, num_experts):
    # start offsets [0, c0, c0 + c1, ...] instead of end offsets
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return x[order // expert_ids.shape[1]], order, (counts.cumsum(0) - counts).int()


def permute_modulo(x, expert_ids, num_experts):
    # the token of slot order[i] taken as order[i] % k instead of order[i] // k
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return x[order % expert_ids.shape[1]], order, torch.bincount(flat, minlength=num_experts).cumsum(0).int()


def gemm_skips_first_expert(xs, w, offs):
    # pairs offs[e-1]:offs[e] for e >= 1 only: expert 0's rows are never computed
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    for e in range(1, len(offs)):
        out[offs[e - 1]:offs[e]] = xs[offs[e - 1]:offs[e]] @ w[e]
    return out


def gemm_off_by_one(xs, w, offs):
    # each expert starts one row after the previous expert's end
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = xs[start:end] @ w[e]
        start = end + 1
    return out


def gemm_offsets_as_counts(xs, w, offs):
    # reads offs as rows per expert
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, count in enumerate(offs.tolist()):
        out[start:start + count] = xs[start:start + count] @ w[e]
        start += count
    return out


def gemm_float32_out(xs, w, offs):
    # allocates the output in float32 whatever the inputs' dtype
    out = torch.zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = (xs[start:end] @ w[e]).float()
        start = end
    return out


def gemm_calls_grouped_mm(xs, w, offs):
    # the library call the exercise asks to write a fallback for
    return F.grouped_mm(xs, w, offs=offs)


def ffn_padded_helper(xs, params, offs):
    # moe.padded_bmm: every expert padded to the busiest one
    return moe.padded_bmm(F.gelu(moe.padded_bmm(xs, params["w_up"], offs)), params["w_down"], offs)


def ffn_padded_by_hand(xs, params, offs):
    # pads every expert's rows to the busiest count and runs one batched matmul
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).tolist()
    starts = [int(o) - c for o, c in zip(offs.tolist(), counts)]
    width = max(counts)

    def padded(x, w):
        batch = x.new_zeros(len(counts), width, x.shape[1])
        for e, (s, c) in enumerate(zip(starts, counts)):
            batch[e, :c] = x[s:s + c]
        y = batch @ w
        return torch.cat([y[e, :c] for e, c in enumerate(counts)])
    return padded(F.gelu(padded(xs, params["w_up"])), params["w_down"])


def ffn_relu(xs, params, offs):
    # ReLU instead of GELU
    return gs._fallback(torch.relu(gs._fallback(xs, params["w_up"], offs)), params["w_down"], offs)


def ffn_gelu_tanh(xs, params, offs):
    # GELU's tanh approximation instead of the exact (erf) GELU
    return gs._fallback(F.gelu(gs._fallback(xs, params["w_up"], offs), approximate="tanh"), params["w_down"], offs)


def ffn_one_expert(xs, params, offs):
    # every row through expert 0's weights
    return F.gelu(xs @ params["w_up"][0]) @ params["w_down"][0]


# --- Lab 04: the C++ custom op (kernel bodies run in a child process) ----------------------------

BODIES = {
    # forgets to multiply by up
    "silu_without_up": r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)));
  }
""",
    # sigmoid(g) * up instead of silu(g) * up
    "sigmoid_not_silu": r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(acc_t(1) / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
""",
    # computes in float, not acc_t: float64 inputs lose their precision
    "float_not_acc_t": r"""
  for (int64_t i = begin; i < end; ++i) {
    const float g = static_cast<float>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (1.0f + std::exp(-g)) * static_cast<float>(up[i]));
  }
""",
    # indexes each chunk from 0: a chunk after the first rewrites the first one's elements, not its own
    "chunk_from_zero": r"""
  for (int64_t i = 0; i < end - begin; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
""",
}


def body_source(body: str) -> str:
    return f"def silu_mul_body():\n    return {body!r}\n"


def fake_keeps_strides(gate, up):
    # empty_like keeps a transposed gate's strides; the C++ wrapper returns a contiguous tensor
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate)


def fake_no_checks(gate, up):
    # allocates without checking the inputs: torch.compile traces calls the kernel would refuse
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def fake_shape_check_only(gate, up):
    # checks the shapes, not the dtypes
    if gate.shape != up.shape:
        raise ValueError("silu_mul: gate and up must have the same shape")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def fake_default_dtype(gate, up):
    # torch.empty(shape): the default dtype (float32), not gate's
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty(gate.shape, device=gate.device)


def fake_runtime_error(gate, up):
    # raises RuntimeError, which the case does not accept as the C++ wrapper's refusal
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise RuntimeError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def backward_missing_term(ctx, grad):
    # d/dgate without the g * (1 - s) term (the derivative of sigmoid, not of silu)
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s, grad * gate * s


def backward_swapped(ctx, grad):
    # returns (d_up, d_gate): not in the schema's order
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * gate * s, grad * up * s * (1 + gate * (1 - s))


def backward_ignores_grad(ctx, grad):
    # forgets to multiply by the incoming gradient
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return up * s * (1 + gate * (1 - s)), gate * s


def backward_exp_sigmoid(ctx, grad):
    # sigmoid as exp(g) / (1 + exp(g)): inf / inf for large gates
    gate, up = ctx.saved_tensors
    s = torch.exp(gate) / (1 + torch.exp(gate))
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


def backward_calls_silu_backward(ctx, grad):
    # aten's silu_backward: the formula the exercise asks to write
    gate, up = ctx.saved_tensors
    return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


def swiglu_plain_silu(x, w_gate, w_up, w_down):
    # F.silu(...) * ...: correct values, but not the op the lab built
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def swiglu_swapped(x, w_gate, w_up, w_down):
    # gate and up swapped in the op's call
    return torch.ops.labs_ext.silu_mul(x @ w_up.T, x @ w_gate.T) @ w_down.T


def swiglu_data_dependent(x, w_gate, w_up, w_down):
    # a data-dependent Python branch: a graph break under fullgraph=True
    gate = x @ w_gate.T
    if gate.abs().max().item() > 1e6:
        gate = gate.clamp(-1e6, 1e6)
    return torch.ops.labs_ext.silu_mul(gate, x @ w_up.T) @ w_down.T


# --- Lab 05: quantization ------------------------------------------------------------------------

def quantize_per_tensor(w, bits=8):
    # one scale for the whole tensor, repeated per row
    qmax = 2 ** (bits - 1) - 1
    scale = w.abs().amax() / qmax
    return torch.clamp(torch.round(w / scale), -qmax, qmax).to(torch.int8), scale.expand(w.shape[0]).float()


def quantize_per_column(w, bits=8):
    # reduces over dim 0: one scale per input column
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=0) / qmax
    return torch.clamp(torch.round(w / scales), -qmax, qmax).to(torch.int8), scales.float()


def quantize_float_codes(w, bits=8):
    # codes left as float
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    return torch.clamp(torch.round(w / scales[:, None]), -qmax, qmax), scales.float()


def quantize_ignores_bits(w, bits=8):
    # qmax fixed at 127 whatever `bits` says
    scales = w.abs().amax(dim=1) / 127
    return torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8), scales.float()


def quantize_zero_row_nan(w, bits=8):
    # divides a zero row by its zero scale, then clamps the NaN away
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    return torch.clamp(torch.round(w / scales[:, None]), -qmax, qmax).nan_to_num(7).to(torch.int8), scales.float()


def quantize_truncates(w, bits=8):
    # .to(torch.int8) truncates towards zero: no rounding
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    q = torch.where(scales[:, None] > 0, w / scales.clamp(min=1e-30)[:, None], 0.0)
    return torch.clamp(q, -qmax, qmax).to(torch.int8), scales.float()


def int8_linear_fp32_activations(x, q, scales, bias):
    # feeds the kernel fp32 activations: correct, but the slow path
    y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), q, scales)
    y = y + bias if bias is not None else y
    return y.reshape(*x.shape[:-1], q.shape[0])


def int8_linear_dequantized(x, q, scales, bias):
    # dequantizes and runs an fp32 matmul: the int8 kernel never runs
    return F.linear(x, q.float() * scales[:, None], bias)


def int8_linear_no_reshape(x, q, scales, bias):
    # hands the kernel the 3-D input: it takes 2-D activations
    y = torch._weight_int8pack_mm(x.to(torch.bfloat16), q, scales.to(torch.bfloat16)).to(x.dtype)
    return y + bias if bias is not None else y


def int8_linear_bf16_out(x, q, scales, bias):
    # returns the kernel's bfloat16 result without casting back
    y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), q, scales.to(torch.bfloat16))
    y = y + bias.to(torch.bfloat16) if bias is not None else y
    return y.reshape(*x.shape[:-1], q.shape[0])


def int8_linear_bias_required(x, q, scales, bias):
    # adds bias unconditionally: None breaks it
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype) + bias
    return y.reshape(*x.shape[:-1], q.shape[0])


class _Int8Linear(nn.Module):
    """The lab's MyInt8Linear, on the spec's quantize_weight and int8_linear (or on `quantize`)."""
    def __init__(self, linear, quantize=gs._quantize_weight):
        super().__init__()
        q, scales = quantize(linear.weight.detach())
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        return gs._int8_linear(x, self.q, self.scales, self.bias)


class _FakeQuantLinear(nn.Module):
    """Rounds the weight to int8 levels but stores it back as float32."""
    def __init__(self, linear):
        super().__init__()
        q, scales = gs._quantize_weight(linear.weight.detach())
        self.register_buffer("weight", q.float() * scales[:, None])
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _swap(module, make):
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(module, name, make(child))
        else:
            _swap(child, make)
    return module


def quantize_model_top_level(model):
    # replaces the direct children only: Linears inside sub-modules are left
    model = copy.deepcopy(model)
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, _Int8Linear(child))
    return model


def quantize_model_in_place(model):
    # swaps the caller's model: the fp32 reference is gone
    return _swap(model, _Int8Linear)


def quantize_model_per_tensor(model):
    # per-tensor scales: rows 1000x apart round to zero
    return _swap(copy.deepcopy(model), lambda lin: _Int8Linear(lin, quantize_per_tensor))


def quantize_model_float_weights(model):
    # fake quantization: int8 levels stored as float32, no smaller than before
    return _swap(copy.deepcopy(model), _FakeQuantLinear)


# --- Lab 06: attention ---------------------------------------------------------------------------

def key_mask_true_on_padding(lengths, max_len):
    # True marks padding: SDPA keeps the True keys
    pad = torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None]
    return pad[:, None, None, :]


def key_mask_2d(lengths, max_len):
    # (batch, max_len): does not broadcast against (batch, heads, queries, keys)
    return torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]


def key_mask_float(lengths, max_len):
    # a float 0 / -inf mask: SDPA adds it, but it is not the boolean mask asked for
    keep = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]
    return torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))[:, None, None, :]


def key_mask_off_by_one(lengths, max_len):
    # position <= length: one padding key kept
    keep = torch.arange(max_len)[None, :] <= torch.tensor(lengths)[:, None]
    return keep[:, None, None, :]


def key_mask_queries(lengths, max_len):
    # masks the queries (rows), not the keys
    keep = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]
    return keep[:, None, :, None]


def pack_int64(seqs):
    # cumsum's int64 offsets: varlen_attn wants int32
    lengths = torch.tensor([s.shape[0] for s in seqs])
    return torch.cat(seqs), torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), int(lengths.max())


def pack_no_leading_zero(seqs):
    # N offsets (the ends), without the leading 0
    lengths = torch.tensor([s.shape[0] for s in seqs])
    return torch.cat(seqs), lengths.cumsum(0).int(), int(lengths.max())


def pack_tensor_max(seqs):
    # the longest length as a 0-d tensor, not a Python int
    lengths = torch.tensor([s.shape[0] for s in seqs])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return torch.cat(seqs), cu, lengths.max()


def pack_total_as_max(seqs):
    # the total number of tokens as max_len
    lengths = torch.tensor([s.shape[0] for s in seqs])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return torch.cat(seqs), cu, int(lengths.sum())


class _Record(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, name):
        super().__init__()
        self.name, self.names = name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(self.name(func))
        return func(*args, **(kwargs or {}))


def ops_drops_kwargs(q, k, v, **kwargs):
    # records correctly but calls SDPA without the keyword arguments
    with _Record(lambda f: f.name()) as rec:
        F.scaled_dot_product_attention(q, k, v)
    return rec.names


def ops_str_names(q, k, v, **kwargs):
    # str(func) ("aten.bmm.default") instead of func.name() ("aten::bmm")
    with _Record(str) as rec:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    return rec.names


def ops_torch_function_mode(q, k, v, **kwargs):
    # a TorchFunctionMode: sees the Python call, not the aten ops under it
    names = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))
    with Record():
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    return names


def bucketed_unsorted(seqs, n_buckets):
    # splits in the input order: buckets mix short and long sequences
    outs = []
    for bucket in torch.arange(len(seqs)).chunk(n_buckets):
        outs += attention.padded_attention([seqs[i] for i in bucket.tolist()])
    return outs


def bucketed_sorted_order(seqs, n_buckets):
    # returns the outputs in sorted order, not the input's
    ordered = sorted(seqs, key=lambda s: s.shape[0])
    outs = []
    for bucket in torch.arange(len(ordered)).chunk(n_buckets):
        outs += attention.padded_attention([ordered[i] for i in bucket.tolist()])
    return outs


def bucketed_floor_size(seqs, n_buckets):
    # bucket size len // n_buckets: the remainder is dropped
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    size = max(1, len(seqs) // n_buckets)
    outs = [None] * len(seqs)
    for b in range(n_buckets):
        idx = order[b * size:(b + 1) * size]
        if idx:
            for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
                outs[i] = o
    return outs


def bucketed_empty_buckets(seqs, n_buckets):
    # even split points: with fewer sequences than buckets some buckets are empty, and still run
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs = [None] * len(seqs)
    for b in range(n_buckets):
        idx = order[b * len(seqs) // n_buckets:(b + 1) * len(seqs) // n_buckets]
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs


# --- Lab 07: memory ------------------------------------------------------------------------------

def _nbytes(ps):
    return sum(p.numel() * p.element_size() for p in ps)


def predicted_one_adam_state(model):
    # Adam keeps two moments per parameter; counts one
    ps = [p for p in model.parameters() if p.requires_grad]
    return {"parameter": _nbytes(model.parameters()), "gradient": _nbytes(ps),
            "optimizer_state": _nbytes(ps) + 4 * len(ps)}


def predicted_ignores_frozen(model):
    # gradients and optimizer state for frozen parameters too
    ps = list(model.parameters())
    return {"parameter": _nbytes(ps), "gradient": _nbytes(ps), "optimizer_state": 2 * _nbytes(ps) + 4 * len(ps)}


def predicted_no_step(model):
    # forgets Adam's 4-byte step per tensor
    ps = [p for p in model.parameters() if p.requires_grad]
    return {"parameter": _nbytes(model.parameters()), "gradient": _nbytes(ps), "optimizer_state": 2 * _nbytes(ps)}


def predicted_four_bytes(model):
    # 4 bytes per element whatever the dtype
    ps = [p for p in model.parameters() if p.requires_grad]
    size = lambda group: sum(4 * p.numel() for p in group)   # noqa: E731
    return {"parameter": size(model.parameters()), "gradient": size(ps), "optimizer_state": 2 * size(ps) + 4 * len(ps)}


def at_peak_last_max(tl):
    # the LAST index of the maximum (>= in a scan)
    totals = [sum(col) for col in zip(*tl["bytes"].values())]
    i = max(range(len(totals)), key=lambda j: (totals[j], j))
    return tl["times_us"][i], {name: values[i] for name, values in tl["bytes"].items()}


def at_peak_per_category(tl):
    # each category's own maximum, not the values at the moment of the total's peak
    totals = [sum(col) for col in zip(*tl["bytes"].values())]
    i = totals.index(max(totals))
    return tl["times_us"][i], {name: max(values) for name, values in tl["bytes"].items()}


def at_peak_index(tl):
    # the index of the peak instead of its time
    totals = [sum(col) for col in zip(*tl["bytes"].values())]
    i = totals.index(max(totals))
    return i, {name: values[i] for name, values in tl["bytes"].items()}


def accumulate_not_divided(model, x, y, micro):
    # sums the chunks' mean losses: gradients `micro` times too large
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        F.mse_loss(model(xs), ys).backward()


def accumulate_divided_by_micro(model, x, y, micro):
    # divides by the number of chunks: right only when the chunks are equal
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (F.mse_loss(model(xs), ys) / micro).backward()


def accumulate_stale(model, x, y, micro):
    # never zeroes the gradients: an earlier step's are added in
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


def accumulate_zero_in_loop(model, x, y, micro):
    # zeroes the gradients before every chunk: only the last chunk's remain
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        model.zero_grad(set_to_none=True)
        (F.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


# --- Lab 08: debugging ---------------------------------------------------------------------------

def first_difference_absolute(a, b, rtol=0.0):
    # |p - q| > rtol: an absolute tolerance
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) > rtol for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_first_hash(a, b, rtol=0.0):
    # compares only each op's first hash
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if abs(ha[0] - hb[0]) > rtol * max(abs(ha[0]), abs(hb[0])):
            return i
    return None


def first_difference_no_name_check(a, b, rtol=0.0):
    # never compares the op names
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_zipped_names(a, b, rtol=0.0):
    # compares the names pairwise with zip: a shorter trace passes
    if any(na != nb for (na, _), (nb, _) in zip(a, b)):
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_ge(a, b, rtol=0.0):
    # >= instead of >: equal hashes "differ" when rtol is 0
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) >= rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def normalize_eps_outside(v, eps=1e-12):
    # v / (norm + eps): eps added, not used as a lower bound
    return v / (torch.linalg.vector_norm(v, dim=-1, keepdim=True) + eps)


def normalize_no_eps(v, eps=1e-12):
    # no eps: 0 / 0 on a zero row
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)


def normalize_manual_sqrt(v, eps=1e-12):
    # sqrt of the sum of squares, clamped: sqrt's gradient at 0 is inf, times 0 is NaN
    return v / torch.sqrt((v * v).sum(-1, keepdim=True)).clamp_min(eps)


def normalize_eps_under_sqrt(v, eps=1e-12):
    # eps under the square root: a different function near zero
    return v / torch.sqrt((v * v).sum(-1, keepdim=True) + eps)


def normalize_calls_torch(v, eps=1e-12):
    # F.normalize: the function the exercise asks to write
    return F.normalize(v, dim=-1, eps=eps)


def prepare_nothing(batch):
    # marks no dimension dynamic: the second size recompiles
    return batch


def prepare_mark_dynamic(batch):
    # mark_dynamic still specialises size 1
    torch._dynamo.mark_dynamic(batch, 0)
    return batch


def prepare_mark_dynamic_min1(batch):
    # mark_dynamic with min=1: a batch of 1 is outside what dynamo allows a dynamic size
    torch._dynamo.mark_dynamic(batch, 0, min=1, max=512)
    return batch


def prepare_wrong_dim(batch):
    # marks the feature dimension, not the batch
    torch._dynamo.mark_dynamic(batch, 1)
    return batch


def export_static(module, example, path):
    # no dynamic_shapes: the batch size is the example's
    torch.export.save(torch.export.export(module, (example,)), path)
    return torch.export.load(path).module()


def export_program_not_module(module, example, path):
    # returns the ExportedProgram, which cannot be called
    batch = torch.export.Dim("batch", min=1, max=512)
    torch.export.save(torch.export.export(module, (example,), dynamic_shapes=({0: batch},)), path)
    return torch.export.load(path)


def export_torchscript(module, example, path):
    # TorchScript: deprecated, and what the exercise replaces
    torch.jit.save(torch.jit.trace(module, example), path)
    return torch.jit.load(path)


# --- Lab 09: migration ---------------------------------------------------------------------------

def _medians(a, b, n_boot, seed, same_index=False):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, len(a), (n_boot, len(a)))
    ib = ia if same_index else rng.integers(0, len(b), (n_boot, len(b)))
    return a, b, np.median(a[ia], axis=1), np.median(b[ib], axis=1)


def _interval_answer(percentiles=(2.5, 97.5), invert=False, stat=np.median, same_index=False, gain_of_draws=False):
    """median_gain_interval with one thing changed (the right answer with the defaults)."""
    def median_gain_interval(samples_a, samples_b, better, n_boot=2000, seed=0):
        a, b, ma, mb = _medians(samples_a, samples_b, n_boot, seed, same_index)
        lower = (better == "lower") != invert
        gains = ma / mb if lower else mb / ma
        gain = stat(a) / stat(b) if lower else stat(b) / stat(a)
        if gain_of_draws:
            gain = np.median(gains)
        low, high = np.percentile(gains, percentiles)
        return float(gain), float(low), float(high)
    return median_gain_interval


interval_inverted = _interval_answer(invert=True)              # B / A for a time, A / B for a throughput
interval_mean_gain = _interval_answer(stat=np.mean)            # the gain of the means, not the medians
interval_gain_of_draws = _interval_answer(gain_of_draws=True)  # the gain as the median of the resampled gains
interval_same_index = _interval_answer(same_index=True)        # resamples B with A's indices (len(A) draws)
interval_90 = _interval_answer(percentiles=(5, 95))            # the 5th and 95th percentiles: a 90% interval


def interval_no_replacement(samples_a, samples_b, better, n_boot=2000, seed=0):
    # resamples by permutation (without replacement): every draw has the same median
    a, b = np.asarray(samples_a, dtype=float), np.asarray(samples_b, dtype=float)
    rng = np.random.default_rng(seed)
    ma = np.array([np.median(rng.permutation(a)) for _ in range(n_boot)])
    mb = np.array([np.median(rng.permutation(b)) for _ in range(n_boot)])
    gains = ma / mb if better == "lower" else mb / ma
    low, high = np.percentile(gains, [2.5, 97.5])
    return float(gains[0]), float(low), float(high)


def interval_calls_stats(samples_a, samples_b, better, n_boot=2000, seed=0):
    # the helper the exercise asks to write
    from helpers.validation import stats
    r = stats.bootstrap_gain(samples_a, samples_b, better, n_boot=n_boot, seed=seed)
    return r["gain"], r["low"], r["high"]


def verdict_interval_only(gain, low, high):
    # the interval alone: a 1% change with a tight interval is flagged
    return "regression" if high < 1 else "improvement" if low > 1 else "within noise"


def verdict_gain_only(gain, low, high):
    # the gain alone: a change the interval does not exclude is flagged
    from helpers.validation import stats
    return ("regression" if gain < 1 / (1 + stats.MIN_CHANGE) else
            "improvement" if gain > 1 + stats.MIN_CHANGE else "within noise")


def verdict_one_minus(gain, low, high):
    # 1 - MIN_CHANGE for a regression instead of 1 / (1 + MIN_CHANGE)
    from helpers.validation import stats
    if high < 1 and gain < 1 - stats.MIN_CHANGE:
        return "regression"
    if low > 1 and gain > 1 + stats.MIN_CHANGE:
        return "improvement"
    return "within noise"


def verdict_low_for_regression(gain, low, high):
    # a regression when the interval's LOW end is below 1
    from helpers.validation import stats
    if low < 1 and gain < 1 / (1 + stats.MIN_CHANGE):
        return "regression"
    if low > 1 and gain > 1 + stats.MIN_CHANGE:
        return "improvement"
    return "within noise"


@functools.lru_cache(maxsize=None)
def _typed_migration():
    return gs._read_migration(*gs._recorded_matrix())


def read_migration_typed(run_a, run_b, report):
    # the numbers typed in from the recorded report, whatever report it is given
    return copy.deepcopy(_typed_migration())


def read_migration_b_first(run_a, run_b, report):
    # every pair as (B, A)
    answers = gs._read_migration(run_a, run_b, report)
    return {k: tuple(reversed(v)) if k.endswith(("_path", "_accuracy")) else v for k, v in answers.items()}


def read_migration_loop_row(run_a, run_b, report):
    # the DLRM step read from the loop_step_time row
    answers = gs._read_migration(run_a, run_b, report)
    row = next(r for r in report["rows"] if (r["workload"], r["figure"]) == ("dlrm_moe_train", "loop_step_time"))
    return {**answers, "dlrm_step": (row["gain"], row["low"], row["high"], row["status"])}


def read_migration_no_regressions(run_a, run_b, report):
    # "regressions": [] typed in, as the recorded report has none
    return {**gs._read_migration(run_a, run_b, report), "regressions": []}


def find_drift_first_changed(report):
    # the first row whose outputs changed at all: "within tolerance" is not a drift
    row = next(n for n in report["numerics"] if n["status"] != "identical")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}


def find_drift_typed(report):
    # the seed-0 answer typed in
    return {"workload": "dlrm_moe_train", "output": "logits", "max_rel_diff": 5.000026723224887e-04}


def find_drift_status_too(report):
    # returns the whole row
    return dict(next(n for n in report["numerics"] if n["status"] == "drift"))


# --- The table: (lab, function, wrong answer, the case it fails, text of that case's hint) -------

@dataclass(frozen=True)
class Wrong:
    lab: str
    function: str
    name: str                   # the id's last part
    fn: object                  # the wrong answer (a callable; for silu_mul_body, the C++ body)
    case: str | None            # the case that must fail (None: any; only with `accepts`)
    hint: str                   # a substring of that case's hint the feedback must contain
    accepts: str | None = None  # why the spec accepts it (the test is then an xfail)
    known: str | None = None    # another known shortfall: the case meant for it passes, or its hint is lost
    slow: bool = False

    @property
    def id(self):
        return f"{self.lab}-{self.function}-{self.name}"


L00, L01, L02, L03, L04, L05, L06, L07, L08, L09 = (
    "00_warmup_lab", "01_data_loading_lab", "02_fusion_lab", "03_moe_lab", "04_custom_op_lab",
    "05_quantization_lab", "06_attention_lab", "07_memory_lab", "08_debugging_lab", "09_migration_lab")

# judge_case compares through helpers.checks.check_close / check_equal, whose type, shape and dtype
# checks (check_tensor) fail with their own generic hint and drop the case's
HINT_DROPPED = ("hint dropped: a wrong type, shape or dtype fails in helpers.checks.check_tensor, whose "
                "generic hint replaces the case's")

WRONG = [
    Wrong(L00, "softmax", "no-max", softmax_no_max, "huge values (1e4) do not overflow", "subtract the maximum first"),
    Wrong(L00, "softmax", "no-max-visible", softmax_no_max, "large values, last dim", "subtract x.amax"),
    Wrong(L00, "softmax", "last-dim-only", softmax_last_dim_only, "along dim 0", "use the dim argument"),
    Wrong(L00, "softmax", "global-max", softmax_global_max, "huge values (1e4) do not overflow",
          "subtract the maximum first"),
    Wrong(L00, "softmax", "float32", softmax_float32, "float64 keeps its dtype", "do not convert to float32"),
    Wrong(L00, "softmax", "calls-torch", softmax_calls_torch, "large values, last dim", "subtract x.amax"),
    Wrong(L00, "rms_norm", "no-eps", rms_norm_no_eps, "eps is used", "add eps inside the square root"),
    Wrong(L00, "rms_norm", "eps-outside-sqrt", rms_norm_eps_outside, "eps is used", "add eps inside the square root"),
    Wrong(L00, "rms_norm", "no-weight-check", rms_norm_no_check, "a mismatched weight is rejected",
          "compare weight.shape with x.shape[-1:]"),
    Wrong(L00, "rms_norm", "vague-error", rms_norm_vague_error, "a mismatched weight is rejected", MATCH_HINT),
    Wrong(L00, "rms_norm", "whole-tensor-mean", rms_norm_whole_tensor, "values", "mean(x**2 over the last dim)"),

    Wrong(L01, "augment", "global-rng", augment_global_rng, "serially, equals slow_augment seeded per item",
          "both with generator=rng"),
    Wrong(L01, "augment", "gain-first", augment_gain_first, "serially, equals slow_augment seeded per item",
          "draw flip first, then gain"),
    Wrong(L01, "augment", "scratch-buffer", augment_scratch, "writes into no module-level tensor", "never out=SCRATCH"),
    Wrong(L01, "augment", "flips-height", augment_flip_height, "serially, equals slow_augment seeded per item",
          "multiply by gain / 255, flip, pad, blur"),
    Wrong(L01, "fast_pipeline", "no-pool", fast_pipeline_serial,
          "at most `workers` calls at once, on more than one thread", "ThreadPoolExecutor(max_workers=workers)"),
    Wrong(L01, "fast_pipeline", "unbounded-pool", fast_pipeline_unbounded,
          "at most `workers` calls at once, on more than one thread", "never more threads than workers"),
    Wrong(L01, "fast_pipeline", "strided-split", fast_pipeline_strided, "equals the serial reference, in order",
          "keep the input order"),
    Wrong(L01, "fast_pipeline", "seed-ignored", fast_pipeline_seed_zero, "another seed", "pass seed to item_generator"),
    Wrong(L01, "fast_pipeline", "one-shared-rng", fast_pipeline_one_rng, "equals the serial reference, in order",
          "seed item i with data.item_generator(seed, i)"),

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
    Wrong(L02, "predicted_kernel_functions", "gpu-habits", predicted_gpu_habits, "the four functions",
          "puts consecutive loops into one function", slow=True),
    Wrong(L02, "predicted_kernel_functions", "matmul-fuses", predicted_matmul_fuses, "the four functions",
          "only a library call (extern_kernels.mm) splits them", slow=True),

    Wrong(L03, "permute_tokens", "unstable", permute_unstable, "12 tokens, k=2, expert 1 gets none",
          "torch.argsort(flat, stable=True)"),
    Wrong(L03, "permute_tokens", "unsorted", permute_unsorted, "12 tokens, k=2, expert 1 gets none",
          "torch.argsort(flat, stable=True)"),
    Wrong(L03, "permute_tokens", "counts-not-offsets", permute_counts_not_offsets,
          "12 tokens, k=2, expert 1 gets none", "cumulative END offsets"),
    Wrong(L03, "permute_tokens", "int64-offsets", permute_int64_offsets, "12 tokens, k=2, expert 1 gets none",
          "offs: int32"),
    Wrong(L03, "permute_tokens", "no-minlength", permute_no_minlength, "trailing experts with no tokens",
          "bincount minlength"),
    Wrong(L03, "permute_tokens", "start-offsets", permute_start_offsets, "12 tokens, k=2, expert 1 gets none",
          "cumulative END offsets"),
    Wrong(L03, "permute_tokens", "modulo-k", permute_modulo, "12 tokens, k=2, expert 1 gets none",
          "xs: token order[i] // k"),
    Wrong(L03, "fallback_grouped_gemm", "skips-expert-0", gemm_skips_first_expert,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "the first starts at 0"),
    Wrong(L03, "fallback_grouped_gemm", "off-by-one", gemm_off_by_one,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "expert e owns rows offs[e-1]:offs[e]"),
    Wrong(L03, "fallback_grouped_gemm", "offsets-as-counts", gemm_offsets_as_counts,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "expert e owns rows offs[e-1]:offs[e]"),
    Wrong(L03, "fallback_grouped_gemm", "float32-output", gemm_float32_out,
          "6 experts, counts [18, 8, 5, 4, 3, 2], torch.bfloat16", "keep the input's dtype"),
    Wrong(L03, "fallback_grouped_gemm", "calls-grouped-mm", gemm_calls_grouped_mm,
          "4 experts, counts [10, 10, 10, 10], torch.float32", "an empty slice is fine"),
    Wrong(L03, "expert_ffn", "padded-helper", ffn_padded_helper, "4 experts, counts [47, 11, 4, 2]", "no padding"),
    Wrong(L03, "expert_ffn", "padded-by-hand", ffn_padded_by_hand, "4 experts, counts [47, 11, 4, 2]", "no padding"),
    Wrong(L03, "expert_ffn", "relu", ffn_relu, "4 experts, counts [47, 11, 4, 2]", "up-projection, GELU"),
    Wrong(L03, "expert_ffn", "gelu-tanh", ffn_gelu_tanh, "4 experts, counts [47, 11, 4, 2]", "GELU"),
    Wrong(L03, "expert_ffn", "one-expert", ffn_one_expert, "4 experts, counts [47, 11, 4, 2]",
          "each expert on its own rows"),

    Wrong(L04, "silu_mul_body", "silu-without-up", BODIES["silu_without_up"], "shape (7,), torch.float32",
          "compute in acc_t", slow=True),
    Wrong(L04, "silu_mul_body", "sigmoid-not-silu", BODIES["sigmoid_not_silu"], "shape (7,), torch.float32",
          "compute in acc_t", slow=True),
    Wrong(L04, "silu_mul_body", "float-not-acc-t", BODIES["float_not_acc_t"], "shape (3, 33), torch.float64",
          "compute in acc_t", slow=True),
    Wrong(L04, "silu_mul_body", "chunk-from-zero", BODIES["chunk_from_zero"], "shape (4099,), torch.float32",
          "only its chunk [begin, end)", slow=True),
    Wrong(L04, "silu_mul_fake", "keeps-strides", fake_keeps_strides, "a transposed gate gives a contiguous output",
          "empty_like copies gate's strides"),
    Wrong(L04, "silu_mul_fake", "no-checks", fake_no_checks, "different shapes are rejected",
          "raise ValueError when the shapes or the dtypes differ"),
    Wrong(L04, "silu_mul_fake", "shape-check-only", fake_shape_check_only, "different dtypes are rejected",
          "raise ValueError when the shapes or the dtypes differ"),
    Wrong(L04, "silu_mul_fake", "default-dtype", fake_default_dtype, "3-D bfloat16",
          "a contiguous tensor of gate's shape and dtype"),
    Wrong(L04, "silu_mul_fake", "runtime-error", fake_runtime_error, "different shapes are rejected",
          "raise ValueError"),
    Wrong(L04, "backward", "missing-term", backward_missing_term, "gradients of gate and up",
          "d/dgate is the product rule on g * s"),
    Wrong(L04, "backward", "swapped", backward_swapped, "gradients of gate and up", "in schema order"),
    Wrong(L04, "backward", "ignores-grad", backward_ignores_grad, "gradients of gate and up", "multiply both by grad"),
    Wrong(L04, "backward", "exp-sigmoid", backward_exp_sigmoid, "large gates (no overflow)", "s = sigmoid(g)"),
    Wrong(L04, "backward", "calls-silu-backward", backward_calls_silu_backward, "gradients of gate and up",
          "d/dgate"),
    Wrong(L04, "swiglu_mlp", "plain-silu", swiglu_plain_silu, "calls labs_ext.silu_mul",
          "call torch.ops.labs_ext.silu_mul"),
    Wrong(L04, "swiglu_mlp", "gate-up-swapped", swiglu_swapped, "values", "silu_mul(x @ w_gate.T, x @ w_up.T)"),
    Wrong(L04, "swiglu_mlp", "graph-break", swiglu_data_dependent,
          "compiled with fullgraph=True: values and gradients", "a graph break"),

    Wrong(L05, "quantize_weight", "per-tensor", quantize_per_tensor, "one fp32 scale per row",
          "one value per output row"),
    Wrong(L05, "quantize_weight", "per-column", quantize_per_column, "one fp32 scale per row", "reduce over the inputs"),
    Wrong(L05, "quantize_weight", "float-codes", quantize_float_codes, "codes are torch.int8", ".to(torch.int8)"),
    Wrong(L05, "quantize_weight", "ignores-bits", quantize_ignores_bits, "bits=4: codes in [-7, 7]",
          "qmax = 2**(bits-1) - 1"),
    Wrong(L05, "quantize_weight", "zero-row", quantize_zero_row_nan, "a row of zeros: scale 0, codes 0, no NaN",
          "do not divide 0 by 0"),
    Wrong(L05, "quantize_weight", "truncates", quantize_truncates, "codes are rounded, not truncated",
          "round(w / scales[:, None])"),
    Wrong(L05, "int8_linear", "fp32-activations", int8_linear_fp32_activations,
          "the kernel gets bfloat16 activations (the fast path on CPU)", "fed fp32 activations"),
    Wrong(L05, "int8_linear", "dequantized-matmul", int8_linear_dequantized,
          "the kernel gets bfloat16 activations (the fast path on CPU)", "torch._weight_int8pack_mm"),
    Wrong(L05, "int8_linear", "no-reshape", int8_linear_no_reshape, "values (3-D input, bias)",
          "reshape x to 2-D"),
    Wrong(L05, "int8_linear", "bf16-output", int8_linear_bf16_out, "output keeps the input's dtype",
          "cast back with .to(x.dtype)"),
    Wrong(L05, "int8_linear", "bias-required", int8_linear_bias_required, "no bias", "bias may be None"),
    Wrong(L05, "quantize_model", "no-recursion", quantize_model_top_level, "a nested model: the Linears one level down",
          "walk named_children() recursively"),
    Wrong(L05, "quantize_model", "in-place", quantize_model_in_place, "the fp32 model is left untouched",
          "copy.deepcopy(model) first"),
    Wrong(L05, "quantize_model", "per-tensor", quantize_model_per_tensor, "argmax agrees with fp32 on 97% of inputs",
          "one scale per output row"),
    Wrong(L05, "quantize_model", "float-weights", quantize_model_float_weights, "at least 3x smaller",
          "not a float copy of the weight"),

    Wrong(L06, "key_mask", "true-on-padding", key_mask_true_on_padding, "a boolean mask, True on real keys",
          "True where the key is a real token"),
    Wrong(L06, "key_mask", "2d-mask", key_mask_2d, "a boolean mask, True on real keys",
          "shape (batch, 1, 1, max_len) broadcasts"),
    Wrong(L06, "key_mask", "float-mask", key_mask_float, "a boolean mask, True on real keys", "True where the key"),
    Wrong(L06, "key_mask", "off-by-one", key_mask_off_by_one, "a boolean mask, True on real keys",
          "position < length"),
    Wrong(L06, "key_mask", "masks-queries", key_mask_queries, "a boolean mask, True on real keys",
          "shape (batch, 1, 1, max_len)"),
    Wrong(L06, "pack", "int64-offsets", pack_int64, "three sequences", "as torch.int32"),
    Wrong(L06, "pack", "no-leading-zero", pack_no_leading_zero, "three sequences", "offsets [0, n0, n0+n1, ...]"),
    Wrong(L06, "pack", "tensor-max-len", pack_tensor_max, "three sequences", "the longest length as a Python int"),
    Wrong(L06, "pack", "total-as-max", pack_total_as_max, "three sequences", "the longest length"),
    Wrong(L06, "ops_dispatched", "drops-kwargs", ops_drops_kwargs, "dropout", "pass every keyword to SDPA"),
    Wrong(L06, "ops_dispatched", "str-names", ops_str_names, "the default choice", "append func.name()"),
    Wrong(L06, "ops_dispatched", "torch-function-mode", ops_torch_function_mode, "the default choice",
          "in __torch_dispatch__"),
    Wrong(L06, "bucketed_attention", "unsorted", bucketed_unsorted, "each bucket holds consecutive lengths",
          "sort the sequences by length"),
    Wrong(L06, "bucketed_attention", "sorted-output", bucketed_sorted_order, "values, in the original order",
          "put its output back there"),
    Wrong(L06, "bucketed_attention", "floor-size", bucketed_floor_size, "3 buckets hold consecutive lengths",
          "split the sorted list into exactly n_buckets runs"),
    Wrong(L06, "bucketed_attention", "empty-buckets", bucketed_empty_buckets, "more buckets than sequences",
          "some buckets are empty: skip them"),

    Wrong(L07, "predicted_bytes", "one-adam-state", predicted_one_adam_state, "float32, every layer trainable",
          "Adam's two moments"),
    Wrong(L07, "predicted_bytes", "ignores-frozen", predicted_ignores_frozen, "the first 2 layers frozen",
          "only for trainable parameters (requires_grad)"),
    Wrong(L07, "predicted_bytes", "no-step", predicted_no_step, "float32, every layer trainable",
          "plus a 4-byte float32 step per trainable tensor"),
    Wrong(L07, "predicted_bytes", "four-bytes", predicted_four_bytes, "bfloat16 parameters", "in their dtype"),
    Wrong(L07, "at_peak", "last-max", at_peak_last_max, "a tie: the first moment", "take the FIRST index"),
    Wrong(L07, "at_peak", "per-category-max", at_peak_per_category, "a random timeline", "report every category there"),
    Wrong(L07, "at_peak", "index-not-time", at_peak_index, "a random timeline", "take the FIRST index of the maximum"),
    Wrong(L07, "accumulate_grads", "not-divided", accumulate_not_divided, "4 equal chunks",
          "weight each chunk's loss by its share"),
    Wrong(L07, "accumulate_grads", "divided-by-micro", accumulate_divided_by_micro,
          "a batch that 4 does not divide (10 rows)", "(chunk rows / batch rows)"),
    Wrong(L07, "accumulate_grads", "stale-grads", accumulate_stale, "gradients left from an earlier step are not added",
          "model.zero_grad(set_to_none=True) before the first chunk"),
    Wrong(L07, "accumulate_grads", "zero-in-loop", accumulate_zero_in_loop, "4 equal chunks",
          "weight each chunk's loss"),

    Wrong(L08, "first_difference", "absolute-tolerance", first_difference_absolute,
          "rtol is relative, not absolute (hashes near 1e6)",
          "differ means |p - q| > rtol * max(|p|, |q|)"),
    Wrong(L08, "first_difference", "first-hash-only", first_difference_first_hash, "only the second hash differs",
          "check every hash of an op"),
    Wrong(L08, "first_difference", "no-name-check", first_difference_no_name_check, "different programs are refused",
          "compare the op names of the two traces first"),
    Wrong(L08, "first_difference", "zipped-names", first_difference_zipped_names,
          "traces of different lengths are refused", "compare the whole list of names"),
    Wrong(L08, "first_difference", "ge-not-gt", first_difference_ge, "identical traces", "return None"),
    Wrong(L08, "safe_normalize", "eps-outside", normalize_eps_outside, "a larger eps",
          "use eps as the norm's lower bound"),
    Wrong(L08, "safe_normalize", "no-eps", normalize_no_eps, "values", "v / max(norm(v, last dim), eps)"),
    Wrong(L08, "safe_normalize", "manual-sqrt", normalize_manual_sqrt, "finite gradients, a zero row included",
          "clamp the norm from below"),
    Wrong(L08, "safe_normalize", "eps-under-sqrt", normalize_eps_under_sqrt, "finite gradients, a zero row included",
          "instead of adding eps under a square root"),
    Wrong(L08, "safe_normalize", "calls-normalize", normalize_calls_torch, "values", "v / max(norm"),
    Wrong(L08, "prepare", "marks-nothing", prepare_nothing, "no recompiles for sizes 8, 9, 100, 3",
          "mark the batch dimension (0) dynamic"),
    Wrong(L08, "prepare", "mark-dynamic", prepare_mark_dynamic, "no recompiles (and no error) for sizes 8, 1, 512, 2",
          "mark_unbacked(batch, 0)"),
    Wrong(L08, "prepare", "mark-dynamic-min1", prepare_mark_dynamic_min1,
          "no recompiles (and no error) for sizes 8, 1, 512, 2", "or raises with min=1"),
    Wrong(L08, "prepare", "wrong-dim", prepare_wrong_dim, "no recompiles for sizes 8, 9, 100, 3",
          "mark the batch dimension (0)"),
    Wrong(L08, "export_and_reload", "no-dynamic-shapes", export_static, "other batch sizes: 5, 1, 512",
          "dynamic_shapes=({0: torch.export.Dim('batch', min=1, max=512)},)"),
    Wrong(L08, "export_and_reload", "program-not-module", export_program_not_module, "the example's batch",
          "export.load(path).module()"),
    Wrong(L08, "export_and_reload", "torchscript", export_torchscript, "the example's batch", "export.export(module"),
    Wrong(L09, "median_gain_interval", "inverted-gain", interval_inverted, "times, B 20% slower: the gain",
          "median(A) / median(B) for a time"),
    Wrong(L09, "median_gain_interval", "mean-gain", interval_mean_gain, "times, B 20% slower: the gain",
          "gain = median(A) / median(B)"),
    Wrong(L09, "median_gain_interval", "gain-of-draws", interval_gain_of_draws, "times, B 20% slower: the gain",
          "gain = median(A) / median(B)"),
    Wrong(L09, "median_gain_interval", "same-indices", interval_same_index, "times, B 20% slower: the 95% interval",
          "len(A) draws from A, len(B) from B"),
    Wrong(L09, "median_gain_interval", "no-replacement", interval_no_replacement,
          "times, B 20% slower: the 95% interval", "resample each side with replacement"),
    Wrong(L09, "median_gain_interval", "calls-bootstrap-gain", interval_calls_stats, "times, B 20% slower: the gain",
          "gain = median(A) / median(B)"),
    Wrong(L09, "median_gain_interval", "90-percent", interval_90, "400 samples a side, n_boot=20000: a 95% interval", "the 2.5th and 97.5th percentiles"),
    Wrong(L09, "verdict", "interval-only", verdict_interval_only, "gain 0.990, interval [0.985, 0.995]",
          "the gain below 1 / (1 + 0.02)"),
    Wrong(L09, "verdict", "gain-only", verdict_gain_only, "gain 0.900, interval [0.850, 1.010]",
          "the whole interval below 1"),
    Wrong(L09, "verdict", "one-minus-min-change", verdict_one_minus, "gain 0.980, interval [0.970, 0.990]", "1 / (1 + 0.02)"),
    Wrong(L09, "verdict", "low-end-for-regression", verdict_low_for_regression, "gain 0.900, interval [0.850, 1.010]",
          "the whole interval below 1"),
    Wrong(L09, "read_migration", "typed-numbers", read_migration_typed, "A and B the other way round",
          "each pair is (from the first run, from the second run)"),
    Wrong(L09, "read_migration", "b-first", read_migration_b_first, "the recorded 2.9.1 -> 2.10.0 run",
          "read each answer from run_a, run_b and report"),
    Wrong(L09, "read_migration", "loop-row", read_migration_loop_row, "the recorded 2.9.1 -> 2.10.0 run",
          "read each answer from run_a, run_b and report"),
    Wrong(L09, "read_migration", "no-regressions-typed", read_migration_no_regressions, "a report with regressions",
          "every row whose status is 'regression'"),
    Wrong(L09, "find_drift", "first-changed-row", find_drift_first_changed, "the injected change, seed 5", "a changed hash alone is not a drift"),
    Wrong(L09, "find_drift", "typed-answer", find_drift_typed, "the injected change, seed 5", "return the numerics row whose status is 'drift'"),
    Wrong(L09, "find_drift", "whole-row", find_drift_status_too, "the injected change, seed 0",
          "with its max_rel_diff"),
]

CHILD_EXERCISES = {(L04, "silu_mul_body")}        # their cases build C++: run in a child process


def _param(w: Wrong):
    marks = [pytest.mark.slow] if w.slow else []
    if w.accepts:
        marks.append(pytest.mark.xfail(strict=True, reason=f"spec accepts: {w.accepts}"))
    return pytest.param(w, id=w.id, marks=marks)


@pytest.fixture(scope="module")
def silu_mul_registered():
    """Lab 04's fake kernel and autograd formula (the spec's references), registered for exercise 4's
    compiled cases as the notebook's cells register them; removed afterwards."""
    from helpers.ext import lab as _defines_the_op   # noqa: F401
    lib = torch.library.Library("labs_ext", "FRAGMENT")
    torch.library.register_fake("labs_ext::silu_mul", gs._fake, lib=lib)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
    torch.library.register_autograd("labs_ext::silu_mul", gs._backward, setup_context=setup_context, lib=lib)
    yield
    lib._destroy()


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    """Every silu_mul_body candidate (the solution notebook's, then the wrong ones) in one child process."""
    solution = solution_namespace(L04)["silu_mul_body"]()
    candidates = {"solution": body_source(solution)}
    candidates.update({w.name: body_source(w.fn) for w in WRONG if w.function == "silu_mul_body"})
    return run_in_child(L04, "silu_mul_body", candidates, tmp_path_factory.mktemp("kernels"))


def _failures(w: Wrong, request) -> dict[str, str]:
    if (w.lab, w.function) in CHILD_EXERCISES:
        return dict(request.getfixturevalue("kernel_results")[w.name])
    if w.function == "swiglu_mlp":
        request.getfixturevalue("silu_mul_registered")
    return dict(run_cases(w.lab, w.fn, w.function))


@pytest.mark.parametrize("w", [_param(w) for w in WRONG])
def test_wrong_answer_fails_with_its_hint(w, request):
    _, cases, _ = prepared(w.lab, w.function)
    failures = _failures(w, request)
    if w.accepts:            # xfail(strict) until a case, any case, catches it with the hint
        assert failures, f"{w.id}: every case passed"
        assert any(w.hint in p for p in failures.values()), failures
        return
    case = next(c for c in cases if c.name == w.case)
    assert w.hint in case.hint or w.hint == MATCH_HINT, f"the table's hint is not the case's: {case.hint!r}"
    caught = w.case in failures and w.hint in failures[w.case]
    if w.known:              # caught elsewhere, or caught without its hint: an xfail until that is fixed
        assert not caught, f"{w.id} is now caught with its hint: drop known= ({w.known})"
        if w.known == HINT_DROPPED:
            assert w.case in failures, f"{w.id}: the case {w.case!r} passed; failures: {failures}"
        pytest.xfail(w.known)
    assert w.case in failures, f"{w.id}: the case {w.case!r} passed; failures: {failures}"
    assert caught, failures[w.case]


def test_every_exercise_has_a_wrong_answer():
    covered = {(w.lab, w.function) for w in WRONG if not w.accepts}
    missing = [(lab, e.function) for lab, spec in SPECS.items() for e in spec.exercises
               if (lab, e.function) not in covered]
    assert not missing, f"exercises without a wrong answer the spec rejects: {missing}"


# --- The references pass every case ---------------------------------------------------------------

EXERCISES = [(lab, e.function) for lab, spec in SPECS.items() for e in spec.exercises]


REFERENCE_EXEMPT = {(L04, "swiglu_mlp"): {"calls labs_ext.silu_mul"}}   # the reference is plain PyTorch


@pytest.mark.parametrize("lab, function", EXERCISES, ids=[f"{lab}-{fn}" for lab, fn in EXERCISES])
def test_spec_reference_passes_every_case(lab, function, request):
    if (lab, function) in CHILD_EXERCISES:
        pytest.skip("the harness gives the reference's values without a build; the solution notebook's body, "
                    "built in the child, is the test of a right kernel")
    if function == "swiglu_mlp":
        request.getfixturevalue("silu_mul_registered")
    failed = run_cases(lab, exercise_of(lab, function).reference, function, reference=True)
    assert [(name, p) for name, p in failed if name not in REFERENCE_EXEMPT.get((lab, function), ())] == []


SLOW_SOLUTIONS = {(L04, "silu_mul_body"), (L02, "predicted_kernel_functions"), (L02, "launch_three_part")}


def _solution_param(lab, function):
    marks = [pytest.mark.slow] if (lab, function) in SLOW_SOLUTIONS else []
    return pytest.param(lab, function, id=f"{lab}-{function}", marks=marks)


@pytest.mark.parametrize("lab, function", [_solution_param(*e) for e in EXERCISES])
def test_solution_notebook_passes_every_case(lab, function, request, tmp_path):
    if (lab, function) in CHILD_EXERCISES:
        assert request.getfixturevalue("kernel_results")["solution"] == []
        return
    if function == "launch_three_part":     # a Triton kernel: its interpreter, in a fresh process
        pytest.importorskip("triton")
        got = run_in_child(lab, function, {"solution": triton_solution_source()}, tmp_path,
                           env={"TRITON_INTERPRET": "1"})
        assert got["solution"] == []
        return
    if function == "swiglu_mlp":
        request.getfixturevalue("silu_mul_registered")
    fn = solution_namespace(lab)[function]
    assert run_cases(lab, fn, function) == []


# --- check() raises what the grader reports -------------------------------------------------------

@pytest.mark.parametrize("lab, fn, function, hint", [
    (L00, softmax_last_dim_only, "softmax", "use the dim argument"),
    (L03, permute_counts_not_offsets, "permute_tokens", "cumulative END offsets"),
    (L07, at_peak_last_max, "at_peak", "take the FIRST index"),
], ids=["softmax", "permute_tokens", "at_peak"])
def test_check_raises_the_hint(lab, fn, function, hint, capsys):
    with pytest.raises(CheckFailed) as failed:
        check(lab, fn, function=function)
    assert hint in str(failed.value)
