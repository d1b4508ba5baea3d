"""The micro-batch table (``schema.MICROBATCH_COLUMNS``) of one ingested trace, for the cost model.

Each micro-batch is one occurrence of the micro-batch range:

1. mxperf's ``update/microbatch`` (its attributes carry step, microbatch, tokens, precision, peak memory);
2. else the ranges matching ``--microbatch-range PATTERN`` (a regular expression, full match);
3. else each ``ProfilerStep#N`` (torch.profiler's step; the step number is N).

``seconds`` is the range's wall time; ``gpu_busy_seconds`` the busy union of the GPU work launched in its
window from any thread (autograd launches backward kernels on its own thread); ``host_stall_seconds`` the
device host-stall time inside the window (launch-end rule). Both are null without GPU ops.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from tracing.outputs import schema
from tracing.outputs.labels import Labels

MXPERF_MICROBATCH = "update/microbatch"
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def select_microbatch_ranges(ranges: pd.DataFrame, pattern: str | None = None) -> pd.DataFrame:
    """The rows of a range table that are micro-batches (see the module docstring for the order)."""
    names = ranges["name"].astype(str)
    if pattern:
        rx = re.compile(pattern)
        return ranges[names.map(lambda n: rx.fullmatch(n) is not None).to_numpy(dtype=bool)]
    mine = ranges[names == MXPERF_MICROBATCH]
    if len(mine):
        return mine
    return ranges[names.str.match(_PROFILER_STEP.pattern).to_numpy(dtype=bool)]


def microbatch_table(ranges: pd.DataFrame, labels: Labels, *, pattern: str | None = None) -> pd.DataFrame:
    """One row per micro-batch range; ``labels`` fill what the trace lacks (attributes win where present)."""
    sel = select_microbatch_ranges(ranges, pattern).sort_values("start_ns", kind="stable")
    rows = []
    index_in_step: dict[int, int] = {}
    for i, r in enumerate(sel.itertuples(index=False)):
        attrs = json.loads(r.attrs) if r.attrs else {}
        m = _PROFILER_STEP.match(str(r.name))
        step = int(attrs.get("step", int(m.group(1)) if m else i))
        mb = int(attrs["microbatch"]) if "microbatch" in attrs else index_in_step.get(step, 0)
        index_in_step[step] = mb + 1
        size = labels.tokens_per_microbatch
        tokens = attrs.get("tokens", attrs.get("num_tokens", size))
        busy, stall = r.window_busy_ns, r.host_stall_ns
        rows.append(
            {
                "model": labels.model,
                "precision": str(attrs["precision"]) if "precision" in attrs else labels.precision,
                "phase": labels.phase or (r.phase if r.phase != "other" else "update"),
                "tokens_per_microbatch": size,
                "num_tokens": int(tokens) if tokens is not None else size,
                "repeat": labels.repeat or 0,
                "step": step,
                "microbatch": mb,
                "seconds": r.wall_ns / 1e9,
                "gpu_busy_seconds": None if pd.isna(busy) else busy / 1e9,
                "host_stall_seconds": None if pd.isna(stall) else stall / 1e9,
                "peak_mem_bytes": attrs.get("peak_mem_bytes"),
                "flops": attrs.get("flops"),
                "source": "trace",
            }
        )
    if not rows:
        return schema.empty_frame(schema.MICROBATCH_COLUMNS)
    df = pd.DataFrame(rows, columns=list(schema.MICROBATCH_COLUMNS))
    for col in ("gpu_busy_seconds", "host_stall_seconds", "peak_mem_bytes", "flops"):
        df[col] = pd.array([np.nan if v is None else float(v) for v in df[col]], dtype="Float64")
        df[col] = df[col].mask(df[col].isna(), pd.NA)
    return schema.conform(df, schema.MICROBATCH_COLUMNS, "microbatches")
