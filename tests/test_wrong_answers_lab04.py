"""Lab 04 (the C++ custom op): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.grading.specs import lab04 as spec04
from wrong_answers import FORBIDDEN_HINT, L04, REPO, Wrong, lab_tests, run_cases, run_in_child, solution_namespace


BODIES = {
    # forgets to multiply by up
    "silu_without_up": r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)));
  }
""",
    # sigmoid(g) * up instead of silu(g) * up
    "sigmoid_not_silu": r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(acc_t(1) / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
""",
    # computes in float, not acc_t: float64 inputs lose their precision
    "float_not_acc_t": r"""
  for (int64_t i = begin; i < end; ++i) {
    const float g = static_cast<float>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (1.0f + std::exp(-g)) * static_cast<float>(up[i]));
  }
""",
    # indexes each chunk from 0: a chunk after the first rewrites the first one's elements, not its own
    # the classic chunking bug: from 0 to end, so a later chunk rewrites the earlier chunks' elements
    "zero_to_end": r"""
  for (int64_t i = 0; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
""",
    # does nothing: out is left as allocated
    "empty_body": r"""
  (void)gate; (void)up; (void)out; (void)begin; (void)end;
""",
    "chunk_from_zero": r"""
  for (int64_t i = 0; i < end - begin; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
""",
}


# a right answer written differently: a pointer walk, the sigmoid through 1 / (1 + exp(-g)), while loop
SECOND_BODY = r"""
  const scalar_t* g_ptr = gate + begin;
  const scalar_t* u_ptr = up + begin;
  scalar_t* o_ptr = out + begin;
  int64_t left = end - begin;
  while (left-- > 0) {
    const acc_t g = static_cast<acc_t>(*g_ptr++);
    const acc_t sig = acc_t(1) / (acc_t(1) + std::exp(-g));
    *o_ptr++ = static_cast<scalar_t>(g * sig * static_cast<acc_t>(*u_ptr++));
  }
"""


def fake_second_solution(gate, up):
    # a right answer written differently: new_empty of the shape (always contiguous), TypeError-free checks
    if tuple(gate.shape) != tuple(up.shape):
        raise ValueError(f"silu_mul: shapes {tuple(gate.shape)} and {tuple(up.shape)} differ")
    if gate.dtype is not up.dtype:
        raise ValueError(f"silu_mul: dtypes {gate.dtype} and {up.dtype} differ")
    return gate.new_empty(gate.shape)


def backward_second_solution(ctx, grad):
    # a right answer written differently: silu(g) and its derivative s + silu(g) * (1 - s)
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    silu = gate * s
    return grad * up * (s + silu * (1 - s)), grad * silu


def swiglu_second_solution(x, w_gate, w_up, w_down):
    # a right answer written differently: torch.matmul with transposes, F.linear for the down projection
    gate = torch.matmul(x, w_gate.transpose(0, 1))
    up = F.linear(x, w_up)
    return F.linear(torch.ops.labs_ext.silu_mul(gate, up), w_down)


def port(*replacements: tuple[str, str]) -> str:
    """The solution's stable-ABI source with each (old, new) text replaced (each old is in it)."""
    source = spec04.STABLE_SOURCE
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    return source


CLASSIC_PARALLEL = (("#include <cmath>", "#include <ATen/Parallel.h>\n\n#include <cmath>"),
                    ("torch::stable::parallel_for(", "at::parallel_for("))
STABLE_REGISTRATION = 'STABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {\n  m.impl("silu_mul", TORCH_BOX(&silu_mul_stable));'
SHAPE_CHECKS = """  STD_TORCH_CHECK(gate.dim() == up.dim(), "silu_mul: gate and up must have the same shape");
  for (int64_t d = 0; d < gate.dim(); ++d) {
    STD_TORCH_CHECK(gate.size(d) == up.size(d), "silu_mul: gate and up must have the same shape");
  }
"""
PARALLEL_LOOP = ("torch::stable::parallel_for(0, g.numel(), 4096, [&](int64_t begin, int64_t end) {\n"
                 "    silu_mul_chunk<scalar_t>(gp, up, op, begin, end);\n  });")
STABLE_SOURCES = {
    # at::parallel_for kept, with its classic header
    "classic-parallel-for": port(*CLASSIC_PARALLEL),
    # the classic registration macro and a plain function
    "torch-library-impl": port((STABLE_REGISTRATION,
                                'TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {\n  m.impl("silu_mul", &silu_mul_stable);')),
    # m.impl handed the plain function, without TORCH_BOX
    "no-torch-box": port(("TORCH_BOX(&silu_mul_stable)", "&silu_mul_stable")),
    # the classic TORCH_CHECK kept
    "torch-check": spec04.STABLE_SOURCE.replace("STD_TORCH_CHECK", "TORCH_CHECK"),
    # rms_norm_stable.cpp's STABLE_TORCH_LIBRARY block copied: defines the op's namespace a second time
    "defines-the-op": port(("STABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {",
                            'STABLE_TORCH_LIBRARY(labs_ext, m) {\n  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");'
                            "\n}\n\nSTABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {")),
    # the block that defines a namespace, used to add the kernel
    "library-for-impl": port(("STABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m)", "STABLE_TORCH_LIBRARY(labs_ext, m)")),
    # the kernel added to a namespace of its own
    "other-namespace": port(("STABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m)",
                             "STABLE_TORCH_LIBRARY_IMPL(labs_ext_stable, CPU, m)")),
    # the #error silenced: the target undefined, the classic header and parallel_for back
    "undef-target": "#undef TORCH_TARGET_VERSION\n" + port(*CLASSIC_PARALLEL),
    # one plain loop over every element: no thread split
    "serial": port((PARALLEL_LOOP, "silu_mul_chunk<scalar_t>(gp, up, op, 0, g.numel());")),
    # parallel_for kept, its callback computing the whole tensor whatever chunk it is handed: right values, each
    # computed once per chunk
    "ignores-chunk": port((PARALLEL_LOOP, "const int64_t n = g.numel();\n"
                           "  torch::stable::parallel_for(0, n, 4096, [&](int64_t, int64_t) {\n"
                           "    silu_mul_chunk<scalar_t>(gp, up, op, 0, n);\n  });")),
    # exercise 1's classic mistake: the chunk counted from 0, so a later chunk computes the first elements again
    "chunk-from-zero": port(("for (int64_t i = begin; i < end; ++i)", "for (int64_t i = 0; i < end - begin; ++i)")),
    # float32 only, as rms_norm_stable.cpp
    "float-only": port(*[(f"      THO_DISPATCH_CASE(ScalarType::{t}, [&] {{ run<scalar_t>(g, u, out); }})\n", "")
                         for t in ("Double", "BFloat16")],
                       ("      THO_DISPATCH_CASE(ScalarType::Half, [&] { run<scalar_t>(g, u, out); })", "")),
    # float for every dtype, double included
    "float-acc": port(("std::conditional_t<std::is_same_v<scalar_t, double>, double, float>", "float")),
    # the flat loop on the inputs as they come
    "no-contiguous": port(("const Tensor g = torch::stable::contiguous(gate);", "const Tensor g = gate;"),
                          ("const Tensor u = torch::stable::contiguous(up);", "const Tensor u = up;")),
    # no shape check: gate (3, 4) and up (3, 5) are multiplied element by element in memory order
    "no-shape-check": port((SHAPE_CHECKS, "")),
    # contiguous taken for a copy: a contiguous gate is returned as itself, and the kernel writes it
    "output-aliases-gate": port(("Tensor out = torch::stable::empty_like(g);",
                                 "Tensor out = torch::stable::contiguous(gate);")),
}

# a right port written differently: a switch on the dtype, the accumulation type by overload, new_empty
SECOND_STABLE_SOURCE = r"""// A second port: a switch on the dtype, an accumulation type by overload, the output from new_empty.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/macros/Macros.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cmath>

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

float widen(c10::BFloat16 v) { return static_cast<float>(v); }
float widen(c10::Half v) { return static_cast<float>(v); }
float widen(float v) { return v; }
double widen(double v) { return v; }

template <typename T>
void silu_mul_typed(const Tensor& gate, const Tensor& up, Tensor& out) {
  const T* g = gate.const_data_ptr<T>();
  const T* u = up.const_data_ptr<T>();
  T* o = out.mutable_data_ptr<T>();
  torch::stable::parallel_for(0, out.numel(), 2048, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto x = widen(g[i]);
      const auto sig = decltype(x)(1) / (decltype(x)(1) + std::exp(-x));
      o[i] = static_cast<T>(x * sig * widen(u[i]));
    }
  });
}

Tensor silu_mul_port(const Tensor& gate, const Tensor& up) {
  STD_TORCH_CHECK(gate.sizes().equals(up.sizes()), "silu_mul: gate and up differ in shape");
  STD_TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "silu_mul: gate and up differ in dtype");
  Tensor g = torch::stable::contiguous(gate);
  Tensor u = torch::stable::contiguous(up);
  Tensor out = torch::stable::new_empty(g, g.sizes());
  switch (g.scalar_type()) {
    case ScalarType::Float: silu_mul_typed<float>(g, u, out); break;
    case ScalarType::Double: silu_mul_typed<double>(g, u, out); break;
    case ScalarType::BFloat16: silu_mul_typed<c10::BFloat16>(g, u, out); break;
    case ScalarType::Half: silu_mul_typed<c10::Half>(g, u, out); break;
    default: STD_TORCH_CHECK(false, "silu_mul: float, double, bfloat16 or half only");
  }
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(labs_ext, CPU, m) {
  m.impl("silu_mul", TORCH_BOX(&silu_mul_port));
}
"""


def stable_source(source: str) -> str:
    return f"def silu_mul_stable_source():\n    return {source!r}\n"


@pytest.fixture(scope="module")
def stable_results(tmp_path_factory):
    """Every silu_mul_stable_source candidate (the solution notebook's, a second port, the wrong ones) built and
    run in one child process."""
    candidates = {"solution": stable_source(solution_namespace(L04)["silu_mul_stable_source"]()),
                  "second_solution": stable_source(SECOND_STABLE_SOURCE)}
    candidates.update({name: stable_source(source) for name, source in STABLE_SOURCES.items()})
    return run_in_child(L04, "silu_mul_stable_source", candidates, tmp_path_factory.mktemp("stable"))


@pytest.mark.slow
def test_second_stable_port_gets_full_marks(stable_results):
    assert stable_results["second_solution"] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STABLE_SOURCES))
