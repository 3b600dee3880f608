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
              "The op's fake kernel and autograd formula are the reference's here, whatever exercises 2 and 3 "
              "registered")
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


STABLE_SOURCE = r"""// silu_mul against the LibTorch stable ABI: only torch/csrc/stable and torch/headeronly headers.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/macros/Macros.h>

#include <cmath>
#include <type_traits>

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

template <typename scalar_t>
void silu_mul_chunk(const scalar_t* gate, const scalar_t* up, scalar_t* out, int64_t begin, int64_t end) {
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
}

template <typename scalar_t>
void run(const Tensor& g, const Tensor& u, Tensor& out) {
  const scalar_t* gp = g.const_data_ptr<scalar_t>();
  const scalar_t* up = u.const_data_ptr<scalar_t>();
  scalar_t* op = out.mutable_data_ptr<scalar_t>();
  torch::stable::parallel_for(0, g.numel(), 4096, [&](int64_t begin, int64_t end) {
    silu_mul_chunk<scalar_t>(gp, up, op, begin, end);
  });
}

Tensor silu_mul_stable(const Tensor& gate, const Tensor& up) {
  STD_TORCH_CHECK(gate.dim() == up.dim(), "silu_mul: gate and up must have the same shape");
  for (int64_t d = 0; d < gate.dim(); ++d) {
    STD_TORCH_CHECK(gate.size(d) == up.size(d), "silu_mul: gate and up must have the same shape");
  }
  STD_TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "silu_mul: gate and up must have the same dtype");
  const Tensor g = torch::stable::contiguous(gate);
  const Tensor u = torch::stable::contiguous(up);
  Tensor out = torch::stable::empty_like(g);
  THO_DISPATCH_SWITCH(g.scalar_type(), "silu_mul_stable",
      THO_DISPATCH_CASE(ScalarType::Float, [&] { run<scalar_t>(g, u, out); })
      THO_DISPATCH_CASE(ScalarType::Double, [&] { run<scalar_t>(g, u, out); })
      THO_DISPATCH_CASE(ScalarType::BFloat16, [&] { run<scalar_t>(g, u, out); })
      THO_DISPATCH_CASE(ScalarType::Half, [&] { run<scalar_t>(g, u, out); }));
  return out;
}

STABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {
  m.impl("silu_mul", TORCH_BOX(&silu_mul_stable));
}
"""


