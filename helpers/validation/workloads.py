"""The four baseline workloads. Each `run_<name>(quick, device, compile, repeats, min_run_time)`
builds its model with random weights, checks one thing about its output, times it with
`helpers.bench.compare` and returns {"config": ..., "figures": ..., "notes": ...}.

A figure is {"value", "unit", "better" ("lower" or "higher"), "min", "max", "iqr", "repeats"}: the
median over repeats with its spread, so a comparison can tell a change from noise.

Quick sizes take about a second each on one CPU core. Full sizes are the real shapes (ResNet-50 at width
64, BERT-base up to length 512) and are meant for accelerators: on a CPU one padded BERT-base call at
8 x 512 tokens alone is about 0.7 TFLOP (2 x 85 M weights per token), so a full run takes many minutes.
"""
from __future__ import annotations

import contextlib
import random
import statistics
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers import bench
from helpers.validation import models

SIZES = {
    "resnet50_train": {"quick": dict(batch=4, image=32, base_width=8, classes=10),
                       "full": dict(batch=16, image=128, base_width=64, classes=1000)},
    "bert_infer": {"quick": dict(dim=128, layers=2, heads=2, ffn=512, batch=4, max_lengths=[32, 128]),
                   "full": dict(dim=768, layers=12, heads=12, ffn=3072, batch=8, max_lengths=[64, 128, 256, 512])},
    "dlrm_moe_train": {"quick": dict(batch=256, dense=13, tables=4, rows=2000, bag=8, dim=32, experts=4,
                                     hidden=64),
                       "full": dict(batch=2048, dense=13, tables=8, rows=100_000, bag=20, dim=64,
                                    experts=8, hidden=256)},
    "unet_attention": {"quick": dict(channels=32, latent=16, heads=4),
                       "full": dict(channels=128, latent=64, heads=8)},
}


def figure(seconds: list[float], unit: str = "s", better: str = "lower", scale: float = 1.0) -> dict:
    """A figure from per-repeat values: `scale / seconds` when better is "higher" (a throughput)."""
    values = [scale / s for s in seconds] if better == "higher" else [s * scale for s in seconds]
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"value": statistics.median(values), "unit": unit, "better": better, "min": min(values),
            "max": max(values), "iqr": q[2] - q[0], "repeats": values}


def timed(candidates: dict, device, repeats: int, min_run_time: float) -> dict:
    """Per-repeat seconds of each candidate, timed interleaved by helpers.bench.compare."""
    result = bench.compare(candidates, repeats=repeats, min_run_time=min_run_time, warmup=2, device=device,
                           threads=torch.get_num_threads())
    return {name: r["repeats_s"] for name, r in result["results"].items()}


class _PeakMemory(TorchDispatchMode):
    """Peak bytes of tensor storage allocated while active and still alive (CPU has no allocator
    statistics, so every op's outputs are tracked; a storage leaves the count when it is freed)."""

    def __init__(self):
        super().__init__()
        self.live, self.current, self.peak = {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if id(storage) not in self.live:
                    self.live[id(storage)] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._free, id(storage))
        return out

    def _free(self, key):
        self.current -= self.live.pop(key, 0)


def peak_memory(fn, device: torch.device) -> int:
    """Peak bytes allocated by one call of fn beyond what was already allocated."""
    if device.type == "cpu":
        with _PeakMemory() as tracker:
            fn()
        return tracker.peak
    torch.accelerator.synchronize()
    before = torch.accelerator.memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    fn()
    torch.accelerator.synchronize()
    return torch.accelerator.max_memory_allocated() - before


def _maybe_compile(model, compile: bool):
    return torch.compile(model) if compile else model


def run_resnet50_train(quick: bool, device: torch.device, compile: bool = False, repeats: int = 3,
                       min_run_time: float = 0.05) -> dict:
    cfg = SIZES["resnet50_train"]["quick" if quick else "full"]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = models.resnet50(cfg["classes"], cfg["base_width"]).to(device)
    forward = _maybe_compile(model, compile)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=gen).to(device)
    y = torch.randint(0, cfg["classes"], (cfg["batch"],), generator=gen).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        return loss

    first = step().item()
    if not torch.isfinite(torch.tensor(first)):
        raise RuntimeError(f"ResNet-50 training step gave a non-finite loss ({first})")
    t = timed({"step": step}, device, repeats, min_run_time)["step"]
    return {"config": cfg | {"parameters": sum(p.numel() for p in model.parameters())},
            "figures": {"step_time": figure(t),
                        "images_per_s": figure(t, unit="images/s", better="higher", scale=cfg["batch"])},
            "notes": {"first_loss": first}}


# On CPU, jagged attention takes the MATH path of torch/nested/_internal/sdpa.py, which goes through a
# strided nested tensor and triggers this prototype-API warning; it says nothing about our code.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")


