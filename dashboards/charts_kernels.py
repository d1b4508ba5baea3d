"""Plotly figures of the Kernels and Diff pages: kernel time per class and phase, the GEMM roofline, and the
B - A decomposition as stacked bars. Pure functions of the small tables of ``dashboards.kernel_tables``."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboards.charts import PHASE_COLORS, layout, precision_color
from dashboards.kernel_tables import DIFF_PARTS

PART_COLORS: dict[str, str] = {
    "GEMM ms": "#1f77b4",
    "casts / quantize ms": "#d62728",
    "other kernels ms": "#9467bd",
    "host stall ms": "#ff7f0e",
    "residual ms": "#7f7f7f",
    "outside micro-batches ms": "#bcbd22",
}


def class_phase_figure(long: pd.DataFrame, title: str) -> go.Figure:
    """Horizontal bars: kernel time per class (ms), stacked by phase."""
    fig = go.Figure()
    order = long.groupby("class", sort=False)["ms"].sum().sort_values().index.tolist()
    for phase, grp in long.groupby("phase", sort=True):
        fig.add_bar(
            name=str(phase),
            orientation="h",
            y=grp["class"],
            x=grp["ms"],
            marker_color=PHASE_COLORS.get(str(phase), "#BAB0AC" if phase == "(no phase)" else None),
            hovertemplate="%{y}: %{x:.3f} ms<extra>" + str(phase) + "</extra>",
        )
    fig.update_layout(
        barmode="stack",
        xaxis_title="kernel time, ms (summed over streams)",
        yaxis={"categoryorder": "array", "categoryarray": order},
    )
    return layout(fig, title, height=max(260, 60 + 40 * len(order)))


def roofline_figure(roof: pd.DataFrame, hbm_bytes_per_s: float | None, title: str) -> go.Figure:
    """Achieved TFLOP/s against FLOP per byte (log-log), one marker series per precision, with each
    precision's roof: min(peak, bandwidth x intensity) from the rows' peak and the device's bandwidth."""
    fig = go.Figure()
    shown = roof.dropna(subset=["FLOP per byte", "achieved TFLOP/s"])
    for i, (prec, grp) in enumerate(shown.groupby("precision", sort=True)):
        color = precision_color(str(prec), i)
        fig.add_scatter(
            name=f"{prec} GEMMs",
            x=grp["FLOP per byte"],
            y=grp["achieved TFLOP/s"],
            mode="markers",
            marker={"color": color, "size": 9},
            text=[
                f"{b}x{m}x{n}x{k}" for b, m, n, k in zip(grp["B"], grp["M"], grp["N"], grp["K"], strict=True)
            ],
            hovertemplate="B x M x N x K %{text}<br>%{x:.0f} FLOP/B, %{y:.1f} TFLOP/s<extra>"
            + str(prec)
            + "</extra>",
        )
        peaks = grp["peak TFLOP/s"].dropna()
        if hbm_bytes_per_s and len(peaks):
            peak = float(peaks.iloc[0])
            lo = min(1.0, float(grp["FLOP per byte"].min()) / 2)
            hi = max(peak * 1e12 / hbm_bytes_per_s * 4, float(grp["FLOP per byte"].max()) * 2)
            xs = [lo * (hi / lo) ** (j / 60) for j in range(61)]
            fig.add_scatter(
                name=f"{prec} roof ({peak:,.0f} TFLOP/s)",
                x=xs,
                y=[min(peak, hbm_bytes_per_s * x / 1e12) for x in xs],
                mode="lines",
                line={"color": color, "dash": "dash"},
                hoverinfo="skip",
            )
    fig.update_layout(
        xaxis={"type": "log", "title": "arithmetic intensity, FLOP per byte"},
        yaxis={"type": "log", "title": "achieved TFLOP/s (at the mean duration)"},
    )
    return layout(fig, title, height=440)


def diff_figure(frame: pd.DataFrame, labels: list[str], title: str) -> go.Figure:
    """B - A per row, its parts stacked (negative parts below zero), the measured B - A as a marker."""
    fig = go.Figure()
    for col in DIFF_PARTS.values():
        if col not in frame:
            continue
        fig.add_bar(
            name=col.removesuffix(" ms"),
            x=labels,
            y=frame[col],
            marker_color=PART_COLORS[col],
            hovertemplate="%{x}: %{y:+.3f} ms<extra>" + col.removesuffix(" ms") + "</extra>",
        )
    fig.add_scatter(
        name="B - A (measured)",
        x=labels,
        y=frame["B - A ms"],
        mode="markers",
        marker={"symbol": "diamond", "size": 10, "color": "black"},
        hovertemplate="%{x}: B - A %{y:+.3f} ms<extra></extra>",
    )
    fig.update_layout(barmode="relative", yaxis_title="B - A, ms (negative: B faster)")
    fig.add_hline(y=0, line_width=1, line_color="#888")
    return layout(fig, title, height=440)
