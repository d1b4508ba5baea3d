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


# --------------------------------------------------------------------------------------------- (a)
def _sync_check_ms(caption: str) -> float:
    import re

    return float(re.search(r"Cost of the checks: median ([\d.]+) ms", caption)[1])


def test_sync_check_cost_is_one_number_on_step_time_and_weight_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    _examples("run-tiny-dense-bf16", "run-tiny-dense-mxfp8")
    at = _open(EXAMPLES, "weight_sync", monkeypatch)
    seen = {}
    for rel in ("run-tiny-dense-mxfp8", "run-tiny-dense-bf16"):
        at.selectbox(key="sync_run").set_value(rel).run()
        cap = next(c for c in _texts(at, "caption") if "Cost of the checks" in c)
        assert "warm-up step left out" in cap and "initial sync" in cap
        metrics = pd.read_parquet(EXAMPLES / rel / store.METRICS).sort_values("step")
        want = metrics["sync_check_s"].iloc[1:].median()  # the Step time rule: warm-up step out
        assert _sync_check_ms(cap) == pytest.approx(want * 1e3, abs=0.05), rel
        seen[rel] = want
    st = _open(EXAMPLES, "step_time", monkeypatch)
    diff = next(df.value for df in st.dataframe if "phase" in df.value.columns)
    row = diff[diff["phase"] == "sync checks"].iloc[0]
    cells = [str(v) for v in row.to_numpy()]
    assert any(c.startswith(f"{seen['run-tiny-dense-mxfp8']:.4g} [") for c in cells), cells
    assert any(c.startswith(f"{seen['run-tiny-dense-bf16']:.4g} [") for c in cells), cells
    assert any("Weight sync shows the same number" in c for c in _texts(st, "caption"))


def test_breakeven_other_phases_from_the_pair_use_mxperf_fits_rule_warm_up_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older fits.json without other phases: Breakeven fills them from the sidebar pair's run folders by the
    function mxperf fit uses (every step, warm-up included), and its caption says which steps."""
    import shutil

    from perfmodel.inputs.load import read_run_folder
    from perfmodel.step.model import other_phase_seconds

    names = ("fit-tiny-dense", "run-tiny-dense-bf16", "run-tiny-dense-mxfp8")
    _examples(*names)
    runs = tmp_path / "runs"
    for n in names:
        shutil.copytree(EXAMPLES / n, runs / n)
    doc = json.loads((runs / "fit-tiny-dense" / store.FITS).read_text())
    for m in doc["models"]:
        (m.get("step") or {}).pop("other_phases_by_precision_s", None)  # the older format
    (runs / "fit-tiny-dense" / store.FITS).write_text(json.dumps(doc))
    at = _open(runs, "breakeven", monkeypatch)
    folders = [
        read_run_folder(runs / n, json.loads((runs / n / store.MANIFEST).read_text())) for n in names[1:]
    ]
    own = other_phase_seconds("tiny-dense", ["bf16", "mxfp8"], folders, {}, {}, exclude="update")
    assert at.number_input(key="be_other").value == pytest.approx(sum(own["bf16"].values()), abs=1e-4)
    assert at.number_input(key="be_other_low").value == pytest.approx(sum(own["mxfp8"].values()), abs=1e-4)
    cap = next(c for c in _texts(at, "caption") if c.startswith("Other phases from"))
    assert "warm-up step included" in cap and "Step time" in cap


# --------------------------------------------------------------------------------------------- (e)
def test_cpu_consistency_and_fault_outputs_are_marked_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    _examples("consistency-tiny-dense", "faults-tiny-dense")
    for rel in ("consistency-tiny-dense", "faults-tiny-dense"):
        assert json.loads((EXAMPLES / rel / store.MANIFEST).read_text())["learner_device"] == "cpu"
    at = _open(EXAMPLES, "consistency", monkeypatch)
    marks = [c for c in _texts(at, "caption") if "`consistency-tiny-dense`" in c]
    assert marks and ":orange-badge[emulated]" in marks[0] and "mxfp8" in marks[0], marks
    at = _open(EXAMPLES, "weight_sync", monkeypatch)
    marks = [c for c in _texts(at, "caption") if "`faults-tiny-dense`" in c]
    assert marks and ":orange-badge[emulated]" in marks[0] and "CPU" in marks[0], marks


# --------------------------------------------------------------------------------------------- (f)
def test_a_folder_linked_from_outside_is_said_skipped_once_on_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dash_fixtures

    runs = dash_fixtures.make_runs_dir(tmp_path / "runs")
    dash_fixtures.add_symlinked_outputs(runs, tmp_path / "outside")
    assert (runs / "linked-folder").is_symlink()
    at = _open(runs, "runs", monkeypatch)
    said = [w for w in _texts(at, "warning") if "links outside the runs folder" in w]
    assert len(said) == 1 and said[0].startswith("1 output(s) skipped") and "`linked-folder`" in said[0], said
    assert str(tmp_path / "outside") not in said[0]  # the link is named, never where it points
    assert not any(
        e.value["path"].str.contains("linked-folder").any() for e in at.dataframe if "path" in e.value
    )


# --------------------------------------------------------------------------------------------- (g)
def test_a_missed_step_prediction_is_a_visible_warning_on_breakeven_and_step_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fits.json's step validation (perfmodel.step.validation) says the prediction misses a run by -55 %:
    Breakeven (under the answer) and Step time (its run is in the sidebar pair) warn in mxperf fit's words."""
    import shutil

    from perfmodel.step.validation import validation_words

    names = ("fit-tiny-dense", "run-tiny-dense-bf16", "run-tiny-dense-mxfp8")
    _examples(*names)
    runs = tmp_path / "runs"
    for n in names:
        shutil.copytree(EXAMPLES / n, runs / n)
    doc = json.loads((runs / "fit-tiny-dense" / store.FITS).read_text())
    assert doc.get("step_model"), "the example fit has a step model"
    row = {"run": "examples/runs/run-tiny-dense-bf16", "phase": "step", "precision": "bf16", "kind": "step",
           "steps": 4, "predicted_s": 2.5, "predicted_ci": [2.4, 2.6], "measured_s": 5.6,
           "error_pct": -55.4, "inside": False}  # fmt: skip
    validation = {
        "rows": [row],
        "median_abs_error_pct": 55.4,
        "counted_rows": 1,
        "misses": [{k: row[k] for k in ("run", "precision", "error_pct", "inside")}],
    }
    doc["step_model"][0]["validation"] = validation
    (runs / "fit-tiny-dense" / store.FITS).write_text(json.dumps(doc))
    words = validation_words(validation)
    assert words and "misses" in words
    at = _open(runs, "breakeven", monkeypatch)
    assert any(words in w and "-55 %" in w for w in _texts(at, "warning")), _texts(at, "warning")
    at = _open(runs, "step_time", monkeypatch)
    assert any(words in w and "`fit-tiny-dense`" in w for w in _texts(at, "warning")), _texts(at, "warning")
