"""Tiny real Qwen3 / Qwen3-MoE learners and samplers for the weight-sync tests (built from configs, no hub)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_config(moe: bool = False, tie: bool = False) -> Any:
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    if moe:
        return Qwen3MoeConfig(
            **common,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        )
    return Qwen3Config(**common, intermediate_size=96)


def tiny_learner(precision: str = "mxfp8", moe: bool = False, seed: int = 0, tie: bool = False) -> Any:
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    from pipeline.learner.engine import HFLearner

    torch.manual_seed(seed)
    cfg = tiny_config(moe, tie)
    model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(cfg)
    return HFLearner(model, precision)


def train_a_little(learner: Any, seed: int = 1, lr: float = 5e-3) -> None:
    """One real AdamW step of the next-token loss on random tokens: the weights (and many scales) move."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, learner.model.config.vocab_size, (4, 12), generator=g)
    opt = torch.optim.AdamW(learner.model.parameters(), lr=lr)
    learner.model.train()
    loss = learner.model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def tiny_sampler(learner: Any, mode: str = "mxfp8", **kw: Any) -> Any:
    from pipeline.sampler.engine import Sampler

    return Sampler(learner.model.config, mode, eos_id=1, pad_id=0, **kw)
