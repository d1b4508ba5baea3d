"""Nsight Systems SQLite export (``nsys export --type sqlite``) -> the normalized event table.

The file is opened read-only (``file:...?mode=ro``). Tables used (export schema 3.25 checked):

- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` / ``_SYNCHRONIZATION``: GPU ops with
  ``start``/``end`` ns, ``deviceId``, ``streamId``, ``correlationId``, ``globalPid``; kernel names are
  ``demangledName`` ids into ``StringIds``.
- ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``: a CUDA graph launch traced whole (``nsys --cuda-graph-trace=graph``, the
  default), whose nodes are in no other table: one kernel row ``CUDA graph <graphId>`` from the graph's start to
  its end, joined to its ``cudaGraphLaunch`` by ``correlationId`` (``trace.trace_warnings`` says what that
  hides); a launch CUPTI could not time (start and end 0) is left out and counted.
- ``CUPTI_ACTIVITY_KIND_RUNTIME``: runtime (``eventClass`` 0) **and** driver (1) calls, ``nameId`` into
  ``StringIds``, names with version suffixes (``cudaLaunchKernel_v7000``; kept as exported).
- ``NVTX_EVENTS``: push/pop ranges (``eventType`` 59) and start/end ranges (60, may end on another thread:
  ``endGlobalTid``); name = ``coalesce(text, StringIds[textId])``; domain names from eventType 75 rows.
- ``StringIds`` (required: every export has it; a SQLite file without it is not an nsys export).

``globalTid`` packs pid and tid: ``pid = (g >> 24) & 0xFFFFFF``, ``tid = g & 0xFFFFFF`` (and ``globalPid``
is the same with tid 0). Tables are created lazily by nsys, so any activity table may be missing: no kernel
table means no GPU ops. Times stay in ns since the session start (``TARGET_INFO_SESSION_START_TIME``).
A GPU op joins its launch on (pid, correlationId), since correlation ids are per process.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tracing.ingest.trace import report_rank, zero_negative
from tracing.outputs import schema
from tracing.outputs.errors import TraceFormatError

NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 75
RUNTIME_CLASS, DRIVER_CLASS = 0, 1
BATCH_ROWS = 1 << 16  # event rows a batch (the decode's peak holds one)
REQUIRED_TABLES = ("StringIds",)
GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
_GPU_TABLES = (  # (kind, table, name column, bytes column)
    (schema.KERNEL, "CUPTI_ACTIVITY_KIND_KERNEL", "demangledName", None),
    (schema.KERNEL, GRAPH_TABLE, "graphId", None),
    (schema.MEMCPY, "CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind", "bytes"),
    (schema.MEMSET, "CUPTI_ACTIVITY_KIND_MEMSET", "memKind", "bytes"),
    (schema.SYNC, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "syncType", None),
)
_GPU_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
# copyKind / syncType value -> name (CUPTI_ACTIVITY_MEMCPY_KIND_*, CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_*)
MEMCPY_KIND = dict(
    enumerate(["Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"])
)
SYNC_KIND = dict(enumerate(["Unknown", "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync"]))
_USED_TABLES = frozenset(
    {
        *REQUIRED_TABLES,
        *(t for _, t, _, _ in _GPU_TABLES),
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "NVTX_EVENTS",
        "TARGET_INFO_SESSION_START_TIME",
        "PROCESSES",
        "TARGET_INFO_GPU",
        "TARGET_INFO_SYSTEM_ENV",
    }
)


def decode_global_tid(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """nsys globalTid -> (pid, tid)."""
    g = np.asarray(g, dtype=np.int64)
    return (g >> 24) & 0xFFFFFF, g & 0xFFFFFF


def open_readonly(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise TraceFormatError(path, "no such file")
    if path.suffix in (".nsys-rep", ".qdrep"):
        raise TraceFormatError(
            path, "is an Nsight Systems report; export it first: nsys export --type sqlite " + str(path)
        )
    with open(path, "rb") as fh:
        if fh.read(16) != b"SQLite format 3\x00":
            raise TraceFormatError(
                path, "not an SQLite file (expected an `nsys export --type sqlite` output)"
            )
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    con.text_factory = _lenient_text
    try:
        con.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        con.close()
        raise TraceFormatError(path, f"unreadable SQLite database ({exc})") from None
    return con


# nsys stores TEXT unchecked: a thread name cut inside a multi-byte character, a Latin-1 NVTX string. One such
# string must not make the whole export unreadable: it is kept with U+FFFD in place of the bad bytes.
_lenient_text = functools.partial(str, encoding="utf-8", errors="replace")


def _as_text(value: Any) -> str:
    """A value of a TEXT column that SQLite's dynamic typing let be something else: a BLOB, a number, NULL."""
    if value is None:
        return ""
    return _lenient_text(value) if isinstance(value, bytes) else str(value)


