"""One view of several run folders: each environment or machine is a column, each notebook a row.

    matrix = merge_runs(["runs/cuda", "runs/minimal", "runs/room-pc2"])
    print(matrix_text(matrix))                   # plain text, for release notes
    write_matrix(matrix, "runs/matrix")          # matrix.html and matrix.json

A run folder is what `python -m helpers run --out RUN_DIR` writes (record.json), plus an optional
nbval.xml: JUnit XML of the stored-output check of the same notebooks (`helpers run --check-outputs`,
or `pytest --nbval-lax --junitxml`), read as
one result per notebook ("failed" if any of its cells failed, "skipped" if all were skipped), and an
optional gpu_sections.xml: the JUnit XML of tests/test_gpu_sections.py, the static check of every GPU
section against that environment's torch. In place of a folder, a gpu-check bundle (one JSON file that
`make gpu-check` writes, attached to a GPU verification report) merges as one more environment.
Imports no torch, so it runs wherever the runner runs.
"""
from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from helpers.files import write_text_atomic

BUDGET_MB = 1536    # a quick-mode notebook's memory budget, the Binder limit (NOTEBOOK_BUDGET_GB in
                    # helpers.runner.execute, which is not imported here because it imports torch)
NOT_RUN = "not run"
PACKAGES = ("triton", "torchao", "torchdata")


def environment_name(summary: dict) -> str:
    """The record's label, else e.g. "torch 2.10.0+cu128 / py3.13t / cuda"."""
    label = (summary.get("label") or "").strip()
    if label:
        return label
    m = summary.get("machine") or {}
    python = ".".join(str(m.get("python_version") or "?").split(".")[:2]) + ("t" if m.get("free_threaded") else "")
    return f"torch {m.get('torch_version') or '?'} / py{python} / {m.get('accelerator') or '?'}"


def _build(m: dict) -> str:
    """What the torch build targets, and what it ran on when that differs."""
    if m.get("cuda_version"):
        build = f"CUDA {m['cuda_version']} build"
    elif m.get("hip_version"):
        build = f"HIP {m['hip_version']} build"
    elif m.get("xpu_compiled") or m.get("build_accelerator") == "xpu":
        build = "XPU build"
    elif m.get("build_accelerator"):
        build = f"{m['build_accelerator'].upper()} build"
    else:
        build = "CPU build"
    accelerator = str(m.get("accelerator") or "?")
    ran_on = accelerator.upper() + (f" ({m['device_name']})" if m.get("device_name") else "")
    if m.get("build_accelerator") and m["build_accelerator"] != accelerator:
        return f"{build}, no GPU: ran on {ran_on}"
    return f"{build}, ran on {ran_on}"


def short_build(m: dict) -> str:
    """What the build targets and whether that GPU was there, for a card: "CUDA build, no GPU"."""
    build = _build(m).split(",")[0]
    accelerator = str(m.get("accelerator") or "?")
    if m.get("build_accelerator") and m["build_accelerator"] != accelerator:
        return f"{build}, no GPU"
    return build if accelerator == "cpu" else f"{build} on {m.get('device_name') or accelerator.upper()}"


def environment_description(summary: dict) -> str:
    """Torch version and build, the accelerator used, Python, the optional packages and the CPU."""
    m = summary.get("machine") or {}
    python = f"Python {m.get('python_version') or '?'}, " + (
        f"free-threaded, GIL {'on' if m.get('gil_enabled') else 'off'}" if m.get("free_threaded") else "with GIL")
    packages = m.get("packages") or {}
    extras = ", ".join(f"{p} {packages.get(p) or 'missing'}" for p in PACKAGES)
    return (f"torch {m.get('torch_version') or '?'}, {_build(m)}; {python}; {extras}; "
            f"CPU {m.get('cpu_name') or '?'}, {m.get('cpu_count') or '?'} cores")


def _read_json(path: Path, run_dir) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{run_dir}: cannot read {path.name}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{run_dir}: {path.name} holds a {type(data).__name__}, not a mapping")
    return data


