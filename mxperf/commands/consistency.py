"""``mxperf consistency``: every learner x sampler precision pairing at fixed weights, in one process."""

from __future__ import annotations

import argparse
import json
import sys

from mxperf.commands.device_flags import add_device_arguments, device_settings
from tracing.outputs.placement import FORCE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--eval-prompts",
        type=int,
        default=128,
        help="prompts in the fixed evaluation batch (~1000 scored tokens resolve the orderings; see the +- se column)",
    )
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--pretrain-steps", type=int, default=0, help="supervised warm-start steps (cached)")
    p.add_argument("--compute-dtype", default="bfloat16", help="learner autocast dtype: bfloat16 | float32")
    add_device_arguments(p)
    p.add_argument("-o", "--output", default=None, help="directory for consistency.parquet + manifest")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print the table as JSON on the last line")


def run(args: argparse.Namespace) -> int:
    import contextlib
    from dataclasses import asdict

    from pipeline.device import device_label
    from pipeline.experiments.consistency import ConsistencyConfig, format_table, run_consistency
    from tracing.outputs import store
    from tracing.outputs.manifest import OutputDir

    device = device_settings(args)
    cfg = ConsistencyConfig(
        model=args.model,
        seed=args.seed,
        eval_prompts=args.eval_prompts,
        max_new_tokens=args.max_new_tokens,
        pretrain_steps=args.pretrain_steps,
        compute_dtype=args.compute_dtype,
        **device,
    )
    od = (
        OutputDir(
            args.output,
            kind="run",
            command=["mxperf", *sys.argv[1:]],
            config={"tool": "consistency", **asdict(cfg)},
            compute_dtype=cfg.compute_dtype,
            force=args.force,
        )
        if args.output
        else contextlib.nullcontext()
    )
    with od as out:
        df = run_consistency(cfg, log=lambda m: print(m, file=sys.stderr))
        if out is not None:
            store.write_table(df, out.path / store.CONSISTENCY)
            out.update(
                learner_device=device_label(cfg.torch_device), sampler_device=device_label(cfg.torch_device)
            )
    print(format_table(df))
    if args.json:
        print(
            json.dumps(
                {
                    "schema_version": 1,
                    "run_dir": args.output,
                    "status": "complete",
                    "rows": df.to_dict(orient="records"),
                }
            )
        )
    return 0
