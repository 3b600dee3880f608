# %% [markdown]
# # 01 · Free-threaded data loading: threads, processes, and the GIL
#
# | | |
# |---|---|
# | **What you will learn** | how to tell whether your Python has a GIL right now; which transforms threads speed up on a GIL build (work that releases the GIL) and which only processes can (pure Python); what `DataLoader` worker processes pay per item, and what collating a batch in the worker saves; what a free-threaded build changes, measured side by side (or read from a recorded run); why thread loaders need a random generator per item |
# | **Prerequisites** | lesson 00; `torch.utils.data.DataLoader` and `Dataset` |
# | **Hardware** | any CPU; more cores show more scaling. The free-threaded sections need a free-threaded CPython (3.13t/3.14t, `environments/free-threaded.txt`, `make free-threaded`); elsewhere the lesson shows a recorded run of them |
# | **Time** | 45 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02); the 2.10 facts are checked against its source and release notes |
#
# PyTorch 2.10 supports Python 3.10-3.14 and ships experimental free-threaded builds (3.13t, 3.14t): a
# Python without the global interpreter lock (GIL). `DataLoader` did not change: its `num_workers` are still
# **processes**. Thread-based loading in 2.10 means `torchdata.nodes.ParallelMapper(method="thread")` or your
# own thread pool. This lesson measures both against processes, on a transform that holds the GIL and on
# one that releases it, and shows what taking the GIL away changes.

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
    os.environ["LABS_NOTEBOOK"] = "notebooks/01_free_threaded_data_loading.ipynb"   # this notebook, for the progress log
    os.chdir(os.path.join(clone, "notebooks"))

# %% tags=["parameters"]
QUICK = False          # quick mode: small sizes, for CI and a first look (papermill: -p QUICK True)
N_ITEMS = 64           # items per measured epoch
IMAGE_SIDE = 256       # input images are (3, IMAGE_SIDE, IMAGE_SIDE) uint8
TEXT_WORDS = 600       # words per document for the tokeniser
BATCH = 8              # batch size of the batched process loader

# %%
import sys
import sysconfig

import torch

from helpers import bench, data
from helpers.device import capabilities, pick_device, quick_mode, requires

QUICK = quick_mode(QUICK)
DEVICE = pick_device()          # data loading runs on the CPU whatever DEVICE is; it is shown for reference
caps = capabilities()
if QUICK:
    N_ITEMS, IMAGE_SIDE, TEXT_WORDS, BATCH = 12, 160, 250, 4
WORKER_COUNTS = data.worker_counts(caps.cpu_count, quick=QUICK)   # 1, 2, 4 and the usable cores (at most 8)
K = WORKER_COUNTS[-1]
torch.set_num_threads(1)        # as DataLoader workers do: parallelism comes from the loader's workers
print(f"torch {torch.__version__} · device: {DEVICE} · usable CPU cores: {caps.cpu_count} · "
      f"workers tried: {WORKER_COUNTS}")

# %% [markdown]
# ## Which Python is this?
#
# Two questions. Was this interpreter **built** free-threaded (`Py_GIL_DISABLED`, the `t` in `python3.14t`)?
# And is the GIL **off right now** (`sys._is_gil_enabled()`, Python 3.13+)? A free-threaded build turns the
# GIL back on when it imports a C extension not marked as safe without it (pytorch/pytorch#144361), so ask
# after all your imports.

# %%
built_free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
gil_on = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True     # the function exists from 3.13
print(f"Python {sys.version.split()[0]} · free-threaded build: {built_free_threaded} · GIL on now: {gil_on}")

# %% [markdown]
# ## Two kinds of transform
#
# - **GIL-bound**: `data.tokenize` lower-cases a document, splits it into words and hashes each word into a
#   vocabulary id, character by character in Python. Every step is bytecode, so the thread holds the GIL the
#   whole time. Real examples: tokenising, parsing JSON or CSV rows, augmentation written as Python loops.
# - **GIL-releasing**: `data.augment_image` crops, flips, blurs, resizes and normalises a uint8 image with
#   torch ops. A torch op releases the GIL while its kernel runs, so other threads run meanwhile. Real
#   examples: torch and numpy ops, image and audio decoding in C libraries.
#
# Both are plain functions in `helpers/data.py`, so worker processes can import them.

