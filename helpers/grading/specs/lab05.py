"""Lab 05 (quantization): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.specs.core import Case, Exercise, LabSpec


def _quantize_weight(w, bits=8):
    qmax = 2 ** (bits - 1) - 1
    w = w.float()
    scales = w.abs().amax(dim=1) / qmax
    q = torch.where(scales[:, None] > 0, w / scales.clamp(min=torch.finfo(w.dtype).tiny)[:, None], 0.0)
    return torch.clamp(torch.round(q), -qmax, qmax).to(torch.int8), scales


def _quantize_weight_cases(gen):
    w = torch.randn(16, 32, generator=gen) * torch.logspace(-2, 1, 16)[:, None]
    codes = ("each code is its weight divided by its row's scale, rounded to the nearest integer and clamped to "
             "[-qmax, qmax], where qmax is the largest code `bits` signed bits can hold symmetrically (not 127 "
             "whatever bits says); stored as torch.int8")
    zero = w.clone()
    zero[3] = 0
    two_zero_rows = zero * torch.tensor([0.0 if i in (0, 3) else 1.0 for i in range(16)])[:, None]
    nan = ("0 / 0 is NaN, and what NaN becomes in torch.int8 depends on the CPU: where a row's scale is 0, "
           "make its codes 0 without dividing by that 0")
    fp32 = ("the scales are float32 whatever the weight's dtype, and computed in float32: a scale divided in "
            "bfloat16 or float16, even if widened afterwards, has lost bits that the int8 kernel's scales keep")
    return [
        Case("one fp32 scale per row", (w,), call="second", hint="a row's scale maps its largest magnitude to "
             "qmax: reduce over the inputs (the last dim), one value per output row, not one for the tensor"),
        Case("codes, within 1 of round(w / scale)", (w,), call="first_as_float", atol=1.0, rtol=0, hint=codes),
        Case("codes are torch.int8", (w,), call="dtype_of_first", hint="convert with .to(torch.int8)"),
        Case("codes are rounded, not truncated", (torch.tensor([[127.0, 10.75, -20.75, 3.25, -0.75, 0.25]]),),
             call="first_as_float", atol=0, rtol=0,
             hint=codes + "; converting a float to int8 truncates towards zero: round first"),
        Case("bits=4: codes in [-7, 7]", (w,), {"bits": 4}, call="first_as_float", atol=1.0, rtol=0, hint=codes),
        Case("a row of zeros: scale 0, codes 0, no NaN", (zero,), call="first_as_float", atol=1.0,
             rtol=0, hint="where a row's scale is 0 its codes are 0: do not divide 0 by 0"),
        Case("a row of zeros: no NaN becomes a code", (zero,), call="non_finite_cast_to_integer", hint=nan),
        Case("a row of zeros: its scale is exactly 0", (zero,), call="second", atol=0.0,
             hint="a row of zeros has scale 0, not a small eps: an eps kept in the scale is a row that is not there"),
        Case("a bfloat16 weight: float32 scales", (w.bfloat16(),), call="dtype_of_second", hint=fp32),
        Case("a bfloat16 weight: the scales' values", (w.bfloat16(),), call="second", hint=fp32),
        Case("two rows of zeros, bits=4", (two_zero_rows,), {"bits": 4}, call="first_as_float", hidden=True, atol=1.0,
             rtol=0, hint="where a row's scale is 0 its codes are 0: do not divide 0 by 0"),
        Case("two rows of zeros, bits=4: no NaN becomes a code", (two_zero_rows,), {"bits": 4},
             call="non_finite_cast_to_integer", hidden=True, hint=nan),
        Case("a float16 weight: float32 scales", (w.half(),), call="dtype_of_second", hidden=True, hint=fp32),
        Case("a float16 weight: the scales' values", (w.half(),), call="second", hidden=True, hint=fp32),
        Case("rows 1000x apart", (torch.randn(4, 8, generator=gen) * torch.tensor([[1e-3], [1.0], [1e3], [1.0]]),),
             call="second", hidden=True, hint="one scale per row, not per tensor"),
        Case("bits=2", (w,), {"bits": 2}, call="first_as_float", hidden=True, atol=1.0, rtol=0, hint=codes),
    ]


def _int8_linear(x, q, scales, bias):
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], q.shape[0])


def _int8_linear_cases(gen):
    w = torch.randn(24, 32, generator=gen) * torch.logspace(-1, 1, 24)[:, None]
    q, scales = _quantize_weight(w)
    bias = torch.randn(24, generator=gen)
    x3 = torch.randn(3, 5, 32, generator=gen)
    shapes = "reshape x to 2-D (rows, in_features) for the kernel and back afterwards; add the bias once"
    return [
        Case("values (3-D input, bias)", (x3, q, scales, bias), atol=0.05, rtol=0.02, hint=shapes),
        Case("output keeps the input's dtype", (x3, q, scales, bias), call="dtype_of",
             hint="the kernel returns its input's dtype; cast back with .to(x.dtype)"),
        Case("the kernel gets the activations of its fast path on this CPU", (x3, q, scales, bias),
             call="int8_kernel_path", expected="fast path", expect_value=True,
             hint="on x86 CPUs (AVX2, AVX512) the kernel is vectorized for bfloat16 activations only: fed fp32 "
                  "activations it is correct but runs a scalar loop (lesson 05's deep dive). Hand it bfloat16 "
                  "activations and scales; on ARM CPUs both dtypes are vectorized and either passes"),
        Case("no bias", (x3, q, scales, None), atol=0.05, rtol=0.02, hint="bias may be None"),
        Case("no bias, 2-D input", (torch.randn(6, 32, generator=gen), q, scales, None), atol=0.05, rtol=0.02,
             hidden=True, hint="bias may be None"),
        Case("batch 1 (a 1-row 2-D input)", (torch.randn(1, 32, generator=gen), q, scales, bias), atol=0.05,
             rtol=0.02, hidden=True, hint=shapes),
    ]


def _quantize_model(model):
    import copy

    from torch import nn

    class Int8Linear(nn.Module):
        def __init__(self, linear):
            super().__init__()
            q, scales = _quantize_weight(linear.weight.detach())
            self.register_buffer("q", q)
            self.register_buffer("scales", scales)
            self.register_buffer("bias", linear.bias.detach().clone())

        def forward(self, x):
            return _int8_linear(x, self.q, self.scales, self.bias)

    def swap(module):
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child))
            else:
                swap(child)
        return module
    return swap(copy.deepcopy(model))


def _quantize_model_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    return [
        Case("every nn.Linear replaced", (64, seed), call="linears_left", expected=0, expect_value=True,
             hint="a Linear inside a child module (a Sequential, a block) is a Linear too: the walk must reach "
                  "every level, and replace each one where its parent holds it"),
        Case("the fp32 model is left untouched", (64, seed), call="original_untouched", expected=True,
             expect_value=True, hint="the model you are given is the fp32 reference and must come back as it "
                                     "went in: replace the layers of a copy, not the caller's"),
        Case("argmax agrees with fp32 on 97% of inputs", (64, seed, 500), call="agreement_with_fp32", expected=True,
             expect_value=True, hint="one scale per output row (per channel): this model's rows differ by 1000x"),
        Case("at least 3x smaller", (64, seed), call="at_least_3x_smaller", expected=True, expect_value=True,
             hint="store int8 codes and one scale per row, not a float copy of the weight"),
        Case("a nested model: the Linears one level down", (64, seed), {"nested": True}, call="linears_left",
             expected=0, expect_value=True,
             hint="Linears left one level down: a child that is not an nn.Linear (a Sequential, a block) "
                  "may hold Linears, at any depth"),
        Case("another model, 97% agreement", (32, seed + 1, 500), call="agreement_with_fp32", expected=True,
             expect_value=True, hidden=True, hint="one scale per output row"),
        Case("another nested model", (32, seed + 2), {"nested": True}, call="linears_left", expected=0,
             expect_value=True, hidden=True,
             hint="Linears left one level down: a child that is not an nn.Linear (a Sequential, a block) "
                  "may hold Linears, at any depth"),
    ]


def _choose_plan():
    return {"fc1": ("channel", 4), "fc2": ("channel", 8), "fc3": ("channel", 8)}


def _plan_cases(gen):
    size = ("the bytes are the codes (bits / 8 per weight) plus 4 per scale: 8 bits on every layer is over the "
            "budget whatever the granularity, and a scale per group of 16 adds a quarter byte per weight. Spend "
            "the bits where a layer needs them, not everywhere")
    accuracy = ("for each layer, find where its weights' magnitudes spread (compare the largest magnitude of each "
                "row with that of each column): a scale per row absorbs a spread over rows (the "
                "output channels), while a spread over columns (the inputs) puts small and large weights in every "
                "row and every group of 16, where only more bits keep the small ones. plan_report's "
                "extra_wrong_alone measures each layer's choice on its own")
    valid = ("return a dict with the keys 'fc1', 'fc2', 'fc3', each mapped to (granularity, bits): granularity "
             "'tensor', 'channel' or 'group', bits 2, 4 or 8")
    return [
        Case("a (granularity, bits) for each layer", (), call="plan_is_valid",
             expected="a (granularity, bits) for each of fc1, fc2, fc3", expect_value=True, hint=valid),
        Case("weights within 23,000 bytes", (0,), call="plan_size", expected="within the size budget",
             expect_value=True, hint=size),
        Case("at most 4 more test images wrong than fp32", (0,), call="plan_accuracy",
             expected="within the accuracy budget", expect_value=True, hint=accuracy),
    ] + [Case(f"the same plan on the model trained with seed {seed}", (seed,), call="plan_accuracy",
              expected="within the accuracy budget", expect_value=True, hidden=seed != 4, hint=accuracy)
         for seed in (4, 1, 2, 3)]   # on seeds 0-4 the reference and the second solution lose at most 2 images


def _ship_plan(model, plan):
    import copy

    from helpers import quant
    shipped = copy.deepcopy(model)
    for name, (granularity, bits) in plan.items():
        linear = shipped.get_submodule(name)
        n, k = linear.weight.shape
        groups = [g for g in quant.INT4_GROUP_SIZES if k % g == 0]
        if bits <= 4 and n % 16 == 0 and groups:      # int4 where the kernel takes the shape
            group = groups[0] if granularity == "group" else groups[-1]   # a row's inputs in as few groups as allowed
            setattr(shipped, name, quant.Int4WeightOnlyLinear(*quant.quantize_int4_packed(linear.weight, group),
                                                              group, linear.bias))
        else:                                         # 8 bits, or a shape the int4 kernel refuses
            setattr(shipped, name, quant.Int8WeightOnlyLinear.from_linear(linear))
    return shipped


HEAD_AT_4 = {"fc1": ("channel", 4), "fc2": ("channel", 8), "fc3": ("channel", 4)}   # exercise 4 accepts it
OTHER_PLANS = ({"fc1": ("channel", 4), "fc2": ("tensor", 8), "fc3": ("group", 4)},
               {"fc1": ("channel", 4), "fc2": ("channel", 8), "fc3": ("tensor", 8)},
               {"fc1": ("channel", 4), "fc2": ("tensor", 8), "fc3": ("channel", 8)})


def _ship_cases(gen):
    kernels = ("each layer's forward runs one of the packed weight kernels on the weights as stored: a layer whose "
               "weights are dequantized to float for the matmul is not served by a kernel, nor is a float layer in "
               "another class. Where the int4 kernel refuses a layer's shape (out_features, or a group size it "
               "does not take or that does not divide in_features), the layer still needs a kernel")
    linears = ("a layer the int4 kernel refuses is still a layer of the plan: a float nn.Linear left in the model "
               "holds 4 bytes a weight and runs no packed kernel")
    untouched = "the model you are given stays the fp32 reference: ship a copy"
    size = ("the budget counts every tensor the shipped model holds: codes, scales and zero points as stored, "
            "biases. A layer the plan puts at 4 bits, stored at 8, costs twice its codes; a scale and zero per "
            "group (4 bytes in bf16) cost more the smaller the group, and the plan's granularity says how many "
            "a row needs; scales and zeros kept in fp32 cost twice the bf16 ones; codes kept unpacked, one to a "
            "byte or more, cost what the packed layout saves")
    accuracy = ("a layer the plan keeps at 8 bits needs them: at 4 bits its small weights round away, whatever "
                "the group size")
    output = ("the shipped model returns what the fp32 one does: 10 logits per image, in the input's dtype. A "
              "layer computed on a padded shape returns the padding's outputs too")
    expect = {"ship_linears_left": ("no nn.Linear left", linears),
              "ship_untouched": ("the given model untouched", untouched),
              "ship_kernels": ("each layer runs a packed kernel, no float matmul", kernels),
              "ship_output": ("logits [450, 10] torch.float32", output),
              "ship_bytes": ("within the budget", size),
              "ship_accuracy": ("within the accuracy budget", accuracy)}

    def case(name, args, call, **kwargs):
        expected, hint = expect[call]
        return Case(name, args, call=call, expected=expected, expect_value=True, hint=hint,
                    central=call == "ship_kernels", **kwargs)

    plan, head = _choose_plan(), "the same plan with the head at 4 bits, on seed 0"
    cases = [case("no nn.Linear left", (0, plan), "ship_linears_left"),
             case("the given model untouched", (0, plan), "ship_untouched"),
             case("each layer runs a packed kernel, no float matmul", (0, plan), "ship_kernels"),
             case("10 float32 logits per test image", (0, plan), "ship_output"),
             case("within 24,064 bytes held", (0, plan), "ship_bytes"),
             case("at most 4 more test images wrong than fp32", (0, plan), "ship_accuracy"),
             case(f"{head}: each layer runs a packed kernel", (0, HEAD_AT_4), "ship_kernels"),
             case(f"{head}: no nn.Linear left", (0, HEAD_AT_4), "ship_linears_left"),
             case(f"{head}: 10 float32 logits per test image", (0, HEAD_AT_4), "ship_output"),
             case(f"{head}: within 24,064 bytes held", (0, HEAD_AT_4), "ship_bytes"),
             case("the head at 4 bits, on the model trained with seed 4: accuracy", (4, HEAD_AT_4), "ship_accuracy")]
    named = {"ship_kernels": "each layer runs a packed kernel", "ship_linears_left": "no nn.Linear left",
             "ship_output": "10 float32 logits per test image", "ship_bytes": "within its budget",
             "ship_accuracy": "accuracy"}
    other = OTHER_PLANS[int(torch.randint(0, len(OTHER_PLANS), (), generator=gen))]
    cases += [case(f"another plan exercise 4 accepts, seed {seed}: {named[call]}", (seed, other), call, hidden=True)
              for seed in (1, 2, 3) for call in ("ship_kernels", "ship_bytes", "ship_accuracy")]
    # 96 wide: K = 96 takes the int4 kernel's groups of 32 only
    cases += [case(f"a network 96 wide, the head at 4 bits: {named[call]}", (0, HEAD_AT_4), call, hidden=True,
                   kwargs={"width": 96}) for call in named]
    return cases


SPEC = LabSpec("05_quantization_lab", (
    Exercise("Exercise 1: quantize_weight", "quantize_weight", _quantize_weight_cases, _quantize_weight,
             forbidden=("helpers.quant.quantize_per_channel", "helpers.quant.minmax_scale",
                        "helpers.quant.quantize", "quantize_per_channel", "fake_quantize_per_channel_affine"),
             refused="the quantizers of torch and helpers.quant compute the scales and codes for you: derive "
                     "each row's scale from its values and round to codes yourself"),
    Exercise("Exercise 2: int8_linear", "int8_linear", _int8_linear_cases, _int8_linear,
             forbidden=("helpers.quant.Int8WeightOnlyLinear", "helpers.grading.harnesses.lab05.int8_linear"),
             refused="helpers.quant.Int8WeightOnlyLinear is the layer exercise 3 wraps around this function, and "
                     "the grader's int8_linear is this exercise's answer: call the int8 kernel yourself; which "
                     "activations to hand it is this exercise's decision"),
    Exercise("Exercise 3: quantize_model", "quantize_model", _quantize_model_cases, _quantize_model,
             forbidden=("helpers.quant.swap_linears", "helpers.quant.Int8WeightOnlyLinear",
                        "torch.ao.quantization.quantize_dynamic", "torch.ao.quantization.quantize_dynamic_jit",
                        "quantize_per_channel", "quantize_per_tensor",
                        "quantize_per_tensor_dynamic"),
             refused="the library quantizers find and swap the layers for you: find every nn.Linear, nested ones"
                     " included, and replace it yourself",
             substitutes=(("quantize_weight", "helpers.quant.quantize_per_channel"),
                          ("int8_linear", "helpers.grading.harnesses.lab05.int8_linear"))),
    Exercise("Exercise 4: a plan under two budgets", "choose_plan", _plan_cases, _choose_plan, needs=("sklearn",)),
    Exercise("Exercise 5: ship the plan on packed kernels", "ship_plan", _ship_cases, _ship_plan, needs=("sklearn",),
             # MyInt8Linear, built on exercises 1 and 2, runs with right ones: a mistake there costs marks once
             substitutes=(("quantize_weight", "helpers.quant.quantize_per_channel"),
                          ("int8_linear", "helpers.grading.harnesses.lab05.int8_linear"))),
))
