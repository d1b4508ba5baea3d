"""Per-range GPU work: which kernels did a range (NVTX, user annotation, range log) cause, and what did they cost?

The rules (``thread_*`` / ``window_*`` through the launch calls, never Kineto's ``gpu_user_annotation``; the
window shared with the micro-batch table, inside which ``busy_in_window_ns`` and ``host_stall_ns`` are
measured) are docs/tracing.md's ("Per range"); :mod:`tracing.analysis.range_tables` computes them in the
engine. With several devices in one process the per-device intervals are merged first (time *some* device
was busy or stalled). A trace without GPU ops leaves all GPU columns null with ``gpu_reason`` set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.analysis import gpu_tables, range_tables
from tracing.analysis.phases import PhaseMap, default_phase_map, range_log_columns
from tracing.analysis.range_tables import (  # noqa: F401 -- the names users and tests import from here
    NO_GPU_REASON,
    RANGELOG_REASON,
    split_encoded_name,
)
from tracing.ingest import engine
from tracing.ingest.trace import Trace
from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

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
    return _ranges(trace, phase_map, gpu=False)[list(_FRAME_COLUMNS)]


def attribute_ranges(
    trace: Trace,
    phase_map: PhaseMap | None = None,
    *,
    ops: pd.DataFrame | None = None,
    timelines: list[gpu_tables.DeviceTimeline] | None = None,
) -> pd.DataFrame:
    """The range table (``schema.RANGE_COLUMNS`` without trace/rank) with GPU work attributed (``ops`` /
    ``timelines``: ignored, the engine joins the launches itself)."""
    return _ranges(trace, phase_map, gpu=True)


def _ranges(trace: Trace, phase_map: PhaseMap | None, gpu: bool) -> pd.DataFrame:
    phase_map = phase_map or default_phase_map()
    if trace.range_log is not None:
        return range_log_frame(trace, phase_map)
    with engine.session() as con:
        engine.register_frame(con, trace.events)
        num_ops = gpu_tables.make_ops(con) if gpu else 0
        range_tables.make_ranges(con)
        return engine.frame(
            range_tables.range_table(con, phase_map, _source(trace), num_ops), schema.RANGE_COLUMNS
        )


def _source(trace: Trace) -> str:
    return "nvtx" if trace.format == "nsys" else "user_annotation"


def range_log_frame(trace: Trace, phase_map: PhaseMap | None = None) -> pd.DataFrame:
    """An mxperf range log's range table (no GPU columns: its clock is the host's)."""
    return schema.to_frame(range_log_table(trace, phase_map))


def range_log_table(trace: Trace, phase_map: PhaseMap | None = None) -> pa.Table:
    """:func:`range_log_frame` as an Arrow table (``schema.RANGE_COLUMNS`` but trace / rank)."""
    log = trace.range_log if schema.is_arrow(trace.range_log) else schema.from_frame(trace.range_log)
    cols = range_log_columns(log, phase_map or default_phase_map())
    cols.update(time_ns=cols["wall_ns"], gpu_reason=RANGELOG_REASON)
    for c in engine.own_columns(schema.RANGE_COLUMNS):
        cols.setdefault(c, None)  # GPU columns: null
    return schema.make_table(cols, engine.own_columns(schema.RANGE_COLUMNS), "ranges")
