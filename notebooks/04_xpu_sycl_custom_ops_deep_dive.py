# %% [markdown]
# # 04 · Deep dive: Intel XPU and SYCL in 2.10, the stable ABI in detail, the Python route and AOTInductor
#
# | | |
# |---|---|
# | **What you will learn** | device-agnostic code with `torch.accelerator`, and where to synchronise; what `torch.xpu` added in 2.10, and capping a process's GPU memory; building SYCL: architectures and build time, oneAPI, `SYCL_HOME`, packaging with `SyclExtension`; the dispatcher's table, line by line; the same kernel against the LibTorch stable ABI (`STABLE_TORCH_LIBRARY`, `torch::stable::Tensor`), the load order of an op defined in C++ and the one-definition rule; the stable ABI in detail (what each library imports from libtorch, headers, ops, computing `TORCH_TARGET_VERSION`, a 2.10 build in a later torch); the Python route `torch.library.custom_op`, an in-place op and a declaration that lies; the op under `torch.compile` with `fullgraph=True`, forward and backward; the op in an AOTInductor package; small against large inputs (where the fixed cost per call decides); `torch.library.triton_op` as the cross-vendor kernel route; what the article got wrong; pitfalls |
# | **Prerequisites** | [lesson 04](04_xpu_sycl_custom_ops.ipynb) |
# | **Hardware** | any CPU. The memory cap needs an Intel GPU; timing on a device needs any accelerator; AOTInductor and the C++ kernels need a C++ compiler (AOTInductor runs in full mode only); the Triton kernel an NVIDIA, AMD or Intel GPU |
# | **Time** | 78 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); `torch.xpu` and `torch/utils/cpp_extension.py` (`SYCL_HOME`, `_get_sycl_arch_list`) read in the 2.10.0 wheel; the stable-ABI headers in both wheels (`torch/include/torch/csrc/stable/`), `wrap_triton` in `torch/_library/triton.py` of both; what 2.10 added for XPU from its release notes (PR numbers below) |

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/04_xpu_sycl_custom_ops_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False        # quick mode: small sizes, and no AOTInductor build (papermill: -p QUICK True)

# %%
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor

from helpers import bench, ext
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()
caps = capabilities()
torch.manual_seed(0)
print(f"torch {torch.__version__} · device: {DEVICE} · XPU build of torch: {caps.xpu_compiled} · quick={QUICK}")

# %% [markdown]
# ## Device-agnostic code, and where to synchronise
#
# Decide the device once, then write code that only says `DEVICE` or `x.device`. **`torch.accelerator`**
# (since 2.6) names the accelerator the installed build was made for (`cuda`, `xpu`, `mps`, ...) whether or
# not one is present, and is `None` only for a CPU-only build: PyPI's Linux wheel is a CUDA build, so a
# laptop without a GPU gets `cuda` here. `is_available()` says whether a device is really there.
#
# A device-agnostic function takes its device from its inputs and does **not** synchronise: ops are queued
# and the host runs ahead; a `synchronize()` inside a wrapper makes every call wait. Synchronise only where
# the host needs the device to be done (to read a clock or a value), and then *the device the tensors are
# on*: `torch.accelerator.synchronize(x.device)`. Without an argument it waits for the current device, which
# on a multi-GPU machine may not be `x`'s.

# %%
print("torch.accelerator.current_accelerator():", torch.accelerator.current_accelerator())
print("torch.accelerator.is_available():       ", torch.accelerator.is_available())
print("torch.get_device_module(DEVICE):        ", torch.get_device_module(DEVICE).__name__)


def seconds_per_call(fn, x: Tensor) -> float:
    """Time one call of fn(x): the one place that must wait for x's device before reading the clock."""
    start = time.perf_counter()
    fn(x)
    if x.device.type not in ("cpu", "meta"):
        torch.accelerator.synchronize(x.device)   # the same call on CUDA, ROCm, XPU and MPS
    return time.perf_counter() - start


if requires("accelerator", section="Timing the op on an accelerator"):
    x_dev = torch.randn(64, 1024, device=DEVICE)
    w_dev = torch.ones(1024, device=DEVICE)
    seconds_per_call(lambda x: ext.rms_norm(x, w_dev), x_dev)          # warm-up
    print(f"{DEVICE}: labs_ext.rms_norm ({ext.kernel_for(DEVICE)}) "
          f"{seconds_per_call(lambda x: ext.rms_norm(x, w_dev), x_dev) * 1e6:.0f} µs for one call")

