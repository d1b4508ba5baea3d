"""The ASGI entry point ``mxperf dash`` serves: the dashboard script behind the Host/Origin guard.

``streamlit run dashboards/serve.py`` finds ``app`` (an ``st.App``) and serves it with uvicorn; every HTTP and
WebSocket request passes :class:`dashboards.guard.HostOriginGuard` before Streamlit sees it. At start-up the
modules the pages use are imported once, so the first visit to a page does not pay for them.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # served from a checkout without an install
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from dashboards.guard import HostOriginGuard  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "app.py"
# What the pages import beyond Streamlit (scipy and plotly's subplots alone take seconds on a cold start).
WARM_MODULES = (
    "pandas",
    "pyarrow.parquet",
    "plotly.graph_objects",
    "plotly.subplots",
    "scipy.stats",
    "dashboards.charts",
    "dashboards.ui",
    "perfmodel.report.results",
    "perfmodel.step.costs",
    "perfmodel.step.interval",
    "tracing.analysis.metrics",
    "tracing.analysis.ranks",
    "tracing.analysis.step_ranges",
)


def import_page_modules() -> list[str]:
    """Import the pages' modules; returns those that failed (a page then says why when it is opened)."""
    failed = []
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # a broken optional module must not keep the server from starting
            failed.append(name)
    return failed


def build_one_figure() -> None:
    """Build and serialize a figure with every trace type the pages use: plotly loads its validators on
    first use, which would otherwise land on the first visit to a page with charts."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=["a", "b"])
    fig.add_bar(x=[1], y=[1], marker={"color": "#000", "opacity": [1.0]}, row=1, col=1)
    fig.add_scatter(x=[1], y=[1], mode="lines+markers", fill="toself", error_y={"array": [0.1]}, row=1, col=2)
    fig.add_trace(go.Heatmap(z=[[0.0]], x=["a"], y=["b"], text=[["t"]], texttemplate="%{text}"), row=1, col=1)
    fig.add_vrect(x0=0, x1=1, fillcolor="#999", opacity=0.1, line_width=0, annotation_text="x")
    fig.add_vline(x=0.5)
    fig.update_layout(barmode="stack", legend={"orientation": "h"}, template="plotly_white")
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="log", dtick=1, exponentformat="e")
    fig.to_plotly_json()


@asynccontextmanager
async def warm_start(_app: Any) -> AsyncIterator[None]:
    await asyncio.to_thread(import_page_modules)
    await asyncio.to_thread(build_one_figure)
    yield


app = st.App(str(SCRIPT), lifespan=warm_start, middleware=[Middleware(HostOriginGuard)])
