"""GRPO pieces and the HF learner: packing, advantages, clipped loss, accumulation, determinism, export."""

from __future__ import annotations

import pytest
import torch

from pipeline.interfaces import LearnerBackend, scale_name
from pipeline.learner.engine import HFLearner
from pipeline.learner.grpo import GRPOBatch, GRPOConfig, group_advantages, pack_microbatches, token_loss
from pipeline.model.presets import build_model, get_preset
from tracing.capture.ranges import RangeLog
from tracing.outputs.errors import InputError


def _batch(b: int = 8, t: int = 12, seed: int = 0) -> GRPOBatch:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 258, (b, t), generator=gen)
    am = torch.ones(b, t, dtype=torch.long)
    am[1::2, t - 3 :] = 0  # shorter sequences, right-padded
    ids[am == 0] = 0
    rm = (am[:, 1:] * (torch.arange(t - 1) >= 4)).float()
    old = -torch.rand(b, t - 1, generator=gen) * 4
    return GRPOBatch(ids, am, rm, group_advantages(torch.rand(b, generator=gen), 4), old, old + 0.05)


def test_group_advantages_are_zero_mean_unit_std_per_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]), 4)
    g = adv.view(2, 4)
    assert torch.allclose(g.mean(1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(g[0].std(unbiased=False), torch.tensor(1.0), atol=1e-4)
    assert torch.equal(g[1], torch.zeros(4))  # identical rewards: no signal


def test_packing_respects_the_padded_budget_and_rejects_too_small_budgets():
    plan = pack_microbatches([10, 10, 12, 5, 9], 24)
    assert plan == [[0, 1], [2, 3], [4]]
    for mb in plan:
        assert len(mb) * max([10, 10, 12, 5, 9][i] for i in mb) <= 24
    with pytest.raises(InputError, match="smaller than one sequence"):
        pack_microbatches([10, 30], 24)


def test_clipped_loss_gives_no_gradient_beyond_the_clip_for_positive_advantage():
    b = _batch()
    lp = (b.old_logprobs + 1.0).requires_grad_(True)  # ratio e > 1 + eps everywhere
    b.advantages.fill_(1.0)
    loss, stats = token_loss(lp, b, GRPOConfig(tis_cap=None))
    loss.sum().backward()
    assert torch.count_nonzero(lp.grad) == 0
    assert float(stats["clipped"]) == float(b.response_mask.sum())


def test_tis_weight_is_truncated_at_the_cap():
    b = _batch()
    b.sampler_logprobs = b.old_logprobs - 5.0  # pi_old / pi_sampler = e^5, far above the cap
    _, stats = token_loss(b.old_logprobs.clone(), b, GRPOConfig(tis_cap=2.0))
    assert float(stats["tis_weight_sum"]) == pytest.approx(2.0 * float(b.response_mask.sum()), rel=1e-5)


def _trained(tokens_per_microbatch: int, precision: str = "bf16", compute: str = "float32") -> HFLearner:
    learner = HFLearner(build_model(get_preset("tiny-dense"), 0), precision, compute_dtype=compute)
    learner.train_step(_batch(), tokens_per_microbatch)
    return learner


def test_gradient_accumulation_gives_the_same_update_for_any_microbatch_split():
    one, many = _trained(12 * 8), _trained(24)
    assert len(many.last_microbatches) == 4 and len(one.last_microbatches) == 1
    for (n, a), (_, b) in zip(one.model.named_parameters(), many.model.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=2e-6), n


def test_learner_is_deterministic_with_a_seed():
    a, b = _trained(48, compute="bfloat16"), _trained(48, compute="bfloat16")
    for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(x, y)


def test_microbatch_ranges_carry_step_index_tokens_and_precision():
    ranges = RangeLog()
    learner = HFLearner(build_model(get_preset("tiny-dense"), 0), "bf16", ranges=ranges)
    assert isinstance(learner, LearnerBackend)
    learner.train_step(_batch(), 36)
    recs = [r for r in ranges.records if r.name == "update/microbatch"]
    assert [r.attrs["microbatch"] for r in recs] == list(range(len(recs))) and len(recs) == 3
    assert sum(r.attrs["tokens"] for r in recs) == int(_batch().attention_mask.sum())
    assert {r.attrs["precision"] for r in recs} == {"bf16"} and {r.attrs["step"] for r in recs} == {0}
    assert all(r.attrs["peak_mem_bytes"] >= 0 for r in recs)


def test_mxfp8_learner_exports_the_bytes_its_forward_uses():
    learner = HFLearner(build_model(get_preset("tiny-dense"), 0), "mxfp8")
    out = learner.export_weights(lambda name: True)
    name = "model.layers.1.self_attn.q_proj.weight"
    assert out[name].dtype == torch.uint8 and out[scale_name(name)].dtype == torch.uint8
    q = learner.model.get_submodule("model.layers.1.self_attn.q_proj").quantized_weight()
    assert torch.equal(out[name], q.data) and torch.equal(out[scale_name(name)], q.scale)
    assert out[name].data_ptr() != q.data.data_ptr()  # a copy: nothing aliases the learner
    assert out["lm_head.weight"].dtype == torch.bfloat16  # policy: LM head stays BF16
    assert out["model.norm.weight"].dtype == torch.bfloat16
    bf = learner.export_weights(lambda name: False)
    assert bf[name].dtype == torch.bfloat16


def test_unknown_learner_precision_is_an_input_error():
    with pytest.raises(InputError, match="learner precision"):
        HFLearner(build_model(get_preset("tiny-dense"), 0), "fp4")
