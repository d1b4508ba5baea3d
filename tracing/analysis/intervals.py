"""Disjoint sorted intervals (a device's busy blocks, its host stalls) and the measure of their union inside
many windows.

C(t) = |union ∩ (-inf, t)| is the sum of the union's whole blocks before t plus the part of the block t falls
in; a window [lo, hi]'s covered time is C(hi) - C(lo), for any number of windows in any order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

_EMPTY = np.zeros(0, np.int64)


@dataclass(frozen=True)
class Intervals:
    """Disjoint [start, end) intervals in start order."""

    start: np.ndarray = field(default_factory=lambda: _EMPTY)
    end: np.ndarray = field(default_factory=lambda: _EMPTY)

    @classmethod
    def of(cls, start: np.ndarray, end: np.ndarray) -> Intervals:
        return cls(np.asarray(start, np.int64), np.asarray(end, np.int64))

    def __len__(self) -> int:
        return len(self.start)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.start, self.end


class Covered:
    """C(t) over the union of intervals (overlapping or not, any order), each set moved by its offset (ns, onto
    a common clock)."""

    def __init__(self, sets: Sequence[Intervals], offsets: Sequence[int] | None = None) -> None:
        offsets = offsets if offsets is not None else [0] * len(sets)
        s = np.concatenate([_EMPTY, *(i.start + o for i, o in zip(sets, offsets, strict=True))])
        e = np.concatenate([_EMPTY, *(i.end + o for i, o in zip(sets, offsets, strict=True))])
        self._bs, self._be = union_intervals(s, e)
        self._before = np.concatenate([[0], np.cumsum(self._be - self._bs)])

    def at(self, t: np.ndarray) -> np.ndarray:
        """C at each of ``t``."""
        t = np.asarray(t, np.int64)
        k = np.searchsorted(self._bs, t, side="right")  # blocks starting at or before t
        if len(self._bs) == 0:
            return np.zeros(len(t), np.int64)
        kk = np.maximum(k - 1, 0)
        partial = np.where(k > 0, np.clip(np.minimum(t, self._be[kk]) - self._bs[kk], 0, None), 0)
        return self._before[kk] * (k > 0) + partial


def union_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the union of [start, end) (touching intervals merge)."""
    if len(start) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], run_end[last]
