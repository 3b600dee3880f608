"""Lab 10, the capstone: each goal measured on a project folder, as a JSON-ready dict.

A project is a folder with `__init__.py`, `data.py`, `model.py`, `train.py` and `serve.py` exposing the
starting code's public functions (labs/10_capstone/). `load_project(folder)` imports it as a fresh package,
so the starting code, a submission and the reference run side by side in one process. A workload
(`workload(...)`) fixes the corpus slice, the model's sizes, the batch, the sequence length, the steps and
the seed; the grader runs hidden ones.

    start, mine, ref = (load_project(f) for f in (START, "my_capstone", REFERENCE))
    loss_curve(mine, ref, VISIBLE)           # {"goal": "loss_curve", "passed": ..., ...}
    train_speed(mine, start, VISIBLE)        # paired rounds against the starting code
    grade(mine, start, ref, VISIBLE)         # every goal

Speed is judged like the validation pipeline judges a timing (helpers.validation.stats): the starting code
(A) and the project (B) alternate in rounds (A B, B A, ...), each round gives one median per side, and a
gain counts only when its 95% paired interval lies above 1 and the gain itself is beyond stats.MIN_CHANGE.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers import checks, memory
from helpers.validation import stats

REPO = Path(__file__).resolve().parents[1]
START = REPO / "labs" / "10_capstone"
REFERENCE = REPO / "labs" / "solutions" / "10_capstone"
MODULES = ("data", "model", "train", "serve")

LOSS_RTOL = 1e-3            # per step, |loss - reference| / reference; an exact port differs by ~1e-7
SERVE_RTOL = 0.03           # ||served - fp32|| / ||fp32|| over the held-out prompts' next-token logits
SERVE_AGREEMENT = 0.95      # share of held-out prompts whose top-1 token the served model keeps
LOSS_RISE = 0.005           # the served model's held-out cross-entropy may rise this much (relative) above fp32's
ACCURACY_DROP = 0.02        # and its held-out top-1 accuracy fall this far below fp32's
BYTES_BUDGET = 1 / 3        # served file, as a fraction of the starting code's (float32) file
MEMORY_BUDGET = 0.5         # a training step's transient peak, as a fraction of the starting code's
MODEL_STATE = ("parameter", "gradient", "optimizer_state")    # timeline categories every version holds alike
CAUSAL_ATOL = 1e-5          # logits before a changed token may move by float noise, no more

_loaded = itertools.count()


def workload(seed: int = 0, part: int = 0, batch_size: int = 16, seq_len: int = 64, steps: int = 30,
             vocab_size: int = 512, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, n_experts: int = 4,
             d_ff: int = 128, lr: float = 3e-3) -> dict:
    """One workload: which corpus slice (`part` of 2), the model's sizes, the batch and the seed."""
    model = {"vocab_size": vocab_size, "d_model": d_model, "n_heads": n_heads, "n_layers": n_layers,
             "n_experts": n_experts, "d_ff": d_ff, "max_len": max(128, seq_len)}
    return {"seed": seed, "part": part, "batch_size": batch_size, "seq_len": seq_len, "steps": steps, "lr": lr,
            "model": model}


VISIBLE = workload()


def load_project(folder) -> types.SimpleNamespace:
    """Import the project in `folder` as a new package (its modules import each other relatively);
    returns its modules as attributes (data, model, train, serve) and `folder`."""
    folder = Path(folder).resolve()
    if not (folder / "__init__.py").is_file():
        raise FileNotFoundError(f"{folder} is not a project folder: it has no __init__.py")
    name = f"capstone_project_{next(_loaded)}"
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return types.SimpleNamespace(folder=str(folder), **{m: importlib.import_module(f"{name}.{m}") for m in MODULES})


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms(True) for the block, then the previous setting."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def config(project, w: dict):
    return project.model.ModelConfig(**w["model"])


def reference_batches(reference, w: dict, steps: int | None = None, part: int | None = None) -> list:
    """The workload's batches as the reference pipeline makes them (the documented sampling)."""
    text = reference.data.corpus(w["part"] if part is None else part)
    tokenizer = reference.data.build_tokenizer(text, w["model"]["vocab_size"])
    return list(reference.data.make_batches(text, tokenizer, w["batch_size"], w["seq_len"],
                                            steps or w["steps"], w["seed"]))


def trained(project, reference, w: dict):
    """The project's model after the workload's steps on the reference batches."""
    trainer = project.train.make_trainer(config(project, w), reference_batches(reference, w), w["seed"], w["lr"])
    for _ in range(w["steps"]):
        trainer.step()
    return trainer.model


