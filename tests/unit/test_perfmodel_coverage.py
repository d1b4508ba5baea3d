"""Coverage of the reported 95 % intervals, measured by simulation with known truth at 3 and 5 repeats.

The slow tests assert the issue's goal (>= 0.93) on 150 simulations per scenario (binomial sd ~1.8 %); the
fast one is a smoke check of the same loop. Scenarios: a clean line (Fieller and the unit bootstrap), a
host/GPU knee (with and without GPU data), a per-step cost on micro-batch 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.breakeven.solve import find_breakeven
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.simulate import KNEE, PAPER_LIKE, Truth, as_truth, simulate_sweep, true_crossings

PER_STEP = {"bf16": Truth(0.010, 4e-6, 0.002), "mxfp8": Truth(0.013, 2e-6, 0.005, per_step_s=0.03)}
SCENARIOS = {
    "line": (PAPER_LIKE, {}),
    "knee": (KNEE, {"stall_per_token_s": 0.0}),
    "knee_no_gpu": (KNEE, {"stall_per_token_s": 0.0}),
    "per_step": (PER_STEP, {"global_tokens": 16384}),
}


def _covers(ci, truth: float) -> bool:
    lo, hi = ci
    return (lo is None or lo <= truth) and (hi is None or truth <= hi)


def coverage(scenario: str, repeats: int, sims: int, n_boot: int = 300) -> dict[str, float]:
    """Share of simulations whose interval holds the truth, per interval (n* withheld counts as a miss)."""
    truth, kw = SCENARIOS[scenario]
    n_star = true_crossings(as_truth(truth["bf16"]), as_truth(truth["mxfp8"]))[-1]
    hits: dict[str, list[bool]] = {}
    for i in range(sims):
        df = simulate_sweep(truth, repeats=repeats, rng=np.random.default_rng(50_000 + i), **kw)
        if scenario == "knee_no_gpu":
            na = pd.array([None] * len(df), dtype="Float64")
            df = df.assign(gpu_busy_seconds=na, host_stall_seconds=na)
        fits = fit_cost_model(df, n_boot=n_boot, seed=i)
        base, low = fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]
        be = find_breakeven(base, low)
        hits.setdefault("n_star", []).append(be.tokens is not None and _covers(be.ci, n_star))
        if be.model == "line":
            hits.setdefault("n_star_bootstrap", []).append(
                bool(be.bootstrap_ci) and _covers(be.bootstrap_ci, n_star)
            )
        if scenario in ("line", "per_step"):
            for f, t in ((base, as_truth(truth["bf16"])), (low, as_truth(truth["mxfp8"]))):
                hits.setdefault("per_token", []).append(_covers(f.wall.line.ci("per_token"), t.per_token_s))
        if scenario == "per_step":
            ps = low.wall.per_step()
            hits.setdefault("per_step", []).append(bool(ps and ps[1]) and _covers(ps[1], 0.03))
    return {k: float(np.mean(v)) for k, v in hits.items()}


def test_coverage_smoke_on_a_clean_line_at_three_repeats() -> None:
    cov = coverage("line", repeats=3, sims=30, n_boot=200)
    assert cov["n_star"] >= 0.85 and cov["n_star_bootstrap"] >= 0.85 and cov["per_token"] >= 0.85


@pytest.mark.slow
@pytest.mark.parametrize("repeats", [3, 5])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_reported_intervals_cover_the_truth_at_three_and_five_repeats(scenario: str, repeats: int) -> None:
    cov = coverage(scenario, repeats=repeats, sims=150)
    assert all(v >= 0.93 for v in cov.values()), cov
