"""`make site`: the course as a static website, built from the executed notebooks of one or more runs.

    python -m helpers site runs/matrix/cuda runs/matrix/minimal --out runs/site   # runs/site/html/index.html

Every lesson, deep dive and lab (the student copy, never the solution) becomes a page with its outputs and
interactive plotly figures (plotly.js is served from the site itself, loaded by the pages that draw). Under each section header, a
provenance line says where that section ran (hardware, torch build, Python, date) and where it was skipped
and why, read from the runs' records. A start page gives the learning path with times; a status page shows
notebook x environment. The pages are staged as notebooks and Markdown under OUT/src and built by Sphinx
with MyST-NB and the book theme, offline: themes, fonts and plotly.js come from installed packages.
"""
from __future__ import annotations

import copy
import datetime
import html
import json
import re
import shutil
from pathlib import Path

from helpers.colab import repository_url
from helpers.manifest import REPO, entries
from helpers.runner.matrix import matrix_table, merge_runs, read_run, short_build

HEADING = re.compile(r"##\s+(.+)")
FENCE = re.compile(r"\s*(```|~~~)")


def page_source(entry: dict) -> str:
    """The repository file a page shows and offers: a lab's student copy, never its solution."""
    return entry["path"].replace("labs/solutions/", "labs/")


def launch_links(path: str, repository: str, download_href: str) -> dict[str, str]:
    """Colab, Binder and download links for the notebook at repository path `path` (branch main)."""
    owner_repo = repository.removeprefix("https://github.com/")
    return {"Open in Colab": f"https://colab.research.google.com/github/{owner_repo}/blob/main/{path}",
            "Launch on Binder": f"https://mybinder.org/v2/gh/{owner_repo}/main?urlpath=lab/tree/{path}",
            "Download the notebook": download_href}


# -- where each section ran ------------------------------------------------------------------------------

def read_environments(run_dirs: list[str | Path], matrix: dict) -> list[dict]:
    """One entry per run, in the order given: its name (as in the merged `matrix`), machine, date,
    parameters, records by notebook path and executed notebooks (paths) by notebook path."""
    environments = []
    for env, run_dir in zip(matrix["environments"], run_dirs):
        summary, _ = read_run(run_dir)
        folder = Path(run_dir) if Path(run_dir).is_dir() else None     # a gpu-check bundle holds no notebooks
        executed = {r["path"]: folder / r["executed"] for r in summary["notebooks"]
                    if folder is not None and r.get("executed") and (folder / r["executed"]).is_file()}
        started = summary.get("started")
        environments.append({"name": env["name"], "machine": summary["machine"],
                             "date": datetime.date.fromtimestamp(started).isoformat() if started else "date unknown",
                             "parameters": summary.get("parameters") or {},
                             "records": {r["path"]: r for r in summary["notebooks"]}, "executed": executed})
    return environments


def where(env: dict) -> str:
    """"cuda: torch 2.10.0+cu128 (CUDA 12.8 build, no GPU), Python 3.11.7, AMD EPYC (2 cores), 2026-12-03";
    on a GPU the build names the device and the CPU is left out."""
    m = env["machine"]
    python = f"Python {m.get('python_version') or '?'}" + (" free-threaded" if m.get("free_threaded") else "")
    on_gpu = m.get("accelerator") not in (None, "cpu") and m.get("device_name")
    cpu = "" if on_gpu else f"{m.get('cpu_name') or '?'} ({m.get('cpu_count') or '?'} cores), "
    return f"{env['name']}: torch {m.get('torch_version') or '?'} ({short_build(m)}), {python}, {cpu}{env['date']}"


def heading_offsets(text: str) -> list[tuple[int, str]]:
    """(offset, title) of each section heading (## ...) of a markdown text, outside fenced code blocks."""
    found, fenced, offset = [], False, 0
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append((offset, match.group(1).strip()))
        offset += len(line)
    return found


def heading(cell: dict) -> str | None:
    """The section heading a cell starts with ("## Title" -> "Title"), else None."""
    if cell["cell_type"] != "markdown":
        return None
    found = heading_offsets("".join(cell["source"]))
    return found[0][1] if found and found[0][0] == 0 else None


def split_at_headings(cells: list[dict]) -> list[dict]:
    """Markdown cells cut before each section heading, so that every heading starts a cell and its
    provenance can follow it."""
    out = []
    for cell in cells:
        text = "".join(cell["source"])
        starts = [at for at, _ in heading_offsets(text)] if cell["cell_type"] == "markdown" else []
        if starts in ([], [0]):
            out.append(cell)
            continue
        bounds = sorted({0, *starts, len(text)})
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            out.append({**cell, "id": f"{cell.get('id', 'cell')}-{k}", "source": text[a:b].strip("\n") + "\n"})
    return out


