"""The streaming (bounded-memory) Kineto and nsys ingest gives exactly the in-memory path's tables.

Every real Kineto trace in tests/data, every Kineto quirk, and simulated verl / Megatron traces with known
micro-batches (tests/synthetic_traces.py), each read twice by ``tracing.jobs.ingest_file``: in memory and
streamed with tiny chunks and runs, so every chunk boundary, multi-run merge and the launch join across runs
are exercised. Tables, micro-batch notes, the event table read back from Parquet and its metadata must be equal.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import tests.synthetic_traces as st
from tracing import streamed
from tracing.analysis import mbdetect
from tracing.ingest import columnfiles, spill, sqlite_bulk
from tracing.jobs import ingest_file
from tracing.outputs import store
from tracing.outputs.labels import Labels

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
REAL = [
    DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz",
    *sorted((DATA / "real" / "hta_sampled_2rank").glob("*.json.gz")),
]
QUIRKS = sorted((DATA / "quirks").glob("*/trace.json"))


def _both(
    path: Path,
    tmp: Path,
    monkeypatch,
    chunk: int = 997,
    run: int = 1511,
    fmt: str = "kineto",
    workers: int = 1,
    **kw,
):
    monkeypatch.setattr(streamed, "CHUNK_ROWS", chunk)
    monkeypatch.setattr(streamed, "RUN_ROWS", run)
    monkeypatch.setattr(streamed, "OP_RUN_ROWS", run)  # joined ops and launches: many runs, many chunks
    monkeypatch.setattr(streamed, "SLAB_ROWS", 53)  # range columns read back in many slabs for attribution
    monkeypatch.setattr(sqlite_bulk, "BLOCK_ROWS", 613)  # nsys: tables read in many rowid blocks
    # micro-batch detection: regions read in many blocks, host items and launches found by a fine sparse index
    monkeypatch.setattr(mbdetect, "_BLOCK", 101)
    monkeypatch.setattr(columnfiles, "EVERY", 37)
    a = ingest_file(str(path), fmt, None, str(tmp), 0, streaming=False, **kw)
    b = ingest_file(str(path), fmt, None, str(tmp), 1, streaming=True, decode_workers=workers, **kw)
    for attr in ("devices", "streams", "ranges", "kernels", "steps"):
        pd.testing.assert_frame_equal(getattr(a, attr), getattr(b, attr), check_exact=True, obj=attr)
    pd.testing.assert_frame_equal(a.microbatches.table, b.microbatches.table, check_exact=True)
    assert a.microbatches.notes == b.microbatches.notes
    assert a.microbatches.warnings == b.microbatches.warnings
    assert (a.num_events, a.meta, a.rank, a.gpu_reason) == (b.num_events, b.meta, b.rank, b.gpu_reason)
    for ta, tb in zip(a.timelines, b.timelines, strict=True):
        assert (ta.pid, ta.device, ta.row) == (tb.pid, tb.device, tb.row)
        for f in ("busy", "stall"):  # starts and ends
            for x, y in zip(getattr(ta, f).arrays(), getattr(tb, f).arrays(), strict=True):
                assert np.array_equal(x, y), f
        # streamed, the intervals are on disk in the caller's folder (it removes them), not in memory
        assert ta.busy.path is None and tb.busy.path is not None and Path(tb.busy.path).parent == tmp
    events_a, events_b = store.read_table(a.staged_events), store.read_table(b.staged_events)
    pd.testing.assert_frame_equal(events_a, events_b, check_exact=True, obj="events")
    assert store.table_meta(a.staged_events) == store.table_meta(b.staged_events)
    # the same Arrow schema (dictionary index types) and pandas metadata (number of categories) too
    assert pq.read_schema(a.staged_events).equals(pq.read_schema(b.staged_events), check_metadata=True)
    assert not list(tmp.glob(".spill-*")), "spill files are removed"
    return a, b


@pytest.mark.parametrize("path", REAL + QUIRKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_streamed_tables_equal_in_memory_tables(path, tmp_path, monkeypatch):
    a, _ = _both(path, tmp_path, monkeypatch)
    assert a.num_events > 0


def test_a_range_dense_trace_streams_to_the_same_tables(tmp_path, monkeypatch):
    """Every cpu_op also a range (benchmarks/make_range_dense_source.py): ranges nested in ranges on every thread,
    read back from the range file in many slabs, the same tables."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import make_range_dense_source as dense
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    path = tmp_path / "dense.json.gz"
    assert dense.range_dense(dense.SRC, path)["ranges_added"] > 2_000
    a, _ = _both(path, tmp_path, monkeypatch)
    assert len(a.ranges) > 2_000 and (a.ranges["depth"] > 1).any() and a.ranges["window_ops"].sum() > 0


