"""The Megatron learner's GPU path (``pipeline.engines.megatron.te_path``): which spec / recipe runs on which
hardware, the errors where none may run, and the export of TE's own MXFP8 bytes.

Everything here but the ``gpu``-marked tests runs on CPU: the selection is a pure function of a capability
tuple and a device name, and the byte export reads TE's storage field names from a plain object whose padded
scale is filled with garbage, as TE's ``at::empty`` padding is. This process never imports megatron or TE.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.device import HardwareUnavailableError
from pipeline.engines.megatron.te_path import (
    compact_rowwise,
    fprop_context,
    local_to_te_names,
    pad_tokens,
    probe_learner_path,
    refresh_weight_casts,
    require_te_autocast,
    select_learner_path,
    te_to_local_names,
    unswizzle_scales,
)
from pipeline.engines.megatron.weights import AttentionShape, hf_to_megatron, megatron_to_hf, split_qkv
from pipeline.quant import quantize_mxfp8

BLACKWELL, HOPPER = (10, 0), (9, 0)
GARBAGE = 0xEE


# -- selection --------------------------------------------------------------------------------------------
def test_without_cuda_bf16_and_mxfp8_use_the_local_spec_on_cpu() -> None:
    bf16, mx = select_learner_path("bf16", None), select_learner_path("mxfp8", None)
    assert (bf16.spec, bf16.recipe, bf16.device) == ("local", None, "cpu")
    assert (mx.spec, mx.recipe, mx.device) == ("local", None, "cpu")
    assert "emulated" in mx.label and not mx.uses_te


def test_blackwell_mxfp8_uses_te_spec_with_mxfp8_block_scaling() -> None:
    path = select_learner_path("mxfp8", BLACKWELL, "NVIDIA B200")
    assert (path.spec, path.recipe, path.device) == ("transformer_engine", "MXFP8BlockScaling", "cuda")
    assert "B200" in path.label and "MXFP8" in path.label


def test_hopper_bf16_uses_te_spec_without_a_recipe() -> None:
    path = select_learner_path("bf16", HOPPER, "NVIDIA H200")
    assert (path.spec, path.recipe, path.device) == ("transformer_engine", None, "cuda")
    assert "MXFP8" not in path.label


@pytest.mark.parametrize("cap", [(9, 0), (8, 9), (8, 0)])
def test_mxfp8_below_sm100_is_refused_naming_the_gpu_and_the_hopper_fp8_ids(cap: tuple[int, int]) -> None:
    with pytest.raises(HardwareUnavailableError) as err:
        select_learner_path("mxfp8", cap, "NVIDIA H200")
    msg = str(err.value)
    assert "NVIDIA H200" in msg and f"SM {cap[0]}.{cap[1]}" in msg
    assert "fp8-tensor" in msg and "fp8-rowwise" in msg


def test_hopper_mxfp8_is_refused_even_when_te_is_missing_too() -> None:
    """The hardware reason comes first: installing TE would not make an H200 run MXFP8."""
    with pytest.raises(HardwareUnavailableError, match="MXFP8 tensor cores"):
        select_learner_path("mxfp8", HOPPER, "NVIDIA H200", te_error="ModuleNotFoundError")


@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_gpu_without_transformer_engine_names_what_to_install(precision: str) -> None:
    with pytest.raises(HardwareUnavailableError) as err:
        select_learner_path(
            precision, BLACKWELL, "NVIDIA B200", te_error="No module named 'transformer_engine'"
        )
    msg = str(err.value)
    assert "transformer-engine[pytorch]>=2.13" in msg and "No module named" in msg and "B200" in msg


def test_unknown_precision_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="fp8-tensor"):
        select_learner_path("fp8-tensor", BLACKWELL, "NVIDIA B200")


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the CPU-only probe")
def test_probe_without_cuda_picks_the_cpu_path_without_importing_te() -> None:
    import sys

    assert probe_learner_path("mxfp8").spec == "local"
    assert "transformer_engine" not in sys.modules


def test_local_path_forward_runs_outside_any_autocast() -> None:
    with fprop_context(select_learner_path("mxfp8", None)):
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert torch.equal(y, torch.full((2, 2), 2.0))


def test_te_without_autocast_is_refused_as_too_old() -> None:
    with pytest.raises(HardwareUnavailableError, match=r"too old.*>=2\.13"):
        require_te_autocast(SimpleNamespace(fp8_autocast=object()))


# -- weight casts -----------------------------------------------------------------------------------------
class _FlaggedLinear(torch.nn.Linear):
    """Stands in for Megatron's TE linears (TE cannot be imported here): they carry ``is_first_microbatch``,
    True at construction and set to False by every forward."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.is_first_microbatch = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.is_first_microbatch = False
        return super().forward(x)


