"""Nsight Systems SQLite export (``nsys export --type sqlite``) -> the normalized event table.

The file is opened read-only (``file:...?mode=ro``). Tables used (export schema 3.25 checked):

- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` / ``_SYNCHRONIZATION``: GPU ops with
  ``start``/``end`` ns, ``deviceId``, ``streamId``, ``correlationId``, ``globalPid``; kernel names are
  ``demangledName`` ids into ``StringIds``.
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

import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from tracing import schema
from tracing.errors import TraceFormatError
from tracing.trace import Trace, events_frame

NVTX_PUSHPOP, NVTX_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 75
RUNTIME_CLASS, DRIVER_CLASS = 0, 1
REQUIRED_TABLES = ("StringIds",)
_GPU_TABLES = {
    schema.KERNEL: ("CUPTI_ACTIVITY_KIND_KERNEL", "demangledName", "NULL"),
    schema.MEMCPY: ("CUPTI_ACTIVITY_KIND_MEMCPY", "copyKind", "bytes"),
    schema.MEMSET: ("CUPTI_ACTIVITY_KIND_MEMSET", "memKind", "bytes"),
    schema.SYNC: ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "syncType", "NULL"),
}
_GPU_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
MEMCPY_KIND = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
SYNC_KIND = {0: "Unknown", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}


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
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        con.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(path, f"unreadable SQLite database ({exc})") from None
    return con


def _tables(con: sqlite3.Connection) -> dict[str, set[str]]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {n: {r[1] for r in con.execute(f'PRAGMA table_info("{n}")')} for n in names}


def _need(path: Path, tables: dict[str, set[str]], table: str, cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in tables[table]]
    if missing:
        raise TraceFormatError(
            path, f"table {table} lacks column(s) {', '.join(missing)}; unsupported nsys export schema"
        )


def _fetch(con: sqlite3.Connection, sql: str) -> list[np.ndarray]:
    rows = con.execute(sql).fetchall()
    if not rows:
        return []
    return [np.asarray(col) for col in zip(*rows, strict=True)]


def _ints(col: np.ndarray) -> np.ndarray:
    if col.dtype == object:  # NULLs come back as None
        return np.array([schema.NO_ID if v is None else v for v in col], dtype=np.int64)
    return col.astype(np.int64)


class _Builder:
    def __init__(self, strings: dict[int, str]) -> None:
        self.strings = strings
        self.names: dict[str, int] = {}
        self.domains: dict[str, int] = {"": 0}
        self.parts: list[dict[str, np.ndarray]] = []

    def codes(self, names: list[str] | np.ndarray, table: dict[str, int]) -> np.ndarray:
        return np.fromiter((table.setdefault(n, len(table)) for n in names), dtype=np.int32, count=len(names))

    def add(self, kind: str, n: int, **cols: Any) -> None:
        part = {
            c: np.full(n, schema.NO_ID, np.int64)
            for c in schema.EVENT_COLUMNS
            if c not in ("kind", "name", "domain")
        }
        part["kind"] = np.full(n, schema.EVENT_KINDS.index(kind), np.int8)
        part["domain"] = np.zeros(n, np.int32)
        for c, v in cols.items():
            part[c] = v
        self.parts.append(part)


def load_nsys_events(path: str | os.PathLike[str], *, rank: int | None = None) -> Trace:
    """Read one Nsight Systems SQLite export into a :class:`Trace` (one trace, possibly many processes)."""
    path = Path(path)
    con = open_readonly(path)
    try:
        return _load(path, con, rank)
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(path, f"SQLite error while reading ({exc})") from None
    except TraceFormatError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. text where nsys writes integers
        raise TraceFormatError(path, f"unexpected value in an nsys table ({exc})") from None
    finally:
        con.close()


def _load(path: Path, con: sqlite3.Connection, rank: int | None) -> Trace:
    tables = _tables(con)
    for t in REQUIRED_TABLES:
        if t not in tables:
            raise TraceFormatError(path, f"no {t} table: not an Nsight Systems SQLite export")
    strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
    b = _Builder(strings)
    for kind, (table, name_col, bytes_col) in _GPU_TABLES.items():
        if table not in tables:
            continue
        _need(path, tables, table, (*_GPU_COLUMNS, name_col))
        cols = _fetch(
            con,
            f'SELECT start, "end", deviceId, streamId, correlationId, globalPid, {name_col}, {bytes_col} FROM {table}',
        )
        if not cols:
            continue
        start, end, dev, stream, corr, gpid, name_id, nbytes = cols
        if kind == schema.KERNEL:
            names = [
                strings.get(int(i), f"<string {i}>") if i is not None else "<unnamed kernel>" for i in name_id
            ]
        elif kind == schema.MEMCPY:
            names = [f"Memcpy {MEMCPY_KIND.get(int(k), k)}" for k in name_id]
        elif kind == schema.MEMSET:
            names = ["Memset"] * len(start)
        else:
            names = [SYNC_KIND.get(int(k) if k is not None else 0, f"Sync {k}") for k in name_id]
        start, end = _ints(start), _ints(end)
        pid, _ = decode_global_tid(_ints(gpid))
        b.add(
            kind,
            len(start),
            name=b.codes(names, b.names),
            pid=pid,
            device=_ints(dev),
            stream=_ints(stream),
            start_ns=start,
            dur_ns=np.maximum(end - start, 0),
            correlation=_ints(corr),
            bytes=_ints(nbytes) if bytes_col != "NULL" else np.full(len(start), schema.NO_ID, np.int64),
        )
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        _need(
            path,
            tables,
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            ("start", "end", "eventClass", "globalTid", "correlationId", "nameId"),
        )
        cols = _fetch(
            con,
            'SELECT start, "end", eventClass, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME',
        )
        if cols:
            start, end, ecls, gtid, corr, name_id = (_ints(c) for c in cols)
            pid, tid = decode_global_tid(gtid)
            names = [strings.get(int(i), f"<string {i}>") for i in name_id]
            is_driver = ecls == DRIVER_CLASS
            for kind, sel in ((schema.RUNTIME, ~is_driver), (schema.DRIVER, is_driver)):
                if sel.any():
                    b.add(
                        kind,
                        int(sel.sum()),
                        name=b.codes([n for n, s in zip(names, sel, strict=True) if s], b.names),
                        pid=pid[sel],
                        tid=tid[sel],
                        start_ns=start[sel],
                        dur_ns=np.maximum(end[sel] - start[sel], 0),
                        correlation=corr[sel],
                    )
    domains = _load_nvtx(path, con, tables, b)
    return _finish(path, con, tables, b, rank, domains)


def _load_nvtx(
    path: Path, con: sqlite3.Connection, tables: dict[str, set[str]], b: _Builder
) -> dict[int, str]:
    if "NVTX_EVENTS" not in tables:
        return {}
    _need(
        path, tables, "NVTX_EVENTS", ("start", "end", "eventType", "text", "globalTid", "textId", "domainId")
    )
    has_end_tid = "endGlobalTid" in tables["NVTX_EVENTS"]
    domains = {
        int(d): t
        for d, t in con.execute(
            f"SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"
        )
        if t
    }
    end_tid_sql = "endGlobalTid" if has_end_tid else "NULL"
    cols = _fetch(
        con,
        f'SELECT start, "end", globalTid, {end_tid_sql}, coalesce(text, ""), textId, coalesce(domainId, 0) FROM NVTX_EVENTS '
        f'WHERE eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}) AND "end" IS NOT NULL',
    )
    if not cols:
        return domains
    start, end, gtid, end_gtid, text, text_id, dom = cols
    names = [
        t if t else b.strings.get(int(i), "") if i is not None else ""
        for t, i in zip(text, text_id, strict=True)
    ]
    start, end = _ints(start), _ints(end)
    pid, tid = decode_global_tid(_ints(gtid))
    end_g = _ints(end_gtid)
    _, end_tid = decode_global_tid(np.where(end_g == schema.NO_ID, 0, end_g))
    end_tid = np.where(end_g == schema.NO_ID, schema.NO_ID, end_tid)
    dom_names = [domains.get(int(d), "" if int(d) == 0 else f"domain {int(d)}") for d in dom]
    b.add(
        schema.RANGE,
        len(start),
        name=b.codes(names, b.names),
        domain=b.codes(dom_names, b.domains),
        pid=pid,
        tid=tid,
        start_ns=start,
        dur_ns=np.maximum(end - start, 0),
        end_tid=end_tid,
    )
    return domains


def _finish(
    path: Path,
    con: sqlite3.Connection,
    tables: dict[str, set[str]],
    b: _Builder,
    rank: int | None,
    domains: dict[int, str],
) -> Trace:
    if b.parts:
        columns = {c: np.concatenate([p[c] for p in b.parts]) for c in b.parts[0]}
    else:
        columns = {c: np.zeros(0, np.int64) for c in schema.EVENT_COLUMNS}
        columns["kind"] = np.zeros(0, np.int8)
        columns["name"] = columns["domain"] = np.zeros(0, np.int32)
    events = events_frame(columns, list(b.names), list(schema.EVENT_KINDS), list(b.domains))
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
        "nvtx_domains": {str(k): v for k, v in domains.items()},
        "gpu_names": gpu_names,
        "missing_tables": [
            t
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
            if t not in tables
        ],
    }
    return Trace(str(path), "nsys", events, rank=rank, meta=meta)
