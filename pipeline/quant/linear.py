"""Emulated quantized linear layers: TE's MXFP8 GEMM usage, on any device, with GEMMs in a chosen dtype.

A Transformer Engine MXFP8 ``te.Linear`` (``transformer_engine/pytorch/module/linear.py``) runs three GEMMs,
each on operands quantized *independently* from the high-precision tensors:

| GEMM                  | left operand                          | right operand                           |
|-----------------------|---------------------------------------|-----------------------------------------|
| fprop  Y  = X W^T     | X rowwise (1x32 blocks along K)       | W rowwise (1x32 blocks along K)         |
| dgrad  dX = dY W      | dY rowwise (1x32 blocks along N)      | W columnwise (32x1 blocks along N)      |
| wgrad  dW = dY^T X    | dY columnwise (32x1 blocks along T)   | X columnwise (32x1 blocks along T)      |

(X [T, K] tokens x in_features, W [N, K], dY [T, N].) Here each operand is quantized with
:func:`pipeline.quant.mxfp8.quantize_mxfp8_along` and dequantized to ``compute_dtype``, and the GEMM runs in
that dtype (bf16 by default, like the BF16 baseline's GEMM; torch accumulates in fp32, which is exact for
products of E4M3 x 2^k values), so on a CPU the MXFP8-vs-BF16 difference is the quantization work, not a
dtype speed artifact. The bias and its gradient stay in high precision (TE does the same).

Token padding: columnwise blocks run along the token dim, so T is zero-padded to a multiple of 32 for wgrad, as
TE/Megatron pad packed sequences. Zero rows never change a block's amax and add nothing to dW, so results do not
depend on the padding (tests check odd T). in/out features must be multiples of 32 (checked at construction).

Weight quantization is cached per weight version (``Parameter._version`` bumps on every in-place update, e.g.
the optimizer step), like TE reusing its weight casts across the micro-batches of one step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.quant.mxfp8 import BLOCK, MXFP8Tensor, dequantize_mxfp8, quantize_mxfp8_along
from pipeline.quant.precisions import MXFP8_RULE, check_precision, dequantize, fake_quantize, quantize_weight


def _fake_mx(x: torch.Tensor, dim: int, rule: str, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_mxfp8(quantize_mxfp8_along(x, dim, rule=rule), dtype)


def _pad_tokens(x_TK: torch.Tensor) -> torch.Tensor:
    pad = (-x_TK.shape[0]) % BLOCK
    return F.pad(x_TK, (0, 0, 0, pad)) if pad else x_TK


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """What F.linear would return: the autocast dtype when autocast is on, else the input dtype."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


