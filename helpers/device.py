"""What this machine has, decided in one place.

Lessons, labs, tests and the doctor ask this module; nothing else inspects hardware.

    from helpers.device import capabilities, pick_device, requires
    DEVICE = pick_device()                       # torch.device, resolved once
    if requires("cuda", section="Combo kernels on the GPU"):
        ...                                      # runs here, or prints what was skipped and why

Every `requires` call is recorded (run or skipped, with the reason); when the environment variable
LABS_SECTION_LOG names a file, each record is appended to it as one JSON line, which is how the batch
runner learns which sections of a notebook ran; each is also emitted as a "section" event (helpers.events),
which the learner's progress (helpers.progress) keeps in their kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from helpers import events
from helpers.env import SECTION_LOG_ENV

OTHER_PYTHON_ENV = "LABS_OTHER_PYTHON"   # the other build's Python (GIL <-> free-threaded), for side-by-side runs
ACCELERATORS = ("cuda", "rocm", "xpu", "mps", "cpu")
TOOLCHAINS = {"cxx": ("c++", "g++", "clang++", "cl"), "ninja": ("ninja",), "nvcc": ("nvcc",),
              "hipcc": ("hipcc",), "icpx": ("icpx", "icx")}
FP8_ROCM_ARCHS = ("gfx942", "gfx950")
FNUZ_FP8_ARCHS = ("gfx942",)        # MI300's FP8 is the *_fnuz encoding (max 240); gfx950 uses OCP e4m3fn
CUTLASS_GROUPED_MM_MAJORS = (9, 10)  # _grouped_mm_cuda's fast path: _scaled_mm_allowed_device(sm90, sm100)


@dataclass(frozen=True)
class Capabilities:
    accelerator: str                 # one of ACCELERATORS ("rocm" is torch's "cuda" device on a HIP build)
    build_accelerator: str | None    # what the torch build targets ("cuda" for PyPI's Linux wheel), even
                                     # with no such device here; None for a CPU-only build
    device_type: str                 # what torch.device takes: "cuda", "xpu", "mps" or "cpu"
    device_name: str
    arch: str | None                 # "sm_90", "gfx942", an XPU name, or the CPU's vector ISA
    memory_gb: float | None          # accelerator memory, or the machine's RAM on CPU
    bf16: bool                       # native bf16 arithmetic (tensor cores, AVX512-BF16/AMX on CPU)
    fp64: bool                       # float64 on the device: tried (Intel Arc and Core Ultra GPUs have none)
    fp8: bool                        # FP8 matmul on the accelerator (sm_89+, gfx942/gfx950; on XPU: tried)
    torch_version: str
    cuda_version: str | None
    hip_version: str | None
    xpu_compiled: bool
    cpu_count: int                   # CPUs this process may use (affinity mask, cgroup quota), not the machine's
    cpu_name: str
    toolchains: dict[str, str | None] = field(default_factory=dict)   # name -> path, or None
    packages: dict[str, str | None] = field(default_factory=dict)     # name -> version, or None
    python_version: str = ""
    free_threaded: bool = False      # a 3.13t/3.14t build (Py_GIL_DISABLED)
    gil_enabled: bool = True         # whether the GIL was on when probed (requires() reads it live: gil_on())
    features: dict[str, bool] = field(default_factory=dict)   # version-dependent torch features (FEATURES)
    other_python: str | None = None  # LABS_OTHER_PYTHON, when it names an executable
    triton_distribution: str | None = None  # what installed the `triton` module: triton (CUDA wheels, PyPI),
                                            # triton-rocm / triton-xpu (torch 2.10's ROCm/XPU wheels), ...
    torch_wants_triton: str | None = None   # the Triton requirement torch's own metadata declares, if any
    cpu_capability: str = ""         # the vector ISA ATen's CPU kernels dispatch to: "AVX512", "AVX2", ...

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may run on: its affinity mask (taskset, a container's cpuset; os.process_cpu_count
    on Python 3.13+, which PYTHON_CPU_COUNT overrides), capped by a cgroup v2 CPU quota (docker --cpus)
    rounded up. os.cpu_count() counts every CPU of the machine."""
    if hasattr(os, "process_cpu_count"):
        n = os.process_cpu_count() or 1
    elif hasattr(os, "sched_getaffinity"):
        n = len(os.sched_getaffinity(0)) or 1
    else:
        n = os.cpu_count() or 1
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return n


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_install(find_spec: Callable = importlib.util.find_spec) -> tuple[str | None, str | None]:
    """(version, distribution) of the `triton` module Python would import, found without importing it.
    The distribution's name varies: PyPI's CUDA wheels of torch require `triton`, the ROCm and XPU wheels
    another name (triton-rocm / triton-xpu, pytorch-triton-rocm / pytorch-triton-xpu in earlier releases,
    `triton` again in AMD's own builds), so the module is looked up, then the dist-info beside it whose
    RECORD lists that very file."""
    spec = find_spec("triton")
    if spec is None or not spec.origin:
        return None, None
    origin = Path(spec.origin).resolve()
    for info in sorted(origin.parent.parent.glob("*.dist-info")):
        record = info / "RECORD"
        if record.is_file() and any(line.startswith("triton/__init__.py,")
                                    for line in record.read_text(errors="replace").splitlines()):
            dist = importlib.metadata.PathDistribution(info)
            return dist.version, dist.metadata["Name"]
    return "unknown", None