# %% tags=["nbval-check-output"]
texts = data.make_texts(N_ITEMS, words=TEXT_WORDS)
images = data.make_images(N_ITEMS, side=IMAGE_SIDE)
toks = data.tokenize("The GIL, the GIL, and free-threading!")
print("tokens:", toks)
assert toks[0] == toks[2] and toks[1] == toks[3] != toks[0], "the same word gets the same id"
out = data.augment_image(data.make_images(1, side=64)[0], torch.Generator().manual_seed(0), size=32)
print("augmented:", tuple(out.shape), out.dtype)
assert list(data.thread_map(data.tokenize, texts, workers=3)) == data.serial_map(data.tokenize, texts)
print("thread_map gives the serial result, in order")

# %% [markdown]
# ## Four ways to load an epoch
#
# Each candidate loads every item once, with *k* workers:
#
# - **threads**: `data.thread_map(fn, items, workers=k)`, a thread pool you can read in one screen: ordered,
#   at most `2 * k` items read ahead, worker threads joined when the loop ends.
# - **torchdata threads**: `torchdata.nodes.ParallelMapper(method="thread", num_workers=k)`, where
#   torchdata is installed.
# - **processes, per sample**: `DataLoader(num_workers=k, batch_size=None)`. Every item crosses the
#   process boundary on its own: a list of token ids is pickled through a pipe, a tensor is moved into its
#   own shared-memory block, which the main process then maps (`torch/multiprocessing/reductions.py`).
# - **processes, batched**: `DataLoader(num_workers=k, batch_size=BATCH)`, as real training loaders run.
#   The worker collates the batch into one tensor before sending it; `default_collate` even allocates the
#   stacked batch in shared memory when it runs in a worker (`torch/utils/data/_utils/collate.py`).
#
# Both `DataLoader`s keep their workers between epochs (`persistent_workers=True`), so start-up is not
# timed. Worker counts above the core count are on purpose: they show what oversubscription costs.
# Before you run the measurement, commit to three answers.

# %% tags=["predict"]
from helpers.interactive import predict, reveal

threads_guess = predict(f"On this Python, will {K} threads make the pure-Python tokenize faster than serial?",
                        options=["yes, clearly (1.3x or more)", "no: about serial speed, or slower"],
                        example="no: about serial speed, or slower")

# %% tags=["predict"]
augment_guess = predict(f"With {K} threads on {caps.cpu_count} cores, how many times faster than serial "
                        f"will the torch-op augment_image run?", unit="x", example=1.5)

# %% tags=["predict"]
batched_guess = predict(f"For tokenize with {K} worker processes, how many times faster will the batched "
                        f"loader (batches of {BATCH}) be than the per-sample one?", unit="x", example=1.5)

# %% [markdown]
# ## Measure
#
# `data.measure` times serial loading and the four loaders interleaved (`helpers.bench.compare`, median of
# repeats), one worker count at a time, with torch at one intra-op thread so that all parallelism comes from
# the workers. Each speed-up is against the serial run measured beside it; one marked ~ overlaps serial's
# spread over the repeats, a tie on this run.

# %%
WITH_TORCHDATA = requires("torchdata", section="torchdata.nodes thread loader")
families = {"GIL-bound: tokenize (pure Python)": (data.tokenize, texts),
            "GIL-releasing: augment_image (torch ops)": (data.augment_image, images)}
results = {}
for family, (fn, items) in families.items():
    results[family] = data.measure(fn, items, WORKER_COUNTS, batch_size=BATCH, repeats=3 if QUICK else 5,
                                   min_run_time=0.05 if QUICK else 0.2, torchdata=WITH_TORCHDATA)
    print(f"\n{family}: {len(items)} items per epoch")
    print(data.speedup_table(results[family]))
bench.save_json({"cpu_count": caps.cpu_count, "free_threaded": built_free_threaded, "gil_enabled": gil_on,
                 "families": results}, "runs/data_loading.json")

# %%
import plotly.graph_objects as go
from plotly.subplots import make_subplots

