"""Nsight Systems SQLite ingest on the real 2x H100 export."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tracing.analysis import metrics
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.nsys import decode_global_tid
from tracing.outputs import schema
from tracing.outputs.errors import TraceFormatError

NSYS = Path(__file__).parent.parent / "data" / "real" / "nsysai_h100x2_mfu_before.sqlite"


@pytest.fixture(scope="module")
def trace():
    return load_nsys_events(NSYS)


def test_row_counts_match_the_export(trace):
    c = trace.events["kind"].value_counts()
    assert (c["kernel"], c["memcpy"], c["memset"], c["sync"]) == (4010, 1020, 269, 366)
    assert c["runtime"] + c["driver"] == 7466
    assert c["driver"] == 1074  # eventClass 1 rows are driver calls (cuLaunchKernelEx, ...)
    assert c["range"] == 19118


def test_global_tid_decodes_to_pid_and_tid():
    pid, tid = decode_global_tid(np.array([0x100006F00006F]))
    assert (int(pid[0]), int(tid[0])) == (111, 111)


def test_kernels_join_to_launches_by_correlation_id(trace):
    con = sqlite3.connect(f"{NSYS.resolve().as_uri()}?mode=ro", uri=True)
    ref = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid"
    ).fetchone()[0]
    con.close()
    ops = metrics.gpu_ops(trace.events)
    kernels = ops[ops["kind"] == "kernel"]
    joined = kernels[kernels["launch_start_ns"] != schema.NO_ID]
    assert len(joined) == ref
    assert (joined["launch_start_ns"] <= joined["start_ns"]).all()  # a kernel never starts before its launch


def test_kernels_belong_to_the_two_training_processes(trace):
    k = trace.events[trace.events["kind"] == "kernel"]
    assert sorted(k.groupby("pid")["device"].unique().map(tuple).items()) == [(144, (0,)), (145, (1,))]


def test_nccl_domain_range_names_come_from_string_ids(trace):
    ranges = trace.events[trace.events["kind"] == "range"]
    nccl = ranges[ranges["domain"] == "domain 1"]
    assert len(nccl) == 462
    assert (nccl["name"].astype(str) != "").all()


def test_file_is_opened_read_only(trace):
    digest = hashlib.sha256(NSYS.read_bytes()).hexdigest()
    load_nsys_events(NSYS)
    assert hashlib.sha256(NSYS.read_bytes()).hexdigest() == digest
    assert not NSYS.with_name(NSYS.name + "-journal").exists()


def test_sqlite_that_is_not_an_nsys_export_is_refused(tmp_path):
    p = tmp_path / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x)")
    con.close()
    with pytest.raises(TraceFormatError, match=r"other\.sqlite.*not an Nsight Systems SQLite export"):
        load_nsys_events(p)


def test_missing_required_column_names_the_table(tmp_path):
    p = tmp_path / "bad.sqlite"
    con = sqlite3.connect(p)
    con.executescript(
        "CREATE TABLE StringIds (id, value); CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, deviceId);"
    )
    con.close()
    with pytest.raises(TraceFormatError, match="CUPTI_ACTIVITY_KIND_KERNEL lacks column"):
        load_nsys_events(p)


def test_export_without_activity_tables_has_no_gpu_ops(tmp_path):
    p = tmp_path / "empty.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.close()
    tr = load_nsys_events(p)
    assert tr.num_gpu_ops == 0 and len(metrics.device_metrics(tr.events)) == 0
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in tr.meta["missing_tables"]


def test_nsys_report_file_says_to_export_to_sqlite(tmp_path):
    p = tmp_path / "run.nsys-rep"
    p.write_bytes(b"\x00binary report")
    with pytest.raises(TraceFormatError, match="nsys export --type sqlite"):
        load_nsys_events(p)


def test_an_export_cut_down_by_hand_takes_its_kernels_pid_from_their_launches(tmp_path):
    """Tools' test exports keep a few columns: kernels without ``globalPid``, runtime calls without
    ``eventClass``. A kernel then belongs to the process of the call that launched it (by correlation id), and
    host stall is measured as in a full export."""
    p = tmp_path / "cut.sqlite"
    con = sqlite3.connect(p)
    con.executescript(
        "CREATE TABLE StringIds (id INTEGER, value TEXT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,"
        " correlationId INTEGER, shortName INTEGER, demangledName INTEGER);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, correlationId INTEGER,"
        " globalTid INTEGER, nameId INTEGER);"
        "INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'gemm');"
    )
    gtid = (1 << 48) | (777 << 24) | 5
    for corr, (l0, l1, k0, k1) in enumerate([(0, 10, 20, 120), (300, 320, 330, 430)], start=1):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 1)", (l0, l1, corr, gtid))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, 2, 2)", (k0, k1, corr))
    con.commit()
    con.close()
    tr = load_nsys_events(p)
    kernels = tr.events[tr.events["kind"] == "kernel"]
    assert kernels["pid"].tolist() == [777, 777] and tr.meta["gpu_ops_without_pid"] == 2
    (d,) = metrics.device_metrics(tr.events).to_dict("records")
    assert (d["pid"], d["busy_ns"], d["host_stall_ns"]) == (777, 200, 320 - 120)
