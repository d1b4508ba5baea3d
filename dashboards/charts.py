"""Plotly figures for the dashboard: pure functions from small tables to ``go.Figure``.

No Streamlit and no file access here, so the tests build every figure directly. Colours are fixed per phase
and per precision id (docs/contracts.md ids are the labels), so bf16 and mxfp8 look the same on every page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PHASE_COLORS: dict[str, str] = {
    "generate": "#4C78A8",
    "logprob": "#72B7B2",
    "update": "#F58518",
    "sync": "#B279A2",
    "other": "#BAB0AC",
}
PRECISION_COLORS: dict[str, str] = {
    "bf16": "#1f77b4",
    "mxfp8": "#d62728",
    "mxfp8-te212": "#ff7f0e",
    "mxfp8-floor": "#9467bd",
    "fp8-tensor": "#2ca02c",
    "fp8-block128": "#8c564b",
    "fp8-rowwise": "#e377c2",
}
# Drawn in this order (overlaid): the idle bar spans the device's active time, busy and stall cover it.
STATE_COLORS: dict[str, str] = {"idle": "#d9d9d9", "busy": "#2ca02c", "host stall": "#d62728"}
STATE_NAMES: dict[str, str] = {"idle": "idle, other (span)", "busy": "GPU busy", "host stall": "host stall"}
_FALLBACK = ("#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78")


def precision_color(label: str, i: int = 0) -> str:
    key = label.split("/")[0].split(" ")[0]
    return PRECISION_COLORS.get(key, _FALLBACK[i % len(_FALLBACK)])


def pairing_color(label: str, i: int = 0) -> str:
    """``learner/sampler`` labels: the precision's colour when both sides match, else a distinct colour."""
    learner, _, sampler = label.partition("/")
    if not sampler or sampler.split(" ")[0] == learner:
        return precision_color(learner, i)
    return _FALLBACK[i % len(_FALLBACK)]


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": -0.3},
        template="plotly_white",
    )
    return fig


# --------------------------------------------------------------------------------------------- step time
def step_time_mean_bars(medians: Mapping[str, pd.Series], phases: Sequence[str]) -> go.Figure:
    """One stacked bar per precision: median seconds per phase (``medians``: label -> Series by phase)."""
    labels = list(medians)
    fig = go.Figure()
    for phase in phases:
        fig.add_bar(
            name=phase,
            x=labels,
            y=[float(medians[lbl].get(phase, 0.0)) for lbl in labels],
            marker_color=PHASE_COLORS.get(phase),
            hovertemplate=f"{phase}: %{{y:.3g}} s<extra>%{{x}}</extra>",
        )
    fig.update_layout(barmode="stack", yaxis_title="median seconds per step", xaxis_title="precision")
    _layout(fig, "Median step time by phase")
    fig.update_layout(legend_traceorder="normal")  # plotly reverses stacked legends; keep phase order
    return fig


def step_time_per_step_bars(tables: Mapping[str, pd.DataFrame], phases: Sequence[str]) -> go.Figure:
    """Per step, stacked phases; one panel per precision sharing the y axis (``tables``: long step tables)."""
    labels = list(tables)
    fig = make_subplots(rows=1, cols=max(1, len(labels)), shared_yaxes=True, subplot_titles=labels)
    for col, label in enumerate(labels, start=1):
        wide = tables[label].pivot_table(index="step", columns="phase", values="seconds", aggfunc="sum")
        for phase in phases:
            if phase not in wide:
                continue
            fig.add_bar(
                name=phase,
                x=wide.index,
                y=wide[phase],
                marker_color=PHASE_COLORS.get(phase),
                legendgroup=phase,
                showlegend=col == 1,
                row=1,
                col=col,
                hovertemplate=f"step %{{x}} {phase}: %{{y:.3g}} s<extra>{label}</extra>",
            )
        fig.update_xaxes(title_text="step", row=1, col=col)
    fig.update_layout(barmode="stack", yaxis_title="seconds")
    return _layout(fig, "Step time by phase, every step")


