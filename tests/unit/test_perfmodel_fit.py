"""Fits recover known truth; CR3 is HC3 when every point is a unit; bootstrap, lack of fit and hold-out behave."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.fitting import bootstrap
from perfmodel.fitting.design import UNIT_ROW, UNIT_STEP, build_design
from perfmodel.fitting.fit_all import fit_basis, fit_cost_model, fit_line
from perfmodel.fitting.linear import fit_linear
from perfmodel.fitting.lof import lack_of_fit
from perfmodel.fitting.model import fit_band, predict_microbatch_seconds
from perfmodel.inputs.simulate import PAPER_LIKE, simulate_sweep


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


def test_cr3_is_the_sum_of_leave_one_unit_out_changes() -> None:
    df = simulate_sweep(rng=np.random.default_rng(2), repeats=3)
    d = build_design(df[df["precision"] == "bf16"].reset_index(drop=True))
    fit = fit_linear(d, "seconds")
    rows = df[df["precision"] == "bf16"].reset_index(drop=True)
    x = np.column_stack([np.ones(len(rows)), rows["num_tokens"], (rows["microbatch"] == 0)])
    y = rows["seconds"].to_numpy(float)
    full = np.linalg.lstsq(x, y, rcond=None)[0]
    deltas = []
    for step in rows["step"].unique():
        keep = (rows["step"] != step).to_numpy()
        deltas.append(full - np.linalg.lstsq(x[keep], y[keep], rcond=None)[0])
    deltas = np.array(deltas)
    np.testing.assert_allclose(fit.beta, full, rtol=1e-9)
    np.testing.assert_allclose(fit.cov, deltas.T @ deltas, rtol=1e-6)


def test_simulated_sweep_recovers_fixed_and_per_token_within_their_intervals() -> None:
    hits = {}
    for seed in range(20):
        fits = fit_cost_model(simulate_sweep(rng=np.random.default_rng(seed)), n_boot=0)
        for prec, (fixed, per_token, _) in PAPER_LIKE.items():
            f = fits[("sim", "update", prec)]
            lo, hi = f.time.ci("intercept")
            hits.setdefault("fixed", []).append(lo <= fixed <= hi)
            lo, hi = f.time.ci("slope")
            hits.setdefault("per_token", []).append(lo <= per_token <= hi)
            assert f.fixed_s == pytest.approx(fixed, rel=0.05)
            assert f.per_token_s == pytest.approx(per_token, rel=0.05)
            assert f.wall.model == "line"
    # 40 intervals each at 95 %: >= 36 is what an honest interval gives (P(fewer) < 5 %)
    assert sum(hits["fixed"]) >= 36 and sum(hits["per_token"]) >= 36


def test_steps_are_the_units_and_micro_batches_are_not() -> None:
    f = fit_cost_model(simulate_sweep(repeats=3, microbatches=4), n_boot=10)[("sim", "update", "bf16")]
    assert f.boot_unit == UNIT_STEP
    assert f.time.n_points == 7 * 3  # one unit per (size, repeat) step
    assert f.n_microbatches == 7 * 3 * 4
    assert f.wall.line.dof == 7 * 3 - 3  # fixed, per-token, per-step (micro-batch 0)


def test_without_repeat_or_step_the_micro_batches_are_the_units() -> None:
    df = simulate_sweep().drop(columns=["repeat", "step", "microbatch"])
    f = fit_cost_model(df, n_boot=10)[("sim", "update", "bf16")]
    assert f.boot_unit == UNIT_ROW
    assert f.time.n_points == len(df) // 2


def test_bootstrap_keeps_every_size_and_matches_the_cr3_spread() -> None:
    rng = np.random.default_rng(3)
    x = np.repeat(np.array([256, 1024, 4096, 16384]), 20)
    df = pd.DataFrame(
        {
            "model": "m",
            "precision": "bf16",
            "tokens_per_microbatch": x,
            "seconds": 0.01 + 2e-6 * x + rng.normal(0, 1e-3, len(x)),
            "repeat": np.tile(np.arange(20), 4),
        }
    )
    from perfmodel.inputs.columns import conform_microbatches

    d = build_design(conform_microbatches(df, "t", "csv"))
    assert d.strata is not None  # 20 units per size: resampled within sizes
    draws = bootstrap.draw(d.n_units, d.strata, 2000, np.random.default_rng(0))
    assert (draws.counts.reshape(2000, -1).sum(axis=1) == d.n_units).all()
    fit = fit_linear(d, "seconds", draws)
    assert np.isfinite(fit.boot).all()  # stratified draws always keep every size
    raw = fit.boot_raw
    assert raw[:, 1].std() * draws.expand == pytest.approx(fit.se("per_token"), rel=0.15)
    assert raw[:, 0].std() * draws.expand == pytest.approx(fit.se("fixed"), rel=0.15)


def test_bootstrap_is_reproducible_with_a_seed() -> None:
    df = simulate_sweep()
    a = fit_cost_model(df, n_boot=50, seed=5)[("sim", "update", "mxfp8")].boot
    b = fit_cost_model(df, n_boot=50, seed=5)[("sim", "update", "mxfp8")].boot
    np.testing.assert_array_equal(a, b)


def _underfilled() -> pd.DataFrame:
    sizes = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192])
    x = np.repeat(sizes, 4)
    # The GPU is under-filled below 512 tokens: time stays at the 512-token level.
    y = 0.01 + 2e-6 * np.maximum(x, 512) + np.tile([-1e-5, 1e-5, -2e-5, 2e-5], len(sizes))
    return pd.DataFrame(
        {
            "model": "m",
            "precision": "bf16",
            "tokens_per_microbatch": x,
            "seconds": y,
            "repeat": np.tile(range(4), 8),
        }
    )


def test_under_filled_small_sizes_reject_the_line_and_a_knee_model_takes_over() -> None:
    from perfmodel.inputs.columns import conform_microbatches

    d = build_design(conform_microbatches(_underfilled(), "t", "csv"))
    draws = bootstrap.draw(d.n_units, d.strata, 200, np.random.default_rng(0))
    b = fit_basis(d, "seconds", "wall", draws)
    assert b.lack_of_fit is not None and b.lack_of_fit.flag
    assert b.lack_of_fit.small_sizes_above_line
    assert "under-filled GPU" in b.lack_of_fit.note and "slower than it predicts" in b.lack_of_fit.note
    assert not b.line_ok and b.model == "knee"
    assert b.knee.curve.knee == pytest.approx(512, rel=0.05)
    assert b.knee.curve.b1 == pytest.approx(0.0, abs=2e-8) and b.knee.curve.b2 == pytest.approx(
        2e-6, rel=0.02
    )


def test_straight_line_data_is_not_flagged() -> None:
    x = np.repeat(np.array([64, 256, 1024, 4096]), 4)
    df = pd.DataFrame(
        {
            "model": "m",
            "precision": "bf16",
            "tokens_per_microbatch": x,
            "seconds": 0.01 + 2e-6 * x + np.tile([-1e-5, 1e-5, -2e-5, 2e-5], 4),
            "repeat": np.tile(range(4), 4),
        }
    )
    from perfmodel.inputs.columns import conform_microbatches

    d = build_design(conform_microbatches(df, "t", "csv"))
    fit = fit_linear(d, "seconds")
    lof = lack_of_fit(d, "seconds", fit.unit_resid, fit.unit_fitted, 2)
    assert lof is not None and not lof.flag


def test_holdout_mape_is_small_on_linear_data() -> None:
    f = fit_cost_model(simulate_sweep(sizes=(256, 512, 1024, 2048, 4096, 8192), noise=0.01), n_boot=0)
    out = f[("sim", "update", "bf16")].holdout
    assert out["interpolation_held_out_sizes"] == [512, 2048]
    assert out["extrapolation_held_out_sizes"] == [8192]
    assert out["interpolation_mape"] < 0.01
    assert out["extrapolation_mape"] < 0.02


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
