"""Emulated MXFP8 linears in Megatron's local layer spec (CPU only; on a GPU: ``te_path.py``).

Megatron's ``ColumnParallelLinear`` / ``RowParallelLinear`` do their GEMM in one overridable method,
``_forward_impl(input, weight, bias, ...)`` (the rest of ``forward`` is tensor-parallel communication, identity
at TP = 1). These subclasses replace only that method with mxperf's emulated MXFP8 GEMM,
``pipeline.quant.linear.QuantLinearFunction``: TE's operand usage -- fprop on rowwise 1x32 blocks of X and W,
dgrad on rowwise dY and columnwise W, wgrad on columnwise dY and X (tokens zero-padded to 32) -- with E8M0
scales by the TE >= 2.13 rule. The weight's quantized operands are cached per weight version, as TE reuses its
weight casts across the micro-batches of a step, and ``quantized_weight()`` returns the exact rowwise bytes and
scales the next fprop uses (what the learner exports to a sampler on its grid).

What is quantized (notes 2.5, Megatron + TE): the four decoder linears of every layer (``linear_qkv``,
``linear_proj``, ``linear_fc1``, ``linear_fc2``). Embeddings, norms, core attention and the output layer (built
by GPTModel outside the layer spec) stay BF16.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pipeline.quant.linear import BoundWeight, GemmSpec, QuantLinearFunction, WeightOperands

PRECISION = "mxfp8"


class _MXFP8GemmMixin:
    """Replaces Megatron's GEMM (``_forward_impl``) with the emulated MXFP8 one (tensor-parallel size 1)."""

    weight: torch.Tensor

    def _mx_operands(self) -> WeightOperands:
        ops = getattr(self, "_mxperf_operands", None)
        if ops is None:
            ops = WeightOperands(GemmSpec(PRECISION, "emulated", self.weight.dtype))  # model's compute dtype
            self._mxperf_operands = ops
        return ops

    def _forward_impl(
        self, input: torch.Tensor, weight: torch.Tensor, bias: Any = None, **_tp: Any
    ) -> torch.Tensor:
        if _tp.get("tp_group") is not None and _tp["tp_group"].size() != 1:
            raise NotImplementedError(
                "the emulated MXFP8 Megatron linear supports tensor-parallel size 1 only"
            )
        return QuantLinearFunction.apply(input, weight, bias, BoundWeight(self._mx_operands(), weight))

    def quantized_weight(self) -> Any:
        """The MXFP8Tensor (uint8 E4M3 bytes [N, K] + E8M0 scales [N, K/32]) of the next fprop."""
        return self._mx_operands().quantized(self.weight)


def _classes() -> tuple[type, type]:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    col = type("MXFP8ColumnParallelLinear", (_MXFP8GemmMixin, ColumnParallelLinear), {})
    row = type("MXFP8RowParallelLinear", (_MXFP8GemmMixin, RowParallelLinear), {})
    return col, row


def mxfp8_local_layer_spec() -> Any:
    """Megatron's local GPT layer spec (RMSNorm, qk-layernorm) with the four decoder linears in MXFP8."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    col, row = _classes()
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    attn = spec.submodules.self_attention
    mlp = spec.submodules.mlp
    attn_sub = dataclasses.replace(attn.submodules, linear_qkv=col, linear_proj=row)
    mlp_sub = dataclasses.replace(mlp.submodules, linear_fc1=col, linear_fc2=row)
    new_attn = dataclasses.replace(attn, submodules=attn_sub)
    new_mlp = dataclasses.replace(mlp, submodules=mlp_sub)
    return dataclasses.replace(
        spec, submodules=dataclasses.replace(spec.submodules, self_attention=new_attn, mlp=new_mlp)
    )


def quantized_linears(model: Any) -> dict[str, Any]:
    """Megatron parameter name (``...linear_qkv.weight``) -> MXFP8Tensor of every MXFP8 linear in ``model``."""
    return {
        f"{name}.weight": mod.quantized_weight()
        for name, mod in model.named_modules()
        if isinstance(mod, _MXFP8GemmMixin)
    }
