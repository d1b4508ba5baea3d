""" "Open in Perfetto": an ingested rank's events as an annotated Kineto trace (``mxperf annotate``'s tracks).

The annotated trace is made from the output's own ``events/rank-<r>.parquet`` (the dashboard reads nothing
outside RUNS_DIR, and an ingest's source trace usually lies elsewhere): its kernels, memory ops, CUDA
runtime / driver calls, CPU ops and ranges as Kineto events (times relative to ``baseTimeNanoseconds``), plus
``mxperf annotate``'s GPU busy / host stall / other-idle tracks per device (``tracing.analysis.annotate``,
its timelines from the engine as the ingest computes them). It is written once per events file (keyed on its
path, size and modification time) into a cache folder, and ``mxperf ingest`` reads it back with the same
busy and host-stall numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tracing.analysis import annotate
from tracing.ingest import engine

CACHE_ENV = "MXPERF_DASH_CACHE"
STEPS = (
    "Open https://ui.perfetto.dev in Chrome or Firefox (the trace is opened in the browser, never uploaded).",
    "Click **Open trace file** in the left menu (or drag the downloaded `.json.gz` onto the page).",
    "Pick the downloaded file; the `mxperf: GPU <d>` process at the top holds the GPU busy, host stall and "
    "idle (other) tracks, the CPU threads and GPU streams follow; W / S zoom, A / D pan.",
)
# Kineto categories per event kind: annotate's map plus CPU ops (their threads are tracks in Perfetto)


def cache_dir() -> Path:
    path = Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "mxperf-dash-perfetto")
    path.mkdir(parents=True, exist_ok=True)
    return path


def annotated_trace(events_path: str | os.PathLike[str], label: str = "") -> Path:
    """The annotated ``.json.gz`` of one rank's events (made once, then taken from the cache)."""
    src = Path(events_path).resolve()
    st = src.stat()
    key = hashlib.sha256(f"{src}|{st.st_size}|{st.st_mtime_ns}|1".encode()).hexdigest()[:20]
    dst = cache_dir() / f"{key}.json.gz"
    if dst.is_file():
        return dst
    with engine.session() as con:
        engine.parquet_events(con, src)
        base = int(con.sql("select coalesce(min(start_ns), 0) from events").fetchall()[0][0])
        base -= base % 1_000_000_000
        timelines = annotate._timelines(con)

        def events() -> Iterator[str]:
            yield from annotate.kineto_events(con, base, annotate.ALL_CATEGORIES, per_process_ids=False)
            yield from annotate.overlay_events(timelines, base)

        meta = {
            "baseTimeNanoseconds": str(base),
            "displayTimeUnit": json.dumps("ms"),
            "mxperf_source": json.dumps(label or str(src)),
        }
        annotate._write_trace(dst, events(), meta)
    return dst
