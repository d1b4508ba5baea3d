"""Simulations with known truth for the fit's guards: does a stated interval cover the truth, and is any
claim confidently wrong?

Each :class:`Scenario` makes a micro-batch table from a seed (``perfmodel.inputs.simulate`` plus the faults real
inputs have: outliers, two sizes, a host/GPU knee, one unit per precision, overlapping micro-batch
windows, heavy-tailed noise). :func:`run` fits it many times (``perfmodel.fit``, the whole fits.json path)
and scores every fit against the truth (:func:`score`):

- **coverage**: among fits that state an interval for n* (a ``faster_above`` / ``faster_below`` case with at
  least one finite bound), the share whose interval holds the true crossing (a null bound is unbounded;
  ``0`` / ``+inf`` stand for "always" / "never");
- **wrong**: a claim the truth contradicts -- ``always_faster`` / ``never_faster`` when the truth is not
  that, or a crossing in the wrong direction (``faster_below`` when the low precision truly becomes faster
  above n*); ``indistinguishable``, ``undetermined`` and a withheld n* claim nothing and are never wrong;
- **recommendation**: a precision recommended while the case is ``indistinguishable`` / ``undetermined`` or
  n* is withheld (unsupported), or one that is truly slower at the recommended size (wrong);
- where stated: the host-stall share's interval against the true share at n -> 0, the knee headline's
  per-token saving "once GPU-bound" against the true GPU-line difference, and the line's wording with two
  sizes ("fits" is never said of a line nothing could test).

``benchmarks/fit_simulations.py`` prints the table; ``tests/unit/test_perfmodel_simulations.py`` asserts it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.inputs.simulate import (
    DEFAULT_SIZES,
    KNEE,
    PAPER_LIKE,
    Truth,
    as_truth,
    simulate_sweep,
    true_crossings,
)

__all__ = ["SCENARIOS", "Scenario", "run", "score", "summarize", "true_answer"]

LINE = {p: as_truth(t) for p, t in PAPER_LIKE.items()}  # n* = 4,500 tokens
NEVER = {"bf16": Truth(0.010, 4e-6, 0.002), "mxfp8": Truth(0.019, 5e-6, 0.009)}  # CPU emulation: never faster
GPU_COLUMNS = ("seconds", "gpu_busy_seconds", "host_stall_seconds")


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    truth: Mapping[str, Truth]
    make: Callable[[np.random.Generator], pd.DataFrame]


def _scale_rows(df: pd.DataFrame, idx: np.ndarray, factor: np.ndarray | float) -> pd.DataFrame:
    df = df.copy()
    for col in GPU_COLUMNS:
        v = df[col].astype(float).to_numpy().copy()
        v[idx] = v[idx] * factor
        df[col] = pd.array(v, dtype="Float64")
    return df


def _outliers(rng: np.random.Generator) -> pd.DataFrame:
    """Two micro-batches 3x their time (a page fault, a co-tenant), anywhere in a clean sweep."""
    df = simulate_sweep(PAPER_LIKE, repeats=4, rng=rng)
    return _scale_rows(df, rng.choice(len(df), 2, replace=False), 3.0)


def _outliers_large(rng: np.random.Generator) -> pd.DataFrame:
    """Two slow micro-batches at the low precision's largest size: the per-token saving rests there."""
    df = simulate_sweep(PAPER_LIKE, repeats=4, rng=rng)
    at = np.flatnonzero((df["precision"] == "mxfp8") & (df["tokens_per_microbatch"] == max(DEFAULT_SIZES)))
    return _scale_rows(df, rng.choice(at, 2, replace=False), 3.0)


def _heavy_tails(rng: np.random.Generator) -> pd.DataFrame:
    """Micro-batch jitter from a t distribution with 2 degrees of freedom (infinite variance), scale 2 %."""
    df = simulate_sweep(PAPER_LIKE, repeats=4, noise=0.0, rng=rng)
    jitter = np.clip(1.0 + 0.02 * rng.standard_t(2, len(df)), 0.3, None)
    return _scale_rows(df, np.arange(len(df)), jitter)


def _one_unit(rng: np.random.Generator) -> pd.DataFrame:
    """One step per precision holding one micro-batch of each size (labels on two single-step traces)."""
    df = simulate_sweep(PAPER_LIKE, repeats=1, microbatches=1, rng=rng)
    df["microbatch"] = df.groupby("precision").cumcount()
    df["step"] = 0
    df["repeat"] = 0
    return df


