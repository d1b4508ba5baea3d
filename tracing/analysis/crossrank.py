"""Across the ranks of one trace set: which rank each step waited for, and how far apart the ranks' GPUs are.

Inputs are an ingest's device and step tables (Arrow); outputs are small (one row per step, one per device
index). The straggler rule is written once, in :func:`tracing.analysis.ranks.straggler_table`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis.gpu_tables import stall_unmeasured
from tracing.analysis.ranks import straggler_table
from tracing.analysis.steps import merge_process_files
from tracing.outputs import schema

if TYPE_CHECKING:
    import pyarrow as pa


def cross_rank_tables(devices: pa.Table, steps: pa.Table) -> dict[str, pa.Table]:
    """Tables across the ranks of one ingest (empty dict with fewer than two ranks): ``stragglers`` (the
    slowest rank of each step, ``schema.STRAGGLER_COLUMNS``) and ``rank_spread`` (busy and host stall across
    the ranks using each device index, ``schema.RANK_SPREAD_COLUMNS``)."""
    ranked = schema.rows_where(devices, [r is not None for r in devices.column("rank").to_pylist()])
    if len({r for r in ranked.column("rank").to_pylist()}) < 2:
        return {}
    out: dict[str, pa.Table] = {}
    trace_steps = schema.rows_where(steps, [r is not None for r in steps.column("rank").to_pylist()])
    trace_steps = merge_process_files(trace_steps)  # a process's files (a file per stage) as one process
    if trace_steps.num_rows:
        out["stragglers"] = straggler_table(trace_steps)
    rows = []
    rank_all = ranked.column("rank").to_numpy()
    device_all = ranked.column("device").to_numpy()
    busy_all, stall_all = (ranked.column(c).to_numpy().astype(np.int64) for c in ("busy_ns", "host_stall_ns"))
    # a rank whose host stall is not measured (no launch calls) is left out of the host-stall columns
    gauged = ~np.asarray(
        stall_unmeasured(*(ranked.column(c).to_numpy() for c in ("unattributed_ns", "idle_ns", "span_ns"))),
        bool,
    ).reshape(-1)
    for device in sorted(set(device_all.tolist())):
        mine = device_all == device
        busy, rank_of = busy_all[mine], rank_all[mine]
        stall, stall_rank = stall_all[mine & gauged], rank_all[mine & gauged]
        rows.append(
            {
                "device": int(device),
                "processes": int(mine.sum()),
                "busy_min_ns": int(busy.min()),
                "busy_median_ns": float(np.median(busy)),
                "busy_max_ns": int(busy.max()),
                "busy_spread_pct": 100 * (busy.max() / busy.min() - 1) if busy.min() > 0 else math.nan,
                "least_busy_rank": int(rank_of[busy.argmin()]),
                "most_busy_rank": int(rank_of[busy.argmax()]),
                "host_stall_median_ns": float(np.median(stall)) if len(stall) else math.nan,
                "host_stall_max_ns": int(stall.max()) if len(stall) else None,
                "most_stalled_rank": int(stall_rank[stall.argmax()]) if len(stall) else None,
            }
        )
    out["rank_spread"] = _table(rows, schema.RANK_SPREAD_COLUMNS, "rank_spread")
    return out


def _table(rows: list[dict[str, Any]], columns: dict[str, str], name: str) -> pa.Table:
    return schema.make_table({c: [r[c] for r in rows] for c in columns}, columns, name)
