"""Paired breakeven: fitting the per-repeat difference cancels drift that both precisions share."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.breakeven.paired import paired_breakeven
from perfmodel.breakeven.solve import find_breakeven
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.simulate import simulate_sweep


def _pair(df: pd.DataFrame):
    fits = fit_cost_model(df, n_boot=0)
    return fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]


def test_shared_drift_is_cancelled_by_pairing() -> None:
    # 30 % drift per (size, repeat), shared by both precisions; little noise of their own.
    df = simulate_sweep(rng=np.random.default_rng(3), noise=0.01, repeat_noise=0.005, shared_drift=0.3)
    base, low = _pair(df)
    paired = paired_breakeven(base, low)
    independent = find_breakeven(base, low)
    assert paired is not None and paired.case == "faster_above"
    # one (size, repeat) drifted 2.7x in both precisions: the outlier screen leaves that step out of both
    assert paired.n_pairs == 7 * 4 - 1
    left_out = {(o["tokens_per_microbatch"], o["repeat"]) for o in base.outliers + low.outliers}
    assert left_out == {(1024, 1)}
    assert paired.ci_shape == "bounded"
    assert paired.ci[0] <= 4500 <= paired.ci[1]
    # Fitted one precision at a time, the drift swamps the per-token saving: no bounded interval for n*.
    assert independent.ci_shape != "bounded"
    assert independent.ci[1] is None  # at best a half-line: "not faster below r2"


def test_paired_matches_independent_fits_without_drift() -> None:
    base, low = _pair(simulate_sweep(rng=np.random.default_rng(4)))
    paired, independent = paired_breakeven(base, low), find_breakeven(base, low)
    assert paired.case == independent.case == "faster_above"
    assert abs(paired.tokens - independent.tokens) < 1e-6 * independent.tokens  # same points, same lines


def test_no_pairing_without_repeats() -> None:
    df = simulate_sweep()
    df["repeat"] = 0
    assert paired_breakeven(*_pair(df)) is None
