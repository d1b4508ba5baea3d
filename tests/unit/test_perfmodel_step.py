"""Step-level predictions, the memory-capped recommendation and the what-if knobs."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.fit import fit_cost_model
from perfmodel.model import predict_step_seconds
from perfmodel.simulate import simulate_sweep
from perfmodel.step import (
    StepCost,
    WhatIf,
    max_tokens_under_cap,
    parse_what_if,
    recommend,
    step_breakeven,
    step_costs,
    weight_quant_seconds,
)
from tracing.outputs.errors import InputError


@pytest.fixture(scope="module")
def fits():
    f = fit_cost_model(simulate_sweep(noise=0.0, repeat_noise=0.0), n_boot=0)
    return {p: f[("sim", "update", p)] for p in ("bf16", "mxfp8")}


def test_step_time_is_micro_batches_times_fixed_plus_tokens_times_per_token() -> None:
    fit = {"fixed_s": 0.01, "per_token_s": 1e-6}
    assert predict_step_seconds(fit, 8192, 1024) == pytest.approx(8 * 0.01 + 8192e-6)
    assert predict_step_seconds(fit, 8192, 1024, {"generate": 1.0, "sync": 0.5}) == pytest.approx(
        8 * 0.01 + 8192e-6 + 1.5
    )
    np.testing.assert_allclose(
        predict_step_seconds([fit, fit], 8192, np.array([1024, 2048])),
        2 * np.array([8 * 0.01, 4 * 0.01]) + 2 * 8192e-6,
    )


def test_recommendation_takes_the_largest_size_under_the_memory_cap(fits) -> None:
    costs = step_costs(fits, "bf16")
    mem = {p: f.memory for p, f in fits.items()}
    cap = 5e7 + 4096.0 * 3000  # memory line of the simulation: 50 MB + 4 KiB per token
    rec = recommend(costs, mem, 65536, list(fits["bf16"].sizes), cap)
    assert rec["per_precision"]["bf16"]["tokens_per_microbatch"] == 3000
    # Below n* = 4500, bf16 wins; with room for 16k tokens mxfp8 wins.
    assert rec["precision"] == "bf16"
    rec_big = recommend(costs, mem, 65536, list(fits["bf16"].sizes), None)
    assert rec_big["precision"] == "mxfp8"
    assert rec_big["tokens_per_microbatch"] == 65536
    assert rec_big["per_precision"]["mxfp8"]["extrapolated"]


def test_no_memory_line_means_no_cap(fits) -> None:
    assert max_tokens_under_cap(None, 1e9) is None
    assert max_tokens_under_cap(fits["bf16"].memory, None) is None


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


def test_weight_quant_defaults_to_the_sweep_difference_as_an_upper_bound(fits) -> None:
    q, source = weight_quant_seconds(fits["bf16"], fits["mxfp8"], WhatIf(weight_quant="per_step"))
    assert q == pytest.approx(fits["mxfp8"].fixed_s - fits["bf16"].fixed_s)
    assert "upper bound" in source


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
