"""Thread-based data loading, the transforms lesson 01 measures, and its benchmark.

    for x in thread_map(augment_image, images, workers=4, seed=0):   # ordered, bounded, seeded
        ...

`thread_map` runs a transform on worker threads. On a normal (GIL) CPython only work that releases the
GIL (torch ops, numpy, decoding in C) runs in parallel; on a free-threaded build (3.13t/3.14t with the
GIL off) pure Python runs in parallel too. Properties, each tested in tests/test_data.py:

- ordered (the serial order) or unordered (completion order);
- bounded prefetch: at most `prefetch` items are taken from the input ahead of the consumer;
- seeding: with `seed=`, the transform is called as fn(item, rng) with the worker's own torch.Generator,
  re-seeded from (seed, index) for every item, so results do not depend on which thread ran which item;
- an exception in the transform is re-raised in the consumer as TransformError naming the item's index;
- no leaked threads: leaving the loop early, an exception, or close() stops and joins every worker.

Transforms are module-level functions so DataLoader worker processes can pickle them (spawn and
forkserver, the default on Python 3.14 Linux, pickle the dataset; a function defined in a notebook is
pickled by reference to `__main__`, which the worker cannot resolve).

Lesson 01 compares serial loading, thread_map, torchdata.nodes threads and two DataLoader process loaders:
per sample (batch_size=None: every item crosses the process boundary on its own) and batched (batch_size=B:
the worker collates B items into one tensor, as real loaders do). `side_by_side` times the pure-Python
transform on a GIL build and a free-threaded build; its record (with where, when and on what it ran) is
written to JSON, and a copy shipped in helpers/recorded/ is what the lesson shows where it cannot run.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import queue
import shlex
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

_GOLDEN = 0x9E3779B97F4A7C15     # spreads (seed, index) pairs over the 64-bit seed space
WORKER_PREFIX = "thread_map-worker"


class TransformError(RuntimeError):
    """The transform raised on one item; `index` is that item's position in the input."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"transform failed on item {index}: {type(cause).__name__}: {cause}")
        self.index = index


def item_seed(seed: int, index: int) -> int:
    """The seed for item `index`: a pure function of (seed, index), whatever thread runs it."""
    return (seed * _GOLDEN + index * 0xBF58476D1CE4E5B9 + 1) % (2**63)


def item_generator(seed: int, index: int, generator: torch.Generator | None = None) -> torch.Generator:
    """A torch.Generator seeded for item `index` (re-seeds `generator` when given)."""
    generator = generator if generator is not None else torch.Generator()
    return generator.manual_seed(item_seed(seed, index))


def serial_map(fn: Callable, items: Iterable, *, seed: int | None = None) -> list:
    """The reference: fn over items in order, on this thread, seeded exactly as thread_map seeds."""
    if seed is None:
        return [fn(item) for item in items]
    return [fn(item, item_generator(seed, i)) for i, item in enumerate(items)]


def _check_args(fn, workers: int, prefetch: int | None) -> int:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    prefetch = 2 * workers if prefetch is None else prefetch
    if not isinstance(prefetch, int) or prefetch < 1:
        raise ValueError(f"prefetch must be an int >= 1 (items taken ahead of the consumer), got {prefetch!r}")
    return prefetch


def _worker(fn, tasks: queue.SimpleQueue, results: queue.SimpleQueue, stop: threading.Event,
            seed: int | None) -> None:
    generator = torch.Generator() if seed is not None else None    # this thread's own RNG state
    while True:
        task = tasks.get()
        if task is None or stop.is_set():
            return
        index, item = task
        try:
            out = fn(item) if seed is None else fn(item, item_generator(seed, index, generator))
            results.put((index, True, out))
        except BaseException as exc:      # handed to the consumer, which re-raises it with the index
            results.put((index, False, exc))


