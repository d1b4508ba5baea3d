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


def _stats(values: dict[str, list[float]]) -> pd.DataFrame:
    """phase_stats of a table whose steps 1.. hold ``values`` (step 0 is a warm-up, left out)."""
    n = len(next(iter(values.values())))
    rows = [(0, p, 99.0) for p in values] + [(s + 1, p, v[s]) for p, v in values.items() for s in range(n)]
    return compare.phase_stats(pd.DataFrame(rows, columns=["step", "phase", "seconds"]))


def test_phase_stats_give_median_quartiles_and_step_count_without_warmup() -> None:
    st = _stats({"update": [1.0, 2.0, 3.0, 4.0], "generate": [1.0, 1.0, 1.0, 1.0]})
    assert st.loc["update", "median_s"] == pytest.approx(2.5)
    assert st.loc["update", "q1_s"] == pytest.approx(1.75) and st.loc["update", "q3_s"] == pytest.approx(3.25)
    assert st.loc["step", "median_s"] == pytest.approx(3.5)
    assert (st["n_steps"] == 4).all()  # the 99 s warm-up step is not in any of these


def test_change_words_spell_out_each_phase_the_step_counts_and_the_spread() -> None:
    base = _stats(
        {"generate": [1.0] * 4, "logprob": [0.5] * 4, "update": [2.0, 2.0, 2.1, 1.9], "sync": [0.0] * 4}
    )
    low = _stats(
        {"generate": [0.76] * 4, "logprob": [0.5] * 4, "update": [1.76, 2.1, 2.0, 1.7], "sync": [0.4] * 4}
    )
    words = compare.phase_change_words(base, low, "mxfp8", "bf16")
    assert words.startswith(
        "mxfp8 vs bf16 (medians of 4 vs 4 steps): generate -24 %, logprob ±0 % (within spread)"
    )
    assert "update -6 % (within spread)" in words  # the quartile ranges overlap
    assert "sync" not in words  # 0 s in the baseline: under 1 % of its step
    assert words.endswith("step +1 % (within spread)")  # sync's +0.4 s eats the savings


def test_change_table_reports_both_medians_with_iqr_and_na_for_zero_baseline() -> None:
    base = _stats({"generate": [1.0, 1.0, 1.0], "sync": [0.0, 0.0, 0.0], "update": [0.0, 0.0, 0.0]})
    low = _stats({"generate": [1.1, 1.1, 1.1], "sync": [0.2, 0.2, 0.2], "update": [0.0, 0.0, 0.0]})
    t = compare.change_table(base, low, "bf16", "mxfp8").set_index("phase")
    assert "update" not in t.index  # neither output spent time in it
    assert t.loc["generate", "change"] == "+10 %" and t.loc["generate", "spread"] == "apart"
    assert t.loc["sync", "change"] == "n/a"
    assert t.loc["generate", "bf16 s, median [IQR] (n=3)"] == "1 [1 – 1]"


def test_sync_checks_come_out_of_the_sync_phase_and_the_step_is_unchanged() -> None:
    metrics = pd.DataFrame(
        {
            "step": [0, 1],
            "step_s": [1.0, 1.0],
            "sync_s": [0.3, 0.4],
            "sync_check_s": [0.25, 0.5],
            "update_s": [0.5, 0.5],
        }
    )
    split = compare.with_sync_checks(steps.step_phase_table(metrics), metrics)
    wide = split.pivot_table(index="step", columns="phase", values="seconds")
    assert wide.loc[0, "sync"] == pytest.approx(0.05) and wide.loc[0, compare.SYNC_CHECKS] == pytest.approx(
        0.25
    )
    assert wide.loc[1, "sync"] == pytest.approx(0.0) and wide.loc[1, compare.SYNC_CHECKS] == pytest.approx(
        0.4
    )
    assert wide.sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    same = steps.step_phase_table(metrics.drop(columns="sync_check_s"))
    assert compare.with_sync_checks(same, metrics.drop(columns="sync_check_s")) is same


def test_tokens_per_second_from_a_runs_metrics() -> None:
    m = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "update_tokens": [100, 200, 200],
            "update_s": [9.0, 0.5, 0.5],
            "step_s": [9.0, 1.0, 1.0],
        }
    )
    tps = compare.tokens_per_second(m)
    assert tps == {"tokens_per_step": 200.0, "update_tokens_per_s": 400.0, "step_tokens_per_s": 200.0}
    assert compare.tokens_per_second(m.drop(columns="update_tokens")) is None
