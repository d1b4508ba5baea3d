"""The sampler's own Qwen3 (dense and MoE) forward: incremental decoding over a KV cache, in BF16.

This is deliberately *not* the learner's code path. Like a real inference engine (vLLM), it:

- holds no ``nn.Module``: every GEMM goes through the weight store (``SamplerWeights.linear``), which owns
  the weights in the sampler's layout (fused ``qkv_proj`` and ``gate_up_proj``, FP8 bytes + scales) and
  quantizes activations on the sampler's grid; norms, router, embedding and LM head are BF16 tensors;
- keeps the residual stream in BF16 (the learner's mixed precision keeps float32 residuals);
- computes attention by hand over a KV cache (BF16, or FP8 E4M3 with one fp32 scale per layer for K and
  for V), one new token per step, so its reductions run in a different order and shape than the learner's
  full-sequence SDPA.

Tensor legend: B batch rows, S new tokens this call, C cache columns, H hidden, Nq/Nkv heads, D head dim.
The cache is left-aligned per batch: column j of row b holds the token at column j of that row's
(left-padded) sequence; ``valid_BC`` masks padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FP8_MAX = 448.0


@dataclass(frozen=True)
class Dims:
    """The shapes the forward needs, read from a transformers Qwen3 / Qwen3-MoE config."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_theta: float
    moe: bool
    top_k: int
    norm_topk_prob: bool

    @classmethod
    def from_config(cls, config: Any) -> Dims:
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        moe = getattr(config, "num_experts", 0) and config.model_type == "qwen3_moe"
        return cls(
            num_layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            vocab=config.vocab_size,
            rms_eps=config.rms_norm_eps,
            rope_theta=theta,
            moe=bool(moe),
            top_k=int(getattr(config, "num_experts_per_tok", 0) or 0),
            norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
        )


