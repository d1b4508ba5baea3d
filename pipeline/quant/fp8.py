"""FP8 E4M3 grids with float32 scales: per tensor, 128x128 / 1x128 blocks, and per row.

These are the "other grids" a sampler may run on (Hopper-era FP8 RL recipes), each defined by where the scale
lives; the element rule is the same everywhere: q = E4M3_RNE_saturate(x / s), value = e4m3(q) * s, with

    s = amax / 448  (float32 division; amax over the scale's group, NaN skipped; an all-zero group uses s = 1)

- ``fp8-tensor``: one scale for the whole tensor (TE "current scaling"). Grid shape (1, ..., 1).
- ``fp8-block128``: DeepSeek-V3 / DeepGEMM blockwise: weights in 128x128 tiles (grid ceil(M/128) x
  ceil(N/128)), activations in 1x128 tiles along the last dim (``block=(1, 128)``); partial edge tiles are
  allowed (they are scaled by the amax of the elements they hold).
- ``fp8-rowwise``: one scale per row, blocks along the last dim (``torch._scaled_mm`` rowwise on Hopper).

``FP8Tensor.scale`` always has ``data.ndim`` dims, each the number of tiles along that dim, so it broadcasts
after ``repeat_interleave``. An Inf in a group makes its scale Inf (the group dequantizes to NaN): FP8 recipes
have no saturating scale, and silently hiding an Inf would be worse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.quant.e4m3 import E4M3_MAX, check_float_tensor, decode_e4m3, encode_e4m3, nan_skipping_absmax

GRANULARITIES = ("tensor", "block128x128", "block1x128", "rowwise")


@dataclass
class FP8Tensor:
    """FP8 E4M3 bytes ``data`` (shape of the source), float32 ``scale`` of the tile grid's shape (value =
    e4m3(data) * scale), the ``granularity`` name, per-dim ``block`` sizes and the source dtype."""

    data: torch.Tensor
    scale: torch.Tensor
    granularity: str
    block: tuple[int, ...] = ()
    orig_dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def _expand(scale: torch.Tensor, block: tuple[int, ...], shape: torch.Size) -> torch.Tensor:
    """Broadcast a grid of scales to the element shape (edge tiles cropped)."""
    out = scale
    for d, (b, n) in enumerate(zip(block, shape, strict=True)):
        if b > 1 and out.shape[d] > 1:  # a grid dim of 1 broadcasts as it is
            out = out.repeat_interleave(b, dim=d).narrow(d, 0, n)
    return out


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    scale = amax / E4M3_MAX
    return torch.where(amax == 0, torch.ones((), dtype=torch.float32), scale)


def _quantize_tiles(x: torch.Tensor, block: tuple[int, ...], granularity: str) -> FP8Tensor:
    """Quantize with one scale per tile of ``block`` (a size per dim; -1 = the whole dim)."""
    block = tuple(n if b == -1 else b for b, n in zip(block, x.shape, strict=True))
    grid = tuple(-(-n // b) for b, n in zip(block, x.shape, strict=True))
    pad = []
    for b, n, g in zip(reversed(block), reversed(x.shape), reversed(grid), strict=True):
        pad += [0, g * b - n]
    xp = torch.nn.functional.pad(x, pad) if any(pad) else x
    tiled = xp.reshape(*[s for g, b in zip(grid, block, strict=True) for s in (g, b)])
    amax, has_nan, has_inf = nan_skipping_absmax(tiled, dim=tuple(range(1, 2 * x.ndim, 2)))
    scale = _scale_from_amax(amax)
    y = x.to(torch.float32) / _expand(scale, block, x.shape)
    data = encode_e4m3(y, saturate=True, may_have_nan=has_nan or has_inf, inplace=True)
    return FP8Tensor(data, scale, granularity, block, x.dtype)


def quantize_fp8_tensor(x: torch.Tensor) -> FP8Tensor:
    """One float32 scale for the whole tensor: s = amax / 448."""
    check_float_tensor(x)
    return _quantize_tiles(x, (-1,) * x.ndim, "tensor")


def quantize_fp8_rowwise(x: torch.Tensor) -> FP8Tensor:
    """One float32 scale per row (per index of all leading dims), over the last dim; grid (..., 1)."""
    check_float_tensor(x)
    return _quantize_tiles(x, (1,) * (x.ndim - 1) + (-1,), "rowwise")


def quantize_fp8_block128(x: torch.Tensor, block: tuple[int, int] = (128, 128)) -> FP8Tensor:
    """DeepSeek-style blockwise FP8: ``block=(128, 128)`` tiles the last two dims (weights; leading dims such as
    experts get their own tiles), ``block=(1, 128)`` gives 1x128 activation tiles along the last dim."""
    check_float_tensor(x)
    block = tuple(block)
    if block == (128, 128):
        if x.ndim < 2:
            raise ValueError(f"128x128 blocks need a tensor with >= 2 dims, got shape {tuple(x.shape)}")
        return _quantize_tiles(x, (1,) * (x.ndim - 2) + (128, 128), "block128x128")
    if block == (1, 128):
        return _quantize_tiles(x, (1,) * (x.ndim - 1) + (128,), "block1x128")
    raise ValueError(f"block must be (128, 128) for weights or (1, 128) for activations, got {block}")


def dequantize_fp8(q: FP8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3(data) * scale in float32, cast to ``dtype``."""
    if not isinstance(q, FP8Tensor):
        raise TypeError(f"dequantize_fp8 expects an FP8Tensor, got {type(q).__name__}")
    values = decode_e4m3(q.data, torch.float32)
    return (values * _expand(q.scale, q.block, q.data.shape)).to(dtype)
