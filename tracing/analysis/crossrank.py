"""Across the ranks of one trace set: which rank each step waited for, and how far apart the ranks' GPUs are.

Inputs are the per-rank tables an ingest already holds (``schema.DEVICE_COLUMNS``, ``schema.STEP_COLUMNS``,
one row per rank, process and device / step and phase); outputs are small (one row per step, one per device
index), so a 256-rank set costs no more memory here than its device and step rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracing.analysis import ranks
from tracing.outputs import schema


def cross_rank_tables(devices: pd.DataFrame, steps: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Tables across the ranks of one ingest (empty dict with fewer than two ranks): ``stragglers`` (the
    slowest rank of each step, ``schema.STRAGGLER_COLUMNS``) and ``rank_spread`` (busy and host stall across
    the ranks using each device index, ``schema.RANK_SPREAD_COLUMNS``)."""
    ranked = devices[devices["rank"].notna()] if len(devices) else devices
    if len(ranked) == 0 or ranked["rank"].nunique() < 2:
        return {}
    out: dict[str, pd.DataFrame] = {}
    trace_steps = steps[steps["rank"].notna()] if len(steps) else steps
    if len(trace_steps):
        slow = ranks.stragglers(trace_steps)
        label_rank = dict(
            zip(ranks.process_labels(trace_steps), trace_steps["rank"].astype("Int64").tolist(), strict=True)
        )
        slow["slowest_rank"] = pd.array([label_rank.get(x) for x in slow["slowest"]], dtype="Int64")
        slow["fastest_rank"] = pd.array([label_rank.get(x) for x in slow["fastest"]], dtype="Int64")
        out["stragglers"] = schema.conform(slow, schema.STRAGGLER_COLUMNS, "stragglers")
    rows = []
    for device, g in ranked.groupby("device", sort=True):
        busy, stall = g["busy_ns"].to_numpy("int64"), g["host_stall_ns"].to_numpy("int64")
        rank_of = g["rank"].to_numpy()
        rows.append(
            {
                "device": int(device),
                "processes": len(g),
                "busy_min_ns": int(busy.min()),
                "busy_median_ns": float(np.median(busy)),
                "busy_max_ns": int(busy.max()),
                "busy_spread_pct": 100 * (busy.max() / busy.min() - 1) if busy.min() > 0 else np.nan,
                "least_busy_rank": rank_of[busy.argmin()],
                "most_busy_rank": rank_of[busy.argmax()],
                "host_stall_median_ns": float(np.median(stall)),
                "host_stall_max_ns": int(stall.max()),
                "most_stalled_rank": rank_of[stall.argmax()],
            }
        )
    out["rank_spread"] = schema.conform(pd.DataFrame(rows), schema.RANK_SPREAD_COLUMNS, "rank_spread")
    return out
