"""Share of the added fixed cost that is the GPU waiting for the host, with an interval that stays bounded.

Per micro-batch, host stall (docs/contracts.md launch-end rule: for each gap in the GPU busy union, the part before the
next op's launch call ended) is fitted like the time, ``stall(n) = stall_fixed + stall_per_token * n``. The
intercepts say how much stall each micro-batch carries regardless of size, so::

    share = (stall_fixed_low - stall_fixed_base) / d_fixed,   d_fixed = fixed_low - fixed_base

A share near 1 means the extra fixed cost of the low precision is almost all launch/host overhead (many small
quantize kernels the CPU cannot issue fast enough), not GPU work; near 0, the GPU is busy the whole time.

That needs straight lines that fit. When the wall or the stall line bends (a host/GPU knee: stall is large
below the knee and near zero above it), each precision's value at n -> 0 comes from its chosen model: the
wall's knee model (its host line at zero tokens) and the stall's own knee model (a segmented line), so the
share is still the one at zero tokens -- never a value measured at the smallest size, which depends on
where the sweep starts (83 % from one start, 108 % from another, on the same hardware). Interval: Fieller's
from the covariance of numerator and denominator (the same units) for lines, the percentile interval of the
paired bootstrap replicates for knee models. It is given only when the denominator is significantly
nonzero -- otherwise the set of plausible shares is unbounded, and the share is null with that reason.
Without a GPU trace there is no stall: null with a reason, never a CPU stand-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.breakeven.solve import fieller_interval
from perfmodel.fitting.bootstrap import percentile_ci
from perfmodel.fitting.fitted import PrecisionFit
from perfmodel.fitting.model import LEVEL, t_quantile


@dataclass(frozen=True)
class HostStallShare:
    share: float | None
    ci: tuple[float | None, float | None]
    ci_method: str | None
    bootstrap_ci: tuple[float, float] | None
    d_stall_fixed_s: float | None
    reason: str | None
    basis: str | None = None  # "fitted intercepts" | "zero-size intercepts of the chosen models ..."


def _null(reason: str) -> HostStallShare:
    return HostStallShare(None, (None, None), None, None, None, reason)


def _stall_line_ok(f: PrecisionFit) -> bool:
    lof = f.stall_lack_of_fit
    return f.wall.line_ok and f.wall.model == "line" and not (lof is not None and lof.flag)


def _fitted_share(base: PrecisionFit, low: PrecisionFit, level: float) -> HostStallShare:
    c = {"fixed": 1.0}
    num = low.stall.contrast(c)[0] - base.stall.contrast(c)[0]
    den = low.fixed_s - base.fixed_s
    if den == 0:
        return _null("d_fixed is exactly 0")
    boot_ci = None
    sb, sl = base.stall.contrast(c)[2], low.stall.contrast(c)[2]
    wb, wl = base.boot[:, 0], low.boot[:, 0]
    n = min(len(sb), len(sl), len(wb), len(wl))
    if n:
        d_den = wl[:n] - wb[:n]
        if max(np.mean(d_den > 0), np.mean(d_den < 0)) >= 0.5 + level / 2:
            boot_ci = percentile_ci((sl[:n] - sb[:n]) / d_den, level)
    var_num = low.stall.cov[0, 0] + base.stall.cov[0, 0]
    var_den = low.time.cov[0, 0] + base.time.cov[0, 0]
    cov = _cross_cov(low) + _cross_cov(base)
    dof = min(low.time.dof_of("intercept"), base.time.dof_of("intercept"))
    fs = fieller_interval(num, den, var_num, var_den, cov, t_quantile(level, dof))
    if fs.shape == "bounded":
        return HostStallShare(
            float(num / den), (fs.lo, fs.hi), "fieller", boot_ci, float(num), None, "fitted intercepts"
        )
    if boot_ci is not None:
        return HostStallShare(
            float(num / den), boot_ci, "bootstrap", boot_ci, float(num), None, "fitted intercepts"
        )
    return HostStallShare(
        float(num / den),
        (None, None),
        None,
        None,
        float(num),
        "no bounded interval: the added fixed cost (d_fixed) is not significantly different from 0",
        "fitted intercepts",
    )


def _cross_cov(f: PrecisionFit) -> float:
    """CR3 covariance of the stall and wall intercepts of one precision (same units)."""
    return f.stall.cross_cov(f.wall.line)


def _zero_size(f: PrecisionFit) -> tuple[float, np.ndarray, float, np.ndarray] | str:
    """(wall at n -> 0, its replicates, stall at n -> 0, its replicates) from the chosen models, or why not."""
    if f.wall.model is None:
        return f"{f.precision}: no model fits its wall time"
    if f.wall.linearity == "untested":
        return f"{f.precision}: its line is untested (too few sizes), so its value at zero tokens is a guess"
    knees = [("wall", f.wall.knee.curve.knee)] if f.wall.model in ("knee", "parts") and f.wall.knee else []
    if not _stall_line_ok(f) and f.stall_knee is not None:
        knees.append(("host-stall", f.stall_knee.curve.knee))
    for what, k in knees:
        below = f.sizes_around(float(np.atleast_1d(k)[0]))[0]
        if below < 2:
            return (
                f"{f.precision}: {below} measured size(s) below its {what} knee ({float(np.atleast_1d(k)[0]):,.0f} "
                "tokens): the launch-bound line's value at zero tokens is not measured (measure smaller sizes)"
            )
    wall0 = float(np.atleast_1d(f.wall.curve().a1)[0])
    wb = f.wall.boot_curve()
    if _stall_line_ok(f):
        stall0, _, sb = f.stall.contrast({"fixed": 1.0})
    else:
        k, lof = f.stall_knee, f.stall_knee_lack_of_fit
        if k is None:
            return f"{f.precision}: the host-stall line bends and there are too few sizes for its knee model"
        if lof is not None and lof.flag:
            return f"{f.precision}: neither a line nor a knee model fits its host stall ({lof.note})"
        stall0 = float(np.atleast_1d(k.curve.a1)[0])
        sb = np.atleast_1d(k.boot.a1) if k.boot is not None else np.empty(0)
    return wall0, (np.atleast_1d(wb.a1) if wb is not None else np.empty(0)), float(stall0), np.asarray(sb)


def _model_share(base: PrecisionFit, low: PrecisionFit, level: float) -> HostStallShare:
    zb, zl = _zero_size(base), _zero_size(low)
    for z in (zb, zl):
        if isinstance(z, str):
            return _null(f"no zero-size intercept: {z}")
    (wb, wbb, sb, sbb), (wl, wlb, sl, slb) = zb, zl
    basis = "zero-size intercepts of the chosen models (a knee model's host line at n -> 0)"
    den, num = wl - wb, sl - sb
    if den == 0:
        return _null("d_fixed is exactly 0")
    n = min(len(wbb), len(wlb), len(sbb), len(slb))
    if not n:
        reason = "no bootstrap replicates (--bootstrap 0): a knee model's share has no interval"
        return HostStallShare(float(num / den), (None, None), None, None, float(num), reason, basis)
    d_den = wlb[:n] - wbb[:n]
    if max(np.mean(d_den > 0), np.mean(d_den < 0)) < 0.5 + level / 2:
        reason = (
            "no bounded interval: the added fixed cost at zero tokens is not significantly different from 0"
        )
        return HostStallShare(float(num / den), (None, None), None, None, float(num), reason, basis)
    lo, hi = percentile_ci((slb[:n] - sbb[:n]) / d_den, level)
    share = float(num / den)
    ci = (min(lo, share), max(hi, share))  # a knee search can skew the replicates away from the estimate
    return HostStallShare(share, ci, "bootstrap", (lo, hi), float(num), None, basis)


def host_stall_share(base: PrecisionFit, low: PrecisionFit, level: float = LEVEL) -> HostStallShare:
    """Share of the added fixed cost that is host stall, with a bounded interval or null with the reason."""
    missing = [f.precision for f in (base, low) if f.stall is None]
    if missing:
        return _null(
            f"no host_stall_seconds for {', '.join(missing)} (host stall needs a GPU trace with its launch calls: sweep with --trace on a GPU)"
        )
    refused = [f"{f.precision}: {f.wall.refused}" for f in (base, low) if f.wall.refused]
    if refused:
        return _null("no model of the wall time: " + "; ".join(refused))
    if _stall_line_ok(base) and _stall_line_ok(low):
        untested = [f.precision for f in (base, low) if "untested" in (f.wall.linearity, _linearity(f))]
        if untested:
            return _null(
                f"linearity untested for {', '.join(untested)} (too few sizes): the value at zero tokens is an "
                "extrapolation nothing checks"
            )
        return _fitted_share(base, low, level)
    return _model_share(base, low, level)


def _linearity(f: PrecisionFit) -> str:
    lof = f.stall_lack_of_fit
    return "untested" if lof is None or lof.p_value is None else "tested"
