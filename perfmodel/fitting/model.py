"""The micro-batch cost model: what is fitted, what the numbers mean, and how to predict with them.

Tutorial
--------
A learner step over a global batch of ``N`` tokens is split into ``N / n`` micro-batches of ``n`` tokens.
Each micro-batch pays a cost that does not depend on its size (kernel launches, bookkeeping and, for MXFP8,
quantizing weights and their scales) and a cost per token (the GEMMs); some costs are paid once per step
(a weight cast cached across micro-batches lands on micro-batch 0)::

    seconds(n) = fixed_s + per_token_s * n  [+ per_step_s on micro-batch 0]          (one micro-batch)
    step(N, n) = (N / n) * (fixed_s + per_token_s * n) + per_step_s + other_s           (one step)

MXFP8 typically *adds* fixed cost (quantize/cast kernels, host stalls between small kernels) and *saves*
per-token cost (faster GEMMs). Against the baseline (``bf16``)::

    d_fixed = fixed_low - fixed_base          (> 0: the low precision adds fixed cost)
    d_tok   = per_token_base - per_token_low  (> 0: the low precision saves per token)

    time_low(n) < time_base(n)  <=>  d_tok * n > d_fixed

so with both positive the low precision pays off above ``n* = d_fixed / d_tok`` (Fieller's interval: a
ratio of two noisy estimates). When small micro-batches are launch-bound (the GPU waits for the host) the
time is ``max(host(n), gpu(n))``: two lines joined at a knee (:class:`Curve`), and n* is where the two
precisions' curves cross (:mod:`perfmodel.fitting.knee`, :mod:`perfmodel.breakeven.curves`).

``n`` is the number of tokens a micro-batch actually processed (``num_tokens``); the budget
``tokens_per_microbatch`` labels the *sizes* (grid points) used for strata, hold-out splits and the measured
range. The fixed cost splits further into GPU work and host stall (the contract's launch-end rule); the
share of the added fixed cost that is host stall is :mod:`perfmodel.breakeven.hoststall`.

This module holds the small fitted objects (a line, a lack-of-fit result, a curve) and the pure prediction
functions the report and the dashboard share; :mod:`perfmodel.fitting.fitted` holds the per-precision fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

LEVEL = 0.95  # every interval in mxperf's cost model is a 95 % interval


@dataclass(frozen=True, eq=False)
class LineFit:
    """Least-squares line ``y = intercept + slope * x`` with HC3 heteroscedasticity-robust covariance.

    ``cov`` is the 2x2 covariance of (intercept, slope); NaN when HC3 is undefined (a point with leverage 1,
    e.g. a size measured once). ``dof`` = points - 2, the degrees of freedom of the t intervals.
    """

    intercept: float
    slope: float
    cov: np.ndarray
    n_points: int
    dof: int
    r2: float
    residual_sd: float
    x_min: float
    x_max: float
    dofs: tuple[float, float] | None = None  # (intercept, slope) when they differ from ``dof``

    def dof_of(self, which: str) -> float:
        return float(self.dofs[0 if which == "intercept" else 1]) if self.dofs else float(self.dof)

    @property
    def intercept_se(self) -> float:
        return float(np.sqrt(self.cov[0, 0]))

    @property
    def slope_se(self) -> float:
        return float(np.sqrt(self.cov[1, 1]))

    def ci(self, which: str, level: float = LEVEL) -> tuple[float, float]:
        """t-based interval of ``"intercept"`` or ``"slope"`` (NaN when the covariance is undefined)."""
        est, se = (self.intercept, self.intercept_se) if which == "intercept" else (self.slope, self.slope_se)
        t = t_quantile(level, self.dof_of(which))
        return (est - t * se, est + t * se)


@dataclass(frozen=True)
class LackOfFit:
    """Does a straight line describe the sizes? ``flag`` when significant *and* large enough to matter.

    ``test`` is ``"pure_error_F"`` (repeats at each size: residual variance beyond replicate noise) or
    ``"quadratic"`` (no repeats: HC3 t-test of an added n^2 term). ``max_rel_dev`` is the largest
    |mean time at a size - line| / line over sizes. ``suggested_min_tokens`` is the smallest size from which
    the line fits (refitting after dropping the smallest sizes), null when no cut helps.
    """

    flag: bool
    test: str
    p_value: float | None
    max_rel_dev: float
    worst_size: int
    small_sizes_above_line: bool
    suggested_min_tokens: int | None
    note: str
    noise_rel: float | None = None  # 95 % half-width of a size's mean relative residual (what noise hides)
    weak: bool = False  # not flagged, but a material bend (> 3 %) could hide in the noise: no evidence


@dataclass(frozen=True, eq=False)
class Curve:
    """Seconds of one micro-batch vs tokens ``n``: two lines joined at ``knee`` (``a1 + b1 n`` below it,
    ``a2 + b2 n`` above); a straight line has ``knee = inf``. Fields are floats or arrays (one value per
    bootstrap replicate), so the same code serves the estimate and its replicates."""

    knee: np.ndarray
    a1: np.ndarray
    b1: np.ndarray
    a2: np.ndarray
    b2: np.ndarray

    @classmethod
    def line(cls, intercept: float | np.ndarray, slope: float | np.ndarray) -> Curve:
        a, b = np.asarray(intercept, dtype=float), np.asarray(slope, dtype=float)
        return cls(np.full(a.shape, np.inf), a, b, a, b)

    def __call__(self, n: float | np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        return np.where(n < self.knee, self.a1 + self.b1 * n, self.a2 + self.b2 * n)

    def shifted(self, slope: float | np.ndarray) -> Curve:
        """The curve plus ``slope * n`` (both segments; the knee stays where it is)."""
        return Curve(self.knee, self.a1, self.b1 + slope, self.a2, self.b2 + slope)

    def take(self, i: int | np.ndarray) -> Curve:
        return Curve(*(np.asarray(v)[i] for v in (self.knee, self.a1, self.b1, self.a2, self.b2)))

    def as_dict(self) -> dict[str, float | None]:
        k = float(self.knee)
        return {
            "knee_tokens": k if np.isfinite(k) else None,
            "left": {"intercept_s": float(self.a1), "slope_s": float(self.b1)},
            "right": {"intercept_s": float(self.a2), "slope_s": float(self.b2)},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Curve:
        k = d.get("knee_tokens")
        left, right = d["left"], d["right"]
        return cls(
            np.asarray(np.inf if k is None else float(k)),
            np.asarray(float(left["intercept_s"])),
            np.asarray(float(left["slope_s"])),
            np.asarray(float(right["intercept_s"])),
            np.asarray(float(right["slope_s"])),
        )


def t_quantile(level: float, dof: float) -> float:
    """Two-sided t critical value; the normal one when dof is huge, NaN when dof < 1."""
    if not np.isfinite(dof) or dof < 1:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2.0, dof))


def _coef(fit: Any) -> tuple[float, float]:
    if isinstance(fit, LineFit):
        return fit.intercept, fit.slope
    if hasattr(fit, "fixed_s") and hasattr(fit, "per_token_s"):  # a PrecisionFit
        return fit.fixed_s, fit.per_token_s
    if isinstance(fit, Mapping):
        return float(fit["fixed_s"]), float(fit["per_token_s"])
    raise TypeError(f"expected a LineFit, PrecisionFit or a fits.json fit mapping, got {type(fit).__name__}")


def _cov_dof(fit: Any) -> tuple[np.ndarray, float]:
    if hasattr(fit, "time") and isinstance(fit.time, LineFit):  # a PrecisionFit
        fit = fit.time
    if isinstance(fit, LineFit):
        return fit.cov, fit.dof
    if isinstance(fit, Mapping) and fit.get("cov") is not None:
        return np.asarray(fit["cov"], dtype=float), float(fit.get("dof") or np.inf)
    raise ValueError("this fit carries no covariance ('cov'); bands need fits.json from mxperf fit")


def predict_microbatch_seconds(fit: Any, n: float | np.ndarray) -> float | np.ndarray:
    """Predicted seconds of one micro-batch of ``n`` tokens: ``fixed_s + per_token_s * n``."""
    fixed, per_token = _coef(fit)
    out = fixed + per_token * np.asarray(n, dtype=float)
    return float(out) if out.ndim == 0 else out


def fit_band(fit: Any, ns: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prediction, lower, upper) arrays: the ``level`` confidence band of the fitted *mean* time at ``ns``.

    var(fixed + per_token * n) = [1 n] cov [1 n]^T, with the HC3 covariance; t quantile with the fit's dof.
    """
    ns = np.asarray(ns, dtype=float)
    cov, dof = _cov_dof(fit)
    pred = np.asarray(predict_microbatch_seconds(fit, ns), dtype=float)
    var = cov[0, 0] + 2.0 * ns * cov[0, 1] + ns * ns * cov[1, 1]
    half = t_quantile(level, dof) * np.sqrt(np.maximum(var, 0.0))
    return pred, pred - half, pred + half
