"""Lab 05 (quantization): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import ast
import copy

import torch
import torch.nn.functional as F
from torch import nn

from helpers import quant
from helpers.grading.specs import lab05 as spec05
from wrong_answers import FORBIDDEN_HINT, L05, Wrong, _cells, lab_tests, run_cases


def quantize_per_tensor(w, bits=8):
    # one scale for the whole tensor, repeated per row
    qmax = 2 ** (bits - 1) - 1
    scale = w.abs().amax() / qmax
    return torch.clamp(torch.round(w / scale), -qmax, qmax).to(torch.int8), scale.expand(w.shape[0]).float()


def quantize_per_column(w, bits=8):
    # reduces over dim 0: one scale per input column
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=0) / qmax
    return torch.clamp(torch.round(w / scales), -qmax, qmax).to(torch.int8), scales.float()


def quantize_float_codes(w, bits=8):
    # codes left as float
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    return torch.clamp(torch.round(w / scales[:, None]), -qmax, qmax), scales.float()


def quantize_ignores_bits(w, bits=8):
    # qmax fixed at 127 whatever `bits` says
    scales = w.abs().amax(dim=1) / 127
    return torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8), scales.float()


def quantize_zero_row_nan(w, bits=8):
    # divides a zero row by its zero scale, then clamps the NaN away
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    return torch.clamp(torch.round(w / scales[:, None]), -qmax, qmax).nan_to_num(7).to(torch.int8), scales.float()


def quantize_nan_cast(w, bits=8):
    # divides a zero row by its zero scale: the NaN codes happen to become 0 in torch.int8 on this CPU
    qmax = 2 ** (bits - 1) - 1
    scales = w.float().abs().amax(dim=1) / qmax
    return torch.clamp(torch.round(w.float() / scales[:, None]), -qmax, qmax).to(torch.int8), scales


def quantize_eps_scale(w, bits=8):
    # keeps 0 / 0 away with an eps in the scale: a zero row's scale is 1e-8, not 0
    qmax = 2 ** (bits - 1) - 1
    scales = (w.float().abs().amax(dim=1) / qmax).clamp(min=1e-8)
    return torch.clamp(torch.round(w.float() / scales[:, None]), -qmax, qmax).to(torch.int8), scales


def quantize_in_weight_dtype(widen):
    """quantize_weight computed in the weight's dtype; widen: the scales cast to float32 on return."""
    def quantize_weight(w, bits=8):
        qmax = 2 ** (bits - 1) - 1
        scales = w.abs().amax(dim=1) / qmax
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.clamp(torch.round(w / safe[:, None]), -qmax, qmax).to(torch.int8)
        return codes, scales.float() if widen else scales
    return quantize_weight


def quantize_truncates(w, bits=8):
    # .to(torch.int8) truncates towards zero: no rounding
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    q = torch.where(scales[:, None] > 0, w / scales.clamp(min=1e-30)[:, None], 0.0)
    return torch.clamp(q, -qmax, qmax).to(torch.int8), scales.float()


def int8_linear_fp32_activations(x, q, scales, bias):
    # feeds the kernel fp32 activations: correct, but the slow path
    y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), q, scales)
    y = y + bias if bias is not None else y
    return y.reshape(*x.shape[:-1], q.shape[0])


def int8_linear_dequantized(x, q, scales, bias):
    # dequantizes and runs an fp32 matmul: the int8 kernel never runs
    return F.linear(x, q.float() * scales[:, None], bias)


def int8_linear_no_reshape(x, q, scales, bias):
    # hands the kernel the 3-D input: it takes 2-D activations
    y = torch._weight_int8pack_mm(x.to(torch.bfloat16), q, scales.to(torch.bfloat16)).to(x.dtype)
    return y + bias if bias is not None else y


def int8_linear_bf16_out(x, q, scales, bias):
    # returns the kernel's bfloat16 result without casting back
    y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), q, scales.to(torch.bfloat16))
    y = y + bias.to(torch.bfloat16) if bias is not None else y
    return y.reshape(*x.shape[:-1], q.shape[0])


