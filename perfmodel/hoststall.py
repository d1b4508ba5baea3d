"""Share of the added fixed cost that is the GPU waiting for the host.

Per micro-batch, host stall (docs/contracts.md launch-end rule: for each gap in the GPU busy union, the part before the
next op's launch call ended) is fitted like the time, ``stall(n) = stall_fixed + stall_per_token * n``. The
intercepts say how much stall each micro-batch carries regardless of size, so::

    share = (stall_fixed_low - stall_fixed_base) / d_fixed,   d_fixed = fixed_low - fixed_base

A share near 1 means the extra fixed cost of the low precision is almost all launch/host overhead (many small
quantize kernels the CPU cannot issue fast enough), not GPU work; near 0, the GPU is busy the whole time.

Interval: Fieller's, with the numerator and denominator built from the same micro-batches of each precision
(HC3 cross-covariance of the stall and time intercepts), cross-checked by the paired bootstrap (stall and time
replicates drawn with the same weights). Without a GPU trace there is no stall: the share is null with a
reason, never a CPU stand-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.bootstrap import percentile_ci
from perfmodel.breakeven import fieller_interval
from perfmodel.model import LEVEL, PrecisionFit, t_quantile


@dataclass(frozen=True)
class HostStallShare:
    share: float | None
    ci: tuple[float | None, float | None]
    ci_method: str | None
    bootstrap_ci: tuple[float, float] | None
    d_stall_fixed_s: float | None
    reason: str | None


def _null(reason: str) -> HostStallShare:
    return HostStallShare(None, (None, None), None, None, None, reason)


def host_stall_share(base: PrecisionFit, low: PrecisionFit, level: float = LEVEL) -> HostStallShare:
    """Share of ``d_fixed`` that is host stall, with its interval (null with a reason when not measurable)."""
    missing = [f.precision for f in (base, low) if f.stall is None]
    if missing:
        return _null(
            f"no host_stall_seconds for {', '.join(missing)} (host stall needs a GPU trace: sweep with --trace on a GPU)"
        )
    num = low.stall.intercept - base.stall.intercept
    den = low.fixed_s - base.fixed_s
    if den == 0:
        return _null("d_fixed is exactly 0")
    boot_ci = None
    if base.boot_stall is not None and low.boot_stall is not None:
        n = min(len(base.boot_stall), len(low.boot_stall), len(base.boot), len(low.boot))
        ratio = (low.boot_stall[:n, 0] - base.boot_stall[:n, 0]) / (low.boot[:n, 0] - base.boot[:n, 0])
        same_sign = max(
            np.mean((low.boot[:n, 0] - base.boot[:n, 0]) > 0),
            np.mean((low.boot[:n, 0] - base.boot[:n, 0]) < 0),
        )
        boot_ci = percentile_ci(ratio, level) if same_sign >= 0.5 + level / 2 else None
    ci: tuple[float | None, float | None] = (None, None)
    method = None
    reason = None
    if base.stall_time_cov is not None and low.stall_time_cov is not None:
        var_num = low.stall.cov[0, 0] + base.stall.cov[0, 0]
        var_den = low.time.cov[0, 0] + base.time.cov[0, 0]
        cov = low.stall_time_cov + base.stall_time_cov
        dof = min(low.time.dof, base.time.dof)
        fs = fieller_interval(num, den, var_num, var_den, cov, t_quantile(level, dof))
        if fs.shape != "undefined":
            ci, method, reason = (fs.lo, fs.hi), "fieller", fs.reason
    if method is None and boot_ci is not None:
        ci, method = boot_ci, "bootstrap"
    elif method is None:
        reason = "no interval: stall missing on some micro-batches and d_fixed not clearly nonzero in the bootstrap"
    return HostStallShare(float(num / den), ci, method, boot_ci, float(num), reason)
