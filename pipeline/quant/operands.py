"""GEMM operands: each operand of C = A · Bᵀ quantized along the GEMM's reduction dim K, per precision id.

Every low-precision GEMM of a linear layer (fprop, dgrad, wgrad) multiplies two matrices that are both quantized
along the dimension the GEMM sums over (TE's rowwise / columnwise usages, torchao's float8 recipes, DeepSeek-V3):

=========  ====================  ============================  ==============================
GEMM       A [M, K]              B [N, K]                      C = A · Bᵀ
=========  ====================  ============================  ==============================
fprop      X [T, in]             W [out, in]         (weight)  Y [T, out]
dgrad      dY [T, out]           Wᵀ [in, out]        (weight)  dX [T, in]
wgrad      dYᵀ [out, T]          Xᵀ [in, T]                    dW [out, in]
=========  ====================  ============================  ==============================

The grid of an operand (its scale ``granularity``) follows from the precision id and whether it is a weight:

================  ====================  ====================
id                activation / grad     weight
================  ====================  ====================
``fp8-tensor``    ``tensor``            ``tensor``
``fp8-rowwise``   ``rowwise``           ``rowwise``
``fp8-block128``  ``block1x128``        ``block128x128``
MXFP8 ids         ``mx`` (1x32, E8M0)   ``mx``
``bf16``          ``none``              ``none``
================  ====================  ====================

``none`` is the BF16 baseline running through the same GEMM code with unquantized operands (``data`` is the
tensor itself, cast to the compute dtype by the GEMM), as Transformer Engine runs BF16 through the same
``te.Linear``: a BF16 vs low-precision comparison then differs only by quantization, not by the GEMM call
(on CPUs without native BF16, oneDNN's BF16 GEMM speed depends several-fold on operand layout).

On a GPU the quantizer is one sync-free function per grid (``quantize_grid``: no ``.item()``, no data-dependent
branches) fused by ``torch.compile``; on a CPU the reference implementations run (:mod:`pipeline.quant.fp8`,
:mod:`pipeline.quant.mxfp8`: cache-blocked, faster than ``quantize_grid`` eager on one core). The two give
the same bytes and scales for every input -- TE's NaN-skipping amax, saturation, NaN as 0x7F, Inf -- checked
on a CPU, eager and compiled (``tests/unit/test_quant_gemm.py``).

Shape legend: ``x_RK`` has R rows and K columns, blocks run along K.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.quant.e4m3 import E4M3_MAX, E4M3_NAN_BYTE
from pipeline.quant.fp8 import (
    FP8Tensor,
    dequantize_fp8,
    quantize_fp8_block128,
    quantize_fp8_rowwise,
    quantize_fp8_tensor,
)
from pipeline.quant.mxfp8 import (
    BLOCK,
    MXFP8Tensor,
    dequantize_mxfp8,
    quantize_mxfp8,
    reciprocal_from_bytes,
    scale_bytes_from_amax,
)
from pipeline.quant.precisions import MXFP8_RULE, check_precision

GRANULARITY = {
    "fp8-tensor": ("tensor", "tensor"),
    "fp8-rowwise": ("rowwise", "rowwise"),
    "fp8-block128": ("block1x128", "block128x128"),
}
TILE = 128
COMPILE_ENV = "MXPERF_COMPILE_QUANT"  # 0: never torch.compile the quantizers (1: also on CPU)


@dataclass(frozen=True)
class Operand:
    """One GEMM operand: uint8 E4M3 ``data`` [R, K] (row-major), ``scale`` of its grid (``mx``:
    uint8 E8M0 [R, K/32]; FP8 grids: float32, one entry per tile: [1, 1], [R, 1], [R, ceil(K/128)] or
    [ceil(R/128), ceil(K/128)]), the ``granularity``, the precision id and the MX scale ``rule``. Grid
    ``none`` (``bf16``): ``data`` is the unquantized tensor and ``scale`` is empty."""

    data: torch.Tensor
    scale: torch.Tensor
    granularity: str
    precision: str
    rule: str | None = None

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def granularity(precision: str, weight: bool) -> str:
    """The scale grid of an operand of ``precision`` (a weight or an activation / gradient)."""
    check_precision(precision)
    if precision == "bf16":
        return "none"
    if precision in MXFP8_RULE:
        return "mx"
    if precision not in GRANULARITY:
        raise ValueError(f"precision {precision!r} has no quantized GEMM operands")
    return GRANULARITY[precision][1 if weight else 0]


# -- the quantizers (pure tensor ops, no host synchronization) ------------------------------------------------
def _absmax(x: torch.Tensor, dim: Any) -> torch.Tensor:
    """max |x| over ``dim`` in float32 with NaN skipped (TE's rule: its accumulator starts at 0)."""
    a = torch.nan_to_num(x.abs(), nan=0.0, posinf=float("inf"))
    return a.amax(dim=dim).float()


def _to_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Scaled float32 -> uint8 E4M3 (RNE, saturating to +-448, NaN as 0x7F)."""
    data = y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(y), torch.full_like(data, E4M3_NAN_BYTE), data)


def _fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax == 0, torch.ones_like(amax), amax / E4M3_MAX)


def _quantize_tiles(x_RK: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp32 scale per ``rows`` x ``cols`` tile (0 = the whole dim); partial edge tiles allowed."""
    r, k = x_RK.shape
    tr, tk = rows or r, cols or k
    pr, pk = (-r) % tr, (-k) % tk
    xp = F.pad(x_RK, (0, pk, 0, pr)) if pr or pk else x_RK
    tiles = xp.reshape((r + pr) // tr, tr, (k + pk) // tk, tk)
    scale = _fp8_scale(_absmax(tiles, (1, 3)))
    y = tiles.float() / scale.reshape(scale.shape[0], 1, scale.shape[1], 1)
    data = _to_e4m3(y).reshape(r + pr, k + pk)
    if pr or pk:
        data = data.narrow(0, 0, r).narrow(1, 0, k).contiguous()
    return data, scale


def _quantize_mx(x_RK: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    r, k = x_RK.shape
    xb = x_RK.reshape(r * (k // BLOCK), BLOCK)
    byte = scale_bytes_from_amax(_absmax(xb, -1), rule)
    y = xb.float() * reciprocal_from_bytes(byte, rule).unsqueeze(-1)
    return _to_e4m3(y).reshape(r, k), byte.to(torch.uint8).reshape(r, k // BLOCK)


def _tensor(x_RK: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_tiles(x_RK, 0, 0)


def _rowwise(x_RK: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_tiles(x_RK, 1, 0)


def _block1x128(x_RK: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_tiles(x_RK, 1, TILE)


def _block128x128(x_RK: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_tiles(x_RK, TILE, TILE)


# One function per grid: torch.compile keeps its compiled variants per code object (and stops recompiling past
# its cache limit), so each grid gets its own entry point and its own few variants (dtype, divisibility).
GRID_KERNELS = {
    "tensor": _tensor,
    "rowwise": _rowwise,
    "block1x128": _block1x128,
    "block128x128": _block128x128,
    "mx": _quantize_mx,
}


def quantize_grid(x_RK: torch.Tensor, grid: str, rule: str = "te") -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 data [R, K], scale) of ``x_RK`` on ``grid`` (see the module docstring); the fusable kernel."""
    if grid not in GRID_KERNELS:
        raise ValueError(f"unknown operand grid {grid!r}")
    return GRID_KERNELS[grid](x_RK, rule)


def reference_grid(x_RK: torch.Tensor, grid: str, rule: str = "te") -> tuple[torch.Tensor, torch.Tensor]:
    """The same quantization through the reference numerics (the CPU path)."""
    q: MXFP8Tensor | FP8Tensor
    if grid == "tensor":
        q = quantize_fp8_tensor(x_RK)
    elif grid == "rowwise":
        q = quantize_fp8_rowwise(x_RK)
    elif grid == "block1x128":
        q = quantize_fp8_block128(x_RK, (1, TILE))
    elif grid == "block128x128":
        q = quantize_fp8_block128(x_RK, (TILE, TILE))
    elif grid == "mx":
        q = quantize_mxfp8(x_RK, -1, rule=rule)
    else:
        raise ValueError(f"unknown operand grid {grid!r}")
    return q.data, q.scale


_COMPILED: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
COMPILE_FAILURES: dict[str, str] = {}  # grid -> why torch.compile was not used (recorded in manifests)


def _compile_wanted(device: torch.device) -> bool:
    flag = os.environ.get(COMPILE_ENV, "")
    if flag == "0":
        return False
    return device.type == "cuda" or flag == "1"


def _kernel(grid: str, device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``quantize_grid`` compiled with ``torch.compile(dynamic=True)`` on CUDA (eager there when the compile
    failed: the reason is kept in :data:`COMPILE_FAILURES`), the reference numerics on a CPU."""
    if not _compile_wanted(device):
        return reference_grid if device.type == "cpu" else quantize_grid
    if grid in COMPILE_FAILURES:
        return quantize_grid
    fn = _COMPILED.get(grid)
    if fn is None:
        compiled = torch.compile(GRID_KERNELS[grid], dynamic=True, fullgraph=True)
        fn = _COMPILED[grid] = lambda x, _grid, rule: compiled(x, rule)
    return fn


def quantize_operand(x_RK: torch.Tensor, precision: str, *, weight: bool = False) -> Operand:
    """Quantize a 2-D ``x_RK`` along its last dim on the grid of ``precision`` (weight or activation)."""
    if x_RK.ndim != 2:
        raise ValueError(f"a GEMM operand is 2-D [rows, K], got shape {tuple(x_RK.shape)}")
    grid = granularity(precision, weight)
    if grid == "none":
        return Operand(x_RK, x_RK.new_empty(0), grid, precision)
    rule = MXFP8_RULE.get(precision)
    if grid == "mx" and x_RK.shape[1] % BLOCK:
        raise ValueError(
            f"MXFP8 operands need K divisible by {BLOCK}, got shape {tuple(x_RK.shape)}; pad or keep it BF16"
        )
    fn = _kernel(grid, x_RK.device)
    try:
        data, scale = fn(x_RK, grid, rule or "te")
    except Exception as exc:  # a compiler failure on this machine: fall back to eager, and say so
        if fn in (quantize_grid, reference_grid):
            raise
        COMPILE_FAILURES[grid] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        warnings.warn(
            f"torch.compile of the {grid} quantizer failed; running it eagerly ({exc})", stacklevel=2
        )
        data, scale = quantize_grid(x_RK, grid, rule or "te")
    return Operand(data, scale, grid, precision, rule)


def transpose_operand(op: Operand) -> Operand:
    """The same values transposed, for grids where that is exact (one tensor scale, square 128x128 tiles):
    Wᵀ's dgrad operand from W's fprop operand, as TE's cast-transpose and DeepSeek's weights do."""
    if op.granularity not in ("tensor", "block128x128", "none"):
        raise ValueError(f"a {op.granularity} operand cannot be transposed (its blocks run along K)")
    return Operand(op.data.t().contiguous(), op.scale.t().contiguous(), op.granularity, op.precision, op.rule)


def to_quantized(op: Operand, orig_dtype: torch.dtype = torch.float32) -> MXFP8Tensor | FP8Tensor:
    """The operand as the reference numerics' tensor type (what ``export_weights`` sends, what tests compare)."""
    if op.granularity == "none":
        raise ValueError("a bf16 operand is not quantized: it has no quantized tensor form")
    if op.granularity == "mx":
        return MXFP8Tensor(op.data, op.scale, -1, op.rule or "te", orig_dtype)
    r, k = op.data.shape
    block = {
        "tensor": (r, k),
        "rowwise": (1, k),
        "block1x128": (1, TILE),
        "block128x128": (TILE, TILE),
    }[op.granularity]
    return FP8Tensor(op.data, op.scale, op.granularity, block, orig_dtype)


def dequantize_operand(op: Operand, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The operand's values in ``dtype`` (exact in float32; MXFP8 values are exact in bfloat16 too)."""
    if op.granularity == "none":
        return op.data.to(dtype)
    q = to_quantized(op)
    return dequantize_mxfp8(q, dtype) if isinstance(q, MXFP8Tensor) else dequantize_fp8(q, dtype)