def test_refresh_weight_casts_resets_every_flagged_module_after_forwards_cleared_them() -> None:
    model = torch.nn.Sequential(_FlaggedLinear(), torch.nn.ReLU(), torch.nn.Sequential(_FlaggedLinear()))
    model(torch.ones(2, 4))
    flagged = [m for m in model.modules() if isinstance(m, _FlaggedLinear)]
    assert [m.is_first_microbatch for m in flagged] == [False, False]  # TE would now reuse stale casts
    assert refresh_weight_casts(model) == 2
    assert [m.is_first_microbatch for m in flagged] == [True, True]
    assert not hasattr(model[1], "is_first_microbatch")


# -- token padding ----------------------------------------------------------------------------------------
def test_pad_tokens_reaches_a_multiple_of_32_with_masked_tokens_after_the_real_ones() -> None:
    ids = torch.arange(3 * 7).reshape(3, 7)
    mask = torch.ones_like(ids)
    pids, pmask = pad_tokens(ids, mask)
    assert pids.numel() % 32 == 0 and pids.shape[0] == 3
    assert torch.equal(pids[:, :7], ids) and torch.equal(pmask[:, :7], mask)
    assert int(pmask[:, 7:].sum()) == 0
    same_ids, _ = pad_tokens(torch.zeros(4, 8, dtype=torch.long), torch.ones(4, 8, dtype=torch.long))
    assert same_ids.shape == (4, 8)


# -- names ------------------------------------------------------------------------------------------------
SHAPE = AttentionShape(num_heads=4, num_query_groups=2, head_dim=32)


def _hf_layer(hidden: int = 64, ffn: int = 96) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q_rows, kv_rows = SHAPE.num_heads * SHAPE.head_dim, SHAPE.num_query_groups * SHAPE.head_dim
    shapes = {
        "self_attn.q_proj.weight": (q_rows, hidden),
        "self_attn.k_proj.weight": (kv_rows, hidden),
        "self_attn.v_proj.weight": (kv_rows, hidden),
        "self_attn.o_proj.weight": (hidden, q_rows),
        "self_attn.q_norm.weight": (SHAPE.head_dim,),
        "self_attn.k_norm.weight": (SHAPE.head_dim,),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (ffn, hidden),
        "mlp.up_proj.weight": (ffn, hidden),
        "mlp.down_proj.weight": (hidden, ffn),
    }
    return {f"model.layers.0.{k}": torch.randn(s, generator=g) for k, s in shapes.items()}


def test_te_fused_pre_norm_names_round_trip_through_the_existing_hf_mapping() -> None:
    hf = _hf_layer()
    te_state = local_to_te_names(hf_to_megatron(hf, SHAPE, tied=True))
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in te_state
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in te_state
    assert not any(k.endswith("input_layernorm.weight") for k in te_state)
    back = megatron_to_hf(te_to_local_names(te_state), SHAPE)
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


