"""Execute notebooks headless with papermill, one kernel each, and record what happened."""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from helpers.device import SECTION_LOG_ENV, capabilities, skip_reason
from helpers.manifest import REPO, entries


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


def _error_cell(executed_path: Path) -> dict | None:
    import nbformat
    if not executed_path.exists():
        return None
    nb = nbformat.read(str(executed_path), as_version=4)
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return {"cell": index, "ename": out["ename"], "evalue": out["evalue"],
                        "source": cell.source[:400]}
    return None


def run_notebook(path: str, out_dir: str, parameters: dict, cell_timeout: int) -> dict:
    """Execute one notebook; returns its record. Runs in a worker process (the env var is per process)."""
    import papermill
    src = REPO / path
    out_dir = Path(out_dir)
    executed = out_dir / "notebooks" / path
    executed.parent.mkdir(parents=True, exist_ok=True)
    log = out_dir / "sections" / (Path(path).stem + ".jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    os.environ[SECTION_LOG_ENV] = str(log)
    start = time.perf_counter()
    record = {"path": path, "status": "passed", "error": None}
    try:
        papermill.execute_notebook(str(src), str(executed), parameters=parameters, cwd=str(src.parent),
                                   execution_timeout=cell_timeout, progress_bar=False, kernel_name="python3")
    except Exception as exc:   # papermill raises PapermillExecutionError, timeouts, dead kernels
        record["status"] = "failed"
        record["error"] = _error_cell(executed) or {"ename": type(exc).__name__, "evalue": str(exc)[:1000]}
    finally:
        os.environ.pop(SECTION_LOG_ENV, None)
    record["seconds"] = round(time.perf_counter() - start, 2)
    record["sections"] = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return record


def run_collection(paths: list[str] | None = None, *, out_dir: str | Path, parameters: dict | None = None,
                   workers: int = 1, cell_timeout: int = 300) -> dict:
    """Execute notebooks (default: every manifest entry) and write out_dir/record.json."""
    items = {e["path"]: e for e in entries()}
    paths = paths or list(items)
    unknown = [p for p in paths if p not in items]
    if unknown:
        raise ValueError(f"not in helpers/manifest.json: {', '.join(unknown)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parameters = parameters or {"QUICK": True}
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_notebook, p, str(out_dir), parameters, cell_timeout) for p in paths]
        records = [f.result() for f in futures]
    for rec in records:
        rec["problems"] = section_problems(items[rec["path"]]["sections"], rec["sections"])
        if rec["status"] == "passed" and rec["problems"]:
            rec["status"] = "failed"
    summary = {"parameters": parameters, "workers": workers, "machine": capabilities().to_dict(),
               "total_seconds": round(time.perf_counter() - start, 2),
               "passed": sum(r["status"] == "passed" for r in records),
               "failed": sum(r["status"] != "passed" for r in records), "notebooks": records}
    (out_dir / "record.json").write_text(json.dumps(summary, indent=2))
    return summary
