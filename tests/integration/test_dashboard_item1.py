"""Issue #35 item 1 (the rest): one number for one thing, words not identifiers, one unit, messages not empty
charts, emulation and skipped links said, a missed prediction warned -- each test fails before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"


def _open(runs: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [str(e.value) for e in at.exception]
    return at


def _texts(at: AppTest, *kinds: str) -> list[str]:
    return [str(e.value) for k in kinds for e in getattr(at, k)]


def _examples(*names: str) -> None:
    if not all((EXAMPLES / n / store.MANIFEST).is_file() for n in names):
        pytest.skip(f"examples/runs lacks one of {names}")


# --------------------------------------------------------------------------------------------- (c), (d)
def test_host_stall_share_in_percent_and_cpu_sweeps_say_not_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _examples("sweep-tiny-dense", "ingest-verl-sim-bf16")
    at = _open(EXAMPLES, "host_stall", monkeypatch)
    for chart in at.get("plotly_chart"):
        fig = json.loads(chart.proto.spec)
        bars = [
            t for t in fig["data"] if t.get("type") == "bar" and "host stall, %" in json.dumps(fig["layout"])
        ]
        for t in bars:  # no empty chart: every host-stall bar series holds a number
            assert any(y is not None for y in t.get("y", [])), fig["layout"].get("title")
    info = " ".join(_texts(at, "info"))
    assert "not available for `tiny-dense`" in info and "CPU" in info
    by_size = next(df.value for df in at.dataframe if "tokens_per_microbatch" in df.value.columns)
    assert "host stall %" in by_size.columns and "host_stall_share" not in by_size.columns
    mb = pd.read_parquet(EXAMPLES / "ingest-verl-sim-bf16" / store.MICROBATCHES)
    mb = mb[mb["host_stall_seconds"].notna()]
    size = int(mb["tokens_per_microbatch"].iloc[0])
    sel = mb[mb["tokens_per_microbatch"] == size]
    want = 100 * sel["host_stall_seconds"].sum() / sel["seconds"].sum()
    row = by_size[(by_size["tokens_per_microbatch"] == size) & (by_size["precision"] == "bf16")]
    row = row[row["traced"] > 0]
    assert float(row["host stall %"].iloc[0]) == pytest.approx(want, rel=1e-9)
