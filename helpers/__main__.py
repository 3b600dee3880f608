"""Command line: python -m helpers {doctor, run, bench, notebooks, labs}."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path


def cmd_doctor(args) -> int:
    from helpers.doctor import report_text
    print(report_text())
    return 0


def cmd_run(args) -> int:
    from helpers.runner import run_collection
    parameters = {"QUICK": args.quick}
    for item in args.parameter or []:
        name, value = item
        parameters[name] = json.loads(value) if value[:1] in "[{0123456789-tfn\"" else value
    out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    summary = run_collection(args.notebooks or None, out_dir=out, parameters=parameters,
                             workers=args.workers, cell_timeout=args.cell_timeout)
    for rec in summary["notebooks"]:
        ran = sum(s["ran"] for s in rec["sections"])
        print(f"{rec['status']:>7}  {rec['seconds']:>6.1f} s  {rec['path']}  "
              f"(sections run {ran}, skipped {len(rec['sections']) - ran})")
        if rec["error"]:
            print(f"         error in cell {rec['error'].get('cell', '?')}: {rec['error']['ename']}: "
                  f"{rec['error']['evalue'][:300]}")
        for problem in rec["problems"]:
            print(f"         {problem}")
    print(f"{summary['passed']} passed, {summary['failed']} failed in {summary['total_seconds']:.1f} s; "
          f"record: {out / 'record.json'}")
    return 0 if summary["failed"] == 0 else 1


def cmd_bench(args) -> int:
    """python -m helpers bench NAME: runs helpers.NAME.benchmark(quick=...) and writes its JSON."""
    from helpers.bench import save_json
    module = importlib.import_module(f"helpers.{args.name}")
    if not hasattr(module, "benchmark"):
        raise SystemExit(f"helpers.{args.name} has no benchmark(quick=...) function")
    result = module.benchmark(quick=args.quick)
    path = save_json(result, args.out or f"runs/bench-{args.name}.json")
    print(json.dumps(result, indent=2)[:4000])
    print(f"written: {path}")
    return 0


def cmd_notebooks(args) -> int:
    from helpers import notebooks
    failed = 0
    for path in map(Path, args.paths):
        problems = notebooks.fix(path)
        print(f"{path}: {'ok' if not problems else '; '.join(problems)}")
        failed += bool(problems)
    return 1 if failed else 0


def cmd_labs(args) -> int:
    from helpers import notebooks
    for path in notebooks.build_labs([Path(p) for p in args.paths] or None):
        print(f"wrote {path}")
    return 0


def cmd_validate(args) -> int:
    """python -m helpers validate run|compare: the migration / performance validation pipeline."""
    from helpers import validation
    if args.action == "run":
        run = validation.run_pipeline(quick=args.quick, device=args.device, threads=args.threads,
                                      compile=args.compile, workloads=args.workloads, checks=args.checks,
                                      label=args.label or "")
        path = validation.save_run(run, args.out or f"runs/validation-{time.strftime('%Y%m%d-%H%M%S')}.json")
        for name, result in run["checks"].items():
            print(f"check {name}: {'passed' if result['passed'] else 'FAILED'}")
        for name, error in run["errors"].items():
            print(f"error in {name}: {error.splitlines()[0]}")
        print(f"{len(run['workloads'])} workloads, {len(run['checks'])} checks, {len(run['errors'])} errors; "
              f"written: {path}")
        return 1 if run["errors"] or not all(c["passed"] for c in run["checks"].values()) else 0
    if len(args.paths) != 2:
        raise SystemExit("validate compare takes exactly two run files: A.json B.json")
    try:
        report = validation.compare_runs(*(validation.load_run(p) for p in args.paths))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(validation.table(report))
    print(f"written: {validation.write_report(report, args.out or 'runs/validation-report.html')}")
    return 1 if report["regressions"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="this machine's capabilities and what each lesson can run here")
    run = sub.add_parser("run", help="execute notebooks headless with papermill and write a record")
    run.add_argument("notebooks", nargs="*", help="paths as in helpers/manifest.json (default: all)")
    run.add_argument("--quick", action=argparse.BooleanOptionalAction, default=True,
                     help="quick mode: small sizes (default on)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    run.add_argument("--out", help="run folder (default runs/DATE-TIME)")
    run.add_argument("--workers", type=int, default=1)
    run.add_argument("--cell-timeout", type=int, default=300, help="seconds per cell")
    bench = sub.add_parser("bench", help="run a module's benchmark and write JSON")
    bench.add_argument("name", help="a helpers module with benchmark(quick=...), e.g. bench, data, moe, quant")
    bench.add_argument("--quick", action="store_true")
    bench.add_argument("--out")
    nbs = sub.add_parser("notebooks", help="execute in quick mode and rewrite under the outputs policy")
    nbs.add_argument("action", choices=["fix"])
    nbs.add_argument("paths", nargs="+")
    labs = sub.add_parser("labs", help="write the student copies of the lab solutions")
    labs.add_argument("action", choices=["build"])
    labs.add_argument("paths", nargs="*")
    val = sub.add_parser("validate", help="migration / performance validation: run the pipeline, compare two runs")
    val.add_argument("action", choices=["run", "compare"])
    val.add_argument("paths", nargs="*", help="compare: the two run files A.json B.json")
    val.add_argument("--quick", action="store_true", help="run: small sizes (seconds per workload)")
    val.add_argument("--device", default="auto")
    val.add_argument("--threads", type=int)
    val.add_argument("--compile", action="store_true", help="run: torch.compile every model (slow on CPU)")
    val.add_argument("--workloads", nargs="*", help="run: a subset (default: all)")
    val.add_argument("--checks", nargs="*", help="run: a subset of the upgrade checks (default: all)")
    val.add_argument("--label")
    val.add_argument("--out", help="run: the JSON file; compare: the HTML report")
    args = parser.parse_args(argv)
    handler = {"doctor": cmd_doctor, "run": cmd_run, "bench": cmd_bench, "notebooks": cmd_notebooks,
               "labs": cmd_labs, "validate": cmd_validate}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
