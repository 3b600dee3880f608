"""The course website (helpers.runner.site): provenance from records, and the built site in Chromium.

The browser test opens every page of a built site served over HTTP: it renders, plotly figures draw, every
section header has its provenance lines, launch links are there, internal links resolve, nothing is logged
to the console as an error, and axe-core finds no serious or critical accessibility violation.
LABS_SITE_DIR names a built site, whose every page is opened (CI: `make site-check` on the site of the
matrix runs); without it the test builds one from a quick run of lesson 00 and opens one page of each kind
(the other lessons then say, section by section, that they have not run anywhere).
"""
import functools
import http.server
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from helpers.manifest import entries
from helpers.runner import site

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
AXE = REPO / "build" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def env(name, records, *, torch="2.10.0+cu128", accelerator="cpu", device_name=None):
    machine = {"torch_version": torch, "python_version": "3.11.7", "accelerator": accelerator,
               "build_accelerator": "cuda" if "cu" in torch else None, "cuda_version": "12.8" if "cu" in torch else None,
               "device_name": device_name, "cpu_name": "AMD EPYC", "cpu_count": 2}
    return {"name": name, "machine": machine, "date": "2026-12-03", "parameters": {}, "records": records,
            "executed": {}}


CELLS = [{"cell_type": "markdown", "source": "# Title"},
         {"cell_type": "markdown", "source": "## Plain section"},
         {"cell_type": "code", "source": "x = 1"},
         {"cell_type": "markdown", "source": "## On the GPU"},
         {"cell_type": "code", "source": 'if requires("cuda", section="Kernels on the GPU"):\n    pass'}]
SKIPPED = {"section": "Kernels on the GPU", "ran": False, "reason": "needs cuda (this machine: cpu)"}
RAN = {"section": "Kernels on the GPU", "ran": True, "reason": None}


def provenance(title, gated, environments, stops=None):
    return site.section_provenance("nb", title, gated, environments, stops or {})


def test_section_map_gives_each_gated_section_to_the_heading_above_it():
    assert site.section_map(CELLS, ["Kernels on the GPU", "Declared elsewhere"]) == {
        "Plain section": [], "On the GPU": ["Kernels on the GPU"]}


def test_headings_inside_fenced_code_are_not_sections_and_a_cell_is_cut_at_each_heading():
    text = "Intro\n## First\ntext\n```text\n## not a heading\n```\n## Second\nmore"
    cells = site.split_at_headings([{"cell_type": "markdown", "id": "c", "source": text}])
    assert [site.heading(c) for c in cells] == [None, "First", "Second"]
    assert "## not a heading" in cells[1]["source"] and cells[1]["source"].count("```") == 2


def test_provenance_says_where_a_section_ran_and_was_skipped_and_why():
    environments = [env("cpu", {"nb": {"status": "passed", "sections": [SKIPPED]}}, torch="2.13.0+cpu"),
                    env("h200", {"nb": {"status": "passed", "sections": [RAN]}}, accelerator="cuda",
                        device_name="NVIDIA H200")]
    gpu = provenance("On the GPU", ["Kernels on the GPU"], environments)
    assert gpu["ran"] == ["h200: torch 2.10.0+cu128 (CUDA 12.8 build on NVIDIA H200), Python 3.11.7, 2026-12-03"]
    assert gpu["ran_without"] == [("cpu: torch 2.13.0+cpu (CPU build), Python 3.11.7, AMD EPYC (2 cores), 2026-12-03",
                               "Kernels on the GPU: needs cuda (this machine: cpu)")]
    plain = provenance("Plain section", [], environments)
    assert len(plain["ran"]) == 2 and not plain["ran_without"]
    text = site.provenance_html(gpu)
    assert "Ran on</b> h200" in text and "Ran on</b> cpu" in text and "with a part skipped" in text
    assert "has not run" not in text
    assert "has not run in full on any machine" in site.provenance_html(provenance("On the GPU", ["Kernels on the GPU"],
                                                                                   environments[:1]))