def int8_linear_bias_required(x, q, scales, bias):
    # adds bias unconditionally: None breaks it
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype) + bias
    return y.reshape(*x.shape[:-1], q.shape[0])


class _Int8Linear(nn.Module):
    """The lab's MyInt8Linear, on the spec's quantize_weight and int8_linear (or on `quantize`)."""
    def __init__(self, linear, quantize=spec05._quantize_weight):
        super().__init__()
        q, scales = quantize(linear.weight.detach())
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        return spec05._int8_linear(x, self.q, self.scales, self.bias)


class _FakeQuantLinear(nn.Module):
    """Rounds the weight to int8 levels but stores it back as float32."""
    def __init__(self, linear):
        super().__init__()
        q, scales = spec05._quantize_weight(linear.weight.detach())
        self.register_buffer("weight", q.float() * scales[:, None])
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _swap(module, make):
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(module, name, make(child))
        else:
            _swap(child, make)
    return module


def quantize_model_top_level(model):
    # replaces the direct children only: Linears inside sub-modules are left
    model = copy.deepcopy(model)
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, _Int8Linear(child))
    return model


def quantize_model_in_place(model):
    # swaps the caller's model: the fp32 reference is gone
    return _swap(model, _Int8Linear)


def quantize_model_per_tensor(model):
    # per-tensor scales: rows 1000x apart round to zero
    return _swap(copy.deepcopy(model), lambda lin: _Int8Linear(lin, quantize_per_tensor))


def quantize_model_float_weights(model):
    # fake quantization: int8 levels stored as float32, no smaller than before
    return _swap(copy.deepcopy(model), _FakeQuantLinear)


