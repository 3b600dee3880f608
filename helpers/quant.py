"""Quantization for deployment: small functions with plain tensors in and out.

    q, scales = quantize_per_channel(w)              # int8 [N, K], fp32 [N]
    w_hat = dequantize_per_channel(q, scales)
    scale = calibrate(x, "mse", bits=8, axis=0)      # min-max, percentile or MSE
    layer = Int8WeightOnlyLinear.from_linear(linear) # torch._weight_int8pack_mm, bf16 activations
    layer4 = Int4WeightOnlyLinear.from_linear(linear) # packed int4 per group, torch._weight_int4pack_mm_for_cpu
    y = fake_quant_ste(w, scale, bits=4)             # forward quantized, gradient straight through

Quantization is symmetric (zero point 0) unless a function says otherwise:
q = clamp(round(x / scale), -qmax, qmax) with qmax = 2**(bits-1) - 1, and x is approximately q * scale.
The asymmetric functions use unsigned codes and a zero point: x is approximately (q - zero_point) * scale.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import bench
from helpers.checks import fail, passed
from helpers.device import fp8_dtype, missing

CALIBRATORS = ("minmax", "percentile", "mse")
INT8_PATHS = ("int8pack_bf16", "int8pack_fp32", "dequant")
INT4_GROUP_SIZES = (32, 64, 128, 256)   # what torch._weight_int4pack_mm_for_cpu accepts


def bf16_k_multiple(capability: str | None = None) -> int:
    """K must be a multiple of this for the CPU torch._weight_int8pack_mm with bf16 activations.

    The kernel (aten/src/ATen/native/cpu/int8mm_kernel.cpp) is compiled per CPU ISA. Its AVX512 build
    steps k by 16 with aligned loads of the bf16 and int8 rows: K = 8, 24, 36 or 40 crashed the process
    (SIGSEGV) on an AVX512 host with torch 2.10 and 2.13, K = 16, 32, 48, 64 ran. Under AVX2 (the same
    host with ATEN_CPU_CAPABILITY=avx2, and an AVX2 host) K = 8, 24 and 40 ran and K = 36 crashed. Other
    ISAs (aarch64, DEFAULT) were not measured: 8, the smaller known step, is assumed. `capability` is
    torch's CPU ISA string (helpers.device.cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...)."""
    if capability is None:
        from helpers.device import cpu_capability
        capability = cpu_capability()
    return 16 if capability.upper().startswith("AVX512") else 8


def qmax(bits: int) -> int:
    """The largest quantized magnitude for a signed symmetric `bits`-bit code (127 for 8 bits)."""
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8 (int8 storage), got {bits!r}")
    return 2 ** (bits - 1) - 1


