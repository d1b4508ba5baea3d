"""Quantized linear layers: fprop, dgrad and wgrad each on operands quantized along the GEMM's reduction dim,
through the real low-precision kernel or its emulation (:mod:`pipeline.quant.gemm`), on any device.

A Transformer Engine low-precision ``te.Linear`` (``transformer_engine/pytorch/module/linear.py``) runs three
GEMMs, each on operands quantized *independently* from the high-precision tensors
(X [T, K] tokens x in_features, W [N, K], dY [T, N]):

| GEMM                  | left operand                          | right operand                           |
|-----------------------|---------------------------------------|-----------------------------------------|
| fprop  Y  = X W^T     | X, blocks along K                     | W, blocks along K                       |
| dgrad  dX = dY W      | dY, blocks along N                    | W, blocks along N (TE: "columnwise")    |
| wgrad  dW = dY^T X    | dY, blocks along T                    | X, blocks along T                       |

The grids per precision id are in :mod:`pipeline.quant.operands` (MXFP8: 1x32 E8M0 blocks everywhere; FP8:
per tensor, per row, or DeepSeek's 1x128 activation / 128x128 weight tiles; E4M3 for gradients too). The bias
and its gradient stay in high precision (TE does the same).

Token padding: wgrad's blocks run along the token dim, so T is zero-padded to a multiple of 32 (MXFP8), 128
(``fp8-block128``: whole 1x128 tiles) or 16 (other FP8: ``torch._scaled_mm`` needs K % 16 == 0), as TE/Megatron
pad packed sequences. Zero rows never change a
block's amax and add nothing to dW, so results do not depend on the padding.

Weight casts (:class:`CastSchedule`): ``per-step`` caches the weight's operands per weight version
(``Parameter._version`` bumps at every in-place update, i.e. the optimizer step) -- TE with
``is_first_microbatch`` True then False: one cast per step, paid in micro-batch 0; ``per-microbatch`` recasts
in every micro-batch (TE with ``is_first_microbatch=None``). The cast runs lazily inside the micro-batch that
needs it, so a timed micro-batch contains its weight casts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.quant.fp8 import FP8Tensor
from pipeline.quant.gemm import BACKENDS, gemm
from pipeline.quant.mxfp8 import BLOCK, MXFP8Tensor
from pipeline.quant.operands import (
    Operand,
    dequantize_operand,
    granularity,
    quantize_operand,
    to_quantized,
    transpose_operand,
)
from pipeline.quant.precisions import MXFP8_RULE, check_precision

WEIGHT_CASTS = ("per-step", "per-microbatch")


class CastSchedule:
    """When weight casts are refreshed (see the module docstring); the learner calls :meth:`next_microbatch`
    at the start of every micro-batch. One schedule is shared by all quantized modules of a model."""

    def __init__(self, mode: str = "per-step") -> None:
        if mode not in WEIGHT_CASTS:
            raise ValueError(f"unknown weight cast {mode!r}; choose one of {', '.join(WEIGHT_CASTS)}")
        self.mode = mode
        self.microbatch = 0

    def next_microbatch(self) -> None:
        self.microbatch += 1

    @property
    def epoch(self) -> int:
        return self.microbatch if self.mode == "per-microbatch" else 0


@dataclass(frozen=True)
class GemmSpec:
    """How a quantized linear runs its GEMMs: grid (``precision``), ``backend`` and the compute dtype (the
    emulation's GEMM dtype and the real kernel's output dtype)."""

    precision: str
    backend: str = "emulated"
    compute_dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown GEMM backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")

    @property
    def token_pad(self) -> int:
        """wgrad's token padding: one MX block, one 1x128 tile (cuBLAS block scaling wants K in whole tiles),
        or the 16 ``torch._scaled_mm`` needs for K."""
        if self.precision == "bf16":
            return 1
        if self.precision in MXFP8_RULE:
            return BLOCK
        return 128 if self.precision == "fp8-block128" else 16


def _pad_tokens(x_TK: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-x_TK.shape[0]) % multiple
    return F.pad(x_TK, (0, 0, 0, pad)) if pad else x_TK


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """What F.linear would return: the autocast dtype when autocast is on, else the input dtype."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


