"""The fit's guards over 100 seeds per scenario with known truth (issue 32's "must show"): where an interval is
stated it covers the truth >= 93 % of the time, and no claim is confidently wrong.

Scenarios (``perfmodel.simstudy.SCENARIOS``): a clean line, two outlier micro-batches (anywhere, and at the
low precision's largest size), two sizes (a line and a knee truth), a host/GPU knee (full sizes, GPU-bound at
one size only, sweeps from 1,024 tokens), one unit per precision, overlapping micro-batch windows (with and
without ``overlap_seconds``), heavy-tailed noise, a never-faster precision. The table:
``.venv/bin/python benchmarks/fit_simulations.py --seeds 100``. The fast checks: test_perfmodel_guards.py.
"""

from __future__ import annotations

import pytest

from perfmodel.simstudy import SCENARIOS, run, summarize

SEEDS = 100
# The knee models' bootstrap intervals cover ~0.95 (0.953 / 0.950 / 0.990 at 300 seeds): a 100-seed rate has
# a binomial sd of 2.2 %, so these three are measured on 300 seeds to tell 0.95 from 0.93.
KNEE_SEEDS = {"knee": 300, "knee_short": 300, "knee_from_1024": 300}
MIN_COVERAGE = 0.93


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_intervals_cover_and_no_claim_is_confidently_wrong_over_100_seeds(name: str) -> None:
    row = summarize(name, run(name, KNEE_SEEDS.get(name, SEEDS), n_boot=300))
    assert row["wrong"] == 0, row
    assert row["n_star_without_interval"] == 0, row
    assert row["recommendation_unsupported"] == 0 and row["recommendation_wrong"] == 0, row
    for key in ("coverage", "share_coverage", "gpu_bound_saving_coverage"):
        stated = row["with_interval"] if key == "coverage" else row[key.replace("coverage", "stated")]
        if stated >= 20:  # a rate on fewer fits says little; those are counted as wrong above when wrong
            assert row[key] >= MIN_COVERAGE, (key, row)
    assert row.get("two_size_line_said_to_fit", 0) == 0, row
    if name in ("one_unit", "overlap", "overlap_unflagged"):  # nothing to claim: no interval, no advice
        assert row["with_interval"] == 0 and row["recommended"] == 0, row
