"""The ASGI entry point ``mxperf dash`` serves: the dashboard script behind the Host/Origin guard.

``streamlit run dashboards/serve.py`` finds ``app`` (an ``st.App``) and serves it with uvicorn; every HTTP and
WebSocket request passes :class:`dashboards.guard.HostOriginGuard` before Streamlit sees it.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # served from a checkout without an install
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from dashboards.guard import HostOriginGuard  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "app.py"

app = st.App(str(SCRIPT), middleware=[Middleware(HostOriginGuard)])