def thread_map(fn: Callable, items: Iterable, *, workers: int = 4, ordered: bool = True,
               prefetch: int | None = None, seed: int | None = None) -> Iterator:
    """Apply fn to every item on `workers` threads; yield the results.

    ordered: yield in input order (True) or as results complete (False).
    prefetch: most items in flight (taken from the input but not yet yielded); default 2 * workers.
    seed: call fn(item, rng) with a generator seeded from (seed, index); None calls fn(item).
    Threads start on the first next() and are joined when the iterator finishes, raises or is closed.
    Leaving a for loop early closes it once nothing references the iterator; where an exception in your
    loop body may keep it referenced (its traceback does), use `with contextlib.closing(thread_map(...))`.
    """
    prefetch = _check_args(fn, workers, prefetch)
    return _run(fn, items, workers, ordered, prefetch, seed)


def _run(fn, items, workers, ordered, prefetch, seed) -> Iterator:
    tasks, results, stop = queue.SimpleQueue(), queue.SimpleQueue(), threading.Event()
    threads = [threading.Thread(target=_worker, args=(fn, tasks, results, stop, seed), daemon=True,
                                name=f"{WORKER_PREFIX}-{k}") for k in range(workers)]
    for t in threads:
        t.start()
    source = enumerate(items)
    in_flight, next_index, done_early, exhausted = 0, 0, {}, False
    try:
        while True:
            while not exhausted and in_flight < prefetch:        # refill up to the prefetch bound
                task = next(source, None)
                if task is None:
                    exhausted = True
                else:
                    tasks.put(task)
                    in_flight += 1
            if in_flight == 0:
                return
            if ordered and next_index in done_early:
                index, ok, out = next_index, *done_early.pop(next_index)
            else:
                index, ok, out = results.get()
                if ordered and index != next_index:
                    done_early[index] = (ok, out)
                    continue
            if not ok:
                raise TransformError(index, out) from out
            in_flight -= 1
            next_index += 1
            yield out
    finally:
        stop.set()
        for _ in threads:
            tasks.put(None)
        for t in threads:
            t.join()


def live_workers() -> int:
    """How many thread_map worker threads are alive in this process."""
    return sum(t.name.startswith(WORKER_PREFIX) for t in threading.enumerate())


# --- Transforms: one GIL-bound, one GIL-releasing ---------------------------------------------

VOCAB = 50_000


