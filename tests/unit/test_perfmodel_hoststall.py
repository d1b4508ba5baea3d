"""Host-stall share of the added fixed cost: recovered with an interval, null with a reason without a trace."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.fit import fit_cost_model
from perfmodel.hoststall import host_stall_share
from perfmodel.simulate import simulate_sweep


def _pair(df):
    fits = fit_cost_model(df, n_boot=500)
    return fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]


def test_share_of_added_fixed_cost_recovers_the_truth_within_its_interval() -> None:
    share = host_stall_share(*_pair(simulate_sweep(rng=np.random.default_rng(2))))
    truth = (0.009 - 0.002) / (0.019 - 0.010)
    assert share.share == pytest.approx(truth, abs=0.08)
    assert share.ci_method == "fieller"
    assert share.ci[0] <= truth <= share.ci[1]
    assert share.bootstrap_ci is not None and share.bootstrap_ci[0] <= truth <= share.bootstrap_ci[1]
    assert share.reason is None


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
