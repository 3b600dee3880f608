"""helpers.attention: backend detection, the float64 reference, ragged batches three ways, varlen shapes."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import attention


@pytest.fixture
def q():
    return torch.randn(2, 3, 17, 8, generator=torch.Generator().manual_seed(0))


def test_cpu_backend_choice_follows_the_inputs(q):
    assert attention.backend_that_runs(q, q, q) == "FLASH_ATTENTION"
    assert attention.backend_that_runs(q, q, q, dropout_p=0.5) == "MATH"        # CPU flash has no dropout
    # 3-D input: MATH on torch 2.10-2.13, the flash kernel from 2.14 (lesson 06 says so)
    three_d = "FLASH_ATTENTION" if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 14) else "MATH"
    assert attention.backend_that_runs(q[0], q[0], q[0]) == three_d
    assert attention.backend_that_runs(q, q, q, ["MATH"]) == "MATH"


def test_backend_report_names_the_cpu_failures(q):
    report = attention.backend_report(q, q, q)
    assert report["MATH"] == "runs (MATH)" and report["FLASH_ATTENTION"] == "runs (FLASH_ATTENTION)"
    assert report["EFFICIENT_ATTENTION"].startswith("No viable backend")
    assert report["CUDNN_ATTENTION"].startswith("No viable backend")


def test_unknown_backend_is_rejected(q):
    with pytest.raises(ValueError, match="unknown SDPA backend 'FAST'"):
        attention.backend_that_runs(q, q, q, ["FAST"])


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3},
                                    {"attn_mask": torch.rand(17, 17) > 0.5},
                                    {"attn_mask": torch.randn(17, 17)}])
def test_reference_matches_math_backend(q, kwargs):
    if "attn_mask" in kwargs and kwargs["attn_mask"].dtype == torch.bool:
        kwargs["attn_mask"].fill_diagonal_(True)
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q, q, q, **kwargs)
    torch.testing.assert_close(attention.sdpa_reference(q, q, q, **kwargs), out, atol=1e-5, rtol=1e-4)


def test_reference_keeps_true_positions_of_a_boolean_mask():
    q = torch.randn(1, 1, 3, 4)
    v = torch.arange(12.0).view(1, 1, 3, 4)
    keep_only_first = torch.tensor([[True, False, False]] * 3)
    out = attention.sdpa_reference(q, q, v, attn_mask=keep_only_first)
    torch.testing.assert_close(out, v[:, :, :1].expand_as(v))


@pytest.mark.parametrize("lengths", [[1], [5, 9, 3], [7, 7], [1, 64, 2]])
def test_three_ragged_methods_match_the_reference(lengths):
    seqs = attention.random_ragged(lengths, 2, 8)
    for method in (attention.padded_attention, attention.jagged_attention, attention.loop_attention):
        outs = method(seqs)
        assert [o.shape for o in outs] == [s.shape for s in seqs]
        assert attention.max_error(outs, seqs) < 1e-5, method.__name__


def test_pack_builds_int32_offsets_and_pad_mask():
    seqs = attention.random_ragged([2, 5, 1], 1, 4)
    packed, offsets, longest = attention.pack(seqs)
    assert packed.shape == (8, 1, 4) and longest == 5
    assert offsets.tolist() == [0, 2, 7, 8] and offsets.dtype == torch.int32
    x, keep = attention.pad_with_mask(seqs)
    assert x.shape == (3, 1, 5, 4) and keep.shape == (3, 1, 1, 5)
    assert keep.sum().item() == 8


def test_bad_ragged_input_is_rejected():
    with pytest.raises(ValueError, match="positive ints"):
        attention.random_ragged([3, 0], 1, 4)
    with pytest.raises(ValueError, match="positive ints"):
        attention.random_ragged([], 1, 4)
    seqs = attention.random_ragged([2, 3], 1, 4)
    with pytest.raises(ValueError, match="2 sequences"):
        attention.max_error(seqs[:1], seqs)


def test_wasted_fraction():
    assert attention.wasted_fraction([4, 4]) == 0
    assert attention.wasted_fraction([1, 2]) == pytest.approx(1 - 5 / 8)


def test_varlen_shapes_on_meta_and_cpu_refusal():
    seqs = attention.random_ragged([3, 6], 2, 8)
    meta = [s.to("meta", torch.bfloat16) for s in seqs]
    for causal in (False, True):
        assert [o.shape for o in attention.varlen_attention(meta, causal=causal)] == [s.shape for s in seqs]
    with pytest.raises(NotImplementedError, match="_flash_attention_forward"):
        attention.varlen_attention([s.bfloat16() for s in seqs])
    assert set(attention.varlen_causal_kwargs()) <= {"is_causal", "window_size"}


def test_block_rejects_bad_heads_and_keeps_shape():
    with pytest.raises(ValueError, match="not divisible"):
        attention.Block(30, 4)
    assert attention.Block(16, 2)(torch.randn(2, 5, 16)).shape == (2, 5, 16)


@pytest.mark.requires_cuda
def test_varlen_matches_reference_on_gpu():
    seqs = attention.random_ragged([3, 40, 17], 2, 64, dtype=torch.bfloat16, device="cuda")
    for causal in (False, True):
        assert attention.max_error(attention.varlen_attention(seqs, causal=causal), seqs, causal=causal) < 3e-2


def test_backend_from_ops_reads_fused_and_math_ops():
    assert attention.backend_from_ops(["aten::view", "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "FLASH_ATTENTION"
    assert attention.backend_from_ops(["aten::bmm", "aten::_safe_softmax", "aten::bmm"]) == "MATH"
    with pytest.raises(RuntimeError, match="no SDPA kernel ran"):
        attention.backend_from_ops(["aten::view"])
    with pytest.raises(RuntimeError, match="expected one SDPA backend"):
        attention.backend_from_ops(["aten::_scaled_dot_product_flash_attention_for_cpu",
                                    "aten::_scaled_dot_product_efficient_attention"])


def test_jagged_sdpa_on_cpu_takes_the_math_path():
    seqs = attention.random_ragged([3, 5], 2, 8)
    packed, offsets, _ = attention.pack(seqs)
    nt = torch.nested.nested_tensor_from_jagged(packed, offsets.long()).transpose(1, 2)
    assert attention.backend_that_runs(nt, nt, nt) == "MATH"


def test_ragged_kernels_compute_what_the_wrappers_do_with_inputs_prepared_once():
    seqs = attention.random_ragged([5, 9, 2], heads=2, head_dim=8)
    kernels = attention.ragged_kernels(seqs, varlen=False)
    assert set(kernels) == {"padded + mask", "jagged nested"}
    padded = kernels["padded + mask"]().transpose(1, 2)
    for got, want in zip(padded, attention.padded_attention(seqs)):
        torch.testing.assert_close(got[: want.shape[0]], want)
    jagged = kernels["jagged nested"]().transpose(1, 2).unbind()
    for got, want in zip(jagged, attention.jagged_attention(seqs)):
        torch.testing.assert_close(got, want)
    assert attention.ragged_tflop([5, 9], heads=2, head_dim=8) == 4 * (25 + 81) * 2 * 8 / 1e12


def test_error_per_backend_checks_each_forced_backend_against_float64():
    q = torch.randn(1, 2, 16, 8)
    errors = attention.error_per_backend(q, ("MATH", "FLASH_ATTENTION", "CUDNN_ATTENTION"))
    assert errors["MATH"] < 1e-5 and errors["FLASH_ATTENTION"] < 1e-5
    assert errors["CUDNN_ATTENTION"].startswith("declined: ")          # no cuDNN kernel for CPU tensors


@pytest.mark.parametrize("names, library", [
    ({"void ck_tile::kentry<...FmhaFwdKernel...>"}, "ck"), ({"fmha_fwd_d128_bf16_batch"}, "ck"),
    ({"attn_fwd", "Memcpy DtoD"}, "aotriton"), ({"gemm_kernel"}, "unknown: gemm_kernel")])
def test_the_rocm_flash_library_is_read_from_kernel_names(names, library):
    assert attention.library_from_kernel_names(names) == library
