"""Upgrade checks: what the 2.10 article tells teams to test when they upgrade, as runnable checks.

Each `check_<name>(quick, device)` returns {"passed": bool, "tolerance": what was required,
"details": what was measured, "paths": which code path ran}. A check that cannot run says why in
"details"; it never passes silently. Numbers in "details" are compared across runs in the report
(an accuracy that moves from 0.97 to 0.955 is shown even when both pass).

- quantization: post-training quantization of an MLP trained on scikit-learn's digits (a real labelled
  data set shipped inside the package, 1797 8x8 images): int8 weight-only per channel as lesson 05 does it
  (helpers.quant), test accuracy and agreement with fp32; beside it the legacy eager torch.ao.quantization
  path (dynamic and static int8; deprecated, its warning left for the pipeline to capture) where it still
  exists, and torchao's Int8WeightOnlyConfig where torchao is installed.
- cpp_extension: a C++ operator compiled with torch.utils.cpp_extension.load_inline against this
  torch's headers (one build directory per torch version), loaded into this libtorch (the ABI check),
  then torch.library.opcheck and a numeric check.
- amp_scaled_mm: autocast bf16 forward/backward against fp32, and an FP8 matmul through the scaled_mm
  API this torch and hardware provide (F.scaled_mm from 2.10, else torch._scaled_mm).
- ddp: two gloo processes on 127.0.0.1 give bitwise-identical gradients.
"""
from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from helpers import quant
from helpers.validation import compat, models

# --- Quantization accuracy on a real labelled data set -------------------------------------------

QUANT_MAX_ACCURACY_DROP = 0.02   # int8 may lose at most 2 points of test accuracy (450 test images: 1 point = 4.5)


def digits_split(seed: int = 0):
    """scikit-learn's digits (bundled with the package: no download), scaled to [0, 1], split 75/25."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.from_numpy((data.data / 16.0).astype(np.float32))
    y = torch.from_numpy(data.target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    split = len(x) * 3 // 4
    return x[order[:split]], y[order[:split]], x[order[split:]], y[order[split:]]


class _DigitsMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.relu1 = nn.Linear(64, 128), nn.ReLU()
        self.fc2, self.relu2 = nn.Linear(128, 128), nn.ReLU()
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def _accuracy(model, x, y) -> float:
    with torch.inference_mode():
        return (model(x).argmax(-1) == y).float().mean().item()


def _agreement(a, b, x) -> float:
    with torch.inference_mode():
        return (a(x).argmax(-1) == b(x).argmax(-1)).float().mean().item()


def _score(results: dict, name: str, model, quantized, x_test, y_test) -> None:
    acc = _accuracy(quantized, x_test, y_test)
    results[f"{name}_accuracy"] = acc
    results[f"{name}_drop"] = results["fp32_accuracy"] - acc
    results[f"{name}_agreement_with_fp32"] = _agreement(model, quantized, x_test)


def _legacy_eager(model, x_train) -> dict[str, nn.Module]:
    """Dynamic and static int8 through eager torch.ao.quantization (x86 qconfig, Linear+ReLU fused, 512
    calibration images). Its deprecation warnings are left to reach the pipeline's warning capture."""
    import torch.ao.quantization as tq
    dynamic = tq.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    static = tq.QuantWrapper(copy.deepcopy(model))
    static.qconfig = tq.get_default_qconfig("x86")
    tq.fuse_modules(static, [["module.fc1", "module.relu1"], ["module.fc2", "module.relu2"]], inplace=True)
    tq.prepare(static, inplace=True)
    with torch.inference_mode():
        for i in range(0, 512, 64):
            static(x_train[i:i + 64])
    tq.convert(static, inplace=True)
    return {"dynamic_int8": dynamic, "static_int8": static}


def _torchao_int8_weight_only(model) -> nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    quantized = copy.deepcopy(model)
    quantize_(quantized, Int8WeightOnlyConfig())
    return quantized