def test_stable_feedback_opens_with_the_mistake(name, stable_results):
    """The first case a wrong port fails (the one check() stops at) is the one whose hint names its mistake."""
    row = next(w for w in WRONG if w.function == "silu_mul_stable_source" and w.name == name)
    assert stable_results[name][0][0] == row.case


def test_a_wrong_fake_or_backward_costs_marks_in_its_own_exercise_only():
    """Exercise 4 compiles the learner's swiglu_mlp with the reference's fake kernel and autograd formula, not
    the ones the notebook registered: a wrong backward (or fake kernel) fails exercise 3 (or 2) and no case of
    exercise 4; the notebook's registrations are back afterwards."""
    from helpers.ext import lab as _defines_the_op   # noqa: F401
    op = torch.ops.labs_ext.silu_mul.default
    lib = torch.library.Library("labs_ext", "FRAGMENT")
    torch.library.register_fake("labs_ext::silu_mul", lambda gate, up: gate.new_empty(()), lib=lib,
                                allow_override=True)
    wrong = torch._library.autograd.make_autograd_impl(op, torch._library.autograd.Info(
        backward_missing_term, lambda ctx, inputs, output: ctx.save_for_backward(*inputs)))
    lib.impl("silu_mul", wrong, "Autograd", with_keyset=True, allow_override=True)
    try:
        assert run_cases(L04, backward_missing_term, "backward") != []
        assert run_cases(L04, solution_namespace(L04)["swiglu_mlp"], "swiglu_mlp") == []
        assert op(torch.empty(3, 4, device="meta"), torch.empty(3, 4, device="meta")).shape == ()
    finally:
        lib._destroy()


