# %% [markdown]
# # Lab 01 · Make a slow loading pipeline thread-safe and faster
#
# | | |
# |---|---|
# | **What you will learn** | to find and remove the shared state that breaks a transform on threads (a shared buffer, the global RNG); to seed per item so threaded results equal the serial ones bit for bit; to make a race show every time instead of sometimes; to write an ordered thread loader whose read-ahead you choose (not `Executor.map`, which reads everything) and measure the gain; to choose threads or processes, and how many, from costs measured on your machine, and to hold that choice against a real run |
# | **Prerequisites** | lesson 01 (free-threaded data loading) |
# | **Hardware** | any CPU; the speed-up is measured, not checked, and shows only with 2 or more cores |
# | **Time** | 60 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each exercise cell is followed by a check cell. A check prints `✅ ... passed`, or stops with `❌` and a
# hint saying what was wrong. `check(LAB, function)` runs the visible cases of the lab's grading spec
# (`helpers/grading/specs/lab01.py`); `python -m helpers grade` runs the same cases plus hidden ones.

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
    os.environ["LABS_NOTEBOOK"] = "labs/01_data_loading_lab.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "labs"))

# %% tags=["parameters"]
QUICK = False      # quick mode: fewer, smaller images (papermill: -p QUICK True)
N_IMAGES = 48
SIDE = 224
WORDS = 2000       # words of the text that comes with each image (exercise 3)

# %%
import copy
import math
import statistics
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from helpers import bench, data
from helpers.device import capabilities, gil_on, pick_device, quick_mode
from helpers.grading.checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()          # loading runs on the CPU; DEVICE is where a training step would run
if QUICK:
    N_IMAGES, SIDE, WORDS = 16, 160, 1000
torch.set_num_threads(1)        # one torch thread per loader worker, as DataLoader workers use
CORES = capabilities().cpu_count
images = data.make_images(N_IMAGES, side=SIDE)
print(f"{N_IMAGES} images of {SIDE}x{SIDE}, {CORES} CPU cores")

# %% [markdown]
# ## The pipeline you are given
#
# `slow_augment` flips an image at random, scales its brightness by a random gain, blurs it and returns
# a float tensor. It is correct serially, and it is what a loader would run on every item. It has two
# pieces of shared state: the global RNG (`torch.rand` without `generator=`) and a module-level scratch
# buffer that every call writes into.

# %%
BLUR = (torch.outer(torch.tensor([1.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 1.0])) / 16).expand(3, 1, 3, 3)
SCRATCH = torch.empty(3, SIDE, SIDE)


def slow_augment(image):
    flip = bool(torch.rand(()) < 0.5)                     # 1st draw: the global RNG
    gain = 0.8 + 0.4 * float(torch.rand(()))              # 2nd draw
    torch.mul(image, gain / 255.0, out=SCRATCH)           # the shared buffer
    x = SCRATCH.flip(-1) if flip else SCRATCH
    x = F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), BLUR, groups=3)[0]
    return x.clone()


def slow_pipeline(images, seed=0):
    """The serial reference: the global RNG re-seeded per item from (seed, index)."""
    out = []
    for i, image in enumerate(images):
        torch.manual_seed(data.item_seed(seed, i))
        out.append(slow_augment(image))
    return out


reference = slow_pipeline(images)
print("reference:", len(reference), "items of", tuple(reference[0].shape))


# %% [markdown]
# Run it on threads as it is. Each item seeds the global RNG for itself (`data.item_seed(0, i)`, as
# `slow_pipeline` does) inside the thread that runs it, so on one thread the results equal the reference,
# and any difference on 4 threads comes from the two calls in flight sharing state: between one call's
# seeding and its draws another call may draw, and between one call's write into `SCRATCH` and its blur
# another call may write there.

# %%
def slow_item(pair):
    i, image = pair
    torch.manual_seed(data.item_seed(0, i))
    return slow_augment(image)


for workers in (1, 4, 4, 4):
    threaded = list(data.thread_map(slow_item, enumerate(images), workers=workers))
    wrong = sum(not torch.equal(a, b) for a, b in zip(threaded, reference))
    print(f"{workers} thread(s): {wrong} of {len(images)} items differ from the serial reference")


