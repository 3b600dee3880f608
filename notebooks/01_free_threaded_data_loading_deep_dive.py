# %% [markdown]
# # 01 · Deep dive: free-threaded data loading
#
# | | |
# |---|---|
# | **What you will learn** | what threads and worker processes cost in memory by start method, and why forked workers grow as they read Python objects; how one extension turns the GIL back on in a free-threaded build; what torch shares between threads; the fixed cost per epoch of `torchdata.nodes`; why serial and one worker can differ on a busy machine; five more pitfalls of thread loading (shared buffers, ordering, read-ahead, errors and shutdown, pickling for process workers); what changes on other hardware, other Pythons and after 2.10 |
# | **Prerequisites** | [lesson 01](01_free_threaded_data_loading.ipynb) |
# | **Hardware** | any CPU. The extension section needs a free-threaded CPython (3.13t/3.14t, `environments/free-threaded.txt`) and a C compiler; the torchdata section needs torchdata |
# | **Time** | 56 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the 2.10 facts are checked against its source and release notes |
#
# The core lesson measured which loader is fast. This notebook is about what else decides the choice: memory,
# hidden shared state, and the ways a thread loader goes wrong. Each section stands on its own.

# %% tags=["colab-setup"]
# Colab only (elsewhere this cell does nothing): clone the course once, install it beside Colab's own torch
# with torchao and torchdata matched to that torch, and work from this notebook's folder of the clone.
import sys

if "google.colab" in sys.modules:
    import os
    import shutil
    import subprocess
    clone = os.environ.get("LABS_COLAB_DIR", "/content/pytorch-210-labs")
    if not os.path.isdir(os.path.join(clone, ".git")):
        shutil.rmtree(clone, ignore_errors=True)   # a clone cut short
        source = os.environ.get("LABS_COLAB_SOURCE", "https://github.com/pytorch-210-labs/pytorch-210-labs")
        subprocess.run(["git", "clone", "--depth", "1", source, clone], check=True)
    subprocess.run([sys.executable, "-m", "helpers.colab", "setup"], cwd=clone, check=True)
    if clone not in sys.path:
        sys.path.insert(0, clone)
    os.environ["LABS_NOTEBOOK"] = "notebooks/01_free_threaded_data_loading_deep_dive.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
N_ITEMS = 64           # items per epoch
IMAGE_SIDE = 256       # input images are (3, IMAGE_SIDE, IMAGE_SIDE) uint8
TEXT_WORDS = 600       # words per document for the tokeniser
LIST_VALUES = 2_000_000  # Python floats a forked worker reads in the copy-on-access measurement

# %%
import multiprocessing
import sys
import threading

import torch

from helpers import bench, data
from helpers.device import capabilities, pick_device, quick_mode, requires
from helpers.interactive import predict, reveal

QUICK = quick_mode(QUICK)
DEVICE = pick_device()          # data loading runs on the CPU whatever DEVICE is; it is shown for reference
caps = capabilities()
if QUICK:
    N_ITEMS, IMAGE_SIDE, TEXT_WORDS, LIST_VALUES = 12, 160, 250, 300_000
K = data.worker_counts(caps.cpu_count, quick=QUICK)[-1]
torch.set_num_threads(1)        # as DataLoader workers do
images = data.make_images(N_ITEMS, side=IMAGE_SIDE)
texts = data.make_texts(N_ITEMS, words=TEXT_WORDS)
print(f"torch {torch.__version__} · Python {sys.version.split()[0]} · device: {DEVICE} · "
      f"usable CPU cores: {caps.cpu_count} · workers: {K}")