def test_the_notebook_shows_the_graders_kernel_from_a_learners_module():
    """Exercise 5's kernel is helpers.ext.lab's, the one the grader's harness defines the op with; the notebook
    imports nothing from the grader's harnesses."""
    from helpers.ext import lab
    from helpers.grading.harnesses import lab04
    assert lab04.silu_mul_record_kernel is lab.silu_mul_record_kernel
    for notebook in ("labs/solutions/04_custom_op_lab.ipynb", "labs/04_custom_op_lab.ipynb"):
        text = (REPO / notebook).read_text()
        assert "inspect.getsource(lab.silu_mul_record_kernel)" in text and "helpers.grading.harnesses" not in text


def record_schema_second_solution():
    # a right answer written differently: out and amax keyword-only (the out= convention), other alias letters
    return "(Tensor(g!) gate, Tensor up, *, Tensor(o!) out, Tensor(m!) amax) -> ()"


@pytest.mark.slow
def test_second_kernel_body_gets_full_marks(kernel_results):
    assert kernel_results["second_solution"] == []


def body_source(body: str) -> str:
    return f"def silu_mul_body():\n    return {body!r}\n"


def fake_keeps_strides(gate, up):
    # empty_like keeps a transposed gate's strides; the C++ wrapper returns a contiguous tensor
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate)