def torch_triton_requirement(requires: Callable = importlib.metadata.requires) -> str | None:
    """The Triton distribution torch's own metadata asks for ("triton==3.6.0", "triton-rocm==3.6.0"),
    without its platform marker; None for a build that asks for none (CPU wheels)."""
    try:
        lines = requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    wanted = [line.split(";")[0].strip() for line in lines if "triton" in line.split(";")[0].lower()]
    return wanted[0].replace(" ", "") if wanted else None


def _fp64_runs(torch_mod, device: str) -> bool:
    """A float64 sum on `device`: Intel Arc and Core Ultra GPUs refuse it ("Required aspect fp64 is not
    supported on the device"); CPUs, NVIDIA and AMD GPUs, Intel Data Center GPU Max run it."""
    if device == "cpu":
        return True
    try:
        return float(torch_mod.ones(4, dtype=torch_mod.float64, device=device).sum().item()) == 4.0
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def reference_device(device: torch.device | str, caps: Capabilities | None = None) -> torch.device:
    """Where to compute a float64 reference for work done on `device`: there, when it has float64,
    else the CPU."""
    device = torch.device(device)
    if device.type == "cpu" or (caps or capabilities()).fp64:
        return device
    return torch.device("cpu")


def _accelerators(torch_mod) -> tuple[str | None, str]:
    """(the accelerator this torch build was made for, or None for a CPU-only build; the device type to
    use here). A CUDA, ROCm or XPU build on a machine without that GPU is a CPU machine: PyPI's Linux
    wheels are CUDA builds, so laptops, CPU cloud machines and Colab's CPU runtime look like this."""
    acc_api = getattr(torch_mod, "accelerator", None)
    if acc_api is not None and hasattr(acc_api, "current_accelerator"):    # torch 2.6+
        acc = acc_api.current_accelerator()    # the build's accelerator, whether or not a device exists
        if acc is None:
            return None, "cpu"
        return acc.type, (acc.type if acc_api.is_available() else "cpu")
    for name, backend in (("cuda", torch_mod.cuda), ("xpu", getattr(torch_mod, "xpu", None)),
                          ("mps", getattr(getattr(torch_mod, "backends", None), "mps", None))):
        if backend is not None and backend.is_available():
            return name, name
    return None, "cpu"


def _rowwise_scaled_mm_on_cpu(torch_mod) -> bool:
    """Row-wise FP8 torch._scaled_mm on CPU tensors: torch 2.10's CPU kernel takes per-tensor scales
    only ("Now _scaled_mm only supports per-tensor scaling for CPU backend"); later releases take both."""
    a = torch_mod.ones(16, 16).to(torch_mod.float8_e4m3fn)
    try:
        torch_mod._scaled_mm(a, a.t(), scale_a=torch_mod.ones(16, 1), scale_b=torch_mod.ones(1, 16),
                             out_dtype=torch_mod.float32)
    except RuntimeError:
        return False
    return True


def _fp8_scaled_mm_runs(torch_mod, device: str) -> bool:
    """A tensor-wise FP8 torch._scaled_mm on `device` (the XPU kernel is new in 2.10, #165978; whether an
    Intel GPU runs it depends on the GPU and driver, so it is tried, not assumed)."""
    try:
        a = torch_mod.ones(16, 16, device=device).to(torch_mod.float8_e4m3fn)
        one = torch_mod.ones((), device=device)
        torch_mod._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch_mod.bfloat16)
    except (RuntimeError, AttributeError, TypeError, NotImplementedError):
        return False
    return True


