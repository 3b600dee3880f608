"""What the grader reads in a submission's source (a notebook's cells, a project's files), in its own process:
the interpreter internals that let code inside the sandbox reach the grader's harness and recorder (frames,
the garbage collector's object graph, torch's mode stacks, code objects, raw process creation). No lab needs them; a submission that uses
them can hide a forbidden call from the recorder, so its exercises with forbidden calls are not trusted.

Not scanned: what the sandbox's audit hook refuses when it runs (the garbage collector's object graph,
sys._current_frames: a memory-debugging cell fails there, and costs nothing), and text that runs nothing (a
docstring or any string standing alone as a statement, comments)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

INTERNALS = {
    "_getframe": "frames", "f_back": "frames", "f_locals": "frames", "f_globals": "frames",
    "tb_frame": "frames", "gi_frame": "frames", "cr_frame": "frames",
    "_pop_torch_function_stack": "torch's mode stacks", "_push_on_torch_function_stack": "torch's mode stacks",
    "_get_function_stack_at": "torch's mode stacks", "_len_torch_function_stack": "torch's mode stacks",
    "DisableTorchFunction": "torch's mode stacks", "DisableTorchFunctionSubclass": "torch's mode stacks",
    "_disable_current_modes": "torch's mode stacks", "_pop_mode": "torch's mode stacks",
    "_get_current_dispatch_mode_stack": "torch's mode stacks", "_get_current_function_mode_stack": "torch's mode stacks",
    "__code__": "code objects", "setprofile": "the profiler hook", "settrace": "the profiler hook",
    "_posixsubprocess": "raw process creation", "fork_exec": "raw process creation",
}
MAGIC = re.compile(r"^\s*[%!]", re.M)
RUNTIME_INTERNALS = "interpreter internals in code compiled at run time:"   # the sandbox's flag, read as the scan


def interpreter_internals(notebook_text: str) -> list[str]:
    """'NAME (what it reaches) in cell N' for each internal the notebook's code cells name, as an attribute,
    a name, an import or a string; [] when none (or the notebook cannot be read: the grader says so elsewhere)."""
    import nbformat
    try:
        nb = nbformat.reads(notebook_text, as_version=4)
    except Exception:
        return []
    return sorted({f"{found} in cell {index}" for index, cell in enumerate(nb.cells) if cell.cell_type == "code"
                   for found in internals_in_source(cell.source)})


def project_internals(folder) -> list[str]:
    """'NAME (what it reaches) in FILE' for each internal a project's Python files name (those that travel to
    the sandbox: the folder's top level). A project's goals are measured in its own process, where these reach
    the measures."""
    files = [p for p in sorted(Path(folder).glob("*.py")) if p.is_file() and not p.is_symlink()]
    return sorted({f"{found} in {path.name}" for path in files
                   for found in internals_in_source(path.read_text(errors="replace"))})


def internals_in_source(source: str) -> list[str]:
    """'NAME (what it reaches)' for each internal a piece of code names (IPython's magics read as comments)."""
    try:
        tree = ast.parse(MAGIC.sub("pass  # ", source))
    except SyntaxError:
        return []
    found = []
    inert = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
             and isinstance(node.value, ast.Constant)}     # docstrings and other strings that run nothing
    for node in ast.walk(tree):
        words = []
        if isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            words = [part for alias in node.names for part in alias.name.split(".")]
            words += (node.module or "").split(".") if isinstance(node, ast.ImportFrom) else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inert:
            words = [w for w in INTERNALS if w in node.value]
        found += [f"{w} ({INTERNALS[w]})" for w in words if w in INTERNALS]
    return sorted(set(found))
