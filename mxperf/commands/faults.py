"""``mxperf faults``: run every weight-sync fault live in the RL loop and print the fault x check matrix."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from mxperf.commands.device_flags import add_device_arguments, device_settings
from tracing.outputs.placement import FORCE_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe (adds the MoE-only faults)")
    p.add_argument("--steps", type=int, default=3, help="RL steps per run (>= 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pretrain-steps", type=int, default=60, help="warm-start steps (cached; GRPO needs reward)"
    )
    p.add_argument("--only", default="", help="comma-separated fault names (default: all that apply)")
    add_device_arguments(p)
    p.add_argument(
        "-o", "--output", default=None, help="directory for fault_matrix.parquet + sync_checks.parquet"
    )
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    from pipeline.experiments.fault_runs import FaultRunSettings, outcome_rows, render_matrix, run_matrix
    from pipeline.model.presets import get_preset
    from pipeline.sync.faults import applicable, get_fault
    from tracing.outputs.errors import InputError

    preset = get_preset(args.model)
    if preset.shape_only:
        raise InputError(f"--model {args.model} is shape-only; fault runs need tiny-dense or tiny-moe")
    device = device_settings(args)
    try:
        settings = FaultRunSettings(
            model=args.model, steps=args.steps, seed=args.seed, pretrain_steps=args.pretrain_steps, **device
        )
        faults = [get_fault(n) for n in args.only.split(",") if n] if args.only else applicable(preset.is_moe)
    except (ValueError, KeyError) as exc:
        raise InputError(str(exc).strip("'\"")) from None
    not_here = [f.name for f in faults if f.moe_only and not preset.is_moe]
    if not_here:
        raise InputError(f"faults {', '.join(not_here)} need an MoE model (--model tiny-moe)")

    def log(msg: str) -> None:
        print(f"[faults] {msg}", file=sys.stderr, flush=True)

    if args.output:
        outcomes, clean_rows, out_dir = _run_into_dir(args, settings, faults, log)
    else:
        outcomes, clean_rows = run_matrix(settings, faults, log)
        out_dir = None
    print(render_matrix(outcomes))
    false_alarms = sum(not r["passed"] for r in clean_rows)
    print(f"clean reference runs: {len(clean_rows)} checks, {false_alarms} false alarms")
    if args.json:
        from tracing.outputs.store import SCHEMA_VERSION

        summary = {
            "schema_version": SCHEMA_VERSION,
            "model": args.model,
            "output": out_dir,
            "all_caught": all(o.caught for o in outcomes),
            "clean_false_alarms": false_alarms,
            "faults": outcome_rows(outcomes, args.model),
        }
        print(json.dumps(summary, default=str, allow_nan=False))
    return 0 if all(o.caught for o in outcomes) and not false_alarms else 1


def _run_into_dir(
    args: argparse.Namespace, settings: Any, faults: list[Any], log: Callable[[str], None]
) -> tuple[list[Any], list[dict[str, Any]], str]:
    import dataclasses

    import pandas as pd

    from pipeline.device import device_label
    from pipeline.experiments.fault_runs import outcome_rows, run_matrix
    from pipeline.sync.invariants import SYNC_CHECK_COLUMNS
    from tracing.outputs import store
    from tracing.outputs.manifest import KINDS, OutputDir

    kind = "faults" if "faults" in KINDS else "run"
    config = {"faults": [f.name for f in faults], **dataclasses.asdict(settings)}
    with OutputDir(args.output, kind=kind, config=config, compute_dtype="bfloat16", force=args.force) as od:
        outcomes, clean_rows = run_matrix(settings, faults, log)
        store.write_table(pd.DataFrame(outcome_rows(outcomes, args.model)), od.path / store.FAULT_MATRIX)
        checks = pd.DataFrame(clean_rows, columns=[*SYNC_CHECK_COLUMNS, "run"])
        store.write_table(checks, od.path / store.SYNC_CHECKS)
        device = device_label(settings.torch_device)
        od.update(all_caught=all(o.caught for o in outcomes), learner_device=device, sampler_device=device)
    return outcomes, clean_rows, str(od.path)
