"""mxperf's own run directory (``ranges.parquet`` from ``tracing.capture.ranges.RangeLog``) -> a :class:`Trace`.

Host wall times only (``time.monotonic_ns`` of the writing process): per-range wall times and the micro-batch
table come out, every GPU metric is null with a reason. A traced run's ``trace/rank-<r>.json.gz`` files are
ingested as Kineto traces alongside (``ingest.expand_inputs``).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tracing.ingest.trace import Trace
from tracing.outputs import schema, store
from tracing.outputs.errors import InputError, TraceFormatError
from tracing.outputs.schema import RANGE_LOG_COLUMNS


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return Path(path).is_dir() and (Path(path) / store.RANGES).is_file()


def run_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's manifest config (empty when there is no manifest)."""
    mpath = Path(path) / store.MANIFEST
    if not mpath.is_file():
        return {}
    try:
        cfg = store.read_json(mpath).get("config") or {}
    except InputError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def load_range_log(path: str | os.PathLike[str], *, rank: int | None = None) -> Trace:
    """Read ``PATH/ranges.parquet`` (a run directory) or a ranges.parquet file itself (its events and range
    log as pandas frames)."""
    trace = read_range_log(path, rank=rank)
    return replace(trace, events=schema.to_frame(trace.events), range_log=schema.to_frame(trace.range_log))


def read_range_log(path: str | os.PathLike[str], *, rank: int | None = None) -> Trace:
    """:func:`load_range_log` with its events and range log as Arrow tables (``mxperf ingest``)."""
    path = Path(path)
    table = path / store.RANGES if path.is_dir() else path
    try:
        log = store.read_arrow(table)
    except InputError as exc:
        raise TraceFormatError(table, str(exc).split(": ", 1)[-1]) from None
    missing = [c for c in RANGE_LOG_COLUMNS if c not in log.column_names]
    if missing:
        raise TraceFormatError(table, f"not an mxperf range log: missing column(s) {', '.join(missing)}")
    try:
        log = schema.conform_table(log, RANGE_LOG_COLUMNS, "range log")
    except InputError as exc:
        raise TraceFormatError(table, f"range log column has the wrong type ({exc})") from None
    start, end = (log.column(c).to_numpy() for c in ("start_ns", "end_ns"))
    if (end < start).any():
        raise TraceFormatError(table, "a range ends before it starts (negative duration)")
    for i, text in enumerate(log.column("attrs").to_pylist()):
        try:
            if not isinstance(json.loads(text), dict):
                raise ValueError
        except (ValueError, TypeError, RecursionError):
            raise TraceFormatError(table, f"row {i}: attrs is not a JSON object") from None
    log_names = log.column("name").to_pylist()
    code = {n: i for i, n in enumerate(dict.fromkeys(log_names))}
    n = log.num_rows
    columns = {
        c: np.full(n, schema.NO_ID, np.int64)
        for c in schema.EVENT_COLUMNS
        if c not in ("kind", "name", "domain", "shapes")
    }
    columns["kind"] = np.full(n, schema.EVENT_KINDS.index(schema.RANGE), np.int64)
    columns["name"] = np.fromiter((code[x] for x in log_names), np.int64, count=n)
    columns["domain"] = columns["shapes"] = np.zeros(n, np.int64)
    for c in ("tid", "start_ns", "dur_ns"):
        columns[c] = log.column(c).to_numpy()
    categories = {"kind": list(schema.EVENT_KINDS), "name": list(code), "domain": [""], "shapes": [""]}
    events = store.coded_table({c: columns[c] for c in schema.EVENT_COLUMNS}, categories)
    cfg = run_config(path) if path.is_dir() else {}
    meta = {"clock": "monotonic_ns", "config": cfg}
    return Trace(str(path), "rangelog", events, rank=rank, meta=meta, range_log=log)