# %% [markdown]
# ## Memory: threads against processes
#
# Memory is the usual argument for threads: a thread shares everything with the loop that feeds it, a
# process has its own interpreter. How much a worker process costs depends on how it starts. With `fork`
# (the default on Linux before Python 3.14) it shares the parent's pages until it writes them; with
# `forkserver` (the default on Linux from 3.14) or `spawn` (macOS, Windows) it starts a fresh interpreter
# that imports torch again. `data.loader_memory` samples the memory of this process and its children while
# one epoch loads (workers started for the epoch, as without `persistent_workers`) and reports the peak above
# where it started. On Linux that is the proportional set size (PSS), which counts a page shared by several
# processes once in total; where the OS reports no PSS (macOS, Windows) it is the resident set size (RSS),
# which counts a shared page in every process, so there the process figures are upper bounds. First, a
# number to estimate from what this kernel holds now:

# %% tags=["predict"]
start_methods = [m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()][:2]
fresh = next((m for m in start_methods if m != "fork"), start_methods[0])   # a method that starts a new interpreter
print(f"this kernel (Python, torch, the data) holds {data.tree_pss_mb():.0f} MB now ({data.memory_measure()})")
memory_guess = predict(f"How many MB will {K} DataLoader workers started with '{fresh}' add at the peak of one epoch?",
                       unit="MB", example=20.0)

# %%
memory = data.loader_memory(data.tokenize, texts, K, start_methods)
print(f"measured as {memory['measure']}; this kernel before loading: {memory['before_mb']:.0f} MB; "
      f"default start method here: {multiprocessing.get_start_method()}")
for name, mb in memory.items():
    if name not in ("measure", "before_mb"):
        print(f"{K} {name:<24} {mb:+7.1f} MB at the peak of one epoch")

# %% tags=["reveal"]
fresh_mb = memory[f"processes ({fresh})"]
forked = (f"; {K} forked workers added {memory['processes (fork)']:+.0f} MB, sharing the parent's pages until they "
          "write them" if fresh != "fork" and "processes (fork)" in memory else "")
reveal(memory_guess, fresh_mb,
       why=f"each '{fresh}' worker starts from a new interpreter, not from this kernel: it imports torch again and "
           f"unpickles the dataset, about {fresh_mb / K:.0f} MB per worker, against this kernel's "
           f"{memory['before_mb']:.0f} MB{forked}; "
           f"{K} threads added {memory['threads']:+.1f} MB. It grows with the worker count, and on Linux from "
           "Python 3.14 forkserver is the default.");

# %% [markdown]
# Threads add next to nothing. Workers that start a new interpreter add a whole torch import each, which is
# why Python 3.14's switch to `forkserver` on Linux raised many loaders' memory. Forked workers add little
# while they only read, but reading a Python object writes its reference count, so a forked worker copies
# every page of Python objects it reads: a dataset held as a big list of Python objects grows in every
# worker over an epoch (pytorch/pytorch#13246). The next cell measures it: one forked worker reads every
# value of a dataset once, held as a list of Python floats and as one tensor, and the cell reports what the
# worker adds after the epoch.

# %% tags=["predict"]
print(f"{LIST_VALUES:,} values; one Python float object: sys.getsizeof(1.0) = {sys.getsizeof(1.0)} bytes; "
      "one float64 element of a tensor: 8 bytes")
cow_guess = predict(f"How many MB more will the worker add after reading the list of {LIST_VALUES:,} floats than "
                    "after reading the tensor?", unit="MB", example=1.0)

# %%
if "fork" in multiprocessing.get_all_start_methods():
    grown = data.copy_on_access(LIST_VALUES)
    for name, mb in grown.items():
        print(f"{LIST_VALUES:,} values as a {name:<22}: the worker adds {mb:+6.1f} MB ({data.memory_measure()})")
    print(f"reading the list copied about {grown['list of Python floats'] - grown['float64 tensor']:.0f} MB more "
          f"than reading the tensor")
else:
    print("this platform has no fork start method: workers do not share the parent's pages at all")

