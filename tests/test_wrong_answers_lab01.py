"""Lab 01 (data loading): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from helpers.data import item_generator
from helpers.grading.specs import lab01 as spec01
from wrong_answers import FORBIDDEN_HINT, L01, Wrong, lab_tests


BLUR = spec01.BLUR


SCRATCH = torch.empty(3, 24, 24)


_BUFFERS: dict = {}


def _blur(x):
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), BLUR, groups=3)[0]


def augment_global_rng(image, rng):
    # draws from the global RNG: shared by every thread
    flip = bool(torch.rand(()) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand(()))
    x = torch.mul(image, gain / 255.0)
    return _blur(x.flip(-1) if flip else x)


def augment_gain_first(image, rng):
    # draws the gain before the flip: other numbers than slow_augment's
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    flip = bool(torch.rand((), generator=rng) < 0.5)
    x = torch.mul(image, gain / 255.0)
    return _blur(x.flip(-1) if flip else x)


def augment_scratch(image, rng):
    # "do nothing clever": slow_augment with generator=rng, its module-level buffer kept
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    torch.mul(image, gain / 255.0, out=SCRATCH)
    return _blur(SCRATCH.flip(-1) if flip else SCRATCH).clone()


def augment_cached_buffer(image, rng):
    # a buffer per shape, cached in a module-level dict: no module-level tensor changes, yet every call
    # shares it (the racy code whose thread check once passed in the notebook and failed in the grader)
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    buffer = _BUFFERS.setdefault(tuple(image.shape), torch.empty(image.shape))
    torch.mul(image, gain / 255.0, out=buffer)
    return _blur(buffer.flip(-1) if flip else buffer)


def augment_divide_after(image, rng):
    # multiplies by gain, then divides by 255: within 1e-6 of slow_augment, never bit-for-bit (review m12)
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    x = image.float() * gain / 255.0
    return _blur(x.flip(-1) if flip else x)


def augment_flip_height(image, rng):
    # flips the height (dim -2), not the width
    flip = bool(torch.rand((), generator=rng) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand((), generator=rng))
    x = torch.mul(image, gain / 255.0)
    return _blur(x.flip(-2) if flip else x)


_LOCAL = __import__("threading").local()


def augment_thread_local_buffer(image, rng):
    # a second, differently written right answer: a scratch buffer per thread (threading.local), shared by no
    # other thread; torch.flip and a separate pad
    flip = torch.rand((), generator=rng).item() < 0.5
    gain = 0.8 + 0.4 * torch.rand((), generator=rng).item()
    if getattr(_LOCAL, "buffer", None) is None or _LOCAL.buffer.shape != image.shape:
        _LOCAL.buffer = torch.empty(image.shape)
    x = torch.mul(image, gain / 255.0, out=_LOCAL.buffer)
    if flip:
        x = torch.flip(x, dims=(2,))
    padded = F.pad(x[None], [1, 1, 1, 1], mode="replicate")
    return F.conv2d(padded, BLUR, groups=3).squeeze(0)


def ordered_map_serial(fn, items, workers, prefetch=None, seed=0):
    # "do nothing clever": no threads at all
    for i, item in enumerate(items):
        yield fn(item, item_generator(seed, i))


def ordered_map_executor_map(fn, items, workers, prefetch=None, seed=0):
    # the one-liner lesson 01 warns against: Executor.map takes every item before the first result
    with ThreadPoolExecutor(workers) as pool:
        yield from pool.map(lambda pair: fn(pair[1], item_generator(seed, pair[0])), enumerate(items))


def ordered_map_as_completed(fn, items, workers, prefetch=None, seed=0):
    # bounded, but yields results as they finish, not in input order
    from concurrent.futures import FIRST_COMPLETED, wait
    prefetch = prefetch or workers
    with ThreadPoolExecutor(workers) as pool:
        pending = set()
        for i, item in enumerate(items):
            pending.add(pool.submit(fn, item, item_generator(seed, i)))
            if len(pending) == prefetch:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        for f in __import__("concurrent.futures").futures.as_completed(pending):
            yield f.result()


def ordered_map_default_pool(fn, items, workers, prefetch=None, seed=0):
    # bounded and ordered, but on a pool of the default size, not `workers`
    from collections import deque
    prefetch = prefetch or workers
    with ThreadPoolExecutor() as pool:
        pending = deque()
        for i, item in enumerate(items):
            pending.append(pool.submit(fn, item, item_generator(seed, i)))
            if len(pending) == prefetch:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def ordered_map_by_index(fn, items, workers, prefetch=None, seed=0):
    # indexes the input (range(len(items))): fails on a stream
    from collections import deque
    prefetch = prefetch or workers
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        for i in range(len(items)):
            pending.append(pool.submit(fn, items[i], item_generator(seed, i)))
            if len(pending) == prefetch:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def ordered_map_refill_first(fn, items, workers, prefetch=None, seed=0):
    # takes the next item before it yields the oldest result: one item more than prefetch in flight
    from collections import deque
    prefetch = prefetch or workers
    source = enumerate(items)
    with ThreadPoolExecutor(workers) as pool:
        pending = deque(pool.submit(fn, item, item_generator(seed, i)) for i, item in
                        __import__("itertools").islice(source, prefetch))
        while pending:
            oldest = pending.popleft()
            nxt = next(source, None)
            if nxt is not None:
                pending.append(pool.submit(fn, nxt[1], item_generator(seed, nxt[0])))
            yield oldest.result()


def ordered_map_twice_workers(fn, items, workers, prefetch=None, seed=0):
    # a right answer: thread_map's and DataLoader's default (2 * workers), the most the exercise allows
    yield from spec01._ordered_map(fn, items, workers, 2 * workers if prefetch is None else prefetch, seed)


def ordered_map_workers_ahead(fn, items, workers, prefetch=None, seed=0):
    # `workers` items in flight: one thread idles while the training loop holds each result
    yield from spec01._ordered_map(fn, items, workers, workers if prefetch is None else prefetch, seed)


def ordered_map_four_times_workers(fn, items, workers, prefetch=None, seed=0):
    # every worker busy, but four times as many items held in memory
    yield from spec01._ordered_map(fn, items, workers, 4 * workers if prefetch is None else prefetch, seed)


def ordered_map_one_ahead(fn, items, workers, prefetch=None, seed=0):
    # prefetch=None read as "one item ahead": every other worker idles
    yield from spec01._ordered_map(fn, items, workers, 1 if prefetch is None else prefetch, seed)


def ordered_map_keeps_futures(fn, items, workers, prefetch=None, seed=0):
    # bounded read-ahead, but every future handed out is kept in a list: each result stays in memory
    from collections import deque
    prefetch = workers + 1 if prefetch is None else prefetch
    handed_out = []
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        for i, item in enumerate(items):
            pending.append(pool.submit(fn, item, item_generator(seed, i)))
            if len(pending) == prefetch:
                handed_out.append(pending.popleft())
                yield handed_out[-1].result()
        while pending:
            handed_out.append(pending.popleft())
            yield handed_out[-1].result()


def ordered_map_whole_batches(fn, items, workers, prefetch=None, seed=0):
    # bounded and ordered, but waits for a whole batch of `prefetch` items before it yields the first
    import itertools
    prefetch = workers + 1 if prefetch is None else prefetch
    stream, start = iter(items), 0
    with ThreadPoolExecutor(workers) as pool:
        while batch := list(itertools.islice(stream, prefetch)):
            results = [f.result() for f in [pool.submit(fn, item, item_generator(seed, start + k))
                                            for k, item in enumerate(batch)]]
            start += len(batch)
            while results:
                yield results.pop(0)


def ordered_map_seed_zero(fn, items, workers, prefetch=None, seed=0):
    # seeds every item from 0, whatever `seed` says
    yield from spec01._ordered_map(fn, items, workers, prefetch, 0)


def ordered_map_one_rng(fn, items, workers, prefetch=None, seed=0):
    # one generator for the whole run, shared by the threads
    rng = torch.Generator().manual_seed(seed)
    with ThreadPoolExecutor(workers) as pool:
        yield from pool.map(lambda item: fn(item, rng), items)


def ordered_map_thread_map(fn, items, workers, prefetch=None, seed=0):
    # lesson 01's loader, the thing this exercise builds
    from helpers import data
    yield from data.thread_map(fn, items, workers=workers, prefetch=prefetch or workers, seed=seed)


def ordered_map_own_threads(fn, items, workers, prefetch=None, seed=0):
    # a second, differently written right answer: its own threads, a task queue, results by index
    import queue
    import threading
    prefetch = workers + 2 if prefetch is None else prefetch
    tasks, done, cond = queue.SimpleQueue(), {}, threading.Condition()

    def work():
        while (task := tasks.get()) is not None:
            i, item = task
            out = fn(item, item_generator(seed, i))
            with cond:
                done[i] = out
                cond.notify_all()
    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        source, taken, given, exhausted = enumerate(items), 0, 0, False
        while True:
            while not exhausted and taken - given < prefetch:
                task = next(source, None)
                if task is None:
                    exhausted = True
                else:
                    tasks.put(task)
                    taken += 1
            if given == taken:
                return
            with cond:
                cond.wait_for(lambda: given in done)
                out = done.pop(given)
            given += 1
            yield out
    finally:
        for _ in threads:
            tasks.put(None)
        for t in threads:
            t.join()


def _loading_seconds(costs, items, cores, kind, workers, *, gil_part=True, start=True, send=True,
                     cap=True, whole=True):
    """Exercise 3's cost model, with one of its terms left out (what each wrong answer below forgets)."""
    running = min(workers, cores) if cap else workers
    rounds = math.ceil(items / running) if whole else items / running
    computing = rounds * (costs["python_s"] + costs["torch_s"])
    if kind == "threads":
        return max(computing, items * costs["python_s"] if costs["gil_on"] and gil_part else 0.0)
    return (workers * costs["start_s"] if start else 0.0) + max(computing, items * costs["send_s"] if send else 0.0)


