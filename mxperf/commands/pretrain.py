"""``mxperf pretrain``: the supervised warm-start of a preset, cached by config hash."""

from __future__ import annotations

import argparse
import json
import sys

from mxperf.commands.device_flags import add_device_arguments, device_settings


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-digits", type=int, default=1)
    p.add_argument("--max-digits", type=int, default=2)
    add_device_arguments(p, learner=False)
    p.add_argument("--json", action="store_true", help="print the cache entry as JSON on the last line")


def run(args: argparse.Namespace) -> int:
    from pipeline.device import resolve_device
    from pipeline.experiments.session import build_tokenizer
    from pipeline.model.presets import get_preset
    from pipeline.model.pretrain import PretrainConfig, progress_lines, warm_start
    from pipeline.model.task import AdditionTask
    from tracing.outputs.errors import InputError

    device = resolve_device(device_settings(args)["device"])
    preset = get_preset(args.model)
    try:
        task = AdditionTask(args.min_digits, args.max_digits)
        cfg = PretrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    progress = progress_lines(args.steps, lambda m: print(m, file=sys.stderr, flush=True))
    _, meta = warm_start(preset, task, build_tokenizer(task), cfg, progress=progress, device=device)
    where = "cached" if meta.get("cached") else "trained"
    print(
        f"{where}: {meta.get('path')} (final loss {meta.get('final_loss', float('nan')):.4f})",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps({"schema_version": 1, **meta}, default=str))
    return 0