def _sim(tmp: Path, name: str, **job) -> Path:
    return st.write_kineto(st.simulate(st.Job(**job)), tmp / f"{name}.json.gz")


@pytest.mark.parametrize(
    ("name", "job", "labels", "pattern"),
    [
        ("verl-fsdp", {"minibatches": 2}, None, None),
        ("verl-megatron", {"framework": "verl-megatron", "precision": "mxfp8"}, None, None),
        ("explicit-verl", {"explicit_ranges": "verl"}, None, None),
        ("explicit-mxperf", {"explicit_ranges": "mxperf", "logprob": False}, None, None),
        ("1f1b", {"steps": ((1024, 2048, 512, 1024),), "logprob": False, "schedule": "1f1b"}, None, None),
        ("labelled", {"logprob": False}, Labels(tokens_per_microbatch=4096, precision="bf16"), None),
        ("pattern", {"steps": ((1024,),)}, None, "no_such_range"),
    ],
)
def test_streamed_microbatches_equal_in_memory(name, job, labels, pattern, tmp_path, monkeypatch):
    path = _sim(tmp_path, name, steps=job.pop("steps", ((2048, 1024, (4, 512)), (4096, 512))), **job)
    a, _ = _both(path, tmp_path, monkeypatch, labels=labels, pattern=pattern)
    if name in ("verl-fsdp", "verl-megatron", "explicit-mxperf", "labelled"):
        assert len(a.microbatches.table) > 0


def test_streamed_without_shapes_or_with_one_big_chunk(tmp_path, monkeypatch):
    rank = st.simulate(st.Job(steps=((2048, 1024), (512,))))
    path = st.write_kineto(rank, tmp_path / "noshapes.json.gz", shapes=False)
    _both(path, tmp_path, monkeypatch)
    _both(path, tmp_path, monkeypatch, chunk=1 << 20, run=1 << 21)  # no runs on disk: one in-memory buffer


def test_several_processes_in_one_kineto_file(tmp_path, monkeypatch):
    """Two processes on one device in one file: the launching pid of each GPU row comes from the
    (correlation -> pid) map, and the device is shared (the colocated columns)."""
    path = st.two_process_kineto(tmp_path)
    a, _ = _both(path, tmp_path, monkeypatch)
    assert sorted(a.devices["pid"].tolist()) == [100, 200]
    assert (a.devices["device_processes"] == 2).all()


def test_sorted_runs_merge_equals_one_stable_sort(tmp_path):
    rng = np.random.default_rng(7)
    n = 50_000
    cols = {
        "a": rng.integers(0, 3, n),
        "b": rng.integers(-5, 5, n) * 10**15,  # large values and ties
        "rid": np.arange(n),
        "v": rng.integers(0, 1 << 40, n),
    }
    runs = spill.SortedRuns(tmp_path, ("a", "b", "rid", "v"), ("a", "b", "rid"), run_rows=4093)
    for i in range(0, n, 3001):
        runs.add({k: v[i : i + 3001] for k, v in cols.items()})
    got = {k: np.concatenate([c[k] for c in runs.merged(chunk_rows=777)]) for k in cols}
    order = np.lexsort((cols["rid"], cols["b"], cols["a"]))
    for k in cols:
        assert np.array_equal(got[k], cols[k][order]), k
    runs.close()
    assert not list(tmp_path.glob("run-*"))


