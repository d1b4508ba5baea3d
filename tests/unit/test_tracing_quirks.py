"""One test per quirk folder in tests/data/quirks (see each folder's README for the expected numbers)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tracing.analysis import attribution, metrics
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.kineto import load_kineto_events

QUIRKS = Path(__file__).parent.parent / "data" / "quirks"
US = 1000


def test_same_stream_overlap_is_counted_once():
    ev = load_kineto_events(QUIRKS / "same_stream_overlap" / "trace.json").events
    d = metrics.device_metrics(ev).iloc[0]
    assert (d.busy_ns, d.span_ns, d.idle_ns) == (23 * US, 35 * US, 12 * US)
    assert d.same_stream_overlap_ns == 2 * US
    assert d.host_stall_ns == 0  # c's launch (driver cuLaunchKernelEx) ended long before the gap
    s = metrics.stream_breakdown(ev).iloc[0]
    assert s.negative_gaps == 1
    assert s.idle_ns == 12 * US  # the negative gap clamps to 0


def test_driver_launches_join_by_correlation():
    ops = metrics.gpu_ops(load_kineto_events(QUIRKS / "same_stream_overlap" / "trace.json").events)
    assert (ops["launch_end_ns"] > 0).all()


def test_kernels_without_launch_records_are_unattributed_not_stall():
    ev = load_kineto_events(QUIRKS / "no_launch_records" / "trace.json").events
    d = metrics.device_metrics(ev).iloc[0]
    assert (d.busy_ns, d.span_ns, d.idle_ns) == (12 * US, 27 * US, 15 * US)
    assert (d.host_stall_ns, d.unattributed_ns, d.other_idle_ns) == (0, 15 * US, 15 * US)
    assert np.isnan(d.host_stall_fraction)  # not measured, so not 0.0


def test_range_on_main_thread_gets_autograd_thread_kernels_by_window():
    tr = load_kineto_events(QUIRKS / "cross_thread_ranges" / "trace.json")
    r = attribution.attribute_ranges(tr).set_index("name").loc["## backward ##"]
    assert (r.thread_ops, r.thread_busy_ns) == (1, 4 * US)
    assert (r.window_ops, r.window_busy_ns, r.window_span_ns) == (3, 39 * US, 51 * US)
    assert r.host_stall_ns == 8 * US
    assert (r.wall_ns, r.gpu_end_ns, r.time_ns) == (50 * US, 155 * US, 55 * US)  # window [100, 155)
    assert r.busy_in_window_ns == 39 * US
    assert r.busy_in_window_ns + r.host_stall_ns <= r.time_ns


def test_ns_resolution_timestamps_are_exact():
    ev = load_kineto_events(QUIRKS / "ns_resolution" / "trace.json").events
    base = 1711964646000000000
    launch = ev[ev["kind"] == "runtime"].iloc[0]
    assert launch.start_ns == base + 4458676522690655
    assert launch.dur_ns == 3001
    k = ev[ev["kind"] == "kernel"].set_index("name")
    assert k.loc["k_ns", "dur_ns"] == 1
    assert k.loc["k_next", "dur_ns"] == 2000
    d = metrics.device_metrics(ev).iloc[0]
    assert d.host_stall_ns == 750


def test_trace_without_gpu_ops_gives_null_gpu_metrics_with_reason():
    tr = load_kineto_events(QUIRKS / "no_gpu_ops" / "trace.json")
    assert tr.num_gpu_ops == 0
    assert len(metrics.device_metrics(tr.events)) == 0
    r = attribution.attribute_ranges(tr)
    mb = r[r["name"] == "update/microbatch"]
    assert len(mb) == 2 and (mb["wall_ns"] > 0).all()
    assert r["host_stall_ns"].isna().all() and r["window_busy_ns"].isna().all()
    assert set(r["gpu_reason"]) == {attribution.NO_GPU_REASON}


@pytest.fixture
def nsys_quirk(tmp_path):
    path = tmp_path / "quirk.sqlite"
    con = sqlite3.connect(path)
    con.executescript((QUIRKS / "nsys_unmatched_push_pop" / "schema.sql").read_text())
    con.close()
    return path


def test_nsys_push_without_pop_is_dropped_and_startend_range_spans_threads(nsys_quirk):
    tr = load_nsys_events(nsys_quirk)
    ranges = tr.events[tr.events["kind"] == "range"]
    assert sorted(ranges["name"].astype(str)) == ["from_string_table", "update/microbatch"]
    se = ranges[ranges["name"] == "from_string_table"].iloc[0]
    assert (se.pid, se.tid, se.end_tid) == (111, 111, 112)
    r = attribution.attribute_ranges(tr).set_index("name").loc["from_string_table"]
    assert (r.thread_ops, r.window_ops, r.window_busy_ns) == (0, 1, 200)


def test_nsys_text_that_is_not_utf8_is_kept_with_a_replacement_character():
    ev = load_nsys_events(QUIRKS / "nsys_non_utf8_text" / "trace.sqlite").events
    names = ev["name"].astype(str)
    assert len(ev) == 540 and (ev["kind"] == "range").sum() == 284
    kernels = ev[ev["kind"] == "kernel"]
    assert kernels.groupby("pid").size().to_dict() == {111: 34, 112: 34}
    bad = sorted({n for n in names if "\ufffd" in n})
    assert len(bad) == 2
    assert bad[0] == "FSDP::post_forward (encoder.block.17.layer.0), op_id = 315213\ufffd"  # NVTX text (ADBC)
    assert bad[1].startswith("sm80_xmma_gemm_") and bad[1].endswith("_kernel__5x_cublas\ufffd")  # StringIds
    assert (names[kernels.index] == bad[1]).sum() == 8


def test_nsys_text_stored_as_blob_or_number_is_read_as_text(tmp_path):
    """SQLite's dynamic typing lets a TEXT column hold a BLOB or a number: such a value is a name too."""
    path = tmp_path / "blob.sqlite"
    path.write_bytes((QUIRKS / "nsys_non_utf8_text" / "trace.sqlite").read_bytes())
    con = sqlite3.connect(path)
    con.execute("UPDATE StringIds SET value = X'6B5F626C6F62FF' WHERE id = 330297")  # b"k_blob\xff"
    con.execute("UPDATE NVTX_EVENTS SET text = X'6E7674785F626C6F62' WHERE rowid = 1")  # b"nvtx_blob"
    con.execute("UPDATE NVTX_EVENTS SET text = 7 WHERE rowid = 2")
    con.commit()
    con.close()
    ev = load_nsys_events(path).events
    names = ev["name"].astype(str)
    assert len(ev) == 540
    assert (names[ev["kind"] == "kernel"] == "k_blob\ufffd").sum() == 8
    assert {"nvtx_blob", "7"} <= set(names[ev["kind"] == "range"])