def quantize_model_torch_ao(model):
    # the forbidden one-liner: torch.ao's dynamic quantization, per-channel int8
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    return quantize_dynamic(copy.deepcopy(model), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def quantize_model_library_layer(model):
    # helpers.quant's layer instead of the learner's
    from helpers import quant

    def make(lin):
        q, scales = spec05._quantize_weight(lin.weight.detach())
        return quant.Int8WeightOnlyLinear(q, scales, lin.bias)
    return _swap(copy.deepcopy(model), make)


def quantize_calls_torch(w, bits=8):
    # torch's own per-channel quantizer (the exercise asks for plain tensor operations)
    qmax = 2 ** (bits - 1) - 1
    scales = (w.abs().amax(dim=1) / qmax).double()
    q = torch.quantize_per_channel(w, scales.clamp(min=1e-30), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
    return q.int_repr().clamp(-qmax, qmax), scales.float()


def plan_int8_everywhere():
    # the safe default: 8 bits per channel on every layer
    return {layer: ("channel", 8) for layer in ("fc1", "fc2", "fc3")}


def plan_int4_per_tensor():
    # 4 bits, one scale per tensor: the smallest that keeps 4 bits
    return {layer: ("tensor", 4) for layer in ("fc1", "fc2", "fc3")}


def plan_int4_per_channel():
    # 4 bits per channel everywhere: a scale per row does not absorb fc2's spread over its inputs
    return {layer: ("channel", 4) for layer in ("fc1", "fc2", "fc3")}


def plan_int4_per_group():
    # 4 bits per group of 16 everywhere: every group still mixes small and large inputs
    return {layer: ("group", 4) for layer in ("fc1", "fc2", "fc3")}


def plan_bits_where_rows_spread():
    # 8 bits for the layer whose rows spread, 4 for the largest layer: the other way round
    return {"fc1": ("channel", 8), "fc2": ("channel", 4), "fc3": ("channel", 8)}


def plan_int8_per_tensor():
    # 8 bits per tensor everywhere: fewer scales, still too many bytes
    return {layer: ("tensor", 8) for layer in ("fc1", "fc2", "fc3")}


def plan_not_a_plan():
    # a format name per layer instead of (granularity, bits)
    return {"fc1": "int4", "fc2": "int8", "fc3": "int8"}


def plan_fc3_per_tensor():
    # the smallest head that passed on seed 0 at exactly the budget: 4 bits, one scale for all of fc3
    return {"fc1": ("channel", 4), "fc2": ("channel", 8), "fc3": ("tensor", 4)}


def choose_plan_second_solution():
    # a right answer written differently: a list per layer, 4 bits per channel for the small head too
    return dict(fc1=["channel", 4], fc2=["channel", 8], fc3=["channel", 4])


def quantize_second_solution(w, bits=8):
    # a right answer written differently: float64 division, torch.where for a zero row, round-half-even
    qmax = float(2 ** (bits - 1) - 1)
    peak = w.double().abs().max(dim=1, keepdim=True).values
    codes = torch.where(peak > 0, (w.double() * qmax / torch.where(peak > 0, peak, 1.0)).round(), 0.0)
    return codes.clamp(-qmax, qmax).to(torch.int8), (peak.squeeze(1) / qmax).float()


def int8_linear_second_solution(x, q, scales, bias):
    # a right answer written differently: flatten, F.linear-style bias via addition broadcast, view back
    flat = x.flatten(0, -2) if x.dim() > 1 else x[None]
    y = torch._weight_int8pack_mm(flat.bfloat16().contiguous(), q, scales.bfloat16()).float().to(x.dtype)
    y = y if bias is None else y + bias[None, :]
    return y.view(x.shape[:-1] + (q.shape[0],))


def quantize_model_second_solution(model):
    # a right answer written differently: named_modules() to find parents, then swap
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear:
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            setattr(parent, name.rpartition(".")[2], _Int8Linear(module))
    return model


def _group(k, granularity="channel"):
    """The int4 kernel's group sizes that divide k: the largest (a row's inputs in as few groups as allowed),
    or the smallest for a plan that asks for groups."""
    groups = [g for g in quant.INT4_GROUP_SIZES if k % g == 0]
    return groups[0] if granularity == "group" else groups[-1]


def _int4(linear, group=None, dtype=torch.bfloat16):
    group = group or _group(linear.in_features)
    return quant.Int4WeightOnlyLinear(*quant.quantize_int4_packed(linear.weight, group, dtype), group, linear.bias)


def _shipped_with(model, plan, make):
    """A copy of model with each layer of the plan replaced by make(linear, granularity, bits)."""
    shipped = copy.deepcopy(model)
    for name, (granularity, bits) in plan.items():
        setattr(shipped, name, make(getattr(shipped, name), granularity, bits))
    return shipped


def ship_int4_head(model, plan):
    # int4 wherever the plan says 4 bits, the 10-class head included: the kernel refuses out_features 10
    return _shipped_with(model, plan, lambda lin, granularity, bits: _int4(lin) if bits == 4
                         else quant.Int8WeightOnlyLinear.from_linear(lin))


def ship_float_head_kept(model, plan):
    # a layer the int4 kernel refuses is left as it was: a float nn.Linear
    return _shipped_with(model, plan, lambda lin, granularity, bits: lin if bits == 4 and lin.out_features % 16
                         else _int4(lin) if bits == 4 else quant.Int8WeightOnlyLinear.from_linear(lin))


class _Bf16Linear(nn.Module):
    """A float layer under another name: the weight kept in bf16, F.linear in the forward."""
    def __init__(self, linear):
        super().__init__()
        self.register_buffer("weight", linear.weight.detach().bfloat16())
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype), self.bias)


def ship_float_head_module(model, plan):
    # a layer the int4 kernel refuses kept in bf16 in a module of its own: not an nn.Linear, not a kernel either
    return _shipped_with(model, plan, lambda lin, granularity, bits: _Bf16Linear(lin) if lin.out_features % 16
                         else _int4(lin) if bits == 4 else quant.Int8WeightOnlyLinear.from_linear(lin))


