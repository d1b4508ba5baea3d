"""Weight sync: bytes that own their data, version metadata, what is sent for each pairing, fail-stop."""

from __future__ import annotations

import pytest
import torch
from weight_sync_helpers import tiny_config, tiny_learner, tiny_sampler

from pipeline.interfaces import SamplingParams, pack_weights, unpack_weights
from pipeline.sampler.weights import SamplerWeights
from pipeline.sync.weight_sync import SyncError, WeightSync, send_quantized_for


def test_pack_unpack_roundtrip_carries_version_and_grid_and_copies_data():
    src = {
        "a.weight": torch.arange(64, dtype=torch.uint8).reshape(2, 32),
        "b": torch.ones(3, dtype=torch.bfloat16),
    }
    payload = pack_weights(src, 7, grid="mxfp8")
    src["a.weight"][0, 0] = 255  # the learner keeps training: the bytes already sent must not change
    tensors, meta = unpack_weights(payload)
    assert meta["version"] == 7 and meta["grid"] == "mxfp8"
    assert int(tensors["a.weight"][0, 0]) == 0
    assert tensors["b"].dtype == torch.bfloat16 and torch.equal(
        tensors["b"], torch.ones(3, dtype=torch.bfloat16)
    )


def test_unpack_rejects_foreign_safetensors_and_garbage():
    from safetensors.torch import save

    with pytest.raises(ValueError, match="not an mxperf weight payload"):
        unpack_weights(save({"x": torch.zeros(2)}))
    with pytest.raises(ValueError, match="too short"):
        unpack_weights(b"abc")


@pytest.mark.parametrize(
    ("learner", "sampler", "fraction", "name", "expected"),
    [
        ("mxfp8", "mxfp8", 1.0, "model.layers.0.self_attn.q_proj.weight", True),
        ("mxfp8", "mxfp8", 1.0, "model.layers.1.mlp.down_proj.weight", True),
        ("mxfp8", "mxfp8", 0.5, "model.layers.1.mlp.down_proj.weight", False),  # layer 1 off the grid
        ("mxfp8", "mxfp8", 1.0, "lm_head.weight", False),
        ("mxfp8", "mxfp8", 1.0, "model.embed_tokens.weight", False),
        ("mxfp8", "mxfp8-floor", 1.0, "model.layers.0.self_attn.q_proj.weight", False),  # another grid: BF16
        ("mxfp8", "fp8-block128", 1.0, "model.layers.0.self_attn.q_proj.weight", False),
        ("bf16", "mxfp8", 1.0, "model.layers.0.self_attn.q_proj.weight", False),
    ],
)
def test_quantized_bytes_travel_only_to_a_sampler_on_the_learners_grid(
    learner, sampler, fraction, name, expected
):
    store = SamplerWeights(tiny_config(), sampler, fraction)
    assert send_quantized_for(learner, sampler, store)(name) is expected


def test_router_is_never_sent_quantized():
    store = SamplerWeights(tiny_config(moe=True), "mxfp8")
    decide = send_quantized_for("mxfp8", "mxfp8", store)
    assert not decide("model.layers.0.mlp.gate.weight")
    assert decide("model.layers.0.mlp.experts.gate_up_proj")


def test_sync_reports_sizes_and_bumps_the_engine_version():
    learner = tiny_learner("mxfp8")
    engine = tiny_sampler(learner, "mxfp8")
    report = WeightSync().sync(learner, engine, 0)
    assert engine.weight_version == 0
    assert report.num_quantized == 14  # 7 linears x 2 layers
    assert report.payload_bytes > 0 and report.total_s > 0


def test_failed_sync_is_fail_stop_and_keeps_the_version():
    learner = tiny_learner("mxfp8")
    engine = tiny_sampler(learner, "mxfp8")
    sync = WeightSync()
    sync.sync(learner, engine, 0)

    class DropOne(WeightSync):
        def transform(self, tensors):
            return {k: v for k, v in tensors.items() if "layers.1.self_attn.o_proj" not in k}

    with pytest.raises(SyncError, match="stays at version 0"):
        DropOne().sync(learner, engine, 1)
    assert engine.weight_version == 0
    with pytest.raises(RuntimeError):  # the engine refuses to serve after a failed load
        engine.generate([[3, 4, 5]], SamplingParams(max_new_tokens=2))


def test_sync_refuses_a_version_that_is_not_newer():
    learner = tiny_learner("bf16")
    engine = tiny_sampler(learner, "bf16")
    WeightSync().sync(learner, engine, 3)
    with pytest.raises(SyncError, match="newer"):
        WeightSync().sync(learner, engine, 3)
