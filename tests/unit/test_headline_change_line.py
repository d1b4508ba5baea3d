"""The answer's 'What to change' line states the recommended precision's advantage on the right base: the low
precision's gain is relative to the baseline's step; a recommended baseline says how much longer the low
precision's step is (never "75 % less" for a step 43 % shorter)."""

from __future__ import annotations

import re

import pytest

from perfmodel.report.headline import _change_line


def _sm(t_base: float, t_low: float, ci: list[float]) -> dict:
    g = 1.0 - t_low / t_base
    best = "mxfp8" if t_low < t_base else "bf16"
    return {
        "recommendation": {
            "global_tokens": 1536,
            "precision": best,
            "tokens_per_microbatch": 768,
            "step_s": min(t_base, t_low),
            "comparison": {"gain": g, "gain_ci": ci},
        }
    }


def _pcts(line: str) -> list[float]:
    m = re.search(r"takes (-?\d+\.\d) % longer at that size \[95 % CI (-?\d+\.\d) to (-?\d+\.\d) %\]", line)
    assert m, line
    return [float(x) for x in m.groups()]


def test_a_recommended_baseline_says_how_much_longer_the_low_precision_is() -> None:
    line = _change_line(_sm(0.505, 0.886, [-1.419, -0.338]), "mxfp8", "bf16")
    assert "use bf16 at 768 tokens" in line and "less than" not in line
    longer, lo, hi = _pcts(line)
    assert longer == pytest.approx(100 * (0.886 / 0.505 - 1), abs=0.05)
    assert (lo, hi) == (33.8, 141.9)
    assert "mxfp8 takes 75.4 % longer" in line


def test_a_recommended_low_precision_says_its_gain_over_the_baseline() -> None:
    line = _change_line(_sm(1.0, 0.8, [0.15, 0.25]), "mxfp8", "bf16")
    assert "use mxfp8 at 768 tokens" in line
    assert "20.0 % less than bf16 at that size [95 % CI 15.0 to 25.0 %]" in line
