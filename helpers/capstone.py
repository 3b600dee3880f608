"""Lab 10, the capstone: each goal measured on a project folder, as a JSON-ready dict.

A project is a folder with `__init__.py`, `data.py`, `model.py`, `train.py` and `serve.py` exposing the
starting code's public functions (labs/10_capstone/). `load_project(folder)` imports it as a fresh package,
so the starting code, a submission and the reference run side by side in one process. A workload
(`workload(...)`) fixes the corpus slice, the model's sizes, the batch, the sequence length, the steps and
the seed; the grader runs hidden ones.

    start, mine, ref = (load_project(f) for f in (START, "my_capstone", REFERENCE))
    goals(["loss_curve", "train_speed"], mine, start, ref, VISIBLE)   # [{"goal": ..., "passed": ...}, ...]
    grade(mine, start, ref, VISIBLE)                                  # every goal

Each goal is two halves (GOALS): a measure, which runs the project's code and returns plain values, and a
judge, which decides with the reference at hand. The guide runs both in the learner's process; the grader
(helpers.grading.specs.lab10) runs the measures in the sandbox and judges in its own process, so the
reference never meets a submission.

Speed is judged like the validation pipeline judges a timing (helpers.validation.stats): the starting code
(A) and the project (B) alternate in rounds (A B, B A, ...), each round gives each side's time per call, and
a gain counts only when its 95% paired interval lies above 1 and the gain itself is at least 1 + SPEED_GAIN:
the pipeline's verdict (an improvement beyond stats.MIN_CHANGE) is what the learner's report states, and the
goal asks a step the learner made, not a difference of two builds of the same code (timing the starting code
against itself gave 0.91-1.12x on a loaded machine). Each side runs in a fresh process of its own, its CPU
read from outside (helpers.capstone_timing): in one process a project could slow the starting code and forge
a gain, and the process the goals run in weighed on whichever side ran there; a step handed to a worker
process, or a thread that burns CPU while A is timed, forged 80x and 42x gains before.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import itertools
import json
import math
import os
import statistics
import tempfile
import threading
import time
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers import capstone_timing, checks, memory
from helpers.validation import stats

REPO = Path(__file__).resolve().parents[1]
START = REPO / "labs" / "10_capstone"
REFERENCE = REPO / "labs" / "solutions" / "10_capstone"
MODULES = ("data", "model", "train", "serve")

LOSS_RTOL = 1e-5            # per step, |loss - reference| / reference; a correct port differs by <= 2.4e-7
TRAINED_RTOL = 3e-6         # the trained models' logits apart, per position, over training's move (loss_curve)
SERVE_RTOL = 0.03           # ||served - fp32|| / ||fp32|| over the held-out prompts' next-token logits
SERVE_AGREEMENT = 0.95      # share of held-out prompts whose top-1 token the served model keeps
LOSS_RISE = 0.005           # the served model's held-out cross-entropy may rise this much (relative) above fp32's
ACCURACY_DROP = 0.02        # and its held-out top-1 accuracy fall this far below fp32's
BYTES_BUDGET = 1 / 3        # served file, as a fraction of the starting code's (float32) file
MEMORY_BUDGET = 0.5         # a training step's transient peak, as a fraction of the starting code's
SPEED_GAIN = 0.10           # a timed goal asks at least this much faster (A's time / B's >= 1.10) with the interval above 1
MODEL_STATE = ("parameter", "gradient", "optimizer_state")    # timeline categories every version holds alike
CAUSAL_ATOL = 1e-5          # logits before a changed token may move by float noise, no more
HELD_OUT = 512              # held-out prompts (the other corpus slice): the served size's quality floor
SERVE_PROMPTS = 256         # ... the first of them: serving agreement
TRAIN_PROMPTS = 16          # ... the first of them: the trained models compared (loss_curve)
MAX_ROUNDS = 1000           # the most paired rounds a timed goal's judge reads
MAX_OUTPUTS = 100_000       # ... and numbers of its calls' outputs
OUTPUT_RTOL = 1e-4          # a timed call's output against the same call untimed (the same code, threads and inputs)
BATCHES_COMPARED = 4        # make_batches' first batches compared with the documented ones

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


def load_project(folder, sources: dict[str, str] | None = None) -> types.SimpleNamespace:
    """Import the project in `folder` as a new package (its modules import each other relatively) from
    `sources`, its Python files by name (None: read from the folder now); returns its modules as attributes
    (data, model, train, serve), `folder`, and `sources`, which are what ran: a file changed on disk later
    changes nothing (what a timed goal's process imports, and what its digest is of)."""
    folder = Path(folder).resolve()
    if not (folder / "__init__.py").is_file():
        raise FileNotFoundError(f"{folder} is not a project folder: it has no __init__.py")
    sources = capstone_timing.sources(folder) if sources is None else sources
    name = f"capstone_project_{next(_loaded)}"
    capstone_timing.import_sources(name, folder, sources)
    return types.SimpleNamespace(folder=str(folder), sources=sources, **{m: importlib.import_module(f"{name}.{m}") for m in MODULES})


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


def reference_inputs(reference, w: dict, prompts: int = HELD_OUT) -> dict:
    """What a project's measures need from the reference, computed where the reference is (the guide's process,
    or the grader): the workload's batches, and `prompts` held-out prompts [prompts, seq_len] from the other
    corpus slice with the token after each."""
    ((x, y),) = reference_batches(reference, w | {"batch_size": prompts}, steps=1, part=1 - w["part"])
    return {"batches": reference_batches(reference, w), "prompts": x, "next_tokens": y[:, -1]}


# Each goal is a measure and a judge. measure_X(project, start, w, given) runs the project's code and returns
# plain values (in the grader, inside the sandbox); judge_X(measured, reference, w, given) decides, with the
# reference at hand (in the grader, outside it). `given` is reference_inputs(reference, w).

# --- Correctness --------------------------------------------------------------------------------------

def measure_training(project, start, w: dict, given: dict) -> dict:
    """The project trained on the given batches with deterministic algorithms: its losses; its trained
    logits on the first TRAIN_PROMPTS prompts; its trained weights; and that model served (export, load): the
    served next-token logits on every prompt and the file's bytes (or what serving raised)."""
    with deterministic():
        trainer = project.train.make_trainer(config(project, w), iter(given["batches"]), w["seed"], w["lr"])
        losses = [trainer.step() for _ in range(w["steps"])]
    model = trainer.model.eval()
    with torch.no_grad():
        measured = {"losses": losses, "logits": model(given["prompts"][:TRAIN_PROMPTS]),
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    try:
        with tempfile.TemporaryDirectory() as folder:
            served, measured["served_bytes"] = _export_and_load(project, model, folder)
            measured["served_logits"] = project.serve.next_token_logits(served, given["prompts"]).float()
    except Exception as error:
        measured["serving_error"] = _raised(error, 300)
    return measured


def _raised(error: BaseException, limit: int = 500) -> str:
    """What raised, on one line: its type and the first line of its message, cut to `limit` characters."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:limit]}"


def _fp32_logits(reference, state: dict, w: dict, prompts: torch.Tensor) -> torch.Tensor:
    """Next-token logits of the given weights in the reference's float32 model."""
    fp32 = reference.model.build_model(config(reference, w), w["seed"]).eval()
    fp32.load_state_dict(state)
    with torch.no_grad():
        return fp32(prompts)[:, -1]


_REFERENCE_RUNS: dict[tuple[str, str], dict] = {}


def _reference_training(reference, w: dict, given: dict) -> dict:
    """measure_training of the reference, once per workload (a grader judges a class against the same run)."""
    key = (reference.folder, repr(w))
    if key not in _REFERENCE_RUNS:
        _REFERENCE_RUNS[key] = measure_training(reference, reference, w, given)
    return _REFERENCE_RUNS[key]


def judge_loss_curve(measured: dict, reference, w: dict, given: dict, rtol: float = LOSS_RTOL,
                     trained_rtol: float = TRAINED_RTOL) -> dict:
    """The first `steps` training losses on the reference batches, with deterministic algorithms, against the
    reference's: every step within `rtol` (relative); and what the two trained models compute: on held-out
    prompts, at the median position, ||logits - reference's|| at most `trained_rtol` x ||reference's - the
    initial model's|| (how far training moved them there).

    A change of documented behaviour can move the losses little (weight decay 0.01 -> 0, exact GELU for the
    tanh one) but moves what training learns, which the trained logits show. Logits, not parameters: a
    softmax ignores the key projection's bias, whose gradient is then rounding noise that AdamW scales to
    full steps, so correct ports' parameters part by as much as a small change of behaviour moves them."""
    losses = _numbers(measured["losses"], w["steps"])
    theirs = _reference_training(reference, w, given)
    if len(losses) != len(theirs["losses"]):
        raise ValueError(f"{len(losses)} losses for {len(theirs['losses'])} steps")
    errors = [abs(a - b) / abs(b) for a, b in zip(losses, theirs["losses"])]
    worst = max(range(len(errors)), key=errors.__getitem__)
    initial = reference.model.build_model(config(reference, w), w["seed"]).eval()
    with torch.no_grad():
        before = initial(given["prompts"][:TRAIN_PROMPTS])
    mine = measured["logits"].float().reshape(theirs["logits"].shape)
    moved = float(((mine - theirs["logits"]).norm(dim=-1) / (theirs["logits"] - before).norm(dim=-1)).median())
    return {"goal": "loss_curve", "passed": errors[worst] <= rtol and moved <= trained_rtol, "rtol": rtol,
            "worst_error": errors[worst], "worst_step": worst, "trained_error": moved,
            "trained_rtol": trained_rtol, "losses": losses, "reference": theirs["losses"]}


def measure_causality(project, start, w: dict, given: dict, positions: int = 4, atol: float = CAUSAL_ATOL) -> dict:
    """Changing the token at position p must leave the logits at every position before p as they were (a
    language model may not see the future): the positions whose earlier logits moved beyond `atol`."""
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
                leaks[str(p)] = moved
    return {"atol": atol, "changed_positions": picks, "leaking_positions": leaks}


def judge_causality(measured: dict, reference, w: dict, given: dict) -> dict:
    """The planted bug's goal: no position leaks."""
    leaks = measured["leaking_positions"]
    if not isinstance(leaks, dict):
        raise ValueError("leaking_positions is not a dict")
    return {**measured, "goal": "causality", "passed": not leaks}


def measure_batches(project, start, w: dict, given: dict, steps: int = BATCHES_COMPARED) -> dict:
    """The first `steps` batches of the project's make_batches, tokenized by its own tokenizer."""
    text = project.data.corpus(w["part"])
    tokenizer = project.data.build_tokenizer(text, w["model"]["vocab_size"])
    made = project.data.make_batches(text, tokenizer, w["batch_size"], w["seq_len"], steps, w["seed"])
    return {"batches": [list(b) if isinstance(b, (list, tuple)) else b for b in itertools.islice(made, steps)]}


def judge_batches(measured: dict, reference, w: dict, given: dict, steps: int = BATCHES_COMPARED) -> dict:
    """The project's make_batches gives the documented batches: the reference's, in order."""
    theirs = reference_batches(reference, w, steps)
    mine = _sequence(measured["batches"], steps)
    same = [isinstance(m, (list, tuple)) and len(m) == 2 and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b) for a, b in zip(m, t))
        for m, t in zip(mine, theirs)]
    return {"goal": "batches_match", "passed": len(same) == steps and all(same), "batches_equal": same}


