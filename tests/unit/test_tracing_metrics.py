"""Device metrics on the real traces against independent computations, and the host-stall rules on tiny tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tracing_helpers import reference_gpu_intervals, reference_union

from tracing.analysis import metrics
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.kineto import load_kineto_events
from tracing.ingest.trace import events_frame
from tracing.outputs import schema

REAL = Path(__file__).parent.parent / "data" / "real"
A100 = REAL / "hta_a100_ddp_rank0_hostbound.json.gz"
KINETO = [A100, REAL / "hta_sampled_2rank" / "rank-0.json.gz", REAL / "hta_sampled_2rank" / "rank-1.json.gz"]
NSYS = REAL / "nsysai_h100x2_mfu_before.sqlite"


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_busy_and_span_equal_an_independent_union(path):
    dev = metrics.device_metrics(load_kineto_events(path).events)
    ref = reference_gpu_intervals(path)
    assert sorted(dev["device"]) == sorted(ref)
    for row in dev.itertuples():
        busy, span = reference_union(ref[row.device])
        assert (row.busy_ns, row.span_ns) == (busy, span)


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_host_stall_plus_other_equals_idle(path):
    dev = metrics.device_metrics(load_kineto_events(path).events)
    assert (dev["host_stall_ns"] + dev["other_idle_ns"] == dev["idle_ns"]).all()
    assert (dev["idle_ns"] == dev["span_ns"] - dev["busy_ns"]).all()
    assert (dev["unattributed_ns"] <= dev["other_idle_ns"]).all()
    assert (dev["host_stall_ambiguous_ns"] <= dev["host_stall_ns"]).all()


def test_a100_trace_is_strongly_host_bound():
    dev = metrics.device_metrics(load_kineto_events(A100).events).iloc[0]
    assert dev.span_ns == 660_551_005
    assert dev.busy_ns / dev.span_ns == pytest.approx(0.238, abs=0.001)
    assert dev.host_stall_ns / dev.idle_ns > 0.9
    assert dev.host_stall_fraction > 0.7


def test_a100_stream7_host_wait_share_matches_hta_within_a_few_percent():
    # HTA 0.5.0 reports host_wait 0.99 of idle on stream 7 with its start rule.
    streams = metrics.stream_breakdown(load_kineto_events(A100).events, rule="start")
    s7 = streams[streams["stream"] == 7].iloc[0]
    assert s7.host_wait_share == pytest.approx(0.99, abs=0.03)
    assert s7.host_wait_ns + s7.kernel_wait_ns + s7.other_wait_ns == s7.idle_ns


def test_nsys_busy_and_span_match_the_fixture_readme():
    dev = metrics.device_metrics(load_nsys_events(NSYS).events).set_index("device")
    assert dev.loc[0, "span_ns"] / 1e6 == pytest.approx(299.8, abs=0.05)
    assert dev.loc[0, "busy_ns"] / 1e6 == pytest.approx(273.8, abs=0.05)
    assert dev.loc[1, "span_ns"] / 1e6 == pytest.approx(298.7, abs=0.05)
    assert dev.loc[1, "busy_ns"] / 1e6 == pytest.approx(267.3, abs=0.05)
    assert (dev["host_stall_ns"] + dev["other_idle_ns"] == dev["idle_ns"]).all()


def _events(rows: list[tuple]) -> pd.DataFrame:
    """rows: (kind, pid, tid, device, stream, start_ns, dur_ns, correlation)."""
    kinds = list(schema.EVENT_KINDS)
    cols = {c: np.array([schema.NO_ID] * len(rows), np.int64) for c in schema.EVENT_COLUMNS}
    for i, (kind, pid, tid, dev, stream, start, dur, corr) in enumerate(rows):
        cols["kind"][i] = kinds.index(kind)
        cols["name"][i] = 0
        cols["domain"][i] = 0
        for c, v in zip(
            ("pid", "tid", "device", "stream", "start_ns", "dur_ns", "correlation"),
            (pid, tid, dev, stream, start, dur, corr),
            strict=True,
        ):
            cols[c][i] = v
    return events_frame(cols, ["op"], kinds, [""])


def test_gap_after_late_launch_is_host_stall():
    # k1 [0,10); launch of k2 ends at 25; k2 [30,40): gap [10,30), stall = min(30, 25) - 10 = 15.
    ev = _events(
        [
            ("runtime", 1, 1, -1, -1, 0, 2, 1),
            ("kernel", 1, -1, 0, 7, 0, 10, 1),
            ("runtime", 1, 1, -1, -1, 20, 5, 2),
            ("kernel", 1, -1, 0, 7, 30, 10, 2),
        ]
    )
    d = metrics.device_metrics(ev).iloc[0]
    assert (d.span_ns, d.busy_ns, d.idle_ns, d.host_stall_ns, d.other_idle_ns) == (40, 20, 20, 15, 5)
    assert d.host_stall_ambiguous_ns == 0


def test_gap_after_early_launch_is_not_host_stall():
    # k2 launched long before k1 ended: the GPU waited on something else.
    ev = _events(
        [
            ("runtime", 1, 1, -1, -1, 0, 2, 1),
            ("kernel", 1, -1, 0, 7, 0, 10, 1),
            ("runtime", 1, 1, -1, -1, 3, 2, 2),
            ("kernel", 1, -1, 0, 7, 30, 10, 2),
        ]
    )
    d = metrics.device_metrics(ev).iloc[0]
    assert (d.host_stall_ns, d.other_idle_ns, d.unattributed_ns) == (0, 20, 0)


def test_launch_that_straddles_the_gap_start_is_stall_and_ambiguous():
    # Launch [5, 18) started before k1 ended at 10 (HTA's start rule says "not host wait") but ended after it.
    ev = _events(
        [
            ("runtime", 1, 1, -1, -1, 0, 2, 1),
            ("kernel", 1, -1, 0, 7, 0, 10, 1),
            ("runtime", 1, 1, -1, -1, 5, 13, 2),
            ("kernel", 1, -1, 0, 7, 30, 10, 2),
        ]
    )
    d = metrics.device_metrics(ev).iloc[0]
    assert (d.host_stall_ns, d.host_stall_ambiguous_ns) == (8, 8)
    start_rule = metrics.stream_breakdown(ev, rule="start").iloc[0]
    end_rule = metrics.stream_breakdown(ev, rule="end").iloc[0]
    assert (start_rule.host_wait_ns, start_rule.kernel_wait_ns) == (0, 20)  # a 20 ns gap < 30 us
    assert end_rule.host_wait_ns == 20


def test_busy_union_counts_other_streams_so_idle_is_device_level():
    # Stream 7 idles [10, 30) while stream 8 works [5, 35): the device is never idle.
    ev = _events(
        [
            ("kernel", 1, -1, 0, 7, 0, 10, -1),
            ("kernel", 1, -1, 0, 8, 5, 30, -1),
            ("kernel", 1, -1, 0, 7, 30, 10, -1),
        ]
    )
    d = metrics.device_metrics(ev).iloc[0]
    assert (d.busy_ns, d.idle_ns, d.num_streams) == (40, 0, 2)
    s7 = metrics.stream_breakdown(ev).set_index("stream").loc[7]
    assert s7.idle_ns == 20  # HTA's per-stream view still sees a gap


def test_no_gpu_ops_gives_no_device_rows():
    ev = _events([("cpu_op", 1, 1, -1, -1, 0, 10, -1)])
    assert len(metrics.device_metrics(ev)) == 0
    assert list(metrics.device_metrics(ev).columns) == [
        c for c in schema.DEVICE_COLUMNS if c not in ("trace", "format", "rank")
    ]


def test_window_stall_is_the_host_stall_inside_each_window_by_brute_force():
    """Micro-batch windows measure host stall in the engine, as ranges do: per process, the union of its devices'
    stall intervals (``device_timelines``) inside [lo, hi], checked against each union block's overlap."""
    from tracing.analysis import gpu_tables, range_tables
    from tracing.ingest.decoded import in_engine

    with in_engine(REAL / "hta_a100_ddp_rank0_hostbound.json.gz", "kineto") as (con, _, _):
        gpu_tables.make_ops(con)
        timelines = gpu_tables.device_timelines(con)
        pid = timelines[0].pid
        s = np.concatenate([t.stall.start for t in timelines if t.pid == pid])
        e = np.concatenate([t.stall.end for t in timelines if t.pid == pid])
        rng = np.random.default_rng(0)
        lo = int(s.min()) - 100 + rng.integers(0, int(e.max() - s.min()) + 100, 300)
        hi = lo + rng.integers(0, int(e.max() - s.min()) // 20, 300)
        got = range_tables.window_stall(con, np.full(300, pid), lo, hi)
    us, ue = metrics.union_intervals(s, e)
    want = [
        int(np.clip(np.minimum(ue, b) - np.maximum(us, a), 0, None).sum())
        for a, b in zip(lo, hi, strict=True)
    ]
    assert got.tolist() == want and sum(want) > 0
