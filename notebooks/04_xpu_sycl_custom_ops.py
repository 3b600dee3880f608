# %% [markdown]
# # 04 · Intel XPU, SYCL C++ extensions and device-agnostic custom ops
#
# | | |
# |---|---|
# | **What you will learn** | device-agnostic code with `torch.accelerator` and `helpers.device`; what `torch.xpu` offers in 2.10, checked against torch's code; one op (a fused RMSNorm) written three ways: C++ for the CPU with `at::parallel_for`, SYCL for Intel GPUs, and a PyTorch reference; registering it with `torch.library` (schema, fake kernel, autograd) so that it works under `torch.compile`, proven with `torch.library.opcheck`; the Python route (`torch.library.custom_op`) beside a schema defined in C++ (`TORCH_LIBRARY`), and a mutable op (`mutates_args`, `Tensor(a!)`); the hand-written kernel against `torch.compile` of the reference; the op inside `torch.export` and an AOTInductor package; what the LibTorch stable ABI offers in 2.10; packaging with `SyclExtension` |
# | **Prerequisites** | lesson 00; reading a little C++ helps |
# | **Hardware** | any CPU. The C++ kernels need a C++ compiler and ninja, and every Inductor compile on a CPU (the benchmark against `torch.compile`, full mode's compiled block, AOTInductor) needs the C++ compiler: without them those sections say so and are skipped, quick mode's compile uses the `aot_eager` backend (no code generated), and the op runs on the PyTorch reference. The `torch.xpu` demo needs an Intel GPU; the SYCL kernel also needs an XPU build of torch and Intel's DPC++ compiler (`icpx`) |
# | **Time** | 65 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); what 2.10 added is taken from its release notes (PR numbers below) |
#
# PyTorch runs Intel GPUs upstream as the `xpu` device; Intel's separate extension (IPEX) stopped
# after 2.8 and is not needed. Custom kernels for Intel GPUs are written in SYCL and built with
# `torch.utils.cpp_extension`: `SyclExtension` and `load_inline(..., sycl_sources=...)` arrived in 2.8
# on Linux, and 2.10 added Windows (with the `icx` compiler).

# %% tags=["parameters"]
QUICK = False        # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
ROWS, HIDDEN = 4096, 4096   # the RMSNorm input measured: ROWS rows of HIDDEN values

# %%
import inspect
import os
import tempfile
import time

import torch

from helpers import bench, ext, fusion
from helpers.device import capabilities, pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)   # LABS_QUICK=1 in the environment also turns it on (the test suite does)
DEVICE = pick_device()
caps = capabilities()
if QUICK:
    ROWS, HIDDEN = 256, 1024
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · XPU build of torch: {caps.xpu_compiled}")
print(f"compilers on PATH: c++ {caps.toolchains['cxx']}, ninja {caps.toolchains['ninja']}, "
      f"icpx {caps.toolchains['icpx']}")

# %% [markdown]
# ## 1. Device-agnostic code
#
# Decide the device once, then write code that only ever says `DEVICE` (or `x.device`). Two layers
# help:
#
# - **`torch.accelerator`** (torch's own, since 2.6): `current_accelerator()` names the accelerator the installed build was made
#   for (`cuda`, `xpu`, `mps`, ...) whether or not such a device is present, and is `None` only for a
#   CPU-only build: PyPI's Linux wheel is a CUDA build, so a laptop without a GPU gets `cuda` here.
#   `is_available()` says whether a device is really there; `device_count()` and
#   `synchronize()` work the same on every backend (the installed torch also has memory statistics
#   there, such as `torch.accelerator.memory_allocated()`).
# - **`helpers.device`** (this collection's): `pick_device()` resolves `DEVICE` once and `requires(...)`
#   runs or skips a section, printing why. It is the only code here that inspects hardware.
#
# A device-agnostic function takes its device from its inputs and does **not** synchronise: on an
# accelerator, ops are queued and the host runs ahead; a `synchronize()` inside a wrapper would make
# every call wait and serialise the host with the device. Synchronise only where the host needs the
# device to be done (to read the clock for a timing, or a value), and then the device the tensors are
# on: `torch.accelerator.synchronize(x.device)` (without an argument it waits for the *current*
# device, which on a multi-GPU machine may not be `x`'s), never `torch.cuda` or `torch.xpu` by name:

# %%
print("torch.accelerator.current_accelerator():", torch.accelerator.current_accelerator())
print("torch.accelerator.is_available():       ", torch.accelerator.is_available())
print("torch.accelerator.device_count():       ", torch.accelerator.device_count())
print("torch.get_device_module(DEVICE):        ", torch.get_device_module(DEVICE).__name__)


def normalize_last_dim(x: torch.Tensor) -> torch.Tensor:
    """RMS-normalise the last dimension on whatever device x lives on (asynchronously: no sync)."""
    return ext.rms_norm(x, torch.ones(x.shape[-1], device=x.device, dtype=x.dtype))


def seconds_per_call(fn, x: torch.Tensor) -> float:
    """Time one call of fn(x): the one place that must wait for x's device before reading the clock."""
    start = time.perf_counter()
    fn(x)
    if x.device.type not in ("cpu", "meta"):
        torch.accelerator.synchronize(x.device)   # the same call on CUDA, ROCm, XPU and MPS
    return time.perf_counter() - start


