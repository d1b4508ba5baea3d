"""The docs/contracts.md case table row by row, Fieller's interval shapes, and its 95 % coverage on simulations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.breakeven.solve import classify_case, fieller_interval, find_breakeven
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.simulate import simulate_sweep

SIZES = np.array([256, 512, 1024, 2048, 4096, 8192])
BASE = (0.010, 4e-6)
# Additive noise, the same pattern for both precisions: the estimated differences are then exact, while each
# fit still has a nonzero HC3 variance (so significance is decided by the truth, not by luck).
NOISE = np.tile([-2e-4, 1e-4, 2e-4, -1e-4], len(SIZES))


def _fits(low: tuple[float, float]):
    x = np.repeat(SIZES, 4)
    rows = []
    for prec, (fixed, per_token) in (("bf16", BASE), ("mxfp8", low)):
        rows.append(
            pd.DataFrame(
                {
                    "model": "m",
                    "phase": "update",
                    "precision": prec,
                    "tokens_per_microbatch": x,
                    "num_tokens": x,
                    "repeat": np.tile(np.arange(4), len(SIZES)),
                    "seconds": fixed + per_token * x + NOISE,
                }
            )
        )
    fits = fit_cost_model(pd.concat(rows, ignore_index=True), n_boot=400)
    return fits[("m", "update", "bf16")], fits[("m", "update", "mxfp8")]


# (low fixed, low per-token) -> expected case and the shape of its n* interval; one dataset per row of the
# docs/contracts.md table. "always" / "never" only when both differences are significant that way; one
# within noise leaves a crossing whose interval reaches 0 ("zero") or infinity ("half-line").
CASE_ROWS = [
    ((0.019, 2e-6), "faster_above", "bounded"),  # d_tok > 0, d_fixed > 0
    ((0.010, 2e-6), "faster_above", "zero"),  # d_tok > 0, d_fixed n.s.: n* in [0, hi]
    ((0.005, 2e-6), "always_faster", None),  # d_tok > 0, d_fixed < 0
    ((0.005, 6e-6), "faster_below", "bounded"),  # d_tok < 0, d_fixed < 0
    ((0.010, 6e-6), "faster_below", "zero"),  # d_tok < 0, d_fixed n.s.: n* in [0, hi]
    ((0.019, 6e-6), "never_faster", None),  # d_tok < 0, d_fixed > 0
    ((0.019, 4e-6), "faster_above", "half-line"),  # d_tok n.s., d_fixed > 0: not faster below r2
    ((0.005, 4e-6), "faster_below", "half-line"),  # d_tok n.s., d_fixed < 0: faster below r2
    ((0.010, 4e-6), "indistinguishable", None),  # both n.s.
]


@pytest.mark.parametrize(("low", "case", "shape"), CASE_ROWS)
def test_each_row_of_the_case_table_is_produced(
    low: tuple[float, float], case: str, shape: str | None
) -> None:
    be = find_breakeven(*_fits(low))
    assert be.case == case
    if shape == "bounded":
        expected = (low[0] - BASE[0]) / (BASE[1] - low[1])
        assert be.tokens == pytest.approx(expected, rel=1e-6)
        assert be.ci_shape == "bounded"
        assert 0 < be.ci[0] < be.tokens < be.ci[1]
        assert be.bootstrap_ci is not None and be.bootstrap_ci[0] < be.tokens < be.bootstrap_ci[1]
    elif shape == "zero":  # the estimate is 0 here (no fixed difference): the interval starts at 0
        assert be.ci_shape == "bounded" and be.ci[0] == 0.0 and be.ci[1] > 0
        assert be.tokens == pytest.approx(0.0, abs=1e-6)
        assert "clipped at 0" in be.ci_reason
    elif shape == "half-line":  # not faster (or: faster) below r2; above it the per-token difference is noise
        assert be.ci_shape == "two_half_lines" and be.ci[0] > 0 and be.ci[1] is None
        assert be.tokens is None  # the estimate (d_tok exactly 0 here) is not in the half-line
        assert "within noise" in be.ci_reason
    else:
        assert be.tokens is None
        assert be.ci_reason


def test_faster_above_numbers() -> None:
    be = find_breakeven(*_fits((0.019, 2e-6)))
    assert be.tokens == pytest.approx(4500.0)
    assert be.d_fixed_s == pytest.approx(0.009)
    assert be.d_tok_s == pytest.approx(2e-6)
    assert not be.extrapolated
    assert be.ci_method == "fieller"


def test_breakeven_outside_measured_sizes_is_flagged_extrapolated() -> None:
    be = find_breakeven(*_fits((0.050, 3e-6)))  # n* = 40000 > 8192
    assert be.case == "faster_above"
    assert be.tokens == pytest.approx(40000.0)
    assert be.extrapolated


def test_significance_table_as_a_pure_function() -> None:
    assert classify_case(1, 1) == classify_case(1, 0) == classify_case(0, 1) == "faster_above"
    assert classify_case(1, -1) == "always_faster"  # only when both differences say so
    assert classify_case(-1, -1) == classify_case(-1, 0) == classify_case(0, -1) == "faster_below"
    assert classify_case(-1, 1) == "never_faster"
    assert classify_case(0, 0) == "indistinguishable"


def test_fieller_bounded_interval_approaches_the_delta_method_when_precise() -> None:
    a, b, va, vb = 9.0, 2.0, 0.01, 1e-4
    fs = fieller_interval(a, b, va, vb, 0.0, 1.96)
    se_delta = np.sqrt(va / b**2 + a**2 * vb / b**4)
    assert fs.shape == "bounded"
    assert fs.lo == pytest.approx(a / b - 1.96 * se_delta, rel=2e-3)
    assert fs.hi == pytest.approx(a / b + 1.96 * se_delta, rel=2e-3)


def test_fieller_two_half_lines_when_denominator_is_not_significant() -> None:
    fs = fieller_interval(9.0, 0.5, 0.01, 1.0, 0.0, 1.96)
    assert fs.shape == "two_half_lines"
    r1, r2 = fs.excluded
    assert r1 < 0 < r2
    assert fs.lo == pytest.approx(r2) and fs.hi is None  # the branch holding a/b = 18
    assert fs.contains(18.0) and fs.contains(-1e9) and not fs.contains(0.0)
    assert fs.reason and "(-inf" in fs.reason


def test_fieller_whole_line_when_nothing_is_significant() -> None:
    fs = fieller_interval(0.1, 0.1, 1.0, 1.0, 0.0, 1.96)
    assert fs.shape == "whole_line"
    assert (fs.lo, fs.hi) == (None, None)
    assert fs.reason


def test_no_token_saving_gives_the_finite_fieller_bound_not_never_faster() -> None:
    # mxfp8 adds 9 ms and saves nothing measurable: "never faster" would claim more than the data show (a
    # per-token saving within noise could still pay off at large sizes); the Fieller set says where not.
    be = find_breakeven(*_fits((0.019, 4e-6)))
    assert be.case == "faster_above"
    assert be.ci_shape == "two_half_lines"
    r1, r2 = be.ci_excluded
    assert r1 < 0 < r2 and be.ci == (r2, None)
    assert be.tokens is None
    assert f"not faster below {r2:,.0f} tokens" in be.ci_reason


def _coverage(reps: int, seed0: int, n_boot: int) -> tuple[float, float]:
    hit_f = hit_b = 0
    for i in range(reps):
        df = simulate_sweep(rng=np.random.default_rng(seed0 + i), noise=0.05, repeat_noise=0.02)
        fits = fit_cost_model(df, n_boot=n_boot, seed=i)
        be = find_breakeven(fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")])
        lo, hi = be.ci
        hit_f += (lo is None or lo <= 4500) and (hi is None or hi >= 4500)
        if be.bootstrap_ci:
            hit_b += be.bootstrap_ci[0] <= 4500 <= be.bootstrap_ci[1]
    return hit_f / reps, hit_b / reps


def test_fieller_interval_covers_the_true_breakeven_about_95_percent() -> None:
    fieller, _ = _coverage(100, 1000, n_boot=0)
    # 100 reps (binomial sd 2.2 %); the slow test below runs 1000.
    assert 0.89 <= fieller <= 0.995


@pytest.mark.slow
def test_fieller_and_bootstrap_coverage_over_1000_repetitions() -> None:
    fieller, boot = _coverage(1000, 5000, n_boot=500)
    # t takes the smaller of the intercept's and the slope's Welch dofs (solve._line_breakeven), and the
    # covariance is CR3: conservative by construction, 0.977 here (binomial sd 0.7 %)
    assert 0.93 <= fieller <= 0.985
    assert 0.85 <= boot <= 0.98  # percentile bootstrap with 4 repeats per size runs a little narrow


def test_a_size_measured_once_leaves_the_case_undetermined_not_indistinguishable() -> None:
    # bf16 measured once at 4096 tokens: that point has leverage 1 (CR3 undefined), and the resamples that
    # leave it out cannot fit a line: no interval can be computed, which the case says.
    rows = [("bf16", 256, 0.011 + d) for d in (-1e-4, 0.0, 1e-4)] + [("bf16", 4096, 0.026384)]
    rows += [("mxfp8", n, 0.019 + 2e-6 * n + d) for n in (256, 4096) for d in (-1e-4, 0.0, 1e-4)]
    df = pd.DataFrame(rows, columns=["precision", "tokens_per_microbatch", "seconds"]).assign(
        model="m", phase="update", repeat=0
    )
    fits = fit_cost_model(df, n_boot=300)
    assert np.isnan(fits[("m", "update", "bf16")].time.cov).all()
    assert fits[("m", "update", "bf16")].wall.line.boot_note  # says why there are no replicates
    be = find_breakeven(fits[("m", "update", "bf16")], fits[("m", "update", "mxfp8")])
    assert be.case == "undetermined"
    assert be.tokens is None and be.ci == (None, None)
    assert "no interval can be computed" in be.ci_reason
    assert be.tokens_estimate == pytest.approx(4500, rel=0.05)  # the point estimate is still given


def test_one_measurement_per_size_without_bootstrap_is_undetermined() -> None:
    x = np.array([256, 4096])
    df = pd.concat(
        [
            pd.DataFrame({"precision": p, "tokens_per_microbatch": x, "seconds": f + t * x})
            for p, f, t in (("bf16", 0.01, 4e-6), ("mxfp8", 0.019, 2e-6))
        ]
    ).assign(model="m", phase="update")
    fits = fit_cost_model(df, n_boot=0)
    be = find_breakeven(fits[("m", "update", "bf16")], fits[("m", "update", "mxfp8")])
    assert be.case == "undetermined" and be.tokens is None


@pytest.mark.parametrize(
    ("low", "within"),
    [
        ((0.019, 4e-6), "slower"),
        ((0.005, 4e-6), "faster"),
        ((0.019, 2e-6), "mixed"),
        ((0.010, 4e-6), "mixed"),
    ],
)
def test_within_measured_sizes_says_which_is_faster_at_every_size(
    low: tuple[float, float], within: str
) -> None:
    be = find_breakeven(*_fits(low))
    assert be.within_measured == within
    lo, hi = be.measured_tokens
    assert (lo, hi) == (256.0, 8192.0)
    expected = [(low[0] - BASE[0]) + n * (low[1] - BASE[1]) for n in (lo, hi)]
    np.testing.assert_allclose(be.diff_at_ends_s, expected, atol=1e-12)
