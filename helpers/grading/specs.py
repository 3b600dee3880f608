"""What the grader checks, per lab: the functions a student writes, the inputs they are called on
(visible ones, as in the lab's check cells, and hidden ones the student copy does not show), and the
reference each result is compared with. The grader computes the references itself; nothing here
runs in the student's process.

To make a lab gradable, add a LabSpec to SPECS: one Exercise per function the lab asks for. An
Exercise's `cases(gen)` returns Case objects whose args are tensors or plain values (they travel to
the student's process as a weights-only torch file); `reference(*args, **kwargs)` computes the
expected result, or a Case names the exception it expects (`raises`, `match`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from helpers.grading.checks import BUCKET_COUNT_OK, DEFAULT_READ_AHEAD_OK, NO_HOST_READS


@dataclass(frozen=True)
class Case:
    name: str                          # what is checked, shown in the feedback
    args: tuple
    kwargs: dict = field(default_factory=dict)
    hidden: bool = False               # not among the student copy's checks
    raises: str | None = None          # the exception class name expected instead of a result
    match: str | None = None           # ... whose message contains this
    atol: float = 1e-5
    rtol: float = 1e-4
    hint: str = ""
    call: str | None = None            # a harness of helpers.grading.checks that calls the function (builds a
                                       # generator, a model, a path); None: function(*args, **kwargs)
    expected: object = None            # with expect_value: this value, not the reference's result
    expect_value: bool = False


@dataclass(frozen=True)
class Exercise:
    title: str                         # "Exercise 1: softmax"
    function: str                      # the name the student's notebook defines
    cases: Callable[[torch.Generator], list[Case]]
    reference: Callable[..., object]
    points: float = 1.0
    forbidden: tuple[str, ...] = ()    # what the exercise asks the student to write without: torch function
                                       # and aten op names (softmax, _softmax), or dotted paths of Python
                                       # functions and classes (helpers.moe.permute, torch.compile)
    refused: str = ""                  # why they are refused, and what the exercise wants instead: the hint
                                       # of a case that reached one of them
    needs: tuple[str, ...] = ()        # capabilities (helpers.device's names, as the lab's requires()) without
                                       # which the exercise is not gradable on the grading machine


@dataclass(frozen=True)
class LabSpec:
    lab: str                           # the manifest id
    exercises: tuple[Exercise, ...]
    allow_processes: bool = False      # True for labs whose code starts processes (Triton, torch.compile
                                       # workers, C++ builds); a submission could then read files that way


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    x = torch.randn(4, 7, generator=gen) * 50
    x[0, 0] = 100.0                    # exp(100) overflows float32: only a max-subtracted softmax survives it
    masked = torch.randn(3, 6, generator=gen) * 5
    masked[1] = float("-inf")          # every key of row 1 masked out
    masked[2, ::2] = float("-inf")     # half of row 2's keys masked out
    masked_3d = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    masked_3d[1, :, 2] = float("-inf")  # along dim 1: one slice entirely masked
    empty = ("in a fully masked row the maximum is -inf and every exp(x) is 0: no probability is left to "
             "share out, so every entry is 0. Not NaN (-inf minus -inf, or 0 / 0), and not 1/n (what a "
             "large finite stand-in for -inf gives): decide what to subtract and what to divide by there")
    half = ("float16 holds no magnitude above 65504 and none below about 6e-8 but 0: a stand-in sized for "
            "float32 (a huge negative for -inf, a tiny eps against 0 / 0) is -inf or 0 in float16, and the fully "
            "masked row is NaN again")
    device = ("build every new tensor from x (zeros_like, a Python number, x.new_...), never on a fixed "
              "device, and never read a value back to Python (bool(), .item(), an `if` on a tensor): the "
              "check runs your function on the meta device, which has no values, as an accelerator would "
              "run it without a round trip to the host; and keep x's dtype")
    return [
        Case("large values, last dim", (x,), hint="subtract x.amax(dim, keepdim=True) before exp"),
        Case("along dim 0", (x,), {"dim": 0}, hint="use the dim argument in every reduction, with keepdim=True"),
        Case("a fully masked row gives zeros", (masked,), hint=empty),
        Case("a fully masked row in float16", (masked.half(),), atol=2e-3, rtol=1e-2, hint=half),
        Case("runs on any device, keeps the dtype (a float64 meta tensor)", (x.double(),),
             call="softmax_on_meta", hint=device),
        Case("3-D input along dim 1", (torch.randn(2, 3, 5, generator=gen) * 10,), {"dim": 1}, hidden=True,
             hint="reduce over `dim` only, keeping it (keepdim=True) so the division broadcasts"),
        Case("float64 keeps its dtype", (torch.randn(3, 4, generator=gen, dtype=torch.float64) * 100,),
             hidden=True, hint="do not convert to float32; every op here keeps the input dtype"),
        Case("huge values (1e4) do not overflow", (torch.randn(2, 6, generator=gen) * 1e4,), hidden=True,
             hint="exp(1e4) is inf in any float type: subtract the maximum first"),
        Case("a fully masked slice along dim 1, float64", (masked_3d,), {"dim": 1}, hidden=True, hint=empty),
        Case("a fully masked slice along dim 1, float16", (masked_3d.half(),), {"dim": 1}, hidden=True, atol=2e-3,
             rtol=1e-2, hint=half),
        Case("any device, 3-D bfloat16 along dim 0", (torch.randn(3, 2, 5, generator=gen).bfloat16(),),
             {"dim": 0}, call="softmax_on_meta", hidden=True, hint=device),
    ]


def _rms_norm_cases(gen: torch.Generator) -> list[Case]:
    x, w = torch.randn(3, 5, 16, generator=gen), torch.rand(16, generator=gen)
    eps = "add eps inside the square root, to the mean of the squares: it matters when values are tiny"
    return [
        Case("values", (x, w), hint="x / sqrt(mean(x**2 over the last dim) + eps) * weight"),
        Case("eps is used", (torch.randn(4, 16, generator=gen) * 1e-3, w), {"eps": 1e-2}, hint=eps),
        Case("a mismatched weight is rejected", (x, torch.ones(8)), raises="ValueError", match="weight",
             hint="compare weight.shape with x.shape[-1:] before computing"),
        Case("1-D input", (torch.randn(16, generator=gen), w), hidden=True,
             hint="normalise over the last dimension whatever the number of dimensions"),
        Case("eps is used, a 3-D input", (torch.randn(2, 3, 16, generator=gen) * 1e-3, w), {"eps": 1e-3},
             hidden=True, hint=eps),
        Case("a mismatched weight on a 1-D input is rejected", (torch.randn(16, generator=gen), torch.ones(15)),
             raises="ValueError", hidden=True, hint="compare weight.shape with x.shape[-1:] before computing"),
    ]


def _softmax_reference(x, dim=-1):
    """torch.softmax, with 0 (not NaN) in a row whose every entry is -inf."""
    out = torch.softmax(x, dim=dim)
    return torch.where(torch.isneginf(x).all(dim=dim, keepdim=True), torch.zeros_like(out), out)


SOFTMAX = ("softmax", "_softmax", "log_softmax", "_log_softmax", "special_softmax", "_safe_softmax",
           # attention computes a softmax inside: with a query of ones and an identity value it returns one
           "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
           "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def _rms_norm_reference(x, weight, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=eps)


SPECS: dict[str, LabSpec] = {
    "00_warmup_lab": LabSpec("00_warmup_lab", (
        Exercise("Exercise 1: softmax", "softmax", _softmax_cases, _softmax_reference, forbidden=SOFTMAX,
                 refused="torch's softmax is the function you are writing, and it gives NaN on a fully masked row: "
                         "build yours from exp, a max and a sum, and decide that row yourself"),
        Exercise("Exercise 2: rms_norm", "rms_norm", _rms_norm_cases, _rms_norm_reference,
                 forbidden=("rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm", "group_norm",
                            "native_group_norm", "batch_norm", "instance_norm"),
                 refused="torch's rms_norm, and the other norms that can be made to compute it, are the function you "
                         "are writing: take the mean of the squares yourself, with eps and the weight"),
    )),
}



# --- Lab 01: data loading -------------------------------------------------------------------------

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
             expected="at most 4 items read ahead", expect_value=True, hint=bound),
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
             expected="at most 7 items read ahead", expect_value=True, hidden=True, hint=bound),
        Case("prefetch=None with 5 workers", (50, 5, seed + 3), call="default_read_ahead",
             expected=DEFAULT_READ_AHEAD_OK, expect_value=True, hidden=True, hint=default),
        Case("one worker, prefetch 1", (items[:5], 1, 1, seed + 4), call="loader_results", hidden=True, hint=order),
    ]


# --- Lab 02: fusion ------------------------------------------------------------------------------

def _combo_grid(numels, block):
    ends, total = [], 0
    for n in numels:
        total += (n + block - 1) // block
        ends.append(total)
    return total, ends


def _combo_grid_cases(gen):
    ceil = "ceil(n / block) is (n + block - 1) // block; ends are running sums"
    sizes = [int(v) for v in torch.randint(0, 5000, (4,), generator=gen)]
    return [
        Case("the example", ([1000, 1, 3075], 256), hint=ceil),
        Case("exact multiples", ([256, 512, 768], 256), hint="a part of exactly k*block elements needs k programs"),
        Case("empty parts", ([0, 5, 0], 4), hint="an empty part needs 0 programs, but still has an end"),
        Case("random sizes", (sizes, 128), hidden=True, hint=ceil),
        Case("every part empty", ([0, 0], 64), hidden=True, hint="no programs at all: (0, [0, 0])"),
        Case("block 1", ([3, 1, 2], 1), hidden=True, hint="one program per element when block is 1"),
        Case("one part", ([70000], 1024), hidden=True, hint=ceil),
    ]


def _combo_launch_cases(gen):
    hint = ("zeros or garbage in one part: that part's programs never ran, or ran with the wrong local id; "
            "subtract the start of the part (end0 for part 1, end1 for part 2)")
    once = ("the point of a combo kernel is ONE launch for all three parts: launch three_part_kernel once, on "
            "the grid combo_grid gives, with no other kernel and no eager PyTorch computing a part")
    cases = [Case(f"sizes {sizes}", ([torch.randn(n, generator=gen) for n in sizes],), hint=hint, hidden=hidden,
                  call="triton_launch")
             for sizes, hidden in (([1000, 1, 3075], False), ([256, 0, 300], False), ([5, 700, 1], True),
                                   ([0, 0, 513], True), ([257, 257, 0], True))]
    cases.insert(2, Case("one launch of three_part_kernel", ([torch.randn(n, generator=gen) for n in (700, 3, 300)],),
                         call="kernel_launches", expected=1, expect_value=True, hint=once))
    cases.append(Case("one launch, other sizes", ([torch.randn(n, generator=gen) for n in (33, 1030, 5)],),
                      call="kernel_launches", expected=1, expect_value=True, hidden=True, hint=once))
    return cases


def _combo_reference(xs):
    from helpers.fusion import combo_reference
    return combo_reference(xs, alpha=0.5)


def _combo_plan(numels, block):
    blocks = [(n + block - 1) // block for n in numels]
    if sum(numels) / (max(numels) * len(numels)) > 0.8:
        return "round_robin", len(numels) * max(blocks), len(numels) * max(blocks) - sum(blocks)
    return "sequential", sum(blocks), 0


def _combo_plan_cases(gen):
    base = int(torch.randint(2000, 6000, (), generator=gen))
    close = [base, base - int(torch.randint(base // 10, base // 6, (), generator=gen)), base]
    small = [base, base, base, int(torch.randint(1, base // 5, (), generator=gen))]
    block = int(torch.tensor([128, 256, 512])[torch.randint(0, 3, (), generator=gen)])
    case = lambda name, args, hint, hidden=False: Case(name, args, call="combo_plan_errors",  # noqa: E731
                                                       expected="all three right",
                                                       expect_value=True, hidden=hidden, hint=hint)
    share = ("round-robin wins when the parts are close in size: the share of a round-robin launch that has work, "
             "computed as select_dispatch_strategy (lesson 02) computes it (the parts' total over the largest times "
             "their number), not the smallest part against the largest; below the bar the parts run one after "
             "another, with no idle program. Work it out yourself: helpers.fusion and Inductor's own functions "
             "would make the decision for you")
    strict = "the bar is strict: at exactly 0.8 Inductor does not pick round-robin"
    elements = ("Inductor measures the share in elements (each part's xnumel), not in blocks: a round-robin launch "
                "with no idle program can still fall below the bar")
    idle = ("count programs in blocks: a round-robin launch gives every part as many programs as the largest part "
            "has blocks, and a program past its part's last block has nothing to do; a sequential launch wastes none")
    return [
        case("parts of close sizes", ([4096, 4096, 4096, 3000], 1024), share),
        case("no idle block, yet below the bar", ([1024, 1024, 1024, 100], 1024), elements),
        case("one small part", ([4096, 4096, 4096, 512], 512), share),
        case("exactly at the bar", ([1280, 1280, 1280, 256], 256), strict),
        case("idle programs of a round-robin launch", ([2048, 2048, 2048, 1100, 1100], 1024), idle),
        case("close sizes, other numbers", (close, block), share, hidden=True),
        case("one small part, other numbers", (small, block), share, hidden=True),
        case("idle programs, other numbers", ([3000, 3072, 2500, 2900], 512), idle, hidden=True),
        case("one part", ([777], 256), idle, hidden=True),
    ]


def _kernel_counts() -> dict[str, int]:
    """helpers.fusion.kernel_counts, imported when lab 02 is graded (importing helpers.fusion loads torch's
    benchmark utilities, which log a CUDA_HOME warning under a CUDA build without a GPU)."""
    from helpers.fusion import kernel_counts
    return kernel_counts()


# --- Lab 03: MoE ---------------------------------------------------------------------------------

def _permute(x, expert_ids, num_experts):
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    return x[order // expert_ids.shape[1]], order, counts.cumsum(0).to(torch.int32)


def _permute_cases(gen):
    order = ("order sorts the flattened (token, slot) positions by expert; among positions with the same expert "
             "the earlier one comes first. A plain sort may swap equal keys: ask the sort to keep ties in order")
    rows = ("xs row i is the token of flattened position order[i]: with k slots per token, position p belongs to "
            "token p // k (slot p % k); reread how a [T, k] tensor is flattened")
    ends = ("offs[e] is the number of rows of experts 0..e together (where expert e's rows END), one entry per "
            "expert: not the count of each expert, not where it starts; an expert with no token repeats the "
            "previous end")
    int32 = "offs must be torch.int32, the dtype grouped_mm takes; a count or a cumulative sum comes out as int64"
    trailing = ("offs has num_experts entries even when the last experts get no token: a count of the ids that "
                "occur stops at the largest id; tell the counting how many experts there are")
    sync = ("the names listed read tensor values back to the host, a sync that stalls the GPU on every MoE layer: "
            "a count that sizes its output from the largest id reads that id back first, and so does any "
            ".tolist(), .item(), int() or Python loop over a tensor. Count with an op whose output size you give "
            "it (num_experts is a Python int already)")
    ids = torch.tensor([[0, 2], [2, 3], [0, 3], [3, 2], [0, 2], [2, 0], [3, 0], [0, 2], [2, 3], [3, 0], [0, 3], [2, 0]])
    x12 = torch.randn(12, 8, generator=gen)
    trail = (torch.randn(7, 5, generator=gen), torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1], [1, 0, 0],
                                                             [0, 1, 0], [1, 1, 1]]), 6)
    return [
        Case("order: sorted by expert, ties in arrival order", (x12, ids, 4), call="second", hint=order),
        Case("xs: the token of each sorted position", (x12, ids, 4), call="first", hint=rows),
        Case("offs: cumulative end offsets, expert 1 gets none", (x12, ids, 4), call="third_as_int64", hint=ends),
        Case("offs is torch.int32", (x12, ids, 4), call="dtype_of_third", hint=int32),
        Case("experts 2..5 get no token: 6 offsets", trail, call="third_as_int64", hint=trailing),
        Case("nothing is read back to the host (no sync on a GPU)", (x12, ids, 4), call="host_reads_of",
             expected=NO_HOST_READS, expect_value=True, hint=sync),
        Case("k=1, random experts", (torch.randn(9, 4, generator=gen), torch.randint(0, 3, (9, 1), generator=gen), 3),
             hint=ends),
        Case("every token to one expert", (torch.randn(5, 3, generator=gen), torch.full((5, 2), 1), 4), hidden=True,
             hint=ends),
        Case("one token", (torch.randn(1, 6, generator=gen), torch.tensor([[2, 0]]), 3), hidden=True, hint=rows),
        Case("trailing experts with no tokens, k=3", (torch.randn(7, 5, generator=gen),
                                                      torch.randint(0, 2, (7, 3), generator=gen), 6),
             call="third_as_int64", hidden=True, hint=trailing),
        Case("k=4, many ties", (torch.randn(10, 4, generator=gen), torch.randint(0, 3, (10, 4), generator=gen), 5),
             call="second", hidden=True, hint=order),
        Case("no host reads, k=1, 7 experts", (torch.randn(9, 4, generator=gen),
                                               torch.randint(0, 7, (9, 1), generator=gen), 7),
             call="host_reads_of", expected=NO_HOST_READS, expect_value=True, hidden=True, hint=sync),
    ]


def _fallback(xs, w, offs):
    out = xs.new_zeros(xs.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = xs[start:end] @ w[e]
        start = end
    return out


def _fallback_cases(gen):
    from helpers.moe import offsets_from_counts, skewed_counts
    hint = ("expert e owns rows offs[e-1]:offs[e] (the first starts at 0); an empty slice is fine. One 2-D "
            "matmul per expert")
    tail = ("rows past offs[-1] belong to no expert: their output rows must be 0. Memory from an empty "
            "allocation holds whatever was there before (this check fills it with NaN)")
    cases = []
    for experts, skew, dtype, hidden in ((4, 0.0, torch.float32, False), (8, 3.0, torch.float32, False),
                                         (6, 1.0, torch.bfloat16, False), (1, 0.0, torch.float32, True),
                                         (5, 8.0, torch.float32, True), (3, 0.0, torch.float64, True)):
        counts = skewed_counts(40, experts, skew)
        low = dtype == torch.bfloat16
        cases.append(Case(f"{experts} experts, counts {counts.tolist()}, {dtype}",
                          (torch.randn(40, 16, generator=gen).to(dtype), torch.randn(experts, 16, 8, generator=gen).to(dtype),
                           offsets_from_counts(counts)), hidden=hidden, atol=0.1 if low else 1e-4,
                          rtol=2e-2 if low else 1e-3, call="uninitialized_is_nan",
                          hint=hint + "; keep the input's dtype"))
    # a capacity-padded buffer: offs[-1] < rows (each input its own allocation: F.grouped_mm wants
    # 16-byte aligned data, which a slice of a flat buffer may not have)
    for rows, counts, hidden in ((48, [10, 0, 20, 6], False), (33, [0, 7, 0], True), (64, [5, 9, 1, 0, 3], True)):
        cases.append(Case(f"{len(counts)} experts own {sum(counts)} of {rows} rows", (
            torch.randn(rows, 16, generator=gen), torch.randn(len(counts), 16, 8, generator=gen),
            offsets_from_counts(torch.tensor(counts))), hidden=hidden, atol=1e-4, rtol=1e-3,
            call="uninitialized_is_nan", hint=tail))
    return cases + _own_rows_cost_cases(cases, "grouped_gemm_flops")


OWN_ROWS_COST = ("each expert's matmul takes that expert's rows only: multiplying every row by every expert's "
                 "weight (then keeping each row's own expert) does num_experts times the work, and so does padding "
                 "every expert to the same rows; a product written as a multiply and a sum is no matmul")


def _own_rows_cost_cases(cases, call):
    """The FLOPs the matmuls do (counted by torch.utils.flop_counter) against each expert on its own rows: on
    the first visible case's inputs, and hidden on the last hidden case's."""
    visible = next(c for c in cases if not c.hidden)
    hidden = [c for c in cases if c.hidden][-1]
    return [Case(f"the FLOPs of each expert on its own rows, no more ({c.name})", c.args, hidden=c.hidden, call=call,
                 hint=OWN_ROWS_COST) for c in (visible, hidden)]


def _expert_ffn(xs, params, offs):
    import torch.nn.functional as F
    return _fallback(F.gelu(_fallback(xs, params["w_up"], offs)), params["w_down"], offs)


def _expert_ffn_cases(gen):
    from helpers.moe import offsets_from_counts, skewed_counts
    hint = ("up-projection, GELU, down-projection, each expert on its own rows only (no padding)")
    cases = []
    for rows, experts, skew, hidden in ((64, 4, 2.0, False), (48, 6, 0.0, True), (30, 5, 6.0, True)):
        params = {"w_up": torch.randn(experts, 16, 32, generator=gen) / 4,
                  "w_down": torch.randn(experts, 32, 16, generator=gen) / 6}
        counts = skewed_counts(rows, experts, skew)
        cases.append(Case(f"{experts} experts, counts {counts.tolist()}",
                          (torch.randn(rows, 16, generator=gen), params, offsets_from_counts(counts)),
                          hidden=hidden, atol=1e-4, rtol=1e-3, hint=hint))
    return cases + _own_rows_cost_cases(cases, "expert_ffn_flops")


# --- Lab 04: the C++ custom op --------------------------------------------------------------------

KERNEL_BODY = r"""
  for (int64_t i = begin; i < end; ++i) {
    const acc_t g = static_cast<acc_t>(gate[i]);
    out[i] = static_cast<scalar_t>(g / (acc_t(1) + std::exp(-g)) * static_cast<acc_t>(up[i]));
  }
