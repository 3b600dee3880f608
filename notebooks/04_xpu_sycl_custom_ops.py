# %% [markdown]
# # 04 · Custom ops end to end: one RMSNorm from a C++ kernel to `torch.export`, with its SYCL kernel for Intel GPUs
#
# | | |
# |---|---|
# | **What you will learn** | one op (a fused RMSNorm) through its whole life: a C++ kernel for the CPU and a SYCL kernel for Intel GPUs registered to the same op; its schema, fake kernel and autograd formula with `torch.library`; `torch.compile` with and without a fake kernel; proof with `torch.library.opcheck`; the hand-written kernel against Inductor's; the op inside `torch.export` |
# | **Prerequisites** | lesson 00; reading a little C++ helps |
# | **Hardware** | any CPU. The C++ kernels and Inductor on a CPU need a C++ compiler and ninja (without them those cells say what they skip); the SYCL kernel an Intel GPU, an XPU build of torch and `icpx` |
# | **Time** | 43 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# The story: an op and its reference → kernel 1, C++ for the CPU → kernel 2, SYCL for an Intel GPU, on the
# same op → what `torch.compile` needs (a fake kernel) → proof with `opcheck` → your turn: a mutable op →
# does Inductor beat the C++ kernel? → `torch.export`.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/04_xpu_sycl_custom_ops.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False        # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
ROWS, HIDDEN = 4096, 4096   # the RMSNorm input measured: ROWS rows of HIDDEN values

# %%
import torch
from torch import Tensor

from helpers import bench, ext
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)   # LABS_QUICK=1 in the environment also turns it on (the test suite does)
DEVICE = pick_device()
caps = capabilities()
if QUICK:
    ROWS, HIDDEN = 256, 1024
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · quick={QUICK}")
print(f"compilers on PATH: c++ {caps.toolchains['cxx']}, ninja {caps.toolchains['ninja']}, "
      f"icpx {caps.toolchains['icpx']}")

# %% [markdown]
# ## The op: RMSNorm, its schema and its reference
#
# **RMSNorm** normalises each row by its root mean square: `y = x / sqrt(mean(x²) + eps) * weight`. In
# PyTorch operations it is six operations (square, mean, add `eps`, rsqrt, two multiplies); a fused kernel
# reads each row twice and writes it once. Importing `helpers.ext` defines the op `labs_ext::rms_norm`
# from Python with `torch.library`:
#
# ```python
# lib = torch.library.Library("labs_ext", "DEF")
# lib.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")       # the schema
# lib.impl("rms_norm", fallback, "CompositeExplicitAutograd")               # any device without a kernel
# torch.library.register_fake("labs_ext::rms_norm", fake)                   # shapes only: for torch.compile
# torch.library.register_autograd("labs_ext::rms_norm", backward, setup_context=setup_context)
# ```
#
# So the op works on every device before any C++ exists; each kernel below adds one device's entry to the
# dispatcher's table (the deep dive reads that table line by line).
#
# The op is device-agnostic: its caller never names a device, and neither does the fake kernel. On the
# `meta` device (shapes without data, what `torch.compile` traces with) the fake kernel answers:

# %% tags=["nbval-check-output"]
for device in ("cpu", "meta"):
    y = ext.rms_norm(torch.randn(3, 8, device=device), torch.ones(8, device=device))
    assert y.shape == (3, 8) and y.device.type == device
    print(f"{device}: shape {tuple(y.shape)}, dtype {y.dtype}")

# %% [markdown]
# ## Kernel 1: C++ for the CPU
#
# `helpers/ext/rms_norm_cpu.cpp`: `AT_DISPATCH_FLOATING_TYPES_AND2` instantiates the kernel for four dtypes,
# `at::opmath_type` accumulates bf16/fp16 in float32, `at::parallel_for` splits the rows over ATen's threads.
# Its last lines add it as the **CPU** kernel of an op *defined elsewhere*:

# %%
ext.show(ext.CPU_SOURCE, "at::parallel_for(0, rows", "return out;")
print()
ext.show(ext.CPU_SOURCE, "TORCH_LIBRARY_IMPL")

# %% [markdown]
# `ext.load_cpu_kernels()` compiles it with `torch.utils.cpp_extension.load_inline` into a cache directory
# keyed by a hash of source, flags and versions, then `torch.ops.load_library` runs its `TORCH_LIBRARY_IMPL`
# block. Later calls, in any process, only load the cached library.

# %% tags=["predict"]
build_guess = predict("The C++ file is about 70 lines. How many seconds does its first build take "
                      "(compiling and linking it with -O3)?", unit="s", example=2.0)

