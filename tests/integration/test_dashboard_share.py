"""Issue #35 item 5 under AppTest: a view is in its URL. The picked pair, fit, entry (model and phase), basis and
knobs are written to the query as they are picked; a new session opened with that query (a reload, a shared
link) shows the same view; a value the page does not offer is ignored; the sidebar holds the link to copy."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"


def _app(monkeypatch: pytest.MonkeyPatch, query: dict[str, str] | None = None) -> AppTest:
    if not (EXAMPLES / "fit-verl-sim" / store.FITS).is_file():
        pytest.skip("examples/runs lacks fit-verl-sim")
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(EXAMPLES))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params = dict(query or {})
    return at


def _breakeven(at: AppTest) -> AppTest:
    at.switch_page("views/breakeven.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.warning, [w.value for w in at.warning]  # no "set via Session State and a default" box
    return at


def _view(at: AppTest) -> dict:
    return {
        "pair": at.sidebar.selectbox(key="pair_choice").value,
        "fit": at.selectbox(key="be_fit").value,
        "entry": at.selectbox(key="be_entry").value,
        "N": int(at.select_slider(key="be_N").value),
        "n": int(at.select_slider(key="be_n").value),
        "other_s": round(float(at.number_input(key="be_other").value), 4),
        "fixed_scale": float(at.slider(key="be_scale").value),
        "weight_quant": bool(at.toggle(key="be_wq").value),
    }


def test_the_breakeven_view_round_trips_through_its_url(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _breakeven(_app(monkeypatch))
    pairs = at.sidebar.selectbox(key="pair_choice").options
    at.sidebar.selectbox(key="pair_choice").set_value(pairs[-2]).run()  # not the default pair
    at.selectbox(key="be_fit").set_value("fit-tiny-dense").run()
    at.select_slider(key="be_N").set_value(4096).run()
    at.select_slider(key="be_n").set_value(512).run()
    at.number_input(key="be_other").set_value(1.25).run()
    at.slider(key="be_scale").set_value(0.5).run()
    at.toggle(key="be_wq").set_value(True).run()
    assert not at.exception
    picked = _view(at)
    assert picked["pair"] == pairs[-2] and picked["N"] == 4096 and picked["n"] == 512
    query = dict(at.query_params)
    assert query["fit"] == "fit-tiny-dense" and query["N"] == "4096" and query["n"] == "512"
    assert query["fixed_scale"] == "0.5" and query["weight_quant"] == "1" and query["other_s"] == "1.25"
    assert query["entry"] == picked["entry"] and query["pair"] == picked["pair"]  # model and phase

    again = _breakeven(_app(monkeypatch, query))  # a new session from the link: a reload
    assert _view(again) == picked
    code = [str(c.value) for c in again.sidebar.code]
    assert len(code) == 1 and parse_qs(urlsplit(code[0]).query) == {k: [v] for k, v in query.items()}


def test_a_fresh_page_is_not_bound_by_a_link_the_fit_cannot_offer(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _breakeven(_app(monkeypatch, {"fit": "no-such-fit", "N": "3", "fixed_scale": "7", "entry": "x"}))
    first = at.selectbox(key="be_fit").options[0]
    assert at.selectbox(key="be_fit").value == first  # ignored, not an exception
    assert at.slider(key="be_scale").value == 1.0
    assert at.query_params["fit"] == first and at.query_params["fixed_scale"] == "1.0"


def test_a_restored_n_is_kept_but_a_new_fit_starts_from_its_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    at = _breakeven(_app(monkeypatch, {"fit": "fit-tiny-dense", "N": "8192"}))
    assert int(at.select_slider(key="be_N").value) == 8192  # the link's, not the fit's 1,024
    at.selectbox(key="be_fit").set_value("fit-verl-sim").run()
    doc = json.loads((EXAMPLES / "fit-verl-sim" / store.FITS).read_text())
    if doc.get("global_batch_tokens"):
        assert int(at.select_slider(key="be_N").value) == doc["global_batch_tokens"]  # W1 still holds
    assert at.query_params["fit"] == "fit-verl-sim"


def test_the_custom_pair_is_in_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch)
    at.run()
    at.sidebar.selectbox(key="pair_choice").set_value("Choose two outputs…").run()
    at.sidebar.selectbox(key="pair_base").set_value("run-tiny-dense-mxfp8").run()
    at.sidebar.selectbox(key="pair_other").set_value("run-tiny-dense-bf16").run()
    query = dict(at.query_params)
    assert query["base"] == "run-tiny-dense-mxfp8" and query["other"] == "run-tiny-dense-bf16"
    again = _app(monkeypatch, query)
    again.run()
    assert again.sidebar.selectbox(key="pair_base").value == "run-tiny-dense-mxfp8"
    assert again.sidebar.selectbox(key="pair_other").value == "run-tiny-dense-bf16"
    assert not again.warning, [w.value for w in again.warning]


def _timeline_view(at: AppTest) -> dict:
    import json

    slider = next(s for s in at.slider if str(s.key).startswith("tl_window_"))
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    return {
        "trace": at.selectbox(key="tl_trace").value,
        "rank": at.selectbox(key="tl_rank").value,
        "jump": at.selectbox(key="tl_jump").value,
        "window": tuple(slider.value),
        "title": fig["layout"]["title"]["text"],
        "boxes": [(t.get("name"), t.get("y"), t.get("base"), t.get("x")) for t in fig["data"]],
    }


def _timeline(at: AppTest) -> AppTest:
    at.switch_page("views/timeline.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.warning, [w.value for w in at.warning]
    return at


def test_the_timeline_view_round_trips_through_its_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trace, rank, the step jumped to and the zoomed window: a new session on the link draws the same
    chart (title and every box); the window's ends are read back exactly."""
    if not (EXAMPLES / "ingest-2rank" / "events" / "rank-1.parquet").is_file():
        pytest.skip("examples/runs lacks ingest-2rank")
    at = _timeline(_app(monkeypatch))
    at.selectbox(key="tl_trace").set_value("ingest-2rank").run()
    at.selectbox(key="tl_rank").set_value("events/rank-1.parquet").run()
    jump = at.selectbox(key="tl_jump")
    jump.set_value(jump.options[min(2, len(jump.options) - 1)]).run()
    slider = next(s for s in at.slider if str(s.key).startswith("tl_window_"))
    lo, hi = slider.value
    slider.set_value((lo + (hi - lo) * 0.25, lo + (hi - lo) * 0.5)).run()  # zoom into the step
    assert not at.exception, [e.value for e in at.exception]
    picked = _timeline_view(at)
    query = dict(at.query_params)
    assert query["trace"] == "ingest-2rank" and query["rank"] == "rank-1" and query["jump"] == picked["jump"]
    assert tuple(float(v) for v in query["window"].split(",")) == picked["window"]

    again = _timeline(_app(monkeypatch, query))  # a reload, or the link opened elsewhere
    assert _timeline_view(again) == picked
    assert dict(again.query_params) == query
    code = [str(c.value) for c in again.sidebar.code]
    assert len(code) == 1 and parse_qs(urlsplit(code[0]).query) == {k: [v] for k, v in query.items()}


def test_a_timeline_link_the_trace_cannot_offer_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _timeline(
        _app(monkeypatch, {"trace": "ingest-2rank", "rank": "rank-9", "window": "5,1e12", "jump": "nope"})
    )
    assert at.selectbox(key="tl_trace").value == "ingest-2rank"  # what the page offers is taken
    assert at.selectbox(key="tl_rank").value == "events/rank-0.parquet"  # the rest falls back
    slider = next(s for s in at.slider if str(s.key).startswith("tl_window_"))
    assert slider.value[0] == 0.0 and slider.value[1] == slider.max
    assert at.query_params["rank"] == "rank-0" and at.query_params["window"] == f"0.0,{slider.max!r}"
