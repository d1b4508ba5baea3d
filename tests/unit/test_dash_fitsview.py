"""dashboards.fitsview: the Breakeven page's words and tables, v1 and v2 fits.json fields, absent ones named."""

from __future__ import annotations

import pytest

from dashboards import fitsview
from perfmodel.step import costs as step


def _entry(case: str, tokens: float | None = None, ci=(None, None), **extra) -> dict:
    be = {"case": case, "tokens": tokens, "ci": list(ci), "ci_method": "fieller", "ci_reason": None, **extra}
    return {
        "model": "tiny-dense",
        "phase": "update",
        "baseline": "bf16",
        "precision": "mxfp8",
        "breakeven": be,
    }


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        ("always_faster", "faster than bf16 at every micro-batch size"),
        ("never_faster", "never faster than bf16"),
        ("indistinguishable", "indistinguishable at the 95 % level"),
        ("undetermined", "undetermined: the intervals cannot be computed"),
    ],
)
def test_breakeven_cases_without_n_star_are_named_in_words(case: str, phrase: str) -> None:
    assert phrase in fitsview.breakeven_sentence(_entry(case))


def test_faster_above_names_n_star_its_interval_and_extrapolation() -> None:
    s = fitsview.breakeven_sentence(_entry("faster_above", 4512.4, (3900, 5230.2), extrapolated=True))
    assert "mxfp8 is faster than bf16 above n* = 4,512 tokens per micro-batch" in s
    assert "95 % CI 3,900 to 5,230" in s
    assert "extrapolated" in s


def test_half_open_interval_says_which_bound_is_missing() -> None:
    e = _entry("faster_below", 800.0, (500.0, None), ci_reason="Fieller interval unbounded above")
    s = fitsview.breakeven_sentence(e)
    assert "below n* = 800" in s and "500 to ?" in s and "unbounded above" in s


def test_rejected_model_withholds_n_star_and_names_the_crossing() -> None:
    e = _entry("faster_above", None, model_ok=False, crossing=[512, 1024], basis="wall")
    s = fitsview.breakeven_sentence(e)
    assert "no n* reported" in s and "model rejected" in s
    assert "cross between 512 and 1,024 tokens" in s


def test_rejected_lines_with_n_star_from_a_model_that_fits_say_which() -> None:
    e = _entry("faster_above", 4120.0, (3988, 4247), model_ok=False, model="parts", crossing=[2048, 8192])
    s = fitsview.breakeven_sentence(e)
    assert (
        "above n* = 4,120 tokens per micro-batch (95 % CI 3,988 to 4,247, from the parts model, which fits)"
        in s
    )
    assert "straight lines are rejected" in s and "cross between 2,048 and 8,192" in s


def test_gpu_busy_breakeven_is_its_own_sentence_and_row() -> None:
    e = _entry("faster_above", 2000.0, (1500, 2600), model_ok=True, crossing=None, extrapolated=False)
    e["breakeven_gpu_busy"] = {
        "case": "always_faster",
        "tokens": None,
        "ci": [None, None],
        "basis": "gpu_busy",
    }
    assert "host overhead removed" in fitsview.breakeven_sentence(e, "breakeven_gpu_busy")
    facts = fitsview.breakeven_facts(e).set_index("basis")
    assert facts.loc["wall clock", "n* tokens"] == "2,000"
    assert facts.loc["wall clock", "model ok"] == "yes"
    assert facts.loc["wall clock", "measured crossing"] == "none"
    assert facts.loc["GPU busy (host overhead removed)", "case"] == "always_faster"


def test_fields_an_older_fits_json_lacks_read_not_in_this_output() -> None:
    facts = fitsview.breakeven_facts(_entry("never_faster")).set_index("basis")
    assert facts.loc["wall clock", "model ok"] == fitsview.ABSENT
    assert facts.loc["wall clock", "measured crossing"] == fitsview.ABSENT
    assert facts.loc["GPU busy (host overhead removed)", "case"] == fitsview.ABSENT
    entry = {**_entry("never_faster"), "breakeven_gpu_busy": None}
    assert "null" in fitsview.breakeven_facts(entry).iloc[1]["case"]


def test_fit_table_shows_per_step_cost_only_when_present() -> None:
    entry = {
        "fits": {
            "bf16": {
                "fixed_s": 0.02,
                "per_token_s": 4e-5,
                "fixed_ci": [0.018, 0.022],
                "per_token_ci": [3e-5, 5e-5],
            },
            "mxfp8": {
                "fixed_s": 0.03,
                "per_token_s": 3e-5,
                "per_step_s": 0.1,
                "per_step_ci": [0.08, 0.12],
                "implausible": ["fixed cost below zero"],
            },
        }
    }
    t = fitsview.fit_table(entry).set_index("precision")
    assert t.loc["bf16", "per-step ms [95 % CI]"] == fitsview.ABSENT
    assert t.loc["mxfp8", "per-step ms [95 % CI]"] == "100 [80, 120]"
    assert t.loc["bf16", "fixed ms [95 % CI]"] == "20 [18, 22]"
    assert t.loc["mxfp8", "implausible"] == "fixed cost below zero"


def test_units_are_spelled_one_way() -> None:
    assert fitsview.units("costs 247 us/token more; 31.8 ms") == "costs 247 µs/token more; 31.8 ms"
    assert fitsview.units("12 us per token") == "12 µs per token"
    assert fitsview.units("status") == "status"


def test_fit_lines_feed_the_cost_model_what_if_rules() -> None:
    entry = {
        "baseline": "bf16",
        "precision": "mxfp8",
        "fits": {
            "bf16": {"fixed_s": 0.010, "per_token_s": 40e-6},
            "mxfp8": {"fixed_s": 0.030, "per_token_s": 30e-6},
        },
    }
    lines = fitsview.fit_lines(entry)
    assert list(lines) == ["bf16", "mxfp8"]
    costs = step.step_costs(lines, "bf16", {"other": 1.0}, step.WhatIf())
    assert step.step_breakeven(costs["bf16"], costs["mxfp8"], 65536) == pytest.approx(2000)
    half = step.step_costs(lines, "bf16", {"other": 1.0}, step.WhatIf(fixed_scale=0.5))
    assert step.step_breakeven(half["bf16"], half["mxfp8"], 65536) == pytest.approx(1000)


def test_slider_sizes_never_offer_n_above_n_global() -> None:
    opts = fitsview.size_options(100, 1024)
    assert opts == [64, 128, 256, 512, 1024]
    assert fitsview.default_microbatch(opts, [128, 256, 512, 1024], 512) == 512
    assert fitsview.default_microbatch(opts, [4096], 256) == 256
