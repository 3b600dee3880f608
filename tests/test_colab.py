"""The Colab route: the tables of torchao and torchdata versions against the environments matrix, the cell
every notebook starts with (inert outside Colab, harmless to the grader, the same on a re-run), and the set-up
it runs.
`make colab-check` runs the cell for real in a venv holding only PyPI's torch 2.10.0."""
from __future__ import annotations

import io
import json
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
def test_the_tables_match_each_environment_s_pins(environment, pins):
    if "torch" not in pins:
        pytest.skip(f"environments/{environment}.txt pins no torch")
    for name, version in colab.matched(pins["torch"]).items():
        if name in pins:
            assert version == pins[name], f"{environment} pins {name}=={pins[name]}, helpers/colab.py {version}"


@pytest.mark.parametrize("package", colab.MATCHED)
def test_every_row_of_a_table_is_pinned_by_an_environment(package):
    pinned = {(colab.minor(pins["torch"]), pins[package]) for pins in environment_pins().values()
              if "torch" in pins and package in pins}
    untested = set(colab.MATCHED[package].items()) - pinned
    assert not untested, f"{package} rows no environment pins (so none is tested): {sorted(untested)}"


def test_a_package_falls_back_on_its_own_table(monkeypatch):
    assert colab.matched("2.10.0+cu126") == {"torchao": "0.16.0", "torchdata": "0.11.0"}
    assert colab.matched("2.99.0") == {"torchao": None, "torchdata": None}
    tables = {"torchao": {"2.10": "0.16.0"}, "torchdata": {"2.10": "0.11.0", "2.11": "0.11.0"}}
    monkeypatch.setattr(colab, "MATCHED", tables)
    assert colab.matched("2.11.0") == {"torchao": None, "torchdata": "0.11.0"}


def notebook_paths() -> list[Path]:
    paths = [REPO / e["path"] for e in manifest.entries()]
    return paths + [notebooks.student_path(p) for p in paths if p.parent.name == "solutions"]


