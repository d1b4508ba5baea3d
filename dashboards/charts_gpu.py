"""Plotly figures of the Host stall page: stall share per size or phase, and the GPU-state timeline.

Pure functions of small tables (no Streamlit, no files); colours per precision id from ``dashboards.charts``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboards.charts import layout, precision_color

# Drawn in this order (overlaid): the idle bar spans the device's active time, busy and stall cover it.
STATE_COLORS: dict[str, str] = {"idle": "#d9d9d9", "busy": "#2ca02c", "host stall": "#d62728"}
STATE_NAMES: dict[str, str] = {"idle": "idle, other (span)", "busy": "GPU busy", "host stall": "host stall"}


def stall_share_figure(share: pd.DataFrame, x: str, title: str) -> go.Figure:
    """Host-stall share (%) per ``x`` (tokens_per_microbatch or phase), one bar series per precision."""
    fig = go.Figure()
    for i, (prec, grp) in enumerate(share.groupby("precision", sort=True)):
        grp = grp.sort_values(x)
        fig.add_bar(
            name=str(prec),
            x=grp[x].astype(str),
            y=grp["host stall %"],
            marker_color=precision_color(str(prec), i),
            hovertemplate="%{x}: %{y:.1f} %<extra>" + str(prec) + "</extra>",
        )
    fig.update_layout(
        barmode="group", yaxis_title="host stall, % of wall time", xaxis_title=x.replace("_", " ")
    )
    return layout(fig, title, height=380)


def timeline_figure(intervals: pd.DataFrame, ranges: pd.DataFrame | None, title: str) -> go.Figure:
    """GPU state per device (busy / host stall / idle bars) with host ranges stacked above.

    ``intervals``: ``lane, state, start_ms, end_ms``; ``ranges``: ``name, depth, start_ms, end_ms``.
    """
    fig = go.Figure()
    for state, color in STATE_COLORS.items():
        sel = intervals[intervals["state"] == state]
        if sel.empty:
            continue
        fig.add_bar(
            name=STATE_NAMES[state],
            orientation="h",
            y=sel["lane"].to_numpy(),
            x=(sel["end_ms"] - sel["start_ms"]).to_numpy(),
            base=sel["start_ms"].to_numpy(),
            marker_color=color,
            hovertemplate=f"{state}: %{{base:.3f}} ms + %{{x:.3f}} ms<extra>%{{y}}</extra>",
        )
    if ranges is not None and not ranges.empty:
        lanes = "range depth " + ranges["depth"].astype(str)
        fig.add_bar(
            name="ranges",
            orientation="h",
            y=lanes.to_numpy(),
            x=(ranges["end_ms"] - ranges["start_ms"]).to_numpy(),
            base=ranges["start_ms"].to_numpy(),
            marker={"color": "#9ecae1", "line": {"color": "#3182bd", "width": 1}},
            text=ranges["name"].to_numpy(),
            textposition="inside",
            insidetextanchor="start",
            hovertemplate="%{text}: %{base:.3f} ms + %{x:.3f} ms<extra></extra>",
        )
    fig.update_layout(barmode="overlay", xaxis_title="ms from window start", bargap=0.25)
    fig.update_yaxes(
        autorange="reversed", categoryorder="array", categoryarray=_lane_order(intervals, ranges)
    )
    layout(fig, title, height=220 + 45 * _lane_count(intervals, ranges))
    fig.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0}, margin={"t": 90})
    return fig


def _lane_order(intervals: pd.DataFrame, ranges: pd.DataFrame | None) -> list[str]:
    lanes = (
        []
        if ranges is None or ranges.empty
        else [f"range depth {d}" for d in sorted(ranges["depth"].unique())]
    )
    return lanes + list(dict.fromkeys(intervals["lane"]))


def _lane_count(intervals: pd.DataFrame, ranges: pd.DataFrame | None) -> int:
    return len(_lane_order(intervals, ranges))


TRACK_COLORS: dict[str, str] = {
    "band": "#c6dbef",
    "cpu": "#6baed6",
    "gpu": "#2ca02c",
    "host stall": "#d62728",
}


def tracks_figure(boxes: pd.DataFrame, bands: pd.DataFrame, t0_ns: int, title: str) -> go.Figure:
    """The Timeline page: bands (steps, phases, micro-batches) above CPU-thread, GPU-stream and host-stall tracks.

    ``boxes``: ``track, kind, start_ns, end_ns, count, busy_ns, name`` (``dashboards.timeline_boxes``);
    ``bands``: ``band, label, start_ns, end_ns``. Times in ms from ``t0_ns``; hover names the op (or the longest
    of a merged box), the count and the busy time."""
    fig = go.Figure()
    order = [*dict.fromkeys(bands["band"])] if len(bands) else []
    if len(bands):
        fig.add_bar(
            name="steps, phases, micro-batches",
            orientation="h",
            y=bands["band"].to_numpy(),
            x=((bands["end_ns"] - bands["start_ns"]) / 1e6).to_numpy(),
            base=((bands["start_ns"] - t0_ns) / 1e6).to_numpy(),
            marker={"color": TRACK_COLORS["band"], "line": {"color": "#3182bd", "width": 1}},
            text=bands["label"].to_numpy(),
            textposition="inside",
            insidetextanchor="start",
            hovertemplate="%{text}<br>%{base:.3f} ms + %{x:.3f} ms<extra>%{y}</extra>",
        )
    tracks = list(dict.fromkeys(boxes["track"])) if len(boxes) else []
    order += [t for t in tracks if t.startswith("CPU")] + sorted(t for t in tracks if t.startswith("GPU"))
    for group, mask in (
        ("cpu", boxes["track"].str.startswith("CPU") if len(boxes) else []),
        (
            "gpu",
            (boxes["track"].str.startswith("GPU") & (boxes["kind"] != "host stall")) if len(boxes) else [],
        ),
        ("host stall", (boxes["kind"] == "host stall") if len(boxes) else []),
    ):
        sel = boxes[mask] if len(boxes) else boxes
        if sel.empty:
            continue
        names = sel["name"].astype(str).str.slice(0, 140)
        what = names.where(sel["count"] == 1, names.radd("longest: "))
        custom = pd.DataFrame(
            {
                "what": what,
                "count": sel["count"],
                "busy": sel["busy_ns"] / 1e6,
                "kind": sel["kind"].astype(str),
            }
        )
        fig.add_bar(
            name={
                "cpu": "CPU ops, runtime calls",
                "gpu": "GPU kernels, memcpy, memset",
                "host stall": "host stall",
            }[group],
            orientation="h",
            y=sel["track"].to_numpy(),
            x=((sel["end_ns"] - sel["start_ns"]) / 1e6).to_numpy(),
            base=((sel["start_ns"] - t0_ns) / 1e6).to_numpy(),
            marker_color=TRACK_COLORS[group],
            customdata=custom.to_numpy(),
            hovertemplate=(
                "%{customdata[0]}<br>%{customdata[3]} · %{customdata[1]} op(s), busy %{customdata[2]:.3f} ms"
                "<br>%{base:.3f} ms + %{x:.3f} ms<extra>%{y}</extra>"
            ),
        )
    fig.update_layout(
        barmode="overlay", xaxis_title="ms from the trace's first op", bargap=0.2, dragmode="zoom"
    )
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=order)
    layout(fig, title, height=200 + 34 * max(len(order), 1))
    fig.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0}, margin={"t": 90})
    return fig
