"""Lab 04 (the C++ custom op): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.grading.specs import lab04 as spec04
from wrong_answers import FORBIDDEN_HINT, L04, Wrong, lab_tests, run_cases, run_in_child, solution_namespace


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


def kernel_failures(w, request):
    """A C++ body's cases build it: they ran in the child, with the others."""
    if w.function == "silu_mul_body":
        return dict(request.getfixturevalue("kernel_results")[w.name])
    return dict(run_cases(w.lab, w.fn, w.function))


def kernel_solution(function, request, tmp_path):
    return request.getfixturevalue("kernel_results")["solution"] if function == "silu_mul_body" else None


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
]

SECOND_SOLUTIONS = [("silu_mul_fake", fake_second_solution), ("backward", backward_second_solution),
                    ("swiglu_mlp", swiglu_second_solution), ("silu_mul_record_schema", record_schema_second_solution)]

NO_BUILD_HERE = ("the harness gives the reference's values without a build; the solution notebook's body, built in "
                 "the child, is the test of a right kernel")

globals().update(lab_tests(L04, WRONG, SECOND_SOLUTIONS, visible=True, failures=kernel_failures,
                           solution=kernel_solution, fixtures={"swiglu_mlp": "silu_mul_registered"},
                           no_reference={"silu_mul_body": NO_BUILD_HERE},
                           reference_exempt={"swiglu_mlp": {"calls labs_ext.silu_mul"}},   # plain PyTorch
                           slow_solutions=("silu_mul_body",)))
