"""Run the workloads and upgrade checks into one JSON file (plus its reference outputs); compare two runs.

    run = run_pipeline(quick=True, label="torch 2.9.1")     # a dict, JSON-ready once saved
    save_run(run, "a.json")                                  # a.json and a.refs.pt (the reference outputs)
    report = compare_runs(load_run("a.json"), load_run("b.json"))
    write_report(report, "report.html")

What a comparison can be trusted for:
- **Settings.** Two runs are compared only when quick mode, every workload's sizes, samples, compile,
  thread count and device type are the same: otherwise `compare_runs` raises NotComparable saying what
  differs (`allow_mismatch=True` compares anyway and flags every difference in the report). A different
  CPU or GPU model is flagged, not refused.
- **Numerics.** Each workload's outputs (from weights and inputs that are the same on every torch) are
  stored as hashes and tensors; B is checked against A: identical, within tolerance, or drift.
- **Noise.** Every figure keeps its per-call samples and their rounds; the gain of B over A comes with a
  95% paired interval over the rounds and the change it could have detected (`stats.py`), and only an
  interval that excludes 1 (and a change over 2%) is a finding. One round per side: "cannot tell".
- **Warnings.** Each workload's and check's warnings are recorded; a DeprecationWarning or FutureWarning
  that B raises and A did not is a finding (an API on its way out).
- **Checks.** Pass/fail and every number each check measured, side by side.

A workload or check that fails is recorded in the run's "errors" with its message, and the rest of the
run goes on. A file that is not a run raises a ValueError naming the file and what is wrong.
"""
from __future__ import annotations

import copy
import html
import json
import math
import os
import platform
import re
import subprocess
import time
import traceback
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from helpers.bench import save_json
from helpers.device import capabilities, pick_device
from helpers.files import write_text_atomic
from helpers.validation import reference, stats
from helpers.validation.upgrade import CHECKS
from helpers.validation.workloads import WORKLOADS, sizes, timing_clock

SCHEMA = "pytorch-210-labs/validation-run/2"
MIN_CHANGE = stats.MIN_CHANGE
REPO = Path(__file__).resolve().parents[2]


class NotComparable(ValueError):
    """Two runs made at different settings: their figures would not measure the same thing."""


def run_pipeline(quick: bool = True, *, device: str = "auto", threads: int | None = None, compile: bool = False,
                 workloads: list[str] | None = None, checks: list[str] | None = None, samples: int | None = None,
                 label: str = "", progress: bool = True, repeats: int | None = None,
                 min_run_time: float | None = None, extra_workloads: dict | None = None) -> dict:
    """Run the selected workloads (default: all four) and upgrade checks (default: all four).
    samples: timed calls per candidate (default: each workload's quick or full setting). `repeats` is the
    old name of `samples`; `min_run_time` is ignored (every call is timed on its own).
    extra_workloads: {name: fn} run after the selected ones, each called like the built-in workloads,
    fn(quick, device, compile=..., samples=...), and returning the same record (`workloads.py`)."""
    samples = samples or repeats
    extra_workloads = dict(extra_workloads or {})
    clash = sorted(set(extra_workloads) & set(WORKLOADS))
    if clash:
        raise ValueError(f"extra workload {clash[0]!r} has the name of a built-in one; give it another name")
    known = WORKLOADS | extra_workloads
    workloads = list(WORKLOADS) if workloads is None else list(workloads)
    workloads += [w for w in extra_workloads if w not in workloads]
    checks = list(CHECKS) if checks is None else list(checks)
    unknown = [w for w in workloads if w not in known] + [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown workload or check {unknown[0]!r}; workloads: {', '.join(WORKLOADS)}; "
                         f"checks: {', '.join(CHECKS)}")
    dev = pick_device(device)
    threads = threads or torch.get_num_threads()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)         # the whole run at one thread count: no recompiles, one setting
    settings = {"quick": quick, "compile": compile, "device": dev.type, "threads": threads, "samples": samples,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "").upper() or None, "clock": timing_clock(dev),
                "sizes": {w: sizes(w, quick) if w in WORKLOADS else {} for w in workloads}}
    run = {"schema": SCHEMA, "label": label or f"torch {torch.__version__}",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__, "device": str(dev),
           "quick": quick, "compile": compile, "threads": threads, "settings": settings,
           "environment": environment(), "workloads": {}, "checks": {}, "errors": {}, "warnings": {}, "seconds": {}}
    steps = [("workload", w) for w in workloads] + [("check", c) for c in checks]
    try:
        for kind, name in tqdm(steps, desc="validation", disable=not progress, leave=False):
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    if kind == "workload":
                        run["workloads"][name] = known[name](quick, dev, compile=compile, samples=samples)
                    else:
                        run["checks"][name] = CHECKS[name](quick, dev)
                except Exception as exc:       # recorded, and the rest of the run goes on
                    run["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
            run["warnings"][name] = warning_records(caught)
            run["seconds"][name] = time.perf_counter() - start
    finally:
        torch.set_num_threads(old_threads)
    return run


WARNING_KINDS = ("DeprecationWarning", "FutureWarning", "UserWarning")
FINDING_WARNINGS = ("DeprecationWarning", "FutureWarning")     # an API on its way out: act before it goes


def warning_records(caught) -> list[dict]:
    """Each distinct warning of a step once: {"category", "message" (first line, addresses masked), "where"
    (the file that warned, from the repository root or site-packages), "count"}."""
    out: dict[tuple, dict] = {}
    for w in caught:
        message = re.sub(r"0x[0-9a-fA-F]+", "0x...", str(w.message).strip().splitlines()[0] if str(w.message).strip()
                         else "")[:300]
        where = _where(str(w.filename))
        key = (w.category.__name__, message)
        out.setdefault(key, {"category": key[0], "message": message, "where": where, "count": 0})["count"] += 1
    return list(out.values())


def _version(text: str) -> tuple[int, int] | None:
    found = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2])) if found else None


