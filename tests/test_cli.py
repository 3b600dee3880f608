"""The command line: doctor's report on this machine, and clear errors."""
import subprocess
import sys

from helpers.device import capabilities
from helpers.doctor import report_html, report_text
from helpers.manifest import entries


def run(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True, timeout=300)


def test_doctor_reports_this_machine_and_every_lesson():
    done = run("doctor")
    assert done.returncode == 0, done.stderr
    caps = capabilities()
    assert caps.torch_version in done.stdout and f"{caps.cpu_count} cores" in done.stdout
    for item in entries():
        assert item["path"] in done.stdout
    assert "runs" in done.stdout


def test_doctor_html_has_the_same_rows():
    text, page = report_text(), report_html()
    assert "<table>" in page and capabilities().torch_version in page and "capabilities missing" in text


def test_unknown_command_and_notebook_fail_clearly(tmp_path):
    assert run("frobnicate").returncode == 2
    done = run("run", "notebooks/nope.ipynb", "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and "not in helpers/manifest.json: notebooks/nope.ipynb" in done.stderr
    done = run("run", "notebooks/00_start_here.ipynb", "--no-quick", "--check-outputs", "--out", str(tmp_path / "r"))
    assert done.returncode == 2 and "quick mode" in done.stderr


def test_the_command_line_never_imports_from_the_folder_it_was_started_in(tmp_path):
    """A grader started inside a folder of submissions: a student's folder named like a dependency (torch,
    numpy) is never imported in its place."""
    for name in ("torch", "numpy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text('raise RuntimeError("a submission folder was imported")\n')
    done = subprocess.run([sys.executable, "-m", "helpers", "doctor"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert "a submission folder was imported" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
