"""Bootstrap over independent units (steps, repeats), shared by every fit of one precision.

Why this unit: micro-batches of one step share that step's noise, so they are not independent draws; steps
(a sweep repeat at one size, or one traced step of one rank) are (:mod:`perfmodel.fitting.design`). A replicate
draws, within each stratum (a size, when every size has >= 2 units), as many units as it has, with
replacement; without strata, all units at once. The same draws serve the wall, GPU busy, host stall and
memory fits of a precision, so ratios of them (the host-stall share) are paired.

How it stays fast: a replicate is a weight vector over units. Every fit needs only weighted sums of sparse
(unit x pattern) count and total matrices (:class:`perfmodel.fitting.design.Response`), so a whole set of replicates
is a few matrix products, chunked to bound memory, in whichever order costs fewer operations.

Small samples: with k units per stratum the resampling variance is (k-1)/k of the truth, and a percentile
interval of a statistic with few degrees of freedom is too narrow by t/z. Replicates are therefore expanded
about the full-data estimate by ``sqrt(k/(k-1)) * t(dof)/z`` (:func:`calibrate`); coverage of the resulting
intervals is measured by simulation (docs/cost-model.md, tests/unit/test_perfmodel_coverage.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import sparse, stats

from perfmodel.fitting.model import LEVEL, t_quantile

_MAX_CHUNK_ELEMENTS = 4_000_000
_MAX_CACHED = 20_000_000  # replicate x pattern totals kept per matrix up to this many numbers (160 MB)


@dataclass(frozen=True, eq=False)
class Draws:
    """``counts[b, u]``: how often unit ``u`` was drawn in replicate ``b``; ``expand``: the variance
    correction sqrt(k/(k-1)) for k units per stratum."""

    counts: np.ndarray
    expand: float
    stratified: bool
    _totals: dict = field(default_factory=dict, repr=False)  # id(matrix) -> (matrix, W @ matrix)

    @property
    def n_boot(self) -> int:
        return int(self.counts.shape[0])

    def project(self, mat: sparse.spmatrix | np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """``W @ mat @ features`` for all replicates: (B x features) (or (B x patterns) without features,
        (B,) for a per-unit vector).

        With few patterns (a size grid) the (B x patterns) totals ``W @ mat`` are computed once per matrix
        and reused by every fit; with many (dynamic batching) the product goes through the units."""
        if id(mat) in self._totals:
            totals = self._totals[id(mat)][1]
            return totals if features is None else totals @ features
        if isinstance(mat, np.ndarray) and mat.ndim == 1:
            return self._chunks(lambda w: w @ mat)
        if self._cacheable(mat) or features is None:
            self.prepare([mat])
            return self.project(mat, features)
        per_unit = np.asarray(mat @ features)
        return self._chunks(lambda w: w @ per_unit)

    def _cacheable(self, mat: sparse.spmatrix | np.ndarray) -> bool:
        """Keep ``W @ mat`` when it is small and cheaper than going through the units every time: fewer
        patterns than units (a size grid), not dynamic batching (many patterns, few steps)."""
        g, p = mat.shape
        return p <= g and self.n_boot * p <= _MAX_CACHED

    def prepare(self, mats: list[sparse.spmatrix | np.ndarray]) -> None:
        """Compute ``W @ mat`` for several matrices (and per-unit vectors) in one pass over the draws: the
        replicate x pattern totals every later projection of them reuses. Matrices with too many patterns
        to keep (dynamic batching) are left to :meth:`project`."""
        todo = [m for m in mats if id(m) not in self._totals and (m.ndim == 1 or self._cacheable(m))]
        if not todo:
            return
        dense = [m for m in todo if isinstance(m, np.ndarray)]
        cells = _SparseCells([m for m in todo if not isinstance(m, np.ndarray)])
        parts: dict[int, list[np.ndarray]] = {id(m): [] for m in todo}
        g = self.counts.shape[1]
        step = max(1, _MAX_CHUNK_ELEMENTS // max(g, 1))
        for i in range(0, self.n_boot, step):
            w = self.counts[i : i + step].astype(float)
            for m in dense:
                parts[id(m)].append(w @ m)
            for m, out in cells.apply(w):
                parts[id(m)].append(out)
        for m in todo:
            self._totals[id(m)] = (m, np.concatenate(parts[id(m)], axis=0))

    def _chunks(self, fn) -> np.ndarray:
        g = self.counts.shape[1]
        step = max(1, _MAX_CHUNK_ELEMENTS // max(g, 1))
        parts = [fn(self.counts[i : i + step].astype(float)) for i in range(0, self.n_boot, step)]
        return np.concatenate(parts, axis=0) if parts else np.empty((0,))


class _SparseCells:
    """``w @ mat`` for several sparse (units x patterns) matrices at once. Every unit touches few patterns,
    so the product is a gather of ``w``'s columns at the nonzero cells -- done once for all matrices (they
    share their cells: one design's responses) -- then, per matrix, a weighted sum per pattern."""

    def __init__(self, mats: list[sparse.spmatrix]) -> None:
        self.mats = mats
        if not mats:
            return
        coos = [sparse.coo_matrix(m) for m in mats]
        g, self.p = mats[0].shape
        keys = np.unique(np.concatenate([c.col.astype(np.int64) * g + c.row for c in coos]))
        self.rows, cols = keys % g, keys // g  # sorted by pattern, then unit
        self.present, self.starts = np.unique(cols, return_index=True)
        self.ends = np.append(self.starts[1:], len(keys))
        self.identity = len(self.rows) == g and bool((self.rows == np.arange(g)).all())
        self.vals = np.zeros((len(keys), len(coos)))  # (cells, matrices)
        for j, c in enumerate(coos):
            self.vals[np.searchsorted(keys, c.col.astype(np.int64) * g + c.row), j] = c.data

    def apply(self, w: np.ndarray) -> list[tuple[sparse.spmatrix, np.ndarray]]:
        if not self.mats:
            return []
        gathered = w if self.identity else w[:, self.rows]
        res = np.zeros((len(self.mats), w.shape[0], self.p))
        if len(self.present) <= 512:  # one small matrix product per pattern, for every matrix at once
            for p, s, e in zip(self.present, self.starts, self.ends, strict=True):
                res[:, :, p] = (gathered[:, s:e] @ self.vals[s:e]).T
        else:
            for j in range(len(self.mats)):
                res[j][:, self.present] = np.add.reduceat(gathered * self.vals[:, j], self.starts, axis=1)
        return [(m, res[j]) for j, m in enumerate(self.mats)]


