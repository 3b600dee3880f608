"""helpers.quant against PyTorch references: round trips, calibrators, STE gradients, int8 linear, FP8."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import quant
from helpers.checks import CheckFailed


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- quantize / dequantize ---------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (64, 128)])
def test_per_channel_round_trip_within_half_a_step(bits, shape):
    w = torch.randn(shape)
    q, scales = quant.quantize_per_channel(w, bits)
    assert q.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (shape[0],)
    assert q.abs().max() <= quant.qmax(bits)
    assert (q.abs().amax(1) == quant.qmax(bits)).all(), "min-max scale puts each row's max on the grid's end"
    err = (quant.dequantize_per_channel(q, scales) - w).abs()
    assert (err <= scales[:, None] / 2 + 1e-6).all()


def test_per_channel_matches_torch_quantize_per_channel():
    w = torch.randn(33, 65)
    q, scales = quant.quantize_per_channel(w)
    ref = torch.quantize_per_channel(w, scales.double(), torch.zeros(33, dtype=torch.long), 0, torch.qint8)
    assert torch.equal(q, ref.int_repr())


def test_zero_and_empty_weights_round_trip():
    w = torch.zeros(3, 8)
    q, s = quant.quantize_per_channel(w)
    assert torch.equal(quant.dequantize_per_channel(q, s), w) and torch.isfinite(s).all()
    q, s = quant.quantize_per_channel(torch.empty(0, 8))
    assert q.shape == (0, 8) and s.shape == (0,)


@pytest.mark.parametrize("group_size", [8, 16, 48])
def test_per_group_round_trip_and_finer_than_per_channel(group_size):
    w = torch.randn(16, 96) * torch.logspace(-2, 0, 96)      # magnitudes vary along the row
    q, scales = quant.quantize_per_group(w, group_size, bits=4)
    assert scales.shape == (16, 96 // group_size) and q.abs().max() <= 7
    w_hat = quant.dequantize_per_group(q, scales, torch.bfloat16)
    assert w_hat.dtype == torch.bfloat16
    step = scales.repeat_interleave(group_size, dim=1)
    assert ((w_hat.float() - w).abs() <= step / 2 + 1e-2 * w.abs() + 1e-6).all()
    qc, sc = quant.quantize_per_channel(w, bits=4)
    assert quant.sqnr_db(w, w_hat.float()) > quant.sqnr_db(w, quant.dequantize_per_channel(qc, sc))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="bits must be an int from 2 to 8"):
        quant.quantize_per_channel(torch.randn(4, 4), bits=9)
    with pytest.raises(TypeError, match="floating-point"):
        quant.quantize_per_channel(torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        quant.quantize_per_group(torch.randn(4, 40), group_size=32)
    with pytest.raises(ValueError, match="2-D"):
        quant.quantize_per_channel(torch.randn(4))
    with pytest.raises(TypeError, match="int8 codes"):
        quant.dequantize_per_channel(torch.ones(2, 2), torch.ones(2))
    with pytest.raises(ValueError, match="one per row"):
        quant.dequantize_per_channel(torch.ones(2, 2, dtype=torch.int8), torch.ones(3))
    with pytest.raises(ValueError, match=r"K // group_size"):
        quant.dequantize_per_group(torch.ones(2, 6, dtype=torch.int8), torch.ones(2, 4))


# --- calibrators -----------------------------------------------------------------------------

def _with_outliers(rows=32, cols=256):
    x = torch.randn(rows, cols)
    x[0, 0] = 60.0            # one outlier in row 0
    x[1] *= 20                # one row much larger than the others
    return x


def test_calibrators_on_outliers():
    x = _with_outliers()
    errors = {}
    for method in quant.CALIBRATORS:
        for axis in (None, 0):
            scale = quant.calibrate(x, method, bits=8, axis=axis)
            assert scale.shape == (() if axis is None else (32,))
            errors[method, axis] = quant.sqnr_db(x, quant.fake_quantize(x, quant.broadcast_scale(scale, x, axis)))
    assert quant.calibrate(x, "percentile", percentile=99.0) < quant.calibrate(x, "minmax")
    for method in quant.CALIBRATORS:
        assert errors[method, 0] > errors[method, None], "per channel beats per tensor here"
    assert errors["mse", None] >= errors["minmax", None] - 1e-6, "MSE search includes the min-max scale"


def test_calibrator_errors():
    with pytest.raises(ValueError, match="unknown calibration method"):
        quant.calibrate(torch.randn(4), "entropy")
    with pytest.raises(ValueError, match="percentile must be"):
        quant.calibrate(torch.randn(4), "percentile", percentile=0)
    with pytest.raises(ValueError, match="out of range"):
        quant.calibrate(torch.randn(4, 4), axis=2)


# --- fake quantization and the straight-through estimator -----------------------------------

@pytest.mark.parametrize("bits", [4, 8])
def test_fake_quant_ste_matches_torch_per_tensor(bits):
    x = (torch.randn(300) * 3).requires_grad_()
    scale = torch.tensor(0.05 if bits == 8 else 0.3)
    m = quant.qmax(bits)
    ours = quant.fake_quant_ste(x, scale, bits)
    x_ref = x.detach().clone().requires_grad_()
    ref = torch.fake_quantize_per_tensor_affine(x_ref, scale.item(), 0, -m, m)
    assert torch.allclose(ours, ref)
    g = torch.randn(300)
    ours.backward(g)
    ref.backward(g)
    assert torch.equal(x.grad, x_ref.grad)
    clipped = torch.round(x.detach() / scale).abs() > m
    assert clipped.any() and (x.grad[clipped] == 0).all() and torch.equal(x.grad[~clipped], g[~clipped])


def test_fake_quant_ste_matches_torch_per_channel():
    w = torch.randn(6, 20, requires_grad=True)
    scale = quant.minmax_scale(w, 4, axis=0) * 0.7          # some values clipped
    ours = quant.fake_quant_ste(w, scale[:, None], 4)
    w_ref = w.detach().clone().requires_grad_()
    ref = torch.fake_quantize_per_channel_affine(w_ref, scale, torch.zeros(6, dtype=torch.int32), 0, -7, 7)
    assert torch.allclose(ours, ref)
    ours.sum().backward()
    ref.sum().backward()
    assert torch.equal(w.grad, w_ref.grad)


def test_fake_quant_linear_trains_and_ptq_matches_it():
    lin = nn.Linear(64, 8)
    fq = quant.FakeQuantLinear.from_linear(lin, bits=4, group_size=32)
    x = torch.randn(5, 64)
    fq(x).pow(2).sum().backward()
    assert fq.weight.grad is not None and fq.weight.grad.abs().sum() > 0
    ptq = quant.quantize_model_per_group(nn.Sequential(nn.Linear(64, 8)), bits=4, group_size=32)
    ptq[0].load_state_dict(lin.state_dict())
    quant.quantize_model_per_group(ptq, bits=4, group_size=32)
    assert torch.allclose(ptq(x), fq(x), atol=1e-5)
    with pytest.raises(ValueError, match="group_size"):
        quant.FakeQuantLinear(40, 8, group_size=32)


# --- int8 weight-only linear -----------------------------------------------------------------

@pytest.mark.parametrize("path,rtol", [("int8pack_bf16", 1e-2), ("int8pack_fp32", 1e-5), ("dequant", 1e-5)])
@pytest.mark.parametrize("m,k,n", [(1, 64, 48), (3, 128, 17), (0, 32, 8)])
def test_int8_linear_matches_dequantized_reference(path, rtol, m, k, n):
    lin = nn.Linear(k, n)
    layer = quant.Int8WeightOnlyLinear.from_linear(lin, path=path)
    x = torch.randn(2, m, k)
    ref = F.linear(x, quant.dequantize_per_channel(layer.q, layer.scales), lin.bias)
    with torch.no_grad():
        out = layer(x)
    assert out.shape == (2, m, n) and out.dtype == torch.float32
    if m:
        assert ((out - ref).norm() / ref.norm()).item() < rtol


def test_int8_linear_close_to_float_linear_and_keeps_input_dtype():
    lin = nn.Linear(256, 64)
    layer = quant.Int8WeightOnlyLinear.from_linear(lin)
    x = torch.randn(4, 256)
    with torch.no_grad():
        assert ((layer(x) - lin(x)).norm() / lin(x).norm()).item() < 2e-2
        assert layer(x.bfloat16()).dtype == torch.bfloat16
    assert layer.path == "int8pack_bf16" and layer.q.dtype == torch.int8


def test_int8_linear_refuses_bf16_kernel_for_k_not_multiple_of_the_isa_step():
    step = quant.bf16_k_multiple()
    lin = nn.Linear(33, 8)
    assert quant.Int8WeightOnlyLinear.from_linear(lin).path == "dequant"
    with pytest.raises(ValueError, match=f"not a multiple of {step}"):
        quant.Int8WeightOnlyLinear.from_linear(lin, path="int8pack_bf16")
    with pytest.raises(ValueError, match="unknown path"):
        quant.Int8WeightOnlyLinear.from_linear(nn.Linear(8, 8), path="fast")
    # K = 24 is a multiple of AVX2's step and not of AVX512's: refused exactly where the kernel crashed
    assert (quant.Int8WeightOnlyLinear.from_linear(nn.Linear(24, 8)).path == "int8pack_bf16") == (step == 8)


def test_bf16_k_multiple_follows_the_cpu_isa():
    """N12: the AVX512 kernel steps k by 16 with aligned loads; AVX2's by 8 (int8mm_kernel.cpp)."""
    from helpers.device import cpu_capability
    assert quant.bf16_k_multiple("AVX512") == 16
    assert quant.bf16_k_multiple("AVX2") == 8 and quant.bf16_k_multiple("DEFAULT") == 8
    assert quant.bf16_k_multiple() == quant.bf16_k_multiple(cpu_capability())


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512")), reason="an x86 CPU")
def test_bf16_k_guard_follows_aten_cpu_capability_in_a_child_process():
    """The guard reads the ISA ATen dispatches to, so ATEN_CPU_CAPABILITY=avx2 lowers it on an AVX512
    host; and the smallest K it admits runs and is right under each ISA."""
    import os
    import subprocess
    import sys
    code = ("import torch; from helpers import quant; k = quant.bf16_k_multiple(); "
            "x = torch.randn(3, k, dtype=torch.bfloat16); q = torch.randint(-127, 128, (16, k), dtype=torch.int8); "
            "s = torch.rand(16, dtype=torch.bfloat16) + 0.5; y = quant.int8_weight_only_mm(x, q, s).float(); "
            "ref = x.float() @ (q.float() * s.float()[:, None]).t(); "
            "assert ((y - ref).norm() / ref.norm()) < 1e-2; print(torch.backends.cpu.get_cpu_capability(), k)")
    seen = {}
    for isa in ("avx2", None):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if isa:
            env["ATEN_CPU_CAPABILITY"] = isa
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-500:]
        name, k = done.stdout.split()
        seen[name] = int(k)
    assert seen.get("AVX2") == 8 and seen.get("AVX512", 16) == 16, seen