# name -> test on the torch module: each feature is tried, not read from the version number
FEATURES: dict[str, Callable] = {
    "fp8_rowwise_cpu": _rowwise_scaled_mm_on_cpu,
}


def torch_features(torch_mod=torch) -> dict[str, bool]:
    return {name: bool(test(torch_mod)) for name, test in FEATURES.items()}


def _other_python(path: str | None) -> str | None:
    return path if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


def probe(torch_mod=torch, sys_mod=sys, which: Callable[[str], str | None] = shutil.which,
          cpu_flags: set[str] | None = None, config_var: Callable[[str], object] = sysconfig.get_config_var,
          features: Callable[[object], dict[str, bool]] = torch_features,
          fp8_runs: Callable[[object, str], bool] = _fp8_scaled_mm_runs,
          fp64_runs: Callable[[object, str], bool] = _fp64_runs,
          triton: Callable[[], tuple[str | None, str | None]] = triton_install,
          triton_wanted: Callable[[], str | None] = torch_triton_requirement) -> Capabilities:
    """Inspect the machine. The arguments exist so tests can fake every vendor and torch version."""
    build, device_type = _accelerators(torch_mod)
    hip = getattr(torch_mod.version, "hip", None)
    cuda = getattr(torch_mod.version, "cuda", None)
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    arch, memory_gb, name, bf16, fp8 = None, None, "", False, False
    if device_type == "cuda":
        props = torch_mod.cuda.get_device_properties(0)
        name, memory_gb = props.name, round(props.total_memory / 2**30, 1)
        if hip:
            arch = getattr(props, "gcnArchName", "").split(":")[0] or None
            bf16 = arch is not None and arch.startswith(("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12"))
            fp8 = arch in FP8_ROCM_ARCHS
        else:
            arch = f"sm_{props.major}{props.minor}"
            bf16 = props.major >= 8
            fp8 = (props.major, props.minor) >= (8, 9)
    elif device_type == "xpu":
        props = torch_mod.xpu.get_device_properties(0)
        name, memory_gb = props.name, round(props.total_memory / 2**30, 1)
        arch = name
        bf16 = True
        fp8 = fp8_runs(torch_mod, "xpu")
    elif device_type == "mps":
        name, arch, bf16 = "Apple GPU", "mps", True
    else:
        name = _cpu_name()
        arch = next((isa for isa in ("amx_tile", "avx512f", "avx2", "asimd", "neon") if isa in flags), None)
        memory_gb = _ram_gb()
        bf16 = bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    accelerator = "rocm" if device_type == "cuda" and hip else device_type
    build_accelerator = "rocm" if build == "cuda" and hip else build
    gil_check = getattr(sys_mod, "_is_gil_enabled", None)
    triton_version, triton_dist = triton()
    cpu_backend = getattr(getattr(torch_mod, "backends", None), "cpu", None)
    packages = {pkg: _package_version(pkg) for pkg in ("torchao", "torchdata", "numpy", "scikit-learn")}
    return Capabilities(
        accelerator=accelerator, build_accelerator=build_accelerator, device_type=device_type,
        device_name=name, arch=arch,
        memory_gb=memory_gb, bf16=bf16, fp8=fp8, fp64=fp64_runs(torch_mod, device_type),
        torch_version=torch_mod.__version__, cuda_version=None if hip else cuda, hip_version=hip,
        xpu_compiled=bool(getattr(getattr(torch_mod, "xpu", None), "_is_compiled", lambda: False)()),
        cpu_count=usable_cpus(), cpu_name=_cpu_name(),
        toolchains={tool: next((p for p in map(which, names) if p), None) for tool, names in TOOLCHAINS.items()},
        packages={"triton": triton_version, **packages},
        python_version=platform.python_version(),
        free_threaded=bool(config_var("Py_GIL_DISABLED")),
        gil_enabled=gil_check() if gil_check is not None else True,
        features=features(torch_mod),
        other_python=_other_python(os.environ.get(OTHER_PYTHON_ENV)),
        triton_distribution=triton_dist, torch_wants_triton=triton_wanted(),
        cpu_capability=cpu_backend.get_cpu_capability() if hasattr(cpu_backend, "get_cpu_capability") else "",
    )


@functools.cache
def capabilities() -> Capabilities:
    """This machine's capabilities, probed once per process."""
    return probe()


