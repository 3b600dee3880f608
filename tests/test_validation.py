"""The validation pipeline: each workload's quick size runs on this torch and records its code paths, the
upgrade checks pass (and fail cleanly), the version-guarded paths fall back as they do on 2.9, and the
comparison can be trusted: mismatched runs are refused, numerics drift is caught, and the noise
statistic flags what it should (and, on A/A draws, rarely anything else)."""
import copy
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.__main__ import main
from helpers.validation import (NotComparable, compare_runs, load_run, merge_runs, run_pipeline, save_run, table,
                                write_report)
from helpers.validation import compat, matrix, models, pipeline, reference, upgrade, workloads

FIXTURES = Path(__file__).parent / "fixtures" / "validation"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One real run (two quick workloads, one check, 3 samples each), saved with its reference outputs."""
    torch.set_num_threads(1)
    run = run_pipeline(quick=True, threads=1, workloads=["dlrm_moe_train", "unet_attention"], checks=["amp_scaled_mm"],
                       samples=3, progress=False, label="small")
    return save_run(run, tmp_path_factory.mktemp("runs") / "a.json")


# --- workloads ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_each_workload_quick_size_runs(name):
    result = workloads.WORKLOADS[name](True, CPU, samples=2)
    assert result["figures"] and result["references"] and result["paths"], name
    for fig_name, fig in result["figures"].items():
        assert fig["better"] in ("lower", "higher"), fig_name
        assert fig["value"] > 0 and fig["min"] <= fig["value"] <= fig["max"], (fig_name, fig)
        assert len(fig["samples"]) in (1, 2) and fig["n"] == len(fig["samples"])
    large = {name for name, rec in result["references"].items() if np.prod(rec["shape"]) > reference.MAX_ELEMENTS}
    assert set(result["_tensors"]) == set(result["references"]) | {n + reference.NORMS_SUFFIX for n in large}
    json.dumps({k: v for k, v in result.items() if k != "_tensors"})          # JSON-ready


def test_bert_has_p50_p99_at_batch_1_and_a_batch_and_says_why_varlen_did_not_run():
    result = workloads.run_bert_infer(True, CPU, samples=2,
                                      cfg=dict(dim=32, layers=1, heads=2, ffn=64, batch=4, max_lengths=[16], samples=2))
    assert {"padded_b4_p50_L16", "padded_b4_p99_L16", "jagged_b4_p50_L16", "batch1_p50_L16",
            "batch1_p99_L16"} <= set(result["figures"])
    assert result["figures"]["batch1_p99_L16"]["stat"] == "p99"
    varlen = result["paths"]["varlen_attn"]
    assert varlen == "ran" or varlen.startswith("skipped: ")    # 2.9: not in torch; CPU: no kernel
    if compat.varlen_attn() is None:
        assert "2.10+" in varlen


def test_resnet50_has_the_real_parameter_count():
    assert sum(p.numel() for p in models.resnet50().parameters()) == 25_557_032   # torchvision's resnet50
    with pytest.raises(ValueError, match="base_width"):
        models.resnet50(base_width=0)


def test_unet_has_cross_attention_to_the_text_context():
    unet = models.seed_parameters_(models.UNet(16, (1, 2), (1, 1), heads=2, context_dim=24), 0).eval()
    x, t = models.randn(1, 4, 8, 8, seed=1), torch.tensor([10])
    with torch.no_grad():
        a = unet(x, t, models.randn(1, 7, 24, seed=2))
        b = unet(x, t, models.randn(1, 7, 24, seed=3))
    assert a.shape == x.shape and not torch.allclose(a, b)          # the text changes the prediction


def test_weights_and_inputs_do_not_depend_on_torchs_generator():
    torch.manual_seed(1)
    a = models.seed_parameters_(models.DLRM(4, 2, 50, 8, 2, 16), 3)
    torch.manual_seed(2)
    b = models.seed_parameters_(models.DLRM(4, 2, 50, 8, 2, 16), 3)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert torch.equal(models.randn(3, 4, seed=5), torch.from_numpy(
        np.random.default_rng(5).standard_normal((3, 4), dtype=np.float32)))


def test_jagged_encoder_matches_padded_on_real_tokens():
    enc = models.seed_parameters_(models.Encoder(dim=32, layers=2, heads=4, ffn=64), 0).eval()
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


def test_moe_path_matches_loop_with_an_empty_expert():
    auto = models.seed_parameters_(models.MoE(dim=8, hidden=16, experts=5), 0)
    loop = models.seed_parameters_(models.MoE(dim=8, hidden=16, experts=5, mode="loop"), 0)
    x = models.randn(3, 8, seed=1)            # 3 tokens, 5 experts: at least two experts get nothing
    torch.testing.assert_close(auto(x), loop(x))
    auto(x).square().mean().backward()
    assert auto.w1.grad is not None and auto.w1.grad.shape == (5, 8, 16)
    assert auto.path("cpu") == compat.moe_path("cpu") != "loop"          # 2.9 runs torch._grouped_mm on CPU too
    with pytest.raises(ValueError, match="mode"):
        models.MoE(8, 16, 2, mode="bmm")


@pytest.fixture
def fresh_probes():
    compat.moe_probes.cache_clear()
    yield
    compat.moe_probes.cache_clear()


def test_every_grouped_mm_api_is_probed_and_recorded(fresh_probes):
    probes = compat.moe_probes("cpu")
    assert set(probes) == {"F.grouped_mm", "torch._grouped_mm", "loop"} and probes["loop"] == "ran"
    assert probes["torch._grouped_mm"] == "ran"                     # its CPU kernel is in 2.9 and 2.10
    assert probes["F.grouped_mm"] == ("ran" if hasattr(F, "grouped_mm") else "absent")
    result = workloads.run_dlrm_moe_train(True, CPU, samples=1, cfg=dict(
        batch=32, dense=4, tables=2, rows=100, bag=3, dim=8, experts=2, hidden=16, samples=1))
    assert result["paths"] == {"moe": compat.moe_path("cpu"), "moe_probes": probes, "moe_dtype": "float32",
                               "moe_kernel": "fallback: one mm per group inside ATen (cpu)"}


def test_a_torch_with_only_the_private_op_uses_it_as_2_9_does(monkeypatch, fresh_probes):
    monkeypatch.delattr(F, "grouped_mm", raising=False)
    assert compat.moe_probes("cpu")["F.grouped_mm"] == "absent"
    assert compat.moe_path("cpu") == "_grouped_mm"
    auto = models.seed_parameters_(models.MoE(8, 16, 3), 0)
    loop = models.seed_parameters_(models.MoE(8, 16, 3, mode="loop"), 0)
    x = models.randn(6, 8, seed=0)
    assert auto.path("cpu") == "_grouped_mm"
    torch.testing.assert_close(auto(x), loop(x))


def test_where_no_grouped_mm_runs_the_moe_loops_and_says_why(monkeypatch, fresh_probes):
    def no_kernel(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_grouped_mm' with arguments from the 'CPU' backend")
    monkeypatch.delattr(F, "grouped_mm", raising=False)
    monkeypatch.setattr(torch, "_grouped_mm", no_kernel)
    probes = compat.moe_probes("cpu")
    assert probes["torch._grouped_mm"].startswith("NotImplementedError: Could not run") and probes["loop"] == "ran"
    assert compat.moe_path("cpu") == "loop"
    moe = models.MoE(8, 16, 3)
    assert moe.path("cpu") == "loop"
    moe(models.randn(6, 8, seed=0))
    with pytest.raises(RuntimeError, match="no grouped GEMM on cpu"):
        models.MoE(8, 16, 3, mode="grouped")(models.randn(6, 8, seed=0))
    result = workloads.run_dlrm_moe_train(True, CPU, samples=1, cfg=dict(
        batch=32, dense=4, tables=2, rows=100, bag=3, dim=8, experts=2, hidden=16, samples=1))
    assert result["paths"]["moe"] == "loop" and result["paths"]["moe_kernel"].startswith("loop")


def test_bf16_experts_as_on_a_gpu_agree_with_the_loop_and_train_fp32_weights():
    auto = models.seed_parameters_(models.MoE(16, 32, 4, expert_dtype=torch.bfloat16), 0)
    loop = models.seed_parameters_(models.MoE(16, 32, 4, mode="loop", expert_dtype=torch.bfloat16), 0)
    x = models.randn(24, 16, seed=1)
    y = auto(x)
    assert y.dtype == torch.float32 and auto.path("cpu") != "loop"
    torch.testing.assert_close(y, loop(x), atol=1e-3, rtol=reference.TOLERANCE["torch.bfloat16"])
    y.square().mean().backward()
    assert auto.w1.dtype == auto.w1.grad.dtype == torch.float32      # fp32 weights, cast per call as autocast does
    assert compat.moe_probes("cpu", torch.bfloat16)["torch._grouped_mm"] == "ran"


def test_the_grouped_gemm_kernel_follows_torchs_dispatch_rule(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.version, "hip", None)
    for major, dtype, expected in ((9, torch.bfloat16, "CUTLASS bf16 grouped GEMM (sm90"),
                                   (10, torch.bfloat16, "CUTLASS bf16 grouped GEMM (sm100"),
                                   (9, torch.float32, "fallback: one mm per group inside ATen (operands are not bf16)"),
                                   (8, torch.bfloat16, "fallback: one mm per group inside ATen (compute capability 8.x")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, major=major: (major, 0))
        assert compat.grouped_mm_kernel("grouped_mm", gpu, dtype).startswith(expected), (major, dtype)
    assert compat.grouped_mm_kernel("loop", gpu, torch.bfloat16).startswith("loop")
    assert compat.grouped_mm_kernel("_grouped_mm", CPU, torch.float32) == "fallback: one mm per group inside ATen (cpu)"


def test_peak_memory_counts_live_tensors_only():
    def two_alive_at_most():
        a = torch.ones(1000, 1000)
        b = a * 2
        del a
        c = b + 1
        del b
        return c.sum()
    assert workloads.step_memory(two_alive_at_most, CPU) == {"allocated": 2 * 4_000_000}   # two 4 MB tensors at most


class FakeAllocator:
    """torch.accelerator's memory statistics as a caching allocator reports them: 3 MB resident, a step
    that allocates 5 MB more at its peak, with 96 MB reserved in 4 segments (fragmentation)."""

    def __init__(self):
        self.calls = []

    def synchronize(self, device):
        self.calls.append("synchronize")

    def memory_allocated(self, device):
        return 3_000_000

    def reset_peak_memory_stats(self, device):
        self.calls.append("reset")

    def max_memory_allocated(self, device):
        return 8_000_000

    def max_memory_reserved(self, device):
        return 96 * 2**20

    def memory_stats(self, device):
        return {"segment.all.peak": 4, "segment.all.current": 3, "num_alloc_retries": 0}


def test_on_an_accelerator_reserved_memory_and_segments_are_recorded_beside_allocated(monkeypatch):
    fake, ran = FakeAllocator(), []
    memory = workloads.step_memory(lambda: ran.append(1), torch.device("cuda"), allocator=fake)
    assert memory == {"allocated": 5_000_000, "reserved": 96 * 2**20, "segments": 4}
    assert ran == [1] and fake.calls == ["synchronize", "reset", "synchronize"]     # peaks reset before the step
    cfg = dict(batch=32, dense=4, tables=2, rows=100, bag=3, dim=8, experts=2, hidden=16, samples=1)
    on_cpu = workloads.run_dlrm_moe_train(True, CPU, samples=1, cfg=cfg)
    assert "peak_step_reserved_memory" not in on_cpu["figures"] and "does not cache" in on_cpu["notes"]["reserved_memory"]
    monkeypatch.setattr(workloads, "step_memory", lambda fn, device, allocator=None: memory)
    figures = workloads.run_dlrm_moe_train(True, CPU, samples=1, cfg=cfg)["figures"]
    assert figures["peak_step_reserved_memory"] == workloads.constant_figure(96 * 2**20, "bytes")
    assert figures["reserved_segments"] == workloads.constant_figure(4, "segments")
    assert figures["peak_step_memory"]["value"] == 5_000_000


# --- upgrade checks ----------------------------------------------------------------------------

def test_cpp_extension_builds_loads_and_passes_opcheck():
    result = upgrade.check_cpp_extension(True, CPU)
    assert result["passed"], result
    d = result["details"]
    assert d["torch"] == torch.__version__ and torch.__version__.replace("+", "_") in d["build_directory_tag"]
    assert all(v == "SUCCESS" for k, o in d.items() if k.startswith("opcheck") for v in o.values())
    again = upgrade.check_cpp_extension(True, CPU)        # second time: the cached build for this torch
    assert again["passed"] and again["details"]["cached_build"] is True


def test_amp_within_tolerance_and_scaled_mm_path_recorded():
    result = upgrade.check_amp(True, CPU)
    assert result["passed"], result
    d = result["details"]
    assert d["dtypes_under_autocast"] == {"linear": "torch.bfloat16", "mse_loss": "torch.float32"}
    assert 0 < d["output_relative_error"] <= upgrade.AMP_OUTPUT_RTOL
    assert result["paths"]["scaled_mm"] in ("F.scaled_mm", "torch._scaled_mm")
    assert d["scaled_mm_attempts"][result["paths"]["scaled_mm"]] == "ran"
    assert 0 < d["fp8_relative_error"] <= upgrade.FP8_RTOL


def test_scaled_mm_falls_back_to_the_private_op_when_the_public_one_fails(monkeypatch):
    def unsupported(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_scaled_mm_v2' with arguments from the 'CPU' backend")
    monkeypatch.setattr(F, "scaled_mm", unsupported, raising=False)
    a8 = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b8 = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    path, out, tried = compat.scaled_mm_attempts(a8, b8, torch.tensor(1.0), torch.tensor(1.0))
    assert path == "torch._scaled_mm" and out.shape == (16, 16)
    assert tried["F.scaled_mm"].startswith("NotImplementedError")


def test_quantization_on_digits_keeps_accuracy_as_lesson_05_quantizes():
    pytest.importorskip("sklearn", reason="scikit-learn (its digits data set) is not installed")
    with pytest.warns(DeprecationWarning, match="torch.ao.quantization is deprecated"):   # left for the pipeline
        result = upgrade.check_quantization(True, CPU)
    assert result["passed"], result
    d, paths = result["details"], result["paths"]
    assert d["dataset"].startswith("sklearn digits: 1347 train / 450 test")
    assert d["fp32_accuracy"] > 0.9
    assert abs(d["int8_weight_only_drop"]) <= upgrade.QUANT_MAX_ACCURACY_DROP
    assert 0.9 <= d["int8_weight_only_agreement_with_fp32"] <= 1
    assert paths["quantization"].startswith("int8 weight-only per channel (helpers.quant")
    assert d["legacy_eager"] == "ran" and 0 <= d["static_int8_accuracy"] <= 1      # still in this torch
    assert d["torchao"] in ("ran", "skipped: torchao is not installed")


def test_quantization_without_the_legacy_api_passes_on_the_main_path(monkeypatch):
    pytest.importorskip("sklearn", reason="scikit-learn (its digits data set) is not installed")
    monkeypatch.setitem(sys.modules, "torch.ao.quantization", None)        # as a torch that removed it
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)          # as an environment without torchao
    result = upgrade.check_quantization(True, CPU)
    assert result["passed"] and "static_int8_accuracy" not in result["details"]
    assert result["details"]["legacy_eager"].startswith("absent: ModuleNotFoundError: import of torch.ao.quantization")
    assert result["paths"]["legacy_eager"] == "absent" and result["details"]["torchao"].startswith("skipped")


def test_ddp_gloo_two_processes_identical_gradients():
    result = upgrade.check_ddp(True, CPU)
    assert result["passed"], result
    assert result["details"]["ranks_identical"] is True and "nccl" in result["details"]


def test_ddp_never_hangs_a_short_timeout_kills_the_workers():
    result = upgrade.check_ddp(True, CPU, timeout_s=0.3)
    assert not result["passed"]
    assert "were killed" in result["details"]["error"]


# The noise statistic has its own tests: tests/test_validation_stats.py


# --- reference outputs: drift -------------------------------------------------------------------

def test_reference_compare_identical_within_tolerance_and_drift():
    t = models.randn(64, 64, seed=0)
    rec, ten = reference.record({"y": t})
    assert reference.compare(rec["y"], rec["y"], ten["y"], ten["y"])["status"] == "identical"
    close = t * (1 + 1e-6)
    rec2, ten2 = reference.record({"y": close})
    assert reference.compare(rec["y"], rec2["y"], ten["y"], ten2["y"])["status"] == "within tolerance"
    far = t.clone()
    far[3, 5] += 1e-2 * t.abs().max()
    rec3, ten3 = reference.record({"y": far})
    row = reference.compare(rec["y"], rec3["y"], ten["y"], ten3["y"])
    assert row["status"] == "drift" and row["max_rel_diff"] == pytest.approx(1e-2, rel=1e-3)
    assert reference.compare(rec["y"], rec3["y"], None, None)["status"] == "hash differs, tensors not available"
    big, big_tensors = reference.record({"y": torch.zeros(10_000)})
    assert big["y"]["stored_elements"] == reference.MAX_ELEMENTS
    assert big["y"]["block_size"] == 3 and big_tensors["y" + reference.NORMS_SUFFIX].shape == (3334,)  # 10,000 / 3


def test_a_localised_drift_the_subsample_skips_is_caught_by_the_block_norms():
    """262,144 elements (BERT's encoded_L128 at quick size) keep 1 in 64; doubling 20 neighbouring elements
    that are not among them leaves the subsample equal but moves one block's norm."""
    t = models.randn(8, 128, 256, seed=0)
    rec, ten = reference.record({"y": t})
    k = reference.stride(t.numel())
    assert k == 64 and rec["y"]["block_size"] == 64
    drifted = t.clone().view(-1)
    drifted[64 * 100 + 1: 64 * 100 + 21] *= 2                          # inside block 100, off the stride
    rec2, ten2 = reference.record({"y": drifted.view_as(t)})
    assert torch.equal(ten["y"], ten2["y"])                           # the subsample cannot see it
    norms = "y" + reference.NORMS_SUFFIX
    row = reference.compare(rec["y"], rec2["y"], ten["y"], ten2["y"], ten[norms], ten2[norms])
    assert row["status"] == "drift" and row["max_rel_diff"] == 0 and row["worst_block"] == 100
    assert row["max_rel_block_norm_diff"] > row["tolerance"]
    assert row["compared"] == "1 in 64 elements and norms of 4096 blocks of 64"
    old_file = reference.compare(rec["y"], rec2["y"], ten["y"], ten2["y"])      # a run from before block norms
    assert old_file["status"] == "within tolerance" and "subsample only" in old_file["compared"]
    rounding = t * (1 + 1e-6)                                        # a change far below fp32's tolerance
    rec3, ten3 = reference.record({"y": rounding})
    row = reference.compare(rec["y"], rec3["y"], ten["y"], ten3["y"], ten[norms], ten3[norms])
    assert row["status"] == "within tolerance" and row["max_rel_block_norm_diff"] <= row["tolerance"]
    small, _ = reference.record({"y": t[0, 0]})
    assert reference.compare(small["y"], small["y"], None, None)["compared"] == "sha256 of all 256 elements"


def test_injected_drift_keeps_one_drift_and_one_harmless_change_with_block_norms(small_run, tmp_path):
    """Lab 09's run C on a run whose UNet output is larger than the subsample: the block norms are updated
    with the changed elements, so the report still shows exactly one drift and one change within tolerance."""
    from helpers.validation import labcheck
    run = load_run(small_run)
    big = models.randn(1, 4, 64, 64, seed=3)                           # 16,384 elements: 1 in 4 stored
    unet = run["workloads"]["unet_attention"]
    unet["references"], unet["_tensors"] = reference.record({"noise_prediction": big})
    run["workloads"]["dlrm_moe_train"]["_tensors"] = {
        k.split("/", 1)[1]: t for k, t in pipeline.reference_tensors(load_run(small_run)).items()
        if k.startswith("dlrm_moe_train/")}
    path_b = save_run(run, tmp_path / "b.json")
    for seed in (0, 1, 2):
        report = compare_runs(load_run(path_b), load_run(labcheck.inject_drift(path_b, tmp_path / f"c{seed}.json", seed)))
        statuses = sorted(n["status"] for n in report["numerics"])
        assert statuses == ["drift", "within tolerance"], (seed, report["numerics"])
        drift = next(n for n in report["numerics"] if n["status"] == "drift")
        assert drift["max_rel_diff"] == pytest.approx(5e-4, rel=0.05)
        harmless = next(n for n in report["numerics"] if n["status"] == "within tolerance")
        assert harmless.get("max_rel_block_norm_diff", 0) <= harmless["tolerance"]


def test_a_changed_kernel_shows_as_drift_in_the_report(small_run, tmp_path, monkeypatch):
    """Run B with attention reading bf16-rounded inputs (what a kernel that starts using a lower-precision
    path looks like between versions; every backend alike, so the workload's own default-vs-math check
    still passes): the UNet's output drifts beyond the fp32 tolerance and the report says so."""
    sdpa = F.scaled_dot_product_attention
    rounded = lambda t: t.bfloat16().float()   # noqa: E731
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: sdpa(rounded(q), rounded(k), rounded(v), **kw))
    run_b = run_pipeline(quick=True, threads=1, workloads=["unet_attention"], checks=[], samples=3, progress=False)
    monkeypatch.undo()
    path_b = save_run(run_b, tmp_path / "b.json")
    a = load_run(small_run)
    a["workloads"] = {"unet_attention": a["workloads"]["unet_attention"]}
    a["settings"]["sizes"] = {"unet_attention": a["settings"]["sizes"]["unet_attention"]}
    report = compare_runs(a, load_run(path_b))
    row = {n["output"]: n for n in report["numerics"]}["noise_prediction"]
    assert row["status"] == "drift" and row["max_rel_diff"] > row["tolerance"]
    assert row in report["regressions"]
    assert "numerics unet_attention/noise_prediction: drift" in table(report)


