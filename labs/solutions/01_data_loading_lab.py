# %% [markdown]
# # Lab 01 · Make a slow loading pipeline thread-safe and faster
#
# | | |
# |---|---|
# | **What you will learn** | to find and remove the shared state that breaks a transform on threads (a shared buffer, the global RNG); to seed per item so threaded results equal the serial ones exactly; to write an ordered, bounded thread pool (`ThreadPoolExecutor`) for the pipeline and measure the gain |
# | **Prerequisites** | lesson 01 (free-threaded data loading) |
# | **Hardware** | any CPU; the speed-up is measured, not checked, and shows only with 2 or more cores |
# | **Time** | 25 minutes |
# | **Verified with torch** | quick run and stored outputs pass on 2.10.0+cu128 (env cuda: CUDA 12.8 build, no GPU), 2.13.0+cpu (env minimal: CPU build) (make matrix, 2026-12-02) |
#
# Each exercise cell is followed by a check cell. A check prints `✅ ... passed`, or stops with `❌` and a
# hint saying what was wrong. `check(LAB, function)` runs the visible cases of the lab's grading spec
# (`helpers/runner/grading_specs.py`); `python -m helpers grade` runs the same cases plus hidden ones.

# %% tags=["parameters"]
QUICK = False      # quick mode: fewer, smaller images (papermill: -p QUICK True)
N_IMAGES = 48
SIDE = 224

# %%
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from helpers import bench, data
from helpers.device import capabilities, pick_device, quick_mode
from helpers.lab_checks import check

QUICK = quick_mode(QUICK)
DEVICE = pick_device()          # loading runs on the CPU; DEVICE is where a training step would run
if QUICK:
    N_IMAGES, SIDE = 16, 160
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
# Run it on 4 threads as it is and compare with the reference, twice. (`thread_map` is lesson 01's
# loader; the global RNG is seeded once, as a training script would.)

# %%
for attempt in range(2):
    torch.manual_seed(0)
    threaded = list(data.thread_map(slow_augment, images, workers=4))
    wrong = sum(not torch.equal(a, b) for a, b in zip(threaded, reference))
    print(f"attempt {attempt + 1}: {wrong} of {len(images)} items differ from the serial reference")


# %% [markdown]
# ## Exercise 1: a thread-safe `augment(image, rng)`
#
# Write `augment(image, rng)` that computes exactly what `slow_augment` computes, but
#
# - draws its random numbers from `rng` (a `torch.Generator`), in the same order: flip first, then gain;
# - writes into no shared buffer: every call allocates its own tensors.
#
# The check calls `augment(image, data.item_generator(seed, i))` for every item `i`: a generator seeded
# from `(seed, index)`, exactly as `slow_pipeline` seeds the global RNG per item. The outputs must be
# bit-for-bit equal to `slow_augment`'s serially, and stay equal on 4 threads over 3 runs; the check also
# fails if a call changes any tensor defined at the notebook's top level (like `SCRATCH`).

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
# The same threaded run as above, with `augment` (lesson 01's `thread_map` seeds item `i` with
# `data.item_generator(0, i)` when given `seed=0`):

# %%
for attempt in range(2):
    threaded = list(data.thread_map(augment, images, workers=4, seed=0))
    wrong = sum(not torch.equal(a, b) for a, b in zip(threaded, reference))
    print(f"attempt {attempt + 1}: {wrong} of {len(images)} items differ from the serial reference")


# %% [markdown]
# ## Exercise 2: a faster pipeline, on your own thread pool
#
# Write `fast_pipeline(images, workers, seed=0)` that returns the same list as
# `slow_pipeline(images, seed)`, computed with `augment` on a pool of threads that you build yourself
# with `concurrent.futures.ThreadPoolExecutor` (not `data.thread_map`: that is lesson 01's loader, the
# thing this exercise builds):
#
# - item `i` gets its own generator, `data.item_generator(seed, i)`, whichever thread runs it;
# - the results come back in input order (`pool.map`, or the futures in submission order), however the
#   threads finish;
# - at most `workers` calls of `augment` run at once (`max_workers=workers`), on more than one thread;
# - call `augment` by its name, at call time: the check counts how many calls run at once;
# - `workers` may exceed the number of images, and an empty list gives an empty list.
#
# The work is torch ops, which release the GIL, so threads speed it up even on a GIL build.

# %%
def fast_pipeline(images, workers, seed=0):
    ### BEGIN SOLUTION
    def one(i):
        return augment(images[i], data.item_generator(seed, i))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(images))))
    ### END SOLUTION


# %% tags=["nbval-check-output"]
check("01_data_loading_lab", fast_pipeline)

# %% [markdown]
# ## How much faster? (measured, not checked)
#
# `fast_pipeline` with one worker per core against `slow_pipeline`, interleaved in this process
# (`helpers.bench.compare`, median of 3 repeats). The ratio is a measurement of this machine, not a
# target: it cannot exceed the number of cores, other programs take their share, and on 1 core it
# stays near 1. The first line checks that the fast pipeline still gives the reference on this
# notebook's images.

# %%
fast = fast_pipeline(images, workers=CORES)
print("fast_pipeline equals the reference:", all(torch.equal(a, b) for a, b in zip(fast, reference)))
result = bench.compare({"slow_pipeline": lambda: slow_pipeline(images),
                        f"fast_pipeline, {CORES} threads": lambda: fast_pipeline(images, workers=CORES)},
                       baseline="slow_pipeline", repeats=3, device="cpu")
print(bench.table(result))
ratio = result["results"][f"fast_pipeline, {CORES} threads"]["ratio_to_baseline"]
print(f"measured: {ratio:.2f}x the serial pipeline's speed on {CORES} core(s)"
      + ("" if CORES >= 2 else " (1 core: threads cannot run in parallel here)"))

# %% [markdown]
# ## What you did
#
# - Shared state is the usual reason a transform breaks on threads. The GIL does not protect a tensor
#   buffer: torch ops release it while they compute.
# - Per-item seeds make augmentation reproducible whatever thread runs which item; per-thread seeds
#   would not, because a pool hands items to whichever thread is free.
# - On a free-threaded build (3.13t/3.14t, `environments/free-threaded.txt`), the same `fast_pipeline`
#   also speeds up pure-Python transforms; on a GIL build only processes (`DataLoader(num_workers=k)`)
#   do that.