def test_int8_kernel_scales_dtype_must_match_activations():
    """The trap the helper hides: the kernel wants scales in the activations' dtype."""
    q = torch.randint(-127, 128, (16, 64), dtype=torch.int8)
    xb = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="expected scalar type BFloat16 but found Float"):
        torch._weight_int8pack_mm(xb, q, torch.ones(16))          # torch's own message names no argument
    with pytest.raises(TypeError, match=r"pass scales.to\(x.dtype\)"):
        quant.int8_weight_only_mm(xb, q, torch.ones(16))
    with pytest.raises(TypeError, match="int8 q"):
        quant.int8_weight_only_mm(xb, q.float(), torch.ones(16))
    with pytest.raises(ValueError, match=f"not a multiple of {quant.bf16_k_multiple()}"):
        quant.int8_weight_only_mm(torch.randn(2, 36, dtype=torch.bfloat16), q[:, :36], torch.ones(16).bfloat16())
    out = quant.int8_weight_only_mm(xb, q, torch.ones(16, dtype=torch.bfloat16))
    assert torch.allclose(out.float(), xb.float() @ q.float().t(), rtol=1e-2, atol=0.5)
    with pytest.raises(TypeError, match="2-D int8"):
        quant.Int8WeightOnlyLinear(q.float(), torch.ones(16))
    with pytest.raises(ValueError, match="scales must have shape"):
        quant.Int8WeightOnlyLinear(q, torch.ones(8))
    layer = quant.Int8WeightOnlyLinear(q, torch.ones(16))
    with pytest.raises(ValueError, match="this layer takes 64"):
        layer(torch.randn(2, 32))


