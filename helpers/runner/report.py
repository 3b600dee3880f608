"""The run folder's report.html: one row per notebook (status, fault, duration, peak memory, sections
run and skipped with reasons, the error cell) and a plotly timeline of when each notebook ran where.
plotly.js is written once beside it (plotly.min.js), so the page works offline."""
from __future__ import annotations

import html
from pathlib import Path

from helpers.files import write_text_atomic

COLORS = {"passed": "#2e7d32", "failed": "#c62828"}


def timeline(summary: dict):
    """A plotly figure: one bar per notebook from its start to its end, coloured by status."""
    import plotly.graph_objects as go
    start = summary["started"]
    fig = go.Figure()
    for status in ("passed", "failed"):
        rows = [r for r in summary["notebooks"] if r["status"] == status and not r.get("resumed")]
        if not rows:
            continue
        fig.add_trace(go.Bar(
            orientation="h", name=status, marker_color=COLORS[status],
            y=[r["path"] for r in rows], base=[r["started"] - start for r in rows],
            x=[r["finished"] - r["started"] for r in rows],
            customdata=[[r.get("fault") or "", r.get("worker", ""), r.get("peak_memory_mb") or 0] for r in rows],
            hovertemplate="%{y}<br>%{x:.1f} s from %{base:.1f} s<br>%{customdata[0]}<br>"
                          "worker %{customdata[1]}<br>peak %{customdata[2]:.0f} MB<extra></extra>"))
    fig.update_layout(title="When each notebook ran (seconds from the start of the run)", barmode="overlay",
                      xaxis_title="seconds", height=160 + 28 * len(summary["notebooks"]),
                      margin={"l": 20, "r": 20, "t": 50, "b": 40}, yaxis={"autorange": "reversed"})
    return fig


def _sections(record: dict) -> str:
    if not record["sections"]:
        return "none recorded" if not record.get("problems") else ""
    items = []
    for s in record["sections"]:
        what = "ran" if s["ran"] else f"skipped: {html.escape(str(s.get('reason') or ''))}"
        items.append(f"<li>{html.escape(s['section'])}: {what}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def _error(record: dict) -> str:
    parts = []
    if record.get("detail"):
        parts.append(f"<p>{html.escape(record['detail'])}</p>")
    err = record.get("error")
    if err:
        where = f"cell {err['cell']}: " if "cell" in err else ""
        parts.append(f"<p><b>{where}{html.escape(str(err.get('ename', '')))}</b> "
                     f"{html.escape(str(err.get('evalue', ''))[:600])}</p>")
        if err.get("source"):
            parts.append(f"<pre>{html.escape(err['source'])}</pre>")
    for problem in record.get("problems", []):
        parts.append(f"<p>{html.escape(problem)}</p>")
    return "".join(parts)


def report_html(summary: dict, plotly_src: str = "plotly.min.js") -> str:
    rows = []
    for r in summary["notebooks"]:
        link = (f"<a href='{html.escape(r['executed'])}'>{html.escape(r['path'])}</a>" if r.get("executed")
                else html.escape(r["path"]))
        status = r["status"] + (" (kept from an earlier run)" if r.get("resumed") else "")
        peak = "" if r.get("peak_memory_mb") is None else f"{r['peak_memory_mb']:.0f} MB"
        rows.append(
            f"<tr class='{r['status']}'><td>{link}</td><td>{status}</td><td>{html.escape(r.get('fault') or '')}</td>"
            f"<td>{r['seconds']:.1f} s</td><td>{peak}</td>"
            f"<td>{_sections(r)}</td><td>{_error(r)}</td></tr>")
    m = summary["machine"]
    faults = ", ".join(f"{k}: {v}" for k, v in sorted(summary["faults"].items())) or "none"
    figure = timeline(summary).to_html(include_plotlyjs=False, full_html=False)
    params = html.escape(", ".join(f"{k}={v!r}" for k, v in summary["parameters"].items()))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Run report</title>
<script src="{plotly_src}"></script>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;width:100%}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}}
tr.failed td:nth-child(2){{color:#c62828;font-weight:bold}} tr.passed td:nth-child(2){{color:#2e7d32}}
pre{{background:#f5f5f5;padding:4px;max-height:12em;overflow:auto}}</style></head><body>
<h1>Run report: {summary['passed']} passed, {summary['failed']} failed</h1>
<p>Machine: {html.escape(str(m.get('cpu_name', '')))}, {m.get('cpu_count')} cores, accelerator
{html.escape(str(m.get('accelerator')))}, torch {html.escape(str(m.get('torch_version')))}.
Parameters: {params}. Executor: {summary['executor']} ({summary['workers']} workers).
Timeouts: {summary['cell_timeout']:g} s per cell, {summary['notebook_timeout']:g} s per notebook.
Total {summary['total_seconds']:.1f} s. Faults: {html.escape(faults)}.</p>
{figure}
<table><tr><th>notebook</th><th>status</th><th>fault</th><th>duration</th><th>peak memory</th>
<th>sections</th><th>error</th></tr>
{''.join(rows)}
</table></body></html>
"""


def write_report(summary: dict, out_dir: str | Path) -> Path:
    from plotly.offline import get_plotlyjs
    out_dir = Path(out_dir)
    js = out_dir / "plotly.min.js"
    if not js.exists():
        write_text_atomic(get_plotlyjs(), js)
    path = out_dir / "report.html"
    write_text_atomic(report_html(summary), path)
    return path

