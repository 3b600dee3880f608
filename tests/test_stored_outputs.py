"""The matrix's output check: nbval's comparison applied to notebooks a run already executed."""
import copy

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from helpers.runner.matrix import read_nbval
from helpers.runner.stored_outputs import compare_notebook, junit_xml, sanitize_patterns


def stored_notebook():
    checked = new_code_cell("print(verdict)", metadata={"tags": ["nbval-check-output"]},
                            outputs=[new_output("stream", name="stdout", text="all 3 checks passed in 12.5 ms\n")])
    free = new_code_cell("print(time.time())", outputs=[new_output("stream", name="stdout", text="1.0\n")])
    return new_notebook(cells=[free, checked])


def executed(stored, text):
    """What papermill writes: the parameters cell first, every cell with this run's outputs."""
    run = copy.deepcopy(stored)
    run.cells.insert(0, new_code_cell("QUICK = True", metadata={"tags": ["injected-parameters"]}))
    run.cells[2].outputs = [new_output("stream", name="stdout", text=text)]
    run.cells[1].outputs = [new_output("stream", name="stdout", text="2.0\n")]   # not checked
    return run


def test_a_checked_cell_matches_through_nbval_s_sanitizers_and_unchecked_cells_are_ignored():
    stored = stored_notebook()
    assert compare_notebook(stored, executed(stored, "all 3 checks passed in 9.1 ms\n"), sanitize_patterns()) \
        == [(1, None)]


def test_a_changed_verdict_fails_with_both_texts_and_without_sanitizers_a_timing_does_too():
    stored = stored_notebook()
    [(index, problem)] = compare_notebook(stored, executed(stored, "2 of 3 checks passed in 12.5 ms\n"),
                                          sanitize_patterns())
    assert index == 1 and "2 of 3 checks passed" in problem and "all 3 checks passed" in problem
    [(_, problem)] = compare_notebook(stored, executed(stored, "all 3 checks passed in 9.1 ms\n"), {})
    assert problem is not None


def test_a_print_that_arrived_in_two_chunks_matches_as_in_nbval():
    stored = stored_notebook()
    run = executed(stored, "all 3 checks passed")
    run.cells[2].outputs.append(new_output("stream", name="stdout", text=" in 9.1 ms\n"))
    assert compare_notebook(stored, run, sanitize_patterns()) == [(1, None)]
    assert stored.cells[1].outputs[0].text == "all 3 checks passed in 12.5 ms\n"     # nothing mutated


def test_a_run_that_stopped_early_or_never_ran_fails_the_checked_cells():
    stored = stored_notebook()
    stopped = executed(stored, "x\n")
    del stopped.cells[2]
    assert compare_notebook(stored, stopped, {})[0][1].startswith("not executed")
    assert compare_notebook(stored, None, {})[0][1].startswith("not executed")


def test_the_verdicts_read_back_as_the_matrix_reads_pytest_s_junit_xml(tmp_path):
    verdicts = {"notebooks/a.ipynb": [(3, None), (7, "mismatch 'text'")], "labs/solutions/b.ipynb": [(1, None)],
                "notebooks/no_checked_cells.ipynb": []}
    path = tmp_path / "nbval.xml"
    path.write_text(junit_xml(verdicts))
    assert read_nbval(path, list(verdicts)) == {"notebooks/a.ipynb": "failed", "labs/solutions/b.ipynb": "passed",
                                                "notebooks/no_checked_cells.ipynb": "passed"}
    nbformat.validate(stored_notebook())
