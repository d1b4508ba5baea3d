"""Precision ids (docs/contracts.md) -> quantizers: one entry point for weights, activations and dequantization.

| id             | weights (``quantize_weight``)          | activations (``fake_quantize``)          |
|----------------|----------------------------------------|------------------------------------------|
| ``bf16``       | None (kept as they are)                | identity                                 |
| ``mxfp8``      | MXFP8 rowwise, TE >= 2.13 rule         | MXFP8 along ``axis``, same rule          |
| ``mxfp8-te212``| MXFP8 rowwise, TE <= 2.12 rule         | same rule                                |
| ``mxfp8-floor``| MXFP8 rowwise, OCP FLOOR rule          | same rule                                |
| ``fp8-tensor`` | one fp32 scale                         | one fp32 scale (current scaling)         |
| ``fp8-block128``| 128x128 tiles (last two dims)         | 1x128 tiles along ``axis``               |
| ``fp8-rowwise``| one scale per row (last dim)           | one scale per row along ``axis``         |
"""

from __future__ import annotations

import torch

from pipeline.quant.fp8 import (
    FP8Tensor,
    dequantize_fp8,
    quantize_fp8_block128,
    quantize_fp8_rowwise,
    quantize_fp8_tensor,
)
from pipeline.quant.mxfp8 import MXFP8Tensor, dequantize_mxfp8, quantize_mxfp8, quantize_mxfp8_along
from tracing.outputs.precisions import PIPELINE_PRECISIONS

PRECISIONS = PIPELINE_PRECISIONS
MXFP8_RULE = {"mxfp8": "te", "mxfp8-te212": "te212", "mxfp8-floor": "floor"}


def check_precision(precision: object) -> str:
    """Return ``precision`` if it is a precision id (docs/contracts.md), else raise ValueError listing the valid ids."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid ids: {', '.join(PRECISIONS)}")
    return precision  # type: ignore[return-value]


def quantize_weight(w: torch.Tensor, precision: str) -> MXFP8Tensor | FP8Tensor | None:
    """Quantize a weight [..., out, in] the way a GEMM of ``precision`` consumes it (None for bf16)."""
    check_precision(precision)
    if precision == "bf16":
        return None
    if precision in MXFP8_RULE:
        return quantize_mxfp8_along(w, -1, rule=MXFP8_RULE[precision])
    if precision == "fp8-tensor":
        return quantize_fp8_tensor(w)
    if precision == "fp8-block128":
        return quantize_fp8_block128(w, block=(128, 128))
    return quantize_fp8_rowwise(w)


def dequantize(q: MXFP8Tensor | FP8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize either kind of quantized tensor."""
    if isinstance(q, MXFP8Tensor):
        return dequantize_mxfp8(q, dtype)
    if isinstance(q, FP8Tensor):
        return dequantize_fp8(q, dtype)
    raise TypeError(f"dequantize expects an MXFP8Tensor or FP8Tensor, got {type(q).__name__}")


def _quantize_activation(x: torch.Tensor, precision: str) -> MXFP8Tensor | FP8Tensor:
    """Activation quantization along the last dim."""
    if precision in MXFP8_RULE:
        return quantize_mxfp8_along(x, -1, rule=MXFP8_RULE[precision])
    if precision == "fp8-tensor":
        return quantize_fp8_tensor(x)
    if precision == "fp8-block128":
        return quantize_fp8_block128(x, block=(1, 128))
    return quantize_fp8_rowwise(x)


def fake_quantize(x: torch.Tensor, precision: str, axis: int = -1) -> torch.Tensor:
    """quantize -> dequantize in ``x.dtype``: what a GEMM of ``precision`` sees of an activation ``x`` whose
    blocks run along ``axis`` (-1, or 0 for a 2-D tensor). bf16 returns ``x`` itself."""
    check_precision(precision)
    if precision == "bf16":
        return x
    if precision in MXFP8_RULE:
        return dequantize_mxfp8(quantize_mxfp8(x, axis, rule=MXFP8_RULE[precision]), x.dtype)
    if axis not in (-1, x.ndim - 1):
        if axis != 0 or x.ndim != 2:
            raise ValueError(f"axis must be -1 or 0 (2-D only), got {axis} for shape {tuple(x.shape)}")
        return dequantize(_quantize_activation(x.t(), precision), x.dtype).t()
    return dequantize(_quantize_activation(x, precision), x.dtype)
