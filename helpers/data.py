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
forkserver, the default on Python 3.14 Linux, pickle the dataset; functions defined in a notebook cannot be).
"""
from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
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


# --- The loaders compared: each candidate loads one epoch ------------------------------------

def count(iterable) -> int:
    return sum(1 for _ in iterable)


def dataloader(fn, items, workers: int) -> torch.utils.data.DataLoader:
    """DataLoader with `workers` processes, one item per step, workers kept between epochs."""
    return torch.utils.data.DataLoader(MapDataset(items, fn), batch_size=None, num_workers=workers,
                                       persistent_workers=True, prefetch_factor=4)


def nodes_loader(fn, items, workers: int):
    """torchdata.nodes pipeline: IterableWrapper -> ParallelMapper(method="thread") -> Loader."""
    from torchdata import nodes
    mapper = nodes.ParallelMapper(nodes.IterableWrapper(items), map_fn=fn, num_workers=workers,
                                  method="thread", in_order=True)
    return nodes.Loader(mapper)


def loaders(fn, items, worker_counts: Iterable[int], *, torchdata: bool = True
            ) -> tuple[dict[str, Callable[[], int]], list]:
    """name -> zero-argument callable that loads one epoch; plus the DataLoaders to shut down.
    torchdata=False leaves out the torchdata.nodes loader (an optional package)."""
    candidates = {"serial": lambda: count(map(fn, items))}
    opened = []
    for k in worker_counts:
        dl = dataloader(fn, items, k)
        opened.append(dl)
        candidates[f"processes x{k}"] = lambda dl=dl: count(dl)
        candidates[f"threads x{k}"] = lambda k=k: count(thread_map(fn, items, workers=k))
        if torchdata:
            nl = nodes_loader(fn, items, k)
            candidates[f"torchdata threads x{k}"] = lambda nl=nl: count(nl)
    return candidates, opened


def shutdown(opened: list) -> None:
    """Stop persistent DataLoader worker processes now instead of at garbage collection."""
    for dl in opened:
        it = getattr(dl, "_iterator", None)
        if it is not None:
            it._shutdown_workers()
            dl._iterator = None


def measure(fn, items, worker_counts: Iterable[int], *, repeats: int = 3, min_run_time: float = 0.1,
            torchdata: bool = True) -> dict:
    """items/s for every loader and worker count, measured interleaved in one helpers.bench.compare run,
    with torch at 1 intra-op thread so parallelism comes from the loaders' workers alone."""
    from helpers.bench import compare
    candidates, opened = loaders(fn, items, worker_counts, torchdata=torchdata)
    try:
        with warnings.catch_warnings():    # more workers than cores is part of the experiment
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            result = compare(candidates, baseline="serial", repeats=repeats, min_run_time=min_run_time,
                             warmup=1, threads=1, device="cpu", work=len(items), work_unit="items")
    finally:
        shutdown(opened)
    return result


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench data`: items/s per loader and worker count, both transform families."""
    from helpers.device import capabilities, missing
    caps = capabilities()
    with_torchdata = not missing("torchdata")
    worker_counts = [1, 2] if quick else sorted({1, 2, 4, caps.cpu_count})
    n = 16 if quick else 64
    families = {"GIL-bound: tokenize (pure Python)": (tokenize, make_texts(n, words=300 if quick else 600)),
                "GIL-releasing: augment_image (torch ops)": (augment_image, make_images(n, 192 if quick else 256))}
    out = {"worker_counts": worker_counts, "items_per_epoch": n, "cpu_count": caps.cpu_count,
           "free_threaded": caps.free_threaded, "gil_enabled": caps.gil_enabled, "families": {}}
    for name, (fn, items) in families.items():
        out["families"][name] = measure(fn, items, worker_counts, repeats=3 if quick else 5,
                                        min_run_time=0.05 if quick else 0.2, torchdata=with_torchdata)
    return out


# --- Memory: threads against processes -------------------------------------------------------

def tree_pss_mb(pid: int | None = None) -> float:
    """Proportional set size of a process and all its children, in MB: pages shared between them (torch's
    libraries, memory a forked worker has not written) count once in total. The batch runner's measure."""
    import psutil

    from helpers.runner.job import _memory_mb, _tree
    root = psutil.Process(pid)
    return _memory_mb([root, *_tree(root)])


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
                  interval_s: float = 0.01) -> dict[str, float]:
    """What one epoch costs in memory, in MB of PSS above this process before it started: with `workers`
    threads (thread_map), and with `workers` DataLoader processes started for the epoch by each of
    `start_methods` ("fork", "forkserver", "spawn"; no persistent workers: each epoch starts them again)."""
    before = tree_pss_mb()
    out = {"before_mb": before,
           "threads": _peak_while(lambda: count(thread_map(fn, items, workers=workers)), interval_s) - before}
    for method in start_methods:
        loader = torch.utils.data.DataLoader(MapDataset(items, fn), batch_size=None, num_workers=workers,
                                             multiprocessing_context=method)
        out[f"processes ({method})"] = _peak_while(lambda: count(loader), interval_s) - before
    return out


# --- The same benchmark in another interpreter -------------------------------------------------

def interpreter_benchmark(n_texts: int = 32, words: int = 300, workers: int = 2, repeats: int = 3) -> dict:
    """Seconds to tokenize n_texts documents serially and on `workers` threads, in this interpreter,
    with what it is (version, free-threaded build, GIL on after torch's import)."""
    texts = make_texts(n_texts, words=words)

    def median(call) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]

    count(map(tokenize, texts))      # warm-up
    serial = median(lambda: count(map(tokenize, texts)))
    threaded = median(lambda: count(thread_map(tokenize, texts, workers=workers)))
    gil_check = getattr(sys, "_is_gil_enabled", None)
    return {"python": sys.version.split()[0], "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
            "gil_enabled": gil_check() if gil_check else True, "texts": n_texts, "workers": workers,
            "serial_s": serial, "threads_s": threaded, "speedup": serial / threaded}


def interpreter_benchmark_in(python: str, timeout_s: float = 300, env: dict | None = None, **kwargs) -> dict:
    """interpreter_benchmark run by another Python (a venv with torch and this package installed);
    env: extra environment, e.g. {"PYTHON_GIL": "1"} to run a free-threaded build with the GIL on."""
    done = subprocess.run([python, "-m", "helpers.data", json.dumps(kwargs)], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{python} -m helpers.data failed: {done.stderr.strip()[-1000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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


if __name__ == "__main__":     # python -m helpers.data '{"n_texts": 32}': interpreter_benchmark as JSON
    print(json.dumps(interpreter_benchmark(**json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}"))))
