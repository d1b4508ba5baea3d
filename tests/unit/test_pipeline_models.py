"""Model presets: sizes, FLOPs, seeded init, bad ids."""

from __future__ import annotations

import pytest
import torch

from pipeline.model.presets import PRESETS, build_model, count_params, flops_per_token, get_preset
from tracing.outputs.errors import InputError


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_counted_params_equal_the_instantiated_model(name):
    p = get_preset(name)
    model = build_model(p, seed=0)
    assert count_params(p) == sum(t.numel() for t in model.parameters())


def test_real_presets_have_their_published_sizes():
    assert count_params(get_preset("qwen3-8b")) == pytest.approx(8.19e9, rel=0.01)
    moe = get_preset("qwen3-30b-a3b")
    assert count_params(moe) == pytest.approx(30.5e9, rel=0.01)
    assert count_params(moe, active=True) == pytest.approx(3.35e9, rel=0.02)


def test_moe_active_params_count_only_routed_experts():
    p = get_preset("tiny-moe")
    assert count_params(p, active=True) < count_params(p)
    dense = get_preset("tiny-dense")
    assert count_params(dense, active=True) == count_params(dense)


def test_flops_per_token_training_is_three_forwards_and_grows_with_attention_span():
    p = get_preset("qwen3-8b")
    assert flops_per_token(p, 4096) == pytest.approx(3 * flops_per_token(p, 4096, training=False))
    assert flops_per_token(p, 8192) > flops_per_token(p, 1024)
    # 6N rule of thumb, within the attention term at short sequences
    assert flops_per_token(p, 1) == pytest.approx(6 * 7.6e9, rel=0.05)


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_quantized_dims_are_multiples_of_an_mxfp8_block(name):
    model = build_model(get_preset(name), seed=0)
    for pname, t in model.named_parameters():
        if t.ndim >= 2 and "embed" not in pname and not pname.endswith("mlp.gate.weight"):  # router: BF16
            assert t.shape[-1] % 32 == 0 and t.shape[-2] % 32 == 0, pname


def test_init_is_identical_per_seed_and_differs_across_seeds():
    p = get_preset("tiny-dense")
    a, b, c = build_model(p, 3), build_model(p, 3), build_model(p, 4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_unknown_model_and_shape_only_build_are_input_errors():
    with pytest.raises(InputError, match="unknown model"):
        get_preset("llama-7b")
    with pytest.raises(InputError, match="shape-only"):
        build_model(get_preset("qwen3-8b"))
    assert set(PRESETS) == {"tiny-dense", "tiny-moe", "qwen3-8b", "qwen3-8b-2l", "qwen3-30b-a3b"}


def test_the_gpu_check_preset_has_qwen3_8b_layers_and_the_task_vocabulary():
    big, small = get_preset("qwen3-8b"), get_preset("qwen3-8b-2l")
    layer_keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    )
    assert all(big.get(k) == small.get(k) for k in layer_keys)
    assert (small.num_layers, small.vocab_size, small.shape_only) == (2, 512, False)
    h, i, q, kv = 4096, 12288, 32 * 128, 8 * 128
    per_layer = 2 * h * q + 2 * h * kv + 2 * 128 + 3 * h * i + 2 * h  # q, o, k, v, q/k norms, MLP, 2 norms
    assert count_params(small) == 2 * per_layer + 2 * 512 * h + h  # embedding, LM head, final norm
