"""Which modules run quantized: the Megatron + Transformer Engine precision policy, by HF module name.

Only TE GEMM modules quantize (te.Linear, LayerNormLinear, LayerNormMLP, GroupedLinear). Everything else stays
in BF16 (notes 2.5; Megatron ``fp8_utils.py``):

- embeddings (``embed_tokens``) and the LM head (``lm_head``; TE's MXFP8-only ``fp8_output_proj`` is off);
- norms (``input_layernorm``, ``post_attention_layernorm``, ``q_norm``, ``k_norm``, the final ``norm``);
- the MoE router: ``mlp.gate`` in Qwen3-MoE (a 1-layer linear whose argmax picks experts; quantizing it flips
  routing -- NeMo-RL PR #3614). Careful: the *dense* MLP's ``mlp.gate_proj`` is an ordinary GEMM and IS
  quantized; so is ``mlp.shared_expert`` but not ``mlp.shared_expert_gate``;
- biases (a parameter name ending in ``.bias``);
- optionally whole decoder layers ``model.layers.{i}.``: the first ``bf16_first_layers`` and the last
  ``bf16_last_layers`` (Megatron ``first_last_layers_bf16``).

:func:`convert_linears` applies a policy to a model in place: every eligible ``nn.Linear`` becomes a
:class:`pipeline.quant.linear.QuantLinear` (``MXFP8Linear`` for MXFP8 ids) and every fused-experts module a
:class:`pipeline.quant.experts.QuantExperts`; parameters are shared, so names and optimizer state are unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.quant.experts import QuantExperts, is_fused_experts
from pipeline.quant.linear import CastSchedule, MXFP8Linear, QuantLinear
from pipeline.quant.precisions import MXFP8_RULE, check_precision

BF16_COMPONENTS = frozenset({"embed_tokens", "lm_head", "wte", "wpe", "embed_positions"})
ROUTER_COMPONENTS = frozenset({"gate", "router", "shared_expert_gate"})
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class PrecisionPolicy:
    """``precision`` (a precision id) for eligible GEMMs, BF16 for the rest (see the module docstring).

    ``num_layers`` (decoder layer count) is needed only when ``bf16_last_layers > 0``; :func:`convert_linears`
    fills it from ``model.config.num_hidden_layers``.
    """

    precision: str
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    num_layers: int | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)
        for field in ("bf16_first_layers", "bf16_last_layers"):
            v = getattr(self, field)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{field} must be a non-negative int, got {v!r}")
        if self.num_layers is not None and (not isinstance(self.num_layers, int) or self.num_layers < 0):
            raise ValueError(f"num_layers must be a non-negative int or None, got {self.num_layers!r}")

    def layer_is_bf16(self, index: int) -> bool:
        if index < self.bf16_first_layers:
            return True
        if self.bf16_last_layers:
            if self.num_layers is None:
                raise ValueError(
                    "bf16_last_layers needs num_layers: PrecisionPolicy(..., num_layers=config.num_hidden_layers)"
                )
            return index >= self.num_layers - self.bf16_last_layers
        return False

    def is_quantized(self, name: str) -> bool:
        """Whether module (or parameter) ``name`` runs on the quantized grid, e.g.
        ``model.layers.3.mlp.gate_proj`` -> True, ``model.layers.3.mlp.gate`` -> False."""
        if self.precision == "bf16" or name.endswith(".bias"):
            return False
        parts = name.split(".")
        if parts[-1] == "weight":
            parts = parts[:-1]
        if not parts or any(p in BF16_COMPONENTS or "norm" in p for p in parts):
            return False
        if parts[-1] in ROUTER_COMPONENTS:
            return False
        m = _LAYER_RE.search(".".join(parts))
        return not (m and self.layer_is_bf16(int(m.group(1))))


def _num_layers(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    config = text() if callable(text) else config
    return getattr(config, "num_hidden_layers", None)


def convert_linears(
    model: nn.Module,
    policy: PrecisionPolicy,
    compute_dtype: torch.dtype = torch.bfloat16,
    *,
    backend: str = "emulated",
    schedule: CastSchedule | None = None,
    baseline_gemms: bool = False,
) -> list[str]:
    """Replace every module ``policy`` quantizes, in place; return their names in module order.

    ``nn.Linear`` -> :class:`QuantLinear` (:class:`MXFP8Linear` for MXFP8 ids); fused 3-D experts ->
    :class:`QuantExperts`, all with GEMM ``backend`` (``emulated`` | ``scaled_mm``) and one shared weight-cast
    ``schedule``. Modules already converted are left alone (returned again). A quantized linear whose features
    the grid cannot block (MXFP8: multiples of 32) raises ValueError naming it.

    ``baseline_gemms`` (a ``bf16`` policy only): route the modules a low-precision policy would quantize through
    the same GEMM code with unquantized operands (grid ``none``), so that a BF16 vs low-precision comparison
    measures quantization, not two different GEMM calls. Nothing is quantized, so it returns ``[]``.
    """
    if policy.bf16_last_layers and policy.num_layers is None:
        n = _num_layers(model)
        if n is None:
            raise ValueError(
                "bf16_last_layers needs the layer count: model.config.num_hidden_layers is missing"
            )
        policy = dataclasses.replace(policy, num_layers=n)
    baseline = policy.precision == "bf16"
    if baseline and not baseline_gemms:
        return []
    selector = dataclasses.replace(policy, precision="mxfp8") if baseline else policy  # the same modules
    converted = []
    for name, module in list(model.named_modules()):
        if not name or not selector.is_quantized(name):
            continue
        if isinstance(module, QuantLinear | QuantExperts):
            converted.append(name)
            continue
        if isinstance(module, nn.Linear):
            try:
                opts = {"backend": backend, "schedule": schedule}
                if policy.precision in MXFP8_RULE:
                    rule = MXFP8_RULE[policy.precision]
                    new: nn.Module = MXFP8Linear.from_linear(module, compute_dtype, rule, **opts)
                else:
                    new = QuantLinear.from_linear(module, policy.precision, compute_dtype, **opts)
            except ValueError as err:
                raise ValueError(f"cannot quantize {name}: {err}") from err
        elif is_fused_experts(module):
            new = QuantExperts(module, policy.precision, compute_dtype, backend=backend, schedule=schedule)
        else:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        converted.append(name)
    return [] if baseline else converted