def removal_due(message: str, torch_version: str) -> str | None:
    """The version a warning says its API is removed in, when this torch has reached it ("will be removed
    in 2.10" read under 2.10.0), else None."""
    found = re.search(r"removed (?:in|by|from) (?:torch |PyTorch |version )?v?(\d+\.\d+)", message, re.IGNORECASE)
    here = _version(torch_version)
    return found[1] if found and here and _version(found[1]) <= here else None


def _where(filename: str) -> str:
    """A warning's file without this machine's folders: from this repository's root or from site-packages."""
    path = Path(filename)
    if path.is_relative_to(REPO):
        return path.relative_to(REPO).as_posix()
    return re.sub(r"^.*?site-packages/", "", path.as_posix())


def warning_differences(a: dict, b: dict) -> list[dict]:
    """Warnings (kinds in WARNING_KINDS) per workload or check: raised by B and not by A ("new in B"), the
    reverse ("gone in B"), and those B still raises for an API it says is removed by B's own version
    ("removal announced for <= B's version: still raised"; a note when A raised it too). Findings are
    differences: a new DeprecationWarning or FutureWarning, and a due removal that only B raises."""
    rows = []
    steps = dict.fromkeys(list(a.get("warnings", {})) + list(b.get("warnings", {})))
    for step in steps:
        wa = {(w["category"], w["message"]): w for w in a.get("warnings", {}).get(step, [])}
        wb = {(w["category"], w["message"]): w for w in b.get("warnings", {}).get(step, [])}
        for key in dict.fromkeys(list(wa) + list(wb)):
            due = removal_due(key[1], b.get("torch", "")) if key in wb else None
            if key[0] not in WARNING_KINDS or ((key in wa) == (key in wb) and not due):
                continue
            both = key in wa and key in wb
            status = (f"removal announced for {due}, overdue on both sides (a note: nothing changed)" if due and both
                      else f"removal announced for {due} and B is {b.get('torch', '').split('+')[0]}: still raised"
                      if due else "new in B" if key in wb else "gone in B")
            rows.append({"step": step, "category": key[0], "message": key[1], "where": (wb if key in wb else wa)[key]["where"],
                         "status": status, "finding": not both and (bool(due) or (key not in wa and key[0] in FINDING_WARNINGS))})
    return rows


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "helpers"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + (" (helpers/ modified)" if dirty else "") if out.returncode == 0 else None
    except Exception:
        return None


def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except Exception:
        return None


ENV_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
            "TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST", "TORCHINDUCTOR_CACHE_DIR")


def environment() -> dict:
    """Everything a regression may have to be attributed to: torch build (CUDA/HIP, cuDNN, NCCL), driver,
    CPU, Python, packages, relevant environment variables, torch's build configuration, the pipeline's
    own git commit."""
    c = capabilities()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except Exception:
        nccl = None
    return {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
            "torch_git": getattr(torch.version, "git_version", None), "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None), "cudnn": cudnn, "nccl": nccl, "gpu_driver": _gpu_driver(),
            "accelerator": c.accelerator, "device_name": c.device_name, "arch": c.arch, "cpu": c.cpu_name,
            "cpu_count": c.cpu_count, "bf16": c.bf16, "packages": c.packages,
            "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ}
            | {k: v for k, v in os.environ.items() if k.startswith("TORCH_")},
            "torch_config": torch.__config__.show(), "torch_parallel": torch.__config__.parallel_info(),
            "pipeline_commit": _git_commit()}


def refs_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.stem + ".refs.pt")


def save_run(run: dict, path: str | Path) -> Path:
    """The run as JSON, and its reference tensors beside it (`<name>.refs.pt`)."""
    path = Path(path)
    tensors = reference_tensors(run)
    out = {k: v for k, v in run.items() if k != "_source"}
    out["workloads"] = {w: {k: v for k, v in r.items() if k != "_tensors"} for w, r in run["workloads"].items()}
    if tensors:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = refs_path(path).with_suffix(".tmp")
        torch.save(tensors, tmp)
        os.replace(tmp, refs_path(path))
        out["reference_file"] = refs_path(path).name
    return save_json(out, path)


