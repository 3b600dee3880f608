"""Every notebook and lab solution runs headless with papermill in quick mode (the batch runner, two
workers); every declared section reports in; the cells tagged nbval-check-output print what is stored
(nbval's comparison, on this one execution); student copies stop exactly at their first stub."""
import json
import shutil
from pathlib import Path

import papermill
import pytest
from papermill.execute import remove_error_markers

from helpers import manifest, notebooks
from helpers.runner import run_collection, section_problems
from helpers.runner.execute import memory_budget_gb
from helpers.runner.stored_outputs import check_run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def collection_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    summary = run_collection(out_dir=out, parameters={"QUICK": True}, workers=2, cell_timeout=240)
    measured = {r["path"]: {"seconds": r["seconds"], "peak_memory_mb": r["peak_memory_mb"]} for r in summary["notebooks"]}
    print(json.dumps({"total_seconds": summary["total_seconds"], "notebooks": measured}, indent=1))
    return {**summary, "stored_outputs": check_run(out)}


@pytest.mark.parametrize("item", manifest.entries(), ids=lambda i: i["id"])
def test_notebook_executes_in_quick_mode(collection_run, item):
    record = next(r for r in collection_run["notebooks"] if r["path"] == item["path"])
    assert record["error"] is None, f"{item['path']} failed in cell {record['error'].get('cell')}: " \
                                    f"{record['error']['ename']}: {record['error']['evalue']}"
    assert record["problems"] == [] and record["status"] == "passed"
    budget_mb = memory_budget_gb() * 1024     # 1.5 GB (Binder) with a CPU-only torch, 2 GB with a GPU build
    assert record["peak_memory_mb"] is not None and record["peak_memory_mb"] < budget_mb, \
        f"quick mode must fit {budget_mb:.0f} MB with this torch build: peak {record['peak_memory_mb']} MB"


@pytest.mark.parametrize("item", manifest.entries(), ids=lambda i: i["id"])
def test_stored_outputs_are_what_the_quick_run_printed(collection_run, item):
    differ = [f"cell {index}: {problem}" for index, problem in collection_run["stored_outputs"][item["path"]] if problem]
    assert not differ, f"{item['path']}: " + "\n".join(differ) + \
        f"\n(re-run `python -m helpers notebooks fix {item['path']}` if the new output is right)"


def test_silent_skip_guard():
    declared = [{"name": "GPU part", "needs": ["cuda"]}, {"name": "CPU part", "needs": ["cxx"]}]
    assert "never reported" in section_problems(declared, [])[0]
    undeclared = [{"section": "Extra", "needs": ["cuda"], "ran": False, "reason": "x"}]
    assert any("not declared" in p for p in section_problems([], undeclared))
    # a section skipped on a machine that has what it needs (here: the C++ compiler) is an error
    skipped_wrongly = [{"section": "CPU part", "needs": ["cxx"], "ran": False, "reason": "needs cxx"}]
    assert any("skipped although this machine has cxx" in p for p in section_problems(declared[1:], skipped_wrongly))


@pytest.mark.parametrize("item", [i for i in manifest.entries() if i["kind"] == "lab"], ids=lambda i: i["id"])
def test_student_copy_stops_at_its_first_stub(tmp_path, item):
    student = notebooks.student_path(REPO / item["path"])
    copy = tmp_path / student.name
    shutil.copy(student, copy)
    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(str(copy), str(copy), parameters={"QUICK": True}, cwd=str(student.parent),
                                   progress_bar=False, kernel_name="python3", execution_timeout=240)
    # the stub's own error, or the check that called it saying the exercise is not started, with its task
    assert (info.value.ename == "NotImplementedError" and "Exercise 1" in info.value.evalue) or \
        (info.value.ename == "CheckFailed" and "not started" in info.value.evalue and "Exercise 1" in info.value.evalue
         and "Hint" not in info.value.evalue), (info.value.ename, info.value.evalue)
    # error.cell_index counts the executed cells; papermill then adds its error banner and anchor cells
    nb = remove_error_markers(notebooks.read(copy))
    first_stub = next(i for i, c in enumerate(nb.cells) if "raise NotImplementedError(\"Exercise 1" in c.source)
    # the stub raises where it is first called: in its own cell, or in the check that calls it
    assert info.value.cell_index >= first_stub