def repository_path(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("path", notebook_paths(), ids=repository_path)
def test_every_notebook_starts_with_the_colab_cell_for_the_path_a_learner_opens(path):
    nb = notebooks.read(path)
    first = next(c for c in nb.cells if c.cell_type == "code")
    opened = repository_path(notebooks.student_path(path) if path.parent.name == "solutions" else path)
    assert first.source == colab.cell_source(colab.repository_url(), opened), \
        "run: python -m helpers notebooks colab-cell"
    assert notebooks.COLAB_TAG in first.metadata.get("tags", [])
    assert nb.cells.index(first) == 1 and nb.cells[0].cell_type == "markdown", "after the card"
    assert "parameters" in nb.cells[2].metadata.get("tags", []), "before the parameters cell"


def test_a_lab_solution_s_cell_names_its_student_copy():
    assert colab.learner_path("labs/solutions/03_moe_lab.ipynb") == "labs/03_moe_lab.ipynb"
    assert colab.learner_path("notebooks/03_grouped_gemm_moe.ipynb") == "notebooks/03_grouped_gemm_moe.ipynb"


def test_the_cell_clones_the_repository_of_pyproject():
    url = colab.repository_url()
    assert url == "https://github.com/pytorch-210-labs/pytorch-210-labs"
    cell = colab.cell_source(url, NOTEBOOK)
    assert f'"{url}"' in cell and '"/content/pytorch-210-labs"' in cell
    fork = colab.cell_source("https://github.com/someone/course-fork.git", NOTEBOOK)
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
    colab.with_cell(nb, colab.cell_source(colab.repository_url(), NOTEBOOK))
    assert notebooks.estimated_minutes(nb) == before


NOTEBOOK = "notebooks/02_horizontal_fusion.ipynb"


def run_cell(monkeypatch, tmp_path, in_colab: bool) -> tuple[list, str]:
    """Execute the cell of NOTEBOOK; subprocess.run is recorded, not run (a clone makes only the folders the
    cell needs). Returns (the commands, what the cell printed)."""
    calls = []

    def record(cmd, **kwargs):
        calls.append((cmd, kwargs))
        if cmd[:2] == ["git", "clone"]:
            for folder in (".git", "notebooks"):
                (Path(cmd[-1]) / folder).mkdir(parents=True)

    monkeypatch.setattr(subprocess, "run", record)
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", object())
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv(colab.FOLDER_ENV, str(tmp_path / "clone"))
    monkeypatch.setenv(colab.NOTEBOOK_ENV, "before")
    monkeypatch.delenv(colab.SOURCE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with redirect_stdout(out):
        exec(colab.cell_source(colab.repository_url(), NOTEBOOK), {})
    return calls, out.getvalue()


SETUP = [sys.executable, "-m", "helpers.colab", "setup"]


def test_outside_colab_the_cell_does_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    path_before = list(sys.path)
    calls, printed = run_cell(monkeypatch, tmp_path, in_colab=False)
    assert calls == [] and printed == "" and os.getcwd() == str(tmp_path) and sys.path == path_before
    assert os.environ[colab.NOTEBOOK_ENV] == "before"


def test_in_colab_the_cell_clones_once_sets_up_and_works_from_the_notebook_s_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    clone = str(tmp_path / "clone")
    calls, _ = run_cell(monkeypatch, tmp_path, in_colab=True)
    assert calls == [(["git", "clone", "--depth", "1", colab.repository_url(), clone], {"check": True}),
                     (SETUP, {"cwd": clone, "check": True})]
    assert os.getcwd() == os.path.join(clone, "notebooks") and sys.path[0] == clone
    assert os.environ[colab.NOTEBOOK_ENV] == NOTEBOOK


def test_running_the_cell_again_neither_clones_nor_adds_to_the_path(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    clone = str(tmp_path / "clone")
    run_cell(monkeypatch, tmp_path, in_colab=True)
    path_after_first = list(sys.path)
    calls, _ = run_cell(monkeypatch, tmp_path, in_colab=True)     # a re-run, or one after a runtime restart
    assert calls == [(SETUP, {"cwd": clone, "check": True})], "cloned once"
    assert sys.path == path_after_first and sys.path.count(clone) == 1
    assert os.getcwd() == os.path.join(clone, "notebooks")


def test_a_clone_cut_short_is_cloned_again(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "clone" / "notebooks").mkdir(parents=True)
    (tmp_path / "clone" / "half-written").write_text("")
    calls, _ = run_cell(monkeypatch, tmp_path, in_colab=True)
    assert calls[0][0][:2] == ["git", "clone"] and not (tmp_path / "clone" / "half-written").exists()


def test_the_cell_names_the_notebook_where_the_progress_log_reads_it():
    from helpers import progress
    assert colab.NOTEBOOK_ENV == progress.NOTEBOOK_ENV


def test_the_grader_finds_nothing_to_flag_in_the_cell():
    cell = nbformat.v4.new_code_cell(colab.cell_source(colab.repository_url(), NOTEBOOK))
    assert interpreter_internals(nbformat.writes(nbformat.v4.new_notebook(cells=[cell]))) == []


def fake_setup(monkeypatch, torch_version, have=None, set_up_before=False, pip_fails=()) -> tuple[list, int, str]:
    """setup() on REPO with pip recorded (failing for the packages named in pip_fails), `have` installed
    beside torch, and the package editable from REPO when set_up_before. Returns (pip calls, status, lines)."""
    pips = []

    def pip(*args):
        pips.append(args)
        return int(any(name in arg for arg in args for name in pip_fails))

    monkeypatch.setattr(colab, "_pip", pip)
    monkeypatch.setattr(colab, "installed", lambda name: {"torch": torch_version, **(have or {})}.get(name))
    monkeypatch.setattr(colab, "editable_from", lambda clone: set_up_before and clone == REPO)
    out = io.StringIO()
    with redirect_stdout(out):
        status = colab.setup(REPO)
    return pips, status, out.getvalue()


DEPENDENCIES = ("numpy>=1.26", "plotly>=5.20", "ipywidgets>=8.1", "tqdm>=4.66")


def test_setup_installs_the_package_without_resolving_torch_then_the_matched_versions(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.10.0+cu126")
    assert status == 0
    assert pips == [DEPENDENCIES, ("--no-deps", "-e", str(REPO)),
                    ("--no-deps", "torchao==0.16.0"), ("--no-deps", "torchdata==0.11.0")]
    assert not any(re.match(r"torch\b(?!-)", arg) for args in pips for arg in args), "pip never resolves torch"
    assert len(out.splitlines()) == 4 and "torch 2.10.0+cu126: kept" in out


def test_the_dependencies_are_pyproject_s_but_torch(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torch>=2.10", "numpy>=1.26", "Torch_Extra>=1", "tqdm; python_version>\'3\'"]\n')
    assert colab.dependencies(tmp_path) == ["numpy>=1.26", "Torch_Extra>=1", "tqdm; python_version>'3'"]
    assert tuple(colab.dependencies(REPO)) == DEPENDENCIES


def test_setup_installs_nothing_matched_for_a_torch_the_table_does_not_know(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.99.0", have={"torchao": "0.99.0"})
    assert status == 0 and pips == [DEPENDENCIES, ("--no-deps", "-e", str(REPO))]
    assert "torchao: helpers/colab.py matches no version to torch 2.99" in out and "0.99.0 is kept" in out
    assert "torchdata: helpers/colab.py matches no version" in out and "skip and say why" in out
    assert "older than" not in out


def test_setup_with_a_torch_older_than_the_course_says_what_skips_and_goes_on(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.9.1+cu126")
    assert status == 0 and pips == [DEPENDENCIES, ("--no-deps", "-e", str(REPO))]
    older = [line for line in out.splitlines() if "older than 2.10" in line]
    assert len(older) == 1 and "torchdata.nodes thread loader" in older[0] and "torchao or torchdata" in older[0]


def test_one_package_failing_does_not_stop_the_other(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, "2.13.0", pip_fails=("torchao",))
    assert status == 0 and pips[-1] == ("--no-deps", "torchdata==0.11.0")
    assert "torchao: pip failed to install 0.18.0" in out and "torchdata 0.11.0: installed" in out


def test_setup_a_second_time_repeats_no_pip(monkeypatch):
    have = {"torchao": "0.18.0", "torchdata": "0.11.0"}
    pips, status, out = fake_setup(monkeypatch, "2.13.0", have=have, set_up_before=True)
    assert status == 0 and pips == [] and "already set up" in out
    pips, status, out = fake_setup(monkeypatch, "2.13.0", have={"torchdata": "0.11.0"}, set_up_before=True)
    assert status == 0 and "already set up" not in out and ("--no-deps", "torchao==0.18.0") in pips


def test_setup_stops_without_torch_or_when_the_package_will_not_install(monkeypatch):
    pips, status, out = fake_setup(monkeypatch, None)
    assert status == 1 and pips == [] and "torch: not installed" in out
    pips, status, out = fake_setup(monkeypatch, "2.13.0", pip_fails=("numpy>=1.26",))
    assert status == 1 and pips == [DEPENDENCIES] and "pip failed" in out


def test_editable_from_reads_pip_s_record_in_any_metadata_folder(monkeypatch, tmp_path):
    class Installed:
        def __init__(self, record):
            self.record = record

        def read_text(self, name):
            return self.record if name == "direct_url.json" else None

    def editable(url, **dir_info):
        return Installed(json.dumps({"url": url, "dir_info": dir_info}))

    found = []
    monkeypatch.setattr(colab.importlib.metadata, "distributions", lambda name: found)
    assert not colab.editable_from(tmp_path)
    found[:] = [Installed(None), editable(tmp_path.as_uri(), editable=True)]    # the clone's egg-info first
    assert colab.editable_from(tmp_path) and not colab.editable_from(tmp_path / "other")
    found[:] = [editable(tmp_path.as_uri())]
    assert not colab.editable_from(tmp_path), "installed from the clone, not editable"


def test_helpers_and_the_set_up_import_no_torch():
    code = "import sys, helpers, helpers.colab; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
