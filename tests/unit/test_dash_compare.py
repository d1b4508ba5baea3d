"""dashboards.compare: pairing BF16 with MXFP8 and the per-phase difference in words."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dashboards import compare
from dashboards.data import OutputEntry


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
    return pd.DataFrame(
        {
            "step": [0, 1, 2],
            "step_s": [3.0, 2.0, 2.2],
            "generate_s": [1.0, 0.8, 0.9],
            "logprob_s": [0.5] * 3,
            "update_s": [1.2, 0.6, 0.6],
            "sync_s": [0.1] * 3,
        }
    )


def test_step_phase_table_has_other_as_step_minus_phases() -> None:
    t = compare.step_phase_table(_metrics())
    wide = t.pivot_table(index="step", columns="phase", values="seconds")
    assert list(t["phase"].unique()) == list(compare.STEP_PHASES)
    np.testing.assert_allclose(wide["other"], [0.2, 0.0, 0.1], atol=1e-12)
    np.testing.assert_allclose(wide.sum(axis=1), [3.0, 2.0, 2.2])


def test_step_phase_table_clips_negative_other_to_zero() -> None:
    m = _metrics().assign(step_s=[1.0, 1.0, 1.0])
    assert compare.step_phase_table(m).query("phase == 'other'")["seconds"].eq(0).all()


def test_step_phase_table_falls_back_to_the_range_log() -> None:
    rows = [
        (0, "step", 0, 1000, -1, 0, {"step": 7}),
        (1, "generate", 0, 400, 0, 1, {}),
        (2, "update", 400, 900, 0, 1, {}),
        (3, "update/microbatch", 400, 600, 2, 2, {}),
    ]
    ranges = pd.DataFrame(
        [
            {
                "range_id": r,
                "name": n,
                "start_ns": s,
                "end_ns": e,
                "dur_ns": e - s,
                "tid": 1,
                "parent_id": p,
                "depth": d,
                "attrs": json.dumps(a),
            }
            for r, n, s, e, p, d, a in rows
        ]
    )
    t = compare.step_phase_table(None, ranges).set_index("phase")["seconds"]
    assert t["generate"] == pytest.approx(400e-9)
    assert t["update"] == pytest.approx(500e-9)
    assert t["other"] == pytest.approx(100e-9)
    assert compare.step_phase_table(None, ranges)["step"].unique().tolist() == [7]


def test_step_phase_table_without_phase_times_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no per-phase times"):
        compare.step_phase_table(pd.DataFrame({"step": [0], "reward": [1.0]}))


def test_phase_medians_skip_the_warmup_step() -> None:
    med = compare.phase_medians(compare.step_phase_table(_metrics()))
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


def _trace_ranges(rows: list[tuple[str, str, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"name": n, "phase": ph, "start_ns": s, "end_ns": e, "pid": pid, "depth": 0, "range_id": i}
            for i, (n, ph, s, e, pid) in enumerate(rows)
        ]
    )


def test_trace_step_table_unions_nested_ranges_of_one_phase_within_each_step() -> None:
    ranges = _trace_ranges(
        [
            ("ProfilerStep#4", "step", 0, 1000, 1),
            ("## backward ##", "update", 100, 600, 1),
            ("update_actor", "update", 500, 700, 1),  # overlaps backward: the union counts 100..700 once
            ("rollout_generate", "generate", 700, 900, 1),
            ("## backward ##", "update", 100, 900, 2),  # another process: not this step's
            ("ProfilerStep#5", "step", 1000, 1500, 1),
        ]
    )
    t = compare.step_phase_table_from_trace(ranges).pivot_table(
        index="step", columns="phase", values="seconds"
    )
    assert t.loc[4, "update"] == pytest.approx(600e-9)
    assert t.loc[4, "generate"] == pytest.approx(200e-9)
    assert t.loc[4, "other"] == pytest.approx(200e-9)
    assert t.loc[5, "other"] == pytest.approx(500e-9)


def test_trace_without_step_ranges_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no step ranges"):
        compare.step_phase_table_from_trace(_trace_ranges([("gemm", "other", 0, 1, 1)]))
