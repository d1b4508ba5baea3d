"""Step time on verl one-step-off-policy metric logs (an async trainer, its sampler beside the learner):
the step total is the log's ``timing_s/step`` (= the wait for the sampler + the learner's phases + sync), never
that plus ``generate`` (``generate_async``, which ran overlapped with the learner); generate is its own series.

Fixtures: tests/data/metric_logs/verl_one_step_off_*.jsonl, ingested by the real ``mxperf ingest``.
"""

from __future__ import annotations

import json
from pathlib import Path

import dash_fixtures
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import charts, compare, data
from tracing.analysis import steps
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
LOGS = REPO / "tests" / "data" / "metric_logs"
PRECS = ("bf16", "mxfp8")


def _logged(prec: str) -> pd.DataFrame:
    """Per training step the log's own timers (seconds)."""
    rows = [json.loads(line) for line in (LOGS / f"verl_one_step_off_{prec}.jsonl").read_text().splitlines()]
    return pd.DataFrame(
        [{"step": r["step"], **r["data"]} for r in rows if "timing_s/step" in r["data"]]
    ).set_index("step")


def _steady(values: pd.Series) -> pd.Series:
    return values.iloc[1:] if len(values) >= 3 else values  # the warm-up step, as the page leaves it out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one_step_off") / "runs"
    for prec in PRECS:
        log = LOGS / f"verl_one_step_off_{prec}.jsonl"
        dash_fixtures.ingest(root, f"ingest-osp-{prec}", [log], "--label", f"model=sim,precision={prec}")
    return root


def _table(runs: Path, prec: str) -> pd.DataFrame:
    return steps.one_process(store.read_table(runs / f"ingest-osp-{prec}" / store.STEPS))


def test_step_totals_are_the_logged_step_time(runs: Path) -> None:
    for prec in PRECS:
        log = _logged(prec)
        table = _table(runs, prec)
        assert compare.overlapped(table)
        totals = compare.step_totals(table)
        assert totals.to_dict() == pytest.approx(log["timing_s/step"].to_dict())
        learner = log[[f"timing_s/{k}" for k in ("old_log_prob", "ref", "update_actor", "reward", "adv")]]
        serial = log["timing_s/gen"] + log["timing_s/sync_rollout_weights"] + learner.sum(axis=1)
        assert (totals - serial).abs().max() <= 0.5 + 1e-6  # + 0.5 s host time, in 'other'
        summed = serial + log["timing_s/generate_async"]  # what adding every phase gave
        assert ((summed - totals) > 5).all()
        stats = compare.phase_stats(table)
        assert stats.loc["step", "median_s"] == pytest.approx(_steady(log["timing_s/step"]).median())
        assert stats.loc["generate_wait", "median_s"] == pytest.approx(_steady(log["timing_s/gen"]).median())
        assert "overlapped" in (compare.step_total_words(table) or "")


def test_colocated_tables_keep_their_sum() -> None:
    table = pd.DataFrame(
        {
            "step": [1, 1, 1, 2, 2, 2],
            "phase": ["generate", "update", "other"] * 2,
            "seconds": [3.0, 2.0, 0.5, 4.0, 2.0, 0.25],
        }
    )
    assert compare.step_totals(table).tolist() == [5.5, 6.25]
    assert compare.step_total_words(table) is None and not compare.overlapped(table)
    logged = pd.concat([table, pd.DataFrame({"step": [1], "phase": ["step"], "seconds": [7.0]})])
    assert compare.step_totals(logged).tolist() == [7.0, 6.25]  # a logged whole-step time wins


def test_the_overlapped_generation_is_drawn_apart(runs: Path) -> None:
    tables = {p: _table(runs, p) for p in PRECS}
    stats = {p: compare.phase_stats(t) for p, t in tables.items()}
    phases = [p for p in compare.SHOWN_PHASES if any(p in s.index for s in stats.values())]
    for fig in (charts.step_time_median_bars(stats, phases), charts.step_time_per_step_bars(tables, phases)):
        bars = {t.name for t in fig.data if t.type == "bar"}
        assert "generate" not in bars and "generate_wait" in bars
        assert any(t.type == "scatter" and t.name == compare.OVERLAPPED_LABEL for t in fig.data)


def test_step_time_page_shows_the_logged_step(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("views/step_time.py").run()
    assert not at.exception, [e.value for e in at.exception]
    medians = [m.value for m in at.metric if str(m.label).startswith("median step")]
    assert len(medians) == 2, medians
    for shown, prec in zip(medians, PRECS, strict=True):
        log = _logged(prec)
        logged = _steady(log["timing_s/step"]).median()
        summed = _steady(log["timing_s/step"] + log["timing_s/generate_async"]).median()
        assert shown == f"{logged:.3g} s" and shown != f"{summed:.3g} s", (prec, shown)
    captions = " ".join(str(c.value) for c in at.caption)
    assert "step = the logged step time" in captions and "drawn apart, not added" in captions
    diff = next(df.value for df in at.dataframe if len(df.value.columns) and df.value.columns[0] == "phase")
    assert compare.OVERLAPPED_LABEL in set(diff["phase"]) and "generate_wait" in set(diff["phase"])