def _served(measured: dict) -> None:
    if "serving_error" in measured:
        raise RuntimeError(f"serving raised {measured['serving_error']}")


def judge_serving_agreement(measured: dict, reference, w: dict, given: dict, rtol: float = SERVE_RTOL,
                            agreement: float = SERVE_AGREEMENT) -> dict:
    """The served model (export, then load) against the float32 model with the same trained weights: the
    next-token logits within `rtol` (relative, over the first SERVE_PROMPTS prompts) and the same top-1
    token on `agreement` of them."""
    _served(measured)
    x = given["prompts"][:SERVE_PROMPTS]
    expected = _fp32_logits(reference, measured["state"], w, x)
    got = measured["served_logits"][:SERVE_PROMPTS].float().reshape(expected.shape)
    error = float((got - expected).norm() / expected.norm())
    agree = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
    return {"goal": "serving_agreement", "passed": error <= rtol and agree >= agreement, "relative_error": error,
            "rtol": rtol, "top1_agreement": agree, "agreement_needed": agreement}


_START_FILES: dict[str, int] = {}


@functools.cache
def _starting_code():
    return load_project(START)


def _start_file_bytes(w: dict) -> int:
    """The bytes of the file the starting code exports for the workload's model, made where the judge runs
    (the starting code is the course's own: a submission's process never reports it)."""
    if repr(w) not in _START_FILES:
        start = _starting_code()
        with tempfile.TemporaryDirectory() as folder:
            _START_FILES[repr(w)] = _export_and_load(start, start.model.build_model(config(start, w), w["seed"]),
                                                     folder)[1]
    return _START_FILES[repr(w)]