# %% tags=["reveal"]
if "fork" in multiprocessing.get_all_start_methods():
    extra = grown["list of Python floats"] - grown["float64 tensor"]
    reveal(cow_guess, extra,
           why=f"reading a float increments its reference count, a write into the float object itself, so the "
               f"worker gets its own copy of every page those objects sit on: {LIST_VALUES:,} x {sys.getsizeof(1.0)} "
               f"bytes = {LIST_VALUES * sys.getsizeof(1.0) / 1e6:.1f} MB of objects; measured {extra:.1f} MB more. "
               f"The tensor's {grown['float64 tensor']:+.1f} MB is what the worker writes of its own whatever the "
               f"data; the tensor's {LIST_VALUES * 8 / 1e6:.1f} MB of values carry no reference counts and stay "
               "shared. The gap grows with the values read, in every worker.");
else:
    print("no fork start method here: nothing was measured")


# %% [markdown]
# Keep large read-only data in tensors or numpy arrays (one object, no per-element reference counts), not in
# lists or dicts of Python objects; with threads the question does not arise. PyTorch's own measurements of
# thread workers in `DataLoader` ([pytorch/pytorch#161044](https://github.com/pytorch/pytorch/pull/161044))
# report, for data held in memory, comparable throughput with 2-3x less memory; that figure is theirs, not
# measured here.
#
# ### Your turn: pack a ragged dataset
#
# Token ids do not fit one rectangular tensor: every document has its own length, so the natural form is a
# list of lists of Python ints, and every int above 256 is an object of its own with a reference count
# (CPython shares only the small ints from -5 to 256). Write `pack(docs)` so that it returns one flat int64
# tensor of every id and an int64 tensor `offsets` of `len(docs) + 1` boundaries, starting at 0, so that
# `flat[offsets[i]:offsets[i + 1]]` is document i. A worker then reads two objects, whatever the size.

# %% tags=["your-turn"]
def pack(docs):
    flat = docs          # a list of Python lists: make it one tensor of every id
    offsets = None       # and this the tensor of boundaries
    return flat, offsets


# %%
from helpers.checks import fail, your_turn

