"""Cross-check against torchao 0.18.0 ``to_mx`` RCEIL (the ``bench`` extra; skipped when not installed).

torchao 0.18.0 (released 2026-07-31) computes log2(amax / 448) in fp32 and multiplies byte-0 blocks by 1.0, so
it matches TE >= 2.13 only on bf16 blocks with amax > 448 * 2^-127; on fp32 amax just above 448 * 2^k its scale
can be one byte too small (fp32 log2 rounds k + 1.7e-7 down to k).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_mxfp8_reference import all_positive_finite_bf16, bits_f32, f32_bits

from pipeline.quant import quantize_mxfp8

pytestmark = pytest.mark.slow  # importing torchao takes ~10-20 s on this machine


def _torchao(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    config = pytest.importorskip("torchao.prototype.mx_formats.config")
    scale, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, config.ScaleCalculationMode.RCEIL)
    return scale.view(torch.uint8).reshape(*x.shape[:-1], -1), data.view(torch.uint8)


def test_torchao_018_matches_te_rule_on_bf16_blocks_above_the_tiny_range():
    amax = all_positive_finite_bf16()
    amax = amax[amax > np.float32(448.0 * 2.0**-127)]
    x = torch.from_numpy(np.repeat(amax, 32)).view(-1, 32) * torch.linspace(-1, 1, 32)
    x[:, -1] = torch.from_numpy(amax)
    x = x.to(torch.bfloat16)
    ours = quantize_mxfp8(x, rule="te")
    scale, data = _torchao(x)
    assert torch.equal(scale, ours.scale) and torch.equal(data, ours.data)


def test_torchao_018_scale_is_one_byte_low_just_above_448_times_power_of_two_in_fp32():
    base = f32_bits(np.float32(448.0) * np.exp2(np.arange(-100, 100)).astype(np.float32))
    x = torch.from_numpy(bits_f32(base + 1)).repeat_interleave(32).view(-1, 32)
    ours = quantize_mxfp8(x, rule="te")
    scale, _ = _torchao(x)
    low = (ours.scale.int() - scale.int()).flatten()
    assert set(low.tolist()) <= {0, 1} and low.sum() > 0