# --- Correctness --------------------------------------------------------------------------------------

def loss_curve(project, reference, w: dict = VISIBLE, rtol: float = LOSS_RTOL) -> dict:
    """The first `steps` training losses on the reference batches, with deterministic algorithms, against the
    reference's: every step within `rtol` (relative)."""
    batches = reference_batches(reference, w)
    curves = []
    with deterministic():
        for side in (project, reference):
            trainer = side.train.make_trainer(config(side, w), batches, w["seed"], w["lr"])
            curves.append([trainer.step() for _ in range(w["steps"])])
    errors = [abs(a - b) / abs(b) for a, b in zip(*curves)]
    worst = max(range(len(errors)), key=errors.__getitem__)
    return {"goal": "loss_curve", "passed": errors[worst] <= rtol, "rtol": rtol, "worst_error": errors[worst],
            "worst_step": worst, "losses": curves[0], "reference": curves[1]}


def causality(project, w: dict = VISIBLE, positions: int = 4, atol: float = CAUSAL_ATOL) -> dict:
    """The planted bug's goal: changing the token at position p must leave the logits at every position
    before p as they were (a language model may not see the future)."""
    model = project.model.build_model(config(project, w), w["seed"]).eval()
    generator = torch.Generator().manual_seed(w["seed"])
    ids = torch.randint(w["model"]["vocab_size"], (2, w["seq_len"]), generator=generator)
    picks = torch.randint(1, w["seq_len"], (positions,), generator=generator).tolist()
    leaks = {}
    with torch.no_grad():
        before = model(ids)
        for p in picks:
            changed = ids.clone()
            changed[:, p] = (changed[:, p] + 1) % w["model"]["vocab_size"]
            moved = float((model(changed)[:, :p] - before[:, :p]).abs().max())
            if moved > atol:
                leaks[p] = moved
    return {"goal": "causality", "passed": not leaks, "atol": atol, "changed_positions": picks,
            "leaking_positions": {str(p): m for p, m in leaks.items()}}


def batches_match(project, reference, w: dict = VISIBLE, steps: int = 4) -> dict:
    """The project's make_batches gives the documented batches: the reference's, in order."""
    text = reference.data.corpus(w["part"])
    tokenizer = project.data.build_tokenizer(text, w["model"]["vocab_size"])
    mine = list(itertools.islice(project.data.make_batches(text, tokenizer, w["batch_size"], w["seq_len"], steps,
                                                           w["seed"]), steps))
    theirs = reference_batches(reference, w, steps)
    same = [len(m) == 2 and all(torch.equal(a, b) for a, b in zip(m, t)) for m, t in zip(mine, theirs)]
    return {"goal": "batches_match", "passed": len(same) == steps and all(same), "batches_equal": same}


