"""Lab 09's data and checks: the driver run it reads (this machine's or the recorded one), the changes it
injects into run B for the learner to find (a numerics drift, a slowdown) or into a workload (a slowdown
of a planned size), and the properties of a workload the learner writes; every expected value comes from
what was measured."""
from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from helpers.validation import pipeline, reference, stats

RECORDED = Path(__file__).parent / "recorded"


def find_matrix() -> tuple[Path, str]:
    """The newest driver run on this machine (runs/validation-matrix), else the recorded one shipped with
    the package (a real 2.9.1 -> 2.10.0 quick run); with a sentence saying which."""
    from helpers.validation.matrix import latest_matrix
    folder = latest_matrix()
    if folder is not None:
        return folder, f"this machine's latest driver run: {folder.name}"
    return RECORDED, "the recorded run shipped with the lab (python -m helpers validate matrix has not run here)"


def matrix_paths(folder: str | Path) -> tuple[Path, Path]:
    """The merged run files (A, B) of a driver folder."""
    folder = Path(folder)
    names = list(json.loads((folder / "matrix.json").read_text())["venvs"])
    return folder / f"{names[0]}.json", folder / f"{names[1]}.json"


def load_matrix(folder: str | Path) -> tuple[dict, dict, dict]:
    """(run A, run B, report) of a driver folder: the merged runs and the comparison, recomputed from them."""
    a, b = (pipeline.load_run(p) for p in matrix_paths(folder))
    return a, b, pipeline.compare_runs(a, b)


def told_rows(report: dict) -> dict[str, list[dict]]:
    """The rows of a report that have an interval (two or more pairs of rounds), by workload."""
    told: dict[str, list[dict]] = {}
    for row in report["rows"]:
        if row.get("low") is not None:
            told.setdefault(row["workload"], []).append(row)
    return told


def is_timing(fig: dict) -> bool:
    """A figure measured per call in seconds or per second (not bytes, not an exact count)."""
    unit = fig.get("unit", "")
    return fig.get("stat") != "exact" and (unit == "s" or unit.endswith("/s"))


def inject_slowdown(path_a: str | Path, path_b: str | Path, out: str | Path, seed: int = 0, *,
                    workload: str | None = None, factors: list[float] | None = None) -> Path:
    """Run C: run B with every timing sample of one workload slowed in every round (a time multiplied by
    the round's factor, a throughput divided by it); its numerics, checks and other workloads are B's.
    The workload is chosen by seed among those that A against B can tell (two or more pairs of rounds),
    unless given. The factor, unless `factors` gives one per round, is the same in every round: 1.5 times
    the largest of that workload's (1 + detectable change) and interval upper ends in A against B, so
    every figure of it that can be told becomes a regression beyond what the run could detect."""
    run_b = pipeline.load_run(path_b)
    told = told_rows(pipeline.compare_runs(pipeline.load_run(path_a), run_b))
    if not told:
        raise ValueError("A against B has no figure with two or more pairs of rounds: inject into a run made by "
                         "`validate matrix` (interleaved rounds)")
    if workload is None:
        names = sorted(told)
        workload = names[int(np.random.default_rng(seed).integers(len(names)))]
    elif workload not in told:
        raise ValueError(f"workload {workload!r} has no figure A against B can tell; choose one of {sorted(told)}")
    factor = round(1.5 * max(max(1 + r["detectable"], r["high"]) for r in told[workload]), 2)
    c = copy.deepcopy(run_b)
    for fig in c["workloads"][workload]["figures"].values():
        if not is_timing(fig):
            continue
        groups = fig.get("groups") or [len(fig["samples"])]
        per_round = list(factors) if factors else [factor] * len(groups)
        if len(per_round) != len(groups):
            raise ValueError(f"factors has {len(per_round)} values, the run has {len(groups)} rounds")
        each = np.repeat(per_round, groups)
        samples = np.asarray(fig["samples"], dtype=float)
        scaled = samples * each if fig["better"] == "lower" else samples / each
        fig["samples"] = [float(v) for v in scaled]
        fig["value"] = stats.statistic(fig["samples"], fig["stat"])
        fig["min"], fig["max"] = min(fig["samples"]), max(fig["samples"])
    c["label"] = "run C (B after a change you have to find)"
    return pipeline.save_run(c, out)       # the reference outputs are B's, read from B's file


