"""The Host stall timeline: GPU-state bars and ranges of a time window, the windows worth offering.

Pure functions over ``tracing.analysis.metrics.DeviceTimeline`` objects and range tables (no Streamlit, no
files): busy and host-stall intervals clipped to a window, shares per lane, ranges to draw above them, and
the windows a trace offers (its steps, else phase ranges, else equal slices; never op-level ranges).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd


def timeline_intervals(timelines: Sequence[Any], t0_ns: int, t1_ns: int, rank: object = None) -> pd.DataFrame:
    """Bars for :func:`dashboards.charts_gpu.timeline_figure` from ``tracing.analysis.metrics.DeviceTimeline`` objects.

    Per device lane, clipped to the window [t0, t1): one ``idle`` bar over the device's active span (drawn
    underneath), the busy-union intervals and the host-stall intervals on top; times in ms from t0.
    """
    rows: list[tuple[str, str, float, float]] = []
    for tl in timelines:
        lane = f"GPU {tl.device} · " + (f"rank {rank}" if rank is not None else f"pid {tl.pid}")
        first, last = int(tl.row["first_ns"]), int(tl.row["last_ns"])
        lo, hi = max(first, t0_ns), min(last, t1_ns)
        if hi <= lo:
            continue
        rows.append((lane, "idle", lo, hi))
        for state, s, e in (
            ("busy", *tl.busy.arrays()),
            ("host stall", *tl.stall.arrays()),
        ):
            s, e = np.clip(np.asarray(s), lo, hi), np.clip(np.asarray(e), lo, hi)
            keep = e > s
            rows.extend((lane, state, int(a), int(b)) for a, b in zip(s[keep], e[keep], strict=True))
    df = pd.DataFrame(rows, columns=["lane", "state", "start_ns", "end_ns"])
    return pd.DataFrame(
        {
            "lane": df["lane"],
            "state": df["state"],
            "start_ms": (df["start_ns"] - t0_ns) / 1e6,
            "end_ms": (df["end_ns"] - t0_ns) / 1e6,
        }
    )


def window_shares(intervals: pd.DataFrame) -> pd.DataFrame:
    """Per lane in the window: busy, host-stall and other-idle shares (%) of the device's active span."""
    dur = intervals.assign(ms=intervals["end_ms"] - intervals["start_ms"])
    wide = dur.pivot_table(index="lane", columns="state", values="ms", aggfunc="sum").reindex(
        columns=["idle", "busy", "host stall"], fill_value=0.0
    )
    wide = wide.fillna(0.0)
    span = wide["idle"]
    out = pd.DataFrame(
        {
            "span ms": span,
            "busy %": 100 * wide["busy"] / span,
            "host stall %": 100 * wide["host stall"] / span,
            "other idle %": 100 * (span - wide["busy"] - wide["host stall"]) / span,
        }
    )
    return out.round(2).reset_index()


def window_ranges(
    ranges: pd.DataFrame, t0_ns: int, t1_ns: int, max_depth: int = 2, max_bars: int = 300
) -> pd.DataFrame:
    """Ranges overlapping the window (depth <= max_depth), clipped, in ms from t0.

    Only ranges covering at least 0.2 % of the window, and at most ``max_bars`` of the longest, are kept: an
    Nsight trace of PyTorch ops has tens of thousands of NVTX ranges, unreadable (and slow) as bars.
    """
    sel = ranges[(ranges["end_ns"] > t0_ns) & (ranges["start_ns"] < t1_ns) & (ranges["depth"] <= max_depth)]
    start, end = sel["start_ns"].clip(lower=t0_ns), sel["end_ns"].clip(upper=t1_ns)
    keep = (end - start) >= 0.002 * max(t1_ns - t0_ns, 1)
    sel, start, end = sel[keep], start[keep], end[keep]
    longest = (end - start).sort_values(ascending=False, kind="stable").index[:max_bars]
    sel, start, end = sel.loc[longest], start.loc[longest], end.loc[longest]
    out = pd.DataFrame(
        {
            "name": sel["name"].astype(str),
            "depth": sel["depth"].astype(int),
            "start_ms": (start - t0_ns) / 1e6,
            "end_ms": (end - t0_ns) / 1e6,
        }
    )
    return out.sort_values(["depth", "start_ms"], kind="stable").reset_index(drop=True)


_OP_SUFFIX = re.compile(r",\s*(?:seq|op_id|sizes)\s*=.*$")


def short_name(name: str) -> str:
    """A range name without ``emit_nvtx``'s ``, seq = N, op_id = M, sizes = [...]`` tail."""
    return _OP_SUFFIX.sub("", str(name))


def step_mask(ranges: pd.DataFrame) -> np.ndarray:
    """The rows of ``ranges`` that are the step table's steps (``tracing.analysis.steps.numbered_steps``:
    ``ProfilerStep#N``, ``step``, phase ``step``; a step range inside another of its process is the same step)."""
    from tracing.analysis import steps
    from tracing.outputs import schema

    mask = np.zeros(len(ranges), bool)
    if not len(ranges):
        return mask
    cols = [c for c in ("trace", "name", "phase", "pid", "start_ns", "end_ns", "attrs") if c in ranges]
    frame = ranges[cols].reset_index(drop=True)
    if "pid" not in frame:  # one process
        frame = frame.assign(pid=-1)
    kept, _ = steps.numbered_steps(schema.from_frame(frame))
    mask[kept] = True
    return mask


