"""Lab 04: the op labs_ext::silu_mul (out = silu(gate) * up, the core of a SwiGLU MLP), its C++
template and the checks that say which part failed.

    from helpers.ext import lab
    lab.build_kernel(BODY)       # your C++ loop body in silu_mul_cpu_template.cpp, built and registered
    lab.check_kernel()           # numerics against silu_mul_reference, odd shapes, three dtypes
    lab.check_fake(); lab.check_autograd(); lab.check_opcheck(); lab.check_compiled(swiglu_mlp)

Importing this module defines only the schema: the CPU kernel, the fake kernel and the autograd
formula are the learner's. Every check takes the op as an argument, so it can test any op with the
same signature.

    lab.build_stable(SOURCE)     # a whole C++ file against the stable ABI, as the CPU kernel of an op of its own
    lab.stable_op(SOURCE)        # that op: the schema of labs_ext::silu_mul, the reference fake and autograd
    lab.silu_mul_record_kernel   # exercise 5's second op: a kernel that writes some of its arguments
"""
from __future__ import annotations

import hashlib
import re
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers.checks import distinct, fail, passed
from helpers.ext import NAMESPACE, SOURCES, STABLE_TARGET, BuildError, Built, build_and_load

TEMPLATE = (SOURCES / "silu_mul_cpu_template.cpp").read_text()
BODY_MARKER = "  // LAB: the loop body goes here\n"
SILU_MUL = f"{NAMESPACE}::silu_mul"

_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIB.define("silu_mul(Tensor gate, Tensor up) -> Tensor")