def slowed(fn, change: float):
    """Workload fn made `change` slower (0.10: 10%): each call it times through workloads.sample_calls goes
    on, inside the timed call and on the same thread, with a spin that uses `change` times the CPU time
    the call used (so a busy machine delays the spin as it delays the call; where the thread clock is coarse,
    `change` times the call's wall time). A workload that times its calls otherwise gets its timing
    samples scaled by 1 + change instead, and says so in its notes ("slowed": "scaled")."""
    from helpers.validation import workloads
    clock = time.thread_time if time.get_clock_info("thread_time").resolution <= 1e-6 else time.perf_counter

    def spun(call):
        def slower():
            start = clock()
            out = call()
            end = clock()
            until = end + change * (end - start)
            while clock() < until:
                pass
            return out
        return slower

    def slowed_workload(quick, device, compile=False, samples=None):
        original, used = workloads.sample_calls, []

        def sample_calls(candidates, *args, **kwargs):
            used.append(True)
            return original({name: spun(call) for name, call in candidates.items()}, *args, **kwargs)
        workloads.sample_calls = sample_calls
        try:
            record = fn(quick, device, compile=compile, samples=samples)
        finally:
            workloads.sample_calls = original
        if not used:
            for fig in record["figures"].values():
                if isinstance(fig, dict) and is_timing(fig):
                    fig["samples"] = [v * (1 + change) if fig["better"] == "lower" else v / (1 + change)
                                      for v in fig["samples"]]
                    fig["value"] = stats.statistic(fig["samples"], fig.get("stat", "median"))
            record.setdefault("notes", {})["slowed"] = "scaled"
        return record
    return slowed_workload


# --- lab 09 exercise 5: a workload of the learner's own, checked the way the pipeline would use it ----

RECORD_KEYS = ("config", "figures", "paths", "notes", "references", "_tensors")


def _call_workload(fn, samples: int, torch_seed: int = 0) -> dict:
    torch.manual_seed(torch_seed)          # a different global RNG state must not change the outputs
    record = fn(True, torch.device("cpu"), compile=False, samples=samples)
    if not isinstance(record, dict) or any(k not in record for k in RECORD_KEYS):
        got = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"a workload returns a dict with keys {list(RECORD_KEYS)}; got {got}")
    return record


def _storages(tree) -> set[int]:
    """The storage addresses of the tensors in a (nested) object."""
    return {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(tree)
            if isinstance(t, torch.Tensor)}


class _Derived(torch.overrides.TorchFunctionMode):
    """Adds to `outputs` every tensor computed from one already there (a clone, a cast, a slice), so an
    output recorded after such a step still counts as the reloaded model's."""
    def __init__(self, outputs: list):
        super().__init__()
        self.outputs = outputs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.outputs and _storages((args, kwargs)) & _storages(self.outputs):
            self.outputs.append(out)
        return out


@contextlib.contextmanager
def _watched(perturb: bool = False):
    """What a workload does while active: its torch.save and torch.load calls, the loads without
    weights_only=True, the load_state_dict calls given a loaded state, what the modules given one
    returned (and every tensor computed from those), and what reference.record received. perturb: every
    torch.load returns its floating-point tensors plus 0.5, as a broken round trip would. Everything
    seen is kept alive, so an address is never reused by another tensor."""
    seen = {"saves": 0, "loads": 0, "unsafe_loads": 0, "into_model": 0, "loaded": [], "models": [],
            "outputs": [], "recorded": []}
    save, load, load_state_dict, record = torch.save, torch.load, torch.nn.Module.load_state_dict, reference.record

    def watched_save(*args, **kwargs):
        seen["saves"] += 1
        return save(*args, **kwargs)

    def watched_load(*args, **kwargs):
        seen["loads"] += 1
        seen["unsafe_loads"] += kwargs.get("weights_only") is not True
        state = load(*args, **kwargs)
        if perturb:
            state = torch.utils._pytree.tree_map(
                lambda t: t + 0.5 if isinstance(t, torch.Tensor) and t.is_floating_point() else t, state)
        seen["loaded"].append(state)
        return state

    def watched_load_state_dict(module, state_dict, *args, **kwargs):
        if _storages(state_dict) & set().union(*map(_storages, seen["loaded"])):
            seen["into_model"] += 1
            seen["models"].append(module)
        return load_state_dict(module, state_dict, *args, **kwargs)

    def keep_output(module, args, output):
        if any(module is m for m in seen["models"]):
            seen["outputs"].append(output)

    def watched_record(outputs, *args, **kwargs):
        seen["recorded"].append(dict(outputs))
        return record(outputs, *args, **kwargs)
    handle = torch.nn.modules.module.register_module_forward_hook(keep_output)
    torch.save, torch.load, torch.nn.Module.load_state_dict, reference.record = (
        watched_save, watched_load, watched_load_state_dict, watched_record)
    try:
        with _Derived(seen["outputs"]):
            yield seen
    finally:
        torch.save, torch.load, torch.nn.Module.load_state_dict, reference.record = save, load, load_state_dict, record
        handle.remove()


