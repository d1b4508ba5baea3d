"""Fits recover known truth; HC3 matches its textbook formula; bootstrap, lack of fit and hold-out behave."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.bootstrap import REPEAT_UNIT, ROW_UNIT, bootstrap_lines, resampling_cells
from perfmodel.fit import fit_cost_model, fit_line, holdout_errors, lack_of_fit
from perfmodel.model import fit_band, predict_microbatch_seconds
from perfmodel.simulate import PAPER_LIKE, simulate_sweep


def test_noiseless_line_is_recovered_exactly() -> None:
    x = np.array([256, 512, 1024, 2048, 4096.0])
    fit = fit_line(x, 0.01 + 3e-6 * x)
    assert fit.intercept == pytest.approx(0.01, rel=1e-9)
    assert fit.slope == pytest.approx(3e-6, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)


def test_hc3_covariance_matches_the_sandwich_formula() -> None:
    rng = np.random.default_rng(1)
    x = np.repeat([100.0, 400.0, 900.0, 1600.0], 3)
    y = 1.0 + 0.01 * x + rng.normal(0, 0.05 * x / 100 + 0.01)
    fit = fit_line(x, y)
    design = np.stack([np.ones_like(x), x], axis=1)
    inv = np.linalg.inv(design.T @ design)
    e = y - design @ inv @ design.T @ y
    h = np.einsum("ij,jk,ik->i", design, inv, design)
    expected = inv @ (design.T * (e**2 / (1 - h) ** 2)) @ design @ inv
    np.testing.assert_allclose(fit.cov, expected, rtol=1e-8)


def test_simulated_sweep_recovers_fixed_and_per_token_within_their_intervals() -> None:
    fits = fit_cost_model(simulate_sweep(rng=np.random.default_rng(7)), n_boot=200)
    for prec, (fixed, per_token, _) in PAPER_LIKE.items():
        f = fits[("sim", "update", prec)]
        lo, hi = f.time.ci("intercept")
        assert lo <= fixed <= hi
        lo, hi = f.time.ci("slope")
        assert lo <= per_token <= hi
        assert f.fixed_s == pytest.approx(fixed, rel=0.05)
        assert f.per_token_s == pytest.approx(per_token, rel=0.05)


def test_fits_use_repeat_means_when_every_size_has_repeats() -> None:
    f = fit_cost_model(simulate_sweep(repeats=3, microbatches=4), n_boot=10)[("sim", "update", "bf16")]
    assert f.boot_unit == REPEAT_UNIT
    assert f.time.n_points == 7 * 3
    assert f.n_microbatches == 7 * 3 * 4


def test_resampling_falls_back_to_micro_batches_without_repeats() -> None:
    _, strata, unit = resampling_cells(np.array([1, 1, 2, 2, 2]), np.zeros(5, np.int64))
    assert unit == ROW_UNIT
    assert strata.tolist() == [0, 0, 1, 1, 1]


def test_bootstrap_keeps_every_size_and_matches_hc3_spread() -> None:
    rng = np.random.default_rng(3)
    x = np.repeat(np.array([256, 1024, 4096, 16384.0]), 20)
    y = 0.01 + 2e-6 * x + rng.normal(0, 1e-3, len(x))
    repeat = np.tile(np.arange(20), 4)
    (boot,), unit = bootstrap_lines(x, [y], x.astype(int), repeat, 2000, np.random.default_rng(0))
    assert unit == REPEAT_UNIT
    assert np.isfinite(boot).all()  # stratified draws always keep >= 2 sizes
    fit = fit_line(x, y)
    assert boot[:, 1].std() == pytest.approx(fit.slope_se, rel=0.15)
    assert boot[:, 0].std() == pytest.approx(fit.intercept_se, rel=0.15)


def test_bootstrap_is_reproducible_with_a_seed() -> None:
    df = simulate_sweep()
    a = fit_cost_model(df, n_boot=50, seed=5)[("sim", "update", "mxfp8")].boot
    b = fit_cost_model(df, n_boot=50, seed=5)[("sim", "update", "mxfp8")].boot
    np.testing.assert_array_equal(a, b)


def test_under_filled_small_sizes_are_flagged_with_a_min_tokens_suggestion() -> None:
    sizes = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192])
    x = np.repeat(sizes, 4).astype(float)
    # The GPU is under-filled below 512 tokens: time stays at the 512-token level.
    y = 0.01 + 2e-6 * np.maximum(x, 512) + np.tile([-1e-5, 1e-5, -2e-5, 2e-5], len(sizes))
    lof = lack_of_fit(x, y, x.astype(int))
    assert lof is not None and lof.flag
    assert lof.small_sizes_above_line
    assert lof.suggested_min_tokens is not None and lof.suggested_min_tokens >= 256
    assert "under-filled" in lof.note


def test_straight_line_data_is_not_flagged() -> None:
    x = np.repeat(np.array([64, 256, 1024, 4096.0]), 4)
    y = 0.01 + 2e-6 * x + np.tile([-1e-5, 1e-5, -2e-5, 2e-5], 4)
    lof = lack_of_fit(x, y, x.astype(int))
    assert lof is not None and not lof.flag


def test_holdout_mape_is_small_on_linear_data() -> None:
    x = np.repeat(np.array([256, 512, 1024, 2048, 4096, 8192.0]), 3)
    y = 0.01 + 2e-6 * x * np.tile([0.99, 1.0, 1.01], 6)
    out = holdout_errors(x, y, x.astype(int))
    assert out["interpolation_held_out_sizes"] == [512, 2048]
    assert out["extrapolation_held_out_sizes"] == [8192]
    assert out["interpolation_mape"] < 0.01
    assert out["extrapolation_mape"] < 0.01


def test_band_contains_the_prediction_and_widens_away_from_the_data() -> None:
    f = fit_cost_model(simulate_sweep(), n_boot=0)[("sim", "update", "bf16")]
    ns = np.array([4096.0, 100_000.0])
    pred, lo, hi = fit_band(f, ns)
    np.testing.assert_allclose(pred, predict_microbatch_seconds(f, ns))
    assert np.all(lo < pred) and np.all(pred < hi)
    assert (hi - lo)[1] > (hi - lo)[0]


def test_prediction_accepts_a_fits_json_mapping() -> None:
    assert predict_microbatch_seconds({"fixed_s": 0.01, "per_token_s": 1e-6}, 1000) == pytest.approx(0.011)


def test_min_tokens_drops_small_sizes() -> None:
    f = fit_cost_model(simulate_sweep(), n_boot=0, min_tokens=1024)[("sim", "update", "bf16")]
    assert f.sizes[0] == 1024


def test_trailing_partial_micro_batch_counts_its_actual_tokens() -> None:
    rows = []
    for n in (512, 1024, 2048):
        for _r in range(3):
            rows.append((n, n, 0.01 + 1e-6 * n))
            rows.append((n, n // 2, 0.01 + 1e-6 * (n // 2)))  # a half-full last micro-batch
    df = pd.DataFrame(rows, columns=["tokens_per_microbatch", "num_tokens", "seconds"]).assign(
        model="m", phase="update", precision="bf16", repeat=0
    )
    f = fit_cost_model(df, n_boot=0)[("m", "update", "bf16")]
    assert f.per_token_s == pytest.approx(1e-6, rel=1e-6)
    assert f.fixed_s == pytest.approx(0.01, rel=1e-6)
