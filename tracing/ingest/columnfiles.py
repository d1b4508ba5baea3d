"""Rows written once in (group, key) order, one flat file per column, read back by row range.

What micro-batch detection reads of a streamed trace (its host items and GPU launches, per process in start
order) goes here instead of memory: a cut reads the rows of one process whose start lies in a time window,
so what is held is the window's rows (or one block of them), not the trace. Reads are plain ``pread`` calls
(no ``mmap``: mapped pages would count in the process's resident memory). Finding a window's rows reads a
sparse index (every ``every``-th key, 8 bytes per ``every`` rows) and at most ``every`` keys from disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

EVERY = 1 << 10  # rows per sparse index entry


class ColumnFiles:
    """Rows appended in (``group``, ``key``) order (sorted chunks, each continuing the last), one file per
    column in ``dtypes``; then :meth:`find` / :meth:`read` / :meth:`blocks` by row range."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        dtypes: dict[str, np.dtype],
        group: str,
        key: str,
        every: int = EVERY,
    ) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dtypes = {c: np.dtype(t) for c, t in dtypes.items()}
        self.group, self.key, self.every = group, key, every or EVERY
        self.rows = 0
        self.groups: dict[int, tuple[int, int]] = {}  # group value -> its rows [a, b)
        self._last: int | None = None
        self._sparse_parts: list[np.ndarray] = []
        self._sparse = np.zeros(0, np.int64)
        self._out = {c: open(self._path(c), "wb") for c in self.dtypes}  # noqa: SIM115 -- closed by finish()
        self._fds: dict[str, int] = {}

    def _path(self, column: str) -> Path:
        return self.folder / f"{column}.bin"

    def append(self, chunk: dict[str, np.ndarray]) -> None:
        """Rows sorted by (group, key) that continue the rows appended so far; columns beyond ``dtypes`` are
        ignored (the group column is kept only when it is one of them)."""
        n = len(chunk[self.key])
        if n == 0:
            return
        group = np.asarray(chunk[self.group])
        edges = np.flatnonzero(np.diff(group)) + 1
        for a, b in zip([0, *edges.tolist()], [*edges.tolist(), n], strict=True):
            g = int(group[a])
            if g == self._last:
                self.groups[g] = (self.groups[g][0], self.rows + b)
            elif g in self.groups:
                raise ValueError(f"{self.folder}: rows of group {g} appended after another group's")
            else:
                self.groups[g] = (self.rows + a, self.rows + b)
                self._last = g
        # a copy: a view of every EVERY-th key would keep the chunk's whole key column alive (8 bytes a row)
        self._sparse_parts.append(
            np.array(chunk[self.key][(-self.rows) % self.every :: self.every], np.int64)
        )
        for c, t in self.dtypes.items():
            np.asarray(chunk[c]).astype(t, copy=False).tofile(self._out[c])
        self.rows += n

    def finish(self) -> ColumnFiles:
        """Done appending: the files are closed for writing and opened for reading."""
        for c, fh in self._out.items():
            fh.close()
            self._fds[c] = os.open(self._path(c), os.O_RDONLY)
        self._out = {}
        self._sparse = np.concatenate([np.zeros(0, np.int64), *self._sparse_parts])
        self._sparse_parts = []
        return self

    def find(self, group: int, lo: int, hi: int) -> slice:
        """The rows of ``group`` whose key lies in [lo, hi] (in row order)."""
        a, b = self.groups.get(group, (0, 0))
        i = self._bound(a, b, lo, "left")
        return slice(i, max(i, self._bound(a, b, hi, "right")))

    def _bound(self, a: int, b: int, x: int, side: str) -> int:
        """Where ``x`` goes among the keys of rows [a, b) (numpy's searchsorted ``side``)."""
        if b <= a:
            return a
        e = self.every
        ka, kb = -(-a // e), -(-b // e)  # the sparse entries of rows a .. b-1
        j = int(np.searchsorted(self._sparse[ka:kb], x, side=side))  # type: ignore[call-overload]
        lo = a if j == 0 else (ka + j - 1) * e + 1
        hi = b if ka + j >= kb else (ka + j) * e
        keys = self.read(slice(lo, hi), (self.key,))[self.key]
        return lo + int(np.searchsorted(keys, x, side=side))  # type: ignore[call-overload]

    def read(self, rows: slice, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
        """``columns`` of ``rows`` (a slice with a step of one), read from disk."""
        n = max(0, rows.stop - rows.start)
        out = {}
        for c in columns:
            t = self.dtypes[c]
            buf = os.pread(self._fds[c], n * t.itemsize, rows.start * t.itemsize)
            if len(buf) != n * t.itemsize:
                raise OSError(f"{self._path(c)}: short read ({len(buf)} of {n * t.itemsize} bytes)")
            out[c] = np.frombuffer(buf, t)
        return out

    def blocks(self, rows: slice, columns: tuple[str, ...], size: int) -> Iterator[dict[str, np.ndarray]]:
        """``columns`` of ``rows``, ``size`` rows at a time."""
        for a in range(rows.start, rows.stop, size):
            yield self.read(slice(a, min(a + size, rows.stop)), columns)

    def close(self) -> None:
        """Close and remove the files."""
        for fh in self._out.values():
            fh.close()
        for fd in self._fds.values():
            os.close(fd)
        self._out, self._fds = {}, {}
        for c in self.dtypes:
            self._path(c).unlink(missing_ok=True)
