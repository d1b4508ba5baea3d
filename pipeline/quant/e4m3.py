"""FP8 E4M3 elements and E8M0 scale bytes: the bit-level building blocks of every grid in mxperf.

E4M3 (OCP FP8, torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no Inf; NaN is S.1111.111
(0x7F / 0xFF); largest finite 448 = 1.75 * 2^8; smallest subnormal 2^-9. Every grid here converts with
round-to-nearest-even and *saturation* (|v| > 448 -> +-448, Inf -> +-448), and writes NaN as the single canonical
byte 0x7F, as Transformer Engine's `cvt.rn.satfinite.e4m3x2.f32` does.

torch >= 2.13 saturates in its float -> float8_e4m3fn cast on CPU, older releases do not; callers clamp to +-448
first whenever a value can exceed it (``encode_e4m3(..., saturate=True)``). torch writes -NaN as 0xFF, so NaN is
canonicalized explicitly. The tests check all of this against an integer-only reference, not against torch.

Decoding uses torch's fp8 -> float cast only once, to build lookup tables; the hot path gathers two elements at
a time from a 65,536-entry table indexed by the little-endian uint16 view of the bytes (eager torch's fp8 casts
are scalar loops, several times slower than this on one core).

E8M0 (scale): 8 exponent bits, bias 127, no sign and no mantissa: byte b means 2^(b - 127); 0x00 = 2^-127 (there
is no zero) and 0xFF = NaN.
"""

from __future__ import annotations

import sys
from functools import cache

import torch

E4M3_MAX = 448.0
E4M3_NAN_BYTE = 0x7F
E8M0_NAN_BYTE = 0xFF
E8M0_MAX_BYTE = 254

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Bit layout per input dtype: (integer view dtype, magnitude mask, bit pattern of +Inf).
_BITS = {
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
    torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
    torch.float16: (torch.int16, 0x7FFF, 0x7C00),
}


def check_float_tensor(x: object, what: str = "x") -> torch.Tensor:
    """Return ``x`` if it is a non-empty float32/bfloat16/float16 tensor, else raise TypeError/ValueError."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{what} must be float32, bfloat16 or float16, got {x.dtype} with shape {tuple(x.shape)}"
        )
    if x.ndim == 0:
        raise ValueError(f"{what} must have at least one dimension, got a 0-d tensor")
    if x.numel() == 0:
        raise ValueError(f"{what} is empty (shape {tuple(x.shape)}); nothing to quantize")
    return x


def nan_skipping_absmax(
    x: torch.Tensor, dim: int | tuple[int, ...] | None
) -> tuple[torch.Tensor, bool, bool]:
    """max |x| over ``dim`` in the input dtype with NaN elements skipped (an all-NaN group gives 0).

    Non-negative IEEE floats order like their bit patterns read as integers, so the maximum is taken on the
    sign-cleared integer view: exact, and NaN (bit pattern above +Inf) is easy to drop. That is TE's rule: its
    accumulator starts at 0 and PTX ``max`` / ``fmaxf`` return the non-NaN operand.

    Returns (amax as float32, any NaN in x, any Inf in x).
    """
    int_dtype, mag_mask, inf_bits = _BITS[x.dtype]
    mag = x.view(int_dtype) & mag_mask
    amax_bits = mag.amax(dim=dim) if dim is not None else mag.amax()
    has_nan = bool((amax_bits > inf_bits).any())
    if has_nan:
        mag = torch.where(mag > inf_bits, torch.zeros((), dtype=int_dtype), mag)
        amax_bits = mag.amax(dim=dim) if dim is not None else mag.amax()
    has_inf = bool((amax_bits == inf_bits).any())
    return amax_bits.view(x.dtype).float(), has_nan, has_inf


def encode_e4m3(
    y: torch.Tensor, *, saturate: bool = True, may_have_nan: bool = True, inplace: bool = False
) -> torch.Tensor:
    """Round ``y`` to E4M3 (RNE, saturating to +-448, NaN -> 0x7F) and return the uint8 bit patterns.

    ``y`` must already be scaled. ``saturate=False`` skips the clamp when the caller knows |y| <= 448 (NaN still
    becomes 0x7F, Inf would need the clamp). ``may_have_nan=False`` skips the NaN canonicalization pass.
    ``inplace=True`` lets the clamp overwrite ``y`` (pass a temporary; saves a full-size allocation).
    """
    if saturate:
        y = y.clamp_(-E4M3_MAX, E4M3_MAX) if inplace else y.clamp(-E4M3_MAX, E4M3_MAX)
    data = y.to(torch.float8_e4m3fn).view(torch.uint8)
    if may_have_nan:
        nan_mask = torch.isnan(y)
        if bool(nan_mask.any()):
            data.masked_fill_(nan_mask, E4M3_NAN_BYTE)
    return data


@cache
def _byte_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The 256 E4M3 values as ``dtype`` (both NaN bytes give NaN)."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    values[E4M3_NAN_BYTE] = float("nan")
    values[0xFF] = float("nan")
    return values.to(dtype).to(device)


@cache
def _pair_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """65,536 entries: uint16 (two little-endian E4M3 bytes) -> the two decoded values packed in one integer."""
    single = _byte_table(dtype, torch.device("cpu"))
    int_dtype = torch.int32 if dtype.itemsize == 2 else torch.int64
    idx = torch.arange(65536, dtype=torch.int32)
    lo, hi = single[idx & 0xFF], single[idx >> 8]
    return torch.stack([lo, hi], dim=-1).contiguous().view(int_dtype).reshape(65536).to(device)


def decode_e4m3(
    data: torch.Tensor, dtype: torch.dtype = torch.float32, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 E4M3 bit patterns -> values in ``dtype`` (exact for float32/bfloat16/float16; NaN bytes -> NaN).

    ``out``: a contiguous ``dtype`` tensor with ``data``'s number of elements to write into.
    """
    if data.dtype != torch.uint8:
        raise TypeError(f"E4M3 data must be uint8 bit patterns, got {data.dtype}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"decode dtype must be float32, bfloat16 or float16, got {dtype}")
    flat = data.contiguous().view(-1)
    if out is None:
        out = torch.empty(data.shape, dtype=dtype, device=data.device)
    if flat.numel() % 2 or sys.byteorder != "little":
        torch.index_select(_byte_table(dtype, data.device), 0, flat.to(torch.int32), out=out.view(-1))
        return out.view(data.shape)
    table = _pair_table(dtype, data.device)
    pairs = flat.view(torch.uint16).to(torch.int32)
    torch.index_select(table, 0, pairs, out=out.view(-1).view(table.dtype))
    return out.view(data.shape)


def e8m0_to_float32(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> 2^(byte - 127) as float32, built from bits (byte 0 is the subnormal 2^-127, 255 -> NaN)."""
    b = scale.to(torch.int32)
    bits = torch.where(b == 0, 0x00400000, b << 23)
    bits = torch.where(b == E8M0_NAN_BYTE, 0x7FC00000, bits)
    return bits.view(torch.float32)