# %% tags=["nbval-check-output"]
for device in ("cpu", "meta"):          # meta: shapes only, no data (what torch.compile traces with)
    y = normalize_last_dim(torch.randn(3, 8, device=device))
    assert y.shape == (3, 8) and y.device.type == device
    print(f"{device}: shape {tuple(y.shape)}, dtype {y.dtype}")
if DEVICE.type != "cpu":
    x_dev = torch.randn(3, 8, device=DEVICE)
    print(DEVICE, normalize_last_dim(x_dev).shape, f"{seconds_per_call(normalize_last_dim, x_dev) * 1e6:.0f} µs")

# %% [markdown]
# ## 2. What `torch.xpu` offers in 2.10
#
# `torch.xpu` mirrors `torch.cuda` for Intel GPUs. What the 2.10 release notes list for Intel GPUs:
#
# | 2.10 change | API | PR |
# |---|---|---|
# | cap this process's share of GPU memory | `torch.xpu.set_per_process_memory_fraction(f)`, `get_per_process_memory_fraction()` | #165510 |
# | plug in your own allocator (a shared library with `alloc`/`free` functions) | `torch.xpu.XPUPluggableAllocator(path, alloc_fn, free_fn)`, `torch.xpu.change_current_allocator(a)` | 2.10 release notes |
# | SYCL C++ extensions on Windows (`icx`) | `SyclExtension`, `load_inline(sycl_sources=...)` | 2.10 release notes |
# | int8 weight-only matmul kernel on XPU | `torch._weight_int8pack_mm` | #160938 |
# | FP8 `scaled_mm` (tensor-wise, row-wise) on XPU | `torch._scaled_mm`, `scaled_mm_v2` | #165978, #167518 |
#
# The cell below checks that every name used in this lesson exists in the installed torch (on a CPU
# build too: the module is always there, only its calls need an Intel GPU).

# %% tags=["nbval-check-output"]
XPU_IN_210 = ["set_per_process_memory_fraction", "get_per_process_memory_fraction",
              "XPUPluggableAllocator", "change_current_allocator"]
XPU_BASICS = ["is_available", "device_count", "get_device_properties", "synchronize", "mem_get_info",
              "memory_allocated", "max_memory_allocated", "empty_cache", "Stream", "Event"]
absent = [name for name in XPU_IN_210 + XPU_BASICS if not hasattr(torch.xpu, name)]
assert not absent, f"missing from torch.xpu: {absent}"
for name in XPU_IN_210:    # parameter names only: annotations print differently across torch versions
    print(f"torch.xpu.{name}({', '.join(inspect.signature(getattr(torch.xpu, name)).parameters)})")
print(f"and {len(XPU_BASICS)} long-standing calls: {', '.join(XPU_BASICS)}")

# %% [markdown]
# `set_per_process_memory_fraction` is the tool for sharing one GPU between processes (two training
# jobs, or a notebook next to a server): past `fraction x total memory` the caching allocator raises
# an out-of-memory error instead of taking memory another process needs. The next cell caps this
# process at a quarter of the GPU, asks for more, and restores the cap.