def _held_out(reference, w: dict, prompts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts [prompts, seq_len] and the token after each, from the other corpus slice."""
    ((x, y),) = reference_batches(reference, w | {"batch_size": prompts}, steps=1, part=1 - w["part"])
    return x, y[:, -1]


def _export_and_load(project, model, folder) -> tuple[object, int]:
    path = os.path.join(folder, "served.pt")
    project.serve.export(model, path)
    return project.serve.load(path), os.path.getsize(path)


def _fp32_logits(reference, model, w: dict, prompts: torch.Tensor) -> torch.Tensor:
    """Next-token logits of the project's weights in the reference's float32 model."""
    fp32 = reference.model.build_model(config(reference, w), w["seed"]).eval()
    fp32.load_state_dict(model.state_dict())
    with torch.no_grad():
        return fp32(prompts)[:, -1]


def serving_agreement(project, reference, w: dict = VISIBLE, model=None, prompts: int = 256,
                      rtol: float = SERVE_RTOL, agreement: float = SERVE_AGREEMENT) -> dict:
    """The served model (export, then load) against the float32 model with the same trained weights: the
    next-token logits within `rtol` (relative, over all prompts) and the same top-1 token on `agreement` of them."""
    model = trained(project, reference, w) if model is None else model
    x, _ = _held_out(reference, w, prompts)
    expected = _fp32_logits(reference, model, w, x)
    with tempfile.TemporaryDirectory() as folder:
        served, _ = _export_and_load(project, model, folder)
        got = project.serve.next_token_logits(served, x).float()
    error = float((got - expected).norm() / expected.norm())
    agree = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
    return {"goal": "serving_agreement", "passed": error <= rtol and agree >= agreement, "relative_error": error,
            "rtol": rtol, "top1_agreement": agree, "agreement_needed": agreement}


def served_size(project, start, reference, w: dict = VISIBLE, model=None, prompts: int = 512,
                budget: float = BYTES_BUDGET, loss_rise: float = LOSS_RISE, drop: float = ACCURACY_DROP) -> dict:
    """The served file's bytes under `budget` x the starting code's file for the same model, at a quality
    floor on held-out text: the next-token cross-entropy at most `loss_rise` (relative) above the float32
    model's, and the top-1 accuracy at most `drop` below it."""
    model = trained(project, reference, w) if model is None else model
    x, y = _held_out(reference, w, prompts)
    expected = _fp32_logits(reference, model, w, x)
    with tempfile.TemporaryDirectory() as folder:
        served, size = _export_and_load(project, model, folder)
        got = project.serve.next_token_logits(served, x).float()
    with tempfile.TemporaryDirectory() as folder:
        start_size = _export_and_load(start, start.model.build_model(config(start, w), w["seed"]), folder)[1]
    loss, fp32_loss = (float(F.cross_entropy(logits, y)) for logits in (got, expected))
    accuracy, fp32_accuracy = (float((logits.argmax(-1) == y).float().mean()) for logits in (got, expected))
    ratio = size / start_size
    floor = loss <= fp32_loss * (1 + loss_rise) and accuracy >= fp32_accuracy - drop
    return {"goal": "served_size", "passed": ratio <= budget and floor, "bytes": size, "start_bytes": start_size,
            "ratio": ratio, "budget": budget, "loss": loss, "fp32_loss": fp32_loss, "loss_rise_allowed": loss_rise,
            "accuracy": accuracy, "fp32_accuracy": fp32_accuracy, "drop_allowed": drop}


# --- Speed ----------------------------------------------------------------------------------------------

def paired_rounds(run_a, run_b, rounds: int, calls: int, settle: float = 0.05) -> tuple[list[float], list[float]]:
    """Each round times `calls` calls of each side back to back, A first in even rounds and B first in odd
    ones, with `settle` seconds before each side (what one side left running in the background, a loader's
    worker processes refilling their queue, must not be timed as the other's); returns each side's per-round
    medians in seconds, round i of A paired with round i of B."""
    medians = {"a": [], "b": []}
    for r in range(rounds):
        for side in ("ab" if r % 2 == 0 else "ba"):
            run = run_a if side == "a" else run_b
            time.sleep(settle)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            medians[side].append(statistics.median(times))
    return medians["a"], medians["b"]


def speed_verdict(goal: str, medians_a: list[float], medians_b: list[float]) -> dict:
    """The gain of B over A (A's time / B's) with its paired interval; passed only for an improvement."""
    interval = stats.paired_interval(medians_a, medians_b, "lower")
    verdict = stats.verdict(interval)
    return {"goal": goal, "passed": verdict == "improvement", "verdict": verdict, "gain": interval["gain"],
            "low": interval["low"], "high": interval["high"], "pairs": interval["pairs"],
            "round_gains": interval["round_gains"], "start_s": statistics.median(medians_a),
            "project_s": statistics.median(medians_b), "threads": torch.get_num_threads()}


@contextlib.contextmanager
def threads(count: int | None):
    """torch's intra-op threads set to `count` for the block (None: left as they are)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _trainer(project, w: dict, steps: int):
    """A trainer on the project's own pipeline (its tokenizer, its batches), for `steps` steps."""
    text = project.data.corpus(w["part"])
    tokenizer = project.data.build_tokenizer(text, w["model"]["vocab_size"])
    batches = project.data.make_batches(text, tokenizer, w["batch_size"], w["seq_len"], steps, w["seed"])
    return project.train.make_trainer(config(project, w), batches, w["seed"], w["lr"])


def train_speed(project, start, w: dict = VISIBLE, rounds: int = 6, calls: int = 5, warmup: int = 3,
                threads_used: int | None = None) -> dict:
    """Training step time (next batch, forward, backward, optimizer step) against the starting code's, both
    on `threads_used` intra-op threads (None: as set)."""
    steps = warmup + rounds * calls
    with threads(threads_used):
        a, b = _trainer(start, w, steps), _trainer(project, w, steps)
        for _ in range(warmup):
            a.step()
            b.step()
        return speed_verdict("train_speed", *paired_rounds(a.step, b.step, rounds, calls))


def serve_latency(project, start, w: dict = VISIBLE, rounds: int = 6, calls: int = 20, warmup: int = 3,
                  threads_used: int | None = None) -> dict:
    """Batch-1 latency of next_token_logits on a seq_len prompt, served (export, load) against the
    starting code's, both on `threads_used` intra-op threads (None: as set)."""
    generator = torch.Generator().manual_seed(w["seed"])
    prompt = torch.randint(w["model"]["vocab_size"], (1, w["seq_len"]), generator=generator)
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for side in (start, project):
            served, _ = _export_and_load(side, side.model.build_model(config(side, w), w["seed"]), folder)
            runs.append(lambda side=side, served=served: side.serve.next_token_logits(served, prompt))
    with threads(threads_used):
        for run in runs * warmup:
            run()
        return speed_verdict("serve_latency", *paired_rounds(*runs, rounds, calls))


# --- Memory ---------------------------------------------------------------------------------------------

def step_peaks(project, w: dict = VISIBLE, warmup: int = 2) -> dict:
    """One training step (after `warmup` steps, so the optimizer state exists) under the profiler, its memory
    timeline read as lesson 07 reads it: the peak of all bytes, and the peak of the transient ones, every
    category but the model's state (parameters, gradients, optimizer state), which any version holds alike."""
    trainer = _trainer(project, w, warmup + 1)
    for _ in range(warmup):
        trainer.step()
    timeline = memory.timeline(memory.profile_steps(trainer.step, steps=1))
    transient = [sum(at) for at in zip(*(b for c, b in timeline["bytes"].items() if c not in MODEL_STATE))]
    return {"peak_bytes": memory.peak_bytes(timeline), "transient_peak_bytes": max(transient)}


def step_memory(project, start, w: dict = VISIBLE, budget: float = MEMORY_BUDGET) -> dict:
    """A training step's transient peak (step_peaks) under `budget` x the starting code's on the same workload."""
    mine, theirs = step_peaks(project, w), step_peaks(start, w)
    ratio = mine["transient_peak_bytes"] / theirs["transient_peak_bytes"]
    return {"goal": "step_memory", "passed": ratio <= budget, "ratio": ratio, "budget": budget,
            "transient_peak_bytes": mine["transient_peak_bytes"], "peak_bytes": mine["peak_bytes"],
            "start_transient_peak_bytes": theirs["transient_peak_bytes"], "start_peak_bytes": theirs["peak_bytes"]}


# --- Hygiene --------------------------------------------------------------------------------------------

def _is_torch_deprecation(caught: warnings.WarningMessage) -> bool:
    text = str(caught.message)
    deprecation = issubclass(caught.category, (DeprecationWarning, FutureWarning)) or "deprecat" in text.lower()
    from_torch = Path(caught.filename).resolve().is_relative_to(Path(torch.__file__).parent)
    return deprecation and ("torch" in text or from_torch)


def deprecations(folder, w: dict = VISIBLE, steps: int = 2) -> dict:
    """Deprecation warnings from torch while the project is imported, trains `steps` steps, exports, loads
    and serves: none allowed. Imported afresh (a warning raised at import counts) and with
    torch.set_warn_always(True), so warnings torch raises once per process are seen every time."""
    found = []
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory() as tmp:
            warnings.simplefilter("always")
            project = load_project(folder)
            trainer, _, _ = project.train.train(project.data.corpus(w["part"]), config(project, w), w["batch_size"],
                                                w["seq_len"], steps, w["seed"], w["lr"])
            served, _ = _export_and_load(project, trainer.model, tmp)
            project.serve.next_token_logits(served, torch.zeros(1, w["seq_len"], dtype=torch.long))
    finally:
        torch.set_warn_always(warn_always)
    for c in caught:
        line = f"{c.category.__name__}: {str(c.message).splitlines()[0]}"
        if _is_torch_deprecation(c) and line not in found:
            found.append(line)
    return {"goal": "deprecations", "passed": not found, "warnings": found}


def deterministic_repeat(project, w: dict = VISIBLE) -> dict:
    """The project's whole run (its tokenizer, batches, model, optimizer) twice with the same seed: the same
    losses, bit for bit."""
    text = project.data.corpus(w["part"])
    runs = [project.train.train(text, config(project, w), w["batch_size"], w["seq_len"], w["steps"], w["seed"],
                                w["lr"])[1] for _ in range(2)]
    differ = [i for i, (a, b) in enumerate(zip(*runs)) if a != b]
    return {"goal": "deterministic_repeat", "passed": not differ and len(runs[0]) == len(runs[1]) == w["steps"],
            "first_differing_step": differ[0] if differ else None, "losses": runs}


def graph_breaks(project, w: dict = VISIBLE) -> dict:
    """torch._dynamo.explain over train.loss_fn on a training-mode model and a batch: one graph, no break."""
    model = project.model.build_model(config(project, w), w["seed"]).train()
    ids = torch.randint(w["model"]["vocab_size"], (w["batch_size"], w["seq_len"] + 1),
                        generator=torch.Generator().manual_seed(w["seed"]))
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(project.train.loss_fn)(model, ids[:, :-1], ids[:, 1:])
    except Exception as error:       # a trace that fails is a finding, reported like a break
        return {"goal": "graph_breaks", "passed": False, "graph_breaks": None, "graphs": None,
                "reasons": [f"{type(error).__name__}: {str(error).splitlines()[0]}"]}
    finally:
        torch._dynamo.reset()
    reasons = list(dict.fromkeys(str(b.reason).splitlines()[0] for b in explained.break_reasons))
    return {"goal": "graph_breaks", "passed": explained.graph_break_count == 0,
            "graph_breaks": explained.graph_break_count, "graphs": explained.graph_count, "reasons": reasons}


# --- Everything -----------------------------------------------------------------------------------------

def _attempt(goal: str, measure, *args, **kwargs) -> dict:
    """A goal's result, or a failed goal saying what the project raised."""
    try:
        return measure(*args, **kwargs)
    except Exception as error:
        return {"goal": goal, "passed": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:500]}"}


