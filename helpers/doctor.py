"""The capability report: what this machine has and what each lesson can run here."""
from __future__ import annotations

import html

from helpers.device import NEEDS, Capabilities, capabilities, missing, triton_mismatch, triton_remedy
from helpers.manifest import entries, verdict


def report_rows(caps: Capabilities | None = None) -> list[tuple[str, str]]:
    c = caps or capabilities()
    gil = "off" if not c.gil_enabled else "on"
    return [
        ("torch", c.torch_version + (f" (CUDA {c.cuda_version})" if c.cuda_version else "")
         + (f" (HIP {c.hip_version})" if c.hip_version else "") + (" (XPU build)" if c.xpu_compiled else "")),
        ("accelerator", f"{c.accelerator}: {c.device_name}" + (f", {c.arch}" if c.arch else "")),
        ("torch build for", build_note(c)),
        ("memory", f"{c.memory_gb} GiB" if c.memory_gb else "unknown"),
        ("bf16 / fp8 / fp64", " / ".join("yes" if ok else "no" for ok in (c.bf16, c.fp8, c.fp64))),
        ("CPU", f"{c.cpu_name}, {c.cpu_count} cores" + (f", kernels {c.cpu_capability}" if c.cpu_capability else "")),
        ("Python", f"{c.python_version}, free-threaded build: {'yes' if c.free_threaded else 'no'}, GIL {gil}"),
        ("toolchains", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in c.toolchains.items())),
        ("packages", ", ".join(f"{k} {v or 'missing'}" for k, v in c.packages.items())),
        ("triton", triton_line(c)),
        ("capabilities met", ", ".join(n for n in NEEDS if not missing(n, caps=c))),
        ("capabilities missing", ", ".join(n for n in NEEDS if missing(n, caps=c))),
    ]


def triton_line(c: Capabilities) -> str:
    """Which distribution gave the `triton` module, against what torch declares, and what to do."""
    if c.packages.get("triton") is None:
        return f"missing; {triton_remedy(c)}"
    line = f"{c.packages['triton']} from {c.triton_distribution or 'an unknown distribution'}"
    line += f" (torch declares {c.torch_wants_triton})" if c.torch_wants_triton else ""
    problem = triton_mismatch(c)
    return f"{line}. WARNING: {problem}" if problem else line


def build_note(c: Capabilities) -> str:
    """What the installed torch was built for, and whether that device is here."""
    if c.build_accelerator is None:
        return "CPU only"
    if c.build_accelerator == c.accelerator:
        return f"{c.build_accelerator} (device present)"
    return (f"{c.build_accelerator}, but no {c.build_accelerator} device is present: everything runs on the CPU "
            f"(the GPU sections would run on a machine with one)")


def lesson_rows(caps: Capabilities | None = None) -> list[tuple[str, str, list[str]]]:
    rows = []
    for item in entries():
        state, skipped = verdict(item, caps)
        label = {"full": "runs fully", "partial": "runs, with sections skipped",
                 "cannot run": "cannot run"}[state]
        rows.append((item["path"], label, skipped))
    return rows


def report_text(caps: Capabilities | None = None) -> str:
    lines = ["== This machine =="]
    lines += [f"{name:<22}{value}" for name, value in report_rows(caps)]
    lines.append("\n== Lessons and labs here ==")
    for path, label, skipped in lesson_rows(caps):
        lines.append(f"{path:<48}{label}")
        lines += [f"    skipped: {s}" for s in skipped]
    return "\n".join(lines)


def learning_path(caps: Capabilities | None = None) -> str:
    """The path through the collection on this machine: each lesson with its deep dive and lab, the
    minutes on their cards, the sections that skip here (with the capability they lack; the doctor
    gives each reason in full), then what to open next."""
    c = caps or capabilities()
    items, lines = entries(), []
    for item in items:
        kind = "deep dive" if "deep_dive_of" in item else item["kind"]
        lines.append(f"{item['id'][:2]}  {kind:<9} {item['minutes']:>3} min  {item['title']}")
        lines += [f"{'':>21}skips here: {s}" for s in skipped_here(item, c)]
    minutes = {kind: sum(i["minutes"] for i in items if i["kind"] == kind and "deep_dive_of" not in i)
               for kind in ("lesson", "lab")}
    lines.append(f"\nCore lessons {minutes['lesson']} min in all, labs {minutes['lab']} min; a deep dive is for "
                 f"those who need its topic in depth.")
    where = ("this GPU runs the GPU sections: 02, 03 and 06 have the most" if c.accelerator != "cpu"
             else "on a GPU the skipped sections run too (environments/ has the install for each vendor)")
    lines.append(f"Open next: lesson 01, then any order. Everything above runs here; "
                 f"{len(core_lessons_skipping(c, items))} of the core lessons 01-08 skip some sections ({where}).")
    return "\n".join(lines)


def skipped_here(item: dict, caps: Capabilities) -> list[str]:
    """The sections of a manifest entry that skip on this machine, each with the capabilities it lacks."""
    return [f"{s['name']} (needs {', '.join(lacking)})" for s in item["sections"]
            if (lacking := missing(*s["needs"], caps=caps))]


def core_lessons_skipping(caps: Capabilities, items: list[dict] | None = None) -> list[str]:
    """The ids of the core lessons after 00 that skip at least one section here."""
    return [i["id"] for i in items or entries() if i["kind"] == "lesson" and "deep_dive_of" not in i
            and i["id"] != "00_start_here" and skipped_here(i, caps)]


def report_html(caps: Capabilities | None = None, *, with_lessons: bool = True) -> str:
    """The same report as an HTML table, for notebooks (IPython.display.HTML); with_lessons=False leaves
    out the lessons (lesson 00 prints its learning path instead)."""
    cell = "padding:2px 10px;text-align:left;vertical-align:top"
    rows = "".join(f"<tr><th style='{cell}'>{html.escape(k)}</th><td style='{cell}'>{html.escape(v)}</td></tr>"
                   for k, v in report_rows(caps))
    colour = {"runs fully": "#1a7f37", "runs, with sections skipped": "#9a6700", "cannot run": "#cf222e"}
    lessons = "".join(
        f"<tr><td style='{cell}'>{html.escape(p)}</td><td style='{cell};color:{colour[label]}'>{label}"
        + "".join(f"<br><small>skipped: {html.escape(s)}</small>" for s in skipped) + "</td></tr>"
        for p, label, skipped in lesson_rows(caps))
    return (f"<h4>This machine</h4><table>{rows}</table>"
            + (f"<h4>Lessons and labs here</h4><table>{lessons}</table>" if with_lessons else ""))
