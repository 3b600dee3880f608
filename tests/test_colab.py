"""The Colab route: the table of torchao and torchdata versions against the environments matrix, the cell
every notebook starts with (inert outside Colab, harmless to the grader), and the set-up it runs.
`make colab-check` runs the cell for real in a venv holding only PyPI's torch 2.10.0."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import nbformat
import pytest

from helpers import colab, manifest, notebooks
from helpers.grading.scan import interpreter_internals

REPO = Path(__file__).resolve().parent.parent
PINNED = re.compile(r"^(torch|torchao|torchdata)==([^\s;#]+)", re.M)


def environment_pins() -> dict[str, dict[str, str]]:
    """{environment: {package: version}} for torch, torchao and torchdata in environments/*.txt."""
    return {path.stem: dict(PINNED.findall(path.read_text())) for path in sorted((REPO / "environments").glob("*.txt"))}


@pytest.mark.parametrize("environment, pins", environment_pins().items())
def test_the_table_matches_each_environment_s_pins(environment, pins):
    if "torch" not in pins:
        pytest.skip(f"environments/{environment}.txt pins no torch")
    versions = colab.matched(pins["torch"])
    assert versions is not None, f"helpers/colab.py MATCHED has no row for torch {pins['torch']} ({environment})"
    for name, version in zip(("torchao", "torchdata"), versions):
        assert pins.get(name, version) == version, f"{environment} pins {name}=={pins[name]}, the table {version}"


def test_every_row_of_the_table_is_a_torch_of_the_matrix():
    tested = {colab.minor(pins["torch"]) for pins in environment_pins().values() if "torch" in pins}
    assert set(colab.MATCHED) <= tested, "a row for a torch no environment pins is not tested"


def notebook_paths() -> list[Path]:
    paths = [REPO / e["path"] for e in manifest.entries()]
    return paths + [notebooks.student_path(p) for p in paths if p.parent.name == "solutions"]


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_notebook_starts_with_the_colab_cell(path):
    nb = notebooks.read(path)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == colab.cell_source(), "run: python -m helpers notebooks colab-cell"
    assert colab.CELL_TAG in first.metadata.get("tags", [])
    assert nb.cells.index(first) == 1 and nb.cells[0].cell_type == "markdown", "after the card"
    assert "parameters" in nb.cells[2].metadata.get("tags", []), "before the parameters cell"


def test_the_cell_clones_the_repository_of_pyproject():
    url = colab.repository_url()
    assert url == "https://github.com/pytorch-210-labs/pytorch-210-labs"
    assert f'"{url}"' in colab.cell_source() and '"/content/pytorch-210-labs"' in colab.cell_source()
    fork = colab.cell_source("https://github.com/someone/course-fork.git")
    assert '"https://github.com/someone/course-fork.git"' in fork and '"/content/course-fork"' in fork


def test_writing_the_cell_inserts_it_once_and_refreshes_it():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# card"),
                                         nbformat.v4.new_code_cell("QUICK = False", metadata={"tags": ["parameters"]})])
    assert colab.with_cell(nb, "old") and [c.source for c in nb.cells] == ["# card", "old", "QUICK = False"]
    assert colab.with_cell(nb, "new") and [c.source for c in nb.cells] == ["# card", "new", "QUICK = False"]
    assert not colab.with_cell(nb, "new") and len(nb.cells) == 3
    nbformat.validate(nb)


def test_the_cell_counts_no_minutes():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# card"), nbformat.v4.new_code_cell("x = 1")])
    before = notebooks.estimated_minutes(nb)
    colab.with_cell(nb, colab.cell_source())
    assert notebooks.estimated_minutes(nb) == before


def run_cell(monkeypatch, tmp_path, in_colab: bool) -> tuple[list, str]:
    """Execute the cell; subprocess.run is recorded, not run (a clone makes only the folder). Returns (the
    commands, what the cell printed)."""
    calls = []

    def record(cmd, **kwargs):
        calls.append((cmd, kwargs))
        if cmd[:2] == ["git", "clone"]:
            Path(cmd[-1]).mkdir()

    monkeypatch.setattr(subprocess, "run", record)
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", object())
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv(colab.FOLDER_ENV, str(tmp_path / "clone"))
    monkeypatch.delenv(colab.SOURCE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = io.StringIO()
    with redirect_stdout(out):
        exec(colab.cell_source(), {})
    return calls, out.getvalue()


def test_outside_colab_the_cell_does_nothing(monkeypatch, tmp_path):
    path_before = list(sys.path)
    calls, printed = run_cell(monkeypatch, tmp_path, in_colab=False)
    assert calls == [] and printed == "" and os.getcwd() == str(tmp_path) and sys.path == path_before


def test_in_colab_the_cell_clones_once_sets_up_and_works_from_the_clone(monkeypatch, tmp_path):
    clone = str(tmp_path / "clone")
    calls, _ = run_cell(monkeypatch, tmp_path, in_colab=True)
    assert calls == [(["git", "clone", "--depth", "1", colab.repository_url(), clone], {"check": True}),
                     ([sys.executable, "-m", "helpers.colab", "setup"], {"cwd": clone, "check": True})]
    assert os.getcwd() == clone and sys.path[0] == clone
    calls, _ = run_cell(monkeypatch, tmp_path, in_colab=True)
    assert [cmd for cmd, _ in calls] == [[sys.executable, "-m", "helpers.colab", "setup"]], "cloned once"


def test_the_grader_finds_nothing_to_flag_in_the_cell():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(colab.cell_source())])
    assert interpreter_internals(nbformat.writes(nb)) == []


def fake_setup(monkeypatch, torch_version, have=None) -> tuple[list, str]:
    pips = []
    monkeypatch.setattr(colab, "_pip", lambda *args: pips.append(args) or 0)
    monkeypatch.setattr(colab, "installed", lambda name: {"torch": torch_version, **(have or {})}.get(name))
    out = io.StringIO()
    with redirect_stdout(out):
        status = colab.setup(Path("/clone"))
    return pips, status, out.getvalue()


def test_setup_keeps_torch_and_installs_the_matched_versions(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.10.0+cu126")
    assert status == 0
    assert pips == [("-e", "/clone", "torch==2.10.0+cu126"), ("--no-deps", "torchao==0.16.0", "torchdata==0.11.0")]
    assert len(out.splitlines()) == 3 and "torch 2.10.0+cu126: kept" in out


def test_setup_installs_nothing_matched_for_a_torch_the_table_does_not_know(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.99.0")
    assert status == 0 and pips == [("-e", "/clone", "torch==2.99.0")]
    assert "no versions to torch 2.99" in out and "skip and say why" in out


def test_setup_skips_what_is_installed_and_stops_without_torch(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.13.0", have={"torchao": "0.18.0", "torchdata": "0.11.0"})
    assert status == 0 and len(pips) == 1 and "already installed" in out
    pips, status, out = fake_setup(monkeypatch, None)
    assert status == 1 and pips == [] and "torch: not installed" in out


def test_helpers_and_the_set_up_import_no_torch():
    code = "import sys, helpers, helpers.colab; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
