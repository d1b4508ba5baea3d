"""Breakeven micro-batch size against a baseline: the docs/contracts.md case table and Fieller's interval.

With ``d_fixed = fixed_low - fixed_base`` and ``d_tok = per_token_base - per_token_low`` the low precision is
faster at size n exactly when ``d_tok * n > d_fixed``. Each difference is "significantly > 0", "significantly
< 0" or "not significant" by its two-sided 95 % t interval (HC3 variances of the two independent fits add;
Welch-Satterthwaite degrees of freedom). The seven rows (docs/contracts.md):

    d_tok sig > 0, d_fixed sig > 0      faster_above       n* = d_fixed / d_tok
    d_tok sig > 0, d_fixed not > 0      always_faster
    d_tok sig < 0, d_fixed sig < 0      faster_below       n* = d_fixed / d_tok
    d_tok sig < 0, d_fixed not < 0      never_faster
    d_tok n.s.,    d_fixed sig > 0      never_faster
    d_tok n.s.,    d_fixed sig < 0      always_faster
    d_tok n.s.,    d_fixed n.s.         indistinguishable

Fieller's interval for a ratio ``theta = a / b`` is the set of theta whose t-statistic of ``a - theta b`` is
below the critical value t::

    (a - theta b)^2 <= t^2 (v_a - 2 theta c_ab + theta^2 v_b)
    <=>  A theta^2 - 2 B theta + C <= 0,  A = b^2 - t^2 v_b,  B = a b - t^2 c_ab,  C = a^2 - t^2 v_a

A > 0 (b significant) gives a bounded interval around a/b; A < 0 gives two half-lines (-inf, r1] U [r2, inf)
or, when the discriminant is negative, the whole line. For the two fits here ``v_a = var(fixed_low) +
var(fixed_base)``, ``v_b = var(per_token_low) + var(per_token_base)`` and ``c_ab = -(cov_low + cov_base)``
with ``cov`` the fixed/per-token covariance within one fit. Because the case table uses the same t, the
Fieller interval is bounded in exactly the rows that report n*; in the other rows it is still computed and
its finite bound(s) reported (null for an infinite end) with ``ci_reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.bootstrap import percentile_ci
from perfmodel.model import LEVEL, PrecisionFit, t_quantile

CASES = ("faster_above", "always_faster", "faster_below", "never_faster", "indistinguishable")


@dataclass(frozen=True)
class FiellerSet:
    """The Fieller confidence set of a ratio. ``lo``/``hi``: finite bounds of the branch holding the estimate.

    shape: ``bounded`` | ``two_half_lines`` (``excluded`` = the gap (r1, r2)) | ``whole_line`` | ``undefined``.
    """

    shape: str
    lo: float | None
    hi: float | None
    excluded: tuple[float, float] | None
    reason: str | None

    def contains(self, theta: float) -> bool:
        if self.shape == "whole_line":
            return True
        if self.shape == "bounded":
            return self.lo <= theta <= self.hi
        if self.shape == "two_half_lines":
            return theta <= self.excluded[0] or theta >= self.excluded[1]
        return False


def fieller_interval(a: float, b: float, var_a: float, var_b: float, cov_ab: float, t: float) -> FiellerSet:
    """Fieller's confidence set for ``a / b`` at critical value ``t`` (see the module docstring)."""
    if not all(np.isfinite([a, b, var_a, var_b, cov_ab, t])):
        return FiellerSet("undefined", None, None, None, "variances undefined (a size measured only once?)")
    qa = b * b - t * t * var_b
    qb = a * b - t * t * cov_ab
    qc = a * a - t * t * var_a
    disc = qb * qb - qa * qc
    if qa > 0:
        root = np.sqrt(max(disc, 0.0))
        return FiellerSet("bounded", (qb - root) / qa, (qb + root) / qa, None, None)
    if disc <= 0 or qa == 0:
        return FiellerSet(
            "whole_line",
            None,
            None,
            None,
            "denominator not significantly different from 0: the set is every value",
        )
    root = np.sqrt(disc)
    r1, r2 = sorted(((qb - root) / qa, (qb + root) / qa))
    est = a / b if b != 0 else np.inf
    lo, hi = (r2, None) if est >= r2 else (None, r1)
    reason = (
        f"denominator not significantly different from 0: the set is (-inf, {r1:.4g}] U [{r2:.4g}, +inf); "
        "the bound of the branch holding the estimate is given"
    )
    return FiellerSet("two_half_lines", lo, hi, (float(r1), float(r2)), reason)


def _welch_dof(v1: float, d1: float, v2: float, d2: float) -> float:
    den = v1 * v1 / d1 + v2 * v2 / d2
    return (v1 + v2) ** 2 / den if den > 0 else float(d1 + d2)


def _sign(ci: tuple[float, float]) -> int:
    if ci[0] > 0:
        return 1
    if ci[1] < 0:
        return -1
    return 0


def classify_case(tok_sign: int, fixed_sign: int) -> str:
    """The docs/contracts.md case from the significance signs (+1 / -1 / 0) of d_tok and d_fixed."""
    if tok_sign > 0:
        return "faster_above" if fixed_sign > 0 else "always_faster"
    if tok_sign < 0:
        return "faster_below" if fixed_sign < 0 else "never_faster"
    return {1: "never_faster", -1: "always_faster", 0: "indistinguishable"}[fixed_sign]