class WeightOperands:
    """A weight's quantized operands -- ``fprop`` (W, blocks along K) and ``dgrad`` (Wᵀ, blocks along N) --
    and, for the emulated backend, their values in compute dtype; cached per (tensor, storage, ``_version``,
    cast epoch). 3-D expert stacks [E, N, K] hold one operand per expert."""

    def __init__(self, spec: GemmSpec, schedule: CastSchedule | None = None) -> None:
        self.spec = spec
        self.schedule = schedule or CastSchedule()
        self._cache: dict[str, tuple[tuple[int, ...], dict[int | None, tuple[Operand, Any]]]] = {}

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.spec.compute_dtype

    def _slot(self, usage: str, weight: torch.Tensor) -> dict[int | None, tuple[Operand, Any]]:
        key = (id(weight), weight.data_ptr(), weight._version, self.schedule.epoch)
        hit = self._cache.get(usage)
        if hit is None or hit[0] != key:
            hit = (key, {})
            self._cache[usage] = hit
        return hit[1]

    def _entry(self, usage: str, weight: torch.Tensor, expert: int | None) -> tuple[Operand, Any]:
        slot = self._slot(usage, weight)
        if expert not in slot:
            with torch.no_grad():
                w = (weight[expert] if expert is not None else weight).detach()
                if usage == "fprop":
                    op = quantize_operand(w, self.spec.precision, weight=True)
                elif granularity(self.spec.precision, True) in ("tensor", "block128x128"):
                    op = transpose_operand(self._entry("fprop", weight, expert)[0])
                else:
                    op = quantize_operand(w.t().contiguous(), self.spec.precision, weight=True)
                values = (
                    dequantize_operand(op, self.spec.compute_dtype)
                    if self.spec.backend == "emulated"
                    else None
                )
            slot[expert] = (op, values)
        return slot[expert]

    def operand(self, usage: str, weight: torch.Tensor, expert: int | None = None) -> Operand:
        return self._entry(usage, weight, expert)[0]

    def values(self, usage: str, weight: torch.Tensor, expert: int | None = None) -> torch.Tensor | None:
        return self._entry(usage, weight, expert)[1]

    def quantized(self, weight: torch.Tensor) -> MXFP8Tensor | FP8Tensor:
        """The exact fprop bytes + scales the next forward uses (stacked over experts for a 3-D weight)."""
        slot: dict[Any, Any] = self._slot("fprop", weight)
        if "export" in slot:
            return slot["export"]
        if weight.ndim == 2:
            out: MXFP8Tensor | FP8Tensor = to_quantized(self.operand("fprop", weight), weight.dtype)
        else:
            qs = [
                to_quantized(self.operand("fprop", weight, e), weight.dtype) for e in range(weight.shape[0])
            ]
            data = torch.stack([q.data for q in qs])
            scale = torch.stack([q.scale for q in qs])
            if isinstance(qs[0], MXFP8Tensor):
                out = MXFP8Tensor(data, scale, -1, qs[0].rule, weight.dtype)
            else:
                out = FP8Tensor(data, scale, qs[0].granularity, (1, *qs[0].block), weight.dtype)
        slot["export"] = out
        return out


@dataclass(frozen=True)
class BoundWeight:
    """One weight (or one expert of a stack) as the GEMMs of one linear call see it."""

    ops: WeightOperands
    source: torch.Tensor  # the parameter the cache keys on (the whole stack for experts)
    expert: int | None = None

    def operand(self, usage: str) -> Operand:
        return self.ops.operand(usage, self.source, self.expert)

    def values(self, usage: str) -> torch.Tensor | None:
        return self.ops.values(usage, self.source, self.expert)


def _gemm(spec: GemmSpec, a: Operand, bound: BoundWeight | Operand, usage: str = "", bias: Any = None) -> Any:
    b = bound.operand(usage) if isinstance(bound, BoundWeight) else bound
    values = bound.values(usage) if isinstance(bound, BoundWeight) else None
    cd = spec.compute_dtype
    return gemm(a, b, spec.backend, out_dtype=cd, compute_dtype=cd, b_values=values, bias=bias)