# --------------------------------------------------------------------------------------------- breakeven
def breakeven_figure(
    points: pd.DataFrame,
    lines: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]],
    n_star: float | None = None,
    n_star_ci: Sequence[float | None] = (None, None),
    title: str = "Time per micro-batch vs tokens",
) -> go.Figure:
    """Measured micro-batch times (``points``: precision, num_tokens, seconds), fitted lines with 95 %
    bands (``lines``: precision -> (ns, pred, lower|None, upper|None)) and n* with its interval."""
    fig = go.Figure()
    for i, (prec, (ns, pred, lo, hi)) in enumerate(lines.items()):
        color = precision_color(prec, i)
        if lo is not None and hi is not None:
            fig.add_scatter(
                x=np.concatenate([ns, ns[::-1]]),
                y=np.concatenate([hi, lo[::-1]]),
                fill="toself",
                fillcolor=color,
                opacity=0.18,
                line={"width": 0},
                name=f"{prec} 95 % band",
                hoverinfo="skip",
            )
        fig.add_scatter(x=ns, y=pred, mode="lines", line={"color": color, "width": 2}, name=f"{prec} fit")
    for i, (prec, grp) in enumerate(points.groupby("precision", sort=True)):
        x = grp["num_tokens"] if "num_tokens" in grp else grp["tokens_per_microbatch"]
        fig.add_scatter(
            x=x,
            y=grp["seconds"],
            mode="markers",
            marker={"color": precision_color(str(prec), i), "size": 6, "opacity": 0.7},
            name=f"{prec} measured",
        )
    if n_star is not None and np.isfinite(n_star):
        lo, hi = ([*list(n_star_ci), None, None])[:2]
        if lo is not None or hi is not None:
            x0 = lo if lo is not None else 0
            x1 = hi if hi is not None else max(n_star * 2, x0)
            fig.add_vrect(x0=x0, x1=x1, fillcolor="#999", opacity=0.15, line_width=0)
        fig.add_vline(x=n_star, line_dash="dash", line_color="black")
        fig.add_annotation(x=n_star, y=1, yref="paper", text=f"n* = {n_star:,.0f}", showarrow=False, yshift=8)
    fig.update_layout(xaxis_title="tokens per micro-batch", yaxis_title="seconds per micro-batch")
    return _layout(fig, title, height=460)


def step_prediction_figure(
    ns: np.ndarray, predictions: Mapping[str, np.ndarray], chosen_n: float, global_tokens: float
) -> go.Figure:
    """Predicted step seconds vs micro-batch size per precision, with the chosen size marked."""
    fig = go.Figure()
    for i, (prec, y) in enumerate(predictions.items()):
        fig.add_scatter(
            x=ns, y=y, mode="lines", name=prec, line={"color": precision_color(prec, i), "width": 2}
        )
    fig.add_vline(x=chosen_n, line_dash="dot", line_color="black")
    fig.update_layout(xaxis_title="tokens per micro-batch", yaxis_title="predicted seconds per step")
    return _layout(fig, f"Predicted step time for a global batch of {global_tokens:,.0f} tokens", height=380)


# --------------------------------------------------------------------------------------------- host stall
def stall_share_figure(share: pd.DataFrame, x: str, title: str) -> go.Figure:
    """Host-stall share (%) per ``x`` (tokens_per_microbatch or phase), one bar series per precision."""
    fig = go.Figure()
    for i, (prec, grp) in enumerate(share.groupby("precision", sort=True)):
        grp = grp.sort_values(x)
        fig.add_bar(
            name=str(prec),
            x=grp[x].astype(str),
            y=100 * grp["host_stall_share"],
            marker_color=precision_color(str(prec), i),
            hovertemplate="%{x}: %{y:.1f} %<extra>" + str(prec) + "</extra>",
        )
    fig.update_layout(
        barmode="group", yaxis_title="host stall, % of wall time", xaxis_title=x.replace("_", " ")
    )
    return _layout(fig, title, height=380)


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
            y=sel["lane"],
            x=sel["end_ms"] - sel["start_ms"],
            base=sel["start_ms"],
            marker_color=color,
            hovertemplate=f"{state}: %{{base:.3f}} ms + %{{x:.3f}} ms<extra>%{{y}}</extra>",
        )
    if ranges is not None and not ranges.empty:
        lanes = "range depth " + ranges["depth"].astype(str)
        fig.add_bar(
            name="ranges",
            orientation="h",
            y=lanes,
            x=ranges["end_ms"] - ranges["start_ms"],
            base=ranges["start_ms"],
            marker={"color": "#9ecae1", "line": {"color": "#3182bd", "width": 1}},
            text=ranges["name"],
            textposition="inside",
            insidetextanchor="start",
            hovertemplate="%{text}: %{base:.3f} ms + %{x:.3f} ms<extra></extra>",
        )
    fig.update_layout(barmode="overlay", xaxis_title="ms from window start", bargap=0.25)
    fig.update_yaxes(
        autorange="reversed", categoryorder="array", categoryarray=_lane_order(intervals, ranges)
    )
    _layout(fig, title, height=220 + 45 * _lane_count(intervals, ranges))
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


