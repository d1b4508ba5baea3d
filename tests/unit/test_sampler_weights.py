"""The sampler's weight store: vLLM layout, byte-exact loading of grid-matched bytes, online quantization on
its own grid, derived (swizzled) scale copies that the GEMM really reads, fail-stop on incomplete loads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from weight_sync_helpers import tiny_config, tiny_learner, train_a_little

import pipeline.quant as mx
from pipeline.interfaces import pack_weights, scale_name
from pipeline.sampler.weights import (
    IncompleteLoadError,
    SamplerWeights,
    grid_layers,
    sampler_layout,
)
from pipeline.sync.weight_sync import send_quantized_for


def _push(learner, store: SamplerWeights, version: int = 0) -> None:
    tensors = learner.export_weights(send_quantized_for(learner.precision, store.mode, store))
    store.load_weights(pack_weights(tensors, version, grid=learner.precision))


def test_grid_fraction_spreads_layers_evenly_and_rejects_out_of_range():
    assert grid_layers(4, 0.5) == {0, 2}
    assert grid_layers(4, 1.0) == {0, 1, 2, 3}
    assert grid_layers(4, 0.0) == frozenset()
    assert grid_layers(4, 0.25) == {0}
    with pytest.raises(ValueError, match="grid fraction"):
        grid_layers(4, 1.5)


def test_layout_fuses_qkv_and_gate_up_in_vllm_order():
    layout = sampler_layout(tiny_config(), "mxfp8")
    qkv = layout.dests["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == ((4 + 2 + 2) * 16, 64) and qkv.quantized
    rows = {p.source.split(".")[-2]: p.dst_rows for p in layout.pieces if p.dest == qkv.name}
    assert rows == {"q_proj": (0, 64), "k_proj": (64, 96), "v_proj": (96, 128)}
    gu = {
        p.source.split(".")[-2]: p.dst_rows
        for p in layout.pieces
        if p.dest.endswith("0.mlp.gate_up_proj.weight")
    }
    assert gu == {"gate_proj": (0, 96), "up_proj": (96, 192)}
    for name in (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.self_attn.q_norm.weight",
    ):
        assert not layout.dests[name].quantized


def test_moe_layout_has_w13_w2_and_a_bf16_router():
    layout = sampler_layout(tiny_config(moe=True), "mxfp8")
    w13 = layout.dests["model.layers.1.mlp.experts.w13_weight"]
    assert w13.shape == (4, 64, 64) and w13.quantized
    assert layout.dests["model.layers.1.mlp.experts.w2_weight"].shape == (4, 64, 32)
    assert not layout.dests["model.layers.1.mlp.gate.weight"].quantized
    halves = sorted({p.dst_rows for p in layout.pieces if p.dest == w13.name})
    assert halves == [(0, 32), (32, 64)]


def test_grid_matched_bytes_are_stored_byte_for_byte_with_a_swizzled_copy():
    learner = tiny_learner("mxfp8")
    store = SamplerWeights(learner.model.config, "mxfp8")
    _push(learner, store)
    sent = learner.export_weights(lambda n: True)
    a = "model.layers.1.self_attn"
    want = torch.cat([sent[f"{a}.{x}_proj.weight"] for x in "qkv"])
    want_scale = torch.cat([sent[scale_name(f"{a}.{x}_proj.weight")] for x in "qkv"])
    assert torch.equal(store.tensor(f"{a}.qkv_proj.weight_scale"), want_scale)
    assert torch.equal(store.read_back()[f"{a}.qkv_proj.weight"], want)
    assert torch.equal(
        store.tensor(f"{a}.qkv_proj.weight_scale_swizzled"), mx.swizzle_mxfp8_scales(want_scale)
    )


def test_bf16_sent_to_another_grid_is_quantized_online_with_the_samplers_rule():
    learner = tiny_learner("mxfp8")
    store = SamplerWeights(learner.model.config, "mxfp8-floor")
    _push(learner, store)
    bf16 = learner.export_weights(lambda n: False)
    m = "model.layers.0.mlp"
    fused = torch.cat([bf16[f"{m}.gate_proj.weight"], bf16[f"{m}.up_proj.weight"]])
    q = mx.quantize_mxfp8(fused, -1, rule="floor")
    got = store.read_back()
    assert torch.equal(got[f"{m}.gate_up_proj.weight"], q.data)
    assert torch.equal(got[f"{m}.gate_up_proj.weight_scale"], q.scale)


@pytest.mark.parametrize("mode", ["fp8-tensor", "fp8-block128", "fp8-rowwise", "mxfp8", "bf16"])
def test_linear_matches_the_learners_weights_within_grid_error(mode):
    learner = tiny_learner("bf16")
    store = SamplerWeights(learner.model.config, mode)
    _push(learner, store)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    attn = learner.model.model.layers[0].self_attn
    w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
    ref = F.linear(x.float(), w.float())
    got = store.linear("model.layers.0.self_attn.qkv_proj", x).float()
    rel = float((got - ref).norm() / ref.norm())
    assert rel < (0.01 if mode == "bf16" else 0.1)
    if mode != "bf16":
        assert rel > 1e-4  # activations and weights really were on the grid


def test_a_stale_derived_scale_copy_changes_the_output():
    learner = tiny_learner("mxfp8")
    store = SamplerWeights(learner.model.config, "mxfp8")
    _push(learner, store, 0)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    prefix = "model.layers.0.self_attn.o_proj"
    fresh = store.linear(prefix, x)
    store.process_weights_after_loading = lambda: None  # skip the rebuild from now on
    with torch.no_grad():
        learner.model.model.layers[0].self_attn.o_proj.weight.mul_(2.0)  # same bytes, every scale byte +1
    _push(learner, store, 1)
    assert torch.equal(store.linear(prefix, x), fresh)  # bytes doubled, kernel still reads old scales
    SamplerWeights.process_weights_after_loading(store)
    assert torch.allclose(store.linear(prefix, x).float(), 2 * fresh.float(), rtol=0.05, atol=1e-3)


def test_incomplete_load_raises_and_the_store_refuses_to_compute():
    learner = tiny_learner("mxfp8")
    store = SamplerWeights(learner.model.config, "mxfp8")
    tensors = learner.export_weights(send_quantized_for("mxfp8", "mxfp8", store))
    del (
        tensors["model.layers.1.mlp.down_proj.weight"],
        tensors[scale_name("model.layers.1.mlp.down_proj.weight")],
    )
    with pytest.raises(IncompleteLoadError, match="down_proj"):
        store.load_weights(pack_weights(tensors, 3, grid="mxfp8"))
    with pytest.raises(IncompleteLoadError):
        store.linear("model.layers.0.self_attn.o_proj", torch.randn(2, 64))


def test_unmapped_payload_name_fails_the_load():
    learner = tiny_learner("bf16")
    store = SamplerWeights(learner.model.config, "bf16")
    tensors = learner.export_weights(lambda n: False)
    tensors["model.layers.0.mlp.experts.0.gate_proj.weight"] = torch.zeros(4, 64)
    with pytest.raises(IncompleteLoadError, match="map to no sampler tensor"):
        store.load_weights(pack_weights(tensors, 0))


def test_store_starts_as_nan_before_any_load():
    store = SamplerWeights(tiny_config(), "mxfp8")
    raw = store.read_back()
    assert bool((raw["model.layers.0.self_attn.qkv_proj.weight"] == 0x7F).all())
    assert bool(torch.isnan(raw["model.embed_tokens.weight"].float()).all())


def test_experts_match_the_hf_moe_block():
    learner = tiny_learner("bf16", moe=True)
    train_a_little(learner)
    store = SamplerWeights(learner.model.config, "bf16")
    _push(learner, store)
    mlp = learner.model.model.layers[0].mlp
    x = torch.randn(7, 64)
    with torch.no_grad():
        ref = mlp(x[None]).reshape(7, 64)
        _, topk_w, topk_ids = mlp.gate(x)
    got = store.experts(0, x.to(torch.bfloat16), topk_ids, topk_w.to(torch.bfloat16)).float()
    assert float((got - ref).norm() / ref.norm()) < 0.02


def test_tied_embeddings_share_one_tensor_and_skip_lm_head():
    learner = tiny_learner("bf16", tie=True)
    store = SamplerWeights(learner.model.config, "bf16")
    assert "lm_head.weight" not in store.dests
    tensors = learner.export_weights(lambda n: False)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    store.load_weights(pack_weights(tensors, 0))
    assert torch.equal(store.tensor("lm_head.weight"), store.tensor("model.embed_tokens.weight"))
