"""Real low-precision GEMMs on CPU: operand bytes vs the reference numerics, ``torch._scaled_mm`` argument layouts
(torch's own CUDA checks on fake CUDA tensors), and forward + backward of each quantized linear through the real
kernel's code path compared with its emulation."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from pipeline.device import scaled_mm_unsupported
from pipeline.quant import (
    QuantLinear,
    quantize_fp8_block128,
    quantize_fp8_rowwise,
    quantize_fp8_tensor,
    quantize_mxfp8,
)
from pipeline.quant.gemm import (
    ScaledMMArgs,
    check_scaled_mm_args,
    choose_backend,
    gemm,
    reference_scaled_mm,
    scaled_mm_args,
)
from pipeline.quant.linear import CastSchedule, GemmSpec, WeightOperands
from pipeline.quant.operands import dequantize_operand, quantize_grid, quantize_operand

FP8_IDS = ("fp8-tensor", "fp8-rowwise", "fp8-block128")
IDS = (*FP8_IDS, "mxfp8")
QWEN3_8B = {
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (24576, 4096),
    "down_proj": (4096, 12288),
}


def _reference(x: torch.Tensor, precision: str, weight: bool):
    if precision == "fp8-tensor":
        return quantize_fp8_tensor(x)
    if precision == "fp8-rowwise":
        return quantize_fp8_rowwise(x)
    if precision == "fp8-block128":
        return quantize_fp8_block128(x, (128, 128) if weight else (1, 128))
    return quantize_mxfp8(x)


def _nasty(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Values over 12 decades, an all-zero row, NaN and +-Inf: every special case of the scale rules."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-6, 6, cols)[torch.randperm(cols, generator=g)]
    x[1] = 0.0
    x[2, 3] = float("nan")
    x[3, 5], x[4, 6] = float("inf"), float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("precision", "weight"), [(p, w) for p in IDS for w in (False, True)])
def test_operand_bytes_equal_the_reference_numerics_for_every_input(precision, weight, dtype):
    """The GPU's fusable quantizer is not a second numerics: same bytes and scales as pipeline.quant (what a CPU
    runs), NaN/Inf included, odd shapes included (partial 128-tiles)."""
    x = _nasty(200, 320, dtype)
    op, ref = quantize_operand(x, precision, weight=weight), _reference(x, precision, weight)
    fused = quantize_grid(x, op.granularity)
    for data, scale in ((op.data, op.scale), fused):
        assert torch.equal(data, ref.data)
        assert scale.shape == ref.scale.shape
        assert torch.equal(scale.float().nan_to_num(-1.0), ref.scale.float().nan_to_num(-1.0))


def _args_for(m: int, k: int, n: int, precision: str, seed: int = 0) -> tuple[ScaledMMArgs, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    a, b = quantize_operand(x, precision), quantize_operand(w, precision, weight=True)
    values = dequantize_operand(a).double() @ dequantize_operand(b).double().t()
    return scaled_mm_args(a, b), values


def _fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")


@pytest.mark.parametrize("precision", IDS)
@pytest.mark.parametrize(("m", "k", "n"), [(160, 512, 256), (100, 384, 272), (33, 1280, 128), (48, 256, 96)])
def test_scaled_mm_arguments_mean_the_operands_values(precision, m, k, n):
    """Read by the documented layouts (outer-dim-major 1x128 scales, transposed 128x128 tiles, swizzled E8M0),
    the arguments multiply exactly the values the operands hold."""
    args, values = _args_for(m, k, n, precision)
    check_scaled_mm_args(args)
    got = reference_scaled_mm(args)
    assert float((got - values).norm() / values.norm()) < 1e-7  # fp32 rounding of dequantized values only


def test_128x128_tiles_fall_back_to_repeated_row_scales_when_cublas_cannot_align_them():
    aligned, _ = _args_for(64, 512, 256, "fp8-block128")  # L = 4 blocks of K: 16-byte aligned
    unaligned, _ = _args_for(64, 384, 256, "fp8-block128")  # L = 3
    assert aligned.recipe == ("block1x128", "block128x128")
    assert unaligned.recipe == ("block1x128", "block1x128")


@pytest.mark.parametrize("precision", IDS)
def test_every_qwen3_8b_gemm_passes_torchs_own_cuda_checks(precision):
    """fprop, dgrad and wgrad operand shapes of every Qwen3-8B linear, at round and odd token counts: operands
    quantized on meta tensors (shapes and strides, no data), then torch's CUDA rules for ``_scaled_mm`` run on
    fake CUDA tensors of exactly those shapes, strides and dtypes (no GPU needed), and ours."""
    for n_out, k_in in QWEN3_8B.values():
        for tokens in (512, 4096 + 32):
            gemms = {
                "fprop": (tokens, k_in, n_out),
                "dgrad": (tokens, n_out, k_in),
                "wgrad": (n_out, tokens, k_in),
            }
            for name, (m, k, n) in gemms.items():
                a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
                b = torch.empty(n, k, dtype=torch.float32, device="meta")
                args = scaled_mm_args(
                    quantize_operand(a, precision), quantize_operand(b, precision, weight=True)
                )
                check_scaled_mm_args(args)
                with FakeTensorMode():
                    fake = [_fake_cuda(t) for t in (args.mat1, args.mat2, args.scale_a, args.scale_b)]
                    y = torch._scaled_mm(
                        *fake[:2], scale_a=fake[2], scale_b=fake[3], out_dtype=torch.bfloat16
                    )
                assert (tuple(y.shape), y.device.type) == ((m, n), "cuda"), name


def test_layout_checks_are_live_they_reject_what_torch_rejects():
    args, _ = _args_for(64, 512, 256, "fp8-rowwise")
    row_major_b = ScaledMMArgs(args.mat1, args.mat2.contiguous(), args.scale_a, args.scale_b, args.recipe)
    with pytest.raises(ValueError, match="column-major"):
        check_scaled_mm_args(row_major_b)
    with FakeTensorMode(), pytest.raises(RuntimeError, match="col_major"):
        fake = [_fake_cuda(t) for t in (row_major_b.mat1, row_major_b.mat2, args.scale_a, args.scale_b)]
        torch._scaled_mm(*fake[:2], scale_a=fake[2], scale_b=fake[3], out_dtype=torch.bfloat16)
    blk, _ = _args_for(64, 512, 256, "fp8-block128")
    row_major_scales = ScaledMMArgs(blk.mat1, blk.mat2, blk.scale_a.contiguous(), blk.scale_b, blk.recipe)
    with pytest.raises(ValueError, match="scales do not fit"):
        check_scaled_mm_args(row_major_scales)  # 1x128 scales must be outer-dim-major (strides (1, M))
    with pytest.raises(ValueError, match="multiples of 16"):
        check_scaled_mm_args(_args_for(64, 40 * 4, 100, "fp8-tensor")[0])


@pytest.mark.parametrize("precision", ["fp8-tensor", "fp8-rowwise"])
def test_cpu_torch_scaled_mm_computes_what_the_emulation_computes(precision):
    """CPU torch runs tensorwise and rowwise _scaled_mm: the real call on our arguments vs the emulated GEMM."""
    g = torch.Generator().manual_seed(3)
    a = quantize_operand(torch.randn(96, 256, generator=g), precision)
    b = quantize_operand(torch.randn(128, 256, generator=g) * 0.02, precision, weight=True)
    real = gemm(a, b, "scaled_mm", out_dtype=torch.float32)
    emulated = gemm(a, b, "emulated", out_dtype=torch.float32, compute_dtype=torch.float32)
    assert float((real - emulated).norm() / emulated.norm()) < 1e-6


def _scaled_mm_by_the_rules(mat1, mat2, *, scale_a, scale_b, out_dtype, **_):
    """``torch._scaled_mm`` as CPU torch cannot run it (blockwise, MX): torch's recipe inference, our layout
    checks, then the documented arithmetic."""
    m, n = mat1.shape[0], mat2.shape[1]
    if scale_a.dtype == torch.float8_e8m0fnu:
        recipe = ("mx", "mx")
    elif scale_a.numel() == 1 and scale_b.numel() == 1:
        recipe = ("tensor", "tensor")
    elif tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
        recipe = ("rowwise", "rowwise")
    else:
        recipe = ("block1x128", "block1x128" if scale_b.shape[1] == n else "block128x128")
    args = ScaledMMArgs(mat1, mat2, scale_a, scale_b, recipe)
    check_scaled_mm_args(args)
    return reference_scaled_mm(args).to(out_dtype)


def _fwd_bwd(lin: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    x = x.detach().clone().requires_grad_(True)
    lin.zero_grad(set_to_none=True)
    y = lin(x)
    y.backward(dy)
    return y.detach(), x.grad, lin.weight.grad, None if lin.bias is None else lin.bias.grad


@pytest.mark.parametrize("precision", IDS)
def test_forward_and_backward_through_the_real_kernel_path_match_the_emulation(precision, monkeypatch):
    """fprop, dgrad and wgrad of a quantized linear with backend scaled_mm (operand layouts, token padding,
    transposed weights: the code a GPU runs) against backend emulated, both with exact operand values."""
    torch.manual_seed(0)
    base = torch.nn.Linear(256, 384)
    x = torch.randn(2, 45, 256)  # 90 tokens: wgrad pads them to 96 (FP8) or 96 (MXFP8)
    dy = torch.randn(2, 45, 384)
    emu = QuantLinear.from_linear(base, precision, torch.float32, backend="emulated")
    y0, dx0, dw0, db0 = _fwd_bwd(emu, x, dy)
    monkeypatch.setattr(torch, "_scaled_mm", _scaled_mm_by_the_rules)
    real = QuantLinear.from_linear(base, precision, torch.float32, backend="scaled_mm")
    y1, dx1, dw1, db1 = _fwd_bwd(real, x, dy)
    for got, want in ((y1, y0), (dx1, dx0), (dw1, dw0), (db1, db0)):
        assert float((got - want).norm() / want.norm()) < 1e-6
    # and the low-precision linear is close to, but not, the high-precision one
    ref = torch.nn.functional.linear(x, base.weight, base.bias).detach()
    assert 1e-4 < float((y0 - ref).norm() / ref.norm()) < 0.1


@pytest.mark.parametrize("precision", IDS)
def test_emulated_backward_is_the_hand_composition_of_operand_quantizations(precision):
    torch.manual_seed(1)
    base = torch.nn.Linear(128, 96, bias=False)
    lin = QuantLinear.from_linear(base, precision, torch.float32)
    x, dy = torch.randn(37, 128), torch.randn(37, 96)
    _, dx, dw, _ = _fwd_bwd(lin, x, dy)
    deq = dequantize_operand
    pad = {"mxfp8": 32, "fp8-block128": 128}.get(precision, 16)
    xp = torch.cat([x, x.new_zeros((-37) % pad, 128)])
    dyp = torch.cat([dy, dy.new_zeros((-37) % pad, 96)])
    w = base.weight.detach()
    dx_ref = deq(quantize_operand(dy, precision)) @ deq(quantize_operand(w.t(), precision, weight=True)).t()
    dw_ref = deq(quantize_operand(dyp.t(), precision)) @ deq(quantize_operand(xp.t(), precision)).t()
    assert torch.allclose(dx, dx_ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(dw, dw_ref, rtol=1e-6, atol=1e-6)


def test_weight_casts_per_step_are_cached_until_the_weight_changes_per_microbatch_are_redone():
    w = torch.nn.Parameter(torch.randn(64, 64))
    for mode, expect_same in (("per-step", True), ("per-microbatch", False)):
        schedule = CastSchedule(mode)
        ops = WeightOperands(GemmSpec("fp8-rowwise"), schedule)
        first = ops.operand("fprop", w)
        schedule.next_microbatch()
        assert (ops.operand("fprop", w) is first) is expect_same
        with torch.no_grad():
            w.add_(1.0)  # an optimizer step: a new weight version is cast in both modes
        assert ops.operand("fprop", w) is not first
    with pytest.raises(ValueError, match="per-step"):
        CastSchedule("sometimes")


def test_backend_choice_says_why_and_refuses_what_the_device_cannot_run():
    cpu = torch.device("cpu")
    assert choose_backend("bf16", cpu)[0] == "bf16"
    backend, why = choose_backend("fp8-block128", cpu)
    assert backend == "emulated" and "no low-precision tensor cores" in why
    assert choose_backend("fp8-rowwise", cpu, "scaled_mm")[0] == "scaled_mm"  # CPU torch has this one
    from pipeline.device import HardwareUnavailableError

    with pytest.raises(HardwareUnavailableError, match="fp8-block128"):
        choose_backend("fp8-block128", cpu, "scaled_mm")


@pytest.mark.parametrize(
    ("precision", "capability", "cuda", "ok"),
    [
        ("fp8-tensor", (8, 9), "12.4", True),
        ("fp8-tensor", (8, 0), "12.4", False),  # A100: no FP8 tensor cores
        ("fp8-rowwise", (9, 0), "13.0", True),  # H100 / H200
        ("fp8-block128", (9, 0), "13.0", True),
        ("fp8-block128", (9, 0), "12.4", False),  # cuBLASLt blockwise needs CUDA 12.9
        ("fp8-block128", (10, 0), "13.0", False),  # DeepSeek-style blocks: Hopper only in torch
        ("mxfp8", (9, 0), "13.0", False),  # an H200 is never mxfp8
        ("mxfp8", (10, 0), "12.8", True),
    ],
)
def test_which_gpu_runs_which_real_gemm(precision, capability, cuda, ok):
    assert (scaled_mm_unsupported(precision, capability, cuda) is None) is ok


def test_compiled_quantizers_write_the_same_bytes(monkeypatch):
    """torch.compile (what a GPU runs) of the mx and rowwise quantizers equals their eager bytes, across shapes
    without recompiling per shape."""
    from pipeline.quant import operands

    monkeypatch.setenv(operands.COMPILE_ENV, "1")
    monkeypatch.setattr(operands, "_COMPILED", {})
    for shape in ((64, 256), (96, 320)):
        x = _nasty(*shape, torch.bfloat16, seed=shape[0])
        for precision in ("mxfp8", "fp8-rowwise"):
            op = quantize_operand(x, precision)
            eager = quantize_grid(x, op.granularity)
            assert torch.equal(op.data, eager[0]) and torch.equal(
                op.scale.nan_to_num(-1), eager[1].nan_to_num(-1)
            )
    assert set(operands._COMPILED) == {"mx", "rowwise"} and not operands.COMPILE_FAILURES