def gil_on(c: Capabilities | None = None) -> bool:
    """Whether the GIL is on now. For this process it is read live (sys._is_gil_enabled()): importing an
    extension not marked free-threading-safe after the probe turns it back on. A Capabilities other than
    this process's (a test's fake) answers from its own field."""
    if c is None or c is capabilities():
        check = getattr(sys, "_is_gil_enabled", None)
        return check() if check is not None else True
    return c.gil_enabled


@functools.cache
def triton_interpreter_runs() -> bool:
    """Run one tiny Triton kernel with TRITON_INTERPRET=1 in a child process (the interpreter is
    process-wide state, so it is tried where it cannot disturb this process)."""
    if triton_install()[0] is None:
        return False
    code = ("import torch, triton, triton.language as tl\n"
            "@triton.jit\ndef k(x, y):\n    tl.store(y + tl.arange(0, 4), tl.load(x + tl.arange(0, 4)) * 2)\n"
            "x = torch.arange(4.0); y = torch.empty(4); k[(1,)](x, y); assert y.tolist() == [0, 2, 4, 6]\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


# --- Requirements: name -> (test on Capabilities, what would make it true) ---------------------

def _tool(name: str):
    return lambda c: c.toolchains.get(name) is not None


def _package(name: str):
    return lambda c: c.packages.get(name) is not None


NEEDS: dict[str, tuple[Callable[[Capabilities], bool], str]] = {
    "cuda": (lambda c: c.accelerator == "cuda",
             "an NVIDIA GPU with a CUDA build of torch (environments/cuda.txt)"),
    "grouped_mm_cutlass": (lambda c: c.accelerator == "cuda" and c.arch is not None
                           and int(c.arch[3:]) // 10 in CUTLASS_GROUPED_MM_MAJORS,
                           "an NVIDIA GPU where grouped_mm takes its CUTLASS kernel: sm_90 (H100/H200) or "
                           "sm_100 (B200/GB200); other GPUs, sm_120 included, take the loop of regular GEMMs"),
    "torch_cuda": (lambda c: c.accelerator in ("cuda", "rocm"),
                   "an NVIDIA or AMD GPU: torch.cuda's API (ROCm builds of torch use it too)"),
    "rocm": (lambda c: c.accelerator == "rocm",
             "an AMD GPU with a ROCm build of torch (environments/rocm.txt)"),
    "rocm_ck": (lambda c: c.accelerator == "rocm" and c.arch in FP8_ROCM_ARCHS,
                "an AMD Instinct MI300/MI350-class GPU (gfx942/gfx950) with a ROCm build of torch"),
    "xpu": (lambda c: c.accelerator == "xpu",
            "an Intel GPU with an XPU build of torch (environments/xpu.txt)"),
    "mps": (lambda c: c.accelerator == "mps", "an Apple-silicon Mac with macOS 14 or newer"),
    "gpu": (lambda c: c.accelerator in ("cuda", "rocm", "xpu"),
            "an NVIDIA, AMD or Intel GPU with the matching torch build (environments/)"),
    "accelerator": (lambda c: c.accelerator != "cpu", "any accelerator torch supports (CUDA, ROCm, XPU, MPS)"),
    "bf16": (lambda c: c.bf16, "hardware with native bf16 (Ampere+ GPU, MI200+, Intel GPU, or a CPU with "
             "AVX512-BF16/AMX)"),
    "fp64": (lambda c: c.fp64, "a device with float64 arithmetic (a CPU, NVIDIA or AMD GPU, Intel Data Center "
                               "GPU Max; Intel Arc and Core Ultra GPUs have none)"),
    "fp8": (lambda c: c.fp8, "a GPU with FP8 matmul (NVIDIA sm_89+ such as L4/H100, AMD MI300+, an Intel GPU "
                             "whose driver runs torch 2.10's XPU _scaled_mm)"),
    "cxx": (_tool("cxx"), "a C++ compiler on PATH (apt install g++, or Xcode command-line tools)"),
    "ninja": (_tool("ninja"), "ninja on PATH (pip install ninja)"),
    "nvcc": (_tool("nvcc"), "the CUDA toolkit's nvcc on PATH"),
    "hipcc": (_tool("hipcc"), "ROCm's hipcc on PATH"),
    "icpx": (_tool("icpx"), "Intel oneAPI DPC++ (icpx; icx on Windows) on PATH"),
    "sycl": (lambda c: c.toolchains.get("icpx") is not None and c.xpu_compiled,
             "Intel oneAPI DPC++ (icpx) on PATH and an XPU build of torch (environments/xpu.txt)"),
    "triton": (_package("triton"), "Triton (every GPU build of torch brings its own; pip install triton on a CPU)"),
    "triton_gpu": (lambda c: c.packages.get("triton") is not None and c.accelerator in ("cuda", "rocm", "xpu"),
                   "Triton and a GPU it compiles for (NVIDIA, AMD or Intel)"),
    "triton_interpreter": (lambda c: triton_interpreter_runs() if c is capabilities()
                           else c.packages.get("triton") is not None,
                           "Triton installed; its interpreter runs kernels on the CPU"),
    "torchao": (_package("torchao"), "torchao (pip install torchao; match it to your torch version)"),
    "torchdata": (_package("torchdata"), "torchdata (pip install torchdata)"),
    "sklearn": (_package("scikit-learn"), "scikit-learn (pip install scikit-learn; every environments/ file but minimal.txt has it)"),
    "fp8_rowwise_cpu": (lambda c: c.features.get("fp8_rowwise_cpu", False),
                        "a torch whose CPU torch._scaled_mm takes row-wise scales (newer than 2.10; "
                        "environments/cpu.txt pins one)"),
    "free_threaded": (lambda c: c.free_threaded,
                      "a free-threaded CPython 3.13t/3.14t with a matching torch (environments/free-threaded.txt)"),
    "other_python": (lambda c: c.other_python is not None,
                     f"{OTHER_PYTHON_ENV}=PATH naming the Python of a venv of the other build (a GIL build "
                     f"beside a free-threaded one, or the reverse) with torch and this package; "
                     f"make free-threaded sets it"),
    "gil_disabled": (lambda c: not gil_on(c),
                     "a free-threaded CPython with the GIL off (no extension re-enabled it; PYTHON_GIL=0)"),
}


def _requirement_parts(requirement: str) -> tuple[str, str]:
    name, _, version = requirement.partition("==")
    return name.strip().lower().replace("_", "-"), version.strip()


def triton_remedy(c: Capabilities) -> str:
    """How to get the Triton this torch build works with: the distribution torch's metadata declares
    (`triton` for CUDA wheels, `triton-rocm` / `triton-xpu` for ROCm and XPU wheels, from the index the
    torch came from); PyPI's generic `triton` over a ROCm or XPU build shadows the vendor's backend."""
    if c.torch_wants_triton:
        name, _ = _requirement_parts(c.torch_wants_triton)
        where = "" if name == "triton" else " from the index your torch came from (download.pytorch.org/whl/...)"
        return f"pip install '{c.torch_wants_triton}'{where}: the Triton torch {c.torch_version} declares"
    if c.build_accelerator in ("rocm", "xpu"):
        return (f"the Triton of your torch's {c.build_accelerator.upper()} build (triton-{c.build_accelerator}, "
                f"from download.pytorch.org/whl/...); not PyPI's generic triton")
    return "pip install triton (its interpreter runs kernels on a CPU)"


def triton_mismatch(c: Capabilities) -> str | None:
    """A `triton` module from another distribution or version than the one torch declares, or None."""
    if not (c.torch_wants_triton and c.triton_distribution):
        return None
    want = _requirement_parts(c.torch_wants_triton)
    have = (c.triton_distribution.lower().replace("_", "-"), c.packages.get("triton") or "")
    if want == have or (want[0] == have[0] and not want[1]):
        return None
    return (f"torch {c.torch_version} declares {c.torch_wants_triton}, but the triton module comes from "
            f"{c.triton_distribution} {have[1]}; {triton_remedy(c)}")


TRITON_NEEDS = ("triton", "triton_gpu", "triton_interpreter")


def _remedy(name: str, c: Capabilities) -> str:
    if name in TRITON_NEEDS and c.packages.get("triton") is None:
        return triton_remedy(c)
    return NEEDS[name][1]


def _found(name: str, c: Capabilities) -> str:
    """What the machine has instead, for the skip message."""
    if name in TOOLCHAINS:
        return f"no {name} on PATH"
    package = {"sklearn": "scikit-learn"}.get(name, name.split("_")[0])
    if package in c.packages and c.packages[package] is None:
        return f"{package} not installed"
    if name in c.features:
        return f"torch {c.torch_version} lacks it"
    if name == "other_python":
        return f"{OTHER_PYTHON_ENV} is {os.environ.get(OTHER_PYTHON_ENV) or 'unset'}"
    if name in ("free_threaded", "gil_disabled"):
        return f"Python {c.python_version}, free-threaded build: {c.free_threaded}, GIL on: {gil_on(c)}"
    return f"this machine: {c.accelerator} ({c.device_name}{', ' + c.arch if c.arch else ''})"


def check_needs(needs: tuple[str, ...] | list[str]) -> None:
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"unknown capability {unknown[0]!r}; known: {', '.join(sorted(NEEDS))}")