def run_bert_infer(quick: bool, device: torch.device, compile: bool = False, repeats: int = 3,
                   min_run_time: float = 0.05) -> dict:
    cfg = SIZES["bert_infer"]["quick" if quick else "full"]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = models.Encoder(cfg["dim"], cfg["layers"], cfg["heads"], cfg["ffn"]).to(device).eval()
    forward = _maybe_compile(model, compile)
    rng = random.Random(0)
    figures, notes = {}, {}
    for max_len in cfg["max_lengths"]:
        # one sequence at full length, the rest uniform in [max_len/8, max_len]: typical padding waste
        lengths = [max_len] + [rng.randint(max(1, max_len // 8), max_len) for _ in range(cfg["batch"] - 1)]
        x, mask = models.padded_batch(lengths, cfg["dim"], gen, device)
        jagged = models.to_jagged(x, mask)
        with torch.inference_mode():
            padded_out, jagged_out = forward(x, mask), forward(jagged)
            err = max((j - p[:n]).abs().max().item()
                      for j, p, n in zip(jagged_out.unbind(), padded_out, lengths))
        if err > 1e-3:
            raise RuntimeError(f"jagged and padded outputs differ by {err:.3g} at max length {max_len}")

        def padded_call():
            with torch.inference_mode():
                forward(x, mask)

        def jagged_call():
            with torch.inference_mode():
                forward(jagged)

        t = timed({"padded": padded_call, "jagged": jagged_call}, device, repeats, min_run_time)
        figures[f"padded_latency_L{max_len}"] = figure(t["padded"])
        figures[f"jagged_latency_L{max_len}"] = figure(t["jagged"])
        notes[f"L{max_len}"] = {"lengths": lengths, "padding_fraction": 1 - sum(lengths) / (max_len * len(lengths)),
                                "max_abs_diff_jagged_vs_padded": err}
    return {"config": cfg, "figures": figures, "notes": notes}


def run_dlrm_moe_train(quick: bool, device: torch.device, compile: bool = False, repeats: int = 3,
                       min_run_time: float = 0.05) -> dict:
    cfg = SIZES["dlrm_moe_train"]["quick" if quick else "full"]
    gen = torch.Generator().manual_seed(0)
    dense, ids, offsets, labels = models.dlrm_batch(cfg["batch"], cfg["dense"], cfg["tables"], cfg["rows"],
                                                    cfg["bag"], gen, device)
    arch = {k: cfg[k] for k in ("dense", "tables", "rows", "dim", "experts", "hidden")}
    steps, losses = {}, {}
    reference = None
    for mode in ("grouped", "loop"):
        torch.manual_seed(0)
        model = models.DLRM(**arch, mode=mode).to(device)
        if reference is None:
            reference = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(reference)             # same weights for both ways of running the experts
        forward = _maybe_compile(model, compile)
        opt = torch.optim.Adagrad(model.parameters(), lr=0.01)

        def step(forward=forward, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(forward(dense, ids, offsets), labels)
            loss.backward()
            opt.step()
            return loss

        with torch.no_grad():
            losses[mode] = F.binary_cross_entropy_with_logits(forward(dense, ids, offsets), labels).item()
        step()                                       # optimizer state exists before memory is measured
        steps[mode] = step
    if abs(losses["grouped"] - losses["loop"]) > 1e-4:
        raise RuntimeError(f"grouped_mm and per-expert loop disagree: loss {losses['grouped']} vs {losses['loop']}")
    memory = {mode: peak_memory(fn, device) for mode, fn in steps.items()}
    t = timed(steps, device, repeats, min_run_time)
    figures = {}
    for mode in steps:
        figures[f"{mode}_step_time"] = figure(t[mode])
        figures[f"{mode}_examples_per_s"] = figure(t[mode], unit="examples/s", better="higher", scale=cfg["batch"])
        figures[f"{mode}_peak_memory"] = {"value": memory[mode], "unit": "bytes", "better": "lower",
                                          "min": memory[mode], "max": memory[mode], "iqr": 0, "repeats": [memory[mode]]}
    return {"config": cfg, "figures": figures, "notes": {"initial_loss": losses["grouped"]}}


def run_unet_attention(quick: bool, device: torch.device, compile: bool = False, repeats: int = 3,
                       min_run_time: float = 0.05) -> dict:
    cfg = SIZES["unet_attention"]["quick" if quick else "full"]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = models.UNet(cfg["channels"], 4, cfg["heads"]).to(device).eval()
    forward = _maybe_compile(model, compile)
    x = torch.randn(1, 4, cfg["latent"], cfg["latent"], generator=gen).to(device)
    t_step = torch.tensor([500], device=device)

    def iteration(backends=None):
        with torch.inference_mode(), (sdpa_kernel(backends) if backends else contextlib.nullcontext()):
            return forward(x, t_step)

    default_out = iteration()
    math_out = iteration([SDPBackend.MATH])
    err = (default_out - math_out).abs().max().item()
    if default_out.shape != x.shape or err > 1e-3:
        raise RuntimeError(f"UNet output {tuple(default_out.shape)} (expected {tuple(x.shape)}), "
                           f"default vs math attention differ by {err:.3g}")
    t = timed({"default": iteration, "math": lambda: iteration([SDPBackend.MATH])}, device, repeats, min_run_time)
    return {"config": cfg | {"attention_tokens": (cfg["latent"] // 2) ** 2},
            "figures": {"iteration_time": figure(t["default"]), "math_attention_iteration_time": figure(t["math"])},
            "notes": {"max_abs_diff_default_vs_math": err}}


WORKLOADS = {"resnet50_train": run_resnet50_train, "bert_infer": run_bert_infer,
             "dlrm_moe_train": run_dlrm_moe_train, "unet_attention": run_unet_attention}
