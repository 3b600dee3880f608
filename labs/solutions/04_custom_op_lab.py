# %% [markdown]
# # Lab 04 · A C++ custom op, end to end
#
# | | |
# |---|---|
# | **What you will learn** | write the loop body of a C++ CPU kernel (`silu_mul`, the core of a SwiGLU MLP), register a fake kernel and an autograd formula for it with `torch.library`, pass `torch.library.opcheck`, and use the op in a `torch.compile`d MLP with no graph breaks, and time your kernel against eager PyTorch and `torch.compile`; then read an op's kernel and write the schema that declares what it writes, proven by `opcheck`; and port the kernel to the LibTorch stable ABI, so that one build loads in torch 2.10 and later releases |
# | **Prerequisites** | lesson 04 (XPU, SYCL and custom ops) and its deep dive's stable-ABI sections for exercise 6 |
# | **Hardware** | any CPU. Exercises 1 and 6 and the timing need a C++ compiler and ninja; without them the PyTorch reference stands in for your kernel, the lab says so, and exercises 2-5 still run |
# | **Time** | 85 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# The op is `labs_ext::silu_mul(Tensor gate, Tensor up) -> Tensor`: `out = silu(gate) * up`, with
# `silu(g) = g / (1 + exp(-g))`. Llama-style models compute it in every feed-forward block:
# `(silu(x @ W_gate.T) * (x @ W_up.T)) @ W_down.T`. Importing `helpers.ext.lab` defines the op's
# schema and nothing else: the kernel, the fake kernel and the autograd formula are yours.
#
# Each exercise cell is followed by a check cell, `check("04_custom_op_lab", function)`: it runs the
# exercise's visible cases exactly as the grader does and prints `✅ ... passed` per case, or stops with
# `❌`, what was wrong, and a hint. The grader adds hidden cases; each exercise says what they test.

# %% tags=["colab-setup"]
# Colab only (elsewhere this cell does nothing): clone the course once, install it beside Colab's own torch
# with torchao and torchdata matched to that torch, and work from this notebook's folder of the clone.
import sys

if "google.colab" in sys.modules:
    import os
    import shutil
    import subprocess
    clone = os.environ.get("LABS_COLAB_DIR", "/content/pytorch-210-labs")
    if not os.path.isdir(os.path.join(clone, ".git")):
        shutil.rmtree(clone, ignore_errors=True)   # a clone cut short
        source = os.environ.get("LABS_COLAB_SOURCE", "https://github.com/pytorch-210-labs/pytorch-210-labs")
        subprocess.run(["git", "clone", "--depth", "1", source, clone], check=True)
    subprocess.run([sys.executable, "-m", "helpers.colab", "setup"], cwd=clone, check=True)
    if clone not in sys.path:
        sys.path.insert(0, clone)
    os.environ["LABS_NOTEBOOK"] = "labs/04_custom_op_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False   # quick mode: a smaller tensor and fewer repeats in the timing cell (papermill: -p QUICK True)

# %%
import torch

from helpers import bench
from helpers.device import pick_device, quick_mode, requires
from helpers.ext import lab
from helpers.grading.checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
torch.manual_seed(0)
print("the op's schema:", torch.ops.labs_ext.silu_mul.default._schema)

# %% [markdown]
# ## The C++ template
#
# `helpers/ext/silu_mul_cpu_template.cpp` has everything but the loop body: the wrapper checks shapes
# and dtypes, makes both inputs contiguous, allocates `out`, dispatches on the dtype (`scalar_t` is
# `float`, `double`, `c10::BFloat16` or `c10::Half`) and splits the elements over threads with
# `at::parallel_for`, which calls `silu_mul_chunk` once per chunk `[begin, end)`:

# %%
lines = lab.TEMPLATE.splitlines()
start = next(i for i, line in enumerate(lines) if "Called by at::parallel_for" in line)
print("\n".join(lines[start:start + 6]))
print("  ...")
first = next(i for i, line in enumerate(lines) if "at::parallel_for(0" in line)
print("\n".join(lines[first - 4:first + 3]))