# %% [markdown]
# ## What `torch.xpu` offers in 2.10
#
# `torch.xpu` mirrors `torch.cuda` for Intel GPUs; Intel's separate extension (IPEX) is not needed. What the
# 2.10 release notes list for Intel GPUs:
#
# | 2.10 change | API | PR |
# |---|---|---|
# | cap this process's share of GPU memory | `torch.xpu.set_per_process_memory_fraction(f)`, `get_per_process_memory_fraction()` | #165510 |
# | plug in your own allocator (a shared library with `alloc`/`free` functions) | `torch.xpu.XPUPluggableAllocator(path, alloc_fn, free_fn)`, `torch.xpu.change_current_allocator(a)` | 2.10 release notes |
# | SYCL C++ extensions on Windows (`icx`) | `SyclExtension`, `load_inline(sycl_sources=...)` | 2.10 release notes |
# | int8 weight-only matmul kernel on XPU | `torch._weight_int8pack_mm` | #160938 |
# | FP8 `scaled_mm` (tensor-wise, row-wise) on XPU | `torch._scaled_mm`, `scaled_mm_v2` | #165978, #167518 |
#
# The names exist in every build (only their calls need an Intel GPU):

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
# `set_per_process_memory_fraction` shares one GPU between processes: past `fraction x total memory` the
# caching allocator raises an out-of-memory error instead of taking memory another process needs. The cell
# caps this process at a quarter of the GPU, asks for more, and restores the cap. It reads the total from
# `get_device_properties`: `torch.xpu.mem_get_info()` needs `ZES_ENABLE_SYSMAN=1` on many drivers (pitfalls).

# %%
if requires("xpu", section="torch.xpu memory controls on an Intel GPU"):
    props = torch.xpu.get_device_properties(0)
    total = props.total_memory
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
# ## Building SYCL: compiler, architectures, packaging
#
# **Which compiler, when.** `torch.utils.cpp_extension` looks for `icpx` once, when it is imported
# (`SYCL_HOME = _find_sycl_home() if torch.xpu._is_compiled() else None`, line 238 of 2.10's
# `cpp_extension.py`), and many imports pull it in: `torch.utils.benchmark` does, so `helpers.bench` does.
# So activate the compiler's environment (pytorch/tutorials' `cpp_custom_ops_sycl.rst`: the Intel compiler
# of Intel's Deep Learning Essentials, activated before running) *before* starting Python or Jupyter;
# changing `PATH` in a cell is too late. Use the oneAPI version torch was built with
# (`python -m torch.utils.collect_env`): the XPU wheel ships its own SYCL runtime, and another version's
# environment at run time is where the `UR error` and `libpti_view.so` reports below come from.

# %% tags=["nbval-check-output"]
print("torch.utils.cpp_extension imported already:", "torch.utils.cpp_extension" in sys.modules)

# %% [markdown]
# **Architectures and build time.** torch compiles SYCL sources ahead of time for every architecture in
# `torch.xpu.get_arch_list()` except `dg2*` (Arc A-series), plus SPIR-V that the driver compiles on first
# launch for any other Intel GPU (`_get_sycl_arch_list` and `_append_sycl_targets_if_missing` in
# `cpp_extension.py`): the build runs everywhere but spends minutes compiling ahead of time.
# `TORCH_XPU_ARCH_LIST` chooses: `"bmg"` for one architecture, `""` for SPIR-V only, which
# `ext.load_xpu_kernels` uses unless you set it (a short build, a compile on first launch, which a
# benchmark's warm-up absorbs). The SYCL kernel has no float64 kernel, by choice: several Intel GPUs (Arc
# A-series) lack native fp64, so `ext.sample_inputs("xpu")` tests float16 there instead.
#
# **Packaging.** `load_inline` suits lessons. A library you ship is built ahead of time into a wheel:
# `helpers/ext/example_setup/setup.py` builds the same sources with `SyclExtension` where an XPU torch and
# `icpx` exist, with `CppExtension` (CPU kernel only) elsewhere. `pip install --no-build-isolation .` (so the
# build uses your installed torch); ninja is required; `.sycl` files go to `icpx`/`icx`, `.cpp` files to the
# host compiler; SYCL builds on Windows need torch 2.10 or newer.

# %%
ext.show(ext.SOURCES / "example_setup" / "setup.py", "sources = [", "install_requires")

# %% [markdown]
# ## The dispatcher's table, line by line
#
# The core lesson's `labs_ext::rms_norm` is defined from Python, and each kernel adds one device's entry to
# the dispatcher's table. The table (`torch._C._dispatch_dump`, a private debugging call) reads:
#
# - `schema:` the signature every kernel follows; `debug:` where `define` ran; `alias analysis kind:
#   FROM_SCHEMA`: aliasing and mutation are read from the schema's annotations (none here).
# - one line per **dispatch key** with a kernel: `Meta` is the fake kernel, `Autograd` the autograd formula,
#   `CompositeExplicitAutograd` the fallback. `[alias]` marks a key that stands for several runtime keys
#   (`Autograd` covers AutogradCPU, AutogradCUDA, ...).
# - `:: (none) [ boxed ]`: a Python kernel has no C++ signature and is called **boxed**, its arguments on
#   a stack. A C++ kernel prints its signature and `[ boxed unboxed ]`: it can also be called directly.

