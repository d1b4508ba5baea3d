"""Knee-aware micro-batch models: time that bends where the host stops keeping up with the GPU.

Small micro-batches are launch-bound (the GPU waits for the host: time follows host(n)), large ones
GPU-bound (time follows gpu(n)), so wall = max(host, GPU): two lines joined at a knee. A straight line
through such data is rejected by lack of fit and its n* can be far off. Two models, chosen by the data
(:mod:`perfmodel.fitting.fit_all`):

- ``parts`` (GPU busy known): the GPU line's slope ``g1`` is the GPU-busy slope (fitted on
  ``gpu_busy_seconds``, same bootstrap draws); the host line and the GPU-bound wall's offset come from wall
  time::

      seconds - g1 n = a + d min(n, k) [+ per-step, attention terms]
      host(n) = a + (g1 + d) n,   GPU-bound wall(n) = (a + d k) + g1 n,   they meet at the knee k

- ``knee`` (wall time only): a continuous segmented line ``seconds = a + b n + c (n - k)+ [+ terms]``.

The knee is found by profile least squares (a grid of knots, then golden-section refinement); every
bootstrap replicate searches the grid again on its own draws, so the knee's uncertainty is in the intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.fitting.bootstrap import Draws, calibrate
from perfmodel.fitting.design import Design
from perfmodel.fitting.fitted import LinearFit, SegmentedFit
from perfmodel.fitting.linear import solve_batch
from perfmodel.fitting.model import Curve

KNOTS = 48
MIN_SIZES = 5  # a knee model has one more parameter than its line and needs sizes left over to be tested
TERMS = ("per_step", "per_step_spread", "per_sq_token")
KINDS = {
    "knee": "segmented line (wall time only)",
    "parts": "host line + GPU-busy line, wall = max of the two",
}


def _grid(tokens: np.ndarray, cnt: np.ndarray) -> np.ndarray | None:
    sizes = np.unique(tokens[cnt > 0])
    if len(sizes) < MIN_SIZES:
        return None
    if len(sizes) > 24:  # dynamic batching: many distinct sizes; keep the knee inside the bulk of the data
        w = cnt[cnt > 0]
        order = np.argsort(tokens[cnt > 0])
        cum = np.cumsum(w[order]) / w.sum()
        lo, hi = np.interp([0.05, 0.95], cum, tokens[cnt > 0][order])
    else:  # from between the two smallest sizes to between the two largest
        lo, hi = np.sqrt(sizes[0] * sizes[1]), np.sqrt(sizes[-2] * sizes[-1])
    if not hi > lo:
        return None
    return np.geomspace(lo, hi, KNOTS) if hi / lo > 4 else np.linspace(lo, hi, KNOTS)


def _columns(x: np.ndarray, names: tuple[str, ...], knots: np.ndarray, kind: str) -> np.ndarray:
    """(knots, patterns, q): the regressors at each knot."""
    n = x[:, names.index("per_token")]
    zs = np.repeat(x[None], len(knots), axis=0)
    if kind == "parts":
        zs[:, :, names.index("per_token")] = np.minimum(n[None], knots[:, None])
        return zs
    return np.concatenate([zs, np.maximum(n[None] - knots[:, None], 0.0)[..., None]], axis=2)


@dataclass(frozen=True, eq=False)
class _Sums:
    """Normal-equation pieces for every knot, for the full data (1 row) or every replicate (B rows)."""

    zz: np.ndarray  # (R, K, q, q)
    zy: np.ndarray  # (R, K, q)
    zn: np.ndarray  # (R, K, q): sum cnt * n * z (parts: removes g1 n from the response)
    yy: np.ndarray  # (R,)
    ny: np.ndarray  # (R,)
    nn: np.ndarray  # (R,)

    def solve(self, g1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(beta (R, K, q), SSE (R, K)) for anchor slopes ``g1`` (R,) (zeros for the plain knee)."""
        v = self.zy - g1[:, None, None] * self.zn
        beta = solve_batch(self.zz, v)
        yy = self.yy - 2 * g1 * self.ny + g1 * g1 * self.nn
        return beta, yy[:, None] - np.einsum("rkq,rkq->rk", v, beta)


def _sums(design: Design, response: str, zs: np.ndarray, draws: Draws | None) -> _Sums:
    resp = design.responses[response]
    k, p, q = zs.shape
    n = design.tokens
    f_zz = np.transpose(zs[..., :, None] * zs[..., None, :], (1, 0, 2, 3)).reshape(p, k * q * q)
    f_z = np.transpose(zs, (1, 0, 2)).reshape(p, k * q)
    f_nz = np.transpose(n[None, :, None] * zs, (1, 0, 2)).reshape(p, k * q)
    if draws is None:
        cnt = resp.pattern_count[None]
        tot = resp.pattern_total[None]
        parts = (cnt @ f_zz, tot @ f_z, cnt @ f_nz, np.array([resp.sumsq.sum()]), tot @ n, cnt @ (n * n))
    else:
        parts = (
            draws.project(resp.count, f_zz),
            draws.project(resp.total, f_z),
            draws.project(resp.count, f_nz),
            draws.project(resp.sumsq),
            draws.project(resp.total, n[:, None])[:, 0],
            draws.project(resp.count, (n * n)[:, None])[:, 0],
        )
    r = parts[0].shape[0]
    return _Sums(
        parts[0].reshape(r, k, q, q),
        parts[1].reshape(r, k, q),
        parts[2].reshape(r, k, q),
        *(np.asarray(v, dtype=float).reshape(r) for v in parts[3:]),
    )


