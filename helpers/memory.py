"""Memory: the profiler's memory timeline as data and a plotly figure, top allocations, CUDA snapshots.

    prof = memory.profile_steps(step, steps=2)          # torch.profiler with what the timeline needs
    tl = memory.timeline(prof)                           # {"times_us": [...], "bytes": {category: [...]}}
    memory.timeline_figure(tl).show(); memory.top_allocations(prof)
    out, made = memory.tensors_made(fn, x)              # every floating tensor fn's ops made: (op, dtype, shape)

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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers import bench


def profile_steps(step: Callable[[], object], steps: int = 2, device: torch.device | str = "cpu") -> profile:
    """Run `step` `steps` times under torch.profiler with memory profiling on (CPU activity, and the GPU's
    when `device` is an NVIDIA or AMD GPU, waited for before the profile ends).

    The memory timeline needs profile_memory, record_shapes and with_stack all on. The events are read
    right away: reading a with_stack=True profile can fail with UnicodeDecodeError, an open profiler bug
    (pytorch/pytorch#136040, #64345); then the steps are profiled once more."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    on_gpu = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    for attempt in range(2):
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            for _ in range(steps):
                step()
            if on_gpu:
                torch.cuda.synchronize(device)
        try:
            prof.events()
            return prof
        except UnicodeDecodeError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def timeline_device(device: torch.device | str) -> str:
    """The name export_memory_timeline takes for `device`: "cpu", or "cuda:N" with the index filled in."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    return f"{device.type}:{device.index if device.index is not None else torch.cuda.current_device()}"


CUDA_BLOCK_BYTES = 512     # c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, every block a multiple of it


def allocated_bytes(tensors, device: torch.device | str) -> int:
    """What the memory timeline counts for these tensors on `device`: their bytes on a CPU; on a GPU each
    rounded up to the caching allocator's 512-byte blocks, the size the profiler records (measured on an
    H200 with torch 2.11: 512 for a 4-byte tensor, 4096 for a 4000-byte one)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    if torch.device(device).type == "cpu":
        return sum(sizes)
    return sum(-(-n // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES for n in sizes)


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


def top_allocations(prof: profile, n: int = 8, device: torch.device | str = "cpu") -> list[dict]:
    """The ATen operators that allocated the most memory themselves on `device` (self CPU memory, or self
    device memory on a GPU; positive part). Python-frame events (recorded with with_stack=True) are left
    out: a frame's self memory is what no operator under it allocated."""
    field = "self_cpu_memory_usage" if torch.device(device).type == "cpu" else "self_device_memory_usage"
    rows = [{"op": e.key, "self_bytes": getattr(e, field), "calls": e.count}
            for e in prof.key_averages() if getattr(e, field) > 0 and e.key.startswith("aten::")]
    return sorted(rows, key=lambda r: -r["self_bytes"])[:n]


def uncategorized(prof: profile, n: int = 5) -> list[dict]:
    """What the timeline calls "unknown": tensors to which no rule of torch/profiler/_memory_profiler.py
    gives a category. Grouped by the op that allocated them and its nearest Python frame, the n groups
    that created the most bytes. Reads the exporter's own (private) MemoryProfile, prof._memory_profile()."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey
    mp = prof._memory_profile()
    made_by = {}
    for event in mp._op_tree.dfs():
        if event.typed[0] == _EventType.Allocation and event.typed[1].alloc_size > 0:
            key = TensorKey.from_allocation(event.typed[1])
            if key is not None:
                made_by[key] = event.parent
    groups: dict[tuple[str, str], dict] = {}
    for _, action, (key, version), size in mp.timeline:
        if action != Action.CREATE or mp._categories.get(key, version) is not None:
            continue
        op, caller = made_by.get(key), None
        frame = op.parent if op is not None else None
        while frame is not None and caller is None:
            caller = frame.name if frame.typed[0] == _EventType.PyCall else None
            frame = frame.parent
        name = (op.name if op is not None else "(an allocation not tied to a tensor)", caller or "")
        group = groups.setdefault(name, {"op": name[0], "caller": name[1], "bytes": 0, "tensors": 0})
        group["bytes"] += size
        group["tensors"] += 1
    return sorted(groups.values(), key=lambda g: -g["bytes"])[:n]


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


class _TensorsMade(TorchDispatchMode):
    """Every floating tensor an op returns, as (op, dtype, shape): what a function makes, op by op, as ATen
    runs it. What happens inside one op's kernel is not seen, and should not be: a reduction told
    dtype=torch.float32 reads float16 and accumulates in float32 on a GPU, while on a CPU it converts its
    input first, as a plain float16 .mean() there does too."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:   # as helpers.grading.recorder._AtenNames: no torch._dynamo import
        return False

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.made.append((f"aten.{func.overloadpacket.__name__}", t.dtype, tuple(t.shape)))
        return out


def tensors_made(fn: Callable, *args, **kwargs) -> tuple[object, list[tuple[str, torch.dtype, tuple]]]:
    """fn(*args, **kwargs) and every floating tensor its ops made: (op, dtype, shape). Lab 00 counts with it
    the copies of x a function makes in a wider dtype."""
    with _TensorsMade() as mode:
        out = fn(*args, **kwargs)
    return out, mode.made


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


def training_step(model: nn.Module, batch: int, width: int, seed: int = 0,
                  device: torch.device | str | None = None) -> Callable[[], float]:
    """A closure doing forward, backward and an Adam step on a fixed random batch (drawn on the CPU, then
    moved to `device`, where the model must already be)."""
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)
    if device is not None:
        x, y = x.to(device), y.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


class GatedMLP(nn.Module):
    """A transformer's feed-forward block, x + down(gelu(up(x)) * gate(x)): three matmuls and the
    pointwise ops between them, whose outputs autograd saves (hidden = 4 x width)."""

    def __init__(self, width: int):
        super().__init__()
        self.up, self.gate = nn.Linear(width, 4 * width), nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)) * self.gate(x))


MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
CHECKPOINTING = ("none", "full", "selective")


def save_matmuls(ctx, op, *args, **kwargs):
    """A selective-checkpointing policy: keep what matmuls produce, recompute everything else
    (the pointwise ops, cheap to redo) in backward."""
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def gated_stack(width: int = 128, depth: int = 4, checkpointing: str = "none") -> nn.Module:
    """`depth` GatedMLP blocks and a linear head. checkpointing: "none" (autograd saves every
    activation), "full" (each block saves only its input and recomputes its inside in backward) or
    "selective" (each block also keeps its matmul outputs, policy `save_matmuls`)."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}, not {checkpointing!r}")
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    def selective():
        return create_selective_checkpoint_contexts(save_matmuls)

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.head = nn.ModuleList(GatedMLP(width) for _ in range(depth)), nn.Linear(width, 1)

        def forward(self, x):
            for block in self.blocks:
                if checkpointing == "none":
                    x = block(x)
                elif checkpointing == "full":
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = checkpoint(block, x, use_reentrant=False, context_fn=selective)
            return self.head(x)
    return Stack()


def checkpoint_comparison(batch: int = 512, width: int = 128, depth: int = 4, *, steps: int = 1,
                          repeats: int = 3, min_run_time: float = 0.05) -> dict:
    """Peak activation memory (profiler timeline) and time per step of a GatedMLP stack without
    checkpointing, with full and with selective (save the matmuls) activation checkpointing. One step
    runs before the profiled ones, as in later training steps: in a first step the total peak can be
    Adam creating its state in opt.step() (it is at small batches), after backward has freed the
    activations, where checkpointing cannot lower it."""
    out = {"batch": batch, "width": width, "depth": depth, "peak_bytes": {}, "activation_peak_bytes": {}}
    candidates = {}
    for mode in CHECKPOINTING:
        torch.manual_seed(0)
        step = training_step(gated_stack(width, depth, mode), batch, width)
        step()
        tl = timeline(profile_steps(step, steps=steps))
        out["peak_bytes"][mode] = peak_bytes(tl)
        out["activation_peak_bytes"][mode] = peak_bytes(tl, "activation")
        candidates[mode] = step
    out["timing"] = bench.compare(candidates, baseline="none", repeats=repeats,
                                  min_run_time=min_run_time, device="cpu")
    return out


# --- CUDA: allocator history and memory pools (GPU only) ---------------------------------------

def record_history(fn: Callable[[], object], max_entries: int = 100_000) -> dict:
    """Run fn with the CUDA allocator recording its history; return torch.cuda.memory._snapshot()."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
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


def _is_python_frame(filename: str) -> bool:
    """A Python source file, a notebook cell (ipykernel's /tmp/ipykernel_*/N.py) or code given as a
    string ("<string>", "<stdin>"); not a C/C++ frame ("??", "offloadstuff.c", "../c10/core/...")."""
    return filename.endswith(".py") or (filename.startswith("<") and filename.endswith(">"))


