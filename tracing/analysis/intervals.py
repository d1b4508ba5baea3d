"""Disjoint sorted intervals (a device's busy blocks, its host stalls) in memory or on disk, and the measure of
their union inside many windows, read a block at a time.

A streamed trace's device timelines have about one busy block and one stall per kernel on a launch-bound run
(32 bytes each): held in memory they were most of what still grew with a multi-GB trace. Here they are
appended to a spill file as they are found (:class:`IntervalSink`), and every consumer reads them back in start
order, a block at a time::

    timelines of one process / one device --(merged_by_start: k-way, by start)--> one start-ordered stream
      --(Covered: running union, C(t) = |union ∩ (-inf, t)| at non-decreasing t)--> C(hi) - C(lo) per window

C is the int64 sum of the whole union blocks before t plus the part of the block t falls in, the same numbers
as on the union held at once (tests/unit/test_intervals.py); what is held is one block per stream,
the union blocks that a later query can still cut, and the queries.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tracing.ingest.spill import RowFile, read_blocks

BLOCK_ROWS = 1 << 16  # intervals read per block, queries answered per call
_COLUMNS = ("start", "end")
_EMPTY = np.zeros(0, np.int64)

Pairs = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Intervals:
    """Disjoint [start, end) intervals in start order: two arrays, or a spill file of int64 pairs (``path``)."""

    start: np.ndarray = field(default_factory=lambda: _EMPTY)
    end: np.ndarray = field(default_factory=lambda: _EMPTY)
    path: str | None = None
    count: int = 0

    @classmethod
    def of(cls, start: np.ndarray, end: np.ndarray) -> Intervals:
        return cls(np.asarray(start, np.int64), np.asarray(end, np.int64), None, len(start))

    def __len__(self) -> int:
        return self.count

    def blocks(self, rows: int = BLOCK_ROWS) -> Iterator[Pairs]:
        """The intervals in order, ``rows`` at a time."""
        if self.path is None:
            for a in range(0, self.count, rows):
                yield self.start[a : a + rows], self.end[a : a + rows]
            return
        for c in read_blocks(self.path, _COLUMNS, rows):
            yield c["start"], c["end"]

    def arrays(self) -> Pairs:
        """All of them in memory (the annotated trace, the dashboard's timeline: one window of a small trace)."""
        if self.path is None:
            return self.start, self.end
        parts = list(self.blocks(1 << 20))
        if not parts:
            return _EMPTY, _EMPTY
        return np.concatenate([s for s, _ in parts]), np.concatenate([e for _, e in parts])

    def loaded(self) -> Intervals:
        """The same intervals held in memory (for a caller that removes the spill folder)."""
        return self if self.path is None else Intervals.of(*self.arrays())


class IntervalSink:
    """Intervals appended in start order, a window at a time: held in memory, or written to ``path``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._file = RowFile(path, _COLUMNS) if path is not None else None
        self._starts: list[np.ndarray] = []
        self._ends: list[np.ndarray] = []
        self.count = 0

    def add(self, start: np.ndarray, end: np.ndarray) -> None:
        if len(start) == 0:
            return
        self.count += len(start)
        if self._file is not None:
            self._file.add({"start": start, "end": end})
        else:
            self._starts.append(np.asarray(start, np.int64))
            self._ends.append(np.asarray(end, np.int64))

    def done(self) -> Intervals:
        if self._file is not None:
            self._file.close()
            return Intervals(_EMPTY, _EMPTY, str(self._file.path), self.count)
        if not self._starts:
            return Intervals()
        return Intervals.of(np.concatenate(self._starts), np.concatenate(self._ends))

    def close(self) -> None:
        """Give up (an interrupted ingest): the file is closed and removed."""
        if self._file is not None:
            self._file.close()
            Path(self._file.path).unlink(missing_ok=True)


def merged_by_start(streams: Sequence[Iterable[Pairs]]) -> Iterator[Pairs]:
    """The intervals of several start-ordered streams in one start order (equal starts in any order), a block
    at a time: each round takes every stream's intervals up to the smallest last start of the held blocks."""
    if len(streams) == 1:
        yield from streams[0]
        return
    its = [iter(s) for s in streams]
    held: list[Pairs | None] = [_next(it) for it in its]
    while True:
        live = [i for i, h in enumerate(held) if h is not None]
        if not live:
            return
        bound = min(int(held[i][0][-1]) for i in live)  # type: ignore[index]
        starts, ends = [], []
        for i in live:
            s, e = held[i]  # type: ignore[misc]
            k = int(np.searchsorted(s, bound, side="right"))
            starts.append(s[:k])
            ends.append(e[:k])
            held[i] = (s[k:], e[k:]) if k < len(s) else _next(its[i])
        s, e = np.concatenate(starts), np.concatenate(ends)
        order = np.argsort(s, kind="stable")
        yield s[order], e[order]


def _next(it: Iterator[Pairs]) -> Pairs | None:
    """The next non-empty block of ``it`` (None at its end)."""
    for s, e in it:
        if len(s):
            return s, e
    return None


class Covered:
    """C(t) = |union of the intervals ∩ (-inf, t)|, for queries that never go back in time, over intervals
    (overlapping or not) read in start order a block at a time."""

    def __init__(self, blocks: Iterable[Pairs]) -> None:
        self._it = iter(blocks)
        self._done = False
        # start of the last interval read: later ones start at or after it
        self._last = np.iinfo(np.int64).min
        self._bs, self._be = _EMPTY, _EMPTY  # union blocks a query may still cut (the last may still grow)
        self._folded = 0  # the measure of the blocks before them (every query from now on covers them whole)

    def at(self, t: np.ndarray) -> np.ndarray:
        """C at each of ``t`` (non-decreasing, none before an earlier call's)."""
        t = np.asarray(t, np.int64)
        out = np.empty(len(t), np.int64)
        i = 0
        while i < len(t):
            if not self._done and t[i] > self._last:  # an unread interval may start before t[i]
                self._fold(int(t[i]))
                self._read()
                continue
            j = len(t) if self._done else int(np.searchsorted(t, self._last, side="right"))
            q = t[i:j]
            bs, be = self._bs, self._be
            cum = np.concatenate([[0], np.cumsum(be - bs)])
            k = np.searchsorted(bs, q, side="right")  # blocks starting at or before q
            kk = np.maximum(k - 1, 0)
            if len(bs):
                partial = np.where(k > 0, np.clip(np.minimum(q, be[kk]) - bs[kk], 0, None), 0)
                out[i:j] = self._folded + cum[kk] * (k > 0) + partial
            else:
                out[i:j] = self._folded
            self._fold(int(q[-1]))
            i = j
        return out

    def _fold(self, t: int) -> None:
        """Count whole the blocks (but the last, which may grow) that end at or before t: no later query cuts them."""
        f = int(np.searchsorted(self._be[:-1], t, side="right"))
        if f:
            self._folded += int((self._be[:f] - self._bs[:f]).sum())
            self._bs, self._be = self._bs[f:], self._be[f:]

    def _read(self) -> None:
        nxt = _next(self._it)
        if nxt is None:
            self._done = True
            return
        s, e = nxt
        self._last = int(s[-1])
        s = np.concatenate([self._bs[-1:], s])  # the open block first: it starts before every new interval
        e = np.concatenate([self._be[-1:], e])
        run = np.maximum.accumulate(e)
        new = np.ones(len(s), bool)
        new[1:] = s[1:] > run[:-1]  # touching intervals join (the measure is the same)
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, len(s) - 1)
        self._bs = np.concatenate([self._bs[:-1], s[first]])
        self._be = np.concatenate([self._be[:-1], run[last]])


def clipped(streams: Sequence[Iterable[Pairs]], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|union of the streams' intervals ∩ [lo_i, hi_i]| per window i (0 where hi_i <= lo_i), reading the
    intervals once in start order."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    n = len(lo)
    if n == 0 or not streams:
        return np.zeros(n, np.int64)
    points = np.concatenate([lo, hi])
    order = np.argsort(points, kind="stable")
    cov = Covered(merged_by_start(streams))
    c = np.empty(2 * n, np.int64)
    for a in range(0, 2 * n, BLOCK_ROWS):
        idx = order[a : a + BLOCK_ROWS]
        c[idx] = cov.at(points[idx])
    return np.clip(c[n:] - c[:n], 0, None)


def shifted(blocks: Iterable[Pairs], offset: int) -> Iterator[Pairs]:
    """The intervals moved by ``offset`` ns (onto another file's clock)."""
    for s, e in blocks:
        yield s + offset, e + offset