def _sequence(values, most: int) -> list:
    """A returned list or tuple of at most `most` items (a judge never iterates anything larger)."""
    if not isinstance(values, (list, tuple)) or len(values) > most:
        raise ValueError(f"expected a list of at most {most}")
    return list(values)


def _numbers(values, most: int) -> list[float]:
    """A returned sequence of at most `most` numbers, as floats."""
    return [float(v) for v in _sequence(values, most)]


def judge_served_size(measured: dict, reference, w: dict, given: dict, budget: float = BYTES_BUDGET,
                      loss_rise: float = LOSS_RISE, drop: float = ACCURACY_DROP) -> dict:
    """The served file's bytes under `budget` x the starting code's file for the same model, at a quality
    floor on every held-out prompt: the next-token cross-entropy at most `loss_rise` (relative) above the
    float32 model's, and the top-1 accuracy at most `drop` below it."""
    _served(measured)
    if int(measured["served_bytes"]) <= 0:
        raise ValueError(f"a served file of {int(measured['served_bytes'])} bytes")
    x, y = given["prompts"], given["next_tokens"]
    expected = _fp32_logits(reference, measured["state"], w, x)
    got = measured["served_logits"].float().reshape(expected.shape)
    loss, fp32_loss = (float(F.cross_entropy(logits, y)) for logits in (got, expected))
    accuracy, fp32_accuracy = (float((logits.argmax(-1) == y).float().mean()) for logits in (got, expected))
    size, start_size = int(measured["served_bytes"]), _start_file_bytes(w)
    ratio = size / start_size
    floor = loss <= fp32_loss * (1 + loss_rise) and accuracy >= fp32_accuracy - drop
    return {"goal": "served_size", "passed": ratio <= budget and floor, "bytes": size, "start_bytes": start_size,
            "ratio": ratio, "budget": budget, "loss": loss, "fp32_loss": fp32_loss, "loss_rise_allowed": loss_rise,
            "accuracy": accuracy, "fp32_accuracy": fp32_accuracy, "drop_allowed": drop}