class _DequantizedInt4(nn.Module):
    """Packed int4 weights, dequantized to fp32 at every call for an F.linear."""
    def __init__(self, linear):
        super().__init__()
        self.inner = _int4(linear)

    def forward(self, x):
        return F.linear(x, quant.dequantize_int4_packed(self.inner.packed, self.inner.scale_and_zero), self.inner.bias)


def ship_dequantized(model, plan):
    # the weights stored packed, but each forward dequantizes them and multiplies in float
    def make(lin):
        q, scales = quant.quantize_per_channel(lin.weight.detach())
        return quant.Int8WeightOnlyLinear(q, scales, lin.bias, path="dequant")
    return _shipped_with(model, plan, lambda lin, granularity, bits: _DequantizedInt4(lin)
                         if bits == 4 and lin.out_features % 16 == 0 else make(lin))


def ship_group_32(model, plan):
    # the lesson's group of 32 for every int4 layer, whatever the plan's granularity
    return _shipped_with(model, plan, lambda lin, granularity, bits: _int4(lin, 32)
                         if bits == 4 and lin.out_features % 16 == 0 else quant.Int8WeightOnlyLinear.from_linear(lin))


def ship_int8_everywhere(model, plan):
    # int8 per channel on every layer: always a kernel, whatever the plan
    return _shipped_with(model, plan, lambda lin, granularity, bits: quant.Int8WeightOnlyLinear.from_linear(lin))


def ship_int4_wherever_allowed(model, plan):
    # the lesson's rule, int4 (group 32) wherever the kernel takes the shape, int8 elsewhere: the plan's bits ignored
    return _shipped_with(model, plan, lambda lin, granularity, bits: _int4(lin, 32) if lin.out_features % 16 == 0
                         else quant.Int8WeightOnlyLinear.from_linear(lin))


def ship_fp32_scale_and_zero(model, plan):
    # int4 with its scales and zeros in fp32 (the kernel then takes fp32 activations)
    return _shipped_with(model, plan, lambda lin, granularity, bits: _int4(lin, dtype=torch.float32)
                         if bits == 4 and lin.out_features % 16 == 0 else quant.Int8WeightOnlyLinear.from_linear(lin))


class _PackedPerCall(nn.Module):
    """int4 codes kept as int32 [N, K] and packed at every call."""
    def __init__(self, linear):
        super().__init__()
        packed, self.group = _int4(linear), _group(linear.in_features)
        self.register_buffer("codes", quant.int4_codes(packed.packed))
        self.register_buffer("scale_and_zero", packed.scale_and_zero)
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        packed = torch._convert_weight_to_int4pack_for_cpu(self.codes, 1)
        y = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16).contiguous(), packed, self.group,
                                              self.scale_and_zero)
        return y.to(x.dtype) + self.bias


def ship_unpacked_codes(model, plan):
    # the int4 codes held one per int32 and packed in the forward: the plan counted half a byte per weight
    return _shipped_with(model, plan, lambda lin, granularity, bits: _PackedPerCall(lin)
                         if bits == 4 and lin.out_features % 16 == 0 else quant.Int8WeightOnlyLinear.from_linear(lin))


class _PaddedInt4(nn.Module):
    """int4 with out_features padded up to a multiple of 16 by zero rows; `cut`: drop the padding's outputs."""
    def __init__(self, linear, group, cut=True):
        super().__init__()
        n, k = linear.weight.shape
        rows = -(-n // 16) * 16
        weight = torch.zeros(rows, k)
        weight[:n] = linear.weight.detach()
        packed, scale_and_zero = quant.quantize_int4_packed(weight, group)
        self.register_buffer("packed", packed)
        self.register_buffer("scale_and_zero", scale_and_zero)
        self.register_buffer("bias", linear.bias.detach().clone() if cut else F.pad(linear.bias.detach(), (0, rows - n)))
        self.group, self.n = group, (n if cut else rows)

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        y = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scale_and_zero)[:, :self.n]
        return (y.to(x.dtype) + self.bias).reshape(*x.shape[:-1], self.n)