def test_the_same_run_compares_identical_and_cannot_tell_without_rounds(small_run):
    report = compare_runs(load_run(small_run), load_run(small_run))
    assert {n["status"] for n in report["numerics"]} == {"identical"}
    assert {r["status"] for r in report["rows"] if r["stat"] != "exact"} == {"cannot tell"}   # one round per side
    assert {r["status"] for r in report["rows"] if r["stat"] == "exact"} == {"unchanged"}     # bytes: no noise
    assert not report["regressions"] and report["comparable"]


# --- refusal of mismatched runs -------------------------------------------------------------------

def test_runs_at_different_settings_are_refused(small_run):
    a = load_run(small_run)
    for change, expected in ((lambda s: s.update(quick=False), "quick: True vs False"),
                             (lambda s: s.update(threads=2), "threads: 1 vs 2"),
                             (lambda s: s.update(compile=True), "compile"),
                             (lambda s: s.update(device="cuda"), "device: 'cpu' vs 'cuda'"),
                             (lambda s: s.update(omp_wait_policy="SPIN"), "omp_wait_policy: .* vs 'SPIN'"),
                             (lambda s: s["sizes"]["unet_attention"].update(latent=64), "unet_attention sizes: latent")):
        b = copy.deepcopy(a)
        change(b["settings"])
        with pytest.raises(NotComparable, match=expected):
            compare_runs(a, b)
        flagged = compare_runs(a, b, allow_mismatch=True)
        assert not flagged["comparable"] and flagged["mismatch"]
        assert "NOT COMPARABLE" in table(flagged)