class KVCache:
    """Per-layer K/V for B rows x C columns, BF16 or FP8 (E4M3 codes + per-layer fp32 scales)."""

    def __init__(
        self,
        dims: Dims,
        batch: int,
        columns: int,
        *,
        fp8: bool,
        k_scales: list[float] | None = None,
        v_scales: list[float] | None = None,
        track_amax: bool = False,
        device: Any = None,
    ) -> None:
        dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        shape = (batch, dims.num_kv_heads, columns, dims.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.num_layers)]
        self.valid_BC = torch.zeros(batch, columns, dtype=torch.bool, device=device)
        self.fp8 = fp8
        self.k_scales = list(k_scales) if k_scales else [1.0] * dims.num_layers
        self.v_scales = list(v_scales) if v_scales else [1.0] * dims.num_layers
        self.track_amax = track_amax  # KV-scale calibration only: a host sync per write
        self.observed_amax_k = [0.0] * dims.num_layers
        self.observed_amax_v = [0.0] * dims.num_layers

    def _encode(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        if not self.fp8:
            return x.to(torch.bfloat16)
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    def _decode(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return (x.float() * scale).to(torch.bfloat16) if self.fp8 else x

    def write(self, layer: int, col0: int, k: torch.Tensor, v: torch.Tensor) -> None:
        s = k.shape[2]
        if self.track_amax:
            self.observed_amax_k[layer] = max(self.observed_amax_k[layer], float(k.float().abs().max()))
            self.observed_amax_v[layer] = max(self.observed_amax_v[layer], float(v.float().abs().max()))
        self.k[layer][:, :, col0 : col0 + s] = self._encode(k, self.k_scales[layer])
        self.v[layer][:, :, col0 : col0 + s] = self._encode(v, self.v_scales[layer])

    def read(self, layer: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = self._decode(self.k[layer][:, :, :columns], self.k_scales[layer])
        v = self._decode(self.v[layer][:, :, :columns], self.v_scales[layer])
        return k, v


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, output BF16 (weight applied after the downcast, as Qwen3's)."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    return weight.to(torch.bfloat16) * y


def rope(x: torch.Tensor, positions_BS: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) on x [B, N, S, D] at integer positions [B, S]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions_BS.float()[..., None] * inv_freq  # [B, S, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible_BSC: torch.Tensor) -> torch.Tensor:
    """q [B, Nq, S, D], k/v [B, Nkv, C, D] BF16 -> [B, S, Nq*D]; BF16 matmuls, float32 softmax."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~visible_BSC[:, None], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
    out = torch.matmul(probs, v)  # [B, Nq, S, D]
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def linear_prefix(layer: int, name: str) -> str:
    """Sampler-layout name of a fused linear: qkv_proj, o_proj, gate_up_proj, down_proj."""
    group = "self_attn" if name in ("qkv_proj", "o_proj") else "mlp"
    return f"model.layers.{layer}.{group}.{name}"


def forward(
    weights: Any,
    dims: Dims,
    ids_BS: torch.Tensor,
    positions_BS: torch.Tensor,
    token_valid_BS: torch.Tensor,
    cache: KVCache,
    col0: int,
) -> torch.Tensor:
    """Run S new tokens per row through the model, writing their K/V at cache columns [col0, col0+S).

    Returns float32 logits [B, S, V]. Query i of a row sees cache columns <= col0 + i that are valid.
    """
    b, s = ids_BS.shape
    cache.valid_BC[:, col0 : col0 + s] = token_valid_BS
    columns = col0 + s
    dev = ids_BS.device
    causal_SC = torch.arange(columns, device=dev)[None, :] <= (col0 + torch.arange(s, device=dev))[:, None]
    visible_BSC = causal_SC[None] & cache.valid_BC[:, None, :columns]
    h = weights.tensor("model.embed_tokens.weight").to(torch.bfloat16)[ids_BS]  # [B, S, H]
    nq, nkv, d = dims.num_heads, dims.num_kv_heads, dims.head_dim
    for layer in range(dims.num_layers):
        pre = f"model.layers.{layer}"
        x = rms_norm(h, weights.tensor(f"{pre}.input_layernorm.weight"), dims.rms_eps)
        qkv = weights.linear(linear_prefix(layer, "qkv_proj"), x.reshape(b * s, -1)).to(torch.bfloat16)
        q, k, v = qkv.view(b, s, -1).split([nq * d, nkv * d, nkv * d], dim=-1)
        q = rms_norm(q.reshape(b, s, nq, d), weights.tensor(f"{pre}.self_attn.q_norm.weight"), dims.rms_eps)
        k = rms_norm(k.reshape(b, s, nkv, d), weights.tensor(f"{pre}.self_attn.k_norm.weight"), dims.rms_eps)
        q = rope(q.transpose(1, 2), positions_BS, dims.rope_theta)
        k = rope(k.transpose(1, 2), positions_BS, dims.rope_theta)
        cache.write(layer, col0, k, v.reshape(b, s, nkv, d).transpose(1, 2))
        k_all, v_all = cache.read(layer, columns)
        attn = attention(q, k_all, v_all, visible_BSC)
        o = weights.linear(linear_prefix(layer, "o_proj"), attn.reshape(b * s, -1)).to(torch.bfloat16)
        h = h + o.view(b, s, -1)
        x = rms_norm(h, weights.tensor(f"{pre}.post_attention_layernorm.weight"), dims.rms_eps).reshape(
            b * s, -1
        )
        mlp = _moe(weights, dims, layer, x) if dims.moe else _dense_mlp(weights, layer, x)
        h = h + mlp.to(torch.bfloat16).view(b, s, -1)
    h = rms_norm(h, weights.tensor("model.norm.weight"), dims.rms_eps)
    logits = torch.matmul(h, weights.tensor("lm_head.weight").to(torch.bfloat16).t())
    return logits.float()


def _dense_mlp(weights: Any, layer: int, x: torch.Tensor) -> torch.Tensor:
    gate, up = weights.linear(linear_prefix(layer, "gate_up_proj"), x).to(torch.bfloat16).chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * up
    return weights.linear(linear_prefix(layer, "down_proj"), act)


def _moe(weights: Any, dims: Dims, layer: int, x: torch.Tensor) -> torch.Tensor:
    """BF16 router -> float32 softmax -> top-k (renormalised if configured) -> the store's fused experts."""
    router = weights.tensor(f"model.layers.{layer}.mlp.gate.weight").to(torch.bfloat16)
    probs = torch.softmax(torch.matmul(x, router.t()).float(), dim=-1)
    topk_w, topk_ids = torch.topk(probs, dims.top_k, dim=-1)
    if dims.norm_topk_prob:
        topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
    return weights.experts(layer, x, topk_ids, topk_w.to(torch.bfloat16))
