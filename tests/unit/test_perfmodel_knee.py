"""Knee-aware models on max(host, GPU) timings: chosen by the data, n* from a model that fits or withheld."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.breakeven.crossing import measured_crossing
from perfmodel.breakeven.curves import crossing_roots, pick_root
from perfmodel.breakeven.solve import find_breakeven
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.fitting.model import Curve
from perfmodel.inputs.simulate import KNEE, Truth, simulate_sweep, true_crossings

TRUE_N = true_crossings(KNEE["bf16"], KNEE["mxfp8"])[-1]  # 4,250 tokens


def _pair(df: pd.DataFrame, n_boot: int = 300):
    fits = fit_cost_model(df, n_boot=n_boot)
    return fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]


def _no_gpu(df: pd.DataFrame) -> pd.DataFrame:
    na = pd.array([None] * len(df), dtype="Float64")
    return df.assign(gpu_busy_seconds=na, host_stall_seconds=na)


def test_the_true_crossing_of_the_simulation() -> None:
    assert pytest.approx(4250, rel=1e-6) == TRUE_N


def test_with_gpu_busy_the_parts_model_is_chosen_and_its_interval_covers_the_truth() -> None:
    base, low = _pair(simulate_sweep(KNEE, rng=np.random.default_rng(11), stall_per_token_s=0.0))
    for f, knee in ((base, 2000), (low, 8000)):
        assert not f.wall.line_ok and f.wall.lack_of_fit.flag  # the straight line is rejected ...
        assert f.wall.model == "parts"  # ... and the host line + GPU-busy line model fits
        k = f.wall.knee
        assert k.anchor_slope_s == pytest.approx(f.busy.line.coef("per_token"))
        lo, hi = np.quantile(k.boot.knee, [0.025, 0.975])
        assert lo <= knee <= hi
    be = find_breakeven(base, low)
    assert be.model_ok is False and be.model == "parts" and be.case == "faster_above"
    assert be.ci[0] <= TRUE_N <= be.ci[1]
    assert be.model_reason.startswith("bf16: it misses the mean time by") and "mxfp8:" in be.model_reason


def test_without_gpu_data_the_segmented_knee_model_is_chosen() -> None:
    base, low = _pair(_no_gpu(simulate_sweep(KNEE, rng=np.random.default_rng(12), stall_per_token_s=0.0)))
    assert base.busy is None and base.wall.model == "knee" and low.wall.model == "knee"
    be = find_breakeven(base, low)
    assert be.model == "knee" and be.ci[0] <= TRUE_N <= be.ci[1]
    c = measured_crossing(base, low)
    assert c.tokens[0] <= TRUE_N <= c.tokens[1] and c.direction == "faster_above"


def test_too_few_sizes_for_a_knee_withholds_n_star_and_names_the_misfit() -> None:
    df = simulate_sweep(
        KNEE, sizes=(512, 2048, 4096, 8192), rng=np.random.default_rng(13), stall_per_token_s=0.0
    )
    base, low = _pair(_no_gpu(df))
    assert base.wall.model is None and "too few sizes" in base.wall.note  # bf16 bends at 2,000 tokens
    be = find_breakeven(base, low)
    assert be.tokens is None and be.model is None and be.model_ok is False
    assert "withheld" in be.ci_reason and be.model_reason
    c = measured_crossing(base, low)
    assert c.tokens is not None and c.tokens[0] <= TRUE_N <= c.tokens[1]


def test_a_wrong_gpu_busy_slope_makes_the_data_prefer_the_free_knee() -> None:
    # stall that grows with n even when GPU-bound: busy grows slower than wall, so anchoring the GPU line
    # on the busy slope is wrong, and the unit residuals say so
    truth = {
        "bf16": Truth(0.002, 4e-6, stall_fixed_s=0.0005, host_fixed_s=0.010),
        "mxfp8": Truth(0.003, 2e-6, stall_fixed_s=0.0005, host_fixed_s=0.019),
    }
    base, _ = _pair(
        simulate_sweep(truth, rng=np.random.default_rng(14), stall_per_token_s=1.5e-6, noise=0.01)
    )
    assert base.wall.model == "knee"


def test_crossings_of_two_knee_curves_are_exact() -> None:
    def hinge(k: float, a1: float, b1: float, b2: float) -> Curve:
        a2 = a1 + (b1 - b2) * k
        return Curve(*(np.asarray(v) for v in (k, a1, b1, a2, b2)))

    base = hinge(2000.0, 0.010, 0.0, 4e-6)  # max(10 ms, 2 ms + 4 us n)
    low = hinge(8000.0, 0.019, 0.0, 2e-6)  # max(19 ms, 3 ms + 2 us n)
    roots, slopes = crossing_roots(low, base)
    found = roots[0][np.isfinite(roots[0])]
    np.testing.assert_allclose(found, [4250.0])
    assert pick_root(roots, slopes, "faster_above")[0] == pytest.approx(4250.0)
    assert np.isnan(pick_root(roots, slopes, "faster_below")[0])
    # two crossings: low faster at small sizes, slower in the middle, faster again at large ones
    wavy = hinge(1000.0, 0.009, 3e-6, 1e-6)
    roots, slopes = crossing_roots(wavy, base)
    assert np.isfinite(roots[0]).sum() == 2
    assert pick_root(roots, slopes, "faster_above")[0] > pick_root(roots, slopes, "faster_below")[0]


def _traced_steps(truth, seed: int, steps: int = 8) -> pd.DataFrame:
    """Dynamic batching as traces show it: each traced step holds micro-batches of many sizes (the size
    label is the detected size), a step of one rank is the unit."""
    rng = np.random.default_rng(seed)
    sizes = np.unique(np.geomspace(256, 32768, 40).astype(int))
    df = simulate_sweep(truth, sizes=sizes, repeats=steps, microbatches=1, rng=rng, stall_per_token_s=0.0)
    df["step"] = df["repeat"]
    df["microbatch"] = df.groupby(["precision", "step"]).cumcount()
    df = df.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # micro-batch order within a step
    return df.assign(source="detected")


@pytest.mark.parametrize("gpu", [True, False])
def test_a_knee_inside_dynamic_steps_is_found_within_steps_not_hidden_in_their_means(gpu: bool) -> None:
    df = _traced_steps(KNEE, seed=3)
    base, low = _pair(df if gpu else _no_gpu(df))
    for f in (base, low):
        assert f.design.unit_kind == "step" and f.design.n_units == 8  # steps, not single micro-batches
        assert not f.wall.line_ok and f.wall.lack_of_fit.test.startswith("pure_error_F")
        assert f.wall.model == ("parts" if gpu else "knee")
    be = find_breakeven(base, low)
    assert be.ci[0] <= TRUE_N <= be.ci[1]


def test_a_straight_line_inside_dynamic_steps_is_kept() -> None:
    from perfmodel.inputs.simulate import PAPER_LIKE

    base, low = _pair(_traced_steps(PAPER_LIKE, seed=4))
    assert base.wall.line_ok and low.wall.line_ok
    be = find_breakeven(base, low)
    assert be.model == "line" and be.ci[0] <= 4500 <= be.ci[1]


def test_the_global_batch_of_dynamic_steps_is_the_tokens_of_a_step() -> None:
    from perfmodel.step.recommend import default_global_tokens

    df = _traced_steps(KNEE, seed=5)
    per_step = df.groupby(["precision", "step"])["num_tokens"].sum()
    assert default_global_tokens(df) == int(per_step.median())
