"""Lab 04 (the C++ custom op): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show."""
from __future__ import annotations

import itertools
import os
import re
import sys
import warnings

import torch

from helpers.ext.lab import silu_mul_record_kernel   # bound at import: the sandbox restores this module's names
from helpers.grading.recorder import _AtenNames


def _is_silu_mul_reference(fn, function: str) -> bool:
    specs = sys.modules.get("helpers.grading.specs")   # never imported in a submission's sandbox
    return specs is not None and any(e.function == function and e.reference is fn
                                     for e in specs.spec_for("04_custom_op_lab").exercises)


def silu_mul_kernel(fn, gate, up):
    """Build the body fn() returns into the op's CPU kernel, then run the op. The spec's reference body
    is not built: its values are the PyTorch reference's. (Loading a library a second time registers
    nothing, so building the reference between two cases would leave the learner's kernel in place and
    compare it with itself; and the grader needs no compiler for the expected values.)"""
    from helpers.ext import lab
    if _is_silu_mul_reference(fn, "silu_mul_body"):
        return lab.silu_mul_reference(gate, up)
    lab.build_kernel(fn())
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))    # so at::parallel_for splits a large input into chunks
    try:
        return torch.ops.labs_ext.silu_mul(gate, up)
    finally:
        torch.set_num_threads(threads)


CHUNK_PROBE = r"""// Lab 04's check of one chunk: the learner's body alone, called on [begin, end) of an out full of NaN.
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/full.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace labs_lab {
template <typename scalar_t>
void silu_mul_chunk(const scalar_t* gate, const scalar_t* up, scalar_t* out, int64_t begin, int64_t end) {
  using acc_t = at::opmath_type<scalar_t>;
BODY
}

at::Tensor chunk_probe(const at::Tensor& gate, const at::Tensor& up, int64_t begin, int64_t end) {
  // room past the inputs: a body that runs past its end writes there
  at::Tensor out = at::full({gate.numel() + 4096}, std::numeric_limits<float>::quiet_NaN(), gate.options());
  silu_mul_chunk<float>(gate.const_data_ptr<float>(), up.const_data_ptr<float>(), out.mutable_data_ptr<float>(),
                        begin, end);
  return out;
}
}  // namespace labs_lab

TORCH_LIBRARY(NAMESPACE, m) {
  m.def("chunk(Tensor gate, Tensor up, int begin, int end) -> Tensor", &labs_lab::chunk_probe);
}
"""


def chunk_writes(fn, n, begin, end) -> list[int]:
    """Build the body fn() returns into a bare chunk function (no threads; its own op namespace, one per
    body), call it once on the chunk [begin, end) of n float32 elements with `out` filled with NaN, and
    return [first written index, last written index + 1, number written]: a body that loops from 0, not
    from begin, writes elements of other chunks, which a whole-tensor run cannot show (same values)."""
    if _is_silu_mul_reference(fn, "silu_mul_body"):
        return [begin, end, end - begin]
    import hashlib

    from helpers.ext import build_and_load
    body = fn().rstrip("\n")
    namespace = "labs_probe_" + hashlib.sha256(body.encode()).hexdigest()[:16]
    if not hasattr(torch.ops, namespace) or not hasattr(getattr(torch.ops, namespace), "chunk"):
        build_and_load("labs_chunk_probe", CHUNK_PROBE.replace("BODY", body).replace("NAMESPACE", namespace),
                       extra_cflags=("-O1",))
    gen = torch.Generator().manual_seed(n)
    gate, up = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    out = getattr(torch.ops, namespace).chunk(gate, up, begin, end)
    written = (~out.isnan()).nonzero().flatten().tolist()
    return [written[0], written[-1] + 1, len(written)] if written else [0, 0, 0]


def on_meta(fn, gate, up):
    """fn on meta tensors with the inputs' shapes, strides and dtypes: (shape, strides, dtype)."""
    meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (gate, up)]
    out = fn(*meta)
    return list(out.shape), list(out.stride()), str(out.dtype)


def backward_of(fn, gate, up, grad):
    """fn(ctx, grad) with ctx holding (gate, up), as setup_context saves them."""
    ctx = type("Ctx", (), {"saved_tensors": (gate, up), "needs_input_grad": (True, True)})()
    return tuple(fn(ctx, grad))