def _round_trip_property(fn, what: str, samples: int) -> str:
    """The round trip's properties: "trip" (one torch.save and one torch.load(weights_only=True) per timed
    call), "into model" (every loaded state reaches load_state_dict), "checked" (a load that returns
    other weights makes the call raise), "recorded" (a recorded output is one a reloaded model returned)."""
    if what == "trip":
        counts = []
        for n in (samples, samples + 3):       # the calls beyond the timed ones (a warm-up, a check) cancel out
            with _watched() as seen:
                record = _call_workload(fn, n)
            seen["timed"] = max((len(f["samples"]) for f in record["figures"].values()
                                 if isinstance(f, dict) and is_timing(f)), default=0)
            counts.append(seen)
        timed, saves, loads = (counts[1][k] - counts[0][k] for k in ("timed", "saves", "loads"))
        if not timed:                           # the number of samples ignored: each timed call at least
            timed, saves, loads = (counts[1][k] for k in ("timed", "saves", "loads"))
            saves, loads = min(saves, timed), min(loads, timed)
        if (saves, loads) != (timed, timed):
            return (f"{timed} timed call(s) made {saves} torch.save and {loads} torch.load call(s) of their own (the "
                    f"check counts calls through torch.save and torch.load)")
        unsafe = counts[1]["unsafe_loads"]
        return f"{unsafe} torch.load call(s) without weights_only=True" if unsafe else \
            "one torch.save and one torch.load(weights_only=True) per timed call"
    if what == "into model":
        with _watched() as seen:
            _call_workload(fn, samples)
        return f"{seen['into_model']} of {seen['loads']} loaded states put into a model with load_state_dict" \
            if seen["into_model"] < seen["loads"] or not seen["loads"] else "every loaded state put into a model"
    if what == "checked":
        try:
            with _watched():
                _call_workload(fn, samples)
        except NotImplementedError:
            raise
        except Exception as exc:     # noqa: BLE001 (it must run before its raising can mean anything)
            return f"the workload raised {type(exc).__name__} with nothing changed"
        with _watched(perturb=True):
            try:
                _call_workload(fn, samples)
            except NotImplementedError:
                raise                   # a stub noticed nothing
            except Exception:       # noqa: BLE001 (any error: the workload noticed)
                return "a reloaded model that computes something else stops the workload"
        return "a reloaded model with other weights went unnoticed"
    if what == "recorded":
        with _watched() as seen:
            _call_workload(fn, samples)
        if not seen["recorded"]:
            return "reference.record was not called (call it through the module: reference.record({...}))"
        from_reloaded = _storages(seen["outputs"])
        names = [name for outputs in seen["recorded"] for name, t in outputs.items()
                 if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in from_reloaded]
        return "a reloaded model's output recorded" if names else \
            "no output recorded with reference.record came from a model given the reloaded state"
    raise ValueError(f"unknown property {what!r}")


ROUND_TRIP = ("trip", "into model", "checked", "recorded")


