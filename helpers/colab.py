"""Colab: the first code cell of every notebook, and the set-up it runs beside Colab's own torch.

Colab ships its own CUDA build of torch. The cell (CELL_TEMPLATE, written into every notebook by
`python -m helpers notebooks colab-cell` with the repository URL of pyproject.toml's [project.urls])
does nothing outside Colab; in Colab it clones the repository once and runs `python -m helpers.colab
setup` there, which installs this package without touching torch, then torchao and torchdata at the
versions MATCHED to the torch it finds. `helpers.device` then says which sections skip, and why.

Standard library only, and no torch import: this runs from a fresh clone before anything is installed.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "pytorch-210-labs"
CELL_TAG = "colab-setup"
SOURCE_ENV, FOLDER_ENV = "LABS_COLAB_SOURCE", "LABS_COLAB_DIR"   # overrides, for the CI check of the cell

# torch minor version -> (torchao, torchdata) installed beside it. Each row is a torch of the environments
# matrix, with that environment's pins (tests/test_colab.py holds the table to environments/*.txt); torchao's
# binaries are built per torch (0.16.0's for 2.10.0 only; 0.17.0 and later load on torch >= 2.11).
MATCHED = {
    "2.10": ("0.16.0", "0.11.0"),   # cuda, rocm, xpu (free-threaded: torchdata only)
    "2.13": ("0.18.0", "0.11.0"),   # cpu (minimal: neither)
    "2.14": ("0.18.0", "0.11.0"),   # latest
}

CELL_TEMPLATE = '''\
# Colab only (elsewhere this cell does nothing): clone the course, install it beside Colab's own torch
# with torchao and torchdata matched to that torch, and work from the clone.
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess
    clone = os.environ.get("{folder_env}", "/content/{name}")
    if not os.path.isdir(clone):
        source = os.environ.get("{source_env}", "{url}")
        subprocess.run(["git", "clone", "--depth", "1", source, clone], check=True)
    subprocess.run([sys.executable, "-m", "helpers.colab", "setup"], cwd=clone, check=True)
    os.chdir(clone)
    sys.path.insert(0, clone)
'''


def repository_url(pyproject: Path = REPO / "pyproject.toml") -> str:
    """[project.urls] Repository: the one place a fork names itself."""
    import tomllib
    return tomllib.loads(pyproject.read_text())["project"]["urls"]["Repository"]


def cell_source(url: str | None = None) -> str:
    url = url or repository_url()
    name = url.rstrip("/").removesuffix(".git").rsplit("/", 1)[-1]
    return CELL_TEMPLATE.format(url=url, name=name, source_env=SOURCE_ENV, folder_env=FOLDER_ENV).rstrip("\n")


def with_cell(nb, source: str):
    """The notebook with `source` as its first code cell, tagged CELL_TAG: the tagged cell rewritten, or a
    new one put before the first code cell (after the markdown card). Returns whether anything changed."""
    import nbformat
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    first = nb.cells[code[0]] if code else None
    if first is not None and CELL_TAG in first.get("metadata", {}).get("tags", []):
        changed = first.source != source
        first.source = source
        return changed
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [CELL_TAG]})
    nb.cells.insert(code[0] if code else len(nb.cells), cell)
    return True


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def matched(torch_version: str) -> tuple[str, str] | None:
    return MATCHED.get(minor(torch_version))


def _pip(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args]).returncode


def setup(clone: Path = REPO) -> int:
    """Install the package from `clone` beside the torch already installed, then torchao and torchdata at
    the versions MATCHED to it; one line per step. Returns the exit status."""
    torch_version = installed("torch")
    if torch_version is None:
        print("torch: not installed; install torch first (Colab ships one)")
        return 1
    print(f"torch {torch_version}: kept as installed")
    # naming the installed torch pins it: pip resolves the package's other dependencies around it
    if _pip("-e", str(clone), f"torch=={torch_version}") != 0:
        print(f"{PACKAGE}: pip failed (its output is above)")
        return 1
    print(f"{PACKAGE}: installed from {clone} (editable), with its dependencies other than torch")
    versions = matched(torch_version)
    if versions is None:
        print(f"torchao, torchdata: not installed: helpers/colab.py matches no versions to torch "
              f"{minor(torch_version)} (it knows {', '.join(MATCHED)}); the sections that need them skip and say why")
        return 0
    wanted = dict(zip(("torchao", "torchdata"), versions))
    if all(installed(name) == version for name, version in wanted.items()):
        print(f"torchao {wanted['torchao']}, torchdata {wanted['torchdata']}: already installed")
        return 0
    # --no-deps: neither may pull another torch
    if _pip("--no-deps", *(f"{name}=={version}" for name, version in wanted.items())) != 0:
        print("torchao, torchdata: pip failed (its output is above)")
        return 1
    print(f"torchao {wanted['torchao']}, torchdata {wanted['torchdata']}: installed, matched to torch "
          f"{minor(torch_version)}")
    return 0


# `make colab-check`: the cell as Colab runs it, in a fresh interpreter whose import path does not hold
# this repository; then what it must have left behind.
CHECK_PROGRAM = '''\
import importlib.metadata, subprocess, sys, types
sys.modules["google.colab"] = types.ModuleType("google.colab")
exec(compile({cell!r}, "colab-setup cell", "exec"))
import helpers
assert helpers.__file__.startswith({clone!r}), f"helpers imported from {{helpers.__file__}}, not the clone"
found = {{name: importlib.metadata.version(name) for name in ("torch", "torchao", "torchdata")}}
assert found == {wanted!r}, f"installed {{found}}, expected {wanted!r}"
subprocess.run([sys.executable, "-m", "helpers", "doctor"], check=True)
import torch
print(f"colab-check passed: torch {{torch.__version__}} kept, torchao {{found['torchao']}}, "
      f"torchdata {{found['torchdata']}}, helpers from {{helpers.__file__}}")
'''


def check(source: str, torch_version: str) -> int:
    """Run the cell with a stand-in google.colab module in this interpreter's environment (which holds only
    torch `torch_version`), cloning `source` into a temporary folder; returns the exit status."""
    versions = matched(torch_version)
    if versions is None:
        print(f"colab-check: helpers/colab.py matches no torchao and torchdata to torch {torch_version}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        clone = os.path.join(tmp, "clone")
        wanted = {"torch": torch_version, "torchao": versions[0], "torchdata": versions[1]}
        program = CHECK_PROGRAM.format(cell=cell_source(), clone=clone, wanted=wanted)
        env = {**os.environ, SOURCE_ENV: source, FOLDER_ENV: clone}
        return subprocess.run([sys.executable, "-c", program], cwd=tmp, env=env).returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["setup"] and len(sys.argv) == 2:
        sys.exit(setup())
    if sys.argv[1:2] == ["check"] and len(sys.argv) == 4:
        sys.exit(check(*sys.argv[2:]))
    sys.exit("usage: python -m helpers.colab setup                      (from a clone of the repository)\n"
             "       python -m helpers.colab check SOURCE TORCH_VERSION  (make colab-check)")
