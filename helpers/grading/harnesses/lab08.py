"""Lab 08 (debugging): the harnesses its cases name (`Case.call`), which build what cannot travel as
tensors and measure what a value cannot show, and what its notebook imports beside `check`."""
from __future__ import annotations

import os
import tempfile
import warnings

import torch
from torch import nn


def grad_of_sum(fn, v, **kwargs):
    """The gradient of fn(v).sum() with respect to v."""
    v = v.clone().requires_grad_()
    fn(v, **kwargs).sum().backward()
    return v.grad


def recompiles(fn, sizes) -> int:
    """A compiled step called on fn(batch) for each batch size in turn: the number of recompiles."""
    from helpers.debugging import count_recompiles
    torch._dynamo.reset()
    step = torch.compile(lambda b: torch.tanh(b @ b.T).sum(), backend="eager")
    return len(count_recompiles(lambda: [step(fn(torch.randn(n, 16))) for n in sizes]))


def grad_is_finite(fn, v, **kwargs) -> bool:
    """Whether every element of the gradient of fn(v).sum() is finite (no NaN, no inf)."""
    return bool(torch.isfinite(grad_of_sum(fn, v, **kwargs)).all())


TOKENS, FEATURES = 6, 16


class TokenHead(nn.Module):
    """Lab 08's module to migrate: for each example of a (batch, tokens, features) input, standardise
    every feature over the tokens, project, and keep each output's maximum over the tokens. Written as a
    loop over the examples, which torch.jit.trace unrolls for the example's batch size."""

    def __init__(self, features: int = FEATURES, out: int = 4):
        super().__init__()
        self.proj = nn.Linear(features, out)

    def forward(self, x):
        rows = []
        for i in range(x.shape[0]):
            xi = x[i]                                            # (tokens, features)
            rows.append(self.proj((xi - xi.mean(0)) / (xi.std(0) + 1e-5)).amax(0))
        return torch.stack(rows)


def token_head(seed: int = 0) -> TokenHead:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TokenHead()


def _export_run(fn, seed, example_batch, batches, from_file: bool):
    """fn(head, example, path) exports, saves and reloads a TokenHead; the outputs, on a batch of each
    size in `batches`, of the module fn returned, or (from_file) of torch.export.load(path).module(),
    the program fn saved."""
    head = token_head(seed)
    gen = torch.Generator().manual_seed(seed)
    example = torch.randn(example_batch, TOKENS, FEATURES, generator=gen)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = os.path.join(tmp, "head.pt2")
        module = fn(head, example, path)
        if from_file:
            module = torch.export.load(path).module()
        with torch.no_grad():
            return [module(torch.randn(n, TOKENS, FEATURES, generator=gen)) for n in batches]


def exported_outputs(fn, seed, example_batch, batches):
    """The outputs of the module fn returns, on each batch size in `batches`."""
    return _export_run(fn, seed, example_batch, batches, from_file=False)


def saved_program_outputs(fn, seed, example_batch, batches):
    """The outputs of the program fn saved at its path, loaded again with torch.export.load."""
    return _export_run(fn, seed, example_batch, batches, from_file=True)


def returns_a_module(fn, seed, example_batch) -> bool:
    """Whether what fn returns is a module (callable), not the ExportedProgram torch.export.load gives."""
    head = token_head(seed)
    example = torch.randn(example_batch, TOKENS, FEATURES, generator=torch.Generator().manual_seed(seed))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return isinstance(fn(head, example, os.path.join(tmp, "head.pt2")), nn.Module)


def export_specialised_the_batch(fn, seed, example_batch) -> bool:
    """Whether fn failed because torch.export found the batch dimension, declared dynamic, specialised
    to the example's size by the code (a loop over it); other errors propagate."""
    try:
        _export_run(fn, seed, example_batch, [example_batch], from_file=False)
    except Exception as error:      # torch._dynamo.exc.UserError: Constraints violated ... specialized it
        if "specialized it to be a constant" in str(error) or "specialised it to be a constant" in str(error):
            return True
        raise
    return False


class RunawaySearch(RuntimeError):
    """Raised by the agrees of first_divergent's cases once it has been called far more often than a search
    of the layers needs: a loop that does not end."""


def _agrees_for(n: int, divergent: int | None, asked: list):
    """agrees(k) for a model of n layers whose layer `divergent` (None: none) breaks agreement once compiled:
    True while layers 0..k-1 compiled leave it out. Each call is appended to `asked`; k must be an int from
    0 to n, as a slice of the layers would need."""
    limit = 2 * n + 20

    def agrees(k):
        if isinstance(k, bool) or not hasattr(k, "__index__"):
            raise TypeError(f"agrees({k!r}): k counts the layers compiled, an int from 0 to {n}")
        k = k.__index__()
        if not 0 <= k <= n:
            raise IndexError(f"agrees({k}): k counts the layers compiled, from 0 to {n}")
        asked.append(k)
        if len(asked) > limit:
            raise RunawaySearch(f"agrees was called {len(asked)} times for a model of {n} layers and the search "
                                f"had not ended; the last calls asked k = {', '.join(map(str, asked[-6:]))}")
        return divergent is None or k <= divergent
    return agrees


def found_layer(fn, n, divergent):
    """What fn(n, agrees) returns for a model of n layers whose layer `divergent` breaks agreement."""
    return fn(n, _agrees_for(n, divergent, []))


def runs_of_agrees(fn, n, divergent, budget) -> str:
    """How many times fn(n, agrees) called agrees, against `budget`: "at most {budget} runs", or the count
    with the k it asked, in order."""
    asked = []
    fn(n, _agrees_for(n, divergent, asked))
    if len(asked) <= budget:
        return f"at most {budget} run{'' if budget == 1 else 's'}"
    shown = ", ".join(map(str, asked[:12])) + (", ..." if len(asked) > 12 else "")
    return f"{len(asked)} runs, asking agrees(k) for k = {shown}"
