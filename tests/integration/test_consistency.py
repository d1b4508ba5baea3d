"""Consistency at fixed weights: the orderings the grid-matching argument predicts, on dense and MoE."""

from __future__ import annotations

import pytest

from mxperf.cli import main
from pipeline.experiments.consistency import SAMPLER_VARIANTS, ConsistencyConfig, run_consistency
from tracing.outputs import store

VARIANTS = tuple(
    v for v in SAMPLER_VARIANTS if v.label in ("bf16", "mxfp8", "mxfp8 grid-fraction 0.5", "mxfp8-floor")
)


def _k3(df, learner, sampler):
    return float(df[(df["learner"] == learner) & (df["sampler"] == sampler)]["kl_k3"].iloc[0])


def _assert_orderings(df):
    bf16, mx, half, floor = (
        _k3(df, "mxfp8", s) for s in ("bf16", "mxfp8", "mxfp8 grid-fraction 0.5", "mxfp8-floor")
    )
    assert mx < half < bf16  # matching more layers of the learner's grid lowers the mismatch
    assert floor > mx  # another grid is worse than the shared grid
    assert _k3(df, "bf16", "bf16") < mx  # BF16 end to end is the most consistent
    assert (df["kl_k3"] > 0).all()  # absolute values: the residual mismatch is real, never zero


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_shared_grid_beats_bf16_and_other_grids_for_an_mxfp8_learner(model):
    df = run_consistency(ConsistencyConfig(model=model, eval_prompts=16, max_new_tokens=6), variants=VARIANTS)
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
    assert {"kl_k1", "kl_k3", "token_mult_prob_error", "kl_k3_vs_bf16_sampler"} <= set(df.columns)
    assert "mxfp8-floor" in capsys.readouterr().out
