"""``mxperf run``: an instrumented GRPO run (learner and sampler precisions, weight sync checks)."""

from __future__ import annotations

import argparse
import json
import sys

from mxperf.commands.device_flags import add_device_arguments, device_settings
from mxperf.commands.trace_flags import add_trace_arguments, trace_config
from tracing.outputs.placement import FORCE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe")
    p.add_argument(
        "--learner",
        default="bf16",
        help="learner precision: bf16 | mxfp8 | fp8-tensor | fp8-rowwise | fp8-block128",
    )
    p.add_argument(
        "--sampler", default="bf16", help="sampler precision id (bf16, mxfp8, mxfp8-floor, fp8-tensor, ...)"
    )
    p.add_argument(
        "--grid-fraction", type=float, default=1.0, help="fraction of layers on the sampler's grid"
    )
    p.add_argument("--kv-cache", default="bf16", help="sampler KV cache: bf16 | fp8")
    p.add_argument(
        "--sampler-engine",
        default="native",
        help="native | vllm (vLLM in its own process; `make vllm` first)",
    )
    p.add_argument(
        "--learner-engine", default="native", help="native (transformers) | megatron (megatron-core)"
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--samples-per-prompt", type=int, default=4, help="GRPO group size n")
    p.add_argument(
        "--max-new-tokens",
        default="5",
        help="default: 5. Cap on each response's new tokens: N, or LO:HI to draw each step's cap uniformly "
        "from LO..HI with --seed (responses still end at end-of-sequence; metrics.parquet records each "
        "step's max_new_tokens, prompt_tokens and response_tokens, the manifest's step_shapes the draws)",
    )
    p.add_argument(
        "--max-digits",
        default="2",
        help="most digits of the task's numbers: N (each number has 1..N), or LO:HI to draw each step's N "
        "from LO..HI with --seed, so prompt lengths vary by step (tokenizer and warm start cover 1..HI)",
    )
    p.add_argument(
        "--tokens-per-microbatch", type=int, default=128, help="padded token budget per micro-batch"
    )
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--compute-dtype", default="bfloat16", help="bfloat16 | float32 (learner autocast dtype)")
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=300,
        help="supervised warm-start steps, cached in $MXPERF_CACHE (0: random init, zero reward)",
    )
    p.add_argument("--async", dest="async_mode", action="store_true", help="overlap generation with the sync")
    add_device_arguments(p)
    p.add_argument("--check-sync", default="every", help="every sync | first (the initial push only) | off")
    p.add_argument("--strict", action="store_true", help="stop with an error at the first failed sync check")
    add_trace_arguments(p, what="steps", steps=True)
    p.add_argument("-o", "--output", default="runs/run", help="run directory")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    from pipeline.device import resolve_device
    from pipeline.experiments.settings import int_range

    new_low, new_high = int_range("max_new_tokens", args.max_new_tokens)
    digits_low, digits_high = int_range("max_digits", args.max_digits)
    device = device_settings(args)
    from pipeline.experiments.loop import SyncCheckFailedError
    from pipeline.experiments.run import execute_run
    from pipeline.experiments.session import RunConfig

    trace = trace_config(args, args.steps, resolve_device(args.device).type == "cuda")

    cfg = RunConfig(
        model=args.model,
        learner=args.learner,
        sampler=args.sampler,
        grid_fraction=args.grid_fraction,
        kv_cache=args.kv_cache,
        steps=args.steps,
        seed=args.seed,
        prompts_per_step=args.prompts_per_step,
        samples_per_prompt=args.samples_per_prompt,
        max_new_tokens=new_high,
        max_new_tokens_low=new_low if new_low < new_high else None,
        max_digits=digits_high,
        max_digits_low=digits_low if digits_low < digits_high else None,
        tokens_per_microbatch=args.tokens_per_microbatch,
        lr=args.lr,
        compute_dtype=args.compute_dtype,
        pretrain_steps=args.pretrain_steps,
        async_mode=args.async_mode,
        sampler_engine=args.sampler_engine,
        learner_engine=args.learner_engine,
        **device,
    )
    try:
        summary = execute_run(
            cfg,
            args.output,
            trace=trace,
            check_sync=args.check_sync,
            strict=args.strict,
            force=args.force,
            command=["mxperf", *sys.argv[1:]],
            log=lambda msg: print(msg, file=sys.stderr),
        )
    except SyncCheckFailedError as exc:
        if args.json:
            print(
                json.dumps(
                    {"schema_version": 1, "run_dir": args.output, "status": "failed", "error": str(exc)}
                )
            )
        raise
    print(
        f"run complete: {summary['steps']} steps, {summary['checks_failed']} failed checks -> {summary['run_dir']}",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(summary))
    return 0
