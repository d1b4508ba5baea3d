"""Supervised warm-start, cached by config hash, so the RL policy has non-zero reward at step 0.

Teacher forcing on solved problems (``prompt answer <eos>``), cross-entropy on the answer and end-of-sequence
tokens only (the prompt digits are random and carry nothing to learn), AdamW in float32. The result depends
only on (model preset, task, tokenizer, steps, batch size, learning rate, seed, and the device type when it is
not the CPU: a GPU's kernels round differently), so it is cached under
``$MXPERF_CACHE/pretrain/<sha256 of that config>/`` (default ``~/.cache/mxperf``) as ``model.safetensors``
plus ``meta.json``; a second run with the same config loads it in milliseconds. Writes are atomic (a
temporary directory renamed into place), so an interrupted pretrain never leaves a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.model.presets import ModelPreset, build_model
from pipeline.model.task import AdditionTask
from pipeline.model.tokenizer import TaskTokenizer

CACHE_ENV = "MXPERF_CACHE"
PRETRAIN_FORMAT = 1  # bump when the training recipe changes (invalidates cached entries)


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 300
    batch_size: int = 64
    lr: float = 2e-3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"invalid pretrain config {self}: need steps >= 0, batch_size >= 1, lr > 0")
        if not 0 <= self.seed <= 2**62 or max(self.steps, self.batch_size) > 2**62:
            raise ValueError(
                f"invalid pretrain config {self}: seed must be from 0 to 2^62, steps and batch_size at most 2^62"
            )


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mxperf")


def progress_lines(total_steps: int, log: Callable[[str], None]) -> Callable[[int, float], None]:
    """A ``warm_start`` progress callback that says what the first, uncached warm start is doing (it runs
    for a minute or more on a CPU with nothing else printed) in about ten lines."""
    every = max(1, total_steps // 10)

    def progress(step: int, loss: float) -> None:
        if step == 0:
            log(
                f"warm start: {total_steps} supervised steps, the first time only (then cached in {cache_root()})"
            )
        if (step + 1) % every == 0 or step + 1 == total_steps:
            log(f"warm start: step {step + 1}/{total_steps}, loss {loss:.4f}")

    return progress


def config_hash(
    preset: ModelPreset,
    task: AdditionTask,
    tokenizer: TaskTokenizer,
    cfg: PretrainConfig,
    device: torch.device | None = None,
) -> str:
    vocab = json.dumps(sorted(tokenizer._tok.get_vocab().items()))
    key = {
        "format": PRETRAIN_FORMAT,
        "preset": preset.name,
        "config": preset.config_kwargs,
        "task": asdict(task),
        "tokenizer_sha": hashlib.sha256(vocab.encode()).hexdigest(),
        "pretrain": asdict(cfg),
    }
    if device is not None and torch.device(device).type != "cpu":  # CPU keys stay as they were
        key["device"] = torch.device(device).type
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _batch(
    task: AdditionTask, tok: TaskTokenizer, n: int, seed: int, device: torch.device | None = None
) -> tuple[torch.Tensor, ...]:
    """(input_ids, attention_mask, loss_mask [B, T-1]) of ``n`` solved problems."""
    rows, answer_from = [], []
    for p in task.problems(n, seed):
        prompt = tok.encode(p.prompt)
        rows.append(prompt + tok.encode(p.answer) + [tok.eos_id])
        answer_from.append(len(prompt))
    t = max(len(r) for r in rows)
    ids = torch.full((n, t), tok.pad_id, dtype=torch.long)
    am = torch.zeros((n, t), dtype=torch.long)
    lm = torch.zeros((n, t - 1))
    for i, (r, a) in enumerate(zip(rows, answer_from, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        am[i, : len(r)] = 1
        lm[i, a - 1 : len(r) - 1] = 1.0
    return ids.to(device), am.to(device), lm.to(device)


def train(
    model: torch.nn.Module,
    task: AdditionTask,
    tok: TaskTokenizer,
    cfg: PretrainConfig,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place, on the device it is on; returns the loss of each step."""
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 20) * max(0.1, 1 - i / max(cfg.steps, 1))
    )
    model.train()
    losses = []
    for step in range(cfg.steps):
        ids, am, lm = _batch(task, tok, cfg.batch_size, seed=cfg.seed * 1_000_003 + step + 7, device=device)
        logits = model(input_ids=ids, attention_mask=am, use_cache=False).logits[:, :-1]
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        loss = (ce * lm.reshape(-1)).sum() / lm.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step, losses[-1])
    model.eval()
    return losses


def warm_start(
    preset: ModelPreset,
    task: AdditionTask,
    tok: TaskTokenizer,
    cfg: PretrainConfig,
    *,
    progress: Callable[[int, float], None] | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The warm-started float32 model on the CPU (from the cache when present) and its cache metadata;
    ``device``: where the supervised steps run when the cache has no entry."""
    from safetensors.torch import load_file, save_file

    model = build_model(preset, seed=cfg.seed)
    if cfg.steps == 0:
        return model, {"cached": False, "steps": 0, "path": None}
    key = config_hash(preset, task, tok, cfg, torch.device(device) if device is not None else None)
    entry = cache_root() / "pretrain" / key
    if (entry / "model.safetensors").is_file() and (entry / "meta.json").is_file():
        model.load_state_dict(load_file(str(entry / "model.safetensors")))
        meta = json.loads((entry / "meta.json").read_text())
        return model.eval(), {**meta, "cached": True, "path": str(entry)}
    t0 = time.monotonic()
    if device is not None:
        model.to(device)
    losses = train(model, task, tok, cfg, progress)
    model.cpu()
    meta = {
        "key": key,
        "preset": preset.name,
        "device": str(device) if device is not None else "cpu",
        "pretrain": asdict(cfg),
        "final_loss": losses[-1],
        "seconds": time.monotonic() - t0,
    }
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=entry.parent))
    try:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        tok.save(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if entry.exists():  # another process won the race; keep its entry
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return model, {**meta, "cached": False, "path": str(entry)}