def _export_and_load(project, model, folder) -> tuple[object, int]:
    path = os.path.join(folder, "served.pt")
    project.serve.export(model, path)
    return project.serve.load(path), os.path.getsize(path)


# --- Speed ----------------------------------------------------------------------------------------------

def speed_verdict(goal: str, rounds_a: list[float], rounds_b: list[float], least: float = SPEED_GAIN) -> dict:
    """The gain of B over A (A's time / B's) with its paired interval and the pipeline's verdict; passed for
    an improvement of at least 1 + `least`, in the rounds' typical gain and in their total time alike (work
    piled into one round pays in full: the typical gain of rounds, their geometric mean, would not see it)."""
    interval = stats.paired_interval(rounds_a, rounds_b, "lower")
    verdict, total_gain = stats.verdict(interval), sum(rounds_a) / sum(rounds_b)
    passed = verdict == "improvement" and min(interval["gain"], total_gain) >= 1 + least
    return {"goal": goal, "passed": passed, "verdict": verdict, "gain": interval["gain"], "total_gain": total_gain,
            "least": 1 + least,
            "low": interval["low"], "high": interval["high"], "pairs": interval["pairs"],
            "round_gains": interval["round_gains"], "start_s": statistics.median(rounds_a),
            "project_s": statistics.median(rounds_b), "threads": torch.get_num_threads(),
            "start_rounds": list(rounds_a), "project_rounds": list(rounds_b)}


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


def timed_call(project, goal: str, w: dict, calls: int, folder):
    """What a timed goal times, on the project's own pipeline: a training step (next batch, forward, backward,
    optimizer step) of a trainer built for `calls` steps, or batch-1 next_token_logits on a seq_len prompt,
    served (exported into `folder`, loaded), a new prompt each of the `calls` calls."""
    if goal == "train_speed":
        return _trainer(project, w, calls).step
    generator = torch.Generator().manual_seed(w["seed"])
    prompts = iter(torch.randint(w["model"]["vocab_size"], (calls, 1, w["seq_len"]), generator=generator))
    served, _ = _export_and_load(project, project.model.build_model(config(project, w), w["seed"]), folder)
    return lambda: project.serve.next_token_logits(served, next(prompts))   # a new prompt each call: no cache pays


def _measure_speed(goal: str, project, start, w: dict, rounds: int, calls: int, warmup: int,
                   threads_used: int | None) -> dict:
    """The starting code (A) and the project (B) in paired rounds, each in a process of its own importing the
    sources it was loaded from, both on `threads_used` intra-op threads (None: as set), each call built and
    warmed up on its side."""
    total = warmup + rounds * calls
    with threads(threads_used):      # the untimed runs first: no project code runs here once the rounds have
        here = [_untimed(project, goal, w, total) for _ in range(2 if goal == "train_speed" else 1)]
        with capstone_timing.started(start.sources, goal, w, total, warmup, "the starting code") as side_a, \
                capstone_timing.started(project.sources, goal, w, total, warmup, "the project") as side_b:
            a, b, clock = capstone_timing.paired_rounds(side_a, side_b, rounds, calls)
            return {"start": a, "project": b, "clock": clock, "threads": torch.get_num_threads(),
                    "start_job": side_a.job, "project_digest": side_b.job["digest"],
                    "project_outputs": side_b.outputs(), "outputs_here": here}


def _untimed(project, goal: str, w: dict, calls: int) -> list[float]:
    """The fingerprints of a timed goal's calls run here, untimed (capstone_timing.fingerprint)."""
    with tempfile.TemporaryDirectory() as folder:
        run = timed_call(project, goal, w, calls, folder)
        return [x for _ in range(calls) for x in capstone_timing.fingerprint(run())]


