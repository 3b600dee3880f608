"""Lab 01 (data loading): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab01 import DEFAULT_READ_AHEAD_OK
from helpers.grading.specs.core import Case, Exercise, LabSpec


BLUR = (torch.outer(torch.tensor([1.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 1.0])) / 16).expand(3, 1, 3, 3)


def augment(image, rng):
    """Lab 01's reference augment (exercise 1)."""
    import torch.nn.functional as F
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    x = torch.mul(image, gain / 255.0)
    if flip:
        x = x.flip(-1)
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), BLUR, groups=3)[0]


def _ordered_map(fn, items, workers, prefetch=None, seed=0):
    """Lab 01's reference loader (exercise 2): fn(item, rng) on `workers` threads, results in input order,
    at most `prefetch` items (default: `workers + 1`) taken from `items` and not yet yielded."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from helpers.data import item_generator
    prefetch = workers + 1 if prefetch is None else prefetch
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = deque()
        for i, item in enumerate(items):
            pending.append(pool.submit(fn, item, item_generator(seed, i)))
            if len(pending) == prefetch:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _images(gen, n, h, w):
    return list(torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=gen).unbind(0))


def _augment_cases(gen):
    images, seed = _images(gen, 6, 24, 24), int(torch.randint(0, 1000, (), generator=gen))
    rng = ("draw every random number with generator=rng: the global RNG is one state shared by every thread, "
           "so which item gets which numbers would depend on the order the threads draw in")
    same = ("the same operations in the same order give the same bits: draw the flip, then the gain; scale by "
            "gain / 255 in one multiplication, as slow_augment does; flip the width; pad and blur as it does")
    race = ("a call that keeps a tensor between two of its steps where another call can reach it (a buffer "
            "cached in a dict, a default argument, an attribute) is overwritten by the other call: allocate "
            "every tensor inside the call")
    return [
        Case("draws only from rng, never from the global RNG", (images[:3], seed), call="global_rng_use",
             expected="draws only from rng", expect_value=True, hint=rng),
        Case("bit-for-bit equal to slow_augment seeded per item", (images, seed), call="not_bit_equal",
             expected="every item bit-for-bit equal", expect_value=True, hint=same),
        Case("writes into no module-level tensor", (images, seed), call="globals_written",
             expected="writes into no module-level tensor", expect_value=True,
             hint="allocate a new tensor in every call, never out=SCRATCH: threads share module-level tensors"),
        Case("another call run between any two of its steps changes nothing (the race, made to happen)",
             (images[:3], seed), call="changed_by_a_call_between", expected="no item changed",
             expect_value=True, hint=race),
        Case("a non-square image, another seed", (_images(gen, 2, 5, 9), seed + 1), call="not_bit_equal",
             expected="every item bit-for-bit equal", expect_value=True, hidden=True, hint=same),
        Case("the race, on other images", (_images(gen, 4, 8, 12), seed + 2), call="changed_by_a_call_between",
             expected="no item changed", expect_value=True, hidden=True, hint=race),
    ]


def _items(gen, n):
    return list(torch.rand(n, 2, generator=gen).unbind(0))


def _ordered_map_cases(gen):
    seed = int(torch.randint(1, 1000, (), generator=gen))
    items = _items(gen, 9)
    busy = ("fewer calls ran at once than `workers`: run the calls on `workers` threads, and take at least "
            "`workers` items from the input before you wait for the first result")
    too_many = ("more calls ran at once than `workers`: size the pool to `workers` threads (a "
                "ThreadPoolExecutor() without max_workers has up to 32)")
    seeded = "call fn(item, data.item_generator(seed, i)) for item i: a new generator per item, from seed and i"
    order = ("yield item i's result before item i+1's, even when a later item finishes first: keep the "
             "futures (or results) in the order you took the items, and wait for the oldest")
    stream = ("items may be a generator, readable once and of unknown length: take items one at a time as "
              "you go (iterate it), never len(), indexing or list(items)")
    bound = ("take a new item from the input only after you yielded one: Executor.map, list(items) or "
             "submitting everything first reads the whole input before the first result")
    default = ("a worker can only run an item that was read, and every item read ahead is held in memory: "
               "count what the workers have left to run while the training loop holds the result you yielded")
    return [
        Case("`workers` calls run at once", (12, 3, 3, seed), call="calls_at_once", expected="3 calls at once",
             expect_value=True, hint=busy),
        Case("never more than `workers` calls at once", (12, 2, 8, seed), call="calls_at_once",
             expected="2 calls at once", expect_value=True, hint=too_many),
        Case("item i is seeded with data.item_generator(seed, i)", (items[:1], 2, 2, seed), call="loader_results",
             hint=seeded),
        Case("results in input order when a later item finishes first", (items, 3, 4, seed),
             call="loader_results", hint=order),
        Case("items from a one-shot stream (a generator: no len())", (items, 2, 3, seed), {"stream": True},
             call="loader_results", hint=stream),
        Case("never more than `prefetch` items read ahead", (200, 2, 4, seed), call="read_ahead",
             expected="at most 4 items read ahead", expect_value=True, hint=bound, central=True),
        Case("prefetch=None: the read-ahead you derived", (40, 3, seed), call="default_read_ahead",
             expected=DEFAULT_READ_AHEAD_OK, expect_value=True, hint=default),
        Case("an empty input yields nothing", ([], 2, 2, seed), call="loader_results",
             hint="with no items there is nothing to wait for: finish without a result"),
        Case("more workers than items", (items[:2], 6, 6, seed), call="loader_results",
             hint="a pool larger than the input still yields every item once, in order"),
        Case("4 calls at once, another seed", (9, 4, 5, seed + 1), call="calls_at_once",
             expected="4 calls at once", expect_value=True, hidden=True, hint=busy),
        Case("never more than `workers` calls at once, 3 workers", (15, 3, 9, seed), call="calls_at_once",
             expected="3 calls at once", expect_value=True, hidden=True, hint=too_many),
        Case("a longer stream, another seed", (_items(gen, 17), 4, 6, seed + 1), {"stream": True},
             call="loader_results", hidden=True, hint=stream),
        Case("read-ahead bound 7 with 3 workers", (300, 3, 7, seed), call="read_ahead",
             expected="at most 7 items read ahead", expect_value=True, hidden=True, hint=bound, central=True),
        Case("prefetch=None with 5 workers", (50, 5, seed + 3), call="default_read_ahead",
             expected=DEFAULT_READ_AHEAD_OK, expect_value=True, hidden=True, hint=default),
        Case("one worker, prefetch 1", (items[:5], 1, 1, seed + 4), call="loader_results", hidden=True, hint=order),
    ]


SPEC = LabSpec("01_data_loading_lab", (
    Exercise("Exercise 1: augment", "augment", _augment_cases, augment),
    Exercise("Exercise 2: ordered_map", "ordered_map", _ordered_map_cases, _ordered_map,
             forbidden=("helpers.data.thread_map", "helpers.data.serial_map", "helpers.data.dataloader",
                        "helpers.data.nodes_loader"),
             refused="the helpers' loaders are lesson 01's answers to this question: start the threads yourself "
                     "and decide how far ahead of the consumer they may read"),
))
