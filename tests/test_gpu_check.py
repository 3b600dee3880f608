"""make gpu-check's verdict: the vendor from its own tools, silent skips, the GPU figures (no GPU needed)."""
import json

import pytest

from helpers.runner import gpu_check

TOOLS = {
    "H200": ({"nvidia-smi"}, {"nvidia-smi": "9.0\n"}),
    "RTX 5090": ({"nvidia-smi"}, {"nvidia-smi": "12.0\n"}),
    "MI300X": ({"rocminfo"}, {"rocminfo": "  Name:                    gfx942\n  Name:   gfx000\n"}),
    "Max 1550": ({"xpu-smi"}, {"xpu-smi": "| 0 | Device Name: Intel(R) Data Center GPU Max 1550 |"}),
    "none": (set(), {}),
}


def detect(machine):
    on_path, outputs = TOOLS[machine]
    return gpu_check.detect(which=lambda t: t if t in on_path else None, run=lambda tool, *a: outputs.get(tool, ""))


def test_the_vendor_and_architecture_come_from_the_vendors_tools():
    assert detect("H200") == {"vendor": "cuda", "arch": "sm_90", "major": 9, "minor": 0}
    assert detect("MI300X") == {"vendor": "rocm", "arch": "gfx942"}
    assert detect("Max 1550") == {"vendor": "xpu", "arch": None}
    assert detect("none") is None


@pytest.mark.parametrize("machine, present, absent", [
    ("H200", {"cuda", "torch_cuda", "bf16", "fp8", "grouped_mm_cutlass", "triton_gpu"}, {"rocm", "xpu", "sycl"}),
    ("RTX 5090", {"cuda", "fp8"}, {"grouped_mm_cutlass"}),          # sm_120 takes grouped_mm's loop
    ("MI300X", {"rocm", "rocm_ck", "fp8", "torch_cuda", "bf16"}, {"cuda", "grouped_mm_cutlass"}),
    ("Max 1550", {"xpu", "bf16", "gpu"}, {"fp8", "sycl", "torch_cuda"})])   # fp8 and sycl are tried, not owed
def test_what_each_gpu_owes(machine, present, absent):
    needs = gpu_check.expected_needs(detect(machine))
    assert present <= needs and not absent & needs


def record(sections, figures=(), status="passed"):
    return {"machine": {"torch_version": "2.10.0+cu128", "device_name": "NVIDIA H200", "accelerator": "cuda"},
            "notebooks": [{"path": "notebooks/06_attention_kernels.ipynb", "status": status, "sections": sections,
                           "figures": list(figures), "seconds": 1.0, "peak_memory_mb": 100.0, "error": None,
                           "fault": None}],
            "passed": 1, "failed": 0, "complete": True, "total_seconds": 1.0}


def test_a_section_skipped_on_a_gpu_that_has_its_needs_fails_the_check(tmp_path, capsys):
    sections = [{"section": "SDPA backends on the GPU", "needs": ["torch_cuda"], "ran": False,
                 "reason": "needs torch_cuda (this machine: cpu)"},
                {"section": "AOTriton vs CK on ROCm", "needs": ["rocm"], "ran": False, "reason": "needs rocm"},
                {"section": "Build and run the SYCL kernel", "needs": ["xpu", "sycl"], "ran": False, "reason": "x"}]
    figures = [{"section": "varlen_attn on the GPU", "device": "cuda", "results": {"varlen_attn": {}}},
               {"section": None, "device": "cpu", "results": {"a": {}}}]
    (tmp_path / "record.json").write_text(json.dumps(record(sections, figures)))
    assert gpu_check.verify(tmp_path, detect("H200")) == 1
    out = capsys.readouterr().out
    assert "SILENT SKIP" in out and "SDPA backends on the GPU" in out and "AOTriton" not in out
    written = json.loads((tmp_path / "gpu_figures.json").read_text())
    assert [f["section"] for f in written["figures"]] == ["varlen_attn on the GPU"]     # the CPU timing is left out
    assert (tmp_path / "matrix.html").is_file()


def test_a_clean_gpu_run_passes(tmp_path):
    sections = [{"section": "SDPA backends on the GPU", "needs": ["torch_cuda"], "ran": True, "reason": None}]
    (tmp_path / "record.json").write_text(json.dumps(record(sections)))
    assert gpu_check.verify(tmp_path, detect("H200")) == 0
    (tmp_path / "record.json").write_text(json.dumps(record(sections, status="failed")))
    assert gpu_check.verify(tmp_path, detect("H200")) == 1
