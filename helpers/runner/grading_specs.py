"""What the grader checks, per lab: the functions a student writes, the inputs they are called on
(visible ones, as in the lab's check cells, and hidden ones the student copy does not show), and the
reference each result is compared with. The grader computes the references itself; nothing here
runs in the student's process.

To make a lab gradable, add a LabSpec to SPECS: one Exercise per function the lab asks for. An
Exercise's `cases(gen)` returns Case objects whose args are tensors or plain values (they travel to
the student's process as a weights-only torch file); `reference(*args, **kwargs)` computes the
expected result, or a Case names the exception it expects (`raises`, `match`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass(frozen=True)
class Case:
    name: str                          # what is checked, shown in the feedback
    args: tuple
    kwargs: dict = field(default_factory=dict)
    hidden: bool = False               # not among the student copy's checks
    raises: str | None = None          # the exception class name expected instead of a result
    match: str | None = None           # ... whose message contains this
    atol: float = 1e-5
    rtol: float = 1e-4
    hint: str = ""
    call: str | None = None            # a harness of helpers.lab_checks that calls the function (builds a
                                       # generator, a model, a path); None: function(*args, **kwargs)
    expected: object = None            # with expect_value: this value, not the reference's result
    expect_value: bool = False


@dataclass(frozen=True)
class Exercise:
    title: str                         # "Exercise 1: softmax"
    function: str                      # the name the student's notebook defines
    cases: Callable[[torch.Generator], list[Case]]
    reference: Callable[..., object]
    points: float = 1.0
    forbidden: tuple[str, ...] = ()    # what the exercise asks the student to write without: torch function
                                       # and aten op names (softmax, _softmax), or dotted paths of Python
                                       # functions and classes (helpers.moe.permute, torch.compile)


@dataclass(frozen=True)
class LabSpec:
    lab: str                           # the manifest id
    exercises: tuple[Exercise, ...]
    allow_processes: bool = False      # True for labs whose code starts processes (Triton, torch.compile
                                       # workers, C++ builds); a submission could then read files that way


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    x = torch.randn(4, 7, generator=gen) * 50
    x[0, 0] = 100.0                    # exp(100) overflows float32: only a max-subtracted softmax survives it
    return [
        Case("large values, last dim", (x,), hint="subtract x.amax(dim, keepdim=True) before exp"),
        Case("along dim 0", (x,), {"dim": 0}, hint="use the dim argument in every reduction, with keepdim=True"),
        Case("3-D input along dim 1", (torch.randn(2, 3, 5, generator=gen) * 10,), {"dim": 1}, hidden=True,
             hint="reduce over `dim` only, keeping it (keepdim=True) so the division broadcasts"),
        Case("float64 keeps its dtype", (torch.randn(3, 4, generator=gen, dtype=torch.float64) * 100,),
             hidden=True, hint="do not convert to float32; every op here keeps the input dtype"),
        Case("huge values (1e4) do not overflow", (torch.randn(2, 6, generator=gen) * 1e4,), hidden=True,
             hint="exp(1e4) is inf in any float type: subtract the maximum first"),
    ]


def _rms_norm_cases(gen: torch.Generator) -> list[Case]:
    x, w = torch.randn(3, 5, 16, generator=gen), torch.rand(16, generator=gen)
    return [
        Case("values", (x, w), hint="x / sqrt(mean(x**2 over the last dim) + eps) * weight"),
        Case("a mismatched weight is rejected", (x, torch.ones(8)), raises="ValueError", match="weight",
             hint="compare weight.shape with x.shape[-1:] before computing"),
        Case("1-D input", (torch.randn(16, generator=gen), w), hidden=True,
             hint="normalise over the last dimension whatever the number of dimensions"),
        Case("eps is used", (torch.randn(4, 16, generator=gen) * 1e-3, w), {"eps": 1e-2}, hidden=True,
             hint="add eps inside the square root: it matters when values are tiny"),
        Case("a mismatched weight on a 1-D input is rejected", (torch.randn(16, generator=gen), torch.ones(15)),
             raises="ValueError", hidden=True, hint="compare weight.shape with x.shape[-1:] before computing"),
    ]


SOFTMAX = ("softmax", "_softmax", "log_softmax", "_log_softmax", "special_softmax")


def _rms_norm_reference(x, weight, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=eps)


SPECS: dict[str, LabSpec] = {
    "00_warmup_lab": LabSpec("00_warmup_lab", (
        Exercise("Exercise 1: softmax", "softmax", _softmax_cases,
                 lambda x, dim=-1: torch.softmax(x, dim=dim), forbidden=SOFTMAX),
        Exercise("Exercise 2: rms_norm", "rms_norm", _rms_norm_cases, _rms_norm_reference,
                 forbidden=("rms_norm", "_fused_rms_norm")),
    )),
}



# --- Lab 01: data loading -------------------------------------------------------------------------

BLUR = (torch.outer(torch.tensor([1.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 1.0])) / 16).expand(3, 1, 3, 3)


def augment(image, rng):
    """Lab 01's reference augment (named so: the concurrency harness wraps the global `augment`)."""
    import torch.nn.functional as F
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    x = torch.mul(image, gain / 255.0)
    if flip:
        x = x.flip(-1)
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), BLUR, groups=3)[0]


def _fast_pipeline(images, workers, seed=0):
    from concurrent.futures import ThreadPoolExecutor

    from helpers.data import item_generator
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda i: augment(images[i], item_generator(seed, i)), range(len(images))))


def _images(gen, n, h, w):
    return list(torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=gen).unbind(0))


def _augment_cases(gen):
    images, seed = _images(gen, 6, 24, 24), int(torch.randint(0, 1000, (), generator=gen))
    same = "draw flip first, then gain, both with generator=rng; then multiply by gain / 255, flip, pad, blur"
    return [
        Case("serially, equals slow_augment seeded per item", (images, seed), call="serial_items", hint=same),
        Case("writes into no module-level tensor", (images, seed), call="globals_written", expected=[],
             expect_value=True, hint="allocate a new tensor in every call (torch.mul(image, g) or image * g), "
                                     "never out=SCRATCH: threads share module-level tensors"),
        Case("on 4 threads, 3 runs, equals the serial results", (images, seed, 4, 3), call="threaded_runs",
             hint="draw every random number from rng (generator=rng), never from the global RNG"),
        Case("a non-square image", (_images(gen, 2, 5, 9), seed), call="serial_items", hidden=True, hint=same),
        Case("8 threads on 12 items", (_images(gen, 12, 8, 8), seed, 8, 2), call="threaded_runs", hidden=True,
             hint="no shared state: the result must not depend on which thread runs which item"),
    ]


