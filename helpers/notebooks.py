"""The notebook format policy, the lab student-copy generator, and the format check.

Outputs policy (enforced by tests/test_notebook_format.py):
- Committed notebooks carry no outputs and no execution counts, except cells tagged
  `nbval-check-output`: those hold deterministic output (printed checks, shapes, exact values) that
  nbval compares on every test run. `python -m helpers notebooks fix` executes a notebook in quick
  mode and keeps exactly those outputs.
- nbformat 4.5 (cell ids), kernel spec `python3`, no widget state, a markdown card first
  (with "What you will learn", "Hardware" and "Verified with torch"), a code cell tagged `parameters`
  that defines QUICK.

Labs: the authored source `labs/solutions/NN_topic_lab.ipynb` marks each solution with lines
`### BEGIN SOLUTION` and `### END SOLUTION`; `python -m helpers labs build` writes the student copy
`labs/NN_topic_lab.ipynb` with each marked block replaced by a stub that raises NotImplementedError.
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import nbformat

from helpers.files import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
NBVAL_TAG = "nbval-check-output"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CARD_HEADINGS = ("What you will learn", "Hardware", "Verified with torch")


def read(path: str | Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def write(nb: nbformat.NotebookNode, path: str | Path) -> None:
    write_text_atomic(nbformat.writes(nb) + "\n", path)


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def normalize(nb: nbformat.NotebookNode, executed: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """Apply the outputs policy. `executed` (the same notebook, run) supplies the outputs of tagged cells."""
    nb = copy.deepcopy(nb)
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    ran = {}
    if executed is not None:
        ran = {c.get("id"): c for c in executed.cells if c.cell_type == "code"}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in ("tags",)}
        if cell.cell_type != "code":
            continue
        if NBVAL_TAG in _tags(cell) and cell.get("id") in ran:
            source = ran[cell.id]
            cell.outputs = [o for o in source.outputs if o.output_type != "display_data"]
            cell.execution_count = source.execution_count
        elif NBVAL_TAG not in _tags(cell):
            cell.outputs, cell.execution_count = [], None
    nbformat.validator.normalize(nb)
    return nb


def format_problems(nb: nbformat.NotebookNode, *, lab_student: bool = False) -> list[str]:
    """Everything that breaks the format policy; an empty list means the notebook is fine."""
    problems = []
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        problems.append(f"invalid nbformat: {exc.message}")
    if (nb.nbformat, nb.nbformat_minor) < (4, 5):
        problems.append(f"nbformat {nb.nbformat}.{nb.nbformat_minor}, expected 4.5 (cell ids)")
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append("kernel spec is not python3")
    if "widgets" in nb.metadata:
        problems.append("saved widget state in metadata.widgets")
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        problems.append("first cell is not the markdown card")
    else:
        missing = [h for h in CARD_HEADINGS if h.lower() not in nb.cells[0].source.lower()]
        if missing:
            problems.append(f"card misses: {', '.join(missing)}")
    params = [c for c in nb.cells if "parameters" in _tags(c)]
    if len(params) != 1:
        problems.append(f"{len(params)} cells tagged 'parameters', expected 1")
    elif not re.search(r"^QUICK\s*=", params[0].source, re.M):
        problems.append("parameters cell does not define QUICK")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        checked = NBVAL_TAG in _tags(cell) and not lab_student
        if not checked and (cell.outputs or cell.execution_count is not None):
            problems.append(f"cell {i} has outputs but is not tagged {NBVAL_TAG}")
        if checked and "requires(" in cell.source:
            problems.append(f"cell {i} is tagged {NBVAL_TAG} but calls requires(): what it prints depends on "
                            f"the machine, so nbval cannot compare it across the matrix")
        if checked and (not cell.outputs or cell.execution_count is None):
            problems.append(f"cell {i} is tagged {NBVAL_TAG} but has no stored output "
                            f"(run: python -m helpers notebooks fix)")
        if any(o.get("output_type") == "display_data" and "application/vnd.jupyter.widget-view+json"
               in o.get("data", {}) for o in cell.outputs):
            problems.append(f"cell {i} stores a widget view")
    return problems


def _stub(match: re.Match, exercise: str) -> str:
    indent = match.group(1)
    return f'{indent}raise NotImplementedError("{exercise}: your code here")\n'


def student_copy(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student version: solution blocks become NotImplementedError stubs, no outputs at all."""
    nb = normalize(solution)
    block = re.compile(rf"^([ \t]*){re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*\n?", re.S | re.M)
    exercise_no = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        cell.metadata["tags"] = [t for t in _tags(cell) if t != NBVAL_TAG]
        if not cell.metadata["tags"]:
            del cell.metadata["tags"]
        if BEGIN in cell.source:
            exercise_no += 1
            cell.source = block.sub(lambda m: _stub(m, f"Exercise {exercise_no}"), cell.source)
            if BEGIN in cell.source or END in cell.source:
                raise ValueError(f"unbalanced solution markers in cell: {cell.source[:80]!r}")
    if exercise_no == 0:
        raise ValueError(f"no '{BEGIN}' markers found: is this a lab solution notebook?")
    return nb