# %% [markdown]
# ## Exercise 1: the kernel body
#
# Write the statements that go where the `// LAB:` line is: `silu_mul_body()` returns them as a
# Python string. `at::parallel_for` calls `silu_mul_chunk` once per chunk `[begin, end)` of the flattened
# tensors, from several threads at once, so each call may touch only its own elements. Compute in
# `acc_t`, not `float`: it is `float` for bf16 and fp16 (8 or 11 bits of mantissa are too few for the
# arithmetic) and `double` for `double`. Write `out[i] = silu(gate[i]) * up[i]`, converted back to
# `scalar_t` once. `std::exp` is available.
#
# What is checked: the op's output against `silu(gate) * up` computed in PyTorch, for float32, float64
# (to 1e-10, which a kernel computing in `float` misses), bfloat16 and float16, on a 1-D, a 2-D and a
# 3-D shape, and on 4099 elements run with two threads, which `parallel_for` splits into two chunks
# (where the kernel is built with OpenMP, as on Linux). Values alone cannot show a loop that runs over
# other chunks' elements (it writes them with the same values), so one more case builds your body into
# a bare chunk function, calls it once on the chunk `[2050, 4099)` with `out` full of NaN, and checks
# that it wrote exactly those 2049 elements.
# Hidden cases add an empty tensor, a single element, a larger fp16 matrix, another chunk and a
# transposed gate (the wrapper makes it contiguous before your loop sees it).
#
# The cell after yours builds the template with your body (cached by a hash of the source: an
# unchanged body is not rebuilt) and loads it, which registers it as the op's CPU kernel. A compiler
# error is shown as the compiler's own lines. Changing the body and re-running replaces the kernel;
# torch prints a warning that it overrides the previous one.

# %%
def silu_mul_body() -> str:
    """The C++ statements of silu_mul_chunk's body."""
    ### BEGIN SOLUTION
    return r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
