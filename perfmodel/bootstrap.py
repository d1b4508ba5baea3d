"""Bootstrap over independent units (steps, repeats), shared by every fit of one precision.

Why this unit: micro-batches of one step share that step's noise, so they are not independent draws; steps
(a sweep repeat at one size, or one traced step of one rank) are (:mod:`perfmodel.design`). A replicate
draws, within each stratum (a size, when every size has >= 2 units), as many units as it has, with
replacement; without strata, all units at once. The same draws serve the wall, GPU busy, host stall and
memory fits of a precision, so ratios of them (the host-stall share) are paired.

How it stays fast: a replicate is a weight vector over units. Every fit needs only weighted sums of sparse
(unit x pattern) count and total matrices (:class:`perfmodel.design.Response`), so a whole set of replicates
is a few matrix products, chunked to bound memory, in whichever order costs fewer operations.

Small samples: with k units per stratum the resampling variance is (k-1)/k of the truth, and a percentile
interval of a statistic with few degrees of freedom is too narrow by t/z. Replicates are therefore expanded
about the full-data estimate by ``sqrt(k/(k-1)) * t(dof)/z`` (:func:`calibrate`); coverage of the resulting
intervals is measured by simulation (docs/cost-model.md, tests/unit/test_perfmodel_coverage.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse, stats

from perfmodel.model import LEVEL, t_quantile

_MAX_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True, eq=False)
class Draws:
    """``counts[b, u]``: how often unit ``u`` was drawn in replicate ``b``; ``expand``: the variance
    correction sqrt(k/(k-1)) for k units per stratum."""

    counts: np.ndarray
    expand: float
    stratified: bool

    @property
    def n_boot(self) -> int:
        return int(self.counts.shape[0])

    def project(self, mat: sparse.spmatrix | np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """``W @ mat @ features`` for all replicates: (B x features) (or (B x patterns) without features,
        (B,) for a per-unit vector). The cheaper multiplication order is chosen per call."""
        if isinstance(mat, np.ndarray) and mat.ndim == 1:
            return self._chunks(lambda w: w @ mat)
        if isinstance(mat, np.ndarray):  # a small design: plain dense products
            if features is None:
                return self._chunks(lambda w: w @ mat)
            per_unit = mat @ features
            return self._chunks(lambda w: w @ per_unit)
        mat = sparse.csr_matrix(mat)
        if features is None:
            return self._chunks(lambda w: np.asarray((mat.T @ w.T).T))
        g, p = mat.shape
        f = features.shape[1]
        b = self.n_boot
        if g * f * b + mat.nnz * f < mat.nnz * b + b * p * f:
            per_unit = np.asarray(mat @ features)
            return self._chunks(lambda w: w @ per_unit)
        return self._chunks(lambda w: np.asarray((mat.T @ w.T).T) @ features)

    def _chunks(self, fn) -> np.ndarray:
        g = self.counts.shape[1]
        step = max(1, _MAX_CHUNK_ELEMENTS // max(g, 1))
        parts = [fn(self.counts[i : i + step].astype(float)) for i in range(0, self.n_boot, step)]
        return np.concatenate(parts, axis=0) if parts else np.empty((0,))


def _draw_counts(rng: np.random.Generator, n_rep: int, groups: list[np.ndarray], g: int) -> np.ndarray:
    out = np.zeros((n_rep, g), dtype=np.uint16)
    rows = np.arange(n_rep)[:, None]
    for members in groups:
        idx = members[(rng.random((n_rep, len(members))) * len(members)).astype(np.int64)]
        np.add.at(out, (np.broadcast_to(rows, idx.shape), idx), 1)
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
