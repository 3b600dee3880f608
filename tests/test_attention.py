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


def test_ragged_training_fns_give_the_loop_reference_gradients_on_cpu():
    lengths = [5, 12, 3]
    seqs = attention.random_ragged(lengths, 2, 8, dtype=torch.float64)
    q, k, v = (attention.pack(seqs)[0] + i for i in range(3))
    grad = torch.randn_like(q)
    fns = attention.ragged_training_fns(lengths, varlen=False, flex=False)
    assert list(fns) == ["padded + mask"]
    want = attention.packed_grads(attention.loop_reference_fn(lengths, torch.float64), q, k, v, grad)
    for got, ref in zip(attention.packed_grads(fns["padded + mask"], q, k, v, grad), want):
        torch.testing.assert_close(got, ref)


def test_backend_from_ops_knows_the_kernels_called_directly():
    assert attention.backend_from_ops(["aten::_efficient_attention_forward"]) == "EFFICIENT_ATTENTION"
    assert attention.backend_from_ops(["aten::_flash_attention_forward", "aten::pad"]) == "FLASH_ATTENTION"


def test_error_per_backend_checks_each_forced_backend_against_float64():
    q = torch.randn(1, 2, 16, 8)
    errors = attention.error_per_backend(q, ("MATH", "FLASH_ATTENTION", "CUDNN_ATTENTION"))
    assert errors["MATH"] < 1e-5 and errors["FLASH_ATTENTION"] < 1e-5
    assert errors["CUDNN_ATTENTION"].startswith("declined: ")          # no cuDNN kernel for CPU tensors


@pytest.mark.parametrize("names, library", [
    ({"void ck_tile::kentry<...FmhaFwdKernel...>"}, "ck"), ({"ck_tile::FmhaBwdDQDKDVKernel<...>"}, "ck"),
    ({"attn_fwd", "Memcpy DtoD"}, "aotriton"), ({"bwd_kernel_dk_dv"}, "aotriton"),
    ({"_ZN5aiter24fmha_fwd_hd128_bf16_causalE"}, "aotriton"),      # AITER asm kernel behind AOTriton, not CK
    ({"gemm_kernel"}, "unknown: gemm_kernel")])
def test_the_rocm_flash_library_is_read_from_kernel_names(names, library):
    assert attention.library_from_kernel_names(names) == library


# --- FlexAttention with a document mask, training, memory, GQA, decline reasons ---------------

def test_document_ids_and_block_mask_keep_tokens_inside_their_sequence():
    assert attention.document_ids([2, 3, 1]).tolist() == [0, 0, 1, 1, 1, 2]
    mask = attention.document_block_mask([3, 5], block_size=4)
    dense = mask.to_dense()[0, 0]                     # (q blocks, kv blocks) that the kernel visits
    assert dense.tolist() == [[1, 1], [1, 1]]          # the 2nd sequence spans both blocks
    assert attention.blocks_computed(mask) == (4, 4)
    far_apart = attention.document_block_mask([8, 8, 8], block_size=8)
    assert attention.blocks_computed(far_apart) == (3, 9)      # only the diagonal blocks


def test_compiled_document_block_mask_is_the_eager_one():
    eager = attention.document_block_mask([3, 9, 20], block_size=8)
    compiled = attention.document_block_mask([3, 9, 20], block_size=8, compiled=True)
    assert torch.equal(eager.to_dense(), compiled.to_dense())


def test_eager_flex_with_the_document_mask_matches_the_reference():
    from torch.nn.attention.flex_attention import flex_attention
    lengths = [5, 19, 3]
    seqs = attention.random_ragged(lengths, 2, 8)
    q, k, v = attention.packed_heads_first(seqs)
    assert q.shape == (1, 2, 27, 8) and q.data_ptr() != k.data_ptr() != v.data_ptr()
    out = flex_attention(q, k, v, block_mask=attention.document_block_mask(lengths, block_size=8))
    assert attention.max_error(attention.split_heads_first(out, lengths), seqs) < 1e-5
    # without the mask every token sees the whole packed row: far from the per-sequence reference
    unmasked = flex_attention(q, k, v)
    assert attention.max_error(attention.split_heads_first(unmasked, lengths), seqs) > 1e-2


def test_try_backward_reports_ok_or_the_error():
    x = torch.randn(3)
    assert attention.try_backward(lambda a: a * 2, x) == "ok"
    assert not x.requires_grad

    def refuse(a):
        raise NotImplementedError("no backward here\nsecond line")
    assert attention.try_backward(refuse, x) == "NotImplementedError: no backward here"


