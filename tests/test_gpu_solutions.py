"""On a CUDA GPU, the exercises about a GPU property keep it there, for every right answer the tests hold (the
notebook's solution and the second solutions). On a CPU the grader checks the same properties statically, on
the meta device (helpers.grading.harnesses: lab 00's softmax_on_meta, lab 03's host_reads_of); here the GPU has
its own word:
- a function the lab promises reads nothing back to the host runs under torch.cuda.set_sync_debug_mode("error"),
  where a synchronising operation (a device-to-host copy, .item(), an op whose output size depends on the
  data) raises, and gives on the GPU what it gives on the CPU;
- a function that must work wherever its input lives returns its result on the input's device, as on the CPU.
The exercises are found from their cases (the harness each names), so a new one is covered when it is added."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from helpers.grading.specs import SPECS
from wrong_answers import solution_namespace

GPU_PROPERTIES = {"host_reads_of": "no sync", "softmax_on_meta": "same device"}


def _gpu_property_cases() -> list[tuple[str, str, str, tuple, dict]]:
    """(lab, function, property, args, kwargs) of every case that checks a GPU property, on seed 0."""
    found = []
    for lab, spec in sorted(SPECS.items()):
        if spec.submission is not None:
            continue
        for exercise in spec.exercises:
            for case in exercise.cases(torch.Generator().manual_seed(0)):
                if case.call in GPU_PROPERTIES:
                    found.append((lab, exercise.function, GPU_PROPERTIES[case.call], case.args, dict(case.kwargs)))
    return found


CASES = _gpu_property_cases()


def right_answers(lab: str, function: str) -> dict:
    """name -> callable: the notebook's solution and the tests' second solutions of the exercise."""
    module = importlib.import_module(f"test_wrong_answers_lab{lab[:2]}")
    answers = {"solution": solution_namespace(lab)[function]}
    answers |= {fn.__name__: fn for name, fn in getattr(module, "SECOND_SOLUTIONS", []) if name == function}
    return answers


def _on(device: str, value):
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def test_gpu_property_cases_are_found():
    """The CPU's half: the cases this file runs on a GPU exist (lab 00's placement, lab 03's two no-sync
    exercises), and each has a right answer to run."""
    assert {(lab, fn, prop) for lab, fn, prop, _, _ in CASES} >= {
        ("00_warmup_lab", "softmax", "same device"), ("03_moe_lab", "permute_tokens", "no sync"),
        ("03_moe_lab", "padded_layout", "no sync")}
    assert all(right_answers(lab, fn) for lab, fn, _, _, _ in CASES)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("lab, function, prop, args, kwargs", CASES,
                         ids=[f"{lab[:2]}-{fn}-{i}" for i, (lab, fn, _, _, _) in enumerate(CASES)])
def test_right_answers_keep_the_gpu_property_on_a_gpu(lab, function, prop, args, kwargs):
    for name, fn in right_answers(lab, function).items():
        on_cpu = fn(*args, **kwargs)
        gpu_args, gpu_kwargs = _on("cuda", (args, kwargs))
        torch.cuda.synchronize()
        if prop == "no sync":
            torch.cuda.set_sync_debug_mode("error")
        try:
            on_gpu = fn(*gpu_args, **gpu_kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        gpu_leaves, cpu_leaves = tree_flatten(on_gpu)[0], tree_flatten(on_cpu)[0]
        assert len(gpu_leaves) == len(cpu_leaves), name
        for got, want in zip(gpu_leaves, cpu_leaves):
            if isinstance(want, torch.Tensor):
                assert got.device.type == "cuda", f"{name}: a result left the GPU"
                torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
            else:
                assert got == want, name