# %%
print(torch._C._dispatch_dump(ext.RMS_NORM))
print("labs_ext::rms_norm on CPU tensors runs:", ext.kernel_for("cpu"))

# %% [markdown]
# ## The stable ABI, and the load order of an op defined in C++
#
# A classic extension like `rms_norm_cpu.cpp` links to libtorch's C++ symbols, so each torch version needs
# its own build. pytorch/tutorials' `cpp_custom_ops.rst` recommends the **LibTorch stable ABI** for 2.10
# and later: only `torch/csrc/stable` and `torch/headeronly` headers, a `torch::stable::Tensor`, calls
# through torch's C shim. Built with `-DTORCH_TARGET_VERSION=0x020a000000000000` (2.10.0), one binary loads
# in torch 2.10 and later ones (the next section reports a 2.10 build loaded in 2.13). `rms_norm_stable.cpp`
# is the same kernel (float32 only, to stay small), and it **defines its own op**, `labs_stable::rms_norm`.
#
# An op defined in C++ exists only once its library is loaded. The tutorial's order for such a **hybrid**
# op: load the library first, then register the Python half (`register_fake`, `register_autograd`), before
# anything calls the op. The cell tries the wrong order first, then loads (building once), registers
# the same Python fake kernel and autograd formula as `labs_ext::rms_norm` on `labs_stable::rms_norm`, and
# runs `opcheck`. Note its CPU line: `TORCH_BOX` makes a boxed-only kernel.

# %%
ext.show(ext.STABLE_SOURCE, "Tensor rms_norm_stable", "const float* xp")
print("  ...")
ext.show(ext.STABLE_SOURCE, "STABLE_TORCH_LIBRARY(labs_stable")
if requires("cxx", "ninja", section="The stable-ABI kernel and the hybrid load order"):
    if not ext.op_defined(ext.STABLE_OP):             # the library is not loaded yet in this process
        try:
            torch.library.register_fake(ext.STABLE_OP)(ext._rms_norm_fake)
        except RuntimeError as exc:
            print("register_fake before loading the library:", exc)
    built_stable = ext.load_stable_kernel()
    print(f"{built_stable.path.name}: {'loaded from the cache' if built_stable.cached else 'built now'}; "
          f"the build took {built_stable.build_s:.1f} s when it ran")
    ext.register_stable_python_half()
    print("its dispatch table:", *torch._C._dispatch_dump(ext.STABLE_OP).splitlines()[4:], sep="\n  ")
    xs_grad, ws = torch.randn(4, 8, requires_grad=True), torch.rand(8)
    torch.testing.assert_close(torch.ops.labs_stable.rms_norm(xs_grad, ws, 1e-6), ext.rms_norm_reference(xs_grad, ws))
    print("opcheck:", torch.library.opcheck(torch.ops.labs_stable.rms_norm.default, (xs_grad, ws, 1e-6)))

# %% [markdown]
# The one-definition rule bites when you edit C++: a rebuilt library is a new `.so` that defines its
# namespace a second time, and loading it into the same process fails. With the stable ABI the failure is a
# crash of the whole Python process (a segmentation fault, seen on 2.10 and 2.13), so after editing such a
# file, restart the kernel. `labs_ext` avoids it: its schema lives in Python, and its C++ and SYCL files only
# add `TORCH_LIBRARY_IMPL` kernels, which a rebuild replaces (torch warns that it overrides the old one).
# The rule, on `labs_ext` (no compiler needed), and a `FRAGMENT` block, which may add ops to a namespace:

# %% tags=["nbval-check-output"]
try:
    torch.library.Library("labs_ext", "DEF")         # helpers.ext defined labs_ext already, from Python
except RuntimeError as exc:
    print("a second DEF block:", str(exc).split(";")[0])
frag = torch.library.Library("labs_ext", "FRAGMENT")
frag.define("rms_norm_nofake(Tensor x, Tensor weight, float eps) -> Tensor")
print("a FRAGMENT block added:", torch.ops.labs_ext.rms_norm_nofake.default._schema)

# %% [markdown]
# ## The stable ABI in detail
#
# The section above built `rms_norm_stable.cpp` against the stable ABI; `rms_norm_cpu.cpp` is the classic kind.
# For this lesson a 2.10 build of each was loaded into torch 2.13: the stable one gave the reference's
# numbers, the classic one failed to load with `undefined symbol: at::TensorBase::const_data_ptr<float>`
# (demangled). A shared library lists the symbols it expects other libraries to define
# (`nm -D --undefined-only` prints them), and the loader must find every one of them in the torch it is
# loaded into. The cell after the question builds both (or finds them built) and lists them.

