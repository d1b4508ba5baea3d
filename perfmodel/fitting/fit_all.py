"""Fit every (model, phase, precision): the line, and where the data reject it, a knee-aware model.

Per precision, one set of bootstrap draws over independent units (:mod:`perfmodel.fitting.bootstrap`) serves every
response. For wall time (``seconds``) and GPU busy time (``gpu_busy_seconds``) the model is chosen by the
data, never by a flag:

1. the line ``fixed + per_token n [+ per-step, attention terms]`` (:mod:`perfmodel.fitting.linear`), kept when
   lack of fit does not reject it and its coefficients are plausible (:mod:`perfmodel.fitting.lof`);
2. else, with GPU busy known, the ``parts`` model (GPU-busy slope + host line, wall = max of the two), and
   the plain ``knee`` model (segmented line) (:mod:`perfmodel.fitting.knee`); the one that fits is kept (both fit:
   ``parts``, unless the unit residuals say its anchored GPU slope is wrong);
3. else nothing fits: ``model`` is None and the breakeven withholds n* (:mod:`perfmodel.breakeven.solve`).

Host stall and peak memory are fitted as lines (the stall share and the memory cap use them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from scipy import stats

from perfmodel.fitting.bootstrap import Draws, draw
from perfmodel.fitting.design import GPU_SIDE, Design, build_design, restrict
from perfmodel.fitting.fitted import PER_STEP_TERMS, BasisFit, LinearFit, PrecisionFit, SegmentedFit
from perfmodel.fitting.knee import KINDS, fit_segmented
from perfmodel.fitting.linear import fit_line, fit_linear
from perfmodel.fitting.lof import holdout_mape, holdout_splits, implausible, lack_of_fit
from perfmodel.fitting.outliers import screen_rows
from tracing.analysis.steps import LAG_SHARE
from tracing.outputs.errors import InputError

__all__ = ["GROUP_KEYS", "fit_basis", "fit_cost_model", "fit_line", "fit_precision"]
GROUP_KEYS = ("model", "phase", "precision")
PER_STEP_MATERIAL = 0.1  # a per-step cost below zero is no noise beyond this share of a typical micro-batch
GPU_BUSY_MIN_SHARE = 0.9  # GPU busy on at least this share of micro-batches to fit the GPU-busy basis
_PARTS_ALPHA = 0.05


def _flagged(lof) -> bool:
    return lof is not None and lof.flag


def _unit_ss(fit: SegmentedFit) -> tuple[float, int]:
    r = fit.unit_resid[np.isfinite(fit.unit_resid)]
    return float(r @ r), len(r)


def _prefer_knee(parts: SegmentedFit, knee: SegmentedFit) -> bool:
    """Does freeing the GPU line's slope (knee) fit the units significantly better than anchoring it to the
    GPU-busy slope (parts)? An F test on unit mean residuals, 1 numerator degree of freedom."""
    ss_p, _ = _unit_ss(parts)
    ss_k, g = _unit_ss(knee)
    df = g - knee.n_params
    if df < 1 or ss_k <= 0:
        return False
    f = max(ss_p - ss_k, 0.0) / (ss_k / df)
    return bool(stats.f.sf(f, 1, df) < _PARTS_ALPHA)


def line_refit(response: str) -> Callable[[Design], tuple[np.ndarray, np.ndarray] | None]:
    """Refit the line on a (weighted) design: lack of fit tests it as a relative (WLS) fit."""

    def refit(d: Design) -> tuple[np.ndarray, np.ndarray] | None:
        f = fit_linear(d, response)
        return None if f is None else (f.unit_resid, f.unit_fitted)

    return refit


def _knee_refit(
    response: str, anchor: LinearFit | None
) -> Callable[[Design], tuple[np.ndarray, np.ndarray] | None]:
    def refit(d: Design) -> tuple[np.ndarray, np.ndarray] | None:
        f = fit_segmented(d, response, None, anchor)
        return None if f is None else (f.unit_resid, f.unit_fitted)

    return refit


def fit_basis(
    design: Design,
    response: str,
    basis: str,
    draws: Draws | None,
    anchor: LinearFit | None = None,
    refuse: str | None = None,
) -> BasisFit | None:
    """The line for ``response``, and the knee-aware model when the line is rejected (see the module
    docstring); None when the response cannot give a line. ``refuse``: a reason the times are not
    per-micro-batch costs (overlapping windows): the line is fitted for reference, no model is chosen."""
    line = fit_linear(design, response, draws)
    if line is None:
        return None
    lof = lack_of_fit(
        design,
        response,
        line.unit_resid,
        line.unit_fitted,
        len(line.names),
        line_refit(response),
        line.pattern_fitted,
        line=True,
    )
    b = BasisFit(basis, line, lof, seq_len_ref=design.seq_len_ref)
    line2 = b.line2()
    bad = implausible(line2.intercept, line2.ci("intercept"), line2.slope, line2.ci("slope"))
    ps = b.per_step()
    typical = float(np.nanmedian(line.unit_fitted)) if np.isfinite(line.unit_fitted).any() else 0.0
    if ps is not None and ps[1] is not None and ps[1][1] < 0 and ps[0] < -PER_STEP_MATERIAL * typical:
        bad.append(
            f"per-step cost {ps[0] * 1e3:.3g} ms is below zero (95 % CI up to {ps[1][1] * 1e3:.3g} ms): the first "
            "micro-batch of a step is faster than the others -- their windows overlap (each holds an earlier "
            "one's GPU work) or the index is not the order they ran in"
        )
    # a per-token or per-step cost below zero is no bend a knee model could follow: nothing is fitted
    hard = [m for m in bad if not m.startswith("fixed cost")]
    if refuse or hard:
        why = refuse or "; ".join(hard)
        note = f"no model: {why}"
        return BasisFit(basis, line, lof, tuple(bad), None, None, None, note, design.seq_len_ref, why)
    b = BasisFit(basis, line, lof, tuple(bad), seq_len_ref=design.seq_len_ref)
    if b.line_ok:
        return b
    fits = {}
    dof = float(min(line.dof_of({"fixed": 1.0}), line.dof_of({"per_token": 1.0})))
    if anchor is not None:
        fits["parts"] = fit_segmented(design, response, draws, anchor, dof)
    fits["knee"] = fit_segmented(design, response, draws, dof=dof)
    lofs = {
        k: lack_of_fit(
            design,
            response,
            f.unit_resid,
            f.unit_fitted,
            f.n_params,
            _knee_refit(response, anchor if k == "parts" else None),
            f.pattern_fitted,
        )
        for k, f in fits.items()
        if f
    }
    ok = [k for k, f in fits.items() if f is not None and not _flagged(lofs[k])]
    if "parts" in ok and "knee" in ok and _prefer_knee(fits["parts"], fits["knee"]):
        ok.remove("parts")
    why = "; ".join([*bad, *([lof.note] if _flagged(lof) else [])])
    if ok:
        kind = ok[0]
        note = f"the line is rejected ({why}); the {kind} model ({KINDS[kind]}) fits"
        return BasisFit(basis, line, lof, bad, fits[kind], lofs[kind], kind, note, design.seq_len_ref)
    shown = next((k for k in ("parts", "knee") if fits.get(k) is not None), None)
    if shown is None:
        note = f"the line is rejected ({why}); too few sizes for a knee model (needs 5)"
        return BasisFit(basis, line, lof, bad, None, None, None, note, design.seq_len_ref)
    note = f"the line is rejected ({why}); the {shown} model does not fit either ({lofs[shown].note})"
    return BasisFit(basis, line, lof, bad, fits[shown], lofs[shown], None, note, design.seq_len_ref)


OVERLAP_MIN_SHARE = 0.1  # of a group's micro-batches overlapping an earlier one by > LAG_SHARE of their time


def overlap_reason(df: pd.DataFrame) -> str | None:
    """Why the micro-batch times are not per-micro-batch costs: their windows overlap earlier micro-batches'
    GPU work (``overlap_seconds`` from ``mxperf ingest``) in a material share of them; None when they do not
    (or the table does not say)."""
    if "overlap_seconds" not in df.columns:
        return None
    ov = pd.to_numeric(df["overlap_seconds"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    secs = pd.to_numeric(df["seconds"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    hit = np.isfinite(ov) & (ov > LAG_SHARE * secs)
    if "seconds_basis" in df.columns:  # a device completion interval holds no wait for earlier work
        hit &= (df["seconds_basis"].astype("string") != "device").fillna(True).to_numpy(bool)
    if hit.sum() < max(2, OVERLAP_MIN_SHARE * len(df)):
        return None
    share = float(np.median(ov[hit] / secs[hit]))
    return (
        f"micro-batch windows overlap: {int(hit.sum())} of {len(df)} start while an earlier micro-batch's GPU "
        f"work still runs (overlap_seconds, median {share:.0%} of their seconds), so their times include that "
        "wait and are not per-micro-batch costs"
    )


def _holdout(design: Design, basis: BasisFit) -> dict[str, object]:
    out: dict[str, object] = {"interpolation_mape": None, "extrapolation_mape": None, "model": basis.model}
    for name, held in holdout_splits(design).items():
        sub = restrict(design, ~np.isin(design.unit_label, held))
        if basis.model in ("knee", "parts"):
            anchor = fit_linear(sub, "gpu_busy_seconds") if basis.model == "parts" else None
            refit = fit_segmented(sub, "seconds", None, anchor)
        else:
            refit = fit_linear(sub, "seconds")
        if refit is None:
            continue
        out[f"{name}_mape"] = holdout_mape(design, "seconds", held, refit.pattern_fitted)
        out[f"{name}_held_out_sizes"] = [int(s) for s in held]
    return out


def _size_means(df: pd.DataFrame, col: str) -> tuple[float, ...] | None:
    if col not in df.columns or not pd.to_numeric(df[col], errors="coerce").notna().any():
        return None
    g = pd.to_numeric(df[col], errors="coerce").groupby(df["tokens_per_microbatch"]).mean()
    return tuple(float(v) for v in g.to_numpy(dtype=float, na_value=np.nan))


def per_step_share(design: Design, fit: LinearFit, response: str = "seconds") -> np.ndarray:
    """(units,) the fitted per-step cost carried by each unit's average micro-batch (0 without one)."""
    extra = np.zeros(len(design.x))
    for t in PER_STEP_TERMS:
        if fit.has(t):
            extra += design.x[:, design.names.index(t)] * fit.coef(t)
    resp = design.responses[response]
    cnt = resp.unit_count
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, np.asarray(resp.count @ extra).ravel() / cnt, 0.0)


