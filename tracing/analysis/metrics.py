"""Per-device GPU metrics (span, busy, idle, host stall), HTA's per-stream breakdown and the GPU ops of an
events frame: pure functions over the engine's tables (:mod:`tracing.analysis.gpu_tables`), times int64 ns.

The rules are docs/tracing.md's ("What is measured"); where several ops start at the end g1 of a gap of the
busy union, the gap's op k is the one whose launch ended first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis import gpu_tables
from tracing.analysis.gpu_tables import KERNEL_WAIT_THRESHOLD_NS, DeviceTimeline
from tracing.analysis.intervals import union_intervals
from tracing.ingest import engine
from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


def gpu_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Kernel/memcpy/memset rows (in table order) with their launch call joined by (pid, correlation):
    ``end_ns``, ``launch_start_ns``, ``launch_end_ns``, ``launch_tid`` (-1 when no launch record)."""
    with engine.session() as con:
        engine.register_frame(con, events)
        gpu_tables.make_ops(con)
        return gpu_tables.ops_frame(con)


def device_timelines(events: pd.DataFrame, ops: pd.DataFrame | None = None) -> list[DeviceTimeline]:
    """One :class:`DeviceTimeline` per (process, device) with GPU ops, in (pid, device) order (``ops``: ignored)."""
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
    with engine.session() as con:
        engine.register_frame(con, events)
        gpu_tables.make_ops(con)
        return engine.frame(
            gpu_tables.stream_rows(con, rule, kernel_wait_threshold_ns), schema.STREAM_COLUMNS
        )


def measure(start: np.ndarray, end: np.ndarray) -> int:
    """|union of [start, end)| in ns."""
    s, e = union_intervals(np.asarray(start, np.int64), np.asarray(end, np.int64))
    return int((e - s).sum())
