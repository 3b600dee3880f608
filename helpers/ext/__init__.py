"""One custom op, several kernels: C++ for the CPU, SYCL for Intel GPUs, PyTorch as the reference; the same
RMSNorm against the LibTorch stable ABI (its own op, labs_stable::rms_norm) and in Triton (helpers.ext.triton_kernel).

    from helpers import ext
    ext.load_cpu_kernels()           # build once (cached by source hash), register the C++ CPU kernel
    y = ext.rms_norm(x, weight)      # torch.ops.labs_ext.rms_norm: the native kernel for x's device
                                     # where one is registered, else the PyTorch reference

Importing this module registers, from Python, the op's schema, its fake (meta) kernel, its autograd
formula and the PyTorch reference as the fallback kernel for every device (CompositeExplicitAutograd).
So the op works on any device and under torch.compile before any C++ is built. `rms_norm_cpu.cpp`
and `rms_norm_xpu.sycl` only add kernels for the CPU and XPU dispatch keys (TORCH_LIBRARY_IMPL).

`build_and_load` compiles with torch.utils.cpp_extension.load_inline into a cache directory named
after a hash of the sources, the flags, torch and Python, and loads the library with
torch.ops.load_library; a later call (in any process) loads the cached library without a compiler.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:   # Windows: builds are not shared between processes there
    fcntl = None

import torch

from helpers.device import probe, skip_reason

NAMESPACE = "labs_ext"
SOURCES = Path(__file__).resolve().parent
CPU_SOURCE = SOURCES / "rms_norm_cpu.cpp"
SYCL_SOURCE = SOURCES / "rms_norm_xpu.sycl"
STABLE_SOURCE = SOURCES / "rms_norm_stable.cpp"
STABLE_OP = "labs_stable::rms_norm"
# TORCH_TARGET_VERSION: the oldest torch the stable-ABI build must load in, [major][minor][patch][abi tag 5 bytes]
STABLE_TARGET = "0x020a000000000000"       # 2.10.0, as pytorch/tutorials' cpp_custom_ops.rst uses
CACHE_DIR = Path(os.environ.get("LABS_CACHE", Path.home() / ".cache" / "pytorch-210-labs")) / "ext"
STALE_LOCK_S = 600          # a build lock older than this was left by an interrupted build
LIBRARY_SUFFIX = ".pyd" if sys.platform == "win32" else ".so"


# --- Build and load ------------------------------------------------------------------------------

class BuildError(RuntimeError):
    """An extension could not be built here; the message says what is missing or which line failed.
    `log` holds the full compiler output when the compiler ran."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class Built:
    name: str
    path: Path          # the shared library
    cached: bool        # True: loaded from the cache, no compiler ran in this call
    build_s: float      # how long the build took when it ran (measured then, stored with the cache)
    load_s: float       # how long this call took


def cache_key(*parts: str) -> str:
    """12 hex digits of a hash of the sources and flags, torch's version, Python's and the platform."""
    digest = hashlib.sha256()
    for part in (*parts, torch.__version__, sys.version, platform.machine(), sys.platform):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:12]


def build_directory(name: str, cpp_source: str, sycl_source: str | None = None,
                    extra_cflags: tuple[str, ...] = ("-O3",)) -> Path:
    """Where `build_and_load` builds (and caches) this exact source."""
    runtime = loaded_cxx_runtime()
    return CACHE_DIR / f"{name}-{cache_key(cpp_source, sycl_source or '', *extra_cflags, runtime.name if runtime else '')}"


@functools.cache      # torch, imported above, has loaded it for the life of the process
def loaded_cxx_runtime() -> Path | None:
    """The C++ standard library this process has loaded (Linux; torch loads one), or None. Extensions are
    linked against this very file. Left to its defaults, g++ 13.3 on Ubuntu 24.04 with torch 2.11 built an
    extension that did not list the library among its dependencies, and streaming an integer into a
    TORCH_CHECK message (std::ostream << long) crashed the process with SIGSEGV; linked against the loaded
    file, the same source raises its message."""
    try:
        with open("/proc/self/maps") as maps:
            found = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    except OSError:
        return None
    return Path(sorted(found)[0]) if len(found) == 1 else None


BUILD_LISTENERS: list = []   # callables told "start" and "end" around each compiler run (the grader's sandbox)