# --------------------------------------------------------------------------------------------- consistency
def consistency_figure(long: pd.DataFrame, metrics: Sequence[str]) -> go.Figure:
    """One panel per metric (KL k1, KL k3, token multiplicative probability error), a line per pairing."""
    present = [m for m in metrics if m in set(long["metric"])]
    fig = make_subplots(rows=1, cols=max(1, len(present)), subplot_titles=present)
    for col, metric in enumerate(present, start=1):
        sel = long[long["metric"] == metric]
        for i, (pairing, grp) in enumerate(sel.groupby("pairing", sort=True)):
            fig.add_scatter(
                x=grp["step"],
                y=grp["value"],
                mode="lines+markers",
                name=str(pairing),
                legendgroup=str(pairing),
                showlegend=col == 1,
                line={"color": pairing_color(str(pairing), i)},
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="step", row=1, col=col)
    return _layout(fig, "Sampler vs learner, per step (learner/sampler)", height=400)


def fixed_weights_figure(table: pd.DataFrame, metric: str = "kl_k3") -> go.Figure:
    """One bar per (learner, sampler) pairing at fixed weights, grouped by learner; log y (the pairings
    span orders of magnitude: an identical BF16 pair against a sampler on another grid)."""
    fig = go.Figure()
    for i, (learner, grp) in enumerate(table.groupby("learner", sort=True)):
        fig.add_bar(
            name=f"learner {learner}",
            x=grp["sampler"].astype(str),
            y=grp[metric],
            marker_color=precision_color(str(learner), i),
            hovertemplate="sampler %{x}: %{y:.3g}<extra>learner " + str(learner) + "</extra>",
        )
    fig.update_layout(barmode="group", xaxis_title="sampler", yaxis_title=metric, yaxis_type="log")
    return _layout(
        fig, f"{metric} at fixed weights, every pairing (lower = sampler closer to learner)", height=420
    )


# --------------------------------------------------------------------------------------------- weight sync
def sync_heatmap(matrix: pd.DataFrame, names: Mapping[str, str]) -> go.Figure:
    """step x invariant grid: green passed, red failed, grey not checked."""
    z = matrix.to_numpy(dtype=float).T
    text = np.where(np.isnan(z), "not checked", np.where(z > 0.5, "pass", "FAIL"))
    y = [f"{c} {names.get(c, '')}".strip() for c in matrix.columns]
    x = ["initial" if int(s) < 0 else str(int(s)) for s in matrix.index]  # step -1: the sync before training
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=y,
            zmin=0,
            zmax=1,
            colorscale=[[0, "#d62728"], [1, "#2ca02c"]],
            showscale=False,
            text=text,
            hovertemplate="sync after step %{x}, %{y}: %{text}<extra></extra>",
            xgap=1,
            ygap=1,
        )
    )
    fig.update_layout(xaxis_title="sync after step")
    fig.update_xaxes(type="category")
    fig.update_yaxes(autorange="reversed")
    return _layout(
        fig, "Weight-sync invariants per sync (green pass, red fail, grey not checked)", height=320
    )


def fault_matrix_figure(grid: pd.DataFrame) -> go.Figure:
    """fault x check grid (``summaries.fault_grid``): green where a check caught the injected fault; a
    fault its own target check missed is marked in red."""
    caught = grid.pivot_table(index="fault", columns="check", values="caught", aggfunc="max", sort=False)
    target = grid.pivot_table(index="fault", columns="check", values="target", aggfunc="max", sort=False)
    z = caught.astype(float).to_numpy()
    tgt = target.reindex_like(caught).fillna(False).astype(bool).to_numpy()
    z = np.where(tgt & (z < 0.5), -1.0, z)
    text = np.where(z > 0.5, "caught", np.where(z < -0.5, "MISSED", ""))
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(caught.columns),
            y=list(caught.index),
            zmin=-1,
            zmax=1,
            colorscale=[[0, "#d62728"], [0.5, "#f0f0f0"], [1, "#2ca02c"]],
            showscale=False,
            text=text,
            texttemplate="%{text}",
            hovertemplate="%{y} / %{x}: %{text}<extra></extra>",
            xgap=1,
            ygap=1,
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(side="top")
    return _layout(fig, "Fault matrix: injected fault x check", height=180 + 28 * len(caught.index))