def reference_tensors(run: dict) -> dict[str, torch.Tensor]:
    """{"workload/output": tensor}: from memory (a run just made) or from the run's .refs.pt file."""
    out = {}
    for w, r in run["workloads"].items():
        for name, t in (r.get("_tensors") or {}).items():
            out[f"{w}/{name}"] = t
    if out:
        return out
    source = run.get("_source")
    if source and run.get("reference_file"):
        file = Path(source).with_name(run["reference_file"])
        if file.exists():
            return torch.load(file, weights_only=True)
    return {}


def load_run(path: str | Path) -> dict:
    """Read a run file; a missing, unreadable or foreign file raises ValueError saying which and why."""
    path = Path(path)
    try:
        run = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such run file; create one with "
                         f"`python -m helpers validate run --out {path}`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is corrupt or truncated: "
                         f"re-run `python -m helpers validate run --out {path}`") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a validation run of this pipeline (expected \"schema\": \"{SCHEMA}\"); "
                         f"create one with `python -m helpers validate run`")
    for key in ("workloads", "checks", "settings"):
        if not isinstance(run.get(key), dict):
            raise ValueError(f"{path}: \"{key}\" is missing or not an object; the file is damaged")
    run.setdefault("errors", {})
    run["_source"] = str(path)
    return run


def merge_runs(runs: list[dict], label: str | None = None) -> dict:
    """Rounds of the same environment (the driver interleaves A, B, A, B) as one run: each figure's samples
    pooled, checks from the round that ran them, reference outputs from the first round, and for every
    output whether later rounds reproduced it bit for bit ("repeatability"), and the seconds each step took summed
    over the rounds."""
    if not runs:
        raise ValueError("merge_runs needs at least one run")
    base = copy.deepcopy({k: v for k, v in runs[0].items()})
    base["workloads"] = {w: dict(r) for w, r in runs[0]["workloads"].items()}
    torch_versions = {r["torch"] for r in runs}
    if len(torch_versions) > 1:
        raise NotComparable(f"rounds of one environment ran different torch versions: {sorted(torch_versions)}")
    for other in runs[1:]:
        diffs = setting_differences(runs[0], other)
        if diffs:
            raise NotComparable("rounds differ in their settings: " + "; ".join(diffs))
    repeat = {}
    for w, r in base["workloads"].items():
        figs = copy.deepcopy(r["figures"])
        for other in runs[1:]:
            o = other["workloads"].get(w)
            if not o:
                continue
            for name, f in figs.items():
                if name in o["figures"] and f.get("stat") != "exact":
                    f["groups"] = f.get("groups", [len(f["samples"])]) + [len(o["figures"][name]["samples"])]
                    f["samples"] = f["samples"] + o["figures"][name]["samples"]
                    if "wall_samples" in f:
                        f["wall_samples"] = f["wall_samples"] + o["figures"][name].get("wall_samples", [])
            for out, rec in r.get("references", {}).items():
                same = o.get("references", {}).get(out, {}).get("sha256") == rec["sha256"]
                repeat[f"{w}/{out}"] = repeat.get(f"{w}/{out}", True) and same
        for f in figs.values():
            if f.get("stat") != "exact":
                f["value"] = stats.statistic(f["samples"], f["stat"])
                f["min"], f["max"], f["n"] = min(f["samples"]), max(f["samples"]), len(f["samples"])
                if f.get("wall_samples"):
                    f["wall_value"] = stats.statistic(f["wall_samples"], f["stat"])
        base["workloads"][w]["figures"] = figs
    for other in runs[1:]:
        for step, found in other.get("warnings", {}).items():
            known = base.setdefault("warnings", {}).setdefault(step, [])
            seen = {(w["category"], w["message"]) for w in known}
            known += [w for w in found if (w["category"], w["message"]) not in seen]
        for c, result in other["checks"].items():
            base["checks"].setdefault(c, result)
        for name, err in other["errors"].items():
            base["errors"].setdefault(name, err)
    base["seconds"] = {step: sum(r.get("seconds", {}).get(step, 0.0) for r in runs)     # every round's, for plan()
                       for step in {step for r in runs for step in r.get("seconds", {})}}
    base["rounds"] = len(runs)
    base["repeatability"] = repeat
    base["label"] = label or base["label"]
    return base


def setting_differences(a: dict, b: dict) -> list[str]:
    """What makes two runs not comparable: quick mode, sizes, samples, compile, threads, device type, how OpenMP's
    threads wait, the clock the timings were read from."""
    sa, sb = a.get("settings", {}), b.get("settings", {})
    diffs = [f"{k}: {sa.get(k)!r} vs {sb.get(k)!r}" for k in ("quick", "compile", "device", "threads", "samples",
                                                              "omp_wait_policy", "clock") if sa.get(k) != sb.get(k)]
    for w in sorted(set(sa.get("sizes", {})) & set(sb.get("sizes", {}))):
        if sa["sizes"][w] != sb["sizes"][w]:
            keys = sorted(k for k in set(sa["sizes"][w]) | set(sb["sizes"][w])
                          if sa["sizes"][w].get(k) != sb["sizes"][w].get(k))
            diffs.append(f"{w} sizes: " + ", ".join(f"{k} {sa['sizes'][w].get(k)!r} vs {sb['sizes'][w].get(k)!r}"
                                                    for k in keys))
    return diffs


