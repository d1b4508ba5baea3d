"""Streaming ingest of one Kineto trace or nsys export in bounded memory: the in-memory path's tables, any size.

    file --(KinetoDecoder: ~1M rows at a time)--> raw rows, GPU op rows (disk) | launches, host items, ranges
         (NsysDecoder: a block of rowids of each table at a time)              (sorted runs, disk)
    raw rows --(launching pid of GPU rows, base time)--> events Parquet, one row group per chunk
    ranges --(merged in table order, nesting carried, tracing.analysis.range_file)--> range columns (disk)
    GPU op rows x launches --(merge join in (pid, correlation) order, tracing.ingest.opjoin)--> joined ops
    (sorted runs, disk) --(a window of ops at a time in (start, row) order, tracing.analysis.opwindows)-->
    devices, streams, kernels, range attribution ; launches (disk) + host items in (pid, start) order -->
    column files (disk) --(each region a block at a time, tracing.analysis.mbwindows)--> micro-batches

Held in memory: one chunk of rows, one run buffer per spill, the distinct names (a string each, and each range
name's values; emit_nvtx's are one per range), a slab of range columns at a time and the attribution counters
of the ranges an op still to come may have been launched in (``range_ops``), and for micro-batch detection one
block of a region and a few values per forward pass and backward burst (the host items and launches stay on
disk, also for a whole process with no ranges). The range table itself is never whole here when it goes to the
staging folder (``ranges_path``): it is made and written a part at a time, and what reads ranges afterwards
(micro-batch detection, the step table, seconds per phase) reads the few rows ``range_summary`` keeps.

Nothing is held per GPU op or per idle gap: the device timelines' busy blocks and host stalls go to files in
``spill_dir`` (``tracing.analysis.intervals``), which outlive the call (``--colocated`` unions them across
files; pool workers return them by name) and go with that folder. The other spill files live in a temporary
folder inside ``spill_dir`` and are removed at the end. With ``workers`` > 1 a Kineto file's batches are decoded
by that many other processes (``tracing.ingest.kineto_sharded``).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tracing import staged
from tracing.analysis import attribution, metrics, range_file
from tracing.analysis.mbsignals import is_op_range, is_optimizer
from tracing.analysis.mbwindows import HOST_COLUMNS, HostStats, find_microbatches_streamed
from tracing.analysis.opwindows import Launches, OpTables, OpWindows, cut_between_starts
from tracing.analysis.phases import PhaseMap
from tracing.analysis.range_file import RangeFile
from tracing.analysis.range_ops import SLAB_ROWS, Counters
from tracing.ingest.kineto import trace_info
from tracing.ingest.kineto_decode import KinetoDecoder
from tracing.ingest.kineto_rows import KIND_CODE
from tracing.ingest.kineto_sharded import Fallback, ShardedKinetoDecoder
from tracing.ingest.nsys import nvtx_shape_codes
from tracing.ingest.nsys_stream import NsysDecoder
from tracing.ingest.opjoin import joined_ops
from tracing.ingest.spill import RowFile, SortedRuns
from tracing.ingest.trace import Trace, events_frame
from tracing.outputs import background, schema, store
from tracing.outputs.labels import Labels

if TYPE_CHECKING:
    import pyarrow as pa

CHUNK_ROWS = 1 << 17  # decoded rows per chunk (and per event-table row group)
RUN_ROWS = 1 << 18  # rows per sorted run of launches / host items
OP_RUN_ROWS = 1 << 16  # rows per sorted run of joined GPU ops (13 columns) and of their launch signals
_INT_COLUMNS = tuple(c for c in schema.EVENT_COLUMNS if schema.EVENT_COLUMNS[c] == "int64")
RAW_COLUMNS = ("rid", "kind", "name", "shapes", "domain", *_INT_COLUMNS)
LAUNCH_COLUMNS = ("key", "rid", "tid", "start", "dur", "corr", "pid")
OP_COLUMNS = ("rid", "kind", "name", "pid", "device", "stream", "start_ns", "dur_ns", "correlation")
_OP_CODES = [KIND_CODE[k] for k in schema.GPU_OP_KINDS]
_LAUNCH_CODES = [KIND_CODE[k] for k in schema.LAUNCH_KINDS]
_RANGE, _CPU_OP = KIND_CODE[schema.RANGE], KIND_CODE[schema.CPU_OP]


@dataclass
class StreamedTrace:
    """A streamed file: what the in-memory :class:`Trace` would say about it, without its events."""

    trace: Trace  # path, format, rank, meta; events: none (its range rows went into the range table)
    num_events: int
    num_gpu_ops: int
    analysis: Any  # tracing.jobs.Analysis
    staged_ranges: StagedRanges | None = None  # the range table on disk (its rows not in ``analysis``)


class _Pass1:
    """What one pass over the decoded rows keeps: raw rows and sorted runs on disk, GPU ops and ranges here."""

    def __init__(self, spill: Path, timelines: Path) -> None:
        self.dir = spill
        self.timeline_dir = timelines  # the device timelines' intervals: they outlive the pass (OpWindows)
        self.raw = RowFile(spill / "raw.bin", RAW_COLUMNS)
        self.ops = RowFile(spill / "ops.bin", OP_COLUMNS)  # GPU op rows, joined after the pass (opjoin)
        self.launches = SortedRuns(spill, LAUNCH_COLUMNS, ("key", "rid"), RUN_ROWS)
        self.host = SortedRuns(spill, HOST_COLUMNS, ("pid", "start", "rid"), RUN_ROWS)
        # range rows in runs a quarter as long: their merge is read a slab at a time anyway, and the buffer was
        # the decode's peak on NVTX-heavy exports (nsys x64: 135 -> 127 MB above the imports)
        self.ranges = SortedRuns(spill, range_file.SPILL_COLUMNS, range_file.SPILL_KEYS, RUN_ROWS // 4)
        self.launch_pids: Counter = Counter()
        self.host_pids: set[int] = set()
        self.stats: dict[int, HostStats] = {}
        self.optimizer: list[tuple[int, int, int]] = []  # (pid, start, end), relative times
        self.rows = 0
        self.gpu_rows = 0
        self._op_range = np.zeros(0, bool)
        self._opt = np.zeros(0, bool)

    def flags(self, names: list[str]) -> None:
        """Per-name flags for names interned since the last chunk."""
        k = len(self._op_range)
        if len(names) > k:
            self._op_range = np.append(self._op_range, [is_op_range(n) for n in names[k:]])
            self._opt = np.append(self._opt, [is_optimizer(n) for n in names[k:]])

    def add(self, c: dict[str, np.ndarray]) -> None:
        n = len(c["kind"])
        if "domain" not in c:  # Kineto rows: one (empty) domain
            c["domain"] = np.zeros(n, np.int32)
        c["rid"] = np.arange(self.rows, self.rows + n, dtype=np.int64)
        self.rows += n
        self.raw.add(c)
        kind, pid, corr = c["kind"], c["pid"], c["correlation"]
        self.gpu_rows += int(np.count_nonzero(c["device"] >= 0))
        is_op = np.isin(kind, _OP_CODES)
        self.ops.add({k: c[k][is_op] for k in OP_COLUMNS})
        is_call = np.isin(kind, _LAUNCH_CODES)
        launch = is_call & (corr >= 0)
        if launch.any():
            lp = pid[launch]
            self.launch_pids.update(
                dict(zip(*(a.tolist() for a in np.unique(lp, return_counts=True)), strict=True))
            )
            key = metrics.launch_key(lp, corr[launch]).view(np.int64)
            self.launches.add(
                {
                    "key": key,
                    "rid": c["rid"][launch],
                    "tid": c["tid"][launch],
                    "start": c["start_ns"][launch],
                    "dur": c["dur_ns"][launch],
                    "corr": corr[launch],
                    "pid": lp,
                }
            )
        is_range = kind == _RANGE
        code = c["name"].astype(np.int64)
        safe = np.maximum(code, 0)
        if is_range.any():
            self.ranges.add(range_file.spill_rows(c, is_range))
            opt = is_range & (code >= 0) & self._opt[safe]
            ends = (c["start_ns"] + c["dur_ns"])[opt].tolist()
            self.optimizer += zip(pid[opt].tolist(), c["start_ns"][opt].tolist(), ends, strict=True)
        host = (kind == _CPU_OP) | is_call | (is_range & (code >= 0) & self._op_range[safe])
        self.host_pids.update(np.unique(pid[host]).tolist())
        hm = host & (code >= 0)
        end = c["start_ns"] + c["dur_ns"]
        self.host.add(
            {
                "pid": pid[hm],
                "start": c["start_ns"][hm],
                "rid": c["rid"][hm],
                "tid": c["tid"][hm],
                "end": end[hm],
                "code": code[hm],
                "shape": c["shapes"][hm].astype(np.int64),
                "is_call": is_call[hm].astype(np.int64),
            }
        )
        hp = pid[hm]
        for p in np.unique(hp).tolist():
            m = hp == p
            self.stats.setdefault(int(p), HostStats()).add(c["tid"][hm][m], c["start_ns"][hm][m], end[hm][m])

    def close(self) -> None:
        for f in (self.raw, self.ops):
            f.close()
            f.path.unlink(missing_ok=True)
        self.launches.close()
        self.host.close()
        self.ranges.close()


def stream_trace(
    path: str,
    fmt: str,
    *,
    rank: int | None,
    include_python: bool,
    phase_map: PhaseMap,
    labels: Labels | None,
    pattern: str | None,
    events_path: str | None,
    spill_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
    ranges_path: str | None = None,
) -> StreamedTrace:
    """Ingest one Kineto file or nsys export (``fmt``: ``kineto`` or ``nsys``) in bounded memory:
    writes its event table to ``events_path`` (when given) and returns every per-trace table, equal to
    ``tracing.jobs.analyze_trace(load_trace(path))``'s.

    A Kineto file is decoded in chunks (``workers`` > 1: by that many other processes, batch by batch,
    ``tracing.ingest.kineto_sharded``; if they fail, this process reads the file itself); an nsys export is read a
    block of rowids at a time (``tracing.ingest.nsys_stream``). With ``workers`` > 1 the event table is
    written by a forked process while this one analyses (``tracing.outputs.background``). With ``ranges_path``
    a range table of ``tracing.staged.STAGE_ROWS`` ranges or more is written there a part at a time
    (``StreamedTrace.staged_ranges``), and the analysis holds only the rows the other tables read
    (``tracing.analysis.range_summary``)."""
    args = (rank, include_python, phase_map, labels, pattern, events_path, ranges_path, workers > 1)
    return_large_frees()
    if fmt == "nsys":
        return _spilled(path, spill_dir, NsysDecoder(path, progress=progress), *args)
    if workers > 1:
        try:
            sharded = ShardedKinetoDecoder(path, include_python, workers, progress=progress)
            return _spilled(path, spill_dir, sharded, *args)
        except Fallback:
            pass
    return _spilled(path, spill_dir, KinetoDecoder(path, include_python, progress=progress), *args)


MMAP_THRESHOLD_BYTES = 128 << 10


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold at 128 KiB, so every freed array (a chunk's columns, the per-op
    temporaries of the analysis) goes back to the OS at once. By default glibc raises the threshold to the
    largest block freed (up to 32 MiB) and then serves such blocks from its heap, which it keeps: a streamed
    4 GB GPU-heavy trace peaked ~15 % higher, and the RSS after each analysis step stayed at its high-water
    mark. Process-wide and idempotent; False (nothing done) where the C library is not glibc or
    ``MALLOC_MMAP_THRESHOLD_`` is set."""
    import ctypes
    import ctypes.util

    global _FREES_RETURNED
    if _FREES_RETURNED is None and os.environ.get("MALLOC_MMAP_THRESHOLD_"):  # the user's choice stands
        _FREES_RETURNED = False
    if _FREES_RETURNED is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _FREES_RETURNED = bool(libc.mallopt(-3, MMAP_THRESHOLD_BYTES))  # M_MMAP_THRESHOLD
        except (OSError, AttributeError):
            _FREES_RETURNED = False
    return _FREES_RETURNED


