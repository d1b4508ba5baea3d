"""A streamed file's range table leaves it a part at a time: the parts make the whole table, and what the other
tables read from the rows it keeps (``tracing.analysis.range_summary``) equals what they read from all rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import synthetic_traces as st

from tracing import staged
from tracing.analysis import attribution, mbregions, range_file
from tracing.analysis.microbatches import plan_jobs
from tracing.analysis.phases import default_phase_map
from tracing.analysis.range_file import RangeFile
from tracing.ingest.spill import SortedRuns
from tracing.jobs import ingest_file

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = [
    DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz",
    DATA / "real" / "hta_sampled_2rank" / "rank-0.json.gz",
    DATA / "real" / "nsysai_h100x2_mfu_before.sqlite",
]
QUIRKS = [DATA / "quirks" / q / "trace.json" for q in ("no_gpu_ops", "cross_thread_ranges")]


def _synthetic(tmp: Path) -> list[Path]:
    verl = st.simulate(st.Job(minibatches=2))  # phase ranges, ProfilerStep#N, micro-batches to detect
    explicit = st.simulate(st.Job(explicit_ranges="mxperf", pid=7))
    nemo = st.simulate(st.Job(framework="nemo-rl", pid=99))
    return [
        st.write_kineto(verl, tmp / "verl.json.gz"),
        st.write_kineto(explicit, tmp / "explicit.json.gz"),
        st.write_nsys_sqlite([nemo], tmp / "nemo.sqlite"),  # emit_nvtx op ranges: a range per op
    ]


def _fmt(path: Path) -> str:
    return "nsys" if path.suffix == ".sqlite" else "kineto"


def test_a_staged_range_table_gives_every_table_the_whole_table_gives(tmp_path, monkeypatch):
    for i, path in enumerate([*REAL, *QUIRKS, *_synthetic(tmp_path)]):
        full = ingest_file(str(path), _fmt(path), None, None, 0, streaming=True)
        rows = max(1, len(full.ranges) // 5)  # five or six parts, the last one short
        monkeypatch.setattr(staged, "STAGE_ROWS", rows)
        stage = tmp_path / f"stage-{i}"
        stage.mkdir()
        got = ingest_file(str(path), _fmt(path), None, str(stage), 0, streaming=True)
        n = len(full.ranges)
        assert got.num_ranges == n and "ranges" in got.staged_tables, path
        assert len(got.ranges) == 0 and list(got.ranges.columns) == list(full.ranges.columns)
        parts = list(staged._read_parts(got.staged_tables["ranges"]))
        assert [len(p) for p in parts] == [min(rows, n - a) for a in range(0, n, rows)]
        whole = pd.concat(parts, ignore_index=True)
        pd.testing.assert_frame_equal(whole, full.ranges, check_exact=True)
        assert got.phase_seconds == staged.phase_seconds(full.ranges)
        pd.testing.assert_frame_equal(got.steps, full.steps, check_exact=True)
        assert got.microbatches is not None and full.microbatches is not None
        pd.testing.assert_frame_equal(got.microbatches.table, full.microbatches.table, check_exact=True)
        assert got.microbatches.notes == full.microbatches.notes, path


def _cols(rows: list[tuple[str, str, int, int, int, int]]) -> dict:
    """Range columns of (name, domain, pid, tid, start, end) rows."""
    names = sorted({r[0] for r in rows})
    domains = sorted({r[1] for r in rows})
    arr = lambda k: np.array([r[k] for r in rows], np.int64)  # noqa: E731
    return attribution.coded_range_columns(
        (np.array([names.index(r[0]) for r in rows], np.int64), names),
        (np.array([domains.index(r[1]) for r in rows], np.int64), domains),
        arr(2),
        arr(3),
        arr(4),
        arr(5),
        "nvtx",
        default_phase_map(),
    )


def _table(cols: dict) -> pd.DataFrame:
    return next(attribution.table_parts(dict(cols), max(len(cols["start_ns"]), 1)))


def _range_file(rows: list[tuple[str, str, int, int, int, int]], pattern: str | None, tmp: Path) -> RangeFile:
    """The rows as the streamed path keeps them: sorted runs of pass-1 rows (relative times, codes into names
    that are not all range names), merged into a range file a few rows at a time."""
    names = ["a kernel", *sorted({r[0] for r in rows})]
    domains = sorted({r[1] for r in rows})
    runs = SortedRuns(tmp, range_file.SPILL_COLUMNS, range_file.SPILL_KEYS, run_rows=16)
    for a in range(0, len(rows), 10):
        mine = rows[a : a + 10]
        chunk = {
            "rid": np.arange(a, a + len(mine)),
            "name": np.array([names.index(r[0]) for r in mine], np.int32),
            "domain": np.array([domains.index(r[1]) for r in mine], np.int32),
            "pid": np.array([r[2] for r in mine]),
            "tid": np.array([r[3] for r in mine]),
            "start_ns": np.array([r[4] - 1000 for r in mine]),
            "dur_ns": np.array([r[5] - r[4] for r in mine]),
        }
        runs.add(range_file.spill_rows(chunk, np.ones(len(mine), bool)))
    path = tmp / f"ranges-{pattern}.bin"
    rf = RangeFile.build(runs.merged(7), path, 1000, names, domains, "nvtx", default_phase_map(), pattern)
    runs.close()
    return rf


def _kept(rf: RangeFile, rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The whole table from the range file's parts of ``rows`` ranges, and its kept rows."""
    parts, kept = [], []
    for part, keep in rf.table(rows, None, []):
        parts.append(part)
        kept.append(part[keep])
    return pd.concat(parts, ignore_index=True), pd.concat(kept, ignore_index=True)


