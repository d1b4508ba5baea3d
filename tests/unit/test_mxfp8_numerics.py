"""MXFP8 bytes from pipeline.quant equal the independent integer reference, for all three scale rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_mxfp8_reference import (
    all_positive_finite_bf16,
    bits_f32,
    closed_form_te_byte,
    f32_bits,
    ref_e4m3_decode,
    ref_e4m3_encode,
    ref_quantize_rows,
)

from pipeline.quant import MXFP8Tensor, dequantize_mxfp8, quantize_mxfp8, quantize_mxfp8_along
from pipeline.quant.e4m3 import decode_e4m3, encode_e4m3

RULES = ("te", "te212", "floor")


def _blocks_below(amax_f32: np.ndarray, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """One block per amax: element 0 is +-amax, the other 31 have random bit patterns of smaller magnitude."""
    rng = np.random.default_rng(seed)
    if dtype == torch.bfloat16:
        top = (f32_bits(amax_f32) >> 16).astype(np.int64)
        mags = rng.integers(0, top[:, None] + 1, size=(len(top), 31))
        bits = np.concatenate([top[:, None], mags], axis=1) | (rng.integers(0, 2, (len(top), 32)) << 15)
        return torch.from_numpy((bits & 0xFFFF).astype(np.uint16).view(np.int16)).view(torch.bfloat16)
    top = f32_bits(amax_f32)
    mags = rng.integers(0, top[:, None] + 1, size=(len(top), 31))
    bits = np.concatenate([top[:, None], mags], axis=1) | (rng.integers(0, 2, (len(top), 32)) << 31)
    return torch.from_numpy(bits_f32(bits))


def _assert_matches_reference(x: torch.Tensor, rule: str, axis: int = -1) -> MXFP8Tensor:
    q = quantize_mxfp8(x, axis, rule=rule)
    x_np = x.float().numpy()
    if axis == 0:
        data_t, scale_t = ref_quantize_rows(x_np.T, rule)
        ref_data, ref_scale = data_t.T, scale_t.T
    else:
        ref_data, ref_scale = ref_quantize_rows(x_np, rule)
    assert q.data.dtype == torch.uint8 and q.scale.dtype == torch.uint8
    assert q.data.shape == x.shape
    np.testing.assert_array_equal(q.scale.numpy(), ref_scale)
    np.testing.assert_array_equal(q.data.numpy(), ref_data)
    return q


@pytest.mark.parametrize("rule", RULES)
def test_every_positive_bf16_amax_gives_reference_bytes(rule):
    x = _blocks_below(all_positive_finite_bf16(), torch.bfloat16)
    q = _assert_matches_reference(x, rule)
    if rule != "floor":
        closed = [closed_form_te_byte(float(a)) for a in all_positive_finite_bf16()[::97]]
        assert q.scale[::97, 0].tolist() == closed


@pytest.mark.parametrize("rule", RULES)
def test_fp32_amax_within_two_ulp_of_448_times_power_of_two(rule):
    base = f32_bits(np.float32(448.0) * np.exp2(np.arange(-135, 120)).astype(np.float32))
    amax = bits_f32((base[:, None] + np.arange(-2, 3)[None, :]).ravel())
    x = _blocks_below(amax, torch.float32, seed=1)
    q = _assert_matches_reference(x, rule)
    if rule == "te":
        closed = np.array([closed_form_te_byte(float(a)) for a in amax])
        off = np.nonzero(q.scale[:, 0].numpy() != closed)[0]
        # The closed form holds everywhere but at one fp32 amax: see the next test.
        assert f32_bits(amax[off]).tolist() == [0x04600001]


def test_closed_form_fails_only_where_the_fp32_descale_is_subnormal():
    """amax = 448 * 2^-127 + 1 ulp: amax * fp32(1/448) = 2^-127 (1 + 2^-22.8) rounds to the subnormal
    0x00400000 (ulp 2^-149), so TE's bit rule gives byte 0 where ceil(log2(amax/448)) + 127 says 1; the block
    maximum then lands just above 448 and rounds to 448."""
    amax = bits_f32(np.array([0x04600001]))
    x = torch.from_numpy(np.repeat(amax, 32)).view(1, 32)
    q = quantize_mxfp8(x)
    assert closed_form_te_byte(float(amax[0])) == 1
    assert q.scale.item() == 0 and q.data.eq(0x7E).all()


def test_tiny_blocks_keep_their_elements_under_te_but_flush_under_te212():
    amax = np.float32(2.6e-36) * np.exp2(-np.arange(0, 20, dtype=np.float32))  # reaches fp32 subnormals
    x = _blocks_below(amax.astype(np.float32), torch.float32, seed=2)
    q_te = _assert_matches_reference(x, "te")
    q_212 = _assert_matches_reference(x, "te212")
    assert q_te.scale.eq(0).all() and q_212.scale.eq(0).all()
    representable = torch.from_numpy(amax >= 2.0**-136)  # amax * 2^127 >= 2^-9, the smallest E4M3
    assert (q_te.data & 0x7F).ne(0).any(dim=1)[representable].all()
    assert (q_212.data & 0x7F).eq(0).all()  # x * 1.0 underflows E4M3: all +-0
    dq = dequantize_mxfp8(q_te)
    normal = torch.from_numpy(amax >= 2.0**-133)  # amax * 2^127 >= 2^-6: a normal E4M3, 3 mantissa bits
    assert torch.allclose(dq[normal, 0], x[normal, 0], rtol=2**-4, atol=0)


@pytest.mark.parametrize("rule", RULES)
def test_nan_elements_are_skipped_by_amax_and_written_as_0x7f(rule):
    x = torch.linspace(-3.0, 3.0, 96, dtype=torch.float32).reshape(1, 96)
    x[0, 5] = float("nan")
    x[0, 6] = -float("nan")
    x[0, 32:64] = float("nan")  # an all-NaN block
    q = _assert_matches_reference(x, rule)
    clean = x.clone()
    clean[0, 5:7] = 0.0
    q_clean = quantize_mxfp8(clean, rule=rule)
    assert q.scale[0, 0] == q_clean.scale[0, 0]  # NaN did not reach amax
    assert q.data[0, 5] == 0x7F and q.data[0, 6] == 0x7F
    assert q.scale[0, 1] == 0 and q.data[0, 32:64].eq(0x7F).all()


@pytest.mark.parametrize("rule", RULES)
def test_inf_blocks_saturate_the_scale_and_the_element(rule):
    x = torch.full((2, 32), 3.0)
    x[0, 0] = float("inf")
    x[1, 7] = -float("inf")
    q = _assert_matches_reference(x, rule)
    assert q.scale.flatten().tolist() == [254, 254]
    if rule == "te212":  # reciprocal 0.0: Inf * 0 = NaN, finite peers 0
        assert q.data[0, 0] == 0x7F and q.data[1, 7] == 0x7F
    else:  # reciprocal 2^-127: Inf -> +-448, finite peers underflow to 0
        assert q.data[0, 0] == 0x7E and q.data[1, 7] == 0xFE
    assert q.data[0, 1:].eq(0).all()


@pytest.mark.parametrize("rule", RULES)
def test_zero_blocks_get_byte_zero_and_keep_the_sign_of_zero(rule):
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    x[0, 32:] = -0.0
    q = _assert_matches_reference(x, rule)
    assert q.scale.tolist() == [[0, 0]]
    assert q.data[0, :32].eq(0).all() and q.data[0, 32:].eq(0x80).all()
    assert dequantize_mxfp8(q).abs().max() == 0


@pytest.mark.parametrize("rule", RULES)
def test_columnwise_on_non_square_tensor_equals_reference_on_columns(rule):
    x = torch.randn(96, 160, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 3, 160)
    q_col = _assert_matches_reference(x, rule, axis=0)
    assert q_col.scale.shape == (3, 160) and q_col.axis == 0
    q_row = _assert_matches_reference(x, rule, axis=-1)
    assert q_row.scale.shape == (96, 5)
    q_t = quantize_mxfp8(x.t().contiguous(), rule=rule)
    assert torch.equal(q_col.data, q_t.data.t()) and torch.equal(q_col.scale, q_t.scale.t())
    assert not torch.equal(q_col.data, q_row.data)  # the two usages are genuinely different grids


def test_non_contiguous_inputs_give_the_bytes_of_their_contiguous_copy():
    g = torch.Generator().manual_seed(4)
    base = torch.randn(64, 256, generator=g, dtype=torch.bfloat16)
    views = [base[:, ::2], base.t(), base[::2], base.t()[::2].t(), base.view(64, 8, 32)[:, ::2]]
    for v in views:
        assert not v.is_contiguous()
        for axis in (-1, 0) if v.ndim == 2 else (-1,):
            if v.shape[axis] % 32:
                continue
            a, b = quantize_mxfp8(v, axis), quantize_mxfp8(v.contiguous(), axis)
            assert torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_input_and_its_fp32_upcast_give_identical_bytes(rule, dtype):
    x = (torch.randn(128, 256, generator=torch.Generator().manual_seed(5)) * 30).to(dtype)
    x[0, :32] *= 1e-6
    a, b = quantize_mxfp8(x, rule=rule), quantize_mxfp8(x.float(), rule=rule)
    assert torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale)
    assert a.orig_dtype == dtype


@pytest.mark.parametrize("rule", ["te", "te212"])
def test_round_trip_error_is_within_half_an_e4m3_step(rule):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(256, 512, generator=g) * torch.logspace(-20, 20, 512)
    q = quantize_mxfp8(x, rule=rule)
    err = (dequantize_mxfp8(q) - x).abs()
    scale = torch.exp2(q.scale.float() - 127).repeat_interleave(32, dim=1)
    # RNE to 3 mantissa bits: |err| <= 2^-4 |x| for normals, <= half the subnormal step 2^-9 * scale below.
    assert (err <= 2**-4 * x.abs() + 2**-10 * scale).all()
    block_amax = x.abs().view(256, 16, 32).amax(-1)
    assert (err.view(256, 16, 32).amax(-1) <= 2**-4 * block_amax).all()
    assert (dequantize_mxfp8(q).abs().view(256, 16, 32).amax(-1) <= 448 * scale[:, ::32]).all()


def test_floor_differs_from_te_exactly_on_blocks_whose_amax_significand_exceeds_1_75():
    amax = all_positive_finite_bf16()
    x = _blocks_below(amax, torch.bfloat16, seed=7)
    te, fl = quantize_mxfp8(x, rule="te"), quantize_mxfp8(x, rule="floor")
    mant, _ = np.frexp(amax.astype(np.float64))
    significand = 2 * mant  # in [1, 2)
    normal = amax >= np.float32(2.0**-126)
    unclamped = (fl.scale[:, 0].numpy() > 0) & normal
    differs = (te.scale[:, 0] != fl.scale[:, 0]).numpy()
    np.testing.assert_array_equal(differs[unclamped], significand[unclamped] > 1.75)
    assert ((te.scale[:, 0] - fl.scale[:, 0]).numpy()[differs & unclamped] == 1).all()
    saturated = (fl.data[:, 0].numpy() & 0x7F) == 0x7E
    assert saturated[unclamped & (significand > 1.75)].all()  # FLOOR clips those block maxima to 448


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_every_element_byte_at_every_scale_byte(dtype):
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 1)  # row = scale byte
    scale = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 8)
    out = dequantize_mxfp8(MXFP8Tensor(data, scale, -1, "te", torch.float32), dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = ref_e4m3_decode(data.numpy()) * np.exp2(scale.numpy().astype(np.float64) - 127).repeat(32, 1)
    ref[255] = np.nan  # scale byte 0xFF is NaN
    with np.errstate(over="ignore"):
        ref_t = torch.from_numpy(ref.astype(np.float32)).to(dtype)
    assert out.dtype == dtype
    assert torch.equal(torch.isnan(out), torch.isnan(ref_t))
    ok = ~torch.isnan(ref_t)
    assert torch.equal(out[ok], ref_t[ok])


def test_e4m3_encode_of_every_bf16_bit_pattern_and_every_tie_matches_reference():
    every_bf16 = (torch.arange(65536, dtype=torch.int32) << 16).view(torch.float32)
    vals = ref_e4m3_decode(np.arange(0x7F)).astype(np.float64)
    ties = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    ties = np.concatenate([ties, -ties, np.nextafter(ties, 0), np.nextafter(ties, 1000)]).astype(np.float32)
    for y in (every_bf16, torch.from_numpy(ties)):
        got = encode_e4m3(y.clone(), saturate=True)
        np.testing.assert_array_equal(got.numpy(), ref_e4m3_encode(y.numpy()))
    in_range = torch.from_numpy(ties[np.abs(ties) <= 448])  # torch's own cast: RNE without the clamp
    np.testing.assert_array_equal(
        encode_e4m3(in_range, saturate=False).numpy(), ref_e4m3_encode(in_range.numpy())
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_table_matches_reference_for_every_byte(dtype):
    for data in (torch.arange(256, dtype=torch.int32).to(torch.uint8), torch.arange(255).to(torch.uint8)):
        out = decode_e4m3(data, dtype).float().numpy()
        np.testing.assert_array_equal(out, ref_e4m3_decode(data.numpy()).astype(np.float32))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="int64"):
        quantize_mxfp8(torch.arange(64))
    with pytest.raises(ValueError, match="empty"):
        quantize_mxfp8(torch.zeros(0, 32))
    with pytest.raises(ValueError, match=r"\(4, 33\)"):
        quantize_mxfp8(torch.zeros(4, 33))
    with pytest.raises(ValueError, match=r"\(33, 64\)"):
        quantize_mxfp8(torch.zeros(33, 64), axis=0)
    with pytest.raises(ValueError, match="2-D"):
        quantize_mxfp8(torch.zeros(32, 32, 32), axis=0)
    with pytest.raises(ValueError, match="te212"):
        quantize_mxfp8(torch.zeros(32), rule="ceil")
    with pytest.raises(ValueError, match="0-d"):
        quantize_mxfp8(torch.tensor(1.0))
    with pytest.raises(TypeError, match="Tensor"):
        quantize_mxfp8(np.zeros(32))
    with pytest.raises(TypeError, match="MXFP8Tensor"):
        dequantize_mxfp8(torch.zeros(32))


@pytest.mark.slow
@pytest.mark.parametrize("rule", RULES)
def test_random_fp32_bit_patterns_give_reference_bytes(rule):
    """4M uniformly random finite fp32 bit patterns (every exponent, subnormals, both signs)."""
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 0x7F800000, size=(1 << 22,)) | (rng.integers(0, 2, 1 << 22) << 31)
    x = torch.from_numpy(bits_f32(bits)).view(-1, 1024)
    _assert_matches_reference(x, rule)
    _assert_matches_reference(x.t().contiguous()[:, :1024], rule, axis=0)


def test_quantize_along_any_dim_equals_per_slice_columnwise():
    w = torch.randn(3, 64, 96, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    q = quantize_mxfp8_along(w, -2)
    assert q.axis == 1 and q.scale.shape == (3, 2, 96)
    for e in range(3):
        qe = quantize_mxfp8(w[e], axis=0)
        assert torch.equal(q.data[e], qe.data) and torch.equal(q.scale[e], qe.scale)
    assert torch.equal(dequantize_mxfp8(q)[1], dequantize_mxfp8(quantize_mxfp8(w[1], axis=0)))