_FREES_RETURNED: bool | None = None


def _spilled(path: str, spill_dir: str | None, dec: Any, *args: Any) -> StreamedTrace:
    """The device timelines' intervals stay in ``spill_dir`` after this returns (the caller removes that
    folder); without one they are read back into memory before the temporary folder goes."""
    with tempfile.TemporaryDirectory(prefix=".spill-", dir=spill_dir) as tmp:
        p1 = _Pass1(Path(tmp), Path(spill_dir) if spill_dir is not None else Path(tmp))
        try:
            st = _stream(path, p1, dec, *args)
            if spill_dir is None:
                st.analysis.timelines = [t.loaded() for t in st.analysis.timelines]
            return st
        finally:
            p1.close()


def read_pass1(dec: Any, p1: _Pass1) -> list[str]:
    """Every decoded row into pass 1, ``CHUNK_ROWS`` at a time; the interned names."""
    for _ in dec.run():
        if len(dec.columns) >= CHUNK_ROWS:
            p1.flags(list(dec.columns.names))
            p1.add(dec.columns.take())
    p1.flags(list(dec.columns.names))
    p1.add(dec.columns.take())
    names = list(dec.columns.names)
    dec.columns.forget_names()
    return names


def _stream(
    path: str,
    p1: _Pass1,
    dec: Any,
    rank: int | None,
    include_python: bool,
    phase_map: PhaseMap,
    labels: Labels | None,
    pattern: str | None,
    events_path: str | None,
    ranges_path: str | None,
    background_write: bool = False,
) -> StreamedTrace:
    from tracing.jobs import assemble  # jobs dispatches here; the table building is shared

    names = read_pass1(dec, p1)
    if isinstance(dec, NsysDecoder):  # session-clock ns, GPU rows carry their own pid, shapes by name
        fmt, base_ns, domains = "nsys", 0, dec.domains
        resolved, info = dec.finish(rank)
        shape_cats, lut = dec.shape_names, dec.shape_lut
        fix = _nsys_shapes(lut)
        host_chunks: Iterator[dict[str, np.ndarray]] = _nsys_host_shapes(p1.host.merged(), lut)
    else:
        fmt, domains, shape_cats = "kineto", [""], list(dec.columns.shapes)
        base_ns, resolved, info = trace_info(Path(path), dec.reader.meta, rank, dec.skipped)
        fix = _gpu_pid_fixer(p1)
        host_chunks = _shifted(p1.host.merged(), base_ns)
    writer = None
    if events_path is not None:
        meta = {"trace": str(Path(path)), "format": fmt, "rank": resolved}
        p1.raw.close()  # every row on disk before a forked writer reads them

        def parts() -> Iterator[pd.DataFrame]:
            return _event_parts(p1.raw, base_ns, fix, names, shape_cats, domains)

        if background_write:  # another core writes while this one analyses
            writer = background.BackgroundWrite.start(parts, events_path, meta)
        if writer is None:
            store.write_table_parts(parts(), events_path, meta)
    try:
        # the trace's events stay here and on disk: its range rows go to the range file
        no_events = _frame(  # no rows, no names (pandas would hash every one: ~250 bytes a name)
            {"kind": np.zeros(0, np.int8), "name": np.zeros(0, np.int32)}, [], shape_cats, domains
        )
        trace = Trace(str(Path(path)), fmt, no_events, rank=resolved, meta=info)
        source = "nvtx" if fmt == "nsys" else "user_annotation"
        # range rows are host rows: their pid needs no fixing (_gpu_pid_fixer), nor do the shapes of an
        # export's (_nsys_shapes), which the range table does not have
        ranges = RangeFile.build(
            p1.ranges.merged(), p1.dir / "ranges.bin", base_ns, names, domains, source, phase_map, pattern
        )
        p1.ranges.close()
        optimizer = _optimizer(p1.optimizer, base_ns)
        for st in p1.stats.values():
            if st.first_ns is not None:
                st.first_ns += base_ns
                st.last_ns += base_ns  # type: ignore[operator]
        ops = _op_tables(p1, trace, ranges, base_ns, fix, names, ranges_path)
        mb = find_microbatches_streamed(
            names,
            shape_cats,
            host_chunks,
            p1.host_pids,
            p1.stats,
            optimizer,
            ops.ranges,
            ops.launches,
            ops.tables.num_ops,
            ops.tables.kernels,
            labels,
            pattern,
            resolved,
            fmt,
            ops.tables.timelines,
            p1.dir / "detection",
        )
        ops.launches.close()
        t = ops.tables
        analysis = assemble(trace, t.timelines, t.streams, ops.ranges, t.kernels, mb)
        if ops.staged is not None:  # on disk: what was read above were the rows that matter (range_summary)
            analysis.tables["ranges"] = ops.ranges.iloc[:0].copy()
        if writer is not None:
            writer.wait()
    except BaseException:
        if writer is not None:
            writer.cancel()
        raise
    return StreamedTrace(trace, p1.rows, ops.tables.num_ops, analysis, ops.staged)


