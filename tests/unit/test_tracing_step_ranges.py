"""tracing.analysis.step_ranges: a step split by its own child range names, lined up with steps.parquet."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tracing.analysis import step_ranges, steps
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
MS = 1_000_000


def _ranges(rows: list[tuple[int, int, str, int, int, int]]) -> pd.DataFrame:
    """(range_id, parent_id, name, depth, start_ms, end_ms) on one process of one trace."""
    df = pd.DataFrame(rows, columns=["range_id", "parent_id", "name", "depth", "start_ns", "end_ns"])
    df[["start_ns", "end_ns"]] *= MS
    return df.assign(trace="t.json", rank=0, pid=7, tid=7, phase="other", attrs="{}")


RANGES = _ranges(
    [
        (0, -1, "ProfilerStep#3", 0, 0, 100),
        (1, 0, "## forward ##", 1, 5, 35),
        (2, 0, "## backward ##", 1, 35, 85),
        (3, 2, "aten::mm", 2, 40, 60),  # a grandchild: inside backward, never counted apart
        (4, 0, "## forward ##", 1, 86, 90),  # a second forward in the same step adds up
        (5, -1, "ProfilerStep#4", 0, 100, 150),
        (6, 5, "## forward ##", 1, 90, 120),  # starts before its step: clipped to the step
    ]
)


def test_children_by_name_with_the_uncovered_rest() -> None:
    kids = step_ranges.step_children(RANGES).set_index(["step", "name"])["seconds"]
    assert kids[(3, "## forward ##")] == pytest.approx(0.034)
    assert kids[(3, "## backward ##")] == pytest.approx(0.050)
    assert kids[(3, step_ranges.OUTSIDE)] == pytest.approx(0.100 - 0.084)
    assert kids[(4, "## forward ##")] == pytest.approx(0.020)
    assert (3, "aten::mm") not in kids.index
    per_step = kids.groupby(level="step").sum()
    assert per_step.to_dict() == pytest.approx({3: 0.100, 4: 0.050})  # each step adds up to its wall time


def test_step_numbers_match_the_step_table() -> None:
    numbers = set(steps.trace_step_phases(RANGES)["step"])
    assert numbers == set(step_ranges.step_children(RANGES)["step"]) == {3, 4}


def test_a_step_range_inside_another_is_the_same_step_as_in_the_step_table() -> None:
    """An mxperf ``step`` range (``{"step": 7}``) inside torch.profiler's ``ProfilerStep#3``: one step, numbered
    7, split by the outer range's children, as steps.parquet has it."""
    nested = _ranges(
        [
            (0, -1, "ProfilerStep#3", 0, 0, 100),
            (1, 0, "step", 1, 2, 98),
            (2, 1, "## forward ##", 2, 5, 35),
            (3, 0, "## optimizer ##", 1, 98, 100),
        ]
    )
    nested.loc[1, "attrs"] = '{"step": 7}'
    kids = step_ranges.step_children(nested)
    assert set(kids["step"]) == set(steps.trace_step_phases(nested)["step"]) == {7}
    assert kids.groupby("step")["seconds"].sum().to_dict() == pytest.approx({7: 0.100})
    assert set(kids["name"]) == {"step", "## optimizer ##", step_ranges.OUTSIDE}


def test_top_names_fold_the_rest_and_keep_outside() -> None:
    kids = step_ranges.step_children(RANGES)
    top = step_ranges.top_names(kids, limit=1)
    assert set(top["name"]) == {"## forward ##", "(other ranges)", step_ranges.OUTSIDE}  # 54 ms > 50 ms
    assert top["seconds"].sum() == pytest.approx(kids["seconds"].sum())


def test_no_step_ranges_gives_an_empty_table() -> None:
    assert step_ranges.step_children(RANGES[RANGES["depth"] > 0]).empty


def test_real_trace_forward_backward_optimizer_add_up_to_the_step() -> None:
    path = REPO / "examples" / "runs" / "ingest-a100-hostbound" / store.RANGES
    if not path.is_file():
        pytest.skip("examples/runs/ingest-a100-hostbound not generated")
    kids = step_ranges.step_children(store.read_table(path))
    names = set(kids["name"])
    assert {"## forward ##", "## backward ##", "## optimizer ##"} <= names
    walls = store.read_table(path.parent / store.STEPS).groupby("step")["seconds"].sum()
    assert kids.groupby("step")["seconds"].sum().to_dict() == pytest.approx(walls.to_dict(), rel=1e-6)