def _default_op():
    return torch.ops.labs_ext.silu_mul.default


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in float32 (float64 for float64), rounded once; contiguous like the kernel."""
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (F.silu(gate.to(acc)) * up.to(acc)).to(gate.dtype).contiguous()


def swiglu_mlp_reference(x, w_gate, w_up, w_down):
    """The SwiGLU feed-forward block of Llama-style models, in plain PyTorch."""
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def lab_source(body: str) -> str:
    """The template with `body` as the loop body of silu_mul_chunk."""
    if not isinstance(body, str) or not body.strip():
        raise ValueError("the kernel body must be a non-empty string of C++ statements, e.g. a for loop "
                         "from begin to end that writes out[i]")
    if BODY_MARKER not in TEMPLATE:
        raise RuntimeError("silu_mul_cpu_template.cpp lost its LAB marker line; restore it")
    return TEMPLATE.replace(BODY_MARKER, body.rstrip("\n") + "\n")


def _openmp_flags() -> tuple[str, ...]:
    """-fopenmp where torch's CPU threads are OpenMP's (Linux builds): without it the template compiles
    at::parallel_for as one call over the whole range, and the kernel never runs in chunks or threads."""
    return ("-fopenmp",) if sys.platform.startswith("linux") and torch.backends.openmp.is_available() else ()


def build_kernel(body: str, verbose: bool = False) -> Built:
    """Build the template with `body` (once per distinct body) and register it as the CPU kernel.
    A rebuilt body in the same process replaces the previous kernel (torch warns that it overrides).
    Built with OpenMP where torch uses it; a compiler without OpenMP gets a warning and a build without."""
    source, flags = lab_source(body), ("-O3", *_openmp_flags())
    try:
        return build_and_load("labs_ext_lab", source, extra_cflags=flags, verbose=verbose)
    except BuildError as exc:
        if flags == ("-O3",) or not any(word in exc.log for word in ("omp.h", "fopenmp")):
            raise
    warnings.warn("this C++ compiler has no OpenMP (-fopenmp failed): the kernel is built without it, so "
                  "at::parallel_for calls it once for the whole tensor, on one thread", stacklevel=2)
    return build_and_load("labs_ext_lab", source, verbose=verbose)


def register_reference_kernel() -> None:
    """Where no C++ compiler exists: the PyTorch reference stands in as the CPU kernel, so the rest of
    the lab (fake kernel, autograd, opcheck, torch.compile) still runs."""
    _LIB.impl("silu_mul", silu_mul_reference, "CPU")


def reference_backward(ctx, grad):
    """The op's gradients through aten's silu_backward: what exercise 4 and the stable-ABI op are graded with."""
    gate, up = ctx.saved_tensors
    return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


def save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


# --- A second op, one that writes its arguments (exercise 5) ------------------------------------------

def silu_mul_record_kernel(gate, up, out, amax):
    """Lab 04's recording kernel: out = silu(gate) * up, and amax raised to the largest |out| seen so far
    (a running maximum a scaling recipe can read). It computes the sigmoid in gate's storage to save a
    temporary."""
    out.copy_(gate)
    gate.sigmoid_()
    out.mul_(gate).mul_(up)
    torch.maximum(amax, out.abs().amax().reshape(1), out=amax)


# --- The same kernel against the LibTorch stable ABI (exercise 6) --------------------------------------

STABLE_FLAGS = ("-O3", f"-DTORCH_TARGET_VERSION={STABLE_TARGET}")   # as helpers.ext.load_stable_kernel builds
STABLE_IMPL = re.compile(rf"\bSTABLE_TORCH_LIBRARY_IMPL\s*\(\s*{NAMESPACE}\s*,")
DEFINES = re.compile(r"\bSTABLE_TORCH_LIBRARY(?:_FRAGMENT)?\s*\(")
_STABLE_LIBS: dict[str, torch.library.Library] = {}      # namespace -> the op's definition, for the process
_STABLE_FAILED: dict[str, BaseException] = {}            # source -> why it did not build or load


def stable_namespace(source: str) -> str:
    return "labs_stable_" + hashlib.sha256(source.encode()).hexdigest()[:12]


def stable_op(source: str):
    """The op `source` implements: silu_mul(Tensor gate, Tensor up) -> Tensor in a namespace named after the
    source, with the reference fake kernel and autograd formula (defined once per process)."""
    namespace = stable_namespace(source)
    if namespace not in _STABLE_LIBS:
        lib = torch.library.Library(namespace, "DEF")
        lib.define("silu_mul(Tensor gate, Tensor up) -> Tensor")
        torch.library.register_fake(f"{namespace}::silu_mul", silu_mul_reference, lib=lib)
        torch.library.register_autograd(f"{namespace}::silu_mul", reference_backward, setup_context=save_inputs,
                                        lib=lib)
        _STABLE_LIBS[namespace] = lib
    return getattr(torch.ops, namespace).silu_mul.default


def build_stable(source: str, verbose: bool = False) -> Built:
    """Build a whole C++ file with TORCH_TARGET_VERSION 2.10.0 (any torch header outside the stable ABI then
    stops the build with an #error) and load it. Its STABLE_TORCH_LIBRARY_IMPL(labs_ext, ...) block is built
    for stable_op(source) instead, so each source is an op of its own and replaces no other kernel (exercise 1's
    included). A source that does not build is reported again, not rebuilt, for the life of the process."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError("the stable kernel must be a non-empty string: a whole C++ file")
    if source in _STABLE_FAILED:
        raise _STABLE_FAILED[source]
    if DEFINES.search(source):
        raise ValueError(f"the source defines a namespace (STABLE_TORCH_LIBRARY): {SILU_MUL} and its schema exist "
                         "already, and loading a second definition of a namespace crashes the process; the library "
                         "adds a kernel only")
    namespace = stable_namespace(source)
    stable_op(source)
    try:
        return build_and_load("labs_ext_stable", STABLE_IMPL.sub(f"STABLE_TORCH_LIBRARY_IMPL({namespace},", source),
                              extra_cflags=STABLE_FLAGS, verbose=verbose)
    except (BuildError, OSError) as exc:    # OSError: the library would not load
        _STABLE_FAILED[source] = exc
        raise


def compiler_error_lines(log: str) -> list[str]:
    """The compiler's own error lines in a build log ('file:line:col: error: ...'), each file by its name."""
    return [re.sub(r"^\S*?([\w.]+):(\d+):(\d+):", r"\1:\2:\3:", line.strip())
            for line in log.splitlines() if re.match(r"^\S+:\d+:\d+: (fatal )?error:", line.strip())]


def unstable_headers(log: str) -> list[str]:
    """The torch headers whose #error stopped a build that targets a version (they are not the stable ABI's)."""
    found = re.findall(r"include/(\S+?\.h):\d+:\d+: error: #error \"This file should not be included", log)
    return list(dict.fromkeys(found))


def imported_symbols(library: Path | str) -> list[str]:
    """The symbols a shared library expects other libraries to define (what `nm -D --undefined-only` lists),
    read from its ELF dynamic symbol table; other formats (Mach-O) through `nm -u`."""
    data = Path(library).read_bytes()
    if data[:4] != b"\x7fELF":
        listing = subprocess.run(["nm", "-u", str(library)], capture_output=True, text=True, check=True).stdout
        return [line.split()[-1][1:] for line in listing.splitlines() if line.strip()]   # Mach-O adds a '_'
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    names = []
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != 11:          # SHT_DYNSYM
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, symbol_size):
            name, _, _, section = struct.unpack_from("<IBBH", data, at)
            if name and section == 0:       # SHN_UNDEF: defined elsewhere
                names.append(data[strings + name:data.index(b"\0", strings + name)].decode())
    return names


