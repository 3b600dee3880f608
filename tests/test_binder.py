"""Binder: repo2docker's Dockerfile (printed without a Docker engine) installs what the lessons import."""
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import notebooks
from helpers.manifest import entries

REPO = Path(__file__).resolve().parent.parent
BINDER = REPO / "binder"
# tools of the tests, the authors and the course website, not of the lessons
TEST_ONLY = {"jupyter-repo2docker", "playwright", "jupytext", "ruff", "sphinx", "myst-nb", "sphinx-book-theme"}


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.split("#")[0].strip())
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found


def test_binder_mirrors_the_cpu_environment_with_the_cpu_only_torch_wheel():
    binder, cpu = pins(BINDER / "requirements.txt"), pins(REPO / "environments" / "cpu.txt")
    assert binder.pop("torch") == cpu.pop("torch") + "+cpu"
    assert binder == {k: v for k, v in cpu.items() if k not in TEST_ONLY}
    assert "download.pytorch.org/whl/cpu" in (BINDER / "requirements.txt").read_text()
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    assert not (BINDER / "environment.yml").exists(), "environment.yml would win over requirements.txt"


@pytest.fixture(scope="module")
def dockerfile(tmp_path_factory):
    exe = Path(sys.executable).with_name("repo2docker")
    if not exe.exists():
        pytest.skip("repo2docker not installed (pip install jupyter-repo2docker)")
    copy = tmp_path_factory.mktemp("r2d") / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "__pycache__"))
    done = subprocess.run([str(exe), "--no-build", "--debug", str(copy)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def test_dockerfile_uses_binder_folder_and_installs_the_package(dockerfile):
    assert "conda environment for python=3.11" in dockerfile
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in dockerfile
    assert "./binder/postBuild" in dockerfile
    assert "pip install --no-deps -e ." in (BINDER / "postBuild").read_text()


def test_binder_installs_every_package_the_notebooks_import():
    """Each top-level import in a notebook is the standard library, helpers, or a Binder requirement."""
    provided = {name.replace("-", "_") for name in pins(BINDER / "requirements.txt")}
    provided |= {"helpers", "IPython", "ipykernel", "torch", "torchgen"}   # IPython comes with ipykernel, torchgen with torch
    imported = set()
    for item in entries():
        for cell in notebooks.read(REPO / item["path"]).cells:
            if cell.cell_type != "code":
                continue
            tree = ast.parse("\n".join(l for l in cell.source.splitlines() if not l.lstrip().startswith(("%", "!"))))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
    missing = sorted(m for m in imported if m not in provided and m not in sys.stdlib_module_names)
    assert missing == []
