"""dashboards.summaries: host-stall shares, per-device tables, sync verdicts, fault tables, timeline windows."""

from __future__ import annotations

import dash_fixtures
import numpy as np
import pandas as pd
import pytest

from dashboards import summaries, timeline
from tracing.analysis.metrics import device_timelines


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
    got = share.set_index(["precision", "tokens_per_microbatch"])[
        summaries.STALL_PCT
    ]  # percent, as every share
    assert got[("mxfp8", 256)] == pytest.approx(50.0)
    assert got[("bf16", 512)] == pytest.approx(5.0)


def test_stall_share_without_gpu_trace_is_null_with_reason_not_zero() -> None:
    mb = _mb([None, None, None, None])
    assert not summaries.has_gpu_numbers(mb)
    share = summaries.stall_share(mb, ["precision"])
    assert share[summaries.STALL_PCT].isna().all()
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
    bars = timeline.timeline_intervals([tl], first, last, rank=0)
    shares = timeline.window_shares(bars).iloc[0]
    assert shares["span ms"] == pytest.approx(tl.row["span_ns"] / 1e6, abs=0.01)
    assert shares["busy %"] == pytest.approx(100 * tl.row["busy_ns"] / tl.row["span_ns"], abs=0.01)
    assert shares["host stall %"] == pytest.approx(100 * tl.row["host_stall_fraction"], abs=0.01)
    assert tl.row["host_stall_ns"] > 0


def test_timeline_window_clips_intervals_to_the_window() -> None:
    (tl,) = device_timelines(dash_fixtures.gpu_events())
    t0 = int(tl.row["first_ns"]) + 200_000
    t1 = t0 + 300_000
    bars = timeline.timeline_intervals([tl], t0, t1)
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
    got = timeline.window_ranges(ranges, 1_000_000, 3_000_000)
    assert got.to_dict("records") == [{"name": "a", "depth": 0, "start_ms": 0.0, "end_ms": 1.0}]


def test_device_summary_names_a_null_rank_by_its_pid() -> None:
    devices = pd.DataFrame(
        {
            "trace": "t.sqlite",
            "rank": pd.array([None, None], dtype="Int64"),
            "pid": pd.array([144, 145], dtype="Int64"),
            "device": [0, 1],
            "span_ns": [1_000_000, 2_000_000],
            "busy_ns": [500_000, 1_000_000],
            "idle_ns": [500_000, 1_000_000],
            "host_stall_ns": [100_000, 0],
            "num_kernels": [3, 4],
        }
    )
    table = summaries.device_summary(devices)
    assert list(table["process"]) == ["pid 144", "pid 145"]
    assert "None" not in table.astype(str).to_numpy().ravel().tolist()
    assert list(table["host stall %"]) == [10.0, 0.0]


def test_device_summary_blanks_a_host_stall_nothing_measured() -> None:
    """A GPU whose idle all ends at ops with no launch call in the trace: host stall blank, not 0; a GPU with a
    few such ops keeps its figure; "unmeasured ms" says how much idle was not measured on each."""
    devices = pd.DataFrame(
        {
            "pid": [1, 2, 3],
            "device": [0, 1, 2],
            "span_ns": [1_000_000] * 3,
            "busy_ns": [500_000] * 3,
            "idle_ns": [500_000] * 3,
            "host_stall_ns": [0, 100_000, 100_000],
            "unattributed_ns": [500_000, 200_000, 1_000],
            "num_kernels": [3, 4, 5],
        }
    )
    table = summaries.device_summary(devices)
    assert list(table["unmeasured ms"]) == [0.5, 0.2, 0.0]
    assert table["host stall %"].isna().tolist() == [True, False, False]
    assert list(table["host stall %"][1:]) == [10.0, 10.0]
    assert table["other idle ms"].isna().tolist() == [True, False, False]