def test_choose_fastest_path_picks_a_correct_path():
    layer = quant.Int8WeightOnlyLinear.from_linear(nn.Linear(128, 64))
    report = quant.choose_fastest_path(layer, torch.randn(1, 128), repeats=1, threads=1)
    assert report["path"] == layer.path and report["path"] in quant.INT8_PATHS
    assert report["timing"]["threads"] == 1 and set(report["timing"]["results"]) == set(report["times_s"])
    assert report["tied_with"] in set(report["times_s"]) - {report["path"]} | {None}
    assert all(isinstance(e, float) and e < 2e-2 for e in report["errors"].values())
    odd = quant.Int8WeightOnlyLinear.from_linear(nn.Linear(33, 8))
    report = quant.choose_fastest_path(odd, torch.randn(1, 33), repeats=1)
    assert f"not a multiple of {quant.bf16_k_multiple()}" in report["errors"]["int8pack_bf16"] and report["path"] != "int8pack_bf16"


def test_swap_linears_replaces_nested_layers():
    model = nn.Sequential(nn.Linear(16, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 4)))
    quant.swap_linears(model, quant.Int8WeightOnlyLinear.from_linear)
    assert [type(m).__name__ for m in model.modules()].count("Int8WeightOnlyLinear") == 2
    assert quant.model_bytes(model) < 16 * 16 * 4


