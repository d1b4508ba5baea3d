"""``mxperf sweep``: update-step timing per micro-batch size and precision, on identical data."""

from __future__ import annotations

import argparse
import json
import sys

from mxperf.commands.trace_flags import add_trace_arguments, trace_config
from tracing.outputs.placement import FORCE_HELP


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        from tracing.outputs.errors import InputError

        raise InputError(f"--tokens-per-microbatch must be comma-separated integers, got {text!r}") from None
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe")
    p.add_argument("--precisions", default="bf16,mxfp8", help="comma-separated learner precisions")
    p.add_argument(
        "--tokens-per-microbatch",
        default="128,256,384,512,768,1024,1536,2048",
        help="comma-separated micro-batch token budgets (dense at small sizes by default)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="unrecorded update steps per (precision, size)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence of the fixed batch")
    p.add_argument("--global-tokens", type=int, default=None, help="tokens per step (default: largest size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compute-dtype", default="bfloat16", help="bfloat16 | float32")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady timings)")
    add_trace_arguments(p, what="sweep", steps=False)
    p.add_argument("-o", "--output", default="runs/sweep", help="sweep directory")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(max(1, args.threads))
    from pipeline.experiments.sweep import SweepConfig
    from pipeline.experiments.sweep_run import execute_sweep

    trace = trace_config(args, None, torch.cuda.is_available())

    cfg = SweepConfig(
        model=args.model,
        precisions=tuple(p.strip() for p in args.precisions.split(",") if p.strip()),
        sizes=_ints(args.tokens_per_microbatch),
        repeats=args.repeats,
        warmup=args.warmup,
        seq_len=args.seq_len,
        global_tokens=args.global_tokens,
        seed=args.seed,
        compute_dtype=args.compute_dtype,
    )
    summary = execute_sweep(
        cfg,
        args.output,
        trace=trace,
        force=args.force,
        command=["mxperf", *sys.argv[1:]],
        log=lambda m: print(m, file=sys.stderr),
    )
    print(f"sweep complete: {summary['microbatches']} micro-batches -> {summary['run_dir']}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0
