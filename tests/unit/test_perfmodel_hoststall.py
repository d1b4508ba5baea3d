"""Host-stall share of the added fixed cost: recovered with an interval, null with a reason without a trace."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.breakeven.hoststall import host_stall_share
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.simulate import KNEE, simulate_sweep


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


# At zero tokens both precisions are launch-bound: the added 9 ms (host 19 vs 10 ms) is 8 ms of stall
# (host minus GPU fixed cost: 16 vs 8 ms) -- the model's own value, wherever the sweep starts.
KNEE_SHARE = ((0.019 - 0.003) - (0.010 - 0.002)) / 0.009


@pytest.mark.parametrize(
    "sizes", [(256, 512, 1024, 2048, 4096, 8192, 16384), (512, 1024, 2048, 4096, 8192, 16384)]
)
def test_a_knee_gives_the_share_at_zero_tokens_wherever_the_sweep_starts(sizes) -> None:
    df = simulate_sweep(KNEE, sizes=sizes, rng=np.random.default_rng(1), stall_per_token_s=0.0)
    share = host_stall_share(*_pair(df, n_boot=200))
    assert share.basis.startswith("zero-size intercepts")
    assert share.ci[0] is not None and share.ci[0] <= KNEE_SHARE <= share.ci[1]
    assert share.share == pytest.approx(KNEE_SHARE, abs=0.05)
    assert share.ci[0] > 0.5 and share.ci[1] < 1.3  # bounded and sensible


def test_a_knee_with_one_size_below_it_gives_no_share() -> None:
    # from 1,024 tokens bf16 (knee at 2,000) has one launch-bound size: its value at zero is not measured
    df = simulate_sweep(
        KNEE, sizes=(1024, 2048, 4096, 8192, 16384), rng=np.random.default_rng(1), stall_per_token_s=0.0
    )
    share = host_stall_share(*_pair(df, n_boot=100))
    assert share.share is None and "below its" in share.reason and "not measured" in share.reason


def test_two_sizes_give_no_share_the_intercept_is_untested() -> None:
    share = host_stall_share(
        *_pair(simulate_sweep(sizes=(1024, 8192), rng=np.random.default_rng(2)), n_boot=100)
    )
    assert share.share is None and "linearity untested" in share.reason


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
