"""Least squares on a design, with leave-one-unit-out (CR3) covariance and bootstrap replicates.

Estimator: OLS on every micro-batch (a cell of ``c`` identical-regressor micro-batches enters with weight
``c``). Micro-batches of one unit (a step) share noise, so the covariance is clustered on units, in its
jackknife form (CR3; Bell & McCaffrey 2002, MacKinnon & White 1985's HC3 when every unit is one row)::

    V = sum_u d_u d_u^T,   d_u = (M - S_u)^-1 U_u  = beta - beta(without unit u)

with ``M = X'X``, ``S_u = X_u'X_u`` and ``U_u = X_u' e_u`` -- only per-unit sums, so 100k micro-batches cost
milliseconds. It is undefined (NaN) when dropping one unit leaves the regressors unidentified (e.g. a size
measured in one unit only, with two sizes). Intervals are t-based with ``units - regressors`` degrees of
freedom. Bootstrap replicates solve the same normal equations on resampled unit weights
(:mod:`perfmodel.fitting.bootstrap`), calibrated for small samples.
"""

from __future__ import annotations

import numpy as np

from perfmodel.fitting.bootstrap import Draws, calibrate
from perfmodel.fitting.design import Design, Response, unit_pattern_matrix
from perfmodel.fitting.fitted import LinearFit
from perfmodel.fitting.model import LineFit
from tracing.outputs.errors import InputError

_SINGULAR = 1e-12  # det / prod(diag) of a normal matrix below this: singular
MAX_FAILED_RESAMPLES = 0.05  # more singular resamples than this: the bootstrap says nothing


def identified(x: np.ndarray, cnt: np.ndarray, names: tuple[str, ...]) -> list[int]:
    """Columns of ``x`` the rows with ``cnt > 0`` identify, in order; fixed and per-token are required."""
    ok = cnt > 0
    keep: list[int] = []
    for j in range(x.shape[1]):
        col = x[ok, j]
        if not keep:
            keep.append(j)
            continue
        scale = np.abs(col).max() or 1.0
        base = x[ok][:, keep]
        sw = np.sqrt(cnt[ok])
        beta, *_ = np.linalg.lstsq(base * sw[:, None], col / scale * sw, rcond=None)
        resid = (col / scale - base @ beta) * sw
        centered = (col / scale - np.average(col / scale, weights=cnt[ok])) * sw
        ss = float(centered @ centered)
        if ss > 0 and float(resid @ resid) / ss > 1e-6:
            keep.append(j)
        elif names[j] in ("fixed", "per_token"):
            return []
    return keep


