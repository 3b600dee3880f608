"""One unit of batch work: execute one notebook in its own processes, under a time and memory limit,
and classify what went wrong. The same function runs in the local pool and on Dask workers: a job
carries the notebook's text and returns the executed notebook's text, so workers need no shared disk.

Faults (record["fault"]):
  cell-error          a cell raised (the error cell is in record["error"])
  cell-timeout        one cell ran longer than the per-cell timeout
  notebook-timeout    the whole notebook ran longer than the per-notebook timeout; stopped
  kernel-died         the kernel process ended: os._exit(n), a segfault, or a signal (detail says which)
  out-of-memory       over the memory limit (stopped by the runner), MemoryError, or a failed allocation
  malformed-notebook  the .ipynb is not valid JSON or not a valid notebook
  unknown-parameter   a parameter the notebook's `parameters` cell does not declare
  runner-error        the runner itself failed (a bug here, not in the notebook)
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from helpers.files import read_json_lines
from helpers.env import FIGURES_LOG_ENV, HEADLESS_ENV, SECTION_LOG_ENV
from helpers.processes import kill, memory_mb, process_tree
from helpers.progress import PROGRESS_ENV

REPO = Path(__file__).resolve().parent.parent.parent
POLL_SECONDS = 0.1
_LIVE: set[int] = set()       # driver pids of the jobs running in this process, for stop_all()
OOM_WORDS = ("can't allocate memory", "out of memory", "cannot allocate memory")


def make_job(path: str, source: str, parameters: dict, *, cell_timeout: float, notebook_timeout: float,
             memory_limit_mb: float | None = None) -> dict:
    """A JSON-ready job. `path` is relative to the repository when the notebook lives in it."""
    return {"path": path, "source": source, "parameters": parameters, "cell_timeout": cell_timeout,
            "notebook_timeout": notebook_timeout, "memory_limit_mb": memory_limit_mb}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def stop_all() -> None:
    """Kill every notebook this process is running (their drivers and kernels): on Ctrl-C."""
    for pid in list(_LIVE):
        try:
            proc = psutil.Process(pid)
            kill(process_tree(proc) + [proc])
        except psutil.Error:
            pass


def _check_notebook(source: str, parameters: dict, workdir: Path) -> tuple[str, str] | None:
    """(fault, detail) for a malformed notebook or an unknown parameter; None when it can run."""
    import nbformat
    import papermill
    try:
        nb = nbformat.reads(source, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:   # JSON errors, schema errors, unreadable versions
        return "malformed-notebook", f"{type(exc).__name__}: {str(exc)[:500]}"
    probe = workdir / "inspect.ipynb"
    probe.write_text(source)
    declared = papermill.inspect_notebook(str(probe))
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        return "unknown-parameter", (f"{', '.join(unknown)} not declared in the notebook's parameters cell "
                                     f"(it declares: {', '.join(sorted(declared)) or 'nothing'})")
    return None


def _read_notebook(path: Path):
    import nbformat
    try:
        return nbformat.read(str(path), as_version=4)
    except Exception:   # a notebook cut off by a kill mid-write is simply not there
        return None


def _error_cell(nb, result: dict, source: str) -> dict | None:
    """The cell that raised (its error output), or the last one started (for timeouts and deaths).
    "cell" is its index in the submitted notebook (papermill inserts cells into the executed copy)."""
    if nb is None:
        return None
    import nbformat
    ids = [c.get("id") for c in nbformat.reads(source, as_version=4).cells]

    def entry(cell, ename, evalue):
        index = ids.index(cell.get("id")) if cell.get("id") in ids else None
        return {"cell": index, "ename": ename, "evalue": evalue, "source": cell.source[:600]}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return entry(cell, out["ename"], out["evalue"])
    started = [c for c in nb.cells if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return entry(started[-1], result.get("ename", ""), result.get("evalue", "")) if started else None


def _classify(result: dict, stopped: str | None, job: dict, peak_mb: float) -> tuple[str | None, str]:
    if stopped == "time":
        return "notebook-timeout", f"stopped after {job['notebook_timeout']:g} s (per-notebook timeout)"
    if stopped == "memory":
        return "out-of-memory", (f"the kernel reached {peak_mb:.0f} MB, over the limit of "
                                 f"{job['memory_limit_mb']:g} MB; stopped")
    outcome = result.get("outcome")
    if outcome is None:
        return "runner-error", "the notebook process ended without a result"
    if outcome == "passed":
        return None, ""
    if outcome == "cell-error":
        text = f"{result['ename']}: {result['evalue']}"
        if result["ename"] in ("MemoryError", "OutOfMemoryError") or any(w in text.lower() for w in OOM_WORDS):
            return "out-of-memory", text[:500]
        return "cell-error", text[:500]
    if outcome == "cell-timeout":
        return "cell-timeout", f"a cell ran longer than {job['cell_timeout']:g} s (per-cell timeout)"
    if outcome == "kernel-died":
        code = result.get("kernel_exit")
        if code is None:
            return "kernel-died", "the kernel died (exit status unknown)"
        if code >= 0:
            return "kernel-died", f"the kernel process exited with status {code} (os._exit, or exit() in native code)"
        name = _signal_name(code)
        why = {"SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "an abort",
               "SIGKILL": "killed; the system's out-of-memory killer sends SIGKILL"}.get(name, "a signal")
        return "kernel-died", f"the kernel was ended by {name} ({why})"
    return "runner-error", f"{result.get('ename', '')}: {result.get('evalue', '')}"[:500]


def execute_job(job: dict) -> dict:
    """Execute one notebook; returns {"record": {...}, "notebook": executed .ipynb text or None}."""
    started = time.time()
    record = {"path": job["path"], "status": "failed", "fault": None, "detail": "", "error": None,
              "sections": [], "peak_memory_mb": None, "started": started,
              "worker": f"{socket.gethostname()}/{threading.current_thread().name}"}
    notebook_text = None
    with tempfile.TemporaryDirectory(prefix="labs-run-") as tmp:
        workdir = Path(tmp)
        problem = _check_notebook(job["source"], job["parameters"], workdir)
        if problem:
            record["fault"], record["detail"] = problem
        else:
            src, out = workdir / Path(job["path"]).name, workdir / "executed.ipynb"
            src.write_text(job["source"])
            cwd = REPO / Path(job["path"]).parent
            spec = {"input": str(src), "output": str(out), "parameters": job["parameters"],
                    "cwd": str(cwd if cwd.is_dir() else workdir), "cell_timeout": job["cell_timeout"],
                    "result": str(workdir / "result.json")}
            (workdir / "job.json").write_text(json.dumps(spec))
            log, figures = workdir / "sections.jsonl", workdir / "figures.jsonl"
            env = {**os.environ, SECTION_LOG_ENV: str(log), FIGURES_LOG_ENV: str(figures), HEADLESS_ENV: "1",
                   PROGRESS_ENV: "off", "PYTHONUNBUFFERED": "1"}   # a batch run is no learner's progress
            with open(workdir / "driver.log", "wb") as driver_log:
                driver = subprocess.Popen([sys.executable, "-m", "helpers.runner.drive", str(workdir / "job.json")],
                                          cwd=str(REPO), env=env, stdout=subprocess.DEVNULL, stderr=driver_log,
                                          start_new_session=True)
            _LIVE.add(driver.pid)
            stopped, peak, proc, seen = None, 0.0, psutil.Process(driver.pid), {}
            deadline = started + job["notebook_timeout"]
            while driver.poll() is None:
                for p in process_tree(proc):
                    seen[p.pid] = p
                peak = max(peak, memory_mb(list(seen.values())))
                limit = job.get("memory_limit_mb")
                if limit and peak > limit:
                    stopped = "memory"
                elif time.time() > deadline:
                    stopped = "time"
                if stopped:
                    kill(list(seen.values()) + [proc])
                    driver.wait()
                    break
                time.sleep(POLL_SECONDS)
            kill(list(seen.values()))   # a kernel left behind by a killed driver
            _LIVE.discard(driver.pid)
            result = {}
            if (workdir / "result.json").exists():
                result = json.loads((workdir / "result.json").read_text())
            record["peak_memory_mb"] = round(max(peak, result.get("kernel_max_rss_mb") or 0.0), 1)
            record["fault"], record["detail"] = _classify(result, stopped, job, peak)
            if result.get("kernel_restarted"):
                record["kernel_restarted"] = result["kernel_restarted"]
            if record["fault"] == "runner-error" and not result:
                record["detail"] += ": " + (workdir / "driver.log").read_text()[-800:]
            nb = _read_notebook(out)
            if nb is not None:
                import nbformat
                notebook_text = nbformat.writes(nb)
            if record["fault"]:
                record["error"] = _error_cell(nb, result, job["source"])
            record["sections"] = read_json_lines(log)
            if figures.exists():
                record["figures"] = read_json_lines(figures)
    if record["fault"] and not record["error"]:
        record["error"] = {"ename": record["fault"], "evalue": record["detail"]}
    record["status"] = "passed" if record["fault"] is None else "failed"
    record["finished"] = time.time()
    record["seconds"] = round(record["finished"] - started, 2)
    return {"record": record, "notebook": notebook_text}