def grade(project, start, reference, w: dict = VISIBLE, threads_used: int | None = None) -> dict:
    """Every goal on one workload, the timed ones on `threads_used` threads: {"goals": {name: result},
    "passed": [names], "seconds": ...}."""
    t0 = time.perf_counter()
    model = _attempt("trained", trained, project, reference, w)
    model = None if isinstance(model, dict) else model       # each serving goal then trains, and reports the error
    goals = {goal: _attempt(goal, measure, *args, **kwargs) for goal, measure, args, kwargs in (
        ("loss_curve", loss_curve, (project, reference, w), {}),
        ("causality", causality, (project, w), {}),
        ("batches_match", batches_match, (project, reference, w), {}),
        ("serving_agreement", serving_agreement, (project, reference, w), {"model": model}),
        ("served_size", served_size, (project, start, reference, w), {"model": model}),
        ("train_speed", train_speed, (project, start, w), {"threads_used": threads_used}),
        ("serve_latency", serve_latency, (project, start, w), {"threads_used": threads_used}),
        ("step_memory", step_memory, (project, start, w), {}),
        ("deprecations", deprecations, (project.folder, w), {}),
        ("deterministic_repeat", deterministic_repeat, (project, w), {}),
        ("graph_breaks", graph_breaks, (project, w), {}))}
    return {"goals": goals, "passed": [g for g, r in goals.items() if r["passed"]],
            "seconds": math.ceil(time.perf_counter() - t0)}


