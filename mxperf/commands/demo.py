"""``mxperf demo``: the main job end to end on this machine, in a few minutes on 2 CPU cores.

1. ``sweep``: tiny-dense learner updates in bf16 and mxfp8 on identical data over a grid of micro-batch sizes
   (``DIR/sweep``);
2. ``fit``: fixed + per-token cost per precision, the breakeven size and its interval (``DIR/fit``), through
   ``mxperf.commands.fit`` -- the same code path as ``mxperf fit``;
3. ``consistency``: sampler-learner KL for every precision pairing at fixed weights (``DIR/consistency``);
4. prints the verdict, where the results are, and the ``mxperf dash`` command.

On a CPU the MXFP8 learner is an emulation (quantize + dequantize around BF16 GEMMs), so it can only add cost:
the verdict says what was measured, never what a GPU would do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tracing.outputs.placement import FORCE_HELP

DEMO_SIZES = "64,128,192,256,384,512,768"  # every one divides the global batch (1,536 tokens at --seq-len 64)
MAX_GLOBAL_FACTOR = 4  # the global batch may be at most this many times the largest size


def demo_global_batch(sizes: Sequence[int], seq_len: int) -> int:
    """The smallest global batch every size divides into whole micro-batches of whole sequences: the least
    common multiple of the sizes (each a multiple of ``seq_len``). Raises InputError when a size is not a
    multiple of ``seq_len`` or that multiple exceeds ``MAX_GLOBAL_FACTOR`` times the largest size (a sweep
    of it would take too long): the message names the sizes to change."""
    from tracing.outputs.errors import InputError

    bad = [n for n in sizes if n % seq_len]
    if bad:
        raise InputError(
            f"--tokens-per-microbatch {bad[0]} is not a multiple of --seq-len {seq_len}: a micro-batch holds "
            "whole sequences"
        )
    g = math.lcm(*sizes)
    if g > MAX_GLOBAL_FACTOR * max(sizes):
        raise InputError(
            f"--tokens-per-microbatch {','.join(map(str, sizes))}: the smallest global batch they all divide is "
            f"{g:,} tokens (> {MAX_GLOBAL_FACTOR} x the largest size); pick sizes that divide one global "
            f"batch, e.g. {DEMO_SIZES}"
        )
    return g


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default="runs/demo", help="demo directory (sweep/, fit/, consistency/)")
    p.add_argument("--model", default="tiny-dense", help="tiny-dense | tiny-moe")
    p.add_argument("--tokens-per-microbatch", default=DEMO_SIZES, help="sweep sizes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--skip-consistency", action="store_true", help="only sweep + fit")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def _fit(sweep_dir: Path, fit_dir: Path) -> int:
    """Run ``mxperf fit`` on the sweep, as the command would."""
    from mxperf.commands import fit as cli_fit

    parser = argparse.ArgumentParser(prog="mxperf fit")
    cli_fit.add_arguments(parser)
    return int(cli_fit.run(parser.parse_args([str(sweep_dir), "-o", str(fit_dir)])) or 0)


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    """Work from ``folder`` so that what the fit records (its inputs, its report) reads ``sweep``, not the
    temp folder the demo is built in."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run(args: argparse.Namespace) -> int:
    import torch

    from mxperf.commands.sweep import _ints
    from pipeline.experiments.sweep import SweepConfig
    from pipeline.experiments.sweep_run import execute_sweep
    from tracing.outputs.manifest import OutputDir

    torch.set_num_threads(1)
    out = Path(args.output)
    t0 = time.monotonic()
    sizes = _ints(args.tokens_per_microbatch)
    cfg = SweepConfig(
        model=args.model,
        precisions=("bf16", "mxfp8"),
        sizes=sizes,
        repeats=args.repeats,
        seq_len=args.seq_len,
        global_tokens=demo_global_batch(sizes, args.seq_len),
    )
    config = {
        "model": args.model,
        "tokens_per_microbatch": list(sizes),
        "repeats": args.repeats,
        "seq_len": args.seq_len,
        "global_tokens": cfg.global_batches[0],
        "consistency": not args.skip_consistency,
    }
    # One output: sweep/, fit/ and consistency/ are built inside the demo's temp folder and appear together.
    with OutputDir(out, kind="demo", config=config, compute_dtype=cfg.compute_dtype, force=args.force) as od:
        print(
            f"[1/3] sweep {args.model} bf16 vs mxfp8, sizes {sizes}, {args.repeats} repeats", file=sys.stderr
        )
        sweep = execute_sweep(cfg, od.path / "sweep", log=lambda m: print(f"  {m}", file=sys.stderr))
        print("[2/3] fit fixed + per-token cost, breakeven", file=sys.stderr)
        with _inside(od.path):
            fit_rc = _fit(Path("sweep"), Path("fit"))
        consistency = None
        if not args.skip_consistency:
            print("[3/3] consistency: KL of every precision pairing at fixed weights", file=sys.stderr)
            _consistency(args.model, od.path / "consistency")
            consistency = str(out / "consistency")
        od.update(parts=["sweep", "fit", *([] if args.skip_consistency else ["consistency"])])
    elapsed = time.monotonic() - t0
    print(
        f"\nresults in {out}/ (sweep/microbatches.parquet, fit/report.md"
        f"{'' if args.skip_consistency else ', consistency/'}) after {elapsed:.0f} s"
    )
    mxperf = "mxperf" if shutil.which("mxperf") else str(Path(sys.executable).parent / "mxperf")
    print(f"open the dashboard: {mxperf} dash {out}")
    if args.json:
        print(
            json.dumps(
                {
                    "schema_version": 1,
                    "run_dir": str(out),
                    "status": "complete",
                    "sweep": str(out / "sweep") if sweep else None,
                    "fit": str(out / "fit") if fit_rc == 0 else None,
                    "consistency": consistency,
                    "seconds": elapsed,
                }
            )
        )
    return 0


def _consistency(model: str, out: Path) -> None:
    from dataclasses import asdict

    from pipeline.experiments.consistency import ConsistencyConfig, format_table, run_consistency
    from tracing.outputs import store
    from tracing.outputs.manifest import OutputDir

    cfg = ConsistencyConfig(model=model)  # the same batch as `mxperf consistency` (README's table)
    with OutputDir(
        out, kind="run", config={"tool": "consistency", **asdict(cfg)}, compute_dtype=cfg.compute_dtype
    ) as od:
        df = run_consistency(cfg)
        store.write_table(df, od.path / store.CONSISTENCY)
    print(format_table(df))
