"""Paired breakeven: the difference low - base measured in the same repeat, fitted directly.

A sweep interleaves precisions: within a repeat, for each size, every precision runs back to back. Slow drift
of a shared machine (clock, co-tenants) then hits both precisions of a (size, repeat) cell alike, while it
moves whole repeats up and down by tens of percent. Fitting each precision alone (the docs/contracts.md breakeven)
keeps that drift in both lines; fitting the per-cell difference cancels the shared part::

    diff(n) = time_low(n) - time_base(n) = d_fixed - d_tok * n        (one point per matched (size, repeat))

The intercept is d_fixed, minus the slope is d_tok, both from one fit (HC3; their covariance enters
Fieller's interval directly), and the same case table applies. Multiplicative drift scales diff but leaves
its zero, the breakeven, in place. This is reported next to the docs/contracts.md result as a cross-check; it needs
repeats in both precisions at the same sizes (``None`` otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.breakeven.solve import _sign, classify_case, fieller_interval, line_within, ratio_answer
from perfmodel.fitting.design import UNIT_ROW
from perfmodel.fitting.fitted import PrecisionFit
from perfmodel.fitting.linear import fit_line
from perfmodel.fitting.model import LEVEL, t_quantile


@dataclass(frozen=True)
class PairedBreakeven:
    n_pairs: int
    case: str
    tokens: float | None
    ci: tuple[float | None, float | None]
    ci_shape: str
    d_fixed_s: float
    d_fixed_ci: tuple[float, float]
    d_tok_s: float
    d_tok_ci: tuple[float, float]
    within_measured: str


def _unique_keys(points: dict[str, np.ndarray]) -> set[tuple[int, int]]:
    keys = list(zip(points["label"].astype(int), points["repeat"].astype(int), strict=True))
    counts = pd.Series(keys, dtype=object).value_counts()
    return {k for k, c in counts.items() if c == 1 and k[0] >= 0}


def _matched(base: PrecisionFit, low: PrecisionFit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, low - base, size) per (size, repeat) cell that each precision measured exactly once."""
    ok = _unique_keys(base.points) & _unique_keys(low.points)
    b = {
        (int(s), int(r)): (x, y)
        for s, r, x, y in zip(*(base.points[k] for k in ("label", "repeat", "x", "seconds")), strict=True)
        if (int(s), int(r)) in ok
    }
    xs, ds, sizes = [], [], []
    for s, r, x, y in zip(*(low.points[k] for k in ("label", "repeat", "x", "seconds")), strict=True):
        if (int(s), int(r)) in b:
            xb, yb = b[(int(s), int(r))]
            xs.append(0.5 * (x + xb))
            ds.append(y - yb)
            sizes.append(int(s))
    return np.asarray(xs, dtype=float), np.asarray(ds, dtype=float), np.asarray(sizes, dtype=np.int64)


def paired_breakeven(base: PrecisionFit, low: PrecisionFit, level: float = LEVEL) -> PairedBreakeven | None:
    """The case table on the fitted per-repeat difference (None without matched repeats at >= 2 sizes)."""
    if base.points is None or low.points is None or UNIT_ROW in (base.boot_unit, low.boot_unit):
        return None
    x, d, sizes = _matched(base, low)
    if len(np.unique(x)) < 2 or len(x) < 4:
        return None
    f = fit_line(x, d, sizes)
    a, b = f.intercept, -f.slope
    t = t_quantile(level, min(f.dof_of("intercept"), f.dof_of("slope")))
    if not (np.isfinite(t) and np.isfinite(f.cov).all()):
        return None
    a_ci = (a - t * f.intercept_se, a + t * f.intercept_se)
    b_ci = (b - t * f.slope_se, b + t * f.slope_se)
    tok_sign, fixed_sign = _sign(b_ci), _sign(a_ci)
    case = classify_case(tok_sign, fixed_sign)
    fs = fieller_interval(a, b, f.cov[0, 0], f.cov[1, 1], -f.cov[0, 1], t)
    tokens, ci, _ = ratio_answer(case, a, b, fs, tok_sign, fixed_sign)
    within, _ = line_within(f.intercept, f.slope, f.cov, float(x.min()), float(x.max()), t)
    return PairedBreakeven(
        n_pairs=len(x),
        case=case,
        tokens=tokens,
        ci=ci,
        ci_shape=fs.shape,
        d_fixed_s=a,
        d_fixed_ci=a_ci,
        d_tok_s=b,
        d_tok_ci=b_ci,
        within_measured=within,
    )