@pytest.mark.parametrize("path", REAL + QUIRKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sharded_decoders_and_background_writer_give_every_in_memory_table(path, tmp_path, monkeypatch):
    """--workers 2 on one streamed file (two decoder processes, the event Parquet written beside the
    analysis): every table, the micro-batches, timelines and the event Parquet as in memory."""
    from tracing.ingest import kineto_sharded

    monkeypatch.setattr(kineto_sharded, "MESSAGE_ROWS", 500)
    _both(path, tmp_path, monkeypatch, workers=2)


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("path", REAL[:2], ids=lambda p: p.name)
def test_decoding_in_several_processes_gives_the_same_tables(path, workers, tmp_path, monkeypatch):
    from tracing.ingest import kineto_sharded

    monkeypatch.setattr(kineto_sharded, "MESSAGE_ROWS", 300)  # many messages, batches split across them
    monkeypatch.setattr(streamed, "CHUNK_ROWS", 997)
    seen: list[tuple[int, int]] = []
    a = ingest_file(str(path), "kineto", None, str(tmp_path), 0, streaming=False)
    b = ingest_file(
        str(path),
        "kineto",
        None,
        str(tmp_path),
        1,
        decode_workers=workers,
        progress=lambda *d: seen.append(d),
    )
    for attr in ("devices", "streams", "ranges", "kernels", "steps"):
        pd.testing.assert_frame_equal(getattr(a, attr), getattr(b, attr), check_exact=True, obj=attr)
    events_a, events_b = store.read_table(a.staged_events), store.read_table(b.staged_events)
    pd.testing.assert_frame_equal(events_a, events_b, check_exact=True, obj="events")
    assert a.meta == b.meta and a.num_events == b.num_events
    size = path.stat().st_size
    assert seen and seen[-1] == (size, size) and [d[0] for d in seen] == sorted(d[0] for d in seen)


def test_a_decoder_that_dies_leaves_the_file_to_this_process(tmp_path, monkeypatch):
    """A decoder process that stops without a word (killed, out of memory): the file is read in this
    process, and the tables are the same."""
    from tracing.ingest import kineto_sharded

    def dies(out, path, include_python, fast, workers, me, reports):
        if me == 1:
            os._exit(9)
        return real(out, path, include_python, fast, workers, me, reports)

    real = kineto_sharded._decode_shard
    monkeypatch.setattr(kineto_sharded, "_decode_shard", dies)
    path = REAL[0]
    a = ingest_file(str(path), "kineto", None, str(tmp_path), 0, streaming=False)
    b = ingest_file(str(path), "kineto", None, str(tmp_path), 1, decode_workers=2)
    pd.testing.assert_frame_equal(a.ranges, b.ranges, check_exact=True)
    pd.testing.assert_frame_equal(store.read_table(a.staged_events), store.read_table(b.staged_events))
    assert not list(tmp_path.glob(".spill-*"))


def _kineto(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}))
    return path


def _x(cat: str, name: str, pid: object, ts: str, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": 1, "ts": ts, "dur": "1.5", "args": args}


def test_two_processes_fall_back_to_the_serial_reader_where_ids_span_the_file(tmp_path):
    """A text pid gets its id by first appearance in the whole file: the decoder processes hand the file to
    the serial reader, and the tables are the in-memory path's."""
    events = [_x("cpu_op", f"op{i}", 7 if i % 3 else "Spans", f"{100 + i}.250") for i in range(50)]
    path = _kineto(tmp_path / "spans.json", events)
    a = ingest_file(str(path), "kineto", None, str(tmp_path), 0, streaming=False)
    b = ingest_file(str(path), "kineto", None, str(tmp_path), 1, decode_workers=2)
    pd.testing.assert_frame_equal(store.read_table(a.staged_events), store.read_table(b.staged_events))
    assert (store.read_table(b.staged_events)["pid"] < -1).any()


def test_a_bad_event_gives_the_same_error_streamed_in_two_processes(tmp_path):
    from tracing.outputs.errors import TraceFormatError

    events = [_x("cpu_op", "op", 7, f"{100 + i}.250") for i in range(40)]
    del events[33]["ts"]
    path = _kineto(tmp_path / "bad.json", events)
    errors = []
    for kw in ({"streaming": False}, {"decode_workers": 2}, {"streaming": True}):
        with pytest.raises(TraceFormatError) as exc:
            ingest_file(str(path), "kineto", None, str(tmp_path), 0, **kw)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] == errors[2] and "traceEvents[33]" in errors[0] and "'ts'" in errors[0]
    assert not list(tmp_path.glob(".spill-*")) and not list(tmp_path.glob("*.parquet"))


NSYS_QUIRK = DATA / "quirks" / "nsys_unmatched_push_pop" / "schema.sql"


def _nsys_cases(tmp: Path) -> dict[str, Path]:
    steps = ((2048, 1024, (4, 512)), (4096, 512))
    learner = st.simulate(st.Job(framework="nemo-rl", steps=steps, pid=100, device=0))
    sampler = st.simulate(
        st.Job(framework="nemo-rl", steps=((512,) * 6,), logprob=False, pid=200, start_ns=3_000_000, seed=3)
    )
    quirk = tmp / "quirk.sqlite"
    con = sqlite3.connect(quirk)
    con.executescript(NSYS_QUIRK.read_text())
    con.close()
    return {
        "real": DATA / "real" / "nsysai_h100x2_mfu_before.sqlite",
        "emit_nvtx": st.write_nsys_sqlite([learner], tmp / "megatron_policy_worker_3:5_4242.sqlite"),
        "no_shapes": st.write_nsys_sqlite([learner], tmp / "plain.sqlite", emit_nvtx=False),
        "two_processes": st.write_nsys_sqlite([learner, sampler], tmp / "colocated.sqlite"),
        "quirk": quirk,
    }


