"""Read integer (and one text) column of an SQLite table into NumPy without a Python object per value.

Why: ``cursor.fetchall()`` builds a tuple per row and an ``int`` per value (~100 ns each), and converting them
to ``int64`` costs as much again; for an nsys export that is most of the ingest. Here SQLite formats each column
of a block of rows as one comma-separated string (``group_concat``), and NumPy parses it in C::

    SELECT count(*), group_concat(start), group_concat("end"), ..., group_concat(name, char(0))
    FROM t AS n WHERE n.rowid BETWEEN lo AND hi [AND ...]

All aggregates of one query see the same rows in the same order, so the columns stay aligned. Blocks of
:data:`BLOCK_ROWS` rowids keep each string far below SQLite's string limit (``SQLITE_MAX_LENGTH``, 1e9 bytes),
and rowid ranges give the table's rowid order, the order a plain ``SELECT`` scans in.

It is only a faster route to the same values: :func:`select_columns` returns None -- and the caller reads the
rows the ordinary way, which gives the same table or the exact error -- whenever the bulk text would not
round-trip: a table without rowids (a view), a block whose text exceeds SQLite's string limit, a NULL (``group_concat`` skips it), a non-integer value (REAL
``5.0``, text ``"12abc"``: the parse stops), an out-of-range one (NumPy clamps to the int64 limits, so either
limit falls back), or a text value holding the separator ``char(0)`` (NVTX names come from C strings and never do).
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from typing import Any

import numpy as np

BLOCK_ROWS = 1 << 16  # rowids a query: its column texts and their parses are the decode peak (2^18: +70 MB)
_INT64 = np.iinfo(np.int64)


def _parse_ints(text: str | None, n: int) -> np.ndarray | None:
    """``"1,-2,3"`` -> int64 array of length ``n``, or None when it is not exactly ``n`` in-range integers."""
    if text is None:
        return None
    try:
        values = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:  # unmatched data: a float, text, or an empty field
        return None
    if len(values) != n or (values == _INT64.max).any() or (values == _INT64.min).any():
        return None
    return values


def _rowids(con: sqlite3.Connection, table: str) -> tuple[int, int] | None:
    """The table's first and last rowid ((1, 0) when empty: no blocks), or None when it has no rowids."""
    try:
        lo, hi, total = con.execute(f"SELECT min(rowid), max(rowid), count(*) FROM {table}").fetchone()
    except sqlite3.OperationalError:  # no rowid (a WITHOUT ROWID table)
        return None
    if total == 0:
        return 1, 0
    if lo is None:  # rows without rowids (a view)
        return None
    return lo, hi


def select_blocks(
    con: sqlite3.Connection,
    table: str,
    int_exprs: list[str],
    *,
    text: str | None = None,
    where: str = "",
    bulk: bool = True,
) -> Iterator[tuple[np.ndarray, list[str]]]:
    """:func:`select` a block of :data:`BLOCK_ROWS` rowids at a time (bounded memory): the same rows in the
    same order, as ``(matrix, texts)`` per non-empty block. A block the bulk text cannot reproduce is read
    row by row (the same values, or the exact error); a table without rowids is read whole."""
    span = _rowids(con, table)
    if span is None:  # no rowids (a view, a WITHOUT ROWID table): one block, row by row
        yield select(con, table, int_exprs, text=text, where=where, bulk=False)
        return
    lo, hi = span
    cond = f" AND ({where})" if where else ""
    for first in range(lo, hi + 1, BLOCK_ROWS):
        bounds = (first, first + BLOCK_ROWS - 1)
        got = _bulk_block(con, table, int_exprs, text, where, bounds) if bulk else None
        if got is None:
            got = _plain(con, table, int_exprs, text, f"WHERE n.rowid BETWEEN ? AND ?{cond}", bounds)
        if len(got[0]):
            yield got


