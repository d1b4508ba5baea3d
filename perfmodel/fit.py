"""Fit ``seconds = fixed_s + per_token_s * n`` per (model, phase, precision), with honest uncertainty.

Estimator: ordinary least squares on every micro-batch. Micro-batch times are heteroscedastic (bigger
micro-batches vary more in absolute terms), so standard errors are HC3 (MacKinnon & White 1985): the
sandwich ``A X' diag(e_i^2 / (1 - h_ii)^2) X A`` with ``A = (X'X)^-1`` and leverages ``h_ii``; it stays
honest with few points per size. Intervals are t-based with ``points - 2`` degrees of freedom. The bootstrap
over repeats (:mod:`perfmodel.bootstrap`) gives a second, assumption-light interval.

Lack of fit: a line is wrong when small micro-batches under-fill the hardware (time flat, then linear). With
repeats at each size, the residual variance beyond replicate noise is tested (pure-error F test); without
repeats, an added n^2 term is tested. Both are flagged only when also large (> 3 % of the line at some size),
because with thousands of micro-batches any curvature is "significant". ``--min-tokens`` drops the small end.

Hold-out accuracy: fit on part of the grid, predict the mean time at the held-out sizes (MAPE).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from perfmodel.bootstrap import REPEAT_UNIT, bootstrap_lines, resampling_cells
from perfmodel.model import LackOfFit, LineFit, PrecisionFit
from tracing.outputs.errors import InputError

LOF_ALPHA = 0.01
LOF_MIN_REL_DEV = 0.03
GROUP_KEYS = ("model", "phase", "precision")


def _hc3(x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray, float]:
    """(intercept, slope, residuals, leverages, A-scaled design rows, mean x) on centered x."""
    xm = float(x.mean())
    xc = x - xm
    sxx = float(xc @ xc)
    slope = float(xc @ (y - y.mean())) / sxx
    intercept = float(y.mean()) - slope * xm
    resid = y - (intercept + slope * x)
    lev = 1.0 / len(x) + xc * xc / sxx
    # Rows of X A in the centered parametrization: [1/N, xc/Sxx].
    xa = np.stack([np.full_like(xc, 1.0 / len(x)), xc / sxx], axis=1)
    return intercept, slope, resid, lev, xa, xm


def _uncenter(cov_c: np.ndarray, xm: float) -> np.ndarray:
    j = np.array([[1.0, -xm], [0.0, 1.0]])
    return j @ cov_c @ j.T


def fit_line(x: np.ndarray, y: np.ndarray) -> LineFit:
    """OLS line with HC3 covariance. Needs at least two distinct x values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(np.unique(x)) < 2:
        raise InputError("a line needs at least two distinct sizes")
    intercept, slope, resid, lev, xa, xm = _hc3(x, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        omega = resid * resid / (1.0 - lev) ** 2
    if np.any(lev > 1.0 - 1e-10):
        cov = np.full((2, 2), np.nan)
    else:
        cov = _uncenter((xa * omega[:, None]).T @ xa, xm)
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    dof = len(x) - 2
    return LineFit(
        intercept=intercept,
        slope=slope,
        cov=cov,
        n_points=len(x),
        dof=dof,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        residual_sd=float(np.sqrt(ss_res / dof)) if dof > 0 else float("nan"),
        x_min=float(x.min()),
        x_max=float(x.max()),
    )


def hc3_intercept_cross_cov(x: np.ndarray, y1: np.ndarray, y2: np.ndarray) -> float:
    """HC3 covariance of the intercepts of two lines fitted on the same rows (e.g. stall and time)."""
    x = np.asarray(x, dtype=float)
    _, _, e1, lev, xa, xm = _hc3(x, np.asarray(y1, dtype=float))
    _, _, e2, _, _, _ = _hc3(x, np.asarray(y2, dtype=float))
    w = e1 * e2 / (1.0 - lev) ** 2
    return float(_uncenter((xa * w[:, None]).T @ xa, xm)[0, 0]) if np.all(lev < 1 - 1e-10) else float("nan")


def _lof_stats(x: np.ndarray, y: np.ndarray, label: np.ndarray) -> tuple[str, float | None, float, int, bool]:
    fit = fit_line(x, y)
    sizes = np.unique(label)
    rel_dev = np.array(
        [
            (y[label == s].mean() - (fit.intercept + fit.slope * x[label == s].mean()))
            / (fit.intercept + fit.slope * x[label == s].mean())
            for s in sizes
        ]
    )
    worst = int(np.argmax(np.abs(rel_dev)))
    small = rel_dev[: max(1, len(sizes) // 3)]
    small_above = bool(np.all(small > 0))
    ux, gid = np.unique(x, return_inverse=True)
    p: float | None = None
    if len(ux) >= 3 and len(ux) < len(x):
        gmeans = np.bincount(gid, weights=y) / np.bincount(gid)
        ss_pe = float(((y - gmeans[gid]) ** 2).sum())
        resid = y - (fit.intercept + fit.slope * x)
        ss_lof = max(float(resid @ resid) - ss_pe, 0.0)
        df_lof, df_pe = len(ux) - 2, len(x) - len(ux)
        if ss_pe > 0:
            p = float(stats.f.sf((ss_lof / df_lof) / (ss_pe / df_pe), df_lof, df_pe))
        test = "pure_error_F"
    else:
        test = "quadratic"
        if len(ux) >= 3 and len(x) > 3:
            p = _quadratic_p(x, y)
    return test, p, float(np.abs(rel_dev[worst])), int(sizes[worst]), small_above


def _quadratic_p(x: np.ndarray, y: np.ndarray) -> float | None:
    xs = (x - x.mean()) / x.std()
    design = np.stack([np.ones_like(xs), xs, xs * xs], axis=1)
    inv = np.linalg.pinv(design.T @ design)
    beta = inv @ design.T @ y
    e = y - design @ beta
    lev = np.einsum("ij,jk,ik->i", design, inv, design)
    if np.any(lev > 1 - 1e-10):
        return None
    cov = inv @ (design.T * (e * e / (1 - lev) ** 2)) @ design @ inv
    if cov[2, 2] <= 0:
        return None
    return float(2 * stats.t.sf(abs(beta[2]) / np.sqrt(cov[2, 2]), len(x) - 3))


def lack_of_fit(x: np.ndarray, y: np.ndarray, label: np.ndarray) -> LackOfFit | None:
    """Test the straight line against the sizes (None with fewer than three sizes: nothing to test)."""
    x, y, label = np.asarray(x, float), np.asarray(y, float), np.asarray(label)
    if len(np.unique(label)) < 3:
        return None
    test, p, rel, worst, small_above = _lof_stats(x, y, label)
    flag = p is not None and p < LOF_ALPHA and rel > LOF_MIN_REL_DEV
    suggestion = None
    if flag:
        sizes = np.unique(label)
        for cut in sizes[1:-2]:
            keep = label >= cut
            _, p2, rel2, _, _ = _lof_stats(x[keep], y[keep], label[keep])
            if not (p2 is not None and p2 < LOF_ALPHA and rel2 > LOF_MIN_REL_DEV):
                suggestion = int(cut)
                break
    if not flag:
        note = "a straight line fits the measured sizes"
    elif small_above:
        note = (
            f"small micro-batches take longer than the line predicts (worst {rel:.1%} at {worst} tokens): "
            "the hardware is under-filled there" + (f"; try --min-tokens {suggestion}" if suggestion else "")
        )
    else:
        note = f"the line misses the mean time by {rel:.1%} at {worst} tokens" + (
            f"; try --min-tokens {suggestion}" if suggestion else ""
        )
    return LackOfFit(flag, test, p, rel, worst, small_above, suggestion, note)


def holdout_errors(x: np.ndarray, y: np.ndarray, label: np.ndarray) -> dict[str, object]:
    """Fit on part of the grid, predict the mean time of the rest; MAPE over held-out sizes.

    interpolation: every other inner size held out (needs >= 4 sizes); extrapolation: the largest size held
    out (needs >= 3 sizes).
    """
    sizes = np.unique(label)
    out: dict[str, object] = {"interpolation_mape": None, "extrapolation_mape": None}
    splits = {}
    if len(sizes) >= 4:
        splits["interpolation"] = sizes[1:-1:2]
    if len(sizes) >= 3:
        splits["extrapolation"] = sizes[-1:]
    for name, held in splits.items():
        test = np.isin(label, held)
        fit = fit_line(x[~test], y[~test])
        errs = [
            abs(fit.intercept + fit.slope * x[label == s].mean() - y[label == s].mean())
            / y[label == s].mean()
            for s in held
        ]
        out[f"{name}_mape"] = float(np.mean(errs))
        out[f"{name}_held_out_sizes"] = [int(s) for s in held]
    return out


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return df[name].to_numpy(dtype=float, na_value=np.nan)


def _replicate_means(
    label: np.ndarray, x: np.ndarray, repeat: np.ndarray, responses: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], str]:
    """One point per (size, repeat) when every size has >= 2 repeats, else the micro-batches themselves.

    Micro-batches of one step share its noise, so they are not independent observations; repeats are. Fitting
    the repeat means makes the HC3 errors, the pure-error lack-of-fit test and the bootstrap all use the
    independent unit. (With equal micro-batch counts the line is the same as fitted on every micro-batch.)
    A response missing (NaN) on some micro-batches is averaged over those that have it.
    """
    cell_id, _, unit = resampling_cells(label, repeat)
    if unit != REPEAT_UNIT:
        return {"label": label, "x": x, "repeat": repeat, **responses}, unit
    _, first = np.unique(cell_id, return_index=True)
    count = np.bincount(cell_id)
    out = {"label": label[first], "repeat": repeat[first], "x": np.bincount(cell_id, weights=x) / count}
    for name, v in responses.items():
        ok = np.isfinite(v)
        n_ok = np.bincount(cell_id, weights=ok.astype(float), minlength=len(count))
        total = np.bincount(cell_id, weights=np.where(ok, v, 0.0), minlength=len(count))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name] = np.where(n_ok > 0, total / np.maximum(n_ok, 1), np.nan)
    return out, unit


def fit_precision(
    df: pd.DataFrame, *, n_boot: int, rng: np.random.Generator, x_col: str = "num_tokens"
) -> PrecisionFit:
    """Fit one (model, phase, precision) group: time, host stall, memory, bootstrap, lack of fit, hold-out."""
    model, phase, precision = (str(df[k].iloc[0]) for k in GROUP_KEYS)
    label_all = df["tokens_per_microbatch"].to_numpy(dtype=np.int64)
    x_all = _column(df, x_col)
    x_all = np.where(np.isfinite(x_all) & (x_all > 0), x_all, label_all.astype(float))
    if len(np.unique(label_all)) < 2:
        raise InputError(
            f"{model}/{phase}/{precision}: needs at least two micro-batch sizes, has {np.unique(label_all).tolist()}"
        )
    repeat_all = (
        df["repeat"].to_numpy(dtype=np.int64) if "repeat" in df.columns else np.zeros(len(df), np.int64)
    )
    responses = {c: _column(df, c) for c in ("seconds", "host_stall_seconds", "peak_mem_bytes")}
    pts, unit = _replicate_means(label_all, x_all, repeat_all, responses)
    label, x, y, repeat = pts["label"], pts["x"], pts["seconds"], pts["repeat"]
    sizes = np.unique(label)
    stall_y = pts["host_stall_seconds"]
    has_stall = np.isfinite(stall_y)
    ys = [y] + ([stall_y] if len(np.unique(label[has_stall])) >= 2 else [])
    boots, _ = bootstrap_lines(x, ys, label, repeat, n_boot, rng) if n_boot > 0 else ([], unit)
    stall = stall_cov = None
    if len(ys) == 2:
        stall = fit_line(x[has_stall], stall_y[has_stall])
        if has_stall.all():
            stall_cov = hc3_intercept_cross_cov(x, stall_y, y)
    mem_y = pts["peak_mem_bytes"]
    has_mem = np.isfinite(mem_y)
    memory = fit_line(x[has_mem], mem_y[has_mem]) if len(np.unique(label[has_mem])) >= 2 else None
    return PrecisionFit(
        model=model,
        phase=phase,
        precision=precision,
        time=fit_line(x, y),
        sizes=tuple(int(s) for s in sizes),
        size_mean_s=tuple(float(y[label == s].mean()) for s in sizes),
        size_mean_tokens=tuple(float(x[label == s].mean()) for s in sizes),
        size_count=tuple(int((label_all == s).sum()) for s in sizes),
        boot=boots[0] if boots else np.empty((0, 2)),
        boot_unit=unit,
        n_microbatches=len(df),
        lack_of_fit=lack_of_fit(x, y, label),
        stall=stall,
        stall_time_cov=stall_cov,
        boot_stall=boots[1] if len(boots) == 2 else None,
        stall_size_mean_s=(
            tuple(
                float(stall_y[(label == s) & has_stall].mean())
                if has_stall[label == s].any()
                else float("nan")
                for s in sizes
            )
            if stall is not None
            else None
        ),
        memory=memory,
        holdout=holdout_errors(x, y, label),
        points={"label": label, "repeat": repeat, "x": x, "seconds": y},
    )


def fit_cost_model(
    table: pd.DataFrame, *, min_tokens: int = 0, n_boot: int = 1000, seed: int = 0, x_col: str = "num_tokens"
) -> dict[tuple[str, str, str], PrecisionFit]:
    """Fit every (model, phase, precision) group of a micro-batch table (``min_tokens``: drop smaller sizes)."""
    if min_tokens > 0:
        table = table[table["tokens_per_microbatch"] >= min_tokens]
    fits: dict[tuple[str, str, str], PrecisionFit] = {}
    groups = sorted(table.groupby(list(GROUP_KEYS), sort=True), key=lambda kv: kv[0])
    for i, (key, df) in enumerate(groups):
        rng = np.random.default_rng([seed, i])
        fits[tuple(str(k) for k in key)] = fit_precision(df, n_boot=n_boot, rng=rng, x_col=x_col)
    return fits
