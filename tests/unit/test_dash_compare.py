"""dashboards.compare: pairing BF16 with MXFP8 and the per-phase difference in words."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboards import compare
from dashboards.data import OutputEntry
from tracing.analysis import steps


def _run(
    rel: str,
    learner: str,
    sampler: str | None = None,
    model: str = "m",
    created: str = "2026-01-01",
    status: str = "complete",
) -> OutputEntry:
    return OutputEntry(
        rel=rel,
        kind="run",
        status=status,
        model=model,
        learner=learner,
        sampler=sampler or learner,
        created=created,
    )


def test_pairs_newest_bf16_with_newest_mxfp8_per_model() -> None:
    entries = [
        _run("old-bf16", "bf16", created="2026-01-01"),
        _run("new-bf16", "bf16", created="2026-02-01"),
        _run("mx", "mxfp8", created="2026-01-15"),
        _run("other-model-bf16", "bf16", model="n"),
    ]
    pairs = compare.pair_runs(entries)
    assert [(p.model, p.baseline.rel, p.other.rel) for p in pairs] == [("m", "new-bf16", "mx")]
    assert pairs[0].other_precision == "mxfp8"


def test_pairing_prefers_mxfp8_and_matched_sampler_and_skips_unfinished() -> None:
    entries = [
        _run("b", "bf16"),
        _run("floor", "mxfp8-floor", created="2026-03-01"),
        _run("mx-bf16-sampler", "mxfp8", sampler="bf16", created="2026-03-01"),
        _run("mx", "mxfp8", created="2026-01-01"),
        _run("mx-running", "mxfp8", created="2026-04-01", status="running"),
    ]
    (pair,) = compare.pair_runs(entries)
    assert pair.other.rel == "mx"


def test_model_without_both_precisions_is_not_paired() -> None:
    assert compare.pair_runs([_run("a", "mxfp8"), _run("b", "mxfp8-floor")]) == []


def _metrics() -> pd.DataFrame:
    from test_tracing_steps import run_metrics

    return run_metrics()


def test_phase_medians_skip_the_warmup_step() -> None:
    med = compare.phase_medians(steps.step_phase_table(_metrics()))
    assert med["update"] == pytest.approx(0.6)
    assert med["step"] == pytest.approx(2.1)


def test_change_words_spell_out_each_phase_and_the_step() -> None:
    base = pd.Series(
        {"generate": 1.0, "logprob": 0.5, "update": 2.0, "sync": 0.0, "other": 0.001, "step": 3.501}
    )
    low = pd.Series(
        {"generate": 0.76, "logprob": 0.5, "update": 1.76, "sync": 0.4, "other": 0.001, "step": 3.421}
    )
    words = compare.phase_change_words(base, low, "mxfp8", "bf16")
    assert words == "mxfp8 vs bf16: generate -24 %, logprob ±0 %, update -12 %, step -2 %"


def test_change_table_reports_both_medians_and_na_for_zero_baseline() -> None:
    base = pd.Series({"generate": 1.0, "sync": 0.0, "step": 1.0})
    low = pd.Series({"generate": 1.1, "sync": 0.2, "step": 1.3})
    t = compare.change_table(base, low, "bf16", "mxfp8").set_index("phase")
    assert t.loc["generate", "change"] == "+10 %"
    assert t.loc["sync", "change"] == "n/a"