# --- In the guide notebook ------------------------------------------------------------------------------

EVIDENCE = ("leaking_positions", "batches_equal", "warnings", "reasons")   # the lists that say why a goal missed


def describe(result: dict) -> str:
    """A goal's figures on one line (its verdict flag and long lists left out); a missed goal also shows its
    evidence (which batches differ, the warnings, the graph breaks' reasons), the first three of each."""
    def show(value):
        if isinstance(value, list):
            return "[" + "; ".join(str(v)[:200] for v in value[:3]) + (f"; and {len(value) - 3} more" if len(value) > 3
                                                                       else "") + "]"
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return ", ".join(f"{k} {show(v)}" for k, v in result.items()
                     if k not in ("goal", "passed") and not isinstance(v, (list, dict)) or k == "leaking_positions"
                     or k in EVIDENCE and not result["passed"])


def check_goals(results: list[dict], what: str, hints: dict[str, str] | None = None, stop: bool = True) -> bool:
    """One line per goal: passed, or what was measured with the goal's hint. With `stop`, any goal missed
    raises helpers.checks.CheckFailed after every line is printed; without, the notebook goes on. Returns
    whether every goal passed."""
    missed = []
    for result in results:
        name = f"{what}: {result['goal']}"
        if result["passed"]:
            checks.passed(name)
            continue
        hint = (hints or {}).get(result["goal"], "")
        missed.append(name)
        print(f"Not yet. {name}: {describe(result)}" + (f"\n   Hint: {hint}" if hint else ""))
    if missed and stop:
        checks.fail(what, f"{len(missed)} of {len(results)} goals missed ({', '.join(missed)})",
                    "each line above says what was measured")
    return not missed