def test_windows_are_steps_never_op_ranges_and_never_start_before_zero() -> None:
    ranges = pd.DataFrame(
        {
            "name": ["ProfilerStep#7", "aten::to, op_id = 990347", "ProfilerStep#8"],
            "phase": ["other", "other", "other"],
            "depth": [0, 1, 0],
            "start_ns": [900, 1_000, 2_000_000],
            "end_ns": [1_900_000, 2_000, 3_900_000],
        }
    )
    w = timeline.window_choices(ranges, 1_000, 4_000_000)
    assert list(w)[1:] == ["ProfilerStep#7 @ 0.0 ms (1.9 ms long)", "ProfilerStep#8 @ 2.0 ms (1.9 ms long)"]
    ops_only = ranges.iloc[[1]].assign(depth=0)
    sliced = timeline.window_choices(ops_only, 0, 10_000_000, slices=4)
    assert len(sliced) == 5 and not any("aten" in k for k in sliced)
    assert sliced["slice 2/4: 2.5 – 5.0 ms"] == (2_500_000, 5_000_000)


def test_a_step_range_inside_a_profiler_step_is_one_step_window_and_band() -> None:
    """An mxperf or framework ``step`` range inside torch.profiler's ``ProfilerStep#N`` is the same step (the
    step table counts it once): one window, one band, never two."""
    ranges = pd.DataFrame(
        {
            "range_id": [0, 1, 2, 3],
            "name": ["ProfilerStep#0", "step", "ProfilerStep#1", "step"],
            "phase": ["other", "step", "other", "step"],
            "pid": [7, 7, 7, 7],
            "start_ns": [0, 10, 1_000_000, 1_000_010],
            "end_ns": [900_000, 899_990, 1_900_000, 1_899_990],
        }
    )
    w = timeline.window_choices(ranges, 0, 2_000_000)
    assert list(w)[1:] == ["ProfilerStep#0 @ 0.0 ms (0.9 ms long)", "ProfilerStep#1 @ 1.0 ms (0.9 ms long)"]
    b = timeline.bands(ranges, None, 0, 2_000_000)
    assert (b["band"] == "steps").sum() == 2


def test_short_name_drops_emit_nvtx_tails() -> None:
    assert timeline.short_name("aten::mm, seq = 4, op_id = 9, sizes = [[2, 3]]") == "aten::mm"
    assert timeline.short_name("## forward ##") == "## forward ##"


def test_fault_table_says_when_each_fault_was_caught() -> None:
    fm = pd.DataFrame(
        {
            "fault": ["flip", "late", "missed"],
            "invariant": ["I1", "I7", "I2"],
            "caught_by": ["I1", "I7", ""],
            "first_caught_step": pd.array([-1, 1, None], dtype="Int64"),
            "silent": [True, True, True],
        }
    )
    t = summaries.fault_table(fm).set_index("fault")
    assert t.loc["flip", "first caught"] == "initial sync (before step 0)"
    assert t.loc["late", "first caught"] == "sync after step 1"
    assert t.loc["missed", "first caught"] == "never" and t.loc["missed", "caught by"] == "nothing"


def test_consistency_medians_count_the_steps() -> None:
    long = summaries.consistency_long(
        {"bf16/bf16": pd.DataFrame({"step": [0, 1, 2], "kl_k1": [-1e-4, 1e-4, 2e-4], "kl_k3": [1e-5] * 3})}
    )
    med = summaries.consistency_medians(long).iloc[0]
    assert med["steps"] == 3 and med["kl_k1"] == pytest.approx(1e-4)


def test_microbatch_words_name_the_source_or_why_there_are_none() -> None:
    mb = pd.DataFrame(
        {
            "phase": ["update", "update", "logprob"],
            "source": ["detected", "detected", "range"],
            "num_tokens": [512, 4096, 1024],
        }
    )
    assert summaries.microbatch_words(mb) == (
        "3 micro-batches in this trace: logprob 1 (range), update 2 (detected); 512 to 4,096 tokens."
    )
    assert "sizes could not be read" in summaries.microbatch_words(None, ["sizes could not be read"])