def tokenize(text: str) -> list[int]:
    """Pure-Python tokeniser: lower-case, split on non-letters, FNV-1a hash per word into VOCAB ids.
    Every step is Python bytecode, so it holds the GIL the whole time."""
    ids, h, in_word = [], 0xCBF29CE484222325, False
    for ch in text.lower():
        if "a" <= ch <= "z":
            h = ((h ^ ord(ch)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
            in_word = True
        elif in_word:
            ids.append(h % VOCAB)
            h, in_word = 0xCBF29CE484222325, False
    if in_word:
        ids.append(h % VOCAB)
    return ids


_BLUR = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0
MEAN, STD = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def augment_image(image: torch.Tensor, rng: torch.Generator | None = None, size: int = 96) -> torch.Tensor:
    """Image augmentation with torch ops (which release the GIL while they compute): random crop to
    7/8 of each side, random horizontal flip, 5x5 Gaussian blur, resize to size x size, normalise.
    image: uint8 (3, H, W). rng: the generator for the random choices (None: the global one)."""
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"augment_image expects a uint8 image of shape (3, H, W), got {image.dtype} "
                         f"{tuple(image.shape)}")
    _, h, w = image.shape
    ch, cw = h * 7 // 8, w * 7 // 8
    top = int(torch.randint(0, h - ch + 1, (1,), generator=rng))
    left = int(torch.randint(0, w - cw + 1, (1,), generator=rng))
    flip = bool(torch.rand((), generator=rng) < 0.5)
    x = image[:, top:top + ch, left:left + cw].float().div_(255.0)
    if flip:
        x = x.flip(-1)
    k = torch.outer(_BLUR, _BLUR).expand(3, 1, 5, 5)
    x = F.conv2d(F.pad(x.unsqueeze(0), (2, 2, 2, 2), mode="reflect"), k, groups=3)
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    return (x - MEAN) / STD


def tokenize_and_augment(item: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """A captioned image, as lab 01's loading job: item = (index, text, image) -> (the text's token ids as an
    int64 tensor, the image through augment_image with a generator seeded for its index). Both kinds of
    work in one transform: tokenize holds the GIL, augment_image's torch ops release it."""
    index, text, image = item
    return torch.tensor(tokenize(text), dtype=torch.int64), augment_image(image, item_generator(0, index))


def make_texts(n: int, words: int = 400, seed: int = 0) -> list[str]:
    """n synthetic documents of `words` words each (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (n, words), generator=g)
    letters = torch.randint(0, 26, (n, words * 10), generator=g).tolist()
    texts = []
    for doc, lens in zip(letters, lengths.tolist()):
        pos, out = 0, []
        for ln in lens:
            out.append("".join(chr(97 + c) for c in doc[pos:pos + ln]))
            pos += ln
        texts.append(" ".join(out))
    return texts


def make_images(n: int, side: int = 256, seed: int = 0) -> list[torch.Tensor]:
    """n random uint8 images of shape (3, side, side) (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    return list(torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g).unbind(0))


class MapDataset(torch.utils.data.Dataset):
    """A map-style dataset applying a module-level transform; picklable for DataLoader workers."""

    def __init__(self, items: list, fn: Callable):
        self.items, self.fn = items, fn

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.fn(self.items[i])


PAD = VOCAB      # the padding id of a batch of token ids: one past the vocabulary


def collate(batch: list):
    """What a real loader's collate_fn does, in the worker: one tensor per batch. Tensors of one shape are
    stacked by torch's default_collate (which, in a worker process, writes the batch straight into shared
    memory: torch/utils/data/_utils/collate.py); lists of token ids are padded with PAD into a
    (batch, longest) int64 tensor."""
    if isinstance(batch[0], torch.Tensor):
        return torch.utils.data.default_collate(batch)
    out = torch.full((len(batch), max(len(ids) for ids in batch)), PAD, dtype=torch.int64)
    for row, ids in enumerate(batch):
        out[row, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out


# --- The loaders compared: each candidate loads one epoch ------------------------------------

LOADERS = ("threads", "processes, per sample", "processes, batched", "torchdata threads")
MOST_WORKERS = 8     # the largest worker count measured: every loader's workers stay alive while it is timed


def worker_counts(cores: int, *, quick: bool, most: int = MOST_WORKERS) -> list[int]:
    """The worker counts to measure: 1, 2, 4 and the usable cores (at most `most`); [1, 2] in quick mode.
    4 on a 2-core machine is on purpose: it shows what oversubscription costs."""
    return [1, 2] if quick else sorted({1, 2, 4, max(1, min(cores, most))})


def count(iterable) -> int:
    return sum(1 for _ in iterable)


def dataloader(fn, items, workers: int, batch_size: int | None = None) -> torch.utils.data.DataLoader:
    """DataLoader with `workers` processes kept between epochs. batch_size=None: one item per step, each
    sent back from its worker on its own (pickled; a tensor through its own shared-memory block).
    batch_size=B: the worker collates B items (`collate`) and sends one tensor per batch."""
    return torch.utils.data.DataLoader(MapDataset(items, fn), batch_size=batch_size, num_workers=workers,
                                       collate_fn=collate if batch_size is not None else None,
                                       persistent_workers=True, prefetch_factor=4)


def nodes_loader(fn, items, workers: int):
    """torchdata.nodes pipeline: IterableWrapper -> ParallelMapper(method="thread") -> Loader."""
    from torchdata import nodes
    mapper = nodes.ParallelMapper(nodes.IterableWrapper(items), map_fn=fn, num_workers=workers,
                                  method="thread", in_order=True)
    return nodes.Loader(mapper)


def loaders(fn, items, workers: int, *, batch_size: int = 8, torchdata: bool = True
            ) -> tuple[dict[str, Callable[[], int]], list]:
    """name -> zero-argument callable that loads one epoch (serial, and each of LOADERS with `workers`
    workers), plus the DataLoaders to shut down. torchdata=False leaves out the torchdata.nodes loader."""
    per_sample, batched = dataloader(fn, items, workers), dataloader(fn, items, workers, batch_size)
    candidates = {"serial": lambda: count(map(fn, items)),
                  "threads": lambda: count(thread_map(fn, items, workers=workers)),
                  "processes, per sample": lambda: count(per_sample),
                  "processes, batched": lambda: count(batched)}
    if torchdata:
        nl = nodes_loader(fn, items, workers)
        candidates["torchdata threads"] = lambda: count(nl)
    return candidates, [per_sample, batched]


def shutdown(opened: list) -> None:
    """Stop persistent DataLoader worker processes now instead of at garbage collection."""
    for dl in opened:
        it = getattr(dl, "_iterator", None)
        if it is not None:
            it._shutdown_workers()
            dl._iterator = None


def measure(fn, items, worker_counts: Iterable[int], *, batch_size: int = 8, repeats: int = 3,
            min_run_time: float = 0.1, torchdata: bool = True) -> dict:
    """Items/s of serial loading and of every loader, at each worker count. One helpers.bench.compare per
    worker count times serial and the loaders interleaved, with torch at 1 intra-op thread (parallelism
    comes from the workers alone); only that count's worker processes are alive meanwhile.
    Returns {"worker_counts", "batch_size", "items", "by_workers": {k: compare result}}."""
    from helpers.bench import compare
    counts = list(worker_counts)
    out = {"worker_counts": counts, "batch_size": batch_size, "items": len(items), "by_workers": {}}
    for k in counts:
        with warnings.catch_warnings():    # more workers than cores is part of the experiment
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            candidates, opened = loaders(fn, items, k, batch_size=batch_size, torchdata=torchdata)
            try:
                out["by_workers"][k] = compare(candidates, baseline="serial", repeats=repeats,
                                               min_run_time=min_run_time, warmup=1, threads=1, device="cpu",
                                               work=len(items), work_unit="items")
            finally:
                shutdown(opened)
    return out


def items_per_s(result: dict, loader: str) -> list[float]:
    """A loader's items/s at each worker count of a `measure` result ("serial": measured beside each)."""
    return [result["by_workers"][k]["results"][loader]["items_per_s"] for k in result["worker_counts"]]


def speedup(result: dict, loader: str, workers: int) -> float:
    """How many times faster than serial (measured beside it) a loader was with `workers` workers."""
    return result["by_workers"][workers]["results"][loader]["ratio_to_baseline"]


def items_per_s_range(result: dict, loader: str) -> tuple[list[float], list[float]]:
    """A loader's items/s in its slowest and in its fastest repeat, at each worker count of a `measure` result."""
    runs = [result["by_workers"][k]["results"][loader] for k in result["worker_counts"]]
    return [result["items"] / r["max_s"] for r in runs], [result["items"] / r["min_s"] for r in runs]


def speedup_table(result: dict) -> str:
    """A `measure` result as text: each loader's speed-up over serial (measured beside it) per worker
    count, and serial's own items/s. A speed-up whose spread overlaps serial's is marked ~ (a tie here)."""
    from helpers.bench import separated
    counts = result["worker_counts"]
    names = [n for n in result["by_workers"][counts[0]]["results"] if n != "serial"]
    ties = {(name, k): not separated(result["by_workers"][k], "serial", name) for name in names for k in counts}
    rows = ["speed-up over serial, by number of workers",
            f"{'workers':<24}" + "".join(f"{k:>12}" for k in counts),
            *(f"{name:<24}" + "".join(f"{'~' * ties[name, k] + f'{speedup(result, name, k):.2f}':>11}x" for k in counts)
              for name in names),
            f"{'(serial items/s)':<24}" + "".join(f"{v:>12.0f}" for v in items_per_s(result, "serial"))]
    if any(ties.values()):
        rows.append("~ its spread over the repeats overlaps serial's: a tie here")
    return "\n".join(rows)


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench data`: items/s per loader and worker count, both transform families."""
    from helpers.device import capabilities, missing
    caps = capabilities()
    with_torchdata = not missing("torchdata")
    counts = worker_counts(caps.cpu_count, quick=quick)
    n = 16 if quick else 64
    families = {"GIL-bound: tokenize (pure Python)": (tokenize, make_texts(n, words=300 if quick else 600)),
                "GIL-releasing: augment_image (torch ops)": (augment_image, make_images(n, 192 if quick else 256))}
    out = {"worker_counts": counts, "items_per_epoch": n, "cpu_count": caps.cpu_count,
           "free_threaded": caps.free_threaded, "gil_enabled": caps.gil_enabled, "families": {}}
    for name, (fn, items) in families.items():
        out["families"][name] = measure(fn, items, counts, batch_size=4 if quick else 8, repeats=3 if quick else 5,
                                        min_run_time=0.05 if quick else 0.2, torchdata=with_torchdata)
    return out


# --- Memory: threads against processes -------------------------------------------------------

def memory_measure() -> str:
    """What tree_pss_mb measures on this OS: "PSS" (Linux), or "RSS" where the OS reports no PSS (macOS,
    Windows): there a page shared by several processes is counted once in each."""
    import psutil
    try:
        return "PSS" if hasattr(psutil.Process().memory_full_info(), "pss") else "RSS"
    except psutil.Error:
        return "RSS"


def tree_pss_mb(pid: int | None = None) -> float:
    """Proportional set size of a process and all its children, in MB: pages shared between them (torch's
    libraries, memory a forked worker has not written) count once in total. The batch runner's measure;
    where the OS reports no PSS it falls back to RSS (see memory_measure)."""
    import psutil

    from helpers.processes import memory_mb, process_tree
    root = psutil.Process(pid)
    return memory_mb([root, *process_tree(root)])


def _peak_while(load: Callable[[], object], interval_s: float) -> float:
    """The highest tree_pss_mb() seen while load() runs, sampled on a side thread."""
    peak, done = [tree_pss_mb()], threading.Event()

    def sample():
        while not done.is_set():
            peak.append(tree_pss_mb())
            done.wait(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        load()
    finally:
        done.set()
        sampler.join()
    return max(peak)


def loader_memory(fn, items, workers: int, start_methods: Iterable[str] = ("fork",), *,
                  interval_s: float = 0.01) -> dict:
    """What one epoch costs in memory, in MB above this process before it started: with `workers` threads
    (thread_map), and with `workers` DataLoader processes started for the epoch by each of `start_methods`
    ("fork", "forkserver", "spawn"; no persistent workers: each epoch starts them again). "measure" says
    whether the figures are PSS or, where the OS has no PSS, RSS."""
    before = tree_pss_mb()
    out = {"measure": memory_measure(), "before_mb": before,
           "threads": _peak_while(lambda: count(thread_map(fn, items, workers=workers)), interval_s) - before}
    for method in start_methods:
        loader = torch.utils.data.DataLoader(MapDataset(items, fn), batch_size=None, num_workers=workers,
                                             multiprocessing_context=method)
        out[f"processes ({method})"] = _peak_while(lambda: count(loader), interval_s) - before
    return out


class _Chunks(torch.utils.data.Dataset):
    """Item i sums the i-th of `chunks` slices of `values` (a list of Python floats or a tensor)."""

    def __init__(self, values, chunks: int):
        self.values, self.chunks = values, chunks

    def __len__(self) -> int:
        return self.chunks

    def __getitem__(self, i):
        n = len(self.values) // self.chunks
        part = self.values[i * n:(i + 1) * n]
        return float(sum(part)) if isinstance(part, list) else float(part.sum())


def copy_on_access(n_values: int, *, chunks: int = 16) -> dict[str, float]:
    """MB (PSS, see memory_measure) that one forked DataLoader worker adds once it has read every value of a
    dataset, measured after the epoch while the worker is still alive: values held as a list of Python
    floats, and as one float64 tensor. Reading a Python object writes its reference count, so the worker
    copies each page of the list it reads; a tensor's elements carry no reference counts
    (pytorch/pytorch#13246). The tensor's figure is what any forked worker adds."""
    def one_epoch(values) -> float:
        loader = torch.utils.data.DataLoader(_Chunks(values, chunks), batch_size=None, num_workers=1,
                                             multiprocessing_context="fork", persistent_workers=True)
        before = tree_pss_mb()
        try:
            count(loader)
            return tree_pss_mb() - before
        finally:
            shutdown([loader])

    return {"list of Python floats": one_epoch([float(i) for i in range(n_values)]),
            "float64 tensor": one_epoch(torch.arange(n_values, dtype=torch.float64))}


# --- The same benchmark in another interpreter -------------------------------------------------

def interpreter_benchmark(n_texts: int = 32, words: int = 300, workers: int = 2, repeats: int = 3) -> dict:
    """Seconds to tokenize n_texts documents serially and on `workers` threads, in this interpreter,
    with what it is (CPython and torch versions, free-threaded build, GIL on after torch's import)."""
    texts = make_texts(n_texts, words=words)

    def timed(call) -> dict:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return {"median_s": sorted(times)[len(times) // 2], "min_s": min(times), "max_s": max(times)}

    count(map(tokenize, texts))      # warm-up
    serial = timed(lambda: count(map(tokenize, texts)))
    threaded = timed(lambda: count(thread_map(tokenize, texts, workers=workers)))
    gil_check = getattr(sys, "_is_gil_enabled", None)
    return {"python": sys.version.split()[0], "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
            "gil_enabled": gil_check() if gil_check else True, "torch": torch.__version__, "texts": n_texts,
            "words": words, "workers": workers, "repeats": repeats,
            "serial_s": serial["median_s"], "threads_s": threaded["median_s"],
            "speedup": serial["median_s"] / threaded["median_s"], "results": {"serial": serial, "threads": threaded}}


def interpreter_benchmark_in(python: str, timeout_s: float = 300, env: dict | None = None, **kwargs) -> dict:
    """interpreter_benchmark run by another Python (a venv with torch and this package installed);
    env: extra environment, e.g. {"PYTHON_GIL": "1"} to run a free-threaded build with the GIL on."""
    done = subprocess.run([python, "-m", "helpers.data", json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{python} -m helpers.data failed: {done.stderr.strip()[-1000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- The GIL build and the free-threaded build, side by side, and its recorded run ---------------

SIDE_BY_SIDE_SCHEMA = "pytorch-210-labs/free-threaded-side-by-side/1"
SIDE_BY_SIDE_OUT_ENV = "LABS_SIDE_BY_SIDE_OUT"      # where a live side-by-side run writes its record
SIDE_BY_SIDE_OUT = "runs/free_threaded_side_by_side.json"
RECORDED_SIDE_BY_SIDE = Path(__file__).with_name("recorded") / "free_threaded_side_by_side.json"
GIL_BUILD, FT_BUILD, FT_GIL_FORCED = "GIL build", "free-threaded build", "free-threaded build, PYTHON_GIL=1"


def side_by_side(other_python: str, *, n_texts: int = 64, words: int = 300, workers: int = 2,
                 repeats: int = 3, quick: bool = False) -> dict:
    """interpreter_benchmark here and in `other_python` (one must be a GIL build, the other a free-threaded
    one), and in the free-threaded one again with PYTHON_GIL=1; with where, when and on what it ran."""
    from helpers.device import capabilities
    args = {"n_texts": n_texts, "words": words, "workers": workers, "repeats": repeats}
    here = interpreter_benchmark(**args)
    there = interpreter_benchmark_in(other_python, **args)
    if here["free_threaded"] == there["free_threaded"]:
        raise ValueError(f"{other_python} is the same kind of build as {sys.executable} (free-threaded: "
                         f"{here['free_threaded']}): pair a GIL build with a free-threaded one")
    ft_python = sys.executable if here["free_threaded"] else other_python
    runs = {GIL_BUILD: there if here["free_threaded"] else here, FT_BUILD: here if here["free_threaded"] else there,
            FT_GIL_FORCED: interpreter_benchmark_in(ft_python, env={"PYTHON_GIL": "1"}, **args)}
    caps = capabilities()
    return {"schema": SIDE_BY_SIDE_SCHEMA,
            "recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": {"cpu": caps.cpu_name, "usable_cpus": caps.cpu_count, "os": platform.platform()},
            "quick": quick, "settings": args, "runs": runs}


def save_side_by_side(record: dict, path: str | os.PathLike | None = None) -> Path:
    """Write a side_by_side record as JSON: to `path`, else $LABS_SIDE_BY_SIDE_OUT, else
    runs/free_threaded_side_by_side.json (relative to the working directory). Returns the absolute path."""
    from helpers.files import write_text_atomic
    target = Path(path or os.environ.get(SIDE_BY_SIDE_OUT_ENV) or SIDE_BY_SIDE_OUT)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json.dumps(record, indent=2) + "\n", target)
    return target.resolve()


def recorded_side_by_side(path: str | os.PathLike = RECORDED_SIDE_BY_SIDE) -> dict | None:
    """The side_by_side record shipped with the package, or None when none is shipped."""
    path = Path(path)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("schema") != SIDE_BY_SIDE_SCHEMA:
        raise ValueError(f"{path}: schema {record.get('schema')!r}, expected {SIDE_BY_SIDE_SCHEMA!r}")
    return record


def provenance(record: dict) -> str:
    """Where, when and on what a side_by_side record ran, in one line."""
    m, runs, s = record["machine"], record["runs"], record["settings"]
    builds = "; ".join(f"{name}: CPython {r['python']}, torch {r['torch']}" for name, r in runs.items()
                       if name != FT_GIL_FORCED)
    return (f"{record['recorded_utc']} on {m['cpu']} ({m['usable_cpus']} usable CPUs, {m['os']}); {builds}; "
            f"{s['n_texts']} documents, {s['workers']} threads{', quick mode' if record['quick'] else ''}")


def side_by_side_lines(record: dict) -> list[str]:
    """A side_by_side record as a table and the two comparisons that matter."""
    runs = record["runs"]
    lines = [f"{'':<36}{'Python':>8}{'GIL on':>8}{'serial ms':>11}{'threads ms':>12}{'speed-up':>10}"]
    for name, r in runs.items():
        lines.append(f"{name:<36}{r['python']:>8}{str(r['gil_enabled']):>8}{r['serial_s'] * 1e3:>11.1f}"
                     f"{r['threads_s'] * 1e3:>12.1f}{r['speedup']:>9.2f}x")
    ft, gil = runs[FT_BUILD], runs[GIL_BUILD]
    lines.append(f"one thread, free-threaded build against the GIL build: {ft['serial_s'] / gil['serial_s']:.2f}x "
                 f"the time" + _ratio_spread(ft, "serial", gil, "serial"))
    lines.append(f"{ft['workers']} threads on the free-threaded build against one thread on the GIL build: "
                 f"{gil['serial_s'] / ft['threads_s']:.2f}x the speed" + _ratio_spread(gil, "serial", ft, "threads"))
    return lines


def _ratio_spread(run_a: dict, a: str, run_b: dict, b: str) -> str:
    """The range over the repeats of run_a's `a` time over run_b's `b` time, with bench.NOISY when the two
    ranges overlap; a record made before interpreter_benchmark kept min and max has no range to give."""
    from helpers import bench
    if "results" not in run_a or "results" not in run_b:
        return " (no spread was recorded)"
    pair = {"results": {"a": run_a["results"][a], "b": run_b["results"][b]}}
    lo, hi = bench.speedup_range(pair["results"], "a", "b")
    noisy = "" if bench.separated(pair, "a", "b") else f"; {bench.NOISY}"
    return f" ({lo:.2f}x to {hi:.2f}x over the repeats{noisy})"


# --- An extension that turns the GIL back on -------------------------------------------------

_NOT_MARKED_EXTENSION = """
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
/* no Py_mod_gil slot: the module does not declare that it is safe without the GIL */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "not_gil_safe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_not_gil_safe(void) { return PyModule_Create(&module); }
"""


def build_not_gil_safe_extension(folder: str) -> str:
    """Compile a tiny C extension that, like most extensions built before free-threading, does not
    declare Py_mod_gil; returns the folder to put on sys.path. Needs this Python's headers and its C compiler."""
    source = os.path.join(folder, "not_gil_safe.c")
    with open(source, "w") as f:
        f.write(_NOT_MARKED_EXTENSION)
    target = os.path.join(folder, "not_gil_safe" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    subprocess.run([*cc, "-shared", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}", source, "-o", target],
                   check=True, capture_output=True, text=True)
    return folder


def gil_after_import(folder: str, env: dict | None = None) -> dict:
    """In a fresh interpreter like this one: is the GIL on before and after importing not_gil_safe, and
    what did the import warn? env: extra environment (PYTHON_GIL=0 keeps the GIL off at your own risk)."""
    code = ("import sys, warnings\n"
            "before = sys._is_gil_enabled()\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            f"    sys.path.insert(0, {folder!r}); import not_gil_safe\n"
            "import json; print(json.dumps({'before': before, 'after': sys._is_gil_enabled(), "
            "'warnings': [f'{w.category.__name__}: {w.message}' for w in caught]}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"the import check failed: {done.stderr.strip()[-1000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- Lab checks -------------------------------------------------------------------------------

RACE_HINT = ("outputs that change from run to run mean the threads share state: a buffer that every call "
             "writes into (allocate a new tensor per call), or the global RNG (pass generator=rng to "
             "torch.rand/randint/randn)")


def check_same_outputs(actual: list, expected: list, *, what: str, hint: str = "") -> None:
    """Two lists of tensors are equal item by item; the failure names the first item that differs."""
    from helpers.checks import fail, passed
    if not isinstance(actual, list):
        fail(what, f"expected a list, got {type(actual).__name__}", "collect the results: list(...)")
    if len(actual) != len(expected):
        fail(what, f"{len(actual)} items, expected {len(expected)}", "return one output per input item, in order")
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype or not torch.equal(a, e):
            got = f"{type(a).__name__} {tuple(a.shape)} {a.dtype}" if isinstance(a, torch.Tensor) else type(a).__name__
            fail(what, f"item {i} differs from the serial reference (got {got}, expected {tuple(e.shape)} "
                       f"{e.dtype})", hint)
    passed(what)


def check_thread_safe(fn: Callable, items: list, expected: list, *, seed: int, workers: int = 4, runs: int = 3,
                      what: str) -> None:
    """thread_map(fn, items, seed=seed) gives `expected` on every one of `runs` runs."""
    from helpers.checks import fail, passed
    for run in range(1, runs + 1):
        out = list(thread_map(fn, items, workers=workers, seed=seed))
        bad = [i for i, (a, e) in enumerate(zip(out, expected)) if not torch.equal(a, e)]
        if bad:
            fail(what, f"run {run} with {workers} threads: {len(bad)} of {len(items)} items differ from the serial "
                       f"reference (first: item {bad[0]})", RACE_HINT)
    passed(what)


def _main(argv: list[str]) -> None:
    """python -m helpers.data '{"n_texts": 32}': interpreter_benchmark as JSON (what interpreter_benchmark_in
    runs). python -m helpers.data side-by-side [OUT.json]: side_by_side against $LABS_OTHER_PYTHON at the
    lesson's full size, written to OUT.json (default: $LABS_SIDE_BY_SIDE_OUT, else runs/...)."""
    if argv and argv[0] == "side-by-side":
        from helpers.device import capabilities, skip_reason
        reason = skip_reason(["other_python"])
        if reason:
            raise SystemExit(f"side-by-side: {reason}")
        record = side_by_side(capabilities().other_python, workers=capabilities().cpu_count)
        print("\n".join(side_by_side_lines(record)))
        print("written:", save_side_by_side(record, argv[1] if len(argv) > 1 else None))
        return
    print(json.dumps(interpreter_benchmark(**json.loads(argv[0] if argv else "{}"))))


if __name__ == "__main__":
    _main(sys.argv[1:])