def _texts(col: Any) -> list[Any]:
    """An Arrow text column from the ADBC driver as Python strings (invalid UTF-8 replaced, as above; the
    driver makes a batch that holds a BLOB a binary column)."""
    import pyarrow as pa

    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return [None if b is None else _lenient_text(b) for b in col.to_pylist()]
    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        return [None if b is None else _lenient_text(b) for b in col.cast(pa.binary()).to_pylist()]


def _tables(con: sqlite3.Connection) -> dict[str, set[str]]:
    """The tables/views this module reads (and that exist) -> their column names."""
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {n: {r[1] for r in con.execute(f'PRAGMA table_info("{n}")')} for n in names if n in _USED_TABLES}


def _need(path: Path, tables: dict[str, set[str]], table: str, cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in tables[table]]
    if missing:
        raise TraceFormatError(
            path, f"table {table} lacks column(s) {', '.join(missing)}; unsupported nsys export schema"
        )


def _nz(col: str) -> str:
    return f"coalesce({col}, {schema.NO_ID})"


def _intern(table: dict[str, int], names: Any) -> None:
    """Give each name not yet in ``table`` the next code, in order (one C-level update, no per-name len())."""
    new = [n for n in dict.fromkeys(names) if n not in table]
    table.update(zip(new, range(len(table), len(table) + len(new)), strict=True))


