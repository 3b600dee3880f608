"""Every environments/ file parses, pins torch, and shares versions of common packages with the others."""
import re
from pathlib import Path

import pytest

ENVS = sorted((Path(__file__).parent.parent / "environments").glob("*.txt"))
# validate.txt serves the validation pipeline's venvs, one per torch version: the driver pins torch itself.
TARGETS = [p for p in ENVS if p.stem != "validate"]
PER_TARGET = {"torch", "torchao", "triton"}   # these follow the torch build, so they may differ


def parse(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("--"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
        assert m, f"{path.name}: not an exact pin: {line!r}"
        assert m.group(1).lower() not in pins, f"{path.name}: {m.group(1)} listed twice"
        pins[m.group(1).lower()] = m.group(2)
    return pins


def test_the_targets_exist():
    assert {p.stem for p in ENVS} == {"cpu", "cuda", "rocm", "xpu", "free-threaded", "latest", "minimal", "validate",
                                      "torch-2.11"}


def test_the_validation_file_leaves_torch_to_the_driver_and_says_how():
    path = next(p for p in ENVS if p.stem == "validate")
    text = path.read_text()
    assert "torch" not in parse(path)
    assert "torch first" in text and "pip install torch==" in text and "--no-deps -e ." in text


@pytest.mark.parametrize("path", TARGETS, ids=lambda p: p.stem)
def test_each_file_says_who_it_is_for_and_installs_torch_first(path):
    text = path.read_text()
    assert text.startswith("# "), "header comment first"
    assert "torch first" in text or "then torch" in text
    pins = parse(path)
    assert "torch" in pins
    if path.stem == "minimal":     # torch alone: the package's own ranges bring the rest, no optional extra
        assert set(pins) == {"torch"}
    elif path.stem.startswith("torch-"):     # a torch for the static check of the GPU sections alone
        assert set(pins) == {"torch", "pytest"} and f"make gpu-sections ENV={path.stem}" in text
    else:
        assert "ipywidgets" in pins and "plotly" in pins
    install_line = next(l for l in text.splitlines() if re.match(r"#\s+pip install torch==", l))
    assert f"torch=={pins['torch']}" in install_line, "the header's first install pins the same torch"


def test_ci_runs_the_static_check_under_torch_2_11():
    root = Path(__file__).parent.parent
    assert "make setup ENV=torch-2.11" in (root / ".ci" / "run").read_text()
    assert "make gpu-sections ENV=torch-2.11" in (root / ".ci" / "run").read_text()
    assert "gpu-sections: setup" in (root / "Makefile").read_text()


def test_cpu_environment_is_the_one_verified_here():
    assert parse(next(p for p in ENVS if p.stem == "cpu"))["torch"] == "2.13.0"


def test_the_matrix_covers_the_course_torch_the_default_and_the_newest():
    pins = {p.stem: parse(p) for p in TARGETS}
    assert pins["cuda"]["torch"] == "2.10.0" and pins["minimal"]["torch"] == pins["cpu"]["torch"]
    newest = max(tuple(map(int, p["torch"].split("."))) for p in pins.values())
    assert tuple(map(int, pins["latest"]["torch"].split("."))) == newest
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    assert "MATRIX_ENVS ?= cpu cuda latest minimal" in makefile


def test_shared_packages_carry_the_same_versions():
    pins = {p.stem: parse(p) for p in ENVS}
    names = set().union(*pins.values()) - PER_TARGET
    for name in names:
        versions = {env: p[name] for env, p in pins.items() if name in p}
        if len(versions) > 1:
            assert len(set(versions.values())) == 1, f"{name} differs: {versions}"