def build_and_load(name: str, cpp_source: str, *, sycl_source: str | None = None,
                   extra_cflags: tuple[str, ...] = ("-O3",), verbose: bool = False) -> Built:
    """Compile `cpp_source` (and `sycl_source` with icpx) into a shared library and load it into this
    process, so its TORCH_LIBRARY registrations take effect. Built once per source, by one process at a time:
    a process that finds another building the same source waits for it, then loads that library (a second
    build would rewrite a library the first process has mapped). Raises BuildError saying what to install
    when a compiler, ninja or the SYCL toolchain is missing, or with the compiler's error lines."""
    if not name.isidentifier():
        raise ValueError(f"extension name {name!r} must be a Python identifier (letters, digits, _)")
    directory = build_directory(name, cpp_source, sycl_source, extra_cflags)
    library = directory / f"{name}_{directory.name.rsplit('-', 1)[1]}{LIBRARY_SUFFIX}"
    record = directory / "built.json"
    start = time.perf_counter()
    if not (record.exists() and library.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        with _build_lock(directory):
            if not (record.exists() and library.exists()):   # another process may have built it meanwhile
                _build(name, library, cpp_source, sycl_source, extra_cflags, verbose)
                build_s = time.perf_counter() - start   # load_inline has loaded it into this process
                _write_atomic(record, json.dumps({"build_s": build_s, "torch": torch.__version__,
                                                  "library": library.name}))
                return Built(name, library, False, build_s, build_s)
    torch.ops.load_library(str(library))
    return Built(name, library, True, json.loads(record.read_text())["build_s"], time.perf_counter() - start)


@contextlib.contextmanager
def _build_lock(directory: Path):
    """An exclusive lock on the build directory across processes (released by the kernel if one dies)."""
    with open(directory / "build.lock", "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")   # parallel readers never see half a file
    tmp.write_text(text)
    tmp.replace(path)


def _build(name: str, library: Path, cpp_source: str, sycl_source: str | None, extra_cflags: tuple[str, ...],
           verbose: bool) -> None:
    """Run torch's JIT build of `library` (under _build_lock), telling BUILD_LISTENERS around it."""
    needs = ("cxx", "ninja", "sycl") if sycl_source else ("cxx", "ninja")
    reason = skip_reason(needs, caps=probe())      # probed now: PATH may have changed since import
    if reason:
        raise BuildError(f"cannot build the {name!r} extension here: {reason}")
    directory = library.parent
    _remove_stale_lock(directory)
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import load_inline
    # torch remembers each name's sources per process and skips the build when they are unchanged, even
    # when the last build did not finish (a time limit interrupted it): no library then, and loading fails.
    # Reaching here means this source has no finished build, so let torch build it.
    getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", {}).pop(library.stem, None)
    for listen in BUILD_LISTENERS:
        listen("start")
    try:
        runtime = loaded_cxx_runtime()
        load_inline(library.stem, cpp_sources=cpp_source, sycl_sources=sycl_source,
                    extra_cflags=list(extra_cflags), extra_sycl_cflags=list(extra_cflags) if sycl_source else None,
                    extra_ldflags=[str(runtime)] if runtime else None,
                    build_directory=str(directory), is_python_module=False, no_implicit_headers=True,
                    verbose=verbose)
    except RuntimeError as exc:                    # torch's "Error building extension ...": compiler output
        raise BuildError(compiler_errors(name, str(exc), directory), log=str(exc)) from None
    finally:
        for listen in BUILD_LISTENERS:
            listen("end")


def compiler_errors(name: str, log: str, directory: Path, limit: int = 8) -> str:
    """The compiler's error lines from a failed build log, shortened, with where to see the rest."""
    lines = [line.replace(str(directory) + os.sep, "") for line in log.splitlines()
             if re.search(r"\berror\b", line, re.I) and not line.startswith(("FAILED:", "ninja: build stopped"))]
    shown = "\n  ".join(lines[:limit]) or log[-2000:]
    more = f"\n  ... and {len(lines) - limit} more" if len(lines) > limit else ""
    return (f"the compiler rejected the {name!r} extension:\n  {shown}{more}\n"
            f"(sources and build files: {directory}; the BuildError's .log has the full output)")


def _remove_stale_lock(directory: Path) -> None:
    """torch waits forever on the lock file of a build that was killed; remove it when it is old."""
    lock = directory / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        warnings.warn(f"removed a stale build lock left by an interrupted build: {lock}", stacklevel=3)
        lock.unlink(missing_ok=True)


XPU_ARCH_ENV = "TORCH_XPU_ARCH_LIST"


def load_cpu_kernels(verbose: bool = False) -> Built:
    """Build (once) and register the C++ CPU kernel of labs_ext::rms_norm."""
    return build_and_load("labs_ext_cpu", CPU_SOURCE.read_text(), verbose=verbose)


def load_stable_kernel(verbose: bool = False) -> Built:
    """Build (once) and load rms_norm_stable.cpp: it defines labs_stable::rms_norm itself (STABLE_TORCH_LIBRARY)
    with a CPU kernel, against the stable ABI targeting torch 2.10. Its fake kernel and autograd formula are
    registered from Python after this call (register_stable_python_half): the library must be loaded first."""
    return build_and_load("labs_stable_cpu", STABLE_SOURCE.read_text(), verbose=verbose,
                          extra_cflags=("-O3", f"-DTORCH_TARGET_VERSION={STABLE_TARGET}"))


def register_stable_python_half() -> bool:
    """After load_stable_kernel(): the fake kernel and the autograd formula of labs_stable::rms_norm (the same
    formula as labs_ext::rms_norm's). Registers once per process; returns whether it registered now."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(STABLE_OP, "Meta"):
        return False
    torch.library.register_fake(STABLE_OP)(_rms_norm_fake)
    torch.library.register_autograd(STABLE_OP, _backward, setup_context=_setup_context)
    return True


def load_xpu_kernels(verbose: bool = False) -> Built:
    """Build (once) and register the SYCL kernel of labs_ext::rms_norm. Needs icpx and an XPU torch.

    Unless TORCH_XPU_ARCH_LIST is set, it is set to "" for the build: torch then compiles SPIR-V only
    (-fsycl-targets=spir64), which the driver compiles for whichever Intel GPU runs it, on first launch.
    torch's default compiles ahead of time for every architecture in torch.xpu.get_arch_list() (minus
    dg2) plus that SPIR-V: minutes of ocloc on a build the lesson makes in a cell."""
    arch_list = os.environ.setdefault(XPU_ARCH_ENV, "")
    try:
        return build_and_load("labs_ext_xpu", "", sycl_source=SYCL_SOURCE.read_text(), verbose=verbose)
    finally:
        if arch_list == "" and os.environ.get(XPU_ARCH_ENV) == "":
            del os.environ[XPU_ARCH_ENV]


# --- The op: reference, schema, fake kernel, autograd ------------------------------------------------

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernels accumulate in (ATen's opmath type): float32 for bf16/fp16, else the dtype."""
    return torch.promote_types(dtype, torch.float32)


