"""The format policy (helpers/notebooks.py), the manifest, the README table and the lab student copies."""
import re
from pathlib import Path

import pytest

from helpers import manifest, notebooks

REPO = Path(__file__).resolve().parent.parent
ITEMS = manifest.entries()
ON_DISK = sorted(str(p.relative_to(REPO)) for p in [*REPO.glob("notebooks/*.ipynb"), *REPO.glob("labs/solutions/*.ipynb")])


def test_manifest_lists_every_notebook_and_every_entry_exists():
    listed = [item["path"] for item in ITEMS]
    assert sorted(listed) == ON_DISK
    assert len({item["id"] for item in ITEMS}) == len(ITEMS)
    lessons = [item["id"] for item in ITEMS if item["kind"] == "lesson"]
    assert lessons == sorted(lessons), "lessons are listed in order"


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i["id"])
def test_notebook_follows_the_format_policy(item):
    nb = notebooks.read(REPO / item["path"])
    assert notebooks.format_problems(nb) == []
    assert Path(item["path"]).name.startswith(item["id"][:2])


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i["id"])
def test_declared_sections_match_the_requires_calls(item):
    source = "\n".join(c.source for c in notebooks.read(REPO / item["path"]).cells if c.cell_type == "code")
    called = set(re.findall(r"requires\([^)]*section=\"([^\"]+)\"", source))
    assert called == {s["name"] for s in item["sections"]}


@pytest.mark.parametrize("item", [i for i in ITEMS if i["kind"] == "lab"], ids=lambda i: i["id"])
def test_committed_student_copy_is_up_to_date(item):
    solution = REPO / item["path"]
    student = notebooks.student_path(solution)
    expected = notebooks.student_copy(notebooks.read(solution))
    assert student.exists(), "run: python -m helpers labs build"
    actual = notebooks.read(student)
    assert [c.source for c in actual.cells] == [c.source for c in expected.cells], "run: python -m helpers labs build"
    assert all(not c.get("outputs") for c in actual.cells), "student copies carry no outputs"
    assert "### BEGIN SOLUTION" not in "".join(c.source for c in actual.cells)


def test_student_copy_replaces_each_solution_with_a_stub():
    nb = notebooks.normalize(notebooks.nbformat.v4.new_notebook(cells=[
        notebooks.nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"),
        notebooks.nbformat.v4.new_code_cell("check(f)"),
    ]))
    student = notebooks.student_copy(nb)
    assert student.cells[0].source == 'def f(x):\n    raise NotImplementedError("Exercise 1: your code here")\n'
    assert student.cells[1].source == "check(f)"


@pytest.mark.parametrize("source, text", [
    ("x = 1\n", "no '### BEGIN SOLUTION' markers"),
    ("### BEGIN SOLUTION\nx = 1\n", "unbalanced"),
])
def test_student_copy_rejects_broken_markers(source, text):
    nb = notebooks.normalize(notebooks.nbformat.v4.new_notebook(cells=[notebooks.nbformat.v4.new_code_cell(source)]))
    with pytest.raises(ValueError, match=text):
        notebooks.student_copy(nb)


def test_format_check_catches_each_violation():
    v4 = notebooks.nbformat.v4
    nb = v4.new_notebook(cells=[v4.new_code_cell("x = 1", outputs=[v4.new_output("stream", text="1")],
                                                 execution_count=1)])
    nb.metadata["widgets"] = {"state": {}}
    problems = "\n".join(notebooks.format_problems(nb))
    for text in ("kernel spec", "widget state", "markdown card", "'parameters'", "has outputs but is not tagged"):
        assert text in problems


def test_a_checked_cell_may_not_depend_on_the_machine():
    v4 = notebooks.nbformat.v4
    gated = v4.new_code_cell('if requires("triton", section="x"):\n    print("ok")', execution_count=1,
                             outputs=[v4.new_output("stream", text="ok")], metadata={"tags": [notebooks.NBVAL_TAG]})
    problems = "\n".join(notebooks.format_problems(v4.new_notebook(cells=[gated])))
    assert "calls requires()" in problems


def test_readme_table_matches_the_manifest():
    readme = (REPO / "README.md").read_text()
    assert manifest.readme_table() in readme, "README table is stale: paste helpers.manifest.readme_table()"
