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
    "sync checks": "#E5B8D6",
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
def step_time_median_bars(stats: Mapping[str, pd.DataFrame], phases: Sequence[str]) -> go.Figure:
    """One stacked bar per output: median seconds per phase; the whisker on top is the quartile range of
    the whole step (``stats``: label -> ``compare.phase_stats`` table)."""
    labels = list(stats)
    fig = go.Figure()
    for phase in phases:
        if not any(phase in stats[lbl].index for lbl in labels):
            continue
        fig.add_bar(
            name=phase,
            x=labels,
            y=[float(stats[lbl]["median_s"].get(phase, 0.0)) for lbl in labels],
            marker_color=PHASE_COLORS.get(phase),
            hovertemplate=f"{phase}: median %{{y:.3g}} s<extra>%{{x}}</extra>",
        )
    totals = [float(stats[lbl]["median_s"].get("step", np.nan)) for lbl in labels]
    fig.add_scatter(
        x=labels,
        y=totals,
        mode="markers",
        marker={"color": "black", "size": 6, "symbol": "line-ew-open"},
        error_y={
            "type": "data",
            "symmetric": False,
            "array": [
                float(stats[lbl]["q3_s"].get("step", np.nan)) - t
                for lbl, t in zip(labels, totals, strict=True)
            ],
            "arrayminus": [
                t - float(stats[lbl]["q1_s"].get("step", np.nan))
                for lbl, t in zip(labels, totals, strict=True)
            ],
            "color": "black",
        },
        name="step: median and IQR",
        hovertemplate="step median %{y:.3g} s<extra>%{x}</extra>",
    )
    n = ", ".join(f"{lbl}: {int(stats[lbl]['n_steps'].iloc[0])} steps" for lbl in labels if len(stats[lbl]))
    fig.update_layout(barmode="stack", yaxis_title="median seconds per step", xaxis_title="output")
    _layout(fig, f"Median step time by phase ({n})")
    fig.update_layout(legend_traceorder="normal")  # plotly reverses stacked legends; keep phase order
    return fig


def step_time_per_step_bars(
    tables: Mapping[str, pd.DataFrame], phases: Sequence[str], warmup: Mapping[str, int | None] | None = None
) -> go.Figure:
    """Per step, stacked phases; one panel per output sharing the y axis. The warm-up step (left out of
    the medians) is drawn faded and labelled."""
    labels = list(tables)
    fig = make_subplots(rows=1, cols=max(1, len(labels)), shared_yaxes=True, subplot_titles=labels)
    for col, label in enumerate(labels, start=1):
        wide = tables[label].pivot_table(index="step", columns="phase", values="seconds", aggfunc="sum")
        first = (warmup or {}).get(label)
        opacity = [0.35 if s == first else 1.0 for s in wide.index]
        for phase in phases:
            if phase not in wide:
                continue
            fig.add_bar(
                name=phase,
                x=wide.index,
                y=wide[phase],
                marker={"color": PHASE_COLORS.get(phase), "opacity": opacity},
                legendgroup=phase,
                showlegend=col == 1,
                row=1,
                col=col,
                hovertemplate=f"step %{{x}} {phase}: %{{y:.3g}} s<extra>{label}</extra>",
            )
        if first is not None and first in wide.index:
            fig.add_annotation(
                x=first,
                y=float(wide.loc[first].sum()),
                text="warm-up<br>(not in medians)",
                showarrow=False,
                yshift=18,
                font={"size": 10},
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="step", row=1, col=col)
    fig.update_layout(barmode="stack", yaxis_title="seconds")
    return _layout(fig, "Step time by phase, every step")


def rank_steps_figure(totals: pd.DataFrame, title: str) -> go.Figure:
    """Step seconds of every process per step (``ranks.step_totals``), the job's step (max) as a line."""
    fig = go.Figure()
    for i, (proc, grp) in enumerate(totals.groupby("process", sort=True)):
        fig.add_scatter(
            x=grp["step"],
            y=grp["seconds"],
            mode="markers",
            name=str(proc),
            marker={"size": 9, "color": _FALLBACK[i % len(_FALLBACK)]},
            hovertemplate="step %{x}: %{y:.4g} s<extra>" + str(proc) + "</extra>",
        )
    job = totals.groupby("step")["seconds"].max()
    fig.add_scatter(
        x=job.index,
        y=job.to_numpy(),
        mode="lines",
        name="job step = max over ranks",
        line={"color": "black", "dash": "dot"},
    )
    fig.update_layout(xaxis_title="step", yaxis_title="seconds", xaxis_type="category")
    return _layout(fig, title, height=340)


def range_name_bars(children: pd.DataFrame, title: str) -> go.Figure:
    """Per step, stacked seconds of the step's own child range names (``step_ranges.top_names``)."""
    fig = go.Figure()
    order = children.groupby("name")["seconds"].sum().sort_values(ascending=False).index
    for i, name in enumerate(order):
        grp = children[children["name"] == name].groupby("step")["seconds"].sum()
        fig.add_bar(
            name=str(name),
            x=grp.index.astype(str),
            y=grp.to_numpy(),
            marker_color=_NAME_COLORS[i % len(_NAME_COLORS)],
            hovertemplate=f"{name}: %{{y:.3g}} s<extra>step %{{x}}</extra>",
        )
    fig.update_layout(barmode="stack", xaxis_title="step", yaxis_title="seconds")
    return _layout(fig, title, height=400)


