"""Lab 01 (data loading): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.harnesses.lab01 import DEFAULT_READ_AHEAD_OK, LOADER_OK, STREAMS_OK
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
    streaming = ("items stream: yield each result as soon as it is the oldest one done, and take a new item for "
                 "each one yielded, rather than waiting for a whole batch (the workers idle while the loop holds "
                 "its last result); let go of each result once it is yielded")
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
        Case("items stream: work left for the workers while a result is held", (60, 2, 4, seed), call="streams",
             expected=STREAMS_OK, expect_value=True, hint=streaming),
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
        Case("items stream with 3 workers, prefetch 7", (90, 3, 7, seed + 2), call="streams",
             expected=STREAMS_OK, expect_value=True, hidden=True, hint=streaming),
        Case("one worker, prefetch 1", (items[:5], 1, 1, seed + 4), call="loader_results", hidden=True, hint=order),
    ]


def _choose_loader(costs, items, cores):
    """Lab 01's reference decision (exercise 3): the fastest (kind, workers) in the cost model, and of those
    as fast, the one with the fewest workers."""
    from helpers.grading.harnesses.lab01 import LOADER_KINDS, loading_seconds
    choices = [(kind, workers) for workers in range(1, cores + 1) for kind in LOADER_KINDS]
    return min(choices, key=lambda c: (loading_seconds(costs, items, cores, *c), c[1]))


def _loader_cases(gen):
    gil = ("with the GIL on, one thread at a time runs Python: the pure-Python parts of all items run one "
           "after another, however many threads there are, while processes each run their own")
    released = ("torch ops release the GIL, so threads overlap them, and threads pay no start-up and no "
                "transfer: processes add both")
    gil_off = ("with the GIL off (a free-threaded build), threads run the Python part in parallel too: read "
               "costs['gil_on']")
    start = ("each process costs start_s before loading begins, one process after another: with few items "
             "the start-ups are not paid back")
    send = ("the main process receives every result from the processes, one at a time, send_s each, however "
            "many processes compute")
    whole = ("a worker runs whole items, one at a time: a worker with no item adds nothing, and of the choices "
             "that load as fast, the one with the fewest workers is wanted")
    beyond = ("at most `cores` items are computed at once: a worker beyond the cores adds no computing, and a "
              "process among them still costs its start-up")
    mixed = ("weigh every term of the model: what the GIL serialises on threads, the processes' start-ups and "
             "transfers, whole items on at most `cores` workers at once; the verdict says which way your "
             "choice is off")

    def costs(python_s, torch_s, send_s, start_s, gil_on=True):
        return {"python_s": python_s, "torch_s": torch_s, "send_s": send_s, "start_s": start_s, "gil_on": gil_on}

    def case(name, c, items, cores, hint, hidden=True):
        return Case(name, (c, items, cores), call="loader_verdict", expected=LOADER_OK, expect_value=True,
                    hidden=hidden, hint=hint)

    cases = [
        case("pure Python with the GIL on, 2000 items, 8 cores", costs(2e-3, 1e-4, 2e-4, 0.05), 2000, 8, gil,
             hidden=False),
        case("torch ops with the GIL on, 500 items, 4 cores", costs(5e-5, 2e-3, 5e-4, 0.05), 500, 4, released,
             hidden=False),
        case("pure Python with the GIL off (free-threaded), 1000 items, 8 cores",
             costs(2e-3, 1e-4, 1e-4, 0.02, gil_on=False), 1000, 8, gil_off, hidden=False),
        case("16 items, a slow process start (0.5 s)", costs(3e-3, 1e-3, 2e-4, 0.5), 16, 4, start, hidden=False),
        case("large results, slow to send", costs(1e-3, 3e-3, 2.5e-3, 0.02), 400, 8, send, hidden=False),
        case("3 items on 8 cores", costs(1e-4, 5e-3, 1e-3, 0.05), 3, 8, whole, hidden=False),
        case("pure Python, cheap processes, 2 cores", costs(1e-3, 0.0, 1e-5, 0.01), 1000, 2, beyond, hidden=False),
        case("one core", costs(2e-3, 1e-3, 1e-4, 0.01), 500, 1, whole),
        case("processes pay back their start-up only up to a point", costs(1e-3, 0.0, 1e-5, 0.2), 2000, 32,
             start),
        case("the GIL off, 5 items on 8 cores", costs(2e-3, 1e-3, 1e-4, 0.02, gil_on=False), 5, 8, whole),
        case("a forkserver start (1.5 s), 20000 items of pure Python", costs(1.5e-3, 2e-4, 1e-4, 1.5), 20000, 8,
             gil),
        case("as measured on a 2-core machine with fork", costs(1.6e-4, 2e-3, 1.1e-3, 0.065), 48, 2, released),
        case("large results, the GIL off", costs(1e-3, 1e-3, 3e-3, 0.01, gil_on=False), 300, 16, gil_off),
    ]
    for i in range(4):
        low = [float(torch.empty(()).uniform_(a, b, generator=gen)) for a, b in
               ((-5, -2), (-5, -2), (-5.5, -2.5), (-2.5, 0.3))]
        items = int(10 ** float(torch.empty(()).uniform_(0, 4.5, generator=gen)))
        cores = 2 ** int(torch.randint(0, 7, (), generator=gen))
        gil_on = bool(torch.randint(0, 2, (), generator=gen))
        cases.append(case(f"other costs {i + 1} ({items} items, {cores} core{'s' if cores > 1 else ''}, GIL "
                          f"{'on' if gil_on else 'off'})", costs(*(10 ** v for v in low), gil_on=gil_on), items,
                          cores, mixed))
    return cases


SPEC = LabSpec("01_data_loading_lab", (
    Exercise("Exercise 1: augment", "augment", _augment_cases, augment),
    Exercise("Exercise 2: ordered_map", "ordered_map", _ordered_map_cases, _ordered_map,
             forbidden=("helpers.data.thread_map", "helpers.data.serial_map", "helpers.data.dataloader",
                        "helpers.data.nodes_loader"),
             refused="the helpers' loaders are lesson 01's answers to this question: start the threads yourself "
                     "and decide how far ahead of the consumer they may read"),
    Exercise("Exercise 3: choose_loader", "choose_loader", _loader_cases, _choose_loader),
), allow_processes=True)    # the notebook measures and runs exercise 3's DataLoader worker processes