@pytest.mark.parametrize("case", ["real", "emit_nvtx", "no_shapes", "two_processes", "quirk"])
def test_streamed_nsys_export_equals_in_memory(case, tmp_path, monkeypatch):
    """An nsys export read a block of rowids at a time (runtime and driver calls in separate passes,
    names and domains interned over whole columns first, emit_nvtx shapes applied by name at the end)."""
    a, b = _both(_nsys_cases(tmp_path)[case], tmp_path, monkeypatch, fmt="nsys")
    assert a.format == b.format == "nsys" and a.num_events > 0
    if case == "emit_nvtx":  # sizes read from emit_nvtx names: micro-batches with tokens, both ways
        assert len(a.microbatches.table) > 0


def test_streamed_nsys_errors_are_the_in_memory_errors(tmp_path):
    from tracing.outputs.errors import TraceFormatError

    path = tmp_path / "bad.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, "end" INTEGER, deviceId INTEGER)')
    con.commit()
    con.close()
    errors = []
    for streaming in (False, True):
        with pytest.raises(TraceFormatError) as exc:
            ingest_file(str(path), "nsys", None, str(tmp_path), 0, streaming=streaming)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and "CUPTI_ACTIVITY_KIND_KERNEL" in errors[0]
    assert not list(tmp_path.glob(".spill-*")) and not list(tmp_path.glob("*.parquet"))


def test_streamed_nsys_export_reports_its_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_bulk, "BLOCK_ROWS", 4096)
    path = DATA / "real" / "nsysai_h100x2_mfu_before.sqlite"
    seen: list[tuple[int, int]] = []
    ingest_file(
        str(path), "nsys", None, str(tmp_path), 0, streaming=True, progress=lambda d, t: seen.append((d, t))
    )
    size = path.stat().st_size
    assert len(seen) > 5 and all(t == size and 0 <= d <= size for d, t in seen)
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] > size // 2  # estimated from the rows read, in order


def _child_only(real, failure):
    """``real`` in this process; ``failure`` raised in a forked child (the background event writer)."""
    parent = os.getpid()

    def call(*args, **kwargs):
        if os.getpid() != parent:
            raise failure
        return real(*args, **kwargs)

    return call


# the event Parquet written by a forked process beside the analysis: a streamed file decoded by two
# processes (``--workers 2``), and a lone file read in memory (``mxperf ingest`` with a spare core)
BESIDE = {
    "streamed": {"streaming": True, "decode_workers": 2},
    "in-memory": {"streaming": False, "background_write": True},
}


@pytest.mark.parametrize(
    "path", [REAL[0], *QUIRKS[:3]], ids=lambda p: p.parent.name if p in QUIRKS else p.name
)
def test_an_in_memory_file_written_beside_its_analysis_gives_the_same_bytes(path, tmp_path):
    a = ingest_file(str(path), "kineto", None, str(tmp_path), 0, streaming=False)
    b = ingest_file(str(path), "kineto", None, str(tmp_path), 1, **BESIDE["in-memory"])
    assert Path(a.staged_events).read_bytes() == Path(b.staged_events).read_bytes()
    for attr in ("devices", "ranges", "kernels", "steps"):
        pd.testing.assert_frame_equal(getattr(a, attr), getattr(b, attr), check_exact=True, obj=attr)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(("files", "spare", "forks"), [(1, True, 1), (2, True, 0), (1, False, 0)])
def test_mxperf_ingest_writes_beside_only_for_a_lone_file_with_a_spare_core(
    files, spare, forks, tmp_path, monkeypatch
):
    import tracing.jobs
    from tracing.outputs import background

    started = []

    class Counted(background.BackgroundWrite):
        def __init__(self, *args, **kwargs):
            started.append(args[1])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(background, "BackgroundWrite", Counted)
    monkeypatch.setattr(tracing.jobs, "spare_core", lambda: spare)
    items = [(p, "kineto") for p in REAL[:files]]
    got = tracing.jobs.ingest_many(items, str(tmp_path), workers=1)
    assert len(started) == forks
    assert all(Path(r.staged_events).is_file() for r in got)


