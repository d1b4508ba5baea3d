"""Bytes for the dashboard's download buttons: tables as CSV or Parquet, figures as standalone HTML.

Pure functions (no Streamlit, no files): the page decides the file name and offers the bytes. Parquet goes
through pyarrow in memory with the same ``schema_version`` metadata ``tracing.outputs.store`` writes, so a
downloaded table reads back with ``store.read_table``.
"""

from __future__ import annotations

import io
import re

import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.parquet as pq

from tracing.outputs import store

FORMATS = ("csv", "parquet")


def safe_stem(name: str) -> str:
    """A file-name stem from any label: letters, digits, ``._-`` only (no path separators)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return stem[:120] or "table"


def table_bytes(df: pd.DataFrame, fmt: str) -> bytes:
    """``df`` as CSV (UTF-8, no index) or Parquet bytes."""
    if fmt == "csv":
        return df.to_csv(index=False).encode("utf-8")
    if fmt == "parquet":
        table = pa.Table.from_pandas(df, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"schema_version"] = str(store.SCHEMA_VERSION).encode()
        buf = io.BytesIO()
        pq.write_table(table.replace_schema_metadata(meta), buf)
        return buf.getvalue()
    raise ValueError(f"unknown download format {fmt!r}; expected one of {', '.join(FORMATS)}")


def figure_html(fig: go.Figure) -> bytes:
    """A standalone interactive HTML file of a figure (plotly.js inlined: opens offline)."""
    styled = go.Figure(fig).update_layout(template="plotly_white")  # a copy: the page's figure stays as it is
    return styled.to_html(include_plotlyjs=True, full_html=True).encode("utf-8")


MIME = {
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
    "html": "text/html",
    "md": "text/markdown",
}
