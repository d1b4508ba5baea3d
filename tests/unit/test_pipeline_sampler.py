"""The sampler engine: its own incremental forward, prefix cache, FP8 KV scales, versions, async sync."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pipeline.interfaces import SamplerEngine, SamplingParams
from pipeline.learner.engine import HFLearner
from pipeline.model.presets import build_config, build_model, get_preset
from pipeline.sampler.engine import EngineFailedError, Sampler
from pipeline.sync.weight_sync import WeightSync

PROMPTS = [[5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [11, 12, 13]]


def _pair(model: str = "tiny-dense", mode: str = "bf16", **kw) -> tuple[HFLearner, Sampler]:
    p = get_preset(model)
    learner = HFLearner(build_model(p, 0), "bf16", compute_dtype="float32")
    sampler = Sampler(build_config(p), mode, calibration_prompts=PROMPTS, **kw)
    WeightSync().sync(learner, sampler, 1)
    return learner, sampler


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_sampler_logprobs_track_the_learner_but_come_from_another_reduction(model):
    learner, sampler = _pair(model)
    assert isinstance(sampler, SamplerEngine)
    rollouts = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=6, seed=0))
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        lp = learner.logprobs(ids, torch.ones_like(ids))[0, len(r.prompt_ids) - 1 :]
        diff = (lp - torch.tensor(r.logprobs)).abs()
        assert float(diff.max()) < 0.1  # same model ...
        assert float(diff.max()) > 0  # ... different arithmetic (BF16 incremental vs FP32 full-sequence)


def test_generation_is_deterministic_with_a_seed_and_stamped_with_the_version():
    _, sampler = _pair()
    params = SamplingParams(max_new_tokens=5, seed=3)
    a, b = sampler.generate(PROMPTS, params), sampler.generate(PROMPTS, params)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert all(r.dispatch_version == 1 and r.weight_versions == {1} for r in a)
    assert all(len(r.response_ids) == len(r.logprobs) for r in a)


def test_duplicate_prompts_share_one_prefill_and_the_cache_is_reset_at_sync():
    learner, sampler = _pair()
    sampler.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    assert sampler.stats["prefix_misses"] == 3  # 4 prompts, 3 distinct
    sampler.generate(PROMPTS[:2], SamplingParams(max_new_tokens=2))
    assert sampler.stats["prefix_hits"] == 2
    assert sampler.aux_state()["prefix_cache_versions"] == [1]
    WeightSync().sync(learner, sampler, 2)
    aux = sampler.aux_state()
    assert aux["prefix_cache_entries"] == 0 and aux["weight_version"] == 2


def test_a_stale_prefix_cache_is_served_and_visible_when_the_reset_is_skipped():
    class NoReset(Sampler):
        def _reset_prefix_cache(self) -> None:
            pass

    p = get_preset("tiny-dense")
    learner = HFLearner(build_model(p, 0), "bf16")
    sampler = NoReset(build_config(p), "bf16")
    WeightSync().sync(learner, sampler, 1)
    sampler.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    WeightSync().sync(learner, sampler, 2)
    assert sampler.aux_state()["prefix_cache_versions"] == [1]  # what invariant I6 catches


def test_fp8_kv_scales_are_recalibrated_for_each_weight_version():
    learner, sampler = _pair(kv_cache="fp8")
    aux = sampler.aux_state()
    assert aux["kv_scale_version"] == 1 and all(s != 1.0 for s in aux["k_scales"])
    before = list(aux["k_scales"])
    with torch.no_grad():
        for prm in learner.model.parameters():
            prm.mul_(1.5)
    WeightSync().sync(learner, sampler, 2)
    aux = sampler.aux_state()
    assert aux["kv_scale_version"] == 2 and aux["k_scales"] != before
    out = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=3))
    assert all(torch.isfinite(torch.tensor(r.logprobs)).all() for r in out)


def test_score_matches_generation_logprobs_on_the_same_tokens():
    _, sampler = _pair()
    rollouts = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=1))
    scored = sampler.score([r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts])
    for r, s in zip(rollouts, scored, strict=True):
        assert s == pytest.approx(r.logprobs, abs=1e-6)


def test_no_generation_before_weights_and_after_a_failed_load():
    p = get_preset("tiny-dense")
    sampler = Sampler(build_config(p), "bf16")
    with pytest.raises(EngineFailedError, match="no weights"):
        sampler.generate(PROMPTS, SamplingParams(max_new_tokens=1))
    _, sampler = _pair()
    with pytest.raises(Exception):  # noqa: B017 - any load error
        sampler.update_weights(b"not safetensors", 2)
    assert sampler.weight_version == 1  # fail-stop: no bump ...
    with pytest.raises(EngineFailedError):
        sampler.generate(PROMPTS, SamplingParams(max_new_tokens=1))  # ... and no serving


def _sync_while_decoding(sampler: Sampler, learner: HFLearner) -> list:
    """Start a long generation on the engine's thread, then sync once it is decoding."""
    fut = sampler.submit(PROMPTS, SamplingParams(max_new_tokens=100, seed=0, temperature=0.3))
    deadline = time.monotonic() + 60
    while sampler.stats["decode_steps"] < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    t = threading.Thread(target=WeightSync().sync, args=(learner, sampler, 2))
    t.start()
    out = fut.result(timeout=300)
    t.join(timeout=300)
    sampler.close()
    return out


def test_async_sync_drains_in_flight_requests_before_loading():
    learner, sampler = _pair()
    rollouts = _sync_while_decoding(sampler, learner)
    assert all(r.weight_versions == {r.dispatch_version} == {1} for r in rollouts)
    assert sampler.weight_version == 2


def test_skipping_the_drain_decodes_sequences_on_mixed_weights():
    class NoDrain(Sampler):
        def _drain(self) -> None:
            pass

    p = get_preset("tiny-dense")
    learner = HFLearner(build_model(p, 0), "bf16")
    sampler = NoDrain(build_config(p), "bf16")
    WeightSync().sync(learner, sampler, 1)
    rollouts = _sync_while_decoding(sampler, learner)
    assert any(len(r.weight_versions) > 1 for r in rollouts)
