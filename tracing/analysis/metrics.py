"""Per-device GPU metrics: span, busy, idle, and how much of the idle time the GPU waited for the host.

All functions are pure: event tables in, new tables out. Times are int64 ns.

Busy and idle (per process and device, over [first GPU op start, last GPU op end])::

    stream 7   |==k1==|      |=k3=|
    stream 13      |===k2===|          |=k4=|
    union      |============|  |=====| gap |=|      busy = |union|, idle = span - busy
               ^ first                       ^ last

Only kernels, memcpys and memsets count (not cuda_sync, not gpu_user_annotation); ops that overlap on one
stream (programmatic dependent launch) are counted once by the union.

Host stall, the **launch-end rule** (docs/contracts.md; the default here)::

    host   ..[launch k]......                   L_end(k): the launch call returned
    GPU    ==k-1==|     gap      |==k==
                  g0          g1
    stall = max(0, min(g1, L_end(k)) - g0)

For each gap [g0, g1) of the busy union, k is the op that starts at g1 (the one whose launch ended first,
if several do). The GPU cannot start k before its launch call returns, so the part of the gap before
``L_end(k)`` is time the device waited for the host. A k without a launch record contributes 0 and its gap
counts as ``unattributed``; ``other_idle = idle - host_stall`` (the device waited on something else: a
dependency, a sync, a copy engine). ``host_stall_ambiguous`` is the stalled part of gaps whose launch call had
already *started* before g0: the host was in the launch call when the GPU ran dry.

HTA's per-stream rule (:func:`stream_breakdown`, for comparison with Holistic Trace Analysis)::

    stream s   ==k-1==|        gap       |==k==
    host              ^ prev_end   [launch k]     host_wait   if L_start(k) > prev_end
                                                  kernel_wait elif gap < 30 us
                                                  other       otherwise

HTA looks at one stream at a time, so a stream that sits unused while others work piles up "idle", and it
uses the *start* of the launch call (``rule="start"``); ``rule="end"`` uses its end instead.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis import gpu_tables
from tracing.analysis.gpu_tables import KERNEL_WAIT_THRESHOLD_NS, DeviceTimeline
from tracing.ingest import engine
from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = [
    "KERNEL_WAIT_THRESHOLD_NS",
    "DeviceTimeline",
    "device_metrics",
    "device_timelines",
    "gpu_ops",
    "measure",
    "stream_breakdown",
    "union_intervals",
]


def gpu_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Kernel/memcpy/memset rows (in table order) with their launch call joined by (pid, correlation):
    ``end_ns``, ``launch_start_ns``, ``launch_end_ns``, ``launch_tid`` (-1 when no launch record)."""
    with engine.session() as con:
        engine.register_frame(con, events)
        gpu_tables.make_ops(con)
        return gpu_tables.ops_frame(con)


def device_timelines(events: pd.DataFrame, ops: pd.DataFrame | None = None) -> list[DeviceTimeline]:
    """One :class:`DeviceTimeline` per (process, device) with GPU ops, in (pid, device) order. (``ops`` is
    accepted for older callers; the engine joins the launches itself.)"""
    with engine.session() as con:
        engine.register_frame(con, events)
        gpu_tables.make_ops(con)
        return gpu_tables.device_timelines(con)


def device_metrics(events: pd.DataFrame, timelines: list[DeviceTimeline] | None = None) -> pd.DataFrame:
    """Per (process, device): span, busy, idle, host stall (launch-end rule), unattributed, counts, and
    the device seen by every process of the trace (:mod:`tracing.analysis.colocated`).

    A trace without GPU ops gives zero rows (GPU metrics are then null with a reason, never a CPU stand-in).
    """
    import pandas as pd

    timelines = device_timelines(events) if timelines is None else timelines
    rows = _device_rows(timelines)
    cols = engine.own_columns(schema.DEVICE_COLUMNS)
    if not rows:
        return schema.empty_frame(cols)
    return pd.DataFrame(rows, columns=list(cols))


def device_table(timelines: list[DeviceTimeline]) -> pa.Table:
    """:func:`device_metrics` of a trace's timelines as an Arrow table (``schema.DEVICE_COLUMNS`` but trace /
    format / rank)."""
    rows = _device_rows(timelines)
    cols = engine.own_columns(schema.DEVICE_COLUMNS)
    return schema.make_table({c: [r[c] for r in rows] for c in cols}, cols, "devices")


def _device_rows(timelines: list[DeviceTimeline]) -> list[dict[str, float | int]]:
    from tracing.analysis.colocated import shared_device_time  # it builds on the timelines

    shared = shared_device_time(timelines)  # processes of this trace that share a device
    return [{**t.row, **s} for t, s in zip(timelines, shared, strict=True)]


def stream_breakdown(
    events: pd.DataFrame,
    *,
    rule: str = "start",
    kernel_wait_threshold_ns: int = KERNEL_WAIT_THRESHOLD_NS,
    ops: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """HTA's idle-time breakdown per (process, device, stream): host_wait / kernel_wait / other.

    ``rule="start"`` is HTA's test (launch call *started* after the previous op ended); ``"end"`` tests the
    launch call's end. Gaps between consecutive ops on a stream are taken in start order (as HTA does);
    negative gaps (same-stream overlap) are clamped to 0 and counted in ``negative_gaps``.
    """
    if rule not in ("start", "end"):
        raise ValueError(f"rule must be 'start' or 'end', got {rule!r}")
    with engine.session() as con:
        engine.register_frame(con, events)
        gpu_tables.make_ops(con)
        return engine.frame(
            gpu_tables.stream_rows(con, rule, kernel_wait_threshold_ns), schema.STREAM_COLUMNS
        )


def union_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the union of [start, end) (touching intervals merge)."""
    if len(start) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], run_end[last]


def measure(start: np.ndarray, end: np.ndarray) -> int:
    """|union of [start, end)| in ns."""
    s, e = union_intervals(np.asarray(start, np.int64), np.asarray(end, np.int64))
    return int((e - s).sum())


def runs(*keys: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of equal key tuples in arrays sorted by those keys."""
    n = len(keys[0])
    if n == 0:
        return []
    new = np.zeros(n, bool)
    new[0] = True
    for k in keys:
        new[1:] |= k[1:] != k[:-1]
    bounds = np.append(np.flatnonzero(new), n).tolist()
    return list(itertools.pairwise(bounds))
