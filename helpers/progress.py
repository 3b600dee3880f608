"""The learner's own progress: what the notebooks record on this machine, and its summary.

    python -m helpers progress            # per lesson, deep dive and lab; --json, --reset

A notebook's kernel appends one JSON line per event to a file of this machine's user (nothing leaves
the machine): each gated section's decision (`helpers.device.requires`), each check that passed or failed
(`helpers.checks`) and each prediction revealed (`helpers.interactive.reveal`), which those modules emit
(helpers.events) to this one, subscribed from the first `import helpers` on (helpers/__init__.py imports it;
it imports nothing heavy until it records or summarises), and the notebook's start
and finish (its first cell run once helpers are imported, its last code cell run without an error, or
`show_progress()`, which ends lesson 00). Each event names its notebook as Jupyter tells the kernel
(`__session__` in JupyterLab and Notebook, absolute or relative to the server root; `__vsc_ipynb_file__` in
VS Code), else as the Colab set-up cell names it (LABS_NOTEBOOK, the repository path), else "unknown
notebook"; the summary matches any of these to the course's notebook by file name. Each event also names
the torch version and the time.

Only a Jupyter kernel records, and never in a headless run (the batch runner, the test suite, `notebooks
fix` and the grader set LABS_HEADLESS=1) nor with LABS_PROGRESS=off. The file is
$XDG_STATE_HOME/pytorch-210-labs/progress.jsonl (~/.local/state/... by default), or progress.jsonl in
LABS_PROGRESS_DIR. Writing never stops a lesson: a file that cannot be written records nothing.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from pathlib import Path

from helpers.env import HEADLESS_ENV, NOTEBOOK_ENV
from helpers.events import subscribe

PROGRESS_ENV = "LABS_PROGRESS"            # "off": record nothing
PROGRESS_DIR_ENV = "LABS_PROGRESS_DIR"    # the folder of progress.jsonl, instead of the state folder
REPO = Path(__file__).resolve().parent.parent
UNKNOWN_NOTEBOOK = "unknown notebook"
EXERCISE = re.compile(r"^Exercise (\d+)\b")
CHECK_RESULT = {True: "passed", False: "not yet", None: "not checked"}
HEADLESS_LINE = ("progress is recorded when you run the notebooks in JupyterLab; "
                 "`python -m helpers progress` shows it")


def progress_file() -> Path:
    folder = os.environ.get(PROGRESS_DIR_ENV)
    if not folder:
        state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        folder = Path(state) / "pytorch-210-labs"
    return Path(folder) / "progress.jsonl"


def recording() -> bool:
    """Whether this process may record: not turned off, not a headless run."""
    return os.environ.get(PROGRESS_ENV, "").lower() != "off" and os.environ.get(HEADLESS_ENV) != "1"


def _kernel_shell():
    """This process's IPython shell when it is a Jupyter kernel, else None (IPython is not imported here)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if getattr(shell, "kernel", None) is not None else None


def notebook_of(shell) -> str:
    return (shell.user_ns.get("__session__") or shell.user_ns.get("__vsc_ipynb_file__")
            or os.environ.get(NOTEBOOK_ENV) or UNKNOWN_NOTEBOOK)


def current_notebook() -> str | None:
    """The notebook this kernel runs (UNKNOWN_NOTEBOOK when Jupyter does not say); None outside a kernel."""
    shell = _kernel_shell()
    return notebook_of(shell) if shell is not None else None


