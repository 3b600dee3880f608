"""Reference outputs: what a workload computed, stored so another run (another torch) can be checked
against it.

Each workload returns named output tensors computed from version-independent weights and inputs
(`models.seed_parameters_`, numpy's PCG64). A run keeps, per output, a record in its JSON
({"sha256", "shape", "dtype", "norm", "tolerance", "stored_elements", "block_size"}) and two tensors in a
file beside the run JSON (`<run>.refs.pt`): the output itself up to MAX_ELEMENTS (a fixed strided
subsample of a larger one), and the norms of MAX_BLOCKS contiguous blocks that cover all of it (key
`<output>` + NORMS_SUFFIX), so a change in the elements the subsample skips still shows.

Comparing two runs: equal hashes are "identical"; otherwise the stored elements and the block norms are
each compared by max |b - a| / max |a| against the output's tolerance (by dtype: fp32 1e-4, bf16 3e-2):
"within tolerance" when both are, else "drift"; "compared" says what was. A block norm moves by at most
the norm of the change in its block (triangle inequality), so a changed block shows unless the change
only permutes or flips signs inside it. A run file from before block norms compares on the subsample
only, and says so; a missing tensor file makes it "hash differs, tensors not available".
"""
from __future__ import annotations

import hashlib

import torch

from helpers.device import reference_device

MAX_ELEMENTS = 4096
MAX_BLOCKS = 4096
NORMS_SUFFIX = "/block_norms"
TOLERANCE = {"torch.float32": 1e-4, "torch.float64": 1e-9, "torch.bfloat16": 3e-2, "torch.float16": 5e-3}


def sha256(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def stride(numel: int) -> int:
    """Every stride-th element is stored: 1 up to MAX_ELEMENTS."""
    return max(1, -(-numel // MAX_ELEMENTS))


def block_size(numel: int) -> int:
    """Elements per block: at most MAX_BLOCKS blocks cover the flattened output."""
    return max(1, -(-numel // MAX_BLOCKS))


def stored(t: torch.Tensor) -> torch.Tensor:
    """The tensor as stored: all of it up to MAX_ELEMENTS, else every k-th element (flattened)."""
    flat = t.detach().cpu().reshape(-1)
    return flat[::stride(flat.numel())].clone()


def block_norms(t: torch.Tensor) -> torch.Tensor:
    """float64 L2 norms of consecutive blocks of block_size(numel) elements of the flattened tensor (the
    last block may be shorter)."""
    flat = t.detach().cpu().reshape(-1).double()
    size = block_size(flat.numel())
    pad = -flat.numel() % size
    return torch.cat([flat, flat.new_zeros(pad)]).view(-1, size).norm(dim=1)


def record(outputs: dict[str, torch.Tensor], tolerance: dict[str, float] | None = None) -> tuple[dict, dict]:
    """(JSON records, tensors to store) for a workload's named outputs: each output's stored elements
    under its name, and for a floating-point output larger than MAX_ELEMENTS its block norms under
    name + NORMS_SUFFIX."""
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
        if t.is_floating_point() and t.numel() > MAX_ELEMENTS:
            records[name]["block_size"] = block_size(t.numel())
            tensors[name + NORMS_SUFFIX] = block_norms(t)
    return records, tensors


def _max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """(max |b - a| / max |a|, where it is) over two equal-shaped 1-D tensors."""
    if not a.numel():
        return 0.0, 0
    a, b = a.double(), b.double()
    diff = (b - a).abs()
    return (diff.max() / a.abs().max().clamp_min(1e-12)).item(), int(diff.argmax())


def _what_was_compared(numel: int, norms: bool) -> str:
    k = stride(numel)
    if k == 1:
        return f"all {numel} elements"
    what = f"1 in {k} elements"
    if not norms:
        return what + " (subsample only: a run file without block norms)"
    size = block_size(numel)
    return f"{what} and norms of {-(-numel // size)} blocks of {size}"


def compare(rec_a: dict, rec_b: dict, ten_a: torch.Tensor | None, ten_b: torch.Tensor | None,
            norms_a: torch.Tensor | None = None, norms_b: torch.Tensor | None = None) -> dict:
    """One output of run A against run B: its stored elements, and its block norms where both runs have
    them (norms_a, norms_b: the tensors stored under the output's name + NORMS_SUFFIX)."""
    row = {"shape_a": rec_a["shape"], "shape_b": rec_b["shape"], "dtype_a": rec_a["dtype"],
           "dtype_b": rec_b["dtype"], "tolerance": max(rec_a["tolerance"], rec_b["tolerance"])}
    if rec_a["shape"] != rec_b["shape"] or rec_a["dtype"] != rec_b["dtype"]:
        return row | {"status": "drift", "why": "shape or dtype differs"}
    numel = 1
    for size in rec_a["shape"]:
        numel *= size
    if rec_a["sha256"] == rec_b["sha256"]:
        return row | {"status": "identical", "max_rel_diff": 0.0, "compared": f"sha256 of all {numel} elements"}
    if ten_a is None or ten_b is None or ten_a.shape != ten_b.shape:
        return row | {"status": "hash differs, tensors not available"}
    rel, worst = _max_rel_diff(ten_a, ten_b)
    with_norms = norms_a is not None and norms_b is not None and norms_a.shape == norms_b.shape
    row |= {"max_rel_diff": rel, "worst_stored_index": worst, "compared": _what_was_compared(numel, with_norms)}
    within = rel <= row["tolerance"]
    if with_norms:
        norm_rel, worst_block = _max_rel_diff(norms_a, norms_b)
        row |= {"max_rel_block_norm_diff": norm_rel, "worst_block": worst_block}
        within &= norm_rel <= row["tolerance"]
    return row | {"status": "within tolerance" if within else "drift"}
