"""What-ifs of the whole step with intervals (issue 33 item 5): weight cast once per step (the physical cast
floor, or the range between no cast and all of the added fixed cost), host overhead removed, cast kernels
fused; their intervals cover the truth of simulations."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.inputs.load import FitInputs
from perfmodel.inputs.simulate import PAPER_LIKE, Truth, simulate_sweep
from perfmodel.kernels.bounds import KNOWN, cast_floor
from perfmodel.kernels.devices import device
from perfmodel.report.results import analyze
from perfmodel.simstudy import _covers

SIZES = (256, 512, 1024, 2048, 4096, 8192)
# mxfp8 adds 15 ms per micro-batch, 4 ms of it host stall (11 ms GPU-side), saves 2 us per token
TRUTH = {"bf16": Truth(0.010, 4e-6, stall_fixed_s=0.002), "mxfp8": Truth(0.025, 2e-6, stall_fixed_s=0.006)}
SETUP = (device("b200"), KNOWN["qwen3-8b"])
BIG_N, N = 65_536, 2_048


def _doc(truth, seed: int, setup=SETUP, at=((BIG_N, N),), n_boot: int = 200) -> dict:
    df = simulate_sweep(truth, sizes=SIZES, repeats=4, rng=np.random.default_rng(1000 + seed))
    return analyze(FitInputs(df), n_boot=n_boot, seed=seed, at=list(at), floors_setup=setup)


def _true_gains(truth, big_n: int, n: int, q: float) -> dict[str, float]:
    """The truth's gain with each what-if applied (lines, no per-step cost, n divides N)."""
    k = big_n // n
    b, lo = truth["bf16"], truth["mxfp8"]
    base = k * (b.fixed_s + b.per_token_s * n)
    low = k * (lo.fixed_s + lo.per_token_s * n)
    d_fixed, d_stall = lo.fixed_s - b.fixed_s, lo.stall_fixed_s - b.stall_fixed_s
    saved = {
        "weight_cast_once_per_step": (k - 1) * min(q, d_fixed),
        "host_overhead_removed": k * d_stall,
        "cast_kernels_fused": k * max(d_fixed - d_stall - q, 0.0),
    }
    return {name: 1.0 - (low - s) / base for name, s in saved.items()}


def _coverage(seeds: range) -> tuple[dict[str, float], dict[str, float]]:
    """Per what-if: coverage of its interval where it is estimated, and the share of fits withholding it
    (the host-stall share withheld: then fused casts are a range)."""
    q, _ = cast_floor(SETUP, "update", "bf16", "mxfp8")
    truth = _true_gains(TRUTH, BIG_N, N, q)
    hits: dict[str, list[bool]] = {name: [] for name in truth}
    held = dict.fromkeys(truth, 0)
    for seed in seeds:
        wi = _doc(TRUTH, seed)["step_model"][0]["what_ifs"]
        for w in wi["what_ifs"]:
            if w["kind"] != "estimate":
                held[w["name"]] += 1
                continue
            hits[w["name"]].append(_covers(w["gain_ci"], truth[w["name"]]))
    return {k: float(np.mean(h)) for k, h in hits.items()}, {k: v / len(seeds) for k, v in held.items()}


def test_what_if_intervals_cover_the_true_step_gain() -> None:
    cov, held = _coverage(range(40))
    assert all(c >= 0.85 for c in cov.values()) and all(h <= 0.05 for h in held.values()), (cov, held)


@pytest.mark.slow
def test_what_if_intervals_cover_the_true_step_gain_over_200_seeds() -> None:
    cov, held = _coverage(range(200))
    assert all(c >= 0.93 for c in cov.values()) and all(h <= 0.05 for h in held.values()), (cov, held)


def test_without_device_the_weight_cast_is_a_range_from_no_cast_to_all_added_fixed_cost() -> None:
    doc = _doc(TRUTH, 0, setup=None)
    sm = doc["step_model"][0]
    w = {x["name"]: x for x in sm["what_ifs"]["what_ifs"]}["weight_cast_once_per_step"]
    assert w["kind"] == "range" and "device or model unknown" in w["source"]
    lo, hi = w["range"]["low_end"], w["range"]["high_end"]
    assert lo["gain"] == pytest.approx(sm["settings"][0]["gain"])  # no cast moved: today's gain
    k = BIG_N // N
    # all of the added fixed cost moved once per step: (k - 1) x d_fixed (the fit's, 15 ms true)
    assert hi["saved_s"] == pytest.approx((k - 1) * 0.015, rel=0.15)
    assert w["range"]["gain_ci"][0] <= lo["gain_ci"][0] and w["range"]["gain_ci"][1] >= hi["gain_ci"][1]


def test_with_device_and_model_the_weight_cast_is_its_physical_floor_also_for_the_what_if_knob() -> None:
    from perfmodel.step.costs import WhatIf

    q, _ = cast_floor(SETUP, "update", "bf16", "mxfp8")
    assert q == pytest.approx(3.527e-3, rel=1e-3)  # docs/cost-model.md's Qwen3-8B / B200 table
    df = simulate_sweep(TRUTH, sizes=SIZES, repeats=4, rng=np.random.default_rng(3))
    doc = analyze(
        FitInputs(df), n_boot=100, at=[(BIG_N, N)], knobs=WhatIf(weight_quant="per_step"), floors_setup=SETUP
    )
    legacy = doc["models"][0]["step"]["what_if"]
    assert legacy["weight_quant_s"]["mxfp8"] == pytest.approx(q)
    assert "floor" in legacy["weight_quant_source"]["mxfp8"]
    w = doc["step_model"][0]["what_ifs"]["what_ifs"][0]
    assert w["moved_per_microbatch_s"]["update"] == pytest.approx(q) and "b200" in w["source"]


def test_a_what_if_that_changes_the_answer_is_named_in_what_to_change() -> None:
    # PAPER_LIKE near its n* = 4,500: mxfp8 not faster at 4,096; 7 of its 9 ms added are host stall
    df = simulate_sweep(PAPER_LIKE, sizes=SIZES, repeats=4, rng=np.random.default_rng(5))
    doc = analyze(FitInputs(df), n_boot=200, at=[(BIG_N, 4096)])
    sm = doc["step_model"][0]
    host = {x["name"]: x for x in sm["what_ifs"]["what_ifs"]}["host_overhead_removed"]
    assert sm["settings"][0]["gain_ci"][0] < 0 and host["gain_ci"][0] > 0 and host["changes_answer"]
    assert "What would change the answer" in sm["answer"][2] and "host overhead removed" in sm["answer"][2]
    far = analyze(FitInputs(df), n_boot=200, at=[(BIG_N, 256)])["step_model"][0]  # 3x slower: nothing flips
    hw = {x["name"]: x for x in far["what_ifs"]["what_ifs"]}["host_overhead_removed"]
    assert not hw["changes_answer"] and "host overhead removed" not in far["answer"][2]
