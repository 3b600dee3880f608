"""nbval's comparison of stored outputs, applied to the notebooks a run has already executed.

`pytest --nbval-lax` executes a notebook once more only to compare the cells tagged
`nbval-check-output` with their stored outputs. A run folder (`python -m helpers run`) holds every
notebook executed in quick mode, headless, as nbval would run it; this compares those executed cells with
the committed ones by nbval's own code (`IPyNbCell.compare_outputs`: the same skipped keys, stream
merging and sanitizers) and writes the verdict as nbval.xml, JUnit XML as pytest writes it, one test
case per checked cell, so `make matrix` runs each notebook once per environment instead of twice.
"""
from __future__ import annotations

import copy
import json
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree as ET

import nbformat

from helpers.files import write_text_atomic
from helpers.runner.job import REPO

CHECK_TAG = "nbval-check-output"
SANITIZE_FILE = REPO / "tests" / "nbval_sanitize.cfg"


def _comparer(patterns: dict[str, str]):
    """A stand-in for the nbval cell that compare_outputs is a method of: what that method reads."""
    from nbval.plugin import IPyNbCell, nocolors

    class Comparer:
        colors = nocolors
        sanitize = IPyNbCell.sanitize
        compare_outputs = IPyNbCell.compare_outputs

        def __init__(self):
            skip = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                    "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")  # nbval's, without nbdime
            self.parent = SimpleNamespace(skip_compare=skip, sanitize_patterns=OrderedDict(patterns))
            self.comparison_traceback = []

        def format_output_compare(self, key, left, right):
            self.comparison_traceback += [f"mismatch '{key}'", "stored:", str(left), "executed:", str(right)]
    return Comparer()


def sanitize_patterns(path: Path = SANITIZE_FILE) -> dict[str, str]:
    from nbval.plugin import get_sanitize_patterns
    return dict(get_sanitize_patterns(path.read_text())) if path.is_file() else {}


def compare_notebook(stored: nbformat.NotebookNode, executed: nbformat.NotebookNode | None,
                     patterns: dict[str, str]) -> list[tuple[int, str | None]]:
    """(cell index, None when it matches or what differs) for each cell tagged nbval-check-output of the
    stored notebook, matched to the executed one by cell id (papermill adds a parameters cell)."""
    ran = {cell.get("id"): cell for cell in (executed.cells if executed is not None else [])}
    results = []
    for index, cell in enumerate(stored.cells):
        if cell.cell_type != "code" or CHECK_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        twin = ran.get(cell.get("id"))
        if twin is None:
            results.append((index, "not executed: the run stopped before this cell, or its id changed"))
            continue
        from nbval.plugin import coalesce_streams   # as nbval does: a print may arrive in several chunks
        comparer = _comparer(patterns)
        same = comparer.compare_outputs(coalesce_streams(copy.deepcopy(twin.get("outputs", []))),
                                        coalesce_streams(copy.deepcopy(cell.get("outputs", []))))
        results.append((index, None if same else "\n".join(map(str, comparer.comparison_traceback))))
    return results


def check_run(run_dir: str | Path, patterns: dict[str, str] | None = None) -> dict[str, list[tuple[int, str | None]]]:
    """Compare every notebook of a run folder with its committed copy; write run_dir/nbval.xml."""
    run_dir = Path(run_dir)
    record = json.loads((run_dir / "record.json").read_text())
    patterns = sanitize_patterns() if patterns is None else patterns
    verdicts = {}
    for rec in record["notebooks"]:
        source = Path(rec["path"]) if Path(rec["path"]).is_absolute() else REPO / rec["path"]
        executed_path = run_dir / rec["executed"] if rec.get("executed") else None
        executed = nbformat.read(executed_path, as_version=4) if executed_path and executed_path.is_file() else None
        verdicts[rec["path"]] = compare_notebook(nbformat.read(source, as_version=4), executed, patterns)
    write_text_atomic(junit_xml(verdicts), run_dir / "nbval.xml")
    return verdicts


def junit_xml(verdicts: dict[str, list[tuple[int, str | None]]]) -> str:
    """pytest's JUnit XML shape: a case per cell, classname the notebook path with dots for slashes."""
    cases = [(notebook, index, problem) for notebook, cells in verdicts.items() for index, problem in cells]
    # a notebook with no checked cell passes, as nbval passes a notebook whose cells all ran
    cases += [(notebook, None, None) for notebook, cells in verdicts.items() if not cells]
    suite = ET.Element("testsuite", name="stored-outputs", tests=str(len(cases)),
                       failures=str(sum(problem is not None for _, _, problem in cases)))
    for notebook, index, problem in cases:
        case = ET.SubElement(suite, "testcase", classname=notebook.replace("/", "."),
                             name="no cell tagged nbval-check-output" if index is None else f"Cell {index}")
        if problem is not None:
            ET.SubElement(case, "failure", message=problem.splitlines()[0]).text = problem
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode")