def fake_no_checks(gate, up):
    # allocates without checking the inputs: torch.compile traces calls the kernel would refuse
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def fake_shape_check_only(gate, up):
    # checks the shapes, not the dtypes
    if gate.shape != up.shape:
        raise ValueError("silu_mul: gate and up must have the same shape")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def fake_default_dtype(gate, up):
    # torch.empty(shape): the default dtype (float32), not gate's
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty(gate.shape, device=gate.device)


def fake_runtime_error(gate, up):
    # raises RuntimeError, which the case does not accept as the C++ wrapper's refusal
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise RuntimeError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def backward_missing_term(ctx, grad):
    # d/dgate without the g * (1 - s) term (the derivative of sigmoid, not of silu)
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s, grad * gate * s


def backward_swapped(ctx, grad):
    # returns (d_up, d_gate): not in the schema's order
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * gate * s, grad * up * s * (1 + gate * (1 - s))


def backward_ignores_grad(ctx, grad):
    # forgets to multiply by the incoming gradient
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return up * s * (1 + gate * (1 - s)), gate * s


def backward_exp_sigmoid(ctx, grad):
    # sigmoid as exp(g) / (1 + exp(g)): inf / inf for large gates
    gate, up = ctx.saved_tensors
    s = torch.exp(gate) / (1 + torch.exp(gate))
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


def backward_calls_silu_backward(ctx, grad):
    # aten's silu_backward: the formula the exercise asks to write
    gate, up = ctx.saved_tensors
    return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


def swiglu_plain_silu(x, w_gate, w_up, w_down):
    # F.silu(...) * ...: correct values, but not the op the lab built
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def swiglu_swapped(x, w_gate, w_up, w_down):
    # gate and up swapped in the op's call
    return torch.ops.labs_ext.silu_mul(x @ w_up.T, x @ w_gate.T) @ w_down.T


def swiglu_data_dependent(x, w_gate, w_up, w_down):
    # a data-dependent Python branch: a graph break under fullgraph=True
    gate = x @ w_gate.T
    if gate.abs().max().item() > 1e6:
        gate = gate.clamp(-1e6, 1e6)
    return torch.ops.labs_ext.silu_mul(gate, x @ w_up.T) @ w_down.T


def swiglu_no_down(x, w_gate, w_up, w_down):
    # w_down ([d, f]) used untransposed, like the input projections' weights: a shape error
    return torch.ops.labs_ext.silu_mul(x @ w_gate.T, x @ w_up.T) @ w_down


def record_schema_no_annotations():
    # declares nothing: the schema of an op that only reads its arguments
    return "(Tensor gate, Tensor up, Tensor out, Tensor amax) -> ()"


def record_schema_out_only():
    # only the out= buffer, as in lesson 04's rms_norm_into
    return "(Tensor gate, Tensor up, Tensor(a!) out, Tensor amax) -> ()"


def record_schema_misses_scratch():
    # out and amax, but not gate, which the kernel uses as scratch for the sigmoid
    return "(Tensor gate, Tensor up, Tensor(a!) out, Tensor(b!) amax) -> ()"


def record_schema_all_written():
    # every tensor declared as written, to be safe: up is only read
    return "(Tensor(a!) gate, Tensor(b!) up, Tensor(c!) out, Tensor(d!) amax) -> ()"


def record_schema_returns_out():
    # returns out, as torch's own out= ops do: a custom op may not return an alias of an input
    return "(Tensor(a!) gate, Tensor up, Tensor(b!) out, Tensor(c!) amax) -> Tensor(b!)"


def record_schema_alias_no_write():
    # alias annotations without '!': they say "may alias", not "writes"
    return "(Tensor(a) gate, Tensor up, Tensor(b) out, Tensor(c) amax) -> ()"


