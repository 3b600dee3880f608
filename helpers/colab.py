"""Colab: the first code cell of every notebook, and the set-up it runs beside Colab's own torch.

Colab ships its own CUDA build of torch. The cell (CELL_TEMPLATE, written into every notebook by
`python -m helpers notebooks colab-cell` with the repository URL of pyproject.toml's [project.urls] and the
path a learner opens) does nothing outside Colab; in Colab it clones the repository once, runs `python -m
helpers.colab setup` there, which installs this package without letting pip resolve torch, then torchao and
torchdata at the versions MATCHED to the torch it finds, and moves into the notebook's own folder of the
clone. `helpers.device` then says which sections skip, and why.

Standard library only at import (and helpers.env, which imports nothing), no torch: this runs from a fresh
clone before anything is installed.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from helpers.env import NOTEBOOK_ENV

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "pytorch-210-labs"
SOURCE_ENV, FOLDER_ENV = "LABS_COLAB_SOURCE", "LABS_COLAB_DIR"   # overrides, for the CI check of the cell
TARGET_TORCH = (2, 10)

# package -> {torch minor version: the version installed beside it}. Each package has rows of its own, so a
# torch may get one package and not the other; every row is a torch of the environments matrix, with that
# environment's pin (tests/test_colab.py holds the tables to environments/*.txt). torchao's binaries are built
# per torch (0.16.0's for 2.10.0 only; 0.17.0 and later load on torch >= 2.11); torchdata is pure Python.
MATCHED = {
    "torchao": {"2.10": "0.16.0", "2.13": "0.18.0", "2.14": "0.18.0"},
    "torchdata": {"2.10": "0.11.0", "2.13": "0.11.0", "2.14": "0.11.0"},
}

CELL_TEMPLATE = '''\
# Colab only (elsewhere this cell does nothing): clone the course once, install it beside Colab's own torch
# with torchao and torchdata matched to that torch, and work from this notebook's folder of the clone.
import sys

if "google.colab" in sys.modules:
    import os
    import shutil
    import subprocess
    clone = os.environ.get("{folder_env}", "/content/{name}")
    if not os.path.isdir(os.path.join(clone, ".git")):
        shutil.rmtree(clone, ignore_errors=True)   # a clone cut short
        source = os.environ.get("{source_env}", "{url}")
        subprocess.run(["git", "clone", "--depth", "1", source, clone], check=True)
    subprocess.run([sys.executable, "-m", "helpers.colab", "setup"], cwd=clone, check=True)
    if clone not in sys.path:
        sys.path.insert(0, clone)
    os.environ["{notebook_env}"] = "{path}"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "{folder}"))
'''


def repository_url(pyproject: Path = REPO / "pyproject.toml") -> str:
    """[project.urls] Repository: the one place a fork names itself."""
    import tomllib
    return tomllib.loads(pyproject.read_text())["project"]["urls"]["Repository"]


def learner_path(path: str) -> str:
    """The repository path a learner opens for the notebook at `path`: a lab solution's student copy
    (labs/NN_topic_lab.ipynb for labs/solutions/NN_topic_lab.ipynb), any other notebook itself."""
    posix = PurePosixPath(path)
    return str(posix.parent.parent / posix.name) if posix.parent.name == "solutions" else path


def cell_source(url: str, path: str) -> str:
    """The cell of the notebook a learner opens at repository path `path`, cloning `url`."""
    name = url.rstrip("/").removesuffix(".git").rsplit("/", 1)[-1]
    return CELL_TEMPLATE.format(url=url, name=name, source_env=SOURCE_ENV, folder_env=FOLDER_ENV,
                                notebook_env=NOTEBOOK_ENV, path=path,
                                folder=PurePosixPath(path).parent).rstrip("\n")


def with_cell(nb, source: str):
    """The notebook with `source` as its first code cell, tagged COLAB_TAG: the tagged cell rewritten, or a
    new one put before the first code cell (after the markdown card). Returns whether anything changed."""
    import nbformat

    from helpers.notebooks import COLAB_TAG
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    first = nb.cells[code[0]] if code else None
    if first is not None and COLAB_TAG in first.get("metadata", {}).get("tags", []):
        changed = first.source != source
        first.source = source
        return changed
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [COLAB_TAG]})
    nb.cells.insert(code[0] if code else len(nb.cells), cell)
    return True


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def editable_from(clone: Path) -> bool:
    """Whether PACKAGE is installed editable from `clone`: pip's record of it (direct_url.json) in any of its
    metadata folders on the path (the clone's own egg-info folder, which records nothing, may come first)."""
    for distribution in importlib.metadata.distributions(name=PACKAGE):
        record = json.loads(distribution.read_text("direct_url.json") or "{}")
        url = urlparse(record.get("url", ""))
        if (record.get("dir_info", {}).get("editable") and url.scheme == "file"
                and Path(unquote(url.path)).resolve() == Path(clone).resolve()):
            return True
    return False


def minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def matched(torch_version: str) -> dict[str, str | None]:
    """{package: the version MATCHED to this torch, or None where its table has no row for it}."""
    return {name: rows.get(minor(torch_version)) for name, rows in MATCHED.items()}


def older_than_target(torch_version: str) -> bool:
    return tuple(int(part) for part in minor(torch_version).split(".")) < TARGET_TORCH


def dependencies(clone: Path) -> list[str]:
    """The package's [project] dependencies other than torch, as pyproject.toml of `clone` writes them."""
    import tomllib
    requirements = tomllib.loads((clone / "pyproject.toml").read_text())["project"]["dependencies"]
    return [r for r in requirements if re.match(r"[A-Za-z0-9._-]+", r).group().lower() != "torch"]


def sections_needing(packages: list[str], clone: Path) -> list[str]:
    """'id: section' for each section of helpers/manifest.json in `clone` that needs one of `packages`."""
    items = json.loads((clone / "helpers" / "manifest.json").read_text())
    return [f"{item['id']}: {section['name']}" for item in items for section in item["sections"]
            if set(section["needs"]) & set(packages)]


def older_torch_note(torch_version: str, missing: list[str], clone: Path) -> str:
    """One line for a torch older than the course targets: what skips (the sections that need a package
    this set-up leaves missing) and what may fail."""
    target = ".".join(map(str, TARGET_TORCH))
    skipping = (f"; the sections that need {' or '.join(missing)} skip "
                f"({'; '.join(sections_needing(missing, clone))})" if missing else "")
    return (f"torch {torch_version} is older than {target}, which this course targets: it is kept{skipping}; "
            f"code that uses what {target} added may fail (!python -m helpers doctor lists what runs here)")


def _pip(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args]).returncode