# %%
if requires("xpu", section="torch.xpu memory controls on an Intel GPU"):
    props = torch.xpu.get_device_properties(0)
    total = props.total_memory        # mem_get_info() needs ZES_ENABLE_SYSMAN=1 on many drivers (pitfalls)
    print(f"{props.name}: {total / 2**30:.1f} GiB total")
    old_fraction = torch.xpu.get_per_process_memory_fraction()
    torch.xpu.set_per_process_memory_fraction(0.25)
    try:
        too_big = torch.empty(int(total * 0.30) // 4, dtype=torch.float32, device="xpu")
        print(f"allocated {too_big.numel() * 4 / 2**30:.1f} GiB above the 25% cap: the cap did not hold")
        del too_big
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        print("refused above the 25% cap:", str(exc).splitlines()[0][:200])
    finally:
        torch.xpu.set_per_process_memory_fraction(old_fraction)
        torch.xpu.empty_cache()
    print("fraction restored to", torch.xpu.get_per_process_memory_fraction())


# %% [markdown]
# ## 3. One op, three kernels
#
# **RMSNorm** normalises each row by its root mean square: `y = x / sqrt(mean(x²) + eps) * weight`.
# Written with PyTorch operations it is six operations (square, mean, add `eps`, rsqrt, two
# multiplies), four of them over the full-size tensor. A fused kernel reads each row twice (once to
# sum the squares, once to scale) and writes it once. The op `labs_ext::rms_norm` has three implementations,
# all in `helpers/ext/`:
#
# | file | kernel | runs for |
# |---|---|---|
# | `helpers/ext/__init__.py` | `rms_norm_reference`: PyTorch operations, accumulating in float32 | every device without a kernel of its own (registered as `CompositeExplicitAutograd`) |
# | `rms_norm_cpu.cpp` | C++; rows split across threads with `at::parallel_for` | CPU tensors, once built |
# | `rms_norm_xpu.sycl` | SYCL; one work-group per row, `sycl::reduce_over_group` for the sum | XPU tensors, once built with `icpx` |
#
# The C++ kernel's core, and the file's length:

# %%
def show(path, start: str, stop: str | None = None) -> None:
    """Print the lines of a source file from the one containing `start` up to the one containing `stop`."""
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    last = next((i for i, line in enumerate(lines) if stop and stop in line and i > first), len(lines) - 1)
    print(f"// {path.name}, lines {first + 1}-{last + 1}")
    print("\n".join(lines[first:last + 1]))


show(ext.CPU_SOURCE, "AT_DISPATCH_FLOATING_TYPES", "return out;")
print()
show(ext.CPU_SOURCE, "TORCH_LIBRARY_IMPL")
print(f"\n{ext.CPU_SOURCE.name}: {len(ext.CPU_SOURCE.read_text().splitlines())} lines in all, comments included")

# %% [markdown]
# `AT_DISPATCH_FLOATING_TYPES_AND2` instantiates the lambda for float32, float64, bfloat16 and
# float16 (`scalar_t`); `at::opmath_type` accumulates bf16/fp16 in float32, as the reference does.
# `at::parallel_for(begin, end, grain, f)` splits the rows over ATen's intra-op thread pool (the
# threads `torch.set_num_threads` sets) in chunks of at least `grain` rows, so a small input stays
# on one thread. `TORCH_LIBRARY_IMPL(labs_ext, CPU, m)` adds this function as the CPU kernel of an op
# that is *defined elsewhere*: here, from Python.
#
# ## 4. Registration: schema, fallback, fake kernel, autograd
#
# Importing `helpers.ext` registers, with `torch.library`:
#
# ```python
# lib = torch.library.Library("labs_ext", "DEF")
# lib.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")       # the schema
# lib.impl("rms_norm", fallback, "CompositeExplicitAutograd")               # any device without a kernel
# torch.library.register_fake("labs_ext::rms_norm", fake)                   # shapes only: for torch.compile
# torch.library.register_autograd("labs_ext::rms_norm", backward, setup_context=setup_context)
# ```
#
# Defining the schema in Python (instead of a `TORCH_LIBRARY` block in C++) keeps the op usable where
# nothing could be built, and lets the C++ and SYCL files add kernels independently; a rebuilt library
# replaces its earlier kernel (torch warns that it overrides it). The price: the op exists only where
# this Python module was imported. A C++-only consumer (a LibTorch program, an AOTInductor package
# loaded from C++) cannot see it, and the example wheel of section 11 imports `helpers.ext` for the same
# reason. PyTorch's C++ tutorial defines the schema in C++ instead (`TORCH_LIBRARY`) and keeps only the
# fake kernel in Python; section 8b builds an op that way. The **fake kernel** computes only the
# output's shape, dtype and strides: `torch.compile` traces with fake tensors, and without one an op
# from C++ cannot be traced. The **autograd formula** is written with PyTorch operations, so it runs on
# every device and `torch.compile` can trace it too. The dispatcher's table for the op, before any C++
# is loaded (`torch._C._dispatch_dump` is private, for debugging):

# %%
print(torch._C._dispatch_dump(ext.RMS_NORM))
print("kernels of its own:", ext.native_kernels())

# %% [markdown]
# ## 5. Build the C++ kernel
#
# `ext.load_cpu_kernels()` compiles `rms_norm_cpu.cpp` with `torch.utils.cpp_extension.load_inline`
# into `~/.cache/pytorch-210-labs/ext/<name>-<hash>/` (or under `$LABS_CACHE`), where the hash covers
# the source, the flags, torch's and Python's versions. It then loads the library with
# `torch.ops.load_library`, which runs its `TORCH_LIBRARY_IMPL` block. A later call, in this process
# or any other, finds the library and only loads it: the lesson, the lab and the tests build each
# source once per machine. The cell prints how long the first build took (most of it is parsing
# torch's headers); `no_implicit_headers=True` keeps `load_inline` from adding
# `#include <torch/extension.h>` (Python bindings the kernel does not need).

# %%
HAVE_CXX = requires("cxx", "ninja", section="Build the C++ CPU kernel")
if HAVE_CXX:
    built = ext.load_cpu_kernels()
    state = "loaded from the cache" if built.cached else "built now"
    print(f"{built.path.name}: {state}; the build took {built.build_s:.1f} s when it ran, "
          f"this call {built.load_s:.3f} s")
else:
    print("No C++ kernel here: every call below runs the PyTorch reference through the same op.")
print("labs_ext::rms_norm on CPU tensors runs:", ext.kernel_for("cpu"))

# %% [markdown]
# ## 6. Check: the same numbers as the reference
#
# Odd shapes (one element, a 3-D input, empty inputs, a width that is not a multiple of anything),
# four dtypes, a non-contiguous input. bf16 and fp16 compare within their rounding step; float32 and
# float64 within accumulated rounding error. torch's own `F.rms_norm` must agree too.

# %% tags=["nbval-check-output"]
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12),
              torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}