def _draw_counts(rng: np.random.Generator, n_rep: int, groups: list[np.ndarray], g: int) -> np.ndarray:
    """(n_rep x g) draw counts: within each group, as many draws with replacement as it has members.

    A chunk of replicates draws its unit indices into one buffer (a group of consecutive units -- the usual
    case, units are numbered by pattern -- needs no gather); each replicate is then counted on its own, so
    the count stays in cache (one bincount over the whole chunk scatters across it and is ~4x slower)."""
    out = np.zeros((n_rep, g), dtype=np.uint16)
    step = max(1, _MAX_CHUNK_ELEMENTS // max(g, 1))
    firsts = [int(m[0]) if len(m) and bool((np.diff(m) == 1).all()) else None for m in groups]
    total = sum(len(m) for m in groups)
    buf = np.empty((min(step, n_rep), total), dtype=np.int32)
    for start in range(0, n_rep, step):
        rows = min(step, n_rep - start)
        pos = 0
        for m, first in zip(groups, firsts, strict=True):
            k = len(m)
            idx = rng.integers(0, k, (rows, k), dtype=np.int32)
            view = buf[:rows, pos : pos + k]
            if first is not None:
                np.add(idx, np.int32(first), out=view)
            else:
                np.take(m.astype(np.int32), idx, out=view)
            pos += k
        for r in range(rows):
            out[start + r] = np.bincount(buf[r], minlength=g)
    return out


def draw(n_units: int, strata: np.ndarray | None, n_boot: int, rng: np.random.Generator) -> Draws:
    """Resampling weights over units, stratified when ``strata`` is given (see the module docstring)."""
    if strata is None:
        groups = [np.arange(n_units)]
    else:
        order = np.argsort(strata, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(strata[order])) + 1)
    k = float(np.mean([len(m) for m in groups]))
    expand = float(np.sqrt(k / (k - 1.0))) if k > 1 else 1.0
    return Draws(_draw_counts(rng, n_boot, groups, n_units), expand, strata is not None)


def calibrate(
    reps: np.ndarray, full: np.ndarray, expand: float, dof: float | np.ndarray, level: float = LEVEL
) -> np.ndarray:
    """Replicates expanded about the full-data estimate by ``expand * t(dof) / z`` (small-sample honest);
    ``dof`` per column (coefficient) or one for all."""
    t = np.array([t_quantile(level, d) for d in np.atleast_1d(dof)], dtype=float)
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    factor = expand * np.where(np.isfinite(t), t / z, 1.0)
    return full + factor * (reps - full)


def percentile_ci(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of finite samples (NaN when there are none). +-inf samples count as values (an
    unbounded replicate makes that end infinite), NaN ones are left out."""
    s = np.asarray(samples, dtype=float)
    s = s[~np.isnan(s)]
    if s.size == 0:
        return (float("nan"), float("nan"))
    method = "linear" if np.isfinite(s).all() else "inverted_cdf"  # never interpolate towards an infinity
    lo, hi = np.quantile(s, [0.5 - level / 2.0, 0.5 + level / 2.0], method=method)
    return (float(lo), float(hi))


def interval(samples: np.ndarray, level: float = LEVEL) -> list[float] | None:
    """:func:`percentile_ci` of the finite samples as ``[lo, hi]``; None when there are none."""
    x = np.asarray(samples, float)
    x = x[np.isfinite(x)]
    if not len(x):
        return None
    lo, hi = percentile_ci(x, level)
    return [float(lo), float(hi)]


def median_replicates(samples: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """``(n_boot,)`` bootstrap replicates of the median of ``samples`` (each resampled with replacement),
    expanded about the sample median by :func:`calibrate` with ``k - 1`` degrees of freedom, as the fits' are
    (with 24 steps the plain replicates' 95 % interval covered the true median 89 % of the time), and kept
    within the samples' range (with 5 steps, [min, max] is already the median's distribution-free interval)."""
    s = np.asarray(samples, float)
    reps = np.median(s[rng.integers(0, len(s), size=(n_boot, len(s)))], axis=1)
    k = len(s)
    if k < 2:
        return reps
    wide = calibrate(reps, np.median(s), float(np.sqrt(k / (k - 1.0))), k - 1.0)
    return np.clip(wide, s.min(), s.max())


def covering_ci(samples: np.ndarray, estimate: float, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval widened, where needed, to hold the point estimate: a knee search can skew the
    replicates away from the estimate (a knee resting on one size), and an interval that excludes its own
    estimate would call a difference significant that the fit itself does not show."""
    lo, hi = percentile_ci(samples, level)
    if not np.isfinite(estimate) or np.isnan(lo):
        return (lo, hi)
    return (min(lo, float(estimate)), max(hi, float(estimate)))