def record_schema_shared_letter():
    # one letter for the three written arguments: it says they may be one tensor (torch only warns)
    return "(Tensor(a!) gate, Tensor up, Tensor(a!) out, Tensor(a!) amax) -> ()"


def record_schema_renamed():
    # short names of its own, not the kernel's
    return "(Tensor(a!) g, Tensor u, Tensor(b!) o, Tensor(c!) m) -> ()"


def record_schema_with_name():
    # the op's name in front, as lib.define takes it
    return "silu_mul_record(Tensor(a!) gate, Tensor up, Tensor(b!) out, Tensor(c!) amax) -> ()"


def record_schema_returns_list():
    # a list of tensors returned: a fresh value the kernel never returns
    return "(Tensor(a!) gate, Tensor up, Tensor(b!) out, Tensor(c!) amax) -> Tensor[]"


@pytest.mark.parametrize("fn, first_case", [
    (record_schema_returns_list, "what the op returns"),
    (record_schema_renamed, "the kernel's arguments, by name and in order"),
    (record_schema_with_name, "the kernel's arguments, by name and in order")])
def test_schema_feedback_opens_with_the_mistake(fn, first_case):
    """The first failure reported is the case whose hint names the mistake, not the returns hint."""
    assert run_cases("04_custom_op_lab", fn, "silu_mul_record_schema")[0][0] == first_case


def test_a_fresh_list_returned_is_not_an_aliased_output():
    failed = dict(run_cases("04_custom_op_lab", record_schema_returns_list, "silu_mul_record_schema"))
    assert "no output aliases an argument" not in failed


@pytest.fixture(scope="module")
def silu_mul_registered():
    """Lab 04's fake kernel and autograd formula (the spec's references), registered for exercise 4's
    compiled cases as the notebook's cells register them; removed afterwards."""
    from helpers.ext import lab as _defines_the_op   # noqa: F401
    lib = torch.library.Library("labs_ext", "FRAGMENT")
    torch.library.register_fake("labs_ext::silu_mul", spec04._fake, lib=lib)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
    torch.library.register_autograd("labs_ext::silu_mul", spec04._backward, setup_context=setup_context, lib=lib)
    yield
    lib._destroy()


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    """Every silu_mul_body candidate (the solution notebook's, then the wrong ones) in one child process."""
    solution = solution_namespace(L04)["silu_mul_body"]()
    candidates = {"solution": body_source(solution), "second_solution": body_source(SECOND_BODY)}
    candidates.update({w.name: body_source(w.fn) for w in WRONG if w.function == "silu_mul_body"})
    return run_in_child(L04, "silu_mul_body", candidates, tmp_path_factory.mktemp("kernels"))


BUILT_IN_A_CHILD = {"silu_mul_body": "kernel_results", "silu_mul_stable_source": "stable_results"}


def kernel_failures(w, request):
    """A C++ source's cases build it: they ran in the child, with the others."""
    if w.function in BUILT_IN_A_CHILD:
        return dict(request.getfixturevalue(BUILT_IN_A_CHILD[w.function])[w.name])
    return dict(run_cases(w.lab, w.fn, w.function))


def kernel_solution(function, request, tmp_path):
    fixture = BUILT_IN_A_CHILD.get(function)
    return request.getfixturevalue(fixture)["solution"] if fixture else None