_NAME_COLORS = (
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#B279A2",
    "#FF9DA6",
    "#9D755D",
    "#EECA3B",
    "#BAB0AC",
)


# --------------------------------------------------------------------------------------------- breakeven
_SOURCE_SYMBOLS = {"sweep": "circle", "range": "square", "detected": "diamond", "trace": "square"}


def breakeven_figure(
    points: pd.DataFrame,
    lines: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]],
    n_star: float | None = None,
    n_star_ci: Sequence[float | None] = (None, None),
    title: str = "Time per micro-batch vs tokens",
    crossing: Sequence[float] | None = None,
    dashed: Sequence[str] = (),
) -> go.Figure:
    """Measured micro-batch times (``points``: precision, num_tokens, seconds[, source]), fitted lines with
    95 % bands (``lines``: label -> (ns, pred, lower|None, upper|None); a label starts with its precision
    id; labels in ``dashed`` are an overlaid second fit), n* with its interval and the measured crossing."""
    fig = go.Figure()
    for i, (label, (ns, pred, lo, hi)) in enumerate(lines.items()):
        color = precision_color(label, i)
        dash = "dash" if label in dashed else "solid"
        if lo is not None and hi is not None:
            fig.add_scatter(
                x=np.concatenate([ns, ns[::-1]]),
                y=np.concatenate([hi, lo[::-1]]),
                fill="toself",
                fillcolor=color,
                opacity=0.10 if label in dashed else 0.18,
                line={"width": 0},
                name=f"{label} 95 % band",
                hoverinfo="skip",
            )
        fig.add_scatter(
            x=ns, y=pred, mode="lines", line={"color": color, "width": 2, "dash": dash}, name=f"{label} fit"
        )
    by = ["precision", "source"] if "source" in points and points["source"].notna().any() else ["precision"]
    for i, (key, grp) in enumerate(points.groupby(by, sort=True, dropna=False)):
        key = key if isinstance(key, tuple) else (key,)
        prec, source = str(key[0]), (str(key[1]) if len(key) > 1 else "")
        x = grp["num_tokens"] if "num_tokens" in grp else grp["tokens_per_microbatch"]
        fig.add_scatter(
            x=x,
            y=grp["seconds"],
            mode="markers",
            marker={
                "color": precision_color(prec, i),
                "size": 6,
                "opacity": 0.7,
                "symbol": _SOURCE_SYMBOLS.get(source, "circle"),
            },
            name=f"{prec} measured" + (f" ({source})" if source else ""),
        )
    if crossing is not None and len(crossing) == 2:
        fig.add_vrect(
            x0=crossing[0],
            x1=crossing[1],
            fillcolor="#e6c229",
            opacity=0.18,
            line_width=0,
            annotation_text="measured crossing",
            annotation_position="bottom left",
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
    ns: np.ndarray,
    predictions: Mapping[str, np.ndarray],
    chosen_n: float,
    global_tokens: float,
    measured: Sequence[float] | None = None,
) -> go.Figure:
    """Predicted step seconds vs micro-batch size (n <= N) per precision, the chosen size marked and the
    sizes outside the measured range shaded as extrapolation."""
    fig = go.Figure()
    for i, (prec, y) in enumerate(predictions.items()):
        fig.add_scatter(
            x=ns, y=y, mode="lines", name=prec, line={"color": precision_color(prec, i), "width": 2}
        )
    # Marks are traces in data coordinates (shapes on a log axis are not, and autorange would follow them).
    y_all = (
        np.concatenate([np.asarray(y, dtype=float) for y in predictions.values()])
        if predictions
        else np.zeros(1)
    )
    y_lo, y_hi = float(np.nanmin(y_all)), float(np.nanmax(y_all))
    if measured is not None and len(ns):
        lo, hi = float(measured[0]), float(measured[1])
        for x0, x1 in ((float(ns[0]), lo), (hi, float(ns[-1]))):
            if x1 > x0:
                fig.add_scatter(
                    x=[x0, x1, x1, x0, x0],
                    y=[y_lo, y_lo, y_hi, y_hi, y_lo],
                    fill="toself",
                    fillcolor="rgba(150,150,150,0.18)",
                    line={"width": 0},
                    mode="lines",
                    name="extrapolated (outside the measured sizes)",
                    legendgroup="extrapolated",
                    showlegend=x0 == float(ns[0]) or lo <= float(ns[0]),
                    hoverinfo="skip",
                )
    fig.add_scatter(
        x=[chosen_n, chosen_n],
        y=[y_lo, y_hi],
        mode="lines",
        line={"color": "black", "dash": "dot", "width": 1},
        name=f"n = {chosen_n:,.0f}",
        hoverinfo="skip",
    )
    fig.update_layout(
        xaxis_title="tokens per micro-batch (log scale)",
        yaxis_title="predicted seconds per step",
        xaxis_type="log",
    )
    return _layout(
        fig, f"Predicted step time for a global batch of N = {global_tokens:,.0f} tokens", height=380
    )


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
    # One tick per decade, written 1e-4: plotly's default SI ticks read "5, 2, 100µ" on a log axis.
    fig.update_yaxes(dtick=1, exponentformat="e", showexponent="all", tickformat=".0e")
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
