"""`python -m helpers gpu-check --no-jupyter --out DIR`: the collection on a machine that has torch and little else.

Every lesson, deep dive and lab solution runs as its jupytext twin (`NAME.py` beside the notebook), in quick mode,
several at once, each in a process of its own under a time limit, from its own folder, like a kernel would: the
twin's code runs in `__main__` without a file (so spawned DataLoader workers do not run it again). It needs only
torch, numpy, tqdm and this package: where IPython, ipywidgets or plotly is missing, a stand-in takes its place (a
display prints its text, a widget holds its initial value, a figure prints one line). Writes DIR/record.json in the
form `helpers run` writes (each notebook's status, seconds, sections run or skipped with the reason, figures), one
log per notebook in DIR/logs/, and DIR/gpu-check-bundle.json, which `make site` and `helpers report` merge. With a
GPU (seen by its vendor's tools) it then fails on what `make gpu-check` fails on: a notebook that failed, a section
skipped although the GPU has what it needs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers.device import capabilities
from helpers.env import FIGURES_LOG_ENV, HEADLESS_ENV, SECTION_LOG_ENV
from helpers.files import read_json_lines, write_text_atomic
from helpers.manifest import REPO, entries
from helpers.notebooks import code_sha256, read
from helpers.progress import PROGRESS_ENV

NOTEBOOK_TIMEOUT_S = 240
# Run before a twin: stand-ins for what a kernel has and this machine may not, then the twin in __main__.
BOOTSTRAP = r'''
import sys, types

class _Anything:
    """A stand-in value: any attribute or call gives another; show() prints one line."""
    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()
    def __call__(self, *args, **kwargs):
        return _Anything()
    def __iter__(self):
        return iter(())
    def show(self, *args, **kwargs):
        print("[a figure: plotly is not installed here]")
    def to_html(self, *args, **kwargs):
        return "<p>[a figure: plotly is not installed here]</p>"
    def __str__(self):
        return "[a figure: plotly is not installed here]"

def _module(name, **attrs):
    def anything(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything
    module = types.ModuleType(name)
    module.__dict__.update(attrs, __getattr__=anything)
    sys.modules[name] = module
    return module

try:
    import IPython.display
except ImportError:
    class HTML:
        def __init__(self, data=None, **kwargs):
            self.data = data
        def __repr__(self):
            return str(self.data)
    display = _module("IPython.display", display=lambda *objs, **k: [print(o) for o in objs], HTML=HTML,
                      Markdown=HTML, Image=HTML)
    _module("IPython", display=display, get_ipython=lambda: None)

try:
    import ipywidgets
except ImportError:
    class Widget:
        """A control that keeps its initial value (a headless run reads it once)."""
        def __init__(self, *args, value=None, options=None, children=(), **kwargs):
            options = list(options or [])
            first = options[0] if options else None
            self.value = value if value is not None else (first[1] if isinstance(first, tuple) else first)
            self.options, self.children = options, children
        def observe(self, *args, **kwargs):
            pass
    _module("ipywidgets", **{name: Widget for name in ("IntSlider", "FloatSlider", "Dropdown", "RadioButtons",
                                                       "Text", "Checkbox", "ToggleButtons", "SelectionSlider",
                                                       "HBox", "VBox", "Output", "Button", "Label", "HTML")})

try:
    import plotly.graph_objects
    plotly.graph_objects.Figure.show = lambda self, *a, **k: print(
        f"[a figure: {self.layout.title.text or 'untitled'}; drawn in JupyterLab]")
except ImportError:
    graph_objects = _module("plotly.graph_objects", Figure=_Anything)
    subplots = _module("plotly.subplots", make_subplots=_Anything)
    _module("plotly", graph_objects=graph_objects, subplots=subplots, __path__=[])

path = sys.argv[1]
sys.argv = [path]
exec(compile(open(path, encoding="utf-8").read(), path, "exec"), sys.modules["__main__"].__dict__)
'''


def twins(paths: list[str] | None = None) -> list[str]:
    """The manifest paths whose jupytext twins run (default: every lesson, deep dive and lab solution)."""
    return list(paths) if paths else [e["path"] for e in entries()]


def run_twin(path: str, out_dir: Path, timeout_s: float) -> dict:
    """One notebook's twin as a script, in quick mode: its record, in the form `helpers run` writes."""
    notebook = REPO / path
    twin = notebook.with_suffix(".py")
    logs = out_dir / "logs"
    sections, figures = logs / f"{notebook.stem}.sections.jsonl", logs / f"{notebook.stem}.figures.jsonl"
    for log in (sections, figures):
        log.unlink(missing_ok=True)
    env = {**os.environ, "LABS_QUICK": "1", HEADLESS_ENV: "1", PROGRESS_ENV: "off", "PYTHONUNBUFFERED": "1",
           SECTION_LOG_ENV: str(sections), FIGURES_LOG_ENV: str(figures),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.time()
    with open(logs / f"{notebook.stem}.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, str(twin)], cwd=notebook.parent, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
    tail = (logs / f"{notebook.stem}.log").read_text(errors="replace").strip().splitlines()[-3:]
    fault = None if code == 0 else "time" if code is None else "script-error"
    return {"path": path, "status": "passed" if fault is None else "failed", "fault": fault,
            "detail": "" if fault is None else f"ran past {timeout_s:.0f} s" if code is None else " / ".join(tail)[-400:],
            "error": None if fault is None else {"ename": fault, "evalue": " / ".join(tail)[-400:]},
            "sections": read_json_lines(sections), "figures": read_json_lines(figures), "started": start, "finished": time.time(),
            "seconds": round(time.time() - start, 2), "executed": None, "runner": "script",
            "code_sha256": code_sha256(read(notebook))}


def run_scripts(out_dir: str | Path, *, paths: list[str] | None = None, workers: int | None = None,
                timeout_s: float = NOTEBOOK_TIMEOUT_S, label: str = "") -> dict:
    """Every twin of `paths` (default: the collection), `workers` at a time; writes DIR/record.json and
    DIR/logs/; returns the record."""
    out_dir = Path(out_dir)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    caps = capabilities()
    workers = workers or max(1, min(8, caps.cpu_count // 2))
    items = {e["path"]: e for e in entries()}
    order = sorted(twins(paths), key=lambda p: -items.get(p, {}).get("quick_seconds", 0))   # longest first
    start = time.time()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = {r["path"]: r for r in pool.map(lambda p: run_twin(p, out_dir, timeout_s), order)}
    records = [done[p] for p in twins(paths)]
    summary = {"label": label or f"gpu-check (scripts, {caps.device_type})", "parameters": {"QUICK": True},
               "executor": "scripts", "workers": workers, "notebook_timeout": timeout_s, "machine": caps.to_dict(),
               "started": start, "complete": True, "total_seconds": round(time.time() - start, 2),
               "passed": sum(r["status"] == "passed" for r in records),
               "failed": sum(r["status"] != "passed" for r in records), "notebooks": records}
    write_text_atomic(json.dumps(summary, indent=2), out_dir / "record.json")
    return summary


def main(out_dir: str | Path, *, workers: int | None = None, timeout_s: float = NOTEBOOK_TIMEOUT_S,
         paths: list[str] | None = None) -> int:
    """Run the twins, write the bundle; with a GPU, verify as `make gpu-check` does. The exit status."""
    from helpers.doctor import report_text
    from helpers.runner import gpu_check
    out_dir = Path(out_dir)
    write_text_atomic(report_text(), out_dir / "doctor.txt")
    summary = run_scripts(out_dir, paths=paths, workers=workers, timeout_s=timeout_s)
    print(f"{summary['passed']}/{len(summary['notebooks'])} notebooks passed as scripts in "
          f"{summary['total_seconds']:.0f} s ({summary['workers']} at a time); logs: {out_dir / 'logs'}")
    gpu = gpu_check.detect()
    if gpu is not None:
        return gpu_check.verify(out_dir, gpu)
    figures = {"gpu": None, "torch": summary["machine"].get("torch_version"), "figures": []}
    write_text_atomic(json.dumps(gpu_check.bundle(out_dir, summary, figures), indent=1), out_dir / gpu_check.BUNDLE)
    for record in summary["notebooks"]:
        if record["status"] != "passed":
            print(f"FAILED: {record['path']}: {record['detail']}")
    print(f"no GPU found (nvidia-smi, rocminfo, xpu-smi and sycl-ls see none): the CPU run is in "
          f"{out_dir / gpu_check.BUNDLE}")
    return 0 if summary["failed"] == 0 else 1