def read_nbval(path: Path, notebooks: list[str]) -> dict[str, str]:
    """Per notebook of `notebooks`: "passed", "failed" or "skipped", from pytest's JUnit XML (its
    classname is the notebook's path with dots for slashes; a cell is a test case)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f"{path.parent}: cannot read {path.name}: {exc}") from None
    by_class = {nb.replace("/", "."): nb for nb in notebooks}
    outcomes: dict[str, set[str]] = {}
    for case in root.iter("testcase"):
        notebook = by_class.get(case.get("classname", ""))
        if notebook is None:
            continue
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcomes.setdefault(notebook, set()).add(outcome)
    return {nb: "failed" if "failed" in seen else "passed" if "passed" in seen else "skipped"
            for nb, seen in outcomes.items()}


def read_static_check(path: Path) -> dict | None:
    """{"passed": n, "failed": [test ids]} from the static check's JUnit XML; None when there is none."""
    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f"{path.parent}: cannot read {path.name}: {exc}") from None
    passed, failed = 0, []
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed.append(case.get("name", "?"))
        elif "skipped" not in kinds:
            passed += 1
    return {"passed": passed, "failed": failed}


def _static_text(env: dict) -> str:
    check = env.get("gpu_sections_check")
    if check is None:
        return ""
    failed = f", {len(check['failed'])} failed ({', '.join(check['failed'][:5])})" if check["failed"] else ""
    return f"; GPU sections static check: {check['passed']} passed{failed}"


def read_bundle(path: Path) -> dict:
    """A gpu-check bundle (`make gpu-check` writes runs/gpu-check/gpu-check-bundle.json, the file a GPU
    verification report attaches): {"record", "gpu_figures", "gpu_sections_check", "doctor"}, checked
    where the matrix reads it."""
    bundle = _read_json(path, path)
    check = bundle.get("gpu_sections_check")
    if not isinstance(bundle.get("record"), dict):
        raise ValueError(f"{path}: not a gpu-check bundle (no record)")
    if check is not None and not (isinstance(check, dict) and isinstance(check.get("passed"), int)
                                  and isinstance(check.get("failed"), list)
                                  and all(isinstance(name, str) for name in check["failed"])):
        raise ValueError(f"{path}: its gpu_sections_check is not {{'passed': N, 'failed': [test ids]}}")
    return bundle


def static_check(run_dir: str | Path) -> dict | None:
    """The static check of the GPU sections of a run folder (its gpu_sections.xml) or of a bundle."""
    path = Path(run_dir)
    if path.is_file():
        return read_bundle(path).get("gpu_sections_check")
    return read_static_check(path / "gpu_sections.xml")


def read_run(run_dir: str | Path) -> tuple[dict, dict]:
    """(record.json, nbval results by notebook path, empty without nbval.xml) of one run folder; a
    gpu-check bundle file in place of a folder gives its record (and no nbval results)."""
    folder = Path(run_dir)
    if folder.is_file():
        summary = read_bundle(folder)["record"]
        if not isinstance(summary.get("notebooks"), list) or not isinstance(summary.get("machine"), dict):
            raise ValueError(f"{run_dir}: the bundle's record is not a run record (no notebooks or machine)")
        return summary, {}
    if not (folder / "record.json").is_file():
        raise ValueError(f"{run_dir}: no record.json here (not a folder written by python -m helpers run)")
    summary = _read_json(folder / "record.json", run_dir)
    if not isinstance(summary.get("notebooks"), list) or not isinstance(summary.get("machine"), dict):
        raise ValueError(f"{run_dir}: record.json is not a run record (no notebooks or machine)")
    nbval = {}
    if (folder / "nbval.xml").is_file():
        nbval = read_nbval(folder / "nbval.xml", [r["path"] for r in summary["notebooks"]])
    return summary, nbval


def _error(record: dict) -> str | None:
    """"cell N: Ename: evalue", or the fault and its detail when no cell raised; None when none."""
    err = record.get("error")
    if err:
        where = f"cell {err['cell']}: " if err.get("cell") is not None else ""
        return f"{where}{err.get('ename', '')}: {err.get('evalue', '')}"
    if record.get("fault"):
        return f"{record['fault']}: {record.get('detail', '')}"
    return None


def _result(notebook: str, environment: str, record: dict | None, nbval: dict) -> dict:
    sections = (record or {}).get("sections") or []
    return {"notebook": notebook, "environment": environment,
            "status": record["status"] if record else NOT_RUN,
            "seconds": record.get("seconds") if record else None,
            "peak_memory_mb": record.get("peak_memory_mb") if record else None,
            "sections_run": [s["section"] for s in sections if s["ran"]],
            "sections_skipped": [{"section": s["section"], "reason": s.get("reason")} for s in sections
                                 if not s["ran"]],
            "error": _error(record) if record else None,
            "nbval": nbval.get(notebook)}


def merge_runs(run_dirs: list[str | Path]) -> dict:
    """Read the run folders into one JSON-able matrix: environments (columns), notebooks (rows,
    first-seen order) and one result per notebook and environment ("not run" where it is missing).
    Environments of the same name (one label on a room's machines) get " #2", " #3", ..."""
    if not run_dirs:
        raise ValueError("no run folders given")
    environments, notebooks, runs = [], [], []
    for run_dir in run_dirs:
        summary, nbval = read_run(run_dir)
        base = name = environment_name(summary)
        copy = 1
        while any(env["name"] == name for env in environments):
            copy += 1
            name = f"{base} #{copy}"
        environments.append({"name": name, "description": environment_description(summary),
                             "run_dir": str(run_dir), "torch_version": summary["machine"].get("torch_version"),
                             "build": short_build(summary["machine"]), "passed": summary.get("passed"), "failed": summary.get("failed"),
                             "total_seconds": summary.get("total_seconds"),
                             "complete": bool(summary.get("complete")),
                             "gpu_sections_check": static_check(run_dir)})
        records = {r["path"]: r for r in summary["notebooks"]}
        notebooks += [path for path in records if path not in notebooks]
        runs.append((name, records, nbval))
    results = [_result(notebook, name, records.get(notebook), nbval)
               for notebook in notebooks for name, records, nbval in runs]
    return {"environments": environments, "notebooks": notebooks, "results": results}


def _counts(matrix: dict, environment: str) -> dict:
    counts = {"passed": 0, "failed": 0, NOT_RUN: 0}
    for r in matrix["results"]:
        if r["environment"] == environment:
            counts[r["status"] if r["status"] in counts else "failed"] += 1
    return counts


def _seconds(result: dict) -> str:
    return "-" if result["seconds"] is None else f"{result['seconds']:.1f} s"


def _peak(result: dict) -> str:
    return "-" if result["peak_memory_mb"] is None else f"{result['peak_memory_mb']:.0f} MB"


def matrix_text(matrix: dict) -> str:
    """One aligned line per notebook and environment, then one summary line per environment."""
    nb_width = max([len("notebook")] + [len(n) for n in matrix["notebooks"]])
    env_width = max([len("environment")] + [len(e["name"]) for e in matrix["environments"]])
    lines = [f"{'notebook':<{nb_width}}  {'environment':<{env_width}}  {'status':<7}  {'time':>8}  "
             f"{'peak':>8}  {'sections':<18}  nbval"]
    for r in matrix["results"]:
        sections = (f"run {len(r['sections_run'])}, skipped {len(r['sections_skipped'])}"
                    if r["status"] != NOT_RUN else "-")
        line = (f"{r['notebook']:<{nb_width}}  {r['environment']:<{env_width}}  {r['status']:<7}  "
                f"{_seconds(r):>8}  {_peak(r):>8}  {sections:<18}  {r['nbval'] or '-'}")
        if r["error"]:
            line += f"  {r['error'][:160]}"
        lines.append(line.rstrip())
    lines.append("")
    for env in matrix["environments"]:
        counts = _counts(matrix, env["name"])
        lines.append(f"{env['name']}: {counts['passed']} passed, {counts['failed']} failed"
                     + (f", {counts[NOT_RUN]} not run" if counts[NOT_RUN] else "")
                     + ("" if env["complete"] else " (run incomplete)") + f"; {env['description']}"
                     + _static_text(env))
    return "\n".join(lines)


