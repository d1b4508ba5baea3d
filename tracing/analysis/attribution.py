"""Per-range GPU work: which kernels did a range (NVTX, user annotation, range log) cause, and what did they cost?

A range is a host-side interval [start, end] on one thread. GPU work is attributed through the launch calls,
by correlation id, two ways (never through Kineto's ``gpu_user_annotation``, which is a per-stream span
of the ops whose *innermost* annotation on the *launching thread* is that range):

- ``thread_*``: ops whose launch call started inside the range **on the same thread** (Nsight's
  ``nvtx_gpu_proj_trace`` rule);
- ``window_*``: ops whose launch call started inside the range's time window **on any thread of the
  process** -- autograd runs backward on its own thread, so ``## backward ##`` launches almost nothing
  itself.

For each: the op count, ``busy`` (|union| of the ops' intervals, which may run after the range ended) and
``span`` (first op start -> last op end).

One time basis (docs/contracts.md, v2), shared with the micro-batch table: a range's **window** runs from its start to the
later of its end and ``gpu_end_ns``, the end of the last GPU op launched inside it (``window_*`` rule);
``time_ns`` is its length. GPU work launched in a range runs asynchronously, often after the host moved on,
so host wall time alone (``wall_ns``) can be far shorter than the work it caused. Two columns measured
inside the window obey time conservation -- each is at most ``time_ns``, and so is their sum, since stalls
lie in gaps of the busy union::

    host   [== range ==]                  wall_ns
    GPU         |==k1==|    |===k2===|    (launched inside the range)
           [============ window ========] time_ns = max(end, gpu_end) - start

- ``busy_in_window_ns``: the device busy union inside the window;
- ``host_stall_ns``: the device host-stall intervals (launch-end rule, ``metrics.py``) inside the window.

With several devices in one process the per-device intervals are merged first (time *some* device was busy
or stalled). A trace without GPU ops leaves all GPU columns null with ``gpu_reason`` set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tracing.analysis import engine, gpu_tables, intervals, metrics, range_tables
from tracing.analysis.phases import PhaseMap, default_phase_map
from tracing.analysis.range_tables import (  # noqa: F401 -- the names users and tests import from here
    NO_GPU_REASON,
    RANGELOG_REASON,
    NameValues,
    Nesting,
    split_encoded_name,
)
from tracing.ingest.trace import Trace
from tracing.outputs import schema

_FRAME_COLUMNS = (
    "source",
    "range_id",
    "parent_id",
    "depth",
    "name",
    "domain",
    "pid",
    "tid",
    "start_ns",
    "end_ns",
    "attrs",
    "wall_ns",
    "phase",
)


def range_frame(trace: Trace, phase_map: PhaseMap | None = None) -> pd.DataFrame:
    """The ranges of a trace with nesting (parent_id, depth) and canonical phase; no GPU columns yet."""
    phase_map = phase_map or default_phase_map()
    if trace.range_log is not None:
        table = _frame(_range_log_columns(trace.range_log, phase_map), RANGELOG_REASON)
    else:
        with engine.session() as con:
            engine.register_frame(con, trace.events)
            range_tables.make_ranges(con)
            table = engine.frame(
                range_tables.range_table(con, phase_map, _source(trace), 0), schema.RANGE_COLUMNS
            )
    return table[list(_FRAME_COLUMNS)]


def attribute_ranges(
    trace: Trace,
    phase_map: PhaseMap | None = None,
    *,
    ops: pd.DataFrame | None = None,
    timelines: list[metrics.DeviceTimeline] | None = None,
) -> pd.DataFrame:
    """The range table (``schema.RANGE_COLUMNS`` without trace/rank) with GPU work attributed (computed in the
    engine, :mod:`tracing.analysis.range_tables`; ``ops`` / ``timelines`` are accepted for older callers)."""
    phase_map = phase_map or default_phase_map()
    if trace.range_log is not None:
        return _frame(_range_log_columns(trace.range_log, phase_map), RANGELOG_REASON)
    with engine.session() as con:
        engine.register_frame(con, trace.events)
        num_ops = gpu_tables.make_ops(con)
        range_tables.make_ranges(con)
        return engine.frame(
            range_tables.range_table(con, phase_map, _source(trace), num_ops), schema.RANGE_COLUMNS
        )


def _source(trace: Trace) -> str:
    return "nvtx" if trace.format == "nsys" else "user_annotation"


def range_log_frame(trace: Trace, phase_map: PhaseMap | None = None) -> pd.DataFrame:
    """An mxperf range log's range table (no GPU columns: its clock is the host's)."""
    return _frame(_range_log_columns(trace.range_log, phase_map or default_phase_map()), RANGELOG_REASON)


def _range_log_columns(log: pd.DataFrame, phase_map: PhaseMap) -> dict[str, Any]:
    """mxperf's range log as range columns (its own ids, nesting and attributes)."""
    names = log["name"].astype(str).tolist()
    phases = {n: phase_map.phase_of(n) for n in set(names)}
    start = log["start_ns"].to_numpy(np.int64)
    end = log["end_ns"].to_numpy(np.int64)
    return {
        "source": ["rangelog"] * len(log),
        "range_id": log["range_id"].to_numpy(np.int64),
        "parent_id": log["parent_id"].to_numpy(np.int64),
        "depth": log["depth"].to_numpy(np.int64),
        "name": names,
        "domain": [""] * len(log),
        "phase": [phases[n] for n in names],
        "pid": np.full(len(log), schema.NO_ID, np.int64),
        "tid": log["tid"].to_numpy(np.int64),
        "start_ns": start,
        "end_ns": end,
        "wall_ns": end - start,
        "attrs": log["attrs"].astype(str).tolist(),
    }


def _frame(cols: dict[str, Any], gpu_reason: str) -> pd.DataFrame:
    """The range table of a range log from its columns; GPU columns null, ``gpu_reason`` set."""
    n = len(cols["start_ns"])
    data: dict[str, Any] = {}
    cols["time_ns"] = cols["wall_ns"]
    for c, dtype in schema.RANGE_COLUMNS.items():
        if c in ("trace", "rank"):
            continue
        if c == "gpu_reason":
            data[c] = pd.array([gpu_reason] * n, dtype=dtype)
        elif c not in cols:
            data[c] = pd.array([pd.NA] * n, dtype=dtype)
        elif dtype == "int64":
            data[c] = np.asarray(cols[c], np.int64)
        else:
            data[c] = pd.array(cols[c], dtype=dtype)
    return pd.DataFrame(data, copy=False)


def clipped_device_time(
    pid: np.ndarray, start: np.ndarray, end: np.ndarray, timelines: list[metrics.DeviceTimeline]
) -> tuple[np.ndarray, np.ndarray]:
    """Per window [start, end) of process ``pid`` (in any order): its devices' busy union and host stall inside
    it (ns) (``tracing.analysis.intervals``)."""
    pid, start, end = np.asarray(pid, np.int64), np.asarray(start), np.asarray(end)
    busy = np.zeros(len(pid), np.int64)
    stall = np.zeros(len(pid), np.int64)
    for p in np.unique(pid).tolist():
        idx = np.flatnonzero(pid == p)
        mine = [t for t in timelines if t.pid == p]
        lo, hi = start[idx], end[idx]
        busy[idx] = intervals.clipped([t.busy.blocks() for t in mine], lo, hi)
        stall[idx] = intervals.clipped([t.stall.blocks() for t in mine], lo, hi)
    return busy, stall
