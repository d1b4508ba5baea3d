"""FP8 grids with fp32 scales (tensor, 128x128 / 1x128 blocks, rowwise) against a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_mxfp8_reference import ref_e4m3_decode, ref_e4m3_encode

from pipeline.quant import (
    PRECISIONS,
    FP8Tensor,
    MXFP8Tensor,
    check_precision,
    dequantize,
    dequantize_fp8,
    fake_quantize,
    quantize_fp8_block128,
    quantize_fp8_rowwise,
    quantize_fp8_tensor,
    quantize_weight,
)


def _ref_tiles(x: np.ndarray, bm: int, bn: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference: per (bm x bn) tile, s = fp32(amax / 448) (1 if amax = 0), q = E4M3(fp32(x / s))."""
    m, n = x.shape
    gm, gn = -(-m // bm), -(-n // bn)
    scale = np.ones((gm, gn), dtype=np.float32)
    for i in range(gm):
        for j in range(gn):
            a = np.abs(x[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]).max()
            if a > 0:
                scale[i, j] = np.float32(a) / np.float32(448.0)
    full = np.repeat(np.repeat(scale, bm, 0), bn, 1)[:m, :n]
    return ref_e4m3_encode((x / full).astype(np.float32)), scale


def _x(m=256, n=384, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g) * torch.logspace(-4, 4, n)


@pytest.mark.parametrize(
    ("quantize", "tile", "granularity"),
    [
        (quantize_fp8_tensor, (None, None), "tensor"),
        (quantize_fp8_rowwise, (1, None), "rowwise"),
        (quantize_fp8_block128, (128, 128), "block128x128"),
        (lambda x: quantize_fp8_block128(x, block=(1, 128)), (1, 128), "block1x128"),
    ],
)
def test_bytes_and_scales_match_reference(quantize, tile, granularity):
    for x in (_x(), _x(200, 300, seed=1)):  # the second has partial edge tiles
        x_np = x.numpy()
        bm = tile[0] or x.shape[0]
        bn = tile[1] or x.shape[1]
        ref_data, ref_scale = _ref_tiles(x_np, bm, bn)
        q = quantize(x)
        assert isinstance(q, FP8Tensor) and q.granularity == granularity
        assert q.scale.dtype == torch.float32 and q.scale.shape == ref_scale.shape
        np.testing.assert_array_equal(q.scale.numpy(), ref_scale)
        np.testing.assert_array_equal(q.data.numpy(), ref_data)
        deq = dequantize_fp8(q)
        full = np.repeat(np.repeat(ref_scale, bm, 0), bn, 1)[: x.shape[0], : x.shape[1]]
        np.testing.assert_array_equal(deq.numpy(), (ref_e4m3_decode(ref_data) * full).astype(np.float32))


def test_round_trip_error_and_saturation():
    x = _x(seed=2)
    for q in (quantize_fp8_rowwise(x), quantize_fp8_block128(x), quantize_fp8_tensor(x)):
        err = (dequantize_fp8(q) - x).abs()
        s = q.scale.repeat_interleave(q.block[0], 0)[: x.shape[0]].repeat_interleave(q.block[1], 1)
        s = s.expand_as(x) if s.shape != x.shape else s
        assert (err <= 2**-4 * x.abs() + 2**-10 * s * (1 + 2**-20)).all()
        assert (q.data & 0x7F).max() <= 0x7E  # never NaN, never above 448
    zero = quantize_fp8_tensor(torch.zeros(4, 8))
    assert zero.scale.item() == 1.0 and zero.data.eq(0).all()


def test_nan_skipped_in_scale_and_written_canonically():
    x = torch.tensor([[1.0, -float("nan"), 2.0, 448.0]])
    q = quantize_fp8_rowwise(x)
    assert q.scale.item() == 1.0 and q.data.tolist() == [[0x38, 0x7F, 0x40, 0x7E]]


def test_3d_weights_get_per_leading_index_tiles():
    w = torch.randn(3, 256, 128)
    q = quantize_fp8_block128(w)
    assert q.scale.shape == (3, 2, 1)
    for e in range(3):
        qe = quantize_fp8_block128(w[e])
        assert torch.equal(q.data[e], qe.data) and torch.equal(q.scale[e], qe.scale)
    assert quantize_fp8_rowwise(w).scale.shape == (3, 256, 1)


def test_precision_ids_dispatch_to_their_grids():
    assert PRECISIONS == (
        "bf16", "mxfp8", "mxfp8-te212", "mxfp8-floor", "fp8-tensor", "fp8-block128", "fp8-rowwise",
    )  # fmt: skip
    with pytest.raises(ValueError, match="mxfp8-floor"):
        check_precision("mxfp4")
    w = torch.randn(256, 256, dtype=torch.bfloat16)
    assert quantize_weight(w, "bf16") is None
    kinds = {p: quantize_weight(w, p) for p in PRECISIONS[1:]}
    assert [q.rule for p, q in kinds.items() if isinstance(q, MXFP8Tensor)] == ["te", "te212", "floor"]
    assert [q.granularity for q in kinds.values() if isinstance(q, FP8Tensor)] == [
        "tensor", "block128x128", "rowwise",
    ]  # fmt: skip
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    assert fake_quantize(x, "bf16") is x
    for p in PRECISIONS[1:]:
        y = fake_quantize(x, p)
        assert y.dtype == x.dtype and y.shape == x.shape and not torch.equal(y, x)
    act = fake_quantize(x, "fp8-block128")
    assert torch.equal(act, dequantize(quantize_fp8_block128(x, block=(1, 128)), torch.bfloat16))
    col = fake_quantize(x.float().t().contiguous(), "fp8-rowwise", axis=0)
    assert torch.equal(col, dequantize(quantize_fp8_rowwise(x.float()), torch.float32).t())


def test_bad_inputs_raise():
    with pytest.raises(TypeError):
        quantize_fp8_tensor(torch.arange(4))
    with pytest.raises(ValueError, match="block"):
        quantize_fp8_block128(torch.randn(128, 128), block=(32, 32))
    with pytest.raises(ValueError, match=">= 2 dims"):
        quantize_fp8_block128(torch.randn(128))
    with pytest.raises(TypeError, match="FP8Tensor"):
        dequantize(torch.zeros(3))
