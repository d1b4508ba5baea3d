"""Every dashboard page under streamlit.testing.v1.AppTest, on real outputs and on broken / symlinked ones.

The pages run for real (Streamlit's script runner, real Parquet files written by the project's writers, real
traces ingested by ``mxperf ingest``); only the browser is absent. Each defect of issue #15 has a test here
(or in the browser test) that fails on the dashboard before it.
"""

from __future__ import annotations

import re
from pathlib import Path

import dash_fixtures
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"
PAGES = (
    "overview",
    "runs",
    "step_time",
    "breakeven",
    "host_stall",
    "timeline",
    "kernels",
    "diff",
    "consistency",
    "weight_sync",
    "add_trace",
)
CUSTOM = "Choose two outputs…"


def _open(runs: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()  # the default page: Overview
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    return at


def _texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def _all_text(at: AppTest) -> str:
    kinds = ("title", "markdown", "caption", "info", "warning", "error", "success", "subheader")
    return "\n".join(t for k in kinds for t in _texts(at, k))


def _charts(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


def _pick(at: AppTest, base: str, other: str) -> AppTest:
    at.selectbox(key="pair_choice").set_value(CUSTOM).run()
    at.selectbox(key="pair_base").set_value(base).run()
    at.selectbox(key="pair_other").set_value(other).run()
    return at


@pytest.fixture(scope="module")
def good_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("good") / "runs")


@pytest.fixture(scope="module")
def broken_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("broken") / "runs")
    dash_fixtures.add_broken_outputs(root)
    return dash_fixtures.add_symlinked_outputs(root, tmp_path_factory.mktemp("outside"))


@pytest.fixture(scope="module")
def knee_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("knee") / "runs"
    root.mkdir()
    dash_fixtures.knee_fit(root)
    return root


