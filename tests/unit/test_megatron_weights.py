"""Megatron <-> HF weight layout mapping (pure tensors; no megatron import)."""

from __future__ import annotations

import pytest
import torch

from pipeline.engines.megatron.weights import (
    AttentionShape,
    hf_to_megatron,
    megatron_to_hf,
    merge_qkv,
    split_qkv,
)

SHAPE = AttentionShape(num_heads=4, num_query_groups=2, head_dim=3)


def _hf_layer(hidden: int = 5, inter: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    d, nq, nkv = SHAPE.head_dim, SHAPE.num_heads, SHAPE.num_query_groups
    shapes = {
        "model.embed_tokens.weight": (7, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (7, hidden),
        "model.layers.0.input_layernorm.weight": (hidden,),
        "model.layers.0.post_attention_layernorm.weight": (hidden,),
        "model.layers.0.self_attn.q_proj.weight": (nq * d, hidden),
        "model.layers.0.self_attn.k_proj.weight": (nkv * d, hidden),
        "model.layers.0.self_attn.v_proj.weight": (nkv * d, hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, nq * d),
        "model.layers.0.self_attn.q_norm.weight": (d,),
        "model.layers.0.self_attn.k_norm.weight": (d,),
        "model.layers.0.mlp.gate_proj.weight": (inter, hidden),
        "model.layers.0.mlp.up_proj.weight": (inter, hidden),
        "model.layers.0.mlp.down_proj.weight": (hidden, inter),
    }
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_linear_qkv_rows_are_grouped_q_then_k_then_v() -> None:
    d = SHAPE.head_dim
    q = torch.arange(4 * d).float()[:, None] + 100  # rows tagged by origin
    k = torch.arange(2 * d).float()[:, None] + 200
    v = torch.arange(2 * d).float()[:, None] + 300
    fused = merge_qkv(q, k, v, SHAPE)[:, 0].tolist()
    # group 0: q heads 0,1 ; k head 0 ; v head 0 -- then group 1.
    expect = [*range(100, 100 + 2 * d), *range(200, 200 + d), *range(300, 300 + d)]
    expect += [*range(100 + 2 * d, 100 + 4 * d), *range(200 + d, 200 + 2 * d), *range(300 + d, 300 + 2 * d)]
    assert fused == [float(x) for x in expect]
    q2, k2, v2 = split_qkv(merge_qkv(q, k, v, SHAPE), SHAPE)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


def test_hf_megatron_round_trip_is_exact() -> None:
    hf = _hf_layer()
    meg = hf_to_megatron(hf, SHAPE, tied=False)
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in meg
    assert "decoder.layers.0.mlp.linear_fc1.weight" in meg
    back = megatron_to_hf(meg, SHAPE)
    assert sorted(back) == sorted(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_tied_model_exports_no_lm_head() -> None:
    hf = _hf_layer()
    meg = hf_to_megatron(hf, SHAPE, tied=True)
    assert "output_layer.weight" not in meg
    assert "lm_head.weight" not in megatron_to_hf(meg, SHAPE)


@pytest.mark.parametrize("fault", ["naive_qkv_split", "swap_gate_up"])
def test_export_faults_keep_shapes_but_change_values(fault: str) -> None:
    hf = _hf_layer()
    bad = megatron_to_hf(hf_to_megatron(hf, SHAPE, tied=False), SHAPE, fault=fault)
    assert all(bad[k].shape == hf[k].shape for k in hf)
    assert any(not torch.equal(bad[k], hf[k]) for k in hf)


def test_unknown_megatron_tensor_is_named_in_the_error() -> None:
    with pytest.raises(KeyError, match="mystery"):
        megatron_to_hf({"decoder.layers.0.mystery.weight": torch.zeros(1)}, SHAPE)
    with pytest.raises(ValueError, match="unknown Megatron export fault"):
        megatron_to_hf({}, SHAPE, fault="nope")