# %% tags=["predict"]
STABLE_IMPORTS = ("C++ functions of at:: and c10::, like the classic library, only fewer",
                  "only C functions of torch's (aoti_torch_*, torch_*)",
                  "nothing from torch: the stable headers hold all it needs")
imports_guess = predict("Which symbols does the stable-ABI library expect libtorch to define?",
                        options=STABLE_IMPORTS, example=STABLE_IMPORTS[0])

# %% tags=["reveal"]
LIBTORCH_CPP = ("at::", "c10::", "torch::", "caffe2::")


def imported_symbols(library) -> list[str]:
    """The symbols a shared library expects others to define, demangled (nm -D --undefined-only -C)."""
    listing = subprocess.run(["nm", "-D", "--undefined-only", "-C", str(library)],
                             capture_output=True, text=True, check=True).stdout
    return [line.split(maxsplit=1)[1] for line in listing.splitlines() if len(line.split()) > 1]


def from_libtorch(symbols: list[str]) -> dict[str, list[str]]:
    """C++ symbols of libtorch's namespaces (the name before its argument list), and C functions of its shim."""
    return {"C++": [s for s in symbols if any(ns in s.split("(")[0] for ns in LIBTORCH_CPP)],
            "C shim": [s for s in symbols if "::" not in s and s.startswith(("aoti_torch_", "torch_"))]}


if requires("cxx", "ninja", section="Build the C++ CPU kernel"):
    classic, stable = ext.load_cpu_kernels(), ext.load_stable_kernel()
    ext.register_stable_python_half()
    print(f"build time when it ran: classic {classic.build_s:.1f} s, stable ABI {stable.build_s:.1f} s "
          "(the classic one parses ATen's headers)")
    if sys.platform.startswith("linux") and shutil.which("nm"):
        found = {name: from_libtorch(imported_symbols(built.path)) for name, built in
                 (("classic", classic), ("stable", stable))}
        for name, kinds in found.items():
            print(f"{name}: {len(kinds['C++'])} C++ symbols of libtorch, {len(kinds['C shim'])} C functions of its "
                  f"shim; for example {(kinds['C++'] or kinds['C shim'])[:3]}")
        cpp, shim = len(found["stable"]["C++"]), len(found["stable"]["C shim"])
        reveal(imports_guess, STABLE_IMPORTS[0] if cpp else STABLE_IMPORTS[1] if shim else STABLE_IMPORTS[2],
               why=f"the stable library expects {cpp} C++ symbols of libtorch and {shim} C functions, against "
                   f"{len(found['classic']['C++'])} C++ symbols for the classic one. A C++ symbol's name encodes "
                   "namespaces, classes, template and argument types; a torch that changes one of them, or stops "
                   "exporting it (an inline function, say), no longer defines that name, and the load fails. The "
                   "stable headers compile torch::stable::Tensor and STABLE_TORCH_LIBRARY into the library itself, "
                   "over C functions of torch's shim (declared in torch/csrc/inductor/aoti_torch/c/shim.h and "
                   "torch/csrc/stable/c/shim.h), which torch keeps binary-compatible across releases. What else it "
                   "imports is the C and C++ runtime (libc, libstdc++), not torch.")
    else:
        print("nm (binutils) lists a Linux library's symbols; not available here, so nothing to reveal")

# %% [markdown]
# What the stable build rests on:
#
# - **Headers.** `torch/csrc/stable` (`torch::stable::Tensor`, `STABLE_TORCH_LIBRARY`,
#   `STABLE_TORCH_LIBRARY_IMPL`, `STABLE_TORCH_LIBRARY_FRAGMENT`, `TORCH_BOX`, the ops in `ops.h`) and
#   `torch/headeronly` (`ScalarType`, `STD_TORCH_CHECK`, utilities without libtorch). Every call into torch
#   goes through the C shim (`torch_call_dispatcher`, `aoti_torch_*`), as the symbols above show
#   (https://docs.pytorch.org/docs/stable/notes/libtorch_stable_abi.html).
# - **`TORCH_TARGET_VERSION`** (`torch/csrc/stable/version.h`) is the oldest torch the build must load in,
#   `[major][minor][patch][5 bytes ABI tag]`, so 2.10.0 is `0x020a000000000000`. The headers hide whatever is
#   newer than the target: in 2.13's `ops.h`, `from_blob` with a deleter is under
#   `#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0`, so a 2.10-targeted build cannot call it by mistake.
# - **What 2.10 has.** Its `stable/` lacks `generator.h`, which 2.13 adds; its `ops.h` declares 28 functions
#   (`ext.stable_abi_headers()` on the 2.10 wheel), among them `parallel_for`, `empty_like`, `contiguous`,
#   `new_empty`, `fill_`, `copy_`, `transpose` and `matmul`. ATen's own helpers (`AT_DISPATCH_*`,
#   `at::opmath_type`, `at::vec::Vectorized`) are not there, but `torch/headeronly` has stand-ins in 2.10
#   already: `THO_DISPATCH_SWITCH` and `THO_DISPATCH_CASE` (`core/Dispatch.h`) switch on the dtype, and
#   `util/Half.h` and `util/BFloat16.h` give the 16-bit types; the kernel picks its own accumulation type (a
#   `float` for 16-bit inputs) where ATen would take `opmath_type`. The stable kernel above is float32
#   only to stay short; lab 04's last exercise builds one for four dtypes. What still keeps a kernel classic:
#   ATen's vectorized `Vectorized<T>` loops and any ATen op the stable `ops.h` of the target does not declare.
#
# What the installed torch ships:

