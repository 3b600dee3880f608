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
    ("Max 1550", {"xpu", "bf16", "gpu"}, {"fp8", "fp64", "sycl", "torch_cuda"})])   # fp8, fp64, sycl: tried, not owed
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


@pytest.mark.parametrize("machine, torch_mod, dist", [
    ("H200", dict(accelerator="cuda", props=dict(name="NVIDIA H200", total_memory=2**37, major=9, minor=0)), "triton"),
    ("MI300X", dict(accelerator="cuda", hip="7.1.0", props=dict(name="MI300X", total_memory=2**37, major=9, minor=4,
                                                                gcnArchName="gfx942")), "triton-rocm"),
    ("Max 1550", dict(accelerator="xpu", props=dict(name="Intel(R) Data Center GPU Max 1550", total_memory=2**36)),
     "triton-xpu"),
])
def test_what_gpu_check_owes_is_what_the_device_layer_detects_on_that_vendor_s_build(machine, torch_mod, dist):
    """Each vendor's torch build with its own Triton distribution: every capability make gpu-check expects
    to run is met by what helpers.device detects (fp8 tried and working, as on these three GPUs)."""
    from types import SimpleNamespace

    from test_device import fake_torch, probe_fake
    from helpers.device import missing
    fake = fake_torch(**dict(torch_mod, props=SimpleNamespace(**torch_mod["props"])))
    caps = probe_fake(fake, triton=lambda: ("3.6.0", dist), triton_wanted=lambda: f"{dist}==3.6.0",
                      fp8_runs=lambda torch_mod, dev: True)
    assert missing(*sorted(gpu_check.expected_needs(detect(machine))), caps=caps) == []


def test_verify_writes_one_bundle_that_the_report_merges_as_an_environment(tmp_path, capsys):
    from helpers.runner.matrix import merge_runs, read_run
    sections = [{"section": "SDPA backends on the GPU", "needs": ["torch_cuda"], "ran": True, "reason": None}]
    figures = [{"section": "SDPA backends on the GPU", "device": "cuda", "results": {"flash": {}}}]
    (tmp_path / "record.json").write_text(json.dumps({**record(sections, figures), "label": "gpu-check-cuda"}))
    (tmp_path / "doctor.txt").write_text("torch  2.10.0+cu128 (CUDA 12.8)\n")
    (tmp_path / "gpu_sections.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu_sections" name="test_x[06-cell26]"/>'
        '<testcase classname="tests.test_gpu_sections" name="test_x[07-cell19]"><failure message="gone"/></testcase>'
        '</testsuite></testsuites>')
    assert gpu_check.verify(tmp_path, detect("H200")) == 1, "a failed static check fails the verdict"
    out = capsys.readouterr().out
    assert "STATIC CHECK FAILED: test_x[07-cell19]" in out and gpu_check.BUNDLE in out
    path = tmp_path / gpu_check.BUNDLE
    bundle = json.loads(path.read_text())
    assert bundle["record"]["label"] == "gpu-check-cuda" and bundle["doctor"].startswith("torch  2.10.0")
    assert [f["section"] for f in bundle["gpu_figures"]["figures"]] == ["SDPA backends on the GPU"]
    assert bundle["gpu_sections_check"] == {"passed": 1, "failed": ["test_x[07-cell19]"]}
    assert read_run(path) == (bundle["record"], {})
    [env] = merge_runs([path])["environments"]
    assert env["name"] == "gpu-check-cuda" and env["gpu_sections_check"] == bundle["gpu_sections_check"]


def test_a_bundle_without_static_check_or_doctor_says_so(tmp_path):
    sections = [{"section": "SDPA backends on the GPU", "needs": ["torch_cuda"], "ran": True, "reason": None}]
    (tmp_path / "record.json").write_text(json.dumps(record(sections)))
    assert gpu_check.verify(tmp_path, detect("H200")) == 0
    bundle = json.loads((tmp_path / gpu_check.BUNDLE).read_text())
    assert bundle["gpu_sections_check"] is None and bundle["doctor"] is None


def test_the_twins_run_as_scripts_without_jupyter_and_write_the_bundle(tmp_path, monkeypatch):
    """`helpers gpu-check --no-jupyter` on a machine without IPython, ipywidgets, plotly or nbformat: stand-ins
    take their place, the record holds each notebook's sections and figures, and the bundle is written."""
    from helpers.runner import script_check
    blocked = tmp_path / "blocked"
    for name in ("IPython", "ipywidgets", "plotly", "nbformat", "papermill"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('not on this machine: {name}')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocked))
    out = tmp_path / "out"
    code = script_check.main(out, workers=2, paths=["notebooks/00_start_here.ipynb", "labs/solutions/00_warmup_lab.ipynb"])
    record = json.loads((out / "record.json").read_text())
    assert code == 0 and [n["status"] for n in record["notebooks"]] == ["passed", "passed"], \
        [(n["path"], n["detail"]) for n in record["notebooks"]]
    start = record["notebooks"][0]
    assert start["sections"] and start["figures"] and start["runner"] == "script"
    log = (out / "logs" / "00_start_here.log").read_text()
    assert "a figure" in log and "Not yet" in log        # a stand-in figure; the your-turn read its initial value
    assert json.loads((out / "gpu-check-bundle.json").read_text())["record"]["notebooks"][1]["path"] == \
        "labs/solutions/00_warmup_lab.ipynb"
