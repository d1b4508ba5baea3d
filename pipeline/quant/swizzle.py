"""The GEMM-swizzled MXFP8 scale layout (cuBLAS "block scaling factors layout", TE ``optimize_for_gemm``).

Compact rowwise scales are [M, Kb] (Kb = K / 32). Blackwell block-scaled GEMMs read them in 128 x 4 tiles:
pad to [roundup(M, 128), roundup(Kb, 4)] with zeros (TE zeroes swizzled padding), store tiles row-major over
(M / 128, Kb / 4), and inside a tile put row r, scale column c at byte

    (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)

(TE ``common/cast/mxfp8/swizzle.cuh::gemm_swizzled_scale_idx``; the PyTorch form is a view
(M/128, 4, 32, Kb/4, 4) permuted to (0, 3, 2, 1, 4), as in TE ``tests/pytorch/mxfp8/mxfp8_utils.py`` and vLLM's
``swizzle_mxfp8_scale``). A consumer handed compact scales where it expects swizzled ones reads garbage silently.
"""

from __future__ import annotations

import torch

TILE_ROWS = 128
TILE_COLS = 4


def _roundup(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzled_index(r: int, c: int, Kb: int) -> int:
    """Byte offset of compact scale [r, c] inside the swizzled buffer of a matrix with Kb scale columns."""
    tile = (r // TILE_ROWS) * (_roundup(Kb, TILE_COLS) // TILE_COLS) + c // TILE_COLS
    return tile * TILE_ROWS * TILE_COLS + (r % 32) * 16 + ((r % TILE_ROWS) // 32) * 4 + c % TILE_COLS


def swizzle_mxfp8_scales(scale_MKb: torch.Tensor) -> torch.Tensor:
    """Compact uint8 scales [M, Kb] -> swizzled uint8 [roundup(M,128), roundup(Kb,4)] (zero padding)."""
    if scale_MKb.dtype != torch.uint8 or scale_MKb.ndim != 2:
        raise TypeError(
            f"expected 2-D uint8 scales [M, K/32], got {scale_MKb.dtype} {tuple(scale_MKb.shape)}"
        )
    M, Kb = scale_MKb.shape
    Mp, Kbp = _roundup(M, TILE_ROWS), _roundup(Kb, TILE_COLS)
    padded = torch.zeros(Mp, Kbp, dtype=torch.uint8, device=scale_MKb.device)
    padded.narrow(0, 0, M).narrow(1, 0, Kb).copy_(scale_MKb)
    tiles = padded.view(Mp // TILE_ROWS, 4, 32, Kbp // TILE_COLS, TILE_COLS).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().view(Mp, Kbp)


def unswizzle_mxfp8_scales(swz: torch.Tensor, M: int, Kb: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_mxfp8_scales`: swizzled buffer -> compact [M, Kb] (padding dropped)."""
    Mp, Kbp = _roundup(M, TILE_ROWS), _roundup(Kb, TILE_COLS)
    if swz.dtype != torch.uint8 or swz.numel() != Mp * Kbp:
        raise ValueError(
            f"swizzled scales for M={M}, Kb={Kb} must be {Mp * Kbp} uint8 bytes, got {swz.dtype} "
            f"{tuple(swz.shape)}"
        )
    tiles = swz.reshape(Mp // TILE_ROWS, Kbp // TILE_COLS, 32, 4, TILE_COLS).permute(0, 3, 2, 1, 4)
    return tiles.reshape(Mp, Kbp)[:M, :Kb].contiguous()