@dataclass
class StagedRanges:
    """A streamed file's range table, written to ``path`` a part at a time (``tracing.staged.part_file``)."""

    path: str
    num_ranges: int
    phase_seconds: dict[str, float]


@dataclass
class _OpResult:
    tables: OpTables
    ranges: pd.DataFrame  # the range table; if staged, only the rows the other tables read
    launches: Launches  # on disk, in (pid, launch start) order; closed by the caller
    staged: StagedRanges | None


def _op_tables(
    p1: _Pass1,
    trace: Trace,
    ranges: RangeFile,
    base_ns: int,
    fix: Callable[[dict[str, np.ndarray]], None],
    names: list[str],
    ranges_path: str | None,
) -> _OpResult:
    """The GPU-op tables, the range table and the launches, from the ops joined on disk and read back in
    (start, row) order a chunk at a time (``tracing.ingest.opjoin``, ``tracing.analysis.opwindows``). The
    launches stay on disk (the spill folder) for micro-batch detection. With ``ranges_path`` (where a large
    range table goes; None: held, whatever its size), see :func:`_staged_ranges`."""
    slabs = None if trace.range_log is not None else ranges.slabs(SLAB_ROWS)
    acc = OpWindows(names, slabs, p1.dir, OP_RUN_ROWS, timeline_dir=p1.timeline_dir)
    try:
        joined = joined_ops(p1.ops, p1.launches, base_ns, fix, p1.dir, OP_RUN_ROWS, CHUNK_ROWS)
        p1.ops.path.unlink(missing_ok=True)  # the joined runs hold them now: less spill on disk at once
        acc.set_lag(joined.max_lag)  # ranges retire once no op still to come can have been launched in them
        try:
            for chunk in cut_between_starts(joined.merged(CHUNK_ROWS)):
                acc.add(chunk)
        finally:
            joined.close()
        tables = acc.finish()
        counters, tables.partials = tables.partials, None
        try:
            attributed = bool(tables.num_ops) and trace.range_log is None
            partials = counters if attributed else None
            if ranges_path is not None and len(ranges) >= staged.STAGE_ROWS:
                table, written = _staged_ranges(ranges, partials, tables.timelines, trace, ranges_path)
            else:
                table = next(attribution.table_parts(ranges, max(len(ranges), 1), partials, tables.timelines))
                written = None
        finally:
            if counters is not None:
                counters.close()
        return _OpResult(tables, table, acc.launches(tables.kernels), written)
    except BaseException:
        acc.close()
        raise


