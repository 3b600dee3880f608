"""The matrix report: run folders of several environments merged into one view (synthetic records)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.__main__ import main
from helpers.runner.matrix import (environment_description, environment_name, matrix_html, matrix_text,
                                   merge_runs, write_matrix)

ATTENTION = "notebooks/06_attention_kernels.ipynb"
BASICS = "notebooks/01_tensors.ipynb"


def machine(**changes) -> dict:
    m = {"torch_version": "2.10.0+cu128", "accelerator": "cuda", "build_accelerator": "cuda",
         "device_name": "NVIDIA L4", "cuda_version": "12.8", "hip_version": None, "xpu_compiled": False,
         "python_version": "3.11.9", "free_threaded": False, "gil_enabled": True,
         "cpu_name": "AMD EPYC 7B13", "cpu_count": 8,
         "packages": {"triton": "3.5.0", "torchao": "0.14.0", "torchdata": None, "numpy": "2.3.0"}}
    return {**m, **changes}


def notebook(path: str, status: str = "passed", *, peak: float = 700.0, sections=(), error=None) -> dict:
    return {"path": path, "status": status, "fault": "cell-error" if status == "failed" else None,
            "detail": "", "error": error, "sections": list(sections), "peak_memory_mb": peak,
            "seconds": 12.5, "problems": []}


def write_run(folder, notebooks: list[dict], label: str | None = None, nbval: dict | None = None, **m):
    folder.mkdir(parents=True)
    record = {"parameters": {"QUICK": True}, "executor": "local", "workers": 2, "machine": machine(**m),
              "started": 0.0, "total_seconds": 30.0, "complete": True,
              "passed": sum(n["status"] == "passed" for n in notebooks),
              "failed": sum(n["status"] != "passed" for n in notebooks), "notebooks": notebooks}
    if label is not None:
        record["label"] = label
    (folder / "record.json").write_text(json.dumps(record))
    if nbval is not None:    # pytest's JUnit XML: a few cells per notebook, the outcome on the last one
        cases = "".join(
            f'<testcase classname="{nb.replace("/", ".")}" name="Cell {i}">'
            + ({"failed": "<failure message='x'/>", "skipped": "<skipped/>"}.get(outcome, "") if i == 2 else
               ("<skipped/>" if outcome == "skipped" else "")) + "</testcase>"
            for nb, outcome in nbval.items() for i in range(3))
        (folder / "nbval.xml").write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}'
                                          '</testsuite></testsuites>')
    return folder


def cell(matrix: dict, notebook_path: str, environment: str) -> dict:
    [result] = [r for r in matrix["results"]
                if r["notebook"] == notebook_path and r["environment"] == environment]
    return result


def test_two_environments_with_a_failure_and_a_skipped_section(tmp_path):
    gpu = write_run(tmp_path / "gpu", [notebook(BASICS), notebook(ATTENTION, sections=[
        {"section": "Flash attention", "needs": ["cuda"], "ran": True, "reason": None}])], label="cuda")
    cpu = write_run(tmp_path / "cpu", [notebook(BASICS), notebook(ATTENTION, "failed", sections=[
        {"section": "Flash attention", "needs": ["cuda"], "ran": False, "reason": "needs a CUDA GPU"}],
        error={"cell": 7, "ename": "RuntimeError", "evalue": "boom", "source": "x()"})],
        label="", accelerator="cpu", device_name="")
    matrix = merge_runs([gpu, cpu])
    cpu_name = "torch 2.10.0+cu128 / py3.11 / cpu"
    assert [e["name"] for e in matrix["environments"]] == ["cuda", cpu_name]
    assert matrix["notebooks"] == [BASICS, ATTENTION]
    assert len(matrix["results"]) == 4
    assert cell(matrix, ATTENTION, "cuda")["status"] == "passed"
    assert cell(matrix, ATTENTION, "cuda")["sections_run"] == ["Flash attention"]
    failed = cell(matrix, ATTENTION, cpu_name)
    assert failed["status"] == "failed" and failed["error"] == "cell 7: RuntimeError: boom"
    assert failed["sections_skipped"] == [{"section": "Flash attention", "reason": "needs a CUDA GPU"}]
    assert "CUDA 12.8 build, no GPU: ran on CPU" in matrix["environments"][1]["description"]
    text = matrix_text(matrix)
    assert "cell 7: RuntimeError: boom" in text and f"{cpu_name}: 1 passed, 1 failed" in text
    page = matrix_html(matrix)
    assert "needs a CUDA GPU" in page and "<details>" in page
    json.dumps(matrix)   # JSON-able


def test_names_and_descriptions_of_unlabelled_environments():
    summary = {"machine": machine(python_version="3.13.1", free_threaded=True, gil_enabled=False)}
    assert environment_name(summary) == "torch 2.10.0+cu128 / py3.13t / cuda"
    assert environment_name({**summary, "label": "room-a"}) == "room-a"
    description = environment_description(summary)
    assert "CUDA 12.8 build, ran on CUDA (NVIDIA L4)" in description
    assert "free-threaded, GIL off" in description and "torchdata missing" in description
    assert "triton 3.5.0" in description and "8 cores" in description
    cpu_only = environment_description({"machine": machine(accelerator="cpu", build_accelerator=None,
                                                           cuda_version=None, device_name="")})
    assert "CPU build, ran on CPU" in cpu_only and "no GPU" not in cpu_only


def test_a_notebook_missing_in_one_run_is_not_run(tmp_path):
    full = write_run(tmp_path / "a", [notebook(BASICS), notebook(ATTENTION)], label="full")
    part = write_run(tmp_path / "b", [notebook(BASICS)], label="part")
    matrix = merge_runs([full, part])
    missing = cell(matrix, ATTENTION, "part")
    assert missing["status"] == "not run" and missing["seconds"] is None
    assert any(line.split()[:3] == [ATTENTION, "part", "not"] for line in matrix_text(matrix).splitlines())
    assert "part: 1 passed, 0 failed, 1 not run" in matrix_text(matrix)


def test_runs_with_the_same_label_stay_distinct_columns(tmp_path):
    pc1 = write_run(tmp_path / "pc1", [notebook(BASICS)], label="room")
    pc2 = write_run(tmp_path / "pc2", [notebook(BASICS, "failed")], label="room")
    matrix = merge_runs([pc1, pc2])
    assert [e["name"] for e in matrix["environments"]] == ["room", "room #2"]
    assert [e["run_dir"] for e in matrix["environments"]] == [str(pc1), str(pc2)]
    assert cell(matrix, BASICS, "room")["status"] == "passed"
    assert cell(matrix, BASICS, "room #2")["status"] == "failed"


def test_nbval_results_are_read_when_present(tmp_path):
    with_nbval = write_run(tmp_path / "a", [notebook(BASICS), notebook(ATTENTION)], label="a",
                           nbval={ATTENTION: "failed", BASICS: "skipped"})
    without = write_run(tmp_path / "b", [notebook(ATTENTION)], label="b")
    matrix = merge_runs([with_nbval, without])
    assert cell(matrix, ATTENTION, "a")["nbval"] == "failed"
    assert cell(matrix, BASICS, "a")["nbval"] == "skipped"
    assert cell(matrix, ATTENTION, "b")["nbval"] is None
    assert "nbval failed" in matrix_html(matrix)


def test_a_folder_without_a_record_raises_naming_it(tmp_path):
    good = write_run(tmp_path / "good", [notebook(BASICS)])
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty-folder"):
        merge_runs([good, empty])
    (empty / "record.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="empty-folder"):
        merge_runs([empty])


def test_cli_exit_codes(tmp_path, capsys):
    ok = write_run(tmp_path / "ok", [notebook(BASICS)], label="ok")
    bad = write_run(tmp_path / "bad", [notebook(BASICS, "failed")], label="bad")
    short = write_run(tmp_path / "short", [], label="short")
    out = tmp_path / "matrix"
    assert main(["report", str(ok), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert BASICS in printed and str(out / "matrix.html") in printed
    assert json.loads((out / "matrix.json").read_text())["notebooks"] == [BASICS]
    assert main(["report", str(ok), str(bad), "--out", str(out)]) == 1
    assert main(["report", str(ok), str(short), "--out", str(out)]) == 1


def test_cli_error_exits_2_and_goes_to_stderr(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nowhere" in err
    assert not (tmp_path / "m").exists()


def test_html_escapes_error_text(tmp_path):
    run = write_run(tmp_path / "a", [notebook(BASICS, "failed", error={
        "cell": 2, "ename": "ValueError", "evalue": "<script>alert(1)</script>", "source": ""})], label="<b>x</b>")
    page = matrix_html(merge_runs([run]))
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x</b>" not in page


def test_over_budget_memory_is_highlighted(tmp_path):
    run = write_run(tmp_path / "a", [notebook(BASICS, peak=1400), notebook(ATTENTION, peak=2100)], label="a")
    html_path, json_path = write_matrix(merge_runs([run]), tmp_path / "out")
    page = html_path.read_text()
    assert page.count("class='over-budget'") == 1
    assert "<span class='over-budget' title='over the 1536 MB budget'>2100 MB</span>" in page
    assert "1400 MB" in page and json_path.name == "matrix.json"


def test_matrix_module_does_not_import_torch():
    done = subprocess.run([sys.executable, "-c", "import sys, helpers.runner.matrix; "
                           "sys.exit('torch' in sys.modules)"], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_nbval_failure_fails_the_report(tmp_path):
    run = write_run(tmp_path / "a", [notebook(BASICS)], label="a", nbval={BASICS: "failed"})
    assert main(["report", str(run), "--out", str(tmp_path / "m")]) == 1


def test_card_lists_the_environments_where_quick_run_and_nbval_passed(tmp_path):
    import nbformat

    from helpers import notebooks
    cpu = write_run(tmp_path / "cpu", [notebook(BASICS), notebook(ATTENTION)], label="cpu",
                    nbval={BASICS: "passed", ATTENTION: "passed"}, torch_version="2.13.0+cpu")
    cuda = write_run(tmp_path / "cuda", [notebook(BASICS), notebook(ATTENTION, "failed")], label="cuda",
                     nbval={BASICS: "failed", ATTENTION: "passed"})
    matrix = merge_runs([cpu, cuda])
    cpu_label = "2.13.0+cpu (env cpu: CUDA 12.8 build on NVIDIA L4)"   # the build, and the GPU it ran on
    assert notebooks.verified_versions(matrix, BASICS) == cpu_label     # nbval failed on cuda
    assert notebooks.verified_versions(matrix, ATTENTION) == cpu_label  # the run failed on cuda
    path = tmp_path / "lesson.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "| | |\n|---|---|\n| **Verified with torch** | 2.9 by hand; sources: release notes |")])
    path.write_text(nbformat.writes(nb))
    notebooks.REPO, repo = tmp_path, notebooks.REPO
    try:
        matrix["results"] = [{**r, "notebook": "lesson.ipynb"} for r in matrix["results"] if r["notebook"] == BASICS]
        assert notebooks.write_verified(path, matrix, "2026-12-01")
        assert not notebooks.write_verified(path, matrix, "2026-12-01")    # the same matrix changes nothing
    finally:
        notebooks.REPO = repo
    card = notebooks.read(path).cells[0].source
    assert (f"| **Verified with torch** | quick run and stored outputs pass on {cpu_label} "
            "(make matrix, 2026-12-01); sources: release notes |") in card
    gpu = {"record": {"started": 1796389320.0,   # 2026-12-04 13:02 UTC
                      "machine": {"torch_version": "2.11.0+cu130", "device_name": "NVIDIA H200"},
                      "notebooks": [{"path": "lesson.ipynb", "status": "passed",
                                     "code_sha256": notebooks.code_sha256(notebooks.read(path))}]}}
    notebooks.REPO = tmp_path
    try:
        assert notebooks.write_verified(path, None, None, [gpu])             # the matrix part stays
        assert not notebooks.write_verified(path, None, None, [gpu])
        assert not notebooks.write_verified(path, matrix, "2026-12-01", [gpu])
        assert (f"pass on {cpu_label} (make matrix, 2026-12-01), and as a script on 2.11.0+cu130 on an NVIDIA H200 "
                "(gpu-check, 2026-12-04); sources: release notes |") in notebooks.read(path).cells[0].source
        nb = notebooks.read(path)                                             # its code changes after the GPU run:
        nb.cells.append(nbformat.v4.new_code_cell("x = 1"))                  # the clause no longer holds
        notebooks.write(nb, path)
        assert notebooks.write_verified(path, None, None, [gpu])
        assert "gpu-check" not in notebooks.read(path).cells[0].source
    finally:
        notebooks.REPO = repo
    path.write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# no card")])))
    with pytest.raises(ValueError, match="no .*Verified with torch"):
        notebooks.write_verified(path, matrix, "2026-12-01")


def test_the_gpu_sections_static_check_is_shown_per_environment(tmp_path):
    checked = write_run(tmp_path / "a", [notebook(ATTENTION)], label="torch 2.10")
    (checked / "gpu_sections.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu_sections" name="test_x[06-cell26]"/>'
        '<testcase classname="tests.test_gpu_sections" name="test_x[07-cell19]"><failure message="gone"/></testcase>'
        '</testsuite></testsuites>')
    unchecked = write_run(tmp_path / "b", [notebook(ATTENTION)], label="other")
    matrix = merge_runs([checked, unchecked])
    assert matrix["environments"][0]["gpu_sections_check"] == {"passed": 1, "failed": ["test_x[07-cell19]"]}
    assert matrix["environments"][1]["gpu_sections_check"] is None
    text = matrix_text(matrix)
    assert "GPU sections static check: 1 passed, 1 failed (test_x[07-cell19])" in text
    assert "GPU sections static check: 1 passed, 1 failed" in matrix_html(matrix)


def write_bundle(path, notebooks: list[dict], label: str, check=None, **m):
    """A gpu-check bundle (helpers.runner.gpu_check.bundle): a run's record with the static check and doctor."""
    record = {"label": label, "machine": machine(**m), "started": 0.0, "total_seconds": 30.0, "complete": True,
              "passed": sum(n["status"] == "passed" for n in notebooks),
              "failed": sum(n["status"] != "passed" for n in notebooks), "notebooks": notebooks}
    path.write_text(json.dumps({"record": record, "gpu_figures": {"figures": []}, "gpu_sections_check": check,
                                "doctor": "torch 2.10.0+cu128"}))
    return path


