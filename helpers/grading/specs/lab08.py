"""Lab 08 (debugging): its exercises, their visible and hidden cases, the references the grader computes
and what each exercise refuses. Grader side only: the sandbox never sees this package."""
from __future__ import annotations

import torch

from helpers.grading.specs.core import Case, Exercise, LabSpec


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


def _first_divergent(n, agrees):
    if agrees(n):
        raise ValueError(f"all {n} layers compiled still agree: no layer breaks agreement")
    good, bad = 0, n                 # agrees(0) holds: nothing compiled; agrees(n) does not
    while bad - good > 1:
        mid = (good + bad) // 2
        if agrees(mid):
            good = mid
        else:
            bad = mid
    return good


def _budget(n):
    return (n - 1).bit_length() + 1          # ceil(log2 n) + 1, exactly, for every n >= 1


def _divergent_cases(gen):
    layer = ("k counts the layers compiled (an int from 0 to n), and layers count from 0: when agrees(k) is the "
             "first to disagree, the layer that broke it is the last of those k")
    first = ("the first layer can be the one that breaks agreement: only agrees(0) (nothing compiled) is known "
             "to agree, so no other prefix may be taken as agreeing without asking")
    last = ("the last layer can be the one: when only the whole model compiled disagrees, layer n - 1 broke it, "
            "so the range of suspects runs up to n - 1")
    runs = ("each call of agrees compiles and runs a model, and the budget allows about one call per halving of "
            "the layers still suspect: agreement breaks once and stays broken, so one answer clears a whole side "
            "of the range, not one layer, and needs no second call beside it; a call whose answer the text gives "
            "(agrees(0)) or an earlier call gave is a run spent for nothing")
    none = ("when even the whole model compiled agrees (agrees(n) is True), no layer breaks agreement: there is "
            "no index to return, raise ValueError; and agrees(n) is not known to be False until you ask")
    ends = ("with one layer there is one suspect, layer 0, and one run settles it: the search must stop as soon as "
            "a single layer is left, or a loop whose range no longer shrinks never ends")
    big = int(torch.randint(40, 200, (), generator=gen))
    where = int(torch.randint(0, big, (), generator=gen))
    return [
        Case("8 layers, layer 5 breaks agreement: the layer", (8, 5), call="found_layer", hint=layer),
        Case("layer 0 breaks agreement", (8, 0), call="found_layer", hint=first),
        Case("the last layer breaks agreement", (8, 7), call="found_layer", hint=last),
        Case("16 layers, layer 9 breaks agreement: at most 5 runs of agrees", (16, 9, 5), call="runs_of_agrees",
             expected="at most 5 runs", expect_value=True, hint=runs, central=True),
        Case("the whole model agrees: ValueError that gives n", (12, None), call="found_layer", raises="ValueError",
             match="12", hint=none),
        Case("1 layer, which breaks agreement: the layer", (1, 0), call="found_layer", hint=ends),
        Case("1 layer: at most 1 run", (1, 0, 1), call="runs_of_agrees", expected="at most 1 run", expect_value=True,
             hint=runs),
        Case("1 layer, which agrees: ValueError", (1, None), call="found_layer", raises="ValueError", hint=none),
        Case("40 to 200 layers, any one breaks agreement: within ceil(log2 n) + 1 runs", (big, where, _budget(big)),
             call="runs_of_agrees", expected=f"at most {_budget(big)} runs", expect_value=True, hidden=True,
             hint=runs, central=True),
        Case("40 to 200 layers, any one breaks agreement: the layer", (big, where), call="found_layer", hidden=True,
             hint=layer),
        Case("1000 layers, the last breaks agreement: at most 11 runs", (1000, 999, 11), call="runs_of_agrees",
             expected="at most 11 runs", expect_value=True, hidden=True, hint=runs, central=True),
        Case("3 layers, layer 1: the layer", (3, 1), call="found_layer", hidden=True, hint=layer),
        Case("2 layers, layer 1: at most 2 runs", (2, 1, 2), call="runs_of_agrees", expected="at most 2 runs",
             expect_value=True, hidden=True, hint=runs),
        Case("2 layers, layer 0", (2, 0), call="found_layer", hidden=True, hint=first),
        Case("the whole model of 33 layers agrees: ValueError that gives n", (33, None), call="found_layer",
             raises="ValueError", match="33", hidden=True, hint=none),
    ]


SPEC = LabSpec("08_debugging_lab", (
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
    Exercise("Exercise 5: first_divergent", "first_divergent", _divergent_cases, _first_divergent),
), allow_processes=True)    # the notebook runs exercise 5's search on blocks Inductor compiles (C++ builds)