def _fast_pipeline_cases(gen):
    images = _images(gen, 10, 16, 16)
    return [
        Case("equals the serial reference, in order", (images, 3), hint="keep the input order (collect the "
             "futures in submission order, or pool.map) and seed item i with data.item_generator(seed, i)"),
        Case("at most `workers` calls at once, on more than one thread", (images, 2, 0),
             call="bounded_and_threaded", expected=True, expect_value=True,
             hint="run augment on a ThreadPoolExecutor(max_workers=workers): never more threads than workers"),
        Case("another seed", (images[:4], 2), {"seed": 7}, hidden=True, hint="pass seed to item_generator"),
        Case("one worker", (images[:3], 1), hidden=True, hint="workers=1 is a valid pool"),
        Case("more workers than items", (images[:2], 5), hidden=True, hint="a pool larger than the input works"),
        Case("no images", ([], 2), hidden=True, hint="an empty input gives an empty list"),
    ]


# --- Lab 02: fusion ------------------------------------------------------------------------------

def _combo_grid(numels, block):
    ends, total = [], 0
    for n in numels:
        total += (n + block - 1) // block
        ends.append(total)
    return total, ends


def _combo_grid_cases(gen):
    ceil = "ceil(n / block) is (n + block - 1) // block; ends are running sums"
    sizes = [int(v) for v in torch.randint(0, 5000, (4,), generator=gen)]
    return [
        Case("the example", ([1000, 1, 3075], 256), hint=ceil),
        Case("exact multiples", ([256, 512, 768], 256), hint="a part of exactly k*block elements needs k programs"),
        Case("empty parts", ([0, 5, 0], 4), hint="an empty part needs 0 programs, but still has an end"),
        Case("random sizes", (sizes, 128), hidden=True, hint=ceil),
        Case("every part empty", ([0, 0], 64), hidden=True, hint="no programs at all: (0, [0, 0])"),
        Case("block 1", ([3, 1, 2], 1), hidden=True, hint="one program per element when block is 1"),
        Case("one part", ([70000], 1024), hidden=True, hint=ceil),
    ]


def _combo_launch_cases(gen):
    hint = ("zeros or garbage in one part: that part's programs never ran, or ran with the wrong local id; "
            "subtract the start of the part (end0 for part 1, end1 for part 2)")
    return [Case(f"sizes {sizes}", ([torch.randn(n, generator=gen) for n in sizes],), hint=hint, hidden=hidden,
                 call="triton_launch")
            for sizes, hidden in (([1000, 1, 3075], False), ([256, 0, 300], False), ([5, 700, 1], True),
                                  ([0, 0, 513], True), ([257, 257, 0], True))]


def _combo_reference(xs):
    from helpers.fusion import combo_reference
    return combo_reference(xs, alpha=0.5)


# Exercise 3's reference compiles functions: torch.compile reads the source of every frame on the stack, and
# the sandbox refuses this file, so the reference and what it compiles are helpers.lab_checks code.
from helpers.lab_checks import kernel_counts as _kernel_counts   # noqa: E402


# --- Lab 03: MoE ---------------------------------------------------------------------------------