def _outputs_checked(measured: dict, rtol: float = OUTPUT_RTOL) -> str:
    """Whether the project's timed calls returned what the same calls return untimed: 'same as untimed', 'not
    compared' where two untimed runs differ (training that is not deterministic, which other goals judge), or
    where they part."""
    timed = _numbers(measured.get("project_outputs", []), MAX_OUTPUTS)
    runs = [_numbers(run, MAX_OUTPUTS) for run in _sequence(measured.get("outputs_here", []), 2)]

    def parted(x: list, y: list) -> int | None:
        scale = rtol * max(map(abs, y), default=0.0)      # float noise is relative to the outputs' size
        if len(x) != len(y):
            return min(len(x), len(y))
        return next((i for i, (u, v) in enumerate(zip(x, y)) if abs(u - v) > scale), None)
    if not all(map(math.isfinite, timed + [x for run in runs for x in run])):
        return "differ: an output is not finite"
    if not runs or any(parted(runs[0], run) is not None for run in runs[1:]):
        return "not compared: two untimed runs differ"
    at = parted(timed, runs[0])
    return "same as untimed" if at is None else f"differ from the same calls untimed from number {at} on"


def measure_train_speed(project, start, w: dict, given: dict, rounds: int = 6, calls: int = 5, warmup: int = 3,
                        threads_used: int | None = None) -> dict:
    """Training step time of the starting code and the project in paired rounds (_measure_speed)."""
    return _measure_speed("train_speed", project, start, w, rounds, calls, warmup, threads_used)


def measure_serve_latency(project, start, w: dict, given: dict, rounds: int = 6, calls: int = 20, warmup: int = 3,
                          threads_used: int | None = None) -> dict:
    """Batch-1 serving latency of the starting code and the project in paired rounds (_measure_speed)."""
    return _measure_speed("serve_latency", project, start, w, rounds, calls, warmup, threads_used)


def _judge_speed(goal: str):
    def judge(measured: dict, reference, w: dict, given: dict) -> dict:
        a, b = (_numbers(measured[side], MAX_ROUNDS) for side in ("start", "project"))
        if len(a) != len(b) or len(a) < 2 or min(a + b) <= 0:
            raise ValueError(f"rounds that cannot be paired: {len(a)} and {len(b)} rounds")
        job, clock = dict(measured.get("start_job") or {}), str(measured["clock"])
        if job.get("digest") != capstone_timing.digest(capstone_timing.sources(START)):
            raise ValueError("the code timed as the starting code is not the starting code of 10_capstone/")
        if (job.get("goal"), job.get("workload"), job.get("warmup", 0) >= 1) != (goal, w, True) or \
                (clock == "cpu" and job.get("threads") != 1):
            raise ValueError("the starting code was not timed on this goal's job (its workload, warmup, or one "
                             "thread on the CPU clock)")
        verdict, outputs = speed_verdict(goal, a, b), _outputs_checked(measured)
        return verdict | {"passed": verdict["passed"] and not outputs.startswith("differ"), "outputs": outputs,
                          "threads": int(measured["threads"]), "clock": clock}
    judge.__doc__ = f"The {goal} gain of the project over the starting code: the pipeline's paired verdict."
    return judge


judge_train_speed, judge_serve_latency = _judge_speed("train_speed"), _judge_speed("serve_latency")


# --- Memory ---------------------------------------------------------------------------------------------

def resident_bytes(prof, categories=MODEL_STATE) -> int:
    """Bytes of the tensors alive when the profile began and still alive when it ended (a dataset held as a
    tensor, say), every category but `categories`; read from the per-tensor timeline that
    prof.export_memory_timeline (helpers.memory.timeline) builds. A tensor alive at the start that the
    profiled code frees (what the previous step left) is not resident."""
    from torch.profiler._memory_profiler import Action, TensorKey
    mem_tl = prof.mem_tl
    resident = {}
    for _, action, (key, version), size in mem_tl.timeline:
        if not isinstance(key, TensorKey) or key.device.type != "cpu":
            continue
        if action == Action.PREEXISTING:
            category = mem_tl.categories.get(key, version)
            if category is None or category.name.lower() not in categories:
                resident[key] = size
        elif action == Action.DESTROY:
            resident.pop(key, None)
    return sum(resident.values())


def step_peaks(project, w: dict = VISIBLE, warmup: int = 2) -> dict:
    """One training step (after `warmup` steps, so the optimizer state exists) under the profiler, its memory
    timeline read as lesson 07 reads it: the peak of all bytes, and the transient peak, the most bytes the
    step holds above what is resident through it: every category but the model's state (parameters,
    gradients, optimizer state, which any version holds alike), less the bytes alive through the whole step
    (resident_bytes: the data a pipeline keeps, whether in a tensor, a list or an array)."""
    trainer = _trainer(project, w, warmup + 1)
    for _ in range(warmup):
        trainer.step()
    prof = memory.profile_steps(trainer.step, steps=1)
    timeline = memory.timeline(prof)
    transient = [sum(at) for at in zip(*(b for c, b in timeline["bytes"].items() if c not in MODEL_STATE))]
    resident = resident_bytes(prof)
    return {"peak_bytes": memory.peak_bytes(timeline), "transient_peak_bytes": max(transient) - resident,
            "resident_bytes": resident}


