"""The measured crossing: model-free, paired by repeat, spanning sizes whose difference is within noise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.breakeven.crossing import _flips, measured_crossing
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.simulate import PAPER_LIKE, simulate_sweep


def _pair(df: pd.DataFrame):
    fits = fit_cost_model(df, n_boot=0)
    return fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]


def test_sign_changes_skip_sizes_whose_difference_is_within_noise() -> None:
    assert _flips([1, 1, 0, -1, -1]) == [(1, 3)]
    assert _flips([1, -1, 1]) == [(0, 1), (1, 2)]
    assert _flips([0, 0, 1, 1]) == []


def test_the_crossing_brackets_the_true_breakeven_and_is_paired() -> None:
    hits = 0
    for seed in range(6):
        c = measured_crossing(*_pair(simulate_sweep(rng=np.random.default_rng(seed))))
        assert c.paired and c.grouping == "size" and c.direction == "faster_above"
        hits += c.tokens[0] <= 4500 <= c.tokens[1]
    assert hits >= 5
    assert len(c.sizes) == 7 and len(c.diff_s) == len(c.p_values) == 7


def test_no_crossing_when_one_precision_is_faster_everywhere() -> None:
    truth = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.005, 3e-6, 0.002)}
    c = measured_crossing(*_pair(simulate_sweep(truth, rng=np.random.default_rng(1))))
    assert c.tokens is None and c.n_sign_changes == 0
    assert "faster at every measured size" in c.note


def test_same_sign_everywhere_within_noise_is_said_to_be_point_estimates() -> None:
    # a tiny, constant difference drowned in noise: the signs may agree, the claim must not be confident
    truth = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.0097, 3.95e-6, 0.002)}
    for seed in range(20):
        c = measured_crossing(*_pair(simulate_sweep(truth, noise=0.1, rng=np.random.default_rng(seed))))
        if c.tokens is None and "at every measured size" in c.note:
            n_sig = sum(1 for p in c.p_values if p is not None and p < 0.05)
            assert (n_sig == len(c.p_values)) == ("point estimates" not in c.note), c.note
            if n_sig < len(c.p_values):
                assert f"significant at {n_sig} of {len(c.p_values)} sizes" in c.note
                return
    raise AssertionError("no seed gave a same-sign, not-all-significant case")


def test_a_crossing_between_noisy_sizes_is_not_called_significant() -> None:
    truth = {
        "bf16": (0.010, 4e-6, 0.002),
        "mxfp8": (0.0108, 3.8e-6, 0.002),
    }  # lines nearly on top of each other
    c = measured_crossing(*_pair(simulate_sweep(truth, rng=np.random.default_rng(3), noise=0.05)))
    assert c.tokens is None or c.significant is False


def test_dynamic_batching_is_grouped_into_token_bins() -> None:
    df = simulate_sweep(
        PAPER_LIKE, rng=np.random.default_rng(4), dynamic=True, global_tokens=65536, repeats=2
    )
    df["step"] = df["repeat"] + 100 * (df["precision"] == "mxfp8").astype(
        int
    )  # a step holds several sizes ...
    df["microbatch"] = df.groupby(["precision", "step"]).cumcount()  # ... in one traced step each
    base, low = _pair(df)
    c = measured_crossing(base, low)
    assert c.grouping == "token bins" and not c.paired
    assert c.tokens is not None and c.tokens[0] <= 4500 <= c.tokens[1]


@pytest.mark.parametrize("basis", ["wall", "gpu_busy"])
def test_the_crossing_is_given_per_basis(basis: str) -> None:
    c = measured_crossing(*_pair(simulate_sweep(rng=np.random.default_rng(5))), basis)
    assert c is not None and c.tokens is not None


def test_sizes_are_the_tokens_processed_not_the_size_labels() -> None:
    # each step's micro-batches hold 40-100 % of their size label (padding-free packing): the crossing is on
    # n*'s scale (num_tokens), so it brackets the true 4,500 tokens, not the labels around it
    df = simulate_sweep(rng=np.random.default_rng(6), dynamic=True, repeats=4, noise=0.01)
    c = measured_crossing(*_pair(df))
    assert c.grouping == "size"
    labels = sorted(df["tokens_per_microbatch"].unique())
    assert all(s < lab for s, lab in zip(c.sizes, labels, strict=True))
    assert c.tokens[0] <= 4500 <= c.tokens[1]
