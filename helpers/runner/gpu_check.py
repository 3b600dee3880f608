"""`make gpu-check`: what a GPU machine must show, judged without trusting torch's own detection.

    python -m helpers.runner.gpu_check vendor            # prints cuda, rocm or xpu; exit 1 with no GPU
    python -m helpers.runner.gpu_check verify RUN_DIR    # silent skips, GPU figures, the matrix report, the bundle

The vendor and its architecture come from the vendor's tools (nvidia-smi, rocminfo, xpu-smi or sycl-ls),
not from torch: a torch that fails to see its GPU (a CPU wheel, a driver mismatch) would otherwise skip
every GPU section and pass. `verify` fails a run where a notebook failed, where a section was skipped
although everything it needs is what this GPU provides (a silent skip), or where the static check of the
GPU sections failed. It writes RUN_DIR/gpu_figures.json (every timing taken on the GPU, with its section),
RUN_DIR/matrix.html and RUN_DIR/gpu-check-bundle.json, the one file a GPU verification report attaches:
the record, the GPU figures, the static check (from RUN_DIR/gpu_sections.xml) and the doctor's report
(RUN_DIR/doctor.txt); `python -m helpers report` merges a bundle like a run folder. Imports no torch.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.files import write_text_atomic
from helpers.runner.matrix import merge_runs, read_static_check, write_matrix

FNUZ_OR_CK_ARCHS = ("gfx942", "gfx950")     # helpers.device.FP8_ROCM_ARCHS (no torch here)
BUNDLE = "gpu-check-bundle.json"


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def detect(which=shutil.which, run=_run) -> dict | None:
    """{"vendor": "cuda"|"rocm"|"xpu", "arch": ...} from the vendor's tools; None when no GPU is found."""
    if which("nvidia-smi"):
        caps = run("nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader").split()
        if caps:
            major, minor = (int(p) for p in caps[0].split("."))
            return {"vendor": "cuda", "arch": f"sm_{major}{minor}", "major": major, "minor": minor}
    if which("rocminfo"):
        archs = sorted(set(re.findall(r"\bgfx[0-9a-f]+\b", run("rocminfo"))) - {"gfx000"})
        if archs:
            return {"vendor": "rocm", "arch": archs[0]}
    for tool, args in (("xpu-smi", ("discovery",)), ("sycl-ls", ())):
        if which(tool) and re.search(r"Intel.*(GPU|Graphics)|level_zero:gpu", run(tool, *args)):
            return {"vendor": "xpu", "arch": None}
    return None


def expected_needs(gpu: dict) -> set[str]:
    """The capabilities this GPU provides with its environment file installed (torch builds for all
    three vendors bring Triton, under three distribution names). A section whose needs are all here must
    run. Intel GPUs: fp64 only on Data Center GPU Max, so a section needing it may skip on Arc."""
    common = {"gpu", "accelerator", "triton", "triton_gpu", "triton_interpreter"}
    if gpu["vendor"] == "cuda":
        major, minor = gpu["major"], gpu["minor"]
        return common | {"cuda", "torch_cuda", "fp64"} | ({"bf16"} if major >= 8 else set()) \
            | ({"fp8"} if (major, minor) >= (8, 9) else set()) | ({"grouped_mm_cutlass"} if major in (9, 10) else set())
    if gpu["vendor"] == "rocm":
        arch = gpu["arch"]
        return common | {"rocm", "torch_cuda", "fp64"} | ({"bf16"} if arch.startswith(("gfx90a", "gfx94", "gfx95")) else set()) \
            | ({"fp8", "rocm_ck"} if arch in FNUZ_OR_CK_ARCHS else set())
    return common | {"xpu", "bf16"}


def silent_skips(record: dict, expected: set[str]) -> list[str]:
    """Sections skipped although this GPU provides everything they need."""
    return [f"{nb['path']}: '{s['section']}' ({s.get('reason')})" for nb in record["notebooks"]
            for s in nb.get("sections", []) if not s["ran"] and set(s["needs"]) <= expected]


def gpu_figures(record: dict) -> list[dict]:
    """Every timing of the run that was taken on an accelerator, with its notebook and section."""
    return [{"notebook": nb["path"], **figure} for nb in record["notebooks"] for figure in nb.get("figures", [])
            if not str(figure.get("device", "cpu")).startswith("cpu")]


def bundle(run_dir: Path, record: dict, figures: dict) -> dict:
    """What a GPU verification report attaches: the run's record, its GPU figures, the static check of the
    GPU sections (None without gpu_sections.xml) and the doctor's report (None without doctor.txt)."""
    doctor = run_dir / "doctor.txt"
    return {"record": record, "gpu_figures": figures,
            "gpu_sections_check": read_static_check(run_dir / "gpu_sections.xml"),
            "doctor": doctor.read_text() if doctor.is_file() else None}


def verify(run_dir: str | Path, gpu: dict) -> int:
    run_dir = Path(run_dir)
    record = json.loads((run_dir / "record.json").read_text())
    failed = [nb["path"] for nb in record["notebooks"] if nb["status"] != "passed"]
    skips = silent_skips(record, expected_needs(gpu))
    figures = gpu_figures(record)
    figures_doc = {"gpu": gpu, "torch": record["machine"].get("torch_version"),
                   "device_name": record["machine"].get("device_name"), "figures": figures}
    write_text_atomic(json.dumps(figures_doc, indent=2), run_dir / "gpu_figures.json")
    report = bundle(run_dir, record, figures_doc)
    write_text_atomic(json.dumps(report, indent=1), run_dir / BUNDLE)
    static_failures = (report["gpu_sections_check"] or {}).get("failed", [])
    write_matrix(merge_runs([run_dir]), run_dir)
    ran = sum(s["ran"] for nb in record["notebooks"] for s in nb.get("sections", []))
    print(f"{len(record['notebooks']) - len(failed)}/{len(record['notebooks'])} notebooks passed; "
          f"{ran} sections ran; {len(figures)} GPU timings in {run_dir / 'gpu_figures.json'}")
    for path in failed:
        print(f"FAILED: {path}")
    for skip in skips:
        print(f"SILENT SKIP (this {gpu['vendor']} GPU has what it needs): {skip}")
    for test in static_failures:
        print(f"STATIC CHECK FAILED: {test}")
    print(f"attach to a GPU verification report: {run_dir / BUNDLE}")
    return 1 if failed or skips or static_failures else 0


def main(argv: list[str]) -> int:
    gpu = detect()
    if argv[:1] == ["vendor"]:
        if gpu is None:
            print("no GPU found (nvidia-smi, rocminfo, xpu-smi and sycl-ls see none)", file=sys.stderr)
            return 1
        print(gpu["vendor"])
        return 0
    if argv[:1] == ["verify"] and len(argv) == 2:
        if gpu is None:
            print("no GPU found: nothing to verify", file=sys.stderr)
            return 1
        return verify(argv[1], gpu)
    print("\n".join(__doc__.splitlines()[2:4]), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
