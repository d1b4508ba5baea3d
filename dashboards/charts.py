"""Plotly figures for the dashboard -- shared colours and layout, and the Step time figures.

No Streamlit and no file access here, so the tests build every figure directly. Colours are fixed per phase
and per precision id (docs/contracts.md ids are the labels), so bf16 and mxfp8 look the same on every page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards import compare

PHASE_COLORS: dict[str, str] = {
    "generate": "#4C78A8",
    "generate_wait": "#9ECAE9",
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


def layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    # No plotly template here: st.plotly_chart draws with Streamlit's theme, and assigning a template costs
    # ~55 ms per figure (a deep copy); the HTML download applies plotly_white (dashboards.downloads).
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": -0.3},
    )
    return fig


# --------------------------------------------------------------------------------------------- step time
def step_time_median_bars(stats: Mapping[str, pd.DataFrame], phases: Sequence[str]) -> go.Figure:
    """One stacked bar per output: median seconds per phase; the whisker on top is the quartile range of
    the whole step (``stats``: label -> ``compare.phase_stats`` table)."""
    labels = list(stats)
    beside = {lbl: compare.overlapped(stats[lbl]) for lbl in labels}
    fig = go.Figure()
    for phase in phases:
        if not any(phase in stats[lbl].index for lbl in labels):
            continue
        ys = [float(stats[lbl]["median_s"].get(phase, 0.0)) for lbl in labels]
        if phase == compare.OVERLAPPED and any(beside.values()):  # beside the step: apart, not stacked
            fig.add_scatter(
                name=compare.OVERLAPPED_LABEL,
                x=labels,
                y=[y if beside[lbl] else None for lbl, y in zip(labels, ys, strict=True)],
                mode="markers",
                marker={"color": PHASE_COLORS.get(phase), "size": 14, "symbol": "diamond-wide-open"},
                hovertemplate=f"{compare.OVERLAPPED_LABEL}: median %{{y:.3g}} s<extra>%{{x}}</extra>",
            )
            ys = [0.0 if beside[lbl] else y for lbl, y in zip(labels, ys, strict=True)]
            if not any(ys):
                continue
        fig.add_bar(
            name=phase,
            x=labels,
            y=ys,
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
    layout(fig, f"Median step time by phase ({n})")
    fig.update_layout(legend_traceorder="normal")  # plotly reverses stacked legends; keep phase order
    return fig


def step_time_per_step_bars(
    tables: Mapping[str, pd.DataFrame], phases: Sequence[str], warmup: Mapping[str, int | None] | None = None
) -> go.Figure:
    """Per step, stacked phases; one panel per output sharing the y axis. The warm-up step (left out of
    the medians) is drawn faded and labelled."""
    labels = list(tables)
    fig = make_subplots(rows=1, cols=max(1, len(labels)), shared_yaxes=True, subplot_titles=labels)
    legend: set[str] = set()  # one legend entry per series, from the first panel that has it
    for col, label in enumerate(labels, start=1):
        wide = tables[label].pivot_table(index="step", columns="phase", values="seconds", aggfunc="sum")
        totals = compare.step_totals(tables[label]).reindex(wide.index)
        first = (warmup or {}).get(label)
        opacity = [0.35 if s == first else 1.0 for s in wide.index]
        for phase in phases:
            if phase not in wide:
                continue
            if phase == compare.OVERLAPPED and compare.overlapped(tables[label]):  # beside the step: apart
                fig.add_scatter(
                    name=compare.OVERLAPPED_LABEL,
                    x=wide.index.to_numpy(),
                    y=wide[phase].to_numpy(),
                    mode="lines+markers",
                    line={"color": PHASE_COLORS.get(phase), "dash": "dot"},
                    marker={"symbol": "diamond-wide-open", "size": 10},
                    legendgroup=compare.OVERLAPPED_LABEL,
                    showlegend=compare.OVERLAPPED_LABEL not in legend,
                    row=1,
                    col=col,
                    hovertemplate=f"step %{{x}} {compare.OVERLAPPED_LABEL}: %{{y:.3g}} s<extra>{label}</extra>",
                )
                legend.add(compare.OVERLAPPED_LABEL)
                continue
            fig.add_bar(
                name=phase,
                x=wide.index.to_numpy(),
                y=wide[phase].to_numpy(),
                marker={"color": PHASE_COLORS.get(phase), "opacity": opacity},
                legendgroup=phase,
                showlegend=phase not in legend,
                row=1,
                col=col,
                hovertemplate=f"step %{{x}} {phase}: %{{y:.3g}} s<extra>{label}</extra>",
            )
            legend.add(phase)
        if first is not None and first in wide.index:
            fig.add_annotation(
                x=first,
                y=float(totals.loc[first]),
                text="warm-up<br>(not in medians)",
                showarrow=False,
                yshift=18,
                font={"size": 10},
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="step", row=1, col=col)
    fig.update_layout(barmode="stack", yaxis_title="seconds")
    return layout(fig, "Step time by phase, every step")


def rank_steps_figure(totals: pd.DataFrame, title: str) -> go.Figure:
    """Step seconds of every process per step (``ranks.step_totals``), the job's step (max) as a line."""
    fig = go.Figure()
    for i, (proc, grp) in enumerate(totals.groupby("process", sort=True)):
        fig.add_scatter(
            x=grp["step"].to_numpy(),
            y=grp["seconds"].to_numpy(),
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
    return layout(fig, title, height=340)


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
    return layout(fig, title, height=400)


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
