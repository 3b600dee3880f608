"""Solutions written from the student copies of labs 00, 02, 05 and 06 alone (tests/independent_solutions/,
without the lab solutions or the grader's references) pass every case of their exercise, visible and
hidden, as the grader judges them. A check that fails here rejects an answer that the exercise's text
allows, or the solution is wrong: either way, something to look at."""
from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from wrong_answers import run_cases

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE / "independent_solutions"
ROOT = HERE.parent

EXERCISES = {
    ("00_warmup_lab", "lab00"): ["softmax", "rms_norm"],
    ("02_fusion_lab", "lab02"): ["combo_grid", "launch_three_part", "plan_combo_launch", "predicted_kernel_functions"],
    ("05_quantization_lab", "lab05"): ["quantize_weight", "int8_linear", "quantize_model", "choose_plan"],
    ("06_attention_lab", "lab06"): ["generation_mask", "unpad", "backward_ops", "bucketed_attention",
                                    "prefix_lm_mask_mod", "choose_bucket_count"],
}
CASES = [(lab, module, function) for (lab, module), functions in EXERCISES.items() for function in functions]


def load(module: str):
    """One of the independent solution modules, imported by path."""
    spec = importlib.util.spec_from_file_location(f"independent_{module}", SOLUTIONS / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def has(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


# Lab 02's module sets TRITON_INTERPRET and imports Triton (as the notebook does), which must not leak into
# the other tests of this process, and Triton reads the variable when it is first imported, which another
# test may already have done: so lab 02's exercises run in a fresh process that sets it first.
CHILD = r"""
import json, os, sys
import torch
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
sys.path[:0] = [{root!r}, {tests!r}]
import importlib.util
spec = importlib.util.spec_from_file_location("independent_lab02", {path!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
from wrong_answers import run_cases
results = {{f: run_cases("02_fusion_lab", getattr(mod, f), f) for f in {functions!r} if hasattr(mod, f)}}
print("RESULTS" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def lab02_results() -> dict[str, list]:
    code = CHILD.format(root=str(ROOT), tests=str(HERE), path=str(SOLUTIONS / "lab02.py"),
                        functions=EXERCISES[("02_fusion_lab", "lab02")])
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULTS")), None)
    assert line is not None, f"the child process gave no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(line[len("RESULTS"):])


@pytest.mark.parametrize("lab, module, function", CASES, ids=[f"{lab}:{fn}" for lab, _, fn in CASES])
def test_independent_solution_passes_every_case(lab, module, function, request):
    if function == "launch_three_part" and not has("triton"):
        pytest.skip("exercise 2 of lab 02 needs Triton")
    if function == "choose_plan" and not has("sklearn"):
        pytest.skip("exercise 4 of lab 05 needs scikit-learn")
    if module == "lab02":
        failed = request.getfixturevalue("lab02_results")[function]
    else:
        failed = run_cases(lab, getattr(load(module), function), function)
    assert not failed, "\n".join(f"{name}: {problem}" for name, problem in failed)


def test_every_solution_is_written():
    """Each module defines every function this test runs (read from its source: importing lab 02 here would
    set TRITON_INTERPRET in this process)."""
    for (lab, module), functions in EXERCISES.items():
        tree = ast.parse((SOLUTIONS / f"{module}.py").read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        missing = [f for f in functions if f not in defined]
        assert not missing, f"{module} lacks {missing}"
