"""Checks for lab 09: they read the run files and the report, so every expected value comes from what
was measured on the learner's machine."""
from __future__ import annotations

from pathlib import Path

import torch

from helpers.checks import check_close, check_equal, fail, passed
from helpers.validation.pipeline import compare_runs, load_run
from helpers.validation.workloads import WORKLOADS


def check_run_file(path, *, threads: int, checks: list[str], what: str) -> dict:
    """The file is a complete run: every workload, the requested checks passing, the thread count."""
    if not isinstance(path, (str, Path)) or not Path(path).exists():
        fail(what, f"{path!r} is not an existing file", "return the paths save_run() wrote")
    try:
        run = load_run(path)
    except ValueError as exc:
        fail(what, str(exc), "write the run with save_run(run, path)")
    if run["errors"]:
        name, error = next(iter(run["errors"].items()))
        fail(what, f"{name} failed: {error.splitlines()[0]}", "read the error; the rest of the run was kept")
    missing = [w for w in WORKLOADS if w not in run["workloads"]]
    if missing:
        fail(what, f"workloads missing: {missing}", "call run_pipeline without a workloads= filter")
    if sorted(run["checks"]) != sorted(checks):
        fail(what, f"checks run: {sorted(run['checks'])}, expected {sorted(checks)}", "pass checks=CHECKS")
    failing = [c for c, r in run["checks"].items() if not r["passed"]]
    if failing:
        fail(what, f"upgrade check(s) failed: {failing}", "print run['checks'][name]['details'] to see why")
    if run["threads"] != threads:
        fail(what, f"ran with {run['threads']} threads, expected {threads}", "pass threads=... to run_pipeline")
    passed(what)
    return run


def check_report(report, path_a, path_b, *, what: str) -> None:
    """The report is compare_runs of the two files, in that order (A first)."""
    if not isinstance(report, dict) or "rows" not in report:
        fail(what, f"expected the dict compare_runs returns, got {type(report).__name__}",
             "report = compare_runs(load_run(PATH_A), load_run(PATH_B))")
    expected = compare_runs(load_run(path_a), load_run(path_b))
    if report["a"] != expected["a"]:
        fail(what, "run A of the report is not the file PATH_A", "pass the runs in order: A first, then B")
    check_equal([(r["workload"], r["figure"], r.get("gain")) for r in report["rows"]],
                [(r["workload"], r["figure"], r.get("gain")) for r in expected["rows"]], what=what)


def jagged_gains(run: dict) -> dict[int, float]:
    figs = run["workloads"]["bert_infer"]["figures"]
    lengths = sorted(int(k.rsplit("_L", 1)[1]) for k in figs if k.startswith("padded_latency_L"))
    return {n: figs[f"padded_latency_L{n}"]["value"] / figs[f"jagged_latency_L{n}"]["value"] for n in lengths}


def check_answers(answers, path_a, report, *, what: str) -> None:
    """Answers read from run A and the report."""
    if not isinstance(answers, dict):
        fail(what, f"answers must be a dict, got {type(answers).__name__}")
    run = load_run(path_a)
    gains = jagged_gains(run)
    got = answers.get("jagged_gain_by_length")
    if not isinstance(got, dict) or sorted(got) != sorted(gains):
        fail(what, f"jagged_gain_by_length must map each max length {sorted(gains)} to a ratio, got {got!r}",
             "the keys are the L in figure names padded_latency_L<L>")
    check_close(torch.tensor([float(got[n]) for n in sorted(gains)]), torch.tensor([gains[n] for n in sorted(gains)]),
                what=f"{what}: jagged gain per length", rtol=1e-6,
                hint="padded latency / jagged latency: above 1 means the jagged batch is faster")
    figs = run["workloads"]["dlrm_moe_train"]["figures"]
    ratio = figs["loop_step_time"]["value"] / figs["grouped_step_time"]["value"]
    check_close(torch.tensor(float(answers.get("grouped_vs_loop", float("nan")))), torch.tensor(ratio),
                what=f"{what}: grouped_mm vs loop", rtol=1e-6,
                hint="loop step time / grouped step time in run A")
    flagged = sorted((r["workload"], r["figure"]) for r in report["rows"] if r.get("status") == "regression")
    check_equal(sorted(tuple(f) for f in answers.get("regressions", [])), flagged, what=f"{what}: regressions",
                hint="rows of report['rows'] whose status is 'regression', as (workload, figure)")


def check_verdict(verdict, *, what: str) -> None:
    """The learner's verdict(fig_a, fig_b) agrees with compare_runs on cases around the noise threshold."""
    def fig(value, spread, better="lower"):
        return {"value": value, "min": value * (1 - spread), "max": value * (1 + spread), "better": better, "unit": "s"}
    cases = [(fig(1.0, 0.10), fig(1.15, 0.10)), (fig(1.0, 0.05), fig(1.15, 0.05)), (fig(1.0, 0.0), fig(1.01, 0.0)),
             (fig(1.0, 0.0), fig(0.5, 0.0)), (fig(100, 0.05, "higher"), fig(80, 0.05, "higher")),
             (fig(100, 0.05, "higher"), fig(130, 0.05, "higher"))]
    for a, b in cases:
        runs = [{"label": x, "workloads": {"w": {"figures": {"t": f}}}, "checks": {}, "errors": {}}
                for x, f in (("a", a), ("b", b))]
        expected = compare_runs(*runs)["rows"][0]["status"]
        got = verdict(a, b)
        if got != expected:
            fail(what, f"A={a['value']} (range {a['min']:.3g}-{a['max']:.3g}), B={b['value']} "
                       f"(range {b['min']:.3g}-{b['max']:.3g}), better={a['better']}: "
                       f"got {got!r}, expected {expected!r}",
                 "gain = A/B for 'lower', B/A for 'higher'; threshold = max(noise A + noise B, 0.02), "
                 "noise = (max - min) / (2 * value)")
    passed(what)