@dataclass(frozen=True)
class Breakeven:
    case: str
    tokens: float | None
    tokens_estimate: float | None
    ci: tuple[float | None, float | None]
    ci_method: str
    ci_reason: str | None
    ci_shape: str
    ci_excluded: tuple[float, float] | None
    bootstrap_ci: tuple[float, float] | None
    bootstrap_reason: str | None
    extrapolated: bool
    measured_tokens: tuple[float, float]
    within_measured: str  # "faster" | "slower" | "mixed" | "unknown": low vs base over the measured sizes
    diff_at_ends_s: tuple[float, float]  # (time_low - time_base) at the two ends of the measured range
    d_fixed_s: float
    d_fixed_ci: tuple[float, float]
    d_tok_s: float
    d_tok_ci: tuple[float, float]
    dof: float


def _bootstrap_ratio(base: PrecisionFit, low: PrecisionFit, level: float) -> tuple[tuple | None, str | None]:
    n = min(len(base.boot), len(low.boot))
    if n == 0:
        return None, "no bootstrap replicates"
    d_fixed = low.boot[:n, 0] - base.boot[:n, 0]
    d_tok = base.boot[:n, 1] - low.boot[:n, 1]
    same_sign = max(np.mean(d_tok > 0), np.mean(d_tok < 0))
    if same_sign < 0.5 + level / 2.0:
        return None, f"d_tok changes sign in {1 - same_sign:.1%} of resamples: the ratio is unbounded"
    return percentile_ci(d_fixed / d_tok, level), None


def compare_within(
    base: PrecisionFit, low: PrecisionFit, lo: float, hi: float, t: float
) -> tuple[str, tuple[float, float]]:
    """Is ``low`` significantly faster (or slower) than ``base`` at *every* size in [lo, hi]?

    diff(n) = d_fixed_signed + n * d_slope with var = [1 n] (cov_low + cov_base) [1 n]^T. Its lower
    confidence bound is concave in n (a line minus the square root of a convex quadratic), so it is above 0
    on the whole range exactly when it is above 0 at both ends (and likewise for the upper bound). This
    answers "which is faster where I measured" even when the fixed/per-token split is not significant.
    """
    cov = low.time.cov + base.time.cov
    ends = np.array([lo, hi])
    diff = (low.fixed_s - base.fixed_s) + ends * (low.per_token_s - base.per_token_s)
    if not (np.isfinite(t) and np.isfinite(cov).all()):
        return "unknown", (float(diff[0]), float(diff[1]))
    sd = np.sqrt(np.maximum(cov[0, 0] + 2 * ends * cov[0, 1] + ends * ends * cov[1, 1], 0.0))
    if np.all(diff - t * sd > 0):
        verdict = "slower"
    elif np.all(diff + t * sd < 0):
        verdict = "faster"
    else:
        verdict = "mixed"
    return verdict, (float(diff[0]), float(diff[1]))


def find_breakeven(base: PrecisionFit, low: PrecisionFit, level: float = LEVEL) -> Breakeven:
    """Case, n*, Fieller interval and bootstrap cross-check for ``low`` against ``base``."""
    a = low.fixed_s - base.fixed_s
    b = base.per_token_s - low.per_token_s
    cl, cb = low.time.cov, base.time.cov
    var_a, var_b = cl[0, 0] + cb[0, 0], cl[1, 1] + cb[1, 1]
    cov_ab = -(cl[0, 1] + cb[0, 1])
    dof_a = _welch_dof(cl[0, 0], low.time.dof, cb[0, 0], base.time.dof)
    dof_b = _welch_dof(cl[1, 1], low.time.dof, cb[1, 1], base.time.dof)
    dof = min(dof_a, dof_b)
    t = t_quantile(level, dof)
    if np.isfinite(t) and np.isfinite(var_a) and np.isfinite(var_b):
        a_ci = (a - t * np.sqrt(var_a), a + t * np.sqrt(var_a))
        b_ci = (b - t * np.sqrt(var_b), b + t * np.sqrt(var_b))
        method = "fieller"
    else:  # HC3 undefined: decide significance from the bootstrap instead
        n = min(len(base.boot), len(low.boot))
        a_ci = percentile_ci(low.boot[:n, 0] - base.boot[:n, 0], level)
        b_ci = percentile_ci(base.boot[:n, 1] - low.boot[:n, 1], level)
        method = "bootstrap"
    case = classify_case(_sign(b_ci), _sign(a_ci))
    estimate = a / b if b != 0 else None
    tokens = estimate if case in ("faster_above", "faster_below") else None
    fs = fieller_interval(a, b, var_a, var_b, cov_ab, t)
    boot_ci, boot_reason = _bootstrap_ratio(base, low, level)
    if method == "fieller":
        ci, shape, reason = (fs.lo, fs.hi), fs.shape, fs.reason
    else:
        ci, shape = (boot_ci or (None, None)), "bootstrap"
        reason = "HC3 variances undefined; percentile bootstrap interval" if boot_ci else boot_reason
    if tokens is None and reason is None:
        reason = f"case {case}: no breakeven size; interval of d_fixed / d_tok shown for reference"
    lo_meas = max(base.time.x_min, low.time.x_min)
    hi_meas = min(base.time.x_max, low.time.x_max)
    within, ends = compare_within(base, low, lo_meas, hi_meas, t)
    return Breakeven(
        case=case,
        tokens=tokens,
        tokens_estimate=estimate,
        ci=ci,
        ci_method=method,
        ci_reason=reason,
        ci_shape=shape,
        ci_excluded=fs.excluded,
        bootstrap_ci=boot_ci,
        bootstrap_reason=boot_reason,
        extrapolated=bool(tokens is not None and not (lo_meas <= tokens <= hi_meas)),
        measured_tokens=(lo_meas, hi_meas),
        within_measured=within,
        diff_at_ends_s=ends,
        d_fixed_s=a,
        d_fixed_ci=a_ci,
        d_tok_s=b,
        d_tok_ci=b_ci,
        dof=dof,
    )
