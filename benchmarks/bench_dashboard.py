"""Dashboard page loads in a real browser: `mxperf dash` on a copy of examples/runs, headless Chromium.

For every page: the first visit after the server started (cold: nothing cached), then ``--repeats`` visits by
clicking the page in the sidebar (what a user does), each timed from the click until the script run is over
and every chart drew its SVG. The peer, measured in the same run, is the Add a trace page (no data, one form):
the floor that Streamlit and the browser cost on this machine. Prints a table, then one JSON line.

    .venv/bin/python benchmarks/bench_dashboard.py [--runs examples/runs] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
import test_dashboard_browser as tb  # noqa: E402  (the browser test's helpers: settle, chromium flags)


def _browser(download_dir: Path) -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = tb.CHROMIUM
    for flag in (*tb.FLAGS, "--window-size=1600,1000"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={download_dir}")
    return webdriver.Chrome(service=Service(tb.CHROMEDRIVER), options=opts)


def _click_page(driver: object, server: str, page: str) -> None:
    target = server if page == "runs" else f"{server}/{page}"
    for a in tb._find(driver, '[data-testid="stSidebarNav"] a'):
        if (a.get_attribute("href") or "").rstrip("/") == target:
            a.click()
            return
    raise RuntimeError(f"no sidebar link to {page}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=REPO / "examples" / "runs")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-"))
    runs = tmp / "runs"
    shutil.copytree(args.runs, runs, symlinks=True)
    port = tb._free_port()
    server = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxperf.cli", "dash", str(runs), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    driver = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"{server}/_stcore/health", timeout=1).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.2)
        driver = _browser(tmp / "profile")
        cold: dict[str, float] = {"runs": tb._open(driver, server, "runs")}
        for page, charts in tb.PAGES[1:]:
            _click_page(driver, server, page)
            cold[page] = tb._settle(driver, charts)
        warm: dict[str, list[float]] = {p: [] for p, _ in tb.PAGES}
        for _ in range(args.repeats):
            for page, charts in tb.PAGES:
                _click_page(driver, server, page)
                warm[page].append(tb._settle(driver, charts))
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    floor = statistics.median(warm["add_trace"])
    print(f"{'page':<12} {'first visit s':>14} {'median s':>9} {'max s':>7} {'x floor':>8}")
    for page, _ in tb.PAGES:
        med = statistics.median(warm[page])
        print(f"{page:<12} {cold[page]:>14.2f} {med:>9.2f} {max(warm[page]):>7.2f} {med / floor:>8.1f}")
    print(
        f"(peer: add_trace, the page with no data; load average {load:.2f}; {args.repeats} visits per page)"
    )
    result = {
        "first_visit_s": {p: round(v, 3) for p, v in cold.items()},
        "median_s": {p: round(statistics.median(v), 3) for p, v in warm.items()},
        "max_s": {p: round(max(v), 3) for p, v in warm.items()},
        "load_average": round(load, 2),
        "repeats": args.repeats,
    }
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
