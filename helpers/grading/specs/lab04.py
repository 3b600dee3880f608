"""Lab 04 (the C++ custom op): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.specs.core import Case, Exercise, LabSpec


KERNEL_BODY = r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
"""


def _kernel_cases(gen):
    hint = ("each call sees only its chunk [begin, end); compute in acc_t (float for bf16/fp16) and convert the "
            "result back to scalar_t once")
    cases = []
    tolerance = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 1e-2}
    for shape, dtype, hidden in (((7,), torch.float32, False), ((3, 33), torch.float64, False),
                                 ((2, 5, 129), torch.bfloat16, False), ((4099,), torch.float32, False),
                                 ((0, 5), torch.float32, True), ((1,), torch.float16, True),
                                 ((65, 70), torch.float16, True)):
        gate, up = (torch.randn(shape, generator=gen) * 4).to(dtype), torch.randn(shape, generator=gen).to(dtype)
        cases.append(Case(f"shape {shape}, {dtype}", (gate, up), call="silu_mul_kernel", hidden=hidden,
                          atol=tolerance[dtype], rtol=tolerance[dtype], hint=hint))
    chunk = ("at::parallel_for hands each call one chunk [begin, end): a loop that starts at 0 (or runs "
             "end - begin times from 0) writes other chunks' elements too, from another thread; index from begin")
    cases.insert(4, Case("one chunk [2050, 4099) of 4099 writes only its own elements", (4099, 2050, 4099),
                         call="chunk_writes", expected=[2050, 4099, 2049], expect_value=True, hint=chunk))
    cases.append(Case("a chunk [4096, 8192) writes only its own elements", (8192, 4096, 8192), call="chunk_writes",
                      expected=[4096, 8192, 4096], expect_value=True, hidden=True, hint=chunk))
    cases.append(Case("a transposed (non-contiguous) gate", (torch.randn(40, 30, generator=gen).t(),
                                                              torch.randn(30, 40, generator=gen)),
                      call="silu_mul_kernel", hidden=True, hint=hint))
    return cases


def _kernel_reference(gate, up):
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (torch.nn.functional.silu(gate.to(acc)) * up.to(acc)).to(gate.dtype).contiguous()


def _fake(gate, up):
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def _fake_cases(gen):
    strides = ("allocate what the C++ wrapper allocates: a contiguous tensor of gate's shape and dtype, also "
               "when gate is transposed or permuted (empty_like copies gate's strides unless told which memory "
               "format to use)")
    reject = "raise ValueError when the shapes or the dtypes differ, as the C++ wrapper refuses them"
    e = torch.empty
    return [
        Case("shape, strides and dtype", (e(3, 5), e(3, 5)), call="on_meta", hint=strides),
        Case("a transposed gate gives a contiguous output", (e(5, 3).t(), e(3, 5)), call="on_meta", hint=strides),
        Case("different shapes are rejected", (e(3, 5), e(3, 4)), call="on_meta", raises="ValueError", hint=reject),
        Case("different dtypes are rejected", (e(3, 5), e(3, 5, dtype=torch.float64)), call="on_meta",
             raises="ValueError", hint=reject),
        Case("bfloat16 inputs give a bfloat16 output", (e(3, 5, dtype=torch.bfloat16), e(3, 5, dtype=torch.bfloat16)),
             call="on_meta", hint=strides),
        Case("3-D bfloat16", (e(2, 3, 4, dtype=torch.bfloat16), e(2, 3, 4, dtype=torch.bfloat16)), call="on_meta",
             hidden=True, hint=strides),
        Case("a permuted 3-D gate", (e(4, 2, 3).permute(1, 2, 0), e(2, 3, 4)), call="on_meta", hidden=True,
             hint=strides),
        Case("no elements", (e(0, 7), e(0, 7)), call="on_meta", hidden=True, hint=strides),
    ]


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


def _backward_cases(gen):
    hint = ("out = g * s * up with s = sigmoid(g) and ds/dg = s * (1 - s): d/dgate is the product rule on g * s, "
            "times up; d/dup is silu(g); multiply both by grad and return them in schema order (gate, up)")
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=gen, dtype=dtype)   # noqa: E731
    return [
        Case("gradients of gate and up", (r(4, 6) * 3, r(4, 6), r(4, 6)), call="backward_of", hint=hint),
        Case("float64", (r(5, dtype=torch.float64), r(5, dtype=torch.float64), r(5, dtype=torch.float64)),
             call="backward_of", atol=1e-10, rtol=1e-10, hint=hint),
        Case("large gates (no overflow)", (r(8) * 100, r(8), r(8)), call="backward_of", hint=hint),
        Case("gate of zeros", (torch.zeros(3, 3), r(3, 3), r(3, 3)), call="backward_of", hidden=True, hint=hint),
        Case("large gates, 2-D", (r(4, 5) * 300, r(4, 5), r(4, 5)), call="backward_of", hidden=True, hint=hint),
        Case("float64, 3-D", (r(2, 3, 4, dtype=torch.float64), r(2, 3, 4, dtype=torch.float64),
                              r(2, 3, 4, dtype=torch.float64)), call="backward_of", hidden=True, atol=1e-10,
             rtol=1e-10, hint=hint),
    ]


