"""MXFP8 quantization, bit-exact with Transformer Engine's 1x32 E8M0 / E4M3 recipe (emulated on any device).

An MXFP8 tensor stores every element as an E4M3 byte and, for every block of 32 consecutive elements along one
axis, one shared E8M0 scale byte ``b`` meaning 2^(b - 127). The value of an element is ``e4m3(byte) * 2^(b - 127)``.

The scale rule decides which grid a tensor lands on. Three rules are implemented (per block, amax = max |x|):

``rule="te"`` -- Transformer Engine >= 2.13 (the learner on Blackwell; precision id ``mxfp8``). Sources:
TE ``common/cast/mxfp8/quantize_mxfp8.cuh`` (rowwise/colwise kernels), ``common/util/ptx_arch_spec.cuh``
(``float_to_e8m0``), ``common/util/ptx.cuh`` (``exp2f_rcp``, ``mul_cvt_2x``), TE PR #2647 (commit 71971e3, v2.13):

1. amax over the block **in the input dtype**, NaN elements skipped (accumulator starts at 0; an all-NaN block
   has amax 0).
2. descale = fp32(amax * fp32(1/448)) -- a multiply by the constant 0x3B124925, not a division.
3. byte = descale rounded *up* to a power of two (``cvt.rp.satfinite.ue8m0``), computed on the fp32 bits: the
   exponent field, plus 1 if the mantissa is non-zero; for a subnormal descale, 1 if the mantissa exceeds
   0x400000 (= 2^-127, already byte 0), else 0; saturating at 254. Closed form: 0 for amax = 0, otherwise
   clamp(ceil(log2(amax / 448)) + 127, 0, 254) -- exact for every bf16 amax, and for every fp32 amax but one:
   448 * 2^-127 + 1 ulp, whose descale rounds to the subnormal 2^-127 (byte 0, not 1). A finite amax never
   exceeds byte 247; an Inf amax gives 254.
4. elements = E4M3 RNE of fp32(x * 2^(127 - byte)) with saturation: the reciprocal is built from bits (byte 254
   -> 2^-127). NaN -> 0x7F; Inf -> +-448 (its finite block peers become 0).

``rule="te212"`` -- TE <= 2.12 (precision id ``mxfp8-te212``): same scale bytes, but the reciprocal of byte 0 is 1.0
(so non-zero blocks with amax <= 448 * 2^-127 ~= 2.6e-36 flush to zero) and of byte 254 is 0.0 (so an Inf
element becomes 0 * Inf = NaN).

``rule="floor"`` -- the OCP MX v1.0 reference conversion (precision id ``mxfp8-floor``): scale 2^(floor(log2 amax) - 8)
from the exponent bits of amax (8 = emax of E4M3), clamped to bytes [0, 254]; elements RNE + saturation, so block
maxima in (448, 512) * scale clip to 448. Writing amax = 1.m * 2^n, FLOOR = TE exactly when 1.m <= 1.75 and one
byte below TE when 1.m > 1.75. Special values follow the TE rule (NaN skipped, Inf -> byte 254).

Scale bytes are E8M0 (byte 0 = 2^-127, not zero); dequantization is fp32(e4m3) * 2^(byte - 127) cast to the
output dtype (TE ``dequantize_mxfp8.cuh``).

Axes: ``axis=-1`` is TE's *rowwise* usage (1x32 blocks along the last dim), ``axis=0`` on a 2-D tensor is
*columnwise* (32x1 blocks along dim 0; data keeps the shape of x, it is not transposed). The two are quantized
independently from the high-precision tensor and are not derivable from each other.

Shape legend: ``x_MK`` has M rows and K columns; ``Kb = K // 32`` blocks per row.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from pipeline.quant.e4m3 import (
    E4M3_MAX,
    E4M3_NAN_BYTE,
    E8M0_MAX_BYTE,
    check_float_tensor,
    decode_e4m3,
    e8m0_to_float32,
    nan_skipping_absmax,
)

BLOCK = 32
CHUNK_BLOCKS = 8192  # blocks per chunk: 256 Ki elements, a 1 MiB float32 temporary
RULES = ("te", "te212", "floor")
# fp32(1/448) = 0x3B124925: TE's `Quantized_Limits<e4m3>::max_norm_rcp`, relative error +4.5e-8.
# A Python float holding that fp32 value exactly: ``amax * _RCP_448_F32`` on a float32 tensor stays a float32
# multiply (a scalar does not promote), on any device and inside torch.compile'd graphs (no CPU tensor constant).
_RCP_448_F32 = struct.unpack("<f", struct.pack("<I", 0x3B124925))[0]


@dataclass
class MXFP8Tensor:
    """MXFP8 bytes: ``data`` uint8 E4M3 patterns shaped like the source, ``scale`` uint8 E8M0 bytes with the
    quantized ``axis`` divided by 32, the ``rule`` that chose the scales and the source dtype."""

    data: torch.Tensor
    scale: torch.Tensor
    axis: int
    rule: str
    orig_dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def check_rule(rule: object) -> str:
    if rule not in RULES:
        raise ValueError(f"unknown MXFP8 scale rule {rule!r}; valid rules: {', '.join(RULES)}")
    return rule  # type: ignore[return-value]


def scale_bytes_from_amax(amax: torch.Tensor, rule: str) -> torch.Tensor:
    """E8M0 byte per block from a float32 amax tensor (no NaN), by ``rule``; returns int32."""
    if rule == "floor":
        bits = amax.view(torch.int32)
        exp_field = bits >> 23
        # Subnormal amax: floor(log2) from the integer mantissa's own (exact) float32 exponent.
        sub_log2 = ((bits.to(torch.float32).view(torch.int32) >> 23) - 127) - 149
        floor_log2 = torch.where(exp_field > 0, exp_field - 127, sub_log2)
        byte = (floor_log2 - 8 + 127).clamp_(0, E8M0_MAX_BYTE)
        byte = torch.where(bits == 0, 0, byte)
        return torch.where(exp_field == 255, E8M0_MAX_BYTE, byte)
    descale_bits = (amax * _RCP_448_F32).view(torch.int32)
    # Normal: exponent field + (mantissa != 0), in one add; subnormal <= 2^-127 -> byte 0.
    byte = (descale_bits + 0x7FFFFF) >> 23
    byte = torch.where(descale_bits <= 0x00400000, 0, byte)
    return byte.clamp_(max=E8M0_MAX_BYTE)


def reciprocal_from_bytes(byte: torch.Tensor, rule: str) -> torch.Tensor:
    """The multiplier 2^(127 - byte) as float32, built from bits, with the TE <= 2.12 exceptions for te212."""
    bits = torch.where(byte >= E8M0_MAX_BYTE, 0x00400000, (E8M0_MAX_BYTE - byte) << 23)
    if rule == "te212":
        bits = torch.where(byte == 0, 0x3F800000, bits)  # 1.0
        bits = torch.where(byte == E8M0_MAX_BYTE, 0, bits)  # 0.0
    return bits.view(torch.float32)


def _quantize_blocks(xb: torch.Tensor, rule: str, data_out: torch.Tensor) -> torch.Tensor:
    """Quantize blocks ``xb`` [n, 32] into ``data_out`` (uint8 [n, 32]); return the scale bytes [n] (int32)."""
    amax, has_nan, has_inf = nan_skipping_absmax(xb, dim=-1)
    byte = scale_bytes_from_amax(amax, rule)
    rcp = reciprocal_from_bytes(byte, rule)
    y = xb.to(torch.float32) if xb.dtype != torch.float32 else xb.clone()
    y.mul_(rcp.unsqueeze(-1))  # exact: a power of two (barring fp32 underflow, far below E4M3's 2^-10)
    # TE scales put finite elements at <= 448 (the rounded-up power of two covers amax) except where the fp32
    # descale is subnormal and rounds down (amax = 448 * 2^-127 + 1 ulp); check on the block maxima, which
    # bound every element of their block, and clamp only when some block can exceed 448.
    if rule == "floor" or has_inf or bool((amax * rcp > E4M3_MAX).any()):
        y.clamp_(-E4M3_MAX, E4M3_MAX)
    data_out.view(torch.float8_e4m3fn).copy_(y)  # torch's RNE cast (checked bit-exact by the tests)
    if has_nan or has_inf:
        data_out.masked_fill_(torch.isnan(y), E4M3_NAN_BYTE)
    return byte


def _quantize_lastdim(x: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize 1x32 blocks along the last dim; returns (data uint8 [x.shape], scale uint8 [..., K/32]).

    Works through the tensor in chunks of CHUNK_BLOCKS blocks so the float32 temporaries stay in cache and
    are recycled by the allocator instead of faulting in fresh pages (about 2x faster on one core).
    """
    xb = x.contiguous().view(-1, BLOCK)
    data = torch.empty(xb.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(xb.shape[0], dtype=torch.uint8, device=x.device)
    for start in range(0, xb.shape[0], CHUNK_BLOCKS):
        stop = start + CHUNK_BLOCKS
        scale[start:stop] = _quantize_blocks(xb[start:stop], rule, data[start:stop])
    return data.view(x.shape), scale.view(*x.shape[:-1], x.shape[-1] // BLOCK)


def _normalize_axis(x: torch.Tensor, axis: int) -> int:
    if not isinstance(axis, int):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if axis in (-1, x.ndim - 1):
        return -1
    if axis == 0 and x.ndim == 2:
        return 0
    raise ValueError(
        f"axis must be -1 (any ndim) or 0 (2-D tensors only); got axis={axis} for shape {tuple(x.shape)}"
    )


def quantize_mxfp8_along(x: torch.Tensor, dim: int, *, rule: str = "te") -> MXFP8Tensor:
    """Quantize 32-element blocks along any ``dim`` of ``x`` (the general form behind :func:`quantize_mxfp8`).

    The result's ``axis`` is ``dim`` (negative for the last dim: -1). Used for 3-D expert weights, whose
    columnwise blocks run along dim -2.
    """
    check_float_tensor(x)
    check_rule(rule)
    d = dim % x.ndim
    if x.shape[d] % BLOCK:
        raise ValueError(
            f"MXFP8 needs the quantized dim to be a multiple of {BLOCK}: dim {d} of shape {tuple(x.shape)} "
            f"has {x.shape[d]} elements (pad it, or use a different axis)"
        )
    if d == x.ndim - 1:
        data, scale = _quantize_lastdim(x, rule)
        return MXFP8Tensor(data, scale, -1, rule, x.dtype)
    data, scale = _quantize_lastdim(x.movedim(d, -1), rule)
    return MXFP8Tensor(data.movedim(-1, d).contiguous(), scale.movedim(-1, d).contiguous(), d, rule, x.dtype)


def quantize_mxfp8(x: torch.Tensor, axis: int = -1, *, rule: str = "te") -> MXFP8Tensor:
    """Quantize ``x`` to MXFP8 with 32-element blocks along ``axis`` (-1: rowwise, 0 on 2-D: columnwise).

    Any strides; float32/bfloat16/float16. See the module docstring for the three scale ``rule``s.
    """
    check_float_tensor(x)
    check_rule(rule)
    return quantize_mxfp8_along(x, _normalize_axis(x, axis), rule=rule)


def dequantize_mxfp8(q: MXFP8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """fp32(e4m3) * 2^(byte - 127), cast to ``dtype`` (computed directly in bfloat16 when asked: the product of a
    4-bit significand and a power of two is exact in fp32, so bf16 math rounds it the same way)."""
    if not isinstance(q, MXFP8Tensor):
        raise TypeError(f"dequantize_mxfp8 expects an MXFP8Tensor, got {type(q).__name__}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"dequantize dtype must be a float dtype, got {dtype}")
    work = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    d = q.axis % q.data.ndim
    scale = e8m0_to_float32(q.scale).to(work)
    if d != q.data.ndim - 1:
        values = decode_e4m3(q.data, work).unflatten(d, (q.data.shape[d] // BLOCK, BLOCK))
        values.mul_(scale.unsqueeze(d + 1))
        return values.flatten(d, d + 1).to(dtype)
    data_b = q.data.contiguous().view(-1, BLOCK)
    scale_b = scale.view(-1, 1)
    values = torch.empty(data_b.shape, dtype=work, device=q.data.device)
    for start in range(0, data_b.shape[0], CHUNK_BLOCKS):  # cache-sized chunks, as in quantization
        stop = start + CHUNK_BLOCKS
        decode_e4m3(data_b[start:stop], work, out=values[start:stop]).mul_(scale_b[start:stop])
    return values.view(q.data.shape).to(dtype)
