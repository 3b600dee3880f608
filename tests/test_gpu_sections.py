"""Every GPU-only section, checked against the installed torch without a GPU.

No GPU section runs on a CPU machine, so a name that a torch release renamed, or a keyword it dropped,
would first show on a learner's GPU. Here every cell gated by a GPU capability, and every helper function
it calls, is read: each attribute path rooted at torch (or at a helpers module) must resolve in the
installed torch, and each call to a function with a Python signature must bind its arguments. Run under
every torch of the matrix (`make matrix-env` runs this file too), it is what would have caught
`combo_kernel_max_num_nodes`, an Inductor option torch 2.10 does not have.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import textwrap
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import device, fusion, manifest

# Capabilities that only an accelerator (or its toolchain) provides: a cell asking for one never runs here.
GPU_NEEDS = {"cuda", "rocm", "rocm_ck", "xpu", "mps", "gpu", "accelerator", "torch_cuda", "grouped_mm_cutlass",
             "fp8", "triton_gpu", "sycl"}
HELPER_MODULES = ("attention", "bench", "debugging", "ext", "fusion", "memory", "moe", "quant")
ROOTS = {"torch": torch, "F": F, "nn": nn, "caps": device.capabilities(),
         **{name: importlib.import_module(f"helpers.{name}") for name in HELPER_MODULES}}


def _needs(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


# A core whose story follows the learner's GPU branches on this test (lessons 06 and 07).
GPU_BRANCH = 'STORY.type == "cuda"'


def gpu_cells() -> list[tuple[str, int, list[str], str]]:
    """(notebook, cell index, needs, source) of every code cell gated by a GPU capability or with a branch
    for a GPU."""
    found = []
    for entry in manifest.entries():
        cells = json.loads((manifest.REPO / entry["path"]).read_text())["cells"]
        for index, cell in enumerate(cells):
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and GPU_BRANCH in source:
                found.append((entry["path"], index, ["cuda"], source))
                continue
            if cell["cell_type"] != "code" or "requires(" not in source:
                continue
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "requires":
                    needs = _needs(node)
                    if GPU_NEEDS & set(needs):
                        found.append((entry["path"], index, needs, source))
                        break
    return found


def _chain(node: ast.AST) -> list[str] | None:
    """["torch", "cuda", "memory", "_snapshot"] for torch.cuda.memory._snapshot; None if not a name path."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _resolve(parts: list[str], roots: dict):
    obj = roots[parts[0]]
    for depth, name in enumerate(parts[1:], start=1):
        if isinstance(obj, types.ModuleType) and not hasattr(obj, name):
            try:       # a submodule not imported by its package (torch.nn.attention.varlen)
                obj = importlib.import_module(f"{obj.__name__}.{name}")
                continue
            except ImportError:
                pass
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise AttributeError(f"{'.'.join(parts[:depth + 1])} does not exist in torch {torch.__version__}") from None
    return obj


def problems(source: str, roots: dict) -> tuple[list[str], list]:
    """What does not resolve or bind in `source`; and the helper functions it calls (to read next)."""
    found, helpers_called = [], []
    tree = ast.parse(source)
    outermost = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in outermost:
            continue                  # only whole paths: torch.cuda.memory._snapshot, not its prefixes
        parts = _chain(node)
        if not parts or parts[0] not in roots:
            continue
        try:
            _resolve(parts, roots)
        except AttributeError as exc:
            found.append(str(exc))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                try:
                    _resolve([node.module.split(".")[0], *node.module.split(".")[1:], alias.name],
                             {"torch": torch})
                except AttributeError as exc:
                    found.append(f"from {node.module} import {alias.name}: {exc}")
        if not isinstance(node, ast.Call):
            continue
        parts = _chain(node.func)
        if not parts or parts[0] not in roots:
            continue
        try:
            fn = _resolve(parts, roots)
            signature = inspect.signature(fn)
        except (AttributeError, TypeError, ValueError):
            continue                  # reported above, or a builtin without a Python signature
        if isinstance(fn, types.FunctionType) and fn.__module__.startswith("helpers."):
            helpers_called.append(fn)
        starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        try:
            if starred:
                signature.bind_partial(**keywords)
            else:
                signature.bind(*[None] * len(node.args), **keywords)
        except TypeError as exc:
            found.append(f"{'.'.join(parts)}(...): {exc}")
    return found, helpers_called