# %%
HAVE_CXX = requires("cxx", "ninja", section="Build the C++ CPU kernel")
if HAVE_CXX:
    built = ext.load_cpu_kernels()
    state = "loaded from the cache" if built.cached else "built now"
    print(f"{built.path.name}: {state}; the build took {built.build_s:.1f} s when it ran")
else:
    print("No C++ kernel here: every call below runs the PyTorch reference through the same op.")
print("labs_ext::rms_norm on CPU tensors runs:", ext.kernel_for("cpu"))
print([line for line in torch._C._dispatch_dump(ext.RMS_NORM).splitlines() if line.startswith("CPU")])
if HAVE_CXX:
    reveal(build_guess, round(built.build_s, 1), tolerance=2,
           why="almost none of it is our 70 lines: the compiler parses ATen's headers (Tensor, the "
               "dispatch macros, the parallel backend) and instantiates the kernel for four dtypes. The "
               "deep dive's stable-ABI build includes only small headers: compare its time there.")
else:
    print("No build here, so nothing to reveal: without a compiler the op runs the reference.")

# %% [markdown]
# Odd shapes (one element, a 3-D input, empty inputs, an odd width), four dtypes and a non-contiguous
# input: the kernel must give the reference's numbers, and torch's own `F.rms_norm` must agree.

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
# ## Kernel 2: the same op on an Intel GPU, in SYCL
#
# A second device is one more `TORCH_LIBRARY_IMPL` block, for the **XPU** key; schema, fake kernel and
# autograd formula serve both. `helpers/ext/rms_norm_xpu.sycl` runs one work-group of 256 work-items per row;
# `sycl::reduce_over_group` adds their partial sums. A device guard and the queue of torch's current stream
# on `x`'s device keep a tensor on `xpu:1` on `xpu:1`, ordered with torch's own work.
#
#
# Building it needs an Intel GPU with its driver, an XPU build of torch and Intel's DPC++ compiler `icpx`
# (`icx` on Windows); `load_inline(..., sycl_sources=...)` arrived in 2.8 on Linux, 2.10 added Windows. The
# deep dive has the rest of the XPU story.

# %%
ext.show(ext.SYCL_SOURCE, "void operator()(sycl::nd_item<1>", "dst[j] = static_cast")
ext.show(ext.SYCL_SOURCE, "sycl::queue& queue", "TORCH_LIBRARY_IMPL(labs_ext, XPU")
if requires("xpu", "sycl", section="Build and run the SYCL kernel"):
    built_xpu = ext.load_xpu_kernels()
    print(f"{built_xpu.path.name}: {'cached' if built_xpu.cached else 'built'}, build {built_xpu.build_s:.1f} s")
    print("labs_ext::rms_norm on XPU tensors runs:", ext.kernel_for("xpu"))
    for args in ext.sample_inputs("xpu", quick=QUICK):
        torch.testing.assert_close(ext.rms_norm(*args[:2], args[2]).cpu(),
                                   ext.rms_norm_reference(*(a.cpu() for a in args[:2]), args[2]),
                                   atol=2e-2, rtol=2e-2)
        assert set(torch.library.opcheck(torch.ops.labs_ext.rms_norm.default, args).values()) == {"SUCCESS"}
    print("SYCL kernel: matches the reference (float32, bfloat16, float16); opcheck passes on XPU")
    xpu_result = ext.compare_kernels(ROWS, HIDDEN, repeats=3 if QUICK else 7, device="xpu",
                                     min_run_time=0.02 if QUICK else 0.2)
    print(bench.table(xpu_result))

# %% [markdown]
# ## What `torch.compile` needs: a fake kernel
#
# `torch.compile` and `torch.export` trace with **fake tensors**: metadata, no data. A C++ or SYCL kernel
# cannot run on them, so an op needs a *fake kernel* that computes only its output's metadata. What if an
# op has none? The next cell adds such an op to `labs_ext`. A namespace has exactly one defining block
# (`TORCH_LIBRARY`, `STABLE_TORCH_LIBRARY` or `Library(ns, "DEF")`); more definitions go in `FRAGMENT` blocks.

# %% tags=["predict"]
fake_guess = predict("An op has a CPU kernel but no fake kernel. What does torch.compile(f) do with a "
                     "function f that calls it (default settings)?",
                     options=["compiles f into one graph", "splits f: a graph break, the op runs eagerly",
                              "raises an error"],
                     example="compiles f into one graph")

# %%
frag = torch.library.Library("labs_ext", "FRAGMENT")
frag.define("rms_norm_nofake(Tensor x, Tensor weight, float eps) -> Tensor")
frag.impl("rms_norm_nofake", lambda x, weight, eps: ext.rms_norm_reference(x, weight, eps), "CPU")


