"""Memory: the profiler's memory timeline as data and a plotly figure, top allocations, CUDA snapshots.

    prof = memory.profile_steps(step, steps=2)          # torch.profiler with what the timeline needs
    tl = memory.timeline(prof)                           # {"times_us": [...], "bytes": {category: [...]}}
    memory.timeline_figure(tl).show(); memory.top_allocations(prof)

The timeline comes from `profile.export_memory_timeline(path.json)`, which torch 2.13 marks deprecated
(FutureWarning) in favour of the CUDA allocator's history; on CPU it is still the tool that categorises
memory (parameters, activations, gradients, optimizer state...). The warning is returned, not hidden.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from helpers import bench


def profile_steps(step: Callable[[], object], steps: int = 2) -> profile:
    """Run `step` `steps` times under torch.profiler with memory profiling on (CPU activity).

    The memory timeline needs profile_memory, record_shapes and with_stack all on. The events are read
    right away: on torch 2.13 reading them occasionally fails with UnicodeDecodeError (garbage event
    names, seen after a TorchDispatchMode ran in the process); then the steps are profiled once more."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    for attempt in range(2):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            for _ in range(steps):
                step()
        try:
            prof.events()
            return prof
        except UnicodeDecodeError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def _category_names() -> list[str]:
    """Column names of the exported sizes, in the exporter's order (column 0 is unused)."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX
    order = sorted(_CATEGORY_TO_INDEX, key=_CATEGORY_TO_INDEX.get)
    return [c.name.lower() if c is not None else "unknown" for c in order]


def timeline(prof: profile, device: str = "cpu") -> dict:
    """The memory timeline for one device: microsecond times, bytes per category, and any warning
    the exporter raised (its deprecation), as text."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = os.path.join(tmp, "timeline.json")
        prof.export_memory_timeline(path, device=device)
        with open(path) as f:
            times, sizes = json.load(f)
    if not times:
        raise ValueError(f"no memory events for device {device!r}: did the profiled code allocate there?")
    names = _category_names()
    t0 = times[0]
    return {"times_us": [t - t0 for t in times],
            "bytes": {name: [row[i + 1] for row in sizes] for i, name in enumerate(names)},
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}


def total_bytes(tl: dict) -> list[int]:
    return [sum(col) for col in zip(*tl["bytes"].values())]


def peak_bytes(tl: dict, category: str | None = None) -> int:
    """Peak of the total, or of one category."""
    if category is not None and category not in tl["bytes"]:
        raise ValueError(f"unknown category {category!r}; known: {', '.join(tl['bytes'])}")
    return max(tl["bytes"][category] if category else total_bytes(tl))


def timeline_figure(tl: dict, title: str = "Memory timeline by category"):
    """A stacked area chart (MiB over milliseconds), like the exporter's HTML plot but interactive."""
    import plotly.graph_objects as go
    ms = [t / 1e3 for t in tl["times_us"]]
    fig = go.Figure([go.Scatter(x=ms, y=[b / 2**20 for b in values], name=name, stackgroup="memory",
                                mode="lines", line_width=0.5)
                     for name, values in tl["bytes"].items() if any(values)])
    fig.update_layout(title=title, xaxis_title="time (ms)", yaxis_title="MiB", height=400)
    return fig


def top_allocations(prof: profile, n: int = 8) -> list[dict]:
    """The ops that allocated the most memory themselves (self CPU memory, positive part)."""
    rows = [{"op": e.key, "self_bytes": e.self_cpu_memory_usage, "calls": e.count}
            for e in prof.key_averages() if e.self_cpu_memory_usage > 0]
    return sorted(rows, key=lambda r: -r["self_bytes"])[:n]


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


# --- A training step to look at ----------------------------------------------------------------

def mlp(width: int = 256, depth: int = 4, checkpointed: bool = False) -> nn.Module:
    """A plain MLP; `checkpointed` recomputes each hidden layer in backward instead of storing it."""
    layers = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]
    if not checkpointed:
        return nn.Sequential(*layers, nn.Linear(width, 1))

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers, self.head = nn.ModuleList(layers), nn.Linear(width, 1)

        def forward(self, x):
            from torch.utils.checkpoint import checkpoint
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False)
            return self.head(x)
    return Checkpointed()


