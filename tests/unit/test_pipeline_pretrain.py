"""Warm-start: it learns, it is cached by config hash, the cache location follows MXPERF_CACHE."""

from __future__ import annotations

import json

import pytest
import torch

from mxperf.cli import main
from pipeline.experiments.session import build_tokenizer
from pipeline.model.presets import get_preset
from pipeline.model.pretrain import PretrainConfig, config_hash, warm_start
from pipeline.model.task import AdditionTask


def test_warm_start_lowers_the_loss_and_is_cached_by_config(tmp_path, monkeypatch):
    monkeypatch.setenv("MXPERF_CACHE", str(tmp_path))
    task, preset = AdditionTask(1, 1), get_preset("tiny-dense")
    tok = build_tokenizer(task)
    losses: list[float] = []
    cfg = PretrainConfig(steps=12, batch_size=16)
    model, meta = warm_start(preset, task, tok, cfg, progress=lambda i, loss: losses.append(loss))
    assert not meta["cached"] and losses[-1] < losses[0]
    entry = tmp_path / "pretrain" / config_hash(preset, task, tok, cfg)
    assert (entry / "model.safetensors").is_file() and (entry / "tokenizer.json").is_file()
    again, meta2 = warm_start(preset, task, tok, cfg, progress=lambda i, loss: losses.append(-1.0))
    assert meta2["cached"] and -1.0 not in losses  # loaded, not retrained
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    other = config_hash(preset, task, tok, PretrainConfig(steps=13, batch_size=16))
    assert other != entry.name


def test_pretrain_cli_reports_the_cache_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MXPERF_CACHE", str(tmp_path))
    args = ["pretrain", "--model", "tiny-dense", "--steps", "2", "--batch-size", "4", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["cached"] is False and second["cached"] is True and first["path"] == second["path"]
    assert second["path"].startswith(str(tmp_path))


@pytest.mark.parametrize("bad", [{"seed": -1}, {"seed": 10**20}, {"steps": 10**20}, {"batch_size": 0}])
def test_pretrain_config_refuses_values_torch_cannot_take(bad):
    with pytest.raises(ValueError, match="invalid pretrain config"):
        PretrainConfig(**bad)
