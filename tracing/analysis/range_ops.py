"""Per range, the GPU ops launched in it (each rule of ``attribution.RULES``), a window of ops at a time, with
counters held only for the ranges an op still to come may have been launched in.

The ops arrive in (start, row) order (``tracing.analysis.opwindows``); each was launched at most ``lag`` before
its start (``opjoin.Joined.max_lag``), so once a chunk whose latest start is t has been added, every op still to
come was launched at t - lag or later, and a range that ended before that is done. The ranges (in table order,
start ascending) are read a slab at a time (:data:`SLAB_ROWS` ranges, from a range file or held columns) and
admitted when some op's launch start reaches the slab's first start::

    slab k: its ranges that end before slab k + 1's first start ("short")  -> one set of counters per rule,
            retired (to a row file, in table order) once t - lag passes the latest of their ends
            the others ("long": open across the boundary, as many as are open at one instant)
                                                                           -> one shared set, retired one by one

Short slabs retire in table order (a slab's short ranges all end before the next slab's first start), so the
row file is in table order; the long ranges' counters are held until :meth:`RangeOps.finish` and merged back
by index (:class:`Counters`). What is held: the live slabs (as many as the lag spans), the long set and one
chunk. Without a lag (:meth:`RangeOps.set_lag` not called) nothing retires before :meth:`RangeOps.finish`.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracing.analysis import attribution
from tracing.ingest.spill import RowFile, read_blocks
from tracing.outputs import schema

SLAB_ROWS = 1 << 16  # ranges admitted at a time
_READ_ROWS = 1 << 16  # counter rows read back at a time
_MIN, _MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
_FIELDS = ("ops", "busy", "first", "last")
COLUMNS = ("idx", *(f"{prefix}_{f}" for prefix, _, _ in attribution.RULES for f in _FIELDS))

# per rule: (count, busy, first op start, last op end), 0 where a range has no op
Partial = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass
class _Sorted:
    """One chunk's launched ops in (group, launch start, row) order, for one rule's op keys."""

    ls: np.ndarray
    start: np.ndarray
    end: np.ndarray
    groups: dict[tuple[int, ...], tuple[int, int]]  # group key -> [g0, g1) of the order

    @classmethod
    def of(cls, c: dict[str, np.ndarray], op_keys: tuple[str, ...]) -> _Sorted | None:
        ls = c["launch_start_ns"]
        launched = np.flatnonzero(ls != schema.NO_ID)
        if len(launched) == 0:
            return None
        keys = [c[k][launched] for k in op_keys]
        order = launched[np.lexsort((ls[launched], *reversed(keys)))]  # by (group, launch start, row)
        keys = [c[k][order] for k in op_keys]
        new = np.zeros(len(order), bool)
        new[0] = True
        for k in keys:
            new[1:] |= k[1:] != k[:-1]
        bounds = np.append(np.flatnonzero(new), len(order)).tolist()
        groups = {tuple(int(k[g0]) for k in keys): (g0, g1) for g0, g1 in itertools.pairwise(bounds)}
        return cls(ls[order], c["start_ns"][order], c["end_ns"][order], groups)


class _Rule:
    """Per range of a set, the ops launched in it under one rule, window after window (carry: each range's
    running max op end, which continues its busy union)."""

    def __init__(self, range_keys: list[np.ndarray], start: np.ndarray, end: np.ndarray) -> None:
        self.start, self.end = start, end
        n = len(start)
        self.n_ops = np.zeros(n, np.int64)
        self.busy = np.zeros(n, np.int64)
        self.first = np.full(n, _MAX, np.int64)
        self.last = np.full(n, _MIN, np.int64)  # also each range's carried running max end
        self.groups: dict[tuple[int, ...], np.ndarray] = {}
        if n:
            keys = np.stack([np.asarray(k, np.int64) for k in range_keys], axis=1)
            uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
            by_group = np.argsort(inverse.ravel(), kind="stable")
            cuts = np.searchsorted(inverse.ravel()[by_group], np.arange(len(uniq) + 1))
            for g, key in enumerate(uniq.tolist()):
                self.groups[tuple(key)] = by_group[cuts[g] : cuts[g + 1]]

    def add(self, s: _Sorted) -> None:
        los, his, rows = [], [], []
        for key, mine in self.groups.items():
            bounds = s.groups.get(key)
            if bounds is None:
                continue
            g0, g1 = bounds
            lo = g0 + np.searchsorted(s.ls[g0:g1], self.start[mine], side="left")
            hi = g0 + np.searchsorted(s.ls[g0:g1], self.end[mine], side="right")
            hit = hi > lo
            los.append(lo[hit])
            his.append(hi[hit])
            rows.append(mine[hit])
        if not rows:
            return
        lo, hi, r = np.concatenate(los), np.concatenate(his), np.concatenate(rows)
        if len(r) == 0:
            return
        self.busy[r] += attribution._slice_measures(s.start, s.end, lo, hi, self.last[r])
        self.n_ops[r] += hi - lo
        self.first[r] = np.minimum(self.first[r], attribution._slice_reduce(np.minimum, s.start, lo, hi))
        self.last[r] = np.maximum(self.last[r], attribution._slice_reduce(np.maximum, s.end, lo, hi))

    def raw(self, keep: np.ndarray) -> tuple[np.ndarray, ...]:
        """The counters of ranges ``keep`` as they carry (sentinels where no op yet)."""
        return self.n_ops[keep], self.busy[keep], self.first[keep], self.last[keep]

    def resume(self, raw: tuple[np.ndarray, ...], at: slice) -> None:
        """Continue ranges ``at`` from counters taken with :meth:`raw`."""
        self.n_ops[at], self.busy[at], self.first[at], self.last[at] = raw

    def result(self) -> Partial:
        some = self.n_ops > 0
        return self.n_ops, self.busy, np.where(some, self.first, 0), np.where(some, self.last, 0)


class _Set:
    """Ranges (global indices ``idx``; ``cols``: their pid, tid, start_ns and end_ns) with one :class:`_Rule` per
    rule."""

    def __init__(self, cols: dict[str, np.ndarray], idx: np.ndarray) -> None:
        self.idx, self.cols = idx, cols
        self.start, self.end = cols["start_ns"], cols["end_ns"]
        self.first_start = int(self.start.min()) if len(idx) else _MAX
        self.last_end = int(self.end.max()) if len(idx) else _MIN
        self.rules = {
            prefix: _Rule([cols[k] for k in range_keys], self.start, self.end)
            for prefix, _, range_keys in attribution.RULES
        }

    @classmethod
    def empty(cls) -> _Set:
        return cls({k: np.zeros(0, np.int64) for k in RANGE_COLUMNS}, np.zeros(0, np.int64))

    def add(self, sorted_by: dict[str, _Sorted | None], lo: int, hi: int) -> None:
        """Ops whose launch starts span [lo, hi] (a set none of whose ranges meets it is skipped)."""
        if hi < self.first_start or lo > self.last_end:  # (an empty set: first start > any hi)
            return
        for prefix, rule in self.rules.items():
            s = sorted_by[prefix]
            if s is not None:
                rule.add(s)

    def rows(self, keep: np.ndarray | slice = slice(None)) -> dict[str, np.ndarray]:
        """The counters of ranges ``keep`` as rows of :data:`COLUMNS` (0 where a range has no op)."""
        out = {"idx": self.idx[keep]}
        for prefix, rule in self.rules.items():
            for f, col in zip(_FIELDS, rule.result(), strict=True):
                out[f"{prefix}_{f}"] = col[keep]
        return out


RANGE_COLUMNS = ("pid", "tid", "start_ns", "end_ns")  # what a slab of ranges has


def held_slabs(ranges: dict[str, Any], rows: int = SLAB_ROWS) -> Iterator[dict[str, np.ndarray]]:
    """Held range columns (:data:`RANGE_COLUMNS`, table order) as slabs of ``rows`` ranges."""
    n = len(ranges["start_ns"])
    for a in range(0, n, rows):
        yield {k: np.asarray(ranges[k][a : a + rows], np.int64) for k in RANGE_COLUMNS}


class RangeOps:
    """Feed :meth:`add` the ops chunks of ``opwindows.OpWindows`` (with ``end_ns``); :meth:`finish` gives the
    :class:`Counters`. ``slabs``: the ranges in table order (start ascending), a slab of :data:`RANGE_COLUMNS`
    at a time (:func:`held_slabs`, ``range_file.RangeFile.slabs``), read one slab ahead of the last admitted.
    The short slabs' counters go to a file in ``spill_dir`` (removed by ``Counters.close``)."""

    def __init__(self, slabs: Iterator[dict[str, np.ndarray]], spill_dir: str | Path) -> None:
        self.slabs = (s for s in slabs if len(s["start_ns"]))
        self.next = next(
            self.slabs, None
        )  # the slab to admit next (its first start is the boundary of the last)
        self.n = 0  # ranges admitted
        self.lag: int | None = None
        self.live: deque[_Set] = deque()
        self.long = _Set.empty()
        self.long_done: list[dict[str, np.ndarray]] = []
        self.most_live = 0  # the most ranges held at once (short and long), for tests and benchmarks
        fd, name = tempfile.mkstemp(prefix="range-ops-", suffix=".bin", dir=spill_dir)
        os.close(fd)
        self.out = RowFile(name, COLUMNS)

    def set_lag(self, lag: int | None) -> None:
        """Every op to be added starts at most ``lag`` after its launch (None: no op has a launch)."""
        self.lag = lag

    def add(self, c: dict[str, np.ndarray]) -> None:
        ls = c["launch_start_ns"]
        launched = ls[ls != schema.NO_ID]
        if len(launched):
            lo, hi = int(launched.min()), int(launched.max())
            self._admit(hi)
            sorted_by = {prefix: _Sorted.of(c, op_keys) for prefix, op_keys, _ in attribution.RULES}
            for s in (*self.live, self.long):
                s.add(sorted_by, lo, hi)
        if self.lag is not None and len(c["start_ns"]):
            self._retire(int(c["start_ns"].max()) - self.lag)

    def _admit(self, upto: int) -> None:
        """Admit every slab whose first range starts at or before ``upto``."""
        changed = False
        while self.next is not None and self.next["start_ns"][0] <= upto:
            slab = self.next
            self.next = next(self.slabs, None)
            boundary = int(self.next["start_ns"][0]) if self.next is not None else _MAX
            idx = np.arange(self.n, self.n + len(slab["start_ns"]), dtype=np.int64)
            self.n += len(idx)
            short = slab["end_ns"] < boundary
            self.live.append(_Set({k: v[short] for k, v in slab.items()}, idx[short]))
            if not short.all():
                self._regroup(
                    np.ones(len(self.long.idx), bool), {k: v[~short] for k, v in slab.items()}, idx[~short]
                )
                changed = True
        if changed or self.live:
            held = sum(len(s.idx) for s in self.live) + len(self.long.idx)
            self.most_live = max(self.most_live, held)

    def _regroup(self, keep: np.ndarray, cols: dict[str, np.ndarray], idx: np.ndarray) -> None:
        """The long set as its ranges ``keep`` (a mask; counters carried) plus new ranges (``cols``, ``idx``)."""
        carried = {prefix: rule.raw(keep) for prefix, rule in self.long.rules.items()}
        merged = {k: np.concatenate([v[keep], cols[k]]) for k, v in self.long.cols.items()}
        self.long = _Set(merged, np.concatenate([self.long.idx[keep], idx]))
        for prefix, raw in carried.items():
            self.long.rules[prefix].resume(raw, slice(0, int(keep.sum())))

    def _retire(self, horizon: int) -> None:
        """Retire what ended before ``horizon`` (no op still to come was launched before it)."""
        while self.live and self.live[0].last_end < horizon:
            s = self.live.popleft()
            if len(s.idx):
                self.out.add(s.rows())
        done = self.long.end < horizon
        if done.any():
            self.long_done.append(self.long.rows(done))
            self._regroup(~done, _Set.empty().cols, np.zeros(0, np.int64))

    def finish(self) -> Counters:
        """Every range's counters (all admitted and retired), read back by :class:`Counters`. No op is to come:
        what is live retires now, and the ranges not yet admitted a slab at a time (not all at once)."""
        self._retire(_MAX)
        while self.next is not None:
            self._admit(int(self.next["start_ns"][0]))
            self._retire(_MAX)
        self.long_done.append(self.long.rows())
        self.out.close()
        done = {c: np.concatenate([d[c] for d in self.long_done]) for c in COLUMNS}
        order = np.argsort(done["idx"], kind="stable")
        self.long_done = []
        return Counters(self.out.path, {c: v[order] for c, v in done.items()}, self.n, self.out.rows)

    def close(self) -> None:
        """Give up: the counter file is removed."""
        self.out.close()
        self.out.path.unlink(missing_ok=True)