# -- bytes ------------------------------------------------------------------------------------------------
def _padded(n: int, k: int) -> tuple[int, int]:
    return -(-n // 128) * 128, -(-(k // 32) // 4) * 4


def _fake_te_tensor(data: torch.Tensor, scale: torch.Tensor, swizzled: bool = False) -> SimpleNamespace:
    """An object with TE's MXFP8 storage field names; scale padding holds garbage like TE's at::empty."""
    n, k = data.shape
    rows, cols = _padded(n, k)
    padded = torch.full((rows, cols), GARBAGE, dtype=torch.uint8)
    padded[:n, : k // 32] = scale
    if swizzled:
        padded = _swizzle_by_index_formula(padded)
    return SimpleNamespace(_rowwise_data=data, _rowwise_scale_inv=padded, _with_gemm_swizzled_scales=swizzled)


def _swizzle_by_index_formula(compact: torch.Tensor) -> torch.Tensor:
    """cuBLAS block-scaling layout, written from the element formula (notes 2.4), independently of the code."""
    rows, cols = compact.shape
    out = torch.empty(rows * cols, dtype=torch.uint8)
    tiles_per_row = cols // 4
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_per_row + c // 4
            out[tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = compact[r, c]
    return out


def test_compact_rowwise_keeps_exactly_n_rows_and_k_over_32_scale_columns() -> None:
    w = torch.randn(40, 96)
    q = quantize_mxfp8(w)
    data, scale = compact_rowwise(_fake_te_tensor(q.data, q.scale))
    assert scale.shape == (40, 3) and data.shape == (40, 96) and data.dtype == torch.uint8
    assert torch.equal(scale, q.scale) and torch.equal(data, q.data)
    assert not bool((scale == GARBAGE).any())


def test_compact_rowwise_unswizzles_gemm_swizzled_scales() -> None:
    w = torch.randn(130, 320)  # 2 row tiles, 10 scale columns padded to 12
    q = quantize_mxfp8(w)
    _, scale = compact_rowwise(_fake_te_tensor(q.data, q.scale, swizzled=True))
    assert torch.equal(scale, q.scale)
    compact = torch.arange(256 * 12, dtype=torch.int64).reshape(256, 12)
    assert torch.equal(
        unswizzle_scales(_swizzle_by_index_formula(compact.to(torch.uint8)), 256, 12), compact.to(torch.uint8)
    )


def test_compact_rowwise_rejects_an_unpadded_scale_and_a_k_not_multiple_of_32() -> None:
    bad_scale = SimpleNamespace(
        _rowwise_data=torch.zeros(40, 96, dtype=torch.uint8),
        _rowwise_scale_inv=torch.zeros(40, 3, dtype=torch.uint8),
    )
    with pytest.raises(ValueError, match="pads"):
        compact_rowwise(bad_scale)
    with pytest.raises(ValueError, match="K % 32"):
        compact_rowwise(
            SimpleNamespace(
                _rowwise_data=torch.zeros(4, 40, dtype=torch.uint8),
                _rowwise_scale_inv=torch.zeros(128, 4, dtype=torch.uint8),
            )
        )
    with pytest.raises(ValueError, match="rowwise=True"):
        compact_rowwise(SimpleNamespace(_rowwise_data=None, _rowwise_scale_inv=None))


def test_exported_fused_qkv_bytes_equal_the_rowwise_quantization_of_each_hf_projection() -> None:
    """Row permutations commute with 1x32 rowwise blocks: splitting TE's fused bytes with the existing
    query-group mapping gives exactly the bytes of quantizing q, k and v on their own."""
    hf = _hf_layer()
    qkv = hf_to_megatron(hf, SHAPE, tied=True)["decoder.layers.0.self_attention.linear_qkv.weight"]
    fused = quantize_mxfp8(qkv)
    data, scale = compact_rowwise(_fake_te_tensor(fused.data, fused.scale))
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    by_data = megatron_to_hf({name: data}, SHAPE)
    by_scale = megatron_to_hf({name: scale}, SHAPE)
    for proj in ("q_proj", "k_proj", "v_proj"):
        hf_name = f"model.layers.0.self_attn.{proj}.weight"
        own = quantize_mxfp8(hf[hf_name])
        assert torch.equal(by_data[hf_name], own.data) and torch.equal(by_scale[hf_name], own.scale)
    assert torch.equal(split_qkv(data, SHAPE)[0], by_data["model.layers.0.self_attn.q_proj.weight"])


# -- on hardware (skipped here with a reason) -------------------------------------------------------------
@pytest.mark.gpu
def test_hopper_learner_refuses_mxfp8_and_blackwell_exports_te_bytes() -> None:
    """On an SM < 10 GPU the learner refuses mxfp8; on Blackwell it exports TE's bytes, whose dequantized
    values are the BF16 weights to within one E4M3 step. Never run on hardware yet."""
    from pipeline.engines.megatron.learner import MegatronLearner
    from pipeline.model.presets import get_preset

    preset = get_preset("tiny-dense")
    if torch.cuda.get_device_capability(0) < BLACKWELL:
        with pytest.raises(HardwareUnavailableError, match="fp8-tensor"):
            MegatronLearner(preset, "mxfp8")
        return
    learner = MegatronLearner(preset, "mxfp8")
    assert learner.path.recipe == "MXFP8BlockScaling"
    out = learner.export_weights(lambda name: True)
    name = "model.layers.0.self_attn.q_proj.weight"
    ref = learner.state_dict()[name]
    assert out[name].dtype == torch.uint8 and out[name].shape == ref.shape
    from pipeline.interfaces import scale_name
    from pipeline.quant import MXFP8Tensor, dequantize_mxfp8

    deq = dequantize_mxfp8(MXFP8Tensor(out[name], out[scale_name(name)], -1, "te", torch.bfloat16))
    assert float((deq - ref).abs().max() / ref.abs().max()) < 0.07
    ids = torch.randint(0, preset.vocab_size, (2, 9))
    assert bool(torch.isfinite(learner.logprobs(ids, torch.ones_like(ids))).all())


@pytest.mark.gpu
def test_blackwell_mxfp8_forward_after_a_weight_update_uses_fresh_weight_casts() -> None:
    """After the masters change and are copied into the model (what ``train_step`` does after AdamW), the next
    MXFP8 forward must equal one with explicitly refreshed TE weight casts. Fails while the learner leaves
    TE's ``is_first_microbatch`` False (stale casts from the first forward). Never run on hardware yet."""
    from pipeline.engines.megatron.learner import MegatronLearner
    from pipeline.model.presets import get_preset

    if torch.cuda.get_device_capability(0) < BLACKWELL:
        pytest.skip("MXFP8 needs SM 10.x")
    preset = get_preset("tiny-dense")
    learner = MegatronLearner(preset, "mxfp8")
    ids = torch.randint(0, preset.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    learner.logprobs(ids, mask)
    with torch.no_grad():
        for m in learner.master:
            m.mul_(0.5)
    learner._copy_master_to_model()
    after_update = learner.logprobs(ids, mask)
    refresh_weight_casts(learner.model)
    assert torch.equal(after_update, learner.logprobs(ids, mask))
