"""Every dashboard page under streamlit.testing.v1.AppTest, on real outputs and on broken ones.

The pages run for real (Streamlit's script runner, real Parquet files written by the project's writers);
only the browser is absent. ``examples/runs`` is used when it holds outputs; otherwise (and always for the
broken-output cases) a small RUNS_DIR is built with ``tests/dash_fixtures.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import dash_fixtures
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"
PAGES = ("runs", "step_time", "breakeven", "host_stall", "consistency", "weight_sync")


def _open(runs: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=30)
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}.py").run()
    return at


def _texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def _charts(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


@pytest.fixture(scope="module")
def good_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("good"))


@pytest.fixture(scope="module")
def broken_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("broken"))
    return dash_fixtures.add_broken_outputs(root)


# Charts each page must draw on the shipped examples (real CPU runs, sweep, fit and real GPU traces).
EXAMPLE_CHARTS = {
    "runs": 0,
    "step_time": 2,
    "breakeven": 2,
    "host_stall": 1,
    "consistency": 1,
    "weight_sync": 1,
}


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_its_charts_on_examples(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not any(EXAMPLES.glob("*/manifest.json")):
        pytest.skip("examples/runs holds no outputs yet")
    at = _open(EXAMPLES, page, monkeypatch)
    assert not at.exception, _texts(at, "exception")
    assert not at.warning, _texts(at, "warning")  # every example output reads cleanly
    assert at.title and at.title[0].value
    assert _charts(at) >= EXAMPLE_CHARTS[page]


def test_examples_host_stall_comes_from_real_gpu_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    if not any(EXAMPLES.glob("ingest-*/manifest.json")):
        pytest.skip("examples/runs holds no ingested trace yet")
    at = _open(EXAMPLES, "host_stall", monkeypatch)
    for trace in at.selectbox(key="hs_trace").options:
        at.selectbox(key="hs_trace").set_value(trace).run()
        assert not at.exception, (trace, _texts(at, "exception"))
        shares = at.dataframe[-1].value
        assert ((shares["busy %"] > 0) & (shares["host stall %"] >= 0)).all(), trace


def test_runs_page_lists_outputs_and_the_auto_pair(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "runs", monkeypatch)
    assert not at.exception
    table = at.dataframe[0].value
    assert set(table["path"]) == {
        "run-bf16",
        "run-mxfp8",
        "sweep-tiny-dense",
        "fit-tiny-dense",
        "ingest-gpu",
        "faults",
        "consistency",
    }
    assert at.selectbox(key="pair_choice").value == "tiny-dense: bf16/bf16 vs mxfp8/mxfp8"
    assert any("Comparing `run-bf16` (baseline) with `run-mxfp8`" in s for s in _texts(at, "success"))


def test_runs_page_filter_by_kind(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "runs", monkeypatch)
    at.multiselect(key="runs_kind").select("sweep").run()
    assert list(at.dataframe[0].value["path"]) == ["sweep-tiny-dense"]


def test_step_time_spells_out_the_differences(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "step_time", monkeypatch)
    assert not at.exception
    words = [m for m in _texts(at, "markdown") if m.startswith("### mxfp8/mxfp8 vs bf16/bf16:")]
    assert words and "update -20 %" in words[0] and "sync +" in words[0] and "step -" in words[0]
    assert _charts(at) == 2


def test_breakeven_names_the_case_and_predicts_step_time(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(good_runs, "breakeven", monkeypatch)
    assert not at.exception
    md = " ".join(_texts(at, "markdown"))
    assert "mxfp8 is faster than bf16 above n* = " in md and "tokens per micro-batch (95 % CI" in md
    assert _charts(at) == 2

    def crossing() -> float:
        (cap,) = [c for c in _texts(at, "caption") if "lines cross at n* = " in c]
        return float(re.search(r"n\* = ([\d,]+)", cap).group(1).replace(",", ""))

    before = crossing()
    at.slider[2].set_value(0.5).run()  # fixed_scale: half the fixed cost MXFP8 adds halves the crossing
    assert crossing() == pytest.approx(before / 2, abs=1)


def test_host_stall_says_why_cpu_sweeps_have_none_and_draws_the_gpu_timeline(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(good_runs, "host_stall", monkeypatch)
    assert not at.exception
    assert any("no GPU trace" in s for s in _texts(at, "info"))
    assert _charts(at) == 1
    shares = at.dataframe[-1].value
    assert 0 < shares["host stall %"].iloc[0] < 100


def test_consistency_and_weight_sync_pages(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "consistency", monkeypatch)
    assert not at.exception and _charts(at) == 2  # per step + every pairing at fixed weights
    at = _open(good_runs, "weight_sync", monkeypatch)
    assert not at.exception
    assert _texts(at, "error") == [
        "2 of 42 checks failed; first: I1 (grid identity) at step 4 on tensor "
        "model.layers.0.self_attn.qkv_proj.weight_scale."
    ]
    assert _charts(at) == 2  # invariants per sync + fault matrix
    assert "dropped_expert" in set(at.dataframe[-1].value["fault"])


@pytest.mark.parametrize("page", PAGES)
def test_broken_outputs_give_card_messages_not_exceptions(
    page: str, broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, page, monkeypatch)
    assert not at.exception, _texts(at, "exception")
    assert at.title[0].value


def test_broken_outputs_are_named_on_runs_page(broken_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(broken_runs, "runs", monkeypatch)
    warning = " ".join(_texts(at, "warning"))
    assert "run-halfwritten" in warning and "status: running" in warning
    assert "bad-manifest" in warning and "run-failed" in warning


def test_corrupt_table_shows_on_its_card_and_other_runs_still_render(
    broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, "consistency", monkeypatch)
    assert any(
        "run-corrupt/metrics.parquet: not a readable Parquet table" in w for w in _texts(at, "warning")
    )
    assert _charts(at) == 2  # bf16 and mxfp8 runs still drawn
    at.selectbox(key="pair_choice").set_value("Choose two runs…").run()
    at.selectbox(key="pair_other").set_value(
        next(o for o in at.selectbox(key="pair_other").options if o.startswith("run-corrupt"))
    ).run()
    at.switch_page("views/step_time.py").run()
    assert not at.exception
    assert any("run-corrupt/metrics.parquet" in w for w in _texts(at, "warning"))
    at.switch_page("views/weight_sync.py").run()
    runs = at.selectbox(key="sync_run")
    runs.set_value(next(o for o in runs.options if o.startswith("run-corrupt"))).run()
    assert any("run-corrupt/sync_checks.parquet" in w for w in _texts(at, "warning"))


def test_missing_runs_dir_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(tmp_path / "does-not-exist", "runs", monkeypatch)
    assert not at.exception
    assert any("does not exist" in e for e in _texts(at, "error"))


def test_empty_runs_dir_says_how_to_make_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for page in PAGES:
        at = _open(tmp_path, page, monkeypatch)
        assert not at.exception, (page, _texts(at, "exception"))
        assert at.info, page


def test_ingested_trace_can_be_compared_like_a_run(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "step_time", monkeypatch)
    at.selectbox(key="pair_choice").set_value("Choose two runs…").run()
    base = at.selectbox(key="pair_base")
    base.set_value(next(o for o in base.options if o.startswith("ingest-gpu"))).run()
    other = at.selectbox(key="pair_other")
    other.set_value(next(o for o in other.options if o.startswith("run-mxfp8"))).run()
    assert not at.exception, _texts(at, "exception")
    assert not _texts(at, "warning")
    assert _charts(at) == 2
    assert any(s.startswith("### mxfp8/mxfp8 vs ingest-gpu:") for s in _texts(at, "markdown"))
