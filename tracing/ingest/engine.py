"""The query engine every trace table is computed in: one DuckDB connection per trace, any size.

DuckDB does the relational work (the op <-> launch join, the busy union, gaps and host stall, the stream
breakdown, the kernel table, range attribution as an interval join, window-end device time) out of core:
``memory_limit`` caps what it holds and the rest spills to ``temp_directory``. Events enter as an Arrow table
(a trace decoded in memory) or as Parquet files (a trace decoded a batch at a time); the SQL is the same.

Limits come from the environment so that every entry point (CLI, pool worker, Ray task, notebook) gets them:

- ``MXPERF_MEMORY_LIMIT`` (default ``512MB``): DuckDB's ``memory_limit`` per trace;
- ``MXPERF_THREADS`` (1 to 1024; default: the cores, at most 4, and one for a trace of fewer than
  :data:`SERIAL_ROWS` events, where more threads only add their start-up): DuckDB's ``threads``;
- ``MXPERF_TEMP_DIR``: where it spills (default: the ingest's staging folder, else the system's).

A value the engine cannot use is one line naming its variable (:class:`InputError`); an engine error (out of
memory, out of temp space) one line naming the limit and the variable that raises it (:class:`EngineError`),
never a traceback.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tracing.outputs import schema
from tracing.outputs.errors import InputError

if TYPE_CHECKING:
    import duckdb
    import pandas as pd
    import pyarrow as pa

MEMORY_ENV = "MXPERF_MEMORY_LIMIT"
THREADS_ENV = "MXPERF_THREADS"
TEMP_ENV = "MXPERF_TEMP_DIR"
DEFAULT_MEMORY = "512MB"
MAX_THREADS = 1024  # DuckDB starts every thread it is given
SERIAL_ROWS = 100_000  # measured in benchmarks/RESULTS.md (engine threads)
NO_ID = -1
# Hugeint interval keys: (group << 64) + (t + 2^63) orders every group's times after the previous group's, so an
# equality on the group plus a range on the time is one range condition (an IEJoin, not a hash join + filter).
OFFSET = "9223372036854775808"


class EngineError(InputError):
    """The engine ran out of a limit: one line naming it and how to raise it (exit 2, like bad input)."""


def memory_limit() -> str:
    """``MXPERF_MEMORY_LIMIT`` as DuckDB reads it (``512MB``, ``2GB``, ``1GiB``, ``50%``); DuckDB checks the
    form when a connection opens (:func:`connect`), a negative size (DuckDB's "no limit") is refused here."""
    value = os.environ.get(MEMORY_ENV, DEFAULT_MEMORY).strip()
    if value.startswith("-"):
        raise InputError(f"{MEMORY_ENV}={value!r}: expected a positive memory size (e.g. 512MB, 2GB)")
    return value


def threads() -> int:
    """``MXPERF_THREADS`` (1 to :data:`MAX_THREADS`), else the cores, at most 4."""
    env = os.environ.get(THREADS_ENV)
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_THREADS:
            raise InputError(f"{THREADS_ENV}={env!r}: expected a whole number of threads, 1 to {MAX_THREADS}")
        return n
    return max(1, min(4, os.cpu_count() or 1))


def temp_directory(fallback: str | None = None) -> str:
    """Where the engine spills: ``MXPERF_TEMP_DIR`` (a folder a file can be written in, or one whose parent is:
    DuckDB makes it when it first spills; probed with a temporary file, nothing made here), else ``fallback``,
    else the system's temporary folder."""
    env = os.environ.get(TEMP_ENV)
    if not env:
        return fallback or tempfile.gettempdir()
    folder = env if os.path.exists(env) else os.path.dirname(os.path.abspath(env))
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise InputError(
            f"{TEMP_ENV}={env!r}: the engine cannot spill there ({exc.strerror or exc}: {folder})"
        ) from None
    return env


def connect(spill: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with mxperf's limits (an in-memory database that spills to ``spill``, the folder
    :func:`temp_directory` chose); a limit DuckDB cannot read is one line naming its variable
    (:class:`InputError`)."""
    import duckdb

    memory = memory_limit()
    config = {
        "memory_limit": memory,
        "threads": threads(),
        "temp_directory": spill,
        "preserve_insertion_order": True,
        "arrow_large_buffer_size": True,  # text as Arrow large_string, the tables' type (no cast)
    }
    try:
        return duckdb.connect(config=config)
    except duckdb.ParserException as exc:  # the one setting DuckDB parses
        first = str(exc).splitlines()[0]
        raise InputError(f"{MEMORY_ENV}={memory!r}: not a memory size ({first})") from None


def fit_threads(con: duckdb.DuckDBPyConnection, rows: int) -> None:
    """One engine thread for a trace of fewer than :data:`SERIAL_ROWS` events, unless ``MXPERF_THREADS`` is
    set: DuckDB splits its parallel work by row groups of 122,880 rows, so a small trace gains nothing from
    more threads and pays for starting them."""
    if rows < SERIAL_ROWS and not os.environ.get(THREADS_ENV):
        con.execute("set threads = 1")


@contextmanager
def session(temp_dir: str | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection closed on exit, its engine errors turned into :class:`EngineError`."""
    spill = temp_directory(temp_dir)
    with engine_errors(spill):
        con = connect(spill)
        try:
            yield con
        finally:
            con.close()


@contextmanager
def engine_errors(spill: str = "") -> Iterator[None]:
    """DuckDB's out-of-memory and out-of-disk errors as one line naming the limit and its variable (``spill``:
    the folder the engine spills to)."""
    import duckdb

    try:
        yield
    except duckdb.OutOfMemoryException as exc:
        first = str(exc).splitlines()[0]
        if "offload" in first:  # DuckDB's "failed to offload data block": the spill folder is full
            raise EngineError(
                f"the trace engine ran out of disk spilling to {spill or 'its temporary folder'} at "
                f"{MEMORY_ENV}={memory_limit()} ({first}); point {TEMP_ENV} at a folder with more free space "
                f"or raise {MEMORY_ENV}"
            ) from None
        raise EngineError(
            f"the trace engine ran out of memory at {MEMORY_ENV}={memory_limit()} ({first}); "
            f"raise {MEMORY_ENV} (e.g. 2GB) or free disk in {TEMP_ENV} for spilling"
        ) from None
    except duckdb.IOException as exc:
        first = str(exc).splitlines()[0]
        if any(k in first.lower() for k in ("no space left", "disk", "temp", "create directory")):
            raise EngineError(
                f"the trace engine could not spill to disk ({first}); point {TEMP_ENV} at a folder with "
                "free space"
            ) from None
        raise


def arrow(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> pa.Table:
    """A query's result as one Arrow table."""
    return con.sql(sql, params=params).to_arrow_table()


def batches(
    con: duckdb.DuckDBPyConnection, sql: str, rows: int, params: list[Any] | None = None
) -> Iterator[pa.RecordBatch]:
    """A query's result ``rows`` at a time, in its order (``ORDER BY`` in ``sql``)."""
    yield from con.sql(sql, params=params).to_arrow_reader(rows)


# the event table's columns as the engine reads them: categoricals as text, plus ``row``
EVENT_SELECT = ", ".join(
    [f"{c}::varchar as {c}" if t == "category" else c for c, t in schema.EVENT_COLUMNS.items()]
)


def register_frame(con: duckdb.DuckDBPyConnection, events: pd.DataFrame | pa.Table) -> None:
    """An event table (a frame, or Arrow) as the ``events`` view (``row`` = the row's position in it)."""
    import numpy as np
    import pyarrow as pa

    table = events if isinstance(events, pa.Table) else pa.Table.from_pandas(events, preserve_index=False)
    table = table.append_column("row", pa.array(np.arange(len(events), dtype=np.int64)))
    con.register("events_frame", table)
    con.execute(f"create or replace temp view events as select {EVENT_SELECT}, row from events_frame")


def parquet_events(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str]) -> None:
    """An events Parquet file as the ``events`` view (``row`` = the row's position in the file)."""
    con.execute(
        f"create or replace temp view events as select {EVENT_SELECT}, file_row_number as row "
        f"from read_parquet({literal(path)}, file_row_number = true)"
    )


def literal(text: str | os.PathLike[str]) -> str:
    """A SQL string literal (a path in a view's definition, where parameters cannot go)."""
    return "'" + str(text).replace("'", "''") + "'"


def table(result: pa.Table, columns: dict[str, str], name: str = "table") -> pa.Table:
    """An engine result as an Arrow table of a table's schema (its columns but trace / format / rank)."""
    return schema.conform_table(result, own_columns(columns), name)


def own_columns(columns: dict[str, str]) -> dict[str, str]:
    """A table's columns but the ``trace`` / ``format`` / ``rank`` that ``jobs.with_trace_cols`` adds."""
    return {c: t for c, t in columns.items() if c not in ("trace", "rank", "format")}


def frame(result: pa.Table, columns: dict[str, str], name: str = "table") -> pd.DataFrame:
    """:func:`table` as a pandas frame (the notebook functions)."""
    return schema.to_frame(table(result, columns, name))