def _overlapping(rng: np.random.Generator, column: bool = True) -> pd.DataFrame:
    """Pipelined micro-batches: the host launches four of them back to back, the GPU runs them in turn, and
    each window runs from its first host op to the end of its GPU work -- so it holds the earlier ones'
    remaining GPU time (``overlap_seconds``, as ``mxperf ingest`` reports it). Sizes mixed within a step."""
    rows = []
    sizes = np.array(DEFAULT_SIZES[:6])
    for prec, t in LINE.items():
        for step in range(8):
            ns = rng.choice(sizes, 4)
            eff = 1.0 + rng.normal(0.0, 0.015)
            gpu = np.array([float(t.wall_s(n)) for n in ns]) * eff * (1.0 + rng.normal(0.0, 0.03, 4))
            end = np.cumsum(gpu)
            for m, n in enumerate(ns):
                start = 2e-4 * m
                secs = float(end[m] - start)
                rows.append(
                    {
                        "model": "sim",
                        "precision": prec,
                        "phase": "logprob",
                        "tokens_per_microbatch": int(n),
                        "num_tokens": int(n),
                        "step": step,
                        "microbatch": m,
                        "repeat": step,
                        "rank": 0,
                        "seconds": secs,
                        "gpu_busy_seconds": secs,
                        "host_stall_seconds": 0.0,
                        "source": "detected",
                        "overlap_seconds": max(0.0, float(end[m - 1]) - start) if m else 0.0,
                    }
                )
    df = pd.DataFrame(rows)
    return df if column else df.drop(columns=["overlap_seconds"])


def _knee(sizes: tuple[int, ...] = DEFAULT_SIZES) -> Callable[[np.random.Generator], pd.DataFrame]:
    return lambda rng: simulate_sweep(KNEE, sizes=sizes, stall_per_token_s=0.0, rng=rng)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "clean", "a clean line, 7 sizes x 4 repeats", LINE, lambda r: simulate_sweep(PAPER_LIKE, rng=r)
        ),
        Scenario("outliers", "the clean line plus two micro-batches 3x slow, anywhere", LINE, _outliers),
        Scenario(
            "outliers_large", "two micro-batches 3x slow at mxfp8's largest size", LINE, _outliers_large
        ),
        Scenario(
            "two_sizes",
            "a true line measured at two sizes (1,024 and 8,192)",
            LINE,
            lambda r: simulate_sweep(PAPER_LIKE, sizes=(1024, 8192), rng=r),
        ),
        Scenario(
            "two_sizes_knee",
            "a host/GPU knee measured at two sizes (2,048, 8,192)",
            KNEE,
            _knee((2048, 8192)),
        ),
        Scenario("knee", "a host/GPU knee, 256 to 16,384 tokens, GPU data", KNEE, _knee()),
        Scenario(
            "knee_short",
            "the knee, sizes up to 8,192: mxfp8 GPU-bound at one size",
            KNEE,
            _knee(DEFAULT_SIZES[:-1]),
        ),
        Scenario(
            "knee_from_1024", "the knee, sizes from 1,024 (host-stall share)", KNEE, _knee(DEFAULT_SIZES[2:])
        ),
        Scenario("one_unit", "one step per precision, one micro-batch of each size", LINE, _one_unit),
        Scenario("overlap", "overlapping micro-batch windows (overlap_seconds given)", LINE, _overlapping),
        Scenario(
            "overlap_unflagged",
            "overlapping windows without overlap_seconds",
            LINE,
            lambda r: _overlapping(r, column=False),
        ),
        Scenario("heavy_tails", "the clean line with t(2) micro-batch noise", LINE, _heavy_tails),
        Scenario(
            "never",
            "mxfp8 slower per token and per micro-batch (CPU emulation)",
            NEVER,
            lambda r: simulate_sweep(NEVER, rng=r),
        ),
    )
}


def true_answer(truth: Mapping[str, Truth], baseline: str = "bf16", low: str = "mxfp8") -> tuple[str, float]:
    """(case, n*) of the true wall times: n* = the last crossing (0 for always, inf for never faster)."""
    b, lo = truth[baseline], truth[low]
    roots = true_crossings(b, lo)
    big = float(lo.wall_s(1e7) - b.wall_s(1e7))
    if roots:
        return ("faster_above" if big < 0 else "faster_below"), roots[-1]
    return ("always_faster", 0.0) if big < 0 else ("never_faster", math.inf)


def true_share(truth: Mapping[str, Truth], baseline: str = "bf16", low: str = "mxfp8") -> float:
    """Host-stall share of the added fixed cost at n -> 0 (``perfmodel.inputs.simulate`` stall and wall)."""

    def at_zero(t: Truth) -> tuple[float, float]:
        host = t.host_fixed_s if t.host_fixed_s is not None else -math.inf
        return max(host, t.fixed_s), t.stall_fixed_s + max(0.0, host - t.fixed_s)

    (wb, sb), (wl, sl) = at_zero(truth[baseline]), at_zero(truth[low])
    return (sl - sb) / (wl - wb)