def install_matched(name: str, version: str | None, torch_version: str) -> None:
    """One of MATCHED's packages at its version for this torch, without its dependencies (none may pull
    another torch); a line says what happened. Without a version, or when pip fails, it is left as it was."""
    if version is not None and installed(name) == version:
        print(f"{name} {version}: already installed")
    elif version is not None and _pip("--no-deps", f"{name}=={version}") == 0:
        print(f"{name} {version}: installed, matched to torch {minor(torch_version)}")
    else:
        why = (f"pip failed to install {version} (its output is above)" if version is not None else
               f"helpers/colab.py matches no version to torch {minor(torch_version)} (it knows "
               f"{', '.join(MATCHED[name])})")
        current = installed(name)
        print(f"{name}: {why}; " + (f"{current} is kept" if current else
                                    "not installed: the sections that need it skip and say why"))


def setup(clone: Path = REPO) -> int:
    """Install the package from `clone` beside the torch already installed (pip never resolves torch), then
    torchao and torchdata at the versions MATCHED to it; one line per step, or one when a previous run did it
    all. Returns the exit status."""
    torch_version = installed("torch")
    if torch_version is None:
        print("torch: not installed; install torch first (Colab ships one)")
        return 1
    print(f"torch {torch_version}: kept as installed")
    wanted = matched(torch_version)
    if older_than_target(torch_version):
        missing = [name for name, version in wanted.items() if version is None and installed(name) is None]
        print(older_torch_note(torch_version, missing, clone))
    if editable_from(clone) and all(version in (None, installed(name)) for name, version in wanted.items()):
        print(f"{PACKAGE}, torchao, torchdata: already set up from {clone}")
        return 0
    # the dependencies first: the editable install, made last, marks a finished set-up
    if _pip(*dependencies(clone)) != 0 or _pip("--no-deps", "-e", str(clone)) != 0:
        print(f"{PACKAGE}: pip failed (its output is above)")
        return 1
    print(f"{PACKAGE}: installed from {clone} (editable), with its dependencies other than torch")
    for name, version in wanted.items():
        install_matched(name, version, torch_version)
    return 0


