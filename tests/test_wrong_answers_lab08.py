"""Lab 08 (debugging): plausible wrong answers fail a case with the hint meant for them; the spec's
reference, the solution notebook and a second solution pass every case (tests/wrong_answers.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from wrong_answers import FORBIDDEN_HINT, MATCH_HINT, L08, Wrong, lab_tests


def first_difference_absolute(a, b, rtol=0.0):
    # |p - q| > rtol: an absolute tolerance
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) > rtol or (p != p) != (q != q) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_first_hash(a, b, rtol=0.0):
    # compares only each op's first hash
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        p, q = ha[0], hb[0]
        if (p != p) != (q != q) or abs(p - q) > rtol * max(abs(p), abs(q)):
            return i
    return None


def first_difference_no_name_check(a, b, rtol=0.0):
    # never compares the op names
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any((p != p) != (q != q) or abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_zipped_names(a, b, rtol=0.0):
    # compares the names pairwise with zip: a shorter trace passes
    if any(na != nb for (na, _), (nb, _) in zip(a, b)):
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any((p != p) != (q != q) or abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_ge(a, b, rtol=0.0):
    # >= instead of >: equal hashes "differ" when rtol is 0
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) >= rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_nan_blind(a, b, rtol=0.0):
    # the plain comparison: |nan - x| > t is False, so a NaN never differs
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_nan_always(a, b, rtol=0.0):
    # any NaN is a difference, even NaN in both runs
    if [n for n, _ in a] != [n for n, _ in b]:
        raise ValueError("the traces dispatched different ops")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        if any(p != p or q != q or abs(p - q) > rtol * max(abs(p), abs(q)) for p, q in zip(ha, hb)):
            return i
    return None


def first_difference_by(differ):
    """first_difference with the op names checked and each pair of hashes judged by differ(p, q, rtol)."""
    def first_difference(a, b, rtol=0.0):
        if [n for n, _ in a] != [n for n, _ in b]:
            raise ValueError("the traces dispatched different ops")
        for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
            if any(differ(p, q, rtol) for p, q in zip(ha, hb)):
                return i
        return None
    return first_difference


# NaN handled, but an infinite hash goes through the relative test: |inf - x| > rtol * inf is never true
first_difference_inf_blind = first_difference_by(
    lambda p, q, rtol: math.isnan(p) != math.isnan(q) or abs(p - q) > rtol * max(abs(p), abs(q)))


# the relative difference as a quotient: 0 / 0 (two hashes of 0) raises ZeroDivisionError
first_difference_divides = first_difference_by(
    lambda p, q, rtol: math.isnan(p) != math.isnan(q) or
    (not (math.isnan(p) or math.isnan(q)) and (p != q if math.isinf(p) or math.isinf(q) else
                                                abs(p - q) / max(abs(p), abs(q)) > rtol)))


def normalize_eps_outside(v, eps=1e-12):
    # v / (norm + eps): eps added, not used as a lower bound
    return v / (torch.linalg.vector_norm(v, dim=-1, keepdim=True) + eps)


def normalize_no_eps(v, eps=1e-12):
    # no eps: 0 / 0 on a zero row
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)


def normalize_manual_sqrt(v, eps=1e-12):
    # sqrt of the sum of squares, clamped: sqrt's gradient at 0 is inf, times 0 is NaN
    return v / torch.sqrt((v * v).sum(-1, keepdim=True)).clamp_min(eps)


def normalize_eps_under_sqrt(v, eps=1e-12):
    # eps under the square root: a different function near zero
    return v / torch.sqrt((v * v).sum(-1, keepdim=True) + eps)


def normalize_calls_torch(v, eps=1e-12):
    # F.normalize: the function the exercise asks to write
    return F.normalize(v, dim=-1, eps=eps)


def prepare_nothing(batch):
    # marks no dimension dynamic: the second size recompiles
    return batch


def prepare_mark_dynamic(batch):
    # mark_dynamic still specialises size 1
    torch._dynamo.mark_dynamic(batch, 0)
    return batch


def prepare_mark_dynamic_min1(batch):
    # mark_dynamic with min=1: a batch of 1 is outside what dynamo allows a dynamic size
    torch._dynamo.mark_dynamic(batch, 0, min=1, max=512)
    return batch


def prepare_wrong_dim(batch):
    # marks the feature dimension, not the batch
    torch._dynamo.mark_dynamic(batch, 1)
    return batch


class _Batched(nn.Module):
    """TokenHead without the loop; `dim` is the dimension of the statistics (1, the tokens, is right)."""

    def __init__(self, proj, dim=1):
        super().__init__()
        self.proj, self.dim = proj, dim

    def forward(self, x):
        d = self.dim
        return self.proj((x - x.mean(d, keepdim=True)) / (x.std(d, keepdim=True) + 1e-5)).amax(1)


def _export_save_load(module, example, path, dynamic_shapes=None):
    torch.export.save(torch.export.export(module, (example,), dynamic_shapes=dynamic_shapes), path)
    return torch.export.load(path).module()


BATCH_DIM = ({0: torch.export.Dim("batch", min=1, max=512)},)


def export_static(module, example, path):
    # loop removed, but no dynamic_shapes: the batch size is the example's
    return _export_save_load(_Batched(module.proj), example, path)


def export_looped(module, example, path):
    # the module as it is, batch declared dynamic: export refuses, the loop specialised the batch
    return _export_save_load(module, example, path, BATCH_DIM)


def export_looped_auto(module, example, path):
    # the loop kept, Dim.AUTO: export quietly specialises the batch to the example's
    return _export_save_load(module, example, path, ({0: torch.export.Dim.AUTO},))


def export_returns_eager(module, example, path):
    # "do nothing clever": the eager module back, nothing exported or saved
    return module


def export_wrong_statistics(module, example, path):
    # the loop removed, but the statistics taken over the features instead of the tokens
    return _export_save_load(_Batched(module.proj, dim=2), example, path, BATCH_DIM)


def export_program_not_module(module, example, path):
    # returns the ExportedProgram, which cannot be called
    program = torch.export.export(_Batched(module.proj), (example,), dynamic_shapes=BATCH_DIM)
    torch.export.save(program, path)
    return torch.export.load(path)


def export_torchscript(module, example, path):
    # TorchScript: deprecated, and what the exercise replaces
    torch.jit.save(torch.jit.trace(module, example), path)
    return torch.jit.load(path)


def _halve(n, agrees, good=0, bad=None):
    """Bisection between a k taken to agree (good) and one taken to disagree (bad, n by default): (good, bad)
    once they are one apart."""
    bad = n if bad is None else bad
    while bad - good > 1:
        mid = (good + bad) // 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
    return good, bad


def divergent_linear_scan(n, agrees):
    # a scan from layer 0: the right layer, one run per layer up to it
    for k in range(1, n + 1):
        if not agrees(k):
            return k - 1
    raise ValueError(f"all {n} layers compiled agree")


def divergent_scan_from_the_end(n, agrees):
    # a scan from the whole model down: one run per layer after it
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    k = n
    while k > 1 and not agrees(k - 1):
        k -= 1
    return k - 1


def divergent_asks_pairs(n, agrees):
    # looks for the boundary itself, agrees(mid) and agrees(mid + 1) at each step: two runs per halving
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    lo, hi = 0, n - 1
    while True:
        mid = (lo + hi) // 2
        before, after = agrees(mid), agrees(mid + 1)
        if before and not after:
            return mid
        if before:
            lo = mid + 1
        else:
            hi = mid - 1


def divergent_asks_zero(n, agrees):
    # asks agrees(0) as well, to check the eager run: a run the text already answers
    if not agrees(0):
        raise ValueError("the eager model does not agree with itself")
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    return _halve(n, agrees)[0]


def divergent_confirms(n, agrees):
    # asks the two runs around the boundary again at the end, to confirm what the search already knows
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    good, bad = _halve(n, agrees)
    assert agrees(good) and not agrees(bad)
    return good


def divergent_asks_after_the_end(n, agrees):
    # asks before testing whether one layer is left: with one layer, a run of agrees(0)
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    good, bad = 0, n
    while True:
        mid = (good + bad) // 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
        if bad - good <= 1:
            return good


def divergent_one_based(n, agrees):
    # returns the first k that disagrees: the layer counted from 1
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    return _halve(n, agrees)[1]


def divergent_true_division(n, agrees):
    # (good + bad) / 2 is a float, and agrees takes a number of layers
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    good, bad = 0, n
    while bad - good > 1:
        mid = (good + bad) / 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
    return int(good)


def divergent_layer_zero_assumed(n, agrees):
    # takes agrees(1) as True without asking: layer 0 is never blamed
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    return _halve(n, agrees, good=1)[0]


def divergent_last_layer_left_out(n, agrees):
    # takes agrees(n - 1) as False: the search never reaches the last layer
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    return _halve(n, agrees, bad=max(n - 1, 1))[0]


def divergent_never_asks_n(n, agrees):
    # takes agrees(n) as False without asking: a model that agrees gets layer n - 1
    return _halve(n, agrees)[0]


def divergent_returns_none(n, agrees):
    # returns None when the whole model agrees, instead of raising
    if agrees(n):
        return None
    return _halve(n, agrees)[0]


def divergent_vague_error(n, agrees):
    # raises, but the message says neither how many layers were compiled nor where to look
    if agrees(n):
        raise ValueError("no divergence found")
    return _halve(n, agrees)[0]


def divergent_never_ends(n, agrees):
    # good = mid and bad = mid with `while good < bad`: two apart, mid rounds down to good and nothing shrinks
    if agrees(n):
        raise ValueError(f"all {n} layers compiled agree")
    good, bad = 0, n
    while good < bad:
        mid = (good + bad) // 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
    return good


def first_difference_second(a, b, rtol=0.0):
    if len(a) != len(b) or any(na != nb for (na, _), (nb, _) in zip(a, b)):
        raise ValueError("different programs")
    for i, ((_, ha), (_, hb)) in enumerate(zip(a, b)):
        for p, q in zip(ha, hb):
            if p == q or (p != p and q != q):
                continue
            if abs(p) == float("inf") or abs(q) == float("inf") or not abs(p - q) <= rtol * max(abs(p), abs(q)):
                return i
    return None


def safe_normalize_second(v, eps=1e-12):
    # the sum of squares clamped BEFORE the square root: sqrt never sees 0, and max(norm, eps) is exact
    return v * torch.rsqrt((v * v).sum(-1, keepdim=True).clamp_min(eps * eps))


def prepare_second(batch):
    from torch._dynamo.decorators import mark_unbacked as symbolic_for_every_size
    batch = batch.clone()
    symbolic_for_every_size(batch, 0)
    return batch


def export_and_reload_second(module, example, path):
    class AllAtOnce(nn.Module):           # the loop's body over the whole batch, with std_mean and keyword dims
        def __init__(self, proj):
            super().__init__()
            self.proj = proj

        def forward(self, x):
            std, mean = torch.std_mean(x, dim=-2, keepdim=True)
            return torch.amax(self.proj((x - mean) / (std + 1e-5)), dim=-2)
    program = torch.export.export(AllAtOnce(module.proj), (example,),
                                  dynamic_shapes={"x": {0: torch.export.Dim("n", min=1, max=1024)}})
    torch.export.save(program, path)
    return torch.export.load(path).module()


def first_divergent_second(n, agrees):
    from bisect import bisect_left           # the first k in 1..n whose run disagrees, on a lazy key
    k = bisect_left(range(1, n + 1), True, key=lambda k: not agrees(k))
    if k == n:
        raise ValueError(f"compiling all {n} layers changes nothing: the divergence is not in one layer")
    return k


WRONG = [
    Wrong(L08, "first_difference", "absolute-tolerance", first_difference_absolute,
          "rtol is relative, not absolute (hashes near 1e6)", "larger than rtol times the larger of their magnitudes"),
    Wrong(L08, "first_difference", "first-hash-only", first_difference_first_hash, "only the second hash differs",
          "check every hash of an op"),
    Wrong(L08, "first_difference", "no-name-check", first_difference_no_name_check, "different programs are refused",
          "compare the op names of the two traces first"),
    Wrong(L08, "first_difference", "zipped-names", first_difference_zipped_names,
          "traces of different lengths are refused", "compare the whole list of names"),
    Wrong(L08, "first_difference", "ge-not-gt", first_difference_ge, "identical traces", "there is no index to return"),
    Wrong(L08, "first_difference", "nan-blind", first_difference_nan_blind, "a NaN in one trace differs from a number",
          "a NaN compares False with everything"),
    Wrong(L08, "first_difference", "inf-blind", first_difference_inf_blind, "an infinite hash against a finite one",
          "a relative test never fires there"),
    Wrong(L08, "first_difference", "divides", first_difference_divides,
          "hashes of 0 in both traces, a difference after them", "divides by 0 there"),
    Wrong(L08, "first_difference", "nan-always-differs", first_difference_nan_always,
          "NaN in both traces is not a difference", "the two runs agree when both hashes are NaN"),
    Wrong(L08, "safe_normalize", "eps-outside", normalize_eps_outside, "a larger eps",
          "eps is the smallest value the norm may take"),
    Wrong(L08, "safe_normalize", "no-eps", normalize_no_eps, "values", "never by less than eps"),
    Wrong(L08, "safe_normalize", "manual-sqrt", normalize_manual_sqrt, "finite gradients at a zero row",
          "sqrt's derivative at 0 is infinite"),
    Wrong(L08, "safe_normalize", "eps-under-sqrt", normalize_eps_under_sqrt,
          "F.normalize's gradients, a zero row included", "Adding eps under the square root"),
    Wrong(L08, "safe_normalize", "calls-normalize", normalize_calls_torch, "values", FORBIDDEN_HINT),
    Wrong(L08, "prepare", "marks-nothing", prepare_nothing, "no recompiles for sizes 8, 9, 100, 3",
          "mark the batch dimension (0) dynamic"),
    Wrong(L08, "prepare", "mark-dynamic", prepare_mark_dynamic, "no recompiles (and no error) for sizes 8, 1, 512, 2",
          "makes a size a symbol for every value"),
    Wrong(L08, "prepare", "mark-dynamic-min1", prepare_mark_dynamic_min1,
          "no recompiles (and no error) for sizes 8, 1, 512, 2", "or raises with min=1"),
    Wrong(L08, "prepare", "wrong-dim", prepare_wrong_dim, "no recompiles for sizes 8, 9, 100, 3",
          "mark the batch dimension (0)"),
    Wrong(L08, "export_and_reload", "no-dynamic-shapes", export_static, "other batch sizes: 5, 1, 512",
          "declare the batch dimension dynamic"),
    Wrong(L08, "export_and_reload", "looped", export_looped, "export accepts the batch as dynamic (a loop-free forward)",
          "the forward's Python loop over range(batch)"),
    Wrong(L08, "export_and_reload", "looped-dim-auto", export_looped_auto, "other batch sizes: 5, 1, 512",
          "with Dim.AUTO, export quietly specialises"),
    Wrong(L08, "export_and_reload", "returns-eager", export_returns_eager,
          "the program saved at path takes batches 5, 1, 512", "save the exported program there"),
    Wrong(L08, "export_and_reload", "wrong-statistics", export_wrong_statistics, "the example's batch",
          "the same statistics over the same dimension"),
    Wrong(L08, "export_and_reload", "program-not-module", export_program_not_module,
          "returns the loaded module (callable)", "an ExportedProgram itself cannot be called"),
    Wrong(L08, "export_and_reload", "torchscript", export_torchscript,
          "export accepts the batch as dynamic (a loop-free forward)", FORBIDDEN_HINT),
    Wrong(L08, "first_divergent", "linear-scan", divergent_linear_scan,
          "16 layers, layer 9 breaks agreement: at most 5 runs of agrees", "not one layer"),
    Wrong(L08, "first_divergent", "scan-from-the-end", divergent_scan_from_the_end,
          "16 layers, layer 9 breaks agreement: at most 5 runs of agrees", "not one layer"),
    Wrong(L08, "first_divergent", "asks-pairs", divergent_asks_pairs,
          "16 layers, layer 9 breaks agreement: at most 5 runs of agrees", "needs no second call beside it"),
    Wrong(L08, "first_divergent", "asks-zero", divergent_asks_zero,
          "16 layers, layer 9 breaks agreement: at most 5 runs of agrees", "a call whose answer the text gives"),
    Wrong(L08, "first_divergent", "confirms", divergent_confirms,
          "16 layers, layer 9 breaks agreement: at most 5 runs of agrees", "or an earlier call gave"),
    Wrong(L08, "first_divergent", "asks-after-the-end", divergent_asks_after_the_end, "1 layer: at most 1 run",
          "a call whose answer the text gives"),
    Wrong(L08, "first_divergent", "one-based", divergent_one_based, "8 layers, layer 5 breaks agreement: the layer",
          "the last of those k"),
    Wrong(L08, "first_divergent", "true-division", divergent_true_division,
          "8 layers, layer 5 breaks agreement: the layer", "an int from 0 to n"),
    Wrong(L08, "first_divergent", "layer-zero-assumed", divergent_layer_zero_assumed, "layer 0 breaks agreement",
          "only agrees(0) (nothing compiled) is known to agree"),
    Wrong(L08, "first_divergent", "last-layer-left-out", divergent_last_layer_left_out,
          "the last layer breaks agreement", "the range of suspects runs up to n - 1"),
    Wrong(L08, "first_divergent", "never-asks-n", divergent_never_asks_n,
          "the whole model agrees: ValueError that gives n", "is not known to be False until you ask"),
    Wrong(L08, "first_divergent", "returns-none", divergent_returns_none,
          "the whole model agrees: ValueError that gives n", "there is no index to return, raise ValueError"),
    Wrong(L08, "first_divergent", "vague-error", divergent_vague_error,
          "the whole model agrees: ValueError that gives n", MATCH_HINT),
    Wrong(L08, "first_divergent", "never-ends", divergent_never_ends, "1 layer, which breaks agreement: the layer",
          "never ends"),
]

SECOND_SOLUTIONS = [("first_difference", first_difference_second), ("safe_normalize", safe_normalize_second),
                    ("prepare", prepare_second), ("export_and_reload", export_and_reload_second),
                    ("first_divergent", first_divergent_second)]

globals().update(lab_tests(L08, WRONG, SECOND_SOLUTIONS))