LIBTORCH_CPP = re.compile(r"^_Z(?:T[VIS])?N[rVKRO]*(?:2at|3c10|5torch|6caffe2)")   # at::, c10::, torch::, caffe2::


def libtorch_cpp_symbols(symbols: list[str]) -> list[str]:
    """The mangled C++ names among `symbols` that belong to libtorch's namespaces: a later torch that changes or
    stops exporting one of them cannot load the library."""
    return [s for s in symbols if LIBTORCH_CPP.match(s)]


def demangled(symbols: list[str]) -> list[str]:
    """The names as C++ reads them (c++filt), or as they are where c++filt is missing."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return symbols
    return out.stdout.splitlines()


# --- Checks --------------------------------------------------------------------------------------

SHAPES = [(7,), (1,), (0, 5), (3, 33), (2, 5, 129), (4099,)]     # 4099: more than one parallel_for chunk
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.bfloat16: (1e-2, 1e-2)}


def _first_line(exc: BaseException, limit: int = 240) -> str:
    line = (str(exc).splitlines() or [type(exc).__name__])[0]
    return line if len(line) <= limit else line[:limit] + " ..."


def _has_cpu_kernel(op) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op._schema.name, "CPU")


def check_kernel(op=None, what: str = "Exercise 1: the C++ kernel") -> None:
    """Values against silu_mul_reference on odd shapes (empty, one element, several parallel chunks),
    float32/float64/bfloat16, and a non-contiguous input."""
    op = op or _default_op()
    if not _has_cpu_kernel(op):
        fail(what, f"{op._schema.name} has no CPU kernel registered",
             "run the build cell above; if it raised, fix the compiler error it printed")
    torch.manual_seed(0)
    cases = [(shape, dtype) for dtype in TOLERANCE for shape in SHAPES]
    for shape, dtype in cases:
        gate, up = torch.randn(shape, dtype=dtype) * 4, torch.randn(shape, dtype=dtype)
        _compare(op, gate, up, what, f"shape {shape}, {dtype}")
    gate = torch.randn(40, 30).t()                    # non-contiguous: the wrapper copies it first
    _compare(op, gate, torch.randn(30, 40), what, "a transposed (non-contiguous) gate")
    passed(f"{what} ({len(cases) + 1} cases: {len(SHAPES)} shapes x {len(TOLERANCE)} dtypes, non-contiguous)")


def _compare(op, gate, up, what, case):
    try:
        out = op(gate, up)
    except Exception as exc:
        fail(what, f"raised {type(exc).__name__} on {case}: {_first_line(exc)}")
    expected = silu_mul_reference(gate, up)
    if out.shape != expected.shape or out.dtype != expected.dtype:
        fail(what, f"on {case}: got {tuple(out.shape)} {out.dtype}, expected {tuple(expected.shape)} "
                   f"{expected.dtype}", "return the tensor the wrapper allocated (out)")
    atol, rtol = TOLERANCE.get(gate.dtype, (1e-5, 1e-5))
    bad = ~torch.isclose(out.double(), expected.double(), atol=atol, rtol=rtol)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        got, want = distinct(out.flatten()[i].item(), expected.flatten()[i].item())
        fail(what, f"on {case}: {int(bad.sum())} of {out.numel()} values differ, first at flat index {i}: "
                   f"got {got}, expected {want} in {expected.dtype}",
             "loop i from begin to end (not 0 to n: each call gets one chunk [begin, end)); convert gate[i] "
             "and up[i] to acc_t, compute silu(g) * u there, and convert the result to scalar_t once")


def check_fake(op=None, what: str = "Exercise 2: the fake kernel") -> None:
    """The op runs on meta tensors (no data) and its fake output matches the real one (opcheck's
    test_faketensor: shape, dtype, strides)."""
    op = op or _default_op()
    try:
        out = op(torch.empty(3, 5, device="meta"), torch.empty(3, 5, device="meta"))
    except NotImplementedError as exc:
        fail(what, f"the op does not run on meta tensors: {_first_line(exc)}",
             f"register one: @torch.library.register_fake(\"{op._schema.name}\")")
    except Exception as exc:
        fail(what, f"the fake kernel raised {type(exc).__name__}: {_first_line(exc)}",
             "it must only allocate: return torch.empty_like(gate) (after checking shapes and dtypes)")
    if not isinstance(out, torch.Tensor) or out.shape != (3, 5) or out.dtype != torch.float32:
        fail(what, f"on two (3, 5) float32 inputs it returned {_describe(out)}",
             "return a tensor with gate's shape and dtype: torch.empty_like(gate)")
    transposed = (torch.randn(5, 3).t(), torch.randn(3, 5))     # the C++ wrapper returns it contiguous
    # strides compared here as well as by opcheck: torch 2.10's test_faketensor lets a stride mismatch pass
    real = op(*transposed)
    fake = op(*(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in transposed))
    if fake.stride() != real.stride():
        fail(what, f"on a transposed gate the fake kernel returns strides {fake.stride()}, the real op "
                   f"{real.stride()}", "allocate what the C++ kernel allocates, a contiguous tensor: "
                   "torch.empty_like(gate, memory_format=torch.contiguous_format)")
    _opcheck(op, [_sample((3, 5), torch.float32), transposed], ("test_faketensor",), what)
    for bad_up in (torch.empty(3, 4, device="meta"), torch.empty(3, 5, device="meta", dtype=torch.float64)):
        try:
            op(torch.empty(3, 5, device="meta"), bad_up)
        except Exception:
            continue
        fail(what, f"accepted gate (3, 5) float32 with up {tuple(bad_up.shape)} {bad_up.dtype}, which the "
                   "C++ kernel rejects", "raise a ValueError in the fake kernel when shapes or dtypes differ: "
                   "torch.compile only sees the fake kernel while tracing")
    passed(what)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"


def check_autograd(op=None, what: str = "Exercise 3: the autograd formula") -> None:
    """Gradients against the reference's autograd (float32) and torch.autograd.gradcheck (float64)."""
    op = op or _default_op()
    register_hint = (f"register it: torch.library.register_autograd(\"{op._schema.name}\", backward, "
                     "setup_context=setup_context)")
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op._schema.name, "Autograd"):
        fail(what, f"{op._schema.name} has no autograd formula registered (torch would fall back to a "
                   "deprecated path that warns and can give wrong or no gradients)", register_hint)
    torch.manual_seed(0)
    gate, up = torch.randn(4, 9, requires_grad=True), torch.randn(4, 9, requires_grad=True)
    try:
        op(gate, up).sum().backward()
    except RuntimeError as exc:
        fail(what, f"backward failed: {_first_line(exc)}",
             "backward(ctx, grad) returns one gradient per input (gate, up), each shaped like its input")
    ref_gate, ref_up = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
    silu_mul_reference(ref_gate, ref_up).sum().backward()
    for name, got, expected, formula in (
            ("gate", gate.grad, ref_gate.grad, "up * s * (1 + g * (1 - s)) with s = sigmoid(g)"),
            ("up", up.grad, ref_up.grad, "silu(g) = g * sigmoid(g)")):
        if got is None:
            fail(what, f"no gradient reached {name}", "return a gradient for both gate and up, not None")
        if not torch.allclose(got, expected, atol=1e-5, rtol=1e-4):
            fail(what, f"the gradient for {name} is wrong (max error {(got - expected).abs().max():.3g})",
                 f"d out / d {name} = {formula}; multiply by the incoming grad and return one value per input")
    g64, u64 = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    if not torch.autograd.gradcheck(op, (g64, u64), raise_exception=False):
        fail(what, "gradcheck failed in float64", "compute the backward in the input dtype, not float32")
    passed(what)