def f(x, w):
    return torch.ops.labs_ext.rms_norm_nofake(x, w, 1e-6) * 2


def graph_breaks(fn, *args) -> int:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.compile(fn, backend="aot_eager")(*args)
    return sum(torch._dynamo.utils.counters["graph_break"].values())


xs, ws = torch.randn(4, 8), torch.rand(8)
try:
    breaks_without = graph_breaks(f, xs, ws)
    outcome = "splits f: a graph break, the op runs eagerly" if breaks_without else "compiles f into one graph"
except Exception as exc:                    # what a future torch might do instead
    breaks_without, outcome = None, "raises an error"
    print(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
torch.library.register_fake("labs_ext::rms_norm_nofake")(ext._rms_norm_fake)
breaks_with = graph_breaks(f, xs, ws)
print(f"graph breaks without a fake kernel: {breaks_without}; with one: {breaks_with}")
reveal(fake_guess, outcome,
       why=f"{breaks_without} graph break without the fake kernel, {breaks_with} with it. Dynamo runs every op on "
           "fake tensors to learn its output; an op with no fake kernel cannot run there, so Dynamo ends the "
           "graph before it, runs it eagerly and starts a new graph after it: two graphs, and nothing fused "
           "across the op. With fullgraph=True, and in torch.export, the same break is an error ('Operator does "
           "not support running with fake tensors').");

# %% [markdown]
# ## Proof: `opcheck` and `gradcheck`
#
# `torch.library.opcheck` runs four tests per sample: `test_schema` (no undeclared mutation or alias),
# `test_autograd_registration` (inputs that require grad reach an autograd formula), `test_faketensor` (the
# fake output's shape, dtype and strides match the real one) and `test_aot_dispatch_dynamic` (it traces
# through `torch.compile`'s AOT autograd with dynamic shapes). Whether the gradients are *right* is
# `torch.autograd.gradcheck`'s job (finite differences, float64).

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
# ### Your turn: a mutable op
#
# An op that writes into a tensor (in place, or an `out=` buffer) must say so: `torch.compile`
# *functionalises* it (a pure copy in the graph, written back after) and trusts the declaration.
# `torch.library.custom_op` makes a Python function an op, inferring the schema from its type hints;
# `mutates_args` names what it writes. `rms_norm_into` writes its result into a buffer the caller passes,
# and its declaration is wrong: fix `MUTATES`, run both cells. The check compares every argument before and
# after a call.

# %% tags=["your-turn"]
MUTATES = ("x",)     # the names of the arguments rms_norm_into writes to


def rms_norm_into(x: Tensor, weight: Tensor, eps: float, out: Tensor) -> None:
    out.copy_(ext.rms_norm_reference(x, weight, eps))


# %%
from helpers.checks import fail, passed, your_turn

attempts = []


def check_mutates():
    attempts.append(MUTATES)        # a fresh op name per try: an op name can be defined once per process
    if isinstance(MUTATES, str):
        fail("MUTATES", f"a string, {MUTATES!r}, not a tuple of names",
             "parentheses alone do not make a tuple: a one-element tuple needs a trailing comma")
    try:
        op = torch.library.custom_op(f"labs_turn::rms_norm_into_{len(attempts)}", rms_norm_into,
                                     mutates_args=tuple(MUTATES))
    except ValueError as exc:
        fail("MUTATES", str(exc), "use the names of the function's parameters")
    op.register_fake(lambda x, weight, eps, out: None)
    print("inferred schema:", op._opoverload._schema)
    args = (torch.randn(4, 8), torch.rand(8), 1e-6, torch.zeros(4, 8))
    before = [a.clone() if isinstance(a, Tensor) else a for a in args]
    op(*args)
    written = {name for name, a, b in zip(("x", "weight", "eps", "out"), args, before)
               if isinstance(a, Tensor) and not torch.equal(a, b)}
    declared = set(MUTATES)
    if declared != written:
        fail("MUTATES", f"{len(written - declared)} argument(s) written but not declared, "
                        f"{len(declared - written)} declared but not written",
             "every tensor the body writes (copy_, an in-place op) must be listed, and nothing else: a missing "
             "one can make torch.compile's results wrong, an extra one costs a copy. Read the body again")
    passed("the declared arguments are exactly the ones the op writes")
    print("opcheck:", torch.library.opcheck(op, args))


your_turn(check_mutates, what="declare what an op writes");

# %% [markdown]
# ## Against Inductor
#
# Under `torch.compile` the custom op is one opaque call in the graph (the deep dive compiles a block
# around it, forward and backward). Opaque cuts both ways: Inductor cannot fuse our norm with its
# neighbours, and on its own it fuses the reference's six operations into one generated loop (C++ on a CPU,
# Triton on a GPU). So: does the hand-written kernel beat the compiler? `ext.compare_with_compiled` compiles the reference (untimed), then
# times reference, `F.rms_norm`, our op and the compiled reference, interleaved, median of repeats, on one thread
# (compiled at one thread too: Inductor fixes its CPU code's thread count when it generates it).

# %% tags=["predict"]
inductor_guess = predict(f"On this CPU, one thread, {ROWS} x {HIDDEN} float32: our C++ kernel against "
                         "torch.compile(reference)?",
                         options=["the C++ kernel is faster (by more than 10%)", "within 10% of each other",
                                  "torch.compile is faster (by more than 10%)"],
                         example="the C++ kernel is faster (by more than 10%)")

# %%
timing = dict(repeats=3 if QUICK else 7, min_run_time=0.02 if QUICK else 0.2, threads=1, device="cpu")
if requires("cxx", section="RMSNorm against torch.compile of the reference"):
    result = ext.compare_with_compiled(ROWS, HIDDEN, **timing)
    print(f"torch.compile(reference) generated {result['compiled_kernels']} (first call {result['compile_s']:.1f} s)")
else:
    result = ext.compare_kernels(ROWS, HIDDEN, **timing)
print(f"{ROWS} x {HIDDEN} float32 on {result['threads']} thread; labs_ext.rms_norm runs: {result['kernel']}")
print(bench.table(result))
bench.plot(result, title=f"RMSNorm, {ROWS} x {HIDDEN} float32, CPU").show()
if "torch.compile(reference)" in result["results"]:
    t = {name: r["median_s"] for name, r in result["results"].items()}
    ratio = t["torch.compile(reference)"] / t["labs_ext.rms_norm"]      # > 1: our kernel is faster
    lo, hi = bench.speedup_range(result["results"], "torch.compile(reference)", "labs_ext.rms_norm")
    verdict = ("the C++ kernel is faster (by more than 10%)" if ratio > 1.1 else
               "torch.compile is faster (by more than 10%)" if ratio < 1 / 1.1 else "within 10% of each other")
    reveal(inductor_guess, verdict,
           why=f"the compiled reference took {ratio:.2f}x our kernel's time ({lo:.2f}x to {hi:.2f}x over the "
               f"repeats, one thread, {result['kernel']})"
               + (f"; that range crosses a 10% band edge, so which answer holds is {bench.NOISY}"
                  if lo <= 1.1 <= hi or lo <= 1 / 1.1 <= hi else "")
               + ". Both are one fused pass that reads each row twice and writes it once; "
               "what remains is vectorisation (Inductor emits SIMD code; our loop relies on the C++ compiler) "
               "and the fixed cost per call. Where they tie, the hand-written kernel buys nothing but a build "
               "and opacity; what it can still buy is control: a layout, a dtype, a device Inductor does not "
               "serve well."
               + (" The spread column shows the timing was disturbed (another load on this machine): rerun."
                  if any(r["max_s"] > 3 * r["min_s"] for r in result["results"].values()) else ""))
else:
    print("No C++ compiler: neither our kernel nor Inductor's was built here, so there is nothing to reveal.")


# %% [markdown]
# ## The op in `torch.export`
#
# `torch.export` captures a whole model ahead of time into an `ExportedProgram`: one graph of ATen and
# custom ops, no Python left. The custom op stays one node, its fake kernel giving the shapes. (The deep
# dive compiles this program into an AOTInductor package.)

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

# %% [markdown]
# ## Going further
#
# [The deep dive](04_xpu_sycl_custom_ops_deep_dive.ipynb) is for whoever ships kernels or targets Intel GPUs:
# device-agnostic code with `torch.accelerator` and where to synchronise; what `torch.xpu` added in 2.10 and
# capping a process's GPU memory; the SYCL build (architectures, build time, oneAPI, `SYCL_HOME`) and
# packaging with `SyclExtension`; the dispatcher's table read line by line; the same kernel against the
# LibTorch stable ABI, the load order of an op defined in C++ and the one-definition rule, then the stable ABI
# in detail (what 2.10 and the installed torch offer, a 2.10 build loading in 2.13); the Python route
# `custom_op`, an in-place op, and a declaration that lies; the op in a block compiled with `fullgraph=True`,
# forward and backward, and in an AOTInductor package; the slider from small to large rows; a Triton kernel
# as an op with `torch.library.triton_op`, the cross-vendor route; what the article got wrong; and the
# pitfalls. Then [lab 04](../labs/04_custom_op_lab.ipynb): write a C++ kernel body, its fake kernel and its
# backward, and pass `opcheck`.
