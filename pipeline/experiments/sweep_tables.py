"""The sweep's tables, as pure functions: rows -> ``microbatches.parquet``, GPU busy / host stall per micro-batch
from the traced window, and the profiler's own overhead measured on the same cells traced and untraced.

Extra columns beyond the shared contract (``tracing.outputs.schema.MICROBATCH_COLUMNS``): ``global_tokens``
(tokens in the micro-batch's step), ``padded_tokens``, ``achieved_flop_per_s``, ``mfu`` (null: the hardware peak
is never guessed) and ``traced`` (measured while the profiler ran: its wall time includes the profiler's cost).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

NO_GPU_REASON = "CPU-only sweep: no GPU ops, GPU busy and host stall are null"
EXTRA_COLUMNS = {
    "global_tokens": "int64",
    "padded_tokens": "int64",
    "achieved_flop_per_s": "Float64",
    "mfu": "Float64",
    "traced": "bool",
}


def to_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> the ``microbatches.parquet`` table: the shared contract columns, then the extras."""
    from tracing.outputs.schema import MICROBATCH_COLUMNS

    cols = {**MICROBATCH_COLUMNS, **EXTRA_COLUMNS}
    df = pd.DataFrame(list(rows), columns=list(cols))
    for c, t in cols.items():
        if t == "Float64":
            df[c] = pd.array([None if v is None or pd.isna(v) else float(v) for v in df[c]], dtype="Float64")
    return df.astype(cols)


def gpu_columns(df: pd.DataFrame, trace: Any) -> tuple[pd.DataFrame, str]:
    """Fill ``gpu_busy_seconds`` / ``host_stall_seconds`` from a trace's ``update/microbatch`` ranges (pure).

    Rows match on (precision, learner step, micro-batch index), which the traced range names carry
    (``RangeLog(encode_attrs=True)``, as a traced sweep records them). One time basis (docs/contracts.md):
    busy is the device busy union inside the micro-batch's window (first host op -> later of its last host
    op and the end of the last GPU op it launched), so it never exceeds the window; host stall is the
    device's launch-end-rule stall inside the same window. Rows outside the traced window stay null.
    """
    from tracing.analysis import attribution

    if trace.num_gpu_ops == 0:
        return df, "the trace has no GPU ops"
    ranges = attribution.attribute_ranges(trace)
    mb = ranges[ranges["name"].astype(str) == "update/microbatch"]
    busy, stall = {}, {}
    for r in mb.itertuples(index=False):
        a = json.loads(r.attrs) if r.attrs else {}
        key = (str(a.get("precision")), int(a.get("step", -1)), int(a.get("microbatch", -1)))
        busy[key], stall[key] = r.busy_in_window_ns, r.host_stall_ns
    keys = list(zip(df["precision"], df["step"], df["microbatch"], strict=True))
    out = df.copy()
    out["gpu_busy_seconds"] = pd.array([_seconds(busy.get(k)) for k in keys], dtype="Float64")
    out["host_stall_seconds"] = pd.array([_seconds(stall.get(k)) for k in keys], dtype="Float64")
    wanted = [k for k, t in zip(keys, out["traced"], strict=True) if t] if "traced" in out else keys
    found = sum(k in busy for k in wanted)
    if found < len(wanted):
        return out, (
            f"{len(wanted) - found} of {len(wanted)} traced micro-batches have no update/microbatch range "
            "with precision, step and micro-batch in the trace"
        )
    untraced = len(keys) - len(wanted)
    return out, f"{untraced} micro-batches outside the traced window have no GPU columns" if untraced else ""


def _seconds(ns: Any) -> Any:
    return pd.NA if ns is None or pd.isna(ns) else ns / 1e9


def profiler_overhead(df: pd.DataFrame) -> dict[str, Any] | None:
    """Step time under the profiler over step time without it, on the same (precision, size, global batch)
    cells: the median and range of the per-cell ratios of median step seconds (None without both kinds)."""
    if "traced" not in df or not df["traced"].any() or df["traced"].all():
        return None
    keys = ["precision", "tokens_per_microbatch", "global_tokens"]
    steps = df.groupby([*keys, "step", "traced"], as_index=False)["seconds"].sum()
    med = steps.groupby([*keys, "traced"])["seconds"].median().unstack("traced").dropna()
    if med.empty:
        return None
    ratio = med[True] / med[False]
    return {
        "median_ratio": float(ratio.median()),
        "min_ratio": float(ratio.min()),
        "max_ratio": float(ratio.max()),
        "cells": len(ratio),
        "what": "median step seconds traced / untraced per (precision, size, global batch), profiler active",
    }
