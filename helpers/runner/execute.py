"""Execute notebooks headless with papermill, one kernel each, and record what happened.

    run_collection(out_dir="runs/x", parameters={"QUICK": True}, workers=2)   # every manifest entry

Each notebook runs in its own processes (helpers.runner.job), N at a time on this machine or on a
Dask cluster. The run folder gets the executed notebooks, record.json (rewritten atomically after
every notebook, so an interrupted run loses nothing and `resume=True` skips what passed), and
report.html.
"""
from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from helpers.device import capabilities, skip_reason
from helpers.files import write_text_atomic
from helpers.manifest import REPO, entries
from helpers.runner.job import execute_job, make_job, stop_all

NOTEBOOK_BUDGET_GB = 1.5      # a quick-mode notebook's memory budget: Binder's limit, with its CPU-only torch
GPU_BUILD_BUDGET_GB = 2.0     # with a CUDA, ROCm or XPU build of torch, whose every process (kernel, compile
                              # workers, spawned ranks) maps the GPU libraries: about 0.5 GB more, measured


def memory_budget_gb(caps=None) -> float:
    """A quick-mode notebook's memory budget with the torch installed here."""
    caps = caps or capabilities()
    return NOTEBOOK_BUDGET_GB if caps.build_accelerator is None else GPU_BUILD_BUDGET_GB


def section_problems(declared: list[dict], recorded: list[dict]) -> list[str]:
    """The silent-skip guard: every declared section must report in, nothing undeclared may, and
    no section may be skipped on a machine that has what it needs."""
    problems = []
    names = {s["name"] for s in declared if s["name"] != "*"}
    seen = {r["section"] for r in recorded}
    problems += [f"section '{n}' never reported run or skipped (silent skip?)" for n in sorted(names - seen)]
    problems += [f"section '{n}' is not declared in helpers/manifest.json" for n in sorted(seen - names)]
    for r in recorded:
        if not r["ran"] and skip_reason(r["needs"]) is None:
            problems.append(f"section '{r['section']}' was skipped although this machine has "
                            f"{', '.join(r['needs'])}")
    return problems


def default_workers() -> int:
    """What this machine can take: one notebook per core, as many as the free memory holds."""
    import psutil
    by_memory = int(psutil.virtual_memory().available / 2**30 / memory_budget_gb())
    return max(1, min(capabilities().cpu_count, by_memory))


def read_parameters(path: str | Path) -> dict:
    """Parameters from a JSON or YAML file holding one mapping of name to value."""
    text = Path(path).read_text()
    if Path(path).suffix in (".yaml", ".yml"):
        import yaml
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of parameter names to values, got {type(data).__name__}")
    return data


def _key(path: str | Path) -> str:
    """Repository-relative path for notebooks in the repository, absolute otherwise."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = REPO / p
    full = p.resolve()
    try:
        return str(full.relative_to(REPO))
    except ValueError:
        return str(full)


def _executed_path(out_dir: Path, key: str) -> Path:
    rel = Path(key)
    return out_dir / "notebooks" / (rel if not rel.is_absolute() else Path("external") / rel.name)


def _finish(done: dict, out_dir: Path, declared: dict) -> dict:
    """Store one job's executed notebook and complete its record with the section guard."""
    record = done["record"]
    executed = _executed_path(out_dir, record["path"])
    if done["notebook"] is not None:
        write_text_atomic(done["notebook"], executed)
        record["executed"] = str(executed.relative_to(out_dir))
    record["problems"] = []
    if record["path"] in declared:
        record["problems"] = section_problems(declared[record["path"]], record["sections"])
        if record["status"] == "passed" and record["problems"]:
            record["status"], record["fault"] = "failed", "section-problems"
            record["detail"] = "; ".join(record["problems"])
    return record


def run_notebook(path: str, out_dir: str, parameters: dict, cell_timeout: float,
                 notebook_timeout: float = 900, memory_limit_mb: float | None = None) -> dict:
    """Execute one notebook into out_dir/notebooks/PATH; returns its record."""
    key = _key(path)
    source = (REPO / key if not Path(key).is_absolute() else Path(key)).read_text()
    job = make_job(key, source, parameters, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout,
                   memory_limit_mb=memory_limit_mb)
    declared = {e["path"]: e["sections"] for e in entries()}
    return _finish(execute_job(job), Path(out_dir), declared)


def _local(jobs: list[dict], workers: int):
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="worker")
    try:
        futures = {pool.submit(execute_job, job): job for job in jobs}
        for future in as_completed(futures):
            yield futures[future], future
    finally:   # on Ctrl-C, notebooks not started yet never start
        pool.shutdown(wait=True, cancel_futures=True)


def _dask(jobs: list[dict], scheduler: str):
    from distributed import Client, as_completed as dask_completed
    with Client(scheduler, timeout="30s") as client:
        futures = {client.submit(execute_job, job, pure=False, key=f"notebook-{uuid.uuid4().hex}"): job
                   for job in jobs}
        for future in dask_completed(list(futures)):
            yield futures[future], future


