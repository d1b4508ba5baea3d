"""``mxperf sweep``: update-step timing per micro-batch size, precision and global batch, on identical data."""

from __future__ import annotations

import argparse
import json
import sys

from mxperf.commands.device_flags import accept_negative_lists, add_device_arguments, device_settings
from mxperf.commands.trace_flags import add_trace_arguments, trace_config
from tracing.outputs.placement import FORCE_HELP


def _ints(text: str, flag: str = "--tokens-per-microbatch") -> tuple[int, ...]:
    """Comma-separated integers; an empty item or a non-integer is one InputError naming ``flag``."""
    from tracing.outputs.errors import InputError

    items = [v.strip() for v in text.split(",")]
    if text.strip() and not all(items):
        raise InputError(f"{flag} has an empty item in {text!r}; give comma-separated integers, e.g. 256,512")
    try:
        return tuple(int(v) for v in items if v)
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe")
    accept_negative_lists(p)
    p.add_argument(
        "--precisions",
        default="bf16,mxfp8",
        help="comma-separated learner precisions: bf16, mxfp8, fp8-tensor, fp8-rowwise, fp8-block128",
    )
    p.add_argument(
        "--tokens-per-microbatch",
        default="128,256,384,512,768,1024,1536,2048",
        help="comma-separated micro-batch token budgets (dense at small sizes by default)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="unrecorded update steps per (precision, size)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence of the fixed batch")
    p.add_argument(
        "--global-batch",
        "--global-tokens",
        dest="global_batch",
        default=None,
        help="tokens per step, one or more (A,B: the same data at two global batch sizes, which identifies a "
        "cost paid once per step; default: the largest size)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        help="time the warm start mxperf run trains from (its default: 300; cached in $MXPERF_CACHE) instead "
        "of a random init (0); an MoE's cost follows its routing, so use your runs' value",
    )
    p.add_argument("--compute-dtype", default="bfloat16", help="bfloat16 | float32")
    add_device_arguments(p)
    add_trace_arguments(p, what="sweep", steps=False)
    p.add_argument("-o", "--output", default="runs/sweep", help="sweep directory")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    from pipeline.device import resolve_device

    device = device_settings(args)
    from pipeline.experiments.sweep import SweepConfig
    from pipeline.experiments.sweep_run import execute_sweep

    trace = trace_config(args, None, resolve_device(args.device).type == "cuda")
    if args.trace_repeats != 1 and not args.trace:
        from tracing.outputs.errors import InputError

        raise InputError("--trace-repeats chooses what --trace records: add --trace")

    cfg = SweepConfig(
        model=args.model,
        precisions=tuple(p.strip() for p in args.precisions.split(",") if p.strip()),
        sizes=_ints(args.tokens_per_microbatch),
        repeats=args.repeats,
        warmup=args.warmup,
        seq_len=args.seq_len,
        global_tokens=_ints(args.global_batch, "--global-batch") if args.global_batch else None,
        trace_repeats=args.trace_repeats,
        seed=args.seed,
        pretrain_steps=args.pretrain_steps,
        compute_dtype=args.compute_dtype,
        **device,
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