def _check_float(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{what} must be a floating-point tensor, got {got}; quantize the float weights")


def _reduce_dims(x: torch.Tensor, axis: int | None) -> list[int]:
    """The dimensions a scale is computed over: all of them (per tensor) or all but `axis`."""
    if axis is None:
        return list(range(x.dim()))
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a {x.dim()}-D tensor")
    return [d for d in range(x.dim()) if d != axis % x.dim()]


def broadcast_scale(scale: torch.Tensor, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    """A per-tensor (0-D) or per-channel (1-D, along axis) scale reshaped to broadcast against x."""
    if axis is None:
        return scale.reshape([1] * x.dim())
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    return scale.reshape(shape)


# --- Quantize and dequantize -----------------------------------------------------------------

def quantize(x: torch.Tensor, scale: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """int8 codes for x with a scale that broadcasts against x (round half to even, then clamp)."""
    _check_float(x, "x")
    m = qmax(bits)
    return torch.clamp(torch.round(x.float() / scale.float()), -m, m).to(torch.int8)


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """x rounded to the quantization grid and back, in x's dtype (no gradient trick)."""
    return (quantize(x, scale, bits).float() * scale.float()).to(x.dtype)


def quantize_per_channel(w: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel quantization of a [N, K] weight: int8 codes [N, K], fp32 scales [N]."""
    _check_float(w, "w")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
    scales = minmax_scale(w, bits, axis=0)
    return quantize(w, scales[:, None], bits), scales


def dequantize_per_channel(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
                           ) -> torch.Tensor:
    if q.dtype != torch.int8:
        raise TypeError(f"q must be int8 codes, got {q.dtype}")
    if scales.dim() != 1 or scales.numel() != q.shape[0]:
        raise ValueError(f"scales must be 1-D with {q.shape[0]} entries (one per row), got {tuple(scales.shape)}")
    return (q.float() * scales.float()[:, None]).to(dtype)


def quantize_per_group(w: torch.Tensor, group_size: int = 32, bits: int = 4
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization with one scale per `group_size` consecutive inputs of each row:
    int8 codes [N, K] (values within +-qmax(bits)), fp32 scales [N, K // group_size]."""
    _check_float(w, "w")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
    n, k = w.shape
    if group_size < 1 or k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of group_size {group_size}; "
                         f"pick a group size that divides it (e.g. {math.gcd(k, 32) or 1})")
    groups = w.reshape(n, k // group_size, group_size)
    scales = minmax_scale(groups.flatten(0, 1), bits, axis=0).reshape(n, k // group_size)
    return quantize(groups, scales[..., None], bits).reshape(n, k), scales


def dequantize_per_group(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
                         ) -> torch.Tensor:
    if q.dtype != torch.int8:
        raise TypeError(f"q must be int8 codes, got {q.dtype}")
    n, k = q.shape
    if scales.dim() != 2 or scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise ValueError(f"scales must be [N, K // group_size] for codes {tuple(q.shape)}, got {tuple(scales.shape)}")
    group_size = k // scales.shape[1]
    out = q.reshape(n, -1, group_size).float() * scales.float()[..., None]
    return out.reshape(n, k).to(dtype)


# --- Asymmetric (affine) quantization: unsigned codes and a zero point -----------------------

def asymmetric_qparams(x: torch.Tensor, bits: int = 8, axis: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 scale and int32 zero point (per tensor, or per channel along axis) for codes 0..2**bits - 1
    covering [min(x, 0), max(x, 0)]: the range always holds 0, so zero (ReLU's output, padding) is exact.
    The same formula as torch's MinMaxObserver with quint8 and an affine scheme."""
    _check_float(x, "x")
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8 (uint8 storage), got {bits!r}")
    dims = _reduce_dims(x, axis)
    xf = x.detach().float()
    lo = xf.amin(dim=dims).clamp(max=0) if x.numel() else torch.zeros(())
    hi = xf.amax(dim=dims).clamp(min=0) if x.numel() else torch.zeros(())
    top = 2 ** bits - 1
    scale = ((hi - lo) / top).clamp(min=torch.finfo(torch.float32).eps)
    zero_point = torch.clamp(-torch.round(lo / scale), 0, top).to(torch.int32)
    return scale, zero_point


def quantize_asymmetric(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, bits: int = 8
                        ) -> torch.Tensor:
    """uint8 codes clamp(round(x / scale) + zero_point, 0, 2**bits - 1); scale and zero_point broadcast
    against x (reshape per-channel ones with broadcast_scale)."""
    _check_float(x, "x")
    codes = torch.round(x.float() / scale.float()) + zero_point.float()
    return torch.clamp(codes, 0, 2 ** bits - 1).to(torch.uint8)


def dequantize_asymmetric(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if q.dtype != torch.uint8:
        raise TypeError(f"q must be uint8 codes, got {q.dtype}")
    return ((q.float() - zero_point.float()) * scale.float()).to(dtype)


# --- Calibrators: choose the scale -----------------------------------------------------------

def minmax_scale(x: torch.Tensor, bits: int = 8, axis: int | None = None) -> torch.Tensor:
    """scale = max|x| / qmax: nothing is clipped, but one outlier stretches the grid for everyone."""
    _check_float(x, "x")
    dims = _reduce_dims(x, axis)
    if x.numel() == 0:   # an empty tensor has nothing to scale: any positive scale round-trips it
        return torch.full(() if axis is None else (x.shape[axis],), 1.0 / qmax(bits))
    return x.detach().float().abs().amax(dim=dims).clamp(min=1e-12) / qmax(bits)


def percentile_scale(x: torch.Tensor, bits: int = 8, axis: int | None = None, percentile: float = 99.9
                     ) -> torch.Tensor:
    """scale from the given percentile of |x|: the few values above it are clipped."""
    _check_float(x, "x")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    a = x.detach().float().abs()
    a = a.reshape(1, -1) if axis is None else a.movedim(axis, 0).reshape(a.shape[axis], -1)
    k = max(1, math.ceil(percentile / 100 * a.shape[1]))
    value = a.kthvalue(k, dim=1).values          # kthvalue, unlike torch.quantile, has no size limit
    return (value[0] if axis is None else value).clamp(min=1e-12) / qmax(bits)


def mse_scale(x: torch.Tensor, bits: int = 8, axis: int | None = None, grid: int = 50) -> torch.Tensor:
    """The scale (a fraction of the min-max one, searched on a grid) with the least squared error."""
    base = minmax_scale(x, bits, axis)
    xf = x.detach().float()
    dims = _reduce_dims(x, axis)
    best, best_err = base.clone(), torch.full_like(base, float("inf"))
    for frac in torch.linspace(0.2, 1.0, grid):
        scale = base * frac
        err = (fake_quantize(xf, broadcast_scale(scale, x, axis), bits) - xf).pow(2).sum(dim=dims)
        better = err < best_err
        best = torch.where(better, scale, best)
        best_err = torch.where(better, err, best_err)
    return best


def calibrate(x: torch.Tensor, method: str = "minmax", bits: int = 8, axis: int | None = None,
              **options) -> torch.Tensor:
    """A scale for x by `method` ("minmax", "percentile" or "mse"), per tensor or per channel (axis)."""
    calibrators: dict[str, Callable[..., torch.Tensor]] = {
        "minmax": minmax_scale, "percentile": percentile_scale, "mse": mse_scale}
    if method not in calibrators:
        raise ValueError(f"unknown calibration method {method!r}; use one of {CALIBRATORS}")
    return calibrators[method](x, bits, axis, **options)


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (higher is better; each extra bit adds about 6 dB)."""
    ref, err = reference.detach().double(), (approx.detach().double() - reference.detach().double())
    noise = err.pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * math.log10(ref.pow(2).sum().item() / noise)


# --- Fake quantization with a straight-through estimator (QAT) ------------------------------

def fake_quant_ste(x: torch.Tensor, scale: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Forward: x on the quantization grid. Backward: gradient 1 where round(x / scale) lies inside the
    grid and 0 where it was clipped (the clipped straight-through estimator torch.fake_quantize_* use)."""
    _check_float(x, "x")
    m = qmax(bits)
    scale = scale.detach()
    codes = torch.round(x.detach().float() / scale.float())
    inside = ((codes >= -m) & (codes <= m)).to(x.dtype)
    return fake_quantize(x.detach(), scale, bits) + (x - x.detach()) * inside


class FakeQuantLinear(nn.Linear):
    """nn.Linear whose weight is fake-quantized per group in every forward (for QAT)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, bits: int = 4,
                 group_size: int | None = 32):
        super().__init__(in_features, out_features, bias)
        qmax(bits)
        group_size = group_size or in_features
        if in_features % group_size:
            raise ValueError(f"in_features {in_features} is not a multiple of group_size {group_size}")
        self.bits, self.group_size = bits, group_size

    def quantized_weight(self) -> torch.Tensor:
        n, k = self.weight.shape
        groups = self.weight.reshape(n, k // self.group_size, self.group_size)
        scale = minmax_scale(groups.flatten(0, 1), self.bits, axis=0).reshape(n, -1, 1)
        return fake_quant_ste(groups, scale, self.bits).reshape(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.quantized_weight(), self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: int | None = 32) -> "FakeQuantLinear":
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, bits, group_size)
        layer.load_state_dict(linear.state_dict())
        return layer


def swap_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> nn.Module:
    """Replace every nn.Linear in model (in place) by make(linear); returns the model."""
    for name, child in model.named_children():
        if type(child) is nn.Linear:
            setattr(model, name, make(child))
        else:
            swap_linears(child, make)
    return model


def quantize_model_per_group(model: nn.Module, bits: int = 4, group_size: int | None = 32) -> nn.Module:
    """Post-training quantization (in place): every nn.Linear's weight rounded per group (group_size None:
    one group per row, i.e. per channel), stored back as float."""
    with torch.no_grad():
        for module in model.modules():
            if type(module) is nn.Linear:
                q, s = quantize_per_group(module.weight, group_size or module.in_features, bits)
                module.weight.copy_(dequantize_per_group(q, s, module.weight.dtype))
    return model


# --- The int8 weight-only linear -------------------------------------------------------------

def int8_weight_only_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """torch._weight_int8pack_mm(x [M, K], q int8 [N, K], scales [N]) with its preconditions checked
    first, so a mistake raises a clear error instead of "expected scalar type ..." or a crash. The two
    CPU-only rules: scales in x's dtype (the CPU kernel reads them as x's type; CUDA's int8mm.cu
    converts x and scales to fp32 itself), and with bf16 activations K a multiple of bf16_k_multiple()."""
    if x.dim() != 2 or q.dim() != 2 or q.dtype != torch.int8:
        raise TypeError(f"need x [M, K] and int8 q [N, K]; got x {tuple(x.shape)}, q {q.dtype} {tuple(q.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.device.type == "cpu":
        if scales.dtype != x.dtype:
            raise TypeError(f"scales are {scales.dtype} but x is {x.dtype}: the CPU kernel needs them equal; "
                            f"pass scales.to(x.dtype)")
        multiple = bf16_k_multiple()
        if x.dtype == torch.bfloat16 and q.shape[1] % multiple:
            raise ValueError(f"K = {q.shape[1]} is not a multiple of {multiple}: on this CPU's ISA the kernel with "
                             f"bf16 activations crashes the process for such sizes; pad K or use fp32")
    return torch._weight_int8pack_mm(x.contiguous(), q, scales)


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (q * scales).T + bias with int8 weights stored, through one of INT8_PATHS:

    - "int8pack_bf16": torch._weight_int8pack_mm with the activations cast to bf16 (the fast path on x86);
    - "int8pack_fp32": the same kernel fed fp32 activations (correct; on x86 CPUs a slow path, while the
      aarch64 build of int8mm_kernel.cpp vectorizes fp32 too: choose_fastest_path measures it);
    - "dequant": dequantize to the activation dtype, then F.linear (runs anywhere, reads 4 bytes/weight).
    The output has the input's dtype whatever the path.
    """

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 path: str = "int8pack_bf16"):
        super().__init__()
        if q.dtype != torch.int8 or q.dim() != 2:
            raise TypeError(f"q must be a 2-D int8 tensor [N, K], got {q.dtype} {tuple(q.shape)}")
        if scales.shape != (q.shape[0],):
            raise ValueError(f"scales must have shape ({q.shape[0]},), got {tuple(scales.shape)}")
        self.register_buffer("q", q.contiguous())
        # one scale buffer, fp32; the kernel's paths cast it to the activations' dtype per call (N values,
        # nothing next to the N x K codes), so the bytes held and a saved state_dict count it once
        self.register_buffer("scales", scales.float())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.path = path

    @property
    def path(self) -> str:
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        if value not in INT8_PATHS:
            raise ValueError(f"unknown path {value!r}; use one of {INT8_PATHS}")
        if value == "int8pack_bf16" and self.q.device.type == "cpu" and self.q.shape[1] % bf16_k_multiple():
            raise ValueError(f"in_features {self.q.shape[1]} is not a multiple of {bf16_k_multiple()}: on this "
                             f"CPU's ISA the kernel with bf16 activations crashes the process for such sizes; "
                             f"use path='dequant' (or pad the weight)")
        self._path = value

    @classmethod
    def from_linear(cls, linear: nn.Linear, path: str = "auto") -> "Int8WeightOnlyLinear":
        """path "auto": int8pack_bf16 when in_features allows it, else dequant."""
        q, scales = quantize_per_channel(linear.weight.detach())
        if path == "auto":
            path = "int8pack_bf16" if linear.in_features % bf16_k_multiple() == 0 else "dequant"
        return cls(q, scales, linear.bias, path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.q.shape[1]
        if x.shape[-1] != k:
            raise ValueError(f"input's last dimension is {x.shape[-1]}, this layer takes {k}")
        x2 = x.reshape(-1, k)
        if self._path == "int8pack_bf16":
            y = int8_weight_only_mm(x2.to(torch.bfloat16), self.q, self.scales.to(torch.bfloat16))
        elif self._path == "int8pack_fp32":
            y = int8_weight_only_mm(x2.float(), self.q, self.scales)
        else:
            y = F.linear(x2, dequantize_per_channel(self.q, self.scales, x.dtype))
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.q.shape[0])

    def extra_repr(self) -> str:
        return f"in_features={self.q.shape[1]}, out_features={self.q.shape[0]}, path={self._path!r}"


def choose_fastest_path(layer: Int8WeightOnlyLinear, example: torch.Tensor, paths=INT8_PATHS,
                        rtol: float = 2e-2, repeats: int = 3, threads: int | None = None) -> dict:
    """Run every path on `example`, keep those within rtol (relative to the output's norm) of the
    dequantized fp32 reference, time them side by side (at `threads` on a CPU; None: torch's current count)
    and set layer.path to the fastest median.
    Returns {"path": chosen, "errors": {path: relative error, or why it could not run},
    "times_s": {path: median}, "timing": the bench.compare result, "tied_with": the runner-up path when
    its spread overlaps the chosen one's (the choice is a coin toss on this run), else None}."""
    with torch.no_grad():
        reference = F.linear(example.float(), dequantize_per_channel(layer.q, layer.scales))
        if layer.bias is not None:
            reference = reference + layer.bias.float()
        errors, correct = {}, {}
        for path in paths:
            try:
                layer.path = path
                out = layer(example).float()
            except (ValueError, RuntimeError, NotImplementedError) as exc:   # not available for this layer/device
                errors[path] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                continue
            errors[path] = ((out - reference).norm() / reference.norm().clamp(min=1e-12)).item()
            if errors[path] <= rtol:
                correct[path] = (lambda p=path: (setattr(layer, "path", p), layer(example)))
        if not correct:
            raise RuntimeError(f"no path matched the reference within rtol={rtol}: errors {errors}")
        timing = bench.compare(correct, repeats=repeats, min_run_time=0.02, warmup=1, threads=threads,
                               device=example.device)
    times = {p: r["median_s"] for p, r in timing["results"].items()}
    ranked = sorted(times, key=times.get)
    layer.path = ranked[0]
    tied = ranked[1] if len(ranked) > 1 and not bench.separated(timing, ranked[0], ranked[1]) else None
    return {"path": layer.path, "errors": errors, "times_s": times, "timing": timing, "tied_with": tied}


# --- int4 weight-only, packed two codes per byte (torch's CPU kernel, no torchao) --------------

def quantize_int4_packed(w: torch.Tensor, group_size: int = 32, dtype: torch.dtype = torch.bfloat16
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of `group_size` inputs, in the layout of torch._weight_int4pack_mm_for_cpu:
    codes 0..15 packed two per byte (uint8 [N, K / 2], torch._convert_weight_to_int4pack_for_cpu) and
    scale_and_zero [K / group_size, N, 2] in `dtype`, with w approximately (q - 8) * scale + zero (zero is the
    value code 8 stands for; min-max per group, as torchao's "tinygemm" choice). N must be a multiple of 16."""
    _check_float(w, "w")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
    n, k = w.shape
    if group_size not in INT4_GROUP_SIZES or k % group_size:
        raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES} and divide in_features {k}, got {group_size}")
    if n % 16:
        raise ValueError(f"out_features {n} is not a multiple of 16, which the packed CPU int4 layout needs")
    groups = w.detach().float().reshape(n, k // group_size, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    codes = torch.clamp(torch.round((groups - lo[..., None]) / scale[..., None]), 0, 15).to(torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes.reshape(n, k), 1)
    scale_and_zero = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous().to(dtype)
    return packed, scale_and_zero


def int4_codes(packed: torch.Tensor) -> torch.Tensor:
    """The codes 0..15 [N, K] back out of the packed layout, by multiplying it with the identity matrix
    (the kernel is the only documented reader of its layout)."""
    k = packed.shape[1] * 2
    ones = torch.zeros(k // 32, packed.shape[0], 2)
    ones[..., 0] = 1.0                                   # scale 1, zero 0: the kernel returns q - 8
    return (torch._weight_int4pack_mm_for_cpu(torch.eye(k), packed, 32, ones).t() + 8).round().to(torch.int32)


def dequantize_int4_packed(packed: torch.Tensor, scale_and_zero: torch.Tensor, dtype: torch.dtype = torch.float32
                           ) -> torch.Tensor:
    n, k = packed.shape[0], packed.shape[1] * 2
    group_size = k // scale_and_zero.shape[0]
    codes = int4_codes(packed).float().reshape(n, -1, group_size)
    scale, zero = scale_and_zero.float().transpose(0, 1).unbind(-1)
    return ((codes - 8) * scale[..., None] + zero[..., None]).reshape(n, k).to(dtype)


class Int4WeightOnlyLinear(nn.Module):
    """y = x @ dequant(w).T + bias with int4 weights packed two per byte and one bf16 scale and zero per
    group: torch._weight_int4pack_mm_for_cpu on bf16 activations (CPU). The output has x's dtype."""

    def __init__(self, packed: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if packed.dtype != torch.uint8 or packed.dim() != 2:
            raise TypeError(f"packed must be a 2-D uint8 tensor [N, K / 2], got {packed.dtype} {tuple(packed.shape)}")
        self.register_buffer("packed", packed)
        self.register_buffer("scale_and_zero", scale_and_zero)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.group_size = group_size

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32) -> "Int4WeightOnlyLinear":
        packed, scale_and_zero = quantize_int4_packed(linear.weight, group_size)
        return cls(packed, scale_and_zero, group_size, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.packed.shape[1] * 2
        if x.shape[-1] != k:
            raise ValueError(f"input's last dimension is {x.shape[-1]}, this layer takes {k}")
        y = torch._weight_int4pack_mm_for_cpu(x.reshape(-1, k).to(self.scale_and_zero.dtype).contiguous(),
                                              self.packed, self.group_size, self.scale_and_zero).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.packed.shape[0])

    def extra_repr(self) -> str:
        return (f"in_features={self.packed.shape[1] * 2}, out_features={self.packed.shape[0]}, "
                f"group_size={self.group_size}")


# --- int4 weight-only with torchao on CPU ----------------------------------------------------

def torchao_int4_cpu_config(group_size: int = 32, algorithm: str = "tinygemm"):
    """torchao's int4 weight-only config for the CPU kernel torch._weight_int4pack_mm_for_cpu: asymmetric
    codes 0..15 packed two per byte, one scale and one zero per group of `group_size` inputs, in the
    weight's dtype. `algorithm` "hqq" chooses them by HQQ's optimisation instead of min-max. It is a
    prototype whose name moved between releases, so both are tried: torchao 0.16 has
    prototype.int4_opaque_tensor.Int4WeightOnlyOpaqueTensorConfig, 0.18 prototype.quantization.int4's
    PrototypeInt4WeightOnlyConfig. Raises ImportError when neither exists. The kernel needs
    out_features divisible by 16 and group_size 32, 64 or 128."""
    try:
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig as Config
    except ImportError:
        from torchao.prototype.int4_opaque_tensor import Int4WeightOnlyOpaqueTensorConfig as Config
    return Config(group_size=group_size, int4_choose_qparams_algorithm=algorithm, set_inductor_config=False)


# --- FP8 -------------------------------------------------------------------------------------

def to_fp8(x: torch.Tensor, rowwise: bool, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 FP8 values and fp32 scales: one scale (tensor-wise) or one per row ([M, 1]). The format is the
    one x's device computes in (device.fp8_dtype: float8_e4m3fnuz on MI300, float8_e4m3fn elsewhere).
    Values are clamped to the format's range first, as production recipes do: with a scale other than
    amax/max, a value past the range would become NaN (e4m3fn has no infinity)."""
    _check_float(x, "x")
    dtype = dtype or fp8_dtype(x.device)
    fmax = torch.finfo(dtype).max
    amax = x.detach().float().abs().amax(dim=1, keepdim=True) if rowwise else x.detach().float().abs().amax()
    scale = amax.clamp(min=1e-12) / fmax
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype), scale


def fp8_linear(x: torch.Tensor, w: torch.Tensor, rowwise: bool = True,
               out_dtype: torch.dtype = torch.bfloat16, kernel: bool = True) -> torch.Tensor:
    """x [M, K] @ w[N, K].T with both operands in FP8 via torch._scaled_mm (w transposed to column-major);
    kernel=False computes the same from the dequantized operands (fp8_matmul_reference)."""
    xq, sx = to_fp8(x, rowwise)
    wq, sw = to_fp8(w, rowwise)
    return (fp8_matmul if kernel else fp8_matmul_reference)(xq, sx, wq, sw, out_dtype)


def fp8_matmul(xq, sx, wq, sw, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """torch._scaled_mm on pre-quantized operands; sw is [N, 1] for row-wise, passed as [1, N]."""
    return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw.t() if sw.dim() else sw, out_dtype=out_dtype)


def fp8_matmul_reference(xq, sx, wq, sw, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """What _scaled_mm computes, written out: FP8 values times their scales, multiplied in fp32. For a
    torch whose kernel lacks a scaling mode (row-wise on CPU in 2.10) and for checking the kernel."""
    return ((xq.float() * sx) @ (wq.float() * sw).t()).to(out_dtype)


FP8_SLOWER = "slower at every M here"
RECORDED_FP8_CROSSOVER = Path(__file__).with_name("recorded") / "fp8_crossover_h200.json"


def time_fp8_against_bf16(w: torch.Tensor, rows=(16, 128, 1024, 8192), rowwise: bool = True,
                          repeats: int = 5, compiled: bool = True) -> dict:
    """Time x @ w.T on w's GPU for each batch size M in `rows`: bf16 F.linear; FP8 _scaled_mm with the
    activations quantized beforehand (the kernel alone); FP8 with them quantized on every call (what dynamic
    FP8 inference does), eagerly and, with `compiled`, under torch.compile (which fuses to_fp8's passes over
    the activations). Activations are bf16, as a model's are. Returns {M: {name: (median_s, min_s, max_s)}}."""
    w_bf16 = w.bfloat16()
    wq, sw = to_fp8(w, rowwise)

    def per_call(a):
        return fp8_matmul(*to_fp8(a, rowwise), wq, sw)
    per_call_compiled = torch.compile(per_call, dynamic=False) if compiled else None
    timed = {}
    for m in rows:
        a = torch.randn(m, w.shape[1], device=w.device).bfloat16()
        aq, sa = to_fp8(a, rowwise)
        candidates = {"bf16": lambda: F.linear(a, w_bf16),
                      "fp8 kernel alone": lambda: fp8_matmul(aq, sa, wq, sw),
                      "fp8 per call": lambda: per_call(a)}
        if per_call_compiled is not None:
            per_call_compiled(a)                      # compiled for this M before the timing
            candidates["fp8 per call, compiled"] = lambda: per_call_compiled(a)
        r = bench.compare(candidates, baseline="bf16", repeats=repeats, device=w.device)
        timed[m] = {name: (res["median_s"], res["min_s"], res["max_s"]) for name, res in r["results"].items()}
    return timed


def fp8_crossover(rows: dict, candidate: str = "fp8 per call") -> str:
    """The first batch size M at which `candidate` beat bf16 with the spreads apart (its slowest repeat
    faster than bf16's fastest), from {M: {"bf16": (median_s, min_s, max_s), candidate: (...), ...}} in
    increasing M; FP8_SLOWER when it never did."""
    for m, times in rows.items():
        if times[candidate][2] < times["bf16"][1]:
            return str(m)
    return FP8_SLOWER


def recorded_fp8_crossover() -> dict:
    """The FP8 vs bf16 timings recorded on an FP8 GPU (deep dive 05's section), with where and when: shown,
    labelled, where no FP8 GPU is present. Rows keyed by M (int), each time a (median, min, max) tuple."""
    record = json.loads(RECORDED_FP8_CROSSOVER.read_text())
    record["rows"] = {int(m): {name: tuple(t) for name, t in times.items()} for m, times in record["rows"].items()}
    return record


# --- Lab check -------------------------------------------------------------------------------

def tensor_bytes(value) -> int:
    """Bytes a tensor really holds. A tensor subclass (torchao's quantized weights) counts its inner
    tensors (packed codes, scales, zero points), found through __tensor_flatten__; a quantized tensor
    (torch.ao) its codes plus per-channel scales and zero points; tuples and lists (torch.ao's packed
    parameters) their tensors; anything else counts 0."""
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if not isinstance(value, torch.Tensor):
        return 0
    if hasattr(value, "__tensor_flatten__"):
        names, _ = value.__tensor_flatten__()
        return sum(tensor_bytes(getattr(value, name)) for name in names)
    if value.is_quantized:
        extra = 0
        if value.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            extra = tensor_bytes(value.q_per_channel_scales()) + tensor_bytes(value.q_per_channel_zero_points())
        return value.int_repr().numel() * value.element_size() + extra
    return value.numel() * value.element_size()


def model_bytes(model: nn.Module) -> int:
    """Bytes of every tensor a model holds for inference: its state_dict (weights, biases, scales, zero
    points, packed codes; torch.ao's packed parameters included). For a torch.fx GraphModule (a PT2E
    model), only the tensors and submodules its graph reads: convert_pt2e leaves the float originals
    attached, unused."""
    if isinstance(model, torch.fx.GraphModule):
        read = {(n.op, n.target) for n in model.graph.nodes if n.op in ("get_attr", "call_module")}
        return sum(tensor_bytes(value) if op == "get_attr" else model_bytes(value)
                   for op, value in ((op, functools.reduce(getattr, t.split("."), model)) for op, t in read))
    return sum(tensor_bytes(v) for v in model.state_dict().values())


def accuracy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(inputs).argmax(-1) == labels).float().mean().item()


def check_deployment(quantized: nn.Module, reference: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                     *, max_drop: float = 0.01, min_speedup: float | None = 2.0, what: str) -> dict:
    """The quantized model keeps accuracy within max_drop of the reference and is min_speedup times
    faster at batch 1 (None: report the speed without a target). Returns what was measured."""
    acc_ref, acc_q = accuracy(reference, inputs, labels), accuracy(quantized, inputs, labels)
    size_ref, size_q = model_bytes(reference), model_bytes(quantized)
    print(f"accuracy {acc_q:.4f} (fp32 {acc_ref:.4f}) · size {size_q / 2**20:.2f} MiB (fp32 {size_ref / 2**20:.2f} MiB)")
    if acc_ref - acc_q > max_drop:
        fail(what, f"accuracy dropped by {acc_ref - acc_q:.4f}, the budget is {max_drop}",
             "use a finer scale granularity (per channel or per group instead of per tensor), or more bits")
    one = inputs[:1]
    with torch.no_grad():
        timing = bench.compare({"fp32": lambda: reference(one), "quantized": lambda: quantized(one)},
                               baseline="fp32", repeats=5, min_run_time=0.05, threads=1, device=one.device)
    speedup = timing["results"]["quantized"]["ratio_to_baseline"]
    lo, hi = bench.speedup_range(timing["results"], "fp32", "quantized")
    print(f"batch-1 speed-up: {speedup:.2f}x ({lo:.2f}x to {hi:.2f}x over the repeats, 1 thread)"
          + (f" (target {min_speedup:.1f}x)" if min_speedup else " (measured, no target)")
          + ("" if bench.separated(timing, "fp32", "quantized") else f"; the spreads overlap: {bench.NOISY}"))
    if min_speedup is not None and speedup < min_speedup:
        fail(what, f"{speedup:.2f}x faster than fp32 at batch 1, the target is {min_speedup}x",
             "feed the int8 kernel bf16 activations (fp32 activations take a slow path); check that every "
             "large Linear was swapped; on a machine busy with other work, time at torch.set_num_threads(1)")
    passed(what)
    return {"accuracy": acc_q, "reference_accuracy": acc_ref, "bytes": size_q, "reference_bytes": size_ref,
            "speedup": speedup, "timing": timing}


# --- Benchmark -------------------------------------------------------------------------------

def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench quant`: latency and % of measured read bandwidth at M=1 for every
    variant, timed in one run per thread count (1 and all). Full mode: 4096x4096, with the weights of
    several distinct layers cycled so they come from memory, not from the cache (as in a model's forward)."""
    n = k = 1024 if quick else 4096
    layers = 2 if quick else 8
    torch.manual_seed(0)
    linears = [nn.Linear(k, n, bias=False) for _ in range(layers)]
    x = torch.randn(1, k)
    weights = [lin.weight.detach() for lin in linears]
    weights_bf16 = [w.bfloat16() for w in weights]
    int8 = [Int8WeightOnlyLinear.from_linear(lin) for lin in linears]
    int8_fp32 = [Int8WeightOnlyLinear.from_linear(lin, path="int8pack_fp32") for lin in linears]
    rowwise = not missing("fp8_rowwise_cpu")      # torch 2.10's CPU kernel takes tensor-wise scales only
    fp8 = [to_fp8(w, rowwise=rowwise) for w in weights]
    x8, sx8 = to_fp8(x, rowwise=rowwise)
    xb = x.bfloat16()
    step = {"i": 0}

    def cycled(call):
        def run():
            step["i"] = (step["i"] + 1) % layers
            return call(step["i"])
        return run

    candidates = {
        "fp32 F.linear": (cycled(lambda i: F.linear(x, weights[i])), 4),
        "bf16 F.linear": (cycled(lambda i: F.linear(xb, weights_bf16[i])), 2),
        "int8 wo, bf16 activations": (cycled(lambda i: int8[i](x)), 1),
        "int8 wo, fp32 activations": (cycled(lambda i: int8_fp32[i](x)), 1),
        f"fp8 _scaled_mm {'row' if rowwise else 'tensor'}-wise": (cycled(lambda i: fp8_matmul(x8, sx8, *fp8[i])), 1),
    }
    runs = {}
    for threads in sorted({1, torch.get_num_threads()}):
        with torch.no_grad():
            result = bench.compare({name: fn for name, (fn, _) in candidates.items()}, baseline="fp32 F.linear",
                                   repeats=3 if quick else 5, min_run_time=0.05 if quick else 0.2, threads=threads,
                                   device="cpu")
        limits = (bench.measure_limits(threads=threads, quick=True, device="cpu") if quick
                  else bench.machine_limits(threads=threads, device="cpu"))
        for name, (_, bytes_per_weight) in candidates.items():
            entry = result["results"][name]
            entry["weight_bytes"] = bytes_per_weight * n * k
            entry["read_gbs"] = entry["weight_bytes"] / entry["median_s"] / 1e9
            entry["percent_of_read_bandwidth"] = bench.percent_of_limit(entry["read_gbs"],
                                                                        limits["read_bandwidth_gbs"])
        result["read_bandwidth_gbs"] = limits["read_bandwidth_gbs"]
        runs[str(threads)] = result
    return {"shape": {"M": 1, "N": n, "K": k}, "layers_cycled": layers, "quick": quick, "by_threads": runs}
