"""An independent MXFP8 / E4M3 reference in NumPy integer and bit arithmetic, plus checks of the reference itself.

Written from the rules (TE >= 2.13 ``quantize_mxfp8.cuh`` / ``float_to_e8m0`` / ``exp2f_rcp``; TE <= 2.12 byte-0
reciprocal 1.0; OCP FLOOR), not from ``pipeline.quant``. Other test modules import the ``ref_*`` functions.
Only IEEE fp32 multiplication is borrowed from NumPy (x * power of two, amax * fp32(1/448)); rounding to E4M3,
rounding up to E8M0 and everything else is integer code.
"""

from __future__ import annotations

import math

import numpy as np

RCP_448_F32 = np.array([0x3B124925], dtype=np.uint32).view(np.float32)[0]


def f32_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.int64)


def bits_f32(b: np.ndarray) -> np.ndarray:
    return np.asarray(b, dtype=np.int64).astype(np.uint32).view(np.float32)


def ref_e4m3_encode(y: np.ndarray) -> np.ndarray:
    """fp32 values -> E4M3 bytes: RNE, saturate to +-448, Inf -> +-448, NaN -> 0x7F. Integer arithmetic only."""
    bits = f32_bits(y.ravel())
    sign = (bits >> 31) & 1
    exp_field = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    is_nan = (exp_field == 255) & (mant != 0)
    is_inf = (exp_field == 255) & (mant == 0)
    sig = np.where(exp_field > 0, mant | 0x800000, mant)  # value = sig * 2^(e - 23)
    e = np.where(exp_field > 0, exp_field - 127, -126)
    q_exp = np.maximum(e, -6) - 3  # E4M3 quantum: 2^(e-3) for normals, 2^-9 below 2^-6
    shift = np.minimum(q_exp - e + 23, 40)  # always >= 20
    q = sig >> shift
    rem = sig & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    q = q + ((rem > half) | ((rem == half) & (q & 1 == 1)))
    # q counts quanta of 2^q_exp; re-normalize a carry out of the mantissa (q == 16 -> next binade).
    normal = q_exp > -9
    carry = normal & (q == 16)
    e2 = np.where(carry, np.maximum(e, -6) + 1, np.maximum(e, -6))
    q2 = np.where(carry, 8, q)
    code_normal = ((e2 + 7) << 3) | (q2 - 8)
    code = np.where(normal, code_normal, q)  # subnormal region: q in 0..8 is the code itself (8 = 2^-6)
    code = np.where(code > 0x7E, 0x7E, code)
    code = np.where(is_inf, 0x7E, code)
    code = code | (sign << 7)
    code = np.where(is_nan, 0x7F, code)
    return code.astype(np.uint8).reshape(y.shape)