def ship_padded_uncut(model, plan):
    # the refused head padded to 16 rows for the int4 kernel, its 6 padding logits left in the output
    return _shipped_with(model, plan, lambda lin, granularity, bits: quant.Int8WeightOnlyLinear.from_linear(lin)
                         if bits == 8 else _int4(lin) if lin.out_features % 16 == 0
                         else _PaddedInt4(lin, _group(lin.in_features), cut=False))


def ship_in_place(model, plan):
    # replaces the given model's layers: the fp32 reference is gone
    for name, (granularity, bits) in plan.items():
        lin = getattr(model, name)
        setattr(model, name, _int4(lin) if bits == 4 and lin.out_features % 16 == 0
                else quant.Int8WeightOnlyLinear.from_linear(lin))
    return model


class _Int8Bf16Out(nn.Module):
    """int8 per channel on the kernel, its bf16 result returned as it comes."""
    def __init__(self, linear):
        super().__init__()
        q, scales = quant.quantize_per_channel(linear.weight.detach())
        self.register_buffer("q", q)
        self.register_buffer("scales", scales.bfloat16())
        self.register_buffer("bias", linear.bias.detach().bfloat16())

    def forward(self, x):
        return torch._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.q, self.scales) + self.bias


def ship_bf16_logits(model, plan):
    # int8 layers that return the kernel's bf16: the logits come out in bf16
    return _shipped_with(model, plan, lambda lin, granularity, bits: _int4(lin)
                         if bits == 4 and lin.out_features % 16 == 0 else _Int8Bf16Out(lin))


class _Int8(nn.Module):
    def __init__(self, linear):
        super().__init__()
        q, scales = quant.quantize_per_channel(linear.weight.detach())
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        y = torch._weight_int8pack_mm(flat, self.q, self.scales.to(torch.bfloat16)).to(x.dtype) + self.bias
        return y.reshape(*x.shape[:-1], self.q.shape[0])


def ship_plan_second_solution(model, plan):
    # a right answer written otherwise: a refused layer padded with zero rows up to the kernel's multiple of 16
    # and its padding's outputs dropped, so the head keeps the plan's 4 bits; layers of its own
    shipped = copy.deepcopy(model)
    for name, (granularity, bits) in plan.items():
        lin = shipped.get_submodule(name)
        layer = _Int8(lin) if bits > 4 else _PaddedInt4(lin, _group(lin.in_features, granularity))
        shipped.register_module(name, layer)
    return shipped


FP32_FAST_HERE = "on a CPU that vectorizes fp32 activations (aarch64) they are the fast path: nothing to catch"


if torch.backends.cpu.get_cpu_capability().upper().startswith("AVX"):
    FP32_FAST_HERE = None


HEAD = "the same plan with the head at 4 bits, on seed 0"