def section_map(cells: list[dict], declared: list[str]) -> dict[str, list[str]]:
    """For each section heading's title, the declared gated sections whose requires() call lies in the cells
    up to the next heading. A gated section found before any heading belongs to the first heading."""
    headings = [i for i, c in enumerate(cells) if heading(c)]
    owned = {i: [] for i in headings}
    for name in declared:
        quoted = (f'"{name}"', f"'{name}'")
        at = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"
                   and any(q in "".join(c["source"]) for q in quoted)), None)
        if at is None or not headings:
            continue
        owner = max([h for h in headings if h < at], default=headings[0])
        owned[owner].append(name)
    return {heading(cells[i]): names for i, names in owned.items()}


def stopped_in(cells: list[dict]) -> dict[str, str]:
    """For an executed notebook that failed: {section title: "ran" | "failed" | "not reached"}, cut at the
    first cell that raised or never finished (an error output, or papermill's status failed or running)."""
    def stopped(cell) -> bool:
        status = cell.get("metadata", {}).get("papermill", {}).get("status")
        return status in ("failed", "running") or any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    stop = next((i for i, c in enumerate(cells) if c["cell_type"] == "code" and stopped(c)), len(cells))
    starts = [(i, heading(c)) for i, c in enumerate(cells) if heading(c)]
    states = {}
    for (start, title), (end, _) in zip(starts, starts[1:] + [(len(cells), None)]):
        states[title] = "ran" if stop >= end else "failed" if stop >= start else "not reached"
    return states


def section_provenance(path: str, title: str, gated: list[str], environments: list[dict],
                       stops: dict[str, dict[str, str]]) -> dict:
    """Where one section ran, was skipped (and why), failed, was not reached, or cannot be told, per
    environment. `stops`: stopped_in() of each environment whose run of `path` failed, by environment name."""
    prov = {"ran": [], "ran_without": [], "failed": [], "not_reached": [], "unknown": []}
    for env in environments:
        record = env["records"].get(path)
        if record is None:
            continue
        decisions = {s["section"]: s for s in record.get("sections", [])}
        state = "ran"
        if record["status"] != "passed":
            if env["name"] in stops:
                state = stops[env["name"]].get(title, "not reached")
            elif gated and all(name in decisions for name in gated):
                state = "ran"                 # decided, so reached, though no executed copy says more
            else:
                prov["unknown"].append((where(env), f"the notebook {record.get('fault') or 'failed'} and this run "
                                                    "kept no executed copy"))
                continue
        if state == "failed":
            error = record.get("error") or {}
            prov["failed"].append((where(env), f"{error.get('ename', record.get('fault') or 'failed')}: "
                                               f"{str(error.get('evalue', record.get('detail', '')))[:300]}"))
        elif state == "not reached":
            prov["not_reached"].append(where(env))
        else:
            reasons = [f"{name}: {decisions[name].get('reason')}" for name in gated
                       if name in decisions and not decisions[name]["ran"]]
            if reasons:
                prov["ran_without"].append((where(env), "; ".join(reasons)))
            else:
                prov["ran"].append(where(env))
    return prov


def provenance_html(prov: dict) -> str:
    """The lines shown under a section header: where it ran in full, where it ran with a part skipped
    (the part, and why), failed, was not reached, or cannot be told."""
    if prov["ran"]:
        lines = ["<b>Ran on</b> " + "; ".join(html.escape(w) for w in prov["ran"])]
    elif prov["ran_without"]:
        lines = ["<b>This section has not run in full on any machine recorded here.</b>"]
    else:
        lines = ["<b>This section has not run on any machine recorded here.</b>"]
    lines += [f"<b>Ran on</b> {html.escape(env)}, <b>with a part skipped</b>: {html.escape(reason)}"
              for env, reason in prov["ran_without"]]
    lines += [f"<b>Failed here on</b> {html.escape(env)}: {html.escape(error)}" for env, error in prov["failed"]]
    if prov["not_reached"]:
        lines.append("<b>Not reached</b> (the notebook failed before it) on "
                     + "; ".join(html.escape(w) for w in prov["not_reached"]))
    lines += [f"<b>Not known</b> on {html.escape(env)}: {html.escape(why)}" for env, why in prov["unknown"]]
    items = "".join(f"<li>{line}</li>" for line in lines)
    return f'<div class="provenance" role="note" aria-label="Where this section ran"><ul>{items}</ul></div>'


# -- pages ------------------------------------------------------------------------------------------------