def ref_e4m3_decode(b: np.ndarray) -> np.ndarray:
    """E4M3 bytes -> float64 values (NaN for 0x7F/0xFF)."""
    b = np.asarray(b, dtype=np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 7
    mag = np.where(e == 0, m * 2.0**-9, (8 + m) * np.exp2(e - 10.0))
    return np.where((b & 0x7F) == 0x7F, np.nan, s * mag)


def ref_absmax_f32(x32_blocks: np.ndarray) -> np.ndarray:
    """Block amax (last axis) with NaN skipped (all-NaN -> 0), as float32."""
    a = np.abs(x32_blocks.astype(np.float32))
    return np.where(np.isnan(a), np.float32(0), a).max(axis=-1)


def ref_te_scale_byte(amax: np.ndarray) -> np.ndarray:
    """TE float_to_e8m0(fp32(amax * fp32(1/448))): round up to a power of two by bits, saturate at 254."""
    d = (amax.astype(np.float32) * RCP_448_F32).astype(np.float32)
    bits = f32_bits(d)
    exp_field = bits >> 23
    mant = bits & 0x7FFFFF
    byte = np.where(exp_field > 0, exp_field + (mant != 0), (mant > 0x400000).astype(np.int64))
    byte = np.where(exp_field == 255, 254, byte)
    return np.minimum(byte, 254)


def ref_floor_scale_byte(amax: np.ndarray) -> np.ndarray:
    """OCP FLOOR: floor(log2 amax) - 8 + 127 from the fp32 bits, clamped to [0, 254]; 0 -> 0; Inf -> 254."""
    bits = f32_bits(amax)
    exp_field = bits >> 23
    mant = bits & 0x7FFFFF
    sub_log2 = np.array([int(m).bit_length() - 1 - 149 if m else 0 for m in mant.ravel()]).reshape(mant.shape)
    fl = np.where(exp_field > 0, exp_field - 127, sub_log2)
    byte = np.clip(fl - 8 + 127, 0, 254)
    byte = np.where(bits == 0, 0, byte)
    return np.where(exp_field == 255, 254, byte)


def ref_rcp(byte: np.ndarray, rule: str) -> np.ndarray:
    out = np.exp2(127.0 - byte.astype(np.float64)).astype(np.float32)  # 2^-127 is an exact fp32 subnormal
    if rule == "te212":
        out = np.where(byte == 0, np.float32(1.0), out)
        out = np.where(byte == 254, np.float32(0.0), out)
    return out.astype(np.float32)


def ref_quantize_rows(x: np.ndarray, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Reference MXFP8 of x (float32-representable values; 1x32 blocks along the last axis)."""
    x32 = np.asarray(x, dtype=np.float32)
    blocks = x32.reshape(*x32.shape[:-1], x32.shape[-1] // 32, 32)
    amax = ref_absmax_f32(blocks)
    byte = ref_floor_scale_byte(amax) if rule == "floor" else ref_te_scale_byte(amax)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (blocks * ref_rcp(byte, rule)[..., None]).astype(np.float32)
    return ref_e4m3_encode(y).reshape(x32.shape), byte.astype(np.uint8)


def closed_form_te_byte(amax: float) -> int:
    """clamp(ceil(log2(amax/448)) + 127, 0, 254), amax 0 -> 0, in exact rational integer arithmetic."""
    if amax == 0:
        return 0
    mant, exp = math.frexp(amax)  # amax = mant * 2^exp exactly, mant in [0.5, 1)
    num = int(mant * 2**53)  # amax = num * 2^(exp - 53)
    lo, hi = -400, 400
    while lo < hi:  # binary search on k
        k = (lo + hi) // 2
        lhs, rhs = num, 448
        shift = k - (exp - 53)
        if shift >= 0:
            rhs <<= shift
        else:
            lhs <<= -shift
        if lhs <= rhs:
            hi = k
        else:
            lo = k + 1
    return min(max(lo + 127, 0), 254)


def all_positive_finite_bf16() -> np.ndarray:
    """All 32,639 positive finite bfloat16 values (bit patterns 0x0001..0x7F7F) as float32."""
    return bits_f32(np.arange(1, 0x7F80, dtype=np.int64) << 16)


# --- checks of the reference itself --------------------------------------------------------------------------


def test_reference_e4m3_decode_encode_round_trips_every_byte():
    codes = np.arange(256)
    values = ref_e4m3_decode(codes)
    finite = ~np.isnan(values)
    back = ref_e4m3_encode(values[finite].astype(np.float32))
    assert np.array_equal(back, codes[finite])
    assert values[0x7E] == 448.0 and values[0x01] == 2.0**-9 and values[0x08] == 2.0**-6


def test_reference_e4m3_rounds_ties_to_even_and_saturates():
    cases = {
        1.0 + 2**-4: 0x38,  # tie between 1.0 (even) and 1.125 -> 1.0
        1.125 + 2**-4: 0x3A,  # tie between 1.125 and 1.25 (even) -> 1.25
        2.0**-10: 0x00,  # tie between 0 and 2^-9 -> 0
        3 * 2.0**-10: 0x02,  # tie between 2^-9 and 2*2^-9 (even) -> 2^-9 * 2
        464.0: 0x7E,  # would round to 512: saturates
        1e30: 0x7E,
        -np.inf: 0xFE,
        -0.0: 0x80,
    }
    got = ref_e4m3_encode(np.array(list(cases), dtype=np.float32))
    assert got.tolist() == list(cases.values())
    assert ref_e4m3_encode(np.array([np.nan, -np.nan], dtype=np.float32)).tolist() == [0x7F, 0x7F]


def test_reference_te_byte_equals_closed_form_on_all_bf16_amax():
    amax = all_positive_finite_bf16()
    expected = np.array([closed_form_te_byte(float(a)) for a in amax])
    assert np.array_equal(ref_te_scale_byte(amax), expected)
    assert ref_te_scale_byte(np.array([0.0], dtype=np.float32))[0] == 0
