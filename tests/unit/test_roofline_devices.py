"""perfmodel.kernels.roofline and perfmodel.kernels.devices: FLOPs and bytes of GEMM shapes recorded in a real trace, checked
against hand arithmetic; the device table's figures all carry a source; the roofline's bound and floor."""

from __future__ import annotations

import re

import pytest

from perfmodel.kernels.devices import FIGURES, device, load_devices
from perfmodel.kernels.roofline import Gemm, bound, gemm_dims
from tracing.outputs.errors import InputError

# (op, shapes as recorded in tests/data/real/hta_sampled_2rank/rank-0.json.gz, B, M, N, K, bias elements)
REAL = [
    ("aten::mm", "[[2048,125],[125,320]]", 1, 2048, 320, 125, 0),
    ("aten::mm", "[[125,2048],[2048,320]]", 1, 125, 320, 2048, 0),
    ("aten::addmm", "[[3906],[2048,512],[512,3906],[],[]]", 1, 2048, 3906, 512, 3906),
    ("aten::addmm", "[[256],[2048,2400],[2400,256],[],[]]", 1, 2048, 256, 2400, 256),
    ("aten::mm", "[[2048,110],[110,18030]]", 1, 2048, 18030, 110, 0),
    ("aten::matmul", "[[2048,110],[110,18030]]", 1, 2048, 18030, 110, 0),
    ("aten::linear", "[[2048,320],[125,320],[125]]", 1, 2048, 125, 320, 125),
    ("aten::linear", "[[2048,512],[3906,512],[3906]]", 1, 2048, 3906, 512, 3906),
    ("aten::mm", "[[32,2048],[2048,38377]]", 1, 32, 38377, 2048, 0),
    ("aten::mm", "[[15,327680],[327680,72]]", 1, 15, 72, 327680, 0),
    ("aten::bmm", "[[2048,160,7],[2048,7,72]]", 2048, 160, 72, 7, 0),
    ("aten::bmm", "[[2048,606,160],[2048,160,20]]", 2048, 606, 20, 160, 0),
    ("aten::mm", "[[2048,1],[1,32]]", 1, 2048, 32, 1, 0),
]

# hand arithmetic: FLOPs = 2 B M N K; bf16 bytes = 2 (B M K + B K N + B M N + bias)
HAND = {
    "[[2048,125],[125,320]]": (2 * 2048 * 320 * 125, 2 * (2048 * 125 + 125 * 320 + 2048 * 320)),
    "[[3906],[2048,512],[512,3906],[],[]]": (
        2 * 2048 * 3906 * 512,
        2 * (2048 * 512 + 512 * 3906 + 2048 * 3906 + 3906),
    ),
    "[[2048,160,7],[2048,7,72]]": (2 * 2048 * 160 * 72 * 7, 2 * 2048 * (160 * 7 + 7 * 72 + 160 * 72)),
    "[[15,327680],[327680,72]]": (2 * 15 * 72 * 327680, 2 * (15 * 327680 + 327680 * 72 + 15 * 72)),
}


@pytest.mark.parametrize(("op", "shapes", "b", "m", "n", "k", "bias"), REAL, ids=[r[1] for r in REAL])
def test_dims_of_real_gemm_shapes(op, shapes, b, m, n, k, bias):
    g = gemm_dims(op, shapes)
    assert g == Gemm(b, m, n, k, bias)
    assert g.flops == 2 * b * m * n * k


@pytest.mark.parametrize("shapes", sorted(HAND))
def test_flops_and_bf16_bytes_match_hand_arithmetic(shapes):
    op = next(r[0] for r in REAL if r[1] == shapes)
    g = gemm_dims(op, shapes)
    flops, nbytes = HAND[shapes]
    assert g.flops == flops
    assert g.bytes("bf16") == nbytes


def test_low_precision_bytes_count_scales_and_a_bf16_output():
    g = Gemm(1, 4096, 1024, 4096)
    a, b, c = 4096 * 4096, 4096 * 1024, 4096 * 1024
    assert g.bytes("fp8") == a + b + 2 * c
    assert g.bytes("mxfp8") == pytest.approx((a + b) * (1 + 1 / 32) + 2 * c)
    assert g.bytes("mxfp4") == pytest.approx((a + b) * (0.5 + 1 / 32) + 2 * c)
    assert g.bytes("unknown") is None


def test_shapes_that_do_not_give_mnk_are_refused():
    assert gemm_dims("aten::mm", "[[2048,125],[126,320]]") is None  # K disagrees
    assert gemm_dims("aten::linear", "[[2048,320],[],[]]") is None
    assert gemm_dims("aten::matmul", "[[32],[32]]") is None  # a dot product
    assert gemm_dims("aten::mm", "not json") is None


def test_every_device_figure_has_a_source_and_the_table_covers_the_issue():
    ids = {d.id for d in load_devices()}
    assert {"h100-sxm", "h200", "b200", "gb200", "mi300x", "mi325x", "mi355x"} <= ids
    for d in load_devices():
        for key in (*FIGURES, "hbm"):
            f = d.figures[key]
            if f.value is not None:
                assert re.match(r"https://\S+", f.source), (d.id, key)
                assert f.note, (d.id, key)
        assert d.hbm_bytes_per_s is not None, d.id


def test_peak_lookup_never_guesses():
    h100 = device("H100 SXM")
    assert h100.peak_flops("mxfp8")[0] is None and "MX" in h100.peak_flops("mxfp8")[1]
    b200 = device("b200")
    value, note = b200.peak_flops("mxfp8")
    assert value == b200.figures["fp8"].value and "no separate MXFP8" in note
    assert device("mi355x").peak_flops("bf16")[0] is None  # unsourced: left empty
    with pytest.raises(InputError, match="known: "):
        device("a100")


def test_roofline_bound_and_floor():
    h100 = device("h100-sxm")
    peak, bw = h100.peak_flops("bf16")[0], h100.hbm_bytes_per_s
    big = Gemm(1, 8192, 8192, 8192)
    row = bound(big, "bf16", 2e6, h100)
    assert row["bound"] == "compute"
    assert row["floor_ns"] == pytest.approx(big.flops / peak * 1e9)
    assert row["achieved_flops"] == pytest.approx(big.flops / 2e-3)
    assert row["fraction_of_peak"] == pytest.approx(big.flops / 2e-3 / peak)
    skinny = Gemm(1, 1, 8192, 8192)  # a matrix-vector product: all bytes, few FLOPs
    row = bound(skinny, "bf16", 1e5, h100)
    assert row["bound"] == "memory"
    assert row["floor_ns"] == pytest.approx(skinny.bytes("bf16") / bw * 1e9)