def solve_batch(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Solve each (q x q) symmetric positive semi-definite system; NaN rows where it is (near) singular.

    Singular: det(M) / prod(diag(M)) (1 for orthogonal columns, 0 for dependent ones) below 1e-12."""
    diag = np.prod(np.maximum(np.diagonal(m, axis1=-2, axis2=-1), 0.0), axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = np.isfinite(m).all(axis=(-2, -1)) & (np.linalg.det(m) > _SINGULAR * diag) & (diag > 0)
    out = np.full(v.shape, np.nan)
    if ok.any():
        out[ok] = np.linalg.solve(m[ok], v[ok][..., None])[..., 0]
    return out


def satterthwaite_dofs(
    influence: np.ndarray, resid_u: np.ndarray, groups: np.ndarray | None, names: tuple[str, ...]
) -> np.ndarray:
    """Degrees of freedom of each coefficient's variance (Welch-Satterthwaite over sizes).

    A coefficient moves by ``w_u`` per unit of unit u's mean noise (``influence``: (units, q)); its variance
    is ``sum_s a_s sigma_s^2`` with ``a_s = sum_{u in size s} w_u^2`` and ``sigma_s^2`` estimated from the
    spread of the units at size s (``m_s - 1`` dof each). With geometric sizes the per-token cost rests on
    the largest sizes, so its variance has far fewer degrees of freedom than ``units - parameters``: using
    the latter made 95 % intervals cover ~89 % at 3-5 repeats. Only for the fixed and per-token cost (the
    per-step term is identified within steps); without repeats at every size: ``units - parameters``."""
    q = influence.shape[1]
    ok = np.isfinite(resid_u)
    out = np.full(q, float(ok.sum() - q))
    if groups is None or (groups[ok] < 0).any():
        return out
    idx = np.unique(groups[ok], return_inverse=True)[1].reshape(-1)
    m = np.bincount(idx)
    if (m < 2).any():
        return out
    r = resid_u[ok]
    mean = np.bincount(idx, weights=r) / m
    var = np.bincount(idx, weights=(r - mean[idx]) ** 2) / (m - 1)
    for j, name in enumerate(names):
        if name not in ("fixed", "per_token", "per_sq_token"):
            continue
        a = np.bincount(idx, weights=influence[ok, j] ** 2) * var
        den = float(np.sum(a * a / (m - 1)))
        if den > 0:
            out[j] = min(out[j], float(a.sum() ** 2 / den))
    return np.maximum(out, 1.0)


def fit_response(
    x: np.ndarray,
    names: tuple[str, ...],
    resp: Response,
    draws: Draws | None = None,
    groups: np.ndarray | None = None,
) -> LinearFit | None:
    """OLS of one response on pattern regressors ``x`` (see the module docstring); None when the data cannot
    identify a fixed and a per-token cost (fewer than two distinct sizes with this response). ``groups``:
    the size label of each unit, for per-coefficient degrees of freedom (:func:`satterthwaite_dofs`)."""
    g = resp.count.shape[0]
    cnt = resp.pattern_count
    keep = identified(x, cnt, names)
    if len(keep) < 2:
        return None
    names = tuple(names[j] for j in keep)
    scale = np.abs(x[cnt > 0][:, keep]).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x[:, keep] / scale
    q = len(keep)
    xx = (xs[:, :, None] * xs[:, None, :]).reshape(len(xs), q * q)
    tot = resp.pattern_total
    m = (cnt @ xx).reshape(q, q)
    v = xs.T @ tot
    beta = solve_batch(m[None], v[None])[0]
    if not np.isfinite(beta).all():
        return None
    s_u = np.asarray(resp.count @ xx).reshape(g, q, q)
    u_u = np.asarray(resp.total @ xs) - s_u @ beta
    cnt_u = resp.unit_count
    delta = solve_batch(m[None] - s_u, u_u)
    cov = delta.T @ delta if np.isfinite(delta).all() else np.full((q, q), np.nan)
    g_eff = int((cnt_u > 0).sum())
    dof = float(g_eff - q)
    yy = float(resp.sumsq.sum())
    n_rows = float(cnt.sum())
    sse = max(yy - 2 * beta @ v + beta @ m @ beta, 0.0)
    sst = yy - float(tot.sum()) ** 2 / n_rows
    fitted_u = np.asarray(resp.count @ (xs @ beta)).ravel()
    tot_u = resp.unit_total
    with np.errstate(invalid="ignore", divide="ignore"):
        resid_u = np.where(cnt_u > 0, (tot_u - fitted_u) / cnt_u, np.nan)
        fit_mean_u = np.where(cnt_u > 0, fitted_u / cnt_u, np.nan)
    influence = np.asarray(resp.count @ xs) @ np.linalg.inv(m)  # (units, q): w_u per coefficient
    dofs = satterthwaite_dofs(influence, resid_u, groups, names)
    boot = raw = np.empty((0, q))
    boot_note = None
    if draws is not None and draws.n_boot:
        m_b = draws.project(resp.count, xx).reshape(-1, q, q)
        raw = solve_batch(m_b, draws.project(resp.total, xs))
        failed = float(np.mean(~np.isfinite(raw).all(axis=1)))
        if failed > MAX_FAILED_RESAMPLES:
            boot_note = (
                f"{failed:.0%} of resamples cannot fit the model (a size measured in one unit only is left "
                "out of them): no bootstrap interval"
            )
            raw = np.empty((0, q))
        else:
            boot = calibrate(raw, beta, draws.expand, dofs) / scale
            raw = raw / scale
    tokens = x[cnt > 0, 1]
    return LinearFit(
        names=names,
        beta=beta / scale,
        cov=cov / np.outer(scale, scale),
        dof=dof,
        dofs=dofs,
        n_units=g_eff,
        n_rows=int(n_rows),
        r2=1.0 - sse / sst if sst > 0 else 1.0,
        residual_sd=float(np.sqrt(sse / (n_rows - q))) if n_rows > q else float("nan"),
        boot=boot,
        boot_raw=raw,
        boot_note=boot_note,
        unit_resid=resid_u,
        unit_fitted=fit_mean_u,
        pattern_fitted=xs @ beta,
        unit_delta=np.nan_to_num(delta) / scale,
        x_min=float(tokens.min()),
        x_max=float(tokens.max()),
    )


def fit_linear(design: Design, response: str, draws: Draws | None = None) -> LinearFit | None:
    """OLS of ``response`` on the design's regressors (None when the response is absent or unidentified)."""
    resp = design.responses.get(response)
    if resp is None or resp.n_rows == 0:
        return None
    groups = design.unit_label if (design.unit_label >= 0).all() else None
    return fit_response(design.x, design.names, resp, draws, groups)


def points_response(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, Response]:
    """Pattern regressors [1, x] and a Response with every point its own unit (for plain line fits)."""
    xu, pat = np.unique(np.asarray(x, dtype=float), return_inverse=True)
    n = len(x)
    unit = np.arange(n)
    y = np.asarray(y, dtype=float)
    count = unit_pattern_matrix(unit, pat.ravel(), np.ones(n), n, len(xu))
    total = unit_pattern_matrix(unit, pat.ravel(), y, n, len(xu))
    return np.stack([np.ones_like(xu), xu], axis=1), Response(count, total, y * y, n)


def fit_line(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> LineFit:
    """OLS line ``y = intercept + slope * x`` with HC3 covariance (every point its own unit); ``groups``
    (a size label per point) gives per-coefficient degrees of freedom."""
    if len(np.unique(np.asarray(x, dtype=float))) < 2:
        raise InputError("a line needs at least two distinct sizes")
    px, resp = points_response(x, y)
    fit = fit_response(px, ("fixed", "per_token"), resp, None, groups)
    if fit is None:
        raise InputError("a line needs at least two distinct sizes")
    return fit.line()