"""
    ### END SOLUTION


# %%
HAVE_CXX = requires("cxx", "ninja", section="Build the C++ CPU kernel")
if HAVE_CXX:
    built = lab.build_kernel(silu_mul_body())
    print(f"{built.path.name}: {'loaded from the cache' if built.cached else 'built'} "
          f"(build took {built.build_s:.1f} s when it ran)")
else:
    lab.register_reference_kernel()
    print("No C++ compiler: the PyTorch reference stands in as the CPU kernel, so exercise 1 is not "
          "checked here; exercises 2-4 run on the reference.")

# %% tags=["nbval-check-output"]
if HAVE_CXX:
    check("04_custom_op_lab", silu_mul_body)
else:
    print("Exercise 1: not checked (no C++ compiler here)")


# %% [markdown]
# ## Exercise 2: the fake kernel
#
# `torch.compile` traces with fake tensors: they have shapes, dtypes and strides but no data, so the
# C++ kernel cannot run on them. The fake kernel says what the real one would return, using nothing
# but the inputs' metadata. Write it so that it
#
# 1. rejects what the C++ wrapper rejects, gates and ups of different shapes or different dtypes, with a
#    `ValueError` (the wrapper's `TORCH_CHECK` lines above), and
# 2. returns an empty tensor with the real output's shape, dtype **and strides**.
#
# The trap is in (2): read the wrapper again. It allocates `out` from `gate.contiguous()`, so for a
# transposed gate the real output is contiguous, while `torch.empty_like(gate)` copies gate's strides.
# A fake kernel that disagrees with the real one in strides lets `torch.compile` plan memory for a
# layout the kernel does not produce.
#
# What is checked: your function on meta tensors (shape, strides and dtype of what it returns) for two
# (3, 5) float32 inputs, a bfloat16 pair and a transposed gate, and that different shapes and different
# dtypes raise `ValueError`. Hidden cases add a 3-D bfloat16 pair, a permuted 3-D gate and a tensor with
# no elements.

# %%
@torch.library.register_fake("labs_ext::silu_mul")
def silu_mul_fake(gate, up):
    ### BEGIN SOLUTION
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} "
                         f"{up.dtype} must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("04_custom_op_lab", silu_mul_fake)


# %% [markdown]
# ## Exercise 3: the autograd formula
#
# `setup_context` saves what the backward needs (given); `backward` receives `grad`, the gradient of the
# loss with respect to `out`, and returns one gradient per input, in the order of the schema:
# `(grad_gate, grad_up)`. Derive them: with `s = sigmoid(g)`, `out = g * s * up`, and the derivative
# of the sigmoid is `ds/dg = s * (1 - s)`. Apply the product rule for `gate`; `up` is easier.
#
# Write it with elementwise torch operations (they run on every device, and `torch.compile` can trace
# them). `torch.sigmoid` is fine; `F.silu` and torch's own `silu_backward` / `sigmoid_backward` are
# not: they are the formula you are asked to write, and the check refuses them.
#
# What is checked: your `backward` called directly with saved `(gate, up)` and a random `grad`, against
# the true gradients in float32, in float64 (to 1e-10: keep the input's dtype), and with large gates
# (hundreds): `exp(-g)` overflows float32 for gates below about -88, so build on `torch.sigmoid`, which
# does not. Hidden cases: a gate of zeros, and other shapes of the same.

# %%
def setup_context(ctx, inputs, output):
    gate, up = inputs
    ctx.save_for_backward(gate, up)


def backward(ctx, grad):
    gate, up = ctx.saved_tensors
    ### BEGIN SOLUTION
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s
    ### END SOLUTION


torch.library.register_autograd("labs_ext::silu_mul", backward, setup_context=setup_context)

# %% tags=["nbval-check-output"]
check("04_custom_op_lab", backward)

# %% [markdown]
# ## `opcheck`: exercises 1-3 together
#
# `torch.library.opcheck` tests the registration as a whole: the kernel does not mutate its inputs
# (`test_schema`), inputs that require grad reach your formula (`test_autograd_registration`), the
# fake kernel agrees with the real one (`test_faketensor`), and the op traces through
# `torch.compile`'s AOT autograd with dynamic shapes (`test_aot_dispatch_dynamic`). Nothing to write:
# if a test fails, the hint says which exercise to revisit.

# %% tags=["nbval-check-output"]
lab.check_opcheck()


# %% [markdown]
# ## Exercise 4: SwiGLU under `torch.compile`
#
# Write the SwiGLU feed-forward block with your op: `silu_mul(x @ w_gate.T, x @ w_up.T) @ w_down.T`,
# calling `torch.ops.labs_ext.silu_mul`. Nothing in it may break the graph.
#
# What is checked: the values against plain PyTorch, that the op is really called (not `F.silu(...) *
# ...`), and the function compiled with `fullgraph=True` (the `aot_eager` backend: tracing with your fake
# kernel and your autograd formula): its output and the gradients of `x` and the three weights. A hidden
# case repeats the compiled check with other sizes. While these cases run, the op's CPU kernel, fake kernel
# and autograd formula are the reference's, so this exercise is graded on its own, whatever exercises 1-3 gave.

# %%
def swiglu_mlp(x, w_gate, w_up, w_down):
    ### BEGIN SOLUTION
    return torch.ops.labs_ext.silu_mul(x @ w_gate.T, x @ w_up.T) @ w_down.T
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("04_custom_op_lab", swiglu_mlp)

# %% [markdown]
# ## Exercise 5: the schema of an op that writes
#
# A second op, `silu_mul_record(gate, up, out, amax)`, comes with its kernel written: it puts
# `silu(gate) * up` into a buffer `out` that the caller passes and raises `amax` to the largest `|out|`
# seen so far. Before it can be registered, it needs a schema, and the schema must tell the truth about
# what the kernel writes: `torch.compile` trusts it (it clones each argument declared as written, runs
# the op on the clones and writes them back, `auto_functionalized`), so an undeclared write can make the
# compiled results wrong.
#
# Write `silu_mul_record_schema()`: return the schema from its argument list on, `"(...) -> ..."`, in
# the schema language: `Tensor x` for an argument the op only reads, `Tensor(a!) x` for one it writes
# (each written argument with a letter of its own), `-> ()` for an op that returns nothing. Keep the
# kernel's argument names and order. Lesson 04 declared one `out=` buffer through `custom_op`'s
# `mutates_args`; here the decision is yours: read the kernel below line by line, decide which arguments
# it writes, and what the op returns.
#
# What is checked: the argument list (the kernel's names, in its order), what the op returns,
# `torch.library.opcheck` on an op defined with your argument list and this kernel (float32 inputs; its
# `test_schema` compares every argument before and after a call), that the schema declares exactly the
# arguments the kernel writes (one it only reads, declared as written, costs a copy under `torch.compile`),
# and that no two arguments share an alias letter. Hidden cases run `opcheck` on bfloat16 and float64
# inputs of other shapes.

# %%
import inspect

print(inspect.getsource(lab.silu_mul_record_kernel))


# %%
def silu_mul_record_schema() -> str:
    ### BEGIN SOLUTION
    # gate is the sigmoid's scratch (sigmoid_), out is copied into and multiplied in place, amax is an out=
    return "(Tensor(a!) gate, Tensor up, Tensor(b!) out, Tensor(c!) amax) -> ()"
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("04_custom_op_lab", silu_mul_record_schema)

# %% [markdown]
# ## Exercise 6: the same kernel against the stable ABI
#
# The library exercise 1 built expects libtorch to define C++ symbols for it (the cell after the check
# lists them): a torch release that changes or drops one of them cannot load it, so each torch needs its own
# build. Lesson 04's deep dive built `rms_norm_stable.cpp` against the **LibTorch stable ABI**, which
# pytorch/tutorials' `cpp_custom_ops.rst` recommends from 2.10 on, and one build of it loads in 2.10 and in
# later releases. Port `silu_mul`'s CPU kernel to it: `silu_mul_stable_source()` returns a whole C++ file,
# written from the template below and your exercise-1 body. The library must
#
# 1. **load in torch 2.10 and every later torch**: the cell after yours builds it with
#    `-DTORCH_TARGET_VERSION=0x020a000000000000` (2.10.0), under which every torch header outside
#    `torch/csrc/stable` and `torch/headeronly` stops the build with an `#error`; and it may expect no C++
#    symbol of libtorch (`at::`, `c10::`, `torch::`) to be defined for it, only C functions of torch's shim;
# 2. **add the CPU kernel of `labs_ext::silu_mul`**, whose schema exists already (defined from Python);
# 3. **behave as the classic kernel**: the same four dtypes and the same arithmetic (float and the 16-bit
#    types computed in float, float64 in double, rounded once), the same refusals (a gate and an up of
#    different shapes or dtypes), a contiguous output whatever the inputs' strides, and the elements split
#    over torch's intra-op threads.
#
# Which stable counterpart replaces each classic name, and what to write yourself where the stable headers
# have none, is yours to find: the headers are in the installed torch (`torch/include/torch/csrc/stable/`,
# `torch/include/torch/headeronly/`), and an `#error` names the include that has to go.
#
# The cell after yours builds the file (a few seconds; an unchanged source is not rebuilt) and loads it for an
# op of its own: the namespace `labs_ext` in your registration block is replaced by one named after the
# source, so each version you build is a new op (the same schema, with the reference fake kernel and autograd
# formula) and none replaces exercise 1's kernel.
#
# What is checked: the build, and what stopped it when it failed (a classic header, a classic registration,
# a kernel `m.impl` cannot take); that your source adds a kernel to `labs_ext` and defines no namespace, and
# that the library adds `labs_ext::silu_mul`'s CPU kernel; its imports (the symbols `nm -D --undefined-only`
# lists): no C++ symbol of libtorch (the central point: missing it caps the exercise at a quarter of its
# points), and torch's `parallel_for` among them; the values against the reference for float32, bfloat16,
# float16 and float64 (to 1e-10) and for a transposed gate; that different shapes raise a `RuntimeError`;
# that each call of your `parallel_for` callback computes its own chunk and only it; and
# `torch.library.opcheck` on float32 inputs. Values cannot show the chunks (a callback that ignores its
# `[begin, end)` computes the whole tensor in every call, as many times over as there are threads, with the
# same values), so the check builds your source twice more, each time with a `parallel_for` that calls the
# callback once, on the first half of each range it is handed, then on the second half, and runs both on
# 4099 elements: the two outputs must be right on two parts of the tensor that do not overlap and together
# cover it. Hidden cases add an empty tensor, one float16 element, 4099 elements on two threads, a permuted
# 3-D gate, different dtypes and `opcheck` on bfloat16.

# %%
print(lab.TEMPLATE)


# %%
def silu_mul_stable_source() -> str:
    """A whole C++ file: silu_mul's CPU kernel against the stable ABI."""
    ### BEGIN SOLUTION
    return r"""// silu_mul against the LibTorch stable ABI: only torch/csrc/stable and torch/headeronly headers.
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
    ### END SOLUTION


# %%
if HAVE_CXX:
    stable_source = silu_mul_stable_source()
    built_stable = lab.build_stable(stable_source)
    silu_mul_stable = lab.stable_op(stable_source)
    print(f"{built_stable.path.name}: {'loaded from the cache' if built_stable.cached else 'built'} (build took "
          f"{built_stable.build_s:.1f} s when it ran); your kernel is the CPU kernel of {silu_mul_stable._schema.name}")
else:
    print("No C++ compiler: exercise 6 is not built here.")

# %% tags=["nbval-check-output"]
if HAVE_CXX:
    check("04_custom_op_lab", silu_mul_stable_source)
else:
    print("Exercise 6: not checked (no C++ compiler here)")

# %% [markdown]
# What each library expects libtorch to define for it, read from its dynamic symbol table (what
# `nm -D --undefined-only` lists): the classic library names C++ functions and classes of `at::` and `c10::`,
# whose mangled names change when a signature does; the stable one names only C functions of torch's shim,
# which torch keeps from release to release.

# %%
if HAVE_CXX:
    for name, library in (("exercise 1, classic", built.path), ("exercise 6, stable ABI", built_stable.path)):
        symbols = lab.imported_symbols(library)
        cpp = lab.libtorch_cpp_symbols(symbols)
        shim = [s for s in symbols if s.startswith(("aoti_torch_", "torch_"))]
        print(f"{name}: {len(cpp)} C++ symbols of libtorch, {len(shim)} C functions of its shim; for example "
              f"{(lab.demangled(cpp) or shim)[:3]}")

# %% [markdown]
# ## How fast is your kernel?
#
# A custom op is worth its C++ only if it beats what PyTorch already gives. The cell below times four
# ways to compute `silu(gate) * up` on one large float32 tensor pair, on one thread: eager PyTorch
# (`F.silu(gate) * up`, two kernels and a temporary), your op, its stable-ABI port (called through the
# boxed kernel and the shim, which costs a little per call, nothing per element), and `torch.compile` of the
# eager expression (Inductor fuses it into one vectorized loop of its own). It prints what it measured here:
# the ratios are a measurement of this machine, not checked. Your scalar loop calls `std::exp` once
# per element; Inductor's loop uses SIMD instructions, so do not be surprised if the compiler wins.

# %%
if HAVE_CXX:
    import torch.nn.functional as F
    n = 1 << (18 if QUICK else 22)
    gate, up = torch.randn(n), torch.randn(n)
    compiled = torch.compile(lambda g, u: F.silu(g) * u)
    result = bench.compare({"eager F.silu(g) * u": lambda: F.silu(gate) * up,
                            "labs_ext.silu_mul (yours)": lambda: torch.ops.labs_ext.silu_mul(gate, up),
                            "stable-ABI port (yours)": lambda: silu_mul_stable(gate, up),
                            "torch.compile (Inductor)": lambda: compiled(gate, up)},
                           baseline="eager F.silu(g) * u", repeats=3 if QUICK else 5,
                           min_run_time=0.02 if QUICK else 0.1, threads=1, device="cpu")
    print(bench.table(result))
    ratio = result["results"]["labs_ext.silu_mul (yours)"]["ratio_to_baseline"]
    print(f"your kernel runs at {ratio:.2f}x the speed of eager PyTorch here (measured, not checked)")
else:
    print("No C++ compiler: your kernel was not built, and Inductor needs a compiler too; nothing to time.")

# %% [markdown]
# ## What you built
#
# One op, registered piece by piece: a schema (given), a CPU kernel in C++ (exercise 1), a fake
# kernel (exercise 2) and an autograd formula (exercise 3), proven by `opcheck`, used inside a
# compiled model (exercise 4) and timed against eager PyTorch and `torch.compile`; then a second op's
# schema, which declares the arguments its kernel writes (exercise 5); and the kernel against the stable
# ABI, a library that expects nothing of libtorch but its C shim, so one build serves torch 2.10 and the
# releases after it (exercise 6). An Intel GPU kernel would be one more file, a `.sycl` source with a `TORCH_LIBRARY_IMPL(labs_ext, XPU, m)` block
# (lesson 04 shows one for RMSNorm); the fake kernel and the autograd formula would serve it unchanged.
