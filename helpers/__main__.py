"""Command line: python -m helpers {doctor, progress, run, report, grade, bench, notebooks, labs, validate}."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

# `python -m helpers` puts the folder it was started in first on the import path; a grader started inside a
# folder of submissions would import a student's folder named like one of its dependencies. This package is
# already imported, and nothing else is ever imported from there.
sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]


def cmd_doctor(args) -> int:
    from helpers.doctor import report_text
    print(report_text())
    return 0


def cmd_progress(args) -> int:
    """python -m helpers progress: what this machine's learner ran, skipped, passed and predicted."""
    from helpers import progress
    path = progress.progress_file()
    if args.reset:
        print(f"cleared {path}" if progress.reset(path) else f"nothing recorded yet ({path})")
        return 0
    summary = progress.this_machine()
    if args.json:
        print(json.dumps({"file": str(path), **summary}, indent=2))
        return 0
    print(f"Progress recorded on this machine ({path}):")
    print(progress.summary_text(summary))
    return 0


def _value(text: str):
    """A -p value as papermill reads it: YAML scalars and lists (True, 3, 0.5, [1, 2]) or a string."""
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def cmd_run(args) -> int:
    from helpers.runner import run_collection
    from helpers.runner.execute import read_parameters
    if args.check_outputs and not args.quick:
        print("error: --check-outputs compares with the stored outputs, which are quick mode's", file=sys.stderr)
        return 2
    parameters = {"QUICK": args.quick}
    if args.parameters_file:
        parameters.update(read_parameters(args.parameters_file))
    for name, value in args.parameter or []:
        parameters[name] = _value(value)
    out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        summary = run_collection(args.notebooks or None, out_dir=out, parameters=parameters, workers=args.workers,
                                 cell_timeout=args.cell_timeout, notebook_timeout=args.timeout,
                                 memory_limit_mb=args.memory_limit, executor=args.executor,
                                 scheduler=args.scheduler, resume=args.resume, progress=args.progress,
                                 label=args.label)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: what finished is in {out / 'record.json'}; add --resume to go on", file=sys.stderr)
        return 130
    for rec in summary["notebooks"]:
        ran = sum(s["ran"] for s in rec["sections"])
        peak = f"{rec['peak_memory_mb']:>5.0f} MB" if rec.get("peak_memory_mb") is not None else "    ? MB"
        print(f"{rec['status']:>7}  {rec['seconds']:>6.1f} s  {peak}  {rec['path']}  "
              f"(sections run {ran}, skipped {len(rec['sections']) - ran})"
              + ("  [kept from the earlier run]" if rec.get("resumed") else ""))
        if rec["fault"]:
            print(f"         {rec['fault']}: {rec['detail'][:300]}")
        if rec["error"] and rec["error"].get("cell") is not None:
            print(f"         in cell {rec['error']['cell']}: {rec['error']['ename']}: {rec['error']['evalue'][:300]}")
        for problem in rec["problems"]:
            print(f"         {problem}")
    print(f"{summary['passed']} passed, {summary['failed']} failed in {summary['total_seconds']:.1f} s "
          f"({summary['workers']} workers, {summary['executor']}); record: {out / 'record.json'}; "
          f"report: {out / 'report.html'}")
    outputs_ok = check_stored_outputs(out) if args.check_outputs else True
    return 0 if summary["failed"] == 0 and outputs_ok else 1


def check_stored_outputs(out: Path) -> bool:
    """The executed notebooks' nbval-checked cells against the committed outputs (nbval's comparison)."""
    from helpers.runner.stored_outputs import check_run
    verdicts = check_run(out)
    failed = [(nb, index, problem) for nb, cells in verdicts.items() for index, problem in cells if problem]
    for nb, index, problem in failed:
        print(f"stored outputs differ: {nb} cell {index}:\n    " + problem.replace("\n", "\n    "))
    checked = sum(len(cells) for cells in verdicts.values())
    print(f"stored outputs: {checked - len(failed)} of {checked} checked cells match; {out / 'nbval.xml'}")
    return not failed


