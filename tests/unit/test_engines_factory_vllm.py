"""The vLLM client's pure parts (no vLLM needed): weight-only-grid dequantization, the model dir, the load
record the invariant checker reads."""

from __future__ import annotations

import json

import torch

from pipeline.engines.vllm.client import dequantize_payload, write_model_dir
from pipeline.engines.vllm.view import VllmWeightsView
from pipeline.interfaces import scale_name
from pipeline.model.presets import build_config, build_model, get_preset
from pipeline.quant import dequantize_mxfp8, quantize_mxfp8


def test_weight_only_grid_values_are_the_exact_dequantized_mxfp8_bytes() -> None:
    w = torch.randn(64, 96) * torch.logspace(-3, 2, 96)
    q = quantize_mxfp8(w)
    name = "model.layers.0.mlp.down_proj.weight"
    values, n = dequantize_payload(
        {name: q.data, scale_name(name): q.scale, "model.norm.weight": torch.ones(8)}
    )
    assert n == 1 and set(values) == {name, "model.norm.weight"}
    assert values[name].dtype == torch.bfloat16
    # exact: every MXFP8 value is representable in BF16
    assert torch.equal(values[name].float(), dequantize_mxfp8(q, torch.float32))


def test_model_dir_names_the_causal_lm_architecture(tmp_path) -> None:
    preset = get_preset("tiny-dense")
    path = write_model_dir(
        build_config(preset), build_model(preset).state_dict(), tmp_path / "m", torch.bfloat16
    )
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]  # else vLLM builds a pooling model without LM head
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()


def test_load_record_marks_rows_of_received_names_only() -> None:
    config = build_config(get_preset("tiny-dense"))
    view = VllmWeightsView(config, engine=None)
    names = list(build_model(get_preset("tiny-dense")).state_dict())
    rec = view.record_load(3, names)
    assert all(bool((c == 1).all()) for c in rec.writes.values())
    rec = view.record_load(4, [n for n in names if n != "model.layers.1.mlp.up_proj.weight"])
    w = rec.writes["model.layers.1.mlp.gate_up_proj.weight"]
    assert int((w == 0).sum()) == config.intermediate_size  # the up half never written
    rows = rec.row_versions["model.layers.1.mlp.gate_up_proj.weight"]
    assert set(rows.tolist()) == {3, 4}  # stale rows keep the old version (I7)
