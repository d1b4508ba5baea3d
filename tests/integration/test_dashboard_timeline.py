"""Issue #35 item 4: the Timeline page under AppTest on the shipped examples -- CPU-thread and GPU-stream
tracks, host-stall spans, step / phase bands (and micro-batch bands where the output has micro-batches), the
window slider re-querying the server-side boxes, the Perfetto steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"


def _open(monkeypatch: pytest.MonkeyPatch, trace: str) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(EXAMPLES))
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.run()
    at.switch_page("views/timeline.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="tl_trace").set_value(trace).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _figure(at: AppTest) -> dict:
    import json

    charts = [c for c in at.get("plotly_chart")]
    assert charts, "no chart"
    return json.loads(charts[0].proto.spec)


def _lanes(fig: dict) -> set[str]:
    return {y for trace in fig["data"] for y in trace.get("y", [])}


def test_timeline_of_the_a100_trace_has_cpu_and_gpu_tracks_and_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(monkeypatch, "ingest-a100-hostbound")
    fig = _figure(at)
    lanes = _lanes(fig)
    assert {"CPU pid 2910249 · thread 2910249", "CPU pid 2910249 · thread 2919752"} <= lanes
    assert {"GPU 0 · stream 7", "GPU 0 · stream 40", "GPU 0 · host stall"} <= lanes
    assert {"steps", "phases"} <= lanes
    bands = next(t for t in fig["data"] if t["name"].startswith("steps"))
    assert {"ProfilerStep#4", "## forward ##", "## backward ##"} <= set(bands["text"])
    hover = [h for t in fig["data"] for h in (t.get("customdata") or [])]
    assert any("ampere" in str(h[0]) or "kernel" in str(h[3]) for h in hover)  # kernel names on hover
    captions = " ".join(str(c.value) for c in at.caption)
    assert "boxes drawn" in captions and "no micro-batch table" in captions
    assert any("ui.perfetto.dev" in str(m.value) for m in at.markdown)
    # zoom: a narrower window re-queries; every track keeps at most K boxes
    whole = sum(len(t.get("y", [])) for t in fig["data"])
    slider = next(s for s in at.slider if str(s.key).startswith("tl_window_"))
    lo, hi = slider.value
    slider.set_value((lo + (hi - lo) * 0.40, lo + (hi - lo) * 0.42)).run()
    assert not at.exception
    zoomed = _figure(at)
    assert zoomed["layout"]["title"]["text"] != fig["layout"]["title"]["text"]
    assert sum(len(t.get("y", [])) for t in zoomed["data"]) != whole


def test_microbatch_bands_on_a_trace_with_microbatches(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(monkeypatch, "ingest-verl-sim-bf16")
    fig = _figure(at)
    lanes = _lanes(fig)
    assert {"micro-batches", "phases", "steps"} <= lanes
    assert any(y.startswith("CPU") for y in lanes) and any(y.startswith("GPU") for y in lanes)


def test_jump_to_a_step_sets_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(monkeypatch, "ingest-a100-hostbound")
    jump = at.selectbox(key="tl_jump")
    step = next(o for o in jump.options if o.startswith("ProfilerStep#5"))
    jump.set_value(step).run()
    assert not at.exception
    slider = next(s for s in at.slider if str(s.key).startswith("tl_window_"))
    lo, hi = slider.value
    assert 200 < hi - lo < 240  # ProfilerStep#5 is ~220 ms long


def test_a_rewritten_events_file_shows_its_new_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The islands cached on disk (and in the server) follow the events file: rewrite it, the page redraws."""
    import os
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dashboards import timeline_boxes

    runs = tmp_path / "runs"
    shutil.copytree(EXAMPLES / "ingest-a100-hostbound", runs / "ingest-a100-hostbound")
    monkeypatch.setenv(timeline_boxes.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))

    def lanes() -> set[str]:
        at = AppTest.from_file(str(APP), default_timeout=90)
        at.run()
        at.switch_page("views/timeline.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return _lanes(_figure(at))

    thread = "CPU pid 2910249 · thread 2919752"
    assert thread in lanes()
    assert len(list((tmp_path / "cache" / "timeline").iterdir())) == 1
    events = runs / "ingest-a100-hostbound" / "events" / "rank-0.parquet"
    table = pq.read_table(events)
    pq.write_table(table.filter(pc.not_equal(table.column("tid"), 2919752)), events)
    st = events.stat()  # a coarse file-system clock could keep the time: move it on
    os.utime(events, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    after = lanes()
    assert thread not in after and "CPU pid 2910249 · thread 2910249" in after
    assert [p.name for p in (tmp_path / "cache" / "timeline").iterdir()] == [
        timeline_boxes.cache_entry(events).name
    ]