def cmd_report(args) -> int:
    """python -m helpers report RUN_DIR...: one matrix of notebooks by environments (HTML and JSON)."""
    from helpers.runner.matrix import matrix_text, merge_runs, write_matrix
    try:
        matrix = merge_runs(args.run_dirs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(matrix_text(matrix))
    html_path, json_path = write_matrix(matrix, args.out)
    print(f"written: {html_path}, {json_path}")
    return 0 if all(r["status"] == "passed" and r["nbval"] != "failed" for r in matrix["results"]) else 1


def cmd_site(args) -> int:
    """python -m helpers site RUN_DIR...: the course website from executed runs (OUT/html)."""
    from helpers.runner.site import build_site
    try:
        result = build_site(args.run_dirs, args.out)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{result['pages']} pages from {', '.join(result['environments'])}: {result['html']}/index.html")
    return 0


def cmd_gpu_check(args) -> int:
    from helpers.runner import script_check
    return script_check.main(args.out, workers=args.workers, timeout_s=args.timeout, paths=args.notebooks or None)


def cmd_grade(args) -> int:
    from helpers.grading.grade import grade_submissions
    from helpers.grading.judge import CONTROL
    try:
        result = grade_submissions(args.lab, args.submissions, out_dir=args.out, workers=args.workers,
                                   time_limit=args.time_limit, memory_limit_mb=args.memory_limit,
                                   cpu_factor=args.cpu_factor, seed=args.seed, progress=args.progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    limits, ref = result["limits"], result["reference"]
    print(f"{result['isolation']}; the solution took {ref['cpu_seconds']:.1f} s of CPU "
          f"({ref['wall_seconds']:.1f} s wall): a submission may use {limits['budget_cpu_seconds']:.0f} s of CPU "
          f"and {limits['wall_seconds']:.0f} s of wall time")
    for row in result["students"]:   # names are made safe by find_submissions; flags carry a submission's text
        flags = CONTROL.sub(" ", "; ".join(row["flags"]))[:300]
        print(f"{row['student']:<24} {row['total']:>6.2f} / {row['max']:g}  {CONTROL.sub(' ', row['status'])}"
              + (f"  flags: {flags}" if flags else ""))
    print(f"scores: {result['csv']}; feedback: {result['feedback_dir']}")
    return 0


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
    if args.action == "verified":
        return _write_verified(args)
    if args.action in ("sync", "twin"):
        return _sync_twins(args)
    if args.action == "colab-cell":
        return _write_colab_cells(args)
    if not args.paths:
        raise SystemExit("notebooks fix needs the notebooks to execute and rewrite")
    failed = 0
    for path in map(Path, args.paths):
        problems = notebooks.fix(path)
        print(f"{path}: {'ok' if not problems else '; '.join(problems)}")
        failed += bool(problems)
    return 1 if failed else 0


def _sync_twins(args) -> int:
    """notebooks sync [PATHS]: each .ipynb from its percent-format twin (default: every manifest entry);
    notebooks twin PATHS: write the twin of a notebook that has none yet."""
    from helpers import manifest, notebooks
    paths = [Path(p).with_suffix(".ipynb") for p in args.paths] or [manifest.REPO / e["path"] for e in manifest.entries()]
    labs = []
    for path in paths:
        if args.action == "twin":
            notebooks.twin_path(path).write_text(notebooks.twin_text(notebooks.read(path)))
            print(f"wrote {notebooks.twin_path(path)}")
            continue
        changed = notebooks.sync_from_twin(path)
        print(f"{path}: {'rewritten from its twin' if changed else 'unchanged'}")
        if changed and path.parent.name == "solutions":
            labs.append(path)
    for path in notebooks.build_labs(labs) if labs else []:
        print(f"wrote {path}")
    return 0


def _write_colab_cells(args) -> int:
    """notebooks colab-cell [PATHS]: the Colab set-up cell (helpers/colab.py, with pyproject.toml's repository
    URL and the path a learner opens) as the first code cell of each notebook (default: every manifest entry),
    then the labs' student copies."""
    from helpers import colab, manifest, notebooks
    url = colab.repository_url()
    paths = [Path(p).with_suffix(".ipynb") for p in args.paths] or [manifest.REPO / e["path"] for e in manifest.entries()]
    labs = []
    for path in paths:
        nb = notebooks.read(path)
        opened = colab.learner_path(path.resolve().relative_to(manifest.REPO).as_posix())
        changed = colab.with_cell(nb, colab.cell_source(url, opened))
        if changed:
            notebooks.write(nb, path)
        print(f"{path}: {'Colab cell written' if changed else 'unchanged'}")
        if changed and path.parent.name == "solutions":
            labs.append(path)
    for path in notebooks.build_labs(labs) if labs else []:
        print(f"wrote {path}")
    return 0


def _write_verified(args) -> int:
    """notebooks verified [--matrix M.json] [PATHS]: each card's "Verified with torch" from a merged matrix
    (without one, the card's matrix part stays) and from the GPU checks kept in helpers/recorded/."""
    from helpers import manifest, notebooks
    matrix = json.loads(Path(args.matrix).read_text()) if args.matrix else None
    date = time.strftime("%Y-%m-%d", time.localtime(Path(args.matrix).stat().st_mtime)) if args.matrix else None
    gpu_records = [json.loads(p.read_text()) for p in sorted((manifest.REPO / "helpers" / "recorded").glob("gpu-check-*.json"))]
    paths = [Path(p) for p in args.paths] or [manifest.REPO / e["path"] for e in manifest.entries()]
    labs = []
    for path in paths:
        changed = notebooks.write_verified(path, matrix, date, gpu_records)
        key = str(path.resolve().relative_to(manifest.REPO))
        print(f"{path}: {(notebooks.verified_versions(matrix, key) if matrix else 'matrix part kept') or 'none'}"
              f"{notebooks.gpu_verified(gpu_records, key, notebooks.code_sha256(notebooks.read(path)))}" + ("" if changed else " (unchanged)"))
        if changed and path.parent.name == "solutions":
            labs.append(path)
    for path in notebooks.build_labs(labs) if labs else []:
        print(f"wrote {path}")
    return 0


def cmd_labs(args) -> int:
    from helpers import notebooks
    if args.action == "export-nbgrader":
        from helpers.grading.nbgrader_export import export_course
        if not args.paths:
            raise SystemExit("usage: python -m helpers labs export-nbgrader DIR [LAB_ID ...]")
        dest = export_course(Path(args.paths[0]), args.paths[1:] or None)
        print(f"wrote the nbgrader course {dest}; then, with nbgrader on PATH: "
              f"cd {dest} && nbgrader generate_assignment 00_warmup_lab")
        return 0
    for path in notebooks.build_labs([Path(p) for p in args.paths] or None):
        print(f"wrote {path}")
    return 0


def cmd_validate(args) -> int:
    """python -m helpers validate run|compare|matrix|plan: the migration / performance validation pipeline (plan:
    from a paired comparison, an A/A one best, the rounds each change needs at its measured noise)."""
    from helpers import validation
    if args.action == "run":
        run = validation.run_pipeline(quick=args.quick, device=args.device, threads=args.threads,
                                      compile=args.compile, workloads=args.workloads, checks=args.checks,
                                      samples=args.samples, label=args.label or "", progress=args.progress)
        path = validation.save_run(run, args.out or f"runs/validation-{time.strftime('%Y%m%d-%H%M%S')}.json")
        for name, result in run["checks"].items():
            print(f"check {name}: {'passed' if result['passed'] else 'FAILED'}")
        for name, error in run["errors"].items():
            print(f"error in {name}: {error.splitlines()[0]}")
        print(f"{len(run['workloads'])} workloads, {len(run['checks'])} checks, {len(run['errors'])} errors; "
              f"written: {path}")
        return 1 if run["errors"] or not all(c["passed"] for c in run["checks"].values()) else 0
    if args.action == "matrix":
        from helpers.validation import matrix
        if len(args.paths) != 2:
            raise SystemExit("validate matrix takes two torch versions: A B (e.g. 2.9.1 2.10.0)")
        try:
            record = matrix.run_matrix(args.paths, quick=args.quick, rounds=args.rounds, threads=args.threads,
                                       samples=args.samples, out=args.out, same_venv=args.same_venv,
                                       device="cpu" if args.device == "auto" else args.device)
        except (RuntimeError, ValueError) as exc:
            raise SystemExit(f"error: {exc}") from None
        print(validation.table(record["report"]))
        print(f"driver total {record['total_seconds']:.0f} s; written: {Path(record['out']) / 'report.html'}")
        return 1 if record["findings"] else 0
    if len(args.paths) != 2:
        raise SystemExit(f"validate {args.action} takes exactly two run files: A.json B.json (or rounds of each side, "
                         "comma-separated and in the order they were made: A1.json,A2.json B1.json,B2.json)")
    try:
        sides = [[validation.load_run(p) for p in side.split(",") if p] for side in args.paths]
        report = validation.compare_runs(*(runs[0] if len(runs) == 1 else validation.merge_runs(runs)
                                           for runs in sides), allow_mismatch=args.allow_mismatch)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.action == "plan":
        merged = [runs[0] if len(runs) == 1 else validation.merge_runs(runs) for runs in sides]
        print(validation.plan_text(validation.plan(report, *merged)))
        return 0
    print(validation.table(report))
    print(f"written: {validation.write_report(report, args.out or 'runs/validation-report.html')}")
    return 1 if report["regressions"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="this machine's capabilities and what each lesson can run here")
    prog = sub.add_parser("progress", help="your progress on this machine: lessons run fully or partly (which "
                                           "sections skipped, and why), lab exercises passed, predictions held")
    prog.add_argument("--json", action="store_true", help="the summary as JSON")
    prog.add_argument("--reset", action="store_true", help="delete what was recorded")
    run = sub.add_parser("run", help="execute notebooks headless with papermill and write a record")
    run.add_argument("notebooks", nargs="*", help="paths as in helpers/manifest.json (default: all)")
    run.add_argument("--quick", action=argparse.BooleanOptionalAction, default=True,
                     help="quick mode: small sizes (default on)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                     help="a notebook parameter (repeatable); values read as YAML: True, 3, 0.5, [1, 2]")
    run.add_argument("-f", "--parameters-file", help="a JSON or YAML file of parameters (-p overrides it)")
    run.add_argument("--out", help="run folder (default runs/DATE-TIME)")
    run.add_argument("--workers", type=int, default=None,
                     help="notebooks at a time (default: this machine's cores, as many as its free memory holds)")
    run.add_argument("--cell-timeout", type=float, default=300, help="seconds per cell (default 300)")
    run.add_argument("--timeout", type=float, default=900, help="seconds per notebook (default 900)")
    run.add_argument("--memory-limit", type=float, default=None, metavar="MB",
                     help="stop a notebook whose kernel uses more memory than this")
    run.add_argument("--executor", choices=["local", "dask"], default="local",
                     help="local processes (default) or a Dask cluster (with --scheduler)")
    run.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    run.add_argument("--resume", action="store_true", help="keep the notebooks that passed in --out's record")
    run.add_argument("--label", default="", help="name of this environment or machine in merged reports "
                                                 "(python -m helpers report), e.g. cuda or room-pc2")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar")
    run.add_argument("--check-outputs", action="store_true",
                     help="then compare the cells tagged nbval-check-output with their committed outputs, as "
                          "pytest --nbval-lax would, without executing again (writes nbval.xml; quick mode)")
    report = sub.add_parser("report", help="merge run folders from several environments or machines into one "
                                           "matrix: HTML and JSON")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="folders written by `run --out`")
    report.add_argument("--out", default="runs/matrix", help="output folder (default runs/matrix)")
    site = sub.add_parser("site", help="build the course website from run folders (or gpu-check bundles): every "
                                       "page with its outputs and where each section ran")
    site.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="folders written by `run --out`")
    site.add_argument("--out", default="runs/site", help="output folder (default runs/site; the pages in OUT/html)")
    gpu = sub.add_parser("gpu-check", help="--no-jupyter: every notebook's jupytext twin as a script in quick mode "
                                           "(torch, numpy, tqdm and this package only), the bundle `make site` "
                                           "merges; on a GPU, fail on a failed notebook or a silent skip. The "
                                           "Jupyter path is `make gpu-check`")
    gpu.add_argument("--no-jupyter", action="store_true", required=True,
                     help="run the twins as scripts (required: the Jupyter path is `make gpu-check`)")
    gpu.add_argument("notebooks", nargs="*", help="manifest paths (default: all)")
    gpu.add_argument("--out", default="runs/gpu-check", help="output folder (default runs/gpu-check)")
    gpu.add_argument("--workers", type=int, help="twins at a time (default: half the cores, at most 8)")
    gpu.add_argument("--timeout", type=float, default=240, help="seconds per twin (default 240)")
    grade = sub.add_parser("grade", help="grade a folder of lab submissions; writes scores.csv and feedback")
    grade.add_argument("lab", help="lab id or path, e.g. 00_warmup_lab (see helpers/grading/specs/)")
    grade.add_argument("submissions", help="folder of submissions: NAME.ipynb, or NAME/<any>.ipynb; for "
                                           "10_capstone_lab, NAME/ holding the project folder")
    grade.add_argument("--out", help="output folder (default: SUBMISSIONS/graded)")
    grade.add_argument("--workers", type=int, default=None, help="submissions at a time")
    grade.add_argument("--cpu-factor", type=float, default=10,
                       help="a call, a cell and a submission may use this many times the CPU time the lab's "
                            "solution takes in the same run (default 10; floors of 2 s, 10 s and +60 s)")
    grade.add_argument("--time-limit", type=float, default=None,
                       help="wall seconds per submission, for code that waits without computing (default: 10x the "
                            "solution's, at least 120)")
    grade.add_argument("--memory-limit", type=float, default=2048, metavar="MB",
                       help="memory per submission (default 2048)")
    grade.add_argument("--seed", type=int, default=None,
                       help="seed of the grader's inputs (default: a fresh secret one per run)")
    grade.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar")
    bench = sub.add_parser("bench", help="run a module's benchmark and write JSON")
    bench.add_argument("name", help="a helpers module with benchmark(quick=...), e.g. bench, data, moe, quant")
    bench.add_argument("--quick", action="store_true")
    bench.add_argument("--out")
    nbs = sub.add_parser("notebooks", help="fix: execute in quick mode and rewrite under the outputs policy; "
                                           "verified: write each card's 'Verified with torch' from a matrix; "
                                           "sync: write each .ipynb from its percent-format twin (.py); "
                                           "twin: write a notebook's twin; colab-cell: write the Colab set-up "
                                           "cell (from pyproject.toml's repository URL) into every notebook")
    nbs.add_argument("action", choices=["fix", "verified", "sync", "twin", "colab-cell"])
    nbs.add_argument("paths", nargs="*", help="fix: the notebooks; verified: default every manifest entry")
    nbs.add_argument("--matrix", help="verified: the matrix.json written by python -m helpers report")
    labs = sub.add_parser("labs", help="build: write the student copies of the lab solutions; export-nbgrader DIR "
                                       "[LAB_ID ...]: write them as an nbgrader course source")
    labs.add_argument("action", choices=["build", "export-nbgrader"])
    labs.add_argument("paths", nargs="*", help="build: solution notebooks (default all); export-nbgrader: DIR, "
                                               "then lab ids (default all)")
    val = sub.add_parser("validate", help="migration / performance validation: run the pipeline, compare two runs, "
                                          "or both under two torch versions")
    val.add_argument("action", choices=["run", "compare", "matrix", "plan"])
    val.add_argument("paths", nargs="*", help="compare: the two run files A.json B.json (rounds of a side made "
                                              "alternately with the other's: A1.json,A2.json B1.json,B2.json, "
                                              "paired in that order); matrix: two torch versions A B (e.g. 2.9.1 "
                                              "2.10.0)")
    val.add_argument("--quick", action="store_true", help="run, matrix: small sizes (seconds per workload)")
    val.add_argument("--device", default="auto")
    val.add_argument("--threads", type=int)
    val.add_argument("--samples", type=int, help="run, matrix: timed calls per candidate (default: by size)")
    val.add_argument("--rounds", type=int, default=4, help="matrix: interleaved runs per version (default 4)")
    val.add_argument("--compile", action="store_true", help="run: torch.compile every model (slow on CPU)")
    val.add_argument("--workloads", nargs="*", help="run: a subset (default: all)")
    val.add_argument("--checks", nargs="*", help="run: a subset of the upgrade checks (default: all; none: "
                                                 "--checks with no name)")
    val.add_argument("--same-venv", action="store_true",
                     help="matrix with one version twice (A/A calibration): run both sides in one venv")
    val.add_argument("--allow-mismatch", action="store_true",
                     help="compare: compare runs made at different settings, every difference flagged")
    val.add_argument("--no-progress", dest="progress", action="store_false")
    val.add_argument("--label")
    val.add_argument("--out", help="run: the JSON file; compare: the HTML report; matrix: the folder")
    args = parser.parse_args(argv)
    handler = {"doctor": cmd_doctor, "run": cmd_run, "report": cmd_report, "site": cmd_site, "grade": cmd_grade, "bench": cmd_bench,
               "notebooks": cmd_notebooks, "labs": cmd_labs, "validate": cmd_validate,
               "progress": cmd_progress, "gpu-check": cmd_gpu_check}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
