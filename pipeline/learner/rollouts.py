"""Rollouts -> learner tensors: the GRPO batch of a step and the fixed evaluation batch.

Alignment. Log-probs of a sequence of T tokens are next-token log-probs at positions 0..T-2: position j
scores token j+1. A prompt of P tokens and a response of R tokens therefore occupy log-prob positions
P-1 .. P+R-2, which is where ``response_mask`` is 1 and where the sampler's per-token log-probs are placed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.interfaces import Rollout
from pipeline.learner.grpo import GRPOBatch, group_advantages


def pad_sequences(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, response_mask) for prompt+response rows, right-padded."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    b, t = len(lengths), max(lengths)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    am = torch.zeros((b, t), dtype=torch.long)
    rm = torch.zeros((b, t - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        seq = list(p) + list(r)
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        am[i, : len(seq)] = 1
        rm[i, len(p) - 1 : len(p) + len(r) - 1] = 1.0
    return ids, am, rm


def place_logprobs(
    prompt_lengths: Sequence[int], logprobs: Sequence[Sequence[float]], width: int
) -> torch.Tensor:
    """Per-response-token log-probs put at their log-prob positions in a [B, width] tensor (0 elsewhere)."""
    out = torch.zeros((len(logprobs), width), dtype=torch.float32)
    for i, (p, lp) in enumerate(zip(prompt_lengths, logprobs, strict=True)):
        out[i, p - 1 : p - 1 + len(lp)] = torch.tensor(list(lp), dtype=torch.float32)
    return out


def build_grpo_batch(
    rollouts: Sequence[Rollout],
    rewards: Sequence[float],
    group_size: int,
    old_logprobs: torch.Tensor,
    pad_id: int,
) -> GRPOBatch:
    """The GRPO batch of a step: advantages from contiguous groups of ``group_size`` rollouts."""
    ids, am, rm = pad_sequences([r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts], pad_id)
    sampler_lp = place_logprobs(
        [len(r.prompt_ids) for r in rollouts], [r.logprobs for r in rollouts], rm.shape[1]
    )
    adv = group_advantages(torch.tensor(list(rewards), dtype=torch.float32), group_size)
    return GRPOBatch(ids, am, rm, adv, old_logprobs, sampler_lp)