def _failed_job(job: dict, exc: BaseException) -> dict:
    """A job whose worker failed (a lost Dask worker, say): recorded, never silently dropped."""
    now = time.time()
    return {"notebook": None, "record": {
        "path": job["path"], "status": "failed", "fault": "runner-error",
        "detail": f"{type(exc).__name__}: {exc}"[:500],
        "error": {"ename": type(exc).__name__, "evalue": str(exc)[:500]},
        "sections": [], "peak_memory_mb": None, "started": now, "finished": now, "seconds": 0.0, "worker": "?"}}


def run_collection(paths: list[str] | None = None, *, out_dir: str | Path, parameters: dict | None = None,
                   workers: int | None = None, cell_timeout: float = 300, notebook_timeout: float = 900,
                   memory_limit_mb: float | None = None, executor: str = "local", scheduler: str | None = None,
                   resume: bool = False, progress: bool = False, label: str = "") -> dict:
    """Execute notebooks (default: every manifest entry); writes out_dir/record.json and report.html.

    paths: manifest paths or any .ipynb files. executor: "local" (N notebooks at a time here) or
    "dask" (scheduler: a dask.distributed address). resume: keep the notebooks that already passed
    in out_dir/record.json with the same parameters. label: this environment's or machine's name in
    merged reports (helpers.runner.matrix)."""
    from tqdm.auto import tqdm

    from helpers.runner.report import write_report
    if executor not in ("local", "dask"):
        raise ValueError(f"executor must be 'local' or 'dask', not {executor!r}")
    if executor == "dask" and not scheduler:
        raise ValueError("--executor dask needs --scheduler ADDRESS (e.g. tcp://10.0.0.5:8786)")
    items = {e["path"]: e for e in entries()}
    keys = [_key(p) for p in paths] if paths else list(items)
    missing = [p for p, k in zip(paths or keys, keys) if k not in items and not Path(k).is_file()
               and not (REPO / k).is_file()]
    if missing:
        raise ValueError(f"not in helpers/manifest.json: {', '.join(map(str, missing))} (and no such notebook file)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parameters = {"QUICK": True} if parameters is None else parameters
    workers = workers or default_workers()
    declared = {path: e["sections"] for path, e in items.items()}

    kept = {}
    if resume and (out_dir / "record.json").exists():
        before = json.loads((out_dir / "record.json").read_text())
        if before.get("parameters") == parameters:
            kept = {r["path"]: {**r, "resumed": True} for r in before["notebooks"] if r["status"] == "passed"
                    and (out_dir / r.get("executed", "-")).is_file()}
    jobs = []
    for key in keys:
        if key in kept:
            continue
        source = (Path(key) if Path(key).is_absolute() else REPO / key).read_bytes().decode("utf-8", "replace")
        jobs.append(make_job(key, source, parameters, cell_timeout=cell_timeout,
                             notebook_timeout=notebook_timeout, memory_limit_mb=memory_limit_mb))

    # longest first (the manifest's quick_seconds), so the slowest notebook does not start last
    jobs.sort(key=lambda job: -items.get(job["path"], {}).get("quick_seconds", 0))
    start = time.time()
    records = dict(kept)
    summary = {"label": label, "parameters": parameters, "executor": executor, "scheduler": scheduler, "workers": workers,
               "cell_timeout": cell_timeout, "notebook_timeout": notebook_timeout,
               "memory_limit_mb": memory_limit_mb, "machine": capabilities().to_dict(), "started": start}

    def save(complete: bool) -> dict:
        ordered = [records[k] for k in keys if k in records]
        faults = {}
        for r in ordered:
            if r["fault"]:
                faults[r["fault"]] = faults.get(r["fault"], 0) + 1
        summary.update(complete=complete, total_seconds=round(time.time() - start, 2),
                       passed=sum(r["status"] == "passed" for r in ordered),
                       failed=sum(r["status"] != "passed" for r in ordered), faults=faults,
                       resumed=sum(bool(r.get("resumed")) for r in ordered), notebooks=ordered)
        write_text_atomic(json.dumps(summary, indent=2), out_dir / "record.json")
        return summary

    work = _local(jobs, workers) if executor == "local" else _dask(jobs, scheduler)
    with tqdm(total=len(keys), initial=len(kept), desc="notebooks", unit="nb", disable=not progress) as bar:
        try:
            for job, future in work:
                try:
                    done = future.result()
                except Exception as exc:   # the worker itself failed; the other notebooks go on
                    done = _failed_job(job, exc)
                record = _finish(done, out_dir, declared)
                records[record["path"]] = record
                save(complete=False)
                bar.set_postfix_str(f"{Path(record['path']).name}: {record['fault'] or 'passed'}")
                bar.update()
        except KeyboardInterrupt:   # keep what finished (record.json says complete: false); --resume goes on
            stop_all()
            work.close()
            write_report(save(complete=False), out_dir)
            raise
    summary = save(complete=True)
    write_report(summary, out_dir)
    return summary