cases = 0
for shape in [(1, 1), (3, 7), (2, 5, 33), (0, 8), (4, 0), (ROWS // 8, HIDDEN + 1)]:
    for dtype, (atol, rtol) in TOLERANCES.items():
        x = torch.randn(shape, dtype=dtype) * 3
        w = torch.rand(shape[-1], dtype=dtype)
        torch.testing.assert_close(ext.rms_norm(x, w), ext.rms_norm_reference(x, w), atol=atol, rtol=rtol)
        cases += 1
x_t = torch.randn(64, 48).t()                     # non-contiguous: the kernel copies it first
w = torch.rand(64)
torch.testing.assert_close(ext.rms_norm(x_t, w), ext.rms_norm_reference(x_t, w))
torch.testing.assert_close(ext.rms_norm(x_t, w), torch.nn.functional.rms_norm(x_t, (64,), w, eps=1e-6))
print(f"{cases + 1} cases match the reference; F.rms_norm agrees")

# %% [markdown]
# ## 7. Prove the registration: `opcheck` and `gradcheck`
#
# `torch.library.opcheck` runs four tests on each sample: `test_schema` (the kernel does not mutate
# its inputs or return an alias, as the schema promises), `test_autograd_registration` (inputs that
# require grad reach a registered autograd formula), `test_faketensor` (the fake kernel's output has
# the real output's shape, dtype and strides) and `test_aot_dispatch_dynamic` (the op traces through
# `torch.compile`'s AOT autograd with dynamic shapes). It does not check that the gradients are
# right: `torch.autograd.gradcheck` compares the formula with finite differences, in float64.

# %% tags=["nbval-check-output"]
samples = ext.sample_inputs(quick=True)[:: 3 if QUICK else 1]   # quick: float32, bfloat16, transposed
for args in samples:
    result = torch.library.opcheck(torch.ops.labs_ext.rms_norm.default, args)
    assert set(result.values()) == {"SUCCESS"}, result
print(f"opcheck on {len(samples)} samples: {result}")
x64 = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
w64 = torch.rand(6, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(lambda a, b: torch.ops.labs_ext.rms_norm(a, b, 1e-6), (x64, w64))
print("gradcheck (float64, finite differences): passed")


# %% [markdown]
# ## 8. Under `torch.compile`
#
# A pre-norm residual block, `x + rms_norm(x) @ proj`, compiled with `fullgraph=True` (any graph
# break raises). The custom op appears in the captured graph as one opaque call: the compiler
# generates code for what surrounds it and calls the op's kernel as it is (full mode prints the
# generated wrapper's calls). Opaque cuts both ways: Inductor cannot fuse the norm with the residual
# add or the matmul next to it, as it would fuse the reference's operations (section 9 measures what
# that fusion is worth). Quick mode compiles with the `aot_eager` backend (tracing with the fake
# kernel and the autograd formula, without generating code); full mode with Inductor, which generates
# C++ for the CPU and needs a C++ compiler: without one, full mode stays on `aot_eager` and says so.

# %%
def block(x, weight, proj):
    return x + ext.rms_norm(x, weight) @ proj


captured = []


def show_graph(gm, example_inputs):
    captured.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
    print("captured graph:", captured)
    return gm.forward


torch._dynamo.reset()
xb = torch.randn(16, 64)
wb, proj = torch.rand(64, requires_grad=True), torch.randn(64, 64) / 8
torch.compile(block, backend=show_graph, fullgraph=True)(xb, wb, proj)
assert any("labs_ext.rms_norm" in target for target in captured), "the custom op is not in the graph"

BACKEND = "inductor" if not QUICK and caps.toolchains["cxx"] else "aot_eager"
if not QUICK and BACKEND != "inductor":
    print("no C++ compiler: full mode compiles with aot_eager too (Inductor's CPU backend generates C++)")
xg = xb.clone().requires_grad_(True)
compiled = torch.compile(block, backend=BACKEND, fullgraph=True)
out = compiled(xg, wb, proj)
out.square().sum().backward()
grads_compiled = xg.grad.clone(), wb.grad.clone()
xg.grad, wb.grad = None, None
expected = xg + ext.rms_norm_reference(xg, wb) @ proj
expected.square().sum().backward()
torch.testing.assert_close(out, expected)
for got, want in zip(grads_compiled, (xg.grad, wb.grad)):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
print(f"torch.compile(backend={BACKEND!r}, fullgraph=True): output and both gradients match eager")
if BACKEND == "inductor":
    with torch.no_grad():
        generated = fusion.inspect_compiled(block, xb, wb.detach(), proj)
    print("the generated wrapper calls:", *fusion.wrapper_calls(generated.code), sep="\n  ")

# %% [markdown]
# ## 8b. Two more ways to define an op: `torch.library.custom_op`, and a schema in C++
#
# **The Python route.** Since 2.4 the recommended way to make a Python function an op is
# `torch.library.custom_op` (https://docs.pytorch.org/docs/stable/library.html): the decorator infers
# the schema from the type hints, and `mutates_args` says which arguments the function writes to
# (`()` for none). The kernel can be anything Python can call (NumPy, a Triton launcher, a C library
# through ctypes): `torch.compile` treats it as opaque, and `register_fake`, `register_autograd`,
# `register_kernel("xpu")` attach the rest, as for `labs_ext::rms_norm`. The same RMSNorm, and an
# **in-place** variant that writes its result into `x`:

# %%
from torch import Tensor


@torch.library.custom_op("labs_py::rms_norm", mutates_args=())
def rms_norm_py(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return ext.rms_norm_reference(x, weight, eps)        # any Python: this is the kernel


@rms_norm_py.register_fake
def _(x, weight, eps=1e-6):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("labs_py::rms_norm_", mutates_args=("x",))
def rms_norm_py_(x: Tensor, weight: Tensor, eps: float = 1e-6) -> None:
    x.copy_(ext.rms_norm_reference(x, weight, eps))     # writes x: declared in mutates_args


@rms_norm_py_.register_fake
def _(x, weight, eps=1e-6):
    return None                                       # an in-place op returns nothing


print("inferred schemas:")
for op in (rms_norm_py, rms_norm_py_):
    print(" ", str(op._opoverload._schema).replace("9.9999999999999995e-07", "1e-06"))

# %% tags=["nbval-check-output"]
x8, w8 = torch.randn(4, 8), torch.rand(8)
for op, args in ((rms_norm_py, (x8, w8)), (rms_norm_py_, (x8.clone(), w8))):
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result
x_inplace = x8.clone()
assert rms_norm_py_(x_inplace, w8) is None
torch.testing.assert_close(x_inplace, ext.rms_norm(x8, w8))
torch.testing.assert_close(torch.compile(rms_norm_py, backend="aot_eager", fullgraph=True)(x8, w8), ext.rms_norm(x8, w8))
print("opcheck passes for both; the in-place op wrote ext.rms_norm's result into x; compiled == eager")


# %% [markdown]
# `(Tensor(a0!) x ...) -> ()` is the schema language's way to say "writes `x`, returns nothing". Under
# `torch.compile` a mutable op is *functionalised*: the graph calls it through
# `auto_functionalized` on a copy, then writes the copy back, so every compiler pass sees pure
# functions. That is why the declaration must be true: `opcheck`'s `test_schema` runs the op and
# compares the inputs before and after. An op that writes its input but declares `mutates_args=()`:

# %%
@torch.library.custom_op("labs_py::scale_twice", mutates_args=())     # a lie: it writes x
def scale_twice(x: Tensor) -> Tensor:
    x.mul_(2)
    return x.clone()


@scale_twice.register_fake
def _(x):
    return torch.empty_like(x)


outcome = torch.library.opcheck(scale_twice, (torch.randn(3),), raise_exception=False)
print("test_schema:", str(outcome["test_schema"]).splitlines()[0][:200])

# %% [markdown]
# **The C++ route with the schema in C++.** `TORCH_LIBRARY(ns, m) { m.def("...") }` defines the op in the
# library itself, so it exists wherever the `.so` is loaded (from Python with `torch.ops.load_library`,
# or linked into a C++ program); only the fake kernel stays in Python. The in-place RMSNorm in C++,
# built with the same cached `ext.build_and_load`:

# %%
INPLACE_CPP = r"""
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cmath>

// x <- x / sqrt(mean(x^2 over the last dim) + eps) * weight, in place: the schema says Tensor(a!) x
void rms_norm_inplace_cpu(at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1)
              && weight.scalar_type() == x.scalar_type(), "rms_norm_: contiguous x, weight of shape (x.size(-1),)");
  const at::Tensor w = weight.contiguous();
  const int64_t n = x.numel() == 0 ? 0 : x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    scalar_t* xp = x.mutable_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* row = xp + r * n;
        acc_t sum_sq = 0;
        for (int64_t j = 0; j < n; ++j) sum_sq += static_cast<acc_t>(row[j]) * static_cast<acc_t>(row[j]);
        const acc_t rstd = acc_t(1) / std::sqrt(sum_sq / static_cast<acc_t>(n) + static_cast<acc_t>(eps));
        for (int64_t j = 0; j < n; ++j)
          row[j] = static_cast<scalar_t>(static_cast<acc_t>(row[j]) * rstd * static_cast<acc_t>(wp[j]));
      }
    });
  });
}

TORCH_LIBRARY(labs_cpp, m) {      // the schema, defined in C++: the op exists wherever the .so is loaded
  m.def("rms_norm_(Tensor(a!) x, Tensor weight, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(labs_cpp, CPU, m) {
  m.impl("rms_norm_", &rms_norm_inplace_cpu);
}
"""

if requires("cxx", "ninja", section="A mutable op with its schema in C++"):
    built_inplace = ext.build_and_load("labs_cpp_inplace", INPLACE_CPP)
    print(f"{built_inplace.path.name}: {'loaded from the cache' if built_inplace.cached else 'built now'} "
          f"(the build took {built_inplace.build_s:.1f} s when it ran)")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("labs_cpp::rms_norm_", "Meta"):
        torch.library.register_fake("labs_cpp::rms_norm_")(lambda x, weight, eps: None)   # the Python half
    print("schema from C++:", torch.ops.labs_cpp.rms_norm_.default._schema)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x_cpp, w_cpp = torch.randn(5, 33, dtype=dtype), torch.rand(33, dtype=dtype)
        want = ext.rms_norm_reference(x_cpp, w_cpp)
        torch.ops.labs_cpp.rms_norm_(x_cpp, w_cpp, 1e-6)
        torch.testing.assert_close(x_cpp, want, **({} if dtype != torch.bfloat16 else dict(atol=1.6e-2, rtol=1e-2)))
        result = torch.library.opcheck(torch.ops.labs_cpp.rms_norm_.default, (torch.randn(4, 8, dtype=dtype),
                                                                              torch.rand(8, dtype=dtype), 1e-6))
        assert set(result.values()) == {"SUCCESS"}, result
    print("labs_cpp::rms_norm_ writes the reference's result into x (float32, float64, bfloat16); opcheck passes")

# %% [markdown]
# ## 9. Measure: reference, `F.rms_norm`, the op, and `torch.compile` of the reference, side by side
#
# The honest question for a hand-written kernel is whether it beats the compiler. RMSNorm is exactly
# what Inductor fuses on its own: compiled, the reference's six operations become one generated loop
# (C++ with OpenMP on a CPU, one Triton kernel on a GPU). `ext.compare_with_compiled` compiles the
# reference (untimed, printed below with the kernel Inductor generated), then times the four with
# `helpers.bench.compare` (interleaved, median of repeats, `device="cpu"`) on CPU tensors of
# `ROWS x HIDDEN` float32, and reports the effective bandwidth: the bytes a fused
# kernel must move (read x, write y) divided by the time. On a machine without a compiler,
# `labs_ext.rms_norm` is the reference plus the dispatcher's overhead, and the compiled candidate is
# left out (Inductor needs the compiler too).

# %%
timing = dict(repeats=3 if QUICK else 7, min_run_time=0.02 if QUICK else 0.2, device="cpu")
if requires("cxx", section="RMSNorm against torch.compile of the reference"):
    result = ext.compare_with_compiled(ROWS, HIDDEN, **timing)
    print(f"torch.compile(reference) generated {result['compiled_kernels']} (first call {result['compile_s']:.1f} s)")
else:
    result = ext.compare_kernels(ROWS, HIDDEN, **timing)
print(f"{ROWS} x {HIDDEN} float32 on {result['threads']} threads; labs_ext.rms_norm runs: {result['kernel']}")
print(bench.table(result))
for name, r in result["results"].items():
    print(f"{name:<28}{r['GB_per_s']:8.1f} GB/s effective")
bench.plot(result, title=f"RMSNorm, {ROWS} x {HIDDEN} float32, CPU").show()

# %% [markdown]
# **What the numbers mean.** Read the ratio column: the candidates were measured interleaved in one
# run, so the ratios hold even when a busy machine shifts the absolute times (a wide spread column is
# the sign of one). For float32 the reference reads a full-size tensor four times and writes three
# (square, mean, two multiplies); the fused C++ kernel reads each row twice and writes it once, so on
# inputs larger than the caches it should win by about the ratio of bytes moved. On small inputs
# (move the slider below) the fixed cost per call (Python, the dispatcher, waking the thread pool)
# dominates and the differences shrink or reverse. `torch.compile(reference)` is the compiler's fused loop: if it is as fast as the C++ kernel, the
# hand-written kernel buys nothing on this CPU but opacity (and a build); what it still offers is
# control (a layout, a dtype, a device Inductor does not handle well). `F.rms_norm` is torch's own implementation; whether
# it is fused on your CPU depends on the torch build, and the measurement tells you. One detail in the
# kernel matters for speed: it sums squares into 8 independent partial sums, because a single running
# sum makes every addition wait for the previous one.

# %%
import ipywidgets as widgets

from helpers.interactive import interact


def time_width(log2_hidden=10):
    r = ext.compare_kernels(64, 2 ** log2_hidden, repeats=3, min_run_time=0.02)
    ratio = r["results"]["labs_ext.rms_norm"]["ratio_to_baseline"]
    print(f"64 x {2 ** log2_hidden}: labs_ext.rms_norm ({r['kernel']}) is {ratio:.2f}x the reference")


interact(time_width, log2_hidden=widgets.IntSlider(value=10, min=4, max=16, step=2));

# %% [markdown]
# ## 10. The SYCL kernel, on an Intel GPU
#
# The same op for XPU tensors, from `helpers/ext/rms_norm_xpu.sycl`. One work-group of 256 work-items
# per row: each work-item sums the squares of every 256th element, `sycl::reduce_over_group` adds the
# partial sums, then each work-item scales its elements. The kernel is a functor (a struct with
# `operator()`); `c10::xpu::getCurrentXPUStream().queue()` is the SYCL queue of torch's current XPU
# stream, so the kernel is ordered with torch's own work. It has no float64 kernel: several Intel
# GPUs (Arc A-series) lack native fp64.

# %%
show(ext.SYCL_SOURCE, "struct RmsNormKernel", "const scalar_t* x;")

# %% [markdown]
# Building it needs three things this lesson's CI machine does not have: an Intel GPU with its driver,
# an XPU build of torch (`environments/xpu.txt`; the wheel ships its own SYCL runtime) and Intel's
# DPC++ compiler `icpx` (`icx` on Windows) of the oneAPI version torch was built with, for example from
# Intel's Deep Learning Essentials. Without them the cell prints what is missing; it shows no output
# it did not compute.

# %%
if requires("xpu", "sycl", section="Build and run the SYCL kernel"):
    built_xpu = ext.load_xpu_kernels()
    print(f"{built_xpu.path.name}: {'cached' if built_xpu.cached else 'built'}, build {built_xpu.build_s:.1f} s")
    for args in ext.sample_inputs("xpu", quick=QUICK):
        torch.testing.assert_close(ext.rms_norm(*args[:2], args[2]).cpu(),
                                   ext.rms_norm_reference(*(a.cpu() for a in args[:2]), args[2]),
                                   atol=2e-2, rtol=2e-2)
        assert set(torch.library.opcheck(torch.ops.labs_ext.rms_norm.default, args).values()) == {"SUCCESS"}
    print("SYCL kernel: matches the reference; opcheck passes on XPU")
    xpu_result = ext.compare_kernels(ROWS, HIDDEN, repeats=3 if QUICK else 7, device="xpu",
                                     min_run_time=0.02 if QUICK else 0.2)
    print(bench.table(xpu_result))
    bench.plot(xpu_result, title=f"RMSNorm, {ROWS} x {HIDDEN} float32, {caps.device_name}").show()

# %% [markdown]
# ## 11. Packaging: `SyclExtension` in a `setup.py`
#
# `load_inline` suits lessons and experiments. A library you ship is built ahead of time into a wheel:
# `helpers/ext/example_setup/setup.py` builds the same two source files with `SyclExtension` where an
# XPU torch and the SYCL compiler exist, and with `CppExtension` (CPU kernel only) elsewhere. Its
# README has the Linux and Windows notes: `pip install --no-build-isolation .` (so the build uses your
# installed torch), ninja required, `.sycl` files go to `icpx`/`icx` and `.cpp` files to the host
# compiler, `TORCH_XPU_ARCH_LIST` selects the GPU architectures compiled ahead of time (see the pitfalls),
# and SYCL builds on Windows need torch 2.10 or newer.

# %%
setup_py = ext.SOURCES / "example_setup" / "setup.py"
show(setup_py, "sources = [", "install_requires")


# %% [markdown]
# ## 12. The op in `torch.export` and an AOTInductor package
#
# `torch.export` captures a whole model ahead of time into an `ExportedProgram`: one graph of ATen and
# custom ops, no Python left. The custom op stays one node (its fake kernel gave the shapes).
# `torch._inductor.aoti_compile_and_package` then compiles that graph into a `.pt2` package with a
# shared library, loadable from Python (`aoti_load_package`) or C++ without the model's Python code
# (https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html). AOTInductor cannot compile
# an opaque op, so the package calls it through the dispatcher at run time (its *proxy executor*): the
# process that loads the package must have the op registered. For `labs_ext::rms_norm`, whose schema is
# defined in Python, that means importing `helpers.ext`; an op defined with `TORCH_LIBRARY` in a library
# would only need that library loaded.

# %% tags=["nbval-check-output"]
class PreNormBlock(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden))
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        return x + self.proj(ext.rms_norm(x, self.weight))


model = PreNormBlock(64).eval()
x_export = torch.randn(16, 64)
exported = torch.export.export(model, (x_export,))
targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
assert "labs_ext.rms_norm.default" in targets
with torch.no_grad():
    torch.testing.assert_close(exported.module()(x_export), model(x_export))
print("exported graph:", targets)
print("the exported program gives the eager model's output")

# %%
if requires("cxx", section="AOTInductor package with the custom op"):
    if QUICK:
        print("quick mode: the package is not compiled (AOTInductor builds the whole model as C++, "
              "the slowest step of the lesson); run with QUICK = False to build it")
    else:
        start = time.perf_counter()
        package = torch._inductor.aoti_compile_and_package(
            exported, package_path=os.path.join(tempfile.mkdtemp(), "prenorm_block.pt2"))
        compile_s = time.perf_counter() - start
        loaded = torch._inductor.aoti_load_package(package)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x_export), model(x_export))
        print(f"{os.path.basename(package)}: compiled in {compile_s:.1f} s; its output matches the model")
        print("ops the package calls through the dispatcher (must be registered where it runs):",
              ext.package_proxy_calls(package))

# %% [markdown]
# ### The LibTorch stable ABI
#
# A C++ extension like ours is built against one torch: its `.so` links to libtorch's C++ symbols, so a
# new torch needs a rebuild (the cache key in `ext.build_directory` includes torch's version for that
# reason). The *stable ABI* is the way out: a kernel written against `torch/csrc/stable` (a
# `torch::stable::Tensor`, registered with `STABLE_TORCH_LIBRARY` and `STABLE_TORCH_LIBRARY_IMPL`) and
# `torch/headeronly` (`ScalarType`, macros and utilities without libtorch) talks to torch only through
# a C shim, so one build serves later torch versions too; `TORCH_TARGET_VERSION` (in
# `torch/csrc/stable/version.h`) pins the oldest torch the build must load in
# (https://docs.pytorch.org/docs/stable/notes/libtorch_stable_abi.html). In 2.10 the surface is still
# small: a handful of tensor ops, `parallel_for`, device and accelerator helpers. What the installed
# torch ships:

# %%
abi = ext.stable_abi_headers()
print("torch/csrc/stable:", ", ".join(abi["stable"]))
print("torch/headeronly: ", ", ".join(abi["headeronly"]))
print(f"torch::stable ops in ops.h ({len(abi['ops'])}):", ", ".join(abi["ops"]))

# %% [markdown]
# ## What changes on other hardware
#
# - **Intel GPU with an XPU torch and `icpx`**: the `xpu` and `sycl` sections run; `labs_ext.rms_norm`
#   on XPU tensors runs the SYCL kernel; the CPU kernel still serves CPU tensors.
# - **Intel GPU without `icpx`**: the `xpu` section runs, the SYCL build is skipped, and XPU tensors
#   run the PyTorch reference through the same op (correct, not fused).
# - **NVIDIA or AMD GPU**: CUDA/ROCm tensors run the reference; a CUDA or HIP kernel would be one more
#   `TORCH_LIBRARY_IMPL(labs_ext, CUDA, m)` block built with `CUDAExtension`, and nothing else about
#   the op (schema, fake kernel, autograd) changes. That is what makes the op device-agnostic.
# - **More CPU cores**: `at::parallel_for` spreads the rows over more threads; the reference's
#   separate passes are each parallel too, so the ratio depends on memory bandwidth more than cores.
#
# ## What the article got wrong
#
# - **"Upcoming Gaudi accelerators" under the XPU API**: Gaudi is not an XPU device. It is HPU,
#   supported out of tree by Intel's Gaudi software.
# - **"New hardware abstraction interfaces"**: the 2.10 `torch.xpu` additions are the memory-fraction
#   and pluggable-allocator calls in section 2 (plus new XPU kernels); the device-agnostic layer is
#   `torch.accelerator`, which predates 2.10.
# - **"scaled_mm ... with automatic scaling factor management"**: `torch._scaled_mm` takes the scales
#   as required arguments (`scale_a`, `scale_b`); you compute them.
# - **"SYCL compilation ... across all major operating systems"**: SYCL extensions build on Linux
#   (since 2.8) and, new in 2.10, on Windows; macOS has no XPU build of torch.
#
# ## Pitfalls
#
# **`load_inline(sycl_sources=...)` on a torch without XPU support.** The real error: on a CPU build
# with ninja present it is an `OSError` about the SYCL runtime (torch 2.10-2.13 spell it "dected"; 2.14 fixed the typo);
# without ninja, torch stops earlier and asks for ninja.

# %%
if not caps.xpu_compiled:
    from torch.utils.cpp_extension import load_inline
    try:
        load_inline("sycl_probe", cpp_sources="", sycl_sources="// any SYCL source\n",
                    build_directory=tempfile.mkdtemp(), is_python_module=False, no_implicit_headers=True)
    except (OSError, RuntimeError) as exc:
        print(f"{type(exc).__name__}: {exc}")
else:
    print("This torch is an XPU build: it finds its SYCL runtime, and the call would start a real build.")

# %% [markdown]
# **`torch.xpu` calls on a torch without XPU support** fail at their first use of the device; check
# `torch.xpu.is_available()` (or ask `helpers.device`) first. `torch.xpu._is_compiled()` tells a CPU
# wheel (False) from a missing driver (True, but not available).

# %%
if not torch.xpu.is_available():
    try:
        torch.xpu.set_per_process_memory_fraction(0.5)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
    print("torch.xpu._is_compiled():", torch.xpu._is_compiled())
else:
    print("An Intel GPU is available here: the call works (section 2).")

# %% [markdown]
# **A missing compiler.** `helpers.ext` asks `helpers.device` before building and says what to install;
# `load_inline` itself would fail later with a longer message. Here with an empty `PATH`, for a source
# that is not in the cache:

# %% tags=["nbval-check-output"]
saved_path = os.environ["PATH"]
os.environ["PATH"] = tempfile.mkdtemp()
try:
    ext.build_and_load("labs_ext_demo", "// never built\n")
except ext.BuildError as exc:
    print(f"BuildError: {exc}")
finally:
    os.environ["PATH"] = saved_path

# %% [markdown]
# **A fake kernel that lies.** Registration accepts any function; a wrong fake kernel fails only when
# something traces the op, far from the cause. `opcheck` finds it at once. Here a demo op whose fake
# kernel returns float64 for float32 inputs:

# %% tags=["nbval-check-output"]
demo = torch.library.Library("labs_demo", "DEF")
demo.define("double_it(Tensor x) -> Tensor")
demo.impl("double_it", lambda x: x * 2, "CPU")
torch.library.register_fake("labs_demo::double_it", lambda x: torch.empty_like(x, dtype=torch.float64), lib=demo)
outcome = torch.library.opcheck(torch.ops.labs_demo.double_it.default, (torch.randn(3),),
                                test_utils=("test_faketensor",), raise_exception=False)
print("test_faketensor:", str(outcome["test_faketensor"]).splitlines()[0])

# %% [markdown]
# More pitfalls, each from real reports:
#
# - **No autograd formula**: without `register_autograd`, backward goes through a deprecated fallback
#   that warns "an autograd kernel was not registered to the Autograd key(s) but we are trying to
#   backprop through it"; with a C++ kernel the inputs then get no gradient. `opcheck`'s
#   `test_autograd_registration` catches it; the lab's checks do too.
# - **A killed build** leaves a `lock` file in the build directory, and the next `load_inline` for that
#   directory waits for it to disappear, forever (torch's `FileBaton.wait`); `helpers.ext` removes
#   locks older than 10 minutes. Old cache directories (`~/.cache/pytorch-210-labs/ext/`) are safe to
#   delete.
# - **"Ninja is required to build SyclExtension"**: `pip install ninja`.
# - **`RuntimeError: UR error` or `ImportError: libpti_view.so`** after sourcing oneAPI's `setvars`:
#   the XPU wheel ships its own SYCL runtime; build with the oneAPI version torch was built with
#   (`python -m torch.utils.collect_env`) and do not source the full oneAPI environment at run time.
# - **Architectures and build time**: torch compiles SYCL sources ahead of time for every architecture
#   in `torch.xpu.get_arch_list()` except `dg2*` (Arc A-series), plus SPIR-V that the driver compiles
#   on first launch for any other Intel GPU (`_get_sycl_arch_list` and `_append_sycl_targets_if_missing`
#   in `torch.utils.cpp_extension`), so a build does run elsewhere, but takes minutes of ahead-of-time
#   compilation. `TORCH_XPU_ARCH_LIST` chooses: `"bmg"` for one architecture, `""` for SPIR-V only
#   (what `ext.load_xpu_kernels` uses unless you set it: a short build, a compile on first launch).
# - **`torch.xpu.mem_get_info()` raises** "... doesn't support querying the available free memory"
#   on drivers that report free memory only through Level Zero sysman (Data Center GPU Max among them):
#   set `ZES_ENABLE_SYSMAN=1` before the process starts, or read the total from
#   `torch.xpu.get_device_properties(0).total_memory`, as section 3 does.
# - **The kernel on the wrong GPU**: a kernel registered with `TORCH_LIBRARY_IMPL` gets no device guard
#   from torch. Without `c10::DeviceGuard guard(x.device())` and the queue of `x`'s device, a tensor on
#   `xpu:1` is launched on `xpu:0`'s queue; `rms_norm_xpu.sycl` sets both.
