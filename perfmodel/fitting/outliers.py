"""A few wild micro-batches left out before the fit, and named: a median screen per size.

Least squares and its jackknife (CR3) covariance are not robust: one micro-batch three times its normal time
(a page fault, a co-tenant, a profiler flush) moves the per-token cost and inflates its variance until a
clear difference is "not significant" -- with two such micro-batches in a clean sweep the case table read a
per-token saving within noise as ``never_faster`` (or an added fixed cost within noise as ``always_faster``).

The screen compares each micro-batch with the others of its kind: the same size label, first of its step
or not (the first carries a per-step cost such as a cached weight cast), on its relative residual from a
first line fit -- so a bend of the timings (a
knee) shifts a whole size and flags nothing, and dynamic batching's different token counts within a label
are accounted for by the line. A micro-batch is left out when it is more than ``K`` robust standard
deviations (1.4826 x the median absolute deviation of each micro-batch from the median of the others of
its group, pooled over groups) and more than ``MIN_REL`` of its time away from its group's median. Only groups of >= ``MIN_ROWS`` are screened,
fewer than half of a group can be left out (a median cannot tell more), and nothing is left out when more
than ``MAX_SHARE`` of the micro-batches would be (the noise is heavy-tailed throughout, not a few
outliers), or when (nearly) every one flagged is the last micro-batch of its step (a per-step cost paid there, e.g.
an optimizer step: timing, not noise): then the fit says so instead. When at least half of a step's
micro-batches are flagged, the whole step is left out (a slow step, not a slow micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.fitting.design import Design
from perfmodel.fitting.fitted import LinearFit

K = 6.0  # robust standard deviations from the group's median
MIN_REL = 0.05  # and at least this share of the micro-batch's time
MIN_ROWS = 4  # micro-batches in a group to tell which one is off
MAX_SHARE = 0.1  # more flagged than this: heavy tails, not a few outliers -- leave them in and say so
_SCALE_FLOOR = 0.002


@dataclass(frozen=True)
class Screen:
    """Rows (micro-batches) to leave out (``drop``), a description of each, and a note when the screen
    stood down."""

    drop: np.ndarray  # (rows,) bool
    named: tuple[dict, ...]
    note: str | None = None


def _positions(df: pd.DataFrame, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """Per row: first of its step; last of its step (of two or more)."""
    mb = pd.to_numeric(df["microbatch"], errors="coerce").fillna(0).to_numpy()
    last_mb = pd.Series(mb).groupby(design.row_unit).transform("max").to_numpy()
    return mb == 0, (mb == last_mb) & (mb > 0)


def screen_rows(design: Design, fit: LinearFit | None, df: pd.DataFrame) -> Screen:
    """The micro-batches of ``df`` (the table ``design`` was built from) far from the others of their kind."""
    n = len(df)
    none = Screen(np.zeros(n, dtype=bool), ())
    if fit is None or design.row_pattern is None or design.row_unit is None or n < 2 * MIN_ROWS:
        return none
    y = pd.to_numeric(df["seconds"], errors="coerce").to_numpy(dtype=float)
    fitted = np.asarray(fit.pattern_fitted, dtype=float)[design.row_pattern]
    ok = np.isfinite(y) & (fitted > 0)
    rel = np.where(ok, y / np.where(ok, fitted, 1.0) - 1.0, np.nan)
    first, last = _positions(df, design)
    label = df["tokens_per_microbatch"].to_numpy(dtype=np.int64)
    group = pd.factorize(pd.MultiIndex.from_arrays([label, first]))[0]
    dev = np.full(n, np.nan)
    loo = np.full(n, np.nan)  # from the median of the others: a small group's median hides its spread
    for g in np.unique(group[ok]):
        idx = np.flatnonzero(ok & (group == g))
        if len(idx) >= MIN_ROWS:
            dev[idx] = rel[idx] - np.median(rel[idx])
            loo[idx] = [rel[i] - np.median(rel[idx[idx != i]]) for i in idx]
    screened = np.isfinite(dev)
    if screened.sum() < 2 * MIN_ROWS:
        return none
    scale = max(1.4826 * float(np.median(np.abs(loo[screened]))), _SCALE_FLOOR)
    far = screened & (np.abs(dev) > K * scale) & (np.abs(dev) > MIN_REL)
    drop = np.zeros(n, dtype=bool)
    for g in np.unique(group[far]):
        members = np.flatnonzero(screened & (group == g))
        cand = [i for i in members[np.argsort(-np.abs(dev[members]))] if far[i]]
        drop[cand[: (len(members) - 1) // 2]] = True
    if not drop.any():
        return none
    if drop.sum() >= 3 and last[drop].mean() >= 0.8:
        note = (
            f"the last micro-batch of {int(last[drop].sum())} steps is more than {K:g} robust standard "
            "deviations off the others at its size: a cost paid once per step in the last micro-batch (an "
            "optimizer step?), not outliers; kept (two global batch sizes identify it)"
        )
        return Screen(np.zeros(n, dtype=bool), (), note)
    unit_share = pd.Series(drop).groupby(design.row_unit).transform("mean").to_numpy()
    drop |= unit_share >= 0.5  # most of a step is off: the step is (a slow step), all of it
    if drop.sum() > MAX_SHARE * screened.sum():
        note = (
            f"{int(drop.sum())} of {int(screened.sum())} micro-batches are more than {K:g} robust standard "
            f"deviations (+-{K * scale:.0%}) from the median of their size: heavy-tailed timings, all kept"
        )
        return Screen(np.zeros(n, dtype=bool), (), note)
    peers = {g: float(np.median(rel[ok & (group == g)])) for g in np.unique(group[drop])}
    named = tuple(_name(df.iloc[i], (1.0 + rel[i]) / (1.0 + peers[group[i]])) for i in np.flatnonzero(drop))
    return Screen(drop, named)


def _name(row: pd.Series, ratio: float) -> dict:
    def _int(v: object) -> int | None:
        return None if v is None or pd.isna(v) else int(v)

    return {
        "tokens_per_microbatch": _int(row["tokens_per_microbatch"]),
        "num_tokens": _int(row.get("num_tokens")),
        "repeat": _int(row.get("repeat")),
        "step": _int(row.get("step")),
        "microbatch": _int(row.get("microbatch")),
        "rank": _int(row.get("rank")),
        "seconds": float(row["seconds"]),
        "ratio_to_median": float(ratio),
        "trace": None if pd.isna(row.get("trace")) else str(row.get("trace")),
    }


def describe(named: tuple[dict, ...] | list[dict]) -> str:
    """One clause per left-out micro-batch, for the report."""
    return "; ".join(
        f"{o['tokens_per_microbatch']:,} tokens, repeat {o['repeat']}, step {o['step']}, micro-batch "
        f"{o['microbatch']}: {o['seconds'] * 1e3:.3g} ms, {o['ratio_to_median']:.2f}x the median of its size"
        for o in named
    )
