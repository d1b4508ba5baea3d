"""Each range's device busy and host stall before its window end, for millions of ranges without an array
over them all: the window ends sorted on disk, read in that order, the results sorted back to table order.

What ``attribution._Clipped`` holds for every range at once (its window end, C(end) for busy and stall, an
argsort: ~40 bytes a range) goes through two sorted spills instead::

    (window end, range, pid) blocks in table order --sorted runs--> window-end order
      --> per process, C(end) = |union ∩ (-inf, end)| (``intervals.Covered``: queries never go back in time)
      --> (range, C_busy(end), C_stall(end)) --sorted runs--> table order, read a part at a time

Each window's time is then C(end) - C(start), C at the starts taken part by part (a process's starts never go
back in table order), as ``attribution._Clipped`` gives it: the same numbers (tests/unit/test_clipped_spill.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from tracing.analysis import intervals, metrics
from tracing.ingest.spill import SortedRuns

RUN_ROWS = 1 << 16  # rows sorted in memory at a time (4 int64 columns: 2 MB)


Readers = tuple[intervals.Covered, intervals.Covered]  # C(t) of a process's device busy union and host stall


def covered(timelines: list[metrics.DeviceTimeline], pid: int) -> Readers | None:
    """Fresh C(t) readers over process ``pid``'s devices (the union of their timelines); None: it has none."""
    mine = [t for t in timelines if t.pid == pid]
    if not mine:
        return None
    return (
        intervals.Covered(intervals.merged_by_start([t.busy.blocks() for t in mine])),
        intervals.Covered(intervals.merged_by_start([t.stall.blocks() for t in mine])),
    )


def minus_starts(
    busy_hi: np.ndarray,
    stall_hi: np.ndarray,
    pid: np.ndarray,
    lo: np.ndarray,
    readers: Callable[[int], Readers | None],
) -> tuple[np.ndarray, np.ndarray]:
    """Busy and stall inside each window: C(end) (``busy_hi``, ``stall_hi``) - C(start), clipped at 0, C at the
    starts from each process's readers (a process's starts never go back across calls), a block at a time."""
    busy = np.zeros(len(pid), np.int64)
    stall = np.zeros(len(pid), np.int64)
    for p in np.unique(pid).tolist():
        cov = readers(p)
        if cov is None:
            continue
        idx = np.flatnonzero(pid == p)
        for a in range(0, len(idx), intervals.BLOCK_ROWS):
            k = idx[a : a + intervals.BLOCK_ROWS]
            busy[k] = np.clip(busy_hi[k] - cov[0].at(lo[k]), 0, None)
            stall[k] = np.clip(stall_hi[k] - cov[1].at(lo[k]), 0, None)
    return busy, stall


class SpilledClipped:
    """``attribution._Clipped`` with the per-range arrays on disk (``spill_dir``). ``ends``: (pid, window end)
    blocks of the ranges in table order; then :meth:`part` for consecutive parts; :meth:`close` at the end."""

    def __init__(
        self,
        ends: Iterable[tuple[np.ndarray, np.ndarray]],
        timelines: list[metrics.DeviceTimeline],
        spill_dir: str | Path,
        run_rows: int = RUN_ROWS,
    ) -> None:
        self._timelines = timelines
        by_end = SortedRuns(spill_dir, ("hi", "idx", "pid"), ("hi", "idx"), run_rows)
        # idx comes in window-end order here: named twice, it is sorted on, not only a tie-breaker (spill._order)
        self._hi = SortedRuns(spill_dir, ("idx", "busy", "stall"), ("idx", "idx"), run_rows)
        try:
            a = 0
            for pid, hi in ends:
                n = len(pid)
                by_end.add({"hi": hi, "idx": np.arange(a, a + n, dtype=np.int64), "pid": pid})
                a += n
            self.n = a
            at_end: dict[int, Readers | None] = {}
            for c in by_end.merged(run_rows):  # every range in window-end order
                busy = np.zeros(len(c["idx"]), np.int64)
                stall = np.zeros(len(c["idx"]), np.int64)
                for p in np.unique(c["pid"]).tolist():
                    if p not in at_end:
                        at_end[p] = covered(timelines, p)
                    cov = at_end[p]
                    if cov is not None:
                        k = np.flatnonzero(c["pid"] == p)
                        busy[k], stall[k] = cov[0].at(c["hi"][k]), cov[1].at(c["hi"][k])
                self._hi.add({"idx": c["idx"], "busy": busy, "stall": stall})
        except BaseException:
            self._hi.close()
            raise
        finally:
            by_end.close()
        self._lo: dict[int, Readers | None] = {}
        self._parts = self._hi.merged(run_rows)
        self._carry: dict[str, np.ndarray] | None = None

    def _next_rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """C_busy and C_stall at the window ends of the next ``n`` ranges in table order."""
        busy, stall, got = [], [], 0
        while got < n:
            if self._carry is None:
                self._carry = next(self._parts)
            take = min(n - got, len(self._carry["idx"]))
            busy.append(self._carry["busy"][:take])
            stall.append(self._carry["stall"][:take])
            got += take
            rest = {k: v[take:] for k, v in self._carry.items()}
            self._carry = rest if len(rest["idx"]) else None
        if not busy:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(busy), np.concatenate(stall)

    def part(self, a: int, pid: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Busy and stall of ranges [a, a + len(pid)) of the table (their pid and start); parts in order."""
        busy_hi, stall_hi = self._next_rows(len(pid))
        return minus_starts(busy_hi, stall_hi, pid, lo, self._readers_at_starts)

    def _readers_at_starts(self, p: int) -> Readers | None:
        if p not in self._lo:
            self._lo[p] = covered(self._timelines, p)
        return self._lo[p]

    def close(self) -> None:
        self._hi.close()
