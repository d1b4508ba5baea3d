"""tracing.analysis.ranks: the job's step is the slowest rank's (never a sum), stragglers, per-rank spread."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tracing.analysis import ranks, steps
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]


def _steps(rows: list[tuple[str, int | None, int, int, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["trace", "rank", "pid", "step", "phase", "seconds"]).astype(
        {"rank": "Int64"}
    )


TWO_RANKS = _steps(
    [
        ("r0.json", 0, 10, 1, "update", 0.50),
        ("r0.json", 0, 10, 1, "other", 0.10),
        ("r1.json", 1, 11, 1, "update", 0.70),
        ("r1.json", 1, 11, 1, "other", 0.05),
        ("r0.json", 0, 10, 2, "update", 0.40),
        ("r0.json", 0, 10, 2, "other", 0.10),
        ("r1.json", 1, 11, 2, "update", 0.45),
        ("r1.json", 1, 11, 2, "other", 0.00),
    ]
)


def test_job_step_is_the_slowest_rank_never_the_sum() -> None:
    slow = ranks.stragglers(TWO_RANKS).set_index("step")
    assert slow.loc[1, "job_seconds"] == pytest.approx(0.75)  # rank 1: 0.70 + 0.05, not 0.60 + 0.75
    assert slow.loc[2, "job_seconds"] == pytest.approx(0.50)  # rank 0: 0.40 + 0.10
    assert list(slow["slowest"]) == ["rank 1", "rank 0"]
    assert slow.loc[1, "lag_seconds"] == pytest.approx(0.75 - 0.675)
    assert slow.loc[1, "spread_pct"] == pytest.approx(100 * (0.75 / 0.60 - 1))
    # the same number as the per-step table the Step time page uses
    job = steps.one_process(TWO_RANKS).groupby("step")["seconds"].sum()
    assert job.to_dict() == pytest.approx(slow["job_seconds"].to_dict())


def test_ties_go_to_the_lowest_rank_number_not_the_path_that_sorts_first() -> None:
    # "rank-127.json" sorts before "rank-27.json" as text; the tie must name rank 27 (and rank 3 as the
    # fastest, though "rank-300.json" < "rank-3b.json" would put 300 first by path)
    tied = _steps(
        [
            ("rank-127.json", 127, 1, 1, "update", 2.0),
            ("rank-27.json", 27, 2, 1, "update", 2.0),
            ("rank-300.json", 300, 3, 1, "update", 1.0),
            ("rank-3b.json", 3, 4, 1, "update", 1.0),
        ]
    )
    slow = ranks.stragglers(tied).iloc[0]
    assert (slow["slowest"], slow["fastest"]) == ("rank 27", "rank 3")


def test_rank_summary_counts_how_often_each_rank_was_slowest_and_skips_warmup() -> None:
    summary = ranks.rank_summary(TWO_RANKS).set_index("process")
    assert summary.loc["rank 1", "slowest_in"] == 1 and summary.loc["rank 0", "slowest_in"] == 1
    assert summary.loc["rank 0", "median_s"] == pytest.approx(0.55)
    assert summary.loc["rank 1", "q3_s"] == pytest.approx(0.45 + 0.75 * 0.30)  # linear quartile of 0.45, 0.75
    skipped = ranks.rank_summary(TWO_RANKS, skip_steps=(1,)).set_index("process")
    assert skipped.loc["rank 1", "steps"] == 1 and skipped.loc["rank 1", "slowest_in"] == 0


def test_a_null_rank_is_named_by_its_pid_never_none() -> None:
    df = _steps([("t.sqlite", None, 144, 0, "other", 1.0), ("t.sqlite", None, 145, 0, "other", 2.0)])
    assert ranks.processes(df) == ["pid 144", "pid 145"]
    assert ranks.stragglers(df)["slowest"].tolist() == ["pid 145"]


def test_two_traces_calling_themselves_rank_0_stay_apart() -> None:
    df = _steps([("bf16/r0.json", 0, 1, 0, "other", 1.0), ("mx/r0.json", 0, 1, 0, "other", 2.0)])
    procs = ranks.processes(df)
    assert len(procs) == 2 and all(p.startswith("rank 0 (") for p in procs)
    assert ranks.one_rank(df, procs[1])["seconds"].tolist() in ([1.0], [2.0])


def test_one_rank_keeps_that_rank_phases() -> None:
    one = ranks.one_rank(TWO_RANKS, "rank 1")
    assert one.groupby("step")["seconds"].sum().to_dict() == pytest.approx({1: 0.75, 2: 0.45})


def test_empty_table_gives_empty_results() -> None:
    empty = TWO_RANKS.iloc[:0]
    assert ranks.stragglers(empty).empty and ranks.rank_summary(empty).empty and ranks.processes(empty) == []


def test_real_two_rank_trace_steps_take_the_slower_rank() -> None:
    path = REPO / "examples" / "runs" / "ingest-2rank" / store.STEPS
    if not path.is_file():
        pytest.skip("examples/runs/ingest-2rank not generated")
    per_process = store.read_table(path)
    slow = ranks.stragglers(per_process)
    assert (slow["processes"] == 2).all()
    totals = ranks.step_totals(per_process)
    for row in slow.itertuples():
        this = totals[totals["step"] == row.step]["seconds"]
        assert row.job_seconds == pytest.approx(this.max())
        assert row.job_seconds < this.sum() * 0.6  # each rank ~0.61 s: the job's step is not the 1.2 s sum