@pytest.fixture(scope="module")
def traced_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verl-like BF16 and MXFP8 traces (tests/synthetic_traces.py, truth built in), ingested without
    micro-batch ranges (detected) and fitted, as a user would: mxperf ingest + mxperf fit."""
    import synthetic_traces as syn

    from mxperf.cli import main

    root = tmp_path_factory.mktemp("traced") / "runs"
    steps = ((2048, 1024), (4096, 512, 512), (1024, 1024, 2048), (512, 512, 512, 512))
    for prec in ("bf16", "mxfp8"):
        trace = syn.write_kineto(
            syn.simulate(syn.Job(precision=prec, steps=steps)), root.parent / prec / "rank-0.json.gz"
        )
        dash_fixtures.ingest(root, f"ingest-{prec}", [trace], "--label", f"model=verl-like,precision={prec}")
    assert (
        main(["fit", str(root / "ingest-bf16"), str(root / "ingest-mxfp8"), "-o", str(root / "fit-traces")])
        == 0
    )
    return root


# --------------------------------------------------------------------------------------------- examples
EXAMPLE_CHARTS = {
    "overview": 0,
    "runs": 0,
    "step_time": 2,
    "breakeven": 2,
    "host_stall": 1,
    "timeline": 1,
    "kernels": 1,
    "diff": 1,
    "consistency": 1,
    "weight_sync": 1,
    "add_trace": 0,
}


def _examples() -> None:
    if not any(EXAMPLES.glob("*/manifest.json")):
        pytest.skip("examples/runs holds no outputs yet")


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_its_charts_on_examples(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _examples()
    at = _open(EXAMPLES, page, monkeypatch)
    assert not at.exception, _texts(at, "exception")
    assert not at.warning, _texts(at, "warning")  # every example output reads cleanly
    assert at.title and at.title[0].value
    assert _charts(at) >= EXAMPLE_CHARTS[page]
    assert at.sidebar.expander and "Glossary" in [e.label for e in at.sidebar.expander]


def test_examples_two_rank_trace_reads_the_slowest_rank_never_the_sum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _examples()
    at = _pick(_open(EXAMPLES, "step_time", monkeypatch), "ingest-2rank", "ingest-a100-hostbound")
    assert not at.exception and not at.warning, _texts(at, "warning")
    median = float(at.metric[0].value.removesuffix(" s"))
    assert 0.55 < median < 0.7  # ~0.61 s per rank; the old page read 1.23 s (both ranks summed)
    assert at.selectbox(key="st_rank_ingest-2rank").options[1:] == ["rank 0", "rank 1"]
    text = _all_text(at)
    assert "## forward ##" in " ".join(str(df.value.to_dict()) for df in at.dataframe) or "forward" in text
    assert "No range in this trace maps to an RL phase" in text  # not 0 s everywhere with n/a


def test_examples_host_stall_comes_from_real_gpu_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    _examples()
    at = _open(EXAMPLES, "host_stall", monkeypatch)
    for trace in at.selectbox(key="hs_trace").options:
        at.selectbox(key="hs_trace").set_value(trace).run()
        assert not at.exception, (trace, _texts(at, "exception"))
        # the windows' shares table (a trace with GPU micro-batches adds per-size tables after it)
        shares = next(d.value for d in reversed(at.dataframe) if "busy %" in d.value.columns)
        assert ((shares["busy %"] > 0) & (shares["host stall %"] >= 0)).all(), trace
        devices = at.dataframe[0].value
        assert not devices["process"].astype(str).str.contains("None").any(), trace
        windows = at.selectbox(key="hs_window_a").options
        assert not any("op_id" in w or "@ -" in w for w in windows), (trace, windows[:5])


def test_examples_say_cpu_results_are_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    _examples()
    at = _open(EXAMPLES, "runs", monkeypatch)
    assert any("emulated" in s for s in _texts(at, "info"))
    table = at.dataframe[0].value.set_index("path")
    assert table.loc["run-tiny-dense-mxfp8", "low precision"] == "emulated"
    assert "A100" in table.loc["ingest-a100-hostbound", "device"]  # the GPU in the trace, not "CPU"
    at.switch_page("views/step_time.py").run()
    assert sum("emulated" in c for c in _texts(at, "caption")) >= 1  # on the run card itself


# --------------------------------------------------------------------------------------------- runs
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
        "ingest-unmapped",
        "verl-bf16",
        "verl-mxfp8",
        "faults",
        "consistency",
    }
    assert at.selectbox(key="pair_choice").value == "tiny-dense: bf16 vs mxfp8"
    assert any("Comparing `run-bf16` (baseline) with `run-mxfp8`" in s for s in _texts(at, "success"))
    assert len(at.get("download_button")) >= 2


def test_runs_page_filters(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "runs", monkeypatch)
    at.multiselect(key="runs_kind").select("sweep").run()
    assert list(at.dataframe[0].value["path"]) == ["sweep-tiny-dense"]
    at.multiselect(key="runs_kind").unselect("sweep").run()
    at.text_input(key="runs_text").input("H100").run()
    assert set(at.dataframe[0].value["path"]) == {"ingest-gpu", "ingest-unmapped"}


# --------------------------------------------------------------------------------------------- step time
def test_step_time_spells_out_the_differences_with_spread_and_sync_checks(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(good_runs, "step_time", monkeypatch)
    assert not at.exception and not at.warning, _texts(at, "warning")
    words = [m for m in _texts(at, "markdown") if m.startswith("### mxfp8 vs bf16")]
    assert words and "(medians of 5 vs 5 steps)" in words[0]
    assert "update -20 %" in words[0] and "sync checks +" in words[0] and "step -" in words[0]
    diff = at.dataframe[0].value.set_index("phase")
    assert "sync checks" in diff.index  # checks out of the sync phase, shown apart
    assert {"change", "spread"} <= set(diff.columns)
    assert _charts(at) == 2
    assert [s.value for s in at.subheader][-2:] == [
        "Median step time by phase",
        "Every step",
    ]  # not "Averaged"


def test_compare_picker_never_offers_the_same_output_twice(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _pick(_open(good_runs, "step_time", monkeypatch), "run-bf16", "run-mxfp8")
    assert "run-bf16" not in at.selectbox(key="pair_other").options
    at.selectbox(key="pair_base").set_value("run-mxfp8").run()
    assert "run-mxfp8" not in at.selectbox(key="pair_other").options
    assert at.selectbox(key="pair_other").value != at.selectbox(key="pair_base").value
    offered = set(at.selectbox(key="pair_base").options)
    assert "faults" not in offered and "consistency" not in offered  # no per-step times: not offered
    assert not at.exception


def test_multi_rank_trace_has_a_rank_picker_stragglers_and_the_max_step(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _pick(_open(good_runs, "step_time", monkeypatch), "ingest-gpu", "run-bf16")
    assert not at.exception and not at.warning, _texts(at, "warning")
    rank = at.selectbox(key="st_rank_ingest-gpu")
    assert rank.options[1:] == ["rank 0", "rank 1"]
    job = float(at.metric[0].value.removesuffix(" s"))
    rank.set_value("rank 0").run()
    r0 = float(at.metric[0].value.removesuffix(" s"))
    at.selectbox(key="st_rank_ingest-gpu").set_value("rank 1").run()
    r1 = float(at.metric[0].value.removesuffix(" s"))
    assert job == pytest.approx(max(r0, r1), rel=0.01) and r1 > r0  # rank 1 is the built-in straggler
    at.selectbox(key="st_rank_ingest-gpu").set_value(rank.options[0]).run()
    slow = next(df.value for df in at.dataframe if "slowest" in df.value.columns)
    assert (slow["slowest"] == "rank 1").all() and (slow["processes"] == 2).all()
    summary = next(df.value for df in at.dataframe if "slowest_in" in df.value.columns)
    assert summary.set_index("process").loc["rank 1", "slowest_in"] == 2  # steps 1, 2 (step 0: warm-up)


def test_a_trace_without_phase_names_is_split_by_its_own_ranges(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _pick(_open(good_runs, "step_time", monkeypatch), "ingest-unmapped", "ingest-gpu")
    assert not at.exception
    assert any("No range in this trace maps to an RL phase" in s for s in _texts(at, "info"))
    names = next(df.value for df in at.dataframe if "median s per step" in df.value.columns)
    assert {"## forward ##", "## backward ##"} <= set(names["name"])


# --------------------------------------------------------------------------------------------- breakeven
def test_breakeven_names_the_case_and_keeps_n_within_n_global(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(good_runs, "breakeven", monkeypatch)
    assert not at.exception and not at.warning, _texts(at, "warning")
    md = " ".join(_texts(at, "markdown"))
    assert "mxfp8 is faster than bf16 above n* = " in md and "tokens per micro-batch (95 % CI" in md
    assert "us/token" not in _all_text(at)
    n_global, n = at.select_slider(key="be_N"), at.select_slider(key="be_n")
    assert n_global.value != n_global.options[0]  # starts at the fit's global batch, not the far left
    assert max(int(o) for o in n.options) <= int(n_global.value)
    n_global.set_value(1024).run()
    assert max(int(o) for o in at.select_slider(key="be_n").options) <= 1024
    assert int(at.select_slider(key="be_n").value) <= 1024


def test_breakeven_says_no_difference_inside_the_interval(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(good_runs, "breakeven", monkeypatch)
    at.select_slider(key="be_N").set_value(8192).run()
    at.select_slider(key="be_n").set_value(2048).run()  # the built-in n* is 2,000 tokens
    line = next(m for m in _texts(at, "markdown") if m.startswith("At n = 2,048"))
    assert "No significant difference" in line and "95 % CI" in line
    at.select_slider(key="be_n").set_value(256).run()
    line = next(m for m in _texts(at, "markdown") if m.startswith("At n = 256"))
    assert "mxfp8 is " in line and "slower" in line and "95 % CI" in line


def test_breakeven_what_ifs_move_the_crossing(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "breakeven", monkeypatch)
    at.select_slider(key="be_N").set_value(65536).run()

    def crossing() -> float:
        (cap,) = [c for c in _texts(at, "caption") if "step times cross at n = " in c]
        return float(re.search(r"n = ([\d,]+)", cap).group(1).replace(",", ""))

    before = crossing()
    at.slider(key="be_scale").set_value(0.5).run()
    assert crossing() == pytest.approx(before / 2, abs=1)
    at.toggle(key="be_wq").set_value(True).run()
    assert any("a scenario, no interval" in m for m in _texts(at, "markdown"))
    assert not at.exception


def test_breakeven_overlays_a_second_fit_and_checks_runs_against_the_prediction(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(good_runs, "breakeven", monkeypatch)
    check = next(df.value for df in at.dataframe if "inside band" in df.value.columns)
    assert set(check["run"]) == {"run-bf16", "run-mxfp8"} and check["error %"].notna().all()
    at.selectbox(key="be_overlay").set_value("fit-tiny-dense").run()  # overlaying itself: ignored
    assert not at.exception
    assert len(at.get("download_button")) >= 3  # fits.json, report.md, tables, figures


def test_breakeven_draws_the_knee_the_data_chose_and_both_bases(
    knee_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(knee_runs, "breakeven", monkeypatch)
    assert not at.exception and not at.warning, _texts(at, "warning")
    assert any("the data chose a parts model, knee at" in c for c in _texts(at, "caption"))
    facts = next(df.value for df in at.dataframe if "measured crossing" in df.value.columns).set_index(
        "basis"
    )
    assert facts.loc["wall clock", "model ok"] == "no"
    assert facts.loc["wall clock", "measured crossing"] == "2,048 – 8,192"
    fits = next(df.value for df in at.dataframe if "knee tokens" in df.value.columns)
    assert set(fits["model"]) == {"parts"}
    assert any("from the knee model the data chose" in m for m in _texts(at, "markdown"))
    assert at.radio(key="be_basis").options == ["wall clock", "GPU busy (host overhead removed)"]
    at.radio(key="be_basis").set_value("GPU busy (host overhead removed)").run()
    assert not at.exception
    assert any("GPU busy time (host overhead removed)" in m for m in _texts(at, "markdown"))
    assert any(s.endswith("(GPU busy (host overhead removed))") for s in (x.value for x in at.subheader))


def test_breakeven_from_traces_shows_detected_micro_batches_and_their_sources(
    traced_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(traced_runs, "breakeven", monkeypatch)
    assert not at.exception and not at.warning, _texts(at, "warning")
    at.selectbox(key="be_entry").set_value(
        next(o for o in at.selectbox(key="be_entry").options if "/ update" in o)
    ).run()
    per_size = next(df.value for df in at.dataframe if "micro_batches" in df.value.columns)
    assert set(per_size["source"]) == {"detected"}
    sources = next(df.value for df in at.dataframe if list(df.value.columns) == ["number", "from"])
    assert "microbatches.parquet" in sources.set_index("number").loc["wall", "from"]
    assert at.radio(key="be_basis").options[1] == "GPU busy (host overhead removed)"
    at.switch_page("views/step_time.py").run()  # the labelled traces are the automatic pair
    assert any(
        "24 micro-batches in this trace: logprob 12 (detected), update 12 (detected)" in c
        for c in _texts(at, "caption")
    )
    at.switch_page("views/host_stall.py").run()  # the same traces' GPU numbers, side by side by default
    assert not at.exception and _charts(at) >= 3  # two timelines, then host stall per micro-batch size


# --------------------------------------------------------------------------------------------- host stall
def test_host_stall_opens_on_the_pairs_traces_side_by_side(
    good_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _pick(_open(good_runs, "host_stall", monkeypatch), "ingest-gpu", "ingest-unmapped")
    assert not at.exception and not at.warning, _texts(at, "warning")
    assert at.selectbox(key="hs_trace").value == "ingest-gpu"
    assert at.selectbox(key="hs_other").value == "ingest-unmapped"
    assert _charts(at) == 2  # a timeline per side
    both = at.dataframe[-1].value
    assert set(both["trace"]) == {"ingest-gpu", "ingest-unmapped"}
    assert ((both["host stall %"] > 0) & (both["host stall %"] < 100)).all()
    windows = at.selectbox(key="hs_window_a").options
    assert windows[0] == "whole trace" and windows[1].startswith("ProfilerStep#0 @ 0.0 ms")


def test_host_stall_says_why_cpu_runs_have_none(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "host_stall", monkeypatch)
    assert not at.exception
    assert any("has no GPU trace" in s for s in _texts(at, "info"))
    assert any("no GPU trace" in c for c in _texts(at, "caption"))
    assert _charts(at) == 1  # the first card is a trace, never an empty card


# --------------------------------------------------------------------------------------------- consistency, sync
def test_consistency_and_weight_sync_pages(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "consistency", monkeypatch)
    assert (
        not at.exception and _charts(at) == 3
    )  # metric-log mismatch + per step + every pairing at fixed weights
    assert any("can come out negative" in c for c in _texts(at, "caption"))
    assert any("steps" in df.value.columns for df in at.dataframe)
    at = _open(good_runs, "weight_sync", monkeypatch)
    assert not at.exception
    assert _texts(at, "error") == [
        "2 of 42 checks failed; first: I1 (grid identity) at step 4 on tensor "
        "model.layers.0.self_attn.qkv_proj.weight_scale."
    ]
    assert _charts(at) == 2  # invariants per sync + fault matrix
    faults = at.dataframe[-1].value.set_index("fault")
    assert faults.loc["dropped_expert", "first caught"] == "never"
    assert faults.loc["flipped_scale_byte", "first caught"] == "sync after step 0"
    assert any("Grey: the check was not triggered" in c for c in _texts(at, "caption"))


def test_metric_log_imports_compare_like_runs(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(good_runs, "step_time", monkeypatch)
    at.selectbox(key="pair_choice").set_value("qwen3-8b: bf16 vs mxfp8").run()
    assert not at.exception and not at.warning, _texts(at, "warning")
    words = next(m for m in _texts(at, "markdown") if m.startswith("### mxfp8 vs bf16"))
    assert "update -20 %" in words and "generate" in words
    assert any("verl metric log (device not recorded)" in c for c in _texts(at, "caption"))
    at.switch_page("views/consistency.py").run()
    assert "Metric-log imports (verl / NeMo RL): mismatch per step" in [s.value for s in at.subheader]
    medians = next(df.value for df in at.dataframe if "metric" in df.value.columns)
    assert {"kl_k1", "kl_k3"} <= set(medians["metric"])


# --------------------------------------------------------------------------------------------- add a trace
def test_add_a_trace_from_a_path_under_the_runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    dash_fixtures.kineto_trace(runs / "incoming" / "rank-0.json.gz", 0)
    (runs / "incoming" / "broken.json").write_text('{"traceEvents": [')
    at = _open(runs, "add_trace", monkeypatch)
    at.radio(key="add_source").set_value("A file under the runs directory").run()
    assert at.multiselect(key="add_pick").options == ["incoming/broken.json", "incoming/rank-0.json.gz"]
    at.multiselect(key="add_pick").select("incoming/rank-0.json.gz").run()
    at.text_input(key="add_name").input("ingest-mine").run()
    at.selectbox(key="add_precision").set_value("mxfp8").run()
    at.text_input(key="add_model").input("tiny-dense").run()
    at.button(key="add_go").click().run()
    assert not at.exception and not at.error, _texts(at, "error")
    assert any("`ingest-mine` is now listed" in s for s in _texts(at, "success"))
    manifest = store.read_json(runs / "ingest-mine" / store.MANIFEST)
    assert manifest["status"] == "complete" and manifest["config"]["labels"]["precision"] == "mxfp8"
    at.switch_page("views/runs.py").run()
    assert "ingest-mine" in set(at.dataframe[0].value["path"])
    # the CLI's own error, verbatim, for a broken trace; nothing written outside RUNS_DIR
    at.switch_page("views/add_trace.py").run()
    at.radio(key="add_source").set_value("A file under the runs directory").run()
    at.multiselect(key="add_pick").select("incoming/broken.json").run()
    at.text_input(key="add_name").input("ingest-broken").run()
    at.button(key="add_go").click().run()
    assert any(e.startswith("mxperf ingest: error: ") and "broken.json" in e for e in _texts(at, "error"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_add_a_trace_refuses_an_existing_or_escaping_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    dash_fixtures.kineto_trace(runs / "t" / "rank-0.json.gz", 0)
    (runs / "taken").mkdir()
    for name in ("taken", "../escape"):
        at = _open(runs, "add_trace", monkeypatch)
        at.radio(key="add_source").set_value("A file under the runs directory").run()
        at.multiselect(key="add_pick").select("t/rank-0.json.gz").run()
        at.text_input(key="add_name").input(name).run()
        at.button(key="add_go").click().run()
        assert at.error and not at.exception, name
    assert not (tmp_path / "escape").exists() and sorted(p.name for p in (runs / "taken").iterdir()) == []


# --------------------------------------------------------------------------------------------- broken outputs
@pytest.mark.parametrize("page", PAGES)
def test_broken_and_symlinked_outputs_give_card_messages_not_exceptions(
    page: str, broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, page, monkeypatch)
    assert not at.exception, _texts(at, "exception")
    assert at.title[0].value
    assert dash_fixtures.SECRET not in _all_text(at)  # the linked manifest's content is never shown
    for df in at.dataframe:
        assert dash_fixtures.SECRET not in df.value.to_string()


def test_broken_outputs_are_named_on_runs_page(broken_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(broken_runs, "runs", monkeypatch)
    warning = " ".join(_texts(at, "warning"))
    assert "run-halfwritten" in warning and "status: running" in warning
    assert "bad-manifest" in warning and "run-failed" in warning
    assert "linked-manifest" in warning and "outside the runs directory" in warning


def test_a_complete_run_with_a_corrupt_table_is_never_the_auto_pair(
    broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, "step_time", monkeypatch)
    assert at.selectbox(key="pair_choice").value == "tiny-dense: bf16 vs mxfp8"
    assert not at.warning, _texts(at, "warning")  # both sides have phase times
    assert _charts(at) == 2
    assert any("run-mxfp8-corrupt" in m for m in _texts(at, "markdown"))  # listed as not offered, with why
    assert any("· compared `run-mxfp8` (mxfp8)" in c for c in _texts(at, "caption"))


def test_a_broken_sweep_manifest_is_named_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = dash_fixtures.make_runs_dir(tmp_path / "runs")
    (runs / "sweep-tiny-dense" / store.MANIFEST).write_text('{"kind": "sweep", ')
    at = _open(runs, "breakeven", monkeypatch)
    assert not at.exception
    warning = " ".join(_texts(at, "warning"))
    assert "sweep-tiny-dense" in warning and "not valid JSON" in warning
    assert not any("No micro-batch table of this model" in c for c in _texts(at, "caption"))


def test_corrupt_and_linked_tables_show_on_their_cards(
    broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, "consistency", monkeypatch)
    assert any(
        "run-corrupt/metrics.parquet: not a readable Parquet table" in w for w in _texts(at, "warning")
    )
    assert _charts(at) == 3  # metric logs, and the bf16 and mxfp8 runs still drawn
    at.switch_page("views/weight_sync.py").run()
    for rel, why in (
        ("run-corrupt", "run-corrupt/sync_checks.parquet"),
        ("run-linked-sync", "outside the runs"),
    ):
        at.selectbox(key="sync_run").set_value(rel).run()
        assert not at.exception, rel
        assert any(why in w for w in _texts(at, "warning")), (rel, _texts(at, "warning"))


def test_odd_manifests_give_messages_not_exceptions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = dash_fixtures.add_odd_outputs(tmp_path / "runs")
    for page in PAGES:
        at = _open(runs, page, monkeypatch)
        assert not at.exception, (page, _texts(at, "exception"))
    at = _open(runs, "breakeven", monkeypatch)
    said = {}
    for fit in at.selectbox(key="be_fit").options:
        at.selectbox(key="be_fit").set_value(fit).run()
        assert not at.exception, (fit, _texts(at, "exception"))
        said[fit] = " ".join(_texts(at, "warning"))
    assert "no fits.json" in said["bare-fit"] and "no models fitted" in said["fit-empty"]
    assert "models[0] lacks" in said["fit-incomplete"]


def test_missing_runs_dir_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(tmp_path / "does-not-exist", "runs", monkeypatch)
    assert not at.exception
    assert any("does not exist" in e for e in _texts(at, "error"))


def test_empty_runs_dir_says_how_to_make_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for page in PAGES:
        at = _open(tmp_path, page, monkeypatch)
        assert not at.exception, (page, _texts(at, "exception"))
        assert at.info or page == "add_trace", page


def test_ingested_trace_can_be_compared_like_a_run(good_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _pick(_open(good_runs, "step_time", monkeypatch), "ingest-gpu", "run-mxfp8")
    assert not at.exception, _texts(at, "exception")
    assert not _texts(at, "warning")
    assert _charts(at) >= 2
    assert any(s.startswith("### mxfp8 vs ingest-gpu") for s in _texts(at, "markdown"))


def test_step_time_says_how_steps_without_step_ranges_were_found(tmp_path, monkeypatch) -> None:
    """verl-style traces (a file per profiled step, no ProfilerStep#N): the page says the steps are inferred
    and numbered on across a rank's files."""
    import synthetic_traces as stt

    from mxperf.cli import main

    runs = tmp_path / "runs"
    for prec in ("bf16", "mxfp8"):
        for k in range(2):
            job = stt.Job(
                precision=prec,
                steps=((512, 1024),),
                seed=k,
                profiler_steps=False,
                base_time_ns=1_700_000_000_000_000_000 + k * 10**10,
            )
            stt.write_kineto(stt.simulate(job), tmp_path / prec / f"actor_e2e_rank0-of-1_pid4242_{k}.json.gz")
        assert main(["ingest", str(tmp_path / prec), "-o", str(runs / f"ing-{prec}"), "--no-progress"]) == 0
    at = _pick(_open(runs, "step_time", monkeypatch), "ing-bf16", "ing-mxfp8")
    assert not at.exception, _texts(at, "exception")
    steps = [c for c in _texts(at, "caption") if c.startswith("Steps: ")]
    assert any("1 step(s) inferred from its phase ranges" in c for c in steps)
    assert any("numbered 1-1: file 2 of 2 of rank 0 (pid 4242) in time order" in c for c in steps)