# %%
abi = ext.stable_abi_headers()
print("torch/csrc/stable:", ", ".join(abi["stable"]))
print("torch/headeronly: ", ", ".join(abi["headeronly"]))
print(f"torch::stable ops in ops.h ({len(abi['ops'])}):", ", ".join(abi["ops"]))


# %% [markdown]
# ### Your turn: compute `TORCH_TARGET_VERSION`
#
# The target is one 64-bit number, one byte each for major, minor and patch from the top, then the ABI tag
# (`TORCH_ABI_VERSION` in `torch/headeronly/version.h` draws the layout). The comment in 2.13's
# `stable/version.h` targets 2.9 with `0x0209000000000000`, and the function below gives exactly that. Fix it
# so it is right for every version; the check compares it with the 2.10.0 value this lesson builds with and
# with the `TORCH_VERSION_2_*` macros the installed `torch/csrc/stable/version.h` defines.

# %% tags=["your-turn"]
def target_version(major: int, minor: int, patch: int = 0) -> int:
    """TORCH_TARGET_VERSION for torch major.minor.patch (ABI tag 0)."""
    return int(f"0x{major:02d}{minor:02d}{patch:02d}0000000000", 16)     # gives 0x0209000000000000 for 2.9


# %%
from helpers.checks import fail, passed, your_turn


def header_versions() -> dict[tuple[int, int, int], int]:
    """The TORCH_VERSION_X_Y_Z macros of the installed torch/csrc/stable/version.h, evaluated: each is an OR of
    ((0ULL + value) << shift) terms."""
    header = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "stable" / "version.h"
    text = header.read_text() if header.exists() else ""
    return {tuple(int(g) for g in m.groups()[:3]):
            sum(int(value) << int(shift) for value, shift in re.findall(r"\(0ULL \+ (\d+)\) << (\d+)", m.group(4)))
            for m in re.finditer(r"^#define TORCH_VERSION_(\d+)_(\d+)_(\d+) (.+)$", text, re.M)}


def check_target():
    expected = {(2, 10, 0): int(ext.STABLE_TARGET, 16), **header_versions()}
    got = {version: target_version(*version) for version in expected}
    wrong = [version for version in expected if got[version] != expected[version]]
    if wrong:
        v = wrong[0]
        shown = f"0x{got[v]:016x}" if isinstance(got[v], int) else repr(got[v])
        fail("target_version", f"{len(wrong)} of {len(expected)} versions wrong: {'.'.join(map(str, v))} gave "
                               f"{shown}, the header's value is 0x{expected[v]:016x}",
             "a byte holds 0 to 255, written as two hex digits; the f-string writes the minor version as two "
             "decimal digits. What are 10's two hex digits? (or shift each number into its byte: <<)")
    passed("target_version", "matches " + ", ".join(f"{'.'.join(map(str, v))}: 0x{x:016x}" for v, x in expected.items()))


your_turn(check_target, what="compute TORCH_TARGET_VERSION");


# %% [markdown]
# ## The Python route: `torch.library.custom_op`, in place, and a declaration that lies
#
# Since 2.4 the recommended way to make a Python function an op is `torch.library.custom_op`
# (https://docs.pytorch.org/docs/stable/library.html): it infers the schema from the type hints, and
# `mutates_args` names the arguments the function writes (`()` for none). The kernel can be anything Python
# can call (NumPy, a Triton launcher, a C library through ctypes); `register_fake`, `register_autograd` and
# `register_kernel("xpu")` attach the rest. The same RMSNorm, and an **in-place** variant:

# %%
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


for op in (rms_norm_py, rms_norm_py_):
    print(" ", str(op._opoverload._schema).replace("9.9999999999999995e-07", "1e-06"))

# %% tags=["nbval-check-output"]
x8, w8 = torch.randn(4, 8), torch.rand(8)
quick_tests = ("test_schema", "test_faketensor")          # full mode adds the autograd and compile tests
for op, args in ((rms_norm_py, (x8, w8)), (rms_norm_py_, (x8.clone(), w8))):
    result = torch.library.opcheck(op, args, **({"test_utils": quick_tests} if QUICK else {}))
    assert set(result.values()) == {"SUCCESS"}, result
