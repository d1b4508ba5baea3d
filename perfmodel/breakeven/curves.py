"""Breakeven between two micro-batch curves that may bend (a line, or two lines joined at a knee).

The difference ``D(n) = low(n) - base(n)`` of two such curves is piecewise linear with at most two kinks, so
its sign changes are found exactly, segment by segment, for the estimate and for every bootstrap replicate.
The case table of :mod:`perfmodel.breakeven.solve` applies to the two ends of the curve::

    d_fixed = D(0)                     the cost low adds at small micro-batches (host lines' intercepts)
    d_tok   = -(slope of D at large n) the per-token saving once both are GPU-bound

each significant by its bootstrap percentile interval. ``faster_above``: n* is the *last* size where low
becomes faster (so it is faster at every larger size); ``faster_below``: the first where it becomes slower.
Its interval is the percentile interval of the same root over replicates, a replicate without one counting
as 0 (faster everywhere) or +inf (never), so an unbounded end reads null.
"""

from __future__ import annotations

import numpy as np

from perfmodel.fitting.bootstrap import percentile_ci
from perfmodel.fitting.model import LEVEL, Curve


def crossing_roots(low: Curve, base: Curve) -> tuple[np.ndarray, np.ndarray]:
    """Sign changes of ``low - base`` over n > 0: (roots, slope of D there), shape (R, 3), NaN where none.
    A negative slope means low becomes faster above the root."""
    lk, bk = np.atleast_1d(low.knee).astype(float), np.atleast_1d(base.knee).astype(float)
    k1, k2 = np.minimum(lk, bk), np.maximum(lk, bk)
    edges = [np.zeros_like(k1), k1, k2, np.full_like(k1, np.inf)]
    roots = np.full((len(k1), 3), np.nan)
    slopes = np.full((len(k1), 3), np.nan)
    fields = [np.atleast_1d(v).astype(float) for v in (low.a1, low.b1, low.a2, low.b2)]
    bfields = [np.atleast_1d(v).astype(float) for v in (base.a1, base.b1, base.a2, base.b2)]
    for i in range(3):
        lo, hi = edges[i], edges[i + 1]
        with np.errstate(invalid="ignore"):
            mid = np.where(np.isfinite(hi), (lo + hi) / 2.0, lo + 1.0)
        left_l, left_b = mid < lk, mid < bk
        a = np.where(left_l, fields[0], fields[2]) - np.where(left_b, bfields[0], bfields[2])
        b = np.where(left_l, fields[1], fields[3]) - np.where(left_b, bfields[1], bfields[3])
        with np.errstate(divide="ignore", invalid="ignore"):
            r = -a / b
        ok = (b != 0) & (r > lo) & (r <= hi) & np.isfinite(r) & (lo < hi)
        roots[:, i] = np.where(ok, r, np.nan)
        slopes[:, i] = np.where(ok, b, np.nan)
    return roots, slopes


def ends(low: Curve, base: Curve) -> tuple[np.ndarray, np.ndarray]:
    """(d_fixed, d_tok) of the two curves: D at n -> 0 and minus D's slope at large n."""
    return np.asarray(low.a1 - base.a1, dtype=float), np.asarray(base.b2 - low.b2, dtype=float)


def pick_root(roots: np.ndarray, slopes: np.ndarray, case: str) -> np.ndarray:
    """Per row: the last root where low becomes faster (faster_above) or the first where it becomes slower
    (faster_below); NaN when there is none."""
    if case == "faster_above":
        r = np.where(slopes < 0, roots, np.nan)
        return np.where(np.isnan(r).all(axis=1), np.nan, np.nanmax(np.where(np.isnan(r), -np.inf, r), axis=1))
    r = np.where(slopes > 0, roots, np.nan)
    return np.where(np.isnan(r).all(axis=1), np.nan, np.nanmin(np.where(np.isnan(r), np.inf, r), axis=1))


def replicate_roots(low: Curve, base: Curve, case: str) -> np.ndarray:
    """The case's root for each replicate; 0 or +inf where a replicate has none (see the module docstring)."""
    roots, slopes = crossing_roots(low, base)
    r = pick_root(roots, slopes, case)
    d0, dtok = ends(low, base)
    if case == "faster_above":  # no root: low faster at large n means faster everywhere (0), else never (inf)
        fill = np.where(np.atleast_1d(dtok) > 0, 0.0, np.inf)
    else:  # no root: low slower at small n means faster nowhere below (0), else below every size (inf)
        fill = np.where(np.atleast_1d(d0) > 0, 0.0, np.inf)
    return np.where(np.isnan(r), fill, r)


def root_interval(
    boot_low: Curve, boot_base: Curve, case: str, level: float = LEVEL
) -> tuple[float | None, float | None]:
    """Percentile interval of the case's root over replicates; None for an infinite end."""
    lo, hi = percentile_ci(replicate_roots(boot_low, boot_base, case), level)
    return (float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None)


def within_sizes(
    low: Curve,
    base: Curve,
    boot_low: Curve | None,
    boot_base: Curve | None,
    sizes: np.ndarray,
    level: float = LEVEL,
) -> tuple[str, tuple[float, float]]:
    """Is low significantly faster / slower than base at every size in ``sizes`` (bootstrap band of D)?
    Returns the verdict (``faster`` | ``slower`` | ``mixed`` | ``unknown``) and D at the two ends."""
    sizes = np.asarray(sizes, dtype=float)
    d = low(sizes) - base(sizes)
    ends_s = (float(d[0]), float(d[-1]))
    if boot_low is None or boot_base is None:
        return "unknown", ends_s
    db = boot_low(sizes[None, :].T).T - boot_base(sizes[None, :].T).T  # (R, sizes)
    lo, hi = np.nanquantile(db, [0.5 - level / 2, 0.5 + level / 2], axis=0)
    if np.all(lo > 0):
        return "slower", ends_s
    if np.all(hi < 0):
        return "faster", ends_s
    return "mixed", ends_s