# `make colab-check`: the cell as Colab runs it, in a fresh interpreter whose import path does not hold
# this repository; then what it must have left behind, and a second run that finds it all done.
CHECK_PROGRAM = '''\
import importlib.metadata, os, subprocess, sys, types
sys.modules["google.colab"] = types.ModuleType("google.colab")
exec(compile({cell!r}, "colab-setup cell", "exec"))
import helpers
assert helpers.__file__.startswith({clone!r}), f"helpers imported from {{helpers.__file__}}, not the clone"
assert os.path.realpath(os.getcwd()) == os.path.realpath({folder!r}), f"the cell left the kernel in {{os.getcwd()}}"
assert os.environ[{notebook_env!r}] == {path!r}, f"{notebook_env} is {{os.environ[{notebook_env!r}]}}"
found = {{name: importlib.metadata.version(name) for name in ("torch", "torchao", "torchdata")}}
assert found == {wanted!r}, f"installed {{found}}, expected {wanted!r}"
import torch
import torchao, torchdata
again = subprocess.run([sys.executable, "-m", "helpers.colab", "setup"], cwd={clone!r}, capture_output=True,
                       text=True, check=True)
assert "already set up" in again.stdout, f"a second run did more:\\n{{again.stdout}}"
subprocess.run([sys.executable, "-m", "helpers", "doctor"], check=True)
print(f"colab-check passed: torch {{torch.__version__}} kept, torchao {{found['torchao']}}, "
      f"torchdata {{found['torchdata']}} loaded beside it, helpers from {{helpers.__file__}}, "
      f"working in {{os.getcwd()}}")
'''
CHECK_NOTEBOOK = "notebooks/00_start_here.ipynb"


def check(source: str, torch_version: str, path: str = CHECK_NOTEBOOK) -> int:
    """Run the cell of the notebook at `path` with a stand-in google.colab module in this interpreter's
    environment (which holds only torch `torch_version`), cloning `source` into a temporary folder; returns
    the exit status."""
    versions = matched(torch_version)
    if None in versions.values():
        print(f"colab-check: helpers/colab.py matches no torchao or torchdata to torch {torch_version}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        clone = os.path.join(tmp, "clone")
        program = CHECK_PROGRAM.format(
            cell=cell_source(repository_url(), path), clone=clone, path=path, notebook_env=NOTEBOOK_ENV,
            folder=os.path.join(clone, str(PurePosixPath(path).parent)), wanted={"torch": torch_version, **versions})
        env = {**os.environ, SOURCE_ENV: source, FOLDER_ENV: clone}
        return subprocess.run([sys.executable, "-c", program], cwd=tmp, env=env).returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["setup"] and len(sys.argv) == 2:
        sys.exit(setup())
    if sys.argv[1:2] == ["check"] and len(sys.argv) == 4:
        sys.exit(check(*sys.argv[2:]))
    sys.exit("usage: python -m helpers.colab setup                      (from a clone of the repository)\n"
             "       python -m helpers.colab check SOURCE TORCH_VERSION  (make colab-check)")
