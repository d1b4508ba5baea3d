"""Quantized fused MoE experts (transformers 5.x ``Qwen3MoeExperts`` and look-alikes).

transformers 5.19 stores a Qwen3-MoE layer's experts as two 3-D parameters, not as ``nn.Linear`` modules:

    mlp.experts.gate_up_proj  [E, 2 * moe_intermediate, hidden]   (rows: gate then up, per expert)
    mlp.experts.down_proj     [E, hidden, moe_intermediate]

and loops over the routed experts calling ``F.linear(x, gate_up_proj[e])``. :class:`QuantExperts` replaces that
module, keeping both parameters (same names, same tensors) and the same loop, but each per-expert GEMM runs
through :class:`pipeline.quant.linear.QuantLinearFunction` -- TE ``GroupedLinear`` semantics: each expert's
weight is its own [N, K] matrix with its own operands (fprop blocks along K, dgrad along N, one FP8 scale set per
expert), and each expert's token group is padded for wgrad. For MXFP8, quantizing the 3-D stack along its last
dim is exactly per-expert rowwise quantization, so :meth:`QuantExperts.quantized_weights` returns one
MXFP8Tensor [E, N, K] (scales [E, N, K/32]) per parameter -- what a sampler's fused MoE weight holds.
The router (``mlp.gate``, a ``Qwen3MoeTopKRouter``) is not touched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline.quant.linear import (
    BoundWeight,
    CastSchedule,
    GemmSpec,
    QuantLinearFunction,
    WeightOperands,
    check_features,
)
from pipeline.quant.precisions import check_precision

EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def is_fused_experts(module: nn.Module) -> bool:
    """True for a module holding 3-D ``gate_up_proj`` and ``down_proj`` parameters (HF fused experts)."""
    params = [getattr(module, n, None) for n in EXPERT_PARAMS]
    return all(isinstance(p, torch.Tensor) and p.ndim == 3 for p in params) and hasattr(module, "act_fn")


class QuantExperts(nn.Module):
    """Fused experts whose per-expert GEMMs run on the grid of ``precision`` (see the module docstring)."""

    def __init__(
        self,
        experts: nn.Module,
        precision: str,
        compute_dtype: torch.dtype = torch.bfloat16,
        *,
        backend: str = "emulated",
        schedule: CastSchedule | None = None,
    ) -> None:
        super().__init__()
        check_precision(precision)
        if not is_fused_experts(experts):
            raise TypeError(f"{type(experts).__name__} has no 3-D gate_up_proj/down_proj parameters")
        self.gate_up_proj = experts.gate_up_proj
        self.down_proj = experts.down_proj
        self.num_experts = self.gate_up_proj.shape[0]
        self.act_fn = experts.act_fn
        self.precision = precision
        self.compute_dtype = compute_dtype
        spec = GemmSpec(precision, backend, compute_dtype)
        for name in EXPERT_PARAMS:
            n, k = getattr(self, name).shape[1:]
            try:
                check_features(k, n, spec)
            except ValueError as err:
                raise ValueError(f"experts {name} [{n}, {k}]: {err}") from None
        self._operands = {name: WeightOperands(spec, schedule) for name in EXPERT_PARAMS}

    def quantized_weights(self) -> dict[str, Any]:
        """{parameter name: the quantized stack the next fprop uses} (MXFP8Tensor [E, N, K] for MXFP8)."""
        return {name: self._operands[name].quantized(getattr(self, name)) for name in EXPERT_PARAMS}

    def _linear(self, x: torch.Tensor, name: str, e: int) -> torch.Tensor:
        w = getattr(self, name)
        return QuantLinearFunction.apply(x, w[e], None, BoundWeight(self._operands[name], w, e))

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """Same routing loop as ``Qwen3MoeExperts.forward`` (transformers 5.19)."""
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e_t in hit:
            e = int(e_t[0])
            if e == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(mask[e])
            state = hidden_states[token_idx]
            gate, up = self._linear(state, "gate_up_proj", e).chunk(2, dim=-1)
            out = self._linear(self.act_fn(gate) * up, "down_proj", e)
            out = out * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
        return final

    def extra_repr(self) -> str:
        e, n, k = self.gate_up_proj.shape
        return (
            f"experts={e}, gate_up=[{n}, {k}], precision={self.precision}, compute_dtype={self.compute_dtype}"
        )