# --- FP8 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", [
    pytest.param(True, marks=pytest.mark.requires("fp8_rowwise_cpu"), id="scaled_mm"), pytest.param(False, id="reference")])
def test_fp8_tensorwise_and_rowwise_close_to_fp32(kernel):
    x = torch.randn(16, 64)
    w = torch.randn(32, 64) * torch.logspace(-6, 0, 32)[:, None]     # beyond e4m3's exponent range
    ref = x @ w.t()
    rel = {}
    for rowwise in (False, True):
        out = quant.fp8_linear(x, w, rowwise=rowwise, kernel=kernel)
        assert out.dtype == torch.bfloat16 and out.shape == (16, 32)
        rel[rowwise] = ((out.float() - ref).norm(dim=0) / ref.norm(dim=0)).max().item()
    assert rel[True] < 0.1
    assert rel[False] > 2 * rel[True], "row-wise scales keep the smallest rows from underflowing"


@pytest.mark.parametrize("rowwise", [
    pytest.param(True, marks=pytest.mark.requires("fp8_rowwise_cpu"), id="row-wise"), pytest.param(False, id="tensor-wise")])
def test_fp8_reference_computes_what_scaled_mm_does(rowwise):
    x, w = torch.randn(16, 64), torch.randn(32, 64)
    xq, sx = quant.to_fp8(x, rowwise)
    wq, sw = quant.to_fp8(w, rowwise)
    kernel = quant.fp8_matmul(xq, sx, wq, sw, torch.float32)
    torch.testing.assert_close(quant.fp8_matmul_reference(xq, sx, wq, sw, torch.float32), kernel,
                               rtol=1e-5, atol=1e-5)


