"""GRPO pieces that are pure tensor functions: advantages, the clipped token loss, micro-batch packing.

GRPO (Shao et al. 2024, DeepSeekMath) samples ``n`` responses per prompt and uses the group as its own
baseline, so no value network is needed:

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)          (one advantage per sequence)

Each response token t then gets the PPO clipped surrogate, with ratio rho_t = pi(t) / pi_old(t):

    loss_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))

Token-level truncated importance sampling (TIS, Yao et al. 2025 "Your efficient RL framework secretly
brings you off-policy RL training") corrects for the sampler computing different probabilities than the
learner (different precision, kernels, reductions): loss_t is multiplied by the detached weight
min(pi_old(t) / pi_sampler(t), C). The step loss is the mean over **all valid response tokens of the step**,
so gradient accumulation over micro-batches gives the same gradient for any micro-batch split.

Packing: sequences are placed, in order, into micro-batches whose padded size (sequences x longest length)
stays within ``tokens_per_microbatch``; a sequence longer than the budget is an input error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracing.outputs.errors import InputError


@dataclass(frozen=True)
class GRPOConfig:
    """Optimisation settings of the learner (AdamW + clipped GRPO loss)."""

    lr: float = 3e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    tis_cap: float | None = 2.0  # None: no importance-sampling correction
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not (0 < self.clip_eps_low < 1 and self.clip_eps_high > 0):
            raise ValueError("clip_eps_low must be in (0, 1) and clip_eps_high > 0")
        if self.tis_cap is not None and self.tis_cap < 1:
            raise ValueError(f"tis_cap must be >= 1 (or None to disable), got {self.tis_cap}")

    def optimizer(self, params: Any) -> torch.optim.AdamW:
        """The learner's AdamW over ``params`` (both learners: one place for the optimizer settings)."""
        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay, foreach=False
        )


@dataclass
class GRPOBatch:
    """A global batch of B sequences, right-padded to T. Token tensors are aligned with next-token
    log-probs: position j of ``response_mask`` / ``old_logprobs`` refers to token ``input_ids[:, j+1]``."""

    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] int64 (1 = real token)
    response_mask: torch.Tensor  # [B, T-1] float (1 = response token, in the loss)
    advantages: torch.Tensor  # [B] float32
    old_logprobs: torch.Tensor  # [B, T-1] float32, learner before the update
    sampler_logprobs: torch.Tensor | None = None  # [B, T-1] float32, for TIS

    def __post_init__(self) -> None:
        b, t = self.input_ids.shape
        for name, shape in (
            ("attention_mask", (b, t)),
            ("response_mask", (b, t - 1)),
            ("advantages", (b,)),
            ("old_logprobs", (b, t - 1)),
        ):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(
                    f"GRPOBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}"
                )

    @property
    def lengths(self) -> list[int]:
        return [int(x) for x in self.attention_mask.sum(dim=1)]

    def select(self, rows: Sequence[int]) -> GRPOBatch:
        """Rows ``rows``, trimmed to their longest sequence (the micro-batch the model sees)."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        t = int(self.attention_mask[idx].sum(dim=1).max())
        sl = self.sampler_logprobs[idx, : t - 1] if self.sampler_logprobs is not None else None
        return GRPOBatch(
            self.input_ids[idx, :t],
            self.attention_mask[idx, :t],
            self.response_mask[idx, : t - 1],
            self.advantages[idx],
            self.old_logprobs[idx, : t - 1],
            sl,
        )


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages; ``rewards`` is [num_prompts * group_size], groups contiguous."""
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    std = r.std(dim=1, keepdim=True, unbiased=False) if group_size > 1 else torch.zeros_like(r[:, :1])
    return ((r - r.mean(dim=1, keepdim=True)) / (std + eps)).view(-1)


def token_loss(
    logprobs: torch.Tensor, batch: GRPOBatch, cfg: GRPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped (and TIS-weighted) loss [B, T-1], zero outside the response, plus statistics."""
    mask = batch.response_mask
    ratio = torch.exp(logprobs - batch.old_logprobs)
    adv = batch.advantages[:, None]
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    stats = {"clipped": ((clipped > unclipped).float() * mask).sum()}
    if cfg.tis_cap is not None and batch.sampler_logprobs is not None:
        w = torch.exp(batch.old_logprobs - batch.sampler_logprobs).clamp(max=cfg.tis_cap).detach()
        loss = loss * w
        stats["tis_weight_sum"] = (w * mask).sum()
    return loss * mask, stats


def pack_microbatches(lengths: Sequence[int], tokens_per_microbatch: int) -> list[list[int]]:
    """Indices of each micro-batch: in order, as many sequences as fit in the padded token budget."""
    if tokens_per_microbatch < 1:
        raise InputError(f"--tokens-per-microbatch must be >= 1, got {tokens_per_microbatch}")
    longest = max(lengths, default=0)
    if longest > tokens_per_microbatch:
        raise InputError(
            f"--tokens-per-microbatch {tokens_per_microbatch} is smaller than one sequence ({longest} tokens); "
            f"use at least {longest}"
        )
    out: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i, n in enumerate(lengths):
        new_max = max(cur_max, n)
        if cur and (len(cur) + 1) * new_max > tokens_per_microbatch:
            out.append(cur)
            cur, new_max = [], n
        cur.append(i)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


@dataclass
class StepTotals:
    """What a learner step sums over its micro-batches; :meth:`stats` turns it into :func:`step_stats`."""

    loss_sum: float = 0.0
    clipped: float = 0.0
    tis_sum: float = 0.0
    num_microbatches: int = 0

    def add(self, loss: torch.Tensor, stats: dict[str, Any]) -> None:
        """One micro-batch: its loss (already divided by the step's token count) and ``token_loss`` stats."""
        self.loss_sum += float(loss.detach())
        self.clipped += float(stats["clipped"])
        self.tis_sum += float(stats.get("tis_weight_sum", 0.0))
        self.num_microbatches += 1

    def stats(self, batch: GRPOBatch, grad_norm: float) -> dict[str, float]:
        return step_stats(
            batch,
            loss_sum=self.loss_sum,
            grad_norm=grad_norm,
            clipped=self.clipped,
            tis_sum=self.tis_sum,
            num_microbatches=self.num_microbatches,
        )


def step_stats(
    batch: GRPOBatch,
    *,
    loss_sum: float,
    grad_norm: float,
    clipped: float,
    tis_sum: float,
    num_microbatches: int,
) -> dict[str, float]:
    """The per-step statistics every learner backend returns from ``train_step`` (token means over the
    step's valid response tokens; TIS weight mean NaN when the batch carries no sampler log-probs)."""
    total_tokens = float(batch.response_mask.sum().clamp(min=1.0))
    return {
        "loss": loss_sum,
        "grad_norm": float(grad_norm),
        "clip_fraction": clipped / total_tokens,
        "tis_weight_mean": tis_sum / total_tokens if batch.sampler_logprobs is not None else float("nan"),
        "num_microbatches": float(num_microbatches),
        "update_tokens": float(batch.attention_mask.sum()),
    }


def microbatch_range(ranges: Any, step: int, index: int, mb: GRPOBatch, precision: str) -> Any:
    """The ``update/microbatch`` range of one micro-batch, with the attributes every learner records (step,
    microbatch, tokens, padded_tokens, precision): the context manager yields that attribute dict."""
    return ranges.range(
        "update/microbatch",
        step=step,
        microbatch=index,
        tokens=int(mb.attention_mask.sum()),
        padded_tokens=int(mb.input_ids.numel()),
        precision=precision,
    )
