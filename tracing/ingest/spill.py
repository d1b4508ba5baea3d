"""Out-of-core columns: append-only row files and sorted runs merged back in key order, in bounded memory.

Why: a multi-GB trace holds tens of millions of events; sorting or joining them in memory costs more than the
trace's own size. Rows are written to disk in blocks of int64 columns (one fixed-size record per row) and
read back a block at a time with plain file reads (no ``mmap``: mapped pages would count in the process's
resident memory), so what is held is one block per file::

    add(rows) --(buffer >= run_rows: stable lexsort by keys, write)--> run 0, run 1, ...
    merged()  --(k-way merge: per round, every run's rows up to the smallest "last key" of the loaded
                 blocks, lexsorted together)--> chunks in key order

Keys must end with a column that is unique across runs (the event's row id) so the merged order is total
and equal to one stable sort of all rows.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

RUN_ROWS = 1 << 20  # rows sorted in memory at a time (x record size: ~50-100 MB per run buffer)
BLOCK_ROWS = 1 << 16  # rows read from each run per merge refill


def _dtype(columns: Sequence[str]) -> np.dtype:
    return np.dtype([(c, np.int64) for c in columns])


class RowFile:
    """Rows of fixed int64 columns appended to one file, read back in order a block at a time."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.columns = tuple(columns)
        self.dtype = _dtype(self.columns)
        self.rows = 0
        self._fh = open(self.path, "wb")  # noqa: SIM115 -- closed by close()

    def add(self, cols: dict[str, np.ndarray]) -> None:
        rec = _records(cols, self.columns, self.dtype)
        rec.tofile(self._fh)
        self.rows += len(rec)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def blocks(self, rows: int = RUN_ROWS) -> Iterator[dict[str, np.ndarray]]:
        """The rows in the order they were added, ``rows`` at a time, as column arrays."""
        self.close()
        return read_blocks(self.path, self.columns, rows)


def read_blocks(
    path: str | os.PathLike[str], columns: Sequence[str], rows: int = RUN_ROWS
) -> Iterator[dict[str, np.ndarray]]:
    """The rows of a closed :class:`RowFile` (its ``path`` and ``columns``), ``rows`` at a time, as column arrays:
    what a process that did not write the file (a pool worker's, pickled by path) reads it with."""
    dtype = _dtype(columns)
    with open(path, "rb") as fh:
        while True:
            rec = np.fromfile(fh, dtype=dtype, count=rows)
            if len(rec) == 0:
                return
            yield _columns(rec, columns)