WRONG = [
    Wrong(L05, "quantize_weight", "per-tensor", quantize_per_tensor, "one fp32 scale per row",
          "one value per output row"),
    Wrong(L05, "quantize_weight", "per-column", quantize_per_column, "one fp32 scale per row", "reduce over the inputs"),
    Wrong(L05, "quantize_weight", "float-codes", quantize_float_codes, "codes are torch.int8", ".to(torch.int8)"),
    Wrong(L05, "quantize_weight", "ignores-bits", quantize_ignores_bits, "bits=4: codes in [-7, 7]",
          "not 127 whatever bits says"),
    Wrong(L05, "quantize_weight", "zero-row", quantize_zero_row_nan, "a row of zeros: scale 0, codes 0, no NaN",
          "do not divide 0 by 0"),
    Wrong(L05, "quantize_weight", "zero-row-nan-cast", quantize_nan_cast, "a row of zeros: no NaN becomes a code",
          "what NaN becomes in torch.int8 depends on the CPU"),
    Wrong(L05, "quantize_weight", "eps-in-scale", quantize_eps_scale, "a row of zeros: its scale is exactly 0",
          "not a small eps"),
    Wrong(L05, "quantize_weight", "scales-in-weight-dtype", quantize_in_weight_dtype(widen=False),
          "a bfloat16 weight: float32 scales", "float32 whatever the weight's dtype"),
    Wrong(L05, "quantize_weight", "scales-widened-late", quantize_in_weight_dtype(widen=True),
          "a bfloat16 weight: the scales' values", "even if widened afterwards"),
    Wrong(L05, "quantize_weight", "truncates", quantize_truncates, "codes are rounded, not truncated",
          "truncates towards zero: round first"),
    Wrong(L05, "quantize_weight", "calls-quantize-per-channel", quantize_calls_torch, "one fp32 scale per row",
          FORBIDDEN_HINT),
    Wrong(L05, "int8_linear", "fp32-activations", int8_linear_fp32_activations,
          "the kernel gets the activations of its fast path on this CPU", "fed fp32", known=FP32_FAST_HERE),
    Wrong(L05, "int8_linear", "dequantized-matmul", int8_linear_dequantized,
          "the kernel gets the activations of its fast path on this CPU", "Hand it bfloat16 activations"),
    Wrong(L05, "int8_linear", "no-reshape", int8_linear_no_reshape, "values (3-D input, bias)",
          "reshape x to 2-D"),
    Wrong(L05, "int8_linear", "bf16-output", int8_linear_bf16_out, "output keeps the input's dtype",
          "cast back with .to(x.dtype)"),
    Wrong(L05, "int8_linear", "bias-required", int8_linear_bias_required, "no bias", "bias may be None"),
    Wrong(L05, "quantize_model", "no-recursion", quantize_model_top_level, "a nested model: the Linears one level down",
          "may hold Linears, at any depth"),
    Wrong(L05, "quantize_model", "in-place", quantize_model_in_place, "the fp32 model is left untouched",
          "replace the layers of a copy"),
    Wrong(L05, "quantize_model", "per-tensor", quantize_model_per_tensor, "argmax agrees with fp32 on 97% of inputs",
          "one scale per output row"),
    Wrong(L05, "quantize_model", "float-weights", quantize_model_float_weights, "at least 3x smaller",
          "not a float copy of the weight"),
    Wrong(L05, "quantize_model", "torch-ao-dynamic", quantize_model_torch_ao, "every nn.Linear replaced",
          FORBIDDEN_HINT),
    Wrong(L05, "quantize_model", "library-int8-linear", quantize_model_library_layer, "every nn.Linear replaced",
          FORBIDDEN_HINT),
    Wrong(L05, "choose_plan", "int8-everywhere", plan_int8_everywhere, "weights within 23,000 bytes",
          "8 bits on every layer is over the budget"),
    Wrong(L05, "choose_plan", "int8-per-tensor", plan_int8_per_tensor, "weights within 23,000 bytes",
          "whatever the granularity"),
    Wrong(L05, "choose_plan", "int4-per-tensor", plan_int4_per_tensor, "at most 4 more test images wrong than fp32",
          "a scale per row absorbs a spread over rows"),
    Wrong(L05, "choose_plan", "int4-per-channel", plan_int4_per_channel, "at most 4 more test images wrong than fp32",
          "a spread over columns (the inputs)"),
    Wrong(L05, "choose_plan", "int4-per-group", plan_int4_per_group, "at most 4 more test images wrong than fp32",
          "every group of 16"),
    Wrong(L05, "choose_plan", "bits-where-rows-spread", plan_bits_where_rows_spread,
          "at most 4 more test images wrong than fp32", "only more bits keep the small ones"),
    Wrong(L05, "choose_plan", "format-names", plan_not_a_plan, "a (granularity, bits) for each layer",
          "each mapped to (granularity, bits)"),
    Wrong(L05, "choose_plan", "fc3-per-tensor", plan_fc3_per_tensor, "the same plan on the model trained with seed 4",
          "extra_wrong_alone measures each layer's choice"),
    Wrong(L05, "ship_plan", "int4-head", ship_int4_head, f"{HEAD}: each layer runs a packed kernel",
          "Where the int4 kernel refuses a layer's shape"),
    Wrong(L05, "ship_plan", "float-head-kept", ship_float_head_kept, f"{HEAD}: no nn.Linear left",
          "a layer the int4 kernel refuses is still a layer of the plan"),
    Wrong(L05, "ship_plan", "float-head-module", ship_float_head_module, f"{HEAD}: each layer runs a packed kernel",
          "nor is a float layer in another class"),
    Wrong(L05, "ship_plan", "dequantized-forward", ship_dequantized, "each layer runs a packed kernel, no float matmul",
          "dequantized to float for the matmul"),
    Wrong(L05, "ship_plan", "group-32", ship_group_32, "within 24,064 bytes held", "cost more the smaller the group"),
    Wrong(L05, "ship_plan", "int8-everywhere", ship_int8_everywhere, "within 24,064 bytes held",
          "stored at 8, costs twice its codes"),
    Wrong(L05, "ship_plan", "int4-wherever-allowed", ship_int4_wherever_allowed,
          "at most 4 more test images wrong than fp32", "a layer the plan keeps at 8 bits needs them"),
    Wrong(L05, "ship_plan", "fp32-scale-and-zero", ship_fp32_scale_and_zero, "within 24,064 bytes held",
          "scales and zeros kept in fp32"),
    Wrong(L05, "ship_plan", "unpacked-codes", ship_unpacked_codes, "within 24,064 bytes held", "codes kept unpacked"),
    Wrong(L05, "ship_plan", "padded-head-uncut", ship_padded_uncut, f"{HEAD}: 10 float32 logits per test image",
          "returns the padding's outputs too"),
    Wrong(L05, "ship_plan", "in-place", ship_in_place, "the given model untouched", "ship a copy"),
    Wrong(L05, "ship_plan", "bf16-logits", ship_bf16_logits, "10 float32 logits per test image",
          "in the input's dtype"),
]

