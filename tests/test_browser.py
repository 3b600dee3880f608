"""The lessons in a real JupyterLab, in a real browser (Debian's Chromium driven by Playwright).

JupyterLab runs on 127.0.0.1 with a token and clean config, settings and workspace folders; kernels get
LABS_QUICK=1. For each notebook: open it, wait until its kernel is connected and idle (before that,
"Run All" can raise a kernel-selection dialog), run all cells, then check in the DOM that no cell
errored, that plotly figures and widgets rendered, and (lesson 00) that moving a slider round-trips to
the kernel. Screenshots go to runs/browser/.
"""
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = REPO / "runs" / "browser"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium on PATH: apt-get install chromium "
                                "(make test installs it where it runs as root)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(server, path):
    with urllib.request.urlopen(f"{server['url']}/api/{path}?token={server['token']}", timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("lab")
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # no news or update pop-ups
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # every cell in the page, not only those scrolled into view: the tests read all outputs (tracebacks included)
    tracker = home / "settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    root = home / "root"        # a copy, so that autosave never writes into the repository
    for folder in ("notebooks", "labs"):
        shutil.copytree(REPO / folder, root / folder)
    token, port = secrets.token_hex(16), free_port()
    env = {k: v for k, v in os.environ.items() if k != "LABS_HEADLESS"}   # real widgets here
    env.update(JUPYTER_CONFIG_DIR=str(home / "config"), LABS_QUICK="1",
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           f"--LabServerApp.user_settings_dir={home / 'settings'}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "lab.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    info = {"url": f"http://127.0.0.1:{port}", "token": token}
    deadline = time.time() + 90
    while True:
        try:
            api(info, "status")
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"JupyterLab did not start:\n{(home / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
    yield info
    for kernel in api(info, "kernels"):
        req = urllib.request.Request(f"{info['url']}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(req, timeout=10)
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def wait_for_kernel(server, path, timeout=90):
    """Until the notebook's own kernel shows a connection and is idle."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        kernel = next((s["kernel"] for s in api(server, "sessions") if s["path"] == path), None)
        if kernel and kernel["execution_state"] == "idle" and kernel["connections"] > 0:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{path}: kernel not connected and idle after {timeout} s: {api(server, 'sessions')}")


def run_notebook(server, browser, path, timeout=240):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server['url']}/lab/tree/{path}?token={server['token']}&reset")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    wait_for_kernel(server, path)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # done when every code cell has a number in its prompt and the kernel is idle again
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""", timeout=timeout * 1000)
    wait_for_kernel(server, path)
    return page


@contextlib.contextmanager
def executed(server, browser, path):
    """The notebook opened and run in the browser, checked for tracebacks; screenshot and close after."""
    page = run_notebook(server, browser, path)
    try:
        outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
        errors = [o for o in outputs if "Traceback (most recent call last)" in o]
        assert errors == [], errors[0][-2000:] if errors else ""
        yield page
    finally:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{Path(path).stem}.png"), full_page=False)
        page.close()


def test_start_here_renders_figures_and_widgets_round_trip(server, browser):
    with executed(server, browser, "notebooks/00_start_here.ipynb") as page:
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        assert page.locator(".js-plotly-plot").count() >= 1
        slider = page.locator(".widget-slider .noUi-handle, .widget-hslider .noUi-handle").first
        slider.wait_for(timeout=30_000)
        out = page.locator(".widget-output, .jupyter-widgets-output-area").first
        out.get_by_text("2^8 floats per tensor").wait_for(timeout=60_000)
        slider.focus()
        page.keyboard.press("ArrowRight")          # 8 -> 10: the kernel must run time_at(10)
        out.get_by_text("2^10 floats per tensor").wait_for(timeout=60_000)
        # a prediction prompt is a real control; Run All answers nothing, and the reveal says so
        assert page.locator(".widget-radio-box").count() >= 1
        page.get_by_text("You did not answer").first.wait_for(timeout=5_000)
        page.get_by_text("SKIPPED section 'Accelerator details'").or_(
            page.get_by_text("Section 'Accelerator details' runs here")).first.wait_for(timeout=5_000)


def test_warmup_lab_solution_passes_its_checks_in_the_browser(server, browser):
    with executed(server, browser, "labs/solutions/00_warmup_lab.ipynb") as page:
        outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    import torch

    from helpers.grading.specs import spec_for
    visible = sum(not case.hidden for exercise in spec_for("00_warmup_lab").exercises
                  for case in exercise.cases(torch.Generator().manual_seed(0)))
    assert outputs.count(": passed") == visible and "❌" not in outputs     # one line per visible case


def test_feature_lesson_renders_its_figures(server, browser):
    with executed(server, browser, "notebooks/03_grouped_gemm_moe.ipynb") as page:
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        assert page.locator(".js-plotly-plot").count() >= 2
        assert page.locator(".widget-slider, .widget-hslider").count() >= 1