class _Builder:
    def __init__(self, strings: dict[int, str]) -> None:
        self.strings = strings
        self.names: dict[str, int] = {}
        self.domains: dict[str, int] = {"": 0}
        self.nvtx_domains: dict[int, str] = {}  # NVTX domain id -> name (eventType 75 rows)
        self.negative_durations = 0  # rows that end before they start: kept 0 long (:meth:`dur`)
        self.graphs_whole = 0  # CUDA graph launches traced as one op (GRAPH_TABLE rows)
        self.graphs_untimed = 0  # GRAPH_TABLE rows CUPTI could not time, left out
        self.gpu_ops_without_pid = 0  # GPU rows with no globalPid: they take their launch call's pid
        self.parts: list[dict[str, np.ndarray]] = []

    def dur(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """``end - start``, a row that ends before it starts taken as 0 long and counted (the meta says how many)."""
        d = end - start
        self.negative_durations += zero_negative(d)
        return d

    def codes(self, names: list[str], table: dict[str, int]) -> np.ndarray:
        """Codes of ``names`` in ``table`` (new names appended in order of first appearance)."""
        _intern(table, names)
        return np.fromiter(map(table.__getitem__, names), np.int32, len(names))

    def codes_of_ids(self, ids: np.ndarray, name_of: Any) -> np.ndarray:
        """Codes for integer ids (string ids, enum values) named by ``name_of(id)``; one call per distinct id."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        lut = np.array(
            [self.names.setdefault(name_of(int(i)), len(self.names)) for i in uniq], dtype=np.int32
        )
        return lut[inverse] if len(lut) else np.zeros(0, np.int32)

    def add(self, kind: str, n: int, **cols: Any) -> None:
        part = {
            c: cols[c] if c in cols else np.full(n, schema.NO_ID, np.int64)
            for c in schema.EVENT_COLUMNS
            if c not in ("kind", "name", "domain", "shapes")
        }
        part["kind"] = np.full(n, schema.EVENT_KINDS.index(kind), np.int8)
        part["domain"] = cols["domain"] if "domain" in cols else np.zeros(n, np.int32)
        part["name"] = cols["name"]
        self.parts.append(part)


@contextmanager
def format_errors(path: Path) -> Iterator[None]:
    """SQLite errors and unexpected values inside an export become one-line ``TraceFormatError`` errors."""
    import adbc_driver_manager

    try:
        yield
    except (sqlite3.DatabaseError, adbc_driver_manager.Error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(path, f"SQLite error while reading ({first})") from None
    except TraceFormatError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. text where nsys writes integers
        raise TraceFormatError(path, f"unexpected value in an nsys table ({exc})") from None


def open_builder(path: Path, con: sqlite3.Connection, tables: dict[str, set[str]]) -> _Builder:
    """The name / domain interning of one export (checks that it is one: a ``StringIds`` table)."""
    for t in REQUIRED_TABLES:
        if t not in tables:
            raise TraceFormatError(path, f"no {t} table: not an Nsight Systems SQLite export")
    strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
    if not all(type(v) is str for v in strings.values()):
        strings = {i: v if type(v) is str else _as_text(v) for i, v in strings.items()}
    return _Builder(strings)


def open_rows(path: Path) -> Any:
    """The export opened read-only for its event rows: Arrow batches from ADBC's SQLite driver (no Python
    object per value)."""
    import adbc_driver_sqlite.dbapi as adbc

    return adbc.connect(f"{path.resolve().as_uri()}?mode=ro")


def _int(col: str, null: int | None = None) -> str:
    """``col`` as an exact int64 (a REAL truncated like ``int()``), ``null`` where NULL; NULL where it is no
    number (text, a blob, a NULL without ``null``, a REAL beyond int64): :func:`_rows` refuses those."""
    when_null = f" WHEN 'null' THEN {null}" if null is not None else ""
    return (
        f"CASE typeof({col}) WHEN 'integer' THEN {col} WHEN 'real' THEN CASE WHEN abs({col}) < 9.2e18 "
        f"THEN CAST({col} AS INTEGER) END{when_null} END"
    )


def _rows(
    path: Path, rows: Any, table: str, ints: list[str], *, text: str | None = None, where: str = ""
) -> Iterator[tuple[np.ndarray, list[str]]]:
    """``SELECT ints..., text FROM table AS n [WHERE where]`` in rowid order, ``BATCH_ROWS`` rows at a time, as
    an int64 matrix and the text column; ``ints`` are :func:`_int` expressions (a NULL is a value that is no
    integer: one line naming the table)."""
    cur = rows.cursor()
    try:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        kind = cur.execute("SELECT type FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        order = " ORDER BY n.rowid" if kind and kind[0] == "table" else ""
        cols = [*ints, *([text] if text is not None else [])]
        cur.execute(f"SELECT {', '.join(cols)} FROM {table} AS n {'WHERE ' + where if where else ''}{order}")
        k = len(ints)
        for batch in cur.fetch_record_batch():
            if batch.num_rows == 0:
                continue
            if any(batch.column(i).null_count for i in range(k)):
                raise TraceFormatError(path, f"unexpected value in an nsys table ({table}: not an integer)")
            m = np.column_stack([batch.column(i).to_numpy() for i in range(k)]).astype(np.int64, copy=False)
            yield m, (_texts(batch.column(k)) if text is not None else [])
    finally:
        cur.close()


def _intern_ids(con: sqlite3.Connection, b: _Builder, table: str, expr: str, name_of: Any) -> None:
    """Intern the names of every distinct id of ``expr`` in ``table`` in ascending id order: the codes
    ``_Builder.codes_of_ids`` gives when it sees the whole column at once, whatever blocks come later."""
    for (i,) in con.execute(f"SELECT DISTINCT {expr} FROM {table} AS n ORDER BY 1"):
        b.names.setdefault(name_of(int(i)), len(b.names))


def read_parts(
    path: Path, con: sqlite3.Connection, rows: Any, tables: dict[str, set[str]], b: _Builder
) -> Iterator[None]:
    """Add the export's events to ``b.parts`` -- GPU ops, runtime calls, driver calls, NVTX ranges, in that
    order, each table in rowid order -- yielding after each part of at most ``BATCH_ROWS`` rows (``rows``:
    :func:`open_rows`; ``con`` answers the small queries)."""
    strings = b.strings

    def string(i: int) -> str:
        return strings.get(i, f"<string {i}>")

    namers = {
        "CUPTI_ACTIVITY_KIND_KERNEL": lambda i: string(i) if i != schema.NO_ID else "<unnamed kernel>",
        GRAPH_TABLE: lambda i: f"CUDA graph {i}" if i != schema.NO_ID else "CUDA graph",
        "CUPTI_ACTIVITY_KIND_MEMCPY": lambda i: f"Memcpy {MEMCPY_KIND.get(i, i)}",
        "CUPTI_ACTIVITY_KIND_MEMSET": lambda i: "Memset",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": lambda i: SYNC_KIND.get(i, f"Sync {i}"),
    }
    for kind, table, name_col, bytes_col in _GPU_TABLES:
        if table not in tables:
            continue
        if table == GRAPH_TABLE and name_col not in tables[table]:  # an export without graph ids: unnamed
            name_col = str(schema.NO_ID)
        # a kernel without globalPid (an export cut down by hand) takes its launch call's pid (decoded.gpu_pid_sql)
        owned = "globalPid" in tables[table]
        needed = [c for c in _GPU_COLUMNS if c != "globalPid"] + ([name_col] if name_col[0].isalpha() else [])
        _need(path, tables, table, tuple(needed))
        _intern_ids(con, b, table, _nz(name_col), namers[table])
        exprs = [
            _int("start"),
            _int('"end"'),
            *(
                _int(c, schema.NO_ID) if c != "globalPid" or owned else str(schema.NO_ID)
                for c in ("deviceId", "streamId", "correlationId", "globalPid", name_col)
            ),
            *([_int(bytes_col, schema.NO_ID)] if bytes_col else []),
        ]
        where = ""
        if table == GRAPH_TABLE:  # CUPTI: start and end 0 = the graph could not be timed
            where = 'NOT (n.start = 0 AND n."end" = 0)'
            b.graphs_untimed = con.execute(
                f'SELECT count(*) FROM {table} WHERE start = 0 AND "end" = 0'
            ).fetchone()[0]
        for m, _ in _rows(path, rows, table, exprs, where=where):
            start, end = m[:, 0], m[:, 1]
            no_pid = m[:, 5] == schema.NO_ID
            pid = np.where(no_pid, schema.NO_ID, decode_global_tid(m[:, 5])[0])
            b.gpu_ops_without_pid += int(no_pid.sum())
            b.add(
                kind,
                len(m),
                name=b.codes_of_ids(m[:, 6], namers[table]),
                pid=pid,
                device=m[:, 2].copy(),
                stream=m[:, 3].copy(),
                start_ns=start.copy(),
                dur_ns=b.dur(start, end),
                correlation=m[:, 4].copy(),
                bytes=m[:, 7].copy() if bytes_col else np.full(len(m), schema.NO_ID, np.int64),
            )
            if table == GRAPH_TABLE:
                b.graphs_whole += len(m)
            yield
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        table = "CUPTI_ACTIVITY_KIND_RUNTIME"
        _need(path, tables, table, ("start", "end", "globalTid", "correlationId", "nameId"))
        classed = "eventClass" in tables[table]  # an export cut down by hand may lack it: runtime calls
        _intern_ids(con, b, table, _nz("nameId"), string)
        exprs = [
            _int("start"),
            _int('"end"'),
            *(_int(c, schema.NO_ID) for c in ("globalTid", "correlationId", "nameId")),
        ]
        # runtime (eventClass 0, or anything but 1) calls first, then driver calls: one pass per class
        for kind, cond in ((schema.RUNTIME, "<>"), (schema.DRIVER, "=")):
            where = f"{_nz('n.eventClass') if classed else schema.NO_ID} {cond} {DRIVER_CLASS}"
            for m, _ in _rows(path, rows, table, exprs, where=where):
                pid, tid = decode_global_tid(m[:, 2])
                b.add(
                    kind,
                    len(m),
                    name=b.codes_of_ids(m[:, 4], string),
                    pid=pid,
                    tid=tid,
                    start_ns=m[:, 0],
                    dur_ns=b.dur(m[:, 0], m[:, 1]),
                    correlation=m[:, 3],
                )
                yield
    yield from _load_nvtx(path, con, rows, tables, b)


def _load_nvtx(
    path: Path, con: sqlite3.Connection, rows: Any, tables: dict[str, set[str]], b: _Builder
) -> Iterator[None]:
    if "NVTX_EVENTS" not in tables:
        return
    _need(
        path, tables, "NVTX_EVENTS", ("start", "end", "eventType", "text", "globalTid", "textId", "domainId")
    )
    has_end_tid = "endGlobalTid" in tables["NVTX_EVENTS"]
    domains = b.nvtx_domains = {
        int(d): t
        for d, t in con.execute(
            f"SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"
        )
        if t and d is not None
    }
    where = f'n.eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}) AND n."end" IS NOT NULL'

    def domain_code(d: int) -> int:
        return b.domains.setdefault(domains.get(d, "" if d == 0 else f"domain {d}"), len(b.domains))

    # domain codes in ascending id order over the whole table (what np.unique over all rows gives)
    for (d,) in con.execute(
        f"SELECT DISTINCT coalesce(n.domainId, 0) FROM NVTX_EVENTS AS n WHERE {where} ORDER BY 1"
    ):
        domain_code(int(d))
    # One pass over NVTX_EVENTS; the name is inline text, else the StringIds value of textId (a scalar
    # subquery: one row per event, evaluated only when text is NULL).
    read = _rows(
        path,
        rows,
        "NVTX_EVENTS",
        [
            _int("n.start"),
            _int('n."end"'),
            _int("n.globalTid", schema.NO_ID),
            _int("n.endGlobalTid", schema.NO_ID) if has_end_tid else str(schema.NO_ID),
            _int("n.domainId", 0),
        ],
        text="coalesce(n.text, (SELECT s.value FROM StringIds s WHERE s.id = n.textId), '')",
        where=where,
    )
    for m, names in read:
        pid, tid = decode_global_tid(m[:, 2])
        end_g = m[:, 3]
        _, end_tid = decode_global_tid(np.where(end_g == schema.NO_ID, 0, end_g))
        end_tid = np.where(end_g == schema.NO_ID, schema.NO_ID, end_tid)
        dom_ids, dom_inv = np.unique(m[:, 4], return_inverse=True)
        dom_lut = np.array([domain_code(int(d)) for d in dom_ids], dtype=np.int32)
        b.add(
            schema.RANGE,
            len(m),
            name=b.codes(names, b.names),
            domain=dom_lut[dom_inv],
            pid=pid,
            tid=tid,
            start_ns=m[:, 0].copy(),
            dur_ns=b.dur(m[:, 0], m[:, 1]),
            end_tid=end_tid,
        )
        yield


# torch.autograd.profiler.emit_nvtx(record_shapes=True) names: "aten::mm, seq = 3, op_id = 9, sizes = [[4, 8],
# [8, 2]], input_op_ids = [(7, 0)]" (torch/csrc/profiler/util.cpp getNvtxStr). Shapes hold no parentheses.
_NVTX_SIZES = re.compile(r", sizes = (\[[\[\]0-9, -]*\])(?:, input_op_ids = |$)")


def nvtx_sizes(name: str) -> str:
    """The compact ``sizes = [...]`` of an emit_nvtx range name ("[[4,8],[8,2]]"), or ""."""
    m = _NVTX_SIZES.search(name)
    return m.group(1).replace(" ", "") if m else ""


def nvtx_shape_lut(range_name_codes: np.ndarray, names: list[str]) -> tuple[list[str], np.ndarray]:
    """Shape categories and a code per name code, from the sorted distinct name codes of the range rows:
    each distinct range name's ``sizes`` is parsed once; names without sizes (and non-ranges) map to 0."""
    cats: dict[str, int] = {"": 0}
    lut = np.zeros(len(names), np.int32)
    for code in range_name_codes.tolist():
        if ", sizes = " in names[code]:
            lut[code] = cats.setdefault(nvtx_sizes(names[code]), len(cats))
    return list(cats), lut


