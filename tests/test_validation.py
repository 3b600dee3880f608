"""The validation pipeline: each workload's quick size runs, the upgrade checks pass (and fail cleanly),
and compare works on recorded runs, including a run with a missing workload and a corrupt file."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers.__main__ import main
from helpers.validation import compare_runs, load_run, run_pipeline, save_run, table, write_report
from helpers.validation import models, pipeline, upgrade, workloads

FIXTURES = Path(__file__).parent / "fixtures" / "validation"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --- workloads ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_each_workload_quick_size_runs(name):
    result = workloads.WORKLOADS[name](True, CPU, repeats=2, min_run_time=0.005)
    assert result["figures"], f"{name} reported no figures"
    for fig_name, fig in result["figures"].items():
        assert fig["better"] in ("lower", "higher"), fig_name
        assert fig["value"] > 0 and fig["min"] <= fig["value"] <= fig["max"], (fig_name, fig)
        assert len(fig["repeats"]) in (1, 2)
    json.dumps(result)                       # JSON-ready


def test_resnet50_has_the_real_parameter_count():
    assert sum(p.numel() for p in models.resnet50().parameters()) == 25_557_032   # torchvision's resnet50
    with pytest.raises(ValueError, match="base_width"):
        models.resnet50(base_width=0)


def test_jagged_encoder_matches_padded_on_real_tokens():
    torch.manual_seed(0)
    enc = models.Encoder(dim=32, layers=2, heads=4, ffn=64).eval()
    lengths = [1, 7, 3, 7]                    # a length-1 sequence and ties
    x, mask = models.padded_batch(lengths, 32)
    with torch.no_grad():
        padded, jagged = enc(x, mask), enc(models.to_jagged(x, mask))
    for row, p, n in zip(jagged.unbind(), padded, lengths):
        assert row.shape == (n, 32)
        torch.testing.assert_close(row, p[:n], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="positive"):
        models.padded_batch([3, 0], 32)
    with pytest.raises(ValueError, match="divisible"):
        models.EncoderLayer(30, 4, 64)


def test_grouped_mm_moe_matches_loop_with_an_empty_expert():
    torch.manual_seed(0)
    grouped = models.MoE(dim=8, hidden=16, experts=5)
    loop = models.MoE(dim=8, hidden=16, experts=5, mode="loop")
    loop.load_state_dict(grouped.state_dict())
    x = torch.randn(3, 8)                     # 3 tokens, 5 experts: at least two experts get nothing
    torch.testing.assert_close(grouped(x), loop(x))
    grouped(x).square().mean().backward()     # grouped_mm's backward runs on CPU
    assert grouped.w1.grad is not None and grouped.w1.grad.shape == (5, 8, 16)
    with pytest.raises(ValueError, match="mode"):
        models.MoE(8, 16, 2, mode="bmm")


def test_peak_memory_counts_live_tensors_only():
    def two_alive_at_most():
        a = torch.ones(1000, 1000)
        b = a * 2
        del a
        c = b + 1
        del b
        return c.sum()
    assert workloads.peak_memory(two_alive_at_most, CPU) == 2 * 4_000_000   # never more than two 4 MB tensors alive


# --- upgrade checks ----------------------------------------------------------------------------

def test_custom_op_passes_opcheck():
    result = upgrade.check_custom_op(True, CPU)
    assert result["passed"], result
    assert all(v == "SUCCESS" for k, d in result["details"].items() if k.startswith("sample") for v in d.values())


def test_amp_bf16_within_tolerance_and_dtypes():
    result = upgrade.check_amp(True, CPU)
    assert result["passed"], result
    assert result["details"]["dtypes_under_autocast"] == {     # grouped_mm: in no autocast op list
        "linear": "torch.bfloat16", "mse_loss": "torch.float32", "grouped_mm": "torch.float32"}
    assert 0 < result["details"]["output_relative_error"] <= upgrade.AMP_OUTPUT_RTOL


def test_quantization_keeps_accuracy_and_records_the_deprecation():
    result = upgrade.check_quantization(True, CPU)
    assert result["passed"], result
    assert "deprecated" in result["details"]["quantize_dynamic"]["deprecation_warning"]
    assert result["details"]["fp32_accuracy"] > 0.7


def test_ddp_gloo_two_processes_identical_gradients():
    result = upgrade.check_ddp(True, CPU)
    assert result["passed"], result
    assert result["details"]["ranks_identical"] is True


def test_ddp_never_hangs_a_short_timeout_kills_the_workers():
    result = upgrade.check_ddp(True, CPU, timeout_s=0.3)
    assert not result["passed"]
    assert "were killed" in result["details"]["error"]


# --- the run file ------------------------------------------------------------------------------

def test_a_failing_workload_is_recorded_and_the_rest_kept(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure")
    monkeypatch.setitem(workloads.WORKLOADS, "resnet50_train", broken)
    monkeypatch.setattr(pipeline, "WORKLOADS", workloads.WORKLOADS)
    run = run_pipeline(quick=True, threads=1, workloads=["resnet50_train", "unet_attention"],
                       checks=["amp_bf16"], repeats=2, min_run_time=0.005, progress=False)
    assert "simulated failure" in run["errors"]["resnet50_train"]
    assert list(run["workloads"]) == ["unet_attention"] and run["checks"]["amp_bf16"]["passed"]
    assert run["torch"] == torch.__version__ and run["threads"] == 1
    loaded = load_run(save_run(run, tmp_path / "run.json"))
    assert loaded["workloads"]["unet_attention"]["figures"] == run["workloads"]["unet_attention"]["figures"]


def test_unknown_workload_is_rejected():
    with pytest.raises(ValueError, match="unknown workload or check 'resnet'"):
        run_pipeline(workloads=["resnet"], progress=False)


# --- compare -----------------------------------------------------------------------------------

def test_compare_recorded_runs_with_a_missing_workload():
    report = compare_runs(load_run(FIXTURES / "run_a.json"), load_run(FIXTURES / "run_b_missing_workload.json"))
    why = "RuntimeError: grouped_mm and per-expert loop disagree: loss 1.0988 vs 0.9585"
    assert report["missing"] == [{"workload": "dlrm_moe_train", "missing_in": "B", "why": why}]
    compared = {(r["workload"], r["figure"]) for r in report["rows"]}
    assert ("bert_infer", "jagged_latency_L128") in compared and ("unet_attention", "iteration_time") in compared
    by_name = {(r["workload"], r["figure"]): r for r in report["rows"]}
    step = by_name[("resnet50_train", "step_time")]
    assert step["status"] == "regression" and step["gain"] == pytest.approx(1 / 3)
    assert by_name[("resnet50_train", "images_per_s")]["gain"] == pytest.approx(1 / 3)
    assert {c["check"]: c["status"] for c in report["checks"]} == {
        "amp_bf16": "regression", "custom_op": "missing in B"}
    text = table(report)
    assert "missing in B: RuntimeError" in text and "regression(s) beyond the measured noise" in text


def test_changes_within_the_measured_noise_are_not_flagged():
    def run(value, spread):
        fig = {"value": value, "min": value * (1 - spread), "max": value * (1 + spread), "better": "lower", "unit": "s"}
        return {"label": "x", "workloads": {"w": {"figures": {"t": fig}}}, "checks": {}, "errors": {}}
    assert compare_runs(run(1.0, 0.10), run(1.15, 0.10))["rows"][0]["status"] == "within noise"   # 15% < 20%
    assert compare_runs(run(1.0, 0.05), run(1.15, 0.05))["rows"][0]["status"] == "regression"     # 15% > 10%
    assert compare_runs(run(1.0, 0.0), run(1.01, 0.0))["rows"][0]["status"] == "within noise"     # under 2%
    assert compare_runs(run(1.0, 0.0), run(0.5, 0.0))["rows"][0]["status"] == "improvement"


def test_an_unreadable_figure_loses_nothing_else():
    a = load_run(FIXTURES / "run_a.json")
    b = load_run(FIXTURES / "run_a.json")
    b["workloads"]["unet_attention"]["figures"]["iteration_time"] = {"value": "fast"}
    rows = {(r["workload"], r["figure"]): r["status"] for r in compare_runs(a, b)["rows"]}
    assert rows[("unet_attention", "iteration_time")] == "unreadable figure"
    assert rows[("unet_attention", "math_attention_iteration_time")] == "within noise"
    assert len(rows) == sum(len(w["figures"]) for w in a["workloads"].values())


@pytest.mark.parametrize("content, message", [
    (None, "corrupt or truncated"),
    ('{"schema": "something else"}', "is not a validation run"),
    ('{"schema": "pytorch-210-labs/validation-run/1", "workloads": [], "checks": {}}', '"workloads" is missing'),
])
def test_bad_run_files_give_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is None:
        shutil.copy(FIXTURES / "corrupt_truncated.json", path)
    else:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_run(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="no such run file"):
        load_run(tmp_path / "absent.json")


def test_compare_command_writes_table_and_chart(tmp_path, capsys):
    out = tmp_path / "report.html"
    rc = main(["validate", "compare", str(FIXTURES / "run_a.json"), str(FIXTURES / "run_b_missing_workload.json"),
               "--out", str(out)])
    assert rc == 1                            # regressions found
    page = out.read_text()
    assert "Validation report" in page and "plotly" in page.lower() and "dlrm_moe_train" in page
    assert "regression" in capsys.readouterr().out


def test_compare_command_with_a_corrupt_file_keeps_the_previous_report(tmp_path):
    out = tmp_path / "report.html"
    out.write_text("previous report")
    with pytest.raises(SystemExit, match="corrupt_truncated.json is not valid JSON"):
        main(["validate", "compare", str(FIXTURES / "run_a.json"), str(FIXTURES / "corrupt_truncated.json"),
              "--out", str(out)])
    assert out.read_text() == "previous report"
    assert json.loads((FIXTURES / "run_a.json").read_text())["label"] == "recorded A"


def test_write_report_is_atomic_html(tmp_path):
    report = compare_runs(load_run(FIXTURES / "run_a.json"), load_run(FIXTURES / "run_a.json"))
    assert not report["regressions"]
    path = write_report(report, tmp_path / "sub" / "r.html")
    assert path.exists() and not list(path.parent.glob("*.tmp"))


# --- the lab's checks --------------------------------------------------------------------------

def test_lab_checks_fail_with_a_hint():
    from helpers.checks import CheckFailed
    from helpers.validation import labcheck
    with pytest.raises(CheckFailed, match="dlrm_moe_train failed: RuntimeError"):
        labcheck.check_run_file(FIXTURES / "run_b_missing_workload.json", threads=1, checks=[], what="run")
    with pytest.raises(CheckFailed, match="expected 'regression'"):
        labcheck.check_verdict(lambda a, b: "within noise", what="verdict")
    report = compare_runs(load_run(FIXTURES / "run_a.json"), load_run(FIXTURES / "run_b_missing_workload.json"))
    with pytest.raises(CheckFailed, match="jagged_gain_by_length must map"):
        labcheck.check_answers({"jagged_gain_by_length": {}}, FIXTURES / "run_a.json", report, what="answers")
    labcheck.check_report(report, FIXTURES / "run_a.json", FIXTURES / "run_b_missing_workload.json", what="report")
    with pytest.raises(CheckFailed, match="not the file PATH_A"):
        labcheck.check_report(report, FIXTURES / "run_b_missing_workload.json", FIXTURES / "run_a.json", what="report")
