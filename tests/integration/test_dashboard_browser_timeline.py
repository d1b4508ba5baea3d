"""Issue #35 item 4 in headless Chromium at 1280 px: the Timeline page of the a100 example draws its CPU-thread
and GPU-stream tracks, host stall and bands, without an error or sideways scrolling, and offers the Perfetto
download (screenshot: tests/artifacts/dashboard-timeline-1280.png)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
import test_dashboard_browser as tb

pytestmark = tb.pytestmark


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs = tb._runs_dir(tmp_path_factory.mktemp("served-timeline"))
    port = tb._free_port()
    log = tmp_path_factory.mktemp("dash-timeline") / "dash.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mxperf.cli", "dash", str(runs), "--port", str(port)],
            cwd=tb.REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(tb.REPO)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
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
    opts.binary_location = tb.CHROMIUM
    for flag in (*tb.FLAGS, "--window-size=1280,1000"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile-timeline')}")
    driver = webdriver.Chrome(service=Service(tb.CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_timeline_page_at_1280px(server: str, browser: object) -> None:
    browser.set_window_size(1280, 1000)
    tb._open(browser, server, "timeline", 1)
    tb._select(browser, "Trace", "ingest-a100-hostbound")
    tb._settle(browser, 1)
    assert not tb._errors(browser)
    text = browser.find_element("css selector", '[data-testid="stMain"]').text
    assert "boxes drawn" in text and "ui.perfetto.dev" in text
    ticks = {e.text for e in tb._find(browser, ".js-plotly-plot .ytick text")}
    assert {"steps", "phases", "GPU 0 · stream 7", "GPU 0 · host stall"} <= ticks, ticks
    assert any(t.startswith("CPU pid") for t in ticks), ticks
    assert tb._find(browser, ".js-plotly-plot .bars path")  # boxes drawn
    buttons = [b.text for b in tb._find(browser, '[data-testid="stDownloadButton"] button')]
    assert any("Perfetto" in b for b in buttons), buttons
    wide = browser.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]');return m.scrollWidth > m.clientWidth + 1;"
    )
    assert not wide, "the page scrolls sideways at 1280 px"
    tb._shot(browser, "timeline-1280", 1280)
