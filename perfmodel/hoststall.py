"""Share of the added fixed cost that is the GPU waiting for the host, with an interval that stays bounded.

Per micro-batch, host stall (docs/contracts.md launch-end rule: for each gap in the GPU busy union, the part before the
next op's launch call ended) is fitted like the time, ``stall(n) = stall_fixed + stall_per_token * n``. The
intercepts say how much stall each micro-batch carries regardless of size, so::

    share = (stall_fixed_low - stall_fixed_base) / d_fixed,   d_fixed = fixed_low - fixed_base

A share near 1 means the extra fixed cost of the low precision is almost all launch/host overhead (many small
quantize kernels the CPU cannot issue fast enough), not GPU work; near 0, the GPU is busy the whole time.

That needs straight lines that fit. When the wall or stall line is rejected (a host/GPU knee: stall is
large below the knee and near zero above it, so its intercept means nothing), the share is measured at the
smallest size both precisions ran, where fixed costs dominate: ``(stall_low - stall_base) / (wall_low -
wall_base)`` of unit means there. Interval: Fieller's, from the covariance of numerator and denominator (the
same micro-batches), cross-checked by the paired bootstrap for the fitted share. It is given only when the
denominator is significantly nonzero -- otherwise the set of plausible shares is unbounded, and the share is
null with that reason. Without a GPU trace there is no stall: null with a reason, never a CPU stand-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.bootstrap import percentile_ci
from perfmodel.breakeven import fieller_interval
from perfmodel.fitted import PrecisionFit
from perfmodel.fitting import line_refit
from perfmodel.lof import lack_of_fit
from perfmodel.model import LEVEL, t_quantile


@dataclass(frozen=True)
class HostStallShare:
    share: float | None
    ci: tuple[float | None, float | None]
    ci_method: str | None
    bootstrap_ci: tuple[float, float] | None
    d_stall_fixed_s: float | None
    reason: str | None
    basis: str | None = None  # "fitted intercepts" | "measured at N tokens"


def _null(reason: str) -> HostStallShare:
    return HostStallShare(None, (None, None), None, None, None, reason)


def _stall_line_ok(f: PrecisionFit) -> bool:
    lof = lack_of_fit(
        f.design,
        "host_stall_seconds",
        f.stall.unit_resid,
        f.stall.unit_fitted,
        len(f.stall.names),
        line_refit("host_stall_seconds"),
    )
    return f.wall.line_ok and not (lof is not None and lof.flag)


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


def _unit_means(f: PrecisionFit, label: int) -> pd.DataFrame:
    d = f.design
    sel = d.unit_label == label
    out = {}
    for col in ("seconds", "host_stall_seconds"):
        r = d.responses[col]
        cnt = r.unit_count
        with np.errstate(invalid="ignore", divide="ignore"):
            out[col] = r.unit_total / cnt
    return pd.DataFrame(out)[sel].dropna()


def _measured_share(base: PrecisionFit, low: PrecisionFit, level: float) -> HostStallShare:
    common = sorted(set(base.design.unit_label) & set(low.design.unit_label) - {-1})
    if not common:
        return _null("the wall or stall line is rejected and the precisions share no measured size")
    n0 = int(common[0])
    mb, ml = _unit_means(base, n0), _unit_means(low, n0)
    if len(mb) < 2 or len(ml) < 2:
        return _null(
            f"the wall or stall line is rejected and {n0} tokens has fewer than two units per precision"
        )
    num = ml["host_stall_seconds"].mean() - mb["host_stall_seconds"].mean()
    den = ml["seconds"].mean() - mb["seconds"].mean()
    basis = f"measured at {n0:,} tokens (the lines are rejected)"
    if den == 0:
        return _null("the measured wall times are equal at the smallest size")
    var = {c: ml[c].var() / len(ml) + mb[c].var() / len(mb) for c in ("seconds", "host_stall_seconds")}
    cov = ml.cov().iloc[0, 1] / len(ml) + mb.cov().iloc[0, 1] / len(mb)
    t = t_quantile(level, min(len(ml), len(mb)) - 1)
    fs = fieller_interval(num, den, var["host_stall_seconds"], var["seconds"], cov, t)
    if fs.shape != "bounded":
        reason = f"no bounded interval: the wall-time difference at {n0:,} tokens is not significant"
        return HostStallShare(float(num / den), (None, None), None, None, None, reason, basis)
    return HostStallShare(float(num / den), (fs.lo, fs.hi), "fieller", None, None, None, basis)


def host_stall_share(base: PrecisionFit, low: PrecisionFit, level: float = LEVEL) -> HostStallShare:
    """Share of the added fixed cost that is host stall, with a bounded interval or null with the reason."""
    missing = [f.precision for f in (base, low) if f.stall is None]
    if missing:
        return _null(
            f"no host_stall_seconds for {', '.join(missing)} (host stall needs a GPU trace: sweep with --trace on a GPU)"
        )
    if _stall_line_ok(base) and _stall_line_ok(low):
        return _fitted_share(base, low, level)
    return _measured_share(base, low, level)