def check_quantization(quick: bool, device: torch.device) -> dict:
    """Train an MLP on digits (fp32, CPU), then post-training quantization. The checked path is lesson
    05's: int8 weight-only per output channel (helpers.quant.Int8WeightOnlyLinear, torch's
    _weight_int8pack_mm), which runs on 2.9 and 2.10 alike. Recorded beside it: the legacy eager
    torch.ao.quantization path (dynamic and static int8) where this torch still has it, and torchao's
    Int8WeightOnlyConfig where torchao is installed. The int8 kernels are CPU kernels, so this check runs
    on the CPU whatever the device."""
    tolerance = (f"fp32 test accuracy >= 0.9; int8 weight-only accuracy drop <= {QUANT_MAX_ACCURACY_DROP:.0%} "
                 f"(absolute)")
    try:
        x_train, y_train, x_test, y_test = digits_split()
    except ImportError:
        return {"passed": False, "tolerance": tolerance,
                "details": {"error": "scikit-learn is not installed (pip install scikit-learn): its digits "
                                     "data set is the labelled data this check measures accuracy on"}}
    model = models.seed_parameters_(_DigitsMLP(), 5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(1)
    for _ in range(300 if quick else 1500):
        idx = torch.from_numpy(rng.integers(0, len(x_train), 64))
        opt.zero_grad()
        F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
        opt.step()
    model.eval()
    results = {"dataset": f"sklearn digits: {len(x_train)} train / {len(x_test)} test images",
               "fp32_accuracy": _accuracy(model, x_test, y_test)}
    int8 = quant.swap_linears(copy.deepcopy(model), quant.Int8WeightOnlyLinear.from_linear)
    _score(results, "int8_weight_only", model, int8, x_test, y_test)
    kernels = sorted({m.path for m in int8.modules() if isinstance(m, quant.Int8WeightOnlyLinear)})
    paths = {"quantization": f"int8 weight-only per channel (helpers.quant: {', '.join(kernels)})"}
    try:
        legacy = _legacy_eager(model, x_train)
    except (ImportError, AttributeError) as exc:
        results["legacy_eager"] = f"absent: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        paths["legacy_eager"] = "absent"
    else:
        for name, quantized in legacy.items():
            _score(results, name, model, quantized, x_test, y_test)
        results["legacy_eager"] = "ran"
        paths["legacy_eager"] = "torch.ao.quantization eager (x86 qconfig)"
    try:
        torchao = _torchao_int8_weight_only(model)
    except ImportError:
        results["torchao"] = "skipped: torchao is not installed"
        paths["torchao"] = "skipped"
    else:
        _score(results, "torchao_int8_weight_only", model, torchao, x_test, y_test)
        results["torchao"] = "ran"
        paths["torchao"] = "Int8WeightOnlyConfig"
    return {"passed": results["int8_weight_only_drop"] <= QUANT_MAX_ACCURACY_DROP and results["fp32_accuracy"] >= 0.9,
            "tolerance": tolerance, "details": results, "paths": paths}


# --- A compiled C++ extension, built and loaded under this torch -----------------------------------

EXT_SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>

// GELU(x) * scale, written against ATen: recompiled for each torch, loaded into its libtorch.
at::Tensor scaled_gelu(const at::Tensor& x, double scale) {
  return at::gelu(x) * scale;
}

TORCH_LIBRARY(labs_validation_ext, m) {
  m.def("scaled_gelu(Tensor x, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(labs_validation_ext, CPU, m) {
  m.impl("scaled_gelu", &scaled_gelu);
}
"""


def extension_build_dir() -> Path:
    """One build directory per torch version and C++ ABI: a library built against other headers is never
    reused (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions, then labs-validation/<torch>)."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    tag = f"torch-{torch.__version__.replace('+', '_')}-cxx11abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return root / "labs-validation" / tag


_fake_registered = False


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    if not shutil.which(cxx):
        return f"{cxx}: not found"
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else cxx


def check_cpp_extension(quick: bool, device: torch.device) -> dict:
    """Compile EXT_SOURCE with load_inline (ninja; cached per torch version), load it into this process,
    then opcheck the operator and compare it with F.gelu * scale. Failing to build or load is the
    finding: an extension must be rebuilt against each torch it runs under."""
    global _fake_registered
    build = extension_build_dir()
    build.mkdir(parents=True, exist_ok=True)
    cached = any(build.glob("*.so"))
    details = {"torch": torch.__version__, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
               "compiler": _compiler(), "build_directory_tag": build.name, "cached_build": cached}
    tolerance = "builds and loads; every opcheck test SUCCESS; output equals F.gelu(x) * scale"
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load_inline
        load_inline("labs_validation_ext", cpp_sources=EXT_SOURCE, is_python_module=False, build_directory=str(build),
                    extra_cflags=["-O2"], no_implicit_headers=True, verbose=False)
    except Exception as exc:
        details["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        return {"passed": False, "tolerance": tolerance, "details": details, "paths": {"extension": "failed"}}
    details["build_and_load_s"] = time.perf_counter() - start
    op = torch.ops.labs_validation_ext.scaled_gelu
    if not _fake_registered:
        torch.library.register_fake("labs_validation_ext::scaled_gelu")(lambda x, scale: torch.empty_like(x))
        _fake_registered = True
    cpu = torch.device("cpu")
    samples = [(models.randn(3, 5, seed=1), 2.0), (models.randn(7, seed=2), -0.5),
               (torch.randn(0, 4), 1.0), (models.randn(2, 3, 5, seed=3)[:, 1:], 3.0)]   # empty, non-contiguous
    passed = True
    for i, args in enumerate(samples):
        try:
            outcome = torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                                   "test_aot_dispatch_static"))
        except Exception as exc:
            outcome = {"opcheck": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        details[f"opcheck sample {i} {tuple(args[0].shape)}"] = outcome
        passed &= all(v == "SUCCESS" for v in outcome.values())
    x = models.randn(64, 64, seed=4).to(cpu)
    diff = (op(x, 1.5) - F.gelu(x) * 1.5).abs().max().item()
    details["max_abs_diff_vs_F.gelu"] = diff
    return {"passed": bool(passed and diff <= 1e-6), "tolerance": tolerance, "details": details,
            "paths": {"extension": "load_inline, built against this torch's headers"}}


# --- AMP: autocast bf16 numerics, and FP8 through scaled_mm ------------------------------------------

AMP_OUTPUT_RTOL = 3e-2     # bf16 keeps 8 significant bits (eps 2**-8 = 0.0039); a few layers accumulate
AMP_GRAD_RTOL = 6e-2
FP8_RTOL = 0.1             # e4m3 keeps 4 significant bits: per-element error up to 2**-4 of the value


def _relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def check_amp(quick: bool, device: torch.device) -> dict:
    """Forward and backward of a conv + MLP model in fp32 and under torch.autocast(bfloat16) agree
    within tolerance, with linear in bf16 and mse_loss in fp32 under autocast; then an FP8 (e4m3)
    matmul with per-tensor scales through the scaled_mm API that runs here, against the fp32 product
    (autocast never routes a matmul to scaled_mm: FP8 is an explicit call or a library such as torchao)."""
    model = models.seed_parameters_(nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.GELU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 128),
        nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 10)), 7).to(device)
    x = models.randn(8, 3, 8, 8, seed=8).to(device)

    def forward_backward():
        model.zero_grad()
        out = model(x)
        out.float().square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    ref_out, ref_grads = forward_backward()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        amp_out, amp_grads = forward_backward()
        a = models.randn(8, 16, seed=9).to(device)
        low = a.bfloat16()
        dtypes = {"linear": str(F.linear(a, models.randn(4, 16, seed=10).to(device)).dtype),
                  "mse_loss": str(F.mse_loss(low, torch.zeros_like(low)).dtype)}
    out_err = _relative_error(amp_out, ref_out)
    grad_err = max(_relative_error(g, r) for g, r in zip(amp_grads, ref_grads))
    expected = {"linear": "torch.bfloat16", "mse_loss": "torch.float32"}
    # FP8: per-tensor scales so that the largest magnitude maps to e4m3's largest finite value (448)
    fp8 = torch.float8_e4m3fn
    a32 = models.randn(64, 128, seed=11).to(device)
    b32 = models.randn(128, 96, seed=12).to(device)
    sa, sb = (t.abs().max() / torch.finfo(fp8).max for t in (a32, b32))
    a8 = (a32 / sa).to(fp8)
    b8 = (b32 / sb).t().contiguous().to(fp8).t()          # column-major second operand, as the kernels want
    path, out8, tried = compat.scaled_mm_attempts(a8, b8, sa.float(), sb.float(), torch.bfloat16)
    details = {"output_dtype": str(amp_out.dtype), "output_relative_error": out_err,
               "max_gradient_relative_error": grad_err, "dtypes_under_autocast": dtypes,
               "scaled_mm_path": path or "none ran", "scaled_mm_attempts": tried}
    fp8_ok = False
    if out8 is not None:
        ref = a32 @ b32
        details["fp8_relative_error"] = _relative_error(out8, ref)
        details["fp8_output_dtype"] = str(out8.dtype)
        fp8_ok = details["fp8_relative_error"] <= FP8_RTOL
    return {"passed": out_err <= AMP_OUTPUT_RTOL and grad_err <= AMP_GRAD_RTOL and dtypes == expected and fp8_ok,
            "tolerance": f"max |bf16 - fp32| / max |fp32| <= {AMP_OUTPUT_RTOL} (output), <= {AMP_GRAD_RTOL} "
                         f"(gradients); op dtypes under autocast as {expected}; FP8 scaled_mm within "
                         f"{FP8_RTOL} of the fp32 product",
            "details": details, "paths": {"scaled_mm": path or "none"}}


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


