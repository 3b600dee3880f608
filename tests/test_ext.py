"""helpers.ext: the rms_norm op (C++ CPU kernel, fallback, fake, autograd, compile), the cached
build-and-load helper and its error messages, and the lab op's checks.

The C++ build is shared with the lesson through the cache (one build per source per machine)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ext
from helpers.checks import CheckFailed
from helpers.ext import lab

SHAPES = [(1, 1), (3, 7), (2, 5, 33), (0, 8), (4, 0), (257, 129)]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.bfloat16: (1.6e-2, 1e-2),
       torch.float16: (1e-3, 1e-3)}


@pytest.fixture(scope="module")
def cpu_kernels():
    built = ext.load_cpu_kernels()
    assert ext.native_kernels()["CPU"], "loading the library must register the CPU kernel"
    return built


def test_reference_matches_torch_rms_norm():
    x, w = torch.randn(4, 9, dtype=torch.float64), torch.rand(9, dtype=torch.float64)
    torch.testing.assert_close(ext.rms_norm_reference(x, w, 1e-6),
                               torch.nn.functional.rms_norm(x, (9,), w, eps=1e-6))


def test_fallback_is_registered_for_every_device():
    assert torch._C._dispatch_has_kernel_for_dispatch_key(ext.RMS_NORM, "CompositeExplicitAutograd")
    y = torch.ops.labs_ext.rms_norm(torch.randn(2, 3, device="meta"), torch.rand(3, device="meta"), 1e-6)
    assert y.device.type == "meta" and y.shape == (2, 3)


@pytest.mark.requires("cxx", "ninja")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_kernel_matches_reference(cpu_kernels, shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3
    w = torch.rand(shape[-1], dtype=dtype)
    out = torch.ops.labs_ext.rms_norm(x, w, 1e-5)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, ext.rms_norm_reference(x, w, 1e-5), atol=atol, rtol=rtol)
    assert out.is_contiguous()


@pytest.mark.requires("cxx", "ninja")
def test_cpu_kernel_on_non_contiguous_input_and_many_threads(cpu_kernels):
    x = torch.randn(300, 200).t()                     # 200 rows of 300: several parallel_for chunks
    w = torch.rand(300)
    torch.testing.assert_close(torch.ops.labs_ext.rms_norm(x, w, 1e-6), ext.rms_norm_reference(x, w, 1e-6))
    assert ext.kernel_for("cpu") == "C++ kernel (rms_norm_cpu.cpp)"


@pytest.mark.requires("cxx", "ninja")
def test_cpu_kernel_rejects_bad_input_with_its_own_message(cpu_kernels):
    with pytest.raises(RuntimeError, match="use one dtype"):
        torch.ops.labs_ext.rms_norm(torch.randn(2, 3), torch.rand(3, dtype=torch.float64), 1e-6)
    with pytest.raises(RuntimeError, match=r"weight must have shape \(3,\)"):
        torch.ops.labs_ext.rms_norm(torch.randn(2, 3), torch.rand(4), 1e-6)


@pytest.mark.parametrize("x, w, text", [
    (torch.randn(2, 3), torch.rand(4), "pass a weight of shape (3,)"),
    (torch.randn(2, 3), torch.rand(3, dtype=torch.float64), "use one dtype"),
    (torch.ones(2, 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64), "floating-point"),
    (torch.tensor(1.0), torch.rand(1), "weight of shape (?,)"),
])
def test_wrapper_rejects_bad_input_clearly(x, w, text):
    with pytest.raises(ValueError) as info:
        ext.rms_norm(x, w)
    assert text in str(info.value)


@pytest.mark.requires("cxx", "ninja")
def test_opcheck_passes_with_the_cpu_kernel(cpu_kernels):
    for args in ext.sample_inputs(quick=True):
        result = torch.library.opcheck(torch.ops.labs_ext.rms_norm.default, args)
        assert set(result.values()) == {"SUCCESS"}


def test_autograd_formula_passes_gradcheck():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.labs_ext.rms_norm(a, b, 1e-6), (x, w))


def test_compiled_forward_and_backward_match_eager():
    x = torch.randn(5, 17, requires_grad=True)
    w = torch.rand(17, requires_grad=True)
    f = torch.compile(lambda a, b: ext.rms_norm(a, b) * 2.0 + 1.0, fullgraph=True, backend="aot_eager")
    out = f(x, w)
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    expected = ext.rms_norm_reference(ref_x, ref_w) * 2.0 + 1.0
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(w.grad, ref_w.grad)


def test_comparisons_time_and_compile_at_the_thread_count_asked(monkeypatch):
    from types import SimpleNamespace

    from helpers import fusion
    seen = []

    def fake_inspect(fn, *args):   # records the count Inductor would fix in its CPU code
        seen.append(torch.get_num_threads())
        return SimpleNamespace(fn=fn, result=fn(*args), kernel_functions=[], compile_s=0.0)

    monkeypatch.setattr(fusion, "inspect_compiled", fake_inspect)
    before = torch.get_num_threads()
    result = ext.compare_with_compiled(4, 8, repeats=1, min_run_time=0.001, threads=1)
    assert seen == [1] and result["threads"] == 1 and torch.get_num_threads() == before
    assert ext.compare_kernels(4, 8, repeats=1, min_run_time=0.001, threads=1)["threads"] == 1


# --- build-and-load ------------------------------------------------------------------------------

def _path_with(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only links to the named tools found on the real PATH."""
    import shutil
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        real = shutil.which(tool)
        if real:
            (bin_dir / tool).symlink_to(real)
    return str(bin_dir)