def check_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    """The rules every rms_norm kernel enforces, as clear ValueErrors."""
    if not x.dtype.is_floating_point:
        raise ValueError(f"rms_norm needs a floating-point x, got {x.dtype}: convert with x.float()")
    if x.dim() == 0 or weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight has shape {tuple(weight.shape)} but x has shape {tuple(x.shape)}: "
                         f"pass a weight of shape ({x.shape[-1] if x.dim() else '?'},)")
    if weight.dtype != x.dtype:
        raise ValueError(f"rms_norm: x is {x.dtype} but weight is {weight.dtype}; use one dtype "
                         f"(weight.to(x.dtype))")
    if weight.device != x.device:
        raise ValueError(f"rms_norm: x is on {x.device} but weight is on {weight.device}")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x**2 over the last dim) + eps) * weight, computed in float32 (float64 for
    float64) and rounded once, like the kernels. Contiguous output, like the kernels."""
    acc = _acc_dtype(x.dtype)
    xf = x.to(acc)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(acc)
    return y.to(x.dtype).contiguous()


_LIB = torch.library.Library(NAMESPACE, "DEF")     # kept alive for the process: it owns the registrations
_LIB.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")
RMS_NORM = f"{NAMESPACE}::rms_norm"


def _fallback(x, weight, eps):
    check_inputs(x, weight)
    return rms_norm_reference(x, weight, eps)


# Every device without a kernel of its own (CUDA, MPS, XPU before the SYCL build, CPU before the C++ build)
_LIB.impl("rms_norm", _fallback, "CompositeExplicitAutograd")


@torch.library.register_fake(RMS_NORM, lib=_LIB)
def _rms_norm_fake(x, weight, eps):
    check_inputs(x, weight)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    """With r = 1/sqrt(mean(x**2) + eps): dx = r * (g*w - x * r**2 * mean(g*w*x)), dw = sum(g*x*r)."""
    x, weight = ctx.saved_tensors
    acc = _acc_dtype(x.dtype)
    xf, wf, gf = x.to(acc), weight.to(acc), grad.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gw = gf * wf
    grad_x = rstd * (gw - xf * rstd.pow(2) * (gw * xf).mean(-1, keepdim=True))
    grad_w = (gf * xf * rstd).reshape(-1, x.shape[-1]).sum(0)
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


torch.library.register_autograd(RMS_NORM, _backward, setup_context=_setup_context, lib=_LIB)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """labs_ext::rms_norm, with the inputs checked first (clear ValueErrors instead of C++ ones)."""
    check_inputs(x, weight)
    return torch.ops.labs_ext.rms_norm(x, weight, eps)


def show(path: Path, start: str, stop: str | None = None) -> None:
    """Print the lines of a source file from the first one containing `start` up to the next one containing
    `stop` (to the end without it), headed by the file's name and the line numbers."""
    lines = Path(path).read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    last = next((i for i, line in enumerate(lines) if stop and stop in line and i > first), len(lines) - 1)
    print(f"// {Path(path).name}, lines {first + 1}-{last + 1}")
    print("\n".join(lines[first:last + 1]))