def test_gradients_of_each_backend_match_float64_and_a_wrong_one_would_not():
    qkv = [torch.randn(1, 2, 24, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    errors = attention.gradient_error_per_backend(*qkv)
    assert set(errors) == {"MATH", "FLASH_ATTENTION"} and max(errors.values()) < 1e-4
    causal = attention.attention_grads(*(x.double() for x in qkv), causal=True)
    full = attention.attention_grads(*(x.double() for x in qkv), causal=False)
    assert (causal[0] - full[0]).abs().max() > 1e-2      # the check can tell a different computation


def test_attention_tflop_counts_causal_half_and_backward():
    assert attention.attention_tflop(1, 1, 10, 4, causal=False) == 4 * 100 * 4 / 1e12
    assert attention.attention_tflop(1, 1, 10, 4) == 2 * 100 * 4 / 1e12
    assert attention.attention_tflop(2, 3, 10, 4, backward=True) == pytest.approx(3.5 * 6 * 2 * 100 * 4 / 1e12)


def test_training_step_timing_has_every_backend_and_length():
    before = torch.get_num_threads()
    r = attention.time_training_step([16, 32], heads=1, head_dim=8, repeats=2, min_run_time=0.001, threads=1)
    assert set(r["median_s"]) == {16, 32} and set(r["median_s"][16]) == {"MATH", "FLASH_ATTENTION"}
    assert all(v > 0 for row in r["GFLOP_per_s"].values() for v in row.values())
    assert torch.get_num_threads() == before and r["threads"] == 1
    for n in (16, 32):
        assert all(0 < r["min_s"][n][b] <= r["median_s"][n][b] <= r["max_s"][n][b] for b in r["backends"])
        lo, hi = r["min_s"][n], r["max_s"][n]
        assert r["separated"][n] == (hi["MATH"] < lo["FLASH_ATTENTION"] or hi["FLASH_ATTENTION"] < lo["MATH"])


def test_backend_timing_keeps_the_spread_and_runs_at_the_threads_asked():
    before = torch.get_num_threads()
    r = attention.time_backends([16, 32], heads=1, head_dim=8, repeats=2, min_run_time=0.001, threads=1)
    assert torch.get_num_threads() == before and r["threads"] == 1
    for n in (16, 32):
        for b in ("MATH", "FLASH_ATTENTION"):
            assert 0 < r["min_s"][n][b] <= r["median_s"][n][b] <= r["max_s"][n][b]
        lo, hi = r["min_s"][n], r["max_s"][n]
        assert r["separated"][n] == (hi["MATH"] < lo["FLASH_ATTENTION"] or hi["FLASH_ATTENTION"] < lo["MATH"])


def test_cpu_peak_bytes_sees_an_allocation_and_math_holds_the_scores():
    assert attention.cpu_peak_bytes(lambda: torch.empty(1 << 20, dtype=torch.uint8)) >= 1 << 20
    memory = attention.forward_peak_memory([256], heads=2, head_dim=16)
    peak, scores = memory["peak_bytes"][256], memory["score_matrix_bytes"][256]
    assert scores == 2 * 256 * 256 * 4
    assert peak["MATH"] >= scores > peak["FLASH_ATTENTION"]


def test_math_keeps_fp32_scores_for_bf16_inputs():
    """MATH upcasts half/bf16 inputs (all intermediates in torch.float), so bf16 saves it no score memory."""
    bf16 = attention.forward_peak_memory([256], heads=2, head_dim=16, dtype=torch.bfloat16)
    fp32 = attention.forward_peak_memory([256], heads=2, head_dim=16)
    assert bf16["dtype"] == "torch.bfloat16"
    assert bf16["peak_bytes"][256]["MATH"] >= 2 * 256 * 256 * 4 > bf16["peak_bytes"][256]["FLASH_ATTENTION"]
    assert bf16["peak_bytes"][256]["MATH"] > 0.75 * fp32["peak_bytes"][256]["MATH"]


def test_priority_order_names_every_backend_once():
    order = attention.priority_order()
    assert sorted(order) == sorted(name for name in SDPBackend.__members__ if name != "ERROR")
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
        assert attention.priority_order()[:2] == ["MATH", "FLASH_ATTENTION"]
    assert attention.priority_order() == order


def test_enable_gqa_equals_repeated_kv_heads():
    q, k, v = torch.randn(1, 6, 10, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    k_rep = attention.repeat_kv_heads(k, 6)
    assert k_rep.shape == (1, 6, 10, 8) and torch.equal(k_rep[:, 0], k_rep[:, 2]) and torch.equal(k_rep[:, 3], k[:, 1])
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, attention.sdpa_reference(q, k_rep, attention.repeat_kv_heads(v, 6)))
    with pytest.raises(ValueError, match="not a multiple"):
        attention.repeat_kv_heads(k, 5)


def test_decline_reasons_carry_the_flash_checks_warnings(q):
    outcome, reasons = attention.decline_reasons(q, q, q, ["FLASH_ATTENTION"], dropout_p=0.5)
    assert outcome.startswith("No available kernel")
    assert reasons[0] == "Flash attention kernel not used because:" and "dropout" in reasons[1]
    assert attention.decline_reasons(q, q, q, ["EFFICIENT_ATTENTION"]) [0].startswith("No viable backend")
    assert attention.decline_reasons(q, q, q, ["FLASH_ATTENTION"]) == ("ran FLASH_ATTENTION", [])


@pytest.mark.slow
def test_compiled_flex_attention_matches_eager_or_says_why_not():
    from torch.nn.attention.flex_attention import flex_attention
    lengths = [40, 90]
    seqs = attention.random_ragged(lengths, 2, 16)
    q, k, v = attention.packed_heads_first(seqs)
    mask = attention.document_block_mask(lengths, block_size=64)
    compiled, seconds, error = attention.compile_flex_attention(q, k, v, mask)
    assert seconds > 0
    if compiled is None:
        assert error, "a refusal names its reason"
        pytest.skip(f"no fused FlexAttention kernel on this CPU: {error}")
    torch.testing.assert_close(compiled(q, k, v, block_mask=mask), flex_attention(q, k, v, block_mask=mask),
                               atol=1e-5, rtol=1e-4)


def test_flash_runs_on_is_tried_not_inferred(monkeypatch):
    assert attention.flash_runs_on("cpu", torch.float32)
    monkeypatch.setattr(attention, "decline_reasons", lambda *a, **k: ("No available kernel.", ["sm 7.5"]))
    assert not attention.flash_runs_on("cpu", torch.float32)