def test_a_failed_run_ran_the_sections_before_its_error_failed_in_one_and_never_reached_the_rest():
    executed = [{"cell_type": "markdown", "source": "## First"},
                {"cell_type": "code", "source": "1", "execution_count": 1, "outputs": []},
                {"cell_type": "markdown", "source": "## Second"},
                {"cell_type": "code", "source": "2", "execution_count": 2,
                 "outputs": [{"output_type": "error", "ename": "ValueError", "evalue": "bad"}]},
                {"cell_type": "markdown", "source": "## Third"},
                {"cell_type": "code", "source": "3", "execution_count": None, "outputs": []}]
    stops = {"cpu": site.stopped_in(executed)}
    assert stops["cpu"] == {"First": "ran", "Second": "failed", "Third": "not reached"}
    failed = [env("cpu", {"nb": {"status": "failed", "sections": [], "fault": "cell-error",
                                 "error": {"ename": "ValueError", "evalue": "bad"}}})]
    assert provenance("First", [], failed, stops)["ran"]
    assert provenance("Second", [], failed, stops)["failed"] == [(site.where(failed[0]), "ValueError: bad")]
    assert provenance("Third", [], failed, stops)["not_reached"]
    assert "Failed here on</b> cpu" in site.provenance_html(provenance("Second", [], failed, stops))


def test_a_failed_run_without_an_executed_copy_tells_only_what_its_record_decided():
    record = {"status": "failed", "fault": "kernel-died", "sections": [SKIPPED]}
    environments = [env("bundle", {"nb": record})]
    gated = provenance("On the GPU", ["Kernels on the GPU"], environments)
    assert gated["ran_without"] and not gated["unknown"]
    plain = provenance("Plain section", [], environments)
    assert plain["unknown"] == [(site.where(environments[0]), "the notebook kernel-died and this run kept no "
                                                              "executed copy")] and not plain["ran"]


def test_a_section_that_never_ran_says_so_and_reasons_are_escaped():
    skipped = {"section": "S", "ran": False, "reason": "needs <xpu>"}
    prov = provenance("S", ["S"], [env("cpu", {"nb": {"status": "passed", "sections": [skipped]}})])
    text = site.provenance_html(prov)
    assert "has not run in full on any machine recorded here" in text and "&lt;xpu&gt;" in text
    assert "has not run on any machine" in site.provenance_html(provenance("S", ["S"], []))


def test_a_run_without_executed_notebooks_tells_from_its_record_and_a_missing_date_is_unknown(tmp_path):
    record = {"label": "h200", "started": 0, "parameters": {"QUICK": True}, "complete": True, "passed": 0,
              "failed": 1, "machine": {"torch_version": "2.10.0+cu128", "accelerator": "cuda"},
              "notebooks": [{"path": "nb", "status": "failed", "sections": [RAN], "seconds": 1.0}]}
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.json").write_text(json.dumps(record))
    matrix = site.merge_runs([run])
    [environment] = site.read_environments([run], matrix)
    assert environment["executed"] == {} and environment["date"] == "date unknown"
    assert provenance("On the GPU", ["Kernels on the GPU"], [environment])["ran"]


def test_figures_carry_a_title_and_a_text_alternative():
    figure = {"data": [{"type": "bar", "name": "eager", "x": [1], "y": [2]}],
              "layout": {"title": {"text": "Time per step"}, "xaxis": {"title": {"text": "batch"}}}}
    out = site.plotly_html(figure, 1)
    assert 'aria-label="Time per step"' in out and "<figcaption>" in out
    assert "x axis: batch" in out and "bar &#x27;eager&#x27;" in out and "Plotly.newPlot" in out


def test_pages_offer_the_student_copy_of_a_lab_never_its_solution():
    assert site.page_source({"path": "labs/solutions/03_moe_lab.ipynb"}) == "labs/03_moe_lab.ipynb"
    links = site.launch_links("labs/03_moe_lab.ipynb", "https://github.com/o/r", "../downloads/labs/03_moe_lab.ipynb")
    assert links["Open in Colab"] == "https://colab.research.google.com/github/o/r/blob/main/labs/03_moe_lab.ipynb"
    assert "urlpath=lab/tree/labs/03_moe_lab.ipynb" in links["Launch on Binder"]


