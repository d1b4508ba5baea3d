"""Dashboard page loads in a real browser: `mxperf dash` on a copy of examples/runs, headless Chromium.

For every page: the first visit after the server started (cold: nothing cached), then ``--repeats`` visits by
clicking the page in the sidebar (what a user does), each timed from the click until the script run is over
and every chart drew its SVG. The peer, measured in the same run, is the Add a trace page (no data, one form):
the floor that Streamlit and the browser cost on this machine. Prints a table, then one JSON line.

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