# %% [markdown]
# On 4 threads the count changes from run to run, and can be zero: a race shows only when the scheduler
# happens to pause one call at the wrong moment. So the check of exercise 1 does not wait for luck. It
# makes the bad moment happen: it pauses a call after each of its torch operations in turn, runs a whole
# call on another item on another thread right there, and then lets the first call finish
# (`helpers.grading.harnesses.lab01.changed_by_a_call_between`). A call that shares nothing with other calls gives the
# same result every time; a call that keeps a tensor where another call can reach it does not.
#
# ## Exercise 1: a thread-safe `augment(image, rng)`
#
# Write `augment(image, rng)` that computes exactly what `slow_augment` computes, but
#
# - draws its random numbers only from `rng` (a `torch.Generator`), in the same order: flip first, then
#   gain; never from the global RNG;
# - writes into no shared buffer: not `SCRATCH`, and no tensor kept between calls anywhere else (a dict, a
#   default argument, an attribute);
# - is bit-for-bit equal to `slow_augment` when `rng` is `data.item_generator(seed, i)` and slow_augment's
#   global RNG is seeded with `data.item_seed(seed, i)`: the same operations in the same order.
#
# The check tests each of these: the first by watching the global RNG, the second by watching every
# module-level tensor and then by making the race happen as described above, the third against
# `slow_augment` run beside your function.

# %%
def augment(image, rng):
    ### BEGIN SOLUTION
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    x = torch.mul(image, gain / 255.0)
    if flip:
        x = x.flip(-1)
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), BLUR, groups=3)[0]
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("01_data_loading_lab", augment)

# %% [markdown]
# The threaded run above, with `augment` (lesson 01's `thread_map` calls `augment(image, rng)` with
# `rng = data.item_generator(0, i)` when given `seed=0`):

# %%
for attempt in range(3):
    threaded = list(data.thread_map(augment, images, workers=4, seed=0))
    wrong = sum(not torch.equal(a, b) for a, b in zip(threaded, reference))
    print(f"attempt {attempt + 1}: {wrong} of {len(images)} items differ from the serial reference")


# %% [markdown]
# ## Exercise 2: an ordered loader with bounded read-ahead
#
# Lesson 01's deep dive (pitfall 4) showed that `ThreadPoolExecutor.map` takes **every** item of its input
# before it returns the first result: over a stream of a million images it reads, and keeps, all of them.
# A loader must read ahead of the training loop, but only so far. Write the loader:
# `ordered_map(fn, items, workers, prefetch=None, seed=0)`, a generator that yields
# `fn(item, data.item_generator(seed, i))` for item `i` of `items`, computed on threads you start
# yourself (`concurrent.futures.ThreadPoolExecutor` or `threading`; not `data.thread_map`: that is lesson
# 01's loader, the thing you build here), such that
#
# - the results come out in input order, even when a later item finishes first;
# - `items` may be any iterable that can be read only once, a generator of unknown length (even an endless
#   one): take items one at a time as you go, never `len(items)`, indexing or `list(items)`;
# - at no moment are more than `prefetch` items taken from `items` and not yet yielded;
# - items stream: while the training loop holds a result and `items` has more, the workers have an item left
#   to run, and a result is not kept by the loader once it is yielded;
# - when there is enough work, `workers` calls of `fn` run at once, and never more;
# - an empty input yields nothing, and `workers` may exceed the number of items.
#
# **Your decision: what `prefetch=None` means.** Every item read ahead is held in memory until it is
# yielded, and a worker can only run an item that was read. The consumer is a training loop: it holds each
# result you yield for a whole step before it asks for the next, and items do not all cost the same.
# Choose the default: no worker may sit idle for lack of an item while the loop holds a result, and no
# more than `2 * workers` items may be held (DataLoader's default `prefetch_factor=2` per worker holds as
# many). Write in a comment why your number keeps the workers busy and why one item less would not. The
# check watches the loader as a training loop would: it counts what the workers can run while it holds each
# result, and the most items held; a measurement below the check shows what the choice costs in time.

# %%
def ordered_map(fn, items, workers, prefetch=None, seed=0):
    ### BEGIN SOLUTION
    from collections import deque

    # workers + 1: when the oldest result is yielded, `workers` items stay in flight, one per thread, for
    # as long as the training loop holds that result; with `workers` only, one thread idles through every
    # step. Up to 2 * workers also lets a slow item finish while the others run ahead, for more memory.
    prefetch = workers + 1 if prefetch is None else prefetch
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = deque()                       # futures in input order
        for i, item in enumerate(items):        # one item at a time: a stream is read as it goes
            pending.append(pool.submit(fn, item, data.item_generator(seed, i)))
            if len(pending) == prefetch:        # full: hand out the oldest before taking another item
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("01_data_loading_lab", ordered_map)


# %% [markdown]
# How far each loader reads ahead of its consumer: the input below counts the items taken from it when
# the first result arrives, out of a stream of 1000.