def machine_differences(a: dict, b: dict) -> list[str]:
    """Flagged, not refused: the same settings on a different CPU or GPU model."""
    ea, eb = a.get("environment", {}), b.get("environment", {})
    return [f"{k}: {ea.get(k)!r} vs {eb.get(k)!r}" for k in ("cpu", "cpu_count", "device_name", "bf16")
            if ea.get(k) != eb.get(k)]


def _figure_ok(fig) -> bool:
    return (isinstance(fig, dict) and fig.get("better") in ("lower", "higher") and isinstance(fig.get("samples"), list)
            and len(fig["samples"]) > 0 and all(isinstance(v, (int, float)) and v > 0 for v in fig["samples"]))


def _numbers(details, prefix="") -> dict:
    """The leaves of a check's details that are numbers, booleans or short strings, by dotted key."""
    out = {}
    if isinstance(details, dict):
        for k, v in details.items():
            out |= _numbers(v, f"{prefix}{k}." if not isinstance(v, (int, float, str, bool, type(None)))
                            else f"{prefix}{k}")
    elif isinstance(details, list) and prefix:
        out[prefix.rstrip(".")] = "; ".join(map(str, details))[:200] if details else "(none)"
    elif prefix and (isinstance(details, (int, float, bool)) or details is None or
                     (isinstance(details, str) and len(details) <= 200)):
        out[prefix] = details
    return out


def same_measurement(x: dict, y: dict) -> bool:
    """Whether two figures of a workload are the same calls seen two ways (a time and its rate): samples whose
    products are one constant."""
    a, b = x.get("samples", []), y.get("samples", [])
    if len(a) != len(b) or len(a) < 2 or "exact" in (x.get("stat"), y.get("stat")):
        return False
    products = [p * q for p, q in zip(a, b)]
    return max(products) - min(products) <= 1e-9 * abs(products[0])


def _decide_family(rows: list[dict], min_change: float) -> None:
    """Holm across the distinct figures that could be told (stats.family_verdicts); a rate seen as the same calls
    as a time takes the time's verdict."""
    family = [r for r in rows if r.get("low") is not None and not r.get("same_as")]
    for row, status in zip(family, stats.family_verdicts(family, min_change)):
        if row["status"] in ("regression", "improvement") and status == "within noise":
            row["why"] = (f"its own interval excludes 1, but not after Holm's correction across the {len(family)} "
                          "distinct figures of this report")
        row["status"] = status
    by_name = {(r["workload"], r["figure"]): r for r in rows}
    for row in rows:
        if row.get("same_as"):
            row["status"] = by_name[(row["workload"], row["same_as"])]["status"]
            row["why"] = f"the same calls as {row['same_as']}: counted once"