"""


def _kernel_cases(gen):
    hint = ("each call sees only its chunk [begin, end); compute in acc_t (float for bf16/fp16) and convert the "
            "result back to scalar_t once")
    cases = []
    tolerance = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 1e-2}
    for shape, dtype, hidden in (((7,), torch.float32, False), ((3, 33), torch.float64, False),
                                 ((2, 5, 129), torch.bfloat16, False), ((4099,), torch.float32, False),
                                 ((0, 5), torch.float32, True), ((1,), torch.float16, True),
                                 ((65, 70), torch.float16, True)):
        gate, up = (torch.randn(shape, generator=gen) * 4).to(dtype), torch.randn(shape, generator=gen).to(dtype)
        cases.append(Case(f"shape {shape}, {dtype}", (gate, up), call="silu_mul_kernel", hidden=hidden,
                          atol=tolerance[dtype], rtol=tolerance[dtype], hint=hint))
    chunk = ("at::parallel_for hands each call one chunk [begin, end): a loop that starts at 0 (or runs "
             "end - begin times from 0) writes other chunks' elements too, from another thread; index from begin")
    cases.insert(4, Case("one chunk [2050, 4099) of 4099 writes only its own elements", (4099, 2050, 4099),
                         call="chunk_writes", expected=[2050, 4099, 2049], expect_value=True, hint=chunk))
    cases.append(Case("a chunk [4096, 8192) writes only its own elements", (8192, 4096, 8192), call="chunk_writes",
                      expected=[4096, 8192, 4096], expect_value=True, hidden=True, hint=chunk))
    cases.append(Case("a transposed (non-contiguous) gate", (torch.randn(40, 30, generator=gen).t(),
                                                              torch.randn(30, 40, generator=gen)),
                      call="silu_mul_kernel", hidden=True, hint=hint))
    return cases


def _kernel_reference(gate, up):
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (torch.nn.functional.silu(gate.to(acc)) * up.to(acc)).to(gate.dtype).contiguous()


def _fake(gate, up):
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError("silu_mul: gate and up must have the same shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def _fake_cases(gen):
    strides = ("allocate what the C++ wrapper allocates: a contiguous tensor of gate's shape and dtype, also "
               "when gate is transposed or permuted (empty_like copies gate's strides unless told which memory "
               "format to use)")
    reject = "raise ValueError when the shapes or the dtypes differ, as the C++ wrapper refuses them"
    e = torch.empty
    return [
        Case("shape, strides and dtype", (e(3, 5), e(3, 5)), call="on_meta", hint=strides),
        Case("a transposed gate gives a contiguous output", (e(5, 3).t(), e(3, 5)), call="on_meta", hint=strides),
        Case("different shapes are rejected", (e(3, 5), e(3, 4)), call="on_meta", raises="ValueError", hint=reject),
        Case("different dtypes are rejected", (e(3, 5), e(3, 5, dtype=torch.float64)), call="on_meta",
             raises="ValueError", hint=reject),
        Case("bfloat16 inputs give a bfloat16 output", (e(3, 5, dtype=torch.bfloat16), e(3, 5, dtype=torch.bfloat16)),
             call="on_meta", hint=strides),
        Case("3-D bfloat16", (e(2, 3, 4, dtype=torch.bfloat16), e(2, 3, 4, dtype=torch.bfloat16)), call="on_meta",
             hidden=True, hint=strides),
        Case("a permuted 3-D gate", (e(4, 2, 3).permute(1, 2, 0), e(2, 3, 4)), call="on_meta", hidden=True,
             hint=strides),
        Case("no elements", (e(0, 7), e(0, 7)), call="on_meta", hidden=True, hint=strides),
    ]


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * gate * s


def _backward_cases(gen):
    hint = ("out = g * s * up with s = sigmoid(g) and ds/dg = s * (1 - s): d/dgate is the product rule on g * s, "
            "times up; d/dup is silu(g); multiply both by grad and return them in schema order (gate, up)")
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=gen, dtype=dtype)   # noqa: E731
    return [
        Case("gradients of gate and up", (r(4, 6) * 3, r(4, 6), r(4, 6)), call="backward_of", hint=hint),
        Case("float64", (r(5, dtype=torch.float64), r(5, dtype=torch.float64), r(5, dtype=torch.float64)),
             call="backward_of", atol=1e-10, rtol=1e-10, hint=hint),
        Case("large gates (no overflow)", (r(8) * 100, r(8), r(8)), call="backward_of", hint=hint),
        Case("gate of zeros", (torch.zeros(3, 3), r(3, 3), r(3, 3)), call="backward_of", hidden=True, hint=hint),
        Case("large gates, 2-D", (r(4, 5) * 300, r(4, 5), r(4, 5)), call="backward_of", hidden=True, hint=hint),
        Case("float64, 3-D", (r(2, 3, 4, dtype=torch.float64), r(2, 3, 4, dtype=torch.float64),
                              r(2, 3, 4, dtype=torch.float64)), call="backward_of", hidden=True, atol=1e-10,
             rtol=1e-10, hint=hint),
    ]


def _swiglu(x, w_gate, w_up, w_down):
    import torch.nn.functional as F
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def _swiglu_cases(gen):
    def weights(d, f):
        return (torch.randn(4, d, generator=gen), torch.randn(f, d, generator=gen) / 3,
                torch.randn(f, d, generator=gen) / 3, torch.randn(d, f, generator=gen) / 3)
    hint = ("silu_mul's first argument goes through the SiLU (the gate projection), its second multiplies it "
            "(the up projection); the down projection comes last, on the product")
    traced = ("torch.compile(fullgraph=True) could not trace your function in one graph, or its values or "
              "gradients differ. Look first in swiglu_mlp for Python that needs a tensor's value while tracing "
              "(.item(), .tolist(), bool() or an `if` on a tensor, printing a tensor): each is a graph break. "
              "Only if the error names the fake kernel or the backward is it exercise 2 or 3 (this check uses "
              "the ones your notebook registered)")
    return [
        Case("values", weights(8, 12), call="swiglu_values", atol=1e-4, hint=hint),
        Case("calls labs_ext.silu_mul", weights(8, 12), call="uses_silu_mul", expected=True, expect_value=True,
             hint="call torch.ops.labs_ext.silu_mul, not F.silu(...) * ...: the exercise is about your op"),
        Case("compiled with fullgraph=True: values and gradients", weights(8, 12), call="compiled_with_grads",
             atol=1e-4, hint=traced),
        Case("compiled, other sizes", weights(5, 7), call="compiled_with_grads", hidden=True, atol=1e-4, hint=traced),
    ]


RECORD_SCHEMA = "(Tensor(a!) gate, Tensor up, Tensor(b!) out, Tensor(c!) amax) -> ()"


def _record_schema_cases(gen):
    form = ("write the argument list only, from '(' on: the op's name is added for you. Keep the kernel's "
            "argument names in its order (gate, up, out, amax), each a Tensor")
    returns = ("the kernel returns None: an op that only writes its arguments has no value of its own to "
               "return, and its schema says so with '-> ()'")
    aliased = ("torch.compile refuses a custom op whose output aliases one of its inputs (opcheck's "
               "test_aot_dispatch_dynamic): the caller already holds every tensor the kernel writes")
    undeclared = ("opcheck's test_schema ran the kernel and found an argument written that the schema does not "
                  "declare as written: each one needs an alias annotation with '!'. Read the "
                  "kernel line by line: copy_, an in-place method (its name ends in _) and out= all write, "
                  "whatever the argument's name says it is for")
    extra = ("declare only the arguments the kernel writes: under torch.compile every argument declared as "
             "written is cloned and written back (auto_functionalized), so one it only reads costs a copy")
    letters = ("an alias letter names a set of tensors that may share memory: one letter on two arguments "
               "declares that they may be the same tensor. The kernel's written arguments are different "
               "tensors: give each a letter of its own")
    return [
        Case("the kernel's arguments, by name and in order", (), call="record_arguments",
             expected="gate, up, out, amax", expect_value=True, hint=form),
        Case("what the op returns", (), call="record_returns", expected="returns nothing", expect_value=True,
             hint=returns),
        Case("no output aliases an argument", (), call="record_aliased_returns",
             expected="no output aliases an argument", expect_value=True, hint=aliased),
        Case("opcheck passes (float32, 3 x 5)", ((3, 5), "float32"), call="record_opcheck",
             expected="every opcheck test passes", expect_value=True, hint=undeclared),
        Case("declares exactly the arguments the kernel writes", (), call="record_declarations",
             expected="declares exactly the arguments the kernel writes", expect_value=True, hint=extra),
        Case("alias letters", (), call="record_letters", expected="a letter of its own for each written argument",
             expect_value=True, hint=letters),
        Case("opcheck passes (bfloat16, 2 x 3 x 4)", ((2, 3, 4), "bfloat16"), call="record_opcheck",
             expected="every opcheck test passes", expect_value=True, hidden=True, hint=undeclared),
        Case("opcheck passes (float64, 7)", ((7,), "float64"), call="record_opcheck",
             expected="every opcheck test passes", expect_value=True, hidden=True, hint=undeclared),
    ]


# --- Lab 05: quantization ------------------------------------------------------------------------

def _quantize_weight(w, bits=8):
    qmax = 2 ** (bits - 1) - 1
    w = w.float()
    scales = w.abs().amax(dim=1) / qmax
    q = torch.where(scales[:, None] > 0, w / scales.clamp(min=torch.finfo(w.dtype).tiny)[:, None], 0.0)
    return torch.clamp(torch.round(q), -qmax, qmax).to(torch.int8), scales


def _quantize_weight_cases(gen):
    w = torch.randn(16, 32, generator=gen) * torch.logspace(-2, 1, 16)[:, None]
    codes = ("each code is its weight divided by its row's scale, rounded to the nearest integer and clamped to "
             "[-qmax, qmax], where qmax is the largest code `bits` signed bits can hold symmetrically (not 127 "
             "whatever bits says); stored as torch.int8")
    zero = w.clone()
    zero[3] = 0
    two_zero_rows = zero * torch.tensor([0.0 if i in (0, 3) else 1.0 for i in range(16)])[:, None]
    nan = ("0 / 0 is NaN, and what NaN becomes in torch.int8 depends on the CPU: where a row's scale is 0, "
           "make its codes 0 without dividing by that 0")
    fp32 = ("the scales are float32 whatever the weight's dtype, and computed in float32: a scale divided in "
            "bfloat16 or float16, even if widened afterwards, has lost bits that the int8 kernel's scales keep")
    return [
        Case("one fp32 scale per row", (w,), call="second", hint="a row's scale maps its largest magnitude to "
             "qmax: reduce over the inputs (the last dim), one value per output row, not one for the tensor"),
        Case("codes, within 1 of round(w / scale)", (w,), call="first_as_float", atol=1.0, rtol=0, hint=codes),
        Case("codes are torch.int8", (w,), call="dtype_of_first", hint="convert with .to(torch.int8)"),
        Case("codes are rounded, not truncated", (torch.tensor([[127.0, 10.75, -20.75, 3.25, -0.75, 0.25]]),),
             call="first_as_float", atol=0, rtol=0,
             hint=codes + "; converting a float to int8 truncates towards zero: round first"),
        Case("bits=4: codes in [-7, 7]", (w,), {"bits": 4}, call="first_as_float", atol=1.0, rtol=0, hint=codes),
        Case("a row of zeros: scale 0, codes 0, no NaN", (zero,), call="first_as_float", atol=1.0,
             rtol=0, hint="where a row's scale is 0 its codes are 0: do not divide 0 by 0"),
        Case("a row of zeros: no NaN becomes a code", (zero,), call="non_finite_cast_to_integer", hint=nan),
        Case("a row of zeros: its scale is exactly 0", (zero,), call="second", atol=0.0,
             hint="a row of zeros has scale 0, not a small eps: an eps kept in the scale is a row that is not there"),
        Case("a bfloat16 weight: float32 scales", (w.bfloat16(),), call="dtype_of_second", hint=fp32),
        Case("a bfloat16 weight: the scales' values", (w.bfloat16(),), call="second", hint=fp32),
        Case("two rows of zeros, bits=4", (two_zero_rows,), {"bits": 4}, call="first_as_float", hidden=True, atol=1.0,
             rtol=0, hint="where a row's scale is 0 its codes are 0: do not divide 0 by 0"),
        Case("two rows of zeros, bits=4: no NaN becomes a code", (two_zero_rows,), {"bits": 4},
             call="non_finite_cast_to_integer", hidden=True, hint=nan),
        Case("a float16 weight: float32 scales", (w.half(),), call="dtype_of_second", hidden=True, hint=fp32),
        Case("a float16 weight: the scales' values", (w.half(),), call="second", hidden=True, hint=fp32),
        Case("rows 1000x apart", (torch.randn(4, 8, generator=gen) * torch.tensor([[1e-3], [1.0], [1e3], [1.0]]),),
             call="second", hidden=True, hint="one scale per row, not per tensor"),
        Case("bits=2", (w,), {"bits": 2}, call="first_as_float", hidden=True, atol=1.0, rtol=0, hint=codes),
    ]


def _int8_linear(x, q, scales, bias):
    x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch._weight_int8pack_mm(x2, q, scales.to(torch.bfloat16)).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], q.shape[0])


def _int8_linear_cases(gen):
    w = torch.randn(24, 32, generator=gen) * torch.logspace(-1, 1, 24)[:, None]
    q, scales = _quantize_weight(w)
    bias = torch.randn(24, generator=gen)
    x3 = torch.randn(3, 5, 32, generator=gen)
    shapes = "reshape x to 2-D (rows, in_features) for the kernel and back afterwards; add the bias once"
    return [
        Case("values (3-D input, bias)", (x3, q, scales, bias), atol=0.05, rtol=0.02, hint=shapes),
        Case("output keeps the input's dtype", (x3, q, scales, bias), call="dtype_of",
             hint="the kernel returns its input's dtype; cast back with .to(x.dtype)"),
        Case("the kernel gets the activations of its fast path on this CPU", (x3, q, scales, bias),
             call="int8_kernel_path", expected="fast path", expect_value=True,
             hint="on x86 CPUs (AVX2, AVX512) the kernel is vectorized for bfloat16 activations only: fed fp32 "
                  "activations it is correct but runs a scalar loop (lesson 05). Hand it bfloat16 activations and "
                  "scales; on ARM CPUs both dtypes are vectorized and either passes"),
        Case("no bias", (x3, q, scales, None), atol=0.05, rtol=0.02, hint="bias may be None"),
        Case("no bias, 2-D input", (torch.randn(6, 32, generator=gen), q, scales, None), atol=0.05, rtol=0.02,
             hidden=True, hint="bias may be None"),
        Case("batch 1 (a 1-row 2-D input)", (torch.randn(1, 32, generator=gen), q, scales, bias), atol=0.05,
             rtol=0.02, hidden=True, hint=shapes),
    ]


def _quantize_model(model):
    import copy

    from torch import nn

    class Int8Linear(nn.Module):
        def __init__(self, linear):
            super().__init__()
            q, scales = _quantize_weight(linear.weight.detach())
            self.register_buffer("q", q)
            self.register_buffer("scales", scales)
            self.register_buffer("bias", linear.bias.detach().clone())

        def forward(self, x):
            return _int8_linear(x, self.q, self.scales, self.bias)

    def swap(module):
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child))
            else:
                swap(child)
        return module
    return swap(copy.deepcopy(model))


def _quantize_model_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    return [
        Case("every nn.Linear replaced", (64, seed), call="linears_left", expected=0, expect_value=True,
             hint="a Linear inside a child module (a Sequential, a block) is a Linear too: the walk must reach "
                  "every level, and replace each one where its parent holds it"),
        Case("the fp32 model is left untouched", (64, seed), call="original_untouched", expected=True,
             expect_value=True, hint="copy.deepcopy(model) first, then replace the copy's layers"),
        Case("argmax agrees with fp32 on 97% of inputs", (64, seed, 500), call="agreement_with_fp32", expected=True,
             expect_value=True, hint="one scale per output row (per channel): this model's rows differ by 1000x"),
        Case("at least 3x smaller", (64, seed), call="at_least_3x_smaller", expected=True, expect_value=True,
             hint="store int8 codes and one scale per row, not a float copy of the weight"),
        Case("a nested model: the Linears one level down", (64, seed), {"nested": True}, call="linears_left",
             expected=0, expect_value=True,
             hint="walk named_children() recursively: a child that is not an nn.Linear may hold Linears"),
        Case("another model, 97% agreement", (32, seed + 1, 500), call="agreement_with_fp32", expected=True,
             expect_value=True, hidden=True, hint="one scale per output row"),
        Case("another nested model", (32, seed + 2), {"nested": True}, call="linears_left", expected=0,
             expect_value=True, hidden=True,
             hint="walk named_children() recursively: a child that is not an nn.Linear may hold Linears"),
    ]


def _choose_plan():
    return {"fc1": ("channel", 4), "fc2": ("channel", 8), "fc3": ("channel", 8)}


def _plan_cases(gen):
    size = ("the bytes are the codes (bits / 8 per weight) plus 4 per scale: 8 bits on every layer is over the "
            "budget whatever the granularity, and a scale per group of 16 adds a quarter byte per weight. Spend "
            "the bits where a layer needs them, not everywhere")
    accuracy = ("for each layer, find where its weights' magnitudes spread (compare the largest magnitude of each "
                "row with that of each column): a scale per row absorbs a spread over rows (the "
                "output channels), while a spread over columns (the inputs) puts small and large weights in every "
                "row and every group of 16, where only more bits keep the small ones. plan_report's "
                "extra_wrong_alone measures each layer's choice on its own")
    valid = ("return a dict with the keys 'fc1', 'fc2', 'fc3', each mapped to (granularity, bits): granularity "
             "'tensor', 'channel' or 'group', bits 2, 4 or 8")
    return [
        Case("a (granularity, bits) for each layer", (), call="plan_is_valid",
             expected="a (granularity, bits) for each of fc1, fc2, fc3", expect_value=True, hint=valid),
        Case("weights within 23,000 bytes", (0,), call="plan_size", expected="within the size budget",
             expect_value=True, hint=size),
        Case("at most 4 more test images wrong than fp32", (0,), call="plan_accuracy",
             expected="within the accuracy budget", expect_value=True, hint=accuracy),
    ] + [Case(f"the same plan on the model trained with seed {seed}", (seed,), call="plan_accuracy",
              expected="within the accuracy budget", expect_value=True, hidden=seed != 4, hint=accuracy)
         for seed in (4, 1, 2, 3)]   # on seeds 0-4 the reference and the second solution lose at most 2 images


# --- Lab 06: attention ---------------------------------------------------------------------------

def _key_mask(lengths, max_len):
    keep = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]
    return keep[:, None, None, :]


def _key_mask_cases(gen):
    hint = "True where the key is a real token (position < length); shape (batch, 1, 1, max_len) broadcasts"
    return [
        Case("a boolean mask, True on real keys", ([3, 1, 4], 4, 2), call="broadcast_mask", hint=hint),
        Case("padding beyond the longest", ([2, 5], 7, 3), call="broadcast_mask", hint=hint),
        Case("batch 1", ([6], 6, 1), call="broadcast_mask", hidden=True, hint=hint),
        Case("every sequence full", ([4, 4, 4], 4, 2), call="broadcast_mask", hidden=True, hint=hint),
    ]


def _pack(seqs):
    lengths = torch.tensor([s.shape[0] for s in seqs])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return torch.cat(seqs), cu, int(lengths.max())


def _pack_cases(gen):
    tokens = ("the packed tensor holds every sequence's tokens one after another, in the order given, along the "
              "token dimension (dim 0); heads and head_dim stay as they are")
    dtype = "cumsum of int64 lengths is int64, and the flash kernel's offsets are int32: convert them"
    offsets = ("varlen_attn reads sequence i as the packed rows from cu_seq[i] to cu_seq[i + 1], so cu_seq has one "
               "entry more than there are sequences, and its first and last entries bound the whole packed tensor")
    longest = ("max_len is the length of the longest single sequence (not the total), as a Python int: a 0-d "
               "tensor is not an int, and the kernel takes it as an int argument")
    whole = "each part as the visible cases check it: the tokens, cu_seq's values and dtype, and max_len"
    seqs = lambda lengths: [torch.randn(n, 2, 4, generator=gen) for n in lengths]   # noqa: E731
    three = seqs([3, 7, 2])
    return [
        Case("three sequences: the packed tokens", (three,), call="first", hint=tokens),
        Case("three sequences: cu_seq's dtype", (three,), call="offsets_dtype", hint=dtype),
        Case("three sequences: cu_seq's values", (three,), call="offsets_as_int64", hint=offsets),
        Case("three sequences: max_len", (three,), call="max_len_kind", hint=longest),
        Case("one sequence", (seqs([5]),), hidden=True, hint=whole),
        Case("a sequence of length 1", (seqs([1, 9, 1, 4]),), hidden=True, hint=whole),
    ]


def _ops_dispatched(q, k, v, **kwargs):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.name())
            return func(*args, **(kwargs or {}))
    with Record() as rec:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    return rec.names


def _ops_cases(gen):
    x = torch.randn(1, 2, 32, 16, generator=gen)
    hint = "append func.name() for every op in __torch_dispatch__, call func, and pass every keyword to SDPA"
    v_narrow = torch.randn(1, 2, 32, 8, generator=gen)
    return [
        Case("the default choice", (x, x, x), call="backend_of", hint=hint),
        Case("dropout", (x, x, x), {"dropout_p": 0.2}, call="backend_of", hint=hint),
        Case("v of another head dim: MATH without dropout", (x, x, v_narrow), call="backend_of",
             hint="return the ops that really ran, recorded in __torch_dispatch__: the backend is read off them, "
                  "never guessed from the arguments (here no dropout, yet the fused CPU kernel declines)"),
        Case("a boolean mask", (x, x, x), {"attn_mask": torch.ones(32, 32, dtype=torch.bool).tril()},
             call="backend_of", hidden=True, hint=hint),
        Case("causal, float64", (x.double(), x.double(), x.double()), {"is_causal": True}, call="backend_of",
             hidden=True, hint=hint),
    ]


def _bucketed(seqs, n_buckets):
    from helpers import attention
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
    outs = [None] * len(seqs)
    for bucket in torch.tensor(order).tensor_split(n_buckets):   # exactly n_buckets runs (chunk can give fewer)
        idx = bucket.tolist()
        if not idx:
            continue
        for i, o in zip(idx, attention.padded_attention([seqs[i] for i in idx])):
            outs[i] = o
    return outs


def _bucket_cases(gen):
    lengths = [int(n) for n in torch.randint(1, 60, (7,), generator=gen)]
    seqs = lambda ls: [torch.randn(n, 2, 4, generator=gen) for n in ls]   # noqa: E731
    runs = ("sort the sequences by length first: a bucket of consecutive lengths pads least; call "
            "attention.padded_attention once per bucket")
    exact = ("the number of padded_attention calls must be n_buckets: a split by a bucket size rounded up (what "
             "torch.chunk does) leaves the last buckets empty, one rounded down leaves sequences out; split "
             "by the number of buckets")
    empty = ("with fewer sequences than buckets, some buckets are empty: skip them (padded_attention of an empty "
             "list fails), and still return one output per sequence")
    order = "remember each sequence's index when you sort, and put its output back there"
    few = [int(n) for n in torch.randint(1, 30, (2,), generator=gen)]
    nine = [int(n) for n in torch.randint(1, 60, (9,), generator=gen)]
    return [
        Case("values, in the original order", (seqs(lengths), 2), atol=1e-4, hint=order),
        Case("each bucket holds consecutive lengths", (seqs([40, 3, 35, 30, 5, 2]), 2), call="buckets_are_sorted_runs",
             expected=True, expect_value=True, hint=runs),
        Case("4 buckets for 6 sequences: exactly 4 runs", (seqs([12, 50, 7, 33, 21, 3]), 4),
             call="buckets_are_sorted_runs", expected=True, expect_value=True, hint=exact),
        Case("more buckets than sequences", (seqs([4, 9]), 3), atol=1e-4, hint=empty),
        Case("3 buckets, values", (seqs(lengths), 3), atol=1e-4, hidden=True, hint=order),
        Case("3 buckets hold consecutive lengths", (seqs(lengths), 3), call="buckets_are_sorted_runs", expected=True,
             expect_value=True, hidden=True, hint=runs),
        Case("more buckets than sequences, other lengths", (seqs(few), len(few) + 2), atol=1e-4, hidden=True,
             hint=empty),
        Case("4 buckets for 9 sequences: exactly 4 runs", (seqs(nine), 4), call="buckets_are_sorted_runs",
             expected=True, expect_value=True, hidden=True, hint=exact),
    ]


def _prefix_lm_mask_mod(lengths, prefix):
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    starts = torch.tensor([0] + list(lengths)).cumsum(0)[:-1]
    position = torch.arange(sum(lengths)) - starts[doc]        # each token's position inside its document

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & ((kv_idx <= q_idx) | (position[kv_idx] < prefix))
    return mask_mod


def _prefix_lm_cases(gen):
    causal = ("a token sees the keys of its own document up to and including itself; build the condition from "
              "tensor comparisons joined with & and | (no Python if, and, or: mask_mod runs once, under vmap, on "
              "index tensors)")
    prefix = ("the prefix is the first `prefix` tokens of EACH document, counted from that document's start (a "
              "position inside the document, not in the packed row), and only tokens of the same document see it")
    lengths = [int(n) for n in torch.randint(1, 12, (5,), generator=gen)]
    return [
        Case("prefix 0: causal inside each document", ([4, 3, 5], 0), call="dense_mask", hint=causal),
        Case("a prefix of 2 in each document", ([4, 3, 5], 2), call="dense_mask", hint=prefix),
        Case("a document shorter than the prefix", ([2, 6, 1], 3), call="dense_mask", hint=prefix),
        Case("random lengths, prefix 0", (lengths, 0), call="dense_mask", hidden=True, hint=causal),
        Case("random lengths, prefix 3", (lengths, 3), call="dense_mask", hidden=True, hint=prefix),
        Case("one document", ([9], 4), call="dense_mask", hidden=True, hint=prefix),
    ]


def _choose_bucket_count(lengths, call_cost, entry_cost, max_buckets):
    from helpers.grading.checks import _bucketing_cost
    return min(range(1, max_buckets + 1), key=lambda n: _bucketing_cost(lengths, n, call_cost, entry_cost))


def _bucket_count_cases(gen):
    padding = ("a padded call scores every (query, key) pair of each sequence in it, padding included: its cost "
               "grows with the sequences it holds times the square of its longest length, so on skewed lengths "
               "the padding of a few large buckets costs more than the calls more buckets add")
    calls = ("each padded_attention call costs call_cost however few sequences it holds: a count whose extra calls "
             "cost more than the padding they remove is not the cheapest")
    alike = "with lengths all alike there is no padding to remove: every bucket past the first only adds a call"
    tail = ("on long-tailed lengths both costs matter: a call costs call_cost however small, and a padded call "
            "scores its longest length squared for every sequence it holds; the verdict says which your count "
            "underweights")
    skewed = [12, 20, 9, 300, 15, 31, 8, 260, 40, 18, 25, 11]

    def case(name, lengths, call_cost, entry_cost, max_buckets, hint, hidden=True):
        return Case(name, (lengths, call_cost, entry_cost, max_buckets), call="bucket_count_verdict",
                    expected=BUCKET_COUNT_OK, expect_value=True, hidden=hidden, hint=hint)

    def lognormal(n, mean):   # lengths as serving sees them: most short, a long tail
        return [min(2048, max(1, int(v))) for v in torch.randn(n, generator=gen).add(mean).exp()]

    cases = [
        case("skewed lengths, cheap calls", skewed, 2e-4, 1e-8, 5, padding, hidden=False),
        case("the same lengths, an expensive call", skewed, 2e-3, 1e-8, 8, calls, hidden=False),
        case("lengths all alike", [64] * 10, 1e-4, 1e-8, 8, alike, hidden=False),
        case("one long outlier", [30] * 15 + [1000], 5e-4, 1e-8, 8, padding),
        case("fewer sequences than max_buckets", [5, 200, 40], 1e-5, 1e-8, 8, padding),
        case("uniform lengths, an expensive call",
             [int(v) for v in torch.randint(1, 512, (24,), generator=gen)], 5e-3, 1e-8, 8, calls),
    ]
    for i in range(4):
        n, mean = int(torch.randint(8, 40, (), generator=gen)), 3.5 + i / 2
        call_cost, entry_cost = (10 ** float(torch.empty(()).uniform_(low, low + 2, generator=gen)) for low in (-5, -9))
        cases.append(case(f"long-tailed lengths {i + 1} ({n} sequences)", lognormal(n, mean), call_cost, entry_cost,
                          4 + i, tail))
    return cases


# --- Lab 07: memory ------------------------------------------------------------------------------

def _predicted_bytes(model):
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    size = lambda ps: sum(p.numel() * p.element_size() for p in ps)   # noqa: E731
    return {"parameter": size(params), "gradient": size(trainable),
            "optimizer_state": 2 * size(trainable) + 4 * len(trainable)}


def _predicted_cases(gen):
    frozen = ("a frozen parameter is stored but gets no gradient and no optimizer state: count gradients and "
              "Adam's state over the parameters with requires_grad only")
    dtype = ("a parameter's bytes depend on its dtype: a bfloat16 element takes 2 bytes, not 4; a gradient and "
             "Adam's moments take the dtype of their parameter (only the step counter is float32)")
    adam = ("Adam keeps more per trainable parameter than one tensor: reread what the exercise lists (and the "
            "lesson's reveal), the per-tensor counter included")
    width, depth = (int(v) for v in torch.randint(24, 64, (2,), generator=gen))
    depth = 2 + depth % 3
    return [
        Case("float32, every layer trainable", (32, 3, 0, "float32"), call="predict_for",
             hint=adam),
        Case("the first 2 layers frozen", (32, 3, 2, "float32"), call="predict_for", hint=frozen),
        Case("bfloat16 parameters", (48, 2, 1, "bfloat16"), call="predict_for", hint=dtype),
        Case("bfloat16, another model", (width, depth, 1, "bfloat16"), call="predict_for", hidden=True, hint=dtype),
        Case("everything frozen but the head", (16, 4, 4, "float32"), call="predict_for", hidden=True, hint=frozen),
    ]


def _keep_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    # keep a matmul's output only where it is wider than the matmul's input: up's and gate's, which
    # backward reads (gelu's and mul's backward); down's output is read by no backward formula
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and args[-1].shape[-1] > args[-2].shape[-1]:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _keep_policy_cases(gen):
    recomputes = ("backward recomputed a matmul: an output that backward reads and that you let be recomputed is "
                  "rebuilt from its inputs, and if a matmul made it, that is a matmul redone. Keep the matmul "
                  "outputs that backward needs; let only the cheap pointwise ops be recomputed")
    too_much = ("your policy keeps as many bytes as saving every matmul output, or more: at least one output it "
                "keeps is read by no backward formula. Recomputation stops once it has rebuilt the last tensor "
                "backward needs, so keeping such an output saves no work and costs its bytes in every block. Go "
                "through the block op by op and ask which saved tensor each op's backward reads")
    sizes = [(48, 2, 96), (64, 4, 200)]
    cases = [
        Case("no matmul recomputed in backward (width 32, 3 blocks, batch 128)", (32, 3, 128),
             call="matmul_flops_recomputed", expected=0, expect_value=True,
             hint=recomputes),
        Case("fewer bytes kept than save_matmuls (width 32, 3 blocks, batch 128)", (32, 3, 128),
             call="keeps_fewer_bytes_than_save_matmuls", expected=True, expect_value=True, hint=too_much),
    ]
    for width, depth, batch in sizes:
        cases += [
            Case(f"no matmul recomputed (width {width}, {depth} blocks, batch {batch})", (width, depth, batch),
                 call="matmul_flops_recomputed", expected=0, expect_value=True, hidden=True, hint=recomputes),
            Case(f"fewer bytes kept than save_matmuls (width {width}, {depth} blocks, batch {batch})",
                 (width, depth, batch), call="keeps_fewer_bytes_than_save_matmuls", expected=True,
                 expect_value=True, hidden=True, hint=too_much),
        ]
    return cases


def _accumulate(model, x, y, micro):
    from torch import nn
    model.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        (nn.functional.mse_loss(model(xs), ys) * (xs.shape[0] / x.shape[0])).backward()


def _accumulate_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    weights = ("mse_loss is a mean over its own chunk: the sum of the chunks' losses is not the batch's mean "
               "loss until each chunk counts in proportion to the rows it holds")
    unequal = ("with unequal chunks, dividing by the number of chunks gives a small chunk the weight of a large "
               "one: weight each chunk by its share of the batch's rows instead")
    stale = ("the parameters held gradients from an earlier step, and yours were added to them: clear them once, "
             "before the first chunk")
    last = ("only the last chunk's gradients are left: clearing the gradients inside the loop throws away what "
            "the earlier chunks accumulated; clear them once, before the loop")
    once = ("backward ran fewer times than there are chunks: summing the chunks' losses and calling backward "
            "once keeps every chunk's activations alive until the end, the memory accumulation is meant to save. "
            "Call backward on each chunk's loss inside the loop")
    ahead = ("a forward keeps the activations its backward needs until that backward runs: forwards run ahead of "
             "their backwards (the losses kept for later, or a graph retained) hold several chunks' activations at "
             "once, the memory accumulation is meant to save")
    return [
        Case("4 equal chunks", (16, 2, 32, 4, seed), call="accumulated_grads", atol=1e-5, hint=weights),
        Case("a batch that 4 does not divide (10 rows)", (16, 2, 10, 4, seed), call="accumulated_grads", atol=1e-5,
             hint=unequal),
        Case("gradients left from an earlier step are not added", (8, 2, 12, 3, seed), {"stale_grads": True},
             call="accumulated_grads", atol=1e-5, hint=stale),
        Case("every chunk counts, not only the last", (16, 2, 32, 4, seed), call="only_last_chunk_counts",
             expected=False, expect_value=True, hint=last),
        Case("one backward per chunk", (16, 2, 10, 4, seed), call="accumulations_per_parameter", expected=4,
             expect_value=True, hint=once),
        Case("one chunk's activations alive at a time (4 chunks of 32 rows)", (16, 2, 32, 4, seed),
             call="activations_of_one_chunk", hint=ahead),
        Case("one chunk", (8, 3, 9, 1, seed), call="accumulated_grads", atol=1e-5, hidden=True, hint=weights),
        Case("7 rows in 3 chunks", (12, 2, 7, 3, seed), call="accumulated_grads", atol=1e-5, hidden=True, hint=unequal),
        Case("stale gradients, 7 rows in 3 chunks", (12, 2, 7, 3, seed + 1), {"stale_grads": True},
             call="accumulated_grads", atol=1e-5, hidden=True, hint=stale),
        Case("one backward per chunk, 3 chunks", (12, 2, 7, 3, seed), call="accumulations_per_parameter", expected=3,
             expect_value=True, hidden=True, hint=once),
        Case("one chunk's activations alive at a time, 7 rows in 3 chunks", (12, 2, 7, 3, seed),
             call="activations_of_one_chunk", hidden=True, hint=ahead),
    ]


# --- Lab 08: debugging ---------------------------------------------------------------------------

def _hashes_differ(p, q, rtol):
    import math
    if math.isnan(p) or math.isnan(q):
        return math.isnan(p) != math.isnan(q)
    if math.isinf(p) or math.isinf(q):          # inf - x is inf, and so is rtol * inf: test them on their own
        return p != q
    return abs(p - q) > rtol * max(abs(p), abs(q))


def _first_difference(a, b, rtol=0.0):
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(_hashes_differ(p, q, rtol) for p, q in zip(ha, hb)):
            return i
    return None


def _trace_cases(gen):
    names = ["aten.addmm.default", "aten.tanh.default", "aten.mm.default", "aten.sum.default", "aten.relu.default"]
    values = [float(v) for v in torch.rand(10, generator=gen) * 100]
    trace = [(names[i % 5], (values[2 * i], values[2 * i + 1])) for i in range(5)]
    changed = lambda i, j, f: [(n, tuple(h * f if (k, m) == (i, j) else h for m, h in enumerate(hs)))   # noqa: E731
                               for k, (n, hs) in enumerate(trace)]
    nan_at = lambda t, i: [(n, tuple(float("nan") if k == i else h for h in hs)) if k >= i else (n, hs)  # noqa: E731
                           for k, (n, hs) in enumerate(t)]
    hint = ("compare every hash of each op, in order; two hashes differ when the gap between them is larger "
            "than rtol times the larger of their magnitudes")
    nan = ("a NaN compares False with everything, so |p - q| > t is False when p or q is NaN: a NaN hash in one "
           "trace and a number in the other must count as a difference, tested on its own")
    scaled = [(n, tuple(h * 1e4 for h in hs)) for n, hs in trace]
    set_at = lambda t, i, h: [(n, (h,) + hs[1:]) if k == i else (n, hs) for k, (n, hs) in enumerate(t)]  # noqa: E731
    inf = ("an infinite hash (an overflow in that op) against a finite one, or against the other infinity, is a "
           "difference, but |inf - x| is inf and rtol times inf is inf too (NaN when rtol is 0), so a relative "
           "test never fires there: test infinite hashes on their own")
    zero = ("a hash can be 0 (an op whose output is all zeros): a relative difference that divides by a hash, "
            "or by the larger magnitude, divides by 0 there; scale rtol by the magnitude instead of dividing")
    return [
        Case("identical traces", (trace, trace), hint="when nothing differs, there is no index to return"),
        Case("the op that differs first", (trace, changed(3, 0, 1 + 1e-4)), hint=hint),
        Case("rtol is relative", (trace, changed(3, 0, 1 + 1e-4)), {"rtol": 1e-2}, hint=hint),
        Case("rtol is relative, not absolute (hashes near 1e6)", (scaled, [(n, tuple(h * (1 + 1e-4) if i == 3 else h
             for h in hs)) for i, (n, hs) in enumerate(scaled)]), {"rtol": 1e-2}, hint=hint),
        Case("different programs are refused", (trace, trace[:-1] + [("aten.cos.default", (0.0,))]),
             raises="ValueError", hint="compare the op names of the two traces first"),
        Case("a NaN in one trace differs from a number", (trace, nan_at(trace, 2)), {"rtol": 1e-2}, hint=nan),
        Case("NaN in both traces is not a difference", (nan_at(trace, 1), nan_at(trace, 1)), hint=(
            "the two runs agree when both hashes are NaN: only NaN against a number is a difference")),
        Case("only the second hash differs", (trace, changed(2, 1, 1.5)),
             hint="check every hash of an op, not only the first"),
        Case("traces of different lengths are refused", (trace, trace[:3]), raises="ValueError",
             hint="a shorter trace dispatched different ops: compare the whole list of names"),
        Case("an infinite hash against a finite one", (trace, set_at(trace, 2, float("inf"))), {"rtol": 1e-2},
             hint=inf),
        Case("hashes of 0 in both traces, a difference after them", (set_at(trace, 1, 0.0),
             set_at(changed(3, 0, 1.5), 1, 0.0)), {"rtol": 1e-2}, hint=zero),
        Case("a difference in the first op", (trace, changed(0, 1, 2.0)), hidden=True, hint=hint),
        Case("only the second hash differs, another op", (trace, changed(4, 1, 0.5)), hidden=True,
             hint="check every hash of an op, not only the first"),
        Case("a NaN in the first op", (nan_at(trace, 0), trace), hidden=True, hint=nan),
        Case("a longer second trace is refused", (trace[:2], trace), raises="ValueError", hidden=True,
             hint="a longer trace dispatched different ops: compare the whole list of names"),
        Case("empty traces", ([], []), hidden=True, hint="nothing differs: there is no index to return"),
        Case("-inf against inf", (set_at(trace, 3, float("-inf")), set_at(trace, 3, float("inf"))), hidden=True,
             hint=inf),
        Case("the same infinity in both traces is not a difference", (set_at(trace, 1, float("inf")),
             set_at(trace, 1, float("inf"))), {"rtol": 1e-2}, hidden=True,
             hint="the two runs agree when both hashes are the same infinity"),
        Case("a hash of 0 against a number", (set_at(trace, 4, 0.0), trace), hidden=True, hint=zero),
    ]


def _safe_normalize(v, eps=1e-12):
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(eps)


def _normalize_cases(gen):
    v = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]])
    values = ("F.normalize divides each row (the last dimension) by its norm, but never by less than eps: "
              "a zero row stays zero instead of 0 / 0")
    eps = ("eps is the smallest value the norm may take, not an amount added to it: rows whose norm is below "
           "eps are divided by eps itself")
    nan = ("the gradient at the zero row is NaN although your norm is clamped: sqrt's derivative at 0 is "
           "infinite, and backward multiplies it by the zero that the clamp passes back (or by the zero row), "
           "and inf * 0 is NaN. A clamp after the square root cannot help; the square root's own backward must "
           "never see 0. Anomaly mode (torch.autograd.detect_anomaly) names the op")
    grads = ("the gradient at the zero row is not F.normalize's: below eps the function is v / eps, and so is "
             "its gradient. Adding eps under the square root gives a different function near zero (NaN "
             "gradients: see the finite-gradient check first)")
    z = torch.randn(2, 3, 4, generator=gen)
    z[1, 2] = 0
    return [
        Case("values", (v,), hint=values),
        Case("a larger eps", (v,), {"eps": 1e-2}, hint=eps),
        Case("finite gradients at a zero row", (v,), call="grad_is_finite", expected=True, expect_value=True,
             hint=nan),
        Case("F.normalize's gradients, a zero row included", (v,), call="grad_of_sum", rtol=1e-3, hint=grads),
        Case("1-D input", (torch.randn(5, generator=gen),), hidden=True, hint=values),
        Case("3-D with a zero row: finite gradients", (z,), call="grad_is_finite", expected=True, expect_value=True,
             hidden=True, hint=nan),
        Case("3-D with a zero row: gradients", (z,), call="grad_of_sum", rtol=1e-3, hidden=True, hint=grads),
        Case("a larger eps: gradients", (v[[0, 2]],), {"eps": 1e-2}, call="grad_of_sum", rtol=1e-3, hidden=True,
             hint=eps),
    ]


def _prepare(batch):
    torch._dynamo.decorators.mark_unbacked(batch, 0)
    return batch


def _prepare_cases(gen):
    hint = ("mark_dynamic still specialises sizes 0 and 1: a batch of 1 recompiles, or raises with min=1. "
            "Look in torch._dynamo.decorators for the marking that makes a size a symbol for every value")
    return [
        Case("no recompiles for sizes 8, 9, 100, 3", ((8, 9, 100, 3),), call="recompiles", expected=0,
             expect_value=True, hint="mark the batch dimension (0) dynamic before each call"),
        Case("no recompiles (and no error) for sizes 8, 1, 512, 2", ((8, 1, 512, 2),), call="recompiles", expected=0,
             expect_value=True, hint=hint),
        Case("a batch of 1 first", ((1, 7, 300),), call="recompiles", expected=0, expect_value=True, hidden=True,
             hint=hint),
    ]


class _VectorHead(torch.nn.Module):
    """TokenHead's forward over the whole batch at once, with TokenHead's own projection."""

    def __init__(self, proj):
        super().__init__()
        self.proj = proj

    def forward(self, x):
        return self.proj((x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5)).amax(1)


def _export_and_reload(module, example, path):
    batch = torch.export.Dim("batch", min=1, max=512)
    program = torch.export.export(_VectorHead(module.proj), (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, path)
    return torch.export.load(path).module()


def _export_cases(gen):
    seed = int(torch.randint(0, 1000, (), generator=gen))
    loop = ("torch.export refused the batch dimension you declared dynamic: the forward's Python loop over "
            "range(batch) runs once per example while export traces it, so the program can only have the "
            "example's batch size. Write the forward without the loop, with ops that work on every example of "
            "the batch at once, and export that")
    values = ("the exported program does not compute what TokenHead computes for each example: the same "
              "statistics over the same dimension (the tokens, per example and per feature), the same "
              "projection, the same maximum")
    dynamic = ("by default torch.export specialises every dimension to the example's size, and the loaded "
               "program refuses other batch sizes: declare the batch dimension dynamic, with "
               "dynamic_shapes and a torch.export.Dim. (with Dim.AUTO, export quietly specialises whatever the "
               "code makes constant; a Dim with a range makes it say what did)")
    saved = ("nothing loadable at `path`, or a program that does not take these batches: save the exported "
             "program there (torch.export.save) and return what loading it gives")
    return [
        Case("export accepts the batch as dynamic (a loop-free forward)", (seed, 8), call="export_specialised_the_batch",
             expected=False, expect_value=True,
             hint=loop),
        Case("returns the loaded module (callable)", (seed, 8), call="returns_a_module", expected=True,
             expect_value=True, hint=("return what .module() of the loaded program gives: an ExportedProgram "
                                      "itself cannot be called")),
        Case("the example's batch", (seed, 8, [8]), call="exported_outputs", atol=1e-5, hint=values),
        Case("other batch sizes: 5, 1, 512", (seed, 8, [5, 1, 512]), call="exported_outputs", atol=1e-5,
             hint=dynamic),
        Case("the program saved at path takes batches 5, 1, 512", (seed, 8, [5, 1, 512]), call="saved_program_outputs",
             atol=1e-5, hint=saved),
        Case("an example of batch 3, then 64 and 2", (seed + 1, 3, [64, 2]), call="exported_outputs", atol=1e-5,
             hidden=True, hint=dynamic),
        Case("the saved program, an example of batch 3", (seed + 1, 3, [64, 2]), call="saved_program_outputs",
             atol=1e-5, hidden=True, hint=saved),
    ]


SPECS.update({spec.lab: spec for spec in (
    LabSpec("01_data_loading_lab", (
        Exercise("Exercise 1: augment", "augment", _augment_cases, augment),
        Exercise("Exercise 2: ordered_map", "ordered_map", _ordered_map_cases, _ordered_map,
                 forbidden=("helpers.data.thread_map", "helpers.data.serial_map", "helpers.data.dataloader",
                            "helpers.data.nodes_loader"),
                 refused="the helpers' loaders are lesson 01's answers to this question: start the threads yourself "
                         "and decide how far ahead of the consumer they may read"),
    )),
    LabSpec("02_fusion_lab", (
        Exercise("Exercise 1: combo_grid", "combo_grid", _combo_grid_cases, _combo_grid,
                 forbidden=("helpers.fusion.combo_grid",),
                 refused="helpers.fusion.combo_grid sizes the grid for you: derive each part's programs from its "
                         "size and the block"),
        Exercise("Exercise 2: the combo kernel's dispatch", "launch_three_part", _combo_launch_cases, _combo_reference,
                 needs=("triton_interpreter",),
                 forbidden=("helpers.fusion.combo_reference", "helpers.fusion.combo_launch"),
                 refused="the helpers' combo reference and launcher compute the answer for you: your kernel finds "
                         "its part from its own program id"),
        Exercise("Exercise 3: plan the combo launch", "plan_combo_launch", _combo_plan_cases, _combo_plan,
                 forbidden=("helpers.fusion.inductor_combo_dispatch_strategy", "helpers.fusion.combo_dispatch_strategy",
                            "helpers.fusion.combo_utilization", "helpers.fusion.round_robin_grid",
                            "helpers.fusion.inductor_dispatch_code",
                            "torch._inductor.codegen.triton_combo_kernel.ComboKernel"),
                 refused="these helpers and Inductor's ComboKernel make the decision for you: apply Inductor's rule "
                         "to the sizes yourself"),
        Exercise("Exercise 4: predicted kernel counts", "predicted_kernel_functions",
                 lambda gen: [Case("the four functions", (), call="sealed_counts",
                                   hint="the name in brackets is a function you predicted wrong (both counts shown "
                                        "sealed, so as not to give them away): on the CPU, Inductor's "
                                        "C++ backend puts consecutive loops into one function, and only a call it "
                                        "does not generate itself splits them; reread each function for one, and predict "
                                        "without running torch.compile")],
                 _kernel_counts,
                 forbidden=("helpers.fusion.inspect_compiled", "torch.compile",
                            "torch._inductor.utils.run_and_get_code"),
                 refused="compiling and counting measures the answer instead of predicting it: predict from each "
                         "function's operations and what Inductor generates itself"),
    ), allow_processes=True),
    LabSpec("03_moe_lab", (
        Exercise("Exercise 1: permute_tokens", "permute_tokens", _permute_cases, _permute,
                 forbidden=("helpers.moe.permute",),
                 refused="helpers.moe.permute is the permutation you are writing: sort the positions by expert and "
                         "count each expert's rows yourself, without reading a count back to the CPU"),
        Exercise("Exercise 2: fallback_grouped_gemm", "fallback_grouped_gemm", _fallback_cases, _fallback,
                 forbidden=("grouped_mm", "_grouped_mm", "bmm", "baddbmm", "helpers.moe.loop_gemm",
                            "helpers.moe.grouped_gemm", "helpers.moe.triton_gemm", "helpers.moe.padded_bmm"),
                 refused="grouped_mm, bmm and the helpers' GEMMs are what this fallback stands in for: give each "
                         "expert one matmul on its own rows"),
        Exercise("Exercise 3: expert_ffn without padding", "expert_ffn", _expert_ffn_cases, _expert_ffn,
                 forbidden=("bmm", "baddbmm", "helpers.moe.padded_bmm", "helpers.moe.moe_layer"),
                 refused="a bmm needs every expert padded to the same number of rows, the waste this exercise "
                         "removes, and moe_layer runs the whole layer for you: run each expert on its own rows"),
    )),
    LabSpec("04_custom_op_lab", (
        Exercise("Exercise 1: the C++ kernel body", "silu_mul_body", _kernel_cases,
                 lambda: KERNEL_BODY, needs=("cxx", "ninja")),
        Exercise("Exercise 2: the fake kernel", "silu_mul_fake", _fake_cases, _fake),
        Exercise("Exercise 3: the autograd formula", "backward", _backward_cases, _backward,
                 forbidden=("silu", "silu_backward", "sigmoid_backward"),
                 refused="F.silu, silu_backward and sigmoid_backward are the formula you are asked to write: build "
                         "both gradients on torch.sigmoid with the product rule"),
        Exercise("Exercise 4: SwiGLU with the op", "swiglu_mlp", _swiglu_cases, _swiglu),
        Exercise("Exercise 5: the schema of an op that writes", "silu_mul_record_schema", _record_schema_cases,
                 lambda: RECORD_SCHEMA),
    ), allow_processes=True),
    LabSpec("05_quantization_lab", (
        Exercise("Exercise 1: quantize_weight", "quantize_weight", _quantize_weight_cases, _quantize_weight,
                 forbidden=("helpers.quant.quantize_per_channel", "helpers.quant.minmax_scale",
                            "helpers.quant.quantize", "quantize_per_channel", "fake_quantize_per_channel_affine"),
                 refused="the quantizers of torch and helpers.quant compute the scales and codes for you: derive "
                         "each row's scale from its values and round to codes yourself"),
        Exercise("Exercise 2: int8_linear", "int8_linear", _int8_linear_cases, _int8_linear,
                 forbidden=("helpers.quant.Int8WeightOnlyLinear",),
                 refused="helpers.quant.Int8WeightOnlyLinear is the layer exercise 3 wraps around this function: "
                         "call the int8 kernel yourself; which activations to hand it is this exercise's decision"),
        Exercise("Exercise 3: quantize_model", "quantize_model", _quantize_model_cases, _quantize_model,
                 forbidden=("helpers.quant.swap_linears", "helpers.quant.Int8WeightOnlyLinear",
                            "torch.ao.quantization.quantize_dynamic", "torch.ao.quantization.quantize_dynamic_jit",
                            "quantize_per_channel", "quantize_per_tensor",
                            "quantize_per_tensor_dynamic"),
                 refused="the library quantizers find and swap the layers for you: find every nn.Linear, nested ones"
                         " included, and replace it yourself"),
        Exercise("Exercise 4: a plan under two budgets", "choose_plan", _plan_cases, _choose_plan, needs=("sklearn",)),
    )),
    LabSpec("06_attention_lab", (
        Exercise("Exercise 1: key_mask", "key_mask", _key_mask_cases, _key_mask,
                 forbidden=("helpers.attention.pad_with_mask",),
                 refused="helpers.attention.pad_with_mask builds this mask for you: compare key positions with the "
                         "lengths yourself"),
        Exercise("Exercise 2: pack", "pack", _pack_cases, _pack, forbidden=("helpers.attention.pack",),
                 refused="helpers.attention.pack is the function you are writing: concatenate the tokens and compute"
                         " the offsets yourself"),
        Exercise("Exercise 3: ops_dispatched", "ops_dispatched", _ops_cases, _ops_dispatched,
                 forbidden=("helpers.attention.OpNames", "helpers.attention.backend_that_runs",
                            "helpers.attention.backend_report"),
                 refused="these helpers record the dispatched ops for you: write the dispatch mode that records them"),
        Exercise("Exercise 4: bucketed_attention", "bucketed_attention", _bucket_cases, _bucketed),
        Exercise("Exercise 5: a prefix-LM document mask", "prefix_lm_mask_mod", _prefix_lm_cases,
                 _prefix_lm_mask_mod),
        Exercise("Exercise 6: choose the bucket count", "choose_bucket_count", _bucket_count_cases,
                 _choose_bucket_count),
    )),
    LabSpec("07_memory_lab", (
        Exercise("Exercise 1: predicted_bytes", "predicted_bytes", _predicted_cases, _predicted_bytes,
                 forbidden=("helpers.memory.profile_steps", "helpers.memory.timeline"),
                 refused="profiling measures the bytes instead of predicting them: count them from the parameters, "
                         "which ones train, and what Adam keeps"),
        Exercise("Exercise 2: keep_policy", "keep_policy", _keep_policy_cases, _keep_policy,
                 forbidden=("helpers.memory.save_matmuls", "helpers.memory.gated_stack",
                            "helpers.memory.checkpoint_comparison"),
                 refused="these helpers hold a ready policy: decide for each op yourself whether to keep its output "
                         "or recompute it"),
        Exercise("Exercise 3: accumulate_grads", "accumulate_grads", _accumulate_cases, _accumulate),
    )),
    LabSpec("08_debugging_lab", (
        Exercise("Exercise 1: first_difference", "first_difference", _trace_cases, _first_difference,
                 forbidden=("helpers.debugging.first_divergence", "helpers.debugging.op_differences"),
                 refused="these helpers find the first difference for you: compare the traces yourself"),
        Exercise("Exercise 2: safe_normalize", "safe_normalize", _normalize_cases, _safe_normalize,
                 forbidden=("normalize",),
                 refused="normalize guards the zero vector for you: find where the NaN in the gradient comes from, "
                         "and guard that step"),
        Exercise("Exercise 3: prepare", "prepare", _prepare_cases, _prepare),
        Exercise("Exercise 4: export_and_reload", "export_and_reload", _export_cases, _export_and_reload,
                 forbidden=("torch.jit.trace", "torch.jit.script", "torch.jit.save", "torch.jit.load"),
                 refused="TorchScript is what this exercise leaves: export the model with torch.export and load what"
                         " it saved"),
    )),
)})


# --- Lab 09: migration ---------------------------------------------------------------------------

def _recorded_matrix():
    """(run A, run B, report) of the recorded 2.9.1 -> 2.10.0 driver run shipped with the package."""
    from helpers.validation import labcheck
    return labcheck.load_matrix(labcheck.RECORDED)


def _paired_interval(rounds_a, rounds_b, better):
    import numpy as np

    from helpers.validation import stats
    if len(rounds_a) != len(rounds_b) or len(rounds_a) < 2:
        raise ValueError(f"pairs need the same number of rounds on each side, at least two; got {len(rounds_a)} "
                         f"and {len(rounds_b)}")
    r = stats.paired_interval([float(np.median(x)) for x in rounds_a], [float(np.median(x)) for x in rounds_b],
                              better)
    return r["gain"], r["low"], r["high"]


def _rounds(gen, medians, shared, spread, n):
    """Per-call samples of rounds: round i's median times a slow stretch shared with the other side's
    round i (`shared[i]`), with independent per-call noise of `spread` (log scale)."""
    return [[float(m * s * v) for v in torch.exp(spread * torch.randn(n, generator=gen, dtype=torch.float64))]
            for m, s in zip(medians, shared)]


def _paired_cases(gen):
    from helpers.validation import stats
    run_a, run_b, _ = _recorded_matrix()
    unet = [stats.split_rounds(f["samples"], f.get("groups"))
            for f in (run["workloads"]["unet_attention"]["figures"]["iteration_time"] for run in (run_a, run_b))]
    gain = ("the gain is the geometric mean of the per-round gains (each round's median; for a time A / B, for a "
            "throughput B / A), not a ratio of averages over all rounds")
    width = ("the interval's width: where the feedback names a mistake, that ingredient of step 3 differs; "
             "otherwise compare each ingredient in turn (a resampling of the pairs is not a t interval)")
    rounds = "one value per round (its median): the rounds are the pairs, not the calls within them"
    slow = [1.0, 1.6, 0.9, 1.3, 1.0, 2.2]                  # slow stretches that hit both runs of a round pair
    jitter = (1 + 0.03 * torch.randn(6, generator=gen, dtype=torch.float64)).tolist()
    a6 = _rounds(gen, [0.020] * 6, slow, 0.05, 12)
    b6 = _rounds(gen, [0.022 * j for j in jitter], slow, 0.05, 12)
    a3 = _rounds(gen, [50.0] * 3, [1.0, 0.7, 1.2], 0.05, 9)
    b3 = _rounds(gen, [46.0, 47.5, 44.0], [1.0, 0.7, 1.2], 0.05, 9)
    skew = [[0.01, 0.011, 0.012, 0.5], [0.02, 0.021, 0.022, 0.9, 0.95]], [[0.011, 0.012, 0.013, 0.3],
                                                                       [0.025, 0.026, 0.027, 0.04, 0.05]]
    stub = "this case passes once the function runs without the pipeline's statistics"
    cases = [Case("written without stats.paired_interval or stats.compare_figure", (a6, b6, "lower"),
                  call="called", expected="called", expect_value=True, hint=stub)]
    for name, args, hidden, hint in (
            ("times, 6 rounds with slow stretches shared by each pair, B about 10% slower", (a6, b6, "lower"),
             False, gain),
            ("throughputs (better higher), 3 rounds", (a3, b3, "higher"), False, gain),
            ("3 pairs", (a3, b3, "higher"), False, gain),
            ("rounds of unequal length with slow outliers", (*skew, "lower"), False, rounds),
            ("the recorded UNet step times", (*unet, "lower"), False, gain),
            ("2 pairs", (a6[:2], b6[:2], "lower"), True, gain),
            ("8 pairs, throughputs", (_rounds(gen, [9.0] * 8, [1.0, 0.8] * 4, 0.1, 7),
                                      _rounds(gen, [10.0] * 8, [1.0, 0.8] * 4, 0.1, 7), "higher"), True, gain),
            ("identical rounds", ([[1.0, 2.0]] * 3, [[1.0, 2.0]] * 3, "lower"), True, gain)):
        cases.append(Case(f"{name}: the gain", args, call="first", rtol=1e-6, atol=0, hidden=hidden, hint=hint))
        cases.append(Case(f"{name}: the 95% interval", args, call="interval_named", rtol=1e-6, atol=0,
                          hidden=hidden, hint=width))
    bad = "check that both sides have the same number of rounds, at least two, and say so in a ValueError"
    cases += [Case("3 rounds against 4: a ValueError", (a3, a6[:4], "lower"), raises="ValueError", hint=bad),
              Case("one round a side: a ValueError", (a3[:1], b3[:1], "higher"), call="own_value_error",
                   expected="its own ValueError", expect_value=True,
                   hint="check the number of pairs yourself before computing anything: with one pair, a library "
                        "call failing on zero degrees of freedom (or returning NaN) is not the ValueError that says "
                        "why"),
              Case("5 rounds against 2: a ValueError", (a6[:5], b6[:2], "lower"), raises="ValueError", hidden=True,
                   hint=bad)]
    return cases


def _decide(row, wanted):
    from helpers.validation import stats
    if row.get("low") is None:
        return "cannot tell"
    verdict = stats.verdict(row)
    if verdict != "within noise":
        return verdict
    return "no change of that size" if row["detectable"] <= wanted else "cannot tell"


def _decide_cases(gen):
    from helpers.validation import stats
    floor = (f"a change within {stats.MIN_CHANGE:.0%} is never a regression or an improvement, however tight its "
             f"interval")
    interval = "a regression needs the whole interval below 1, an improvement the whole interval above 1"
    seen = ("within noise, the run rules out a change of `wanted` only if it could have detected one that size "
            "(detectable <= wanted, both fractions)")
    pairs = "with no interval (fewer than two pairs, or a figure not reported) the data cannot tell"
    first = ("the interval decides first: a whole interval below 1 with the gain beyond the floor is a regression "
             "whatever the detectable change; detectable only splits the rest")
    on_gain = ("the 2% floor applies to the gain, not to the interval's end: the interval has only to lie wholly "
               "below (above) 1")
    inverse = (f"the floor below 1 is 1 / (1 + MIN_CHANGE) (B {stats.MIN_CHANGE:.0%} slower: A / B = 1 / "
               f"{1 + stats.MIN_CHANGE}), not 1 - MIN_CHANGE")
    strict = "an interval that ends at 1 contains 1: wholly below 1 is high < 1, wholly above 1 is low > 1"
    floor_below = 1 / (1 + stats.MIN_CHANGE)

    def row(gain, low, high, detectable, pairs=4):
        return {"gain": gain, "low": low, "high": high, "detectable": detectable, "pairs": pairs}
    _, _, report = _recorded_matrix()
    told = [r for r in report["rows"] if r.get("low") is not None]
    recorded = min(told, key=lambda r: r["detectable"])
    visible = [
        ("0.85x, interval [0.80, 0.90]", row(0.85, 0.80, 0.90, 0.06), 0.10, interval),
        ("1.20x, interval [1.10, 1.31]", row(1.20, 1.10, 1.31, 0.08), 0.10, interval),
        ("0.90x, interval [0.78, 1.04]", row(0.90, 0.78, 1.04, 0.12), 0.05, interval),
        ("0.99x, interval [0.985, 0.995]", row(0.99, 0.985, 0.995, 0.02), 0.05, floor),
        ("0.80x, interval [0.68, 0.94], detectable 30%, wanted 10%", row(0.80, 0.68, 0.94, 0.30), 0.10, first),
        ("0.97x, interval [0.95, 0.99]", row(0.97, 0.95, 0.99, 0.03), 0.05, on_gain),
        (f"{(floor_below + 0.98) / 2:.4f}x (between 0.98 and 1 / 1.02), interval [0.975, 0.985]",
         row((floor_below + 0.98) / 2, 0.975, 0.985, 0.02), 0.05, inverse),
        ("0.95x, interval [0.90, 1.00] (ends at 1), detectable 30%, wanted 10%", row(0.95, 0.90, 1.0, 0.30), 0.10,
         strict),
        ("1.00x, interval [0.97, 1.03], detectable 4%, wanted 10%", row(1.0, 0.97, 1.03, 0.04), 0.10, seen),
        ("1.02x, interval [0.70, 1.49], detectable 55%, wanted 10%", row(1.02, 0.70, 1.49, 0.55), 0.10, seen),
        ("1.00x, interval [0.95, 1.05], detectable 10%, wanted 10%", row(1.0, 0.95, 1.05, 0.10), 0.10, seen),
        ("one pair of rounds", row(0.7, None, None, None, pairs=1), 0.10, pairs),
        ("a p99 not reported", row(None, None, None, None, pairs=None), 0.10, pairs),
        ("the recorded row with the smallest detectable change, wanted 10%",
         {k: recorded[k] for k in ("gain", "low", "high", "detectable", "pairs")}, 0.10, seen),
    ]
    hidden = [("1.015x, interval [1.01, 1.02]", row(1.015, 1.01, 1.02, 0.02), 0.05, floor),
              ("1.25x, interval [1.06, 1.47], detectable 30%, wanted 10%", row(1.25, 1.06, 1.47, 0.30), 0.10, first),
              ("1.03x, interval [1.01, 1.05]", row(1.03, 1.01, 1.05, 0.03), 0.05, on_gain),
              ("1.06x, interval [1.00, 1.12] (starts at 1), detectable 30%, wanted 10%", row(1.06, 1.0, 1.12, 0.30),
               0.10, strict),
              ("0.97x, interval [0.955, 0.985]", row(0.97, 0.955, 0.985, 0.02), 0.05, interval)]
    for r in told:
        hidden.append((f"the recorded {r['workload']} {r['figure']}",
                       {k: r[k] for k in ("gain", "low", "high", "detectable", "pairs")},
                       float(0.05 + 0.5 * torch.rand((), generator=gen)), seen))
    return [Case(name, (r, wanted), hidden=i >= len(visible), hint=hint)
            for i, (name, r, wanted, hint) in enumerate(visible + hidden)]


def _find_slowdown(report_ab, report_ac):
    before = {(r["workload"], r["figure"]) for r in report_ab["rows"] if r.get("status") == "regression"}
    new = [r for r in report_ac["rows"] if r.get("status") == "regression" and (r["workload"], r["figure"]) not in before]
    workload = new[0]["workload"]
    return {"workload": workload,
            "slowdowns": {r["figure"]: (1 / r["gain"], 1 / r["high"], 1 / r["low"]) for r in report_ac["rows"]
                          if r["workload"] == workload and r.get("status") == "regression"}}


def _slowdown_cases(gen):
    import tempfile
    from pathlib import Path

    from helpers.validation import compare_runs, labcheck, load_run
    path_a, path_b = labcheck.matrix_paths(labcheck.RECORDED)
    run_a = load_run(path_a)
    report_ab = compare_runs(run_a, load_run(path_b))
    told = labcheck.told_rows(report_ab)
    new = ("the injected workload is the one whose figures became regressions: regressions in A against C that "
           "A against B does not have; a low gain whose interval contains 1 is noise")
    inverse = ("a slowdown is how many times slower C is: the inverse of the gain, and the interval's ends swap "
               "places when inverted")
    reported = "only rows with an interval can be regressions: a figure not reported has no gain to invert"
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def reports(b, c):
            return compare_runs(run_a, load_run(b)), compare_runs(run_a, load_run(c))

        def injected(b, name, **how):
            return reports(b, labcheck.inject_slowdown(path_a, b, tmp / f"c_{name}.json", **how))
        cases.append(Case("seed 0: the workload and its slowdowns", injected(path_b, "seed0", seed=0), rtol=1e-9,
                          atol=0, hint=inverse))
        order = [w for w in dict.fromkeys(r["workload"] for r in report_ab["rows"]) if w in told]
        first, last = order[0], order[-1]      # a distractor in `first` comes before the injection in `last`
        # B with a real regression of its own (torch's) in another workload, then C from it
        b_reg = labcheck.inject_slowdown(path_a, path_b, tmp / "b_reg.json", workload=first)
        cases.append(Case("B with a regression of its own in another workload: the new regressions are the injection",
                          injected(b_reg, "reg", workload=last), rtol=1e-9, atol=0, hint=new))
        # B with `first` noisy: its point gain the lowest of all, its intervals containing 1
        b_noisy = _noisy_b(path_a, path_b, tmp, first, told, injected(path_b, "last", workload=last)[1])
        cases.append(Case("B noisy in another workload: its gain is the lowest, but within noise",
                          injected(b_noisy, "noisy", workload=last), rtol=1e-9, atol=0, hint=new))
        if "bert_infer" in told:
            cases.append(Case("bert_infer slowed (its p99 rows are not reported)",
                              injected(path_b, "bert", workload="bert_infer"), rtol=1e-9, atol=0, hint=reported))
        secret = 1 + int(torch.randint(0, 1000, (), generator=gen))
        cases.append(Case("a secret seed", injected(path_b, "secret", seed=secret), rtol=1e-9, atol=0, hidden=True,
                          hint=new))
    return cases


def _noisy_b(path_a, path_b, tmp, other, told, report_ac):
    """Run B with workload `other` slowed by factors that swing from round to round: its lowest gain
    below every gain in report_ac, every one of its intervals containing 1."""
    from helpers.validation import compare_runs, labcheck, load_run
    lowest = min(r["gain"] for r in report_ac["rows"] if r.get("low") is not None)
    k = told[other][0]["pairs"]
    level = 1.5 * max(r["gain"] for r in told[other]) / lowest
    for swing in (2, 3, 5, 8, 13, 21, 34):
        factors = [level * swing, level / swing] * (k // 2) + [level] * (k % 2)
        b = labcheck.inject_slowdown(path_a, path_b, tmp / "b_noisy.json", workload=other, factors=factors)
        rows = [r for r in compare_runs(load_run(path_a), load_run(b))["rows"] if r["workload"] == other]
        if all(r["status"] != "regression" for r in rows):
            return b
    raise RuntimeError(f"could not make {other} noisy enough in the recorded run")


def _find_drift(report):
    row = next(n for n in report["numerics"] if n["status"] == "drift")
    return {"workload": row["workload"], "output": row["output"], "max_rel_diff": row["max_rel_diff"]}


def _drift_cases(gen):
    import tempfile
    from pathlib import Path

    from helpers.validation import compare_runs, labcheck, load_run
    _, path_b = labcheck.matrix_paths(labcheck.RECORDED)
    hint = ("a changed hash alone is not a drift: return the numerics row whose status is 'drift', with its "
            "max_rel_diff")
    seeds = [0, 5, 6 + int(torch.randint(0, 1000, (), generator=gen))]   # seed 5: a row within tolerance comes first
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(seeds):
            report = compare_runs(load_run(path_b), load_run(labcheck.inject_drift(path_b, Path(tmp) / f"c{i}.json", seed)))
            cases.append(Case(f"the injected change, seed {seed if i < 2 else 'secret'}", (report,), rtol=1e-6,
                              atol=0, hidden=i > 0, hint=hint))
    return cases


def _pairs_needed(gains, change):
    import math

    from helpers.validation import stats
    if len(gains) < 2:
        raise ValueError(f"need the gains of at least two pairs, got {len(gains)}")
    logs = [math.log(g) for g in gains]
    mean = sum(logs) / len(logs)
    spread = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    pairs = stats.rounds_needed(spread, change)
    return None if pairs is None else float(pairs)    # a float: compared within the cases' tolerance


def _aa_gains(gen, spread, n):
    """n per-pair gains of an A/A comparison: log-normal noise of `spread` around 1."""
    return torch.exp(spread * torch.randn(n, generator=gen, dtype=torch.float64)).tolist()


def _pairs_needed_cases(gen):
    report = _recorded_matrix()[2]
    recorded = next(r["round_gains"] for r in report["rows"] if r.get("round_gains"))
    spread = ("the noise is the spread of the pairs' log-gains with k - 1 in the denominator, as in exercise 1's "
              "interval: with a handful of pairs, dividing by k understates it")
    test = ("the plan sizes exercise 1's test, two-sided at 95%, to find the change 80% of the time: the change's log "
            "must exceed the 95% half-width plus the distance to the 80% point, not the half-width alone")
    small = ("with few pairs Student's t is far from the normal quantiles, at both the 95% and the 80% point: a plan "
             "that uses the normal ones promises more than it delivers")
    stub = "this case passes once the function runs without stats.rounds_needed or the pipeline's plan"
    cases = [Case("written without stats.rounds_needed or the pipeline's plan", (_aa_gains(gen, 0.1, 6), 0.1),
                  call="called", expected="called", expect_value=True, hint=stub)]
    for name, args, hidden, hint in (
            ("6 A/A pairs at a spread of about 0.10, a 10% change", (_aa_gains(gen, 0.1, 6), 0.10), False, small),
            ("8 A/A pairs at about 0.16 (the recorded run's median), a 10% change", (_aa_gains(gen, 0.16, 8), 0.10),
             False, test),
            ("4 A/A pairs at about 0.2, a 5% change", (_aa_gains(gen, 0.2, 4), 0.05), False, spread),
            ("the per-pair gains of the recorded run's first timing row, a 25% change", (recorded, 0.25), False, test),
            ("a quiet machine: 5 pairs at about 0.03, a 10% change", (_aa_gains(gen, 0.03, 5), 0.10), False, small),
            ("12 pairs at about 0.05, a 5% change", (_aa_gains(gen, 0.05, 12), 0.05), True, test),
            ("3 pairs at about 0.25, a 10% change", (_aa_gains(gen, 0.25, 3), 0.10), True, spread),
            ("identical pairs: no noise, the fewest pairs", ([1.0, 1.0, 1.0], 0.10), True, small),
            ("a noisy machine and a 1% change: more than 1000 pairs", ([0.6, 1.0, 1.6], 0.01), True,
             "beyond 1000 pairs the answer is None")):
        cases.append(Case(name, args, rtol=0.12, atol=1, hidden=hidden, hint=hint))
    cases += [Case("one pair: a ValueError", ([1.02], 0.10), raises="ValueError",
                   hint="one gain says nothing about the noise: raise a ValueError saying that at least two are needed"),
              Case("no pairs: a ValueError", ([], 0.10), raises="ValueError", hidden=True,
                   hint="one gain says nothing about the noise: raise a ValueError saying that at least two are needed")]
    return cases


def _checkpoint_workload(quick, device, compile=False, samples=None):
    import io

    from torch import nn

    from helpers.validation import models, reference, workloads

    def mlp():
        return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    model = models.seed_parameters_(mlp(), seed=7).to(device)
    x = models.randn(32, 64, seed=8).to(device)

    def round_trip():
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        buffer.seek(0)
        copy = mlp().to(device)
        copy.load_state_dict(torch.load(buffer, weights_only=True))
        return copy

    with torch.no_grad():
        out = round_trip()(x)
        if not torch.equal(out, model(x)):
            raise RuntimeError("the reloaded model computes something else than the saved one")
    times = workloads.sample_calls({"round_trip": round_trip}, device, samples or 20)["round_trip"]
    references, tensors = reference.record({"reloaded_output": out})
    return {"config": {"layers": [64, 128, 10], "batch": 32}, "figures": {"round_trip_time": workloads.figure(times)},
            "paths": {}, "notes": {}, "references": references, "_tensors": tensors}


def _own_workload_cases(gen):
    record = ("return the record every workload returns (config, figures, paths, notes, references, _tensors), "
              "with a timed figure and the reloaded model's output as a reference")
    trip = ("time the whole round trip: each timed call runs torch.save of the state_dict and "
            "torch.load(..., weights_only=True), not the forward pass or the save alone")
    into = ("the reloaded state was never put into the model: copy.load_state_dict(torch.load(...)), else the "
            "fresh model keeps its own initial weights")
    checked = ("check that the reloaded model computes what the original does (torch.equal on their outputs), and "
               "raise if it does not: a round trip that changed the weights must not go unnoticed")
    recorded = ("record the reloaded model's output (what the fresh model, given the loaded state, returns), not "
                "the original model's: the reference is what the round trip gives")
    averaged = "one sample per timed call, not one averaged number: the noise statistic needs every call"
    samples = ("the number of samples is not what was asked: time `samples` calls (20 when it is None), not a "
               "fixed count")
    better = "a time (unit s) is better lower, a rate (unit .../s) better higher"
    refs = ("weights and inputs from numpy's generator (models.seed_parameters_, models.randn), not torch's "
            "global random state, so both versions compute the same thing")
    aa = "the same torch on both sides must give identical outputs and no new warning"
    n = int(torch.randint(3, 9, (), generator=gen))
    return [Case("a workload record", ("record", 5), call="own_workload", hint=record),
            Case("each timed call saves and loads (weights_only=True)", ("trip", 5), call="own_workload", hint=trip),
            Case("the loaded state goes into the fresh model", ("into model", 5), call="own_workload", hint=into),
            Case("a round trip that changes the weights is noticed", ("checked", 5), call="own_workload",
                 hint=checked),
            Case("the recorded output is the reloaded model's", ("recorded", 5), call="own_workload", hint=recorded),
            Case("5 samples asked: one per timed call", ("averaged", 5), call="own_workload", hint=averaged),
            Case("5 samples asked, 5 timed calls", ("samples", 5), call="own_workload", hint=samples),
            Case("better matches the unit", ("better", 5), call="own_workload", hint=better),
            Case("outputs independent of torch's seed", ("references", 3), call="own_workload", hint=refs),
            Case("A/A through the pipeline, rounds interleaved", ("aa", 3), call="own_workload", hint=aa),
            Case(f"{n} samples asked", ("samples", n), call="own_workload", hidden=True, hint=samples),
            Case(f"better, {n} samples", ("better", n), call="own_workload", hidden=True, hint=better)]


SPECS["09_migration_lab"] = LabSpec("09_migration_lab", (
    Exercise("Exercise 1: the paired interval", "paired_interval", _paired_cases, _paired_interval,
             forbidden=("helpers.validation.stats.paired_interval", "helpers.validation.stats.compare_figure"),
             refused="the pipeline's stats.paired_interval is the function you are writing (and compare_figure calls"
                     " it): compute it from the rounds yourself"),
    Exercise("Exercise 2: the decision", "decide", _decide_cases, _decide,
             forbidden=("helpers.validation.stats.verdict", "helpers.validation.stats.compare_figure"),
             refused="the pipeline's stats.verdict makes the decision for you (and compare_figure calls it): decide "
                     "from the interval and the detectable change yourself"),
    Exercise("Exercise 3: find the injected slowdown", "find_slowdown", _slowdown_cases, _find_slowdown),
    Exercise("Exercise 4: find the drift", "find_drift", _drift_cases, _find_drift),
    Exercise("Exercise 5: a workload of your own", "checkpoint_workload", _own_workload_cases, _checkpoint_workload),
    Exercise("Exercise 6: how many rounds", "pairs_needed", _pairs_needed_cases, _pairs_needed,
             forbidden=("helpers.validation.stats.rounds_needed", "helpers.validation.pipeline.plan"),
             refused="the pipeline's stats.rounds_needed (and its plan, which calls it) is the function you are "
                     "writing: plan from the gains yourself"),
), allow_processes=True)    # the lab runs the pipeline, which records the git commit it ran from


def spec_for(lab: str) -> LabSpec:
    """The spec of a lab given by id (00_warmup_lab) or by its notebook path."""
    from pathlib import Path
    name = Path(lab).stem if lab.endswith(".ipynb") else lab
    if name not in SPECS:
        raise ValueError(f"no grading spec for lab {lab!r}; gradable labs: {', '.join(sorted(SPECS))} "
                         f"(add one to helpers/grading/specs.py)")
    return SPECS[name]
