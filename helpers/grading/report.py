"""What the grader writes for teachers: scores.csv and one feedback file per student. Every text that came
from a submission (an exception's message, a cell's error, a refused path, a file name) is made inert
first: on one line, in a code span, and never the start of a spreadsheet formula."""
from __future__ import annotations

import csv
import io

from helpers.grading.judge import CONTROL, untrusted

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "|")


def csv_cell(value):
    """A value for scores.csv: numbers as they are; a text that a spreadsheet would run as a formula gets a
    leading apostrophe (OWASP's advice for CSV injection)."""
    if value is None:
        return "not gradable here"
    if isinstance(value, (int, float)):
        return value
    text = CONTROL.sub(" ", str(value).replace("\n", " "))
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def feedback(row: dict, lab: str, exercises, run: dict) -> str:
    text = [f"# {lab}: feedback for {untrusted(row['student'], 100)}", "",
            f"Score: {row['total']:g} / {row['max']:g}", ""]
    if row["isolation"].startswith("not isolated"):
        text += [f"Graded without operating-system isolation ({row['isolation']}).", ""]
    elif row["isolation"] != "isolated":
        text += [f"Graded {row['isolation']}.", ""]
    for ex in exercises:
        score = row["scores"][ex.title]
        text.append(f"- {ex.title}: " + ("not gradable here" if score is None else f"{score:g} / {ex.points:g}"))
    text += ["", "## Checks", ""] + [line.replace("\n", "\n    ") for line in row["lines"]]
    if run.get("build_seconds"):
        text += ["", f"Building your extension took {run['build_seconds']:.0f} s, with a limit of its own: it is not "
                 "counted as your code's run time."]
    if run["cell_errors"]:
        text += ["", "## Cells that failed while your notebook ran", ""] + [f"- {untrusted(e)}" for e in run["cell_errors"]]
    if row["flags"]:
        text += ["", "## Refused", "", "Grading runs your code without access to the solutions, the grader or "
                 "other files it protects; these attempts were refused:", ""] + [f"- {untrusted(f)}" for f in row["flags"][:50]]
    return "\n".join(text) + "\n"


def scores_csv(rows: list[dict], exercises) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    titles = [e.title for e in exercises]
    writer.writerow(["student", *titles, "total", "max", "status", "isolation", "seconds", "flags"])
    for row in rows:
        writer.writerow([csv_cell(v) for v in (row["student"], *[row["scores"][t] for t in titles], row["total"],
                                               row["max"], row["status"], row["isolation"], row["seconds"],
                                               "; ".join(row["flags"][:20])[:2000])])
    return buffer.getvalue()
