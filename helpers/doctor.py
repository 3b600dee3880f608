"""The capability report: what this machine has and what each lesson can run here."""
from __future__ import annotations

import html

from helpers.device import NEEDS, Capabilities, capabilities, missing
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
        ("bf16 / fp8 native", f"{'yes' if c.bf16 else 'no'} / {'yes' if c.fp8 else 'no'}"),
        ("CPU", f"{c.cpu_name}, {c.cpu_count} cores"),
        ("Python", f"{c.python_version}, free-threaded build: {'yes' if c.free_threaded else 'no'}, GIL {gil}"),
        ("toolchains", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in c.toolchains.items())),
        ("packages", ", ".join(f"{k} {v or 'missing'}" for k, v in c.packages.items())),
        ("capabilities met", ", ".join(n for n in NEEDS if not missing(n, caps=c))),
        ("capabilities missing", ", ".join(n for n in NEEDS if missing(n, caps=c))),
    ]


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


def report_html(caps: Capabilities | None = None) -> str:
    """The same report as an HTML table, for notebooks (IPython.display.HTML)."""
    cell = "padding:2px 10px;text-align:left;vertical-align:top"
    rows = "".join(f"<tr><th style='{cell}'>{html.escape(k)}</th><td style='{cell}'>{html.escape(v)}</td></tr>"
                   for k, v in report_rows(caps))
    colour = {"runs fully": "#1a7f37", "runs, with sections skipped": "#9a6700", "cannot run": "#cf222e"}
    lessons = "".join(
        f"<tr><td style='{cell}'>{html.escape(p)}</td><td style='{cell};color:{colour[label]}'>{label}"
        + "".join(f"<br><small>skipped: {html.escape(s)}</small>" for s in skipped) + "</td></tr>"
        for p, label, skipped in lesson_rows(caps))
    return (f"<h4>This machine</h4><table>{rows}</table>"
            f"<h4>Lessons and labs here</h4><table>{lessons}</table>")