def test_missing_compiler_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path))
    with pytest.raises(ext.BuildError) as info:
        ext.build_and_load("labs_ext_never", "// never built: no compiler on PATH\n")
    message = str(info.value)
    assert "needs cxx (no cxx on PATH)" in message and "apt install g++" in message
    assert "needs ninja" in message and "pip install ninja" in message


@pytest.mark.requires("cxx")
def test_missing_ninja_alone_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, "c++"))
    with pytest.raises(ext.BuildError, match="needs ninja") as info:
        ext.build_and_load("labs_ext_never", "// never built: no ninja on PATH\n")
    assert "needs cxx" not in str(info.value)


@pytest.mark.skipif(torch.xpu._is_compiled(), reason="an XPU build of torch has a SYCL runtime")
def test_sycl_build_on_a_cpu_wheel_names_the_missing_toolchain():
    with pytest.raises(ext.BuildError, match="needs sycl") as info:
        ext.build_and_load("labs_ext_never", "", sycl_source="// never built\n")
    assert "icpx" in str(info.value) and "environments/xpu.txt" in str(info.value)


@pytest.mark.skipif(torch.xpu._is_compiled(), reason="an XPU build of torch has a SYCL runtime")
def test_load_inline_sycl_error_on_a_cpu_wheel(tmp_path):
    """The error the lesson shows: torch itself refuses SYCL sources without a SYCL runtime."""
    from torch.utils.cpp_extension import load_inline
    with pytest.raises(OSError, match="SYCL runtime is not (dected|detected)"):
        load_inline("sycl_probe", cpp_sources="", sycl_sources="// x\n", build_directory=str(tmp_path),
                    is_python_module=False, no_implicit_headers=True)


@pytest.mark.requires("cxx", "ninja")
def test_compiler_errors_are_short_and_point_at_the_line(tmp_path, monkeypatch):
    monkeypatch.setattr(ext, "CACHE_DIR", tmp_path)
    with pytest.raises(ext.BuildError) as info:    # no torch headers: fails in well under a second
        ext.build_and_load("labs_ext_broken", "int broken( {\n")
    message = str(info.value)
    assert "the compiler rejected the 'labs_ext_broken' extension" in message
    assert "main.cpp:1" in message and "error" in message
    assert len(message.splitlines()) < 15 and "main.cpp" in info.value.log