loaders = [name for name in data.LOADERS if WITH_TORCHDATA or not name.startswith("torchdata")]
colours = dict(zip(data.LOADERS, ["#d62728", "#1f77b4", "#17becf", "#2ca02c"]))
fig = make_subplots(rows=1, cols=2, subplot_titles=list(results))
for col, result in enumerate(results.values(), start=1):
    for name in loaders:
        y, (slowest, fastest) = data.items_per_s(result, name), data.items_per_s_range(result, name)
        fig.add_trace(go.Scatter(x=WORKER_COUNTS, y=y, mode="lines+markers", name=name, legendgroup=name,
                                 showlegend=col == 1, line=dict(color=colours[name]),
                                 error_y=dict(type="data", symmetric=False, array=[f - m for f, m in zip(fastest, y)],
                                              arrayminus=[m - s for s, m in zip(slowest, y)])), row=1, col=col)
    serial = sorted(data.items_per_s(result, "serial"))[len(WORKER_COUNTS) // 2]
    fig.add_hline(y=serial, line_dash="dash", annotation_text="serial", row=1, col=col)
    fig.add_vline(x=caps.cpu_count, line_dash="dot", annotation_text=f"{caps.cpu_count} cores", row=1, col=col)
fig.update_xaxes(title_text="workers", type="log", tickvals=WORKER_COUNTS)
fig.update_yaxes(title_text="items / s (higher is better)", rangemode="tozero", col=1)
fig.update_layout(height=420, title=f"Loading throughput (bars: slowest to fastest repeat) · "
                                   f"Python {sys.version.split()[0]}, GIL on: {gil_on}")
fig.show()

# %% tags=["reveal"]
tok, aug = (results[f] for f in families)
tok_threads = data.speedup(tok, "threads", K)
tok_processes = max(data.speedup(tok, name, K) for name in ("processes, per sample", "processes, batched"))
tok_lo, tok_hi = bench.speedup_range(tok["by_workers"][K]["results"], "serial", "threads")
reveal(threads_guess, "yes, clearly (1.3x or more)" if tok_threads >= 1.3 else "no: about serial speed, or slower",
       why=f"{K} threads ran tokenize at {tok_threads:.2f}x serial ({tok_lo:.2f}x to {tok_hi:.2f}x over the repeats) "
           f"with the GIL {'on' if gil_on else 'off'}. "
           + (f"That range straddles 1.3x, so which answer holds is {bench.NOISY}. " if tok_lo < 1.3 <= tok_hi else "")
           + ("With the GIL one thread at a time runs bytecode, so threads add no compute: what differs from 1x "
              "is switching cost and how the OS schedules a busy machine. " if gil_on else
              "Without a GIL the threads run bytecode in parallel. ")
           + f"The best process loader reached {tok_processes:.2f}x: separate interpreters run in parallel, "
           f"minus what sending the items back costs.")

# %% tags=["reveal"]
aug_threads = data.speedup(aug, "threads", K)
aug_lo, aug_hi = bench.speedup_range(aug["by_workers"][K]["results"], "serial", "threads")
reveal(augment_guess, aug_threads, tolerance=1.5,
       why=f"augment_image spends its time in torch kernels, which release the GIL, so {K} threads overlap: "
           f"{aug_threads:.2f}x serial here ({aug_lo:.2f}x to {aug_hi:.2f}x over the repeats), against a ceiling "
           f"of about {min(K, caps.cpu_count)}x ({caps.cpu_count} usable cores)."
           + (f" Serial's and the threads' spreads overlapped: {bench.NOISY}." if not
              bench.separated(aug["by_workers"][K], "serial", "threads") else
              " Above the ceiling means the serial run was slowed (other load on the machine, or one thread's "
              "caches): no loader beats the core count; run the measurement again." if aug_lo > 1.15 *
              min(K, caps.cpu_count) else ""))

# %% tags=["reveal"]
per_sample, batched = (data.items_per_s(tok, name)[-1] for name in ("processes, per sample", "processes, batched"))
n_batches = -(-len(texts) // BATCH)
batch_lo, batch_hi = bench.speedup_range(tok["by_workers"][K]["results"], "processes, per sample", "processes, batched")
reveal(batched_guess, batched / per_sample,
       why=f"per sample, each of the {len(texts)} token lists is pickled and sent on its own; batched, "
           f"{n_batches} tensors make the trip, and the workers pay for padding them. "
           + (f"The two spreads overlapped ({batch_lo:.2f}x to {batch_hi:.2f}x over the repeats): {bench.NOISY}."
              if not bench.separated(tok["by_workers"][K], "processes, per sample", "processes, batched") else
              "That saving won here." if batched > per_sample else
              f"Here it did not: {n_batches} batches for {K} workers split a short epoch into a few large "
              "pieces that finish unevenly. Raise N_ITEMS and run again."))

# %% [markdown]
# ## What the numbers mean
#
# - **Pure Python on threads**: with the GIL on, *k* threads take turns running bytecode, so they run at
#   about serial speed, often a little slower (switching costs). With the GIL off they run in parallel.
# - **Torch ops on threads**: most of the time is spent inside kernels that release the GIL, so threads
#   overlap and scale up to about the core count, without starting a process.
# - **Processes** have an interpreter and a GIL each, so they run either transform in parallel, but they
#   pay for every item that comes back, and the main process, busy receiving, is one more process on
#   the cores. On a machine with few cores that can cost more than the workers save.
# - **Per sample against batched**: batching pays where an item is cheap to compute but costly to send (a
#   token list, pickled), and matters little where computing it dominates (an augmented image).
# - **torchdata threads** pay a fixed cost each epoch (the deep dive measures it), so short epochs make
#   them look slow. And with *n* cores no loader beats about *n* times serial.

# %% [markdown]
# ## What the GIL decides, and the free-threaded build
#
# On a GIL build one thread at a time runs Python bytecode. A thread lets the GIL go while it waits or runs
# C code that releases it (a torch kernel, a file read), and otherwise every switch interval
# (`sys.getswitchinterval()`). That is the whole story of the curves above: threads help exactly where the
# work releases the GIL, and processes, each with its own GIL, pay to send items back.
#
# A free-threaded build (PEP 703) has no GIL: threads run bytecode in parallel. It is experimental in 3.13
# and officially supported, though not the default, from 3.14 (PEP 779). It costs single-thread speed: reference
# counts become atomic or per-thread (biased), and 3.13t runs without the specialising adaptive interpreter,
# which 3.14 turns back on for free-threaded builds (the "What's New" pages of Python 3.13 and 3.14). The next
# section runs only with the GIL off; the one after needs both builds, and elsewhere shows a recorded run.

# %%
if requires("free_threaded", "gil_disabled", section="Pure-Python scaling with threads"):
    cores = caps.cpu_count
    ft = bench.compare({"serial": lambda: data.count(map(data.tokenize, texts)),
                        f"threads x{cores}": lambda: data.count(data.thread_map(data.tokenize, texts, workers=cores))},
                       baseline="serial", repeats=3, threads=1, device="cpu")
    print(bench.table(ft))
    lo, hi = bench.speedup_range(ft["results"], "serial", f"threads x{cores}")
    print(f"pure Python on {cores} threads: {ft['results'][f'threads x{cores}']['ratio_to_baseline']:.2f}x serial "
          f"({lo:.2f}x to {hi:.2f}x over the repeats)"
          + ("" if bench.separated(ft, "serial", f"threads x{cores}") else f"; {bench.NOISY}"))

# %% [markdown]
# ## The GIL build and the free-threaded build, side by side
#
# Do threads on the free-threaded build beat one thread on the GIL build? When `LABS_OTHER_PYTHON` names
# the other build's Python (`make free-threaded` sets it), this cell tokenizes serially and on every core's
# thread in both builds, and once more in the free-threaded one with `PYTHON_GIL=1` (the GIL forced back
# on), and writes the record to `runs/free_threaded_side_by_side.json` (or `$LABS_SIDE_BY_SIDE_OUT`).
# Anywhere else it prints the recorded run shipped with the course, with where, when and on what it ran.

# %%
if requires("other_python", section="GIL build and free-threaded build side by side"):
    side = data.side_by_side(caps.other_python, n_texts=16 if QUICK else 64, workers=caps.cpu_count, quick=QUICK)
    print(f"MEASURED HERE: {data.provenance(side)}")
    print("\n".join(data.side_by_side_lines(side)))
    print("record written to", data.save_side_by_side(side))
elif (side := data.recorded_side_by_side()) is not None:
    print(f"RECORDED on {data.provenance(side)}; not measured here")
    print("\n".join(data.side_by_side_lines(side)))
else:
    print(f"No recorded run is shipped yet ({data.RECORDED_SIDE_BY_SIDE.name} is not in helpers/recorded/), "
          "so there is nothing to show here: run `make free-threaded` to measure it on this machine.")

# %% [markdown]
# Read the free-threaded row and the last two lines together. With the GIL off, threads can beat their own
# build's serial run (a speed-up above one on that row), but each thread is slower than on the GIL build; with
# few cores the two effects can cancel, and with the GIL forced back on, threads only take turns. On more cores
# the scaling term grows and wins. A free-threaded speed-up under one means the threads did not really run at
# once: on 2 shared cores that happens (on one idle 2-core virtual machine this course saw a speed-up above one
# in one process and below one in the next), so measure on more cores before you conclude.
#
# ## The pitfall that matters most: one random generator for all threads
#
# An augmentation that draws from the global generator (`torch.rand(...)` without `generator=`) shares one
# RNG state with every thread: which item gets which random numbers depends on the order in which threads
# happen to draw. `DataLoader` processes each have their own generator, seeded `base_seed + worker_id`
# (`torch/utils/data/_utils/worker.py`), and with `in_order=True` (the default) batches go to workers in a
# fixed rotation, so a seeded run repeats. (With `in_order=False`, `_try_put_index` in
# `torch/utils/data/dataloader.py` hands work to any worker with spare capacity, and that is lost too.)

# %% tags=["predict"]
rng_guess = predict("Seeded once with torch.manual_seed(0), will 4 threads give exactly the serial run's outputs?",
                    options=["yes, on every run", "not reliably"], example="not reliably")


# %%
def noisy_global_rng(x):
    y = torch.nn.functional.avg_pool2d(x.float().unsqueeze(0), 3, stride=1)[0]   # the GIL is released here
    return y + torch.rand(y.shape)                                                # the global generator


def differing(a, b):
    return sum(not torch.equal(x, y) for x, y in zip(a, b, strict=True))


small = images[:12]
torch.manual_seed(0)
reference = data.serial_map(noisy_global_rng, small)
runs = []
for _ in range(3):
    torch.manual_seed(0)
    runs.append(differing(list(data.thread_map(noisy_global_rng, small, workers=4)), reference))
print(f"items of {len(small)} that differ from the serial run, in each of 3 threaded runs: {runs}")

# %% tags=["reveal"]
reveal(rng_guess, "yes, on every run" if not any(runs) else "not reliably",
       why=f"the threads draw from one generator in whatever order the scheduler lets them ({runs} items "
           "differed); a run that matches is luck, not reproducibility. A seed per thread does not fix it: any "
           "thread may take any item.")


# %% [markdown]
# ## Your turn: a generator per item
#
# Make each item's random numbers a function of the item alone. In the cell below, replace `rng = None`
# with a generator seeded from the item's index (`torch.Generator().manual_seed(...)`). The check then asks
# that 4 threads give the serial outputs, and so does a serial run in reverse order.

# %% tags=["your-turn"]
def noisy(x, index):
    rng = None                          # your change: a torch.Generator seeded from `index`
    y = torch.nn.functional.avg_pool2d(x.float().unsqueeze(0), 3, stride=1)[0]
    return y + torch.rand(y.shape, generator=rng)


# %%
from helpers.checks import check_equal, your_turn


def per_item_randomness():
    serial = [noisy(x, i) for i, x in enumerate(small)]
    backwards = [noisy(x, i) for i, x in reversed(list(enumerate(small)))][::-1]
    hint = "an item's random numbers must depend on that item alone, not on which thread draws first or when"
    check_equal(differing(backwards, serial), 0, what="items that change when computed in reverse order", hint=hint)
    for _ in range(3):                  # a race can hide in one run; three runs rarely all get lucky
        threaded = list(data.thread_map(lambda pair: noisy(pair[1], pair[0]), enumerate(small), workers=4))
        check_equal(differing(threaded, serial), 0, what="items that differ between 4 threads and serial", hint=hint)
    same = noisy(small[0], 0) - noisy(small[0], 1)      # one image, two item indices
    check_equal(bool(same.abs().max() > 0), True, what="two items with different indices get different noise",
                hint="a seed that is the same for every item gives every item the same noise: use the index")


your_turn(per_item_randomness, what="a generator per item")

# %% [markdown]
# `thread_map(fn, items, seed=s)` does this for you: it calls `fn(item, rng)` with a generator seeded from
# `(s, index)` (`data.item_generator`), so each epoch can take a new `s` and still repeat exactly.
#
# ## Going further
#
# [The deep dive](01_free_threaded_data_loading_deep_dive.ipynb) has the rest of the topic, each part measured
# or demonstrated: memory of threads and of worker processes by start method (`fork`, `forkserver`,
# `spawn`), an extension that turns the GIL back on, what torch shares between threads, torchdata's cost per
# epoch, why serial and one worker differ on a busy machine, five more pitfalls of thread loading (shared
# buffers, ordering, read-ahead, errors and shutdown, pickling for process workers) and what changes on other
# hardware and Pythons. Read it before you move a real pipeline to threads or to a free-threaded Python.
# Then [lab 01](../labs/01_data_loading_lab.ipynb) has you make a slow loading pipeline thread-safe and faster.