SECOND_SOLUTIONS = [("quantize_weight", quantize_second_solution), ("int8_linear", int8_linear_second_solution),
                    ("quantize_model", quantize_model_second_solution), ("choose_plan", choose_plan_second_solution),
                    ("ship_plan", ship_plan_second_solution)]

globals().update(lab_tests(L05, WRONG, SECOND_SOLUTIONS, visible=True))


def test_a_mistake_in_exercise_1_or_2_costs_marks_there_only():
    """Exercises 3 and 5 run the notebook's MyInt8Linear, which calls the learner's quantize_weight and
    int8_linear: they are graded with right ones in their place (Exercise.substitutes), so one scale per
    tensor in exercise 1 and a dequantizing int8_linear in exercise 2 lose no marks there."""
    from helpers.grading.checks import call_case
    wanted = {"MyInt8Linear", "quantize_model", "ship_plan"}
    body = [node for tree in _cells(L05) for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "name", None) in wanted]
    namespace = {"quantize_weight": quantize_per_tensor, "int8_linear": int8_linear_dequantized}
    exec(compile(ast.Module(body, type_ignores=[]), "<lab 05 solution>", "exec"), namespace)
    for function in ("quantize_model", "ship_plan"):
        assert run_cases(L05, namespace[function], function) == [], function
    assert namespace["int8_linear"] is int8_linear_dequantized
    unsubstituted = call_case(namespace["ship_plan"], (0, spec05._choose_plan()), {}, "ship_kernels")
    assert unsubstituted["value"].startswith("fc2 runs no packed kernel but a float matmul"), unsubstituted