# -- the built site in a browser ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    if os.environ.get("LABS_SITE_DIR"):
        return Path(os.environ["LABS_SITE_DIR"])
    from helpers.runner.execute import run_collection
    work = tmp_path_factory.mktemp("site")
    record = run_collection(["notebooks/00_start_here.ipynb"], out_dir=work / "run", workers=1, label="quick-cpu")
    assert record["passed"] == 1, record["notebooks"]
    return Path(site.build_site([work / "run"], work / "site")["html"])


@pytest.fixture(scope="module")
def served(site_dir):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    handler = functools.partial(Quiet, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def internal_links(page_file: Path, hrefs: list[str]) -> list[str]:
    """The relative links of a page whose target file is missing."""
    broken = []
    for href in hrefs:
        if re.match(r"^[a-z]+:", href) or href.startswith("#"):
            continue
        target = (page_file.parent / href.split("#")[0].split("?")[0]).resolve()
        if href.split("#")[0] and not target.exists():
            broken.append(href)
    return broken


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium on PATH: apt-get install chromium (make test installs "
                    "it where it runs as root)")
@pytest.mark.skipif(not AXE.is_file(), reason="needs axe-core from npm in build/npm: make axe (needs npm)")
def test_every_page_renders_with_provenance_launch_links_and_no_serious_accessibility_violation(site_dir, served):
    from playwright.sync_api import sync_playwright
    pages = sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html")
                   if not p.relative_to(site_dir).as_posix().startswith(("_", "genindex", "search")))
    notebooks = [p for p in pages if p.startswith(("notebooks/", "labs/"))]
    assert "index.html" in pages and "status.html" in pages and len(notebooks) == len(entries()), pages
    assert not any("solutions" in p for p in pages), "a lab's solution was published"
    if not os.environ.get("LABS_SITE_DIR"):     # the site built here: the pages of each kind, not all 27 alike
        pages = ["index.html", "status.html", "notebooks/00_start_here.html", "notebooks/07_memory_deep_dive.html",
                 "labs/00_warmup_lab.html"]
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        for path in pages:
            page = browser.new_page()
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{served}/{path}", wait_until="load")
            assert page.locator("main h1").count() >= 1, f"{path}: no title"
            if path in notebooks:
                headers = page.locator("main section > h2").count()
                provenance = page.locator(".provenance").count()
                if provenance != headers:
                    problems.append(f"{path}: {headers} section headers, {provenance} provenance notes")
                if path == "notebooks/00_start_here.html":     # ran wherever its record says, CPU-only included
                    first = page.locator(".provenance").first.inner_text()
                    if "Ran on" not in first:
                        problems.append(f"{path}: its first section did not run anywhere: {first[:200]}")
                labels = page.locator(".launch-buttons a").all_inner_texts()
                if labels != ["Open in Colab", "Launch on Binder", "Download the notebook"]:
                    problems.append(f"{path}: launch links {labels}")
                figures = page.locator("figure.plotly-figure").count()
                unlabelled = page.eval_on_selector_all(
                    "figure.plotly-figure", "fs => fs.filter(f => !f.getAttribute('aria-label') || "
                    "!(f.querySelector('figcaption') || {}).textContent).length")
                if unlabelled:
                    problems.append(f"{path}: {unlabelled} figure(s) without a title or a text alternative")
                if figures:
                    page.wait_for_function(f"document.querySelectorAll('figure.plotly-figure .main-svg').length"
                                           f" >= {figures}", timeout=30_000)
            hrefs = page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))")
            problems += [f"{path}: broken link {h}" for h in internal_links(site_dir / path, hrefs)]
            problems += [f"{path}: console error {e[:200]}" for e in errors]
            page.add_script_tag(path=str(AXE))     # axe fetches stylesheets itself: its console is not the page's
            violations = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']}))"
                                       ".violations.map(v => ({id: v.id, impact: v.impact, n: v.nodes.length}))")
            problems += [f"{path}: axe {v['id']} ({v['impact']}, {v['n']} nodes)" for v in violations
                         if v["impact"] in ("serious", "critical")]
            page.close()
        browser.close()
    assert problems == [], "\n".join(problems[:40])
