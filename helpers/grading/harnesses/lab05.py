"""Lab 05 (quantization): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations


import torch
from torch import nn


class _FloatToIntegerCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """The integer dtypes that a floating tensor holding NaN or an infinity was converted to: what such a
    value becomes depends on the CPU and the kernel (0 here, -128 there), so a right answer never casts one."""

    CASTS = ("_to_copy", "copy_")

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.CASTS:
            source = args[1] if func.overloadpacket.__name__ == "copy_" else args[0]
            if source.is_floating_point() and not (out.is_floating_point() or out.is_complex() or
                                                   out.dtype == torch.bool) and not source.isfinite().all():
                self.dtypes.append(str(out.dtype))
        return out


def non_finite_cast_to_integer(fn, *args, **kwargs) -> str:
    with _FloatToIntegerCasts() as casts:
        fn(*args, **kwargs)
    if casts.dtypes:
        return f"NaN or an infinity converted to {casts.dtypes[0]}"
    return "no NaN or infinity converted to an integer"


class ChannelScale(nn.Module):
    """Multiplies each channel by a fixed factor (like a normalization layer's weight)."""
    def __init__(self, factor: torch.Tensor):
        super().__init__()
        self.register_buffer("factor", factor)

    def forward(self, x):
        return x * self.factor


def quant_lab_model(width: int, seed: int = 0) -> nn.Module:
    """Lab 05's classifier: each hidden layer's output channels scaled by r (spread over 1000x) and
    scaled back by 1 / r after the ReLU: the same function, but weight rows that differ by 1000x."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers = [nn.Linear(width, 4 * width), nn.Linear(4 * width, 4 * width)]
        head = nn.Linear(4 * width, 4)
    blocks = []
    with torch.no_grad():
        for layer in layers:
            r = torch.logspace(-1.5, 1.5, layer.out_features)[torch.randperm(layer.out_features, generator=gen)]
            layer.weight.mul_(r[:, None])
            layer.bias.mul_(r)
            blocks += [layer, nn.ReLU(), ChannelScale(1 / r)]
    return nn.Sequential(*blocks, head).eval()


def activation_dtype_of_int8_kernel(fn, *args) -> str:
    """The dtype of the activations fn hands to torch._weight_int8pack_mm ("not called" if it does not)."""
    seen: list[str] = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            if func.overloadpacket.__name__ == "_weight_int8pack_mm":
                seen.append(str(a[0].dtype))
            return func(*a, **(kw or {}))
    with Spy():
        fn(*args)
    return seen[0] if seen else "not called"


def int8_kernel_path(fn, *args) -> str:
    """"fast path" when fn hands torch._weight_int8pack_mm activations its CPU kernel vectorizes here: on x86
    (AVX2, AVX512: int8mm_kernel.cpp's bf16 branch) only bfloat16; elsewhere (aarch64's NEON overloads take
    float, half and bfloat16 alike; DEFAULT builds have no vector branch) fp32 and bf16 both. Else what it got."""
    from helpers.device import cpu_capability
    dtype = activation_dtype_of_int8_kernel(fn, *args)
    if dtype == "not called":
        return dtype
    x86 = cpu_capability().upper().startswith("AVX")
    fast = {"torch.bfloat16"} if x86 else {"torch.bfloat16", "torch.float32", "torch.float16"}
    return "fast path" if dtype in fast else f"{dtype} activations (a scalar loop on this {cpu_capability()} CPU)"


def _quantized(fn, width, seed, nested=False):
    model = quant_lab_model(width, seed)
    if nested:      # the Linears one level down: only a recursive walk reaches them
        model = nn.Sequential(model).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return model, state, fn(model)


def linears_left(fn, width, seed, nested=False) -> int:
    return sum(isinstance(m, nn.Linear) for m in _quantized(fn, width, seed, nested)[2].modules())


def original_untouched(fn, width, seed) -> bool:
    model, state, _ = _quantized(fn, width, seed)
    return all(isinstance(m, (nn.Linear, nn.ReLU, ChannelScale, nn.Sequential)) for m in model.modules()) and \
        all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def agreement_with_fp32(fn, width, seed, n_inputs) -> bool:
    """The quantized model's argmax agrees with fp32's on at least 97% of random inputs: per-channel int8
    keeps 98% or more on every seed tried, per-tensor scales 92% at most."""
    model, _, quantized = _quantized(fn, width, seed)
    inputs = torch.randn(n_inputs, width, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        agree = (quantized(inputs).argmax(-1) == model(inputs).argmax(-1)).float().mean().item()
    return agree >= 0.97


def at_least_3x_smaller(fn, width, seed) -> bool:
    from helpers.quant import model_bytes
    model, _, quantized = _quantized(fn, width, seed)
    return model_bytes(quantized) * 3 < model_bytes(model)


# lab 05, exercise 4: one (granularity, bits) per layer under a size and an accuracy budget, on digits

PLAN_LAYERS = ("fc1", "fc2", "fc3")
GRANULARITIES = ("tensor", "channel", "group")
GROUP_SIZE = 16
PLAN_MAX_BYTES = 23_000
PLAN_MAX_EXTRA_WRONG = 4        # more wrong test images than fp32, of digits' 450: under 1 point of accuracy


class DigitsMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


_DIGITS_MODELS: dict[int, tuple] = {}


def _digits_model(seed: int):
    if seed not in _DIGITS_MODELS:
        _DIGITS_MODELS[seed] = _train_digits_model(seed)
    return _DIGITS_MODELS[seed]


def _train_digits_model(seed: int):
    from helpers.validation.upgrade import digits_split
    x_train, y_train, x_test, y_test = digits_split(seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # bitwise-reproducible training
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = DigitsMLP()
        opt, gen = torch.optim.Adam(model.parameters(), lr=3e-3), torch.Generator().manual_seed(seed)
        for _ in range(300):
            idx = torch.randint(0, len(x_train), (128,), generator=gen)
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():    # fc1's output channels times 0.1 to 10, fc2's inputs scaled back: the same function
        r = torch.logspace(-1, 1, 128)[torch.randperm(128, generator=torch.Generator().manual_seed(1000 + seed))]
        model.fc1.weight.mul_(r[:, None])
        model.fc1.bias.mul_(r)
        model.fc2.weight.div_(r[None, :])
    return model.eval().requires_grad_(False), x_test, y_test


def digits_model(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Lab 05's trained digits classifier (a copy) with its test images and labels."""
    import copy
    model, x_test, y_test = _digits_model(seed)
    return copy.deepcopy(model), x_test, y_test


def check_plan(plan) -> None:
    """Raise ValueError unless plan maps fc1, fc2 and fc3 each to (granularity, bits)."""
    if not isinstance(plan, dict) or set(plan) != set(PLAN_LAYERS):
        raise ValueError(f"the plan must be a dict with the keys {', '.join(PLAN_LAYERS)}, got "
                         f"{sorted(plan) if isinstance(plan, dict) else type(plan).__name__}")
    for layer, choice in plan.items():
        if not (isinstance(choice, (tuple, list)) and len(choice) == 2 and choice[0] in GRANULARITIES
                and choice[1] in (2, 4, 8)):
            raise ValueError(f"{layer}: {choice!r} is not (granularity, bits) with granularity one of "
                             f"{GRANULARITIES} and bits 2, 4 or 8")


def fake_quantize_weight(w: torch.Tensor, granularity: str, bits: int) -> torch.Tensor:
    """w rounded to symmetric `bits`-bit codes and back, one scale per tensor, per row (output channel) or
    per GROUP_SIZE consecutive inputs of a row."""
    qmax = 2 ** (bits - 1) - 1
    n, k = w.shape
    blocks = {"tensor": w.reshape(1, -1), "channel": w, "group": w.reshape(-1, GROUP_SIZE)}[granularity]
    scales = blocks.abs().amax(dim=1, keepdim=True) / qmax
    codes = torch.clamp(torch.round(blocks / scales.clamp(min=1e-12)), -qmax, qmax)
    return (codes * scales).reshape(n, k)


def weight_bytes(shape, granularity: str, bits: int) -> int:
    """Bytes of a quantized weight: its codes packed at `bits` bits each, plus one fp32 scale per tensor,
    per row or per group."""
    n, k = shape
    scales = {"tensor": 1, "channel": n, "group": n * k // GROUP_SIZE}[granularity]
    return (n * k * bits + 7) // 8 + 4 * scales


def _wrong_images(model, x, y) -> int:
    with torch.no_grad():
        return int((model(x).argmax(-1) != y).sum())


def plan_report(plan, seed: int = 0) -> dict:
    """What `plan` costs on the digits model of `seed`: bytes per layer and in all, and the test images
    wrong beyond the fp32 model's, with all layers quantized and with each layer quantized alone."""
    import copy
    check_plan(plan)
    model, x, y = digits_model(seed)
    base = _wrong_images(model, x, y)
    quantized, alone = copy.deepcopy(model), {}
    for layer, (granularity, bits) in plan.items():
        w = getattr(model, layer).weight
        getattr(quantized, layer).weight.copy_(fake_quantize_weight(w, granularity, int(bits)))
        single = copy.deepcopy(model)
        getattr(single, layer).weight.copy_(fake_quantize_weight(w, granularity, int(bits)))
        alone[layer] = _wrong_images(single, x, y) - base
    sizes = {layer: weight_bytes(getattr(model, layer).weight.shape, g, int(b)) for layer, (g, b) in plan.items()}
    return {"bytes": sum(sizes.values()), "bytes_per_layer": sizes,
            "extra_wrong": _wrong_images(quantized, x, y) - base, "extra_wrong_alone": alone}


def plan_is_valid(fn) -> str:
    check_plan(fn())
    return "a (granularity, bits) for each of fc1, fc2, fc3"


def plan_size(fn, seed) -> str:
    total = plan_report(fn(), seed)["bytes"]
    if total <= PLAN_MAX_BYTES:
        return "within the size budget"
    return f"{total:,} bytes of weights, over the budget"


def plan_accuracy(fn, seed) -> str:
    report = plan_report(fn(), seed)
    if report["extra_wrong"] <= PLAN_MAX_EXTRA_WRONG:
        return "within the accuracy budget"
    worst = max(report["extra_wrong_alone"], key=report["extra_wrong_alone"].get)
    return (f"{report['extra_wrong']} more test images wrong than fp32, over the budget; the costliest "
            f"choice is {worst}'s")