def measure_step_memory(project, start, w: dict, given: dict) -> dict:
    """step_peaks of the project and of the starting code on the same workload."""
    return {"project": step_peaks(project, w), "start": step_peaks(start, w)}


def judge_step_memory(measured: dict, reference, w: dict, given: dict, budget: float = MEMORY_BUDGET) -> dict:
    """A training step's transient peak (step_peaks) under `budget` x the starting code's on the same workload."""
    mine, theirs = measured["project"], measured["start"]
    if min(mine["transient_peak_bytes"], theirs["transient_peak_bytes"]) <= 0:
        raise ValueError("a transient peak of zero bytes or fewer")
    ratio = mine["transient_peak_bytes"] / theirs["transient_peak_bytes"]
    return {"goal": "step_memory", "passed": ratio <= budget, "ratio": ratio, "budget": budget,
            "transient_peak_bytes": mine["transient_peak_bytes"], "peak_bytes": mine["peak_bytes"],
            "resident_bytes": mine["resident_bytes"],
            "start_transient_peak_bytes": theirs["transient_peak_bytes"], "start_peak_bytes": theirs["peak_bytes"]}


# --- Hygiene --------------------------------------------------------------------------------------------

def _is_torch_deprecation(caught: warnings.WarningMessage) -> bool:
    text = str(caught.message)
    deprecation = issubclass(caught.category, (DeprecationWarning, FutureWarning)) or "deprecat" in text.lower()
    from_torch = Path(caught.filename).resolve().is_relative_to(Path(torch.__file__).parent)
    return deprecation and ("torch" in text or from_torch)


def measure_deprecations(project, start, w: dict, given: dict, steps: int = 2) -> dict:
    """Deprecation warnings from torch while the project is imported, trains `steps` steps, exports, loads
    and serves. Imported afresh from its folder (a warning raised at import counts) and with
    torch.set_warn_always(True), so warnings torch raises once per process are seen every time."""
    found = []
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught, tempfile.TemporaryDirectory() as tmp:
            warnings.simplefilter("always")
            fresh = load_project(project.folder)
            trainer, _, _ = fresh.train.train(fresh.data.corpus(w["part"]), config(fresh, w), w["batch_size"],
                                              w["seq_len"], steps, w["seed"], w["lr"])
            served, _ = _export_and_load(fresh, trainer.model, tmp)
            fresh.serve.next_token_logits(served, torch.zeros(1, w["seq_len"], dtype=torch.long))
    finally:
        torch.set_warn_always(warn_always)
    for c in caught:
        line = f"{c.category.__name__}: {str(c.message).splitlines()[0][:300]}"
        if _is_torch_deprecation(c) and line not in found:
            found.append(line)
    return {"warnings": found}


def judge_deprecations(measured: dict, reference, w: dict, given: dict) -> dict:
    """No deprecation warning from torch."""
    return {"goal": "deprecations", "passed": not measured["warnings"], "warnings": list(measured["warnings"])}


def measure_repeat(project, start, w: dict, given: dict) -> dict:
    """The project's whole run (its tokenizer, batches, model, optimizer) twice with the same seed: both
    runs' losses."""
    text = project.data.corpus(w["part"])
    return {"losses": [project.train.train(text, config(project, w), w["batch_size"], w["seq_len"], w["steps"],
                                           w["seed"], w["lr"])[1] for _ in range(2)]}


def judge_repeat(measured: dict, reference, w: dict, given: dict) -> dict:
    """The same losses, bit for bit, for every step."""
    runs = [_numbers(run, w["steps"]) for run in _sequence(measured["losses"], 2)]
    differ = [i for i, (a, b) in enumerate(zip(*runs)) if a != b]
    return {"goal": "deterministic_repeat", "passed": len(runs) == 2 and not differ
            and len(runs[0]) == len(runs[1]) == w["steps"], "first_differing_step": differ[0] if differ else None,
            "losses": runs}


def measure_graph_breaks(project, start, w: dict, given: dict) -> dict:
    """torch._dynamo.explain over train.loss_fn on a training-mode model and a batch: its graphs, its breaks
    and their reasons (a trace that fails is reported like a break)."""
    model = project.model.build_model(config(project, w), w["seed"]).train()
    ids = torch.randint(w["model"]["vocab_size"], (w["batch_size"], w["seq_len"] + 1),
                        generator=torch.Generator().manual_seed(w["seed"]))
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(project.train.loss_fn)(model, ids[:, :-1], ids[:, 1:])
    except Exception as error:
        return {"graph_breaks": None, "graphs": None, "reasons": [_raised(error, 300)]}
    finally:
        torch._dynamo.reset()
    return {"graph_breaks": explained.graph_break_count, "graphs": explained.graph_count,
            "reasons": list(dict.fromkeys(str(b.reason).splitlines()[0][:300] for b in explained.break_reasons))[:20]}


