"""Intervals and their union's measure inside windows: equal to the measure on the union computed directly
(:func:`_clipped_at_once`), for any number of overlapping interval sets and offsets."""

from __future__ import annotations

import numpy as np
import pytest

from tracing.analysis import metrics
from tracing.analysis.intervals import Covered, Intervals


def _random_streams(rng: np.random.Generator, k: int, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """k lists of disjoint sorted intervals (some touching, some of zero length), overlapping each other."""
    out = []
    for _ in range(k):
        gaps = rng.integers(0, 4, n)  # 0: the next interval touches this one
        lens = rng.integers(0, 6, n)  # 0: an empty interval
        start = np.cumsum(gaps + np.r_[0, lens[:-1]])
        out.append((start.astype(np.int64), (start + lens).astype(np.int64)))
    return out


def _clipped_at_once(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The reference: |disjoint sorted intervals ∩ [lo_i, hi_i]|, everything in memory, vectorized."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    if len(starts) == 0:
        return np.zeros(len(lo), np.int64)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered_before(t: np.ndarray) -> np.ndarray:  # |intervals ∩ (-inf, t)|
        i = np.searchsorted(starts, t, side="right")
        j = np.maximum(i - 1, 0)
        partial = np.where(i > 0, np.clip(np.minimum(t, ends[j]) - starts[j], 0, None), 0)
        return cum[j] * (i > 0) + partial

    return np.clip(covered_before(hi) - covered_before(lo), 0, None)


def _covered_in(sets: list[Intervals], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The union's measure inside each window [lo, hi] (0 where hi <= lo), from :class:`Covered` at both edges."""
    cov = Covered(sets)
    return np.clip(cov.at(hi) - cov.at(lo), 0, None)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [1, 3, 1000])
def test_covered_at_window_edges_equals_the_measure_on_the_union(k: int, seed: int) -> None:
    rng = np.random.default_rng(k * 100 + seed)
    streams = _random_streams(rng, k, 200)
    u_s, u_e = metrics.union_intervals(
        np.concatenate([s for s, _ in streams]), np.concatenate([e for _, e in streams])
    )
    top = int(max(e.max() for _, e in streams))
    lo = rng.integers(-5, top + 5, 500)
    hi = lo + rng.integers(-3, 40, 500)  # some windows empty or reversed
    want = _clipped_at_once(u_s, u_e, lo, hi)
    got = _covered_in([Intervals.of(s, e) for s, e in streams], lo, hi)
    assert np.array_equal(got, want)
    assert got.sum() > 0


def test_covered_moves_each_set_by_its_offset_and_answers_in_any_order() -> None:
    rng = np.random.default_rng(7)
    (s, e), (s2, e2) = _random_streams(rng, 2, 300)
    u_s, u_e = metrics.union_intervals(np.r_[s, s2 + 50], np.r_[e, e2 + 50])
    t = rng.integers(0, int(u_e[-1]) + 10, 400)  # not sorted
    cov = Covered([Intervals.of(s, e), Intervals.of(s2, e2)], [0, 50])
    got = np.concatenate([cov.at(t[a : a + 7]) for a in range(0, len(t), 7)])
    want = _clipped_at_once(u_s, u_e, np.full(len(t), np.iinfo(np.int64).min // 2), t)
    assert np.array_equal(got, want)


def test_empty_streams_and_no_windows() -> None:
    empty = Intervals()
    assert np.array_equal(_covered_in([empty], np.array([0, 5]), np.array([10, 20])), [0, 0])
    assert len(_covered_in([empty], np.zeros(0, np.int64), np.zeros(0, np.int64))) == 0
    assert np.array_equal(_covered_in([], np.array([1]), np.array([2])), [0])
