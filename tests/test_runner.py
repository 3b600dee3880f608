"""The batch runner: every fault is classified and the other notebooks still finish, the record is
written atomically, --resume keeps what passed, parameters come from -p and a file, Dask runs the same
work, and 2 workers really run side by side. The fault notebooks are in tests/fixtures/runner/."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.runner import run_collection
from helpers.runner.execute import default_workers

FIXTURES = Path(__file__).parent / "fixtures" / "runner"
REPO = Path(__file__).resolve().parent.parent
FAULTS = {   # fixture -> (fault, words in the detail)
    "ok": (None, ""),
    "raises": ("cell-error", "ValueError: fixture: this cell raises"),
    "hangs": ("cell-timeout", "per-cell timeout"),
    "exits": ("kernel-died", "exited with status 3"),
    "segfault": ("kernel-died", "SIGSEGV"),
    "memory_hog": ("out-of-memory", "over the limit of 500 MB"),
    "memory_error": ("out-of-memory", "MemoryError"),
    "malformed": ("malformed-notebook", "NotJSONError"),
}


def fixture(name: str) -> str:
    return str((FIXTURES / f"{name}.ipynb").relative_to(REPO))


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults")
    summary = run_collection([fixture(n) for n in FAULTS], out_dir=out, parameters={"QUICK": True}, workers=2,
                             cell_timeout=20, notebook_timeout=90, memory_limit_mb=500)   # 20 s: a busy machine
    return out, summary


@pytest.mark.parametrize("name", FAULTS)
def test_each_fault_is_classified(fault_run, name):
    _, summary = fault_run
    record = next(r for r in summary["notebooks"] if r["path"] == fixture(name))
    fault, words = FAULTS[name]
    assert record["fault"] == fault, record
    assert words in record["detail"]
    assert record["status"] == ("passed" if fault is None else "failed")
    if fault in ("cell-error", "cell-timeout", "kernel-died"):
        # the cell that raised, hung or killed the kernel, by its index in the submitted notebook
        assert record["error"]["cell"] == 3 and record["error"]["source"]
    if name != "malformed":
        assert record["peak_memory_mb"] > 10 and record["executed"].startswith("notebooks/")
    if name == "memory_hog":
        assert record["peak_memory_mb"] > 500


def test_record_report_and_executed_notebooks_are_on_disk(fault_run):
    out, summary = fault_run
    record = json.loads((out / "record.json").read_text())
    assert record["complete"] and record["passed"] == 1 and record["failed"] == len(FAULTS) - 1
    assert record["faults"] == {"cell-error": 1, "cell-timeout": 1, "kernel-died": 2, "out-of-memory": 2,
                                "malformed-notebook": 1}
    assert not list(out.rglob("*.tmp")), "atomic writes leave no temporary files"
    executed = out / summary["notebooks"][0]["executed"]
    assert "total 3" in executed.read_text()           # outputs of the executed copy
    page = (out / "report.html").read_text()
    assert "plotly.min.js" in page and (out / "plotly.min.js").stat().st_size > 100_000
    for fault in ("cell-timeout", "kernel-died", "out-of-memory", "malformed-notebook", "SIGSEGV"):
        assert fault in page
    assert "fixture: this cell raises" in page and "time.sleep(600)" in page   # the error cells


def test_notebook_timeout_and_resume(tmp_path):
    paths = [fixture("ok"), fixture("slow")]
    # limits far above what "ok" and each 2-second cell of "slow" need on a busy machine; "slow" sleeps 60 s
    limits = {"cell_timeout": 20, "notebook_timeout": 30}
    first = run_collection(paths, out_dir=tmp_path, workers=2, **limits)
    by_path = {r["path"]: r for r in first["notebooks"]}
    assert by_path[fixture("ok")]["status"] == "passed"
    slow = by_path[fixture("slow")]
    assert slow["fault"] == "notebook-timeout" and "30 s" in slow["detail"]
    again = run_collection(paths, out_dir=tmp_path, workers=2, resume=True, **limits)
    kept = {r["path"]: r.get("resumed", False) for r in again["notebooks"]}
    assert kept == {fixture("ok"): True, fixture("slow"): False}
    assert again["resumed"] == 1 and again["faults"] == {"notebook-timeout": 1}
    # other parameters: nothing is kept
    other = run_collection([fixture("ok")], out_dir=tmp_path, parameters={"QUICK": False}, workers=1, resume=True)
    assert other["resumed"] == 0 and other["passed"] == 1


def cli(*args):
    return subprocess.run([sys.executable, "-m", "helpers", "run", *args, "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, timeout=240)


def test_cli_parameters_from_a_file_and_the_command_line_and_exit_status(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("SIZE: 5\nQUICK: true\n")
    # the file sets SIZE=5 (ok's check would then fail); -p SIZE 3 overrides it; raises fails: exit 1
    done = cli(fixture("ok"), fixture("raises"), "-f", str(params), "-p", "SIZE", "3", "--out", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads((tmp_path / "record.json").read_text())["parameters"] == {"QUICK": True, "SIZE": 3}
    assert "1 passed, 1 failed" in done.stdout
    assert "cell-error: ValueError: fixture: this cell raises" in done.stdout and "in cell 3" in done.stdout


def test_unknown_parameter_is_refused_before_running(tmp_path):
    summary = run_collection([fixture("ok")], out_dir=tmp_path, parameters={"QUICK": True, "BOGUS": 1})
    record = summary["notebooks"][0]
    assert record["fault"] == "unknown-parameter"
    assert record["detail"] == "BOGUS not declared in the notebook's parameters cell (it declares: QUICK, SIZE)"


def test_dask_executor_on_a_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    # worker threads in this process (each notebook still gets its own processes): starts in a second
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        summary = run_collection([fixture("ok"), fixture("exits")], out_dir=tmp_path,
                                 executor="dask", scheduler=cluster.scheduler_address, cell_timeout=10)
    faults = {r["path"]: r["fault"] for r in summary["notebooks"]}
    assert faults == {fixture("ok"): None, fixture("exits"): "kernel-died"}
    assert summary["executor"] == "dask" and (tmp_path / "report.html").exists()
    assert (tmp_path / "notebooks" / fixture("ok")).exists()


def test_dask_needs_a_scheduler_and_unknown_notebooks_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="needs --scheduler"):
        run_collection([fixture("ok")], out_dir=tmp_path, executor="dask")
    with pytest.raises(ValueError, match="not in helpers/manifest.json: nope.ipynb"):
        run_collection(["nope.ipynb"], out_dir=tmp_path)


def test_one_vs_two_workers(tmp_path):
    """Two CPU-bound notebooks (1.5 s of CPU each) with 1 and 2 workers. Prints the speed-up; asserts
    only that 2 workers ran notebooks side by side (timing on shared cores is noisy)."""
    copies = []
    for i in range(2):
        copies.append(tmp_path / f"cpu_work_{i}.ipynb")
        shutil.copy(FIXTURES / "cpu_work.ipynb", copies[-1])
    runs = {}
    for workers in (1, 2):
        runs[workers] = run_collection([str(p) for p in copies], out_dir=tmp_path / f"w{workers}",
                                       workers=workers, cell_timeout=60)
        assert runs[workers]["passed"] == 2
    spans = sorted((r["started"], r["finished"]) for r in runs[2]["notebooks"])
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), "2 workers overlapped"
    one, two = runs[1]["total_seconds"], runs[2]["total_seconds"]
    print(f"\n1 worker {one:.1f} s, 2 workers {two:.1f} s: speed-up {one / two:.2f}x")


def test_default_workers_fits_the_machine():
    from helpers.device import capabilities
    assert 1 <= default_workers() <= capabilities().cpu_count


def test_a_kernel_that_dies_before_its_first_reply_is_started_once_more(monkeypatch, tmp_path):
    import papermill

    from helpers.runner import drive
    calls = []

    def execute_notebook(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(drive.KERNEL_START_FAILED)

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    job = {"input": "in.ipynb", "output": "out.ipynb", "parameters": {}, "cwd": str(tmp_path), "cell_timeout": 5}
    result = drive.drive(job)
    assert result["outcome"] == "passed" and len(calls) == 2 and drive.KERNEL_START_FAILED in result["kernel_restarted"]
    calls.clear()
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    assert drive.drive(job)["outcome"] == "runner-error"     # any other failure is not retried
