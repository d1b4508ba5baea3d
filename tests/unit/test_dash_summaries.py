"""dashboards.summaries: breakeven words, what-if knobs, host-stall shares, sync verdicts, timeline bars."""

from __future__ import annotations

import dash_fixtures
import numpy as np
import pandas as pd
import pytest

from dashboards import summaries
from perfmodel import step
from tracing.analysis.metrics import device_timelines


def _entry(case: str, tokens: float | None = None, ci=(None, None), **extra) -> dict:
    be = {"case": case, "tokens": tokens, "ci": list(ci), "ci_method": "fieller", "ci_reason": None, **extra}
    return {
        "model": "tiny-dense",
        "phase": "update",
        "baseline": "bf16",
        "precision": "mxfp8",
        "breakeven": be,
    }


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        ("always_faster", "faster than bf16 at every micro-batch size"),
        ("never_faster", "never faster than bf16"),
        ("indistinguishable", "indistinguishable at the 95 % level"),
    ],
)
def test_breakeven_cases_without_n_star_are_named_in_words(case: str, phrase: str) -> None:
    assert phrase in summaries.breakeven_sentence(_entry(case))


def test_faster_above_names_n_star_its_interval_and_extrapolation() -> None:
    s = summaries.breakeven_sentence(_entry("faster_above", 4512.4, (3900, 5230.2), extrapolated=True))
    assert "mxfp8 is faster than bf16 above n* = 4,512 tokens per micro-batch" in s
    assert "95 % CI 3,900 to 5,230" in s
    assert "extrapolated" in s


def test_half_open_interval_says_which_bound_is_missing() -> None:
    e = _entry("faster_below", 800.0, (500.0, None), ci_reason="Fieller interval unbounded above")
    s = summaries.breakeven_sentence(e)
    assert "below n* = 800" in s and "500 to ?" in s and "unbounded above" in s


def test_fit_lines_feed_the_cost_model_what_if_rules() -> None:
    entry = {
        "baseline": "bf16",
        "precision": "mxfp8",
        "fits": {
            "bf16": {"fixed_s": 0.010, "per_token_s": 40e-6},
            "mxfp8": {"fixed_s": 0.030, "per_token_s": 30e-6},
        },
    }
    lines = summaries.fit_lines(entry)
    assert list(lines) == ["bf16", "mxfp8"]
    costs = step.step_costs(lines, "bf16", {"other": 1.0}, step.WhatIf())
    assert step.step_breakeven(costs["bf16"], costs["mxfp8"], 65536) == pytest.approx(2000)
    half = step.step_costs(lines, "bf16", {"other": 1.0}, step.WhatIf(fixed_scale=0.5))
    assert step.step_breakeven(half["bf16"], half["mxfp8"], 65536) == pytest.approx(1000)


def test_faster_at_states_direction_and_size() -> None:
    assert summaries.faster_at(2.0, 1.5, "mxfp8", "bf16").startswith("mxfp8 is 25.0 % faster than bf16")
    assert "slower" in summaries.faster_at(2.0, 2.2, "mxfp8", "bf16")


def _mb(stall) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": "m",
            "precision": ["bf16", "bf16", "mxfp8", "mxfp8"],
            "phase": "update",
            "tokens_per_microbatch": [256, 512, 256, 512],
            "seconds": [1.0, 2.0, 1.0, 2.0],
            "host_stall_seconds": pd.array(stall, dtype="Float64"),
            "gpu_busy_seconds": pd.array([0.5, 1.5, 0.4, 1.2], dtype="Float64"),
        }
    )


def test_stall_share_is_stall_over_wall_per_group() -> None:
    share = summaries.stall_share(_mb([0.1, 0.1, 0.5, 0.4]), ["precision", "tokens_per_microbatch"])
    got = share.set_index(["precision", "tokens_per_microbatch"])["host_stall_share"]
    assert got[("mxfp8", 256)] == pytest.approx(0.5)
    assert got[("bf16", 512)] == pytest.approx(0.05)


def test_stall_share_without_gpu_trace_is_null_with_reason_not_zero() -> None:
    mb = _mb([None, None, None, None])
    assert not summaries.has_gpu_numbers(mb)
    share = summaries.stall_share(mb, ["precision"])
    assert share["host_stall_share"].isna().all()
    assert (share["reason"] == "no GPU trace for these micro-batches").all()


def _checks(fail: bool) -> pd.DataFrame:
    rows = [
        {
            "step": s,
            "invariant": f"I{i}",
            "passed": not (fail and s == 1 and i == 3),
            "first_failing_tensor": "layers.0.mlp.gate_up_proj.weight" if fail and s == 1 and i == 3 else "",
            "detail": "",
        }
        for s in range(3)
        for i in range(1, 8)
    ]
    return pd.DataFrame(rows)


def test_sync_verdict_names_the_first_failing_invariant_and_tensor() -> None:
    assert summaries.sync_verdict(_checks(False)) == "All 21 checks passed over 3 syncs."
    v = summaries.sync_verdict(_checks(True))
    assert v == (
        "1 of 21 checks failed; first: I3 (layout and mapping) at step 1 on tensor "
        "layers.0.mlp.gate_up_proj.weight."
    )


def test_sync_matrix_is_step_by_invariant_with_failures_zero() -> None:
    m = summaries.sync_matrix(_checks(True))
    assert list(m.columns) == [f"I{i}" for i in range(1, 8)]
    assert m.loc[1, "I3"] == 0 and m.loc[0, "I3"] == 1


def test_timeline_bars_reproduce_device_busy_and_stall_totals() -> None:
    (tl,) = device_timelines(dash_fixtures.gpu_events())
    first, last = int(tl.row["first_ns"]), int(tl.row["last_ns"])
    bars = summaries.timeline_intervals([tl], first, last, rank=0)
    shares = summaries.window_shares(bars).iloc[0]
    assert shares["span ms"] == pytest.approx(tl.row["span_ns"] / 1e6, abs=0.01)
    assert shares["busy %"] == pytest.approx(100 * tl.row["busy_ns"] / tl.row["span_ns"], abs=0.01)
    assert shares["host stall %"] == pytest.approx(100 * tl.row["host_stall_fraction"], abs=0.01)
    assert tl.row["host_stall_ns"] > 0


def test_timeline_window_clips_intervals_to_the_window() -> None:
    (tl,) = device_timelines(dash_fixtures.gpu_events())
    t0 = int(tl.row["first_ns"]) + 200_000
    t1 = t0 + 300_000
    bars = summaries.timeline_intervals([tl], t0, t1)
    assert bars["start_ms"].min() >= 0 and bars["end_ms"].max() <= 0.3 + 1e-9
    busy = bars.query("state == 'busy'")
    assert np.all(busy["end_ms"] > busy["start_ms"])


def test_window_ranges_keeps_overlapping_ranges_clipped() -> None:
    ranges = pd.DataFrame(
        {
            "name": ["a", "b", "deep"],
            "depth": [0, 0, 5],
            "start_ns": [0, 5_000_000, 0],
            "end_ns": [2_000_000, 6_000_000, 1],
        }
    )
    got = summaries.window_ranges(ranges, 1_000_000, 3_000_000)
    assert got.to_dict("records") == [{"name": "a", "depth": 0, "start_ms": 0.0, "end_ms": 1.0}]
