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


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Exercise 2's function, right: what the grader runs in its place while it grades exercises 3 and 5, whose
    MyInt8Linear calls it (Exercise.substitutes), so a mistake in exercise 2 costs marks there only."""
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], q.shape[0])


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
    def __init__(self, width: int = 128):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, width), nn.Linear(width, width), nn.Linear(width, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


_DIGITS_MODELS: dict[tuple[int, int], tuple] = {}


def _digits_model(seed: int, width: int = 128):
    if (seed, width) not in _DIGITS_MODELS:
        _DIGITS_MODELS[seed, width] = _train_digits_model(seed, width)
    return _DIGITS_MODELS[seed, width]


def _train_digits_model(seed: int, width: int = 128):
    from helpers.validation.upgrade import digits_split
    x_train, y_train, x_test, y_test = digits_split(seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                  # bitwise-reproducible training
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = DigitsMLP(width)
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
        r = torch.logspace(-1, 1, width)[torch.randperm(width, generator=torch.Generator().manual_seed(1000 + seed))]
        model.fc1.weight.mul_(r[:, None])
        model.fc1.bias.mul_(r)
        model.fc2.weight.div_(r[None, :])
    return model.eval().requires_grad_(False), x_test, y_test


def digits_model(seed: int = 0, width: int = 128) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Lab 05's trained digits classifier (a copy) with its test images and labels; `width`: its hidden size."""
    import copy
    model, x_test, y_test = _digits_model(seed, width)
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


# lab 05, exercise 5: the plan shipped on the CPU's packed weight kernels

PACKED_KERNELS = ("_weight_int4pack_mm_for_cpu", "_weight_int8pack_mm")
FLOAT_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "mv", "addmv", "dot", "vdot", "linear",
                 "_addmm_activation", "convolution", "_convolution")
PLAN_WEIGHTS = 64 * 128 + 128 * 128 + 128 * 10     # the 128-wide network's weights, which PLAN_MAX_BYTES prices


def ship_budget(model: nn.Module) -> int:
    """Exercise 5's budget for a digits network: exercise 4's PLAN_MAX_BYTES of weights (the same bytes per
    weight for another width) plus the biases in fp32, counted from every tensor the shipped model holds."""
    layers = [getattr(model, name) for name in PLAN_LAYERS]
    weights = sum(layer.weight.numel() for layer in layers)
    return PLAN_MAX_BYTES * weights // PLAN_WEIGHTS + 4 * sum(layer.bias.numel() for layer in layers)


SHIP_MAX_BYTES = PLAN_MAX_BYTES + 4 * (128 + 128 + 10)     # ship_budget of the 128-wide network: 24,064


def held_bytes(model: nn.Module) -> int:
    """Bytes of every tensor a model holds, each storage once: its parameters and buffers, persistent or not,
    and tensors kept as plain attributes of its modules (in lists, tuples and dicts too): quant.model_bytes
    counts the state_dict, which leaves the last two out."""
    from helpers.quant import tensor_bytes
    seen, total = set(), 0

    def visit(value):
        nonlocal total
        if isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, torch.Tensor):
            try:
                key = value.untyped_storage().data_ptr() if type(value) is torch.Tensor else id(value)
            except (RuntimeError, NotImplementedError):
                key = id(value)
            if key not in seen:
                seen.add(key)
                total += tensor_bytes(value)
    for module in model.modules():
        visit(list(module._parameters.values()) + list(module._buffers.values()))
        visit([v for k, v in vars(module).items() if k not in ("_parameters", "_buffers", "_modules")])
    return total


