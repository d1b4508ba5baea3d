"""Sampler-vs-learner mismatch metrics over valid response tokens (formulas from docs/contracts.md).

With lp_s the sampler's and lp_l the learner's log-prob of each sampled token and r = lp_l - lp_s, over
the valid (masked-in) response tokens of a batch, token-mean:

- ``kl_k1`` = mean(lp_s - lp_l): the k1 (plain Monte-Carlo) estimate of KL(sampler || learner); unbiased
  but noisy and can be negative on a finite sample.
- ``kl_k3`` = mean(exp(r) - r - 1): Schulman's k3 estimator, unbiased for the same KL and always >= 0.
- ``token_mult_prob_error`` = mean(exp(|lp_s - lp_l|)) (NeMo RL; 1.0 = identical, > 1.05 is suspect).
- ``prob_abs_diff_mean`` / ``prob_abs_diff_max`` = mean / max |exp(lp_s) - exp(lp_l)| (verl's
  ``rollout_probs_diff``, in probability space).

:func:`kl_k3_stderr` is the standard error of the k3 token mean (tokens treated as independent): two pairings
scored on the same tokens whose kl_k3 differ by less than a few of these are not resolved.

Pure functions of tensors; nothing here reads or writes files.
"""

from __future__ import annotations

import math

import torch

METRIC_NAMES = ("kl_k1", "kl_k3", "token_mult_prob_error", "prob_abs_diff_mean", "prob_abs_diff_max")


def mismatch_metrics(
    sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The five metrics (float64 math). ``mask`` selects valid tokens; no valid token gives NaN values."""
    if sampler_logprobs.shape != learner_logprobs.shape or mask.shape != sampler_logprobs.shape:
        raise ValueError(
            f"shape mismatch: sampler {tuple(sampler_logprobs.shape)}, learner {tuple(learner_logprobs.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    valid = mask.bool()
    n = int(valid.sum())
    if n == 0:
        return dict.fromkeys(METRIC_NAMES, math.nan)
    lp_s = sampler_logprobs.double()[valid]
    lp_l = learner_logprobs.double()[valid]
    r = lp_l - lp_s
    prob_diff = (lp_s.exp() - lp_l.exp()).abs()
    return {
        "kl_k1": float((lp_s - lp_l).mean()),
        "kl_k3": float((r.exp() - r - 1).mean()),
        "token_mult_prob_error": float((lp_s - lp_l).abs().exp().mean()),
        "prob_abs_diff_mean": float(prob_diff.mean()),
        "prob_abs_diff_max": float(prob_diff.max()),
    }


def kl_k3_stderr(sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Standard error of ``kl_k3`` over the valid tokens (NaN with fewer than two)."""
    valid = mask.bool()
    n = int(valid.sum())
    if n < 2:
        return math.nan
    r = learner_logprobs.double()[valid] - sampler_logprobs.double()[valid]
    k3 = r.exp() - r - 1
    return float(k3.std() / math.sqrt(n))
