"""Megatron-core <-> Hugging Face (Qwen3) weight names and layouts. Pure functions on state dicts.

Megatron fuses two projections that Hugging Face keeps apart:

``linear_qkv`` is **query-group interleaved** (not [Q; K; V]). With G query groups (= KV heads), n = heads / G
query heads per group and head dim d, its rows are, for g = 0 .. G-1::

    [ q rows of heads g*n .. g*n+n-1  (n*d) | k rows of group g (d) | v rows of group g (d) ]

so a view ``[G, n+2, d, hidden]`` splits into q ``[:, :n]``, k ``[:, n]``, v ``[:, n+1]``. Reading it as a
plain [Q; K; V] concatenation gives tensors of the right shapes and the wrong values (the fault
``naive_qkv_split`` reproduces that; a log-prob comparison against the learner catches it).

``linear_fc1`` with a gated linear unit is ``[gate; up]`` along the output dim: Megatron computes
``silu(x @ gate.T) * (x @ up.T)`` from ``chunk(fc1(x), 2, -1)``, the same order as vLLM's ``gate_up_proj``.

Other names map one to one (``pre_mlp_layernorm`` is HF's ``post_attention_layernorm``; q/k layernorms are
``q_norm`` / ``k_norm``). With tied embeddings there is no ``output_layer`` and no ``lm_head.weight`` is
exported (HF and vLLM tie them on load).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_ONE_TO_ONE_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_ONE_TO_ONE_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
FAULTS = ("naive_qkv_split", "swap_gate_up")


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int
    num_query_groups: int
    head_dim: int

    def __post_init__(self) -> None:
        if self.num_heads % self.num_query_groups:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of query groups {self.num_query_groups}"
            )


def split_qkv(qkv: torch.Tensor, shape: AttentionShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron ``linear_qkv`` [G*(n+2)*d, H] -> HF (q [heads*d, H], k [G*d, H], v [G*d, H])."""
    g, d = shape.num_query_groups, shape.head_dim
    n = shape.num_heads // g
    qkv_g = qkv.reshape(g, n + 2, d, -1)
    hidden = qkv.shape[-1]
    q = qkv_g[:, :n].reshape(g * n * d, hidden)
    k = qkv_g[:, n].reshape(g * d, hidden)
    v = qkv_g[:, n + 1].reshape(g * d, hidden)
    return q.contiguous(), k.contiguous(), v.contiguous()


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: AttentionShape) -> torch.Tensor:
    """Inverse of ``split_qkv``: HF q/k/v -> Megatron's query-group interleaved ``linear_qkv``."""
    g, d = shape.num_query_groups, shape.head_dim
    n = shape.num_heads // g
    hidden = q.shape[-1]
    parts = [q.reshape(g, n, d, hidden), k.reshape(g, 1, d, hidden), v.reshape(g, 1, d, hidden)]
    return torch.cat(parts, dim=1).reshape(g * (n + 2) * d, hidden).contiguous()


def _naive_split(qkv: torch.Tensor, shape: AttentionShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q_rows = shape.num_heads * shape.head_dim
    kv_rows = shape.num_query_groups * shape.head_dim
    q, k, v = torch.split(qkv, [q_rows, kv_rows, kv_rows], dim=0)
    return q.contiguous(), k.contiguous(), v.contiguous()


def megatron_to_hf(
    state: dict[str, torch.Tensor], shape: AttentionShape, *, fault: str | None = None
) -> dict[str, torch.Tensor]:
    """Megatron GPTModel state dict -> HF Qwen3 names and layouts. ``fault`` (tests / fault injection only):
    ``naive_qkv_split`` reads ``linear_qkv`` as [Q; K; V]; ``swap_gate_up`` exports fc1 as [up; gate]."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown Megatron export fault {fault!r}; known: {', '.join(FAULTS)}")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("._extra_state"):
            continue
        if name in _ONE_TO_ONE_TOP:
            out[_ONE_TO_ONE_TOP[name]] = tensor
            continue
        m = _LAYER.match(name)
        if m is None:
            raise KeyError(f"no HF name for Megatron tensor {name!r}")
        prefix, rest = f"model.layers.{m.group(1)}.", m.group(2)
        if rest in _ONE_TO_ONE_LAYER:
            out[prefix + _ONE_TO_ONE_LAYER[rest]] = tensor
        elif rest == "self_attention.linear_qkv.weight":
            split = _naive_split if fault == "naive_qkv_split" else split_qkv
            q, k, v = split(tensor, shape)
            out[prefix + "self_attn.q_proj.weight"] = q
            out[prefix + "self_attn.k_proj.weight"] = k
            out[prefix + "self_attn.v_proj.weight"] = v
        elif rest == "mlp.linear_fc1.weight":
            gate, up = tensor.chunk(2, dim=0)
            if fault == "swap_gate_up":
                gate, up = up, gate
            out[prefix + "mlp.gate_proj.weight"] = gate.contiguous()
            out[prefix + "mlp.up_proj.weight"] = up.contiguous()
        else:
            raise KeyError(f"no HF name for Megatron tensor {name!r}")
    return out


def hf_to_megatron(
    hf: dict[str, torch.Tensor], shape: AttentionShape, *, tied: bool
) -> dict[str, torch.Tensor]:
    """HF Qwen3 state dict -> Megatron GPTModel names (to start both learners from the same weights)."""
    top = {v: k for k, v in _ONE_TO_ONE_TOP.items()}
    layer = {v: k for k, v in _ONE_TO_ONE_LAYER.items()}
    out: dict[str, torch.Tensor] = {}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in hf.items():
        if name == "lm_head.weight" and tied:
            continue
        if name in top:
            out[top[name]] = tensor
            continue
        m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
        if m is None:
            raise KeyError(f"no Megatron name for HF tensor {name!r}")
        prefix, rest = f"decoder.layers.{m.group(1)}.", m.group(2)
        if rest in layer:
            out[prefix + layer[rest]] = tensor
        else:
            pending.setdefault(prefix, {})[rest] = tensor
    for prefix, parts in pending.items():
        try:
            out[prefix + "self_attention.linear_qkv.weight"] = merge_qkv(
                parts.pop("self_attn.q_proj.weight"),
                parts.pop("self_attn.k_proj.weight"),
                parts.pop("self_attn.v_proj.weight"),
                shape,
            )
            gate, up = parts.pop("mlp.gate_proj.weight"), parts.pop("mlp.up_proj.weight")
        except KeyError as exc:
            raise KeyError(f"HF state dict lacks {prefix}{exc.args[0]} (Megatron fuses it)") from None
        out[prefix + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0).contiguous()
        if parts:
            raise KeyError(f"no Megatron name for HF tensors {sorted(prefix + p for p in parts)}")
    return out