def test_the_kept_rows_plan_the_same_micro_batch_jobs(tmp_path):
    """A phase range nested in an unnamed range nested in another phase range is no region of its own: the
    chain between them is kept. A process of op ranges only is cut as a whole; one with a user range is not;
    one with a sampler range is left alone."""
    rows = [
        ("update_actor", "", 1, 1, 0, 1000),  # a region
        ("helper", "", 1, 1, 10, 900),  # not kept for itself: an ancestor of the next
        ("compute_log_prob", "", 1, 1, 20, 800),  # nested: not a region
        *((f"aten::mm, op_id = {i}", "", 1, 1, 30 + i, 31 + i) for i in range(50)),
        *((f"aten::mm, op_id = {i}", "", 2, 1, 30 + i, 31 + i) for i in range(50)),  # op ranges only
        *((f"aten::mm, op_id = {i}", "", 3, 1, 30 + i, 31 + i) for i in range(50)),
        ("my_marker", "", 3, 1, 500, 600),  # a user range: no whole-process cut
        ("ncclAllReduce", "NCCL", 4, 1, 0, 5),
        ("generate_sequences", "", 5, 1, 0, 100),  # a sampler
        ("ProfilerStep#3", "", 6, 1, 0, 100),
        ("aten::add, op_id = 1", "", 6, 1, 5, 6),
        ("update/microbatch[step=0,microbatch=1]", "", 7, 1, 0, 100),
    ]
    full = _table(_cols(rows))
    for part_rows in (
        1,
        5,
        64,
        1000,
    ):  # the range file's table, in parts or whole, is the held columns' table
        got, kept = _kept(_range_file(rows, None, tmp_path), part_rows)
        pd.testing.assert_frame_equal(got, full, check_exact=True)
    assert len(kept) < len(full) / 3  # the op ranges are not kept
    assert "helper" in set(kept["name"])
    for pattern in (None, r"my_marker"):

        def whole(pid: int) -> mbregions.Region:
            return mbregions.Region(pid, 1, None, 0, 1, -1, "")

        pids = set(range(1, 9))
        want = plan_jobs(pids, whole, full, pattern)
        got = plan_jobs(pids, whole, _kept(_range_file(rows, pattern, tmp_path), 7)[1], pattern)
        assert [(j.pid, j.lo, j.hi, j.phase, j.region) for j in got[0]] == [
            (j.pid, j.lo, j.hi, j.phase, j.region) for j in want[0]
        ]
        assert got[1] == want[1]
        pd.testing.assert_frame_equal(got[2], want[2])
    regions = plan_jobs(set(), lambda p: None, kept, None)[1]
    assert [(r.pid, r.name) for r in regions] == [(1, "update_actor"), (6, "ProfilerStep#3")]
    # pid 2 only has op ranges: cut as a whole; pid 3 has a user range, pid 4 only NCCL's (whole)
    jobs = plan_jobs({2, 3, 4}, lambda p: mbregions.Region(p, 1, None, 0, 1, -1, ""), kept, None)[0]
    assert sorted(j.pid for j in jobs if j.region is not None and j.region.name == "") == [2, 4]


def test_device_time_in_each_window_made_a_part_at_a_time_is_the_clipped_union(tmp_path):
    """busy_in_window / host_stall (C(window end) for all ranges at once, C(start) part by part) equal the
    process's busy and stall intervals clipped to each window, held at once, for every part size."""
    from tracing.analysis import metrics
    from tracing.ingest.detect import load_trace

    for path in [REAL[0], REAL[2], st.two_process_kineto(tmp_path)]:
        trace = load_trace(str(path), _fmt(path))
        ops = metrics.gpu_ops(trace.events)
        timelines = metrics.device_timelines(trace.events, ops)
        assert len({t.pid for t in timelines}) >= 1 and len(timelines) >= 1
        whole = attribution.attribute_ranges(trace, ops=ops, timelines=timelines)
        start = whole["start_ns"].to_numpy()
        busy, stall = attribution.clipped_device_time(
            whole["pid"].to_numpy(), start, start + whole["time_ns"].to_numpy(), timelines
        )
        assert busy.sum() > 0
        np.testing.assert_array_equal(whole["busy_in_window_ns"].to_numpy(), busy)
        np.testing.assert_array_equal(whole["host_stall_ns"].to_numpy(), stall)
        cols = attribution.range_columns(trace)
        launched = {
            c: ops[c].to_numpy(np.int64)
            for c in ("pid", "launch_tid", "launch_start_ns", "start_ns", "end_ns")
        }
        partials = {
            prefix: attribution._attribute(
                [cols[k] for k in keys], cols["start_ns"], cols["end_ns"], launched, list(op_keys)
            )
            for prefix, op_keys, keys in attribution.RULES
        }
        rows = max(1, len(whole) // 4)  # four or five parts
        parts = list(attribution.table_parts(cols, rows, partials, timelines))
        assert len(parts) == -(-len(whole) // rows) > 1
        pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), whole, check_exact=True)