class _silu_mul_reference_kernel:
    """Exercise 4 is graded on its own: while its cases run, the op's CPU kernel, fake kernel and autograd formula
    are the reference's, whatever exercises 1-3 registered (wrong ones, or none); the learner's are back
    afterwards (each registration is the newest of a stack, which destroying the library pops)."""
    def __enter__(self):
        from helpers.ext import lab
        self.lib = torch.library.Library("labs_ext", "IMPL")
        op = torch.ops.labs_ext.silu_mul.default
        autograd = torch._library.autograd.make_autograd_impl(op, torch._library.autograd.Info(
            lab.reference_backward, lab.save_inputs))
        with warnings.catch_warnings():    # "Overriding a previously registered kernel": on purpose
            warnings.simplefilter("ignore")
            self.lib.impl("silu_mul", lab.silu_mul_reference, "CPU", allow_override=True)
            self.lib.impl("silu_mul", autograd, "Autograd", with_keyset=True, allow_override=True)
            torch.library.register_fake("labs_ext::silu_mul", lab.silu_mul_reference, lib=self.lib,
                                        allow_override=True)

    def __exit__(self, *exc):
        self.lib._destroy()


def swiglu_values(fn, x, w_gate, w_up, w_down):
    with _silu_mul_reference_kernel():
        return fn(x, w_gate, w_up, w_down)


def compiled_with_grads(fn, x, w_gate, w_up, w_down):
    """fn compiled with fullgraph=True (aot_eager: tracing with the reference's fake kernel and autograd formula);
    its output and the gradients of x and the three weights. The spec's reference runs eagerly: compiling it would make
    Dynamo read helpers/grading/specs/, which a check cell in the grader's sandbox may not open."""
    with _silu_mul_reference_kernel():
        torch._dynamo.reset()
        inputs = [t.clone().requires_grad_() for t in (x, w_gate, w_up, w_down)]
        run = fn if _is_silu_mul_reference(fn, "swiglu_mlp") else torch.compile(fn, backend="aot_eager", fullgraph=True)
        out = run(*inputs)
        out.sum().backward()
        return [out.detach()] + [t.grad for t in inputs]


def uses_silu_mul(fn, x, w_gate, w_up, w_down) -> bool:
    names: set[str] = set()
    with _silu_mul_reference_kernel(), _AtenNames(names):
        fn(x, w_gate, w_up, w_down)
    return "silu_mul" in names


_RECORD_OPS: dict[str, object] = {}