def missing(*needs: str, caps: Capabilities | None = None) -> list[str]:
    """The needs this machine does not meet (an unknown name raises ValueError)."""
    check_needs(needs)
    caps = caps or capabilities()
    return [n for n in needs if not NEEDS[n][0](caps)]


def skip_reason(needs: tuple[str, ...] | list[str], caps: Capabilities | None = None) -> str | None:
    """None when every need is met; otherwise what is missing and what would make it run."""
    caps = caps or capabilities()
    lacking = missing(*needs, caps=caps)
    if not lacking:
        return None
    return "; ".join(f"needs {n} ({_found(n, caps)}); to run it: {_remedy(n, caps)}" for n in lacking)


SECTIONS: list[dict] = []    # every requires() decision in this process, in order


def requires(*needs: str, section: str, caps: Capabilities | None = None) -> bool:
    """Decide whether a lesson section runs here; print and record the decision.

    Returns True when every need is met. Otherwise prints exactly what is missing and what would make
    it run, and returns False. Never silent: both outcomes are printed and recorded.
    """
    if not needs:
        raise ValueError("requires() needs at least one capability name")
    if not section:
        raise ValueError("requires() needs section='...' naming the section")
    reason = skip_reason(needs, caps)
    record = {"section": section, "needs": list(needs), "ran": reason is None, "reason": reason}
    SECTIONS.append(record)
    events.emit("section", **record)
    log = os.environ.get(SECTION_LOG_ENV)
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
    if reason is None:
        print(f"▶ Section '{section}' runs here ({', '.join(needs)} available).")
    else:
        print(f"⏭ SKIPPED section '{section}': {reason}.")
    return reason is None


