"""Upgrade checks: what the 2.10 article tells teams to test when they upgrade, as runnable checks.

Each `check_<name>(quick, device)` returns {"passed": bool, "tolerance": what was required,
"details": what was measured}. A check that cannot run says why in "details"; it never passes silently.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# --- Quantization accuracy before / after ------------------------------------------------------

QUANT_MAX_ACCURACY_DROP = 0.01   # int8 weights may lose at most 1 point of accuracy


def _classification_task(n: int, generator: torch.Generator):
    """Inputs and labels from a fixed random linear teacher, so a small MLP learns them well."""
    teacher = torch.randn(64, 10, generator=generator)
    x = torch.randn(n, 64, generator=generator)
    return x, (x @ teacher).argmax(-1)


def _accuracy(model, x, y) -> float:
    with torch.inference_mode():
        return (model(x).argmax(-1) == y).float().mean().item()


def check_quantization(quick: bool, device: torch.device) -> dict:
    """Train a small MLP, then compare test accuracy in fp32, after torch.ao.quantization.quantize_dynamic
    (deprecated since 2.8; its warning is recorded) and, where torchao is installed, after torchao's
    quantize_(Int8WeightOnlyConfig()). Runs on the CPU: quantize_dynamic's kernels are CPU kernels."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = _classification_task(4096 if quick else 16384, gen)
    split = len(x) * 3 // 4
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150 if quick else 600):
        idx = torch.randint(0, split, (256,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    model.eval()
    x_test, y_test = x[split:], y[split:]
    fp32 = _accuracy(model, x_test, y_test)
    results = {"fp32_accuracy": fp32}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q_model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    deprecations = sorted({str(w.message).splitlines()[0] for w in caught
                           if issubclass(w.category, (DeprecationWarning, FutureWarning))})
    results["quantize_dynamic"] = {"accuracy": _accuracy(q_model, x_test, y_test),
                                   "agreement_with_fp32": _agreement(model, q_model, x_test),
                                   "deprecation_warning": deprecations[0] if deprecations else None}
    drops = [fp32 - results["quantize_dynamic"]["accuracy"]]
    if importlib.util.find_spec("torchao") is None:
        results["torchao"] = "not installed: only torch.ao.quantization was checked (pip install torchao)"
    else:
        try:
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
            ao_model = copy.deepcopy(model)
            quantize_(ao_model, Int8WeightOnlyConfig())
            results["torchao"] = {"config": "Int8WeightOnlyConfig", "accuracy": _accuracy(ao_model, x_test, y_test),
                                  "agreement_with_fp32": _agreement(model, ao_model, x_test)}
            drops.append(fp32 - results["torchao"]["accuracy"])
        except Exception as exc:          # a torchao that does not match this torch is an upgrade finding
            results["torchao"] = f"failed: {type(exc).__name__}: {exc}"
            drops.append(float("inf"))
    return {"passed": max(drops) <= QUANT_MAX_ACCURACY_DROP,
            "tolerance": f"accuracy drop <= {QUANT_MAX_ACCURACY_DROP:.0%} (absolute) for every int8 model",
            "details": results}


def _agreement(a, b, x) -> float:
    with torch.inference_mode():
        return (a(x).argmax(-1) == b(x).argmax(-1)).float().mean().item()


# --- A custom operator still passing opcheck ---------------------------------------------------


@torch.library.custom_op("labs_validation::scaled_gelu", mutates_args=())
def scaled_gelu(x: torch.Tensor, scale: float) -> torch.Tensor:
    """GELU(x) * scale as an opaque custom op (torch.compile cannot look inside it)."""
    return F.gelu(x) * scale


@scaled_gelu.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_gelu_backward(ctx, grad):
    x, = ctx.saved_tensors
    cdf = 0.5 * (1 + torch.erf(x / 2 ** 0.5))
    pdf = torch.exp(-0.5 * x * x) / (2 * torch.pi) ** 0.5
    return grad * ctx.scale * (cdf + x * pdf), None


def _scaled_gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


scaled_gelu.register_autograd(_scaled_gelu_backward, setup_context=_scaled_gelu_setup)


def check_custom_op(quick: bool, device: torch.device) -> dict:
    """torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch) on a few inputs,
    plus gradcheck for the numerics opcheck does not test."""
    samples = [(torch.randn(3, 5, device=device), 2.0),
               (torch.randn(7, device=device, requires_grad=True), -0.5),
               (torch.randn(0, 4, device=device), 1.0),                     # empty
               (torch.randn(2, 3, 5, device=device, requires_grad=True)[:, 1:], 3.0)]   # non-contiguous
    details, passed = {}, True
    for i, args in enumerate(samples):
        try:
            outcome = torch.library.opcheck(scaled_gelu, args)
        except Exception as exc:
            outcome = {"opcheck": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        details[f"sample {i} {tuple(args[0].shape)}"] = outcome
        passed &= all(v == "SUCCESS" for v in outcome.values())
    x = torch.randn(4, 3, dtype=torch.float64, device=device, requires_grad=True)
    details["gradcheck"] = torch.autograd.gradcheck(lambda t: scaled_gelu(t, 1.5), (x,))
    same = torch.allclose(scaled_gelu(x.detach(), 1.5), F.gelu(x.detach()) * 1.5)
    details["matches F.gelu * scale"] = same
    return {"passed": bool(passed and details["gradcheck"] and same),
            "tolerance": "every opcheck test SUCCESS; gradcheck in float64; output equals F.gelu(x) * scale",
            "details": details}


# --- AMP: autocast bf16 numerics vs fp32 -------------------------------------------------------

AMP_OUTPUT_RTOL = 3e-2     # bf16 keeps 8 significant bits (eps 2**-8 = 0.0039); a few layers accumulate
AMP_GRAD_RTOL = 6e-2


def _relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def check_amp(quick: bool, device: torch.device) -> dict:
    """Forward and backward of a conv + MLP model in fp32 and under torch.autocast(bfloat16): the
    output and gradients agree within the stated tolerance; linear (lower-precision list) runs in bf16,
    mse_loss (fp32 list) runs in fp32 even on bf16 inputs, and grouped_mm, in none of autocast's op
    lists, is left in its inputs' dtype."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GELU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 128),
                          nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 10)).to(device)
    x = torch.randn(8, 3, 8, 8, device=device)

    def forward_backward():
        model.zero_grad()
        out = model(x)
        out.float().square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    ref_out, ref_grads = forward_backward()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        amp_out, amp_grads = forward_backward()
        a = torch.randn(8, 16, device=device)
        low = a.bfloat16()
        dtypes = {"linear": str(F.linear(a, torch.randn(4, 16, device=device)).dtype),     # fp32 in
                  "mse_loss": str(F.mse_loss(low, torch.zeros_like(low)).dtype)}          # bf16 in
    with torch.autocast("cpu", dtype=torch.bfloat16):     # grouped_mm's fp32 path is the CPU fallback
        a = torch.randn(8, 16)
        dtypes["grouped_mm"] = str(F.grouped_mm(a, torch.randn(2, 16, 4),
                                                offs=torch.tensor([3, 8], dtype=torch.int32)).dtype)
    out_err = _relative_error(amp_out, ref_out)
    grad_err = max(_relative_error(g, r) for g, r in zip(amp_grads, ref_grads))
    expected = {"linear": "torch.bfloat16", "mse_loss": "torch.float32", "grouped_mm": "torch.float32"}
    return {"passed": out_err <= AMP_OUTPUT_RTOL and grad_err <= AMP_GRAD_RTOL and dtypes == expected,
            "tolerance": f"max |bf16 - fp32| / max |fp32| <= {AMP_OUTPUT_RTOL} (output), <= {AMP_GRAD_RTOL} "
                         f"(gradients); op dtypes under autocast as {expected}",
            "details": {"output_dtype": str(amp_out.dtype), "output_relative_error": out_err,
                        "max_gradient_relative_error": grad_err, "dtypes_under_autocast": dtypes}}


# --- DDP: two gloo processes on 127.0.0.1 give identical gradients --------------------------------

DDP_TIMEOUT_S = 60


def ddp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def ddp_batch(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed global batch: 8 examples per rank."""
    gen = torch.Generator().manual_seed(1)
    return torch.randn(8 * world, 16, generator=gen), torch.randn(8 * world, 4, generator=gen)


def ddp_shard(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s equal share of the global batch."""
    x, y = ddp_batch(world)
    return x[rank::world], y[rank::world]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_ddp(quick: bool, device: torch.device, timeout_s: float = DDP_TIMEOUT_S) -> dict:
    """Start 2 processes (gloo backend, CPU tensors, 127.0.0.1), run one DDP backward on different
    shards, and check that both ranks hold the same averaged gradients, equal to a single-process
    gradient over the whole batch. Every wait is bounded: after timeout_s the workers are killed."""
    world, port = 2, _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                               os.environ.get("PYTHONPATH", "")]))
        procs = [subprocess.Popen([sys.executable, "-m", "helpers.validation.ddp_worker", str(rank), str(world),
                                   str(port), tmp, str(int(timeout_s))],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
        deadline, logs = time.monotonic() + timeout_s, []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.wait()
                return {"passed": False, "tolerance": "identical gradients on both ranks",
                        "details": {"error": f"DDP workers did not finish within {timeout_s:.0f} s and were killed"}}
        codes = [p.returncode for p in procs]
        saved = all((Path(tmp) / f"rank{r}.pt").exists() for r in range(world))
        teardown_crash = any(codes) and saved     # gloo can abort in its own shutdown after the work is done
        if any(codes) and not saved:
            tail = [log.strip().splitlines()[-1] if log.strip() else "" for log in logs]
            return {"passed": False, "tolerance": "identical gradients on both ranks",
                    "details": {"error": f"worker exit codes {codes}", "last_lines": tail}}
        grads = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]
    model = ddp_model()
    x, y = ddp_batch(world)
    F.mse_loss(model(x), y).backward()
    single = [p.grad for p in model.parameters()]
    identical = all(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))
    max_diff = max((g - s).abs().max().item() for g, s in zip(grads[0], single))
    return {"passed": identical and max_diff <= 1e-6,
            "tolerance": "bitwise-identical gradients on both ranks; <= 1e-6 from the single-process gradient",
            "details": {"world_size": world, "backend": "gloo", "ranks_identical": identical,
                        "max_abs_diff_vs_single_process": max_diff,
                        **({"note": f"a rank exited with {codes} while shutting gloo down, after saving its "
                                    f"gradients"} if teardown_crash else {})}}


CHECKS = {"quantization": check_quantization, "custom_op": check_custom_op, "amp_bf16": check_amp,
          "ddp_gloo": check_ddp}