def window_choices(
    ranges: pd.DataFrame | None, first_ns: int, last_ns: int, limit: int = 50, slices: int = 10
) -> dict[str, tuple[int, int]]:
    """Time windows worth looking at: the whole trace, then its steps (``ProfilerStep#N``, mxperf ``step``
    or phase ``step``), else ranges of a canonical phase, else ``slices`` equal slices of the trace.

    Labels give the start relative to the first GPU op (never negative: a window opening before it reads
    0.0 ms) and the length; op-level ranges (``aten::to, op_id = ...``) are never offered as windows."""
    choices = {"whole trace": (first_ns, last_ns)}
    picked = pd.DataFrame()
    if ranges is not None and not ranges.empty:
        live = ranges[(ranges["end_ns"] > first_ns) & (ranges["start_ns"] < last_ns)]
        phase = live["phase"].astype(str) if "phase" in live else pd.Series("", index=live.index)
        for mask in (step_mask(live), ~phase.isin(["", "other", "<NA>"]).to_numpy(dtype=bool)):
            picked = live[mask]
            if len(picked):
                break
    if len(picked):
        for r in picked.sort_values("start_ns").head(limit).itertuples():
            at = max(r.start_ns - first_ns, 0) / 1e6
            label = f"{short_name(r.name)} @ {at:,.1f} ms ({(r.end_ns - r.start_ns) / 1e6:,.1f} ms long)"
            choices[label if label not in choices else f"{label} #{r.Index}"] = (
                int(r.start_ns),
                int(r.end_ns),
            )
        return choices
    edges = np.linspace(first_ns, last_ns, slices + 1).astype("int64")
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        choices[f"slice {i + 1}/{slices}: {(a - first_ns) / 1e6:,.1f} – {(b - first_ns) / 1e6:,.1f} ms"] = (
            int(a),
            int(b),
        )
    return choices


def bands(
    ranges: pd.DataFrame | None, microbatches: pd.DataFrame | None, t0_ns: int, t1_ns: int, limit: int = 300
) -> pd.DataFrame:
    """Bands above the tracks for the window: ``band`` (steps, phases, micro-batches), ``label``, start, end (ns).

    Steps: ``ProfilerStep#N`` / mxperf ``step`` ranges. Phases: ranges of a canonical phase, else (a trace
    whose ranges map to no RL phase) each step's direct child ranges (``## forward ##`` ...). Micro-batches:
    ``microbatches.parquet`` rows with a start and end. At most ``limit`` of each, the longest."""
    rows: list[pd.DataFrame] = []
    if ranges is not None and not ranges.empty:
        phase = ranges["phase"].astype(str) if "phase" in ranges else pd.Series("", index=ranges.index)
        steps = ranges[step_mask(ranges)]
        rows.append(steps.assign(band="steps", label=steps["name"].astype(str)))
        canon = ~phase.isin(["", "other", "step", "<NA>", "None"]).to_numpy(dtype=bool)
        if canon.any():
            ph = ranges[canon]
            rows.append(
                ph.assign(band="phases", label=ph["phase"].astype(str) + ": " + ph["name"].astype(str))
            )
        elif len(steps) and "parent_id" in ranges:
            kids = ranges[ranges["parent_id"].isin(steps["range_id"]).to_numpy(dtype=bool)]
            rows.append(kids.assign(band="phases", label=kids["name"].astype(str)))
    if microbatches is not None and not microbatches.empty and {"start_ns", "end_ns"} <= set(microbatches):
        mb = microbatches.dropna(subset=["start_ns", "end_ns"])
        label = (
            "micro-batch "
            + mb["microbatch"].astype(str)
            + " · "
            + mb["phase"].astype(str)
            + " · "
            + mb["tokens_per_microbatch"].astype(str)
            + " tokens"
        )
        rows.append(mb.assign(band="micro-batches", label=label))
    if not rows:
        return pd.DataFrame(columns=["band", "label", "start_ns", "end_ns"])
    out = pd.concat([r[["band", "label", "start_ns", "end_ns"]] for r in rows], ignore_index=True)
    out = out.astype({"start_ns": "int64", "end_ns": "int64"})
    out = out[(out["end_ns"] > t0_ns) & (out["start_ns"] < t1_ns)]
    out = out.assign(
        label=out["label"].map(short_name),
        start_ns=out["start_ns"].clip(lower=t0_ns),
        end_ns=out["end_ns"].clip(upper=t1_ns),
    )
    out = out.assign(len_ns=out["end_ns"] - out["start_ns"]).sort_values(
        "len_ns", ascending=False, kind="stable"
    )
    out = out.groupby("band", sort=False).head(limit).drop(columns="len_ns")
    return out.sort_values(["band", "start_ns"], kind="stable").reset_index(drop=True)