# %%
def counted(n, pulled):
    for i in range(n):
        pulled.append(i)
        yield images[i % len(images)]


pulled = []
pool = ThreadPoolExecutor(4)
next(pool.map(lambda image: augment(image, data.item_generator(0, 0)), counted(1000, pulled)))
pool.shutdown(cancel_futures=True)      # the items it took are queued: drop them
print(f"ThreadPoolExecutor.map, 4 threads:  {len(pulled)} of 1000 items taken before the first result")
pulled = []
loader = ordered_map(augment, counted(1000, pulled), workers=4)
next(loader)
loader.close()
print(f"ordered_map, 4 threads (default):   {len(pulled)} of 1000 items taken before the first result")


# %% [markdown]
# What the read-ahead costs in time, with a consumer that takes a step per result and items of uneven cost
# (every fourth takes six times as long): the same 48 items through your `ordered_map` at three read-aheads,
# with 4 workers; each runs three times, interleaved, and its line gives the median and the range.

# %%
def uneven_item(i, rng):
    time.sleep(0.024 if i % 4 == 0 else 0.004)
    return i


def epoch_seconds(prefetch, workers=4, step_s=0.002):
    start = time.perf_counter()
    for _ in ordered_map(uneven_item, iter(range(48)), workers, prefetch=prefetch):
        time.sleep(step_s)                  # the training step holds the result
    return time.perf_counter() - start


READ_AHEADS = {"workers": 4, "workers + 1": 5, "2 * workers": 8}
epochs = {ahead: [] for ahead in READ_AHEADS.values()}
for _ in range(3):                          # interleaved: a busy moment costs each read-ahead alike
    for ahead, times in epochs.items():
        times.append(epoch_seconds(ahead))
for label, ahead in READ_AHEADS.items():
    low, mid, high = sorted(epochs[ahead])
    print(f"prefetch = {label:<12} ({ahead}): {mid:.2f} s (range {low:.2f}-{high:.2f} over 3 runs)")
print("every item at once, no step: "
      f"{sum(0.024 if i % 4 == 0 else 0.004 for i in range(48)) / 4:.2f} s of work per worker")


# %% [markdown]
# ## How much faster? (measured, not checked)
#
# `fast_pipeline` runs `augment` through your `ordered_map` with one worker per core; it is compared with
# `slow_pipeline`, interleaved in this process (`helpers.bench.compare`, median of 3 repeats). The ratio
# is a measurement of this machine, not a target: it cannot exceed the number of cores, other programs
# take their share, and on 1 core it stays near 1. The first line checks that the fast pipeline still
# gives the reference, bit for bit, on this notebook's images.

# %%
def fast_pipeline(images, workers, seed=0):
    return list(ordered_map(augment, images, workers, seed=seed))


fast = fast_pipeline(images, workers=CORES)
print("fast_pipeline equals the reference:", all(torch.equal(a, b) for a, b in zip(fast, reference)))
result = bench.compare({"slow_pipeline": lambda: slow_pipeline(images),
                        f"fast_pipeline, {CORES} threads": lambda: fast_pipeline(images, workers=CORES)},
                       baseline="slow_pipeline", repeats=3, device="cpu")
print(bench.table(result))
ratio = result["results"][f"fast_pipeline, {CORES} threads"]["ratio_to_baseline"]
print(f"measured: {ratio:.2f}x the serial pipeline's speed on {CORES} core(s)"
      + ("" if CORES >= 2 else " (1 core: threads cannot run in parallel here)")
      + ("" if bench.separated(result, "slow_pipeline", f"fast_pipeline, {CORES} threads") else f"; {bench.NOISY}"))

# %% [markdown]
# ## Exercise 3: threads or processes, and how many
#
# Exercise 2's loader runs threads, and lesson 01 measured where threads win and where only processes do. A
# real loading job has both kinds of work. Here each item is an image with the text that comes with it
# (`data.tokenize_and_augment`): tokenizing the text is pure Python, so it holds the GIL; augmenting the
# image is torch ops, which release the GIL while they compute. Whether threads or processes load such items
# faster, and how many of them, depends on what each part costs on this machine. The cell below measures the
# five numbers that decide it:
#
# - `python_s`: seconds per item in the pure-Python part (`data.tokenize`);
# - `torch_s`: seconds per item in the torch part (`data.augment_image`, one torch thread, as a loader's
#   workers run it);
# - `send_s`: seconds per item that handing a result back from a worker process adds: one `DataLoader`
#   worker hands back ready results (each tensor goes through shared memory, and the main process receives
#   the results one at a time), less the copy it makes of each;
# - `start_s`: seconds to start one `DataLoader` worker process, before its first item, by this Python's
#   start method (`fork`, `spawn`, or `forkserver`, Linux's default from Python 3.14);
# - `gil_on`: whether the GIL is on in this process now (`helpers.device.gil_on()`); it is off only on a
#   free-threaded build that runs without it.

