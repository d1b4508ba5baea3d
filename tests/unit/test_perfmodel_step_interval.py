"""perfmodel.step.interval: the step-time difference's 95 % interval (covers the truth), n <= N, honest words."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.step import interval as si


def _fit(
    fixed: float, per_token: float, var_f: float, var_t: float, cov: float = 0.0, dof: float = 30
) -> dict:
    return {
        "fixed_s": fixed,
        "per_token_s": per_token,
        "cov": [[var_f, cov], [cov, var_t]],
        "dof": dof,
        "sizes": [256, 512, 1024, 2048],
    }


def test_difference_and_interval_follow_the_formula() -> None:
    base, low = _fit(0.010, 40e-6, 1e-6, 1e-12), _fit(0.030, 30e-6, 4e-6, 4e-12)
    d = si.step_difference(base, low, global_tokens=8192, n=1024, other_s=0.5)
    a = 8192 / 1024
    assert d.base_s == pytest.approx(a * 0.010 + 8192 * 40e-6 + 0.5)
    assert d.diff_s == pytest.approx(a * 0.020 - 8192 * 10e-6)
    var = a * a * 5e-6 + 8192**2 * 5e-12
    lo, hi = d.diff_ci
    assert (hi - lo) / 2 == pytest.approx(si.t_quantile(0.95, 1e6) * np.sqrt(var), rel=0.05)  # dof ~ 60
    assert not d.extrapolated


def test_n_larger_than_n_global_is_refused() -> None:
    base, low = _fit(0.01, 4e-5, 1e-6, 1e-12), _fit(0.03, 3e-5, 1e-6, 1e-12)
    with pytest.raises(ValueError, match="exceeds the global batch"):
        si.step_difference(base, low, global_tokens=1024, n=2048)


def test_a_change_inside_its_interval_is_not_called_faster() -> None:
    base = _fit(0.010, 40e-6, 1e-4, 1e-10)  # very noisy fits
    low = _fit(0.0101, 40e-6, 1e-4, 1e-10)
    d = si.step_difference(base, low, global_tokens=4096, n=512)
    assert not d.significant
    words = si.difference_words(d, "mxfp8", "bf16")
    assert words.startswith("No significant difference") and "95 % CI" in words
    clear = si.step_difference(_fit(0.01, 4e-5, 1e-8, 1e-14), _fit(0.03, 2e-5, 1e-8, 1e-14), 65536, 4096)
    assert clear.significant and clear.diff_s < 0
    assert si.difference_words(clear, "mxfp8", "bf16").startswith("mxfp8 is ")


def test_without_covariance_there_is_no_interval_and_the_words_say_so() -> None:
    base = {"fixed_s": 0.01, "per_token_s": 4e-5, "sizes": [512]}
    low = {"fixed_s": 0.02, "per_token_s": 3e-5, "sizes": [512]}
    d = si.step_difference(base, low, 4096, 2048)
    assert d.diff_ci is None and d.extrapolated
    assert "no interval" in si.difference_words(d, "mxfp8", "bf16")


def _ols(x: np.ndarray, y: np.ndarray) -> dict:
    X = np.column_stack([np.ones_like(x), x])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    dof = len(x) - 2
    cov = np.linalg.inv(X.T @ X) * (resid @ resid) / dof
    return {
        "fixed_s": beta[0],
        "per_token_s": beta[1],
        "cov": cov.tolist(),
        "dof": dof,
        "sizes": sorted(set(x)),
    }


def test_interval_covers_the_true_difference_at_its_nominal_rate() -> None:
    rng = np.random.default_rng(0)
    sizes = np.repeat([256.0, 512.0, 1024.0, 2048.0], 3)
    truth = {"bf16": (0.010, 40e-6), "mxfp8": (0.030, 30e-6)}
    N, n = 16384, 768
    true_diff = (N / n) * 0.020 - N * 10e-6
    hits, trials = 0, 600
    for _ in range(trials):
        fits = {
            p: _ols(sizes, f + t * sizes + rng.normal(0, 0.002, len(sizes))) for p, (f, t) in truth.items()
        }
        lo, hi = si.step_difference(fits["bf16"], fits["mxfp8"], N, n).diff_ci
        hits += lo <= true_diff <= hi
    assert 0.92 <= hits / trials <= 0.98


def test_predicted_vs_measured_agrees_on_exact_data_and_flags_a_miss() -> None:
    fit = _fit(0.010, 40e-6, 1e-8, 1e-14)
    k = np.array([4, 4, 5])
    tokens = np.array([4000, 4100, 5000])
    exact = k * 0.010 + tokens * 40e-6
    res = si.predicted_vs_measured(fit, k, tokens, exact)
    assert res["error_pct"] == pytest.approx(0.0, abs=1e-9) and res["inside"] is True
    slow = si.predicted_vs_measured(fit, k, tokens, exact * 1.3)
    assert slow["error_pct"] == pytest.approx(100 * (1 / 1.3 - 1)) and slow["inside"] is False
    with pytest.raises(ValueError):
        si.predicted_vs_measured(fit, [0], [100], [1.0])
