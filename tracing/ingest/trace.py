"""The in-memory result of ingesting one trace file: its event table plus what the file says about itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracing.outputs import schema

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass
class Trace:
    """One ingested file. ``events`` follows ``schema.EVENT_COLUMNS``; ``meta`` is JSON-able."""

    path: str
    format: str  # kineto | nsys | rangelog
    events: pd.DataFrame
    rank: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    range_log: pd.DataFrame | None = None  # mxperf range log (format "rangelog" only)

    def of_kind(self, *kinds: str) -> pd.DataFrame:
        return self.events[self.events["kind"].isin(kinds)]

    @property
    def num_gpu_ops(self) -> int:
        return int(self.events["kind"].isin(schema.GPU_OP_KINDS).sum())


def rank_from_name(path: str | Path) -> int | None:
    """``rank-3.json.gz`` / ``trace_rank3.json`` -> 3; None when the name carries no rank."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def events_frame(
    columns: dict[str, Any],
    names: list[str],
    kinds: list[str],
    domains: list[str],
    shapes: list[str] | None = None,
) -> pd.DataFrame:
    """Build the event table from int64 arrays and category codes (``name``/``kind``/``domain`` are codes).

    ``shapes`` are the categories of the ``shapes`` codes (code 0 must be ""); without it every row is "".
    """
    data: dict[str, Any] = {}
    for col, dtype in schema.EVENT_COLUMNS.items():
        if col == "shapes":
            n = len(data["name"])
            codes = columns.get("shapes") if shapes is not None else None
            codes = np.zeros(n, np.int32) if codes is None else np.maximum(np.asarray(codes), 0)
            data[col] = pd.Categorical.from_codes(codes.astype(np.int32), categories=shapes or [""])
        elif col == "name":
            data[col] = pd.Categorical.from_codes(
                np.asarray(columns["name"], dtype=np.int32), categories=names
            )
        elif col == "kind":
            codes = np.asarray(columns["kind"], dtype=np.int8)
            data[col] = pd.Categorical.from_codes(codes, categories=kinds)
        elif col == "domain":
            codes = np.asarray(columns.get("domain", np.zeros(len(data["name"]), np.int32)), dtype=np.int32)
            data[col] = pd.Categorical.from_codes(codes, categories=domains)
        else:
            data[col] = np.asarray(columns[col], dtype=np.int64)
        assert dtype in ("category", "int64")
    return pd.DataFrame(data, copy=False)