def compare_runs(a: dict, b: dict, min_change: float = MIN_CHANGE, *, allow_mismatch: bool = False) -> dict:
    """Every figure, reference output, check and warning of run A against run B. "gain" is how many times
    better B is than A (>1: B better, whether the figure is a time or a throughput), with its 95% paired
    interval over rounds and the change it could have detected (`stats.compare_figure`, `stats.RULE`).
    Runs at different settings raise NotComparable unless allow_mismatch (then flagged)."""
    mismatch = setting_differences(a, b)
    if mismatch and not allow_mismatch:
        raise NotComparable("runs are not comparable: " + "; ".join(mismatch)
                            + ". Re-run both with the same settings (the driver does), or pass "
                              "allow_mismatch=True to compare anyway with every difference flagged")
    rows, missing, numerics, migrations = [], [], [], []
    ta, tb = reference_tensors(a), reference_tensors(b)
    for w in dict.fromkeys(list(a["workloads"]) + list(b["workloads"])):
        wa, wb = a["workloads"].get(w), b["workloads"].get(w)
        if wa is None or wb is None:
            side = "A" if wa is None else "B"
            why = (a if side == "A" else b)["errors"].get(w, "not in the run")
            missing.append({"workload": w, "missing_in": side, "why": why.splitlines()[0]})
            continue
        pa, pb = wa.get("paths", {}), wb.get("paths", {})
        for k in dict.fromkeys(list(pa) + list(pb)):
            if pa.get(k) != pb.get(k):
                migrations.append({"workload": w, "what": k, "a": _path_text(pa.get(k)), "b": _path_text(pb.get(k))})
        fa, fb = wa.get("figures", {}), wb.get("figures", {})
        for name in dict.fromkeys(list(fa) + list(fb)):
            row = {"workload": w, "figure": name}
            if name not in fa or name not in fb:
                rows.append(row | {"status": f"missing in {'A' if name not in fa else 'B'}"})
                continue
            x, y = fa[name], fb[name]
            if not (_figure_ok(x) and _figure_ok(y)):
                rows.append(row | {"status": "unreadable figure"})
                continue
            fig = stats.compare_figure(x["samples"], y["samples"], x["better"], x.get("stat", "median"),
                                       x.get("groups"), y.get("groups"), min_change)
            twin = next((t for t in fa if t != name and fa[t].get("better") == "lower" and x["better"] == "higher"
                         and _figure_ok(fa[t]) and same_measurement(x, fa[t])), None)
            rows.append(row | fig | {"unit": x.get("unit", ""), "better": x["better"], "a": x["value"],
                                     "b": y["value"], "n_a": len(x["samples"]), "n_b": len(y["samples"]),
                                     "rounds_a": len(x.get("groups") or [1]), "rounds_b": len(y.get("groups") or [1]),
                                     "same_as": twin})
        ra, rb = wa.get("references", {}), wb.get("references", {})
        for out in dict.fromkeys(list(ra) + list(rb)):
            if out not in ra or out not in rb:
                numerics.append({"workload": w, "output": out,
                                 "status": f"missing in {'A' if out not in ra else 'B'}"})
                continue
            key = f"{w}/{out}"
            numerics.append({"workload": w, "output": out}
                            | reference.compare(ra[out], rb[out], ta.get(key), tb.get(key),
                                                ta.get(key + reference.NORMS_SUFFIX), tb.get(key + reference.NORMS_SUFFIX)))
    checks = []
    for c in dict.fromkeys(list(a["checks"]) + list(b["checks"])):
        ca, cb = a["checks"].get(c), b["checks"].get(c)
        pa, pb = (r.get("passed") if isinstance(r, dict) else None for r in (ca, cb))
        status = ("missing in A" if pa is None else "missing in B" if pb is None else
                  "regression" if pa and not pb else "fixed" if pb and not pa else
                  "passes" if pa else "fails in both")
        na, nb = _numbers((ca or {}).get("details", {})), _numbers((cb or {}).get("details", {}))
        figures = [{"key": k, "a": na.get(k), "b": nb.get(k)} for k in dict.fromkeys(list(na) + list(nb))]
        checks.append({"check": c, "a": pa, "b": pb, "status": status, "figures": figures,
                       "paths_a": (ca or {}).get("paths", {}), "paths_b": (cb or {}).get("paths", {}),
                       "tolerance": (cb or ca or {}).get("tolerance", "")})
        for k in dict.fromkeys(list((ca or {}).get("paths", {})) + list((cb or {}).get("paths", {}))):
            va, vb = (ca or {}).get("paths", {}).get(k), (cb or {}).get("paths", {}).get(k)
            if va != vb:
                migrations.append({"workload": f"check {c}", "what": k, "a": va, "b": vb})
    ea, eb = a.get("environment", {}), b.get("environment", {})
    env_diff = [{"key": k, "a": ea.get(k), "b": eb.get(k)}
                for k in ("torch", "torch_git", "cuda", "hip", "cudnn", "nccl", "gpu_driver", "python", "cpu",
                          "device_name", "pipeline_commit")
                if ea.get(k) != eb.get(k)]
    pkg_a, pkg_b = ea.get("packages", {}) or {}, eb.get("packages", {}) or {}
    env_diff += [{"key": f"package {k}", "a": pkg_a.get(k), "b": pkg_b.get(k)}
                 for k in sorted(set(pkg_a) | set(pkg_b)) if pkg_a.get(k) != pkg_b.get(k)]
    _decide_family(rows, min_change)
    warning_rows = warning_differences(a, b)
    regressions = ([r for r in rows if r.get("status") == "regression"]
                   + [w for w in warning_rows if w["finding"]]
                   + [c for c in checks if c["status"] == "regression"]
                   + [n for n in numerics if n["status"] == "drift"])
    return {"a": _summary(a), "b": _summary(b), "comparable": not mismatch, "mismatch": mismatch,
            "machine_differences": machine_differences(a, b), "rows": rows, "missing": missing,
            "numerics": numerics, "checks": checks, "migrations": migrations, "environment": env_diff,
            "statistic": stats.RULE, "warnings": warning_rows,
            "regressions": regressions}