def test_a_gpu_check_bundle_merges_as_one_more_environment(tmp_path, capsys):
    ci = write_run(tmp_path / "cuda", [notebook(BASICS), notebook(ATTENTION)], label="cuda")
    h200 = write_bundle(tmp_path / "gpu-check-bundle.json", [notebook(ATTENTION)], "gpu-check-cuda",
                        check={"passed": 40, "failed": []}, device_name="NVIDIA H200")
    matrix = merge_runs([ci, h200])
    assert [e["name"] for e in matrix["environments"]] == ["cuda", "gpu-check-cuda"]
    assert matrix["environments"][1]["gpu_sections_check"] == {"passed": 40, "failed": []}
    assert cell(matrix, ATTENTION, "gpu-check-cuda")["status"] == "passed"
    assert cell(matrix, BASICS, "gpu-check-cuda")["status"] == "not run"
    assert main(["report", str(ci), str(h200), "--out", str(tmp_path / "m")]) == 1     # BASICS not run there
    assert "gpu-check-cuda" in capsys.readouterr().out


@pytest.mark.parametrize("content", ['{"record": [1]}', '[1, 2]', "not json",
                                     '{"record": {"notebooks": [], "machine": {}}, "gpu_sections_check": {"passed": "x"}}',
                                     '{"record": {"machine": {}}}'])
def test_a_malformed_bundle_raises_naming_it(tmp_path, content):
    path = tmp_path / "odd-bundle.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="odd-bundle.json"):
        merge_runs([path])


def test_short_build_says_when_a_gpu_build_ran_without_its_gpu():
    from helpers.runner.matrix import short_build
    assert short_build(machine(accelerator="cpu")) == "CUDA 12.8 build, no GPU"
    assert short_build(machine()) == "CUDA 12.8 build on NVIDIA L4"
    assert short_build(machine(accelerator="cpu", build_accelerator=None, cuda_version=None)) == "CPU build"
