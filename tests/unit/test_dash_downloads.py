"""dashboards.downloads and glossary: downloaded tables read back with mxperf's own reader; the glossary
names every term the issue asks for."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboards import downloads, glossary
from tracing.outputs import store

TABLE = pd.DataFrame(
    {"phase": ["update", "sync"], "seconds": [0.5, 0.1], "n": pd.array([3, None], dtype="Int64")}
)


def test_parquet_download_reads_back_with_store(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(downloads.table_bytes(TABLE, "parquet"))
    pd.testing.assert_frame_equal(store.read_table(path), TABLE)


def test_csv_download_round_trips() -> None:
    back = pd.read_csv(io.BytesIO(downloads.table_bytes(TABLE, "csv")))
    assert back["seconds"].tolist() == [0.5, 0.1] and back["phase"].tolist() == ["update", "sync"]
    with pytest.raises(ValueError, match="unknown download format"):
        downloads.table_bytes(TABLE, "xlsx")


def test_file_names_cannot_carry_paths() -> None:
    assert downloads.safe_stem("../../etc/passwd") == "etc_passwd"
    assert downloads.safe_stem("step time: bf16/bf16 vs mxfp8") == "step_time_bf16_bf16_vs_mxfp8"
    assert downloads.safe_stem("///") == "table"


def test_figure_html_is_standalone() -> None:
    html = downloads.figure_html(go.Figure(go.Bar(x=[1], y=[2])))
    assert (
        html.lower().startswith(b"<!doctype html>") and b"plotly" in html and len(html) > 1_000_000
    )  # plotly.js inlined


@pytest.mark.parametrize(
    "term", ["n* (breakeven)", "fixed / per-token cost", "host stall", "I1-I7", "k1 / k3"]
)
def test_glossary_explains_the_terms_pages_use(term: str) -> None:
    assert term in glossary.TERMS
    assert f"**{term}**" in glossary.glossary_markdown()