def record(event: str, **fields) -> None:
    """Append one event of this kernel's notebook to the progress file; nothing outside a Jupyter kernel,
    in a headless run or with LABS_PROGRESS=off, and nothing (no error either) where the file cannot be
    written."""
    if not recording():
        return
    notebook = current_notebook()
    if notebook is None:
        return
    from helpers.device import torch_version   # torch: not imported by `import helpers`
    try:
        line = json.dumps({"event": event, "notebook": notebook, "torch": torch_version(),
                           "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields})
        path = progress_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    except (TypeError, ValueError, OSError, RuntimeError):   # a field JSON cannot hold; Path.home() without a home
        pass


@functools.lru_cache(maxsize=8)
def _last_code_cell(path: str, modified: float) -> tuple[str | None, str] | None:
    """(id, source) of the saved notebook's last non-empty code cell; None when it cannot be read."""
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
        code = [(c.get("id"), "".join(c["source"]).strip()) for c in cells if c["cell_type"] == "code"]
    except (OSError, ValueError, LookupError, TypeError, AttributeError):   # unreadable, or not a notebook
        return None
    return next((cell for cell in reversed(code) if cell[1]), None)


def notebook_file(notebook: str) -> Path | None:
    """The notebook's saved file: its path as given (absolute, or relative to the kernel's folder), from the
    repository root (a repository path, or one relative to a server started there), or its name in the
    kernel's folder, which is the notebook's own; None when none of these is a file."""
    path = Path(notebook)
    return next((p for p in (path, REPO / path, Path(path.name)) if p.is_file()), None)


def is_last_code_cell(notebook: str, info) -> bool:
    """Whether the cell just run (IPython's ExecutionInfo) is the notebook's last code cell, by its id
    or, from a front end that sends no ids, by its source."""
    path = notebook_file(notebook)
    try:
        last = _last_code_cell(str(path), os.path.getmtime(path)) if path is not None else None
    except OSError:
        return False
    return last is not None and info is not None and (
        (last[0] is not None and getattr(info, "cell_id", None) == last[0]) or info.raw_cell.strip() == last[1])


def watch(shell) -> None:
    """Record the notebook's start (the first cell run from now) and finish (its last code cell run
    without an error) from IPython's post_run_cell event. The hook never raises: IPython would print the
    error under the learner's cell."""
    started = False

    def after_cell(result) -> None:
        nonlocal started
        try:
            if not started:
                started = True
                record("start")
            if result.success and is_last_code_cell(notebook_of(shell), getattr(result, "info", None)):
                record("finish")
        except Exception:
            pass
    shell.events.register("post_run_cell", after_cell)


def _watch_this_kernel() -> None:
    shell = _kernel_shell() if recording() else None
    if shell is not None:
        watch(shell)


subscribe(record)
_watch_this_kernel()


# --- Reading and summarising ----------------------------------------------------------------------

def read_events(path: Path | None = None) -> list[dict]:
    """The recorded events in order; a line cut off mid-write is skipped."""
    try:
        lines = (path or progress_file()).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def reset(path: Path | None = None) -> bool:
    """Delete the progress file; whether there was one."""
    path = path or progress_file()
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def _notebook_id(notebook: str) -> str:
    """A manifest id from a notebook's path: its file name (a lab's student copy and solution share it)."""
    return Path(notebook).stem


def _latest(events: list[dict], kind: str, key: str) -> dict[str, dict]:
    """The last event of `kind` per value of `key`, in first-seen order."""
    latest: dict[str, dict] = {}
    for event in events:
        if event.get("event") == kind and key in event:
            latest[event[key]] = event
    return latest


def _predictions(events: list[dict]) -> dict:
    held = [e.get("held") for e in _latest(events, "prediction", "question").values()]
    return {"revealed": len(held), "answered": sum(h is not None for h in held), "held": sum(h is True for h in held)}


def _exercises(events: list[dict], titles: list[str]) -> list[dict]:
    """Each exercise with its latest check result: True, False, or None (never checked). `titles` are the
    lab's exercises ("Exercise 1: softmax"); exercises only seen in events are added."""
    latest: dict[int, bool] = {}
    seen_titles: dict[int, str] = {}
    for event in events:
        found = EXERCISE.match(str(event.get("what", ""))) if event.get("event") == "check" else None
        if found:
            number = int(found.group(1))
            latest[number] = bool(event.get("passed"))
            seen_titles.setdefault(number, found.group(0))
    by_number = {int(EXERCISE.match(t).group(1)): t for t in titles if EXERCISE.match(t)}
    numbers = sorted(set(by_number) | set(latest))
    return [{"exercise": by_number.get(n, seen_titles.get(n)), "passed": latest.get(n)} for n in numbers]


def summarize(events: list[dict], entries: list[dict], exercises: dict[str, list[str]] | None = None) -> dict:
    """The progress summary from recorded events and the manifest's entries. Per notebook: its status
    ("not opened"; "opened": not run to its last cell; "ran fully"; "ran partly": run to the end with
    sections skipped), the sections whose latest decision was a skip (with why), the predictions (the
    latest reveal per question) and, for a lab, each exercise's latest check (titles from `exercises`,
    lab id -> ["Exercise 1: ...", ...]). Events of notebooks the manifest does not list are counted apart."""
    exercises = exercises or {}
    by_id: dict[str, list[dict]] = {entry["id"]: [] for entry in entries}
    others: dict[str, int] = {}
    for event in events:
        notebook = str(event.get("notebook", UNKNOWN_NOTEBOOK))
        if _notebook_id(notebook) in by_id:
            by_id[_notebook_id(notebook)].append(event)
        else:
            others[notebook] = others.get(notebook, 0) + 1
    notebooks = []
    for entry in entries:
        seen = by_id[entry["id"]]
        skipped = [{"section": name, "reason": e.get("reason")}
                   for name, e in _latest(seen, "section", "section").items() if not e.get("ran")]
        finished = any(e.get("event") == "finish" for e in seen)
        status = ("not opened" if not seen else "opened" if not finished
                  else "ran partly" if skipped else "ran fully")
        kind = "deep dive" if "deep_dive_of" in entry else entry["kind"]
        item = {"id": entry["id"], "kind": kind, "title": entry["title"], "status": status, "skipped": skipped,
                "predictions": _predictions(seen)}
        if kind == "lab":
            item["exercises"] = _exercises(seen, exercises.get(entry["id"], []))
        notebooks.append(item)
    totals = {name: sum(n["predictions"][name] for n in notebooks) for name in ("revealed", "answered", "held")}
    return {"notebooks": notebooks, "predictions": totals, "other_notebooks": others}


def summary_text(summary: dict) -> str:
    """The summary as the learner reads it."""
    lines = ["Lessons and deep dives"]
    for item in summary["notebooks"]:
        if item["kind"] == "lab":
            continue
        status = item["status"] if item["status"] != "opened" else "opened, not run to its last cell"
        lines.append(f"  {item['id']:<42} {status}")
        lines += [f"      skipped {s['section']!r}: {s['reason']}" for s in item["skipped"]]
    lines.append("Labs")
    for item in summary["notebooks"]:
        if item["kind"] != "lab":
            continue
        exercises = item["exercises"]
        if item["status"] == "not opened":
            lines.append(f"  {item['id']:<42} not opened")
            continue
        done = sum(e["passed"] is True for e in exercises)
        lines.append(f"  {item['id']:<42} {done} of {len(exercises)} exercises passed")
        lines += [f"      {e['exercise']}: {CHECK_RESULT[e['passed']]}" for e in exercises]
    totals = summary["predictions"]
    per_notebook = [f"{n['id']} {n['predictions']['held']} of {n['predictions']['answered']}"
                    for n in summary["notebooks"] if n["predictions"]["answered"]]
    lines.append(f"Predictions: {totals['answered']} answered, {totals['held']} held"
                 + (f" ({'; '.join(per_notebook)})" if per_notebook else ""))
    if summary["other_notebooks"]:
        lines.append("Also recorded: " + ", ".join(f"{name} ({count} events)"
                                                   for name, count in summary["other_notebooks"].items()))
    return "\n".join(lines)


def lab_exercises(entries: list[dict]) -> dict[str, list[str]]:
    """Each lab's exercise titles, from the manifest's entries."""
    return {entry["id"]: entry["exercises"] for entry in entries if entry["kind"] == "lab"}


def this_machine() -> dict:
    """The summary of this machine's progress file."""
    from helpers.manifest import entries   # the manifest checks its entries with helpers.device, which imports torch
    items = entries()
    return summarize(read_events(), items, lab_exercises(items))


def show_progress() -> None:
    """The summary, for the cell that ends lesson 00, whose finish it records first (the cell's own finish
    would come after the summary); a headless run prints one fixed line instead."""
    if os.environ.get(HEADLESS_ENV) == "1":
        print(HEADLESS_LINE)
        return
    record("finish")
    print(f"Your progress on this machine ({progress_file()}):")
    print(summary_text(this_machine()))
    if not recording():
        print(f"{PROGRESS_ENV}=off: nothing new is recorded.")