# --- lab check and benchmark -----------------------------------------------------------------

def test_check_deployment_fails_with_a_hint_on_accuracy():
    model = nn.Sequential(nn.Linear(16, 4))
    x = torch.randn(200, 16)
    labels = model(x).argmax(-1)
    broken = nn.Sequential(nn.Linear(16, 4))
    with pytest.raises(CheckFailed, match="granularity"):
        quant.check_deployment(broken, model, x, labels, min_speedup=None, what="t")
    out = quant.check_deployment(model, model, x, labels, min_speedup=None, what="t")
    assert out["accuracy"] == out["reference_accuracy"] == 1.0


def test_benchmark_quick_reports_every_variant():
    result = quant.benchmark(quick=True)
    assert result["shape"] == {"M": 1, "N": 1024, "K": 1024}
    assert "1" in result["by_threads"]
    for run in result["by_threads"].values():
        assert len(run["results"]) == 5 and run["read_bandwidth_gbs"] > 0
        for entry in run["results"].values():
            assert entry["median_s"] > 0 and entry["percent_of_read_bandwidth"] > 0


def test_fp8_format_follows_the_device_and_values_are_clamped(monkeypatch):
    """MI300 (gfx942) computes in float8_e4m3fnuz (max 240); everything else in float8_e4m3fn (max 448).
    A scale that leaves values past the range must clamp them, not turn them into NaN."""
    from helpers import device
    from tests.test_device import fake_torch, probe_fake
    from types import SimpleNamespace
    mi300 = probe_fake(fake_torch("cuda", hip="7.1.0", props=SimpleNamespace(
        name="AMD Instinct MI300X", total_memory=2**37, major=9, minor=4, gcnArchName="gfx942:sramecc+:xnack-")))
    monkeypatch.setattr(device, "capabilities", lambda: mi300)
    assert device.fp8_dtype("cuda") == torch.float8_e4m3fnuz and device.fp8_dtype("cpu") == torch.float8_e4m3fn
    x = torch.tensor([[1.0, -3.0, 1000.0]])
    q, scale = quant.to_fp8(x, rowwise=True, dtype=torch.float8_e4m3fnuz)
    assert q.dtype == torch.float8_e4m3fnuz and q.float().abs().max().item() == 240.0
    q, _ = quant.to_fp8(x, rowwise=False)                      # a CPU tensor: the OCP format
    assert q.dtype == torch.float8_e4m3fn and q.float().abs().max().item() == 448.0
    q, _ = quant.to_fp8(x * 1e6, rowwise=False, dtype=torch.float8_e4m3fn)
    assert not q.float().isnan().any()


# --- asymmetric quantization -----------------------------------------------------------------

def _torch_ao_observer(name: str, **options):
    import warnings
    from torch.ao.quantization import observer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(observer, name)(dtype=torch.quint8, **options)


@pytest.mark.parametrize("shift", [0.0, 1.5, -2.0])
def test_asymmetric_per_tensor_matches_torch_observer_and_quantize(shift):
    x = torch.relu(torch.randn(64, 100)) + shift          # skewed: all >= shift
    scale, zero_point = quant.asymmetric_qparams(x)
    obs = _torch_ao_observer("MinMaxObserver", qscheme=torch.per_tensor_affine)
    obs(x)
    ref_scale, ref_zero = obs.calculate_qparams()
    assert torch.allclose(scale, ref_scale[0]) and zero_point.item() == ref_zero.item()
    q = quant.quantize_asymmetric(x, scale, zero_point)
    ref = torch.quantize_per_tensor(x, scale.item(), zero_point.item(), torch.quint8)
    assert q.dtype == torch.uint8 and torch.equal(q, ref.int_repr())
    assert torch.allclose(quant.dequantize_asymmetric(q, scale, zero_point), ref.dequantize())


