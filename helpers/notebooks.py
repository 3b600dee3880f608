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
import hashlib
import os
import re
import time
from pathlib import Path

import nbformat

from helpers.env import HEADLESS_ENV
from helpers.files import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
NBVAL_TAG = "nbval-check-output"
COLAB_TAG = "colab-setup"      # the Colab set-up cell (helpers.colab writes it)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CARD_HEADINGS = ("What you will learn", "Hardware", "Verified with torch")


def read(path: str | Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def write(nb: nbformat.NotebookNode, path: str | Path) -> None:
    """Write a notebook, and its percent-format twin when it has one, so the pair never drifts."""
    write_text_atomic(nbformat.writes(nb) + "\n", path)
    if twin_path(path).exists():
        write_text_atomic(twin_text(nb), twin_path(path))


# Twins: every lesson, deep dive and lab solution has a jupytext percent-format twin beside it
# (NN_topic.py), the file people edit and review; `python -m helpers notebooks sync` writes the .ipynb
# learners open from it, keeping the cell ids and the stored outputs of cells whose source is unchanged.
TWIN_FORMAT = "py:percent"
TWIN_FILTERS = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags,-all"}


def twin_path(path: str | Path) -> Path:
    return Path(path).with_suffix(".py")


def twin_text(nb: nbformat.NotebookNode) -> str:
    import jupytext
    nb = copy.deepcopy(nb)
    nb.metadata["jupytext"] = dict(TWIN_FILTERS)
    return jupytext.writes(nb, fmt=TWIN_FORMAT)


def from_twin(text: str, existing: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """The notebook a twin describes. A cell whose type and source are unchanged keeps its id and
    outputs from `existing`; an edited cell in the same place keeps its id and loses its outputs."""
    import jupytext
    nb = jupytext.reads(text, fmt=TWIN_FORMAT)
    old = list(existing.cells) if existing is not None else []
    unused = {id(c): c for c in old}
    for cell in nb.cells:
        match = next((c for c in old if id(c) in unused and c.cell_type == cell.cell_type
                      and c.source == cell.source), None)
        if match is not None:
            cell["id"] = match.get("id", cell.get("id"))
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = match.outputs, match.execution_count
            del unused[id(match)]
    taken = {c.get("id") for c in nb.cells}
    for position, cell in enumerate(nb.cells):       # edited cells: the id of the old cell in their place
        if position < len(old) and id(old[position]) in unused and old[position].cell_type == cell.cell_type \
                and old[position].get("id") not in taken:
            cell["id"] = old[position].get("id")
            taken.add(cell["id"])
            del unused[id(old[position])]
    return normalize(nb)


def sync_from_twin(path: str | Path) -> bool:
    """Rewrite the notebook at `path` from its twin; returns whether the notebook changed."""
    path = Path(path)
    existing = read(path) if path.exists() else None
    nb = from_twin(twin_path(path).read_text(), existing)
    before = path.read_text() if path.exists() else None
    write(nb, path)
    return path.read_text() != before


def twin_problem(path: str | Path) -> str | None:
    """Why a notebook and its twin are out of sync (None when they agree)."""
    twin = twin_path(path)
    if not twin.exists():
        return f"{path} has no twin {twin.name} (python -m helpers notebooks twin {path})"
    if twin.read_text() != twin_text(read(path)):
        return (f"{twin} and {Path(path).name} differ: edit the twin, then python -m helpers notebooks sync {twin}")
    return None


# Honest times: a notebook's estimated minutes, from its own cells, fitted to the minutes learners took
# (reviewers who worked through cores, deep dives and labs as new learners: see the README).
WORDS_PER_MINUTE = 160
LINES_PER_MINUTE = 15
MINUTES_PER_CODE_MINUTE = 1.8   # running it, waiting, reading its output and the helper it calls
MINUTES_PER_EXERCISE = 3.5      # a lab exercise (a cell with a solution): thinking, failed checks, another try
PREDICT_TAG, YOUR_TURN_TAG = "predict", "your-turn"


def estimated_minutes(nb: nbformat.NotebookNode) -> float:
    """Words of markdown / 160, plus 1.8 x max(1, lines / 15) for each code cell, plus 3.5 for each lab
    exercise (a code cell holding a solution). The Colab set-up cell and the card's "Verified with torch" row
    (provenance: versions, machines, sources) are no reading: they do not count."""
    words = sum(len(VERIFIED_ROW.sub("", c.source).split()) for c in nb.cells if c.cell_type == "markdown")
    code = [c for c in nb.cells if c.cell_type == "code" and COLAB_TAG not in _tags(c)]
    return (words / WORDS_PER_MINUTE
            + MINUTES_PER_CODE_MINUTE * sum(max(1.0, len(c.source.splitlines()) / LINES_PER_MINUTE) for c in code)
            + MINUTES_PER_EXERCISE * sum(BEGIN in c.source for c in code))


CARD_MINUTES = re.compile(r"^\| \*\*Time\*\* \| (\d+) minutes", re.M)


def card_minutes(nb: nbformat.NotebookNode) -> int | None:
    """The minutes the card's "Time" row states."""
    found = CARD_MINUTES.search(nb.cells[0].source) if nb.cells else None
    return int(found.group(1)) if found else None


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
    from helpers.checks import STUB_TEXT   # the checks know an untouched stub by its text
    indent = match.group(1)
    return f'{indent}raise NotImplementedError("{exercise}{STUB_TEXT}")\n'


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
    and its nbval comparison both passed, each with its build and what it ran on, as
    "2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), ..."."""
    label = {env["name"]: f"{env['torch_version']} (env {env['name']}" + (f": {env['build']})" if env.get("build") else ")")
             for env in matrix["environments"]}
    passed = [label[r["environment"]] for r in matrix["results"]
              if r["notebook"] == notebook and r["status"] == "passed" and r["nbval"] == "passed"]
    return ", ".join(passed)


GPU_CLAUSE = re.compile(r", and as a script on .*? \(gpu-check, [\d-]+\)")


def code_sha256(nb: nbformat.NotebookNode) -> str:
    """The SHA-256 of a notebook's code cells in order: what a run executed, whatever its prose and card say."""
    return hashlib.sha256("\n# %%\n".join(c.source for c in nb.cells if c.cell_type == "code").encode()).hexdigest()


def gpu_verified(records: list[dict], notebook: str, code: str) -> str:
    """', and as a script on 2.11.0+cu130 on an NVIDIA H200 (gpu-check, 2026-12-04)' for each kept GPU check
    record (helpers/recorded/gpu-check-*.json) in which this notebook's quick run passed with the code it has
    now (`code`, its code_sha256); '' when none."""
    clauses = []
    for record in records:
        run = record["record"]
        if any(n["path"] == notebook and n["status"] == "passed" and n.get("code_sha256") == code
               for n in run["notebooks"]):
            machine = run["machine"]
            day = time.strftime("%Y-%m-%d", time.gmtime(run["started"]))
            clauses.append(f", and as a script on {machine['torch_version']} on an {machine['device_name']} "
                           f"(gpu-check, {day})")
    return "".join(dict.fromkeys(clauses))     # two checks of one torch, machine and day: said once


def write_verified(path: Path, matrix: dict | None, date: str | None, gpu_records: list[dict] = ()) -> bool:
    """Rewrite the card's "Verified with torch" value, up to its first ";": from the matrix, the torch versions
    (and environment names) where the quick run and nbval passed (matrix None: the matrix part stays), then
    the GPU checks kept in the repository where its quick run passed. Returns whether it changed."""
    nb = read(path)
    key = str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)
    card = nb.cells[0]
    row = VERIFIED_ROW.search(card.source)
    if not row:
        raise ValueError(f"{path}: the card has no '| **Verified with torch** | ... |' row")
    if matrix is None:
        text = GPU_CLAUSE.sub("", row.group(2).rstrip())
    else:
        versions = verified_versions(matrix, key)
        text = (f"quick run and stored outputs pass on {versions} (make matrix, {date})" if versions
                else f"no environment of the matrix of {date} passed")
    text += gpu_verified(list(gpu_records), key, code_sha256(nb))
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
    os.environ[HEADLESS_ENV] = "1"      # the kernel inherits it: widgets cannot stall the run
    nb = normalize(read(path))
    write(nb, path)
    executed = papermill.execute_notebook(str(path), None, parameters={"QUICK": True}, cwd=str(path.parent),
                                          execution_timeout=timeout, progress_bar=False, kernel_name="python3")
    # papermill inserts an "injected-parameters" cell; match cells by id, so it is simply not used
    fixed = normalize(nb, executed)
    write(fixed, path)
    return format_problems(fixed)