class _OneThread:
    """torch on one thread while a check ships and runs a digits network (tensors of a few thousand elements:
    threads only add their wake-ups, milliseconds an op on a busy machine), as the grader's sandbox runs."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)


class _KernelCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """The packed kernels and float matmuls each of a model's layers runs, by the layer running them."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:     # as helpers.grading.recorder._AtenNames: no Dynamo import per op
        return False

    def __init__(self):
        super().__init__()
        self.layer = None
        self.calls: dict[str | None, list[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in PACKED_KERNELS or name in FLOAT_MATMULS:
            self.calls.setdefault(self.layer, []).append(name)
        return func(*args, **(kwargs or {}))


def layer_kernels(model: nn.Module, x: torch.Tensor, layers=PLAN_LAYERS) -> dict[str | None, list[str]]:
    """The packed kernels and float matmuls a forward of `model` on `x` runs, by layer (None: outside them)."""
    recorder = _KernelCalls()
    hooks = []
    for name in layers:
        module = model.get_submodule(name)
        hooks.append(module.register_forward_pre_hook(lambda m, a, name=name: setattr(recorder, "layer", name)))
        hooks.append(module.register_forward_hook(lambda m, a, out: setattr(recorder, "layer", None)))
    try:
        with torch.no_grad(), _OneThread(), recorder:
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return recorder.calls


def _shipped(fn, seed, plan, width):
    model, x, y = digits_model(seed, width)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with _OneThread():
        return model, state, x, y, fn(model, dict(plan))


def ship_linears_left(fn, seed, plan, width=128) -> str:
    shipped = _shipped(fn, seed, plan, width)[4]
    left = [name or "the model itself" for name, m in shipped.named_modules() if isinstance(m, nn.Linear)]
    return f"nn.Linear left: {', '.join(left)}" if left else "no nn.Linear left"


def ship_untouched(fn, seed, plan, width=128) -> str:
    model, state, *_ = _shipped(fn, seed, plan, width)
    if not all(type(getattr(model, name)) is nn.Linear for name in PLAN_LAYERS):
        return "the given model's layers were replaced"
    changed = [k for k, v in model.state_dict().items() if k not in state or not torch.equal(v, state[k])]
    return f"the given model's {', '.join(changed)} changed" if changed else "the given model untouched"


def ship_kernels(fn, seed, plan, width=128) -> str:
    """Whether each of the plan's layers runs a packed weight kernel in the shipped model's forward, and no
    float matmul runs anywhere in it."""
    _, _, x, _, shipped = _shipped(fn, seed, plan, width)
    try:
        calls = layer_kernels(shipped, x, tuple(plan))
    except AttributeError:
        return "the shipped model lost a layer's name: replace each layer where it sits (fc1, fc2, fc3)"
    problems = []
    for name in plan:
        ops = calls.get(name, [])
        packed = [op for op in ops if op in PACKED_KERNELS]
        floats = sorted({op for op in ops if op in FLOAT_MATMULS})
        if not packed:
            problems.append(f"{name} runs no packed kernel" + (f" but a float matmul ({', '.join(floats)})" if floats else ""))
        elif floats:
            problems.append(f"{name} runs {packed[0]} and a float matmul ({', '.join(floats)})")
    outside = sorted({op for op in calls.get(None, []) if op in FLOAT_MATMULS})
    if outside:
        problems.append(f"a float matmul outside the plan's layers ({', '.join(outside)})")
    return "; ".join(problems) or "each layer runs a packed kernel, no float matmul"


def ship_output(fn, seed, plan, width=128) -> str:
    _, _, x, _, shipped = _shipped(fn, seed, plan, width)
    with torch.no_grad(), _OneThread():
        out = shipped(x)
    return f"logits {list(out.shape)} {out.dtype}"


def ship_bytes(fn, seed, plan, width=128) -> str:
    model, _, _, _, shipped = _shipped(fn, seed, plan, width)
    total, budget = held_bytes(shipped), ship_budget(model)
    if total <= budget:
        return "within the budget"
    layers = ", ".join(f"{name} {held_bytes(shipped.get_submodule(name)):,}" for name in PLAN_LAYERS
                       if isinstance(getattr(shipped, name, None), nn.Module))
    return f"{total:,} bytes held, over the budget of {budget:,} ({layers})"


def ship_accuracy(fn, seed, plan, width=128) -> str:
    model, _, x, y, shipped = _shipped(fn, seed, plan, width)
    with _OneThread():
        extra = _wrong_images(shipped, x, y) - _wrong_images(model, x, y)
    if extra <= PLAN_MAX_EXTRA_WRONG:
        return "within the accuracy budget"
    return f"{extra} more test images wrong than fp32, over the budget"
