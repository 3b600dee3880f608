"""Build the lesson's rms_norm kernels ahead of time, as an installable package, instead of with
load_inline at run time.

    cd helpers/ext/example_setup
    pip install --no-build-isolation .      # torch must already be installed: the build imports it

With an XPU build of torch and Intel's DPC++ compiler on PATH (icpx on Linux, icx on Windows, where
SYCL extensions need torch 2.10 or newer), this builds a SyclExtension holding the CPU (.cpp) and
the Intel GPU (.sycl) kernels; everywhere else a CppExtension with the CPU kernel alone.
SyclExtension and SYCL sources need ninja (pip install ninja). The kernels are compiled ahead of
time for torch.xpu.get_arch_list() (except dg2), plus SPIR-V for any other Intel GPU (compiled on first
launch); TORCH_XPU_ARCH_LIST (for example "pvc,bmg", or "" for SPIR-V only) chooses the list.
"""
import shutil
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, SyclExtension

KERNELS = Path(__file__).resolve().parent.parent          # helpers/ext: the .cpp and .sycl sources
WINDOWS = sys.platform == "win32"
OPTIMIZE = ["/O2"] if WINDOWS else ["-O3"]                # MSVC (cl) and icx on Windows take /O2
SYCL_COMPILER = "icx" if WINDOWS else "icpx"

sources = [str(KERNELS / "rms_norm_cpu.cpp")]
if torch.xpu._is_compiled() and shutil.which(SYCL_COMPILER):
    sources.append(str(KERNELS / "rms_norm_xpu.sycl"))
    extension = SyclExtension("labs_ext_kernels._C", sources, py_limited_api=True,
                              extra_compile_args={"cxx": OPTIMIZE, "sycl": OPTIMIZE})
else:
    print(f"setup.py: no XPU build of torch or no {SYCL_COMPILER} on PATH: building the CPU kernel only")
    extension = CppExtension("labs_ext_kernels._C", sources, py_limited_api=True,
                             extra_compile_args={"cxx": OPTIMIZE})

setup(
    name="labs-ext-kernels",
    version="0.1.0",
    description="The rms_norm kernels of PyTorch 2.10 Labs, lesson 04 (CPU and Intel GPU)",
    packages=["labs_ext_kernels"],
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension},
    # The kernels use no Python API, so one wheel serves every CPython >= 3.10 (abi3).
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    install_requires=["torch>=2.10"],
)