x_inplace = x8.clone()
assert rms_norm_py_(x_inplace, w8) is None
torch.testing.assert_close(x_inplace, ext.rms_norm(x8, w8))
print("opcheck passes for both; the in-place op wrote ext.rms_norm's result into x")


# %% [markdown]
# `(Tensor(a0!) x ...) -> ()` is the schema language's "writes `x`, returns nothing"; in C++ the same
# schema is written `Tensor(a!) x`. Under `torch.compile` a mutable op is called through
# `auto_functionalized` on a copy that is then written back, so every compiler pass sees pure functions.
# That is why the declaration must be true: `opcheck`'s `test_schema` runs the op and compares the inputs
# before and after. An op that writes its input but declares `mutates_args=()`:

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
# ## The op under `torch.compile`, forward and backward
#
# A pre-norm residual block, `x + rms_norm(x) @ proj`, compiled with `fullgraph=True`, forward and backward.
# The custom op is one opaque call in the graph. Quick mode compiles with the `aot_eager` backend (traces
# with the fake kernel and the formula, generates no code); full mode with Inductor (a C++ compiler on a CPU).

# %% tags=["nbval-check-output"]
def block(x, weight, proj):
    return x + ext.rms_norm(x, weight) @ proj


BACKEND = "inductor" if not QUICK and caps.toolchains["cxx"] else "aot_eager"
torch._dynamo.reset()
xb = torch.randn(16, 64, requires_grad=True)
wb, proj = torch.rand(64, requires_grad=True), torch.randn(64, 64) / 8
out = torch.compile(block, backend=BACKEND, fullgraph=True)(xb, wb, proj)
out.square().sum().backward()
grads_compiled = xb.grad.clone(), wb.grad.clone()
xb.grad, wb.grad = None, None
expected = xb + ext.rms_norm_reference(xb, wb) @ proj
expected.square().sum().backward()
torch.testing.assert_close(out, expected)
for got, want in zip(grads_compiled, (xb.grad, wb.grad)):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
print("torch.compile(fullgraph=True): output and both gradients match eager")


# %% [markdown]
# ## The op in an AOTInductor package
#
# `torch._inductor.aoti_compile_and_package` compiles an `ExportedProgram` into a `.pt2` package with a shared
# library, loadable from Python (`aoti_load_package`) or C++ without the model's Python code
# (https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html). It cannot compile an opaque op, so
# the package calls it through the dispatcher at run time (its *proxy executor*): the process that loads the
# package must have the op registered. For `labs_ext::rms_norm`, defined from Python, that means importing
# `helpers.ext`; an op defined in C++ (like `labs_stable::rms_norm`) needs only its library loaded. The build
# compiles the whole model as C++: on the 2 shared cores this lesson was checked on it took close to a
# minute, too long for CI's quick mode, so quick mode skips it.

# %%
class PreNormBlock(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden))
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        return x + self.proj(ext.rms_norm(x, self.weight))


if requires("cxx", section="AOTInductor package with the custom op"):
    if QUICK:
        print("quick mode: the package is not compiled (AOTInductor builds the whole model as C++); "
              "run with QUICK = False to build it")
    else:
        model = PreNormBlock(64).eval()
        x_export = torch.randn(16, 64)
        exported = torch.export.export(model, (x_export,))
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
# ## Try it: small rows against large ones
#
# The reference is six ATen operations (square, mean, add, rsqrt, two multiplies) that together read a
# full-size tensor four times and write three. The fused kernel is one call that reads each row twice and
# writes it once. Timed on one thread: on a busy machine, two threads' barriers stall and small timings
# jump (deep dive 02's pitfalls).

# %% tags=["predict"]
SMALL_ROWS = ("our kernel, by more than 2x", "within 2x of each other", "the reference, by more than 2x")
small_guess = predict("64 rows of 16 floats (4 KB, far inside the caches): which is faster, our C++ kernel or the "
                      "six-op reference?", options=SMALL_ROWS, example=SMALL_ROWS[1])

# %% tags=["reveal"]
torch.set_num_threads(1)      # from here on, the slider below included
REF, OURS = "reference (PyTorch ops)", "labs_ext.rms_norm"


def speedup(r: dict) -> tuple[float, bool]:      # ours over the reference (medians), and: repeats apart?
    return r["results"][OURS]["ratio_to_baseline"], bench.separated(r, REF, OURS)


