"""Seconds per step by the trace's own range names: the step's direct child ranges, per process.

For a trace whose ranges the phase map does not know (``## forward ##`` in a plain training loop) the whole
step is "other"; its own top-level names still say where the time goes. A name's time in a step is the union of
the step's direct children of that name; ``(outside child ranges)`` is the step's wall time none covers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracing.analysis.metrics import measure
from tracing.analysis.steps import numbered_steps
from tracing.outputs import schema

OUTSIDE = "(outside child ranges)"
COLUMNS = ["trace", "rank", "pid", "step", "name", "phase", "seconds"]


def _numbered_steps(ranges: pd.DataFrame) -> pd.DataFrame:
    """The step table's steps (:func:`tracing.analysis.steps.numbered_steps`), with their numbers as ``step_no``."""
    rows, numbers = numbered_steps(schema.from_frame(ranges))
    steps = ranges.iloc[rows].assign(step_no=np.asarray(numbers, np.int64))
    return steps.assign(**{k: steps.get(k) for k in ("trace", "rank")})


def step_children(ranges: pd.DataFrame) -> pd.DataFrame:
    """Long table ``trace, rank, pid, step, name, phase, seconds`` (``phase``: the child's canonical phase)."""
    if ranges.empty or "parent_id" not in ranges:
        return pd.DataFrame(columns=COLUMNS)
    steps = _numbered_steps(ranges)
    if steps.empty:
        return pd.DataFrame(columns=COLUMNS)
    trace_col = ranges["trace"] if "trace" in ranges else pd.Series("", index=ranges.index)
    rows = []
    for st in steps.itertuples(index=False):
        same_trace = (trace_col == st.trace) if "trace" in ranges else True
        kids = ranges[(ranges["parent_id"] == st.range_id) & (ranges["pid"] == st.pid) & same_trace]
        start, end = int(st.start_ns), int(st.end_ns)
        base = {"trace": st.trace, "rank": st.rank, "pid": int(st.pid), "step": int(st.step_no)}
        for (name, phase), grp in kids.groupby(["name", "phase"], sort=False, dropna=False):
            s = grp["start_ns"].clip(lower=start).to_numpy()
            e = grp["end_ns"].clip(upper=end).to_numpy()
            rows.append({**base, "name": str(name), "phase": phase, "seconds": measure(s, e) / 1e9})
        covered = (
            measure(kids["start_ns"].clip(lower=start).to_numpy(), kids["end_ns"].clip(upper=end).to_numpy())
            if len(kids)
            else 0
        )
        rows.append(
            {**base, "name": OUTSIDE, "phase": "other", "seconds": max(end - start - covered, 0) / 1e9}
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def top_names(children: pd.DataFrame, limit: int = 8) -> pd.DataFrame:
    """``step_children`` with all but the ``limit`` names of most total time folded into ``(other ranges)``
    (``OUTSIDE`` is always kept), summed per step and name: small enough to draw as stacked bars."""
    if children.empty:
        return children
    totals = children[children["name"] != OUTSIDE].groupby("name")["seconds"].sum()
    keep = set(totals.sort_values(ascending=False).index[:limit]) | {OUTSIDE}
    named = children.assign(name=np.where(children["name"].isin(keep), children["name"], "(other ranges)"))
    keys = [k for k in ("trace", "rank", "pid", "step", "name") if k in named]
    return named.groupby(keys, dropna=False, as_index=False, sort=False)["seconds"].sum()