def _covers(ci: Any, value: float) -> bool:
    lo, hi = ([*list(ci or []), None, None])[:2]
    return (lo is None or lo <= value) and (hi is None or value <= hi)


def _wrong(case: str, ci: Any, truth_case: str) -> bool:
    """Is ``case`` contradicted by the truth? Intervals aside (that is coverage): a one-sided claim about
    every size, or a crossing in the wrong direction."""
    if case in ("always_faster", "never_faster"):
        return case != truth_case
    if case == "faster_above":
        return truth_case == "faster_below"
    if case == "faster_below":
        return truth_case == "faster_above"
    return False


def score(doc: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """One fit (a fits.json document) against its scenario's truth."""
    (e,) = doc["models"]
    be = e["breakeven"]
    truth_case, n_star = true_answer(scenario.truth)
    case, ci = be["case"], be.get("ci")
    bounded = case in ("faster_above", "faster_below") and any(v is not None for v in ci or [])
    out: dict[str, Any] = {
        "case": case if be.get("model") is not None or case == "undetermined" else f"{case} (withheld)",
        "interval": bounded,
        "covered": bounded and _covers(ci, n_star),
        "wrong": _wrong(case, ci, truth_case) and be.get("model") is not None,
        "n_star_without_interval": be.get("tokens") is not None and not bounded,
    }
    rec = (e.get("step") or {}).get("recommendation") or {}
    prec, size = rec.get("precision"), rec.get("tokens_per_microbatch")
    out["recommended"] = prec is not None
    out["recommendation_unsupported"] = prec is not None and (
        case in ("indistinguishable", "undetermined") or be.get("model") is None
    )
    if prec is not None and size:
        other = e["baseline"] if prec == e["precision"] else e["precision"]
        t = scenario.truth
        out["recommendation_wrong"] = bool(t[prec].wall_s(size) > t[other].wall_s(size) * 1.0001)
    share, hs = e.get("host_stall_share_of_added_fixed"), e.get("host_stall") or {}
    if share is not None and (hs.get("share_ci") or [None])[0] is not None:
        out["share_covered"] = _covers(hs["share_ci"], true_share(scenario.truth))
    m = re.search(r"saves (-?[\d.]+) (us|ms)/token once GPU-bound", e.get("verdict") or "")
    if m:
        t = scenario.truth
        d_tok = t["bf16"].per_token_s - t["mxfp8"].per_token_s
        out["gpu_bound_saving_covered"] = _covers(be.get("d_tok_ci"), d_tok)
    notes = [f.get("model_note") or "" for f in e["fits"].values()]
    sizes = min(len(f.get("sizes") or []) for f in e["fits"].values())
    if sizes < 3:
        out["two_size_line_said_to_fit"] = any("fits the measured sizes" in n for n in notes) or bool(
            be.get("model_ok")
        )
    return out


def run(name: str, seeds: int, n_boot: int = 300, first_seed: int = 0) -> list[dict[str, Any]]:
    """Fit ``seeds`` simulations of scenario ``name`` and score each."""
    from perfmodel.api import fit

    scenario = SCENARIOS[name]
    out = []
    for seed in range(first_seed, first_seed + seeds):
        df = scenario.make(np.random.default_rng(10_000 + seed))
        out.append(score(fit(df, n_boot=n_boot, seed=seed), scenario))
    return out


def summarize(name: str, scores: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and rates of one scenario's scores."""
    n = len(scores)
    with_ci = [s for s in scores if s["interval"]]
    out: dict[str, Any] = {
        "scenario": name,
        "about": SCENARIOS[name].about,
        "truth": "{} n*={:,.0f}".format(*true_answer(SCENARIOS[name].truth)),
        "fits": n,
        "cases": dict(Counter(s["case"] for s in scores).most_common()),
        "with_interval": len(with_ci),
        "coverage": (sum(s["covered"] for s in with_ci) / len(with_ci)) if with_ci else None,
        "wrong": sum(s["wrong"] for s in scores),
        "n_star_without_interval": sum(s["n_star_without_interval"] for s in scores),
        "recommended": sum(s["recommended"] for s in scores),
        "recommendation_unsupported": sum(s["recommendation_unsupported"] for s in scores),
        "recommendation_wrong": sum(s.get("recommendation_wrong", False) for s in scores),
    }
    for key in ("share_covered", "gpu_bound_saving_covered"):
        vals = [s[key] for s in scores if key in s]
        out[key.replace("_covered", "_coverage")] = (sum(vals) / len(vals)) if vals else None
        out[key.replace("_covered", "_stated")] = len(vals)
    said = [s["two_size_line_said_to_fit"] for s in scores if "two_size_line_said_to_fit" in s]
    if said:
        out["two_size_line_said_to_fit"] = sum(said)
    return out
