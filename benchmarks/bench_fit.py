"""Benchmark: fitting 100k micro-batch records with 1000 bootstrap resamples on one core (goal < 5 s).

Every scenario runs the whole per-precision fit (``fit_cost_model``: wall and GPU-busy bases with lack of
fit, the knee models where the line is rejected, host-stall and memory lines, hold-out), side by side in one
process, median of --reps runs, CPU seconds of this process (the single-core cost) and wall seconds:

- ``sweep``: a clean line with a per-step term (micro-batch index) and GPU columns; steps are the units;
- ``knee``: max(host, GPU) timings, so the ``parts`` and ``knee`` models are fitted with their bootstrap;
- ``rows``: the knee table without repeat/step/micro-batch columns: every micro-batch its own unit
  (the worst case for the bootstrap);
- ``dynamic``: dynamic batching with sequence lengths (attention term; ~10k distinct sizes, few steps);
- the peer: a plain per-replicate loop (index draw + ``np.linalg.lstsq``, line only) on the micro-batch
  rows, timed on fewer replicates and scaled to 1000.

    .venv/bin/python benchmarks/bench_fit.py [--records 100000] [--resamples 1000] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np
import pandas as pd

from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.simulate import KNEE, PAPER_LIKE, Truth, simulate_sweep

SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ATTENTION = {
    "bf16": Truth(0.010, 4e-6, 0.002, per_sq_token_s=2e-9),
    "mxfp8": Truth(0.019, 2e-6, 0.009, per_sq_token_s=2e-9),
}


def _tables(records: int) -> dict[str, pd.DataFrame]:
    per_cell = 100
    repeats = max(2, records // (2 * len(SIZES) * per_cell))
    kw = dict(sizes=SIZES, repeats=repeats, microbatches=per_cell, rng=np.random.default_rng(0))
    sweep = simulate_sweep(PAPER_LIKE, **kw)
    knee = simulate_sweep(KNEE, stall_per_token_s=0.0, **kw)
    dyn_repeats = max(2, records // (2 * 5 * 200))
    dynamic = simulate_sweep(
        ATTENTION,
        sizes=(1024, 2048, 4096, 8192, 16384),
        repeats=dyn_repeats,
        microbatches=200,
        dynamic=True,
        seq_len=512,
        seq_len_spread=0.8,
        rng=np.random.default_rng(1),
    )
    return {
        "sweep": sweep,
        "knee": knee,
        "rows": knee.drop(columns=["repeat", "step", "microbatch"]),
        "dynamic": dynamic,
    }


def _median_s(fn, reps: int) -> tuple[float, float]:
    """(median CPU seconds of this process, median wall seconds). The CPU time is the single-core cost;
    wall time also counts waiting for a core on a shared machine."""
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall)


def _naive_loop(df: pd.DataFrame, n_rep: int) -> None:
    rng = np.random.default_rng(0)
    for _, g in df.groupby("precision"):
        x = g["num_tokens"].to_numpy(float)
        y = g["seconds"].to_numpy(float)
        design = np.stack([np.ones_like(x), x], axis=1)
        for _ in range(n_rep):
            idx = rng.integers(0, len(x), len(x))
            np.linalg.lstsq(design[idx], y[idx], rcond=None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    tables = _tables(args.records)
    result: dict[str, object] = {"resamples": args.resamples, "goal_s": 5.0, "threads": 1}
    lines = []
    for name, df in tables.items():
        fits = fit_cost_model(df, n_boot=args.resamples)  # warm-up, and the models it chose
        cpu, wall = _median_s(lambda df=df: fit_cost_model(df, n_boot=args.resamples), args.reps)
        f = next(iter(fits.values()))
        models = sorted({v.wall.model or "none" for v in fits.values()})
        result[name] = {
            "records": len(df),
            "units_per_precision": f.design.n_units,
            "patterns_per_precision": len(f.design.x),
            "models": models,
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
        }
        lines.append(
            f"  {name:8s} {len(df):7,} micro-batches, {f.design.n_units:6,} units, models {','.join(models):11s}"
            f" {cpu:7.3f} / {wall:7.3f}"
        )
    peer_n = 20
    t_peer, w_peer = (
        v * args.resamples / peer_n for v in _median_s(lambda: _naive_loop(tables["rows"], peer_n), args.reps)
    )
    result["naive_loop_cpu_s_scaled"] = round(t_peer, 2)
    result["naive_loop_vs_rows"] = round(t_peer / result["rows"]["cpu_s"], 1)
    print(
        f"{args.resamples} resamples, 1 thread, median of {args.reps} (CPU s / wall s):\n"
        + "\n".join(lines)
        + f"\n  peer: per-replicate lstsq loop on the rows table, line only (scaled from {peer_n}) "
        f"{t_peer:7.2f} / {w_peer:7.2f}",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