def largest_allocations(snapshot: dict, n: int = 3) -> list[dict]:
    """The n largest recorded allocations with the first Python frame outside torch: the line of your
    code that asked for the memory (what memory_viz shows on hover). A history recorded with C++ stacks
    (stacks="all", the default) starts each stack with frames such as `??:0 torch::unwind::unwind()`;
    only Python frames count. Backward allocations run on autograd's thread and have no Python frame."""
    allocs = [e for trace in snapshot.get("device_traces", []) for e in trace if e["action"] == "alloc"]
    out = []
    for event in sorted(allocs, key=lambda e: e["size"], reverse=True)[:n]:
        frames = [f for f in event.get("frames", []) if _is_python_frame(f.get("filename", ""))
                  and f"{os.sep}torch{os.sep}" not in f["filename"]]
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


# --- The allocator in a fresh process: settings read once, observers never detached -----------

def run_fresh(function: str, env: dict | None = None, timeout_s: float = 300, **kwargs):
    """Call helpers.memory.<function>(**kwargs) in a new Python process with `env` added to its
    environment, and return what it returned (JSON). The CUDA allocator reads PYTORCH_ALLOC_CONF (and
    PYTORCH_CUDA_ALLOC_CONF) once, at its first use, and an out-of-memory observer cannot be removed:
    a fresh process keeps both away from the caller."""
    import json
    import subprocess
    import sys
    if not callable(globals().get(function)):
        raise ValueError(f"helpers.memory has no function {function!r}")
    code = ("import json, sys; from helpers import memory; "
            f"print('RESULT ' + json.dumps(memory.{function}(**json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout_s,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        raise RuntimeError(f"memory.{function} failed in a fresh process (exit {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    return json.loads(results[-1][len("RESULT "):])


def fragmentation_workload(sizes_mib: list[int] | None = None, tensors_per_step: int = 8) -> dict:
    """The pattern of the allocator docs (notes/cuda.rst, expandable_segments): each step allocates
    `tensors_per_step` tensors a little larger than the last step's (a growing batch), then frees them.
    Returns the CUDA allocator's peak allocated and reserved bytes, its segments, and whether they were
    expandable (read from the snapshot, so it says what the allocator really did)."""
    sizes_mib = sizes_mib or list(range(12, 28, 2))
    torch.cuda.reset_peak_memory_stats()
    for mib_each in sizes_mib:
        live = [torch.empty(mib_each << 20, dtype=torch.uint8, device="cuda") for _ in range(tensors_per_step)]
        del live
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    segments = torch.cuda.memory._snapshot()["segments"]
    return {"sizes_mib": sizes_mib, "tensors_per_step": tensors_per_step,
            "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
            "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
            "reserved_bytes": torch.cuda.memory_reserved(),
            "segments": len(segments),
            "expandable": any(s.get("is_expandable", False) for s in segments),
            "alloc_conf": {k: os.environ[k] for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
                           if k in os.environ}}


def oom_snapshot(path: str, fraction: float = 0.02, chunk_mib: int = 64) -> dict:
    """Cap this process at `fraction` of the GPU (set_per_process_memory_fraction), record the
    allocator's history, attach an out-of-memory observer that dumps a snapshot for
    pytorch.org/memory_viz, then allocate `chunk_mib` pieces until the cap is hit. Returns what the
    observer saw, the OutOfMemoryError's text, and the largest allocations in the dumped snapshot.
    Run it with run_fresh: the observer stays attached for the life of the process."""
    import pickle
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        raise RuntimeError("this torch build has no CUDA caching allocator "
                           "(torch._C._cuda_attach_out_of_memory_observer is missing)")
    seen: list[dict] = []

    def observer(device, alloc, device_allowed, device_free):
        # c10/cuda/CUDACachingAllocator.cpp calls it with (device, requested bytes, the cap or the
        # device's total, free bytes), after releasing the allocator's lock, before raising
        seen.append({"device": device, "requested_bytes": alloc, "allowed_bytes": device_allowed,
                     "device_free_bytes": device_free})
        torch.cuda.memory._dump_snapshot(path)

    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.memory._record_memory_history(max_entries=10_000, stacks="python")
    attach(observer)
    held, message = [], None
    try:
        while len(held) < 10_000:
            held.append(torch.empty(chunk_mib << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as exc:
        message = str(exc)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    if not seen:
        return {"observer_calls": [], "error": message, "chunks_before_oom": len(held)}
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    return {"observer_calls": seen, "error": message, "chunks_before_oom": len(held),
            "snapshot_path": path, "largest_allocations": largest_allocations(snapshot)}


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench memory`: activation checkpointing, memory saved vs time paid."""
    return checkpoint_comparison(batch=128 if quick else 1024, width=128 if quick else 512)
