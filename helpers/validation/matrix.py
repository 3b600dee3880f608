"""The two-environment driver: the same pipeline under two torch versions, interleaved, compared.

    python -m helpers validate matrix 2.9.1 2.10.0 --quick        # or: make validate-matrix

For each version it makes (or reuses) a venv `.venv-validate-<version>` beside the repository with
`pip install torch==<version>` first (pinned, so pip never picks another build), then
`pip install -r environments/validate.txt` and `pip install --no-deps -e .` (no-deps: the package
declares torch>=2.10, which would replace 2.9.1). pip's own configuration applies (PIP_INDEX_URL,
PIP_FIND_LINKS, its cache), so a machine with the wheels cached installs in seconds.

Then `rounds` rounds, A and B alternating (A B, then B A, A B, B A), every run with identical settings
(`validate run` with the same quick mode, threads, samples); the first round of each runs the upgrade
checks too. Rounds of one version are merged (samples pooled, `pipeline.merge_runs`), the merged A is
compared with the merged B, and everything lands in one folder:

    OUT/torch-<v>/round<i>.json (+ .refs.pt)   each run as it was made
    OUT/torch-<v>.json (+ .refs.pt)            the merged run of that version
    OUT/report.json, OUT/report.html           the comparison
    OUT/matrix.json                            versions, venvs, commands, wall times, exit codes

Interleaving is the point: on a shared machine a slow minute then falls on both sides, not on one, and
round i of A and round i of B form a pair (`stats.py`).

The same version twice (`validate matrix 2.10.0 2.10.0`, `--same-venv` to use one venv) is an A/A run:
the report states how many figures it flagged (false alarms) and the change each could have detected.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.files import write_text_atomic

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "environments" / "validate.txt"
RUN_TIMEOUT_S = 3600
# Every round's environment, unless the caller's already sets it: OpenMP threads that sleep while they wait
# instead of spinning leave the cores to whatever else runs. Kept because it lowered the measured noise: A/A
# rounds of the quick workloads on 2 busy cores, interleaved with the default, median per-pair spread 0.097
# against 0.133 on the log scale (10 pairs). Pinning threads to cores (OMP_PROC_BIND=close, OMP_PLACES=cores)
# raised it (0.190 against 0.132, 8 pairs) and is not used.
ROUND_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def venv_path(version: str, suffix: str = "") -> Path:
    return REPO / f".venv-validate-{version}{suffix}"


def _python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run(cmd: list[str], log, timeout: float | None = None, **kw) -> int:
    log.write(f"$ {' '.join(map(str, cmd))}\n")
    log.flush()
    return subprocess.run(list(map(str, cmd)), stdout=log, stderr=subprocess.STDOUT, timeout=timeout, **kw).returncode


def ensure_venv(version: str, venv: Path, log, python: str = sys.executable) -> dict:
    """Create or update the venv for one torch version; {"venv", "torch", "seconds", "created"}."""
    start = time.perf_counter()
    created = not _python(venv).exists()
    if created:
        base = os.environ.get("VALIDATE_BASE_PYTHON") or getattr(sys, "_base_executable", python)
        if _run([base, "-m", "venv", venv], log):
            raise RuntimeError(f"could not create {venv} (see the log)")
    py = _python(venv)
    steps = [[py, "-m", "pip", "install", "-q", f"torch=={version}"],
             [py, "-m", "pip", "install", "-q", "-r", REQUIREMENTS],
             [py, "-m", "pip", "install", "-q", "--no-deps", "-e", REPO]]
    for step in steps:
        if _run(step, log, cwd=REPO):
            raise RuntimeError(f"failed in {venv}: {' '.join(map(str, step))} (see the log)")
    found = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True).stdout.strip()
    if found.split("+")[0] != version:
        raise RuntimeError(f"{venv} has torch {found!r}, expected {version}")
    return {"venv": venv.name, "torch": found, "seconds": time.perf_counter() - start, "created": created}


def run_matrix(versions: list[str], *, quick: bool = True, rounds: int = 4, threads: int | None = None,
               samples: int | None = None, out: str | Path | None = None, device: str = "cpu",
               run_args: list[str] | None = None, same_venv: bool = False, progress=print) -> dict:
    """Install, run interleaved rounds, merge, compare, write. Returns the matrix record.
    run_args: extra arguments for every `validate run` (e.g. a subset of workloads in a test).
    The same version twice is an A/A calibration: two venvs of that torch, or one venv run as both sides
    (same_venv); the report then says how many figures were flagged (each a false alarm) and the
    change each could have detected."""
    from helpers.validation import pipeline
    if len(versions) != 2:
        raise ValueError(f"give exactly two torch versions (A then B), got {versions}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    total_start = time.perf_counter()
    out = Path(out or REPO / "runs" / "validation-matrix" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or (1 if quick else os.cpu_count() or 1)   # quick: one thread, timed on the CPU clock
    names = [f"torch-{v}" for v in versions]
    suffixes = ["", "-b" if not same_venv else ""] if versions[0] == versions[1] else ["", ""]
    if versions[0] == versions[1]:
        names = [f"torch-{versions[0]}-a", f"torch-{versions[1]}-b"]
    record = {"versions": versions, "quick": quick, "rounds": rounds, "threads": threads, "samples": samples,
              "device": device, "out": str(out.relative_to(REPO) if out.is_relative_to(REPO) else out), "venvs": {}, "runs": [], "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(out / "driver.log", "a") as log:
        for v, name, suffix in zip(versions, names, suffixes):
            if same_venv and name == names[1]:
                record["venvs"][name] = record["venvs"][names[0]]       # A/A in one venv: installed once
                continue
            progress(f"[{name}] preparing {venv_path(v, suffix).name} (pip install torch=={v}, then the package)")
            record["venvs"][name] = ensure_venv(v, venv_path(v, suffix), log)
            progress(f"[{name}] torch {record['venvs'][name]['torch']} ready in "
                     f"{record['venvs'][name]['seconds']:.0f} s")
        for r in range(rounds):
            order = list(zip(versions, names, suffixes))
            if r % 2:
                order.reverse()                                  # A B, B A, A B, ...: no side always first
            for v, name, suffix in order:
                path = out / name / f"round{r + 1}.json"
                cmd = [_python(venv_path(v, suffix)), "-m", "helpers", "validate", "run", "--device", device,
                       "--threads", str(threads), "--label", name, "--out", path, "--no-progress"]
                cmd += ["--quick"] if quick else []
                cmd += ["--samples", str(samples)] if samples else []
                cmd += list(run_args or [])
                if r > 0 and "--checks" not in (run_args or []):
                    cmd += ["--checks"]                          # the checks once per version, in round 1
                start = time.perf_counter()
                rc = _run(cmd, log, timeout=RUN_TIMEOUT_S, cwd=REPO, env=ROUND_ENV | dict(os.environ))
                seconds = time.perf_counter() - start
                record["runs"].append({"version": v, "name": name, "round": r + 1, "exit_code": rc,
                                       "seconds": seconds, "file": str(path.relative_to(out))})
                progress(f"[{name}] round {r + 1}/{rounds}: {seconds:.0f} s, exit {rc}")
                if not path.exists():
                    raise RuntimeError(f"{name} round {r + 1} wrote no run file (exit {rc}); see {out / 'driver.log'}")
    merged = {}
    for name in names:
        runs = [pipeline.load_run(out / name / f"round{r + 1}.json") for r in range(rounds)]
        merged[name] = pipeline.merge_runs(runs, label=name)
        pipeline.save_run(merged[name], out / f"{name}.json")
    report = pipeline.compare_runs(pipeline.load_run(out / f"{names[0]}.json"),
                                   pipeline.load_run(out / f"{names[1]}.json"))
    if versions[0] == versions[1]:
        report["calibration"] = record["calibration"] = pipeline.calibration(report)
    pipeline.write_report_json(report, out / "report.json")
    pipeline.write_report(report, out / "report.html")
    write_text_atomic(pipeline.table(report), out / "report.txt")
    record["total_seconds"] = time.perf_counter() - total_start
    record["findings"] = len(report["regressions"])
    write_text_atomic(json.dumps(record, indent=2), out / "matrix.json")
    latest = out.parent / "LATEST"
    write_text_atomic(out.name + "\n", latest)
    return record | {"report": report}


def latest_matrix(root: str | Path | None = None) -> Path | None:
    """The folder of the newest complete driver run under runs/validation-matrix, or None."""
    root = Path(root or REPO / "runs" / "validation-matrix")
    pointer = root / "LATEST"
    if pointer.exists():
        folder = root / pointer.read_text().strip()
        if (folder / "report.json").exists():
            return folder
    done = sorted(p.parent for p in root.glob("*/report.json"))
    return done[-1] if done else None