if ext.native_kernels()["CPU"]:
    small, large = (ext.compare_kernels(64, n, repeats=3, min_run_time=0.05) for n in (16, 2 ** 16))
    print(f"64 x 16 float32, {small['kernel']}:\n{bench.table(small)}\n\n64 x 65536 float32:\n{bench.table(large)}")
    (small_x, small_clear), (large_x, large_clear) = speedup(small), speedup(large)
    t_ref, t_ours = (small["results"][name]["median_s"] * 1e6 for name in (REF, OURS))
    large_text = (f"their repeats overlap ({large_x:.1f}x by medians): too close to call here" if not large_clear else
                  f"ours is {large_x:.1f}x faster" + (": there the bytes moved decide" if large_x < 3 else ", more than "
                  "the bytes moved explain: the reference also allocates three new 16 MiB tensors a call, and first "
                  "writes to new memory cost extra (the OS maps fresh pages in as they are touched)"))
    if small_clear:
        reveal(small_guess, SMALL_ROWS[0] if small_x > 2 else SMALL_ROWS[2] if small_x < 0.5 else SMALL_ROWS[1],
               why=f"at 64 x 16 the reference took {t_ref:.1f} µs for its six operations (and the casts around them, "
                   f"no-ops in float32), our kernel {t_ours:.1f} µs for one call: {small_x:.1f}x. With 4 KB of data "
                   "each call's fixed cost (Python, the dispatcher, a new output tensor) is nearly all the time, and "
                   f"ours pays it once. At 64 x 65536 (16 MiB a tensor) {large_text}. Seven full-size passes over "
                   "memory against three would give 2.3x if memory speed were all that counted.")
    else:
        print(f"64 x 16: the two overlapped over the repeats ({small_x:.2f}x by medians): too close to call here; "
              "run the cell again.")
else:
    print("No C++ kernel was built here: labs_ext.rms_norm runs the reference itself, so there is nothing to reveal.")

# %% [markdown]
# The sizes in between (64 rows, width 2^k, float32, one thread):

# %%
import ipywidgets as widgets

from helpers.interactive import interact


def time_width(log2_hidden=10):
    r = ext.compare_kernels(64, 2 ** log2_hidden, repeats=3, min_run_time=0.02)
    ratio, clear = speedup(r)
    print(f"64 x {2 ** log2_hidden}: labs_ext.rms_norm ({r['kernel']}) runs {ratio:.2f}x as fast as the reference"
          + ("" if clear else " (their repeats overlap: too close to call; move the slider back and forth)"))


interact(time_width, log2_hidden=widgets.IntSlider(value=10, min=4, max=16, step=2));

# %% [markdown]
# ## The cross-vendor route: a Triton kernel with `torch.library.triton_op`
#
# A CUDA kernel would be one more `TORCH_LIBRARY_IMPL(..., CUDA, ...)` block. **Triton** compiles one
# Python-like source for NVIDIA, AMD and Intel GPUs, and `torch.library.triton_op` makes it an op that
# `torch.compile` *sees into*: it traces the body with fake tensors (no fake kernel to write) and hands the
# kernel inside `wrap_triton` to Inductor. Not on a CPU: Triton's interpreter (`TRITON_INTERPRET=1`) is
# rejected by 2.10's `wrap_triton`, and 2.13 runs it in eager but cannot trace it with fake tensors. On a GPU
# the cell checks `helpers/ext/triton_kernel.py` against the reference, runs `opcheck` and compiles it.

# %%
ext.show(ext.SOURCES / "triton_kernel.py", "@triton.jit", "rms_norm.register_autograd")
if requires("triton_gpu", section="triton_op on a GPU"):
    from helpers.ext import triton_kernel

    for args in ext.sample_inputs(DEVICE, quick=True):
        torch.testing.assert_close(triton_kernel.rms_norm(*args), ext.rms_norm_reference(*args),
                                   atol=2e-2, rtol=2e-2)
        assert set(torch.library.opcheck(triton_kernel.rms_norm, args).values()) == {"SUCCESS"}
    ROWS, HIDDEN = (256, 1024) if QUICK else (4096, 4096)      # the core lesson's sizes
    xg, wg = torch.randn(ROWS, HIDDEN, device=DEVICE), torch.rand(HIDDEN, device=DEVICE)
    compiled = torch.compile(lambda x, w: x + triton_kernel.rms_norm(x, w, 1e-6), fullgraph=True)
    torch.testing.assert_close(compiled(xg, wg), xg + ext.rms_norm_reference(xg, wg))
    print(f"labs_triton::rms_norm on {DEVICE}: matches the reference, opcheck passes, compiles with fullgraph=True")

