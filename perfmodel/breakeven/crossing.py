"""The measured crossing: between which two measured sizes does the low precision become faster (or slower)?

Model-free: at each size both precisions measured, the difference of mean micro-batch time (low - base) over
independent units (steps), paired by repeat when both have the same repeats at that size (a sweep runs
precisions back to back, so shared drift cancels), Welch otherwise, with its two-sided t test. The crossing
is the pair of adjacent sizes between which the difference changes sign; a size whose difference is within
noise (p >= 0.05) has no known sign, so the crossing spans it (the last size significantly one way to the
first significantly the other). ``significant``: both ends significant; false when only the point estimates
change sign; null when there are too few units for a test. It is reported always: it is the
answer when no model fits, and a check on the model's n* when one does. The fitted per-step cost (a cost on
micro-batch 0, or one seen across global batch sizes) is taken out of each unit's mean first, so the
crossing is comparable to the micro-batch n*. Dynamic batching (no size grid): sizes are token bins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise

import numpy as np
import pandas as pd
from scipy import stats

from perfmodel.fitting.design import scale_cols
from perfmodel.fitting.fit_all import per_step_share
from perfmodel.fitting.fitted import PER_STEP_TERMS, BasisFit, PrecisionFit

ALPHA = 0.05
_BINS = 6


@dataclass(frozen=True)
class Crossing:
    tokens: (
        tuple[float, float] | None
    )  # adjacent measured sizes (mean tokens processed) bracketing the change
    significant: bool | None
    direction: str | None  # "faster_above" (low becomes faster above) | "faster_below"
    n_sign_changes: int
    sizes: list[float] = field(default_factory=list)
    diff_s: list[float] = field(default_factory=list)  # mean low - base per size
    p_values: list[float | None] = field(default_factory=list)
    paired: bool = False
    grouping: str = "size"
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _unit_values(fit: PrecisionFit, basis: BasisFit, response: str) -> pd.DataFrame:
    d = fit.design
    resp = d.responses[response]
    cnt = resp.unit_count
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = resp.unit_total / cnt - per_step_share(d, basis.line, response)
    ok = cnt > 0
    return pd.DataFrame(
        {"label": d.unit_label[ok], "repeat": d.unit_repeat[ok], "tokens": d.unit_tokens[ok], "y": mean[ok]}
    )


def _cell_values(fit: PrecisionFit, basis: BasisFit, response: str, edges: np.ndarray) -> pd.DataFrame:
    """Dynamic batching (a step holds several sizes): one observation per (unit, token bin), the mean time of
    the unit's micro-batches in that bin without the fitted per-step cost."""
    d = fit.design
    resp = d.responses[response]
    onehot = np.eye(len(edges) + 1)[np.digitize(d.tokens, edges)]  # (patterns, bins)
    extra = d.x @ np.array(
        [basis.line.coef(n) if n in PER_STEP_TERMS and basis.line.has(n) else 0.0 for n in d.names]
    )
    cnt = np.asarray(resp.count @ onehot)
    tot = np.asarray(resp.total @ onehot) - np.asarray(scale_cols(resp.count, extra) @ onehot)
    tok = np.asarray(scale_cols(resp.count, d.tokens) @ onehot)
    u, b = np.nonzero(cnt)
    return pd.DataFrame(
        {"label": b, "repeat": d.unit_repeat[u], "tokens": tok[u, b] / cnt[u, b], "y": tot[u, b] / cnt[u, b]}
    )


def _bin_edges(base: PrecisionFit, low: PrecisionFit, response: str) -> np.ndarray:
    """Interior edges of log-spaced token bins over the sizes both precisions measured."""
    lo = max(f.design.tokens[f.design.responses[response].pattern_count > 0].min() for f in (base, low))
    hi = min(f.design.tokens[f.design.responses[response].pattern_count > 0].max() for f in (base, low))
    return np.geomspace(lo, hi, _BINS + 1)[1:-1] if hi > lo else np.array([])