def workload_property(fn, what: str, samples: int) -> str:
    """One property of a workload function fn(quick, device, compile=..., samples=...), in words:
    "record" (the keys the pipeline reads, a timed figure, a reference output), the round trip's
    properties (ROUND_TRIP, in `_round_trip_property`), "averaged" (not one number for all calls),
    "samples" (one sample per timed call, as many as asked), "better" (a time is better lower, a rate
    higher), "references" (the outputs do not depend on torch's global random state), "aa" (run by the
    pipeline in two interleaved rounds a side, A against A finds no numerics or warning difference)."""
    if what == "record":
        record = _call_workload(fn, samples)
        timed = [n for n, f in record["figures"].items() if isinstance(f, dict) and is_timing(f)]
        if not timed:
            return "no timed figure (a unit of s or .../s, one sample per call)"
        return "a record with a timed figure and a reference output" if record["references"] else \
            "a timed figure but no reference output"
    if what in ROUND_TRIP:
        return _round_trip_property(fn, what, samples)
    if what == "averaged":
        record = _call_workload(fn, samples)
        wrong = [f"{n!r} has one sample for {samples} timed calls" for n, f in record["figures"].items()
                 if is_timing(f) and len(f["samples"]) == 1 and samples > 1]
        return "; ".join(wrong) or "not one number for all calls"
    if what == "samples":
        record = _call_workload(fn, samples)
        wrong = [f"{n!r} has {len(f['samples'])} sample(s) for {samples} timed calls"
                 for n, f in record["figures"].items() if is_timing(f) and len(f["samples"]) != samples]
        return "; ".join(wrong) or "one sample per timed call"
    if what == "better":
        record = _call_workload(fn, samples)
        wrong = [f"{n!r} in {f['unit']} is better {f['better']!r}" for n, f in record["figures"].items()
                 if is_timing(f) and f["better"] != ("lower" if f["unit"] == "s" else "higher")]
        return "; ".join(wrong) or "every figure's better matches its unit"
    if what == "references":
        first, second = (_call_workload(fn, samples, seed)["references"] for seed in (0, 1))
        changed = sorted(k for k in first if first[k]["sha256"] != second.get(k, {}).get("sha256"))
        return f"outputs {changed} change with torch's global seed" if changed else \
            "the same outputs whatever torch's global seed"
    if what == "aa":
        rounds = {"A": [], "B": []}
        for i, side in enumerate(("A", "B", "B", "A")):       # interleaved, as the driver runs them
            torch.manual_seed(i)
            rounds[side].append(pipeline.run_pipeline(True, device="cpu", workloads=[], checks=[], samples=samples,
                                                      progress=False, extra_workloads={"own": fn}))
        errors = [e.splitlines()[0] for r in rounds["A"] + rounds["B"] for e in r["errors"].values()]
        if errors:
            return f"the pipeline recorded an error: {errors[0]}"
        report = pipeline.compare_runs(*(pipeline.merge_runs(rounds[s]) for s in ("A", "B")))
        findings = [f"{n['output']}: {n['status']}" for n in report["numerics"] if n["status"] != "identical"]
        findings += [f"{w['category']}: {w['message']}" for w in report["warnings"] if w["finding"]]
        return "; ".join(findings) or "A/A: every output identical, no new warning"
    raise ValueError(f"unknown property {what!r} (record, {', '.join(ROUND_TRIP)}, averaged, samples, better, "
                     f"references, aa)")


def inject_drift(path_b: str | Path, out: str | Path, seed: int = 0) -> Path:
    """Run C: run B with two of its reference outputs changed as a new kernel might change them, one by
    far less than its tolerance and one beyond it (which ones depends on seed). The timings are B's."""
    run = pipeline.load_run(path_b)
    tensors = dict(pipeline.reference_tensors(run))
    keys = sorted(k for k, t in tensors.items() if t.dtype == torch.float32 and t.numel() >= 64
                  and not k.endswith(reference.NORMS_SUFFIX))
    rng = np.random.default_rng(seed)
    drifted, harmless = (keys[i] for i in rng.choice(len(keys), 2, replace=False))
    for key, size in ((drifted, 5e-4), (harmless, 1e-7)):
        old = tensors[key]
        t = old.clone()
        where = torch.from_numpy(rng.choice(t.numel(), max(1, t.numel() // 50), replace=False))
        t[where] += size * t.abs().max() * torch.from_numpy(rng.choice([-1.0, 1.0], len(where)).astype(np.float32))
        tensors[key] = t
        w, name = key.split("/", 1)
        rec = run["workloads"][w]["references"][name]
        rec["sha256"] = reference.sha256(t)
        if key + reference.NORMS_SUFFIX in tensors:     # the changed elements' blocks change their norms too
            numel = int(np.prod(rec["shape"]))
            blocks = where * reference.stride(numel) // reference.block_size(numel)
            squares = tensors[key + reference.NORMS_SUFFIX].square()
            squares.index_add_(0, blocks, t[where].double().square() - old[where].double().square())
            tensors[key + reference.NORMS_SUFFIX] = squares.clamp_min(0).sqrt()
    c = copy.deepcopy({k: v for k, v in run.items() if k != "_source"})
    for w, r in c["workloads"].items():
        r["_tensors"] = {k.split("/", 1)[1]: t for k, t in tensors.items() if k.startswith(w + "/")}
    c["label"] = "run C (B after a change you have to find)"
    return pipeline.save_run(c, out)