def _permute(x, expert_ids, num_experts):
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.bincount(flat, minlength=num_experts).cumsum(0).to(torch.int32)
    return x[order // expert_ids.shape[1]], order, offs


def _permute_cases(gen):
    hint = ("order: torch.argsort(flat, stable=True); xs: token order[i] // k; offs: int32 cumulative END "
            "offsets with an entry for every expert (torch.bincount(flat, minlength=num_experts).cumsum(0))")
    ids = torch.tensor([[0, 2], [2, 3], [0, 3], [3, 2], [0, 2], [2, 0], [3, 0], [0, 2], [2, 3], [3, 0], [0, 3], [2, 0]])
    return [
        Case("12 tokens, k=2, expert 1 gets none", (torch.randn(12, 8, generator=gen), ids, 4), hint=hint),
        Case("k=1, random experts", (torch.randn(9, 4, generator=gen), torch.randint(0, 3, (9, 1), generator=gen), 3),
             hint=hint),
        Case("every token to one expert", (torch.randn(5, 3, generator=gen), torch.full((5, 2), 1), 4), hidden=True,
             hint="empty experts still get an offset (equal to the previous one)"),
        Case("one token", (torch.randn(1, 6, generator=gen), torch.tensor([[2, 0]]), 3), hidden=True, hint=hint),
        Case("trailing experts with no tokens", (torch.randn(7, 5, generator=gen),
                                                 torch.randint(0, 2, (7, 3), generator=gen), 6), hidden=True,
             hint="offs has num_experts entries even when the last experts get no token (bincount minlength)"),
    ]


def _fallback(xs, w, offs):
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = xs[start:end] @ w[e]
        start = end
    return out


def _fallback_cases(gen):
    from helpers.moe import offsets_from_counts, skewed_counts
    hint = "expert e owns rows offs[e-1]:offs[e] (the first starts at 0); an empty slice is fine"
    cases = []
    for experts, skew, dtype, hidden in ((4, 0.0, torch.float32, False), (8, 3.0, torch.float32, False),
                                         (6, 1.0, torch.bfloat16, False), (1, 0.0, torch.float32, True),
                                         (5, 8.0, torch.float32, True), (3, 0.0, torch.float64, True)):
        counts = skewed_counts(40, experts, skew)
        low = dtype == torch.bfloat16
        cases.append(Case(f"{experts} experts, counts {counts.tolist()}, {dtype}",
                          (torch.randn(40, 16, generator=gen).to(dtype), torch.randn(experts, 16, 8, generator=gen).to(dtype),
                           offsets_from_counts(counts)), hidden=hidden, atol=0.1 if low else 1e-4,
                          rtol=2e-2 if low else 1e-3, hint=hint + "; keep the input's dtype"))
    return cases


def _expert_ffn(xs, params, offs):
    import torch.nn.functional as F
    return _fallback(F.gelu(_fallback(xs, params["w_up"], offs)), params["w_down"], offs)


def _expert_ffn_cases(gen):
    from helpers.moe import offsets_from_counts, skewed_counts
    hint = "up-projection, GELU, down-projection, each expert on its own rows only (no padding)"
    cases = []
    for rows, experts, skew, hidden in ((64, 4, 2.0, False), (48, 6, 0.0, True), (30, 5, 6.0, True)):
        params = {"w_up": torch.randn(experts, 16, 32, generator=gen) / 4,
                  "w_down": torch.randn(experts, 32, 16, generator=gen) / 6}
        counts = skewed_counts(rows, experts, skew)
        cases.append(Case(f"{experts} experts, counts {counts.tolist()}",
                          (torch.randn(rows, 16, generator=gen), params, offsets_from_counts(counts)),
                          hidden=hidden, atol=1e-4, rtol=1e-3, hint=hint))
    return cases


# --- Lab 04: the C++ custom op --------------------------------------------------------------------

KERNEL_BODY = r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
"""


def _kernel_cases(gen):
    hint = ("each call sees only its chunk [begin, end); compute in acc_t (float for bf16/fp16) and convert the "
            "result back to scalar_t once")
    cases = []
    tolerance = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 1e-2}
    for shape, dtype, hidden in (((7,), torch.float32, False), ((3, 33), torch.float64, False),
                                 ((2, 5, 129), torch.bfloat16, False), ((4099,), torch.float32, False),
                                 ((0, 5), torch.float32, True), ((1,), torch.float16, True),
                                 ((65, 70), torch.float16, True)):
        gate, up = (torch.randn(shape, generator=gen) * 4).to(dtype), torch.randn(shape, generator=gen).to(dtype)
        cases.append(Case(f"shape {shape}, {dtype}", (gate, up), call="silu_mul_kernel", hidden=hidden,
                          atol=tolerance[dtype], rtol=tolerance[dtype], hint=hint))
    cases.append(Case("a transposed (non-contiguous) gate", (torch.randn(40, 30, generator=gen).t(),
                                                              torch.randn(30, 40, generator=gen)),
                      call="silu_mul_kernel", hidden=True, hint=hint))
    return cases


def _kernel_reference(gate, up):
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (torch.nn.functional.silu(gate.to(acc)) * up.to(acc)).to(gate.dtype).contiguous()


def _fake(gate, up):
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def _fake_cases(gen):
    strides = ("allocate what the C++ wrapper allocates: a contiguous tensor of gate's shape and dtype, also "
               "when gate is transposed or permuted (empty_like copies gate's strides unless told which memory "
               "format to use)")
    reject = "raise ValueError when the shapes or the dtypes differ, as the C++ wrapper refuses them"
    e = torch.empty
    return [
        Case("shape, strides and dtype", (e(3, 5), e(3, 5)), call="on_meta", hint=strides),
        Case("a transposed gate gives a contiguous output", (e(5, 3).t(), e(3, 5)), call="on_meta", hint=strides),
        Case("different shapes are rejected", (e(3, 5), e(3, 4)), call="on_meta", raises="ValueError", hint=reject),
        Case("different dtypes are rejected", (e(3, 5), e(3, 5, dtype=torch.float64)), call="on_meta",
             raises="ValueError", hint=reject),
        Case("3-D bfloat16", (e(2, 3, 4, dtype=torch.bfloat16), e(2, 3, 4, dtype=torch.bfloat16)), call="on_meta",
             hidden=True, hint=strides),
        Case("a permuted 3-D gate", (e(4, 2, 3).permute(1, 2, 0), e(2, 3, 4)), call="on_meta", hidden=True,
             hint=strides),
        Case("no elements", (e(0, 7), e(0, 7)), call="on_meta", hidden=True, hint=strides),
    ]


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


def _backward_cases(gen):
    hint = ("out = g * s * up with s = sigmoid(g) and ds/dg = s * (1 - s): d/dgate is the product rule on g * s, "
            "times up; d/dup is silu(g); multiply both by grad and return them in schema order (gate, up)")
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=gen, dtype=dtype)   # noqa: E731
    return [
        Case("gradients of gate and up", (r(4, 6) * 3, r(4, 6), r(4, 6)), call="backward_of", hint=hint),
        Case("float64", (r(5, dtype=torch.float64), r(5, dtype=torch.float64), r(5, dtype=torch.float64)),
             call="backward_of", hidden=True, atol=1e-10, rtol=1e-10, hint=hint),
        Case("gate of zeros", (torch.zeros(3, 3), r(3, 3), r(3, 3)), call="backward_of", hidden=True, hint=hint),
        Case("large gates (no overflow)", (r(8) * 100, r(8), r(8)), call="backward_of", hidden=True, hint=hint),
    ]


def _swiglu(x, w_gate, w_up, w_down):
    import torch.nn.functional as F
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def _swiglu_cases(gen):
    def weights(d, f):
        return (torch.randn(4, d, generator=gen), torch.randn(f, d, generator=gen) / 3,
                torch.randn(f, d, generator=gen) / 3, torch.randn(d, f, generator=gen) / 3)
    hint = "silu_mul(x @ w_gate.T, x @ w_up.T) @ w_down.T"
    return [
        Case("values", weights(8, 12), call="swiglu_values", atol=1e-4, hint=hint),
        Case("calls labs_ext.silu_mul", weights(8, 12), call="uses_silu_mul", expected=True, expect_value=True,
             hint="call torch.ops.labs_ext.silu_mul, not F.silu(...) * ...: the exercise is about your op"),
        Case("compiled with fullgraph=True: values and gradients", weights(8, 12), call="compiled_with_grads",
             atol=1e-4, hint="a graph break or a failure in tracing: the fake kernel (exercise 2) or the autograd "
                             "formula (exercise 3) is missing or wrong"),
        Case("compiled, other sizes", weights(5, 7), call="compiled_with_grads", hidden=True, atol=1e-4, hint=hint),
    ]


# --- Lab 05: quantization ------------------------------------------------------------------------

def _quantize_weight(w, bits=8):
    qmax = 2 ** (bits - 1) - 1
    scales = w.abs().amax(dim=1) / qmax
    q = torch.where(scales[:, None] > 0, w / scales.clamp(min=torch.finfo(w.dtype).tiny)[:, None], 0.0)
    return torch.clamp(torch.round(q), -qmax, qmax).to(torch.int8), scales.float()


def _quantize_weight_cases(gen):
    w = torch.randn(16, 32, generator=gen) * torch.logspace(-2, 1, 16)[:, None]
    codes = "round(w / scales[:, None]) clamped to [-qmax, qmax], qmax = 2**(bits-1) - 1, stored as torch.int8"
    zero = w.clone()
    zero[3] = 0
    return [
        Case("one fp32 scale per row", (w,), call="second", hint="scales = w.abs().amax(dim=1) / qmax: reduce over "
             "the inputs (dim 1), one value per output row"),
        Case("codes, within 1 of round(w / scale)", (w,), call="first_as_float", atol=1.0, rtol=0, hint=codes),
        Case("codes are torch.int8", (w,), call="dtype_of_first", hint="convert with .to(torch.int8)"),
        Case("codes are rounded, not truncated", (torch.tensor([[127.0, 10.75, -20.75, 3.25, -0.75, 0.25]]),),
             call="first_as_float", atol=0, rtol=0,
             hint=codes + "; .to(torch.int8) without torch.round truncates every code towards zero"),
        Case("bits=4: codes in [-7, 7]", (w,), {"bits": 4}, call="first_as_float", atol=1.0, rtol=0, hint=codes),
        Case("a row of zeros: scale 0, codes 0, no NaN", (zero,), call="first_as_float", hidden=True, atol=1.0,
             rtol=0, hint="where a row's scale is 0 its codes are 0: do not divide 0 by 0"),
        Case("rows 1000x apart", (torch.randn(4, 8, generator=gen) * torch.tensor([[1e-3], [1.0], [1e3], [1.0]]),),
             call="second", hidden=True, hint="one scale per row, not per tensor"),
        Case("bits=2", (w,), {"bits": 2}, call="first_as_float", hidden=True, atol=1.0, rtol=0, hint=codes),
    ]


def _int8_linear(x, q, scales, bias):
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], q.shape[0])


def _int8_linear_cases(gen):
    w = torch.randn(24, 32, generator=gen) * torch.logspace(-1, 1, 24)[:, None]
    q, scales = _quantize_weight(w)
    bias = torch.randn(24, generator=gen)
    x3 = torch.randn(3, 5, 32, generator=gen)
    shapes = "reshape x to 2-D (rows, in_features) for the kernel and back afterwards; add the bias once"
    return [
        Case("values (3-D input, bias)", (x3, q, scales, bias), atol=0.05, rtol=0.02, hint=shapes),
        Case("output keeps the input's dtype", (x3, q, scales, bias), call="dtype_of",
             hint="the kernel returns its input's dtype; cast back with .to(x.dtype)"),
        Case("the kernel gets bfloat16 activations (the fast path on CPU)", (x3, q, scales, bias),
             call="activation_dtype_of_int8_kernel", expected="torch.bfloat16", expect_value=True,
             hint="fed fp32 activations the kernel is correct but slow (lesson 05): cast x and scales to "
                  "torch.bfloat16 before calling torch._weight_int8pack_mm"),
        Case("no bias", (x3, q, scales, None), atol=0.05, rtol=0.02, hidden=True, hint="bias may be None"),
        Case("batch 1 (a 1-row 2-D input)", (torch.randn(1, 32, generator=gen), q, scales, bias), atol=0.05,
             rtol=0.02, hidden=True, hint=shapes),
    ]


def _quantize_model(model):
    import copy

    from torch import nn

    class Int8Linear(nn.Module):
        def __init__(self, linear):
            super().__init__()
            q, scales = _quantize_weight(linear.weight.detach())
            self.register_buffer("q", q)
            self.register_buffer("scales", scales)
            self.register_buffer("bias", linear.bias.detach().clone())

        def forward(self, x):
            return _int8_linear(x, self.q, self.scales, self.bias)

    def swap(module):
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child))
            else:
                swap(child)
        return module
    return swap(copy.deepcopy(model))


def _quantize_model_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    return [
        Case("every nn.Linear replaced", (64, seed), call="linears_left", expected=0, expect_value=True,
             hint="walk named_children() recursively and setattr each nn.Linear to MyInt8Linear(child)"),
        Case("the fp32 model is left untouched", (64, seed), call="original_untouched", expected=True,
             expect_value=True, hint="copy.deepcopy(model) first, then replace the copy's layers"),
        Case("argmax agrees with fp32 on 97% of inputs", (64, seed, 500), call="agreement_with_fp32", expected=True,
             expect_value=True, hint="one scale per output row (per channel): this model's rows differ by 1000x"),
        Case("at least 3x smaller", (64, seed), call="at_least_3x_smaller", expected=True, expect_value=True,
             hint="store int8 codes and one scale per row, not a float copy of the weight"),
        Case("another model, 97% agreement", (32, seed + 1, 500), call="agreement_with_fp32", expected=True,
             expect_value=True, hidden=True, hint="one scale per output row"),
        Case("a nested model: the Linears one level down", (64, seed), {"nested": True}, call="linears_left",
             expected=0, expect_value=True, hidden=True,
             hint="walk named_children() recursively: a child that is not an nn.Linear may hold Linears"),
    ]


# --- Lab 06: attention ---------------------------------------------------------------------------

def _key_mask(lengths, max_len):
    keep = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]
    return keep[:, None, None, :]


def _key_mask_cases(gen):
    hint = "True where the key is a real token (position < length); shape (batch, 1, 1, max_len) broadcasts"
    return [
        Case("a boolean mask, True on real keys", ([3, 1, 4], 4, 2), call="broadcast_mask", hint=hint),
        Case("padding beyond the longest", ([2, 5], 7, 3), call="broadcast_mask", hint=hint),
        Case("batch 1", ([6], 6, 1), call="broadcast_mask", hidden=True, hint=hint),
        Case("every sequence full", ([4, 4, 4], 4, 2), call="broadcast_mask", hidden=True, hint=hint),
    ]


def _pack(seqs):
    lengths = torch.tensor([s.shape[0] for s in seqs])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return torch.cat(seqs), cu, int(lengths.max())


def _pack_cases(gen):
    hint = ("(torch.cat(seqs), offsets [0, n0, n0+n1, ...] as torch.int32 (cumsum gives int64: convert), "
            "the longest length as a Python int)")
    seqs = lambda lengths: [torch.randn(n, 2, 4, generator=gen) for n in lengths]   # noqa: E731
    return [
        Case("three sequences", (seqs([3, 7, 2]),), hint=hint),
        Case("one sequence", (seqs([5]),), hidden=True, hint=hint),
        Case("a sequence of length 1", (seqs([1, 9, 1, 4]),), hidden=True, hint=hint),
    ]


def _ops_dispatched(q, k, v, **kwargs):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.name())
            return func(*args, **(kwargs or {}))
    with Record() as rec:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    return rec.names


def _ops_cases(gen):
    x = torch.randn(1, 2, 32, 16, generator=gen)
    hint = "append func.name() for every op in __torch_dispatch__, call func, and pass every keyword to SDPA"
    return [
        Case("the default choice", (x, x, x), call="backend_of", hint=hint),
        Case("dropout", (x, x, x), {"dropout_p": 0.2}, call="backend_of", hint=hint),
        Case("a boolean mask", (x, x, x), {"attn_mask": torch.ones(32, 32, dtype=torch.bool).tril()},
             call="backend_of", hidden=True, hint=hint),
        Case("causal, float64", (x.double(), x.double(), x.double()), {"is_causal": True}, call="backend_of",
             hidden=True, hint=hint),
    ]


def _bucketed(seqs, n_buckets):
    from helpers import attention
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs = [None] * len(seqs)
    for bucket in torch.tensor(order).tensor_split(n_buckets):   # exactly n_buckets runs (chunk can give fewer)
        idx = bucket.tolist()
        if not idx:
            continue
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs


def _bucket_cases(gen):
    lengths = [int(n) for n in torch.randint(1, 60, (7,), generator=gen)]
    seqs = lambda ls: [torch.randn(n, 2, 4, generator=gen) for n in ls]   # noqa: E731
    runs = ("sort the sequences by length, split the sorted list into exactly n_buckets runs (tensor_split; "
            "chunk can return fewer) and call attention.padded_attention once per non-empty bucket")
    order = "remember each sequence's index when you sort, and put its output back there"
    return [
        Case("values, in the original order", (seqs(lengths), 2), atol=1e-4, hint=order),
        Case("each bucket holds consecutive lengths", (seqs([40, 3, 35, 30, 5, 2]), 2), call="buckets_are_sorted_runs",
             expected=True, expect_value=True, hint=runs),
        Case("3 buckets, values", (seqs(lengths), 3), atol=1e-4, hidden=True, hint=order),
        Case("3 buckets hold consecutive lengths", (seqs(lengths), 3), call="buckets_are_sorted_runs", expected=True,
             expect_value=True, hidden=True, hint=runs),
        Case("more buckets than sequences", (seqs([4, 9]), 3), atol=1e-4, hidden=True,
             hint="with fewer sequences than buckets, some buckets are empty: skip them"),
        Case("4 buckets for 6 sequences", (seqs([12, 50, 7, 33, 21, 3]), 4), call="buckets_are_sorted_runs",
             expected=True, expect_value=True, hidden=True, hint=runs),
    ]


# --- Lab 07: memory ------------------------------------------------------------------------------

def _predicted_bytes(model):
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    size = lambda ps: sum(p.numel() * p.element_size() for p in ps)   # noqa: E731
    return {"parameter": size(params), "gradient": size(trainable),
            "optimizer_state": 2 * size(trainable) + 4 * len(trainable)}


def _predicted_cases(gen):
    hint = ("numel() * element_size() per parameter; gradients and Adam's two moments only for trainable "
            "parameters (requires_grad), in their dtype; plus a 4-byte float32 step per trainable tensor")
    return [
        Case("float32, every layer trainable", (32, 3, 0, "float32"), call="predict_for", hint=hint),
        Case("the first 2 layers frozen", (32, 3, 2, "float32"), call="predict_for", hint=hint),
        Case("bfloat16 parameters", (48, 2, 1, "bfloat16"), call="predict_for", hidden=True, hint=hint),
        Case("everything frozen but the head", (16, 4, 4, "float32"), call="predict_for", hidden=True, hint=hint),
    ]


def _at_peak(tl):
    totals = [sum(col) for col in zip(*tl["bytes"].values())]
    i = totals.index(max(totals))
    return tl["times_us"][i], {name: values[i] for name, values in tl["bytes"].items()}


def _at_peak_cases(gen):
    def timeline(n, categories=("parameter", "activation", "gradient")):
        return {"times_us": sorted(int(t) for t in torch.randint(0, 10_000, (n,), generator=gen).unique()[:n]),
                "bytes": {c: [int(b) for b in torch.randint(0, 1000, (n,), generator=gen)] for c in categories}}
    hint = "sum the categories at each index, take the FIRST index of the maximum; report every category there"
    tie = {"times_us": [10, 20, 30, 40], "bytes": {"a": [1, 5, 2, 5], "b": [0, 0, 3, 0]}}
    tl = timeline(8)
    tl["times_us"] = list(range(0, 80, 10))
    return [
        Case("a random timeline", (tl,), hint=hint),
        Case("a tie: the first moment", (tie,), hint=hint),
        Case("the peak at the last moment", ({"times_us": [1, 2, 3], "bytes": {"x": [1, 2, 9]}},), hidden=True,
             hint=hint),
        Case("one moment", ({"times_us": [7], "bytes": {"x": [3], "y": [4]}},), hidden=True, hint=hint),
    ]


def _accumulate(model, x, y, micro):
    from torch import nn
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (nn.functional.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


def _accumulate_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    hint = ("mse_loss is a mean over its chunk: weight each chunk's loss by its share of the batch "
            "(chunk rows / batch rows)")
    return [
        Case("4 equal chunks", (16, 2, 32, 4, seed), call="accumulated_grads", atol=1e-5, hint=hint),
        Case("a batch that 4 does not divide (10 rows)", (16, 2, 10, 4, seed), call="accumulated_grads", atol=1e-5,
             hint=hint),
        Case("gradients left from an earlier step are not added", (8, 2, 12, 3, seed), {"stale_grads": True},
             call="accumulated_grads", atol=1e-5, hidden=True,
             hint="start from zero gradients: model.zero_grad(set_to_none=True) before the first chunk"),
        Case("one chunk", (8, 3, 9, 1, seed), call="accumulated_grads", atol=1e-5, hidden=True, hint=hint),
        Case("7 rows in 3 chunks", (12, 2, 7, 3, seed), call="accumulated_grads", atol=1e-5, hidden=True, hint=hint),
    ]


# --- Lab 08: debugging ---------------------------------------------------------------------------

def _first_difference(a, b, rtol=0.0):
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def _trace_cases(gen):
    names = ["aten.addmm.default", "aten.tanh.default", "aten.mm.default", "aten.sum.default", "aten.relu.default"]
    values = [float(v) for v in torch.rand(10, generator=gen) * 100]
    trace = [(names[i % 5], (values[2 * i], values[2 * i + 1])) for i in range(5)]
    changed = lambda i, j, f: [(n, tuple(h * f if (k, m) == (i, j) else h for m, h in enumerate(hs)))   # noqa: E731
                               for k, (n, hs) in enumerate(trace)]
    hint = "compare every hash of each op, in order; differ means |p - q| > rtol * max(|p|, |q|)"
    scaled = [(n, tuple(h * 1e4 for h in hs)) for n, hs in trace]
    return [
        Case("identical traces", (trace, trace), hint="return None when nothing differs"),
        Case("the op that differs first", (trace, changed(3, 0, 1 + 1e-4)), hint=hint),
        Case("rtol is relative", (trace, changed(3, 0, 1 + 1e-4)), {"rtol": 1e-2}, hint=hint),
        Case("rtol is relative, not absolute (hashes near 1e6)", (scaled, [(n, tuple(h * (1 + 1e-4) if i == 3 else h
             for h in hs)) for i, (n, hs) in enumerate(scaled)]), {"rtol": 1e-2}, hint=hint),
        Case("different programs are refused", (trace, trace[:-1] + [("aten.cos.default", (0.0,))]),
             raises="ValueError", hint="compare the op names of the two traces first"),
        Case("a difference in the first op", (trace, changed(0, 1, 2.0)), hidden=True, hint=hint),
        Case("only the second hash differs", (trace, changed(2, 1, 1.5)), hidden=True,
             hint="check every hash of an op, not only the first"),
        Case("traces of different lengths are refused", (trace, trace[:3]), raises="ValueError", hidden=True,
             hint="a shorter trace dispatched different ops: compare the whole list of names"),
        Case("empty traces", ([], []), hidden=True, hint="nothing differs: None"),
    ]


def _safe_normalize(v, eps=1e-12):
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(eps)


def _normalize_cases(gen):
    v = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]])
    grads = "clamp the norm from below (clamp_min(eps)) instead of adding eps under a square root of zero"
    z = torch.randn(2, 3, 4, generator=gen)
    z[1, 2] = 0
    return [
        Case("values", (v,), hint="v / max(norm(v, last dim), eps)"),
        Case("finite gradients, a zero row included", (v,), call="grad_of_sum", rtol=1e-3, hint=grads),
        Case("1-D input", (torch.randn(5, generator=gen),), hidden=True, hint="normalise the last dimension"),
        Case("3-D with a zero row: gradients", (z,), call="grad_of_sum", rtol=1e-3, hidden=True, hint=grads),
        Case("a larger eps", (v,), {"eps": 1e-2}, hidden=True, hint="use eps as the norm's lower bound"),
    ]


def _prepare(batch):
    torch._dynamo.decorators.mark_unbacked(batch, 0)
    return batch


def _prepare_cases(gen):
    hint = ("mark_dynamic(batch, 0) still specialises sizes 0 and 1 (a batch of 1 recompiles, or raises with "
            "min=1): torch._dynamo.decorators.mark_unbacked(batch, 0) makes the size a symbol for every value")
    return [
        Case("no recompiles for sizes 8, 9, 100, 3", ((8, 9, 100, 3),), call="recompiles", expected=0,
             expect_value=True, hint="mark the batch dimension (0) dynamic before each call"),
        Case("no recompiles (and no error) for sizes 8, 1, 512, 2", ((8, 1, 512, 2),), call="recompiles", expected=0,
             expect_value=True, hint=hint),
        Case("a batch of 1 first", ((1, 7, 300),), call="recompiles", expected=0, expect_value=True, hidden=True,
             hint=hint),
    ]


def _export_and_reload(module, example, path):
    batch = torch.export.Dim("batch", min=1, max=512)
    torch.export.save(torch.export.export(module, (example,), dynamic_shapes=({0: batch},)), path)
    return torch.export.load(path).module()


def _export_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    dynamic = ("without dynamic_shapes, torch.export specialises the batch size to the example's: export with "
               "dynamic_shapes=({0: torch.export.Dim('batch', min=1, max=512)},)")
    return [
        Case("the example's batch", (seed, 8, [8]), call="exported_outputs", atol=1e-5,
             hint="export.export(module, (example,)), export.save(program, path), export.load(path).module()"),
        Case("other batch sizes: 5, 1, 512", (seed, 8, [5, 1, 512]), call="exported_outputs", atol=1e-5,
             hint=dynamic),
        Case("an example of batch 3, then 64", (seed + 1, 3, [64, 2]), call="exported_outputs", atol=1e-5,
             hidden=True, hint=dynamic),
    ]


SPECS.update({spec.lab: spec for spec in (
    LabSpec("01_data_loading_lab", (
        Exercise("Exercise 1: augment", "augment", _augment_cases, augment),
        Exercise("Exercise 2: fast_pipeline", "fast_pipeline", _fast_pipeline_cases, _fast_pipeline,
                 forbidden=("helpers.data.thread_map", "helpers.data.serial_map", "helpers.data.dataloader",
                            "helpers.data.nodes_loader")),
    )),
    LabSpec("02_fusion_lab", (
        Exercise("Exercise 1: combo_grid", "combo_grid", _combo_grid_cases, _combo_grid,
                 forbidden=("helpers.fusion.combo_grid",)),
        Exercise("Exercise 2: the combo kernel's dispatch", "launch_three_part", _combo_launch_cases, _combo_reference,
                 forbidden=("helpers.fusion.combo_reference", "helpers.fusion.combo_launch")),
        Exercise("Exercise 3: predicted kernel counts", "predicted_kernel_functions",
                 lambda gen: [Case("the four functions", (), call="no_args",
                                   hint="on the CPU, Inductor's C++ backend puts consecutive loops into one "
                                        "function; only a library call (extern_kernels.mm) splits them")],
                 _kernel_counts,
                 forbidden=("helpers.fusion.inspect_compiled", "torch.compile",
                            "torch._inductor.utils.run_and_get_code")),
    ), allow_processes=True),
    LabSpec("03_moe_lab", (
        Exercise("Exercise 1: permute_tokens", "permute_tokens", _permute_cases, _permute,
                 forbidden=("helpers.moe.permute",)),
        Exercise("Exercise 2: fallback_grouped_gemm", "fallback_grouped_gemm", _fallback_cases, _fallback,
                 forbidden=("grouped_mm", "_grouped_mm", "helpers.moe.loop_gemm", "helpers.moe.grouped_gemm",
                            "helpers.moe.triton_gemm")),
        Exercise("Exercise 3: expert_ffn without padding", "expert_ffn", _expert_ffn_cases, _expert_ffn,
                 forbidden=("bmm", "baddbmm", "helpers.moe.padded_bmm", "helpers.moe.moe_layer")),
    )),
    LabSpec("04_custom_op_lab", (
        Exercise("Exercise 1: the C++ kernel body", "silu_mul_body", _kernel_cases,
                 lambda: KERNEL_BODY),
        Exercise("Exercise 2: the fake kernel", "silu_mul_fake", _fake_cases, _fake),
        Exercise("Exercise 3: the autograd formula", "backward", _backward_cases, _backward,
                 forbidden=("silu", "silu_backward", "sigmoid_backward")),
        Exercise("Exercise 4: SwiGLU with the op", "swiglu_mlp", _swiglu_cases, _swiglu),
    ), allow_processes=True),
    LabSpec("05_quantization_lab", (
        Exercise("Exercise 1: quantize_weight", "quantize_weight", _quantize_weight_cases, _quantize_weight,
                 forbidden=("helpers.quant.quantize_per_channel", "helpers.quant.minmax_scale",
                            "helpers.quant.quantize", "quantize_per_channel", "fake_quantize_per_channel_affine")),
        Exercise("Exercise 2: int8_linear", "int8_linear", _int8_linear_cases, _int8_linear,
                 forbidden=("helpers.quant.Int8WeightOnlyLinear",)),
        Exercise("Exercise 3: quantize_model", "quantize_model", _quantize_model_cases, _quantize_model,
                 forbidden=("helpers.quant.swap_linears",)),
    )),
    LabSpec("06_attention_lab", (
        Exercise("Exercise 1: key_mask", "key_mask", _key_mask_cases, _key_mask,
                 forbidden=("helpers.attention.pad_with_mask",)),
        Exercise("Exercise 2: pack", "pack", _pack_cases, _pack, forbidden=("helpers.attention.pack",)),
        Exercise("Exercise 3: ops_dispatched", "ops_dispatched", _ops_cases, _ops_dispatched,
                 forbidden=("helpers.attention.OpNames", "helpers.attention.backend_that_runs",
                            "helpers.attention.backend_report")),
        Exercise("Exercise 4: bucketed_attention", "bucketed_attention", _bucket_cases, _bucketed),
    )),
    LabSpec("07_memory_lab", (
        Exercise("Exercise 1: predicted_bytes", "predicted_bytes", _predicted_cases, _predicted_bytes,
                 forbidden=("helpers.memory.profile_steps", "helpers.memory.timeline")),
        Exercise("Exercise 2: at_peak", "at_peak", _at_peak_cases, _at_peak,
                 forbidden=("helpers.memory.peak_bytes", "helpers.memory.total_bytes")),
        Exercise("Exercise 3: accumulate_grads", "accumulate_grads", _accumulate_cases, _accumulate),
    )),
    LabSpec("08_debugging_lab", (
        Exercise("Exercise 1: first_difference", "first_difference", _trace_cases, _first_difference,
                 forbidden=("helpers.debugging.first_divergence", "helpers.debugging.op_differences")),
        Exercise("Exercise 2: safe_normalize", "safe_normalize", _normalize_cases, _safe_normalize,
                 forbidden=("normalize",)),
        Exercise("Exercise 3: prepare", "prepare", _prepare_cases, _prepare),
        Exercise("Exercise 4: export_and_reload", "export_and_reload", _export_cases, _export_and_reload,
                 forbidden=("torch.jit.trace", "torch.jit.script", "torch.jit.save", "torch.jit.load")),
    )),
)})


# --- Lab 09: migration ---------------------------------------------------------------------------

def _recorded_matrix():
    """(run A, run B, report) of the recorded 2.9.1 -> 2.10.0 driver run shipped with the package."""
    from helpers.validation import labcheck
    return labcheck.load_matrix(labcheck.RECORDED)


def _interval(samples_a, samples_b, better, n_boot=4000):
    from helpers.validation import stats
    r = stats.bootstrap_gain(samples_a, samples_b, better, n_boot=n_boot)
    return r["gain"], r["low"], r["high"]


def _interval_cases(gen):
    def samples(median, spread, n):
        return [float(v) for v in median * torch.exp(spread * torch.randn(n, generator=gen, dtype=torch.float64))]
    gain = ("gain = median(A) / median(B) for a time ('lower'), median(B) / median(A) for a throughput "
            "('higher')")
    interval = ("resample each side with replacement (len(A) draws from A, len(B) from B), take the gain of the "
                "resampled medians n_boot times, then the 2.5th and 97.5th percentiles")
    run_a, run_b, _ = _recorded_matrix()
    unet = [run["workloads"]["unet_attention"]["figures"]["iteration_time"]["samples"] for run in (run_a, run_b)]
    cases = []
    for name, a, b, better, hidden in (
            ("times, B 20% slower", samples(0.02, 0.08, 30), samples(0.024, 0.08, 24), "lower", False),
            ("throughputs, noisy", samples(50, 0.3, 40), samples(55, 0.3, 40), "higher", False),
            ("the recorded UNet step times", *unet, "lower", False),
            ("3 against 4 samples", [1.0, 1.1, 0.9], [2.0, 2.2, 1.8, 2.1], "lower", True),
            ("identical samples", [0.5] * 9, [0.5] * 9, "higher", True)):
        ref = _interval(a, b, better)
        slack = 0.25 * (ref[2] - ref[1]) + 1e-3      # draws differ from one implementation to another
        cases += [Case(f"{name}: the gain", (a, b, better), call="first", rtol=1e-9, atol=0, hidden=hidden, hint=gain),
                  Case(f"{name}: the 95% interval", (a, b, better), call="interval_of", atol=slack, rtol=0,
                       hidden=hidden, hint=interval)]
    a, b = samples(0.02, 0.1, 400), samples(0.021, 0.1, 400)     # tight enough to tell 95% from 90%
    ref = _interval(a, b, "lower", n_boot=20000)
    cases.append(Case("400 samples a side, n_boot=20000: a 95% interval", (a, b, "lower"), {"n_boot": 20000},
                      call="interval_of", atol=0.045 * (ref[2] - ref[1]), rtol=0, hidden=True,
                      hint="the 2.5th and 97.5th percentiles (a 95% interval), not the 5th and 95th"))
    return cases


def _verdict(gain, low, high):
    from helpers.validation import stats
    return stats.verdict({"gain": gain, "low": low, "high": high})


def _verdict_cases(gen):
    from helpers.validation import stats
    rule = (f"a regression needs the whole interval below 1 and the gain below 1 / (1 + {stats.MIN_CHANGE}); "
            f"an improvement the whole interval above 1 and the gain above 1 + {stats.MIN_CHANGE}")
    visible = [(0.9, 0.85, 0.95), (0.9, 0.85, 1.01), (1.1, 1.02, 1.2), (0.99, 0.985, 0.995), (0.9802, 0.97, 0.99)]
    hidden = [(1.01, 1.005, 1.015), (1.5, 0.9, 2.0), (0.5, 0.3, 0.99), (1.03, 1.001, 1.06)]
    hidden += [(g, g * (1 - w), g * (1 + w)) for g, w in
               zip((0.9 + 0.2 * torch.rand(4, generator=gen)).tolist(), (0.05 * torch.rand(4, generator=gen)).tolist())]
    return [Case(f"gain {g:.3f}, interval [{lo:.3f}, {hi:.3f}]", (g, lo, hi), hidden=i >= len(visible), hint=rule)
            for i, (g, lo, hi) in enumerate(visible + hidden)]


def _read_migration(run_a, run_b, report):
    rows = {(r["workload"], r["figure"]): r for r in report["rows"]}
    step = rows[("dlrm_moe_train", "step_time")]
    return {
        "moe_path": tuple(r["workloads"]["dlrm_moe_train"]["paths"]["moe"] for r in (run_a, run_b)),
        "scaled_mm_path": tuple(r["checks"]["amp_scaled_mm"]["paths"]["scaled_mm"] for r in (run_a, run_b)),
        "static_int8_accuracy": tuple(r["checks"]["quantization"]["details"]["static_int8_accuracy"]
                                      for r in (run_a, run_b)),
        "dlrm_step": (step["gain"], step["low"], step["high"], step["status"]),
        "regressions": [(r["workload"], r["figure"]) for r in report["rows"] if r.get("status") == "regression"],
    }


def _migration_cases(gen):
    import copy
    run_a, run_b, report = _recorded_matrix()
    swapped = copy.deepcopy(report)              # the same report with two rows turned into regressions
    for row in [r for r in swapped["rows"] if "gain" in r][:2]:
        row["status"] = "regression"
    return [
        Case("the recorded 2.9.1 -> 2.10.0 run", (run_a, run_b, report), rtol=1e-9, atol=0,
             hint="read each answer from run_a, run_b and report as the exercise lists; type no number"),
        Case("A and B the other way round", (run_b, run_a, report), rtol=1e-9, atol=0, hidden=True,
             hint="each pair is (from the first run, from the second run)"),
        Case("a report with regressions", (run_a, run_b, swapped), rtol=1e-9, atol=0, hidden=True,
             hint="'regressions': every row whose status is 'regression', as (workload, figure)"),
    ]


def _find_drift(report):
    row = next(n for n in report["numerics"] if n["status"] == "drift")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}


def _drift_cases(gen):
    import tempfile
    from pathlib import Path

    from helpers.validation import compare_runs, labcheck, load_run
    _, path_b = labcheck.matrix_paths(labcheck.RECORDED)
    hint = ("a changed hash alone is not a drift: return the numerics row whose status is 'drift', with its "
            "max_rel_diff")
    seeds = [0, 5, 6 + int(torch.randint(0, 1000, (), generator=gen))]   # seed 5: a row within tolerance comes first
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(seeds):
            report = compare_runs(load_run(path_b), load_run(labcheck.inject_drift(path_b, Path(tmp) / f"c{i}.json", seed)))
            cases.append(Case(f"the injected change, seed {seed if i < 2 else 'secret'}", (report,), rtol=1e-6,
                              atol=0, hidden=i > 0, hint=hint))
    return cases


SPECS["09_migration_lab"] = LabSpec("09_migration_lab", (
    Exercise("Exercise 1: the noise interval", "median_gain_interval", _interval_cases, _interval,
             forbidden=("helpers.validation.stats.bootstrap_gain",)),
    Exercise("Exercise 2: regression or noise", "verdict", _verdict_cases, _verdict,
             forbidden=("helpers.validation.stats.verdict",)),
    Exercise("Exercise 3: read the migration off the report", "read_migration", _migration_cases, _read_migration),
    Exercise("Exercise 4: find the drift", "find_drift", _drift_cases, _find_drift),
), allow_processes=True)    # the lab runs the pipeline, which records the git commit it ran from


def spec_for(lab: str) -> LabSpec:
    """The spec of a lab given by id (00_warmup_lab) or by its notebook path."""
    from pathlib import Path
    name = Path(lab).stem if lab.endswith(".ipynb") else lab
    if name not in SPECS:
        raise ValueError(f"no grading spec for lab {lab!r}; gradable labs: {', '.join(sorted(SPECS))} "
                         f"(add one to helpers/runner/grading_specs.py)")
    return SPECS[name]