def test_another_machine_is_flagged_not_refused(small_run):
    a = load_run(small_run)
    b = copy.deepcopy(a)
    b["environment"]["cpu"] = "another CPU"
    report = compare_runs(a, b)
    assert report["comparable"] and report["machine_differences"] == [f"cpu: {a['environment']['cpu']!r} vs 'another CPU'"]


def test_compare_command_refuses_then_allows_with_the_flag(small_run, tmp_path):
    b = json.loads(Path(small_run).read_text())
    b["settings"]["quick"] = False
    other = tmp_path / "b.json"
    other.write_text(json.dumps(b))
    with pytest.raises(SystemExit, match="not comparable: quick"):
        main(["validate", "compare", str(small_run), str(other), "--out", str(tmp_path / "r.html")])
    main(["validate", "compare", str(small_run), str(other), "--out", str(tmp_path / "r.html"), "--allow-mismatch"])
    assert "Not comparable" in (tmp_path / "r.html").read_text()


# --- the run file, merging, the report ---------------------------------------------------------------

def test_a_failing_workload_is_recorded_and_the_rest_kept(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure")
    monkeypatch.setitem(workloads.WORKLOADS, "resnet50_train", broken)
    run = run_pipeline(quick=True, threads=1, workloads=["resnet50_train", "unet_attention"],
                       checks=["amp_scaled_mm"], samples=2, progress=False)
    assert "simulated failure" in run["errors"]["resnet50_train"]
    assert list(run["workloads"]) == ["unet_attention"] and run["checks"]["amp_scaled_mm"]["passed"]
    assert run["torch"] == torch.__version__ and run["threads"] == 1
    env = run["environment"]
    assert {"cuda", "cudnn", "nccl", "gpu_driver", "torch_config", "pipeline_commit"} <= set(env)
    loaded = load_run(save_run(run, tmp_path / "run.json"))
    assert loaded["workloads"]["unet_attention"]["figures"] == run["workloads"]["unet_attention"]["figures"]
    assert pipeline.refs_path(tmp_path / "run.json").exists()
    assert set(pipeline.reference_tensors(loaded)) == {"unet_attention/noise_prediction"}


def test_unknown_workload_is_rejected():
    with pytest.raises(ValueError, match="unknown workload or check 'resnet'"):
        run_pipeline(workloads=["resnet"], progress=False)


def test_one_thread_on_the_cpu_is_timed_by_cpu_time_with_the_wall_time_beside():
    """At one thread a call's time away from the CPU (here asleep, as when other work has the core) does not
    count; at two threads, whose CPU times would add up, the wall clock times it."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        nap = workloads.sample_calls({"nap": lambda: time.sleep(0.02)}, CPU, 3, warmup=0)["nap"]
        assert nap.clock == "cpu" and max(nap) < 0.01 and min(nap.wall) >= 0.02
        fig = workloads.figure(nap)
        assert fig["clock"] == "cpu" and fig["value"] < 0.01 and fig["wall_value"] >= 0.02
        torch.set_num_threads(2)
        nap = workloads.sample_calls({"nap": lambda: time.sleep(0.02)}, CPU, 3, warmup=0)["nap"]
        assert nap.clock == "wall" and min(nap) >= 0.02 and "clock" not in workloads.figure(nap)
    finally:
        torch.set_num_threads(threads)


def test_merge_pools_samples_and_checks_repeatability(small_run):
    a = load_run(small_run)
    merged = merge_runs([a, copy.deepcopy(a)])
    fig = merged["workloads"]["unet_attention"]["figures"]["iteration_time"]
    assert fig["n"] == 2 * a["workloads"]["unet_attention"]["figures"]["iteration_time"]["n"]
    assert merged["rounds"] == 2 and all(merged["repeatability"].values())
    assert merged["workloads"]["dlrm_moe_train"]["figures"]["peak_step_memory"]["n"] == 1    # exact: not pooled
    assert a["settings"]["clock"] == "cpu" and len(fig["wall_samples"]) == fig["n"]        # one thread: CPU time
    other = copy.deepcopy(a)
    other["torch"] = "2.9.1"
    with pytest.raises(NotComparable, match="different torch versions"):
        merge_runs([a, other])


def test_report_shows_ratios_with_their_band_each_checks_numbers_and_migrations(small_run, tmp_path):
    a = load_run(small_run)
    b = copy.deepcopy(a)
    b["workloads"]["dlrm_moe_train"]["paths"]["moe"] = "loop"
    b["checks"]["amp_scaled_mm"]["details"]["fp8_relative_error"] = 0.05
    report = compare_runs(b, a)
    assert {"workload": "dlrm_moe_train", "what": "moe", "a": "loop", "b": a["workloads"]["dlrm_moe_train"]["paths"]["moe"]} \
        in report["migrations"]
    figs = {f["key"]: f for f in report["checks"][0]["figures"]}
    assert figs["fp8_relative_error"]["a"] == 0.05
    page = write_report(report, tmp_path / "r.html").read_text()
    for text in ("Migration differences", "95% interval", "Numerics", "fp8_relative_error", "paired t", "plotly"):
        assert text in page, text


@pytest.mark.parametrize("content, message", [
    (None, "corrupt or truncated"),
    ('{"schema": "something else"}', "is not a validation run"),
    ('{"schema": "pytorch-210-labs/validation-run/2", "workloads": [], "checks": {}, "settings": {}}',
     '"workloads" is missing'),
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


def test_compare_command_with_a_corrupt_file_keeps_the_previous_report(small_run, tmp_path):
    out = tmp_path / "report.html"
    out.write_text("previous report")
    with pytest.raises(SystemExit, match="corrupt_truncated.json is not valid JSON"):
        main(["validate", "compare", str(small_run), str(FIXTURES / "corrupt_truncated.json"), "--out", str(out)])
    assert out.read_text() == "previous report"


# --- the two-environment driver ------------------------------------------------------------------------

def test_matrix_driver_with_two_venvs_of_this_torch(monkeypatch, tmp_path):
    """What CI runs: the driver end to end, with this interpreter standing in for both venvs (creating two
    venvs of real torch builds is a multi-GB download; `make validate-matrix` does that)."""
    made = []

    def fake_venv(version, venv, log, python=sys.executable):
        made.append(venv.name)
        return {"venv": venv.name, "torch": torch.__version__, "seconds": 0.0, "created": False}
    monkeypatch.setattr(matrix, "ensure_venv", fake_venv)
    monkeypatch.setattr(matrix, "_python", lambda venv: Path(sys.executable))
    v = torch.__version__.split("+")[0]
    record = matrix.run_matrix([v, v], rounds=2, threads=1, samples=2, out=tmp_path / "m", progress=lambda m: None,
                               run_args=["--workloads", "unet_attention", "--checks", "amp_scaled_mm"])
    assert made == [f".venv-validate-{v}", f".venv-validate-{v}-b"]
    assert [(r["name"][-1], r["round"]) for r in record["runs"]] == [("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    assert all(r["exit_code"] == 0 for r in record["runs"])
    for name in ("report.json", "report.html", "matrix.json", f"torch-{v}-a.json", f"torch-{v}-a.refs.pt"):
        assert (tmp_path / "m" / name).exists(), name
    report = json.loads((tmp_path / "m" / "report.json").read_text())
    assert report["comparable"] and {n["status"] for n in report["numerics"]} == {"identical"}
    assert report["rows"][0]["n_a"] == 4                                  # 2 samples x 2 rounds, pooled
    run = json.loads((tmp_path / "m" / f"torch-{v}-b" / "round2.json").read_text())
    assert run["settings"]["omp_wait_policy"] == "PASSIVE"               # every round's threads sleep when idle
    assert matrix.latest_matrix(tmp_path) == tmp_path / "m"
    with pytest.raises(ValueError, match="exactly two"):
        matrix.run_matrix(["2.9.1"], out=tmp_path / "x")


# --- the lab's checks --------------------------------------------------------------------------

def test_lab_checks_fail_with_a_hint(small_run, tmp_path):
    from helpers.validation import labcheck
    path_a, path_b = labcheck.matrix_paths(labcheck.RECORDED)
    before = compare_runs(load_run(path_a), load_run(path_b))
    after = compare_runs(load_run(path_a), load_run(labcheck.inject_slowdown(path_a, path_b, tmp_path / "c.json")))
    regressed = [{r["workload"] for r in rep["rows"] if r.get("status") == "regression"} for rep in (before, after)]
    assert len(regressed[1] - regressed[0]) == 1                       # one workload slowed, found
    assert [n["status"] for n in after["numerics"]] == [n["status"] for n in before["numerics"]]
    with pytest.raises(ValueError, match="interleaved rounds"):       # one round a side: nothing to beat
        labcheck.inject_slowdown(small_run, small_run, tmp_path / "x.json")

    def averaged(quick, device, compile=False, samples=None):
        record = workloads.run_unet_attention(quick, device, samples=samples)
        record["figures"] = {"iteration_time": workloads.figure([0.01])}
        return record
    assert labcheck.workload_property(averaged, "samples", 2) == "'iteration_time' has 1 sample(s) for 2 timed calls"
    with pytest.raises(ValueError, match="a workload returns a dict with keys"):
        labcheck.workload_property(lambda *a, **k: {"figures": {}}, "record", 2)


def test_cpu_seconds_see_a_short_call_while_a_cpu_time_limit_is_set():
    """The CPU clock of the pipeline's quick rounds and of the capstone's timed goals (the grader's sandbox sets
    RLIMIT_CPU): a call of about a millisecond measures more than zero, where time.process_time read 0.0."""
    import subprocess
    code = ("import resource; resource.setrlimit(resource.RLIMIT_CPU, (3600, 3605))\n"
            "from helpers.validation.workloads import cpu_seconds\n"
            "def work():\n    s = 0\n    for i in range(30000):\n        s += i\n"
            "samples = []\nfor _ in range(9):\n    t = cpu_seconds(); work(); samples.append(cpu_seconds() - t)\n"
            "print(sorted(samples)[4])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) > 0, out.stdout
