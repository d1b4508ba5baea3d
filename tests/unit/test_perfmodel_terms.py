"""Per-step costs and attention's quadratic term: identified when the data allow, per-token cost free of them,
what-ifs acting on the term that holds the cost, step-level breakeven per global batch."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.breakeven.solve import find_breakeven
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.load import FitInputs
from perfmodel.inputs.simulate import Truth, simulate_sweep
from perfmodel.report.results import analyze

# The issue's example: MXFP8 saves 2 us/token and adds 3 ms per micro-batch plus 30 ms once per step (a
# weight cast cached across micro-batches): n* = 3 ms / 2 us = 1,500 tokens.
PER_STEP = {"bf16": Truth(0.010, 4e-6, 0.002), "mxfp8": Truth(0.013, 2e-6, 0.005, per_step_s=0.03)}


def _pair(df, n_boot: int = 200):
    fits = fit_cost_model(df, n_boot=n_boot)
    return fits[("sim", "update", "bf16")], fits[("sim", "update", "mxfp8")]


@pytest.mark.parametrize(
    ("on", "globals_", "basis"),
    [
        ("first", 16384, "micro-batch 0 of each step"),
        ("last", [16384, 65536], "two global batch sizes"),
    ],
)
def test_a_per_step_cost_is_identified_and_the_per_token_cost_is_free_of_it(on, globals_, basis) -> None:
    df = simulate_sweep(PER_STEP, rng=np.random.default_rng(24), global_tokens=globals_, per_step_on=on)
    base, low = _pair(df)
    est, ci, how = low.wall.per_step()
    assert basis in how
    assert ci[0] <= 0.03 <= ci[1] and est == pytest.approx(0.03, rel=0.15)
    lo, hi = low.wall.line.ci("per_token")
    assert lo <= 2e-6 <= hi  # unbiased: the per-step cost is not read as per-token cost
    be = find_breakeven(base, low)
    assert be.ci[0] <= 1500 <= be.ci[1]


def test_without_the_micro_batch_index_the_per_step_cost_biases_the_fit_as_the_issue_says() -> None:
    df = simulate_sweep(PER_STEP, rng=np.random.default_rng(21), global_tokens=16384)
    naive = _pair(df.drop(columns=["microbatch"]), n_boot=0)[1]
    assert naive.wall.per_step() is None
    assert (
        naive.per_token_s > 2.2e-6
    )  # the per-step cost, spread over micro-batches, looks like per-token cost


def test_step_breakeven_per_global_batch_includes_the_per_step_cost() -> None:
    df = simulate_sweep(PER_STEP, rng=np.random.default_rng(22), global_tokens=[16384, 65536], repeats=3)
    doc = analyze(FitInputs(df), n_boot=200)
    (entry,) = doc["models"]
    sb = {s["global_batch_tokens"]: s for s in entry["step"]["step_breakeven"]}
    assert set(sb) == {16384, 65536}
    for n_global, s in sb.items():
        truth = 0.003 / (2e-6 - 0.03 / n_global)  # 17,700 at 16k tokens per step, 1,945 at 64k
        assert s["ci"][0] <= truth <= (s["ci"][1] if s["ci"][1] is not None else np.inf)
        assert s["tokens"] is None or s["tokens"] <= n_global  # a micro-batch holds at most the step
    low = entry["fits"]["mxfp8"]
    raw, curve = np.array(low["size_mean_s"]), np.array(low["size_mean_curve_s"])
    assert (raw > curve).all()  # the per-step cost is taken out of the points the curve goes through
    diff, ci = entry["step"]["per_step_difference_s"], entry["step"]["per_step_difference_ci"]
    assert ci[0] > 0 and diff == pytest.approx(0.03, rel=0.2)
    assert "once per step" in entry["verdict"]


def test_a_step_crossing_above_the_global_batch_is_not_reported_as_a_micro_batch_size() -> None:
    # truth at 16k tokens per step: 0.003 / (2e-6 - 0.03 / 16384) = 17,700 tokens per micro-batch > N, so
    # mxfp8 is slower at every micro-batch size a 16k-token step can have; at 64k it pays off above 1,945
    df = simulate_sweep(
        PER_STEP,
        rng=np.random.default_rng(23),
        global_tokens=[16384, 65536],
        repeats=3,
        noise=0.004,
        repeat_noise=0.002,
    )
    (entry,) = analyze(FitInputs(df), n_boot=200)["models"]
    sb = {s["global_batch_tokens"]: s for s in entry["step"]["step_breakeven"]}
    small, large = sb[16384], sb[65536]
    assert small["tokens"] is None and small["tokens_estimate"] > 16384
    assert small["within_global_batch"] == "slower" and "above the global batch" in small["reason"]
    assert small["ci"][0] <= 0.003 / (2e-6 - 0.03 / 16384) <= small["ci"][1]
    truth = 0.003 / (2e-6 - 0.03 / 65536)
    assert large["case"] == "faster_above" and large["ci"][0] <= truth <= large["ci"][1]
    assert "16,384 tokens: slower at every micro-batch size" in entry["verdict"]
    assert "65,536 tokens: pays off above" in entry["verdict"]


def test_step_breakeven_is_withheld_when_the_step_times_do_not_differ_significantly() -> None:
    same = {"bf16": Truth(0.010, 4e-6), "mxfp8": Truth(0.010, 4e-6, per_step_s=0.0)}
    df = simulate_sweep(same, rng=np.random.default_rng(5), global_tokens=16384, repeats=3)
    (entry,) = analyze(FitInputs(df), n_boot=200)["models"]
    (sb,) = entry["step"]["step_breakeven"]
    assert sb["case"] not in ("faster_above", "faster_below") and sb["tokens"] is None


def test_weight_quant_what_if_does_not_move_a_cost_the_fit_already_finds_per_step() -> None:
    from perfmodel.step.costs import WhatIf

    df = simulate_sweep(PER_STEP, rng=np.random.default_rng(23), global_tokens=16384)
    doc = analyze(FitInputs(df), n_boot=100, knobs=WhatIf(weight_quant="per_step"))
    wi = doc["models"][0]["step"]["what_if"]
    assert wi["weight_quant_s"]["mxfp8"] == 0.0
    assert "already" in wi["weight_quant_source"]["mxfp8"]


ATTENTION = {
    "bf16": Truth(0.010, 4e-6, 0.002, per_sq_token_s=2e-9),
    "mxfp8": Truth(0.019, 2e-6, 0.009, per_sq_token_s=2e-9),
}


def _dynamic(seed: int):
    return simulate_sweep(
        ATTENTION,
        rng=np.random.default_rng(seed),
        seq_len=512,
        seq_len_spread=0.8,
        dynamic=True,
        global_tokens=16384,
        sizes=(1024, 4096, 16384),
        repeats=3,
    )


def test_attention_term_keeps_the_per_token_cost_unbiased_under_dynamic_batching() -> None:
    hits = naive_hits = 0
    for seed in range(6):
        df = _dynamic(seed)
        low = _pair(df, n_boot=0)[1]
        lo, hi = low.wall.line.ci("per_token")
        hits += lo <= 2e-6 <= hi
        lo, hi = low.wall.line.ci("per_sq_token")
        assert lo <= 2e-9 <= hi or seed > 0
        naive = _pair(df.drop(columns=["seq_lens"]), n_boot=0)[1]
        lo, hi = naive.wall.line.ci("per_token")
        naive_hits += lo <= 2e-6 <= hi
    assert hits >= 5 and naive_hits <= 1  # without the term, long sequences read as per-token cost


def test_the_report_says_when_attention_matters() -> None:
    doc = analyze(FitInputs(_dynamic(1)), n_boot=50)
    att = doc["models"][0]["fits"]["mxfp8"]["attention"]
    assert att["matters"] is True and "it matters" in att["note"]
    assert att["per_sq_token_ci"][0] <= 2e-9 <= att["per_sq_token_ci"][1]
    assert doc["models"][0]["sources"]["attention"].startswith("seq_lens of")
    small = dict(ATTENTION, mxfp8=Truth(0.019, 2e-6, 0.009, per_sq_token_s=1e-13))
    small["bf16"] = Truth(0.010, 4e-6, 0.002, per_sq_token_s=1e-13)
    df = simulate_sweep(small, rng=np.random.default_rng(2), seq_len=512, seq_len_spread=0.8, dynamic=True)
    att = analyze(FitInputs(df), n_boot=0)["models"][0]["fits"]["mxfp8"]["attention"]
    assert att["matters"] is False and "too small to matter" in att["note"]
