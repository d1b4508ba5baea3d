"""GEMM-swizzled scale layout: the cuBLAS/TE index formula, zero padding and the round trip."""

from __future__ import annotations

import pytest
import torch

from pipeline.quant import quantize_mxfp8, swizzle_mxfp8_scales, unswizzle_mxfp8_scales
from pipeline.quant.swizzle import swizzled_index


@pytest.mark.parametrize(("M", "Kb"), [(128, 4), (256, 8), (100, 3), (130, 9), (1, 1)])
def test_every_scale_lands_at_the_formula_index_and_padding_is_zero(M, Kb):
    scale = torch.randint(1, 255, (M, Kb), generator=torch.Generator().manual_seed(M * Kb)).to(torch.uint8)
    swz = swizzle_mxfp8_scales(scale)
    Mp, Kbp = -(-M // 128) * 128, -(-Kb // 4) * 4
    assert swz.shape == (Mp, Kbp)
    flat = swz.flatten()
    written = torch.zeros(Mp * Kbp, dtype=torch.bool)
    for r in range(M):
        for c in range(Kb):
            i = swizzled_index(r, c, Kb)
            assert flat[i] == scale[r, c]
            written[i] = True
    assert flat[~written].eq(0).all()  # padding is zeroed, not garbage
    assert torch.equal(unswizzle_mxfp8_scales(swz, M, Kb), scale)


def test_formula_matches_the_tile_description_for_a_known_entry():
    # row 33 -> (33 % 32) * 16 + (33 // 32) * 4 = 20; column 6 -> tile 1 (512 bytes) + 6 % 4
    assert swizzled_index(33, 6, 8) == 512 + 20 + 2
    assert swizzled_index(128, 0, 8) == 2 * 512  # second tile row starts after Kb/4 tiles


def test_round_trip_of_real_scales_and_bad_sizes():
    q = quantize_mxfp8(torch.randn(320, 224))
    swz = swizzle_mxfp8_scales(q.scale)
    assert not torch.equal(swz[:320, :7], q.scale)  # the layout really differs from compact
    assert torch.equal(unswizzle_mxfp8_scales(swz, 320, 7), q.scale)
    with pytest.raises(ValueError, match="M=320"):
        unswizzle_mxfp8_scales(swz[:128], 320, 7)
    with pytest.raises(TypeError):
        swizzle_mxfp8_scales(q.scale.float())