def _test(b: pd.DataFrame, lo: pd.DataFrame, paired: bool) -> tuple[float, float | None]:
    """(mean low - mean base, two-sided p): a paired t test over repeats, else Welch's."""
    if paired:
        yb = dict(zip(b["repeat"], b["y"], strict=True))
        m = np.array([y - yb[r] for r, y in zip(lo["repeat"], lo["y"], strict=True) if r in yb])
        diff = float(m.mean())
        sd = float(m.std(ddof=1)) if len(m) > 1 else 0.0
        if sd == 0:
            return diff, None
        return diff, float(2 * stats.t.sf(abs(diff) / (sd / np.sqrt(len(m))), len(m) - 1))
    yl, yb = lo["y"].to_numpy(float), b["y"].to_numpy(float)
    diff = float(yl.mean() - yb.mean())
    if len(yb) < 2 or len(yl) < 2:
        return diff, None
    vl, vb = yl.var(ddof=1) / len(yl), yb.var(ddof=1) / len(yb)
    if vl + vb == 0:
        return diff, None
    dof = (vl + vb) ** 2 / (vl * vl / (len(yl) - 1) + vb * vb / (len(yb) - 1))
    return diff, float(2 * stats.t.sf(abs(diff) / np.sqrt(vl + vb), dof))


def measured_crossing(
    base: PrecisionFit, low: PrecisionFit, basis: str = "wall", pair: bool = True
) -> Crossing | None:
    """The crossing on ``basis`` (``wall`` | ``gpu_busy``); None when that basis was not fitted for both.
    ``pair``: the precisions ran back to back (an ``mxperf sweep``), so units with the same repeat at a size
    may be paired; else Welch's test throughout."""
    response = "seconds" if basis == "wall" else "gpu_busy_seconds"
    fb, fl = (base.wall, low.wall) if basis == "wall" else (base.busy, low.busy)
    if fb is None or fl is None:
        return None
    vb, vl = _unit_values(base, fb, response), _unit_values(low, fl, response)
    grouping = "size"
    if (vb["label"] < 0).any() or (vl["label"] < 0).any():
        edges = _bin_edges(base, low, response)
        vb, vl = _cell_values(base, fb, response, edges), _cell_values(low, fl, response, edges)
        grouping = "token bins"
    common = sorted(set(vb["label"]) & set(vl["label"]))
    if len(common) < 2:
        return Crossing(None, None, None, 0, grouping=grouping, note="fewer than two sizes measured in both")
    rows = []
    all_paired = True
    by_b, by_l = dict(tuple(vb.groupby("label"))), dict(tuple(vl.groupby("label")))
    for s in common:
        b, lo = by_b[s], by_l[s]
        shared = set(b["repeat"]) & set(lo["repeat"])
        paired = pair and grouping == "size" and len(shared) >= 2 and len(shared) == len(b) == len(lo)
        all_paired &= paired
        diff, p = _test(b, lo, paired)
        size = float(pd.concat([b, lo])["tokens"].mean())  # tokens processed: n*'s scale, not the label
        rows.append((size, diff, p))
    sizes, diffs, ps = (list(v) for v in zip(*rows, strict=True))
    known = [0 if p is not None and p >= ALPHA else int(np.sign(d)) for d, p in zip(diffs, ps, strict=True)]
    flips = _flips(known)
    significant: bool | None = True
    if not flips:  # no change between significant sizes: fall back to the point estimates' signs
        flips = _flips([int(np.sign(d)) for d in diffs])
        significant = False if flips else None
    if any(p is None for p in ps):
        significant = None if significant else significant
    if not flips:
        side = "slower" if diffs[0] > 0 else "faster"
        n_sig = sum(1 for p in ps if p is not None and p < ALPHA)
        strength = (
            "" if n_sig == len(ps) else f" (point estimates; significant at {n_sig} of {len(ps)} sizes)"
        )
        return Crossing(
            None,
            None,
            None,
            0,
            sizes,
            diffs,
            ps,
            all_paired,
            grouping,
            f"low is {side} at every measured size{strength}",
        )
    i, j = flips[0]
    note = ""
    if j > i + 1:
        note = "the difference is within noise at the size(s) in between, so the crossing spans them"
    if len(flips) > 1:
        note = "; ".join(
            x
            for x in (note, f"the measured difference changes sign {len(flips)} times: the first is reported")
            if x
        )
    direction = "faster_above" if diffs[i] > 0 else "faster_below"
    return Crossing(
        (sizes[i], sizes[j]), significant, direction, len(flips), sizes, diffs, ps, all_paired, grouping, note
    )


def _flips(signs: list[int]) -> list[tuple[int, int]]:
    """(i, j): consecutive nonzero signs of opposite sign (zeros -- not significant -- in between skipped)."""
    nz = [i for i, s in enumerate(signs) if s != 0]
    return [(a, b) for a, b in pairwise(nz) if signs[a] != signs[b]]