@pytest.mark.parametrize("mode", BESIDE)
def test_a_background_writer_that_fails_leaves_the_table_to_this_process(mode, tmp_path, monkeypatch):
    """The event Parquet written beside the analysis: a child that fails for any reason but a write error,
    and this process writes the table itself -- the same file."""
    path = REAL[0]
    a = ingest_file(str(path), "kineto", None, str(tmp_path), 0, streaming=BESIDE[mode]["streaming"])
    monkeypatch.setattr(store, "write_table_parts", _child_only(store.write_table_parts, RuntimeError("bug")))
    b = ingest_file(str(path), "kineto", None, str(tmp_path), 1, **BESIDE[mode])
    pd.testing.assert_frame_equal(store.read_table(a.staged_events), store.read_table(b.staged_events))
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("mode", BESIDE)
def test_no_process_to_spare_and_this_process_writes_the_table(mode, tmp_path, monkeypatch):
    """fork fails (EAGAIN: out of processes or memory): the event Parquet is written here, the same table."""
    import errno

    from tracing.outputs import background

    def no_fork(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    path = REAL[0]
    a = ingest_file(str(path), "kineto", None, str(tmp_path), 0, streaming=BESIDE[mode]["streaming"])
    monkeypatch.setattr(background, "start_with_pipe", no_fork)
    b = ingest_file(str(path), "kineto", None, str(tmp_path), 1, **BESIDE[mode])
    pd.testing.assert_frame_equal(store.read_table(a.staged_events), store.read_table(b.staged_events))


@pytest.mark.parametrize("mode", BESIDE)
def test_a_background_write_error_is_the_one_line_error_of_a_serial_write(mode, tmp_path, monkeypatch):
    from tracing.outputs.errors import OutputWriteError

    full = OutputWriteError("OUT/events/rank-0.parquet: cannot write (No space left on device)")
    monkeypatch.setattr(store, "write_table_parts", _child_only(store.write_table_parts, full))
    with pytest.raises(OutputWriteError, match=r"^OUT/events/rank-0.parquet: cannot write \(No space left"):
        ingest_file(str(REAL[0]), "kineto", None, str(tmp_path), 1, **BESIDE[mode])
    assert not list(tmp_path.glob(".spill-*"))


def test_an_interrupted_wait_stops_the_background_writer_at_once(tmp_path, monkeypatch):
    """Ctrl-C while the analysis waits for the event Parquet: the writer is killed (not waited for) and its
    temp file removed."""
    import threading
    import time

    from tracing.outputs import background

    def slow(frames):
        yield from frames
        time.sleep(60)  # the writer would hold its temp file this long

    target = tmp_path / "events.parquet"
    frame = store.read_table(ingest_file(str(REAL[0]), "kineto", None, str(tmp_path), 0).staged_events)
    writer = background.BackgroundWrite(lambda: slow([frame]), target)
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob(".events.parquet.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    import signal

    assert writer._proc.is_alive(), "the writer is not running (so nothing can be interrupted)"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, []), "SIGINT blocked in this thread"
    # Ctrl-C as the CLI gets it: Python's own handler (a library loaded by an earlier test of the suite may
    # have put its own there), sent to this (the main) thread, not to another thread of the process
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident
    assert main is not None
    threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            writer.wait()
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    assert time.monotonic() - t0 < 20, "waited for the writer instead of stopping it"
    assert not writer._proc.is_alive()
    assert not list(tmp_path.glob(".events.parquet.*.tmp")) and not target.exists()


@pytest.mark.parametrize("mode", BESIDE)
def test_a_failing_analysis_stops_the_background_writer_and_leaves_no_temp_file(mode, tmp_path, monkeypatch):
    import tracing.jobs

    def slow_parts(real):
        def parts(frames, path, meta=None):
            def first_then_wait():
                import time

                yield next(iter(frames))
                time.sleep(30)  # its temp file is open and half written when the analysis fails
                yield from frames

            return real(first_then_wait(), path, meta)

        return parts

    monkeypatch.setattr(store, "write_table_parts", slow_parts(store.write_table_parts))

    def fails(*args, **kwargs):
        import time

        deadline = time.monotonic() + 20
        while not list(tmp_path.glob(".*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the writer is mid-file
        assert list(tmp_path.glob(".*.tmp")), "the background writer never started its file"
        raise ValueError("x")

    monkeypatch.setattr(tracing.jobs, "assemble", fails)
    with pytest.raises(ValueError, match="x"):
        ingest_file(str(REAL[0]), "kineto", None, str(tmp_path), 1, **BESIDE[mode])
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*.parquet"))
    assert not list(tmp_path.glob(".spill-*"))
