"""Breakeven micro-batch size against a baseline: the docs/contracts.md case table, Fieller's interval, honest n*.

With ``d_fixed = fixed_low - fixed_base`` and ``d_tok = per_token_base - per_token_low`` the low precision is
faster at size n exactly when ``d_tok * n > d_fixed``. Each difference is "significantly > 0", "significantly
< 0" or "not significant" by its two-sided 95 % t interval (HC3 variances of the two independent fits add;
Welch-Satterthwaite degrees of freedom). The case says only what the intervals say (docs/contracts.md):
"always" / "never" faster need *both* differences significant that way -- the Fieller set of n* then lies
below zero; when one difference is within noise, the set reaches zero or infinity and the case is the
crossing with that set:

    d_tok sig > 0, d_fixed sig > 0      faster_above       n* = d_fixed / d_tok, Fieller [lo, hi]
    d_tok sig > 0, d_fixed n.s.         faster_above       n* in [0, hi] (0: faster at every size)
    d_tok sig > 0, d_fixed sig < 0      always_faster
    d_tok sig < 0, d_fixed sig < 0      faster_below       n* = d_fixed / d_tok, Fieller [lo, hi]
    d_tok sig < 0, d_fixed n.s.         faster_below       n* in [0, hi] (0: never faster)
    d_tok sig < 0, d_fixed sig > 0      never_faster
    d_tok n.s.,    d_fixed sig > 0      faster_above       n* >= r2: not faster below r2, maybe never
    d_tok n.s.,    d_fixed sig < 0      faster_below       n* >= r2: faster below r2, maybe always
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
its finite bound(s) reported (null for an infinite end) with ``ci_reason``. When no interval can be computed
(covariance undefined and no bootstrap: e.g. one measurement per size with ``--bootstrap 0``) the case is
``undetermined``.

Which n* is reported (:func:`find_breakeven`): ``model_ok`` says the straight lines are not rejected (lack
of fit, implausible coefficients) for either precision. When they are, n* comes only from a model that fits
(the knee-aware curves, :mod:`perfmodel.breakeven.curves`, with bootstrap intervals); when none fits, n* is
withheld (null) with the reason, and the measured crossing (:mod:`perfmodel.breakeven.crossing`) is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodel.breakeven.curves import crossing_roots, ends, pick_root, root_interval, within_sizes
from perfmodel.fitting.bootstrap import covering_ci, percentile_ci
from perfmodel.fitting.fitted import BasisFit, PrecisionFit
from perfmodel.fitting.model import LEVEL, LineFit, t_quantile

CASES = ("faster_above", "always_faster", "faster_below", "never_faster", "indistinguishable", "undetermined")


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
    """The docs/contracts.md case from the significance signs (+1 / -1 / 0) of d_tok and d_fixed: always /
    never faster only when both differences say so; one within noise leaves a crossing whose interval
    reaches 0 or infinity (see the module docstring)."""
    if tok_sign > 0:
        return "always_faster" if fixed_sign < 0 else "faster_above"
    if tok_sign < 0:
        return "never_faster" if fixed_sign > 0 else "faster_below"
    return {1: "faster_above", -1: "faster_below", 0: "indistinguishable"}[fixed_sign]


def ratio_answer(
    case: str, a: float, b: float, fs: FiellerSet, tok_sign: int, fixed_sign: int
) -> tuple[float | None, tuple[float | None, float | None], str | None]:
    """(n*, interval, reason) of a crossing case from the Fieller set of ``a / b`` (d_fixed / d_tok).

    Both significant: the bounded set. d_fixed within noise: the bounded set clipped at 0 (n* may be 0).
    d_tok within noise: the half-line ``[r2, inf)`` beyond the gap around 0 -- the low precision is not
    faster (``faster_above``) / not slower (``faster_below``) below r2, and n* is the estimate only when it
    lies there."""
    est = a / b if b != 0 else None
    if case not in ("faster_above", "faster_below"):
        return None, (fs.lo, fs.hi), fs.reason
    if tok_sign != 0 and fs.shape == "bounded":
        if fixed_sign != 0:
            return est, (fs.lo, fs.hi), None
        way = "faster at every size" if case == "faster_above" else "never faster"
        reason = (
            f"the fixed-cost difference is within noise: n* may be 0 ({way}); the interval's lower end is "
            f"clipped at 0 (Fieller: [{fs.lo:.4g}, {fs.hi:.4g}])"
        )
        return (max(est, 0.0) if est is not None else 0.0), (0.0, fs.hi), reason
    if tok_sign == 0 and fs.shape == "two_half_lines" and fs.excluded is not None:
        r2 = fs.excluded[1]
        way = "not faster" if case == "faster_above" else "faster"
        after = "it may never pay off" if case == "faster_above" else "it may be faster at every size"
        reason = (
            f"the per-token difference is within noise: {way} below {r2:,.0f} tokens (95 %); above that "
            f"{after} (Fieller: {fs.reason.split(': ', 1)[1] if fs.reason else 'two half-lines'})"
        )
        return (est if est is not None and est >= r2 else None), (r2, None), reason
    return None, (None, None), fs.reason or "no interval for n*"


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
    basis: str = "wall"
    model_ok: bool = True
    model: str | None = "line"  # the model n* comes from: line | knee | parts (| a mix); None: withheld
    model_reason: str | None = None  # what rejects the line (and, when withheld, the knee model)
    other_roots: tuple[float, ...] = ()  # further sign changes of the fitted curves
    end_signs: tuple[int, int] = (0, 0)  # low - base significantly > 0 (1) / < 0 (-1) / not at the two ends


def _bootstrap_ratio(base: np.ndarray, low: np.ndarray, level: float) -> tuple[tuple | None, str | None]:
    n = min(len(base), len(low))
    if n == 0:
        return None, "no bootstrap replicates"
    d_fixed = low[:n, 0] - base[:n, 0]
    d_tok = base[:n, 1] - low[:n, 1]
    same_sign = max(np.mean(d_tok > 0), np.mean(d_tok < 0))
    if same_sign < 0.5 + level / 2.0:
        return None, f"d_tok changes sign in {1 - same_sign:.1%} of resamples: the ratio is unbounded"
    return percentile_ci(d_fixed / d_tok, level), None


def end_signs(
    intercept: float, slope: float, cov: np.ndarray, lo: float, hi: float, t: float
) -> tuple[int, int]:
    """Sign (+1 / -1 / 0: not significant) of ``intercept + slope n`` at ``lo`` and at ``hi``."""
    if not (np.isfinite(t) and np.isfinite(cov).all()):
        return (0, 0)
    out = []
    for n in (lo, hi):
        d = intercept + slope * n
        sd = float(np.sqrt(max(cov[0, 0] + 2 * n * cov[0, 1] + n * n * cov[1, 1], 0.0)))
        out.append(1 if d - t * sd > 0 else (-1 if d + t * sd < 0 else 0))
    return (out[0], out[1])


def line_within(
    intercept: float, slope: float, cov: np.ndarray, lo: float, hi: float, t: float
) -> tuple[str, tuple[float, float]]:
    """Is ``diff(n) = intercept + slope n`` (low minus base) significantly > 0 or < 0 at *every* n in [lo, hi]?

    var(diff(n)) = [1 n] cov [1 n]^T. The lower confidence bound is concave in n (a line minus the square root
    of a convex quadratic), so it is above 0 on the whole range exactly when it is above 0 at both ends (and
    likewise for the upper bound). Returns ``slower`` | ``faster`` | ``mixed`` | ``unknown`` and diff at the
    two ends. Used by the independent fits and the paired cross-check alike."""
    e = np.array([lo, hi])
    diff = intercept + e * slope
    if not (np.isfinite(t) and np.isfinite(cov).all()):
        return "unknown", (float(diff[0]), float(diff[1]))
    sd = np.sqrt(np.maximum(cov[0, 0] + 2 * e * cov[0, 1] + e * e * cov[1, 1], 0.0))
    if np.all(diff - t * sd > 0):
        return "slower", (float(diff[0]), float(diff[1]))
    if np.all(diff + t * sd < 0):
        return "faster", (float(diff[0]), float(diff[1]))
    return "mixed", (float(diff[0]), float(diff[1]))


def _line_breakeven(
    base: LineFit, low: LineFit, base_boot: np.ndarray, low_boot: np.ndarray, level: float
) -> Breakeven:
    """The docs/contracts.md breakeven of two straight lines: case, n*, Fieller interval, bootstrap cross-check."""
    a = low.intercept - base.intercept
    b = base.slope - low.slope
    cl, cb = low.cov, base.cov
    var_a, var_b = cl[0, 0] + cb[0, 0], cl[1, 1] + cb[1, 1]
    cov_ab = -(cl[0, 1] + cb[0, 1])
    dof_a = _welch_dof(cl[0, 0], low.dof_of("intercept"), cb[0, 0], base.dof_of("intercept"))
    dof = min(dof_a, _welch_dof(cl[1, 1], low.dof_of("slope"), cb[1, 1], base.dof_of("slope")))
    t = t_quantile(level, dof)
    n = min(len(base_boot), len(low_boot))
    if np.isfinite(t) and np.isfinite(var_a) and np.isfinite(var_b):
        a_ci = (a - t * np.sqrt(var_a), a + t * np.sqrt(var_a))
        b_ci = (b - t * np.sqrt(var_b), b + t * np.sqrt(var_b))
        method = "fieller"
    else:  # covariance undefined: decide significance from the bootstrap instead
        a_ci = percentile_ci(low_boot[:n, 0] - base_boot[:n, 0], level)
        b_ci = percentile_ci(base_boot[:n, 1] - low_boot[:n, 1], level)
        method = "bootstrap"
    determined = bool(np.isfinite(a_ci).all() and np.isfinite(b_ci).all())
    tok_sign, fixed_sign = _sign(b_ci), _sign(a_ci)
    case = classify_case(tok_sign, fixed_sign) if determined else "undetermined"
    estimate = a / b if b != 0 else None
    tokens = None
    fs = fieller_interval(a, b, var_a, var_b, cov_ab, t)
    boot_ci, boot_reason = _bootstrap_ratio(base_boot, low_boot, level)
    if method == "fieller":
        tokens, ci, reason = ratio_answer(case, a, b, fs, tok_sign, fixed_sign)
        shape = fs.shape
    else:
        ci, shape = (boot_ci or (None, None)), "bootstrap"
        reason = (
            "covariance undefined (a size in one unit only); percentile bootstrap interval"
            if boot_ci
            else boot_reason
        )
        if case in ("faster_above", "faster_below") and boot_ci is not None:
            tokens = max(estimate, 0.0) if estimate is not None else None
            if fixed_sign == 0:
                ci = (0.0, boot_ci[1])
    if not determined:
        ci, shape = (None, None), "undefined"
        reason = (
            "no interval can be computed: the covariance is undefined (a size measured in one unit only) and "
            "there are no bootstrap replicates (--bootstrap 0, or one unit per size); measure repeats"
        )
    elif tokens is None and reason is None:
        reason = f"case {case}: no breakeven size; interval of d_fixed / d_tok shown for reference"
    lo_meas, hi_meas = max(base.x_min, low.x_min), min(base.x_max, low.x_max)
    within, diff_ends = line_within(a, -b, cl + cb, lo_meas, hi_meas, t)
    signs = end_signs(a, -b, cl + cb, lo_meas, hi_meas, t)
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
        diff_at_ends_s=diff_ends,
        d_fixed_s=a,
        d_fixed_ci=a_ci,
        d_tok_s=b,
        d_tok_ci=b_ci,
        dof=dof,
        end_signs=signs,
    )


def _curve_breakeven(base: BasisFit, low: BasisFit, measured: tuple[float, float], level: float) -> Breakeven:
    """Breakeven of the chosen (knee-aware) curves, intervals from the bootstrap."""
    cl, cb = low.curve(), base.curve()
    bl, bb = low.boot_curve(), base.boot_curve()
    d0, dtok = (float(v) for v in ends(cl, cb))
    roots, slopes = crossing_roots(cl, cb)
    all_roots = tuple(float(r) for r in roots[0] if np.isfinite(r))
    sizes = np.geomspace(measured[0], measured[1], 25) if measured[1] > measured[0] else np.array(measured)
    within, diff_ends = within_sizes(cl, cb, bl, bb, sizes, level)
    common = dict(
        ci_excluded=None,
        bootstrap_reason=None,
        measured_tokens=measured,
        within_measured=within,
        diff_at_ends_s=diff_ends,
        d_fixed_s=d0,
        d_tok_s=dtok,
        dof=float(
            min(low.knee.dof if low.knee else low.line.dof, base.knee.dof if base.knee else base.line.dof)
        ),
    )
    if bl is None or bb is None:
        return Breakeven(
            case="undetermined",
            tokens=None,
            tokens_estimate=all_roots[-1] if all_roots else None,
            ci=(None, None),
            ci_method="bootstrap",
            ci_reason="a knee model has no interval without bootstrap replicates (--bootstrap 0)",
            ci_shape="undefined",
            bootstrap_ci=None,
            extrapolated=False,
            d_fixed_ci=(float("nan"), float("nan")),
            d_tok_ci=(float("nan"), float("nan")),
            **common,
        )
    a_b, b_b = ends(bl, bb)
    a_ci, b_ci = covering_ci(a_b, d0, level), covering_ci(b_b, dtok, level)
    case = classify_case(_sign(b_ci), _sign(a_ci))
    tokens = ci = None
    reason = None
    if case in ("always_faster", "never_faster"):  # both ends say so; the middle must too (a knee between)
        side = "faster_above" if case == "always_faster" else "faster_below"
        if root_interval(bl, bb, side, level) != (0.0, 0.0):
            case = side
    if case in ("faster_above", "faster_below"):
        r = pick_root(roots, slopes, case)[0]
        if np.isfinite(r):
            tokens = float(r)
        elif (dtok > 0) if case == "faster_above" else (d0 > 0):
            tokens = 0.0  # no crossing: faster everywhere (above) / nowhere (below)
        ci = root_interval(bl, bb, case, level)
        if tokens is not None and not (
            (ci[0] is None or ci[0] <= tokens) and (ci[1] is None or tokens <= ci[1])
        ):  # a skewed knee search: widen to hold the estimate, and say so
            ci = (
                None if ci[0] is None else min(ci[0], tokens),
                None if ci[1] is None else max(ci[1], tokens),
            )
            reason = "the bootstrap interval did not hold the estimate (a skewed knee search); widened to it"
        elif ci[0] == 0.0:
            way = "faster at every size" if case == "faster_above" else "never faster"
            reason = f"some replicates do not cross ({way}): the interval reaches 0"
        elif ci[1] is None:
            way = "may never pay off" if case == "faster_above" else "may be faster at every size"
            reason = f"some replicates do not cross: the upper end is unbounded ({way})"
    else:
        reason = f"case {case}: the fitted curves do not cross in the direction of a breakeven"
    others = tuple(r for r in all_roots if tokens is None or abs(r - tokens) > 1e-9 * max(tokens, 1.0))
    return Breakeven(
        case=case,
        tokens=tokens,
        tokens_estimate=tokens if tokens is not None else (all_roots[-1] if all_roots else None),
        ci=ci or (None, None),
        ci_method="bootstrap",
        ci_reason=reason,
        ci_shape="bootstrap",
        bootstrap_ci=ci,
        extrapolated=bool(tokens is not None and not (measured[0] <= tokens <= measured[1])),
        d_fixed_ci=a_ci,
        d_tok_ci=b_ci,
        other_roots=others,
        **common,
    )


def _basis(fit: PrecisionFit | BasisFit, basis: str) -> BasisFit | None:
    if isinstance(fit, BasisFit):
        return fit
    return fit.wall if basis == "wall" else fit.busy


def find_breakeven(
    base: PrecisionFit | BasisFit, low: PrecisionFit | BasisFit, level: float = LEVEL, basis: str = "wall"
) -> Breakeven:
    """Case, n*, interval and model honesty for ``low`` against ``base`` on one basis (``wall`` |
    ``gpu_busy``); see the module docstring for which n* is reported."""
    b, lo = _basis(base, basis), _basis(low, basis)
    if b is None or lo is None:
        raise ValueError(f"no {basis} fit for one of the precisions")
    line = _line_breakeven(b.line2(), lo.line2(), b.line_boot(), lo.line_boot(), level)
    names = [getattr(f, "precision", d) for f, d in ((base, "baseline"), (low, "low"))]
    fits = (b, lo)
    few = [f"{n}: {f.line.n_units} unit" for n, f in zip(names, fits, strict=True) if f.line.n_units < 2]
    if few:  # nothing to resample, no spread to estimate: no interval, whatever the point estimates say
        why = (
            f"one independent unit (step) per precision ({'; '.join(few)}): nothing to resample and no noise "
            "to measure; trace or run more steps"
        )
        return replace(line, basis=basis, **_no_answer("undetermined", why), model_ok=False, model_reason=why)
    refused: dict[str, list[str]] = {}
    for n, f in zip(names, fits, strict=True):
        if f.refused:
            refused.setdefault(f.refused, []).append(n)
    if refused:
        why = "; ".join(f"{' and '.join(ns)}: {r}" for r, ns in refused.items())
        return replace(
            line,
            basis=basis,
            **_no_answer("undetermined", f"no breakeven: {why}"),
            model_ok=False,
            model=None,
            model_reason=why,
        )
    if b.line_ok and lo.line_ok:
        untested = [n for n, f in zip(names, fits, strict=True) if f.linearity == "untested"]
        if untested:
            return replace(_untested(line, untested, level), basis=basis)
        return replace(line, basis=basis)
    why = "; ".join(f"{n}: {f.rejection}" for n, f in zip(names, fits, strict=True) if not f.line_ok)
    if b.model is not None and lo.model is not None:
        kinds = sorted({b.model, lo.model})
        curve = _curve_breakeven(b, lo, line.measured_tokens, level)
        return replace(curve, basis=basis, model_ok=False, model="+".join(kinds), model_reason=why)
    why += "; " + "; ".join(
        f"{n}: {f.knee_failure}" for n, f in zip(names, fits, strict=True) if f.model is None
    )
    return replace(
        line,
        basis=basis,
        tokens=None,
        ci=(None, None),
        ci_shape="withheld",
        ci_reason="n* withheld: no model fits the data (" + why + "); see the measured crossing",
        extrapolated=False,
        model_ok=False,
        model=None,
        model_reason=why,
    )


def _no_answer(case: str, reason: str) -> dict:
    return dict(
        case=case,
        tokens=None,
        ci=(None, None),
        ci_shape="withheld" if case != "undetermined" else "undefined",
        ci_reason=reason,
        extrapolated=False,
    )


def _untested(line: Breakeven, names: list[str], level: float) -> Breakeven:
    """Lines nothing could test (two sizes): n* from the line is a guess about the curve between and beyond
    the sizes, so its Fieller interval is not stated. The model-free answer is: at each end of the measured
    range, is the low precision significantly slower or faster? A significant change of sign brackets the
    crossing between the two sizes (``ci_method: measured``); anything else is ``undetermined``."""
    lo_n, hi_n = line.measured_tokens
    why = (
        f"linearity untested ({', '.join(names)}: fewer than three sizes; a line through two sizes always fits, "
        "a third would test it)"
    )
    if line.case == "undetermined":  # no interval at all: that reason comes first
        return replace(line, model_ok=False, model_reason=why, ci_reason=f"{line.ci_reason}; {why}")
    common = dict(model_ok=False, model="line", model_reason=why, extrapolated=False, ci_method="measured")
    if line.case != "undetermined" and line.within_measured == "mixed" and hi_n > lo_n:
        d_lo, d_hi = line.diff_at_ends_s
        ends_sig = _ends_significant(line)
        if ends_sig and d_lo > 0 > d_hi:
            case = "faster_above"
        elif ends_sig and d_lo < 0 < d_hi:
            case = "faster_below"
        else:
            case = None
        if case is not None:
            est = line.tokens_estimate
            tokens = min(max(est, lo_n), hi_n) if est is not None else None
            return replace(
                line,
                case=case,
                tokens=tokens,
                ci=(lo_n, hi_n),
                ci_shape="measured",
                ci_reason=f"{why}: the measured difference changes sign significantly between {lo_n:,.0f} and "
                f"{hi_n:,.0f} tokens, which brackets n* (the line's own Fieller interval assumes the line)",
                **common,
            )
    return replace(
        line,
        case="undetermined",
        tokens=None,
        ci=(None, None),
        ci_shape="undefined",
        ci_reason=f"{why}, and the measured difference does not change sign significantly between the sizes: "
        "no interval for n* without a tested model",
        **common,
    )


def _ends_significant(line: Breakeven) -> bool:
    """Is the difference significant, with opposite signs, at the two ends of the measured range?"""
    a, b = line.end_signs
    return bool(a != 0 and b != 0 and a != b)
