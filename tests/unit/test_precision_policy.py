"""The precision policy keeps Megatron+TE's BF16 modules in BF16 and converts the rest of real HF models."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from pipeline.quant import (
    MXFP8Linear,
    PrecisionPolicy,
    QuantExperts,
    QuantLinear,
    convert_linears,
    dequantize_mxfp8,
    quantize_mxfp8,
)

BF16 = torch.bfloat16
COMMON = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, max_position_embeddings=64,
)  # fmt: skip


def _dense() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(intermediate_size=96, **COMMON)).to(BF16).eval()


def _moe() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **COMMON)
    return Qwen3MoeForCausalLM(cfg).to(BF16).eval()


@pytest.mark.parametrize(
    ("name", "quantized"),
    [
        ("model.layers.1.self_attn.q_proj", True),
        ("model.layers.1.self_attn.o_proj.weight", True),
        ("model.layers.1.mlp.gate_proj", True),  # dense MLP GEMM, not a router
        ("model.layers.1.mlp.experts", True),
        ("model.layers.1.mlp.experts.gate_up_proj", True),
        ("model.layers.1.mlp.gate", False),  # Qwen3-MoE router
        ("model.layers.1.mlp.gate.weight", False),
        ("model.layers.1.mlp.shared_expert_gate", False),
        ("model.layers.1.self_attn.q_proj.bias", False),
        ("model.layers.1.self_attn.q_norm", False),
        ("model.layers.1.input_layernorm.weight", False),
        ("model.norm", False),
        ("model.embed_tokens", False),
        ("lm_head", False),
    ],
)
def test_is_quantized_follows_megatron_te_policy(name, quantized):
    assert PrecisionPolicy("mxfp8").is_quantized(name) is quantized
    assert PrecisionPolicy("bf16").is_quantized(name) is False


def test_first_and_last_layers_stay_bf16_when_asked():
    policy = PrecisionPolicy("mxfp8", bf16_first_layers=1, bf16_last_layers=1, num_layers=4)
    flags = [policy.is_quantized(f"model.layers.{i}.mlp.down_proj") for i in range(4)]
    assert flags == [False, True, True, False]
    with pytest.raises(ValueError, match="num_layers"):
        PrecisionPolicy("mxfp8", bf16_last_layers=1).is_quantized("model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match="valid ids"):
        PrecisionPolicy("fp4")
    with pytest.raises(ValueError, match="bf16_first_layers"):
        PrecisionPolicy("mxfp8", bf16_first_layers=-1)


def test_convert_dense_qwen3_replaces_exactly_the_decoder_gemms():
    model = _dense()
    names_before = list(model.state_dict())
    ids = torch.randint(0, 128, (2, 11))
    with torch.no_grad():
        ref = model(input_ids=ids).logits.float()
    converted = convert_linears(model, PrecisionPolicy("mxfp8", bf16_last_layers=1), BF16)
    projs = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]  # fmt: skip
    assert converted == [f"model.layers.{i}.{p}" for i in range(2) for p in projs]
    assert list(model.state_dict()) == names_before
    assert all(isinstance(model.get_submodule(n), MXFP8Linear) for n in converted)
    assert type(model.model.layers[2].mlp.gate_proj) is torch.nn.Linear
    assert type(model.lm_head) is torch.nn.Linear
    with torch.no_grad():
        got = model(input_ids=ids).logits.float()
    assert not torch.equal(got, ref)
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.99
    assert convert_linears(model, PrecisionPolicy("mxfp8", bf16_last_layers=1), BF16) == converted


def test_convert_qwen3_moe_quantizes_experts_but_not_the_router():
    model = _moe()
    converted = convert_linears(model, PrecisionPolicy("mxfp8"), BF16)
    assert "model.layers.0.mlp.experts" in converted
    assert not any(n.endswith("mlp.gate") for n in converted)
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp.experts, QuantExperts) and not isinstance(mlp.gate, QuantLinear)
    q = mlp.experts.quantized_weights()
    assert q["gate_up_proj"].data.shape == (4, 64, 64) and q["gate_up_proj"].scale.shape == (4, 64, 2)
    ref = quantize_mxfp8(mlp.experts.down_proj.detach())
    assert torch.equal(q["down_proj"].data, ref.data) and torch.equal(q["down_proj"].scale, ref.scale)
    ids = torch.randint(0, 128, (2, 9))
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert mlp.experts.gate_up_proj.grad is not None and mlp.experts.gate_up_proj.grad.abs().sum() > 0
    assert mlp.gate.weight.grad is not None  # the BF16 router still trains


def test_quant_experts_equal_a_hand_composition_for_one_expert():
    model = _moe()
    experts = model.model.layers[0].mlp.experts
    qe = QuantExperts(experts, "mxfp8", BF16)
    x = torch.randn(5, 64).to(BF16)
    idx = torch.full((5, 1), 2)
    w = torch.ones(5, 1, dtype=BF16)

    def deq(t, axis=-1):
        return dequantize_mxfp8(quantize_mxfp8(t, axis), BF16)

    gate, up = torch.nn.functional.linear(deq(x), deq(experts.gate_up_proj[2].detach())).chunk(2, -1)
    h = experts.act_fn(gate) * up
    expected = torch.nn.functional.linear(deq(h), deq(experts.down_proj[2].detach()))
    with torch.no_grad():
        assert torch.equal(qe(x, idx, w), expected)