class QuantLinearFunction(torch.autograd.Function):
    """Y = X Wᵀ + b with every GEMM on quantized operands (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, bound: BoundWeight
    ) -> torch.Tensor:
        spec = bound.ops.spec
        out_dtype = _out_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x_TK = x.reshape(-1, x.shape[-1])
            xa = quantize_operand(x_TK, spec.precision)
            b = bias.to(spec.compute_dtype) if bias is not None else None
            y = _gemm(spec, xa, bound, "fprop", b)
        ctx.save_for_backward(x_TK, weight)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.x_shape, ctx.x_dtype, ctx.bound = x.shape, x.dtype, bound
        return y.view(*x.shape[:-1], y.shape[-1]).to(out_dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_TK, weight = ctx.saved_tensors
        bound: BoundWeight = ctx.bound
        spec = bound.ops.spec
        dy_TN = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        with torch.autocast(dy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                dya = quantize_operand(dy_TN, spec.precision)
                dx = _gemm(spec, dya, bound, "dgrad").view(ctx.x_shape).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                # transposed copies: contiguous operands (and one compiled quantizer graph per grid and dtype)
                dyt = quantize_operand(_pad_tokens(dy_TN, spec.token_pad).t().contiguous(), spec.precision)
                xt = quantize_operand(_pad_tokens(x_TK, spec.token_pad).t().contiguous(), spec.precision)
                dw = _gemm(spec, dyt, xt).to(weight.dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = dy_TN.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None


def check_features(in_features: int, out_features: int, spec: GemmSpec) -> None:
    """MXFP8 blocks need multiples of 32; the real kernel multiples of 16 (ValueError naming the fix)."""
    need = BLOCK if spec.precision in MXFP8_RULE else (16 if spec.backend == "scaled_mm" else 1)
    if spec.precision != "bf16" and (in_features % need or out_features % need):
        raise ValueError(
            f"{spec.precision} linear ({spec.backend}) needs in_features and out_features divisible by {need}, "
            f"got in={in_features}, out={out_features}; keep this layer in BF16 (precision policy) or pad it"
        )


class QuantLinear(nn.Linear):
    """``nn.Linear`` whose three GEMMs run on the grid of ``precision`` (a precision id), emulated or real.

    Parameters keep the names ``weight`` / ``bias`` and are shared with the module it was built from, so
    state_dict names and optimizer references are unchanged.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        precision: str = "mxfp8",
        compute_dtype: torch.dtype = torch.bfloat16,
        backend: str = "emulated",
        schedule: CastSchedule | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        spec = GemmSpec(precision, backend, compute_dtype)
        check_features(in_features, out_features, spec)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.precision = precision
        self.compute_dtype = compute_dtype
        self._operands = WeightOperands(spec, schedule)

    @classmethod
    def from_linear(
        cls,
        lin: nn.Linear,
        precision: str = "mxfp8",
        compute_dtype: torch.dtype = torch.bfloat16,
        *,
        backend: str = "emulated",
        schedule: CastSchedule | None = None,
    ) -> QuantLinear:
        """Wrap ``lin``'s own parameters (no copy)."""
        new = cls(
            lin.in_features, lin.out_features, lin.bias is not None, precision=precision,
            compute_dtype=compute_dtype, backend=backend, schedule=schedule, device="meta",
        )  # fmt: skip
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new

    @property
    def rule(self) -> str | None:
        return MXFP8_RULE.get(self.precision)

    @property
    def backend(self) -> str:
        return self._operands.spec.backend

    def quantized_weight(self) -> Any:
        """The exact fprop bytes + scales the next forward uses (MXFP8Tensor for MXFP8 ids, else FP8Tensor)."""
        if self.precision == "bf16":
            raise ValueError("a bf16 QuantLinear has no quantized weight")
        return self._operands.quantized(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # bf16 too: the same three GEMM calls with unquantized operands (grid ``none``), so BF16 and a low
        # precision differ only by quantization, never by how the GEMMs are called.
        return QuantLinearFunction.apply(x, self.weight, self.bias, BoundWeight(self._operands, self.weight))

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, precision={self.precision}, gemm={self.backend}, "
            f"compute_dtype={self.compute_dtype}"
        )


class MXFP8Linear(QuantLinear):
    """:class:`QuantLinear` on an MXFP8 grid, chosen by scale ``rule`` ("te" -> ``mxfp8``, "te212", "floor")."""

    @classmethod
    def from_linear(  # type: ignore[override]
        cls,
        lin: nn.Linear,
        compute_dtype: torch.dtype = torch.bfloat16,
        rule: str = "te",
        *,
        backend: str = "emulated",
        schedule: CastSchedule | None = None,
    ) -> MXFP8Linear:
        precisions = {v: k for k, v in MXFP8_RULE.items()}
        if rule not in precisions:
            raise ValueError(f"unknown MXFP8 scale rule {rule!r}; valid rules: {', '.join(precisions)}")
        return super().from_linear(  # type: ignore[return-value]
            lin, precisions[rule], compute_dtype, backend=backend, schedule=schedule
        )

    def quantized_weight(self) -> MXFP8Tensor:
        return super().quantized_weight()