class MXFP8LinearFunction(torch.autograd.Function):
    """Y = X W^T + b with TE's MXFP8 operand usage (see the module docstring).

    ``w_fprop`` is the dequantized rowwise weight in compute dtype (no grad); ``dgrad_weight()`` returns the
    dequantized columnwise weight, called only when dX is needed.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        w_fprop: torch.Tensor,
        dgrad_weight: Callable[[], torch.Tensor],
        rule: str,
        compute_dtype: torch.dtype,
    ) -> torch.Tensor:
        out_dtype = _out_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x_TK = x.reshape(-1, x.shape[-1])
            xq = _fake_mx(x_TK, -1, rule, compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            y = F.linear(xq, w_fprop, b)
        ctx.save_for_backward(x_TK, weight)
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.dgrad_weight, ctx.rule, ctx.compute_dtype = dgrad_weight, rule, compute_dtype
        return y.view(*x.shape[:-1], y.shape[-1]).to(out_dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_TK, weight = ctx.saved_tensors
        rule, cd = ctx.rule, ctx.compute_dtype
        dy_TN = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        with torch.autocast(dy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                dyq = _fake_mx(dy_TN, -1, rule, cd)
                dx = (dyq @ ctx.dgrad_weight()).view(ctx.x_shape).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                dy_col = _fake_mx(_pad_tokens(dy_TN), 0, rule, cd)
                x_col = _fake_mx(_pad_tokens(x_TK), 0, rule, cd)
                dw = (dy_col.t() @ x_col).to(weight.dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = dy_TN.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None


class WeightOperands:
    """Quantized usages of one weight, cached on (tensor identity, storage, ``_version``).

    ``rowwise`` -> (MXFP8Tensor | FP8Tensor, dequantized in compute dtype); ``columnwise`` -> dequantized
    32x1 blocks along the out-features dim (dim -2). Works for 2-D weights and 3-D expert stacks [E, N, K].
    """

    def __init__(self, precision: str, compute_dtype: torch.dtype) -> None:
        self.precision = precision
        self.compute_dtype = compute_dtype
        self._cache: dict[str, tuple[tuple[int, int, int], Any]] = {}

    def _cached(self, usage: str, weight: torch.Tensor, make: Callable[[torch.Tensor], Any]) -> Any:
        key = (id(weight), weight.data_ptr(), weight._version)
        hit = self._cache.get(usage)
        if hit is None or hit[0] != key:
            with torch.no_grad():
                hit = (key, make(weight.detach()))
            self._cache[usage] = hit
        return hit[1]

    def rowwise(self, weight: torch.Tensor) -> tuple[Any, torch.Tensor]:
        def make(w: torch.Tensor) -> tuple[Any, torch.Tensor]:
            if w.ndim == 3 and self.precision not in MXFP8_RULE:  # FP8 grids: one scale grid per expert
                qs = [quantize_weight(w[e], self.precision) for e in range(w.shape[0])]
                return qs, torch.stack([dequantize(q, self.compute_dtype) for q in qs])
            q = quantize_weight(w, self.precision)
            return q, dequantize(q, self.compute_dtype)

        return self._cached("rowwise", weight, make)

    def columnwise(self, weight: torch.Tensor) -> torch.Tensor:
        rule = MXFP8_RULE[self.precision]
        return self._cached("columnwise", weight, lambda w: _fake_mx(w, -2, rule, self.compute_dtype))


def _check_features(in_features: int, out_features: int, precision: str) -> None:
    if precision in MXFP8_RULE and (in_features % BLOCK or out_features % BLOCK):
        raise ValueError(
            f"MXFP8 linear needs in_features and out_features divisible by {BLOCK}, got "
            f"in={in_features}, out={out_features}; keep this layer in BF16 (precision policy) or pad it"
        )


class QuantLinear(nn.Linear):
    """``nn.Linear`` whose GEMMs see quantized operands on the grid of ``precision`` (a precision id).

    MXFP8 ids run :class:`MXFP8LinearFunction` (TE usage in fprop, dgrad and wgrad). FP8 grids quantize the
    fprop operands (weights per :func:`quantize_weight`, activations per :func:`fake_quantize`) with a
    straight-through gradient -- enough for samplers, which never backpropagate. Parameters keep the names
    ``weight`` / ``bias`` and are shared with the module it was built from, so state_dict names and optimizer
    references are unchanged.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        precision: str = "mxfp8",
        compute_dtype: torch.dtype = torch.bfloat16,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        check_precision(precision)
        _check_features(in_features, out_features, precision)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.precision = precision
        self.compute_dtype = compute_dtype
        self._operands = WeightOperands(precision, compute_dtype)

    @classmethod
    def from_linear(
        cls, lin: nn.Linear, precision: str = "mxfp8", compute_dtype: torch.dtype = torch.bfloat16
    ) -> QuantLinear:
        """Wrap ``lin``'s own parameters (no copy)."""
        new = cls(
            lin.in_features, lin.out_features, lin.bias is not None,
            precision=precision, compute_dtype=compute_dtype, device="meta",
        )  # fmt: skip
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new

    @property
    def rule(self) -> str | None:
        return MXFP8_RULE.get(self.precision)

    def quantized_weight(self) -> Any:
        """The exact rowwise bytes + scales the next fprop uses (MXFP8Tensor for MXFP8 ids)."""
        if self.precision == "bf16":
            raise ValueError("a bf16 QuantLinear has no quantized weight")
        return self._operands.rowwise(self.weight)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision == "bf16":
            b = self.bias.to(self.compute_dtype) if self.bias is not None else None
            return F.linear(x.to(self.compute_dtype), self.weight.to(self.compute_dtype), b)
        _, w_deq = self._operands.rowwise(self.weight)
        if self.rule is not None:
            return MXFP8LinearFunction.apply(
                x, self.weight, self.bias, w_deq,
                lambda: self._operands.columnwise(self.weight), self.rule, self.compute_dtype,
            )  # fmt: skip
        return ste_linear(x, self.weight, self.bias, w_deq, self.precision, self.compute_dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.precision}, compute_dtype={self.compute_dtype}"


def ste_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w_deq: torch.Tensor,
    precision: str,
    compute_dtype: torch.dtype,
) -> torch.Tensor:
    """fprop on quantized operands, identity (straight-through) gradients to x and weight."""
    out_dtype = _out_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        xc = x.to(compute_dtype)
        xq = xc + (fake_quantize(xc.detach(), precision) - xc).detach()
        wc = weight.to(compute_dtype)
        wq = wc + (w_deq - wc).detach()
        y = F.linear(xq, wq, bias.to(compute_dtype) if bias is not None else None)
    return y.to(out_dtype)


class MXFP8Linear(QuantLinear):
    """:class:`QuantLinear` on an MXFP8 grid, chosen by scale ``rule`` ("te" -> ``mxfp8``, "te212", "floor")."""

    @classmethod
    def from_linear(  # type: ignore[override]
        cls, lin: nn.Linear, compute_dtype: torch.dtype = torch.bfloat16, rule: str = "te"
    ) -> MXFP8Linear:
        precisions = {v: k for k, v in MXFP8_RULE.items()}
        if rule not in precisions:
            raise ValueError(f"unknown MXFP8 scale rule {rule!r}; valid rules: {', '.join(precisions)}")
        return super().from_linear(lin, precisions[rule], compute_dtype)  # type: ignore[return-value]

    def quantized_weight(self) -> MXFP8Tensor:
        return super().quantized_weight()
