"""`mxperf ranges` grouping: the time a group's windows cover next to their sum, flagged when they overlap."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mxperf.commands.ranges import group_ranges, one_source_per_range, render, run_traces


def _ranges(rows: list[tuple[str, str, int, int, int | None]]) -> pa.Table:
    """(trace, name, start, end, time_ns or None: no GPU) rows of a range table."""
    return pa.table(
        {
            "trace": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "phase": ["update"] * len(rows),
            "range_id": list(range(len(rows))),
            "parent_id": [-1] * len(rows),
            "start_ns": [r[2] for r in rows],
            "end_ns": [r[3] for r in rows],
            "wall_ns": [r[3] - r[2] for r in rows],
            "time_ns": [r[3] - r[2] if r[4] is None else r[4] for r in rows],
            "window_busy_ns": pa.nulls(len(rows), pa.int64()),
            "thread_busy_ns": pa.nulls(len(rows), pa.int64()),
            "host_stall_ns": pa.nulls(len(rows), pa.int64()),
        }
    )


def test_nested_and_gpu_stretched_windows_are_covered_once_and_flagged():
    rows = group_ranges(
        _ranges(
            [
                ("t", "fwd", 0, 100, None),
                ("t", "fwd", 10, 50, None),  # nested in the first: covered once
                ("t", "fwd", 200, 210, 90),  # its window runs to 290 (GPU work finishing later)
                ("t", "fwd", 220, 230, 100),  # 220 -> 320: overlaps the one before
                ("t", "opt", 400, 450, None),
                ("t", "opt", 500, 520, None),
            ]
        )
    )
    by = {r["name"]: r for r in rows}
    assert by["fwd"]["time_ms"] * 1e6 == pytest.approx(100 + 40 + 90 + 100)
    assert by["fwd"]["covered_ms"] * 1e6 == pytest.approx(100 + 120)  # [0, 100] and [200, 320]
    assert by["fwd"]["overlapping"] and not by["opt"]["overlapping"]
    assert by["opt"]["covered_ms"] * 1e6 == pytest.approx(70)
    text = render(rows)
    assert "covered_ms" in text.splitlines()[0] and "time they cover" in text.splitlines()[-1]
    assert [line.split()[1] for line in text.splitlines()[1:3]] == ["*", "update"]


def test_groups_never_share_their_cover():
    rows = group_ranges(_ranges([("t", "a", 0, 100, None), ("t", "b", 50, 150, None)]))
    assert all(not r["overlapping"] and r["covered_ms"] * 1e6 == pytest.approx(100) for r in rows)


def test_a_runs_trace_rows_that_its_range_log_also_has_are_counted_once():
    traces = [
        {"path": "/r/run1", "format": "rangelog"},
        {"path": "/r/run1/trace/rank-0.json.gz", "format": "kineto"},
        {"path": "/r/other.json.gz", "format": "kineto"},
    ]
    twins = run_traces(traces)
    assert twins == {"/r/run1/trace/rank-0.json.gz": "/r/run1"}
    table = _ranges(
        [
            ("/r/run1", "step", 0, 10, None),
            ("/r/run1", "step", 10, 20, None),
            ("/r/run1/trace/rank-0.json.gz", "step", 1000, 1010, None),  # the log's step, seen by the trace
            ("/r/run1/trace/rank-0.json.gz", "ProfilerStep#2", 999, 1011, None),  # only the trace has it
            ("/r/other.json.gz", "step", 5, 15, None),  # another input: kept
        ]
    )
    kept, notes = one_source_per_range(table, twins)
    assert kept.column("name").to_pylist() == ["step", "step", "ProfilerStep#2", "step"]
    assert len(notes) == 1 and "run1's range log" in notes[0] and "(step)" in notes[0]
