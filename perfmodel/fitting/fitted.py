"""The fitted objects every later stage reads: a linear fit, a knee model, one basis, one precision.

Containers only (and the few numbers derived from them); fitting lives in :mod:`perfmodel.fitting.linear`,
:mod:`perfmodel.fitting.knee` and :mod:`perfmodel.fitting.fit_all`, which fills them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfmodel.fitting.bootstrap import percentile_ci
from perfmodel.fitting.design import Design
from perfmodel.fitting.model import LEVEL, Curve, LackOfFit, LineFit, t_quantile

PER_STEP_TERMS = ("per_step", "per_step_spread")  # on micro-batch 0 / spread over the step (global batches)


@dataclass(frozen=True, eq=False)
class LinearFit:
    """Coefficients ``beta`` for ``names``, CR3 covariance, dof, calibrated bootstrap replicates (B, p)."""

    names: tuple[str, ...]
    beta: np.ndarray
    cov: np.ndarray
    dof: float  # units - regressors
    dofs: np.ndarray  # (p,) per coefficient (Satterthwaite over sizes for fixed and per-token)
    n_units: int
    n_rows: int
    r2: float
    residual_sd: float
    boot: np.ndarray
    boot_raw: np.ndarray  # the same replicates before the small-sample calibration (for models built on them)
    boot_note: str | None  # why there are no replicates although some were asked for
    unit_resid: np.ndarray  # (units,) mean residual of the unit's rows; NaN for a unit without this response
    unit_fitted: np.ndarray  # (units,) mean fitted value of the unit's rows
    pattern_fitted: np.ndarray  # (patterns,) fitted value of each regressor pattern
    unit_delta: np.ndarray  # (units, p) beta - beta without the unit (CR3 terms: cross-covariances of fits)
    x_min: float
    x_max: float

    def has(self, name: str) -> bool:
        return name in self.names

    def coef(self, name: str) -> float:
        return float(self.beta[self.names.index(name)]) if name in self.names else float("nan")

    def se(self, name: str) -> float:
        i = self.names.index(name)
        return float(np.sqrt(self.cov[i, i]))

    def dof_of(self, weights: dict[str, float]) -> float:
        """Degrees of freedom of a contrast: the smallest of the coefficients it uses."""
        used = [self.dofs[self.names.index(n)] for n, w in weights.items() if w and n in self.names]
        return float(min(used)) if used else self.dof

    def ci(self, name: str, level: float = LEVEL) -> tuple[float, float]:
        est, half = self.coef(name), t_quantile(level, self.dof_of({name: 1.0})) * self.se(name)
        return (est - half, est + half)

    def boot_ci(self, name: str, level: float = LEVEL) -> tuple[float, float] | None:
        if not len(self.boot) or name not in self.names:
            return None
        return percentile_ci(self.boot[:, self.names.index(name)], level)

    def contrast(self, weights: dict[str, float]) -> tuple[float, float, np.ndarray]:
        """(estimate, variance, bootstrap replicates) of ``sum_k weights[k] * beta[k]`` (absent names: 0)."""
        c = np.array([weights.get(n, 0.0) for n in self.names])
        boot = self.boot @ c if len(self.boot) else np.empty(0)
        return float(c @ self.beta), float(c @ self.cov @ c), boot

    def cross_cov(self, other: LinearFit, name: str = "fixed") -> float:
        """CR3 covariance of coefficient ``name`` of this fit and of ``other`` (fitted on the same units)."""
        i, j = self.names.index(name), other.names.index(name)
        return float(self.unit_delta[:, i] @ other.unit_delta[:, j])

    def line(self, slope_extra: dict[str, float] | None = None) -> LineFit:
        """The (fixed, per-token) part as a ``LineFit`` (per-token plus ``slope_extra`` terms, e.g. the
        attention term at the reference sequence length)."""
        c_int = {"fixed": 1.0}
        c_slope = {"per_token": 1.0, **(slope_extra or {})}
        a, va, _ = self.contrast(c_int)
        b, vb, _ = self.contrast(c_slope)
        ci = np.array([c_int.get(n, 0.0) for n in self.names])
        cs = np.array([c_slope.get(n, 0.0) for n in self.names])
        cab = float(ci @ self.cov @ cs)
        return LineFit(
            intercept=a,
            slope=b,
            cov=np.array([[va, cab], [cab, vb]]),
            n_points=self.n_units,
            dof=int(self.dof) if np.isfinite(self.dof) else 0,
            dofs=(self.dof_of(c_int), self.dof_of(c_slope)),
            r2=self.r2,
            residual_sd=self.residual_sd,
            x_min=self.x_min,
            x_max=self.x_max,
        )


@dataclass(frozen=True, eq=False)
class SegmentedFit:
    kind: str  # "knee" | "parts"
    curve: Curve  # micro-batch seconds vs n (not the first of its step; attention at the reference length)
    boot: Curve | None  # calibrated bootstrap replicates of the curve
    terms: dict[str, float]  # per_step, per_step_spread, per_sq_token (where in the model)
    boot_terms: dict[str, np.ndarray] = field(default_factory=dict)
    dof: float = float("nan")
    n_params: int = 0
    unit_resid: np.ndarray | None = None
    unit_fitted: np.ndarray | None = None
    pattern_fitted: np.ndarray | None = None
    anchor_slope_s: float | None = None  # parts: the GPU-busy slope the GPU line uses


@dataclass(frozen=True, eq=False)
class BasisFit:
    """One response of one precision (``basis``: ``wall`` = seconds, ``gpu_busy`` = GPU busy seconds): its
    line, lack of fit, implausible coefficients, the knee model when the line is rejected, and ``model``:
    which model the data chose (``line`` | ``knee`` | ``parts``; None when none fits)."""

    basis: str
    line: LinearFit
    lack_of_fit: LackOfFit | None
    implausible: tuple[str, ...] = ()
    knee: SegmentedFit | None = None
    knee_lack_of_fit: LackOfFit | None = None
    model: str | None = "line"
    note: str = ""
    seq_len_ref: float | None = None
    refused: str | None = None  # why no model is fitted at all (implausible costs, overlapping windows)

    @property
    def line_ok(self) -> bool:
        """The straight line is not rejected: no significant, material lack of fit; plausible coefficients."""
        return not (self.lack_of_fit is not None and self.lack_of_fit.flag) and not self.implausible

    @property
    def linearity(self) -> str:
        """What the data say of the straight line: ``rejected`` (lack of fit or implausible coefficients),
        ``untested`` (too few sizes for a lack-of-fit test: a line through two sizes always fits),
        ``no evidence against`` (the test could not see a material bend through the noise) or ``fits``."""
        if not self.line_ok:
            return "rejected"
        lof = self.lack_of_fit
        if lof is None or lof.p_value is None:
            return "untested"
        return "no evidence against" if lof.weak else "fits"

    @property
    def rejection(self) -> str:
        """Why the straight line is rejected, in a few words ('' when it is not)."""
        lof = [self.lack_of_fit.note] if self.lack_of_fit is not None and self.lack_of_fit.flag else []
        return "; ".join([*lof, *self.implausible])

    @property
    def knee_failure(self) -> str:
        """Why no knee model took over ('' when one did or none was needed)."""
        if self.model is not None or self.line_ok or self.refused:
            return ""
        if self.knee is None:
            return "too few sizes for a knee model (it needs 5)"
        note = self.knee_lack_of_fit.note if self.knee_lack_of_fit else "it does not fit"
        return f"the {self.knee.kind} model does not fit either ({note})"

    @property
    def slope_extra(self) -> dict[str, float]:
        """Attention's quadratic term at the reference sequence length, as extra cost per token."""
        if self.line.has("per_sq_token") and self.seq_len_ref:
            return {"per_sq_token": float(self.seq_len_ref)}
        return {}

    def line2(self) -> LineFit:
        """(fixed, per-token) of the line; per-token includes the attention term at the reference length."""
        return self.line.line(self.slope_extra)

    def line_boot(self) -> np.ndarray:
        """(B, 2) bootstrap replicates of (fixed, per-token) as in :meth:`line2`."""
        if not len(self.line.boot):
            return np.empty((0, 2))
        _, _, a = self.line.contrast({"fixed": 1.0})
        _, _, b = self.line.contrast({"per_token": 1.0, **self.slope_extra})
        return np.stack([a, b], axis=1)

    @property
    def chosen(self) -> str | None:
        return self.model

    def curve(self) -> Curve:
        """The chosen model's micro-batch curve (the line when it is chosen or nothing fits)."""
        if self.model in ("knee", "parts") and self.knee is not None:
            return self.knee.curve
        line = self.line2()
        return Curve.line(line.intercept, line.slope)

    def boot_curve(self) -> Curve | None:
        if self.model in ("knee", "parts") and self.knee is not None:
            return self.knee.boot
        b = self.line_boot()
        return Curve.line(b[:, 0], b[:, 1]) if len(b) else None

    def per_step_boot(self) -> np.ndarray:
        """(B,) bootstrap replicates of the per-step cost (zeros without one; empty without replicates)."""
        terms = [t for t in PER_STEP_TERMS if self.line.has(t)]
        b = self.boot_curve()
        n = 0 if b is None else len(np.atleast_1d(b.a1))
        if not terms:
            return np.zeros(n)
        if self.model in ("knee", "parts") and self.knee is not None:
            if self.knee.boot is None:  # no replicates (--bootstrap 0)
                return np.empty(0)
            return np.atleast_1d(
                np.asarray(sum(self.knee.boot_terms.get(t, np.zeros(n)) for t in terms), float)
            )
        return self.line.contrast({t: 1.0 for t in terms})[2]

    def per_step(self, level: float = LEVEL) -> tuple[float, tuple[float, float] | None, str] | None:
        """(seconds per step, 95 % interval, how identified) from the chosen model; None when unidentified."""
        terms = [t for t in PER_STEP_TERMS if self.line.has(t)]
        if not terms:
            return None
        how = " + ".join(
            {"per_step": "micro-batch 0 of each step", "per_step_spread": "two global batch sizes"}[t]
            for t in terms
        )
        if self.model in ("knee", "parts") and self.knee is not None:
            est = float(sum(self.knee.terms.get(t, 0.0) for t in terms))
            boot = sum(self.knee.boot_terms[t] for t in terms if t in self.knee.boot_terms)
            ci = percentile_ci(np.asarray(boot), level) if np.size(boot) > 1 else None
            return est, ci, how
        est, var, _ = self.line.contrast({t: 1.0 for t in terms})
        half = t_quantile(level, self.line.dof) * np.sqrt(var)
        return est, ((est - half, est + half) if np.isfinite(half) else None), how


