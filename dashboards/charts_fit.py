"""Plotly figures of the Breakeven page: time per micro-batch with fits, n* and crossing; predicted step time.

Pure functions of small tables (no Streamlit, no files); colours per precision id from ``dashboards.charts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards.charts import layout, precision_color

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
    return layout(fig, title, height=460)


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
    return layout(
        fig, f"Predicted step time for a global batch of N = {global_tokens:,.0f} tokens", height=380
    )