def _swiglu(x, w_gate, w_up, w_down):
    import torch.nn.functional as F
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def _swiglu_cases(gen):
    def weights(d, f):
        return (torch.randn(4, d, generator=gen), torch.randn(f, d, generator=gen) / 3,
                torch.randn(f, d, generator=gen) / 3, torch.randn(d, f, generator=gen) / 3)
    hint = ("silu_mul's first argument goes through the SiLU (the gate projection), its second multiplies it "
            "(the up projection); the down projection comes last, on the product")
    traced = ("torch.compile(fullgraph=True) could not trace your function in one graph, or its values or "
              "gradients differ. Look first in swiglu_mlp for Python that needs a tensor's value while tracing "
              "(.item(), .tolist(), bool() or an `if` on a tensor, printing a tensor): each is a graph break. "
              "Only if the error names the fake kernel or the backward is it exercise 2 or 3 (this check uses "
              "the ones your notebook registered)")
    return [
        Case("values", weights(8, 12), call="swiglu_values", atol=1e-4, hint=hint),
        Case("calls labs_ext.silu_mul", weights(8, 12), call="uses_silu_mul", expected=True, expect_value=True,
             hint="call torch.ops.labs_ext.silu_mul, not F.silu(...) * ...: the exercise is about your op"),
        Case("compiled with fullgraph=True: values and gradients", weights(8, 12), call="compiled_with_grads",
             atol=1e-4, hint=traced),
        Case("compiled, other sizes", weights(5, 7), call="compiled_with_grads", hidden=True, atol=1e-4, hint=traced),
    ]


RECORD_SCHEMA = "(Tensor(a!) gate, Tensor up, Tensor(b!) out, Tensor(c!) amax) -> ()"


def _record_schema_cases(gen):
    form = ("write the argument list only, from '(' on: the op's name is added for you. Keep the kernel's "
            "argument names in its order (gate, up, out, amax), each a Tensor")
    returns = ("the kernel returns None: an op that only writes its arguments has no value of its own to "
               "return, and its schema says so with '-> ()'")
    aliased = ("torch.compile refuses a custom op whose output aliases one of its inputs (opcheck's "
               "test_aot_dispatch_dynamic): the caller already holds every tensor the kernel writes")
    undeclared = ("opcheck's test_schema ran the kernel and found an argument written that the schema does not "
                  "declare as written: each one needs an alias annotation with '!'. Read the "
                  "kernel line by line: copy_, an in-place method (its name ends in _) and out= all write, "
                  "whatever the argument's name says it is for")
    extra = ("declare only the arguments the kernel writes: under torch.compile every argument declared as "
             "written is cloned and written back (auto_functionalized), so one it only reads costs a copy")
    letters = ("an alias letter names a set of tensors that may share memory: one letter on two arguments "
               "declares that they may be the same tensor. The kernel's written arguments are different "
               "tensors: give each a letter of its own")
    return [
        Case("the kernel's arguments, by name and in order", (), call="record_arguments",
             expected="gate, up, out, amax", expect_value=True, hint=form),
        Case("what the op returns", (), call="record_returns", expected="returns nothing", expect_value=True,
             hint=returns),
        Case("no output aliases an argument", (), call="record_aliased_returns",
             expected="no output aliases an argument", expect_value=True, hint=aliased),
        Case("opcheck passes (float32, 3 x 5)", ((3, 5), "float32"), call="record_opcheck",
             expected="every opcheck test passes", expect_value=True, hint=undeclared),
        Case("declares exactly the arguments the kernel writes", (), call="record_declarations",
             expected="declares exactly the arguments the kernel writes", expect_value=True, hint=extra,
             central=True),
        Case("alias letters", (), call="record_letters", expected="a letter of its own for each written argument",
             expect_value=True, hint=letters),
        Case("opcheck passes (bfloat16, 2 x 3 x 4)", ((2, 3, 4), "bfloat16"), call="record_opcheck",
             expected="every opcheck test passes", expect_value=True, hidden=True, hint=undeclared),
        Case("opcheck passes (float64, 7)", ((7,), "float64"), call="record_opcheck",
             expected="every opcheck test passes", expect_value=True, hidden=True, hint=undeclared),
    ]


SPEC = LabSpec("04_custom_op_lab", (
    Exercise("Exercise 1: the C++ kernel body", "silu_mul_body", _kernel_cases,
             lambda: KERNEL_BODY, needs=("cxx", "ninja"),
             crashed="a kernel that crashes the process has read or written memory it does not own: each call "
                     "of silu_mul_chunk gets its own chunk [begin, end) and touches no index outside it, in out or "
                     "in the inputs"),
    Exercise("Exercise 2: the fake kernel", "silu_mul_fake", _fake_cases, _fake),
    Exercise("Exercise 3: the autograd formula", "backward", _backward_cases, _backward,
             forbidden=("silu", "silu_backward", "sigmoid_backward"),
             refused="F.silu, silu_backward and sigmoid_backward are the formula you are asked to write: build "
                     "both gradients on torch.sigmoid with the product rule"),
    Exercise("Exercise 4: SwiGLU with the op", "swiglu_mlp", _swiglu_cases, _swiglu),
    Exercise("Exercise 5: the schema of an op that writes", "silu_mul_record_schema", _record_schema_cases,
             lambda: RECORD_SCHEMA),
), allow_processes=True)