def test_asymmetric_per_channel_matches_torch_and_keeps_zero_exact():
    x = torch.randn(16, 300) * 3 + torch.linspace(-5, 5, 16)[:, None]
    scale, zero_point = quant.asymmetric_qparams(x, axis=0)
    obs = _torch_ao_observer("PerChannelMinMaxObserver", ch_axis=0, qscheme=torch.per_channel_affine)
    obs(x)
    ref_scale, ref_zero = obs.calculate_qparams()
    assert torch.allclose(scale, ref_scale) and torch.equal(zero_point.long(), ref_zero)
    q = quant.quantize_asymmetric(x, quant.broadcast_scale(scale, x, 0), quant.broadcast_scale(zero_point, x, 0))
    ref = torch.quantize_per_channel(x, scale.double(), zero_point.long(), 0, torch.quint8)
    assert torch.equal(q, ref.int_repr())
    zeros = quant.quantize_asymmetric(torch.zeros(16, 1), quant.broadcast_scale(scale, x, 0),
                                      quant.broadcast_scale(zero_point, x, 0))
    back = quant.dequantize_asymmetric(zeros, quant.broadcast_scale(scale, x, 0), quant.broadcast_scale(zero_point, x, 0))
    assert torch.equal(back, torch.zeros(16, 1)), "0 must round-trip exactly"


@pytest.mark.parametrize("bits", [8, 4])
def test_asymmetric_beats_symmetric_on_a_one_sided_tensor(bits):
    x = torch.relu(torch.randn(64, 256))
    symmetric = quant.fake_quantize(x, quant.minmax_scale(x, bits), bits)
    scale, zero_point = quant.asymmetric_qparams(x, bits)
    asymmetric = quant.dequantize_asymmetric(quant.quantize_asymmetric(x, scale, zero_point, bits), scale, zero_point)
    assert quant.sqnr_db(x, asymmetric) > quant.sqnr_db(x, symmetric) + 4      # about one bit: 6 dB


def test_asymmetric_bad_inputs():
    with pytest.raises(ValueError, match="bits"):
        quant.asymmetric_qparams(torch.randn(4), bits=9)
    with pytest.raises(TypeError, match="uint8 codes"):
        quant.dequantize_asymmetric(torch.ones(2, dtype=torch.int8), torch.ones(()), torch.zeros(()))


# --- measured sizes --------------------------------------------------------------------------

def test_model_bytes_counts_what_each_format_stores():
    lin = nn.Linear(64, 32)
    assert quant.model_bytes(nn.Sequential(lin)) == (64 * 32 + 32) * 4
    int8 = quant.Int8WeightOnlyLinear.from_linear(lin)
    assert quant.model_bytes(int8) == 64 * 32 + 32 * 4 + 32 * 4     # codes, one fp32 scale per row, bias (N14)
    assert [name for name, _ in int8.named_buffers()] == ["q", "scales", "bias"]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dyn = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(64, 32)), {nn.Linear}, dtype=torch.qint8)
    assert quant.model_bytes(dyn) == 64 * 32 + 32 * 4 + 4 + 8    # int8 codes, fp32 bias, the module's scale, zero point
    q = torch.quantize_per_channel(torch.randn(8, 4), torch.ones(8, dtype=torch.double), torch.zeros(8, dtype=torch.long),
                                   0, torch.qint8)
    assert quant.tensor_bytes(q) == 32 + 8 * 8 + 8 * 8


def test_model_bytes_of_a_graph_module_counts_only_what_the_graph_reads():
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(8, 4)))
    gm.unused = nn.Parameter(torch.zeros(1000))                 # attached, never read
    assert quant.model_bytes(gm) == (8 * 4 + 4) * 4


