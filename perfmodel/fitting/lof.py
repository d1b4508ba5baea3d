"""Is a fitted model rejected by the data? Lack of fit, impossible coefficients, hold-out error.

Lack of fit compares, size by size, how far the model misses the mean time with how much independent units
(steps) at that size scatter. With units as the observations (their mean residuals), the classical
pure-error F test: ``F = [sum_s m_s r_s^2 / (S - p)] / [sum_u (r_u - r_s)^2 / (G - S)]`` (S sizes, G units,
p model parameters, a knee counting one). Without repeats at any size, an added squared-size term is tested
instead (CR3 t test). A model is flagged only when the misfit is significant (p < 0.01) *and* large enough to
matter (some size's mean off the model by > 3 %): with thousands of micro-batches any curvature is
"significant". Dynamic batching (no size grid): sizes are grouped into token bins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from perfmodel.fitting.design import Design, weighted
from perfmodel.fitting.linear import fit_response
from perfmodel.fitting.model import LackOfFit

LOF_ALPHA = 0.01
LOF_MIN_REL_DEV = 0.03
_MAX_BINS = 8


def unit_groups(design: Design, ok: np.ndarray) -> np.ndarray:
    """A size group per unit: its label, or (dynamic batching) a quantile bin of its mean tokens."""
    if (design.unit_label[ok] >= 0).all():
        return design.unit_label
    n_bins = int(min(_MAX_BINS, max(2, ok.sum() // 3)))
    edges = np.unique(np.quantile(design.unit_tokens[ok], np.linspace(0, 1, n_bins + 1)))
    return np.digitize(design.unit_tokens, edges[1:-1])


def _cell_frame(design: Design, response: str, pattern_fitted: np.ndarray) -> pd.DataFrame | None:
    """One observation per (step, token bin): the relative residual of the step's micro-batches in that bin.

    Dynamic batching mixes sizes within a step, so step means all sit near the same mean size and hide a
    bend; cells keep the size. Bins: quantiles of the micro-batches' tokens (up to 8). Cells of one step
    share its noise, which makes differences between bins less noisy than the pure error says (the test is
    conservative)."""
    resp = design.responses[response]
    # micro-batch 0 carries the per-step cost, whose estimate absorbs part of any misfit: leave it out
    later = design.x[:, design.names.index("per_step")] == 0 if "per_step" in design.names else True
    cnt = np.where(later, np.asarray(resp.pattern_count), 0.0)
    if not (cnt > 0).any():
        return None
    order = np.argsort(design.tokens)
    cum = np.cumsum(cnt[order]) / cnt.sum()
    qs = np.interp(np.linspace(0, 1, _MAX_BINS + 1)[1:-1], cum, design.tokens[order])
    bins = np.digitize(design.tokens, np.unique(qs))
    onehot = np.eye(int(bins.max()) + 1)[bins] * np.asarray(later, float).reshape(-1, 1)  # (patterns, bins)
    c = np.asarray(resp.count @ onehot)
    tot = np.asarray(resp.total @ onehot)
    fit = np.asarray(resp.count @ (onehot * pattern_fitted[:, None]))
    tok = np.asarray(resp.count @ (onehot * design.tokens[:, None]))
    u, b = np.nonzero((c > 0) & (fit > 0))
    if len(np.unique(b)) < 3:
        return None
    return pd.DataFrame(
        {"g": b, "r": (tot[u, b] - fit[u, b]) / fit[u, b], "f": 1.0, "n": tok[u, b] / c[u, b]}
    )


def _curvature_p(design: Design, response: str) -> float | None:
    """p-value of an added (standardized) squared-size term, CR3 t test; None when it cannot be tested."""
    n = design.tokens
    z = (n - n.mean()) / (n.std() or 1.0)
    x = np.column_stack([design.x, z * z])
    fit = fit_response(x, (*design.names, "curvature"), design.responses[response])
    if fit is None or not fit.has("curvature") or not np.isfinite(fit.cov).all() or fit.dof < 1:
        return None
    se = fit.se("curvature")
    if not se > 0:
        return None
    return float(2 * stats.t.sf(abs(fit.coef("curvature")) / se, fit.dof))


def size_parameters(design: Design, response: str, n_params: int) -> int:
    """How many of a model's parameters move the *unit means*: a per-step term on micro-batch 0 is a constant
    share of every unit with the same micro-batch count, so it fits within steps, not across sizes."""
    resp = design.responses[response]
    ok = resp.unit_count > 0
    xbar = np.asarray(resp.count @ design.x)[ok] / resp.unit_count[ok, None]
    scale = np.abs(xbar).max(axis=0)
    rank = np.linalg.matrix_rank(xbar / np.where(scale > 0, scale, 1.0), tol=1e-8)
    return int(n_params - (design.x.shape[1] - rank))


def lack_of_fit(
    design: Design,
    response: str,
    unit_resid: np.ndarray,
    unit_fitted: np.ndarray,
    n_params: int,
    refit: Callable[[Design], tuple[np.ndarray, np.ndarray] | None] | None = None,
    pattern_fitted: np.ndarray | None = None,
    line: bool = False,
) -> LackOfFit | None:
    """Test a fitted model against the sizes (None when there are too few sizes to test anything).

    Timing noise scales with the time (a 16k-token micro-batch varies by milliseconds where a 256-token one
    varies by microseconds), so the test is on relative residuals of a relative fit: ``refit`` refits the
    model on the design weighted by 1 / fitted^2 per unit (WLS) and returns its (unit residuals, unit fitted
    values); without it the given fit's residuals are used. When steps hold micro-batches of several sizes
    (dynamic batching) and ``pattern_fitted`` (the fit's value per regressor pattern) is given, the
    observations are (step, token bin) cells instead of step means (:func:`_cell_frame`), and for a
    straight line (``line``) an added squared-size term is tested as well (the smaller p, Bonferroni)."""
    if refit is not None:
        ok0 = np.isfinite(unit_fitted) & (unit_fitted > 0)
        w = np.where(ok0, 1.0 / np.where(ok0, unit_fitted, 1.0) ** 2, 0.0)
        again = refit(weighted(design, w, only=response))
        if again is not None:
            unit_resid, unit_fitted = again
    ok = np.isfinite(unit_resid) & np.isfinite(unit_fitted) & (unit_fitted > 0)
    cells = None
    if pattern_fitted is not None and (design.unit_label[ok] < 0).any():
        cells = _cell_frame(design, response, pattern_fitted)
    if cells is not None:  # steps hold several sizes: a bend shows within steps, not in their means
        frame = cells
        n_params = int(n_params)
    else:
        group = unit_groups(design, ok)
        n_params = size_parameters(design, response, n_params)
        frame = pd.DataFrame(
            {"g": group[ok], "r": unit_resid[ok] / unit_fitted[ok], "f": 1.0, "n": design.unit_tokens[ok]}
        )
    by = frame.groupby("g", sort=True)
    r_s, f_s, m_s = by["r"].mean(), by["f"].mean(), by["r"].size()
    n_s = by["n"].mean()
    sizes, units = len(r_s), (len(frame) if cells is not None else int(ok.sum()))
    if sizes < n_params + 1:
        return None
    rel = (r_s / f_s).to_numpy()
    worst = int(np.argmax(np.abs(rel)))
    p: float | None
    noise: float | None = None
    if units > sizes:
        ss_lof = float((m_s * r_s * r_s).sum())
        ss_pe = float(((frame["r"] - frame["g"].map(r_s)) ** 2).sum())
        df_lof, df_pe = sizes - n_params, units - sizes
        noise = float(stats.t.ppf(0.975, df_pe) * np.sqrt(ss_pe / df_pe / float(m_s.mean())))
        if ss_pe > 0:
            p = float(stats.f.sf((ss_lof / df_lof) / (ss_pe / df_pe), df_lof, df_pe))
        else:
            p = 0.0 if ss_lof > 0 else 1.0
        test = "pure_error_F"
        p_curv = _curvature_p(design, response) if cells is not None and line else None
        if p_curv is not None:  # a wide bin hides misfit in its pure error: the squared-size term too
            test, p = "pure_error_F+quadratic", min(1.0, 2.0 * min(p, p_curv))  # Bonferroni
    else:
        test, p = "quadratic", (_curvature_p(design, response) if n_params <= 2 or line else None)
        df_res = units - n_params
        if df_res >= 1:
            noise = float(stats.t.ppf(0.975, df_res) * np.sqrt(float((frame["r"] ** 2).sum()) / df_res))
    rel_dev = float(np.abs(rel[worst]))
    flag = p is not None and p < LOF_ALPHA and rel_dev > LOF_MIN_REL_DEV
    small_above = bool(np.all(rel[: max(1, sizes // 3)] > 0))
    worst_size = round(float(n_s.iloc[worst]))
    what = "line" if line else "model"
    weak = False
    if p is None:
        note = f"the {what} is untested (no lack-of-fit test: too few sizes or units)"
    elif not flag:
        weak = noise is None or not np.isfinite(noise) or noise > LOF_MIN_REL_DEV or rel_dev > LOF_MIN_REL_DEV
        spread = "n/a" if noise is None or not np.isfinite(noise) else f"+-{noise:.1%}"
        if weak:  # the test lacks the power to see a material bend: that is not evidence that the model fits
            note = (
                f"no evidence against the {what} (noise {spread} at a size mean; it misses the mean time by "
                f"up to {rel_dev:.1%}, at {worst_size:,} tokens)"
            )
        else:
            note = f"the {what} fits the measured sizes (within {rel_dev:.1%}; noise {spread} at a size mean)"
    else:
        note = f"it misses the mean time by {rel_dev:.1%} at {worst_size:,} tokens"
        if small_above:
            note += "; small micro-batches are slower than it predicts (a launch-bound host or an under-filled GPU)"
    return LackOfFit(flag, test, p, rel_dev, worst_size, small_above, None, note, noise, weak)


def implausible(
    fixed_s: float, fixed_ci: Sequence[float], per_token_s: float, per_token_ci: Sequence[float]
) -> list[str]:
    """Coefficients no machine can have: a fixed or per-token cost below zero with its whole 95 % interval.

    The line is then an artefact of the sizes measured (timings that bend, a size range too narrow, noise);
    the breakeven built on it is not to be trusted."""
    out = []
    if np.isfinite(fixed_ci[1]) and fixed_ci[1] < 0:
        out.append(
            f"fixed cost {fixed_s * 1e3:.3g} ms per micro-batch is below zero (95 % CI up to {fixed_ci[1] * 1e3:.3g} ms): "
            "the timings are not a straight line down to zero tokens (a knee, or too narrow a size range)"
        )
    if np.isfinite(per_token_ci[1]) and per_token_ci[1] < 0:
        out.append(
            f"per-token cost {per_token_s * 1e6:.3g} us is below zero (95 % CI up to {per_token_ci[1] * 1e6:.3g} us): "
            "larger micro-batches measured faster; check that the inputs are one model, precision and phase"
        )
    return out


def holdout_mape(design: Design, response: str, held: np.ndarray, pattern_fitted: np.ndarray) -> float:
    """Mean absolute percentage error of the mean time at the ``held`` sizes, predicted by a model refitted
    without them (``pattern_fitted``: its prediction for every regressor pattern)."""
    resp = design.responses[response]
    cnt = resp.unit_count
    tot = resp.unit_total
    pred = np.asarray(resp.count @ pattern_fitted).ravel()
    errs = []
    for s in held:
        sel = (design.unit_label == s) & (cnt > 0)
        errs.append(abs(pred[sel].sum() - tot[sel].sum()) / tot[sel].sum())
    return float(np.mean(errs))


def holdout_splits(design: Design) -> dict[str, np.ndarray]:
    """Sizes to hold out: every other inner size (interpolation, >= 4 sizes), the largest (extrapolation,
    >= 3 sizes). None of them for dynamic batching (no size grid)."""
    if (design.unit_label < 0).any():
        return {}
    sizes = np.unique(design.unit_label)
    out = {}
    if len(sizes) >= 4:
        out["interpolation"] = sizes[1:-1:2]
    if len(sizes) >= 3:
        out["extrapolation"] = sizes[-1:]
    return out