def plotly_html(figure: dict, index: int) -> str:
    """An interactive plotly figure (plotly.js loaded once by the page) with its title and a text
    alternative naming its axes and traces."""
    import plotly.io as pio
    layout = figure.get("layout", {})

    def text(value) -> str:
        return (value.get("text") if isinstance(value, dict) else value) or ""
    title = text(layout.get("title")) or "Figure"
    axes = [f"{name.replace('axis', ' axis')}: {text(layout[name].get('title'))}" for name in sorted(layout)
            if re.fullmatch(r"[xy]axis\d*", name) and isinstance(layout[name], dict)
            and text(layout[name].get("title"))]
    traces = [f"{t.get('type', 'scatter')} '{t['name']}'" if t.get("name") else t.get("type", "scatter")
              for t in figure.get("data", [])]
    alt = (f"Interactive chart: {title}. " + (". ".join(axes) + ". " if axes else "")
           + f"{len(traces)} trace(s): {', '.join(traces[:12])}" + (", ..." if len(traces) > 12 else "") + ".")
    div = pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=f"figure-{index}",
                      validate=False, config={"responsive": True})
    return (f'<figure class="plotly-figure" aria-label="{html.escape(re.sub("<[^>]+>", " ", title))}">{div}'
            f'<figcaption>{html.escape(re.sub("<[^>]+>", " ", alt))}</figcaption></figure>')


def page_notebook(entry: dict, environments: list[dict], repository: str) -> tuple[dict, str]:
    """The staged notebook of one page (outputs from a run that passed when there is one, a run that failed
    otherwise, none for a lab's student copy) and its repository path."""
    source_path = page_source(entry)
    source = json.loads((REPO / source_path).read_text())
    path = entry["path"]
    runs = sorted((env for env in environments if path in env["executed"]),
                  key=lambda env: env["records"][path]["status"] != "passed")
    executed = {env["name"]: json.loads(env["executed"][path].read_text()) for env in runs}
    shown = runs[0] if runs and entry["kind"] != "lab" else None
    stops = {env["name"]: stopped_in(split_at_headings(executed[env["name"]]["cells"])) for env in runs
             if env["records"][path]["status"] != "passed"}
    nb = copy.deepcopy(executed[shown["name"]]) if shown else copy.deepcopy(source)
    nb["cells"] = split_at_headings([c for c in nb["cells"]
                                     if "injected-parameters" not in c.get("metadata", {}).get("tags", [])])
    nb["metadata"].pop("widgets", None)     # the widgets' state: their scripts would come from a CDN
    declared = [s["name"] for s in entry["sections"] if s["name"] != "*"]
    headings = section_map(split_at_headings(source["cells"]), declared)

    depth = "../" * source_path.count("/")
    cells, figures = [], 0
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            data.pop("application/vnd.jupyter.widget-view+json", None)    # a live control: its text stays
            if "application/vnd.plotly.v1+json" in data:
                figures += 1
                script = f'<script src="{depth}_static/plotly.min.js"></script>' if figures == 1 else ""
                output["data"] = {"text/html": script + plotly_html(data["application/vnd.plotly.v1+json"], figures),
                                  "text/plain": data.get("text/plain", "plotly figure")}
        cells.append(cell)
        if heading(cell) in headings:
            prov = section_provenance(path, heading(cell), headings[heading(cell)], environments, stops)
            cells.append({"cell_type": "markdown", "id": f"provenance-{len(cells)}", "metadata": {"tags": ["provenance"]},
                          "source": provenance_html(prov)})
    links = launch_links(source_path, repository, f"{depth}downloads/{source_path}")
    if entry["kind"] == "lab":
        whose = ("This is the student copy of the lab, without outputs; the provenance lines are those of "
                 "its solution's runs.")
    elif shown:
        quick = " in quick mode (small sizes)" if shown["parameters"].get("QUICK") else ""
        status = "" if shown["records"][path]["status"] == "passed" else ", which failed"
        whose = f"Outputs on this page come from the run{quick} on {html.escape(where(shown))}{status}."
    else:
        whose = "No run recorded here executed this notebook: it is shown without outputs."
    buttons = " ".join(f'<a class="launch" href="{html.escape(href)}"'
                       + (' download' if label.startswith("Download") else "") + f">{label}</a>"
                       for label, href in links.items())
    top = {"cell_type": "markdown", "id": "launch-buttons", "metadata": {"tags": ["launch"]},
           "source": f'<div class="launch-buttons">{buttons}</div>\n<p class="outputs-from">{whose} '
                     f'Takes about {entry["minutes"]} minutes.</p>'}
    title_at = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"), -1)
    cells.insert(title_at + 1, top)
    nb["cells"] = cells
    return nb, source_path


