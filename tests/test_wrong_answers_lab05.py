"""Lab 05 (quantization): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from helpers.grading.specs import lab05 as spec05
from wrong_answers import FORBIDDEN_HINT, L05, Wrong, lab_tests


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


FP32_FAST_HERE = "on a CPU that vectorizes fp32 activations (aarch64) they are the fast path: nothing to catch"


if torch.backends.cpu.get_cpu_capability().upper().startswith("AVX"):
    FP32_FAST_HERE = None


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
          "walk named_children() recursively"),
    Wrong(L05, "quantize_model", "in-place", quantize_model_in_place, "the fp32 model is left untouched",
          "copy.deepcopy(model) first"),
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
]

SECOND_SOLUTIONS = [("quantize_weight", quantize_second_solution), ("int8_linear", int8_linear_second_solution),
                    ("quantize_model", quantize_model_second_solution), ("choose_plan", choose_plan_second_solution)]

globals().update(lab_tests(L05, WRONG, SECOND_SOLUTIONS, visible=True))