def torch_version() -> str:
    """The torch this process imported, without probing the machine."""
    return torch.__version__


def pick_device(name: str = "auto") -> torch.device:
    """The torch.device lessons use: "auto" takes the accelerator if there is one, else the CPU."""
    caps = capabilities()
    if name == "auto":
        return torch.device(caps.device_type)
    base = name.split(":")[0]
    if base not in ("cpu", "cuda", "xpu", "mps"):
        raise ValueError(f"unknown device {name!r}; use 'auto', 'cpu', 'cuda', 'xpu' or 'mps' "
                         f"(ROCm GPUs are 'cuda' in torch)")
    if base != "cpu" and caps.device_type != base:
        need = {"cuda": "gpu", "xpu": "xpu", "mps": "mps"}[base]
        raise RuntimeError(f"device {name!r} is not available here ({_found(need, caps)}); "
                           f"use pick_device('auto') or get {NEEDS[need][1]}")
    return torch.device(name)


def cpu_capability() -> str:
    """The vector ISA ATen's CPU kernels dispatch to here ("AVX512", "AVX2", "DEFAULT", ...;
    ATEN_CPU_CAPABILITY can lower it): what decides a CPU kernel's alignment and vector width."""
    return capabilities().cpu_capability


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the work queued on `device` (this lesson's device when None; no-op on CPU). The device is
    passed on: torch.accelerator.synchronize() without one waits for the *current* device only."""
    dev = torch.device(device) if device is not None else pick_device()
    if dev.type != "cpu":
        torch.accelerator.synchronize(dev)


QUICK_ENV = "LABS_QUICK"


def quick_mode(requested: bool) -> bool:
    """Quick mode (small sizes) when the notebook's QUICK parameter asks for it, or when the
    environment sets LABS_QUICK=1 (the test suite does, since nbval cannot pass parameters)."""
    return bool(requested) or os.environ.get(QUICK_ENV) == "1"


def fp8_dtype(device: torch.device | str = "cpu", caps: Capabilities | None = None) -> torch.dtype:
    """The e4m3 FP8 format `device` computes in: float8_e4m3fnuz on MI300 (gfx942), float8_e4m3fn
    elsewhere (NVIDIA, MI350, Intel GPUs, the CPU)."""
    caps = caps or capabilities()
    if torch.device(device).type != "cpu" and caps.accelerator == "rocm" and caps.arch in FNUZ_FP8_ARCHS:
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn
