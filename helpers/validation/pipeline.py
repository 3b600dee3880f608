"""Run the workloads and upgrade checks into one JSON file; compare two such files.

    run = run_pipeline(quick=True, threads=1, label="1 thread")      # a dict, JSON-ready
    save_run(run, "a.json")
    report = compare_runs(load_run("a.json"), load_run("b.json"))    # rows with ratios and flags
    write_report(report, "report.html")                               # table + plotly chart

A workload or check that fails is recorded in the run's "errors" with its message, and the rest of the
run goes on. A file that is not a run raises a ValueError naming the file and what is wrong.
"""
from __future__ import annotations

import html
import json
import platform
import time
import traceback
from pathlib import Path

import torch
from tqdm.auto import tqdm

from helpers.bench import save_json
from helpers.device import capabilities, pick_device
from helpers.files import write_text_atomic
from helpers.validation.upgrade import CHECKS
from helpers.validation.workloads import WORKLOADS

SCHEMA = "pytorch-210-labs/validation-run/1"
MIN_CHANGE = 0.02     # changes under 2% are never flagged, however tight the spread


def run_pipeline(quick: bool = True, *, device: str = "auto", threads: int | None = None, compile: bool = False,
                 workloads: list[str] | None = None, checks: list[str] | None = None, repeats: int | None = None,
                 min_run_time: float | None = None, label: str = "", progress: bool = True) -> dict:
    """Run the selected workloads (default: all four) and upgrade checks (default: all four)."""
    workloads = list(WORKLOADS) if workloads is None else list(workloads)
    checks = list(CHECKS) if checks is None else list(checks)
    unknown = [w for w in workloads if w not in WORKLOADS] + [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown workload or check {unknown[0]!r}; workloads: {', '.join(WORKLOADS)}; "
                         f"checks: {', '.join(CHECKS)}")
    dev = pick_device(device)
    threads = threads or torch.get_num_threads()
    repeats = repeats or (3 if quick else 7)
    min_run_time = min_run_time or (0.02 if quick else 0.2)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)         # the whole run at one thread count: no recompiles, one setting
    run = {"schema": SCHEMA, "label": label or f"{threads} threads{', compiled' if compile else ''}",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "device": str(dev),
           "quick": quick, "compile": compile, "threads": threads, "repeats": repeats,
           "environment": environment(), "workloads": {}, "checks": {}, "errors": {}}
    steps = [("workload", w) for w in workloads] + [("check", c) for c in checks]
    try:
        for kind, name in tqdm(steps, desc="validation", disable=not progress, leave=False):
            start = time.perf_counter()
            try:
                if kind == "workload":
                    result = WORKLOADS[name](quick, dev, compile=compile, repeats=repeats, min_run_time=min_run_time)
                    run["workloads"][name] = result | {"seconds": time.perf_counter() - start}
                else:
                    result = CHECKS[name](quick, dev)
                    run["checks"][name] = result | {"seconds": time.perf_counter() - start}
            except Exception as exc:       # recorded, and the rest of the run goes on
                run["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
    finally:
        torch.set_num_threads(old_threads)
    return run


def environment() -> dict:
    c = capabilities()
    return {"python": platform.python_version(), "platform": platform.platform(), "accelerator": c.accelerator,
            "device_name": c.device_name, "arch": c.arch, "cpu": c.cpu_name, "cpu_count": c.cpu_count,
            "bf16": c.bf16, "packages": c.packages}


def save_run(run: dict, path: str | Path) -> Path:
    return save_json(run, path)


def load_run(path: str | Path) -> dict:
    """Read a run file; a missing, unreadable or foreign file raises ValueError saying which and why."""
    path = Path(path)
    try:
        run = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such run file; create one with "
                         f"`python -m helpers validate run --out {path}`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is corrupt or truncated: "
                         f"re-run `python -m helpers validate run --out {path}`") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a validation run (expected \"schema\": \"{SCHEMA}\"); "
                         f"create one with `python -m helpers validate run`")
    for key in ("workloads", "checks"):
        if not isinstance(run.get(key), dict):
            raise ValueError(f"{path}: \"{key}\" is missing or not an object; the file is damaged")
    run.setdefault("errors", {})
    return run


def _figure_ok(fig) -> bool:
    return (isinstance(fig, dict) and fig.get("better") in ("lower", "higher")
            and all(isinstance(fig.get(k), (int, float)) for k in ("value", "min", "max")) and fig["value"] > 0)


def _noise(fig: dict) -> float:
    """Relative half-width of the measured range (min to max over repeats)."""
    return (fig["max"] - fig["min"]) / (2 * fig["value"])


def compare_runs(a: dict, b: dict, min_change: float = MIN_CHANGE) -> dict:
    """Every figure of run A against run B: "gain" is how many times better B is than A (>1: B better,
    whether the figure is a time or a throughput). A change is flagged only when it exceeds the noise
    measured in both runs (the sum of their relative half-ranges) and min_change."""
    rows, missing = [], []
    names = list(dict.fromkeys(list(a["workloads"]) + list(b["workloads"])))
    for w in names:
        wa, wb = a["workloads"].get(w), b["workloads"].get(w)
        if wa is None or wb is None:
            side = "A" if wa is None else "B"
            why = (a if side == "A" else b)["errors"].get(w, "not in the run")
            missing.append({"workload": w, "missing_in": side, "why": why.splitlines()[0]})
            continue
        fa, fb = wa.get("figures", {}), wb.get("figures", {})
        for name in list(dict.fromkeys(list(fa) + list(fb))):
            row = {"workload": w, "figure": name}
            if name not in fa or name not in fb:
                rows.append(row | {"status": f"missing in {'A' if name not in fa else 'B'}"})
                continue
            x, y = fa[name], fb[name]
            if not (_figure_ok(x) and _figure_ok(y)):
                rows.append(row | {"status": "unreadable figure"})
                continue
            gain = x["value"] / y["value"] if x["better"] == "lower" else y["value"] / x["value"]
            noise = _noise(x) + _noise(y)
            threshold = max(noise, min_change)
            status = ("regression" if gain < 1 / (1 + threshold) else
                      "improvement" if gain > 1 + threshold else "within noise")
            rows.append(row | {"unit": x.get("unit", ""), "better": x["better"], "a": x["value"], "b": y["value"],
                               "gain": gain, "noise": noise, "status": status})
    checks = []
    for c in dict.fromkeys(list(a["checks"]) + list(b["checks"])):
        pa, pb = (_check_passed(r, c) for r in (a, b))
        status = ("missing in A" if pa is None else "missing in B" if pb is None else
                  "regression" if pa and not pb else "fixed" if pb and not pa else
                  "passes" if pa else "fails in both")
        checks.append({"check": c, "a": pa, "b": pb, "status": status})
    return {"a": _summary(a), "b": _summary(b), "rows": rows, "missing": missing, "checks": checks,
            "regressions": [r for r in rows if r.get("status") == "regression"]
            + [c for c in checks if c["status"] == "regression"]}


def _check_passed(run: dict, name: str) -> bool | None:
    """True or False, or None when the run has no readable result for that check."""
    result = run["checks"].get(name)
    return result.get("passed") if isinstance(result, dict) else None


def _summary(run: dict) -> dict:
    return {k: run.get(k) for k in ("label", "created", "torch", "device", "quick", "compile", "threads")}


def table(report: dict) -> str:
    """The comparison as plain text, one figure per line."""
    a, b = report["a"], report["b"]
    lines = [f"A: {a['label']} (torch {a['torch']}, {a['device']}, {a['threads']} threads)   "
             f"B: {b['label']} (torch {b['torch']}, {b['device']}, {b['threads']} threads)",
             f"{'workload':<16}{'figure':<32}{'A':>12}{'B':>12}{'B gain':>9}{'noise':>8}  status"]
    for r in report["rows"]:
        if "gain" in r:
            lines.append(f"{r['workload']:<16}{r['figure']:<32}{_short(r['a'], r['unit']):>12}"
                         f"{_short(r['b'], r['unit']):>12}{r['gain']:>8.2f}x{r['noise']:>7.0%}  {r['status']}")
        else:
            lines.append(f"{r['workload']:<16}{r['figure']:<32}{'':>41}  {r['status']}")
    for m in report["missing"]:
        lines.append(f"{m['workload']:<16}{'(whole workload)':<32}{'':>41}  missing in {m['missing_in']}: {m['why']}")
    for c in report["checks"]:
        lines.append(f"{'check':<16}{c['check']:<32}{_passed(c['a']):>12}{_passed(c['b']):>12}{'':>17}  {c['status']}")
    lines.append(f"{len(report['regressions'])} regression(s) beyond the measured noise")
    return "\n".join(lines)


def _passed(value) -> str:
    return {True: "pass", False: "FAIL", None: "-"}[value]


def _short(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.3g} ms"
    if unit == "bytes":
        return f"{value / 2**20:.3g} MiB"
    return f"{value:.4g}"


COLORS = {"regression": "#d62728", "improvement": "#2ca02c", "within noise": "#7f7f7f"}


def chart(report: dict):
    """A plotly bar chart of B's gain over A per figure, with the measured noise as error bars."""
    import plotly.graph_objects as go
    rows = [r for r in report["rows"] if "gain" in r]
    fig = go.Figure(go.Bar(
        x=[f"{r['workload']}<br>{r['figure']}" for r in rows], y=[r["gain"] for r in rows],
        marker_color=[COLORS[r["status"]] for r in rows],
        error_y=dict(type="data", array=[r["gain"] * r["noise"] for r in rows]),
        text=[f"{r['gain']:.2f}x" for r in rows], textposition="outside",
        hovertext=[r["status"] for r in rows]))
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_layout(title=f"B ({report['b']['label']}) vs A ({report['a']['label']}): above 1 is better in B; "
                            f"red: regression beyond the noise", yaxis_title="gain of B over A (x)", height=480)
    return fig


def write_report(report: dict, path: str | Path) -> Path:
    """An HTML page with the table and the chart (plotly.js embedded, so it opens offline)."""
    path = Path(path)
    page = (f"<html><head><meta charset='utf-8'><title>Validation report</title></head><body>"
            f"<h1>Validation report</h1><pre>{html.escape(table(report))}</pre>"
            f"{chart(report).to_html(full_html=False, include_plotlyjs=True)}</body></html>")
    write_text_atomic(page, path)
    return path