@dataclass(frozen=True, eq=False)
class PrecisionFit:
    """Everything fitted for one (model, phase, precision): wall and GPU-busy bases, host-stall and memory
    lines, hold-out errors, per-size means. ``fixed_s`` / ``per_token_s`` / ``time`` / ``boot`` are the
    wall line's (per-token including attention at the reference sequence length)."""

    model: str
    phase: str
    precision: str
    design: Design
    wall: BasisFit
    busy: BasisFit | None = None
    stall: LinearFit | None = None
    stall_lack_of_fit: LackOfFit | None = None
    stall_knee: SegmentedFit | None = (
        None  # host stall's knee model (fitted when the wall or stall line bends)
    )
    stall_knee_lack_of_fit: LackOfFit | None = None
    memory: LinearFit | None = None
    holdout: dict[str, Any] = field(default_factory=dict)
    sizes: tuple[int, ...] = ()
    size_mean_s: tuple[float, ...] = ()
    size_mean_tokens: tuple[float, ...] = ()
    size_count: tuple[int, ...] = ()
    stall_size_mean_s: tuple[float, ...] | None = None
    busy_size_mean_s: tuple[float, ...] | None = None
    size_mean_curve_s: tuple[float, ...] | None = None  # per size, the fitted per-step cost taken out
    busy_size_mean_curve_s: tuple[float, ...] | None = None
    points: dict[str, np.ndarray] | None = None  # one point per unit: label, repeat, x, seconds
    n_microbatches: int = 0
    outliers: tuple[dict, ...] = ()  # steps left out before the fit (perfmodel.fitting.outliers), named
    outlier_note: str | None = None  # why none were left out although some are far off (heavy tails)

    @property
    def time(self) -> LineFit:
        return self.wall.line2()

    def sizes_around(self, knee: float) -> tuple[int, int]:
        """(measured sizes below, above) ``knee`` tokens (sizes as mean tokens processed): a line segment of a
        knee model rests on the sizes on its side; with fewer than two its intercept or slope is not measured."""
        x = np.asarray(self.size_mean_tokens or self.sizes, dtype=float)
        k = float(knee)
        return int(np.sum(x < k)), int(np.sum(x > k))

    @property
    def fixed_s(self) -> float:
        return self.time.intercept

    @property
    def per_token_s(self) -> float:
        return self.time.slope

    @property
    def per_step_s(self) -> float:
        ps = self.wall.per_step()
        return ps[0] if ps else 0.0

    @property
    def boot(self) -> np.ndarray:
        return self.wall.line_boot()

    @property
    def boot_unit(self) -> str:
        return self.design.unit_kind

    @property
    def lack_of_fit(self) -> LackOfFit | None:
        return self.wall.lack_of_fit