def learning_path(pages: list[tuple[dict, str]]) -> str:
    """The start page: the path through the course, topic by topic, with times."""
    rows, topic = [], None
    for entry, path in pages:
        number = entry["id"][:2]
        if number != topic:
            topic = number
            rows.append(f"| **{number}** | | |")
        kind = "lab" if entry["kind"] == "lab" else ("deep dive" if "deep_dive" in entry["id"] else "lesson")
        title = entry["title"].replace("|", "\\|")
        rows.append(f"| [{title}]({path}) | {kind} | {entry['minutes']} min |")
    total = sum(e["minutes"] for e, _ in pages if "deep_dive" not in e["id"])
    return ("# PyTorch 2.10 Labs\n\nRunnable lessons and lab workbooks on what PyTorch 2.10 shipped. Take the "
            "lessons and labs in order; a deep dive follows its lesson for those who want the depth. Every page "
            "says under each section where it ran and where it was skipped and why; the "
            "[status page](status.md) shows every notebook in every environment recorded.\n\n"
            f"Lessons and labs: about {total / 60:.1f} hours in all.\n\n"
            "| Notebook | Kind | Time |\n|---|---|---|\n" + "\n".join(rows) + "\n\n"
            "```{toctree}\n:hidden:\n\nstatus\n" + "\n".join(p.removesuffix(".ipynb") for _, p in pages) + "\n```\n")


def status_page(matrix: dict) -> str:
    envs = "\n".join(f"- **{e['name']}**: {e['description']}" for e in matrix["environments"])
    return ("# Status: every notebook in every environment\n\nEach column is one run recorded for this site "
            "(an environment of the matrix, or a GPU machine's `make gpu-check` bundle): status, time, peak "
            f"memory, sections run and skipped with the reason.\n\n{envs}\n\n"
            f"```{{raw}} html\n{matrix_table(matrix)}\n```\n")


CONF = """# Written by helpers.runner.site; the site is rebuilt from the records each time.
project = "PyTorch 2.10 Labs"
author = "PyTorch 2.10 Labs"
extensions = ["myst_nb"]
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = []
html_theme = "sphinx_book_theme"
html_title = "PyTorch 2.10 Labs"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_extra_path = ["extra"]
html_theme_options = {"use_download_button": False, "use_fullscreen_button": False,
                      "show_navbar_depth": 1, "navigation_with_keys": False}
html_context = {"default_mode": "light"}
html_favicon = "_static/favicon.svg"
exclude_patterns = ["_build", "extra"]
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
"""

CSS = """.provenance{font-size:.85em;border-left:4px solid #5b7aa8;background:#f3f6fb;padding:.3em .8em;margin:.2em 0 1em}
.provenance ul{margin:0;padding-left:1.2em}
.launch-buttons{display:flex;gap:.6em;flex-wrap:wrap;margin:.5em 0}
.launch-buttons a.launch{border:1px solid #1a4f8b;border-radius:4px;padding:.2em .7em;color:#1a4f8b;text-decoration:none}
.plotly-figure figcaption{font-size:.8em;color:#444}
.status-table td,.status-table th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:.85em}
"""


FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" '
           'fill="#ee4c2c"/><text x="8" y="12" font-size="10" text-anchor="middle" fill="#fff">L</text></svg>')


def stage(run_dirs: list[str | Path], src: Path) -> dict:
    """Write the site's sources into `src`: conf.py, the start and status pages, one notebook per page,
    the downloads and plotly.js. Returns {"pages": n, "environments": [names]}."""
    from plotly.offline import get_plotlyjs
    matrix = merge_runs(run_dirs)
    environments = read_environments(run_dirs, matrix)
    repository = repository_url()
    if src.exists():
        shutil.rmtree(src)
    (src / "_static").mkdir(parents=True)
    pages = []
    for entry in entries():
        nb, path = page_notebook(entry, environments, repository)
        target = src / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb, indent=1))
        download = src / "extra" / "downloads" / path
        download.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, download)
        pages.append((entry, path))
    (src / "index.md").write_text(learning_path(pages))
    (src / "status.md").write_text(status_page(matrix))
    (src / "conf.py").write_text(CONF)
    (src / "_static" / "course.css").write_text(CSS)
    (src / "_static" / "favicon.svg").write_text(FAVICON)
    (src / "_static" / "plotly.min.js").write_text(get_plotlyjs())
    return {"pages": len(pages) + 2, "environments": [e["name"] for e in environments]}


def build_site(run_dirs: list[str | Path], out_dir: str | Path) -> dict:
    """Stage the sources into OUT/src and build the HTML into OUT/html (Sphinx, warnings kept in
    OUT/warnings.txt). Returns what stage() returns plus the html folder."""
    from sphinx.cmd.build import build_main
    out = Path(out_dir)
    summary = stage(run_dirs, out / "src")
    html_dir = out / "html"
    if html_dir.exists():
        shutil.rmtree(html_dir)
    status = build_main(["-b", "html", "-q", "-w", str(out / "warnings.txt"), str(out / "src"), str(html_dir)])
    if status:
        raise RuntimeError(f"sphinx-build failed (exit {status}); see {out / 'warnings.txt'}")
    return {**summary, "html": str(html_dir)}
