"""The shape and dtype logic of the GPU sections, run on `meta` tensors (no data, no GPU): the ops' meta
kernels check shapes, dtypes and layouts as the device kernels would, on every torch of the matrix."""
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from helpers import attention, device, moe, quant
from tests.test_device import fake_torch, probe_fake

META = torch.device("meta")


def test_lesson_03_cutlass_section_shapes():
    """gpu_problem's sizes: 16384 routed rows, 16 experts, K=2048, N=1408, bf16 in and out."""
    counts = moe.skewed_counts(16384, 16, 1.5)
    xs = torch.empty(16384, 2048, device=META, dtype=torch.bfloat16)
    w = torch.empty(16, 2048, 1408, device=META, dtype=torch.bfloat16)
    offs = moe.offsets_from_counts(counts).to(META)
    out = F.grouped_mm(xs, w, offs=offs)
    assert out.shape == (16384, 1408) and out.dtype == torch.bfloat16
    assert offs.dtype == torch.int32
    # CUTLASS needs 16-byte-aligned strides: 2048 and 1408 bf16 elements are
    assert all(s * xs.element_size() % 16 == 0 for s in (xs.stride(0), w.stride(1)))


def test_lesson_05_fp8_section_on_an_h200_and_an_mi300(monkeypatch):
    h200 = probe_fake(fake_torch("cuda", props=SimpleNamespace(name="H200", total_memory=2**37, major=9, minor=0)))
    mi300 = probe_fake(fake_torch("cuda", hip="7.1.0", props=SimpleNamespace(
        name="MI300X", total_memory=2**37, major=9, minor=4, gcnArchName="gfx942")))
    for caps, fp8 in ((h200, torch.float8_e4m3fn), (mi300, torch.float8_e4m3fnuz)):
        monkeypatch.setattr(device, "capabilities", lambda caps=caps: caps)
        a = torch.empty(1024, 1024, device=META)
        aq, sa = quant.to_fp8(a, rowwise=True)
        assert aq.dtype == fp8 and sa.shape == (1024, 1)
        out = quant.fp8_matmul(aq, sa, aq, sa)
        assert out.shape == (1024, 1024) and out.dtype == torch.bfloat16      # what row-wise CUDA accepts


def test_lesson_06_varlen_section_shapes():
    """varlen_attn at the GPU section's sizes: bf16, 16 heads x 128, int32 offsets, int max length."""
    lengths = torch.randint(128, 2048, (8,), generator=torch.Generator().manual_seed(0)).tolist()
    seqs = attention.random_ragged(lengths, 16, 128, dtype=torch.bfloat16, device=META)
    packed, offsets, longest = attention.pack(seqs)
    assert offsets.dtype == torch.int32 and offsets.device == META and isinstance(longest, int)
    outs = attention.varlen_attention(seqs)
    assert [o.shape for o in outs] == [(n, 16, 128) for n in lengths] and outs[0].dtype == torch.bfloat16
    assert attention.ragged_tflop(lengths, 16, 128) > 0
