"""Reference outputs: what a workload computed, stored so another run (another torch) can be checked
against it.

Each workload returns named output tensors computed from version-independent weights and inputs
(`models.seed_parameters_`, numpy's PCG64). A run keeps, per output, a record in its JSON
({"sha256", "shape", "dtype", "norm", "tolerance"}) and the tensor itself (at most MAX_ELEMENTS of it:
a fixed strided subsample of a larger output) in a file beside the run JSON (`<run>.refs.pt`).

Comparing two runs: equal hashes are "identical"; otherwise the stored tensors are compared by
max |b - a| / max |a| against the output's tolerance (by dtype: fp32 1e-4, bf16 3e-2): "within
tolerance" or "drift". A missing tensor file makes it "hash differs, tensors not available".
"""
from __future__ import annotations

import hashlib

import torch

from helpers.device import reference_device

MAX_ELEMENTS = 4096
TOLERANCE = {"torch.float32": 1e-4, "torch.float64": 1e-9, "torch.bfloat16": 3e-2, "torch.float16": 5e-3}


def sha256(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def stored(t: torch.Tensor) -> torch.Tensor:
    """The tensor as stored: all of it up to MAX_ELEMENTS, else every k-th element (flattened)."""
    flat = t.detach().cpu().reshape(-1)
    if flat.numel() > MAX_ELEMENTS:
        flat = flat[:: -(-flat.numel() // MAX_ELEMENTS)]
    return flat.clone()


def record(outputs: dict[str, torch.Tensor], tolerance: dict[str, float] | None = None) -> tuple[dict, dict]:
    """(JSON records, tensors to store) for a workload's named outputs."""
    records, tensors = {}, {}
    for name, t in outputs.items():
        t = t.detach()
        dtype = str(t.dtype)
        records[name] = {"sha256": sha256(t), "shape": list(t.shape), "dtype": dtype,
                         "norm": float(t.to(reference_device(t.device)).double().norm())
                         if t.is_floating_point() else None,
                         "tolerance": (tolerance or {}).get(name, TOLERANCE.get(dtype, 1e-4)),
                         "stored_elements": min(t.numel(), MAX_ELEMENTS)}
        tensors[name] = stored(t)
    return records, tensors


def compare(rec_a: dict, rec_b: dict, ten_a: torch.Tensor | None, ten_b: torch.Tensor | None) -> dict:
    """One output of run A against run B."""
    row = {"shape_a": rec_a["shape"], "shape_b": rec_b["shape"], "dtype_a": rec_a["dtype"],
           "dtype_b": rec_b["dtype"], "tolerance": max(rec_a["tolerance"], rec_b["tolerance"])}
    if rec_a["shape"] != rec_b["shape"] or rec_a["dtype"] != rec_b["dtype"]:
        return row | {"status": "drift", "why": "shape or dtype differs"}
    if rec_a["sha256"] == rec_b["sha256"]:
        return row | {"status": "identical", "max_rel_diff": 0.0}
    if ten_a is None or ten_b is None or ten_a.shape != ten_b.shape:
        return row | {"status": "hash differs, tensors not available"}
    a, b = ten_a.double(), ten_b.double()
    scale = a.abs().max().clamp_min(1e-12)
    rel = ((b - a).abs().max() / scale).item() if a.numel() else 0.0
    worst = int((b - a).abs().argmax()) if a.numel() else 0
    return row | {"status": "within tolerance" if rel <= row["tolerance"] else "drift", "max_rel_diff": rel,
                  "worst_stored_index": worst}
