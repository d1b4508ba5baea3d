"""The Megatron-core learner on CPU: export mapping verified numerically against HF Qwen3, bf16 log-probs,
GRPO step, micro-batch split invariance.

megatron-core needs ``pipeline.engines.megatron.compat`` on CPU-only torch, which patches ``torch.cuda``
process-wide, so everything Megatron runs in one child process (``megatron_child/checks.py``) whose JSON
measurements these tests assert on; this pytest process never imports megatron.
"""

from __future__ import annotations

import pytest
from megatron_helpers import run_child

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install megatron-core)")


def _child(tmp_path_factory: pytest.TempPathFactory, *mode: str) -> dict:
    return run_child("checks.py", tmp_path_factory.mktemp("megatron") / "checks.json", *mode)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The export mapping checks only (a few seconds): default suite."""
    return _child(tmp_path_factory)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Learners, GRPO steps, MXFP8: about 15 s in all on 2 cores."""
    return _child(tmp_path_factory, "full")


def test_exported_megatron_weights_reproduce_hf_logits(measured: dict) -> None:
    # fp32, from Megatron's own random init: only the name/layout mapping can make these agree.
    assert measured["logits_maxdiff_fp32[None]"] < 1e-4 * max(1.0, measured["logits_absmax"])


@pytest.mark.parametrize("fault", ["naive_qkv_split", "swap_gate_up"])
def test_wrong_qkv_interleave_or_gate_up_order_changes_logits(measured: dict, fault: str) -> None:
    assert measured[f"logits_maxdiff_fp32[{fault}]"] > 1e-2


def test_left_padded_row_matches_unpadded_sequence(measured: dict) -> None:
    assert measured["left_pad_maxdiff_fp32"] < 1e-4


def test_bf16_learner_logprobs_match_hf_fp32_within_bf16_tolerance(trained: dict) -> None:
    assert trained["logprob_maxdiff_bf16_vs_hf_fp32"] < 0.05


def test_export_is_bf16_in_hf_names(trained: dict) -> None:
    assert trained["export_dtypes"] == ["torch.bfloat16"]
    assert trained["export_names_match_hf"]


def test_gradient_is_independent_of_microbatch_split(trained: dict) -> None:
    one, three = trained["stats"]
    assert (one["num_microbatches"], three["num_microbatches"]) == (1.0, 3.0)
    assert trained["split_grad_maxdiff"] < 1e-2 * trained["grad_absmax"]


def test_grpo_step_moves_logprobs_along_the_advantage(trained: dict) -> None:
    assert trained["update_max_move"] > 0
    assert trained["advantage_weighted_lp_change"] > 0


def test_compat_layer_is_applied_in_the_child_only(measured: dict) -> None:
    import torch

    assert "torch.cuda.current_device->cpu" in measured["compat_patches"]
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            torch.cuda.current_device()


def test_mxfp8_learner_exports_the_fprop_bytes_of_every_decoder_linear(trained: dict) -> None:
    names = trained["mxfp8_quantized_names"]
    assert (
        len(names) == 4 * 7
    )  # q, k, v, o, gate, up, down in each of 4 layers; embeddings / LM head stay BF16
    assert not any("embed" in n or "lm_head" in n or "norm" in n for n in names)
    assert trained["mxfp8_bytes_match_requantized_bf16"]


def test_mxfp8_learner_is_quantized_and_trains(trained: dict) -> None:
    assert 0 < trained["mxfp8_vs_bf16_logprob_maxdiff"] < 0.5  # really quantized, still the same model
    assert trained["mxfp8_grad_norm"] > 0
