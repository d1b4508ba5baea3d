"""Sampler-learner consistency at fixed weights: every precision pairing on one fixed evaluation batch.

For each learner precision {bf16, mxfp8} (same starting weights) and each sampler variant (weights synced
from that learner through the real byte path, ``pipeline.sync.weight_sync``), the sampler scores a fixed batch of
responses with its own prefill + incremental decode, and the learner with its full-sequence forward; the
table holds the mismatch metrics of docs/contracts.md per pairing, as absolute values plus the ratio to the same learner's
BF16 sampler.

The fixed batch: ``eval_prompts`` task prompts, one response each, sampled once by the BF16 sampler paired
with the BF16 learner (temperature 1, fixed seed), so every pairing is measured on the same tokens and the
differences between rows are not sampling noise.

What the rows mean (the grid-matching question): with an MXFP8 learner, a sampler on the **same grid** sees
the same weights byte for byte; what remains is activation-quantization of slightly different inputs and the
different reduction order of incremental BF16 decoding -- realistic residual mismatch. A BF16 sampler sees
the unquantized weights; another grid (FLOOR rule, per-tensor or 128x128 FP8) sees differently rounded ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pipeline.experiments.loop import evaluate_pairing
from pipeline.experiments.session import build_tokenizer
from pipeline.experiments.settings import ExperimentSettings, at_least
from pipeline.interfaces import SamplingParams
from pipeline.model.presets import build_config, get_preset
from pipeline.model.pretrain import PretrainConfig, warm_start
from pipeline.model.task import AdditionTask


@dataclass(frozen=True)
class SamplerVariant:
    label: str
    mode: str
    grid_fraction: float = 1.0
    kv_cache: str = "bf16"


SAMPLER_VARIANTS: tuple[SamplerVariant, ...] = (
    SamplerVariant("bf16", "bf16"),
    SamplerVariant("mxfp8", "mxfp8"),
    SamplerVariant("mxfp8 grid-fraction 0.5", "mxfp8", grid_fraction=0.5),
    SamplerVariant("mxfp8-floor", "mxfp8-floor"),
    SamplerVariant("fp8-tensor", "fp8-tensor"),
    SamplerVariant("fp8-block128", "fp8-block128"),
    SamplerVariant("bf16 kv-fp8", "bf16", kv_cache="fp8"),
    SamplerVariant("mxfp8 kv-fp8", "mxfp8", kv_cache="fp8"),
)
LEARNERS = ("bf16", "mxfp8")


@dataclass(frozen=True)
class ConsistencyConfig(ExperimentSettings):
    eval_prompts: int = 128
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(1, eval_prompts=self.eval_prompts, max_new_tokens=self.max_new_tokens)
        self.check_gemm(LEARNERS)


def _sampler(config: Any, v: SamplerVariant, calib: list[list[int]], tok: Any, device: Any = None) -> Any:
    from pipeline.sampler.engine import Sampler

    return Sampler(
        config,
        v.mode,
        grid_fraction=v.grid_fraction,
        kv_cache=v.kv_cache,
        calibration_prompts=calib,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        device=device,
    )


def run_consistency(
    cfg: ConsistencyConfig,
    variants: tuple[SamplerVariant, ...] = SAMPLER_VARIANTS,
    learners: tuple[str, ...] = LEARNERS,
    log: Callable[[str], None] = lambda m: None,
) -> pd.DataFrame:
    """One row per (learner, sampler variant) with absolute metrics and ratios to the BF16 sampler."""
    from pipeline.learner.engine import HFLearner
    from pipeline.sync.weight_sync import WeightSync

    preset = get_preset(cfg.model)
    task = AdditionTask(1, 2)
    tok = build_tokenizer(task)
    device = cfg.torch_device
    pretrain = PretrainConfig(steps=cfg.pretrain_steps, seed=cfg.seed)
    base, _ = warm_start(preset, task, tok, pretrain, device=device)
    hf_config = build_config(preset)
    problems = task.problems(cfg.eval_prompts, seed=20_000_003 + cfg.seed)
    prompts = [tok.encode(p.prompt) for p in problems]
    opts = cfg.learner_options()
    learner_objs = {p: HFLearner(copy.deepcopy(base), p, **opts) for p in learners}
    ref_learner = HFLearner(copy.deepcopy(base), "bf16", **opts)
    ref = _sampler(hf_config, SAMPLER_VARIANTS[0], prompts, tok, device)
    WeightSync().sync(ref_learner, ref, 1)
    rollouts = ref.generate(prompts, SamplingParams(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed))
    responses = [r.response_ids for r in rollouts]
    rows = []
    for lp in learners:
        for v in variants:
            sampler = _sampler(hf_config, v, prompts, tok, device)
            WeightSync().sync(learner_objs[lp], sampler, 1)
            m = evaluate_pairing(learner_objs[lp], sampler, prompts, responses, tok.pad_id)
            rows.append(
                {
                    "model": cfg.model,
                    "learner": lp,
                    "sampler": v.label,
                    "sampler_mode": v.mode,
                    "grid_fraction": v.grid_fraction,
                    "kv_cache": v.kv_cache,
                    **m,
                }
            )
            log(f"learner {lp:5s} sampler {v.label:24s} kl_k3 {m['kl_k3']:.3e}")
    df = pd.DataFrame(rows)
    base_k3 = df[df["sampler"] == "bf16"].set_index("learner")["kl_k3"]
    df["kl_k3_vs_bf16_sampler"] = df["kl_k3"] / df["learner"].map(base_k3)
    return df


def format_table(df: pd.DataFrame) -> str:
    """The table for people: absolute KL values and the ratio to the BF16 sampler."""
    lines = [
        f"{'learner':8s} {'sampler':26s} {'kl_k1':>11s} {'kl_k3':>11s} {'+- se':>9s} {'mult_err':>9s} "
        f"{'p_diff_max':>10s} {'k3/bf16':>8s}"
    ]
    for r in df.itertuples(index=False):
        lines.append(
            f"{r.learner:8s} {r.sampler:26s} {r.kl_k1:11.3e} {r.kl_k3:11.3e} {r.kl_k3_se:9.1e} "
            f"{r.token_mult_prob_error:9.5f} {r.prob_abs_diff_max:10.2e} {r.kl_k3_vs_bf16_sampler:8.3f}"
        )
    tokens = int(df["num_tokens"].iloc[0]) if len(df) else 0
    lines.append(
        f"{tokens} scored tokens per pairing; kl_k3 values closer than ~2 se (standard error of the token "
        "mean) are not resolved: raise --eval-prompts"
    )
    return "\n".join(lines)