def _bulk_block(
    con: sqlite3.Connection,
    table: str,
    int_exprs: list[str],
    text_expr: str | None,
    where: str,
    bounds: tuple[int, int],
) -> tuple[np.ndarray, list[str]] | None:
    """One rowid block in bulk (see the module docstring), or None where it would not round-trip."""
    k = len(int_exprs)
    aggs = [f"group_concat({e})" for e in int_exprs]
    if text_expr is not None:
        aggs.append(f"group_concat({text_expr}, char(0))")
    cond = f"AND ({where})" if where else ""
    sql = f"SELECT count(*), {', '.join(aggs)} FROM {table} AS n WHERE n.rowid BETWEEN ? AND ? {cond}"
    try:
        row = con.execute(sql, bounds).fetchone()
    except sqlite3.DataError:  # "string or blob too big": the block's text exceeds SQLITE_MAX_LENGTH
        return None
    n = row[0]
    if n == 0:
        return np.zeros((0, k), np.int64), []
    cols = [_parse_ints(s, n) for s in row[1 : 1 + k]]
    if any(c is None for c in cols):
        return None
    texts: list[str] = []
    if text_expr is not None:
        texts = row[1 + k].split("\x00") if row[1 + k] is not None else []
        if len(texts) != n:
            return None
    return (np.column_stack(cols) if k else np.zeros((n, 0), np.int64)), texts


def select_columns(
    con: sqlite3.Connection,
    table: str,
    int_exprs: list[str],
    text_expr: str | None = None,
    where: str = "",
) -> tuple[np.ndarray, list[str]] | None:
    """``SELECT int_exprs..., text_expr FROM table AS n [WHERE where]`` in rowid order, in bulk.

    Returns an ``(n, len(int_exprs))`` int64 matrix and the text column (``[]`` without ``text_expr``), or None
    when the bulk route can't reproduce a plain SELECT exactly (see the module docstring). ``int_exprs`` must
    never be NULL (wrap nullable columns in ``coalesce``); rows are referred to as ``n``.
    """
    span = _rowids(con, table)
    if span is None:
        return None
    lo, hi = span
    k = len(int_exprs)
    blocks: list[np.ndarray] = []
    texts: list[str] = []
    for first in range(lo, hi + 1, BLOCK_ROWS):
        got = _bulk_block(con, table, int_exprs, text_expr, where, (first, first + BLOCK_ROWS - 1))
        if got is None:
            return None
        if len(got[0]):
            blocks.append(got[0])
            texts.extend(got[1])
    if not blocks:
        return np.zeros((0, k), np.int64), []
    return (blocks[0] if len(blocks) == 1 else np.concatenate(blocks)), texts


def select(
    con: sqlite3.Connection,
    table: str,
    int_exprs: list[str],
    *,
    text: str | None = None,
    where: str = "",
    bulk: bool = True,
) -> tuple[np.ndarray, list[str]]:
    """The same SELECT as :func:`select_columns`, always answered: in bulk when the values allow it, else row by
    row -- the same values, or the exact error (``TypeError`` on a NULL, ``OverflowError`` out of range)."""
    if bulk:
        got = select_columns(con, table, int_exprs, text, where)
        if got is not None:
            return got
    return _plain(con, table, int_exprs, text, f"WHERE {where}" if where else "", ())


def _plain(
    con: sqlite3.Connection,
    table: str,
    int_exprs: list[str],
    text: str | None,
    clause: str,
    params: tuple[int, ...],
) -> tuple[np.ndarray, list[str]]:
    """The SELECT row by row (``fetchall``): the exact values, or the exact error."""
    exprs = [*int_exprs, *([text] if text is not None else [])]
    rows = con.execute(f"SELECT {', '.join(exprs)} FROM {table} AS n {clause}", params).fetchall()
    k = len(int_exprs)
    if text is None:
        return _ints_of_rows(rows, k), []
    return _ints_of_rows([r[:k] for r in rows], k), [r[k] for r in rows]


def _ints_of_rows(rows: list[tuple[Any, ...]], ncols: int) -> np.ndarray:
    """``fetchall()`` rows -> an (n, ncols) int64 matrix; a flat ``fromiter`` is ~1.7x faster than
    ``np.array(rows)`` and converts values the same way (int() semantics, TypeError on NULL)."""
    if not rows:
        return np.zeros((0, ncols), np.int64)
    flat = itertools.chain.from_iterable(rows)
    return np.fromiter(flat, np.int64, len(rows) * ncols).reshape(len(rows), ncols)
