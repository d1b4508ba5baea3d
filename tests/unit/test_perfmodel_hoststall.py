"""Host-stall share of the added fixed cost: recovered with an interval, null with a reason without a trace."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.fitting import fit_cost_model
from perfmodel.hoststall import host_stall_share
from perfmodel.simulate import KNEE, simulate_sweep


def _pair(df, n_boot: int = 500):
    fits = fit_cost_model(df, n_boot=n_boot)
    return fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]


def test_share_of_added_fixed_cost_recovers_the_truth_within_its_interval() -> None:
    truth = (0.009 - 0.002) / (0.019 - 0.010)
    hits = 0
    for seed in range(30):
        share = host_stall_share(*_pair(simulate_sweep(rng=np.random.default_rng(seed)), n_boot=100))
        assert share.share == pytest.approx(truth, abs=0.08)
        assert share.ci_method == "fieller" and share.basis == "fitted intercepts"
        assert share.reason is None
        hits += share.ci[0] <= truth <= share.ci[1]
    assert hits >= 26  # a 95 % interval: P(fewer than 26 of 30) < 2 %


def test_a_knee_is_measured_at_the_smallest_size_with_a_bounded_interval() -> None:
    df = simulate_sweep(KNEE, rng=np.random.default_rng(1), stall_per_token_s=0.0)
    share = host_stall_share(*_pair(df, n_boot=100))
    # at 256 tokens both are launch-bound: the added 9 ms is 8.5 ms of stall (busy grows 0.5 ms)
    truth = ((0.019 - 0.003 - 2e-6 * 256) - (0.010 - 0.002 - 4e-6 * 256)) / 0.009
    assert share.basis.startswith("measured at 256 tokens")
    assert share.ci[0] is not None and share.ci[0] <= truth <= share.ci[1]
    assert share.ci[0] > 0.5 and share.ci[1] < 1.5  # bounded and sensible, not [-53 %, 66 %]


def test_no_added_fixed_cost_gives_no_interval_rather_than_an_absurd_one() -> None:
    truth = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.0101, 2e-6, 0.0025)}
    share = host_stall_share(*_pair(simulate_sweep(truth, rng=np.random.default_rng(3)), n_boot=100))
    assert share.ci == (None, None) and "not significantly different from 0" in share.reason


def test_no_gpu_trace_gives_null_share_with_a_reason() -> None:
    df = simulate_sweep()
    df["host_stall_seconds"] = np.nan
    share = host_stall_share(*_pair(df.astype({"host_stall_seconds": "Float64"})))
    assert share.share is None
    assert share.ci == (None, None)
    assert "GPU trace" in share.reason


def test_stall_on_only_some_micro_batches_still_gives_a_bootstrap_interval() -> None:
    df = simulate_sweep(rng=np.random.default_rng(4))
    df.loc[df["microbatch"] == 0, "host_stall_seconds"] = np.nan
    share = host_stall_share(*_pair(df))
    assert share.share is not None
    assert share.ci_method in ("fieller", "bootstrap")
    assert share.ci[0] is not None