def _record_op(schema: str):
    """labs_record_<n>::silu_mul_record defined with `schema`, the recording kernel as its kernel and a
    fake kernel that returns nothing; one namespace per schema (an op name is defined once per process)."""
    if schema not in _RECORD_OPS:
        namespace = f"labs_record_{len(_RECORD_OPS)}"
        lib = torch.library.Library(namespace, "DEF")
        lib.define("silu_mul_record" + schema)
        lib.impl("silu_mul_record", silu_mul_record_kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{namespace}::silu_mul_record", lambda *args, **kwargs: None, lib=lib)
        _RECORD_OPS[schema] = (lib, getattr(torch.ops, namespace).silu_mul_record.default)
    return _RECORD_OPS[schema][1]


def _record_schema(fn) -> tuple[str, object]:
    """fn()'s schema text and torch's parse of it (the op's name is added here); raises ValueError for
    what is not a schema of the kernel's four arguments."""
    schema = fn()
    if not isinstance(schema, str):
        raise ValueError(f"return the schema as a str, got {type(schema).__name__}")
    schema = schema.strip()
    if not schema.startswith("("):
        raise ValueError("write the schema from its argument list on, '(...) -> ...', without the op's name")
    try:
        parsed = torch._C.parse_schema("silu_mul_record" + schema)
    except RuntimeError as exc:
        raise ValueError(f"torch cannot parse the schema: {str(exc).splitlines()[0]}") from None
    names = [a.name for a in parsed.arguments]
    if names != ["gate", "up", "out", "amax"]:
        raise ValueError(f"the schema's arguments are {names}; the kernel's are gate, up, out, amax, in that order")
    return schema, parsed


def _record_args(shape, dtype):
    gen = torch.Generator().manual_seed(len(shape))
    return {"gate": torch.randn(shape, generator=gen).to(dtype), "up": torch.randn(shape, generator=gen).to(dtype),
            "out": torch.empty(shape, dtype=dtype), "amax": torch.zeros(1, dtype=dtype)}


def record_arguments(fn) -> str:
    _, parsed = _record_schema(fn)
    return ", ".join(a.name for a in parsed.arguments)


def record_returns(fn) -> str:
    _, parsed = _record_schema(fn)
    return "returns nothing" if not parsed.returns else f"returns {len(parsed.returns)} value(s)"


def record_aliased_returns(fn) -> str:
    _, parsed = _record_schema(fn)
    aliased = sum(r.alias_info is not None for r in parsed.returns)
    return "no output aliases an argument" if not aliased else f"{aliased} output(s) alias an argument"


def record_letters(fn) -> str:
    """Whether the schema's annotated arguments each have an alias letter of their own (a letter shared says
    the arguments may be one tensor)."""
    _, parsed = _record_schema(fn)
    by_letter: dict[str, list[str]] = {}
    for a in parsed.arguments:
        for letter in a.alias_info.before_set if a.alias_info is not None else ():
            by_letter.setdefault(letter, []).append(a.name)
    shared = {letter: names for letter, names in by_letter.items() if len(names) > 1}
    if not shared:
        return "a letter of its own for each written argument"
    return "; ".join(f"the letter {letter!r} on {', '.join(names)}" for letter, names in shared.items())


def record_opcheck(fn, shape, dtype: str) -> str:
    """torch.library.opcheck on the recording op defined with fn()'s argument list and '-> ()' (the
    returns have cases of their own), called as the schema says (keyword-only arguments by name): "every
    opcheck test passes", or the first failing test and the first line of its message."""
    schema, parsed = _record_schema(fn)
    arguments = schema[:schema.rindex("->")].rstrip()
    args = _record_args(shape, getattr(torch, dtype))
    positional = tuple(args[a.name] for a in parsed.arguments if not a.kwarg_only)
    keywords = {a.name: args[a.name] for a in parsed.arguments if a.kwarg_only}
    result = torch.library.opcheck(_record_op(arguments + " -> ()"), positional, keywords, raise_exception=False)
    failed = [(test, outcome) for test, outcome in result.items() if outcome != "SUCCESS"]
    if not failed:
        return "every opcheck test passes"
    test, outcome = failed[0]
    return f"{test} fails: {str(outcome).splitlines()[0][:200]}"


def record_declarations(fn) -> str:
    """How the schema's written arguments (an alias annotation with '!') compare with the ones the kernel
    writes, in counts only (naming them would give the answer away)."""
    _, parsed = _record_schema(fn)
    declared = {a.name for a in parsed.arguments if a.alias_info is not None and a.alias_info.is_write}
    args = {**_record_args((4, 6), torch.float32), "out": torch.zeros(4, 6)}
    before = {name: t.clone() for name, t in args.items()}
    silu_mul_record_kernel(**args)
    written = {name for name, t in args.items() if not torch.equal(t, before[name])}
    missing, extra = len(written - declared), len(declared - written)
    if not missing and not extra:
        return "declares exactly the arguments the kernel writes"
    return f"{missing} argument(s) written but not declared, {extra} declared but only read"


# --- Exercise 6: the kernel against the stable ABI ---------------------------------------------------------

class NotBuilt(Exception):
    """The source did not build or load: the case 'builds and loads' says why (a class of its own, so that a
    case expecting the kernel's RuntimeError is not passed by it)."""


STABLE_HEADERS = "only torch/csrc/stable and torch/headeronly headers"
STABLE_MACRO = "registers with the stable ABI's macro"
STABLE_ADDS = "adds a kernel to labs_ext, defines no namespace"
STABLE_BOXED = "hands m.impl a boxed kernel"
STABLE_BUILDS = "builds and loads"
STABLE_REGISTERED = "adds the CPU kernel of labs_ext::silu_mul"
STABLE_IMPORTS = "no C++ symbol of libtorch"
STABLE_THREADS = "splits the work with torch's parallel_for"
STABLE_CHUNKS = "each element computed in one chunk, and every element in one"
CLASSIC_MACRO = re.compile(r"\bTORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(")    # \b: not STABLE_TORCH_LIBRARY...
IMPL_BLOCK = re.compile(r"\bSTABLE_TORCH_LIBRARY_IMPL\s*\(\s*(\w+)")    # the namespace a kernel block adds to


def _stable(fn):
    """fn()'s source and what building it gave (helpers.ext.lab.build_stable: once per source): its Built, or
    the BuildError, OSError or ValueError that stopped it."""
    from helpers.ext import BuildError, lab
    source = fn()
    try:
        return source, lab.build_stable(source)
    except (BuildError, OSError, ValueError) as exc:
        return source, exc


def _stable_log(fn) -> tuple[str, str]:
    """fn()'s source and its failed build's compiler output ("" when it built, or was not built)."""
    source, built = _stable(fn)
    return (source if isinstance(source, str) else ""), getattr(built, "log", "")


def stable_headers(fn) -> str:
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_HEADERS
    from helpers.ext import lab
    headers = lab.unstable_headers(_stable_log(fn)[1])
    return f"includes {', '.join(headers)}, outside the stable ABI (the #error stops the build)" if headers \
        else STABLE_HEADERS


def stable_macro(fn) -> str:
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_MACRO
    source, log = _stable_log(fn)
    if log and CLASSIC_MACRO.search(source):
        return "registers with the classic TORCH_LIBRARY macros of torch/library.h, which the build does not know"
    return STABLE_MACRO


def stable_adds(fn) -> str:
    """How the source's registration blocks treat labs_ext, read from the source (no build needed): a block that
    defines a namespace (which build_stable refuses to load), or kernel blocks for other namespaces only."""
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_ADDS
    from helpers.ext import NAMESPACE, lab
    source = fn()
    if not isinstance(source, str):
        return STABLE_ADDS        # the case 'builds and loads' says what fn() returned
    defines = lab.DEFINES.search(source)
    if defines:
        return (f"defines a namespace with {defines.group(0).rstrip('( ')}, where {NAMESPACE} is defined already "
                "(not loaded: a second definition crashes the process)")
    namespaces = sorted(set(IMPL_BLOCK.findall(source)))
    if namespaces and NAMESPACE not in namespaces:
        return f"adds its kernel to {', '.join(namespaces)}, not to {NAMESPACE}"
    return STABLE_ADDS


def stable_boxed(fn) -> str:
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_BOXED
    if "StableIValue" in _stable_log(fn)[1]:
        return "hands m.impl a plain C++ function, where it takes void (*)(StableIValue*, uint64_t, uint64_t)"
    return STABLE_BOXED


def stable_builds(fn) -> str:
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_BUILDS
    from helpers.ext import BuildError, lab
    _, built = _stable(fn)
    if isinstance(built, BuildError):
        return "does not build: " + " | ".join(lab.compiler_error_lines(built.log)[:3] or [str(built)[:300]])
    if isinstance(built, OSError):
        return f"does not load: {str(built)[:300]}"
    if isinstance(built, ValueError):
        return f"not built: {built}"
    return STABLE_BUILDS


def _built(fn):
    """fn()'s source, built and loaded, and its Built; NotBuilt when it did not build or load."""
    source, built = _stable(fn)
    if isinstance(built, Exception):
        raise NotBuilt(f"your source did not build or load ({type(built).__name__}): the case "
                       f"'{STABLE_BUILDS}' says why") from None
    return source, built


def stable_registered(fn) -> str:
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_REGISTERED
    from helpers.ext import lab
    source, built = _stable(fn)
    if isinstance(source, str) and lab.DEFINES.search(source):
        return "defines a namespace (STABLE_TORCH_LIBRARY); not loaded, as loading it would crash the process"
    _built(fn)
    if not torch._C._dispatch_has_kernel_for_dispatch_key(lab.stable_op(source)._schema.name, "CPU"):
        return "registers no CPU kernel for labs_ext::silu_mul (m.impl names another op, or another dispatch key)"
    return STABLE_REGISTERED


def _imports(fn) -> list[str]:
    from helpers.ext import lab
    return lab.imported_symbols(_built(fn)[1].path)


def stable_imports(fn) -> str:
    """The library's undefined symbols (what `nm -D --undefined-only` lists) that are C++ names of libtorch."""
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_IMPORTS
    from helpers.ext import lab
    cpp = lab.libtorch_cpp_symbols(_imports(fn))
    if not cpp:
        return STABLE_IMPORTS
    return f"{len(cpp)} C++ symbol(s) of libtorch, e.g. {'; '.join(lab.demangled(cpp[:3]))}"


def stable_threads(fn) -> str:
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_THREADS
    if "torch_parallel_for" in _imports(fn):
        return STABLE_THREADS
    return "never calls torch's parallel_for (torch_parallel_for is not among its imports): one thread does it all"


HALF_ENV = "LABS_HALF_PARALLEL_FOR"
HALF_PARALLEL_FOR = r"""
// Lab 04's check of the chunks: torch_parallel_for is renamed to this in the whole file. It calls the callback
// once, on the first half of each range it is handed when LABS_HALF_PARALLEL_FOR is 0, on the second when it is 1.
extern "C" int32_t labs_half_parallel_for(int64_t begin, int64_t end, int64_t, void (*f)(int64_t, int64_t, void*),
                                          void* ctx) {
  const char* half = std::getenv("LABS_HALF_PARALLEL_FOR");
  const int64_t mid = begin + (end - begin) / 2;
  if (half != nullptr && half[0] == '0' && begin < mid) f(begin, mid, ctx);
  if (half != nullptr && half[0] == '1' && mid < end) f(mid, end, ctx);
  return 0;
}
"""
_CHUNK_SEEDS = itertools.count(1)   # new inputs at each call: memory a previous call freed holds its right values


def half_parallel_for(source: str) -> str:
    """source with torch's parallel_for replaced by one that runs one half of each range, as one chunk."""
    return ("#include <cstdint>\n#include <cstdlib>\n#define torch_parallel_for labs_half_parallel_for\n" + source +
            HALF_PARALLEL_FOR)


def stable_chunks(fn, n: int) -> str:
    """Whether each call of the source's parallel_for callback computes its own chunk, and only that. The source is
    built once more with a parallel_for that calls the callback once, on the first half of each range it is handed,
    or on the second half, and the op runs once with each on the same n elements (|values| in [0.5, 2], so no
    right output is near 0): a right kernel gives right values on two disjoint parts of the output that together
    cover it. A callback that ignores its [begin, end) computes every element in both (at full size, as many times
    over as there are chunks, the values right); one that counts its chunk from 0 computes the first elements twice
    and the last ones never. What a kernel does not write holds what the memory held, which can equal a right value
    by chance: up to n / 8 such elements are let pass, far fewer than either mistake gives."""
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return STABLE_CHUNKS
    from helpers.ext import BuildError, lab
    source, _ = _built(fn)
    probe = half_parallel_for(source)
    try:
        lab.build_stable(probe)
    except (BuildError, OSError, ValueError) as exc:
        return f"not checked: the source with the check's parallel_for did not build ({str(exc)[:200]})"
    gen = torch.Generator().manual_seed(next(_CHUNK_SEEDS))
    gate, up = ((torch.rand(n, generator=gen) * 1.5 + 0.5) * (torch.randint(0, 2, (n,), generator=gen) * 2 - 1)
                for _ in range(2))
    expected = lab.silu_mul_reference(gate, up)
    outs, right = [], []
    previous = os.environ.get(HALF_ENV)
    try:
        for half in "01":
            os.environ[HALF_ENV] = half
            outs.append(lab.stable_op(probe)(gate.clone(), up.clone()))    # kept: the next output may not reuse it
            right.append(torch.isclose(outs[-1], expected, rtol=1e-5, atol=0))
    finally:
        if previous is None:
            os.environ.pop(HALF_ENV, None)
        else:
            os.environ[HALF_ENV] = previous
    both, neither = int((right[0] & right[1]).sum()), int((~(right[0] | right[1])).sum())
    if both <= n // 8 and neither <= n // 8:
        return STABLE_CHUNKS
    return (f"handed the two halves of its range as two chunks, it computed {both} of the {n} elements in both "
            f"chunks and {neither} in neither")


def stable_silu_mul(fn, gate, up):
    """The op fn()'s source implements, on (gate, up), with at least two threads (as silu_mul_kernel)."""
    from helpers.ext import lab
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return lab.silu_mul_reference(gate, up)
    source, _ = _built(fn)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))
    try:
        return lab.stable_op(source)(gate, up)
    finally:
        torch.set_num_threads(threads)


def stable_opcheck(fn, shape, dtype: str) -> str:
    """torch.library.opcheck on the op fn()'s source implements (the reference's fake kernel and autograd
    formula): "every opcheck test passes", or the first failing test and the first line of its message."""
    if _is_silu_mul_reference(fn, "silu_mul_stable_source"):
        return "every opcheck test passes"
    from helpers.ext import lab
    source, _ = _built(fn)
    gen = torch.Generator().manual_seed(len(shape))
    floating = getattr(torch, dtype)
    args = tuple(torch.randn(shape, generator=gen).to(floating).requires_grad_(floating == torch.float32)
                 for _ in range(2))
    result = torch.library.opcheck(lab.stable_op(source), args, raise_exception=False)
    failed = [(test, outcome) for test, outcome in result.items() if outcome != "SUCCESS"]
    if not failed:
        return "every opcheck test passes"
    test, outcome = failed[0]
    return f"{test} fails: {str(outcome).splitlines()[0][:200]}"
