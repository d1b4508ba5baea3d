"""Decode a Kineto file or an nsys export once, a batch at a time, into Parquet: the one input of the engine.

Memory holds one batch of rows and the interned names: raw Parquet (codes, times as read), then events Parquet
(docs/tracing.md). The second pass applies what only the whole file knows: a Kineto file's
``baseTimeNanoseconds`` (often written after ``traceEvents``), each Kineto GPU row's launching pid (its own pid
is the device: :func:`gpu_pid_sql`) and an export's emit_nvtx shapes (known per range name once all are read).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.ingest.kineto_rows import KIND_CODE, as_int
from tracing.ingest.trace import MAX_RANK, Trace, rank_from_name, report_name
from tracing.outputs import schema, store
from tracing.outputs.errors import TraceFormatError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

BATCH_ROWS = 1 << 17  # rows per raw row group and per events row group
# the raw file holds integers and codes, read once: lz4 without dictionary pages (2.4x faster to write, smaller)
RAW_PARQUET = {"compression": "lz4", "use_dictionary": False}
INT_COLUMNS = tuple(c for c, t in schema.EVENT_COLUMNS.items() if t == "int64")
_LAUNCH_CODES = ", ".join(str(KIND_CODE[k]) for k in schema.LAUNCH_KINDS)
_RANGE_CODE = KIND_CODE[schema.RANGE]


@dataclass
class Decoded:
    """A file decoded to its raw Parquet: codes, the strings they stand for, and what the file says of itself."""

    path: str
    format: str
    rank: int | None
    meta: dict[str, Any]
    raw: Path
    rows: int
    names: list[str]
    shapes: list[str]
    domains: list[str]
    base_ns: int = 0
    shape_lut: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # nsys: name code -> shape


def decode(
    path: str | os.PathLike[str],
    fmt: str,
    work: Path,
    *,
    rank: int | None = None,
    include_python: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Decoded:
    """Decode ``path`` (``fmt``: kineto | nsys) into ``work/raw.parquet``, a batch of rows at a time."""
    import pyarrow.parquet as pq

    path = Path(path)
    raw = work / "raw.parquet"
    if fmt == "nsys":
        from tracing.ingest.nsys_stream import NsysDecoder

        dec: Any = NsysDecoder(path, progress=progress)
    else:
        from tracing.ingest.kineto_rows import KinetoDecoder

        dec = KinetoDecoder(path, include_python, progress=progress)
    rows = 0
    empty = _raw_table({"kind": np.zeros(0, np.int8), "name": np.zeros(0, np.int32)}, 0)
    with pq.ParquetWriter(raw, empty.schema, **RAW_PARQUET) as writer:
        for part in _parts(dec):
            table = _raw_table(part, rows)
            writer.write_table(table)
            rows += table.num_rows
    d = Decoded(str(path), fmt, rank, {}, raw, rows, list(dec.columns.names), [], [""])
    if fmt == "nsys":
        d.rank, d.meta = dec.finish(rank)
        d.shapes, d.domains = list(dec.shape_names), dec.domains
        d.shape_lut = np.asarray(dec.shape_lut, np.int32)
    else:
        d.base_ns, d.rank, d.meta = kineto_info(path, dec.reader.meta, rank, dec.skipped)
        d.meta["negative_durations"] = dec.columns.negative_durations
        d.shapes = list(dec.columns.shapes)
    return d


def kineto_info(
    path: Path, meta: dict[str, Any], rank: int | None, skipped: int
) -> tuple[int, int | None, dict[str, Any]]:
    """What a Kineto file says about itself: (base time ns, rank, the Trace's meta)."""
    base = meta.get("baseTimeNanoseconds")
    base_ns = 0
    if base is not None:
        try:
            base_ns = as_int(base)
        except (TypeError, ValueError):
            raise TraceFormatError(path, f"baseTimeNanoseconds is not an integer: {base!r}") from None
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else None
    file_rank = None if dist is None else dist.get("rank")
    if isinstance(file_rank, int) and not -MAX_RANK <= file_rank <= MAX_RANK:
        raise TraceFormatError(path, f"distributedInfo.rank is not a rank: {file_rank}")
    resolved = file_rank if isinstance(file_rank, int) else rank_from_name(path)
    if resolved is None:
        resolved = rank
    props = meta.get("deviceProperties")
    gpu_names = (
        {int(p["id"]): p.get("name") for p in props if isinstance(p, dict) and isinstance(p.get("id"), int)}
        if isinstance(props, list)
        else {}
    )
    info = {
        "base_time_ns": base_ns,
        "clock": "epoch_ns" if base_ns else "kineto_us_as_ns",
        "distributed_info": dist,
        "gpu_names": gpu_names,
        "skipped_events": skipped,
        "display_time_unit": meta.get("displayTimeUnit"),
    }
    named = report_name(path)  # e.g. the RL step a verl file holds
    if named:
        info["report_name"] = named
    return base_ns, resolved, info


def _parts(dec: Any) -> Iterator[dict[str, np.ndarray]]:
    for _ in dec.run():
        if len(dec.columns) >= BATCH_ROWS:
            yield dec.columns.take()
    last = dec.columns.take()
    if len(last["kind"]):
        yield last


def _raw_table(c: dict[str, np.ndarray], first: int) -> pa.Table:
    """A batch of decoded rows as Arrow: ``rid`` (the row's position in the file), codes, int64 columns."""
    import pyarrow as pa

    n = len(c["kind"])
    cols: dict[str, Any] = {"rid": np.arange(first, first + n, dtype=np.int64)}
    cols["kind"] = np.asarray(c["kind"], np.int8)
    cols["name"] = np.asarray(c["name"], np.int32)
    cols["domain"] = np.asarray(c["domain"], np.int32) if "domain" in c else np.zeros(n, np.int32)
    cols["shapes"] = (
        np.maximum(np.asarray(c["shapes"], np.int32), 0) if "shapes" in c else np.zeros(n, np.int32)
    )
    for k in INT_COLUMNS:
        cols[k] = np.asarray(c[k], np.int64) if k in c else np.full(n, schema.NO_ID, np.int64)
    return pa.table(cols)


def gpu_pid_sql(con: duckdb.DuckDBPyConnection, unknown_only: bool = False) -> str | None:
    """The pid expression of the events view over ``raw`` (None: the rows' own pids stand).

    Each GPU row (device >= 0; ``unknown_only``: each with no pid, an nsys kernel without ``globalPid``) takes the pid of the first launch call (in file order) with its correlation; one
    without a launch record takes the pid that launched most of the other ops on its device, else the file's
    most common launching pid (the smallest pid among equals). A file with no launch record at all gives its GPU
    rows the one process its other rows have, if there is one (else they stay with none)."""
    launch = f"kind in ({_LAUNCH_CODES}) and correlation >= 0"
    counts = con.sql(f"select pid, count(*) as c from raw where {launch} group by pid").fetchall()
    gpu = con.sql("select count(*) from raw where device >= 0").fetchall()[0][0]
    if not gpu:
        return None
    if not counts:
        hosts = con.sql(f"select distinct pid from raw where device < 0 and pid <> {schema.NO_ID}").fetchall()
        counts = hosts if len(hosts) == 1 else []
    if not counts:
        return None
    gpu_row = f"r.device >= 0 and r.pid = {schema.NO_ID}" if unknown_only else "r.device >= 0"
    if len(counts) == 1:
        return f"case when {gpu_row} then {int(counts[0][0])} else r.pid end"
    overall = min(counts, key=lambda pc: (-pc[1], pc[0]))[0]
    con.execute(
        f"""create or replace temp table launch_pid as
        select correlation, arg_min(pid, rid) as lpid from raw where {launch} group by correlation;
        create or replace temp table device_pid as
        select device, arg_min(lpid, (-c, lpid)) as fill from (
          select r.device, l.lpid, count(*) as c from raw r join launch_pid l on r.correlation = l.correlation
          where r.device >= 0 group by r.device, l.lpid) group by device"""
    )
    return f"case when {gpu_row} then coalesce(l.lpid, d.fill, {int(overall)}) else r.pid end"


def events_sql(con: duckdb.DuckDBPyConnection, d: Decoded) -> str:
    """The query giving the event table's int64 columns and codes in file order (``rid``), fixed."""
    pid = gpu_pid_sql(con) if d.format == "kineto" else None  # a Kineto GPU row's pid is its device
    if d.format == "nsys" and d.meta.get("gpu_ops_without_pid"):
        pid = gpu_pid_sql(con, unknown_only=True)
    cols = []
    for c in ("kind", "name", "domain", "shapes", *INT_COLUMNS):
        if c == "pid" and pid is not None:
            cols.append(f"{pid} as pid")
        elif c == "start_ns" and d.base_ns:
            cols.append(f"r.start_ns + {int(d.base_ns)} as start_ns")
        else:
            cols.append(f"r.{c}")
    joins = ""
    if pid is not None and "coalesce" in pid:
        joins = (
            " left join launch_pid l on r.device >= 0 and r.correlation = l.correlation"
            " left join device_pid d on r.device = d.device"
        )
    return f"select r.rid, {', '.join(cols)} from raw r{joins} order by r.rid"


def write_events(con: duckdb.DuckDBPyConnection, d: Decoded, path: Path) -> int:
    """The event table (``schema.EVENT_COLUMNS``, categoricals as pandas reads them) to ``path``, a batch at a
    time; returns its rows."""
    cats = {
        "kind": list(schema.EVENT_KINDS),
        "name": d.names,
        "domain": d.domains,
        "shapes": d.shapes or [""],
    }
    meta = {"trace": d.path, "format": d.format, "rank": d.rank}

    def parts() -> Iterator[pa.Table]:
        shares = store.CarriedCategories({c: len(v) for c, v in cats.items()})
        done = 0
        reader = con.sql(events_sql(con, d)).to_arrow_reader(BATCH_ROWS)
        batch = next(reader, None)
        while batch is not None:
            nxt = next(reader, None)
            cols = {c: batch.column(c).to_numpy() for c in schema.EVENT_COLUMNS}
            if d.format == "nsys" and len(d.shape_lut):
                is_range = cols["kind"] == _RANGE_CODE
                shapes = np.zeros(len(is_range), np.int32)
                shapes[is_range] = d.shape_lut[cols["name"][is_range]]
                cols["shapes"] = shapes
            done += batch.num_rows
            carry = shares.carry({c: cols[c] for c in cats}, last=nxt is None)
            yield store.coded_table(cols, cats, carry)
            batch = nxt
        if done == 0:
            cols = {c: np.zeros(0, np.int64) for c in schema.EVENT_COLUMNS}
            yield store.coded_table(cols, cats)

    return store.write_table_parts(parts(), path, meta)[1]


@contextmanager
def in_engine(
    path: str | os.PathLike[str],
    fmt: str,
    *,
    rank: int | None = None,
    include_python: bool = False,
    progress: Callable[[int, int], None] | None = None,
    events_path: str | os.PathLike[str] | None = None,
    temp_dir: str | None = None,
) -> Iterator[tuple[duckdb.DuckDBPyConnection, Decoded, Path]]:
    """One Kineto file or nsys export decoded (:func:`decode`), fixed and written to ``events_path`` (default: a
    temporary file) (:func:`write_events`), and an engine session whose ``events`` view reads it: yields (the
    connection, what the file says of itself, the events file). The one way every caller reads a trace."""
    import tempfile

    from tracing.ingest import engine

    with tempfile.TemporaryDirectory(prefix=".engine-", dir=temp_dir) as work, engine.session(work) as con:
        d = decode(path, fmt, Path(work), rank=rank, include_python=include_python, progress=progress)
        engine.fit_threads(con, d.rows)
        con.execute(f"create view raw as select * from read_parquet({engine.literal(d.raw)})")
        events = Path(events_path) if events_path is not None else Path(work) / "events.parquet"
        d.rows = write_events(con, d, events)
        con.execute("drop view raw")
        d.raw.unlink()
        engine.parquet_events(con, events)
        yield con, d, events


def load_events(
    path: str | os.PathLike[str],
    fmt: str,
    *,
    rank: int | None = None,
    include_python: bool = False,
) -> Trace:
    """One Kineto file or nsys export as a :class:`Trace` with its event frame (the notebook API): the rows
    ``mxperf ingest`` writes (:func:`in_engine`), read back."""
    with in_engine(path, fmt, rank=rank, include_python=include_python) as (_, d, events):
        frame = store.read_table(events)
    return Trace(d.path, d.format, frame, rank=d.rank, meta=d.meta)


def load_nsys_events(path: str | os.PathLike[str], *, rank: int | None = None) -> Trace:
    """Read one Nsight Systems SQLite export into a :class:`Trace` (one trace, possibly many processes)."""
    return load_events(path, "nsys", rank=rank)
