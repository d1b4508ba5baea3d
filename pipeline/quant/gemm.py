"""C = A · Bᵀ on quantized operands: the real ``torch._scaled_mm`` where the hardware has it, emulation elsewhere.

Two backends run the same operands (:mod:`pipeline.quant.operands`, identical bytes on every device):

- ``emulated``: dequantize both operands to ``compute_dtype`` and multiply with ``F.linear`` (bf16 by default,
  like the BF16 baseline's GEMM; MXFP8 values are exact in bf16, FP8-grid values e4m3 x fp32-scale are rounded to
  bf16, |rel| <= 2^-9; pass float32 for exact operand values);
- ``scaled_mm``: ``torch._scaled_mm(mat1, mat2, scale_a, scale_b, out_dtype)`` with the operands' bytes viewed as
  ``float8_e4m3fn`` and the scales laid out as torch's CUDA kernels require (aten ``ScaledBlas.cpp``,
  ``get_joint_scaling`` and the ``is_*_scaling`` checks, read in torch's sources):

=====================  ====================================  ==========================================
A / B grid             scale_a                               scale_b (B given as mat2 = Bᵀ, column-major)
=====================  ====================================  ==========================================
tensor / tensor        fp32, one element                     fp32, one element
rowwise / rowwise      fp32 [M, 1], contiguous               fp32 [1, N], contiguous
1x128 / 128x128        fp32 [M, L], strides (1, M)           fp32 [L, ceil(N/128)], strides (1, L)
1x128 / 1x128          fp32 [M, L], strides (1, M)           fp32 [L, N], contiguous
mx / mx (1x32)         E8M0 swizzled, roundup(M,128) x       E8M0 swizzled, roundup(N,128) x
                       roundup(K/32, 4), contiguous          roundup(K/32, 4), contiguous
=====================  ====================================  ==========================================

with L = ceil(K/128). mat1 row-major, mat2 column-major, K and N multiples of 16. cuBLAS wants the 128x128
scales' leading dimension 16-byte aligned (L % 4 == 0; torch's own tests pad L otherwise, which the v1 check
``stride(0) == L`` forbids): when L % 4 != 0 the 128x128 weight scales are repeated per row and the GEMM runs
1x128 x 1x128 -- the same values, another kernel. DeepSeek-style block scaling runs on Hopper only (SM 9.0,
cuBLASLt >= 12.9), MX block scaling on Blackwell (SM 10.x); :func:`choose_backend` probes the device once with a
small GEMM compared against the emulation and records why a precision stays emulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.quant.operands import TILE, Operand, dequantize_operand, quantize_operand
from pipeline.quant.swizzle import swizzle_mxfp8_scales, unswizzle_mxfp8_scales

BACKENDS = ("emulated", "scaled_mm")
GEMM_CHOICES = ("auto", *BACKENDS)
PROBE_REL_TOL = 2e-2  # bf16 output of a K=256 GEMM on identical operands: ~1e-3 expected


@dataclass(frozen=True)
class ScaledMMArgs:
    """The arguments of one ``torch._scaled_mm`` call and the recipe torch will infer from them."""

    mat1: torch.Tensor
    mat2: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    recipe: tuple[str, str]


def _outer_major(scale: torch.Tensor) -> torch.Tensor:
    """[R, L] with strides (1, R): 1x128 scales are stored transposed ("outer-dim-major")."""
    return scale.t().contiguous().t()


def scaled_mm_args(a: Operand, b: Operand) -> ScaledMMArgs:
    """``torch._scaled_mm`` arguments computing ``a · bᵀ`` from two operands (see the module docstring)."""
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"operands do not share K: A {tuple(a.shape)}, B {tuple(b.shape)}")
    mat1 = a.data.contiguous().view(torch.float8_e4m3fn)
    mat2 = b.data.contiguous().view(torch.float8_e4m3fn).t()
    n = b.shape[0]
    grids = (a.granularity, b.granularity)
    if grids == ("tensor", "tensor"):
        return ScaledMMArgs(mat1, mat2, a.scale.reshape(()), b.scale.reshape(()), grids)
    if grids == ("rowwise", "rowwise"):
        return ScaledMMArgs(mat1, mat2, a.scale.reshape(-1, 1).contiguous(), b.scale.reshape(1, n), grids)
    if grids == ("mx", "mx"):
        sa = swizzle_mxfp8_scales(a.scale).view(torch.float8_e8m0fnu)
        sb = swizzle_mxfp8_scales(b.scale).view(torch.float8_e8m0fnu)
        return ScaledMMArgs(mat1, mat2, sa, sb, grids)
    if a.granularity == "block1x128" and b.granularity in ("block1x128", "block128x128"):
        sa = _outer_major(a.scale)
        if b.granularity == "block128x128" and b.scale.shape[1] % 4 == 0:
            return ScaledMMArgs(mat1, mat2, sa, b.scale.t(), ("block1x128", "block128x128"))
        rows = (
            b.scale
            if b.granularity == "block1x128"
            else b.scale.repeat_interleave(TILE, dim=0).narrow(0, 0, n)
        )
        return ScaledMMArgs(mat1, mat2, sa, rows.t().contiguous(), ("block1x128", "block1x128"))
    raise ValueError(f"no torch._scaled_mm recipe for operand grids {grids}")


def _rule_error(what: str) -> ValueError:
    return ValueError(f"torch._scaled_mm layout: {what}")


def check_scaled_mm_args(args: ScaledMMArgs) -> None:
    """torch's CUDA rules for ``_scaled_mm`` (dtypes, layouts, divisibility, scale shapes and strides), as a pure
    function of shapes and strides: raises ValueError naming the first rule broken."""
    m, k = args.mat1.shape
    k2, n = args.mat2.shape
    sa, sb = args.scale_a, args.scale_b
    if k != k2:
        raise _rule_error(f"K differs: mat1 {tuple(args.mat1.shape)}, mat2 {tuple(args.mat2.shape)}")
    if args.mat1.dtype != torch.float8_e4m3fn or args.mat2.dtype != torch.float8_e4m3fn:
        raise _rule_error("mat1 and mat2 must be float8_e4m3fn")
    if m and not (args.mat1.stride(1) == 1 and args.mat1.stride(0) >= k):
        raise _rule_error(f"mat1 must be row-major, got strides {args.mat1.stride()}")
    if n > 1 and not (args.mat2.stride(0) == 1 and args.mat2.stride(1) >= k):
        raise _rule_error(f"mat2 must be column-major, got strides {args.mat2.stride()}")
    if k % 16 or n % 16:
        raise _rule_error(f"K and N must be multiples of 16, got K={k}, N={n}")
    lk = -(-k // TILE)

    def _is(
        t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...] | None, dtype: torch.dtype
    ) -> bool:
        if t.dtype != dtype or tuple(t.shape) != size:
            return False
        pairs = zip(size, t.stride(), stride, strict=True) if stride is not None else ()
        return all(s <= 1 or st == want for s, st, want in pairs)

    f32 = torch.float32
    recipe = args.recipe
    if recipe == ("tensor", "tensor"):
        ok = sa.numel() == 1 and sb.numel() == 1 and sa.dtype == f32 and sb.dtype == f32
    elif recipe == ("rowwise", "rowwise"):
        ok = _is(sa, (m, 1), None, f32) and _is(sb, (1, n), None, f32)
        ok = ok and sa.is_contiguous() and sb.is_contiguous()
    elif recipe == ("block1x128", "block128x128"):
        ok = _is(sa, (m, lk), (1, m), f32) and _is(sb, (lk, -(-n // TILE)), (1, lk), f32) and lk % 4 == 0
    elif recipe == ("block1x128", "block1x128"):
        ok = _is(sa, (m, lk), (1, m), f32) and _is(sb, (lk, n), (n, 1), f32)
    elif recipe == ("mx", "mx"):
        need_a = -(-m // 128) * 128 * (-(-(k // 32) // 4) * 4)
        need_b = -(-n // 128) * 128 * (-(-(k // 32) // 4) * 4)
        e8 = torch.float8_e8m0fnu
        ok = sa.dtype == e8 and sb.dtype == e8 and sa.numel() == need_a and sb.numel() == need_b
        ok = ok and sa.is_contiguous() and sb.is_contiguous() and k % 32 == 0
    else:
        raise _rule_error(f"unknown recipe {recipe}")
    if not ok:
        raise _rule_error(
            f"{recipe} scales do not fit M={m}, K={k}, N={n}: scale_a {sa.dtype} {tuple(sa.shape)} strides "
            f"{sa.stride()}, scale_b {sb.dtype} {tuple(sb.shape)} strides {sb.stride()}"
        )


def reference_scaled_mm(args: ScaledMMArgs) -> torch.Tensor:
    """What ``torch._scaled_mm`` computes from ``args``, in float64 on the CPU, reading the scales by the
    documented layouts (independent of :mod:`pipeline.quant.operands`; used by the tests to check that the
    arguments mean the operands' values)."""
    a = args.mat1.cpu().to(torch.float64)
    b = args.mat2.cpu().to(torch.float64)  # [K, N]
    sa, sb = args.scale_a.cpu(), args.scale_b.cpu()
    m, k = a.shape
    n = b.shape[1]
    kk = torch.arange(k)
    if args.recipe == ("tensor", "tensor"):
        return (a * sa.double()) @ (b * sb.double())
    if args.recipe == ("rowwise", "rowwise"):
        return (a * sa.double().reshape(m, 1)) @ (b * sb.double().reshape(1, n))
    if args.recipe == ("mx", "mx"):
        ua = unswizzle_mxfp8_scales(sa.view(torch.uint8), m, k // 32).double()
        ub = unswizzle_mxfp8_scales(sb.view(torch.uint8), n, k // 32).double()
        return (a * torch.exp2(ua - 127)[:, kk // 32]) @ (b * torch.exp2(ub - 127)[:, kk // 32].t())
    a = a * sa.double()[:, kk // TILE]  # 1x128: scale_a[m, k // 128]
    if args.recipe == ("block1x128", "block128x128"):
        sb_kn = sb.double()[kk // TILE][:, torch.arange(n) // TILE]  # scale_b[k // 128, n // 128]
    else:
        sb_kn = sb.double()[kk // TILE]  # scale_b[k // 128, n]
    return a @ (b * sb_kn)


def gemm(
    a: Operand,
    b: Operand,
    backend: str,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    compute_dtype: torch.dtype = torch.bfloat16,
    b_values: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a · bᵀ (+ bias)`` [M, N] in ``out_dtype``. ``b_values``: B already dequantized to ``compute_dtype`` (a
    cached weight), used by the emulated backend."""
    if backend == "scaled_mm":
        args = scaled_mm_args(a, b)
        y = torch._scaled_mm(
            args.mat1, args.mat2, scale_a=args.scale_a, scale_b=args.scale_b, out_dtype=out_dtype
        )
        return y + bias.to(out_dtype) if bias is not None else y
    if backend != "emulated":
        raise ValueError(f"unknown GEMM backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    bv = b_values if b_values is not None else dequantize_operand(b, compute_dtype)
    b_c = bias.to(compute_dtype) if bias is not None else None
    return F.linear(dequantize_operand(a, compute_dtype), bv, b_c).to(out_dtype)


_PROBES: dict[tuple[str, str], str | None] = {}


def probe_scaled_mm(precision: str, device: torch.device) -> str | None:
    """Run one small real GEMM of ``precision`` on ``device`` and compare it with the emulation; None when it
    works, else the reason (the exception, or the error size). Cached per (precision, device)."""
    key = (precision, str(device))
    if key in _PROBES:
        return _PROBES[key]
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(160, 512, generator=g).to(device=device, dtype=torch.bfloat16)
    w = (torch.randn(256, 512, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
    a, b = quantize_operand(x, precision), quantize_operand(w, precision, weight=True)
    why: str | None = None
    try:
        real = gemm(a, b, "scaled_mm", out_dtype=torch.bfloat16).float()  # the dtype training runs it in
        emu = gemm(a, b, "emulated", out_dtype=torch.float32, compute_dtype=torch.float32)
        rel = float((real - emu).norm() / emu.norm().clamp_min(1e-30))
        if not rel < PROBE_REL_TOL:
            why = (
                f"torch._scaled_mm disagrees with the emulation on identical operands (rel. error {rel:.2e})"
            )
    except Exception as exc:  # an unsupported recipe on this torch / GPU: the emulation runs instead
        why = f"torch._scaled_mm failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    _PROBES[key] = why
    return why


def choose_backend(precision: str, device: Any, requested: str = "auto") -> tuple[str, str]:
    """(backend, reason) for ``precision`` on ``device``: ``auto`` takes ``scaled_mm`` where the device has the
    kernel (and it passes the probe), ``emulated`` elsewhere; asking for ``scaled_mm`` where it cannot run raises
    :class:`pipeline.device.HardwareUnavailableError`."""
    from pipeline.device import (
        SCALED_MM_NEEDS,
        HardwareUnavailableError,
        cuda_capability,
        scaled_mm_unsupported,
    )

    if requested not in GEMM_CHOICES:
        raise ValueError(f"unknown --gemm {requested!r}; choose one of {', '.join(GEMM_CHOICES)}")
    device = torch.device(device)
    if precision == "bf16":
        return "bf16", "no quantized GEMM"
    if requested == "emulated":
        return "emulated", "asked for (--gemm emulated)"
    if device.type == "cpu" and requested == "scaled_mm" and precision in ("fp8-tensor", "fp8-rowwise"):
        return "scaled_mm", "CPU torch._scaled_mm (tensorwise / rowwise only)"
    why: str | None
    if device.type != "cuda":
        why = f"{device.type} has no low-precision tensor cores for {precision}"
    elif precision not in SCALED_MM_NEEDS:
        why = f"{precision} has no torch._scaled_mm recipe (emulated with its exact bytes)"
    else:
        why = scaled_mm_unsupported(precision, cuda_capability(device.index or 0), torch.version.cuda)
        why = why or probe_scaled_mm(precision, device)
    if why is None:
        return "scaled_mm", "torch._scaled_mm on this GPU"
    if requested == "scaled_mm":
        raise HardwareUnavailableError(f"--gemm scaled_mm for {precision}: {why}")
    return "emulated", why
