"""A megatron-core GPTModel in the Qwen3 shape, built from an mxperf model preset.

Qwen3 in Megatron terms: RMSNorm everywhere (eps from the preset), RMSNorm on each head's queries and keys
(``qk_layernorm``, over head_dim), rotary embeddings (non-interleaved, as HF's ``rotate_half``), grouped-query
attention (``num_query_groups`` = KV heads, ``kv_channels`` = head_dim), SwiGLU MLP (``gated_linear_unit`` +
SiLU), no biases, untied or tied LM head as the preset says.

Spec: the **local** spec (Megatron's own ColumnParallelLinear / RowParallelLinear and DotProductAttention) on
CPU; on a GPU the Transformer Engine spec (``te_path.te_layer_spec``; ``MXFP8BlockScaling`` only on Blackwell,
SM 10.x), passed in as ``layer_spec``. Dense presets only: MoE (``tiny-moe``) needs Megatron's SequentialMLP expert
mapping, not done here.

Shapes: Megatron's forward takes ``input_ids`` [B, T], ``position_ids`` [B, T] and a boolean attention mask
[B, 1, T, T] (True = masked) and returns logits [B, T, V]. We pass an explicit causal-and-padding mask and
positions counted from each row's first real token, so left- or right-padded batches give each real token the
same log-prob as the unpadded sequence.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pipeline.engines.megatron.weights import AttentionShape, hf_to_megatron


def attention_shape(preset: Any) -> AttentionShape:
    return AttentionShape(
        num_heads=int(preset.get("num_attention_heads")),
        num_query_groups=int(preset.get("num_key_value_heads")),
        head_dim=int(preset.head_dim),
    )


def transformer_config(preset: Any, dtype: torch.dtype = torch.float32) -> Any:
    """Megatron ``TransformerConfig`` of a dense Qwen3 preset with ``dtype`` parameters and compute."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if preset.is_moe:
        raise ValueError(
            f"the Megatron learner supports dense presets only; {preset.name!r} is MoE (use tiny-dense)"
        )
    return TransformerConfig(
        num_layers=preset.num_layers,
        hidden_size=int(preset.get("hidden_size")),
        num_attention_heads=int(preset.get("num_attention_heads")),
        num_query_groups=int(preset.get("num_key_value_heads")),
        kv_channels=int(preset.head_dim),
        ffn_hidden_size=int(preset.get("intermediate_size")),
        normalization="RMSNorm",
        layernorm_epsilon=float(preset.get("rms_norm_eps")),
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        # The fused kernels are CUDA-only; the unfused paths are the reference math.
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def _rope_theta(preset: Any) -> float:
    rope = preset.config_kwargs.get("rope_parameters") or {}
    return float(rope.get("rope_theta", preset.config_kwargs.get("rope_theta", 10000.0)))


def build_gpt_model(preset: Any, *, dtype: torch.dtype = torch.float32, layer_spec: Any | None = None) -> Any:
    """A Megatron GPTModel of ``preset`` with Megatron's own init (``load_hf_weights`` then sets HF's)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(preset, dtype)
    spec = layer_spec or get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=preset.vocab_size,
        max_sequence_length=int(preset.get("max_position_embeddings")),
        position_embedding_type="rope",
        rotary_base=int(_rope_theta(preset)),
        share_embeddings_and_output_weights=bool(preset.get("tie_word_embeddings")),
        parallel_output=True,
    )


def load_hf_weights(model: Any, hf_state: dict[str, torch.Tensor], preset: Any) -> None:
    """Copy an HF Qwen3 state dict into ``model`` (strict: every Megatron parameter must be covered)."""
    mapped = hf_to_megatron(hf_state, attention_shape(preset), tied=bool(preset.get("tie_word_embeddings")))
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("._extra_state")}
    if any(k.endswith(".layer_norm_weight") for k in own):  # TE spec: pre-norms fused into the next linear
        from pipeline.engines.megatron.te_path import local_to_te_names

        mapped = local_to_te_names(mapped)
    missing, unexpected = sorted(set(own) - set(mapped)), sorted(set(mapped) - set(own))
    if missing or unexpected:
        raise KeyError(f"HF -> Megatron mapping: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, tensor in mapped.items():
            if own[name].shape != tensor.shape:
                raise ValueError(
                    f"{name}: Megatron shape {tuple(own[name].shape)} vs mapped {tuple(tensor.shape)}"
                )
            own[name].copy_(tensor.to(own[name].device))


def masks_and_positions(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] 1/0 padding mask -> (Megatron bool mask [B, 1, T, T], True = masked; position ids [B, T])."""
    valid = attention_mask.bool()
    t = valid.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).triu(1)
    masked = causal[None] | ~valid[:, None, :]
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    return masked[:, None], positions


def forward_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of Megatron ``model`` for a padded batch."""
    mask, positions = masks_and_positions(attention_mask)
    return model(input_ids, positions, mask)
