"""Step-level predictions, the memory-capped recommendation and the what-if knobs."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.fitting.model import Curve
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.step.costs import (
    StepCost,
    WhatIf,
    parse_what_if,
    step_breakeven,
    step_costs,
    weight_quant_seconds,
)
from perfmodel.step.recommend import max_tokens_under_cap, recommend
from tracing.outputs.errors import InputError


@pytest.fixture(scope="module")
def fits():
    f = fit_cost_model(simulate_sweep(noise=0.0, repeat_noise=0.0), n_boot=0)
    return {p: f[("sim", "update", p)] for p in ("bf16", "mxfp8")}


def test_step_time_is_micro_batches_times_fixed_plus_tokens_times_per_token() -> None:
    cost = StepCost("bf16", 0.01, 1e-6)
    assert cost.seconds(8192, 1024) == pytest.approx(8 * 0.01 + 8192e-6)
    with_other = step_costs({"bf16": cost_line(0.01, 1e-6)}, "bf16", {"generate": 1.0, "sync": 0.5})["bf16"]
    assert with_other.seconds(8192, 1024) == pytest.approx(8 * 0.01 + 8192e-6 + 1.5)
    np.testing.assert_allclose(cost.seconds(8192, np.array([1024, 2048])), np.array([8, 4]) * 0.01 + 8192e-6)


def test_a_fitted_per_step_cost_is_paid_once_per_step() -> None:
    line = cost_line(0.01, 1e-6, per_step_s=0.05)
    cost = step_costs({"bf16": line}, "bf16")["bf16"]
    assert cost.seconds(8192, 1024) == pytest.approx(8 * 0.01 + 8192e-6 + 0.05)


def test_a_knee_curve_replaces_the_line_in_the_step_time() -> None:
    curve = Curve.line(0.01, 1e-6)
    knee = Curve(np.asarray(2000.0), np.asarray(0.02), np.asarray(0.0), np.asarray(0.012), np.asarray(4e-6))
    cost = StepCost("bf16", 0.0, 0.0, 0.0, knee)
    assert cost.seconds(8192, 1024) == pytest.approx(8 * 0.02)  # host-bound: flat 20 ms per micro-batch
    assert cost.seconds(8192, 4096) == pytest.approx(2 * (0.012 + 4e-6 * 4096))
    assert StepCost("bf16", 0.0, 0.0, 0.0, curve).seconds(100, 10) == pytest.approx(10 * (0.01 + 1e-5))


def cost_line(fixed: float, per_token: float, per_step_s: float = 0.0):
    from perfmodel.step.section import StepLine

    return StepLine("bf16", fixed, per_token, per_step_s)


def test_recommendation_takes_the_largest_size_under_the_memory_cap(fits) -> None:
    costs = step_costs(fits, "bf16")
    mem = {p: f.memory.line() for p, f in fits.items()}
    cap = 5e7 + 4096.0 * 3000  # memory line of the simulation: 50 MB + 4 KiB per token
    rec = recommend(costs, mem, 65536, list(fits["bf16"].sizes), cap)
    assert rec["per_precision"]["bf16"]["tokens_per_microbatch"] == 3000
    # Below n* = 4500, bf16 wins; with room for 16k tokens mxfp8 wins.
    assert rec["precision"] == "bf16"
    rec_big = recommend(costs, mem, 65536, list(fits["bf16"].sizes), None)
    assert rec_big["precision"] == "mxfp8"
    # never beyond the largest measured size (16,384); a faster size beyond it is said, marked extrapolated
    assert rec_big["tokens_per_microbatch"] == 16384 == max(fits["bf16"].sizes)
    ext = rec_big["per_precision"]["mxfp8"]["extrapolated_best"]
    assert ext["tokens_per_microbatch"] == 65536 and ext["extrapolated"]
    assert ext["step_seconds"] < rec_big["step_seconds"]


def test_no_memory_line_means_no_cap(fits) -> None:
    assert max_tokens_under_cap(None, 1e9) is None
    assert max_tokens_under_cap(fits["bf16"].memory.line(), None) is None


def test_fixed_scale_scales_the_added_fixed_cost_and_the_breakeven(fits) -> None:
    costs = step_costs(fits, "bf16", knobs=WhatIf(fixed_scale=0.5))
    d_fixed = fits["mxfp8"].fixed_s - fits["bf16"].fixed_s
    assert costs["mxfp8"].per_microbatch_s == pytest.approx(fits["bf16"].fixed_s + 0.5 * d_fixed)
    assert costs["bf16"].per_microbatch_s == fits["bf16"].fixed_s
    n_star = step_breakeven(costs["bf16"], costs["mxfp8"], 1e12)
    assert n_star == pytest.approx(0.5 * 4500, rel=1e-3)


def test_weight_quant_per_step_moves_fixed_cost_out_of_the_micro_batch(fits) -> None:
    knobs = parse_what_if(["weight_quant=per_step", "weight_quant_s=0.004"])
    q, source = weight_quant_seconds(fits["bf16"], fits["mxfp8"], knobs)
    assert q == pytest.approx(0.004) and "given" in source
    costs = step_costs(fits, "bf16", knobs=knobs, weight_quant_s={"mxfp8": q})
    assert costs["mxfp8"].per_microbatch_s == pytest.approx(fits["mxfp8"].fixed_s - 0.004)
    assert costs["mxfp8"].per_step_s == pytest.approx(0.004)
    n = 1024
    before = StepCost("mxfp8", fits["mxfp8"].fixed_s, fits["mxfp8"].per_token_s).seconds(65536, n)
    assert costs["mxfp8"].seconds(65536, n) == pytest.approx(before - 64 * 0.004 + 0.004)


def test_weight_quant_is_not_moved_twice_when_the_fit_finds_it_per_step_already() -> None:
    from perfmodel.step.section import StepLine

    base = StepLine("bf16", 0.010, 4e-6, 0.0)
    low = StepLine("mxfp8", 0.013, 2e-6, 0.03, per_step_significant=True)
    q, source = weight_quant_seconds(base, low, WhatIf(weight_quant="per_step"))
    assert q == 0.0 and "already" in source
    costs = step_costs(
        {"bf16": base, "mxfp8": low},
        "bf16",
        knobs=WhatIf(weight_quant="per_step"),
        weight_quant_s={"mxfp8": q},
    )
    assert costs["mxfp8"].per_microbatch_s == pytest.approx(0.013) and costs[
        "mxfp8"
    ].per_step_s == pytest.approx(0.03)


def test_fixed_scale_also_scales_the_added_per_step_cost() -> None:
    from perfmodel.step.section import StepLine

    lines = {"bf16": StepLine("bf16", 0.010, 4e-6, 0.002), "mxfp8": StepLine("mxfp8", 0.013, 2e-6, 0.032)}
    costs = step_costs(lines, "bf16", knobs=WhatIf(fixed_scale=0.5))
    assert costs["mxfp8"].per_step_s == pytest.approx(0.002 + 0.5 * 0.03)
    assert costs["mxfp8"].per_microbatch_s == pytest.approx(0.010 + 0.5 * 0.003)


def test_step_breakeven_includes_the_per_step_cost_difference() -> None:
    base, low = StepCost("bf16", 0.010, 4e-6), StepCost("mxfp8", 0.013, 2e-6, 0.03)
    n = step_breakeven(base, low, 65536)
    assert n == pytest.approx(0.003 / (2e-6 - 0.03 / 65536))
    assert step_breakeven(base, low, 8192) is None  # the per-step cost outweighs the saving: never crosses


def test_weight_quant_without_a_floor_is_the_upper_end_of_the_range_and_says_so(fits) -> None:
    q, source = weight_quant_seconds(fits["bf16"], fits["mxfp8"], WhatIf(weight_quant="per_step"))
    assert q == pytest.approx(fits["mxfp8"].fixed_s - fits["bf16"].fixed_s)
    assert "upper end of the range 0 to d_fixed" in source and "--model-shape" in source
    q, source = weight_quant_seconds(
        fits["bf16"], fits["mxfp8"], WhatIf(weight_quant="per_step"), floor_s=1e-4
    )
    assert q == pytest.approx(1e-4) and "floor" in source


def test_weight_quant_from_kernel_classes_of_a_labelled_trace(fits) -> None:
    import pandas as pd

    kernels = pd.DataFrame(
        {
            "precision": ["mxfp8", "mxfp8", "bf16"],
            "kernel_class": ["quantize", "gemm", "quantize"],
            "total_ns": [30_000_000, 90_000_000, 1_000],
        }
    )
    q, source = weight_quant_seconds(
        fits["bf16"], fits["mxfp8"], WhatIf(weight_quant="per_step"), kernels, {"mxfp8": 10}
    )
    assert q == pytest.approx(0.003)
    assert "quantize kernel class" in source


@pytest.mark.parametrize(
    "bad", ["fixed_scale=-1", "fixed_scale=abc", "weight_quant=sometimes", "speed=2", "fixed_scale"]
)
def test_bad_what_if_knobs_raise_input_error(bad: str) -> None:
    with pytest.raises(InputError):
        parse_what_if([bad])
