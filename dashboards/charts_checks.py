"""Plotly figures of the Consistency and Weight sync pages: mismatch per step, every pairing at fixed
weights, invariants per sync, the fault matrix. Pure functions of small tables (no Streamlit, no files)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.charts import layout, pairing_color, precision_color


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
    return layout(fig, "Sampler vs learner, per step (learner/sampler)", height=400)


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
    return layout(
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
    return layout(fig, "Weight-sync invariants per sync (green pass, red fail, grey not checked)", height=320)


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
    return layout(fig, "Fault matrix: injected fault x check", height=180 + 28 * len(caught.index))