def report_meta(
    path: Path,
    con: sqlite3.Connection,
    tables: dict[str, set[str]],
    b: _Builder,
    rank: int | None,
    num_gpu_pids: int,
) -> tuple[int | None, dict[str, Any]]:
    """The trace's rank and meta (clock, session start, processes, NVTX domains, GPUs, missing tables, how
    the rank was found) from the export's small tables, once its events were read."""
    session_start = None
    if (
        "TARGET_INFO_SESSION_START_TIME" in tables
        and "utcEpochNs" in tables["TARGET_INFO_SESSION_START_TIME"]
    ):
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        session_start = int(row[0]) if row and row[0] is not None else None
    processes = {}
    if "PROCESSES" in tables:
        processes = {
            int(pid): name for _, pid, name in con.execute("SELECT globalPid, pid, name FROM PROCESSES")
        }
    gpu_names: dict[int, str] = {}
    if "TARGET_INFO_GPU" in tables and {"id", "name"} <= tables["TARGET_INFO_GPU"]:
        gpu_names = {int(i): n for i, n in con.execute("SELECT id, name FROM TARGET_INFO_GPU")}
    meta = {
        "clock": "nsys_session_ns",
        "session_start_utc_ns": session_start,
        "processes": {str(k): v for k, v in processes.items()},
        "nvtx_domains": {str(k): v for k, v in b.nvtx_domains.items()},
        "gpu_names": gpu_names,
        "negative_durations": b.negative_durations,
        "cuda_graphs_whole": b.graphs_whole,
        "cuda_graphs_untimed": b.graphs_untimed,
        "gpu_ops_without_pid": b.gpu_ops_without_pid,
        "missing_tables": [
            t
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
            if t not in tables
        ],
    }
    rank, naming = report_rank(path, rank, _environment(con, tables), num_gpu_pids)
    meta.update(naming)
    return rank, meta


def _environment(con: sqlite3.Connection, tables: dict[str, set[str]]) -> str | None:
    """The environment nsys ran in (``K=V;K=V``), from TARGET_INFO_SYSTEM_ENV's DeviceEnvironment row."""
    if not {"name", "value"} <= tables.get("TARGET_INFO_SYSTEM_ENV", set()):
        return None
    row = con.execute(
        "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment' LIMIT 1"
    ).fetchone()
    return row[0] if row and isinstance(row[0], str) else None