lengths = torch.randint(50, 400, (LIST_VALUES // 225,), generator=torch.Generator().manual_seed(0)).tolist()
g = torch.Generator().manual_seed(1)
docs = [torch.randint(257, data.VOCAB, (n,), generator=g).tolist() for n in lengths]   # token ids, ragged


def check_pack():
    flat, offsets = pack(docs)
    for name, t in (("flat", flat), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1:
            fail("pack", f"{name} is {type(t).__name__ if not isinstance(t, torch.Tensor) else f'{t.dim()}-D {t.dtype}'}",
                 "a 1-D int64 tensor: torch.tensor(list_of_ints) makes one, and itertools.chain.from_iterable or "
                 "a list comprehension flattens the documents; torch.cumsum of the lengths gives the ends")
    if len(offsets) != len(docs) + 1 or offsets[0] != 0 or offsets[-1] != len(flat):
        fail("pack", f"{len(offsets)} offsets from {int(offsets[0]) if len(offsets) else None} to "
             f"{int(offsets[-1]) if len(offsets) else None}", f"{len(docs) + 1} boundaries from 0 to {len(flat)}")
    for i, doc in enumerate(docs):
        if flat[offsets[i]:offsets[i + 1]].tolist() != doc:
            fail("pack", f"document {i} does not come back from flat[offsets[{i}]:offsets[{i + 1}]]",
                 "offsets[i] is where document i starts: the sum of the lengths before it")


your_turn(check_pack, what="pack a ragged dataset");

# %% [markdown]
# Large token datasets are often stored this way, memory-mapped from disk: a forked worker reads them
# without copying, and with `spawn` or
# `forkserver` the dataset pickles as two tensors instead of millions of objects.
#
# ## An extension that turns the GIL back on
#
# On a free-threaded build, importing a C extension that does not declare `Py_mod_gil` (most extensions built
# before free-threading, and your own unless you add the slot) turns the GIL back on for the whole process,
# with only a `RuntimeWarning` (pytorch/pytorch#144361). This cell compiles a tiny such extension and imports
# it in a fresh interpreter like this one: once plainly, once with `PYTHON_GIL=0`.

# %%
if requires("free_threaded", "cxx", section="An extension that turns the GIL back on"):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        data.build_not_gil_safe_extension(folder)
        plain = data.gil_after_import(folder)
        forced = data.gil_after_import(folder, env={"PYTHON_GIL": "0"})
    print("GIL on before the import:", plain["before"], "| after:", plain["after"])
    for warning in plain["warnings"]:
        print("  warned:", warning)
    print("with PYTHON_GIL=0: GIL on after the import:", forced["after"], "| warnings:", len(forced["warnings"]))
    assert plain["after"] and not plain["before"] and not forced["after"]

# %% [markdown]
# So check `sys._is_gil_enabled()` after *all* your imports, not at start-up (`helpers.device` reads it live
# each time a section asks for `gil_disabled`). `PYTHON_GIL=0` keeps the GIL off at your own risk: the
# extension was not written for it. Triton's extension was one such case (triton-lang/triton#8491).
#
# ## What torch shares between threads
#
# Threads share a process, and with it torch's global random generator (the core lesson's pitfall) and every
# tensor they can reach (pitfall 2 below). The intra-op thread count is murkier: torch keeps one value for
# the process, while OpenMP (the CPU parallel backend of most builds; the last line below names this one's)
# keeps the effective setting per thread, so whether a worker thread's `torch.set_num_threads` reaches the
# other threads depends on what each of them has run before. The cell tries it in a fresh interpreter and in
# this kernel. Set the count once, on the main thread, before the loader's threads start, and never from a
# transform.

# %%
import subprocess

WORKER_SETS_THREADS = """
import threading, torch
torch.set_num_threads(1)
worker = threading.Thread(target=torch.set_num_threads, args=(2,))
worker.start(); worker.join()
main_sees = torch.get_num_threads()
torch.set_num_threads(1)
print(f"the main thread set 1, then a worker thread set 2: the main thread now reports {main_sees}")
"""
fresh = subprocess.run([sys.executable, "-c", WORKER_SETS_THREADS], capture_output=True, text=True, check=True)
print("in a fresh interpreter: ", fresh.stdout.strip())
print("in this kernel, after torch has run: ", end="")
exec(WORKER_SETS_THREADS)
print(torch.__config__.parallel_info().splitlines()[-1])

# %% [markdown]
# ## torchdata.nodes: a fixed cost per epoch
#
# In the core lesson `torchdata.nodes` threads looked slow on short epochs. Its worker threads poll their
# queues with a timeout (`QUEUE_TIMEOUT` in `torchdata/nodes/constants.py`), and starting a new epoch resets
# the mapper, which shuts the old threads down and joins them. So each epoch carries a fixed cost of up to
# about one timeout. This cell times epochs of four cheap items both ways.

# %%
if requires("torchdata", section="torchdata.nodes cost per epoch"):
    from torchdata.nodes import constants

    few = texts[:4]
    nodes = data.nodes_loader(data.tokenize, few, 2)
    epochs = bench.compare({"thread_map": lambda: data.count(data.thread_map(data.tokenize, few, workers=2)),
                            "torchdata threads": lambda: data.count(nodes)},
                           repeats=3, min_run_time=0.05, warmup=1, threads=1, device="cpu")
    per_epoch = {name: r["median_s"] for name, r in epochs["results"].items()}
    print(bench.table(epochs))
    print(f"one epoch of {len(few)} items, 2 threads: thread_map {per_epoch['thread_map'] * 1e3:.1f} ms, "
          f"torchdata {per_epoch['torchdata threads'] * 1e3:.1f} ms; QUEUE_TIMEOUT = {constants.QUEUE_TIMEOUT} s"
          + ("" if bench.separated(epochs, "thread_map", "torchdata threads") else f" (spreads overlap: {bench.NOISY})"))

# %% [markdown]
# On long epochs the cost disappears in the work; on a benchmark of short epochs it dominates. Reuse one
# `Loader` across epochs, as the core lesson does, and measure epochs of realistic length.
#
# ## Serial against one worker, on a busy machine
#
# In the core lesson's tables, compare serial with the 1-worker column. Both compute on one thread, so on an
# idle machine they match, apart from what handing items over costs. When the cores are busy with other
# programs, the operating system does not share them evenly between a long-running thread (the notebook's
# main thread, a persistent worker process) and freshly started worker threads, so serial and one worker can
# differ a lot, either way. Read each loader's curve against its own 1-worker point too, and re-run on an
# idle machine before you draw conclusions.
#
# ## Five more pitfalls, demonstrated
#
# ### 2. A transform that is not thread-safe
#
# A transform that writes into a buffer shared between calls (a module-level scratch tensor, a cached decoder
# object, an open file handle) is fine serially and in processes (each has its own copy) and breaks with
# threads: two threads write into the same memory. The GIL does not protect you, because the torch op releases
# it. How many items a run corrupts is up to the scheduler, zero included, so the cell runs it five times.
# Fix: allocate per call, or keep per-thread state in `threading.local()`; open per-thread resources inside
# the map function (pytorch/data#1470).

# %%
scratch = torch.empty(3, IMAGE_SIDE, IMAGE_SIDE)


def normalise_shared_buffer(x):
    torch.div(x, 255.0, out=scratch)          # every thread writes into the same tensor
    for _ in range(4):
        scratch.sub_(0.5).mul_(2.0)           # each op releases the GIL: another thread may write meanwhile
    return scratch.clone()


def normalise_own_buffer(x):
    y = x.div(255.0)                          # a new tensor per call
    for _ in range(4):
        y.sub_(0.5).mul_(2.0)
    return y


def differing(a, b):
    return sum(not torch.equal(x, y) for x, y in zip(a, b, strict=True))


items = (images * 4)[:48]
expected = data.serial_map(normalise_own_buffer, items)
racy = [differing(list(data.thread_map(normalise_shared_buffer, items, workers=4)), expected) for _ in range(5)]
safe = [differing(list(data.thread_map(normalise_own_buffer, items, workers=4)), expected) for _ in range(5)]
print(f"shared buffer, 4 threads: items of {len(items)} corrupted in each of 5 runs: {racy}")
print(f"own buffer,    4 threads: items of {len(items)} corrupted in each of 5 runs: {safe}")
assert not any(safe)

# %% [markdown]
# ### 3. Ordering and determinism
#
# Unordered delivery (`ordered=False` here, `in_order=False` in torchdata and in `DataLoader`) yields items as
# they finish: faster when item costs vary, but the order changes from run to run, and with it the batches.
# In `DataLoader` it also changes which worker gets which batch: with `in_order=False`, `_try_put_index`
# (`torch/utils/data/dataloader.py`) hands the next batch to any worker with spare capacity instead of the
# fixed rotation, so augmentation seeded per worker (`base_seed + worker_id`) is no longer reproducible; seed
# per item instead, as the core lesson does. Ordered delivery waits for the slowest item in flight.

# %% tags=["nbval-check-output"]
import time


def uneven(i):
    time.sleep(0.02 if i % 4 == 0 else 0.001)      # every 4th item is slow (sleep releases the GIL)
    return i


ordered = list(data.thread_map(uneven, range(12), workers=4))
unordered = list(data.thread_map(uneven, range(12), workers=4, ordered=False))
assert ordered == list(range(12)) and sorted(unordered) == ordered
print("ordered:               ", ordered)
print("unordered, same items: ", sorted(unordered) == ordered)

# %%
print("unordered, this run:   ", unordered)

# %% [markdown]
# ### 4. Back-pressure: how far ahead does the loader read?
#
# `ThreadPoolExecutor.map` submits **every** item before it returns the first result: a pool over a streamed
# dataset of a million images reads (and keeps) all of them. (Python 3.14 adds a `buffersize=` argument that
# bounds it.) A loader needs a bound: `thread_map`'s `prefetch`, torchdata's `max_concurrent`, `DataLoader`'s
# `prefetch_factor` (per worker). Here the input counts how many items were pulled when the first result
# arrives.

# %% tags=["nbval-check-output"]
from concurrent.futures import ThreadPoolExecutor


def counted(n, pulled):
    for i in range(n):
        pulled.append(i)
        yield i


pulled = []
with ThreadPoolExecutor(2) as pool:
    results_iter = pool.map(abs, counted(1000, pulled))
    next(results_iter)
    print(f"ThreadPoolExecutor.map: {len(pulled)} of 1000 items pulled before the first result")

pulled = []
it = data.thread_map(abs, counted(1000, pulled), workers=2, prefetch=4)
next(it)
print(f"thread_map(prefetch=4): {len(pulled)} of 1000 items pulled before the first result")
it.close()


# %% [markdown]
# ### 5. Errors and clean shutdown
#
# A worker thread that raises must not die silently or hang the consumer. `ThreadPoolExecutor.map` re-raises
# the original exception but says nothing about which item failed; `thread_map` re-raises it as
# `TransformError` with the item's index (the original is chained as `__cause__`). Leaving a loop early or an
# exception must not leave threads behind: count them. (If your own loop body may raise, wrap the loader in
# `contextlib.closing(...)`: the traceback keeps an abandoned iterator, and its threads, alive.)

# %% tags=["nbval-check-output"]
def parse(record):
    return int(record)


records = ["1", "2", "3", "oops", "5", "6"]
try:
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(parse, records))
except ValueError as exc:
    print("ThreadPoolExecutor.map:", type(exc).__name__, exc)

threads_before = {t.ident for t in threading.enumerate()}
try:
    for value in data.thread_map(parse, records, workers=2):
        pass
except data.TransformError as exc:
    print("thread_map:", exc, "| index:", exc.index, "| cause:", repr(exc.__cause__))
for value in data.thread_map(parse, map(str, range(10_000)), workers=3):
    if value == 5:
        break                                     # abandon the iterator halfway
new_threads = [t.name for t in threading.enumerate() if t.ident not in threads_before]
print("threads left running after an error and an early break:", new_threads)

# %% [markdown]
# ### 6. Process workers need picklable transforms
#
# With the `spawn` and `forkserver` start methods (`forkserver` is the default on Linux from Python 3.14;
# `spawn` on macOS and Windows), `DataLoader` pickles the dataset, transform included, into each worker. A
# lambda cannot be pickled at all: the parent fails before any worker starts. A function defined in the
# notebook pickles fine, by reference (`__main__.` and its name), and then fails in the worker, whose
# `__main__` is not the notebook: `AttributeError: Can't get attribute ...`. `fork` (the default on Linux up to
# 3.13) copies the parent and hides both. Keep transforms in a module (`helpers/data.py` here). The first
# cell shows both failures without starting torch workers; the second starts a `spawn` `DataLoader` with a lambda.

# %%
import pickle


def shout(text):                                  # defined in the notebook on purpose
    return text.upper()


by_reference = pickle.dumps(shout)
print(f"pickle.dumps(shout): {len(by_reference)} bytes, naming {shout.__module__}.{shout.__qualname__}")
child = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                       input=by_reference, capture_output=True)
print("unpickled in a fresh interpreter:", child.stderr.decode().strip().splitlines()[-1])
try:
    pickle.dumps(lambda text: text.upper())
except Exception as exc:                          # the real error text
    print(f"pickle.dumps(a lambda): {type(exc).__name__}: {exc}")

# %%
notebook_fn = lambda text: text.upper()          # noqa: E731, defined in the notebook on purpose
loader = torch.utils.data.DataLoader(data.MapDataset(texts[:2], notebook_fn), batch_size=None, num_workers=1,
                                     multiprocessing_context="spawn")
try:
    next(iter(loader))
except Exception as exc:                          # the real error text
    print(f"{type(exc).__name__}: {exc}")

# %% [markdown]
# ## Try it: workers against transform
#
# Pick a transform and a thread count, then press the button: the cell measures `thread_map` against serial
# on 8 items. (Widgets need a live kernel; a batch run only shows the controls.)

# %%
import ipywidgets as widgets

from helpers.interactive import interact

families = {"GIL-releasing: augment_image (torch ops)": (data.augment_image, images),
            "GIL-bound: tokenize (pure Python)": (data.tokenize, texts)}


def try_threads(family="GIL-releasing: augment_image (torch ops)", workers=2):
    fn, items = families[family]
    r = bench.compare({"serial": lambda: data.count(map(fn, items[:8])),
                       "threads": lambda: data.count(data.thread_map(fn, items[:8], workers=workers))},
                      repeats=3, min_run_time=0.02, warmup=1, threads=1, device="cpu")
    lo, hi = bench.speedup_range(r["results"], "serial", "threads")
    print(f"{family}, {workers} threads: {r['results']['threads']['ratio_to_baseline']:.2f}x serial "
          f"({lo:.2f}x to {hi:.2f}x over the repeats)"
          + ("" if bench.separated(r, "serial", "threads") else f"; {bench.NOISY}"))


interact(try_threads, manual=True, family=widgets.Dropdown(options=list(families)),
         workers=widgets.IntSlider(value=2, min=1, max=8));

# %% [markdown]
# ## What changes on other hardware and other Pythons
#
# - **More cores**: the GIL-releasing curves keep rising up to about the core count; the GIL-bound thread
#   curve stays flat on a GIL build whatever the core count. In containers count the CPUs the process may
#   use (`os.sched_getaffinity`, `os.process_cpu_count()` on 3.13+, the cgroup quota), not `os.cpu_count()`:
#   `helpers.device` does.
# - **Free-threaded builds**: the GIL-bound thread curve rises like the process curve, from a lower
#   single-thread start (the core lesson's side-by-side section). A single extension that does not declare
#   free-threading support re-enables the GIL for the whole process (above).
# - **What PyTorch measured** for thread workers in `DataLoader`
#   ([pytorch/pytorch#161044](https://github.com/pytorch/pytorch/pull/161044)): for data in memory, throughput
#   comparable to processes with 2-3x less memory; for files on local disk, threads about 30% slower than
#   processes on a GIL build and on par on 3.14t; for data streamed over the network with no local cache,
#   thread workers nearly half as fast as processes, because fetching, decoding and deserialising held the
#   GIL. The last case argues against threads on a GIL build.
# - **Python 3.14 on Linux** starts `multiprocessing` (and so `DataLoader` workers) with `forkserver` instead
#   of `fork`: each worker imports torch (the memory section) and the dataset is pickled (pitfall 6).
# - **After 2.10**: work on thread workers for `DataLoader` continued (pytorch/pytorch#161044, #172659).
#   Later releases, 2.13 for one, have `torch.thread_safe_generator()` and a `worker_method` field in
#   `WorkerInfo` (`torch/random.py`, `torch/utils/data/_utils/worker.py`), but their `DataLoader` still takes
#   no thread option and starts processes. 2.10 has neither.
# - **GPUs**: loading stays on the CPU; what matters is that the GPU never waits, so the loader must deliver
#   batches faster than a training step consumes them. `torch.compile` is not thread-safe: compile and warm
#   up on the main thread before starting worker threads (pytorch/pytorch#168042).
#
# ## What the 2.10 article gets wrong
#
# It says free-threaded builds enable "true parallel execution of Python threads, potentially revolutionizing
# data loading". In 2.10 the free-threaded builds are experimental, `DataLoader` has no thread workers, and
# threads only help where the GIL was the limit: on a GIL build, GIL-releasing work already scales with
# threads, and pure-Python work needs processes (the core lesson measures both).
