"""Checks for lab 09: they compare the learner's code with the pipeline's own statistic and read the run
files and reports, so every expected value comes from what was measured."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch

from helpers.checks import check_close, check_equal, fail, passed
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


def _cases():
    rng = np.random.default_rng(7)
    base = rng.lognormal(np.log(0.02), 0.08, 30)
    return [(base, rng.lognormal(np.log(0.02), 0.08, 30), "lower"),
            (base, rng.lognormal(np.log(0.025), 0.08, 24), "lower"),
            (1 / base, 1 / rng.lognormal(np.log(0.018), 0.3, 40), "higher"),
            (np.array([1.0, 1.1, 0.9]), np.array([2.0, 2.2, 1.8, 2.1]), "lower")]


def check_interval(fn, *, what: str, real: list[tuple] | None = None) -> None:
    """fn(samples_a, samples_b, better) -> (gain, low, high) agrees with stats.bootstrap_gain: the gain
    exactly, the 95% interval within a quarter of its width (resampling differs from draw to draw)."""
    for a, b, better in _cases() + list(real or []):
        ref = stats.bootstrap_gain(a, b, better, n_boot=4000)
        try:
            gain, low, high = (float(v) for v in fn(list(a), list(b), better))
        except Exception as exc:
            fail(what, f"raised {type(exc).__name__}: {exc}", "return (gain, low, high) as three numbers")
        hint = ("gain = median(A) / median(B) for a time ('lower'), median(B) / median(A) for a throughput; "
                "resample each side with replacement, take the 2.5th and 97.5th percentiles of the gains")
        check_close(torch.tensor(gain), torch.tensor(ref["gain"]), what=f"{what}: the gain", rtol=1e-9, hint=hint)
        slack = 0.25 * (ref["high"] - ref["low"]) + 1e-3
        if abs(low - ref["low"]) > slack or abs(high - ref["high"]) > slack:
            fail(what, f"interval [{low:.4f}, {high:.4f}], expected about [{ref['low']:.4f}, {ref['high']:.4f}] "
                       f"(n={len(a)} vs {len(b)}, better={better})", hint)
    passed(what)


def check_verdict(fn, *, what: str, report: dict | None = None) -> None:
    """fn(gain, low, high) -> "regression" / "improvement" / "within noise" as stats.verdict decides
    (without rounds), on edge cases and on every row of a real report."""
    cases = [(0.9, 0.85, 0.95), (0.9, 0.85, 1.01), (1.1, 1.02, 1.2), (0.99, 0.985, 0.995), (1.01, 1.005, 1.015),
             (1.5, 0.9, 2.0), (0.5, 0.3, 0.99), (1.03, 1.001, 1.06)]
    if report:
        cases += [(r["gain"], r["low"], r["high"]) for r in report["rows"] if "gain" in r]
    for gain, low, high in cases:
        expected = stats.verdict({"gain": gain, "low": low, "high": high})
        got = fn(gain, low, high)
        if got != expected:
            fail(what, f"gain {gain:.3f}, interval [{low:.3f}, {high:.3f}]: got {got!r}, expected {expected!r}",
                 f"a regression needs the whole interval below 1 and the gain below 1 / (1 + {stats.MIN_CHANGE}); "
                 f"an improvement the whole interval above 1 and the gain above 1 + {stats.MIN_CHANGE}")
    passed(what)


def check_migration_answers(answers, run_a: dict, run_b: dict, report: dict, *, what: str) -> None:
    """Answers read from the two runs and the report."""
    if not isinstance(answers, dict):
        fail(what, f"answers must be a dict, got {type(answers).__name__}")
    expected = {
        "moe_path": (run_a["workloads"]["dlrm_moe_train"]["paths"]["moe"],
                     run_b["workloads"]["dlrm_moe_train"]["paths"]["moe"]),
        "scaled_mm_path": (run_a["checks"]["amp_scaled_mm"]["paths"]["scaled_mm"],
                           run_b["checks"]["amp_scaled_mm"]["paths"]["scaled_mm"]),
        "static_int8_accuracy": (run_a["checks"]["quantization"]["details"]["static_int8_accuracy"],
                                 run_b["checks"]["quantization"]["details"]["static_int8_accuracy"]),
    }
    for key, value in expected.items():
        got = answers.get(key)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(what, f"{key!r} must be a pair (A, B), got {got!r}", "read it from run_a and run_b")
        check_equal(tuple(got), value, what=f"{what}: {key}")
    rows = {(r["workload"], r["figure"]): r for r in report["rows"] if "gain" in r}
    step = rows[("dlrm_moe_train", "step_time")]
    got = answers.get("dlrm_step")
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        fail(what, f"'dlrm_step' must be (gain, low, high, status), got {got!r}",
             "the report row of dlrm_moe_train / step_time")
    check_close(torch.tensor([float(v) for v in got[:3]]), torch.tensor([step["gain"], step["low"], step["high"]]),
                what=f"{what}: dlrm step gain", rtol=1e-9)
    check_equal(got[3], step["status"], what=f"{what}: dlrm step status")
    flagged = sorted((r["workload"], r["figure"]) for r in report["rows"] if r.get("status") == "regression")
    check_equal(sorted(tuple(f) for f in answers.get("regressions", [])), flagged, what=f"{what}: regressions",
                hint="rows of report['rows'] whose status is 'regression', as (workload, figure)")
    passed(what)


def inject_drift(path_b: str | Path, out: str | Path, seed: int = 0) -> Path:
    """Run C: run B with two of its reference outputs changed as a new kernel might change them, one by
    far less than its tolerance and one beyond it (which ones depends on seed). The timings are B's."""
    run = pipeline.load_run(path_b)
    tensors = dict(pipeline.reference_tensors(run))
    keys = sorted(k for k, t in tensors.items() if t.dtype == torch.float32 and t.numel() >= 64)
    rng = np.random.default_rng(seed)
    drifted, harmless = (keys[i] for i in rng.choice(len(keys), 2, replace=False))
    for key, size in ((drifted, 5e-4), (harmless, 1e-7)):
        t = tensors[key].clone()
        where = torch.from_numpy(rng.choice(t.numel(), max(1, t.numel() // 50), replace=False))
        t[where] += size * t.abs().max() * torch.from_numpy(rng.choice([-1.0, 1.0], len(where)).astype(np.float32))
        tensors[key] = t
        w, name = key.split("/", 1)
        run["workloads"][w]["references"][name]["sha256"] = reference.sha256(t)
    c = copy.deepcopy({k: v for k, v in run.items() if k != "_source"})
    for w, r in c["workloads"].items():
        r["_tensors"] = {k.split("/", 1)[1]: t for k, t in tensors.items() if k.startswith(w + "/")}
    c["label"] = "run C (B after a change you have to find)"
    return pipeline.save_run(c, out)


def check_drift_answer(answer, report: dict, *, what: str) -> None:
    """The output that drifted beyond its tolerance, and by how much."""
    drifts = [n for n in report["numerics"] if n["status"] == "drift"]
    if not drifts:
        fail(what, "this report has no drift at all: compare run B with run C",
             "report_c = compare_runs(load_run(PATH_B), load_run(PATH_C))")
    if not isinstance(answer, dict):
        fail(what, f"expected a dict, got {type(answer).__name__}")
    truth = drifts[0]
    got = (answer.get("workload"), answer.get("output"))
    if got != (truth["workload"], truth["output"]):
        within = [(n["workload"], n["output"]) for n in report["numerics"] if n["status"] == "within tolerance"]
        fail(what, f"{got} is not the output that drifted beyond its tolerance",
             f"a changed hash alone is not a drift: {within} changed too, but within tolerance")
    check_close(torch.tensor(float(answer.get("max_rel_diff", float("nan")))), torch.tensor(truth["max_rel_diff"]),
                what=f"{what}: max relative difference", rtol=1e-6)
    passed(what)