def _staged_ranges(
    ranges: RangeFile,
    partials: Counters | None,
    timelines: list[metrics.DeviceTimeline],
    trace: Trace,
    path: str,
) -> tuple[pd.DataFrame, StagedRanges]:
    """The range table written to ``path`` a part of ``staged.STAGE_ROWS`` ranges at a time, with the trace
    columns the output table has; returned: the rows the other tables read (``range_summary``), and the
    staged table's summary."""
    from tracing.jobs import with_trace_cols

    kept = []
    with staged.part_file(path) as add:
        for part, keep in ranges.table(staged.STAGE_ROWS, partials, timelines):
            kept.append(part[keep])
            add(with_trace_cols(part, trace))
    rows = pd.concat(kept, ignore_index=True)
    return rows, StagedRanges(path, len(ranges), staged.phase_seconds(rows))


def _frame(cols: dict[str, Any], names: list[str], shape_cats: list[str], domains: list[str]) -> pd.DataFrame:
    """Event-table rows (``schema.EVENT_COLUMNS``) from column arrays (:func:`_event_columns`)."""
    return events_frame(_event_columns(cols), names, list(schema.EVENT_KINDS), domains, shape_cats)


def _event_columns(cols: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every event-table column, in ``schema.EVENT_COLUMNS`` order: absent int columns are -1, absent shape and
    domain codes 0, shape codes at least 0."""
    n = len(cols["kind"])
    zeros = np.zeros(n, np.int32)
    full = {c: cols[c] if c in cols else np.full(n, schema.NO_ID, np.int64) for c in schema.EVENT_COLUMNS}
    full["shapes"] = np.maximum(cols["shapes"], 0) if "shapes" in cols else zeros
    full["domain"] = cols.get("domain", zeros)
    return full


def _event_parts(
    raw: RowFile,
    base_ns: int,
    fix: Callable[[dict[str, np.ndarray]], None],
    names: list[str],
    shapes: list[str],
    domains: list[str],
) -> Iterator[pa.Table]:
    """The event table a ``CHUNK_ROWS`` part at a time, as the Arrow tables :func:`_frame`'s parts convert to
    (``store.coded_table``), each carrying a share of the categories (``store.CarriedCategories``)."""
    cats = {"name": names, "kind": schema.EVENT_KINDS, "domain": domains, "shapes": shapes or [""]}
    shares = store.CarriedCategories({c: len(v) for c, v in cats.items()})
    done = 0
    for block in raw.blocks(CHUNK_ROWS):  # one block at a time (a look-ahead for the last would hold two)
        block["start_ns"] = block["start_ns"] + np.int64(base_ns)
        fix(block)
        done += len(block["kind"])
        cols = _event_columns(block)
        yield store.coded_table(cols, cats, shares.carry({c: cols[c] for c in cats}, last=done == raw.rows))
    # the last part carried the categories after every part's codes: every row was read back
    assert done == raw.rows, f"{raw.path}: {done} of {raw.rows} rows read back"


def _nsys_shapes(lut: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    """An nsys export's rows get their emit_nvtx shape codes (by range name) once every name is known."""

    def fix(block: dict[str, np.ndarray]) -> None:
        if "shapes" in block:
            block["shapes"] = nvtx_shape_codes(block["kind"], block["name"].astype(np.int64), lut)

    return fix


def _nsys_host_shapes(
    chunks: Iterator[dict[str, np.ndarray]], lut: np.ndarray
) -> Iterator[dict[str, np.ndarray]]:
    """Host items of an export (runtime / driver calls and NVTX op ranges) with their ranges' shape codes."""
    for c in chunks:
        c["shape"] = np.where(c["is_call"] == 1, 0, lut[c["code"]] if len(lut) else 0).astype(np.int64)
        yield c


def _shifted(chunks: Iterator[dict[str, np.ndarray]], base_ns: int) -> Iterator[dict[str, np.ndarray]]:
    for c in chunks:
        c["start"] = c["start"] + np.int64(base_ns)
        c["end"] = c["end"] + np.int64(base_ns)
        yield c


def _optimizer(rows: list[tuple[int, int, int]], base_ns: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per process, its optimizer ranges' starts (sorted) and ends (in start order, stable), as
    ``mbsignals.gather_signals`` keeps them."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    arr = np.array(rows, np.int64).reshape(-1, 3)
    for p in np.unique(arr[:, 0]).tolist():
        mine = arr[arr[:, 0] == p]
        order = np.argsort(mine[:, 1], kind="stable")
        out[int(p)] = (np.sort(mine[:, 1]) + base_ns, mine[:, 2][order] + base_ns)
    return out


def _gpu_pid_fixer(p1: _Pass1) -> Callable[[dict[str, np.ndarray]], None]:
    """The pid of each GPU row (device >= 0): its launch call's, as ``kineto._assign_gpu_pids`` gives it.

    One launching process (Kineto writes one per file): every GPU row gets it. Several: the (correlation ->
    first launch's pid) map is held (16 bytes a launch), plus a pass over the rows for each device's fill."""
    if p1.gpu_rows == 0 or not p1.launch_pids:
        return lambda block: None
    if len(p1.launch_pids) == 1:
        only = next(iter(p1.launch_pids))

        def one(block: dict[str, np.ndarray]) -> None:
            block["pid"][block["device"] >= 0] = only

        return one
    parts = list(p1.launches.merged(CHUNK_ROWS))
    corr = np.concatenate([c["corr"] for c in parts])
    rid = np.concatenate([c["rid"] for c in parts])
    pid = np.concatenate([c["pid"] for c in parts])
    order = np.lexsort((rid, corr))
    l_corr, l_pid = corr[order], pid[order]
    top = max(p1.launch_pids.values())
    overall = min(p for p, k in p1.launch_pids.items() if k == top)

    def lookup(block: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = np.flatnonzero(block["device"] >= 0)
        c = block["correlation"][g]
        pos = np.minimum(np.searchsorted(l_corr, c), len(l_corr) - 1)
        return g, l_corr[pos] == c, l_pid[pos]

    per_device: dict[int, Counter] = {}
    for block in p1.raw.blocks(CHUNK_ROWS):
        g, found, lp = lookup(block)
        for d, q in zip(block["device"][g][found].tolist(), lp[found].tolist(), strict=True):
            per_device.setdefault(d, Counter())[q] += 1
    fill = {d: min(q for q, k in cnt.items() if k == max(cnt.values())) for d, cnt in per_device.items()}

    def many(block: dict[str, np.ndarray]) -> None:
        g, found, lp = lookup(block)
        devices = block["device"][g]
        block["pid"][g] = np.where(
            found, lp, np.array([fill.get(d, overall) for d in devices.tolist()], np.int64)
        )

    return many