def _refine(design: Design, response: str, kind: str, grid: np.ndarray, j: int, g1: float) -> float:
    """Golden-section search for the best knot between the grid neighbours of knot ``j``."""
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]

    def sse(k: float) -> float:
        zs = _columns(design.x, design.names, np.array([k]), kind)
        s = _sums(design, response, zs / _scale(zs), None)
        return float(s.solve(np.array([g1]))[1][0, 0])

    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = sse(c), sse(d)
    for _ in range(22):
        if not (fc <= fd):
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = sse(d)
        else:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = sse(c)
    best = (c + d) / 2.0
    return best if sse(best) <= sse(grid[j]) else float(grid[j])


def _scale(zs: np.ndarray) -> np.ndarray:
    s = np.abs(zs).max(axis=1, keepdims=True)
    return np.where(s > 0, s, 1.0)


def _params(
    design: Design, kind: str, knee: np.ndarray, beta: np.ndarray, g1: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(knee, a1, b1, b2) per row from unscaled coefficients, and the extra terms."""
    names = design.names
    sq = beta[:, names.index("per_sq_token")] * design.seq_len_ref if "per_sq_token" in names else 0.0
    a1 = beta[:, 0]
    if kind == "parts":
        d = beta[:, names.index("per_token")]
        b1, b2 = g1 + d + sq, g1 + sq
    else:
        b1 = beta[:, 1] + sq
        b2 = b1 + beta[:, -1]
    terms = {t: beta[:, names.index(t)] for t in TERMS if t in names}
    return np.stack([knee, a1, b1, b2], axis=1), terms


def _curve(theta: np.ndarray) -> Curve:
    k, a1, b1, b2 = theta.T
    return Curve(k, a1, b1, a1 + (b1 - b2) * k, b2)


def fit_segmented(
    design: Design,
    response: str,
    draws: Draws | None,
    anchor: LinearFit | None = None,
    dof: float | None = None,
) -> SegmentedFit | None:
    """The ``parts`` model when ``anchor`` (the GPU-busy fit) is given, else the ``knee`` model; None when
    the sizes cannot carry a knee (fewer than five distinct sizes, or no knot identifies the model).
    ``dof``: degrees of freedom for the small-sample calibration of the replicates (default: units minus
    parameters; :mod:`perfmodel.fitting.fit_all` passes the line's Satterthwaite dof, which knows how few units carry
    the large sizes)."""
    kind = "parts" if anchor is not None else "knee"
    resp = design.responses.get(response)
    if resp is None or (anchor is not None and not anchor.has("per_token")):
        return None
    cnt = resp.pattern_count
    grid = _grid(design.tokens, cnt)
    if grid is None:
        return None
    g1 = anchor.coef("per_token") if anchor is not None else 0.0
    zs = _columns(design.x, design.names, grid, kind)
    scale = _scale(zs)
    _, sse = _sums(design, response, zs / scale, None).solve(np.array([g1]))
    if not np.isfinite(sse).any():
        return None
    j = int(np.nanargmin(sse[0]))
    knee = _refine(design, response, kind, grid, j, g1)
    z1 = _columns(design.x, design.names, np.array([knee]), kind)
    s1 = _scale(z1)
    b1, _ = _sums(design, response, z1 / s1, None).solve(np.array([g1]))
    coef = b1[:, 0] / s1[0]
    if not np.isfinite(coef).all():
        return None
    theta, terms = _params(design, kind, np.array([knee]), coef, np.array([g1]))
    q = zs.shape[2]
    fitted = z1[0] @ coef[0] + (g1 * design.tokens if kind == "parts" else 0.0)
    cnt_u = resp.unit_count
    with np.errstate(invalid="ignore", divide="ignore"):
        fit_u = np.asarray(resp.count @ fitted).ravel() / cnt_u
        resid_u = resp.unit_total / cnt_u - fit_u
    dof = float(min((cnt_u > 0).sum() - q - 1, dof if dof is not None else np.inf))
    boot, boot_terms = None, {}
    if draws is not None and draws.n_boot:
        g1_b = (
            anchor.boot_raw[:, anchor.names.index("per_token")]
            if anchor is not None
            else np.zeros(draws.n_boot)
        )
        beta_b, sse_b = _sums(design, response, zs / scale, draws).solve(np.nan_to_num(g1_b))
        ok = np.isfinite(sse_b).any(axis=1) & np.isfinite(g1_b)
        jb = np.where(ok, np.argmin(np.where(np.isfinite(sse_b), sse_b, np.inf), axis=1), 0)
        rows = np.arange(draws.n_boot)
        coef_b = beta_b[rows, jb] / scale[jb, 0]
        coef_b[~ok] = np.nan
        th_b, tr_b = _params(design, kind, grid[jb], coef_b, g1_b)
        full = np.concatenate([theta[0], [terms[t][0] for t in tr_b]])
        raw = np.concatenate(
            [th_b, np.stack([tr_b[t] for t in tr_b], axis=1) if tr_b else th_b[:, :0]], axis=1
        )
        cal = calibrate(raw, full, draws.expand, dof)
        boot = _curve(cal[:, :4])
        boot_terms = {t: cal[:, 4 + i] for i, t in enumerate(tr_b)}
    return SegmentedFit(
        kind=kind,
        curve=_curve(theta).take(0),
        boot=boot,
        terms={t: float(v[0]) for t, v in terms.items()},
        boot_terms=boot_terms,
        dof=dof,
        n_params=q + 1,
        unit_resid=np.where(cnt_u > 0, resid_u, np.nan),
        unit_fitted=np.where(cnt_u > 0, fit_u, np.nan),
        pattern_fitted=fitted,
        anchor_slope_s=g1 if kind == "parts" else None,
    )
