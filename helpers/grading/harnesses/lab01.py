"""Lab 01 (data loading): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import gc
import math
import threading
import weakref
from typing import Callable

import torch


LAB01_BLUR = (torch.outer(torch.tensor([1.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 1.0])) / 16).expand(3, 1, 3, 3)
LAB01_WAIT_S = 3.0       # how long a call waits for other calls that a right answer starts at once; a right
                         # answer never waits it out, a wrong one (too few threads) waits it once


def _slow_augment(image):
    """Lab 01's given slow_augment (global RNG, a scratch buffer), run here, in the learner's process and
    with the learner's torch: the reference an augment must equal bit for bit."""
    import torch.nn.functional as F
    scratch = torch.empty(image.shape)
    flip = bool(torch.rand(()) < 0.5)
    gain = 0.8 + 0.4 * float(torch.rand(()))
    torch.mul(image, gain / 255.0, out=scratch)
    x = scratch.flip(-1) if flip else scratch
    return F.conv2d(F.pad(x.unsqueeze(0), (1, 1, 1, 1), mode="replicate"), LAB01_BLUR, groups=3)[0].clone()


def _bit_equal(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def global_rng_use(fn, images, seed) -> str:
    """Whether fn(image, rng) over the images moved torch's global random generator."""
    from helpers.data import item_generator
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(20261202)
        before = torch.get_rng_state()
        for i, image in enumerate(images):
            fn(image, item_generator(seed, i))
        moved = not torch.equal(before, torch.get_rng_state())
    return "draws from the global RNG" if moved else "draws only from rng"


def not_bit_equal(fn, images, seed) -> str:
    """The items i where fn(image, data.item_generator(seed, i)) is not bit-for-bit slow_augment(image)
    with the global RNG seeded for item i (torch.manual_seed(data.item_seed(seed, i)), as slow_pipeline
    does)."""
    from helpers.data import item_generator, item_seed
    differ = []
    with torch.random.fork_rng(devices=[]):
        for i, image in enumerate(images):
            torch.manual_seed(item_seed(seed, i))
            want = _slow_augment(image)
            if not _bit_equal(fn(image, item_generator(seed, i)), want):
                differ.append(i)
    return f"items {differ} differ from slow_augment's" if differ else "every item bit-for-bit equal"


def globals_written(fn, images, seed) -> str:
    """The module-level tensors of fn's notebook (or module) that a serial run of fn changed, compared
    after every call: an earlier case's run may have left a buffer as this run's last call leaves it."""
    from helpers.data import item_generator

    def same(a, b):
        return torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and
                                     torch.equal(a.nan_to_num(), b.nan_to_num()))
    tensors = {k: v for k, v in fn.__globals__.items() if isinstance(v, torch.Tensor)}
    before = {k: v.clone() for k, v in tensors.items()}
    written = set()
    for i, image in enumerate(images):
        fn(image, item_generator(seed, i))
        written |= {k for k, v in tensors.items() if k not in written and
                    (v.shape != before[k].shape or not same(v, before[k]))}
    return f"writes into {', '.join(sorted(written))}" if written else "writes into no module-level tensor"


class _AfterOperation(torch.overrides.TorchFunctionMode):
    """Calls `between()` once, right after the k-th torch operation (0-based) of the code run under it."""
    def __init__(self, k: int, between: Callable[[], None]):
        super().__init__()
        self.k, self.between, self.seen, self.fired = k, between, 0, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.seen == self.k:
            self.fired = True
            self.between()
        self.seen += 1
        return out