WRONG = [
    Wrong(L04, "silu_mul_body", "silu-without-up", BODIES["silu_without_up"], "shape (7,), torch.float32",
          "compute in acc_t", slow=True),
    Wrong(L04, "silu_mul_body", "sigmoid-not-silu", BODIES["sigmoid_not_silu"], "shape (7,), torch.float32",
          "compute in acc_t", slow=True),
    Wrong(L04, "silu_mul_body", "float-not-acc-t", BODIES["float_not_acc_t"], "shape (3, 33), torch.float64",
          "compute in acc_t", slow=True),
    Wrong(L04, "silu_mul_body", "chunk-from-zero", BODIES["chunk_from_zero"],
          "one chunk [2050, 4099) of 4099 writes only its own elements", "index from begin", slow=True),
    Wrong(L04, "silu_mul_body", "zero-to-end", BODIES["zero_to_end"],
          "one chunk [2050, 4099) of 4099 writes only its own elements", "a loop that starts at 0", slow=True),
    Wrong(L04, "silu_mul_body", "empty-body", BODIES["empty_body"],
          "one chunk [2050, 4099) of 4099 writes only its own elements", "index from begin", slow=True),
    Wrong(L04, "silu_mul_fake", "keeps-strides", fake_keeps_strides, "a transposed gate gives a contiguous output",
          "empty_like copies gate's strides"),
    Wrong(L04, "silu_mul_fake", "no-checks", fake_no_checks, "different shapes are rejected",
          "raise ValueError when the shapes or the dtypes differ"),
    Wrong(L04, "silu_mul_fake", "shape-check-only", fake_shape_check_only, "different dtypes are rejected",
          "raise ValueError when the shapes or the dtypes differ"),
    Wrong(L04, "silu_mul_fake", "default-dtype", fake_default_dtype, "bfloat16 inputs give a bfloat16 output",
          "a contiguous tensor of gate's shape and dtype"),
    Wrong(L04, "silu_mul_fake", "runtime-error", fake_runtime_error, "different shapes are rejected",
          "raise ValueError"),
    Wrong(L04, "backward", "missing-term", backward_missing_term, "gradients of gate and up",
          "d/dgate is the product rule on g * s"),
    Wrong(L04, "backward", "swapped", backward_swapped, "gradients of gate and up", "in schema order"),
    Wrong(L04, "backward", "ignores-grad", backward_ignores_grad, "gradients of gate and up", "multiply both by grad"),
    Wrong(L04, "backward", "exp-sigmoid", backward_exp_sigmoid, "large gates (no overflow)", "s = sigmoid(g)"),
    Wrong(L04, "backward", "calls-silu-backward", backward_calls_silu_backward, "gradients of gate and up",
          FORBIDDEN_HINT),
    Wrong(L04, "swiglu_mlp", "plain-silu", swiglu_plain_silu, "calls labs_ext.silu_mul",
          "call torch.ops.labs_ext.silu_mul"),
    Wrong(L04, "swiglu_mlp", "gate-up-swapped", swiglu_swapped, "values", "its second multiplies it"),
    Wrong(L04, "swiglu_mlp", "no-down-projection", swiglu_no_down, "values", "the down projection comes last"),
    Wrong(L04, "swiglu_mlp", "graph-break", swiglu_data_dependent,
          "compiled with fullgraph=True: values and gradients", "Look first in swiglu_mlp"),
    Wrong(L04, "silu_mul_record_schema", "no-annotations", record_schema_no_annotations,
          "opcheck passes (float32, 3 x 5)", "each one needs an alias annotation with '!'"),
    Wrong(L04, "silu_mul_record_schema", "out-only", record_schema_out_only, "opcheck passes (float32, 3 x 5)",
          "found an argument written that the schema does not declare"),
    Wrong(L04, "silu_mul_record_schema", "misses-scratch", record_schema_misses_scratch,
          "opcheck passes (float32, 3 x 5)", "whatever the argument's name says it is for"),
    Wrong(L04, "silu_mul_record_schema", "all-written", record_schema_all_written,
          "declares exactly the arguments the kernel writes", "one it only reads costs a copy"),
    Wrong(L04, "silu_mul_record_schema", "returns-out", record_schema_returns_out,
          "no output aliases an argument", "whose output aliases one of its inputs"),
    Wrong(L04, "silu_mul_record_schema", "alias-without-write", record_schema_alias_no_write,
          "opcheck passes (float32, 3 x 5)", "an alias annotation with '!'"),
    Wrong(L04, "silu_mul_record_schema", "shared-letter", record_schema_shared_letter, "alias letters",
          "give each a letter of its own"),
    Wrong(L04, "silu_mul_record_schema", "renamed-arguments", record_schema_renamed,
          "the kernel's arguments, by name and in order", "Keep the kernel's argument names"),
    Wrong(L04, "silu_mul_record_schema", "op-name-in-front", record_schema_with_name,
          "the kernel's arguments, by name and in order", "the op's name is added for you"),
    Wrong(L04, "silu_mul_record_schema", "returns-list", record_schema_returns_list, "what the op returns",
          "has no value of its own to return"),
    Wrong(L04, "silu_mul_stable_source", "classic-parallel-for", STABLE_SOURCES["classic-parallel-for"],
          "includes only stable-ABI headers", "the headers under torch/csrc/stable and torch/headeronly", slow=True),
    Wrong(L04, "silu_mul_stable_source", "torch-library-impl", STABLE_SOURCES["torch-library-impl"],
          "registers with the stable ABI's macro", "a stable library registers with STABLE_TORCH_LIBRARY_IMPL",
          slow=True),
    Wrong(L04, "silu_mul_stable_source", "no-torch-box", STABLE_SOURCES["no-torch-box"], "hands m.impl a boxed kernel",
          "TORCH_BOX(&your_function) makes one", slow=True),
    Wrong(L04, "silu_mul_stable_source", "torch-check", STABLE_SOURCES["torch-check"],
          "builds and loads (TORCH_TARGET_VERSION 2.10.0)", "the classic TORCH_CHECK", slow=True),
    Wrong(L04, "silu_mul_stable_source", "defines-the-op", STABLE_SOURCES["defines-the-op"],
          "adds a kernel to labs_ext, defines no namespace", "a second definition of labs_ext crashes", slow=True),
    Wrong(L04, "silu_mul_stable_source", "library-for-impl", STABLE_SOURCES["library-for-impl"],
          "adds a kernel to labs_ext, defines no namespace", "STABLE_TORCH_LIBRARY (and _FRAGMENT) define", slow=True),
    Wrong(L04, "silu_mul_stable_source", "other-namespace", STABLE_SOURCES["other-namespace"],
          "adds a kernel to labs_ext, defines no namespace", "a kernel added to another namespace", slow=True),
    Wrong(L04, "silu_mul_stable_source", "undef-target", STABLE_SOURCES["undef-target"],
          "imports no C++ symbol of libtorch", "keep TORCH_TARGET_VERSION defined", slow=True),
    Wrong(L04, "silu_mul_stable_source", "serial", STABLE_SOURCES["serial"], "splits the work over torch's threads",
          "with the stable ABI's parallel_for", slow=True),
    Wrong(L04, "silu_mul_stable_source", "ignores-chunk", STABLE_SOURCES["ignores-chunk"],
          "each chunk computes only its own range [begin, end)", "a callback that ignores its arguments", slow=True),
    Wrong(L04, "silu_mul_stable_source", "chunk-from-zero", STABLE_SOURCES["chunk-from-zero"],
          "each chunk computes only its own range [begin, end)", "one that counts its chunk from 0", slow=True),
    Wrong(L04, "silu_mul_stable_source", "float-only", STABLE_SOURCES["float-only"], "bfloat16 (2, 5, 129)",
          "the four dtypes the classic kernel dispatched on", slow=True),
    Wrong(L04, "silu_mul_stable_source", "float-acc", STABLE_SOURCES["float-acc"], "float64 (3, 33), to 1e-10",
          "compute float64 in double", slow=True),
    Wrong(L04, "silu_mul_stable_source", "no-contiguous", STABLE_SOURCES["no-contiguous"], "a transposed gate",
          "made both inputs contiguous", slow=True),
    Wrong(L04, "silu_mul_stable_source", "no-shape-check", STABLE_SOURCES["no-shape-check"],
          "different shapes are rejected", "gates and ups of different shapes or dtypes", slow=True),
    Wrong(L04, "silu_mul_stable_source", "output-aliases-gate", STABLE_SOURCES["output-aliases-gate"],
          "opcheck passes (float32, 3 x 5)", "the kernel must allocate its output", slow=True),
]

SECOND_SOLUTIONS = [("silu_mul_fake", fake_second_solution), ("backward", backward_second_solution),
                    ("swiglu_mlp", swiglu_second_solution), ("silu_mul_record_schema", record_schema_second_solution)]

NO_BUILD_HERE = ("the harness gives the reference's values without a build; the solution notebook's body, built in "
                 "the child, is the test of a right kernel")
NO_STABLE_BUILD_HERE = ("the harness gives the reference's values without a build; the solution notebook's source, "
                        "built in the child, is the test of a right port")

globals().update(lab_tests(L04, WRONG, SECOND_SOLUTIONS, visible=True, failures=kernel_failures,
                           solution=kernel_solution, fixtures={"swiglu_mlp": "silu_mul_registered"},
                           no_reference={"silu_mul_body": NO_BUILD_HERE,
                                         "silu_mul_stable_source": NO_STABLE_BUILD_HERE},
                           reference_exempt={"swiglu_mlp": {"calls labs_ext.silu_mul"}},   # plain PyTorch
                           slow_solutions=("silu_mul_body", "silu_mul_stable_source")))