def _cell(result: dict) -> str:
    """One table cell: status, duration, peak memory, nbval, skipped sections, the error."""
    status = result["status"]
    css = status.replace(" ", "-")
    peak = html.escape(_peak(result))
    if result["peak_memory_mb"] is not None and result["peak_memory_mb"] > BUDGET_MB:
        peak = f"<span class='over-budget' title='over the {BUDGET_MB} MB budget'>{peak}</span>"
    parts = [f"<span class='status'>{html.escape(status)}</span>"]
    if status != NOT_RUN:
        parts.append(f"<div>{html.escape(_seconds(result))} &middot; {peak} &middot; "
                     f"sections run {len(result['sections_run'])}</div>")
    if result["nbval"]:
        parts.append(f"<div class='nbval-{html.escape(result['nbval'])}'>nbval {html.escape(result['nbval'])}</div>")
    if result["sections_skipped"]:
        items = "".join(f"<li>{html.escape(s['section'])}: {html.escape(str(s['reason'] or 'no reason given'))}</li>"
                        for s in result["sections_skipped"])
        parts.append(f"<details><summary>{len(result['sections_skipped'])} skipped</summary><ul>{items}</ul></details>")
    if result["error"]:
        parts.append(f"<pre class='error'>{html.escape(result['error'][:1000])}</pre>")
    return f"<td class='{css}'>{''.join(parts)}</td>"


def _environment_item(matrix: dict, env: dict) -> str:
    counts = _counts(matrix, env["name"])
    return (f"<li><b>{html.escape(env['name'])}</b>: {html.escape(env['description'])}. "
            f"{counts['passed']} passed, {counts['failed']} failed"
            + (f", {counts[NOT_RUN]} not run" if counts[NOT_RUN] else "")
            + ("" if env["complete"] else ", <b>run incomplete</b>")
            + (f", {env['total_seconds']:.1f} s" if env["total_seconds"] is not None else "")
            + html.escape(_static_text(env))
            + f". Run folder: <code>{html.escape(env['run_dir'])}</code></li>")


def matrix_html(matrix: dict) -> str:
    """A self-contained page (HTML and CSS only): the environments, then notebooks by environments."""
    envs = "".join(_environment_item(matrix, e) for e in matrix["environments"])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Notebook matrix</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}}
td.passed .status{{color:#2e7d32;font-weight:bold}} td.failed .status{{color:#c62828;font-weight:bold}}
td.failed{{background:#fdecea}} td.not-run{{background:#f0f0f0}} td.not-run .status{{color:#757575}}
.over-budget{{background:#ffe082;font-weight:bold}} .nbval-failed{{color:#c62828}}
pre.error{{white-space:pre-wrap;max-width:40em;max-height:12em;overflow:auto;background:#f5f5f5;padding:4px}}
</style></head><body>
<h1>Notebook matrix: {len(matrix['notebooks'])} notebooks, {len(matrix['environments'])} environments</h1>
<ul>{envs}</ul>
<p>Peak memory over {BUDGET_MB} MB (the Binder budget) is highlighted.</p>
{matrix_table(matrix)}
</body></html>
"""


def matrix_table(matrix: dict) -> str:
    """The notebooks-by-environments table (HTML), also the course site's status page."""
    by_cell = {(r["notebook"], r["environment"]): r for r in matrix["results"]}
    head = "".join(f"<th scope='col'>{html.escape(e['name'])}</th>" for e in matrix["environments"])
    rows = "".join(
        f"<tr><th scope='row'>{html.escape(nb)}</th>"
        + "".join(_cell(by_cell[nb, e["name"]]) for e in matrix["environments"]) + "</tr>"
        for nb in matrix["notebooks"])
    return f"<table class='status-table'><tr><th scope='col'>notebook</th>{head}</tr>\n{rows}\n</table>"


def write_matrix(matrix: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write OUT_DIR/matrix.html and OUT_DIR/matrix.json; returns their paths."""
    out_dir = Path(out_dir)
    return (write_text_atomic(matrix_html(matrix), out_dir / "matrix.html"),
            write_text_atomic(json.dumps(matrix, indent=2), out_dir / "matrix.json"))
