"""The emulated MXFP8 linear equals a hand composition of quantize/dequantize GEMMs in TE's usage."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.quant import (
    MXFP8Linear,
    QuantLinear,
    dequantize,
    dequantize_mxfp8,
    fake_quantize,
    quantize_mxfp8,
    quantize_weight,
)

BF16 = torch.bfloat16


def _deq(t: torch.Tensor, axis: int, rule: str = "te", dtype: torch.dtype = BF16) -> torch.Tensor:
    return dequantize_mxfp8(quantize_mxfp8(t, axis, rule=rule), dtype)


def _pad32(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, t.new_zeros((-t.shape[0]) % 32, t.shape[1])])


def _layer(in_f=64, out_f=96, bias=True, dtype=BF16, seed=0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(in_f, out_f, bias=bias).to(dtype)


def _run(mod, x, dy):
    x = x.detach().clone().requires_grad_(True)
    mod.zero_grad(set_to_none=True)
    y = mod(x)
    y.backward(dy)
    return y, x.grad, mod.weight.grad, None if mod.bias is None else mod.bias.grad


@pytest.mark.parametrize("rule", ["te", "te212", "floor"])
def test_forward_and_backward_equal_hand_composition_in_te_usage(rule):
    lin = _layer()
    mx = MXFP8Linear.from_linear(lin, compute_dtype=BF16, rule=rule)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 23, 64, generator=g).to(BF16)  # 46 tokens: not a multiple of 32
    dy = torch.randn(2, 23, 96, generator=g).to(BF16)
    y, dx, dw, db = _run(mx, x, dy)

    x2, dy2, w = x.reshape(-1, 64), dy.reshape(-1, 96), lin.weight.detach()
    y_ref = F.linear(_deq(x2, -1, rule), _deq(w, -1, rule), lin.bias.detach())  # fprop: rowwise X, W
    dx_ref = _deq(dy2, -1, rule) @ _deq(w, 0, rule)  # dgrad: rowwise dY, columnwise W
    dw_ref = _deq(_pad32(dy2), 0, rule).t() @ _deq(_pad32(x2), 0, rule)  # wgrad: columnwise dY, X
    assert torch.equal(y, y_ref.view(2, 23, 96))
    assert torch.equal(dx, dx_ref.view(2, 23, 64))
    assert torch.equal(dw, dw_ref)
    assert torch.equal(db, dy2.float().sum(0).to(BF16))


@pytest.mark.parametrize("tokens", [1, 31, 33, 45])
def test_zero_padding_tokens_never_change_results(tokens):
    mx = MXFP8Linear.from_linear(_layer(seed=2))
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 64, generator=g).to(BF16)
    dy = torch.randn(tokens, 96, generator=g).to(BF16)
    y, dx, dw, db = _run(mx, x, dy)
    pad = 64 - tokens
    y_p, dx_p, dw_p, db_p = _run(mx, F.pad(x, (0, 0, 0, pad)), F.pad(dy, (0, 0, 0, pad)))
    assert torch.equal(y, y_p[:tokens]) and torch.equal(dx, dx_p[:tokens])
    assert torch.equal(dw, dw_p) and torch.equal(db, db_p)


def test_gradients_are_close_to_the_bf16_linear():
    lin = _layer(256, 128, seed=3)
    mx = MXFP8Linear.from_linear(lin)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(96, 256, generator=g).to(BF16)
    dy = torch.randn(96, 128, generator=g).to(BF16)
    ref = _run(lin, x, dy)
    got = _run(mx, x, dy)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        a, b = a.float(), b.float()
        assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.995
        assert (a - b).norm() / b.norm() < 0.08
        # y, dX, dW went through quantized GEMMs; the bias gradient is high precision in both
        assert torch.equal(a, b) == (i == 3)


def test_quantized_weight_is_the_fprop_grid_and_follows_in_place_updates():
    lin = _layer(seed=5)
    mx = MXFP8Linear.from_linear(lin)
    q1 = mx.quantized_weight()
    assert mx.quantized_weight() is q1  # cached while the weight is unchanged
    ref = quantize_mxfp8(lin.weight.detach())
    assert torch.equal(q1.data, ref.data) and torch.equal(q1.scale, ref.scale) and q1.rule == "te"
    with torch.no_grad():
        mx.weight.mul_(3.0)  # optimizer-style in-place update bumps _version
    q2 = mx.quantized_weight()
    ref2 = quantize_mxfp8(lin.weight.detach())
    assert torch.equal(q2.data, ref2.data) and torch.equal(q2.scale, ref2.scale)
    x = torch.randn(32, 64).to(BF16)
    expected = F.linear(_deq(x, -1), dequantize_mxfp8(q2, BF16), lin.bias.detach())
    assert torch.equal(mx(x), expected)


def test_from_linear_shares_parameters_and_keeps_state_dict_names():
    lin = _layer(seed=6)
    mx = MXFP8Linear.from_linear(lin)
    assert mx.weight is lin.weight and mx.bias is lin.bias
    assert list(mx.state_dict()) == list(lin.state_dict()) == ["weight", "bias"]
    assert mx.compute_dtype == BF16 and mx.precision == "mxfp8"
    assert MXFP8Linear.from_linear(lin, rule="te212").precision == "mxfp8-te212"


def test_autocast_runs_the_gemm_in_compute_dtype_and_returns_the_autocast_dtype():
    lin = _layer(dtype=torch.float32, seed=7)
    mx = MXFP8Linear.from_linear(lin, compute_dtype=BF16)
    x = torch.randn(32, 64)
    with torch.autocast("cpu", dtype=BF16):
        y = mx(x)
    assert y.dtype == BF16
    expected = F.linear(_deq(x, -1), _deq(lin.weight.detach(), -1), lin.bias.detach().to(BF16))
    assert torch.equal(y, expected)
    mx32 = MXFP8Linear.from_linear(lin, compute_dtype=torch.float32)
    y32 = mx32(x)
    assert y32.dtype == torch.float32
    exp32 = F.linear(_deq(x, -1, dtype=torch.float32), _deq(lin.weight.detach(), -1, dtype=torch.float32))
    assert torch.allclose(y32, exp32 + lin.bias.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp8-tensor", "fp8-block128", "fp8-rowwise", "mxfp8-floor"])
def test_quant_linear_on_other_grids_uses_weight_and_activation_quantizers(precision):
    lin = _layer(256, 128, seed=8)
    ql = QuantLinear.from_linear(lin, precision, BF16)
    x = torch.randn(4, 10, 256).to(BF16)
    w_deq = dequantize(quantize_weight(lin.weight.detach(), precision), BF16)
    expected = F.linear(fake_quantize(x, precision), w_deq, lin.bias.detach())
    y = ql(x)
    assert torch.equal(y, expected)
    y.float().sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.shape == lin.weight.shape


def test_features_not_divisible_by_32_are_rejected_clearly():
    with pytest.raises(ValueError, match="in=48, out=96"):
        MXFP8Linear.from_linear(torch.nn.Linear(48, 96))
    with pytest.raises(ValueError, match="rule"):
        MXFP8Linear.from_linear(torch.nn.Linear(64, 96), rule="ceil")
    with pytest.raises(ValueError, match="valid ids"):
        QuantLinear.from_linear(torch.nn.Linear(64, 96), "fp4")
    QuantLinear.from_linear(torch.nn.Linear(48, 96), "fp8-rowwise")  # FP8 grids need no 32-blocks


def test_bf16_baseline_runs_the_same_three_gemm_calls_as_a_low_precision_linear(monkeypatch) -> None:
    """BF16 vs MXFP8 must differ by quantization only: both linears call the GEMM with the same operand
    shapes and layouts (on CPUs without native BF16, oneDNN's speed depends several-fold on layout)."""
    import pipeline.quant.gemm as gemm_mod
    from pipeline.quant import PrecisionPolicy, convert_linears

    calls: dict[str, list[tuple]] = {}
    real = gemm_mod.F.linear

    def spy(a, b, bias=None):
        calls.setdefault(prec, []).append((a.dtype, a.shape, a.stride(), b.dtype, b.shape, b.stride()))
        return real(a, b, bias)

    monkeypatch.setattr(gemm_mod.F, "linear", spy)
    for prec in ("mxfp8", "bf16"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 96))
        convert_linears(model, PrecisionPolicy(prec), torch.bfloat16, baseline_gemms=True)
        x = torch.randn(64, 64, requires_grad=True)  # whole 32-token blocks: MXFP8's wgrad pads nothing
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        y.float().square().sum().backward()
        assert x.grad is not None and model[0].weight.grad is not None
    assert len(calls["bf16"]) == 3  # fprop, dgrad, wgrad
    assert calls["bf16"] == calls["mxfp8"]


def test_bf16_baseline_gemms_match_nn_linear() -> None:
    from pipeline.quant import PrecisionPolicy, convert_linears

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 96))
    routed = torch.nn.Sequential(torch.nn.Linear(64, 96))
    routed.load_state_dict(ref.state_dict())
    assert convert_linears(routed, PrecisionPolicy("bf16"), torch.bfloat16, baseline_gemms=True) == []
    x = torch.randn(40, 64)
    outs, grads = [], []
    for m in (ref, routed):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(xi)
        y.float().square().sum().backward()
        outs.append(y.float())
        grads.append((xi.grad, m[0].weight.grad))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)  # the forward is the same GEMM
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=2e-2, atol=2e-2)  # bf16 GEMMs, other order
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=2e-2, atol=2e-2)