def test_torchao_int4_weight_only_packs_two_codes_per_byte():
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_
    try:
        config = quant.torchao_int4_cpu_config(group_size=32)
    except ImportError:
        pytest.skip("this torchao has no CPU int4 weight-only config")
    lin = nn.Linear(128, 64, bias=False).bfloat16()
    reference = lin.weight.detach().float().clone()
    model = nn.Sequential(lin)
    quantize_(model, config)
    # packed codes [64, 128 / 2] uint8 plus a bf16 scale and zero per group of 32: 0.5 + 4 / 32 bytes per weight
    assert quant.model_bytes(model) == 64 * 128 * 0.5 + 64 * (128 // 32) * 2 * 2
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    exact = x.float() @ reference.t()
    err = (model(x).float() - exact).norm() / exact.norm()
    assert err < 0.15, f"int4 output off by {err:.3f}"


# --- packed int4 weight-only (torch's CPU kernel) --------------------------------------------

@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_packed_layer_matches_its_dequantized_weight_and_stores_half_a_byte(group_size):
    lin = nn.Linear(128, 48)
    layer = quant.Int4WeightOnlyLinear.from_linear(lin, group_size=group_size)
    assert layer.packed.dtype == torch.uint8 and layer.packed.shape == (48, 64)          # two codes per byte
    assert layer.scale_and_zero.shape == (128 // group_size, 48, 2)
    assert quant.model_bytes(layer) == 48 * 64 + (128 // group_size) * 48 * 2 * 2 + 48 * 4   # codes, bf16 scale+zero, bias
    w_hat = quant.dequantize_int4_packed(layer.packed, layer.scale_and_zero)
    step = (lin.weight.detach().reshape(48, -1, group_size).amax(-1) - lin.weight.detach().reshape(48, -1, group_size).amin(-1)) / 15
    assert ((w_hat - lin.weight.detach()).abs().reshape(48, -1, group_size) <= step[..., None] * 0.51 + 1e-2).all()
    codes = quant.int4_codes(layer.packed)
    assert codes.min() >= 0 and codes.max() <= 15
    x = torch.randn(2, 5, 128)
    with torch.no_grad():
        out = layer(x)
    ref = F.linear(x, w_hat, lin.bias)
    assert out.shape == (2, 5, 48) and out.dtype == torch.float32
    assert ((out - ref).norm() / ref.norm()).item() < 2e-2                       # bf16 activations


def test_int4_packed_refuses_what_the_kernel_refuses():
    with pytest.raises(ValueError, match="group_size must be one of"):
        quant.quantize_int4_packed(torch.randn(16, 64), group_size=16)
    with pytest.raises(ValueError, match="multiple of 16"):
        quant.quantize_int4_packed(torch.randn(10, 64), group_size=32)
    with pytest.raises(ValueError, match="divide in_features"):
        quant.quantize_int4_packed(torch.randn(16, 48), group_size=32)


def test_fp8_crossover_needs_the_spreads_apart():
    rows = {16: {"bf16": (1.0, 0.9, 1.1), "fp8 per call": (0.95, 0.8, 1.2)},      # faster median, overlapping
            128: {"bf16": (1.0, 0.9, 1.1), "fp8 per call": (0.7, 0.6, 0.8)}}
    assert quant.fp8_crossover(rows) == "128"
    rows[128]["fp8 per call"] = (0.85, 0.8, 0.95)
    assert quant.fp8_crossover(rows) == quant.FP8_SLOWER


def test_recorded_fp8_figures_say_where_and_hold_every_candidate():
    record = quant.recorded_fp8_crossover()
    assert {"device", "arch", "torch", "recorded", "granularity"} <= set(record)
    assert list(record["rows"]) == [16, 128, 1024, 8192]
    for times in record["rows"].values():
        assert set(times) == {"bf16", "fp8 kernel alone", "fp8 per call", "fp8 per call, compiled"}
        assert all(len(t) == 3 and t[1] <= t[0] <= t[2] for t in times.values())
