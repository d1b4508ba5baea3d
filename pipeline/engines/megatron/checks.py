"""I3 for a Megatron learner: the exported HF tensors must reproduce the learner's own forward.

``pipeline.sync.invariants.check_sync`` compares the sampler with what ``learner.export_weights`` returns *now*, so
it catches every corruption between the export and the kernels -- but not an exporter that is wrong in a
self-consistent way. For the HF learner the export is the model's own parameters; for Megatron it goes through
a layout conversion (``weights.megatron_to_hf``: the query-group interleave of ``linear_qkv``, the [gate; up]
split of ``linear_fc1``), and a wrong interleave produces tensors of the right shapes that the sampler loads
faithfully. So the Megatron check adds one functional test to I3: load the export into an HF Qwen3 model and
compare its logits with Megatron's on a fixed probe batch, both in fp32 on the same (BF16-valued) weights.
A correct mapping agrees to ~1e-6 relative; a wrong interleave or a gate/up swap is off by O(1).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.engines.megatron.model import forward_logits

EXPORT_REL_TOL = 1e-3


def probe_batch(vocab_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (2, 16), generator=g)
    return ids, torch.ones_like(ids)


def _fp32_twin(learner: Any) -> Any:
    """An fp32 GPTModel of the learner's shape, built once per learner (Megatron modules hold process groups,
    so ``copy.deepcopy`` of the learner's model is not an option)."""
    twin = getattr(learner, "_export_check_twin", None)
    if twin is None:
        from pipeline.engines.megatron.model import build_gpt_model

        path = getattr(learner, "path", None)
        spec = None
        if path is not None and path.uses_te:  # same spec (TE fuses the pre-norms) on the learner's GPU
            from pipeline.engines.megatron.te_path import te_layer_spec

            spec = te_layer_spec()
        with torch.random.fork_rng(devices=[]):
            twin = build_gpt_model(learner.preset, dtype=torch.float32, layer_spec=spec).eval()
        twin.to(getattr(learner, "device", "cpu"))
        learner._export_check_twin = twin
    return twin


def verify_export(learner: Any) -> list[tuple[str, str]]:
    """Failures (name, message) when the learner's export does not reproduce its forward (empty = pass)."""
    from pipeline.model.presets import build_config

    exported = learner.export_weights(lambda name: False)
    config = build_config(learner.preset)
    config._attn_implementation = "eager"
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_config(config).float().eval()
    missing, unexpected = hf.load_state_dict({k: v.float() for k, v in exported.items()}, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        return [
            (
                "<export>",
                f"export names differ from HF Qwen3: missing {missing[:3]}, unexpected {unexpected[:3]}",
            )
        ]
    meg = _fp32_twin(learner)
    with torch.no_grad():  # the exported BF16 values, in fp32, on both sides
        for twin, p in zip(meg.parameters(), learner.model.parameters(), strict=True):
            twin.copy_(p.detach().to(torch.bfloat16).float())
        ids, am = probe_batch(learner.preset.vocab_size)
        device = getattr(learner, "device", "cpu")
        lm = forward_logits(meg, ids.to(device), am.to(device)).cpu()
        lh = hf(input_ids=ids, attention_mask=am).logits
    rel = float((lm - lh).abs().max() / lh.abs().max().clamp(min=1e-12))
    if rel > EXPORT_REL_TOL:
        return [
            (
                "<export>",
                f"exported tensors do not reproduce the Megatron forward: max |logit diff| / max |logit| = {rel:.3g} "
                f"(> {EXPORT_REL_TOL}); a wrong linear_qkv interleave or linear_fc1 split?",
            )
        ]
    return []


def fold_export_check(rows: Sequence[Any], learner: Any) -> list[Any]:
    """``rows`` of a sync check with :func:`verify_export` folded into the I3 row."""
    t0 = time.perf_counter()
    failures = verify_export(learner)
    out = []
    for r in rows:
        if r.invariant == "I3":
            seconds = r.check_seconds + time.perf_counter() - t0
            if failures:
                detail = "; ".join(m for _, m in failures) + ("" if r.passed else f"; {r.detail}")
                r = dataclasses.replace(r, passed=False, first_failing_tensor=failures[0][0], detail=detail)
            r = dataclasses.replace(r, check_seconds=seconds)
        out.append(r)
    return out


def check_sync_megatron(
    step: int, learner: Any, engine: Any, *, rollouts: Sequence[Any] = (), report: Any = None
) -> list[Any]:
    """``pipeline.sync.invariants.check_sync`` with the export check folded into I3 (a drop-in ``checker``)."""
    from pipeline.sync.invariants import check_sync

    return fold_export_check(check_sync(step, learner, engine, rollouts=rollouts, report=report), learner)