def _fastest(costs, items, cores, most=None, **left_out):
    choices = [(kind, k) for k in range(1, (most or cores) + 1) for kind in ("threads", "processes")]
    return min(choices, key=lambda c: (_loading_seconds(costs, items, cores, *c, **left_out), c[1]))


def loader_always_processes(costs, items, cores):
    # "processes always win": one per core
    return ("processes", cores)


def loader_always_threads(costs, items, cores):
    # "threads are free": one per core
    return ("threads", cores)


def loader_always_cores(costs, items, cores):
    # the faster kind, but always one worker per core
    return min((("threads", cores), ("processes", cores)), key=lambda c: _loading_seconds(costs, items, cores, *c))


def loader_ignores_gil_part(costs, items, cores):
    # threads computed as if their Python ran in parallel with the GIL on
    return _fastest(costs, items, cores, gil_part=False)


def loader_gil_always_on(costs, items, cores):
    # costs["gil_on"] never read: every Python taken to have the GIL
    return _fastest({**costs, "gil_on": True}, items, cores)


def loader_ignores_start(costs, items, cores):
    # processes priced without their start-up
    return _fastest(costs, items, cores, start=False)


def loader_ignores_send(costs, items, cores):
    # processes priced without handing their results back
    return _fastest(costs, items, cores, send=False)