def judge_graph_breaks(measured: dict, reference, w: dict, given: dict) -> dict:
    """One graph, no break."""
    return {**measured, "goal": "graph_breaks", "passed": type(measured["graph_breaks"]) is int
            and measured["graph_breaks"] == 0}


# --- The learner's report -------------------------------------------------------------------------------

REPORT = "report.json"      # in the project folder: the learner's claims for the timed goals
CLAIMED = ("verdict", "gain", "low", "high", "start_rounds", "project_rounds")
MAX_REPORT_BYTES = 64 * 1024


def write_report(results: list[dict], folder) -> Path:
    """The timed goals' results (as goals() returns them) written to REPORT in the project folder: for each,
    the verdict, the gain and its interval, and the per-round times they come from."""
    claims = {r["goal"]: {k: r[k] for k in CLAIMED} for r in results if r["goal"] in TIMED and "verdict" in r}
    path = Path(folder) / REPORT
    path.write_text(json.dumps({"claims": claims}, indent=1))
    return path


def measure_report(project, start, w: dict, given: dict) -> dict:
    """The claims of the project's REPORT, read as data ({"found": False} when there is none)."""
    path = Path(project.folder) / REPORT
    if not path.is_file():
        return {"found": False, "claims": None}
    if path.stat().st_size > MAX_REPORT_BYTES:
        raise ValueError(f"{REPORT} is larger than {MAX_REPORT_BYTES // 1024} KB")
    report = json.loads(path.read_text())
    return {"found": True, "claims": report.get("claims") if isinstance(report, dict) else None}


def judge_report(measured: dict, reference, w: dict, given: dict, timed: dict | None = None) -> dict:
    """The report claims each timed goal, and each claim is what its own rounds give under the pipeline's
    statistic (the verdict, and the gain and interval within 1e-6); with `timed` (goal -> this judge's own
    result for it), no claim is contradicted there: an improvement claimed where the grader measured a
    regression, or the reverse. A claim the grader only could not confirm (within noise) stands: the
    learner's machine is not the grader's."""
    if not measured["found"]:
        return {"goal": "report", "passed": False, "problems": [f"no {REPORT} in the project folder"]}
    problems, claims = [], measured["claims"] if isinstance(measured["claims"], dict) else {}
    for goal in TIMED:
        claim = claims.get(goal)
        if not isinstance(claim, dict) or set(CLAIMED) - set(claim):
            problems.append(f"{goal}: no claim with {', '.join(CLAIMED)}")
            continue
        rounds = [_numbers(claim[side], MAX_ROUNDS) for side in ("start_rounds", "project_rounds")]
        own = speed_verdict(goal, *rounds)
        if claim["verdict"] != own["verdict"] or any(
                not math.isclose(float(claim[k]), own[k], rel_tol=1e-6) for k in ("gain", "low", "high")):
            problems.append(f"{goal}: claims {claim['verdict']} {float(claim['gain']):.3g}x "
                            f"[{float(claim['low']):.3g}, {float(claim['high']):.3g}], its rounds give "
                            f"{own['verdict']} {own['gain']:.3g}x [{own['low']:.3g}, {own['high']:.3g}]")
        measured_here = (timed or {}).get(goal, {}).get("verdict")
        if {claim["verdict"], measured_here} == {"improvement", "regression"}:
            problems.append(f"{goal}: claims {claim['verdict']}, the grader measured {measured_here}")
    return {"goal": "report", "passed": not problems, "problems": problems}


# --- Every goal -----------------------------------------------------------------------------------------

# goal -> (measure, judge), in the order the grader measures them; goals that share a measure (training feeds
# three) are measured once by grade()
GOALS = {"batches_match": (measure_batches, judge_batches),     # first: training hands the project the batches
         "loss_curve": (measure_training, judge_loss_curve),
         "causality": (measure_causality, judge_causality),
         "serving_agreement": (measure_training, judge_serving_agreement),
         "served_size": (measure_training, judge_served_size),
         "train_speed": (measure_train_speed, judge_train_speed),
         "serve_latency": (measure_serve_latency, judge_serve_latency),
         "step_memory": (measure_step_memory, judge_step_memory),
         "deprecations": (measure_deprecations, judge_deprecations),
         "deterministic_repeat": (measure_repeat, judge_repeat),
         "graph_breaks": (measure_graph_breaks, judge_graph_breaks),
         "report": (measure_report, judge_report)}