# %%
texts = data.make_texts(N_IMAGES, words=WORDS)
jobs = [(i, text, image) for i, (text, image) in enumerate(zip(texts, images))]


def median_seconds(run, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def process_loader(fn, items, workers, **options):
    """DataLoader worker processes that hand back fn(item) one item at a time (batch_size=None)."""
    return torch.utils.data.DataLoader(data.MapDataset(items, fn), batch_size=None, num_workers=workers, **options)


python_s = median_seconds(lambda: [data.tokenize(text) for text in texts]) / N_IMAGES
torch_s = median_seconds(lambda: [data.augment_image(image, data.item_generator(0, i))
                                  for i, image in enumerate(images)]) / N_IMAGES
ready = [data.tokenize_and_augment(job) for job in jobs]
handing_back = process_loader(copy.deepcopy, ready, 1, persistent_workers=True)   # a fresh copy of each result
data.count(handing_back)                                   # started here, so the epochs timed below pay no start
send_s = max(median_seconds(lambda: data.count(handing_back))
             - median_seconds(lambda: [copy.deepcopy(result) for result in ready]), 0.0) / N_IMAGES
data.shutdown([handing_back])
first_item = median_seconds(lambda: data.count(process_loader(data.tokenize_and_augment, jobs[:1], 1)))
start_s = max(first_item - (python_s + torch_s + send_s), 0.0)
COSTS = {"python_s": python_s, "torch_s": torch_s, "send_s": send_s, "start_s": start_s, "gil_on": gil_on()}
print(f"python_s {python_s * 1e3:.2f} ms · torch_s {torch_s * 1e3:.2f} ms · send_s {send_s * 1e3:.2f} ms · "
      f"start_s {start_s * 1e3:.0f} ms ({torch.multiprocessing.get_start_method()}) · gil_on {COSTS['gil_on']}")


# %% [markdown]
# **The cost model.** In this exercise, loading `items` items with `workers` workers on `cores` cores takes:
#
# - computing: a worker runs whole items, one at a time, and at most `cores` workers compute at once; an
#   item costs `python_s + torch_s`;
# - threads share one interpreter. With the GIL on, one thread at a time runs Python, so the pure-Python
#   parts of all the items run one after another, whichever threads run them; torch ops release the GIL and
#   overlap. With the GIL off, nothing is serialised. Threads cost nothing to start, and hand their results
#   over in memory at no cost;
# - processes each have their own interpreter and GIL. The main process starts them one after another
#   before loading begins (`start_s` each), then receives every result, one at a time (`send_s` each), while
#   the processes compute;
# - work that overlaps takes as long as its longest part; work that waits for other work adds to it.
#
# **Your decision.** Write `choose_loader(costs, items, cores)`: the fastest way to load `items` items under
# this model, as a tuple `("threads", workers)` or `("processes", workers)`, `workers` a Python int of at
# least 1. Where several choices load as fast, take the one with the fewest workers: a worker that makes
# loading no faster only holds memory (a thread its stack and its items, a process a whole interpreter).
# The check holds your choice against the fastest, within 2%, on costs, item counts and core counts of its
# own, with the GIL on and off; the cell after it runs your choice and the others on this machine.

# %%
def choose_loader(costs, items, cores):
    ### BEGIN SOLUTION
    item = costs["python_s"] + costs["torch_s"]

    def seconds(kind, workers):
        computing = math.ceil(items / min(workers, cores)) * item   # whole items, at most `cores` at once
        if kind == "threads":            # one interpreter: with the GIL on, its Python runs one item at a time
            return max(computing, items * costs["python_s"] if costs["gil_on"] else 0.0)
        return workers * costs["start_s"] + max(computing, items * costs["send_s"])   # started, then received

    choices = [(kind, workers) for workers in range(1, cores + 1) for kind in ("threads", "processes")]
    return min(choices, key=lambda choice: (seconds(*choice), choice[1]))   # ties: the fewest workers
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("01_data_loading_lab", choose_loader)

# %% [markdown]
# Your choice on this machine: this notebook's items loaded by your choice and by threads and processes of
# other counts (`data.thread_map`; a `DataLoader` started for each epoch, so its start-up counts, as in the
# model), median of 3 epochs each, beside what the model says each costs. The last lines ask your function
# about other jobs with the same costs.

# %%
from helpers.grading.harnesses.lab01 import loading_seconds

kind, workers = choose_loader(COSTS, N_IMAGES, CORES)
chosen = f"{kind} x{workers}"
candidates, modelled = {}, {}
for k in sorted({1, min(2, CORES), min(4, CORES), workers}):
    candidates[f"threads x{k}"] = lambda k=k: data.count(data.thread_map(data.tokenize_and_augment, jobs, workers=k))
    candidates[f"processes x{k}"] = lambda k=k: data.count(process_loader(data.tokenize_and_augment, jobs, k))
    for name in (f"threads x{k}", f"processes x{k}"):
        modelled[name] = loading_seconds(COSTS, N_IMAGES, CORES, name.split(" x")[0], k)
with warnings.catch_warnings():      # more workers than cores is one of the choices measured
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    r = bench.compare(candidates, baseline=chosen, repeats=3, min_run_time=0.01, warmup=0, threads=1, device="cpu")
measured = {name: r["results"][name]["median_s"] for name in candidates}
print(f"{N_IMAGES} items on {CORES} cores{'':<8}{'modelled':>10}{'measured':>11}{'spread':>20}")
for name in candidates:
    low, high = r["results"][name]["min_s"], r["results"][name]["max_s"]
    print(f"{name:<28}{modelled[name] * 1e3:>7.1f} ms{measured[name] * 1e3:>8.1f} ms"
          f"{f'{low * 1e3:.1f} - {high * 1e3:.1f} ms':>20}" + ("   <- your choice" if name == chosen else ""))
fastest = min(measured, key=measured.get)
if fastest == chosen:
    print(f"\nyour choice, {chosen}, was the fastest measured")
elif not bench.separated(r, fastest, chosen):
    print(f"\nyour choice, {chosen}, and the fastest measured, {fastest}, overlap over the repeats: a tie within "
          f"noise here")
else:
    print(f"\nthe fastest measured was {fastest}, not your {chosen}: the model and this machine disagree")
off = {k: statistics.median(measured[n] / modelled[n] for n in candidates if n.startswith(k))
       for k in ("threads", "processes")}
print(f"measured / modelled, median: {off['threads']:.2f}x for threads, {off['processes']:.2f}x for processes")
if off["threads"] > 1.1 and off["threads"] >= off["processes"]:
    print("the model undercharges threads most: it lets them overlap perfectly, but every torch op releases the GIL "
          "and takes it back, so each op is a hand-over where a thread may wait for another")
elif off["processes"] > 1.1:
    print("the model undercharges processes most: it charges start_s and send_s as measured with one worker; with "
          "several, their start-ups and the main process's receiving take turns on the cores with the workers")
if off["processes"] < 0.9:
    print("the model overcharges processes: it counts their start-ups one after another, whole, but once the main "
          "process has started a worker, that worker's own set-up runs beside the next one's start")
if all(0.9 <= ratio <= 1.1 for ratio in off.values()):
    print("the model holds here, within 10% for both: on this machine, with these costs, what it leaves out "
          "weighs little")
for items, cores, gil in dict.fromkeys(((10_000, CORES, COSTS["gil_on"]), (10_000, 16, True), (10_000, 16, False))):
    print(f"your choice for {items} items on {cores} cores, GIL {'on' if gil else 'off'}: "
          f"{choose_loader({**COSTS, 'gil_on': gil}, items, cores)}")

# %% [markdown]
# ## What you did
#
# - Shared state is the usual reason a transform breaks on threads. The GIL does not protect a tensor
#   buffer: torch ops release it while they compute. A race that shows on some runs only is found by making
#   the bad interleaving happen, not by running more often.
# - Per-item seeds make augmentation reproducible whatever thread runs which item; per-thread seeds
#   would not, because a pool hands items to whichever thread is free.
# - A loader's read-ahead is a decision: enough items in flight to keep every worker busy while the
#   training loop holds a result (`workers + 1`; more absorbs uneven items), no more held in memory. `Executor.map` makes no such decision; `thread_map`'s `prefetch`, torchdata's `max_concurrent`
#   and `DataLoader`'s `prefetch_factor` do.
# - Threads or processes, and how many, is a decision made from measured costs: what holds the GIL, what a
#   process costs to start and each result to send back, how many items and cores. A model of those costs
#   chooses; a real run shows what the model leaves out.
# - On a free-threaded build (3.13t/3.14t, `environments/free-threaded.txt`), the same `ordered_map`
#   also speeds up pure-Python transforms; on a GIL build only processes (`DataLoader(num_workers=k)`)
#   do that.