def training_step(model: nn.Module, batch: int, width: int, seed: int = 0) -> Callable[[], float]:
    """A closure doing forward, backward and an Adam step on a fixed random batch."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def checkpoint_comparison(batch: int = 512, width: int = 256, depth: int = 4, *, steps: int = 2,
                          repeats: int = 3, min_run_time: float = 0.05) -> dict:
    """Peak activation memory (profiler timeline) and time per step, with and without checkpointing."""
    out = {"batch": batch, "width": width, "depth": depth, "peak_bytes": {}, "activation_peak_bytes": {}}
    candidates = {}
    for name, ckpt in (("stored activations", False), ("checkpointed", True)):
        torch.manual_seed(0)
        step = training_step(mlp(width, depth, checkpointed=ckpt), batch, width)
        tl = timeline(profile_steps(step, steps=steps))
        out["peak_bytes"][name] = peak_bytes(tl)
        out["activation_peak_bytes"][name] = peak_bytes(tl, "activation")
        candidates[name] = step
    out["timing"] = bench.compare(candidates, baseline="stored activations", repeats=repeats,
                                  min_run_time=min_run_time, device="cpu")
    return out


# --- CUDA: allocator history and memory pools (GPU only) ---------------------------------------

def record_history(fn: Callable[[], object], max_entries: int = 100_000) -> dict:
    """Run fn with the CUDA allocator recording its history; return torch.cuda.memory._snapshot()."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def snapshot_summary(snapshot: dict) -> dict:
    """Segments, allocated bytes and recorded allocator events of a CUDA memory snapshot."""
    segments = snapshot["segments"]
    events = [e for trace in snapshot.get("device_traces", []) for e in trace]
    return {"segments": len(segments),
            "reserved_bytes": sum(s["total_size"] for s in segments),
            "allocated_bytes": sum(b["size"] for s in segments for b in s["blocks"]
                                   if b["state"] == "active_allocated"),
            "events": {a: sum(e["action"] == a for e in events) for a in sorted({e["action"] for e in events})}}


def dump_snapshot(snapshot: dict, path: str | Path) -> Path:
    """Write a snapshot as torch.cuda.memory._dump_snapshot does (a pickle), for pytorch.org/memory_viz."""
    import pickle
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return path


def largest_allocations(snapshot: dict, n: int = 3) -> list[dict]:
    """The n largest recorded allocations with the first stack frame outside torch: the line of your
    code that asked for the memory (what memory_viz shows on hover)."""
    allocs = [e for trace in snapshot.get("device_traces", []) for e in trace if e["action"] == "alloc"]
    out = []
    for event in sorted(allocs, key=lambda e: e["size"], reverse=True)[:n]:
        frames = [f for f in event.get("frames", []) if f"{os.sep}torch{os.sep}" not in f.get("filename", "")]
        where = f"{frames[0]['filename']}:{frames[0]['line']} in {frames[0]['name']}" if frames else "(no Python frame)"
        out.append({"bytes": event["size"], "where": where})
    return out


def nested_pools(size: int = 1 << 20) -> dict:
    """Allocate in an outer MemPool, then in an inner one (before 2.10 that landed in the outer pool,
    #161193), then in the outer again; returns how many bytes each pool's snapshot holds."""
    outer, inner = torch.cuda.MemPool(), torch.cuda.MemPool()
    keep = []
    with torch.cuda.use_mem_pool(outer):
        keep.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        with torch.cuda.use_mem_pool(inner):
            keep.append(torch.empty(2 * size, dtype=torch.uint8, device="cuda"))
        keep.append(torch.empty(size, dtype=torch.uint8, device="cuda"))   # back in the outer pool
    held = {name: sum(b["size"] for s in pool.snapshot() for b in s["blocks"] if b["state"] == "active_allocated")
            for name, pool in (("outer", outer), ("inner", inner))}
    del keep
    return held


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench memory`: activation checkpointing, memory saved vs time paid."""
    return checkpoint_comparison(batch=128 if quick else 1024, width=128 if quick else 512)