def curve_size_means(
    design: Design, basis: BasisFit | None, response: str, sizes: tuple[int, ...]
) -> tuple[float, ...] | None:
    """Mean seconds per size with the fitted per-step cost taken out: the points the micro-batch curve
    (which is for a micro-batch that is not the first of its step) should go through."""
    if basis is None or response not in design.responses:
        return None
    resp = design.responses[response]
    extra = per_step_share(design, basis.line, response) * resp.unit_count
    out = []
    for s in sizes:
        sel = design.unit_label == s
        n = resp.unit_count[sel].sum()
        out.append(float((resp.unit_total[sel].sum() - extra[sel].sum()) / n) if n > 0 else float("nan"))
    return tuple(out)


def _points(design: Design, fit: LinearFit) -> dict[str, np.ndarray]:
    """One point per unit (label, repeat, mean tokens, mean seconds without the fitted per-step cost): the
    paired cross-check's input."""
    ok = np.isfinite(fit.unit_resid)
    secs = fit.unit_resid + fit.unit_fitted - per_step_share(design, fit)
    return {
        "label": design.unit_label[ok],
        "repeat": design.unit_repeat[ok],
        "x": design.unit_tokens[ok],
        "seconds": secs[ok],
    }


def fit_precision(
    df: pd.DataFrame, *, n_boot: int, rng: np.random.Generator, x_col: str = "num_tokens"
) -> PrecisionFit:
    """Fit one (model, phase, precision) group: wall and GPU-busy bases, stall and memory lines, hold-out."""
    model, phase, precision = (str(df[k].iloc[0]) for k in GROUP_KEYS)
    if df["tokens_per_microbatch"].nunique() < 2 and pd.to_numeric(df[x_col], errors="coerce").nunique() < 2:
        raise InputError(f"{model}/{phase}/{precision}: needs at least two micro-batch sizes")
    design = build_design(df, x_col)
    screen = screen_rows(design, fit_linear(design, "seconds"), df)
    if screen.drop.any():  # a few wild micro-batches: named in the report, left out of every fit
        df = df[~screen.drop]
        design = build_design(df, x_col)
    refuse = overlap_reason(df)
    draws = draw(design.n_units, design.strata, n_boot, rng) if n_boot > 0 else None
    if draws is not None:  # one pass over the draws for every response's sums
        draws.prepare([m for r in design.responses.values() for m in (r.count, r.total, r.sumsq)])
    busy_fit = None
    busy = None
    if design.has("gpu_busy_seconds", GPU_BUSY_MIN_SHARE):
        busy = fit_basis(design, "gpu_busy_seconds", "gpu_busy", draws, refuse=refuse)
        busy_fit = busy.line if busy is not None and busy.line_ok and busy.model else None
    wall = fit_basis(design, "seconds", "wall", draws, busy_fit if design.has(GPU_SIDE) else None, refuse)
    if wall is None:
        raise InputError(
            f"{model}/{phase}/{precision}: the sizes cannot separate a fixed and a per-token cost"
        )
    stall = fit_linear(design, "host_stall_seconds", draws)
    stall_lof = stall_knee = stall_knee_lof = None
    if stall is not None:
        stall_lof = lack_of_fit(
            design,
            "host_stall_seconds",
            stall.unit_resid,
            stall.unit_fitted,
            len(stall.names),
            line_refit("host_stall_seconds"),
            stall.pattern_fitted,
            line=True,
        )
        if not wall.line_ok or _flagged(stall_lof):  # stall bends with the wall: its knee model's intercept
            stall_knee = fit_segmented(design, "host_stall_seconds", draws)
            if stall_knee is not None:
                stall_knee_lof = lack_of_fit(
                    design,
                    "host_stall_seconds",
                    stall_knee.unit_resid,
                    stall_knee.unit_fitted,
                    stall_knee.n_params,
                    _knee_refit("host_stall_seconds", None),
                    stall_knee.pattern_fitted,
                )
    memory = fit_linear(design, "peak_mem_bytes")
    sizes = tuple(int(s) for s in sorted(df["tokens_per_microbatch"].unique()))
    return PrecisionFit(
        model=model,
        phase=phase,
        precision=precision,
        design=design,
        wall=wall,
        busy=busy,
        stall=stall,
        stall_lack_of_fit=stall_lof,
        stall_knee=stall_knee,
        stall_knee_lack_of_fit=stall_knee_lof,
        memory=memory,
        holdout=_holdout(design, wall),
        sizes=sizes,
        size_mean_s=_size_means(df, "seconds") or (),
        size_mean_tokens=_size_means(df, x_col) or (),
        size_count=tuple(int(v) for v in df.groupby("tokens_per_microbatch").size().to_numpy()),
        stall_size_mean_s=_size_means(df, "host_stall_seconds"),
        busy_size_mean_s=_size_means(df, "gpu_busy_seconds"),
        size_mean_curve_s=curve_size_means(design, wall, "seconds", sizes),
        busy_size_mean_curve_s=curve_size_means(design, busy, "gpu_busy_seconds", sizes),
        points=_points(design, wall.line),
        n_microbatches=len(df),
        outliers=screen.named,
        outlier_note=screen.note,
    )


def fit_cost_model(
    table: pd.DataFrame, *, min_tokens: int = 0, n_boot: int = 1000, seed: int = 0, x_col: str = "num_tokens"
) -> dict[tuple[str, str, str], PrecisionFit]:
    """Fit every (model, phase, precision) group of a micro-batch table (``min_tokens``: drop smaller sizes).

    The table may be a bare micro-batch table; missing optional columns get their defaults."""
    from perfmodel.inputs.columns import FIT_COLUMNS, conform_microbatches

    if list(table.columns) != list(FIT_COLUMNS):
        table = conform_microbatches(table, "table", "table")
    if min_tokens > 0:
        table = table[table["tokens_per_microbatch"] >= min_tokens]
    fits: dict[tuple[str, str, str], PrecisionFit] = {}
    groups = sorted(table.groupby(list(GROUP_KEYS), sort=True), key=lambda kv: kv[0])
    for i, (key, df) in enumerate(groups):
        rng = np.random.default_rng([seed, i])
        fits[tuple(str(k) for k in key)] = fit_precision(df, n_boot=n_boot, rng=rng, x_col=x_col)
    return fits