def changed_by_a_call_between(fn, images, seed) -> str:
    """The race of two threads, made to happen every time. Each item is computed alone; then again once
    for every torch operation k of its call, with a whole call on the next item run on another thread
    right after operation k (the first call waits for it, up to a second): what a second thread does to a
    first one that the scheduler pauses there. Returns the items whose result changed at any k. A call
    that shares nothing (a buffer, a generator) with other calls cannot change."""
    from helpers.data import item_generator
    alone = [fn(image, item_generator(seed, i)) for i, image in enumerate(images)]
    changed = []
    for i, image in enumerate(images):
        j = (i + 1) % len(images)
        for k in range(500):
            others: list[threading.Thread] = []

            def between():
                other = threading.Thread(target=fn, args=(images[j], item_generator(seed, j)), daemon=True)
                other.start()
                other.join(1.0)           # a lock held by this call may keep the other waiting: go on
                others.append(other)
            pause = _AfterOperation(k, between)
            with pause:
                out = fn(image, item_generator(seed, i))
            for other in others:
                other.join()
            if not pause.fired:
                break
            if not _bit_equal(out, alone[i]):
                changed.append(i)
                break
    return f"items {changed} changed when another call ran in between" if changed else "no item changed"


def _lab01_transform(x, rng):
    """The transform lab 01's loader checks hand to ordered_map: the item plus noise from its generator."""
    return x + torch.rand(x.shape, generator=rng)


def _lab01_items(n: int, counter: list | None = None):
    """A one-shot stream of n small tensors (item i is filled with i); counts what is pulled."""
    for i in range(n):
        if counter is not None:
            counter[0] += 1
        yield torch.full((2,), float(i))


def loader_results(fn, items, workers, prefetch, seed, stream=False):
    """list(fn(transform, items, workers, prefetch=prefetch, seed=seed)), where item 0's call finishes only
    after item 1's (it waits up to LAB01_WAIT_S when 2 or more calls can run at once): a later item
    finishes first, as on a busy machine. stream: items come from a one-shot generator."""
    second_done = threading.Event()
    first, second = (items[0], items[1]) if len(items) > 1 else (None, None)
    overlap = workers > 1 and (prefetch is None or prefetch > 1)

    def transform(x, rng):
        if x is first and overlap:
            second_done.wait(LAB01_WAIT_S)
        out = _lab01_transform(x, rng)
        if x is second:
            second_done.set()
        return out
    source = (x for x in items) if stream else items
    return list(fn(transform, source, workers, prefetch=prefetch, seed=seed))


def calls_at_once(fn, n, workers, prefetch, seed) -> str:
    """The most calls of the transform that fn ran at the same time, loading n items. The first calls wait
    (up to LAB01_WAIT_S) until min(workers, n) run together; with prefetch above workers they then wait a
    second more for any call beyond `workers`, which a pool of more threads than `workers` starts."""
    cond = threading.Condition()
    state = {"now": 0, "most": 0, "arrived": 0, "gave_up": False}
    wave = min(workers, n)

    def transform(x, rng):
        with cond:
            state["now"] += 1
            state["arrived"] += 1
            state["most"] = max(state["most"], state["now"])
            first_wave = state["arrived"] <= wave
            cond.notify_all()
            if first_wave and not state["gave_up"]:
                if not cond.wait_for(lambda: state["most"] >= wave, timeout=LAB01_WAIT_S):
                    state["gave_up"] = True          # fewer at once than `workers`: the later calls go on
                elif prefetch > workers:
                    cond.wait_for(lambda: state["most"] > workers, timeout=1.0)
        try:
            return _lab01_transform(x, rng)
        finally:
            with cond:
                state["now"] -= 1
    for _ in fn(transform, _lab01_items(n), workers, prefetch=prefetch, seed=seed):
        pass
    return f"{state['most']} call{'' if state['most'] == 1 else 's'} at once"


def _most_read_ahead(fn, n, workers, seed, **prefetch) -> int:
    """The most items fn had taken from a stream of n and not yet yielded, over the run."""
    pulled, most = [0], 0
    for j, _ in enumerate(fn(_lab01_transform, _lab01_items(n, pulled), workers, seed=seed, **prefetch)):
        most = max(most, pulled[0] - j)      # result j arrives: items 0..j-1 were yielded before it
    return most


