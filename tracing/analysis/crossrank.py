"""Across the ranks of one trace set: which rank each step waited for, and how far apart the ranks' GPUs are.

Inputs are an ingest's device and step tables (Arrow); outputs are small (one row per step, one per device
index). The rules are :func:`tracing.analysis.ranks.stragglers`' (its notebook twin on pandas frames).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis.ranks import ident_labels
from tracing.analysis.steps import kahan_sum
from tracing.outputs import schema

if TYPE_CHECKING:
    import pyarrow as pa


def cross_rank_tables(devices: pa.Table, steps: pa.Table) -> dict[str, pa.Table]:
    """Tables across the ranks of one ingest (empty dict with fewer than two ranks): ``stragglers`` (the
    slowest rank of each step, ``schema.STRAGGLER_COLUMNS``) and ``rank_spread`` (busy and host stall across
    the ranks using each device index, ``schema.RANK_SPREAD_COLUMNS``)."""
    ranked = devices.filter(devices.column("rank").is_valid())
    if len({r for r in ranked.column("rank").to_pylist()}) < 2:
        return {}
    out: dict[str, pa.Table] = {}
    trace_steps = steps.filter(steps.column("rank").is_valid())
    if trace_steps.num_rows:
        out["stragglers"] = _stragglers(trace_steps)
    rows = []
    rank_all = ranked.column("rank").to_numpy()
    device_all = ranked.column("device").to_numpy()
    busy_all, stall_all = (ranked.column(c).to_numpy().astype(np.int64) for c in ("busy_ns", "host_stall_ns"))
    for device in sorted(set(device_all.tolist())):
        mine = device_all == device
        busy, stall, rank_of = busy_all[mine], stall_all[mine], rank_all[mine]
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
                "host_stall_median_ns": float(np.median(stall)),
                "host_stall_max_ns": int(stall.max()),
                "most_stalled_rank": int(rank_of[stall.argmax()]),
            }
        )
    out["rank_spread"] = _table(rows, schema.RANK_SPREAD_COLUMNS, "rank_spread")
    return out


def _table(rows: list[dict[str, Any]], columns: dict[str, str], name: str) -> pa.Table:
    return schema.make_table({c: [r[c] for r in rows] for c in columns}, columns, name)


def _stragglers(steps: pa.Table) -> pa.Table:
    """One row per step: the slowest and fastest process, the median, and the slowest one's lag (each
    process's step: the sum of its phases); ties go to the lowest rank number."""
    trace, rank, pid, step, seconds = (
        steps.column(c).to_pylist() for c in ("trace", "rank", "pid", "step", "seconds")
    )
    sums: dict[tuple[Any, ...], list[float]] = {}  # (trace, rank, pid, step) -> its phases' seconds
    for key, s in zip(zip(trace, rank, pid, step, strict=True), seconds, strict=True):
        sums.setdefault(key, []).append(s)
    # processes by rank number, then pid, then path: never by the path as text ("rank-127" < "rank-27")
    keys = sorted(sums, key=lambda k: (k[1], k[2], k[0], k[3]))
    idents = list(dict.fromkeys((k[0], k[1], k[2]) for k in keys))
    label = dict(
        zip(idents, ident_labels([{"trace": t, "rank": r, "pid": p} for t, r, p in idents]), strict=True)
    )
    rows = []
    for s in sorted({k[3] for k in keys}):
        grp = [(label[k[:3]], k[1], kahan_sum(sums[k])) for k in keys if k[3] == s]
        secs = [g[2] for g in grp]
        slow = grp[int(np.argmax(secs))]
        fast = grp[int(np.argmin(secs))]
        med = float(np.median(secs))
        rows.append(
            {
                "step": int(s),
                "processes": len(grp),
                "slowest": slow[0],
                "slowest_rank": slow[1],
                "slowest_seconds": float(slow[2]),
                "fastest": fast[0],
                "fastest_rank": fast[1],
                "fastest_seconds": float(fast[2]),
                "median_seconds": med,
                "lag_seconds": float(slow[2]) - med,
                "spread_pct": 100 * (float(slow[2]) / float(fast[2]) - 1) if fast[2] > 0 else math.nan,
                "job_seconds": float(slow[2]),
            }
        )
    return _table(rows, schema.STRAGGLER_COLUMNS, "stragglers")
