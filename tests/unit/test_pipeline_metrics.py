"""The mismatch formulas of docs/contracts.md on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.experiments.mismatch import METRIC_NAMES, mismatch_metrics


def test_identical_logprobs_give_zero_kl_and_unit_error():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.125]]))
    m = mismatch_metrics(lp, lp.clone(), torch.ones_like(lp))
    assert m["kl_k1"] == 0 and m["kl_k3"] == 0 and m["token_mult_prob_error"] == 1.0
    assert m["prob_abs_diff_max"] == 0


def test_metrics_match_the_formulas_on_valid_tokens_only():
    lp_s = torch.tensor([[-0.1, -2.0, -9.0]])
    lp_l = torch.tensor([[-0.3, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    m = mismatch_metrics(lp_s, lp_l, mask)
    d = [(-0.1) - (-0.3), (-2.0) - (-1.5)]
    r = [-x for x in d]
    assert m["kl_k1"] == pytest.approx(sum(d) / 2)
    assert m["kl_k3"] == pytest.approx(sum(math.exp(x) - x - 1 for x in r) / 2)
    assert m["token_mult_prob_error"] == pytest.approx(sum(math.exp(abs(x)) for x in d) / 2)
    diffs = [abs(math.exp(-0.1) - math.exp(-0.3)), abs(math.exp(-2.0) - math.exp(-1.5))]
    assert m["prob_abs_diff_mean"] == pytest.approx(sum(diffs) / 2)
    assert m["prob_abs_diff_max"] == pytest.approx(max(diffs))


def test_k3_is_nonnegative_where_k1_can_be_negative():
    gen = torch.Generator().manual_seed(0)
    lp_s = -torch.rand(4, 16, generator=gen)
    lp_l = lp_s + 0.1 * torch.randn(4, 16, generator=gen)
    m = mismatch_metrics(lp_s, lp_l, torch.ones(4, 16))
    assert m["kl_k3"] >= 0


def test_no_valid_token_gives_nan_and_bad_shapes_raise():
    lp = torch.zeros(2, 3)
    m = mismatch_metrics(lp, lp, torch.zeros(2, 3))
    assert all(math.isnan(m[k]) for k in METRIC_NAMES)
    with pytest.raises(ValueError, match="shape"):
        mismatch_metrics(lp, torch.zeros(2, 4), torch.ones(2, 3))


def test_rollout_tensors_put_sampler_logprobs_where_the_learner_scores_response_tokens():
    from pipeline.learner.rollouts import pad_sequences, place_logprobs

    prompts, responses = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
    ids, am, rm = pad_sequences(prompts, responses, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 9, 10], [8, 11, 12, 13, 0]]
    assert am.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # log-prob position j scores token j+1: response tokens sit at P-1 .. P+R-2
    assert rm.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    lp = place_logprobs([3, 1], [[-0.5, -0.25], [-1.0, -2.0, -3.0]], 4)
    assert lp.tolist() == [[0, 0, -0.5, -0.25], [-1.0, -2.0, -3.0, 0]]