def read_ahead(fn, n, workers, prefetch, seed) -> str:
    most = _most_read_ahead(fn, n, workers, seed, prefetch=prefetch)
    return f"at most {prefetch} items read ahead" if most <= prefetch else f"{most} items read ahead"


DEFAULT_READ_AHEAD_OK = "every worker had an item while a result was held, at most 2 x workers held"
STREAMS_OK = "the workers had items to run while each result was held, and no result was kept once yielded"


def _as_a_training_loop(fn, n, workers, seed, **prefetch) -> tuple[list[int], int, int]:
    """fn over a stream of n items, consumed as a training loop would: it holds each result for a step,
    then drops it. Returns, for each result held while the stream had more, the items taken and not yet
    yielded (all the workers can run: the generator is suspended); the most items held at once; and the
    most results the loop had already taken and dropped that the loader still kept alive, beyond what a
    local variable holds until it is reassigned (the generator's last one, one per worker thread)."""
    pulled, left, most, kept, taken = [0], [], 0, 0, []

    def alive() -> int:
        return sum(ref() is not None for ref in taken[:-1])
    for j, result in enumerate(fn(_lab01_transform, _lab01_items(n, pulled), workers, seed=seed, **prefetch)):
        # A free-threaded build frees an object a worker thread made only once that thread merges the other
        # threads' releases (biased reference counting): a collection does that for every thread
        kept = max(kept, alive() if alive() <= workers else (gc.collect(), alive())[1])
        most = max(most, pulled[0] - j)
        if pulled[0] < n:                    # the stream has more: a worker without an item waits idle
            left.append(pulled[0] - (j + 1))
        taken.append(weakref.ref(result))
        del result                           # the loop is done with it
    return left, most, kept


def _kept_text(kept: int) -> str:
    return (f"{kept} results the training loop had already taken were still held by the loader: memory grows "
            f"with every item unless the loader lets go of a result once it is yielded")


def default_read_ahead(fn, n, workers, seed) -> str:
    """ordered_map without a prefetch, as a training loop consumes it (_as_a_training_loop): while the loop
    holds a result and the stream has more, at least `workers` items are left to run; at most 2 x workers
    items are held at once; no result is kept once yielded."""
    left, most, kept = _as_a_training_loop(fn, n, workers, seed)
    if kept > workers:
        return _kept_text(kept)
    if left and min(left) < workers:
        return (f"while the training loop held a result, {min(left)} item(s) were left to run for {workers} "
                f"workers: {workers - min(left)} worker(s) waited idle through the step")
    if most > 2 * workers:
        return f"{most} items held at once for {workers} workers: more than 2 x workers in memory"
    return DEFAULT_READ_AHEAD_OK


def streams(fn, n, workers, prefetch, seed) -> str:
    """ordered_map with a prefetch, as a training loop consumes it (_as_a_training_loop): items stream. While
    the loop holds a result and the stream has more, the workers have an item left to run (a loader that
    waits for a whole batch before it yields leaves none at each batch's end: every worker idles through
    that step), and no result is kept once yielded (a list of every future holds every item)."""
    left, _, kept = _as_a_training_loop(fn, n, workers, seed, prefetch=prefetch)
    if kept > workers:
        return _kept_text(kept)
    if left and min(left) == 0:
        idle = sum(1 for count in left if count == 0)
        return (f"while the training loop held a result, no item was left to run {idle} time(s) of {len(left)}: "
                f"every worker waited idle through those steps")
    return STREAMS_OK


# --- Exercise 3: threads or processes, and how many, under the lab's cost model -------------------

LOADER_KINDS = ("threads", "processes")
LOADER_OK = "the fastest choice in the model, or within 2% of it, with no worker more than it needs"


