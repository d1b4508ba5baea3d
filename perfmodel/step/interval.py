"""95 % intervals on step-level predictions: low minus baseline at (N, n), and measured vs predicted steps.

A step over ``N`` tokens in micro-batches of ``n`` costs ``(N / n) * fixed + N * per_token (+ per_step)``
per precision. The difference low - base at one (N, n) is linear in the two fits' coefficients::

    D = a * (fixed_low - fixed_base) + N * (per_token_low - per_token_base) + (per_step_low - per_step_base)
    var(D) = sum over the two fits of  [a N] cov [a N]^T  (+ per-step variances),   a = N / n

with each fit's HC3 covariance (independent fits) and Welch-Satterthwaite degrees of freedom, as in
``perfmodel.breakeven.solve``. A "x % faster" is only a claim when this interval excludes zero. ``n`` must not
exceed ``N`` (a step holds at least one whole micro-batch). Fits are fits.json mappings or ``PrecisionFit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.fitting.fitted import PrecisionFit
from perfmodel.fitting.model import LEVEL, t_quantile


@dataclass(frozen=True)
class StepDifference:
    """Predicted step seconds of both precisions at (N, n) and the interval of low - base."""

    base_s: float
    low_s: float
    diff_s: float
    diff_ci: tuple[float, float] | None  # None: no covariance, or too few degrees of freedom
    extrapolated: bool  # n outside the sizes either fit measured
    reason: str | None  # why there is no interval

    @property
    def change(self) -> float:
        return self.diff_s / self.base_s

    @property
    def change_ci(self) -> tuple[float, float] | None:
        return (
            None if self.diff_ci is None else (self.diff_ci[0] / self.base_s, self.diff_ci[1] / self.base_s)
        )

    @property
    def significant(self) -> bool:
        return self.diff_ci is not None and (self.diff_ci[0] > 0 or self.diff_ci[1] < 0)


def _parts(fit: Any) -> tuple[float, float, np.ndarray | None, float, float, float, tuple[float, float]]:
    """fixed, per_token, cov (or None), dof, per_step, per_step variance, measured size range."""
    if isinstance(fit, PrecisionFit):
        sizes = fit.sizes or (0,)
        return (
            fit.fixed_s,
            fit.per_token_s,
            fit.time.cov,
            float(fit.time.dof),
            0.0,
            0.0,
            (min(sizes), max(sizes)),
        )
    cov = np.asarray(fit["cov"], dtype=float) if fit.get("cov") is not None else None
    dof = float(fit.get("dof") or np.inf)
    per_step = float(fit.get("per_step_s") or 0.0)
    ci = fit.get("per_step_ci") or [None, None]
    var_step = 0.0
    if per_step and ci[0] is not None and ci[1] is not None:
        var_step = (
            (float(ci[1]) - float(ci[0])) / (2 * t_quantile(LEVEL, dof if np.isfinite(dof) else 1e6))
        ) ** 2
    sizes = [s for s in fit.get("sizes") or [] if s is not None] or [0]
    return (
        float(fit["fixed_s"]),
        float(fit["per_token_s"]),
        cov,
        dof,
        per_step,
        var_step,
        (float(min(sizes)), float(max(sizes))),
    )


def step_seconds(fit: Any, global_tokens: float, n: float, other_s: float = 0.0) -> float:
    fixed, per_token, _, _, per_step, _, _ = _parts(fit)
    return (global_tokens / n) * fixed + global_tokens * per_token + per_step + other_s


def step_difference(
    base: Any,
    low: Any,
    global_tokens: float,
    n: float,
    other_s: float = 0.0,
    level: float = LEVEL,
) -> StepDifference:
    """Low minus baseline step seconds at (N, n) with its ``level`` interval (see the module docstring).

    ``other_s`` (phases that do not depend on n) is added to both sides and cancels in the difference.
    Raises ValueError when ``n > N`` or either is not positive."""
    if not (n > 0 and global_tokens > 0):
        raise ValueError(f"n = {n} and N = {global_tokens} must be positive")
    if n > global_tokens:
        raise ValueError(
            f"n = {n:,.0f} tokens per micro-batch exceeds the global batch N = {global_tokens:,.0f}"
        )
    fb, tb, cb, db, sb, vsb, rb = _parts(base)
    fl, tl, cl, dl, sl, vsl, rl = _parts(low)
    a = global_tokens / n
    base_s = a * fb + global_tokens * tb + sb + other_s
    low_s = a * fl + global_tokens * tl + sl + other_s
    diff = low_s - base_s
    extrapolated = not (max(rb[0], rl[0]) <= n <= min(rb[1], rl[1]))
    if cb is None or cl is None or not (np.all(np.isfinite(cb)) and np.all(np.isfinite(cl))):
        return StepDifference(base_s, low_s, diff, None, extrapolated, "a fit carries no covariance")
    g = np.array([a, global_tokens])
    vb = float(g @ cb @ g) + vsb
    vl = float(g @ cl @ g) + vsl
    den = (vb * vb / db if np.isfinite(db) and db > 0 else 0.0) + (
        vl * vl / dl if np.isfinite(dl) and dl > 0 else 0.0
    )
    dof = (vb + vl) ** 2 / den if den > 0 else np.inf
    t = t_quantile(level, dof if np.isfinite(dof) else 1e6)
    if not np.isfinite(t):
        return StepDifference(base_s, low_s, diff, None, extrapolated, "too few points for an interval")
    half = t * np.sqrt(max(vb + vl, 0.0))
    return StepDifference(
        float(base_s), float(low_s), float(diff), (float(diff - half), float(diff + half)), extrapolated, None
    )


def difference_words(d: StepDifference, low: str, base: str) -> str:
    """'mxfp8 is 12.0 % faster than bf16 (95 % CI 8.1 to 15.9 % faster)' -- or, when the interval holds
    zero, 'no significant difference ...'; never a bare percentage inside the interval."""
    pct = abs(d.change) * 100
    word = "faster" if d.diff_s < 0 else "slower"
    sizes = f"({d.low_s:.3g} s vs {d.base_s:.3g} s per step)"
    extra = " Extrapolated: n is outside the measured sizes." if d.extrapolated else ""
    if d.change_ci is None:
        return f"{low} predicted {pct:.1f} % {word} than {base} {sizes}; no interval ({d.reason}).{extra}"
    lo, hi = (100 * c for c in d.change_ci)
    ci = f"95 % CI {lo:+.1f} to {hi:+.1f} %"
    if not d.significant:
        return (
            f"No significant difference between {low} and {base} at this size: {d.change * 100:+.1f} % "
            f"({ci}) {sizes}.{extra}"
        )
    return f"{low} is {pct:.1f} % {word} than {base} ({ci} step-time change) {sizes}.{extra}"


def predicted_vs_measured(
    fit: Mapping[str, Any] | PrecisionFit,
    num_microbatches: Sequence[float],
    num_tokens: Sequence[float],
    measured_s: Sequence[float],
    level: float = LEVEL,
) -> dict[str, float | int | bool | None]:
    """Measured per-step phase seconds against the fit's prediction ``k * fixed + tokens * per_token``.

    Per step, ``k`` micro-batches and ``tokens`` tokens (as the run recorded them); compares the medians
    over steps. ``inside`` says whether the measured median lies in the prediction's ``level`` band (the
    band of the fitted mean at the median step's k and tokens; run-to-run noise is not in it)."""
    k = np.asarray(num_microbatches, dtype=float)
    tok = np.asarray(num_tokens, dtype=float)
    meas = np.asarray(measured_s, dtype=float)
    ok = np.isfinite(k) & np.isfinite(tok) & np.isfinite(meas) & (k > 0)
    if not ok.any():
        raise ValueError("no step with micro-batch count, tokens and seconds")
    fixed, per_token, cov, dof, per_step, var_step, _ = _parts(fit)
    pred = k[ok] * fixed + tok[ok] * per_token + per_step
    km, tm = float(np.median(k[ok])), float(np.median(tok[ok]))
    pm, mm = float(np.median(pred)), float(np.median(meas[ok]))
    band = None
    if cov is not None and np.all(np.isfinite(cov)):
        g = np.array([km, tm])
        t = t_quantile(level, dof if np.isfinite(dof) else 1e6)
        half = t * np.sqrt(max(float(g @ cov @ g) + var_step, 0.0))
        band = (float(pm - half), float(pm + half)) if np.isfinite(half) else None
    return {
        "steps": int(ok.sum()),
        "microbatches_median": km,
        "tokens_median": tm,
        "predicted_s": pm,
        "predicted_lo_s": band[0] if band else None,
        "predicted_hi_s": band[1] if band else None,
        "measured_s": mm,
        "error_pct": 100 * (pm / mm - 1) if mm > 0 else None,
        "inside": bool(band[0] <= mm <= band[1]) if band else None,
    }