def _sample(shape, dtype, requires_grad=False):
    return (torch.randn(shape, dtype=dtype, requires_grad=requires_grad),
            torch.randn(shape, dtype=dtype, requires_grad=requires_grad))


OPCHECK_HINTS = {
    "test_schema": "the kernel must not modify its inputs or return one of them: allocate a new output",
    "test_autograd_registration": "register the backward with torch.library.register_autograd",
    "test_faketensor": "the fake kernel's output must match the real one in shape, dtype and strides: the "
                       "C++ wrapper returns a contiguous tensor even for a transposed gate, so use "
                       "torch.empty_like(gate, memory_format=torch.contiguous_format)",
    "test_aot_dispatch_dynamic": "torch.compile's tracer failed: the fake kernel may use only shapes and "
                                 "dtypes (no .item(), no data), and the backward must use torch operations",
}


def _opcheck(op, samples, tests, what) -> None:
    for args in samples:
        results = torch.library.opcheck(op, args, test_utils=tests, raise_exception=False)
        for test, outcome in results.items():
            if outcome != "SUCCESS":
                fail(what, f"opcheck's {test} failed on {_describe(args[0])}: {_first_line(outcome)}",
                     OPCHECK_HINTS.get(test, ""))


def check_opcheck(op=None, what: str = "Exercises 1-3 together: torch.library.opcheck") -> None:
    """opcheck's four tests on float32 inputs that require grad, bfloat16 and an odd shape."""
    op = op or _default_op()
    torch.manual_seed(0)
    samples = [_sample((3, 5), torch.float32, requires_grad=True), _sample((2, 7, 9), torch.bfloat16),
               _sample((33,), torch.float32)]
    tests = tuple(OPCHECK_HINTS)
    _opcheck(op, samples, tests, what)
    passed(f"{what} ({', '.join(tests)} on {len(samples)} samples)")


