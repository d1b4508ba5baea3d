"""tracing.analysis.ranks: the job's step is the slowest rank's (never a sum), stragglers, per-rank spread."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from tracing.analysis import ranks, steps
from tracing.analysis.crossrank import cross_rank_tables
from tracing.outputs import schema, store

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
    # the Step time page's one process per step is that same rank (its rows, not rank 127's): rank 27 alone has
    # a (zero) generate row, which leaves its role (the phases it spends time in) that of the others
    tied = pd.concat([tied, _steps([("rank-27.json", 27, 2, 1, "generate", 0.0)])], ignore_index=True)
    assert steps.one_process(tied)["phase"].tolist() == ["generate", "update"]


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


def test_the_notebook_stragglers_are_the_rows_ingest_writes() -> None:
    folder = REPO / "examples" / "runs" / "ingest-2rank"
    if not (folder / "stragglers.parquet").is_file():
        pytest.skip("examples/runs/ingest-2rank not generated")
    written = store.read_table(folder / "stragglers.parquet")
    pd.testing.assert_frame_equal(ranks.stragglers(store.read_table(folder / store.STEPS)), written)


def _device_rows(stalls: list[tuple[int, int, int]]) -> pa.Table:
    """Two-rank device rows on device 0: (rank, host_stall_ns, unattributed_ns), idle 100 of a span of 200."""
    n = len(stalls)
    return pa.table(
        {
            "rank": pa.array([r for r, _, _ in stalls], pa.int64()),
            "device": [0] * n,
            "busy_ns": [100] * n,
            "host_stall_ns": [s for _, s, _ in stalls],
            "unattributed_ns": [u for _, _, u in stalls],
            "idle_ns": [100] * n,
            "span_ns": [200] * n,
        }
    )


def test_rank_spread_leaves_out_ranks_whose_host_stall_is_not_measured() -> None:
    no_steps = pa.table({"rank": pa.array([], pa.int64())})
    # rank 1 has no launch calls (all its idle unattributed): its 0 is not a measured host stall
    spread = cross_rank_tables(_device_rows([(0, 40, 0), (1, 0, 100), (2, 10, 0)]), no_steps)["rank_spread"]
    row = spread.to_pylist()[0]
    assert (row["host_stall_median_ns"], row["host_stall_max_ns"], row["most_stalled_rank"]) == (25.0, 40, 0)
    assert row["busy_min_ns"] == 100 and row["processes"] == 3  # busy is measured on every rank
    none = cross_rank_tables(_device_rows([(0, 0, 100), (1, 0, 100)]), no_steps)["rank_spread"].to_pylist()[0]
    assert none["host_stall_max_ns"] is None and none["most_stalled_rank"] is None
    assert none["host_stall_median_ns"] is None


def test_files_of_one_process_count_as_that_process_not_as_ranks() -> None:
    """verl's discrete mode writes a file per stage of a step (same rank, same pid): the job's step is that
    process's stages together, and no stage file is a 'straggler' of another."""
    per_stage = _steps(
        [
            ("actor_actor_update_step7_rank0.json", 0, 10, 7, "update", 0.30),
            ("actor_actor_compute_log_prob_step7_rank0.json", 0, 10, 7, "logprob", 0.10),
            ("actor_actor_update_step7_rank1.json", 1, 11, 7, "update", 0.25),
            ("actor_actor_compute_log_prob_step7_rank1.json", 1, 11, 7, "logprob", 0.20),
            ("verl_log.jsonl", None, -1, 7, "generate", 1.0),  # a metric log's row: no process, left alone
        ]
    )
    merged = schema.to_frame(steps.merge_process_files(schema.from_frame(per_stage)))
    assert len(merged) == 5 and merged["trace"].nunique() == 3
    slow = ranks.stragglers(merged[merged["pid"] >= 0]).iloc[0]
    assert (slow["processes"], slow["slowest"]) == (2, "rank 1")
    assert slow["job_seconds"] == pytest.approx(0.45)
    job = steps.one_process(merged[merged["pid"] >= 0]).set_index("phase")["seconds"]
    assert job.to_dict() == pytest.approx({"logprob": 0.20, "update": 0.25})
    # one process's rows of one (step, phase) from two files (update windows of mini-batches) are summed
    windows = _steps([("u_mb0.json", 0, 10, 7, "update", 0.3), ("u_mb1.json", 0, 10, 7, "update", 0.2)])
    both = schema.to_frame(steps.merge_process_files(schema.from_frame(windows)))
    assert both["seconds"].tolist() == pytest.approx([0.5]) and both["trace"].tolist() == ["u_mb0.json"]


def test_processes_of_different_roles_add_their_phases_not_race() -> None:
    """NeMo RL's vLLM worker generates and its policy workers score and update: the job's step is the
    generation of the slowest sampler plus the learning of the slowest learner, each sync counted once --
    not the one process whose own phases take longest."""
    roles = _steps(
        [
            ("vllm_genertion_worker_3:5_100.sqlite", 0, 100, 3, "generate", 4.0),
            ("vllm_genertion_worker_3:5_100.sqlite", 0, 100, 3, "sync", 0.5),
            ("policy_worker_3:5_200.sqlite", 0, 200, 3, "logprob", 1.0),
            ("policy_worker_3:5_200.sqlite", 0, 200, 3, "update", 2.0),
            ("policy_worker_3:5_200.sqlite", 0, 200, 3, "sync", 0.6),
            ("policy_worker_3:5_201.sqlite", 1, 201, 3, "logprob", 1.1),
            ("policy_worker_3:5_201.sqlite", 1, 201, 3, "update", 2.2),
            ("policy_worker_3:5_201.sqlite", 1, 201, 3, "sync", 0.6),
        ]
    )
    job = steps.one_process(roles).set_index("phase")["seconds"]
    assert job.to_dict() == pytest.approx({"generate": 4.0, "logprob": 1.1, "update": 2.2, "sync": 0.6})
    # stragglers compare ranks of one role: the two policy workers, not the vLLM worker against them
    slow = ranks.stragglers(roles).iloc[0]
    assert (slow["processes"], slow["slowest"], slow["fastest"]) == (2, "rank 1", "rank 0")


def test_a_rank_that_does_one_more_phase_is_still_a_rank_of_the_others() -> None:
    """Rank 0 also computes the reward: it shares its other phases with rank 1, so both are one role -- the job
    waits for the slower whole rank, and nothing is flagged as another role."""
    both = _steps(
        [
            ("r0.json", 0, 10, 1, "logprob", 0.2),
            ("r0.json", 0, 10, 1, "update", 0.5),
            ("r0.json", 0, 10, 1, "reward", 0.1),
            ("r1.json", 1, 11, 1, "logprob", 0.2),
            ("r1.json", 1, 11, 1, "update", 0.7),
        ]
    )
    cols = [
        both[c].astype(object).where(both[c].notna(), None).tolist()
        for c in ("trace", "rank", "pid", "phase", "seconds")
    ]
    assert set(steps.process_roles(*cols).values()) == {"logprob,reward,update"}
    job = steps.one_process(both).set_index("phase")["seconds"]
    assert job.to_dict() == pytest.approx({"logprob": 0.2, "update": 0.7})  # rank 1 whole: 0.9 > 0.8
