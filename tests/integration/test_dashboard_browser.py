"""The dashboard in a real browser: `mxperf dash` served on localhost, every page opened in headless Chromium.

Checks that each page rendered its charts (plotly's ``.js-plotly-plot`` / ``.main-svg`` in the DOM, not just
the JavaScript shell) and shows no exception box, and saves one screenshot per page to ``tests/artifacts/``
(look at them: a user must be able to read each page without help). Needs Debian's ``chromium`` and
``chromium-driver`` (``.ci/browser-deps.sh`` installs them); skipped with the command to run when absent.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
EXAMPLES = REPO / "examples" / "runs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# (url path, charts the page must draw at least)
PAGES: tuple[tuple[str, int], ...] = (
    ("runs", 0),
    ("step_time", 2),
    ("breakeven", 2),
    ("host_stall", 1),
    ("consistency", 1),
    ("weight_sync", 1),
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=1400,1800",
)

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs chromium and chromedriver: sudo apt-get install -y chromium chromium-driver",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("MXPERF_DASH_TEST_RUNS"):  # look at another folder of outputs (screenshots)
        return Path(os.environ["MXPERF_DASH_TEST_RUNS"])
    if any(EXAMPLES.glob("*/manifest.json")):
        return EXAMPLES
    sys.path.insert(0, str(REPO / "tests"))
    import dash_fixtures

    return dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    runs = _runs_dir(tmp_path_factory)
    log = tmp_path_factory.mktemp("dash") / "dash.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mxperf.cli", "dash", str(runs), "--port", str(port)],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mxperf dash did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_rendered(driver: object, min_charts: int, timeout_s: float = 25) -> tuple[int, list[str]]:
    """Wait until the app stopped running and at least ``min_charts`` plotly charts drew their SVG."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout_s
    while True:
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        titles = driver.find_elements(By.CSS_SELECTOR, "h1")
        charts = driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")
        plots = len(driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"))
        if titles and not running and plots >= min_charts and (min_charts == 0 or charts):
            time.sleep(0.5)  # let plotly finish laying out before the screenshot
            errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')]
            return plots, errors
        if time.monotonic() > deadline:
            errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')]
            return plots, errors
        time.sleep(0.25)


@pytest.mark.parametrize(("page", "min_charts"), PAGES, ids=[p for p, _ in PAGES])
def test_page_renders_charts_in_chromium(server: str, browser: object, page: str, min_charts: int) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/{'' if page == 'runs' else page}")  # the default page lives at /
    plots, errors = _wait_rendered(browser, min_charts)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;"
        "return Math.max(m.scrollHeight, document.body.scrollHeight);"
    )
    browser.set_window_size(1400, min(max(int(height) + 100, 900), 6000))
    time.sleep(0.3)
    browser.save_screenshot(str(ARTIFACTS / f"dashboard-{page}.png"))
    assert not errors, f"{page}: exception box shown: {errors[0][:500]}"
    dialogs = [d.text for d in browser.find_elements(By.CSS_SELECTOR, '[role="dialog"]')]
    assert not dialogs, f"{page}: a dialog covers the page: {dialogs[0][:200]}"
    assert plots >= min_charts, f"{page}: {plots} plotly charts rendered, expected >= {min_charts}"