def loading_seconds(costs: dict, items: int, cores: int, kind: str, workers: int) -> float:
    """Lab 01's cost model: the seconds to load `items` items with `workers` workers of `kind` on `cores` cores.
    A worker runs whole items, one at a time, and at most `cores` run at once; with the GIL on, the pure-Python
    parts of all items run one after another on threads; processes are started one after another
    (start_s each) and the main process receives every result, one at a time (send_s each), while they
    compute. Overlapping work takes as long as its longest part."""
    computing = math.ceil(items / min(workers, cores)) * (costs["python_s"] + costs["torch_s"])
    if kind == "threads":
        return max(computing, items * costs["python_s"] if costs["gil_on"] else 0.0)
    return workers * costs["start_s"] + max(computing, items * costs["send_s"])


def _loader_choice_problem(choice) -> str | None:
    if not (isinstance(choice, (tuple, list)) and len(choice) == 2):
        return f"a {type(choice).__name__}, not a tuple (kind, workers)"
    kind, workers = choice
    if kind not in LOADER_KINDS:
        return f"the kind {str(kind)[:40]!r} is neither 'threads' nor 'processes'"
    if type(workers) is not int:
        return f"workers is a {type(workers).__name__}, not a Python int"
    if workers < 1:
        return f"{workers} workers: at least 1"
    return None


def loader_verdict(fn, costs, items, cores) -> str:
    """Whether the (kind, workers) fn chooses loads `items` items fastest in the cost model (within 2%), with
    no choice of fewer workers as fast; if not, which way it is off and which cost it underweights, without
    the choice."""
    choice = fn(dict(costs), items, cores)
    problem = _loader_choice_problem(choice)
    if problem:
        return problem
    kind, workers = choice = tuple(choice)
    choices = [(k, w) for k in LOADER_KINDS for w in range(1, cores + 1)] + [choice]   # none beyond the cores is faster
    seconds = {c: loading_seconds(costs, items, cores, *c) for c in choices}
    mine, fastest = seconds[choice], min(seconds.values())
    ratio = f" (your choice's modelled time is {mine / fastest:.2f}x the fastest)"
    if mine > 1.02 * fastest:
        counts = [w for (k, w), t in seconds.items() if k == kind and t <= 1.02 * fastest]
        if not counts and kind == "threads":
            return ("threads, where processes are faster: with the GIL on, the pure-Python parts of all items run "
                    "one after another, however many threads there are" + ratio)
        if not counts:
            if not costs["gil_on"]:
                return ("processes, where threads are faster: with the GIL off, threads run the Python part in "
                        "parallel too, and pay neither a start-up nor a transfer" + ratio)
            without_start = mine - workers * costs["start_s"]
            without_send = workers * costs["start_s"] + math.ceil(items / min(workers, cores)) * (
                costs["python_s"] + costs["torch_s"])
            if without_start <= 1.02 * fastest:
                return ("processes, where threads are faster: each process's start-up, paid one after another "
                        "before the first item, costs more than threads lose to the GIL" + ratio)
            if without_send <= 1.02 * fastest:
                return ("processes, where threads are faster: the main process receives every result, one at "
                        "a time, and that costs more than threads lose to the GIL" + ratio)
            return ("processes, where threads are faster: their start-ups and the results' transfer together "
                    "cost more than threads lose to the GIL" + ratio)
        if workers > cores:
            return ("more workers than cores: at most `cores` items are computed at once, so the workers beyond "
                    "add no computing, and each process among them still costs its start-up" + ratio)
        if workers > min(counts):
            return ("too many processes: the last ones' start-ups cost more than the computing they take "
                    "over" + ratio)
        return f"too few {kind}: more of them would share out the computing" + ratio
    fewer = [c for c, t in seconds.items() if c[1] < workers and t <= mine * (1 + 1e-9)]
    if fewer:
        if workers > cores:
            return ("more workers than cores, where fewer load as fast: at most `cores` items are computed at "
                    "once, so the workers beyond add nothing but memory")
        if workers > items:
            return ("more workers than items, where fewer load as fast: a worker with no item to run adds "
                    "nothing but memory")
        return (f"{workers} {kind}, where fewer workers load as fast in the model: a worker that makes loading "
                f"no faster only holds memory (count the items the busiest worker runs, and what the GIL "
                f"serialises)")
    return LOADER_OK
