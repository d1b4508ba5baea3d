"""Model presets: Qwen3 configs built locally (no downloads), their sizes and their FLOPs per token.

Five presets, each a function returning a frozen :class:`ModelPreset`:

- ``tiny-dense``: Qwen3ForCausalLM, 4 layers, hidden 256 -- about 2.6 M parameters, trains on a CPU.
- ``tiny-moe``: Qwen3MoeForCausalLM, 4 layers, 8 experts, top-2 routing.
- ``qwen3-8b-2l``: two decoder layers of Qwen3-8B (hidden 4096, 32/8 heads of 128, MLP 12288) over the task's
  512-token vocabulary -- 390 M parameters: Qwen3-8B's per-layer GEMM shapes in a model a GPU sweep can train
  (``benchmarks/gpu_check.sh``); built locally like the tiny ones.
- ``qwen3-8b`` and ``qwen3-30b-a3b``: the published configs, **shape-only** (for the cost model's FLOPs and
  parameter counts; :func:`build_model` refuses to instantiate them).

Every dimension a linear layer quantizes along is a multiple of 32 (one MXFP8 block).

FLOPs per token (the convention of Kaplan et al. / PaLM appendix B), with N the parameters that take part
in a token's matmuls (embedding lookup excluded, LM head included, MoE: only the routed top-k experts and the
router), L layers, H query heads of dimension d, sequence length T:

    forward   = 2 N + 4 L H d T          (QK^T and AV each cost 2 H d T per token and layer)
    training  = 3 x forward              (backward = 2 x forward)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracing.outputs.errors import InputError


@dataclass(frozen=True)
class ModelPreset:
    """A named Qwen3 configuration. ``config_kwargs`` go to Qwen3Config / Qwen3MoeConfig unchanged."""

    name: str
    arch: str  # "qwen3" | "qwen3_moe"
    config_kwargs: dict[str, Any] = field(default_factory=dict)
    shape_only: bool = False

    def __post_init__(self) -> None:
        if self.arch not in ("qwen3", "qwen3_moe"):
            raise ValueError(f"arch must be 'qwen3' or 'qwen3_moe', got {self.arch!r}")

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3_moe"

    def get(self, key: str) -> Any:
        return self.config_kwargs[key]

    @property
    def head_dim(self) -> int:
        return int(
            self.config_kwargs.get("head_dim", self.get("hidden_size") // self.get("num_attention_heads"))
        )

    @property
    def vocab_size(self) -> int:
        return int(self.get("vocab_size"))

    @property
    def num_layers(self) -> int:
        return int(self.get("num_hidden_layers"))


def _tiny_common() -> dict[str, Any]:
    return {
        "vocab_size": 512,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "initializer_range": 0.02,
        "attention_bias": False,
    }


def tiny_dense() -> ModelPreset:
    return ModelPreset("tiny-dense", "qwen3", _tiny_common())


def tiny_moe() -> ModelPreset:
    kw = _tiny_common() | {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
    }
    return ModelPreset("tiny-moe", "qwen3_moe", kw)


def qwen3_8b() -> ModelPreset:
    kw = {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    }
    return ModelPreset("qwen3-8b", "qwen3", kw, shape_only=True)


def qwen3_8b_2l() -> ModelPreset:
    kw = qwen3_8b().config_kwargs | {
        "vocab_size": 512,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "attention_bias": False,
    }
    return ModelPreset("qwen3-8b-2l", "qwen3", kw)


def qwen3_30b_a3b() -> ModelPreset:
    kw = {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    }
    return ModelPreset("qwen3-30b-a3b", "qwen3_moe", kw, shape_only=True)


PRESETS: dict[str, Callable[[], ModelPreset]] = {
    "tiny-dense": tiny_dense,
    "tiny-moe": tiny_moe,
    "qwen3-8b": qwen3_8b,
    "qwen3-8b-2l": qwen3_8b_2l,
    "qwen3-30b-a3b": qwen3_30b_a3b,
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``; an unknown id raises InputError listing the known ones."""
    if name not in PRESETS:
        runs = [n for n, make in PRESETS.items() if not make().shape_only]
        shapes = [n for n in PRESETS if n not in runs]
        raise InputError(
            f"unknown model {name!r}; runs and sweeps take {', '.join(runs[:-1])} or {runs[-1]} "
            f"({', '.join(shapes)}: shape-only, for FLOP and parameter counts)"
        )
    return PRESETS[name]()


def _is_moe_layer(p: ModelPreset, layer: int) -> bool:
    kw = p.config_kwargs
    return (
        p.is_moe
        and layer not in kw.get("mlp_only_layers", [])
        and (layer + 1) % kw.get("decoder_sparse_step", 1) == 0
    )


def count_params(p: ModelPreset, *, active: bool = False) -> int:
    """Parameters of the preset (``active``: only the top-k routed experts of each MoE layer count)."""
    h, v, d = p.get("hidden_size"), p.vocab_size, p.head_dim
    nq, nkv = p.get("num_attention_heads"), p.get("num_key_value_heads")
    attn = h * nq * d + 2 * h * nkv * d + nq * d * h + 2 * d  # q,k,v,o + q_norm,k_norm
    total = v * h * (1 if p.get("tie_word_embeddings") else 2) + h  # embed, lm_head, final norm
    for layer in range(p.num_layers):
        total += attn + 2 * h  # two RMSNorms
        if _is_moe_layer(p, layer):
            e, k, i = p.get("num_experts"), p.get("num_experts_per_tok"), p.get("moe_intermediate_size")
            total += e * h + (k if active else e) * 3 * h * i
        else:
            total += 3 * h * p.get("intermediate_size")
    return int(total)


def matmul_params_per_token(p: ModelPreset) -> int:
    """Weights that multiply each token: active params minus the embedding lookup and the norm vectors."""
    h = p.get("hidden_size")
    norms = p.num_layers * (2 * h + 2 * p.head_dim) + h
    embed = p.vocab_size * h
    return count_params(p, active=True) - norms - embed


def flops_per_token(p: ModelPreset, seq_len: int, *, training: bool = True) -> float:
    """Model FLOPs per token at sequence length ``seq_len`` (see the module docstring)."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    attn = 4 * p.num_layers * p.get("num_attention_heads") * p.head_dim * seq_len
    forward = 2 * matmul_params_per_token(p) + attn
    return float(3 * forward if training else forward)


def build_config(p: ModelPreset) -> Any:
    """The transformers config of the preset (no download: built from keyword arguments)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    cls = Qwen3MoeConfig if p.is_moe else Qwen3Config
    return cls(**p.config_kwargs)


def require_trainable(p: ModelPreset) -> ModelPreset:
    """``p``, or InputError when it is shape-only (checked before a run or sweep creates its directory)."""
    if p.shape_only:
        raise InputError(
            f"model {p.name!r} is shape-only (for FLOP and parameter counts); use tiny-dense or tiny-moe"
        )
    return p


def build_model(p: ModelPreset, seed: int = 0) -> Any:
    """A randomly initialised float32 model, identical for identical (preset, seed)."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    require_trainable(p)
    config = build_config(p)
    config._attn_implementation = "sdpa"
    cls = Qwen3MoeForCausalLM if p.is_moe else Qwen3ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.float().eval()