def loader_beyond_cores(costs, items, cores):
    # every worker computes at once, however few the cores: up to 4 workers per core
    return _fastest(costs, items, cores, most=min(items, 4 * cores), cap=False)


def loader_fractional_items(costs, items, cores):
    # items shared out in fractions: the busiest worker runs items / workers of them
    return _fastest(costs, items, cores, whole=False)


def choose_loader_by_kind(costs, items, cores):
    # a second, differently written right answer: integer ceilings, each kind's counts in turn, a running best
    item = costs["python_s"] + costs["torch_s"]
    gil_floor = items * costs["python_s"] if costs["gil_on"] else 0.0
    best = None
    for kind in ("processes", "threads"):
        for k in range(cores, 0, -1):
            busiest = -(-items // min(k, cores)) * item
            t = max(busiest, gil_floor) if kind == "threads" else \
                k * costs["start_s"] + max(busiest, items * costs["send_s"])
            if best is None or t < best[0] or (t == best[0] and k <= best[2]):
                best = (t, kind, k)
    return best[1], best[2]


WRONG = [
    Wrong(L01, "augment", "global-rng", augment_global_rng, "draws only from rng, never from the global RNG",
          "draw every random number with generator=rng"),
    Wrong(L01, "augment", "gain-first", augment_gain_first, "bit-for-bit equal to slow_augment seeded per item",
          "draw the flip, then the gain"),
    Wrong(L01, "augment", "divide-after", augment_divide_after, "bit-for-bit equal to slow_augment seeded per item",
          "in one multiplication"),
    Wrong(L01, "augment", "scratch-buffer", augment_scratch, "writes into no module-level tensor", "never out=SCRATCH"),
    Wrong(L01, "augment", "cached-buffer", augment_cached_buffer,
          "another call run between any two of its steps changes nothing (the race, made to happen)",
          "a buffer cached in a dict"),
    Wrong(L01, "augment", "flips-height", augment_flip_height, "bit-for-bit equal to slow_augment seeded per item",
          "flip the width"),
    Wrong(L01, "ordered_map", "no-threads", ordered_map_serial, "`workers` calls run at once",
          "fewer calls ran at once than `workers`"),
    Wrong(L01, "ordered_map", "executor-map", ordered_map_executor_map, "never more than `prefetch` items read ahead",
          "Executor.map"),
    Wrong(L01, "ordered_map", "as-completed", ordered_map_as_completed,
          "results in input order when a later item finishes first", "even when a later item finishes first"),
    Wrong(L01, "ordered_map", "default-pool", ordered_map_default_pool, "never more than `workers` calls at once",
          "size the pool to `workers` threads"),
    Wrong(L01, "ordered_map", "indexes-input", ordered_map_by_index,
          "items from a one-shot stream (a generator: no len())", "never len(), indexing or list(items)"),
    Wrong(L01, "ordered_map", "refills-before-yield", ordered_map_refill_first,
          "never more than `prefetch` items read ahead", "only after you yielded one"),
    Wrong(L01, "ordered_map", "prefetch-workers", ordered_map_workers_ahead,
          "prefetch=None: the read-ahead you derived", "waited idle through the step"),
    Wrong(L01, "ordered_map", "prefetch-4x-workers", ordered_map_four_times_workers,
          "prefetch=None: the read-ahead you derived", "more than 2 x workers in memory"),
    Wrong(L01, "ordered_map", "prefetch-one", ordered_map_one_ahead, "prefetch=None: the read-ahead you derived",
          "waited idle through the step"),
    Wrong(L01, "ordered_map", "keeps-every-future", ordered_map_keeps_futures,
          "prefetch=None: the read-ahead you derived", "still held by the loader"),
    Wrong(L01, "ordered_map", "whole-batches", ordered_map_whole_batches,
          "items stream: work left for the workers while a result is held", "no item was left to run"),
    Wrong(L01, "ordered_map", "seed-ignored", ordered_map_seed_zero,
          "item i is seeded with data.item_generator(seed, i)", "a new generator per item"),
    Wrong(L01, "ordered_map", "one-shared-rng", ordered_map_one_rng,
          "item i is seeded with data.item_generator(seed, i)", "a new generator per item"),
    Wrong(L01, "ordered_map", "calls-thread-map", ordered_map_thread_map, "`workers` calls run at once",
          FORBIDDEN_HINT),
    Wrong(L01, "choose_loader", "always-processes", loader_always_processes,
          "torch ops with the GIL on, 500 items, 4 cores", "torch ops release the GIL"),
    Wrong(L01, "choose_loader", "always-threads", loader_always_threads,
          "pure Python with the GIL on, 2000 items, 8 cores", "one thread at a time runs Python"),
    Wrong(L01, "choose_loader", "always-cores", loader_always_cores, "3 items on 8 cores",
          "a worker with no item adds nothing"),
    Wrong(L01, "choose_loader", "ignores-gil-part", loader_ignores_gil_part,
          "pure Python with the GIL on, 2000 items, 8 cores", "however many threads there are"),
    Wrong(L01, "choose_loader", "gil-always-on", loader_gil_always_on,
          "pure Python with the GIL off (free-threaded), 1000 items, 8 cores", "read costs['gil_on']"),
    Wrong(L01, "choose_loader", "ignores-start", loader_ignores_start, "16 items, a slow process start (0.5 s)",
          "the start-ups are not paid back"),
    Wrong(L01, "choose_loader", "ignores-send", loader_ignores_send, "large results, slow to send",
          "receives every result from the processes, one at a time"),
    Wrong(L01, "choose_loader", "beyond-cores", loader_beyond_cores, "pure Python, cheap processes, 2 cores",
          "a worker beyond the cores adds no computing"),
    Wrong(L01, "choose_loader", "fractional-items", loader_fractional_items, "3 items on 8 cores",
          "a worker runs whole items"),
]

SECOND_SOLUTIONS = [("augment", augment_thread_local_buffer), ("ordered_map", ordered_map_own_threads),
                    ("ordered_map", ordered_map_twice_workers), ("choose_loader", choose_loader_by_kind)]

globals().update(lab_tests(L01, WRONG, SECOND_SOLUTIONS))
