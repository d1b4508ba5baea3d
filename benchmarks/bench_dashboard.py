"""Dashboard page loads in a real browser: `mxperf dash` on a copy of examples/runs, headless Chromium.

For every page, **loads**: the page's URL opened in the address bar (a new Streamlit session, as a reload or a
shared link), timed from the request until the page's **main content** is on screen (its title, its main
element -- :data:`MAIN`: the answer card, the table, the upload form -- and every chart of the page drew its
SVG); the first load after the server started (cold: nothing cached), then ``--repeats`` loads round robin
over the pages, median and max; the time until the script run is over (no run for 0.6 s) is reported too.
Then ``--repeats`` **visits** by clicking the page in the sidebar (what a user does), each timed from the click
until the run is over and every chart drew. The peer is the Add a trace page (no data, one form): the floor
that Streamlit and the browser cost on this machine. Goal: every load's median under 2 s (issue #35). Prints a
table, then one JSON line (with the machine, versions, date and load average).

    .venv/bin/python benchmarks/bench_dashboard.py [--runs examples/runs] [--repeats 5]
    .venv/bin/python benchmarks/bench_dashboard.py --timeline OUT/events/rank-0.parquet [--repeats 5]

``--timeline``: the Timeline page's server side on one events Parquet, no browser: ``--repeats`` times the
first view with an empty cache folder (read the events into islands and host-stall spans, write them to the
cache, the whole trace's boxes, bands and figure: what the first-ever page load computes) and then again
from the cache (what a new server process computes for a trace it has seen); medians and maxima; then
``--repeats`` zooms (a window of 1/20 of the trace at a random place, the boxes, bands and figure: what a
slider move computes once the page has the trace in memory). The load average before and after is recorded.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
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


GOAL_S = 2.0
# The main content of each page: an element it must show (besides its title and its charts: tb.PAGES).
MAIN: dict[str, str] = {
    "overview": ".st-key-answer-card",
    "runs": '[data-testid="stDataFrame"]',
    "step_time": '[data-testid="stDataFrame"]',
    "breakeven": ".st-key-answer-card",
    "host_stall": '[data-testid="stDataFrame"]',
    "timeline": ".js-plotly-plot .bars path",
    "kernels": '[data-testid="stDataFrame"]',
    "diff": '[data-testid="stDataFrame"]',
    "consistency": '[data-testid="stDataFrame"]',
    "weight_sync": '[data-testid="stDataFrame"]',
    "add_trace": '[data-testid="stFileUploader"]',
}


def _url(server: str, page: str) -> str:
    return server if page == "overview" else f"{server}/{page}"  # the default page lives at /


def _main_content(driver: object, page: str, charts: int, t0: float, timeout_s: float = 60) -> float:
    """Seconds from ``t0`` until the page shows its title, its :data:`MAIN` element and ``charts`` drawn
    charts (polled every 20 ms)."""
    while time.monotonic() - t0 < timeout_s:
        if (
            tb._find(driver, '[data-testid="stMain"] h1')
            and tb._find(driver, f'[data-testid="stMain"] {MAIN[page]}')
            and len(tb._find(driver, ".js-plotly-plot .main-svg")) >= charts
        ):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"{page}: no main content after {timeout_s} s")


def _load(driver: object, server: str, page: str, charts: int) -> tuple[float, float]:
    """One load of ``page`` in a new session: (seconds to its main content, seconds until its run is over)."""
    t0 = time.monotonic()
    driver.get(_url(server, page))
    main = _main_content(driver, page, charts, t0)
    t1 = time.monotonic()
    done = t1 - t0 + tb._settle(driver, charts)
    errors = tb._errors(driver)
    if errors:
        raise RuntimeError(f"{page}: exception on the page: {errors[0]}")
    return main, max(main, done)


def _machine() -> dict[str, object]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in ln
        ),
        platform.processor(),
    )
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


def _versions(driver: object) -> dict[str, str]:
    out = {p: importlib.metadata.version(p) for p in ("streamlit", "plotly", "pandas", "pyarrow", "selenium")}
    out["chromium"] = str(driver.capabilities.get("browserVersion", "?"))  # type: ignore[attr-defined]
    return out


def _click_page(driver: object, server: str, page: str) -> None:
    target = _url(server, page)
    for a in tb._find(driver, '[data-testid="stSidebarNav"] a'):
        if (a.get_attribute("href") or "").rstrip("/") == target:
            a.click()
            return
    raise RuntimeError(f"no sidebar link to {page}")


def _timeline(events: Path, repeats: int) -> int:
    import random

    import pandas as pd

    from dashboards import charts_gpu, timeline, timeline_boxes
    from tracing.outputs import store

    out = events.parent.parent
    ranges = store.read_table(out / store.RANGES) if (out / store.RANGES).is_file() else None
    mb = store.read_table(out / store.MICROBATCHES) if (out / store.MICROBATCHES).is_file() else None

    def view(tl: object, stalls: object, t0: int, t1: int) -> int:
        boxes = timeline_boxes.boxes(tl, t0, t1)
        stall = timeline_boxes.stall_boxes(stalls, t0, t1)
        both = boxes if stall.empty else pd.concat([boxes, stall], ignore_index=True)
        charts_gpu.tracks_figure(both, timeline.bands(ranges, mb, t0, t1), tl.first_ns, "bench").to_json()
        return len(both)

    def first_open() -> tuple[float, float, object, object, int]:
        """What a cold page load computes: the islands and host stalls (through the disk cache), the whole
        trace's boxes, bands and figure."""
        t = time.perf_counter()
        tl, stalls = timeline_boxes.load(events)
        t_load = time.perf_counter() - t
        rows = view(tl, stalls, tl.first_ns, tl.last_ns)
        return time.perf_counter() - t, t_load, tl, stalls, rows

    load_before = os.getloadavg()[0]
    cache = Path(tempfile.mkdtemp(prefix="bench-tl-cache-"))
    os.environ[timeline_boxes.CACHE_ENV] = str(cache)  # an empty cache of our own: first-ever opens
    first, first_load, cached, cached_load = [], [], [], []
    try:
        for _ in range(repeats):
            shutil.rmtree(cache, ignore_errors=True)
            total, t_load, *_ = first_open()  # first-ever: events -> islands + stalls, written to the cache
            first.append(total)
            first_load.append(t_load)
            total, t_load, tl, stalls, rows = first_open()  # a new process's open: read back from the cache
            cached.append(total)
            cached_load.append(t_load)
        cache_bytes = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rng = random.Random(35)
    zooms, zoom_rows = [], []
    span = tl.last_ns - tl.first_ns
    for _ in range(repeats):
        a = tl.first_ns + rng.randrange(0, span - span // 20)
        t = time.perf_counter()
        zoom_rows.append(view(tl, stalls, a, a + span // 20))
        zooms.append(time.perf_counter() - t)
    med = statistics.median
    print(
        json.dumps(
            {
                "events": str(events),
                "bytes": events.stat().st_size,
                "ops": tl.ops,
                "islands": len(tl.islands.start),
                "stall_islands": len(stalls.islands.start),
                "repeats": repeats,
                "first_view_s": round(med(first), 2),
                "first_view_max_s": round(max(first), 2),
                "read_islands_stalls_s": round(med(first_load), 2),
                "cached_first_view_s": round(med(cached), 2),
                "cached_first_view_max_s": round(max(cached), 2),
                "cached_read_s": round(med(cached_load), 3),
                "cache_bytes": cache_bytes,
                "first_view_boxes": rows,
                "zoom_median_s": round(med(zooms), 3),
                "zoom_max_s": round(max(zooms), 3),
                "zoom_boxes_max": max(zoom_rows),
                "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            }
        )
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=REPO / "examples" / "runs")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeline", type=Path, help="time the Timeline page's queries on this events Parquet")
    args = ap.parse_args()
    if args.timeline:
        return _timeline(args.timeline, args.repeats)
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
    load_before = os.getloadavg()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"{server}/_stcore/health", timeout=1).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.2)
        driver = _browser(tmp / "profile")
        versions = _versions(driver)
        cold: dict[str, tuple[float, float]] = {}
        for page, charts in tb.PAGES:  # the first load of each page after the server started
            cold[page] = _load(driver, server, page, charts)
        loads: dict[str, list[tuple[float, float]]] = {p: [] for p, _ in tb.PAGES}
        for _ in range(args.repeats):
            for page, charts in tb.PAGES:
                loads[page].append(_load(driver, server, page, charts))
        visits: dict[str, list[float]] = {p: [] for p, _ in tb.PAGES}
        for _ in range(args.repeats):
            for page, charts in tb.PAGES:
                _click_page(driver, server, page)
                visits[page].append(tb._settle(driver, charts))
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    med = statistics.median
    main_med = {p: med(m for m, _ in v) for p, v in loads.items()}
    print(
        f"{'page':<12} {'first load s':>12} {'load median s':>13} {'load max s':>10} {'run over s':>10} "
        f"{'visit median s':>14} {'< 2 s':>6}"
    )
    for page, _ in tb.PAGES:
        print(
            f"{page:<12} {cold[page][0]:>12.2f} {main_med[page]:>13.2f} {max(m for m, _ in loads[page]):>10.2f} "
            f"{med(d for _, d in loads[page]):>10.2f} {med(visits[page]):>14.2f} "
            f"{'yes' if main_med[page] < GOAL_S else 'NO':>6}"
        )
    print(
        f"(load = the URL opened, until its main content is on screen; run over = until the script run ended; "
        f"visit = a sidebar click; {args.repeats} of each per page; load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after; peer: add_trace)"
    )
    result = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "runs": str(args.runs),
        "repeats": args.repeats,
        "goal_s": GOAL_S,
        "first_load_s": {p: round(v[0], 3) for p, v in cold.items()},
        "load_median_s": {p: round(v, 3) for p, v in main_med.items()},
        "load_max_s": {p: round(max(m for m, _ in v), 3) for p, v in loads.items()},
        "run_over_median_s": {p: round(med(d for _, d in v), 3) for p, v in loads.items()},
        "visit_median_s": {p: round(med(v), 3) for p, v in visits.items()},
        "over_goal": sorted(p for p, v in main_med.items() if v >= GOAL_S),
        "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
        "machine": _machine(),
        "versions": versions,
    }
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