def calibration(report: dict) -> dict:
    """For an A/A comparison (the same torch on both sides): how many of the figures that could be told
    were flagged (each one a false alarm) against the nominal rate, how likely that many flags are by
    chance alone (binomial tail), and the median detectable change. Flags more than chance explains
    (p < 0.05) mean this machine's noise breaks the statistic's assumption that a slow stretch hits both
    runs of a pair: rerun on a quieter machine or with more rounds before trusting a finding."""
    told = [r for r in report["rows"] if r.get("low") is not None and not r.get("same_as")]   # distinct figures
    flagged = [f"{r['workload']}/{r['figure']}" for r in told if r["status"] in ("regression", "improvement")]
    detectable = sorted(r["detectable"] for r in told)
    nominal = round(1 - stats.CONFIDENCE, 4)
    n, m = len(told), len(flagged)
    p_value = sum(math.comb(n, i) * nominal ** i * (1 - nominal) ** (n - i) for i in range(m, n + 1)) if n else None
    trusted = p_value is None or p_value >= 0.05
    return {"figures": n, "flagged": flagged, "false_alarm_rate": m / n if n else None, "nominal": nominal,
            "chance_of_this_many": p_value, "trusted": trusted,
            "median_detectable": detectable[len(detectable) // 2] if detectable else None}


PLAN_CHANGES = (0.05, 0.10)


def plan(report: dict, a: dict | None = None, b: dict | None = None, changes=PLAN_CHANGES) -> dict:
    """From a paired comparison (an A/A one, or any): for each distinct timed figure, its per-pair spread and the
    pairs of rounds needed to find each change in `changes` 80% of the time at 95%, one figure alone and under
    the report's Holm rule (its strictest step, 5% over the number of figures); overall, the most any figure
    needs; and the wall time that costs at the runs' own time per pair of rounds (a and b: the runs)."""
    family = [r for r in report["rows"] if r.get("sd_log") is not None and not r.get("same_as")]
    m = max(len(family), 1)
    figures = [{"figure": f"{r['workload']}/{r['figure']}", "sd_log": r["sd_log"], "pairs": r["pairs"],
                "alone": {c: stats.rounds_needed(r["sd_log"], c) for c in changes},
                "report": {c: stats.rounds_needed(r["sd_log"], c, alpha=(1 - stats.CONFIDENCE) / m) for c in changes}}
               for r in family]
    overall = {c: None if any(f["report"][c] is None for f in figures) or not figures
               else max(f["report"][c] for f in figures) for c in changes}
    per_pair = sum(sum(run.get("seconds", {}).values()) for run in (a, b)) if a and b else None
    rounds = (a or {}).get("rounds") or 1
    return {"figures": figures, "overall": overall, "changes": list(changes),
            "seconds_per_pair": per_pair / rounds if per_pair else None}


def plan_text(planned: dict) -> str:
    """The plan as lines: each figure's noise and rounds, then the overall line with its wall time."""
    def n(k):
        return "over 1000" if k is None else str(k)
    lines = [f"{f['figure']:<44} spread {f['sd_log']:.3f} over {f['pairs']} pairs: " + ", ".join(
        f"{c:.0%} needs {n(f['alone'][c])} pairs alone, {n(f['report'][c])} in the report" for c in planned["changes"])
        for f in planned["figures"]]
    for c, k in planned["overall"].items():
        cost = "" if k is None or not planned["seconds_per_pair"] else \
            f", about {k * planned['seconds_per_pair'] / 60:.0f} min of timed steps at {planned['seconds_per_pair']:.0f} s " \
            "a pair (and each run's start-up)"
        lines.append(f"to find a {c:.0%} change in any figure 80% of the time under the report's rule: {n(k)} pairs of "
                     f"rounds{cost}")
    return "\n".join(lines)


def _path_text(value):
    """A recorded path as one line: a dict of probes as "name: outcome; ..."."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {v}" for k, v in value.items())
    return value


def _summary(run: dict) -> dict:
    out = {k: run.get(k) for k in ("label", "created", "torch", "device", "quick", "compile", "threads", "rounds")}
    env = run.get("environment", {})
    out |= {"cuda": env.get("cuda"), "python": env.get("python"), "cpu": env.get("cpu")}
    return out


def _short(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if unit == "s":
            return f"{value * 1e3:.3g} ms"
        if unit == "bytes":
            return f"{value / 2**20:.3g} MiB"
        return f"{value:.4g}"
    if unit == "bytes" and isinstance(value, int):
        return f"{value / 2**20:.3g} MiB"
    return str(value)


def _gain_text(r: dict) -> str:
    return "-" if r.get("gain") is None else f"{r['gain']:.3f}x"


def _interval_text(r: dict) -> str:
    return "-" if r.get("low") is None else f"[{r['low']:.3f}, {r['high']:.3f}]"


def _detectable_text(r: dict) -> str:
    return "-" if r.get("detectable") is None else f"{r['detectable']:.1%}"


def _passed(value) -> str:
    return {True: "pass", False: "FAIL", None: "-"}[value]


def table(report: dict) -> str:
    """The comparison as plain text."""
    a, b = report["a"], report["b"]
    lines = [f"A: {a['label']} (torch {a['torch']}, {a['device']}, {a['threads']} threads, quick={a['quick']})",
             f"B: {b['label']} (torch {b['torch']}, {b['device']}, {b['threads']} threads, quick={b['quick']})"]
    if report["mismatch"]:
        lines.append("NOT COMPARABLE (compared anyway): " + "; ".join(report["mismatch"]))
    if report["machine_differences"]:
        lines.append("different machines: " + "; ".join(report["machine_differences"]))
    for m in report["migrations"]:
        lines.append(f"migration: {m['workload']} {m['what']}: {m['a']} -> {m['b']}")
    lines.append(f"{'workload':<16}{'figure':<24}{'stat':>7}{'A':>12}{'B':>12}{'B gain':>9}  {'95% interval':<16}"
                 f"{'detectable':>11}  status")
    for r in report["rows"]:
        if "status" in r and "stat" in r:
            lines.append(f"{r['workload']:<16}{r['figure']:<24}{r['stat']:>7}{_short(r['a'], r['unit']):>12}"
                         f"{_short(r['b'], r['unit']):>12}{_gain_text(r):>9}  {_interval_text(r):<16}"
                         f"{_detectable_text(r):>11}  {r['status']}" + (f" ({r['why']})" if r.get("why") else ""))
        else:
            lines.append(f"{r['workload']:<16}{r['figure']:<24}{'':>67}  {r['status']}")
    for m in report["missing"]:
        lines.append(f"{m['workload']:<16}{'(whole workload)':<24}{'':>47}  missing in {m['missing_in']}: {m['why']}")
    for n in report["numerics"]:
        diff = f"max rel diff {n['max_rel_diff']:.2g} (tol {n['tolerance']:.0e})" if "max_rel_diff" in n else ""
        compared = f" [{n['compared']}]" if n.get("compared") else ""
        lines.append(f"numerics {n['workload']}/{n['output']}: {n['status']} {diff}".rstrip() + compared)
    for c in report["checks"]:
        lines.append(f"check {c['check']}: A {_passed(c['a'])}, B {_passed(c['b'])}: {c['status']}")
        for f in c["figures"]:
            if isinstance(f["a"], (int, float)) and not isinstance(f["a"], bool) or f["a"] != f["b"]:
                lines.append(f"    {f['key']:<48} A {_short(f['a'])!s:<14} B {_short(f['b'])}")
    for w in report.get("warnings", []):
        lines.append(f"warning {w['status']}: {w['step']}: {w['category']}: {w['message']}"
                     + (" (a finding)" if w["finding"] else ""))
    if report.get("calibration"):
        cal = report["calibration"]
        rate = "-" if cal["false_alarm_rate"] is None else f"{cal['false_alarm_rate']:.0%}"
        detectable = "-" if cal["median_detectable"] is None else f"{cal['median_detectable']:.1%}"
        chance = "" if cal["chance_of_this_many"] is None else f", {cal['chance_of_this_many']:.2f} by chance alone"
        lines.append(f"A/A calibration: {len(cal['flagged'])} of {cal['figures']} figures flagged ({rate}; nominal "
                     f"{cal['nominal']:.0%} or less{chance}), median detectable change {detectable}"
                     + ("" if cal["trusted"] else ": more false alarms than chance explains, so this machine's noise "
                                                  "is not what the statistic assumes; rerun quieter or with more rounds"))
    counts = {}
    for r in report["rows"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("figures: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    lines.append(f"rule: {report['statistic']}")
    planned = plan(report)
    if planned["figures"]:
        lines.append("rounds: " + "; ".join(f"a {c:.0%} change needs {'over 1000' if k is None else k} pairs at this "
                                            f"noise" for c, k in planned["overall"].items()))
    lines.append(f"{len(report['regressions'])} finding(s): regressions beyond the noise, failed checks, drifts, "
                 f"new deprecation warnings")
    return "\n".join(lines)


COLORS = {"regression": "#d62728", "improvement": "#2ca02c", "within noise": "#7f7f7f"}


def chart(report: dict):
    """A plotly bar chart of B's gain over A per figure, with the 95% paired interval as error bars (figures
    that cannot be told or are not reported are left out)."""
    import plotly.graph_objects as go
    rows = [r for r in report["rows"] if r.get("low") is not None]
    fig = go.Figure(go.Bar(
        x=[f"{r['workload']}<br>{r['figure']}" for r in rows], y=[r["gain"] for r in rows],
        marker_color=[COLORS[r["status"]] for r in rows],
        error_y=dict(type="data", symmetric=False, array=[r["high"] - r["gain"] for r in rows],
                     arrayminus=[r["gain"] - r["low"] for r in rows]),
        text=[f"{r['gain']:.2f}x" for r in rows], textposition="outside",
        hovertext=[f"{r['status']}: 95% interval {r['low']:.3f}-{r['high']:.3f}, detectable change "
                   f"{r['detectable']:.1%}" for r in rows]))
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_layout(title=f"B ({report['b']['label']}) vs A ({report['a']['label']}): above 1 is better in B; "
                            f"error bars: 95% paired interval over rounds; red: regression beyond the noise",
                      yaxis_title="gain of B over A (x)", height=520)
    return fig


def _html_table(headers: list[str], rows: list[list], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(f"<tr class='{html.escape((classes or [''] * len(rows))[i])}'>"
                   + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for i, r in enumerate(rows))
    return f"<table><tr>{head}</tr>{body}</table>"


def report_html(report: dict) -> str:
    a, b = report["a"], report["b"]
    parts = ["<html><head><meta charset='utf-8'><title>Validation report</title><style>"
             "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
             ".regression,.drift,.FAIL{background:#fdd} .improvement{background:#dfd} .flag{color:#b00}"
             "</style></head><body><h1>Validation report</h1>"]
    parts.append(_html_table(["", "label", "torch", "CUDA build", "python", "device", "threads", "quick", "rounds",
                              "cpu"],
                             [[k, r["label"], r["torch"], r["cuda"], r["python"], r["device"], r["threads"],
                               r["quick"], r.get("rounds"), r["cpu"]] for k, r in (("A", a), ("B", b))]))
    if report["mismatch"]:
        parts.append("<p class='flag'><b>Not comparable</b> (compared anyway): "
                     + html.escape("; ".join(report["mismatch"])) + "</p>")
    else:
        parts.append("<p>Settings identical in both runs (quick mode, sizes, samples, compile, threads, device).</p>")
    if report["machine_differences"]:
        parts.append("<p class='flag'>Different machines: " + html.escape("; ".join(report["machine_differences"]))
                     + "</p>")
    parts.append(f"<p><b>Statistic.</b> {html.escape(report['statistic'])}.</p>")
    parts.append("<h2>Migration differences: code paths that differ between A and B</h2>")
    parts.append(_html_table(["workload / check", "what", "A", "B"],
                             [[m["workload"], m["what"], m["a"], m["b"]] for m in report["migrations"]])
                 if report["migrations"] else "<p>none</p>")
    parts.append("<h2>Workloads</h2>")
    figures = [r for r in report["rows"] if "stat" in r]
    others = [r for r in report["rows"] if "stat" not in r]
    parts.append(_html_table(
        ["workload", "figure", "stat", "A", "B", "gain of B", "95% interval", "detectable", "gain per round pair",
         "samples (rounds) A/B", "status"],
        [[r["workload"], r["figure"], r["stat"], _short(r["a"], r["unit"]), _short(r["b"], r["unit"]), _gain_text(r),
          _interval_text(r), _detectable_text(r),
          " ".join(f"{g:.2f}" for g in r["round_gains"]) if r.get("round_gains") else "-",
          f"{r['n_a']} ({r['rounds_a']}) / {r['n_b']} ({r['rounds_b']})",
          r["status"] + (f": {r['why']}" if r.get("why") else "")] for r in figures]
        + [[r["workload"], r["figure"], "", "", "", "", "", "", "", "", r["status"]] for r in others]
        + [[m["workload"], "(whole workload)", "", "", "", "", "", "", "", "", f"missing in {m['missing_in']}: {m['why']}"]
           for m in report["missing"]],
        [r["status"] for r in figures] + [""] * (len(others) + len(report["missing"]))))
    try:
        parts.append(chart(report).to_html(full_html=False, include_plotlyjs=True))
    except ImportError:
        parts.append("<p>(plotly is not installed: no chart)</p>")
    parts.append("<h2>Numerics: reference outputs of B against A</h2>")
    parts.append(_html_table(["workload", "output", "shape", "dtype", "status", "max |B-A| / max |A|", "tolerance",
                              "compared"],
                             [[n["workload"], n["output"], n.get("shape_a", ""), n.get("dtype_a", ""), n["status"],
                               f"{n['max_rel_diff']:.3g}" if "max_rel_diff" in n else "", n.get("tolerance", ""),
                               n.get("compared", "")]
                              for n in report["numerics"]], [n["status"] for n in report["numerics"]]))
    parts.append("<h2>Warnings: raised in one run and not in the other</h2>")
    parts.append(_html_table(["workload / check", "category", "message", "raised in", "status"],
                             [[w["step"], w["category"], w["message"], w["where"],
                               w["status"] + (" (a finding)" if w["finding"] else "")]
                              for w in report.get("warnings", [])],
                             ["regression" if w["finding"] else "" for w in report.get("warnings", [])])
                 if report.get("warnings") else "<p>none</p>")
    parts.append("<h2>Upgrade checks</h2>")
    for c in report["checks"]:
        parts.append(f"<h3 class='{'FAIL' if c['status'] in ('regression', 'fails in both') else ''}'>"
                     f"{html.escape(c['check'])}: A {_passed(c['a'])}, B {_passed(c['b'])} ({html.escape(c['status'])})"
                     f"</h3><p>Required: {html.escape(str(c['tolerance']))}</p>")
        parts.append(_html_table(["measured", "A", "B"], [[f["key"], _short(f["a"]), _short(f["b"])]
                                                          for f in c["figures"]]))
    parts.append("<h2>Environment differences</h2>")
    parts.append(_html_table(["what", "A", "B"], [[e["key"], e["a"], e["b"]] for e in report["environment"]]))
    parts.append(f"<h2>Findings: {len(report['regressions'])}</h2><pre>{html.escape(table(report))}</pre>"
                 "</body></html>")
    return "".join(parts)


def write_report(report: dict, path: str | Path) -> Path:
    """An HTML page: settings, migration differences, each workload's gain with its interval, the
    numerics, each check's numbers, the environment differences (plotly.js embedded: opens offline)."""
    path = Path(path)
    write_text_atomic(report_html(report), path)
    return path


def write_report_json(report: dict, path: str | Path) -> Path:
    return save_json(report, path)