TIMED = ("train_speed", "serve_latency")
HINTS = {"loss_curve": "compare your step with the reference op by op from the same parameters: a documented setting "
                       "changed (an optimizer's, an activation's) moves what training learns even where the loss "
                       "barely moves",
         "causality": "which positions may a position's prediction depend on?",
         "batches_match": "read make_batches' docstring: which generator, which order?",
         "serving_agreement": "serve the model you trained: compare what serve.load returns with the float32 model "
                              "on the same prompts, and keep the error per output channel small",
         "served_size": "a smaller file must predict as well on held-out text: lesson 05, a scale per output channel "
                        "rather than one per tensor; check the held-out loss, not only the size",
         "train_speed": "profile one step before changing it: lessons 01, 02, 03, 05 and 06 each name a cost "
                        "the starting code pays",
         "serve_latency": "at batch 1 each call's fixed costs dominate: the mask built per call, a Python loop "
                          "over experts, the dtype",
         "step_memory": "what does a step keep alive until the backward pass? lesson 07",
         "deprecations": "each warning names the API that replaces it",
         "deterministic_repeat": "every random draw needs its own seeded generator, and the batches' order must "
                                 "not depend on which worker finished first",
         "graph_breaks": "each reason names the line: Python control flow on a tensor's value, a .item(), a "
                         "function dynamo cannot trace",
         "report": "write the report from the rounds you measured (capstone.write_report), and claim only what "
                   "they show"}


_JUDGING = threading.Lock()


def judged(goal: str, measured, reference, w: dict, given: dict, **limits) -> dict:
    """A goal's result from what was measured: a measure that raised (measured is {"error": ...}) or a
    measurement the judge cannot read fails the goal and says why. One judge at a time: a grader judges
    submissions on threads, and the reference's training draws its initial weights from torch's global
    generator (two trainings at once on two threads lost up to 3% of their losses to each other's draws)."""
    try:
        if isinstance(measured, dict) and set(measured) == {"error"}:
            raise RuntimeError(measured["error"])
        with _JUDGING:
            return GOALS[goal][1](measured, reference, w, given, **limits)
    except Exception as error:
        return {"goal": goal, "passed": False, "error": _raised(error)}


def measured(goal: str, project, start, w: dict, given: dict, **options):
    """A goal's measure on the project, or {"error": what it raised}."""
    try:
        return GOALS[goal][0](project, start, w, given, **options)
    except Exception as error:
        return {"error": _raised(error)}


def goal(name: str, project, start, reference, w: dict = VISIBLE, given: dict | None = None, options: dict = {},
         **limits) -> dict:
    """One goal measured on the project and judged against the reference (`options`: the measure's, such as
    rounds and threads_used; `limits`: the judge's, such as rtol and budget)."""
    given = reference_inputs(reference, w) if given is None else given
    return judged(name, measured(name, project, start, w, given, **options), reference, w, given, **limits)


def goals(names, project, start, reference, w: dict = VISIBLE, threads_used: int | None = None,
          rounds: int | None = None) -> list[dict]:
    """The named goals on one workload, each measure run once (the timed ones on `threads_used` threads,
    `rounds` paired rounds or their default)."""
    given, cache, results = reference_inputs(reference, w), {}, []
    timing = {"threads_used": threads_used} | ({"rounds": rounds} if rounds else {})
    for name in names:
        measure = GOALS[name][0]
        if measure not in cache:
            cache[measure] = measured(name, project, start, w, given, **(timing if name in TIMED else {}))
        extra = {"timed": {r["goal"]: r for r in results if r["goal"] in TIMED}} if name == "report" else {}
        results.append(judged(name, cache[measure], reference, w, given, **extra))
    return results


def grade(project, start, reference, w: dict = VISIBLE, threads_used: int | None = None) -> dict:
    """Every goal on one workload, the timed ones on `threads_used` threads: {"goals": {name: result},
    "passed": [names], "seconds": ...}."""
    t0 = time.perf_counter()
    results = dict(zip(GOALS, goals(GOALS, project, start, reference, w, threads_used)))
    return {"goals": results, "passed": [g for g, r in results.items() if r["passed"]],
            "seconds": math.ceil(time.perf_counter() - t0)}


# --- In the guide notebook ------------------------------------------------------------------------------

EVIDENCE = ("leaking_positions", "batches_equal", "warnings", "reasons", "problems")   # the lists that say why a goal missed


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


def check_goals(results: list[dict], what: str, hints: dict[str, str] = HINTS, stop: bool = True) -> bool:
    """One line per goal: passed, or what was measured with the goal's hint. With `stop`, any goal missed
    raises helpers.checks.CheckFailed after every line is printed; without, the notebook goes on. Returns
    whether every goal passed."""
    missed = []
    for result in results:
        name = f"{what}: {result['goal']}"
        if result["passed"]:
            checks.passed(name)
            continue
        hint = hints.get(result["goal"], "")
        missed.append(name)
        print(f"Not yet. {name}: {describe(result)}" + (f"\n   Hint: {hint}" if hint else ""))
    if missed and stop:
        checks.fail(what, f"{len(missed)} of {len(results)} goals missed ({', '.join(missed)})",
                    "each line above says what was measured")
    return not missed
