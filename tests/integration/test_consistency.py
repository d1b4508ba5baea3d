"""Consistency at fixed weights: the orderings the grid-matching argument predicts, on dense and MoE."""

from __future__ import annotations

import pandas as pd
import pytest

from mxperf.cli import main
from pipeline.experiments.consistency import SAMPLER_VARIANTS, ConsistencyConfig, run_consistency
from tracing.outputs import store

VARIANTS = tuple(
    v for v in SAMPLER_VARIANTS if v.label in ("bf16", "mxfp8", "mxfp8 grid-fraction 0.5", "mxfp8-floor")
)


def _k3(df, learner, sampler):
    return float(df[(df["learner"] == learner) & (df["sampler"] == sampler)]["kl_k3"].iloc[0])


def _row(df, learner, sampler):
    return df[(df["learner"] == learner) & (df["sampler"] == sampler)].iloc[0]


def _assert_orderings(df):
    bf16, mx, half, floor = (
        _row(df, "mxfp8", s) for s in ("bf16", "mxfp8", "mxfp8 grid-fraction 0.5", "mxfp8-floor")
    )

    def below(a, b):  # a's kl_k3 below b's by more than their combined standard error: resolved, not luck
        return b.kl_k3 - a.kl_k3 > (a.kl_k3_se**2 + b.kl_k3_se**2) ** 0.5

    assert below(mx, half) and below(
        half, bf16
    )  # matching more layers of the learner's grid lowers the mismatch
    assert below(mx, floor)  # another grid is worse than the shared grid
    assert _k3(df, "bf16", "bf16") < mx.kl_k3  # BF16 end to end is the most consistent
    assert (df["kl_k3"] > 0).all()  # absolute values: the residual mismatch is real, never zero


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_shared_grid_beats_bf16_and_other_grids_for_an_mxfp8_learner(model):
    """~1000 scored tokens: on tiny-moe the shared-grid vs half-grid gap is ~6e-5 against a standard error of
    ~2e-5 per row; with the 96 tokens this test used to score it was not resolved (docs/pipeline.md)."""
    cfg = ConsistencyConfig(model=model, eval_prompts=128, max_new_tokens=8)
    df = pd.concat(
        [
            run_consistency(cfg, variants=VARIANTS, learners=("mxfp8",)),
            run_consistency(cfg, variants=VARIANTS[:1], learners=("bf16",)),
        ]
    )
    assert (df["num_tokens"] > 900).all()
    _assert_orderings(df)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_orderings_hold_across_seeds(model, seed):
    df = run_consistency(ConsistencyConfig(model=model, seed=seed), variants=VARIANTS)
    _assert_orderings(df)


def test_consistency_cli_writes_the_table(tmp_path, capsys):
    out = tmp_path / "c"
    rc = main(
        [
            "consistency",
            "--model",
            "tiny-dense",
            "--eval-prompts",
            "4",
            "--max-new-tokens",
            "3",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    df = store.read_table(out / store.CONSISTENCY)
    assert len(df) == 2 * len(SAMPLER_VARIANTS)
    assert {"kl_k1", "kl_k3", "kl_k3_se", "token_mult_prob_error", "kl_k3_vs_bf16_sampler"} <= set(df.columns)
    out = capsys.readouterr().out
    assert "mxfp8-floor" in out and "not resolved" in out  # the table says how far apart rows must be