class SortedRuns:
    """Rows buffered in memory, written as sorted runs, merged back in ``keys`` order (see the module doc)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        columns: Sequence[str],
        keys: Sequence[str],
        run_rows: int = RUN_ROWS,
    ) -> None:
        assert set(keys) <= set(columns), (keys, columns)
        self.dir = Path(directory)
        self.columns, self.keys = tuple(columns), tuple(keys)
        self.dtype = _dtype(self.columns)
        self.run_rows = run_rows
        self.rows = 0
        self._buf: list[np.ndarray] = []
        self._buffered = 0
        self._runs: list[tuple[Path, int]] = []

    def add(self, cols: dict[str, np.ndarray]) -> None:
        rec = _records(cols, self.columns, self.dtype)
        n = len(rec)
        if n == 0:
            return
        self._buf.append(rec)
        self._buffered += n
        self.rows += n
        if self._buffered >= self.run_rows:
            self._flush()

    def _sorted_buffer(self) -> np.ndarray:
        rec = np.concatenate(self._buf) if len(self._buf) != 1 else self._buf[0]
        self._buf, self._buffered = [], 0
        return rec[_order(rec, self.keys)]

    def _flush(self) -> None:
        rec = self._sorted_buffer()
        fd, name = tempfile.mkstemp(prefix="run-", suffix=".bin", dir=self.dir)
        with os.fdopen(fd, "wb") as fh:
            rec.tofile(fh)
        self._runs.append((Path(name), len(rec)))

    def merged(self, chunk_rows: int = BLOCK_ROWS) -> Iterator[dict[str, np.ndarray]]:
        """Every row in key order, as column arrays of about ``chunk_rows`` (or fewer) rows each (may be
        called again: the runs stay until :meth:`close`)."""
        if not self._runs:  # everything fits one buffer: no disk (kept sorted: merged() may run again)
            rec = self._sorted_buffer() if self._buf else np.zeros(0, self.dtype)
            self._buf, self._buffered = ([rec], len(rec)) if len(rec) else ([], 0)
            for a in range(0, len(rec), max(chunk_rows, 1)):
                yield _columns(rec[a : a + chunk_rows], self.columns)
            return
        if self._buf:
            self._flush()
        yield from _merge([p for p, _ in self._runs], self.dtype, self.keys, self.columns, chunk_rows)

    def close(self) -> None:
        for p, _ in self._runs:
            p.unlink(missing_ok=True)
        self._runs = []
        self._buf = []


def _records(cols: dict[str, np.ndarray], columns: Sequence[str], dtype: np.dtype) -> np.ndarray:
    rec = np.empty(len(cols[columns[0]]), dtype)
    for c in columns:
        rec[c] = cols[c]
    return rec


def _order(rec: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """Stable sort order of ``rec`` by ``keys``. The last key (the unique row id) is only a tie-breaker, and
    rows arrive in its order (in a buffer, and run after run in a merge), so a stable sort by the others
    gives the same order; a key that is constant in ``rec`` is skipped (one process: one sort by time)."""
    cols = [np.ascontiguousarray(rec[k]) for k in keys[:-1]]
    cols = [c for c in cols if len(c) and c.min() != c.max()]
    if not cols:
        return np.arange(len(rec))
    if len(cols) == 1:
        return np.argsort(cols[0], kind="stable")
    return np.lexsort(cols[::-1])


def _columns(rec: np.ndarray, columns: Sequence[str]) -> dict[str, np.ndarray]:
    return {c: np.ascontiguousarray(rec[c]) for c in columns}


def _not_after(rec: np.ndarray, keys: Sequence[str], bound: np.void) -> int:
    """How many leading rows of ``rec`` (sorted by ``keys``) have a key <= ``bound`` (lexicographic)."""
    le = np.zeros(len(rec), bool)
    eq = np.ones(len(rec), bool)
    for k in keys:
        col, b = rec[k], bound[k]
        le |= eq & (col < b)
        eq &= col == b
    le |= eq
    return int(np.count_nonzero(le))  # sorted: the rows <= bound are a prefix


def _merge(
    paths: list[Path], dtype: np.dtype, keys: Sequence[str], columns: Sequence[str], chunk_rows: int
) -> Iterator[dict[str, np.ndarray]]:
    files = [open(p, "rb") for p in paths]  # noqa: SIM115 -- closed below
    try:
        block_rows = max(chunk_rows // max(len(files), 1), 1024)
        blocks = [np.fromfile(f, dtype=dtype, count=block_rows) for f in files]
        while True:
            live = [i for i, b in enumerate(blocks) if len(b)]
            if not live:
                return
            lasts = np.array([blocks[i][-1] for i in live], dtype=dtype)
            # the smallest last key (row id included: keys are unique): no run holds an earlier row unread
            bound = lasts[np.lexsort([lasts[k] for k in reversed(keys)])[0]]
            parts = []
            for i in live:
                k = _not_after(blocks[i], keys, bound)
                if k:
                    parts.append(blocks[i][:k])
                    blocks[i] = blocks[i][k:]
                if len(blocks[i]) == 0:
                    blocks[i] = np.fromfile(files[i], dtype=dtype, count=block_rows)
            rec = np.concatenate(parts)  # parts in run order = row-id order: a stable sort keeps ties right
            yield _columns(rec[_order(rec, keys)], columns)
    finally:
        for f in files:
            f.close()