def op_defined(qualname: str) -> bool:
    """Whether the operator `ns::name` exists in this process (an op defined in C++ exists once its library
    is loaded)."""
    namespace, name = qualname.split("::")
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def native_kernels(op: str = RMS_NORM) -> dict[str, bool]:
    """Which dispatch keys have a kernel of their own for `op` (the rest use the fallback).
    Asks the dispatcher through a private torch function: it is for teaching and debugging."""
    return {key: torch._C._dispatch_has_kernel_for_dispatch_key(op, key) for key in ("CPU", "XPU", "CUDA")}


def kernel_for(device: torch.device | str, op: str = RMS_NORM) -> str:
    """Which implementation labs_ext::rms_norm runs for tensors on `device`."""
    key = {"cpu": "CPU", "xpu": "XPU", "cuda": "CUDA"}.get(torch.device(device).type)
    if key and native_kernels(op)[key]:
        return {"CPU": "C++ kernel (rms_norm_cpu.cpp)", "XPU": "SYCL kernel (rms_norm_xpu.sycl)"}.get(key, key)
    return "PyTorch reference (CompositeExplicitAutograd fallback)"


def sample_inputs(device: torch.device | str = "cpu", quick: bool = True) -> list[tuple]:
    """Arguments for opcheck and the numerics checks: odd shapes, several dtypes, one non-contiguous
    x, inputs that require grad."""
    # the SYCL kernel has no float64 kernel (several Intel GPUs lack native fp64): float16 there instead
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if torch.device(device).type == "xpu"
                                                else [torch.float64])
    shapes = [(3, 7), (2, 5, 33)] if quick else [(3, 7), (2, 5, 33), (1, 1), (64, 1025)]
    samples = []
    for dtype in dtypes:
        for shape in shapes:
            x = torch.randn(shape, device=device, dtype=dtype, requires_grad=dtype == torch.float32)
            w = torch.rand(shape[-1], device=device, dtype=dtype, requires_grad=dtype == torch.float32)
            samples.append((x, w, 1e-6))
    x_t = torch.randn(9, 6, device=device).t()           # non-contiguous: the kernels copy it first
    samples.append((x_t, torch.rand(9, device=device), 1e-5))
    return samples