def nccl_status() -> str:
    """Why NCCL is or is not exercised here: two NCCL ranks cannot share one GPU."""
    if not torch.cuda.is_available():
        return "not tested: no CUDA GPU (the gloo backend is what runs on CPU)"
    if torch.cuda.device_count() < 2:
        return "not tested: NCCL needs one GPU per rank and this machine has 1"
    return "not tested by this check yet: it runs gloo; run the same worker with backend nccl on 2 GPUs"


def check_ddp(quick: bool, device: torch.device, timeout_s: float = DDP_TIMEOUT_S) -> dict:
    """Start 2 processes (gloo backend, CPU tensors, 127.0.0.1), run one DDP backward on different
    shards, and check that both ranks hold the same averaged gradients, equal to a single-process
    gradient over the whole batch. Every wait is bounded: after timeout_s the workers are killed.
    Figures: the largest difference from the single-process gradient and the wall time of the step."""
    world, port = 2, _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                               os.environ.get("PYTHONPATH", "")]))
        procs = [subprocess.Popen([sys.executable, "-m", "helpers.validation.ddp_worker", str(rank), str(world),
                                   str(port), tmp, str(int(timeout_s))],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
        started = time.monotonic()
        deadline, logs = started + timeout_s, []
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
        wall = time.monotonic() - started
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
    return {"paths": {"backend": "gloo"}, "passed": identical and max_diff <= 1e-6,
            "tolerance": "bitwise-identical gradients on both ranks; <= 1e-6 from the single-process gradient",
            "details": {"world_size": world, "backend": "gloo", "ranks_identical": identical,
                        "max_abs_diff_vs_single_process": max_diff, "wall_s_two_processes": wall,
                        "nccl": nccl_status(),
                        **({"note": f"a rank exited with {codes} while shutting gloo down, after saving its "
                                    f"gradients"} if teardown_crash else {})}}


CHECKS = {"quantization": check_quantization, "cpp_extension": check_cpp_extension, "amp_scaled_mm": check_amp,
          "ddp": check_ddp}
