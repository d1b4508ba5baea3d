"""Why a BF16 Megatron learner and the BF16 native sampler can agree bit for bit, measured in a child process
(the Megatron CPU compat layer patches torch.cuda process-wide). Writes one JSON object.

Usage: python tests/integration/megatron_child/sampler_agreement.py OUT.json

The two forwards are different code (Megatron's GPTModel vs ``pipeline.sampler.forward`` over weights that
crossed the safetensors byte boundary), but on CPU they run the same BF16 op sequence: BF16 parameters and
residual stream, fp32 softmax, attention scale 1/8 (exact), the same BF16 GEMMs on row-permuted fused weights.
The one rounding that differs is RMSNorm: ``torch.nn.RMSNorm`` (Megatron's local spec) rounds ``x * rstd * w``
once, the sampler rounds ``x * rstd`` to BF16 and then multiplies by ``w`` (Qwen3's order). With every norm
weight 1.0 (the HF init) the two coincide. So, with the sampler's forward called on the learner's own batch
shape (same GEMM shapes):

- HF init, BF16 sampler: logits and log-probs bitwise equal;
- HF init, MXFP8 sampler: different (the sampler's grid reaches its log-probs);
- norm weights != 1, BF16 sampler: different by BF16 rounding only.

The sampler's scoring path (prefill + one-token decode steps) runs the same math with other GEMM row counts; the
oneDNN BF16 GEMM with K = 768 (``down_proj``) is not row-count independent for every M, so that path is equal
only mostly (recorded, not asserted bitwise).
"""

from __future__ import annotations

import json
import sys

import torch


def _batch(seed: int = 0, rows: int = 4, tokens: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 512, (rows, tokens), generator=g)  # 0 = pad, 1 = eos: not sampled


def _next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    from pipeline.engines.megatron.learner import MegatronLearner
    from pipeline.model.presets import build_config, build_model, get_preset
    from pipeline.sampler.engine import Sampler
    from pipeline.sampler.forward import KVCache, forward
    from pipeline.sync.weight_sync import WeightSync

    preset = get_preset("tiny-dense")
    config = build_config(preset)
    hf_init = {k: v.detach().float() for k, v in build_model(preset, seed=3).state_dict().items()}
    g = torch.Generator().manual_seed(7)
    off_one = {  # norm weights away from 1.0, BF16-representable (the export is exact)
        k: (1 + 0.3 * torch.randn(v.shape, generator=g)).to(torch.bfloat16).float() if "norm" in k else v
        for k, v in hf_init.items()
    }
    ids = _batch()
    b, t = ids.shape
    res: dict[str, object] = {
        "init_norm_weights_all_one": all(bool((v == 1).all()) for k, v in hf_init.items() if "norm" in k)
    }
    for label, init in (("unit_norms", hf_init), ("off_one_norms", off_one)):
        learner = MegatronLearner(preset, "bf16", hf_init=init)
        lp_learner = learner.logprobs(ids, torch.ones_like(ids))
        for mode in ("bf16", "mxfp8"):
            sampler = Sampler(config, mode)
            WeightSync().sync(learner, sampler, 1)
            cache = KVCache(sampler.dims, b, t, fp8=False)
            with torch.no_grad():
                logits = forward(
                    sampler.weights,
                    sampler.dims,
                    ids,
                    torch.arange(t).expand(b, t),
                    torch.ones(b, t, dtype=torch.bool),
                    cache,
                    0,
                )
            diff = _next_token_logprobs(logits, ids) - lp_learner
            key = f"{label}[{mode}]"
            res[f"bitwise_equal_{key}"] = bool((diff == 0).all())
            res[f"maxdiff_{key}"] = float(diff.abs().max())
            if mode == "bf16":
                prompt = 6
                scored = sampler.score(ids[:, :prompt].tolist(), ids[:, prompt:].tolist())
                inc = torch.tensor(scored) - lp_learner[:, prompt - 1 :]
                res[f"score_path_maxdiff_{key}"] = float(inc.abs().max())
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