def compare_kernels(rows: int, hidden: int, dtype: torch.dtype = torch.float32, repeats: int = 5,
                    device: torch.device | str = "cpu", min_run_time: float = 0.1, threads: int | None = None) -> dict:
    """Time the PyTorch reference, torch's own F.rms_norm and labs_ext.rms_norm (whatever kernel is
    registered for `device`) side by side with helpers.bench.compare (at `threads` on a CPU; None: torch's
    current count)."""
    from helpers.bench import compare
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = torch.rand(hidden, device=device, dtype=dtype)
    result = compare({"reference (PyTorch ops)": lambda: rms_norm_reference(x, w),
                      "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6),
                      "labs_ext.rms_norm": lambda: torch.ops.labs_ext.rms_norm(x, w, 1e-6)},
                     baseline="reference (PyTorch ops)", repeats=repeats, device=device, min_run_time=min_run_time,
                     threads=threads, work=2 * x.numel() * x.element_size() / 1e9, work_unit="GB")
    result["kernel"] = kernel_for(device)
    result["shape"] = [rows, hidden]
    result["dtype"] = str(dtype)
    return result


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench ext`: the three implementations on the CPU (C++ built if possible)."""
    try:
        built = load_cpu_kernels()
        build = {"cached": built.cached, "build_s": built.build_s}
    except BuildError as exc:
        build = {"error": str(exc)}
    rows, hidden = (256, 1024) if quick else (4096, 4096)
    return {"build": build, "fp32": compare_kernels(rows, hidden, repeats=3 if quick else 7)}


def compare_with_compiled(rows: int, hidden: int, dtype: torch.dtype = torch.float32, repeats: int = 5,
                          device: torch.device | str = "cpu", min_run_time: float = 0.1,
                          threads: int | None = None) -> dict:
    """compare_kernels plus torch.compile of the PyTorch reference (Inductor fuses it into one kernel by
    itself): the question a hand-written kernel must answer. Compiles first (untimed); on a CPU Inductor
    needs a C++ compiler. result["compiled_kernels"] lists the kernels Inductor generated. `threads`: the
    count everything is timed at, and compiled at too (Inductor's CPU code fixes its OpenMP thread count
    when it is generated: torch._inductor.utils.parallel_num_threads)."""
    from helpers.bench import compare
    from helpers.fusion import inspect_compiled
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = torch.rand(hidden, device=device, dtype=dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        compiled = inspect_compiled(rms_norm_reference, x, w)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(compiled.result, rms_norm_reference(x, w))
    result = compare({"reference (PyTorch ops)": lambda: rms_norm_reference(x, w),
                      "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6),
                      "labs_ext.rms_norm": lambda: torch.ops.labs_ext.rms_norm(x, w, 1e-6),
                      "torch.compile(reference)": lambda: compiled.fn(x, w)},
                     baseline="reference (PyTorch ops)", repeats=repeats, device=device, min_run_time=min_run_time,
                     threads=threads, work=2 * x.numel() * x.element_size() / 1e9, work_unit="GB")
    result.update(kernel=kernel_for(device), shape=[rows, hidden], dtype=str(dtype),
                  compiled_kernels=compiled.kernel_functions, compile_s=compiled.compile_s)
    return result


def package_proxy_calls(package_path: str | Path) -> list[str]:
    """The ops an AOTInductor package (.pt2) does not compile but calls through the dispatcher at run time
    (its proxy executor), read from the package's wrapper JSON: each must be registered in the process
    that loads the package."""
    import zipfile
    targets: list[str] = []
    with zipfile.ZipFile(package_path) as package:
        for name in package.namelist():
            if name.endswith(".wrapper.json"):
                targets += [node["node"]["target"] for node in json.loads(package.read(name))["nodes"]]
    return targets


def stable_abi_headers() -> dict[str, list[str]]:
    """What the installed torch ships of the LibTorch stable ABI: the headers in torch/csrc/stable and the
    folders of torch/headeronly, and the torch::stable ops declared in stable/ops.h."""
    from torch.utils.cpp_extension import include_paths
    root = next(Path(p) / "torch" for p in include_paths() if (Path(p) / "torch" / "csrc" / "stable").is_dir())
    stable = root / "csrc" / "stable"
    ops_h = (stable / "ops.h").read_text() if (stable / "ops.h").exists() else ""
    ops = sorted(set(re.findall(r"^inline\s+[\w:<>&\s]+?\b(\w+)\(", ops_h, re.M)))
    return {"stable": sorted(p.name for p in stable.iterdir() if p.suffix == ".h"),
            "headeronly": sorted(p.name for p in (root / "headeronly").iterdir()),
            "ops": ops}