CELLS = gpu_cells()


def test_the_collection_has_gpu_sections_to_check():
    """If this list shrank to nothing, the check below would pass vacuously."""
    assert len(CELLS) >= 15, [(path, index) for path, index, _, _ in CELLS]
    assert {n for _, _, needs, _ in CELLS for n in needs} >= {"cuda", "rocm", "xpu", "triton_gpu", "fp8"}


@pytest.mark.parametrize("path, index, needs, source", CELLS, ids=[f"{p.split('/')[-1][:2]}-cell{i}" for p, i, _, _ in CELLS])
def test_gpu_section_names_what_this_torch_has(path, index, needs, source):
    found, helpers_called = problems(source, ROOTS)
    for fn in dict.fromkeys(helpers_called):      # one level down: the helper functions the section calls
        module_roots = {**ROOTS, **{k: v for k, v in vars(inspect.getmodule(fn)).items()
                                    if isinstance(v, types.ModuleType)}}
        inner, _ = problems(textwrap.dedent(inspect.getsource(fn)), module_roots)
        found += [f"{fn.__module__}.{fn.__name__}: {p}" for p in inner]
    assert not found, f"{path} cell {index} (needs {needs}) would fail on a GPU with torch {torch.__version__}:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("options", [fusion.COMBO_ON, fusion.COMBO_OFF])
def test_inductor_options_the_gpu_sections_pass_exist_in_this_torch(options):
    from torch._inductor import config
    unknown = [name for name in options if not hasattr(config, name)]
    assert not unknown, f"torch {torch.__version__}'s torch._inductor.config has no {unknown}"


def test_the_check_catches_a_renamed_attribute_and_a_dropped_keyword():
    bad = textwrap.dedent("""
        torch._inductor.config.combo_kernel_max_nodes
        torch.cuda.memory._record_memory_history(max_entrees=10)
        bench.compare({"a": lambda: None})
        from torch.nn.attention.varlen import varlen_attention
    """)
    found, _ = problems(bad, ROOTS)
    assert any("combo_kernel_max_nodes does not exist" in p for p in found)
    assert any("_record_memory_history" in p and "max_entrees" in p for p in found)
    assert any("bench.compare" in p and "device" in p for p in found)
    assert any("import varlen_attention" in p for p in found)


def unstepped_graphed_optimizers(source: str) -> list[str]:
    """The optimizers a cell compiles with mode="reduce-overhead" (torch.compile(OPT.step, ...)) without an eager
    OPT.step() before, directly or in a loop over OPT: their first graph would create the state the next call
    overwrites (CUDA graph trees raise "accessing tensor output of CUDAGraphs that has been overwritten")."""
    stepped, missing = set(), []
    for node in ast.walk(ast.parse(source)):   # breadth-first: a statement's calls before a later statement's
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
            if any(isinstance(c, ast.Call) and _chain(c.func) == [node.target.id, "step"] for c in ast.walk(node)):
                stepped |= {e.id for e in node.iter.elts if isinstance(e, ast.Name)}
        if not isinstance(node, ast.Call):
            continue
        chain = _chain(node.func)
        if chain and len(chain) == 2 and chain[1] == "step" and not node.args:
            stepped.add(chain[0])
        graphed = any(k.arg == "mode" and getattr(k.value, "value", None) == "reduce-overhead" for k in node.keywords)
        if chain == ["torch", "compile"] and graphed and node.args and (_chain(node.args[0]) or [""])[-1] == "step":
            opt = _chain(node.args[0])[0]
            if opt not in stepped:
                missing.append(opt)
    return missing


def test_a_graphed_optimizer_step_follows_an_eager_step():
    graphed = [(path, index, source) for path, index, _, source in CELLS if "reduce-overhead" in source]
    assert graphed, "no cell compiles with mode='reduce-overhead': the check below would pass vacuously"
    for path, index, source in graphed:
        assert not unstepped_graphed_optimizers(source), f"{path} cell {index}"
    assert unstepped_graphed_optimizers("opt = make()\nstep = torch.compile(opt.step, mode='reduce-overhead')\n"
                                        "step()") == ["opt"]