@pytest.mark.requires("cxx", "ninja")
def test_second_load_comes_from_the_cache_without_a_compiler(cpu_kernels, tmp_path, monkeypatch):
    def no_compiling(*args, **kwargs):
        raise AssertionError("load_inline ran although the library was cached")
    import torch.utils.cpp_extension as cpp_extension
    monkeypatch.setattr(cpp_extension, "load_inline", no_compiling)
    monkeypatch.setenv("PATH", _path_with(tmp_path))   # no compiler needed for a cached library
    again = ext.load_cpu_kernels()
    assert again.cached and again.path == cpu_kernels.path and again.build_s == cpu_kernels.build_s
    assert again.path.parent == ext.build_directory("labs_ext_cpu", ext.CPU_SOURCE.read_text())


def test_cache_key_follows_source_and_flags():
    a = ext.build_directory("n", "int x;")
    assert a == ext.build_directory("n", "int x;")
    assert a != ext.build_directory("n", "int y;")
    assert a != ext.build_directory("n", "int x;", extra_cflags=("-O2",))
    assert a != ext.build_directory("n", "int x;", sycl_source="// sycl")
    with pytest.raises(ValueError, match="identifier"):
        ext.build_and_load("not a name", "int x;")


def test_stale_lock_is_removed(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")
    os.utime(lock, (0, 0))
    with pytest.warns(UserWarning, match="stale build lock"):
        ext._remove_stale_lock(tmp_path)
    assert not lock.exists()


# --- the lab's op and checks, on ops implemented in Python (no build needed) ---------------------

_TEST_LIB = torch.library.Library("labs_ext_test", "DEF")
for _name in ("good", "wrong", "nofake", "strided"):
    _TEST_LIB.define(f"{_name}(Tensor gate, Tensor up) -> Tensor")
for _name in ("good", "nofake", "strided"):
    _TEST_LIB.impl(_name, lab.silu_mul_reference, "CPU")
_TEST_LIB.impl("wrong", lambda g, u: (torch.sigmoid(g.float()) * u.float()).to(g.dtype), "CPU")


def _fake(gate, up):
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("gate and up must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def _strided_fake(gate, up):
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("gate and up must have the same shape and dtype")
    return torch.empty_like(gate)          # keeps a transposed gate's strides: the kernel's output does not


for _name in ("good", "wrong"):
    torch.library.register_fake(f"labs_ext_test::{_name}", _fake, lib=_TEST_LIB)
torch.library.register_fake("labs_ext_test::strided", _strided_fake, lib=_TEST_LIB)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


for _name in ("good", "nofake"):
    torch.library.register_autograd(f"labs_ext_test::{_name}", _backward, setup_context=_setup, lib=_TEST_LIB)


def test_lab_source_places_the_body_and_rejects_an_empty_one():
    source = lab.lab_source("  for (int64_t i = begin; i < end; ++i) out[i] = gate[i];\n")
    assert "out[i] = gate[i];" in source and lab.BODY_MARKER not in source
    assert "TORCH_LIBRARY_IMPL(labs_ext, CPU, m)" in source
    with pytest.raises(ValueError, match="non-empty string"):
        lab.lab_source("   ")


def test_lab_checks_pass_a_correct_op(capsys):
    op = torch.ops.labs_ext_test.good.default
    lab.check_kernel(op)
    lab.check_fake(op)
    lab.check_autograd(op)
    lab.check_opcheck(op)
    assert capsys.readouterr().out.count("passed") == 4


@pytest.mark.parametrize("check, op, text", [
    (lab.check_kernel, "wrong", "values differ"),
    (lab.check_fake, "nofake", "register_fake"),
    (lab.check_fake, "strided", "memory_format=torch.contiguous_format"),
    (lab.check_autograd, "wrong", "register_autograd"),
    (lab.check_opcheck, "nofake", "test_faketensor"),
])
def test_lab_checks_name_what_failed(check, op, text):
    with pytest.raises(CheckFailed) as info:
        check(getattr(torch.ops.labs_ext_test, op).default)
    assert text in str(info.value)


def test_lab_compile_check_wants_the_op_in_the_graph():
    op = torch.ops.labs_ext_test.good.default
    with pytest.raises(CheckFailed, match="does not call labs_ext_test::good"):
        lab.check_compiled(lambda x, g, u, d: lab.swiglu_mlp_reference(x, g, u, d), op=op, backend="aot_eager")
    lab.check_compiled(lambda x, g, u, d: op(x @ g.T, x @ u.T) @ d.T, op=op, backend="aot_eager")


# --- Intel GPU ---------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", [None, "pvc"])
def test_sycl_build_compiles_for_the_running_gpu_unless_told_otherwise(monkeypatch, preset):
    """TORCH_XPU_ARCH_LIST="" during the build (SPIR-V, compiled by the driver for the GPU that runs it),
    unless the user chose architectures; the variable is left as it was."""
    seen = []
    monkeypatch.setattr(ext, "build_and_load", lambda *a, **k: seen.append(os.environ.get("TORCH_XPU_ARCH_LIST")))
    if preset is None:
        monkeypatch.delenv("TORCH_XPU_ARCH_LIST", raising=False)
    else:
        monkeypatch.setenv("TORCH_XPU_ARCH_LIST", preset)
    ext.load_xpu_kernels()
    assert seen == ["" if preset is None else preset]
    assert os.environ.get("TORCH_XPU_ARCH_LIST") == preset


def test_sycl_kernel_guards_the_device_of_its_input():
    """Ops registered with TORCH_LIBRARY_IMPL get no generated device guard: the kernel sets one and
    takes the queue of x's device, and refuses a weight on another device."""
    source = ext.SYCL_SOURCE.read_text()
    assert "c10::DeviceGuard guard(x.device())" in source
    assert "getCurrentXPUStream(x.device().index())" in source and "getCurrentXPUStream()" not in source
    assert "x.device() == weight.device()" in source


@pytest.mark.requires("xpu", "sycl")      # a build box with icpx and no GPU builds, then has nothing to run on
def test_sycl_kernel_matches_reference():
    ext.load_xpu_kernels()
    assert ext.native_kernels()["XPU"]
    for x, w, eps in ext.sample_inputs("xpu", quick=False):
        torch.testing.assert_close(torch.ops.labs_ext.rms_norm(x, w, eps).cpu(),
                                   ext.rms_norm_reference(x.cpu(), w.cpu(), eps), atol=2e-2, rtol=2e-2)


@pytest.mark.requires_xpu
def test_xpu_memory_fraction_round_trip():
    old = torch.xpu.get_per_process_memory_fraction()
    try:
        torch.xpu.set_per_process_memory_fraction(0.5)
        assert torch.xpu.get_per_process_memory_fraction() == pytest.approx(0.5)
    finally:
        torch.xpu.set_per_process_memory_fraction(old)


# --- The stable-ABI kernel (labs_stable::rms_norm), helpers for the lesson, the Triton route ---------------

def test_stable_source_uses_only_the_stable_abi():
    """rms_norm_stable.cpp includes only torch/csrc/stable and torch/headeronly, and defines its own op."""
    source = ext.STABLE_SOURCE.read_text()
    includes = [line.split()[1] for line in source.splitlines() if line.startswith("#include <torch")]
    assert includes and all(i.startswith(("<torch/csrc/stable/", "<torch/headeronly/")) for i in includes)
    assert "STABLE_TORCH_LIBRARY(labs_stable" in source and "TORCH_BOX(&rms_norm_stable)" in source
    assert "ATen" not in source and "at::" not in source
    assert ext.STABLE_TARGET == "0x020a000000000000"      # 2.10.0: [major][minor][patch][abi tag]


@pytest.mark.requires("cxx", "ninja")
def test_stable_kernel_loads_first_then_its_python_half_and_passes_opcheck():
    """The hybrid order: the op exists once the library is loaded; the fake kernel and the formula follow."""
    built = ext.load_stable_kernel()
    assert built.path.exists() and ext.op_defined(ext.STABLE_OP)
    ext.register_stable_python_half()
    assert not ext.register_stable_python_half(), "registers once per process"
    for shape in [(3, 7), (2, 5, 33), (0, 8), (64, 1025)]:
        x, w = torch.randn(shape), torch.rand(shape[-1])
        torch.testing.assert_close(torch.ops.labs_stable.rms_norm(x, w, 1e-6), ext.rms_norm_reference(x, w))
    x = torch.randn(4, 8, requires_grad=True)
    result = torch.library.opcheck(torch.ops.labs_stable.rms_norm.default, (x, torch.rand(8), 1e-6))
    assert set(result.values()) == {"SUCCESS"}, result
    with pytest.raises(RuntimeError, match="float32 only"):
        torch.ops.labs_stable.rms_norm(torch.randn(2, 3, dtype=torch.float64), torch.rand(3, dtype=torch.float64), 1e-6)


def test_op_defined_and_show(capsys):
    assert ext.op_defined(ext.RMS_NORM)
    assert not ext.op_defined("labs_nowhere::rms_norm") and not ext.op_defined("labs_ext::no_such_op")
    ext.show(ext.CPU_SOURCE, "TORCH_LIBRARY_IMPL", "}")
    out = capsys.readouterr().out
    assert out.startswith("// rms_norm_cpu.cpp, lines ") and 'm.impl("rms_norm", &rms_norm_cpu);' in out


def test_xpu_samples_use_float16_instead_of_float64():
    """The SYCL kernel has no float64 kernel; its samples test float16 instead (CPU samples keep float64)."""
    on = {str(dev): {args[0].dtype for args in ext.sample_inputs(dev)} for dev in ("cpu", "meta")}
    assert torch.float64 in on["cpu"] and torch.float16 not in on["cpu"]
    source = Path(ext.__file__).read_text()
    assert "[torch.float16] if torch.device(device).type == \"xpu\"" in source


def test_triton_kernel_module_declares_a_triton_op():
    """Read, not imported: importing it decorates a Triton kernel, which only a GPU runs (2.10's wrap_triton
    rejects the CPU interpreter's kernels)."""
    source = (ext.SOURCES / "triton_kernel.py").read_text()
    assert '@triton_op("labs_triton::rms_norm", mutates_args=())' in source
    assert "wrap_triton(rms_norm_kernel)" in source and "register_autograd(ext._backward" in source


@pytest.mark.requires("triton_gpu")
def test_triton_op_matches_reference_and_compiles_on_a_gpu():
    from helpers.ext import triton_kernel
    device = torch.accelerator.current_accelerator()
    for args in ext.sample_inputs(device):
        torch.testing.assert_close(triton_kernel.rms_norm(*args), ext.rms_norm_reference(*args), atol=2e-2, rtol=2e-2)
        assert set(torch.library.opcheck(triton_kernel.rms_norm, args).values()) == {"SUCCESS"}


PARALLEL_BUILD = r'''
import json
from helpers import ext
built = ext.build_and_load("labs_parallel_probe", ext.CPU_SOURCE.read_text().replace("labs_ext", "labs_parallel"))
print(json.dumps({"cached": built.cached, "build_s": built.build_s}))
'''


@pytest.mark.requires("cxx", "ninja")
def test_parallel_processes_build_a_kernel_once_and_all_load_it(tmp_path):
    """Three processes on an empty cache: one compiles, the others wait for it and load its library (none
    rewrites a library another has mapped), and the recorded build time is the compiler's, not a wait."""
    env = dict(os.environ, LABS_CACHE=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", PARALLEL_BUILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sorted(r["cached"] for r in results) == [False, True, True], results
    compiled = next(r for r in results if not r["cached"])
    assert all(r["build_s"] == compiled["build_s"] for r in results)
    assert len(list(tmp_path.glob("ext/labs_parallel_probe-*/labs_parallel_probe_*.so"))) == 1
