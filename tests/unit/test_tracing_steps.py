"""tracing.analysis.steps: seconds per step and phase from a run's metrics / range log or a trace's ranges."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tracing.analysis import steps
from tracing.outputs import schema


def run_metrics() -> pd.DataFrame:
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
    t = steps.step_phase_table(run_metrics())
    wide = t.pivot_table(index="step", columns="phase", values="seconds")
    assert list(t["phase"].unique()) == list(steps.STEP_PHASES)
    np.testing.assert_allclose(wide["other"], [0.2, 0.0, 0.1], atol=1e-12)
    np.testing.assert_allclose(wide.sum(axis=1), [3.0, 2.0, 2.2])


def test_every_reader_of_run_metrics_takes_the_same_columns() -> None:
    # one resolver of phase columns: the Step time page and the step model read the same seconds
    from perfmodel.inputs.load import _phase_seconds

    m = pd.DataFrame(
        {
            "step": [0, 1],
            "wall_s": [4.0, 5.0],
            "time_generate_s": [1.0, 2.0],
            "logprob_ns": [5e8, 6e8],
            "update_time_seconds": [1.5, 1.0],
            "seconds_sync": [0.25, 0.5],
            "update_microbatch_s": [9.0, 9.0],  # a micro-batch's time, not the update phase's
            "generate_ns": [7e9, 7e9],  # a later spelling of a phase already found
        }
    )
    wide = steps.step_phase_table(m).pivot_table(index="step", columns="phase", values="seconds")
    want = {"generate": [1.0, 2.0], "logprob": [0.5, 0.6], "update": [1.5, 1.0], "sync": [0.25, 0.5]}
    for phase, values in want.items():
        np.testing.assert_allclose(wide[phase], values)
        np.testing.assert_allclose(_phase_seconds(m)[phase], values)
    np.testing.assert_allclose(wide["other"], [0.75, 0.9])
    assert steps.metric_seconds(m, ("step",))["step"].tolist() == [4.0, 5.0]


def test_step_phase_table_clips_negative_other_to_zero() -> None:
    m = run_metrics().assign(step_s=[1.0, 1.0, 1.0])
    assert steps.step_phase_table(m).query("phase == 'other'")["seconds"].eq(0).all()


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
    t = steps.step_phase_table(None, ranges).set_index("phase")["seconds"]
    assert t["generate"] == pytest.approx(400e-9)
    assert t["update"] == pytest.approx(500e-9)
    assert t["other"] == pytest.approx(100e-9)
    assert steps.step_phase_table(None, ranges)["step"].unique().tolist() == [7]


def test_step_phase_table_without_phase_times_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no per-phase times"):
        steps.step_phase_table(pd.DataFrame({"step": [0], "reward": [1.0]}))


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
    t = (
        steps.trace_step_phases(ranges)
        .query("pid == 1")
        .pivot_table(index="step", columns="phase", values="seconds")
    )
    assert t.loc[4, "update"] == pytest.approx(600e-9)
    assert t.loc[4, "generate"] == pytest.approx(200e-9)
    assert t.loc[4, "other"] == pytest.approx(200e-9)
    assert t.loc[5, "other"] == pytest.approx(500e-9)


def test_trace_without_step_ranges_gives_an_empty_step_table() -> None:
    t = steps.trace_step_phases(_trace_ranges([("gemm", "other", 0, 1, 1)]))
    assert t.empty and list(t.columns) == list(schema.STEP_COLUMNS)


# one process's RL steps without a step range (verl's torch profiler: a file per profiled step), ns
_CYCLES = [
    ("generate_sequences", "generate", 0, 100, 1),
    ("compute_log_prob", "logprob", 120, 200, 1),
    ("compute_ref_log_prob", "logprob", 210, 260, 1),  # a phase twice in one step: still that step
    ("update_actor", "update", 300, 600, 1),
    ("## backward ##", "update", 350, 500, 1),  # nested in update_actor
    ("generate_sequences", "generate", 700, 800, 1),
    ("compute_log_prob", "logprob", 820, 900, 1),
    ("update_actor", "update", 950, 1200, 1),
    ("train", "update", 0, 300, 2),  # one phase only: no step structure to infer
    ("train", "update", 400, 700, 2),
]


def test_steps_are_inferred_from_phase_cycles_where_a_process_has_no_step_range() -> None:
    notes: list[str] = []
    t = steps.trace_step_phases(_trace_ranges(_CYCLES), notes=notes)
    assert set(t["pid"]) == {1}
    wide = t.pivot_table(index="step", columns="phase", values="seconds") * 1e9
    assert wide.loc[0].to_dict() == pytest.approx(
        {"generate": 100, "logprob": 130, "update": 300, "sync": 0, "other": 70}
    )
    assert wide.loc[1].to_dict() == pytest.approx(
        {"generate": 100, "logprob": 80, "update": 250, "sync": 0, "other": 70}
    )
    assert len(notes) == 1 and notes[0].startswith("pid 1: no step range: 2 step(s) inferred")
    windows = steps.step_windows(schema.from_frame(_trace_ranges(_CYCLES)))  # what numbers micro-batches
    assert windows["start_ns"].tolist() == [0, 700] and windows["end_ns"].tolist() == [600, 1200]
    assert windows["step"].tolist() == [0, 1] and windows["pid"].tolist() == [1, 1]


def test_a_learner_only_process_starts_a_step_at_its_first_phase() -> None:
    rows = [r for r in _CYCLES if r[1] != "generate" and r[4] == 1]  # logprob, update, logprob, update
    t = steps.trace_step_phases(_trace_ranges(rows)).pivot_table(
        index="step", columns="phase", values="seconds"
    )
    assert (t["logprob"] * 1e9).tolist() == pytest.approx([130, 80])
    assert (t["update"] * 1e9).tolist() == pytest.approx([300, 250])


def test_weight_syncs_on_either_side_of_a_phase_never_start_a_step() -> None:
    # Megatron RL: suspend the engine (sync), generate, offload (sync), train, restore (sync), generate, ...
    rows = [
        ("rl/suspend-engine", "sync", 0, 10, 1),
        ("rl/rollout-collection", "generate", 10, 100, 1),
        ("rl/offload", "sync", 100, 120, 1),
        ("train", "update", 120, 300, 1),
        ("rl/restore", "sync", 300, 320, 1),
        ("rl/rollout-collection", "generate", 320, 400, 1),
        ("rl/offload", "sync", 400, 410, 1),
        ("train", "update", 410, 600, 1),
    ]
    t = steps.trace_step_phases(_trace_ranges(rows)).pivot_table(
        index="step", columns="phase", values="seconds"
    )
    assert (t["generate"] * 1e9).tolist() == pytest.approx([90, 80])
    assert (t["update"] * 1e9).tolist() == pytest.approx([180, 190])
    assert (t["sync"] * 1e9).tolist() == pytest.approx(
        [50, 10]
    )  # the sync before the first generate is step 0's


def test_step_ranges_inside_a_phase_mark_minibatches_not_steps() -> None:
    # verl under a torch.profiler schedule: ProfilerStep#N once per update mini-batch, inside update_actor
    markers = [("ProfilerStep#0", "step", 310, 450, 1), ("ProfilerStep#1", "step", 450, 590, 1)]
    markers += [("ProfilerStep#2", "step", 960, 1190, 1)]
    notes: list[str] = []
    t = steps.trace_step_phases(_trace_ranges(_CYCLES + markers), notes=notes)
    assert sorted(set(t["step"])) == [0, 1]
    assert t.query("step == 0 and phase == 'update'")["seconds"].item() == pytest.approx(300e-9)
    assert any("3 step ranges lie inside its phase ranges" in n for n in notes)
    kept, _ = steps.numbered_steps(schema.from_frame(_trace_ranges(_CYCLES + markers)))
    assert kept == []
    # a plain training loop: its steps inside one "train" range (a single phase) stay steps
    loop = [("train", "update", 0, 1000, 3), ("ProfilerStep#0", "step", 10, 500, 3)]
    loop += [("ProfilerStep#1", "step", 500, 990, 3)]
    assert sorted(set(steps.trace_step_phases(_trace_ranges(loop))["step"])) == [0, 1]


def test_steps_of_two_ranks_stay_apart_and_the_job_waits_for_the_slowest() -> None:
    ranges = _trace_ranges(
        [
            ("ProfilerStep#4", "step", 0, 1000, 1),
            ("update_actor", "update", 100, 600, 1),
            ("ProfilerStep#4", "step", 0, 1200, 2),
            ("update_actor", "update", 100, 1000, 2),
        ]
    ).assign(rank=lambda d: d["pid"] - 1, trace=lambda d: "rank-" + (d["pid"] - 1).astype(str))
    t = steps.trace_step_phases(ranges)
    assert sorted(t["rank"].unique().tolist()) == [0, 1]
    per_rank = t.groupby("rank")["seconds"].sum()
    assert per_rank[0] == pytest.approx(1000e-9) and per_rank[1] == pytest.approx(1200e-9)
    job = steps.one_process(t).set_index("phase")["seconds"]
    assert job.sum() == pytest.approx(1200e-9)  # the slowest rank's step, never the sum of both
    assert job["update"] == pytest.approx(900e-9)


@pytest.mark.parametrize("repeat", [1, 2, 3, 5])
def test_step_rows_are_summed_as_pandas_groupby_sums_them(repeat):
    """The step table's rows of one (trace, rank, process, step) -- a Kineto trace has each ProfilerStep on
    the CPU and the GPU timeline -- summed float for float as pandas' groupby-sum (compensated) and melted in
    the same order; ranks missing, several traces, awkward floats (1e-17 next to 1e3, infinities)."""
    st = steps
    rng = np.random.default_rng(repeat)
    rows = []
    for _ in range(40):
        key = {
            "trace": str(rng.choice(["b.json", "a.json"])),
            "rank": pd.NA if rng.random() < 0.3 else int(rng.integers(0, 3)),
            "pid": int(rng.integers(1, 4)),
            "step": int(rng.integers(0, 6)),
        }
        for _ in range(repeat):
            vals = rng.choice([0.0, 1e-17, 0.1, 1e3, 3.3e-9, 7.0 / 3], size=5)
            rows.append({**key, **dict(zip([*st.PHASES, "_wall"], vals.tolist(), strict=True))})
    rows[3]["update"] = float("inf")
    want = pd.DataFrame(rows).groupby(["trace", "rank", "pid", "step"], as_index=False, dropna=False).sum()
    want = st._with_other(
        want.drop(columns="_wall"), want["_wall"].to_numpy(), ["trace", "rank", "pid", "step"]
    )
    got = schema.to_frame(schema.make_table(st._long_table(rows), schema.STEP_COLUMNS))
    pd.testing.assert_frame_equal(
        schema.conform(got, schema.STEP_COLUMNS, "steps"),
        schema.conform(want, schema.STEP_COLUMNS, "steps"),
        check_exact=True,
    )


def test_only_step_and_phase_rows_reach_the_step_table(tmp_path) -> None:
    """jobs passes trace_step_phases only ``step_rows`` (an NVTX-heavy range table is not copied whole): the
    table is the one every row gives, on simulated verl traces (steps, phases, micro-batch and op ranges)."""
    import tests.synthetic_traces as st
    from tracing import jobs
    from tracing.analysis import attribution
    from tracing.ingest.detect import load_trace

    for k, job in enumerate(
        (st.Job(minibatches=2), st.Job(framework="verl-megatron", steps=((512, 256),) * 3))
    ):
        trace = load_trace(st.write_kineto(st.simulate(job), tmp_path / f"{k}.json.gz"))
        ranges = schema.from_frame(attribution.attribute_ranges(trace))
        keep = steps.step_rows(ranges)
        assert 0 < keep.sum() < len(ranges)  # some rows dropped, some kept: the test can fail
        cols = [c for c in jobs._STEP_INPUT if c in ranges.column_names]
        every = steps.trace_step_phases(jobs.with_trace_cols(ranges.select(cols), trace))
        some = steps.trace_step_phases(jobs.with_trace_cols(jobs._step_input(ranges), trace))
        assert len(every) > 0
        assert every.equals(some, check_metadata=True)


def test_a_step_range_inside_profiler_step_is_the_same_step_not_another() -> None:
    """An ``mxperf run --trace`` capture: torch.profiler's ProfilerStep#N holds mxperf's ``step`` range (its
    ``{"step": N}`` attribute the run's own number). One row per step, numbered as the run numbers it,
    phases counted once (before: the inner range became another step and its phases were summed in)."""
    ranges = _trace_ranges(
        [
            ("ProfilerStep#7", "step", 0, 1000, 1),
            ("step", "other", 10, 990, 1),
            ("update", "update", 100, 700, 1),
            ("ProfilerStep#8", "step", 1000, 2000, 1),
            ("step", "other", 1010, 1990, 1),
            ("update", "update", 1100, 1400, 1),
            ("step", "other", 2000, 2500, 1),  # a step outside any ProfilerStep: its own
        ]
    ).assign(attrs=["{}", '{"step": 2}', "{}", "{}", '{"step": 3}', "{}", '{"step": 4}'])
    t = steps.trace_step_phases(ranges).pivot_table(index="step", columns="phase", values="seconds")
    assert list(t.index) == [2, 3, 4]
    assert t.loc[2, "update"] == pytest.approx(600e-9) and t.loc[3, "update"] == pytest.approx(300e-9)
    assert t.loc[2, "other"] == pytest.approx(400e-9)  # ProfilerStep#7's wall minus its update
    assert t.loc[4, "other"] == pytest.approx(500e-9)


def test_steps_behind_the_gpu_are_timed_on_the_device_and_unannotated_ones_take_their_microbatches() -> None:
    """Each host step of 100 ns launches 300 ns of GPU work that starts when the previous step's ends: the
    host windows (100) are not the steps' cost (300); a step without phase ranges takes its micro-batch."""
    import pyarrow as pa

    rows = []
    for i in range(3):
        s = 1000 * i
        # (name, phase, start, end, gpu_end, queued_end): the GPU runs 500 ns behind
        rows.append((f"ProfilerStep#{i}", "step", s, s + 100, s + 800, s + 500 if i else -1))
        rows.append(("update_actor", "update", s + 10, s + 60, s + 700, s + 500 if i else -1))
    ranges = _trace_ranges([(n, ph, a, b, 1) for n, ph, a, b, _, _ in rows]).assign(
        gpu_end_ns=[r[4] for r in rows], queued_end_ns=[r[5] for r in rows]
    )
    bases: dict = {}
    t = steps.trace_step_phases(ranges, None, bases).pivot_table(
        index="step", columns="phase", values="seconds"
    )
    assert bases == {(None, 1): "device"}
    assert t.loc[1, "update"] == pytest.approx(200e-9) and t.loc[1, "other"] == pytest.approx(100e-9)
    assert t.loc[0, "update"] == pytest.approx(690e-9)  # nothing queued before the first: from its start
    host = steps.trace_step_phases(ranges.drop(columns=["queued_end_ns"]))
    assert host.query("step == 1 and phase == 'update'")["seconds"].iloc[0] == pytest.approx(50e-9)
    # no phase range in the steps: the detected micro-batches inside them, on their own basis
    mbs = pa.table(
        {
            "pid": [1, 1],
            "phase": ["update", "update"],
            "start_ns": [1005, 2005],
            "end_ns": [1790, 2790],
            "seconds": [290e-9, 290e-9],
        }
    )
    bare = ranges[ranges["phase"] == "step"]
    got = steps.trace_step_phases(bare, mbs).pivot_table(index="step", columns="phase", values="seconds")
    assert got.loc[1, "update"] == pytest.approx(290e-9) and got.loc[0, "update"] == 0.0