# %% [markdown]
# ## What changes on other hardware
#
# - **Intel GPU with an XPU torch and `icpx`**: XPU tensors run the SYCL kernel; the CPU kernel still serves
#   CPU tensors. **Without `icpx`**, XPU tensors run the PyTorch reference through the same op.
# - **NVIDIA or AMD GPU**: CUDA/ROCm tensors run the reference, or the Triton kernel above; a
#   CUDA or HIP kernel would be one more `TORCH_LIBRARY_IMPL(labs_ext, CUDA, m)` block built with
#   `CUDAExtension`, and nothing else about the op changes.
# - **More CPU cores**: `at::parallel_for` spreads the rows over more threads; the reference's passes are
#   each parallel too, so the ratio depends on memory bandwidth more than on cores.
#
# ## What the article got wrong
#
# - **"Upcoming Gaudi accelerators" under the XPU API**: Gaudi is not an XPU device. It is HPU, supported out
#   of tree by Intel's Gaudi software.
# - **"New hardware abstraction interfaces"**: the 2.10 `torch.xpu` additions are the memory-fraction and
#   pluggable-allocator calls (plus new XPU kernels); the device-agnostic layer is `torch.accelerator`, older.
# - **"scaled_mm ... with automatic scaling factor management"**: `torch._scaled_mm` takes the scales as
#   required arguments (`scale_a`, `scale_b`); you compute them.
# - **"SYCL compilation ... across all major operating systems"**: SYCL extensions build on Linux (since
#   2.8) and, new in 2.10, on Windows; macOS has no XPU build of torch.
#
# ## Pitfalls
#
# **`load_inline(sycl_sources=...)` on a torch without XPU support.** On a CPU build with ninja present the
# error is an `OSError` about the SYCL runtime (torch 2.10-2.13 spell it "dected"); without ninja, torch
# stops earlier and asks for ninja.

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
# **A missing compiler.** `helpers.ext` asks `helpers.device` before building and says what to install;
# `load_inline` itself would fail later with a longer message. Here with an empty `PATH`, for a source not in
# the cache:

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
# something traces the op, far from the cause. `opcheck` finds it at once. A demo op whose fake kernel
# returns float64 for float32 inputs:

# %% tags=["nbval-check-output"]
demo = torch.library.Library("labs_demo", "DEF")
demo.define("double_it(Tensor x) -> Tensor")
demo.impl("double_it", lambda x: x * 2, "CPU")
torch.library.register_fake("labs_demo::double_it", lambda x: torch.empty_like(x, dtype=torch.float64), lib=demo)
outcome = torch.library.opcheck(torch.ops.labs_demo.double_it.default, (torch.randn(3),),
                                test_utils=("test_faketensor",), raise_exception=False)
print("test_faketensor:", str(outcome["test_faketensor"]).splitlines()[0])

# %% [markdown]
# More pitfalls, each seen in practice:
#
# - **Registering the Python half late.** Register the fake kernel and the autograd formula of an op defined
#   in C++ right after loading its library, before anything compiles the op. Compiling a function that
#   calls it first (a graph break, since there is no fake kernel yet) and registering `register_autograd`
#   afterwards left `opcheck`'s `test_aot_dispatch_dynamic` failing with "Gradients of the operator are
#   different in eager-mode PyTorch vs AOTDispatcher" on 2.10 and 2.13, while eager autograd worked.
# - **Reloading an edited library that defines a namespace** (`TORCH_LIBRARY` or `STABLE_TORCH_LIBRARY`): a
#   second definition of the namespace fails; with the stable ABI it crashed the Python process (a
#   segmentation fault on 2.10 and 2.13). Restart the kernel, or keep the schema in Python as `labs_ext` does.
# - **No autograd formula**: backward goes through a deprecated fallback that warns "an autograd kernel was
#   not registered to the Autograd key(s) but we are trying to backprop through it"; with a C++ kernel the
#   inputs get no gradient. `opcheck`'s `test_autograd_registration` catches it.
# - **A killed build** leaves a `lock` file in the build directory, and the next `load_inline` for that
#   directory waits for it forever (torch's `FileBaton.wait`); `helpers.ext` removes locks older than 10
#   minutes. Old cache directories (`~/.cache/pytorch-210-labs/ext/`) are safe to delete.
# - **"Ninja is required to build SyclExtension"**: `pip install ninja`.
# - **`RuntimeError: UR error` or `ImportError: libpti_view.so`** with a oneAPI environment active at run
#   time: reported when that oneAPI is not the version torch was built with; match the versions, as above.
# - **`torch.xpu.mem_get_info()` raises** "... doesn't support querying the available free memory" on
#   drivers that report free memory only through Level Zero sysman (Data Center GPU Max among them): set
#   `ZES_ENABLE_SYSMAN=1` before the process starts, or read `get_device_properties(0).total_memory`.
# - **The kernel on the wrong GPU**: a kernel registered with `TORCH_LIBRARY_IMPL` gets no device guard from
#   torch. Without `c10::DeviceGuard guard(x.device())` and the queue of `x`'s device, a tensor on `xpu:1` is
#   launched on `xpu:0`'s queue; `rms_norm_xpu.sycl` sets both.
# - **`torch.xpu` calls on a torch without XPU support** fail at their first use of the device: check
#   `torch.xpu.is_available()` first. `torch.xpu._is_compiled()` tells a CPU wheel (False) from a missing
#   driver (True, but not available).