class Counters:
    """Per range in table order, per rule: (ops, busy, first start, last end), 0 where none -- from the row file
    of the short slabs (in table order) merged with the long ranges' rows (held, sorted by index)."""

    def __init__(self, path: Path, long: dict[str, np.ndarray], n: int, short_rows: int) -> None:
        assert short_rows + len(long["idx"]) == n, (short_rows, len(long["idx"]), n)
        self.path, self.long, self.n = path, long, n

    @property
    def spill_dir(self) -> Path:
        return self.path.parent

    def parts(self, rows: int) -> Iterator[tuple[int, dict[str, Partial]]]:
        """(first index, counters) of ranges [a, a + rows), a = 0, rows, ..."""
        blocks = read_blocks(self.path, COLUMNS, _READ_ROWS)
        carry: dict[str, np.ndarray] | None = None
        long_idx = self.long["idx"]
        for a in range(0, self.n, max(rows, 1)):
            b = min(a + rows, self.n)
            cols = {c: np.zeros(b - a, np.int64) for c in COLUMNS[1:]}
            while True:  # the short rows of [a, b): from the carry, then blocks until one passes b
                if carry is None:
                    carry = next(blocks, None)
                    if carry is None:
                        break
                k = int(np.searchsorted(carry["idx"], b))
                at = carry["idx"][:k] - a
                for c in COLUMNS[1:]:
                    cols[c][at] = carry[c][:k]
                carry = {c: v[k:] for c, v in carry.items()} if k < len(carry["idx"]) else None
                if carry is not None:
                    break
            i, j = np.searchsorted(long_idx, [a, b])
            at = long_idx[i:j] - a
            for c in COLUMNS[1:]:
                cols[c][at] = self.long[c][i:j]
            yield (
                a,
                {
                    prefix: tuple(cols[f"{prefix}_{f}"] for f in _FIELDS)  # type: ignore[misc]
                    for prefix, _, _ in attribution.RULES
                },
            )

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