def _stable_cases(gen):
    headers = ("a build that targets a torch version may include the stable ABI alone, the headers under "
               "torch/csrc/stable and torch/headeronly: every other torch header stops it with an #error. Each "
               "classic name the kernel used has a counterpart there or in plain C++ (the lesson's "
               "rms_norm_stable.cpp uses several)")
    macro = ("TORCH_LIBRARY_IMPL comes from torch/library.h, outside the stable ABI: a stable library registers "
             "with STABLE_TORCH_LIBRARY_IMPL (torch/csrc/stable/library.h)")
    adds = ("labs_ext and its op silu_mul are defined already (from Python, as for exercise 1): the library only adds "
            "a kernel to them, in the stable ABI's block for one namespace and one dispatch key, the namespace being "
            "labs_ext. STABLE_TORCH_LIBRARY (and _FRAGMENT) define a namespace's ops: a second definition of "
            "labs_ext crashes the process that loads it, and a kernel added to another namespace is not silu_mul's")
    boxed = ("a stable library's m.impl takes a boxed kernel, one that reads its arguments from a stack of "
             "StableIValues: TORCH_BOX(&your_function) makes one from a plain C++ function")
    builds = ("the compiler's first error names what the stable headers lack: the classic TORCH_CHECK, "
              "AT_DISPATCH_* and at::opmath_type are not there. rms_norm_stable.cpp shows the stable check; a "
              "dtype dispatch and an accumulation type you can write in plain C++ (a switch on scalar_type(), a "
              "template)")
    registered = ("labs_ext::silu_mul and its schema exist already (defined from Python, as for exercise 1): "
                  "the library adds only the CPU kernel, in a block for labs_ext and the CPU dispatch key, "
                  "registered under the op's name, silu_mul. Defining the namespace again (STABLE_TORCH_LIBRARY) "
                  "crashes the process that loads it")
    imports = ("the library imports C++ functions of libtorch, and a later torch that changes or drops any one of "
               "them cannot load it: keep TORCH_TARGET_VERSION defined and every classic header out, and let the "
               "#error tell you which name to replace")
    threads = ("the classic kernel split its elements over torch's intra-op threads with at::parallel_for: keep "
               "that split, with the stable ABI's parallel_for, so torch.set_num_threads still governs it")
    chunks = ("the stable ABI's parallel_for calls your callback once per chunk [begin, end) of the range, from "
              "several threads at once: a callback that ignores its arguments computes every element in every call "
              "(as many times over as there are threads, the values still right), and one that counts its chunk "
              "from 0 computes other chunks' elements. Each call computes the elements of its own chunk, and only "
              "those")
    values = "out = silu(gate) * up, element by element, over every element of the (contiguous) inputs"
    low = ("the op takes the four dtypes the classic kernel dispatched on (float, double, BFloat16, Half) and "
           "computes BFloat16 and Half in float, converting the result back once")
    double = ("compute float64 in double: at::opmath_type is not in the stable headers, so choose the accumulation "
              "type per scalar type yourself (float for the 16-bit types and float, double for double)")
    strided = ("the classic wrapper made both inputs contiguous before its flat loop and allocated out from the "
               "contiguous gate: a transposed gate's elements are not in row order in memory")
    reject = ("reject what the classic wrapper rejected, gates and ups of different shapes or dtypes, with a "
              "check that raises (a RuntimeError in Python)")
    schema = ("opcheck's test_schema found an input written or returned: the kernel must allocate its output "
              "(the stable contiguous returns a contiguous input itself, not a copy)")
    tolerance = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 1e-2}

    def values_case(name, shape, dtype, hint, hidden=False):
        gate, up = (torch.randn(shape, generator=gen) * 4).to(dtype), torch.randn(shape, generator=gen).to(dtype)
        return Case(name, (gate, up), call="stable_silu_mul", atol=tolerance[dtype], rtol=tolerance[dtype],
                    hidden=hidden, hint=hint)

    def said(name, call, expected, hint, args=(), **kwargs):
        return Case(name, args, call=call, expected=expected, expect_value=True, hint=hint, **kwargs)
    opcheck = "every opcheck test passes"
    return [
        said("includes only stable-ABI headers", "stable_headers", "only torch/csrc/stable and torch/headeronly "
             "headers", headers),
        said("registers with the stable ABI's macro", "stable_macro", "registers with the stable ABI's macro",
             macro),
        said("adds a kernel to labs_ext, defines no namespace", "stable_adds",
             "adds a kernel to labs_ext, defines no namespace", adds),
        said("hands m.impl a boxed kernel", "stable_boxed", "hands m.impl a boxed kernel", boxed),
        said("builds and loads (TORCH_TARGET_VERSION 2.10.0)", "stable_builds", "builds and loads", builds),
        said("adds the CPU kernel of labs_ext::silu_mul", "stable_registered",
             "adds the CPU kernel of labs_ext::silu_mul", registered),
        said("imports no C++ symbol of libtorch", "stable_imports", "no C++ symbol of libtorch", imports,
             central=True),
        said("splits the work over torch's threads", "stable_threads", "splits the work with torch's parallel_for",
             threads),
        values_case("float32 (7,)", (7,), torch.float32, values),
        values_case("bfloat16 (2, 5, 129)", (2, 5, 129), torch.bfloat16, low),
        values_case("float16 (3, 33)", (3, 33), torch.float16, low),
        values_case("float64 (3, 33), to 1e-10", (3, 33), torch.float64, double),
        Case("a transposed gate", (torch.randn(40, 30, generator=gen).t(), torch.randn(30, 40, generator=gen)),
             call="stable_silu_mul", hint=strided),
        Case("different shapes are rejected", (torch.randn(3, 4, generator=gen), torch.randn(3, 5, generator=gen)),
             call="stable_silu_mul", raises="RuntimeError", hint=reject),
        said("each chunk computes only its own range [begin, end)", "stable_chunks",
             "each element computed in one chunk, and every element in one", chunks, args=(4099,)),
        said("opcheck passes (float32, 3 x 5)", "stable_opcheck", opcheck, schema, args=((3, 5), "float32")),
        values_case("no elements", (0, 5), torch.float32, values, hidden=True),
        values_case("one element, float16", (1,), torch.float16, low, hidden=True),
        values_case("4099 elements on two threads (two chunks)", (4099,), torch.float32, values, hidden=True),
        Case("a permuted 3-D gate", (torch.randn(4, 2, 3, generator=gen).permute(1, 2, 0),
                                     torch.randn(2, 3, 4, generator=gen)), call="stable_silu_mul", hidden=True,
             hint=strided),
        Case("different dtypes are rejected", (torch.randn(3, 5, generator=gen),
                                               torch.randn(3, 5, generator=gen, dtype=torch.float64)),
             call="stable_silu_mul", raises="RuntimeError", hidden=True, hint=reject),
        said("opcheck passes (bfloat16, 2 x 3 x 4)", "stable_opcheck", opcheck, schema, args=((2, 3, 4), "bfloat16"),
             hidden=True),
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
    Exercise("Exercise 6: the kernel against the stable ABI", "silu_mul_stable_source", _stable_cases,
             lambda: STABLE_SOURCE, needs=("cxx", "ninja"),
             crashed="a kernel that crashes the process has read or written memory it does not own: an index past "
                     "numel(), a data pointer of another dtype than the tensor's, or an input used before it was "
                     "made contiguous"),
), allow_processes=True)