def check_compiled(swiglu_mlp, op=None, backend: str = "inductor",
                   what: str = "Exercise 4: SwiGLU under torch.compile") -> None:
    """swiglu_mlp(x, w_gate, w_up, w_down) calls the op, compiles with fullgraph=True (no graph
    breaks), and matches the reference in values and gradients."""
    op = op or _default_op()
    torch.manual_seed(0)
    dim, hidden = 16, 40
    x = torch.randn(6, dim)
    weights = [torch.randn(hidden, dim) / 4, torch.randn(hidden, dim) / 4, torch.randn(dim, hidden) / 6]
    seen = []

    def record_graph(gm, example_inputs):
        seen.extend(node.target for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(swiglu_mlp, backend=record_graph, fullgraph=True)(x, *weights)
    except Exception as exc:
        fail(what, f"fullgraph=True compile failed: {type(exc).__name__}: {_first_line(exc)}",
             "a graph break: no print, .item(), numpy or data-dependent Python in the function, and the op "
             "needs its fake kernel")
    if not any(target in (op, op.overloadpacket) for target in seen):
        fail(what, f"the compiled graph does not call {op._schema.name}",
             "call torch.ops.labs_ext.silu_mul(...) inside swiglu_mlp instead of F.silu(...) * ...")
    params = [w.clone().requires_grad_() for w in weights]
    ref_params = [w.clone().requires_grad_() for w in weights]
    compiled = torch.compile(swiglu_mlp, backend=backend, fullgraph=True)
    out = compiled(x, *params)
    expected = swiglu_mlp_reference(x, *ref_params)
    if not torch.allclose(out, expected, atol=1e-4, rtol=1e-4):
        fail(what, f"compiled output differs from the reference by up to {(out - expected).abs().max():.3g}",
             "gate goes through silu, up does not: silu_mul(x @ w_gate.T, x @ w_up.T) @ w_down.T")
    out.sum().backward()
    expected.sum().backward()
    for name, p, r in zip(("w_gate", "w_up", "w_down"), params, ref_params):
        if p.grad is None or not torch.allclose(p.grad, r.grad, atol=1e-4, rtol=1e-3):
            fail(what, f"the gradient of {name} through the compiled function is wrong or missing",
                 "check Exercise 3: the compiled backward uses your registered formula")
    passed(f"{what} (backend {backend!r}, values and gradients)")