def student_path(solution_path: Path) -> Path:
    return solution_path.parent.parent / solution_path.name


def build_labs(paths: list[Path] | None = None) -> list[Path]:
    """Write the student copy of every lab solution; returns the paths written."""
    paths = paths or sorted((REPO / "labs" / "solutions").glob("*.ipynb"))
    written = []
    for path in paths:
        out = student_path(path)
        write(student_copy(read(path)), out)
        written.append(out)
    return written


VERIFIED_ROW = re.compile(r"^(\| \*\*Verified with torch\*\* \| )([^;|]*)(.*\|)$", re.M)


def verified_versions(matrix: dict, notebook: str) -> str:
    """The environments of a merged matrix (helpers.runner.matrix) where this notebook's quick run
    and its nbval comparison both passed, as "2.10.0+cu128 (cuda), 2.13.0+cpu (cpu), ..."."""
    torch_of = {env["name"]: env["torch_version"] for env in matrix["environments"]}
    passed = [f"{torch_of[r['environment']]} ({r['environment']})" for r in matrix["results"]
              if r["notebook"] == notebook and r["status"] == "passed" and r["nbval"] == "passed"]
    return ", ".join(passed)


def write_verified(path: Path, matrix: dict, date: str) -> bool:
    """Rewrite the card's "Verified with torch" value, up to its first ";", from the matrix: the torch
    versions (and environment names) where the quick run and nbval passed. Returns whether it changed."""
    nb = read(path)
    key = str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)
    versions = verified_versions(matrix, key)
    text = (f"quick run and stored outputs pass on {versions} (make matrix, {date})" if versions
            else f"no environment of the matrix of {date} passed")
    card = nb.cells[0]
    if not VERIFIED_ROW.search(card.source):
        raise ValueError(f"{path}: the card has no '| **Verified with torch** | ... |' row")
    new = VERIFIED_ROW.sub(lambda m: m.group(1) + text + (" " if m.group(3).startswith("|") else "") + m.group(3),
                           card.source, count=1)
    if new == card.source:
        return False
    card.source = new
    write(nb, path)
    return True


def fix(path: Path, timeout: int = 600) -> list[str]:
    """Execute a notebook in quick mode and rewrite it under the outputs policy; returns problems left."""
    import papermill
    from helpers.interactive import HEADLESS_ENV
    os.environ[HEADLESS_ENV] = "1"      # the kernel inherits it: widgets cannot stall the run
    nb = normalize(read(path))
    write(nb, path)
    executed = papermill.execute_notebook(str(path), None, parameters={"QUICK": True}, cwd=str(path.parent),
                                          execution_timeout=timeout, progress_bar=False, kernel_name="python3")
    # papermill inserts an "injected-parameters" cell; match cells by id, so it is simply not used
    fixed = normalize(nb, executed)
    write(fixed, path)
    return format_problems(fixed)
