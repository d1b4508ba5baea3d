"""Sampler grids: quantize a weight on a mode's grid, build the kernel-side derived scale copy, and
dequantize from bytes + derived copy (what the sampler's GEMM reads).

MX modes keep E8M0 scale bytes [.., N, K/32] and derive the cuBLAS/TE 128x4 swizzled layout; FP8 grids keep
fp32 scales in the grid's shape and derive them pre-broadcast to one fp32 per (row, K-block).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.sampler.layout import MX_RULES


def _numerics() -> Any:
    """The public quantization API (imported lazily: importing the layout must stay cheap)."""
    import pipeline.quant as mx

    return mx


def quantize_to_grid(
    w: torch.Tensor, mode: str, rule: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rowwise-quantize weight ``w`` [N, K] or experts [E, N, K] on ``mode``'s grid -> (uint8 data, scale).

    MX modes: E8M0 scale bytes [.., N, K/32] by ``rule`` (default: the mode's own). FP8 grids: fp32 scales in
    the grid's shape, one set per expert for 3-D weights."""
    mx = _numerics()
    if mode in MX_RULES:
        q = mx.quantize_mxfp8(w, -1, rule=rule or MX_RULES[mode])
        return q.data, q.scale
    if w.ndim == 3:  # one scale grid per expert, as vLLM's FP8 MoE holds them
        qs = [mx.quantize_weight(w[e], mode) for e in range(w.shape[0])]
        return torch.stack([q.data for q in qs]), torch.stack([q.scale for q in qs])
    q = mx.quantize_weight(w, mode)
    return q.data, q.scale


def derive_scale(mode: str, scale: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The kernel-side copy of ``scale`` for a weight of ``shape``: swizzled E8M0 (MX) or fp32 scales
    pre-broadcast to [.., N, K-blocks] (FP8 grids). Pure: rebuilt from the canonical scale every load."""
    if len(shape) == 3:
        return torch.stack([derive_scale(mode, scale[e], shape[1:]) for e in range(shape[0])])
    if mode in MX_RULES:
        return _numerics().swizzle_mxfp8_scales(scale)
    n = shape[0]
    if mode == "fp8-block128":
        return scale.float().repeat_interleave(128, dim=0)[:n].contiguous()
    return scale.float().reshape(-1, 1).expand(n, 1).contiguous()  # per-tensor or per-row


def dequantize_derived(
    mode: str, data: torch.Tensor, derived: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """What the GEMM kernel sees: bytes ``data`` times the **derived** scale copy, in ``dtype``."""
    mx = _numerics()
    if data.ndim == 3:
        return torch.stack(
            [dequantize_derived(mode, data[e], derived[e], dtype) for e in range(data.shape[0])]
        )
    n, k = data.shape
    if mode in MX_RULES:
        scale = mx.unswizzle_mxfp8_scales(derived, n, k // 32)
        return mx.dequantize_mxfp8(mx.MXFP8Tensor(data, scale, -1, MX_RULES[mode], dtype), dtype)
    from pipeline.quant.e4m3 import decode_e4m3

    block = k if derived.shape[1] == 1 else 128
    return (decode_e4m3(data) * derived.repeat_interleave(block, dim=1)[:, :k]).to(dtype)


def dequantize_sent(grid: str, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Dequantize bytes that arrived on ``grid`` (MX rowwise), to re-quantize them on another grid."""
    mx = _numerics()
    if grid not in MX_RULES:
        raise ValueError(f"payload grid {grid!r}: only MX bytes are sent (learner precision mxfp8)")
    return mx.dequantize_mxfp8(
        mx.MXFP8Tensor(data, scale, -1, MX_RULES[grid], torch.bfloat16), torch.bfloat16
    )
