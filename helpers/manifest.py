"""The list of lessons and labs (helpers/manifest.json), read by the README table, the doctor, the batch
runner and the learner's progress summary.

Each entry: id, kind ("lesson" or "lab"), path, title, learn (one line), minutes (a learner's time),
quick_seconds (measured quick-mode run time on a 2-core CPU), sections (the hardware sections, each
{"name", "needs"}: the `requires(..., section=name)` calls in the notebook). Every notebook runs on a
CPU-only machine; sections are what may be skipped. A lab also lists its exercises: their titles as the
grader names them ("Exercise 1: softmax"; tests/test_progress.py holds them to helpers/grading/specs/).

Optional: "format": "course" marks a notebook in the course format (a core lesson with prediction prompts
and a "your turn", or its deep dive; tests/test_course_format.py); "deep_dive_of": the id of the core
lesson a deep dive belongs to; "graded_on": "project" marks a lab graded on what a project folder does
(the capstone: helpers.capstone's goals), not on its notebook's functions: the notebook grader's specs and
the nbgrader export leave it out.
"""
from __future__ import annotations

import json
from pathlib import Path

from helpers.device import Capabilities, capabilities, check_needs, skip_reason

REPO = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).with_name("manifest.json")
FIELDS = ("id", "kind", "path", "title", "learn", "minutes", "quick_seconds", "sections")


def notebook_graded_labs() -> list[str]:
    """The ids of the labs graded on their notebook's functions (specs, nbgrader), in order."""
    return [e["id"] for e in entries() if e["kind"] == "lab" and e.get("graded_on") != "project"]


def entries() -> list[dict]:
    items = json.loads(MANIFEST.read_text())
    for item in items:
        missing = [f for f in FIELDS if f not in item]
        if missing:
            raise ValueError(f"manifest entry {item.get('id', '?')!r} lacks {', '.join(missing)}")
        if item["kind"] not in ("lesson", "lab"):
            raise ValueError(f"manifest entry {item['id']!r}: kind must be 'lesson' or 'lab'")
        for section in item["sections"]:
            check_needs(section["needs"])
        exercises = item.get("exercises")
        if item["kind"] == "lab" and not (exercises and all(str(t).startswith("Exercise ") for t in exercises)):
            raise ValueError(f"manifest entry {item['id']!r}: a lab lists its exercises ('Exercise 1: ...')")
    lessons = {item["id"] for item in items if item["kind"] == "lesson"}
    for item in items:
        if "deep_dive_of" in item and item["deep_dive_of"] not in lessons - {item["id"]}:
            raise ValueError(f"manifest entry {item['id']!r}: deep_dive_of names no other lesson")
        if item.get("format", "course") != "course":
            raise ValueError(f"manifest entry {item['id']!r}: format must be 'course' when given")
    return items


def deep_dives(core_id: str) -> list[dict]:
    """The deep-dive notebooks of a core lesson."""
    return [item for item in entries() if item.get("deep_dive_of") == core_id]


def hardware(item: dict) -> str:
    """What a lesson needs, for the README table."""
    needs = sorted({n for s in item["sections"] for n in s["needs"]})
    return "CPU" + (f"; more with {', '.join(needs)}" if needs else " (all of it)")


def verdict(item: dict, caps: Capabilities | None = None) -> tuple[str, list[str]]:
    """("full" | "partial", [skipped section: reason, ...]) for this machine. Every lesson runs on a
    CPU, so no verdict is "cannot run" unless a hard requirement (a section named "*") is missing."""
    caps = caps or capabilities()
    skipped = []
    for section in item["sections"]:
        reason = skip_reason(section["needs"], caps)
        if reason:
            if section["name"] == "*":
                return "cannot run", [reason]
            skipped.append(f"{section['name']}: {reason}")
    return ("partial" if skipped else "full"), skipped


def readme_table() -> str:
    rows = ["| # | Notebook | What you learn | Hardware | Time |", "|---|---|---|---|---|"]
    for item in entries():
        link = f"[{item['title']}]({item['path']})"
        if item["kind"] == "lab":    # learners open the student copy; the solution is linked beside it
            student = Path(item["path"]).parent.parent / Path(item["path"]).name
            link = f"[{item['title']}]({student.as_posix()}) ([solution]({item['path']}))"
        rows.append(f"| {item['id'][:2]} | {link} | {item['learn']} | {hardware(item)} | {item['minutes']} min |")
    return "\n".join(rows)
