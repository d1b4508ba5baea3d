"""Benchmark: fitting 100k micro-batch records with 1000 bootstrap resamples on one core (goal < 5 s).

Three measurements, medians of --reps runs, side by side in one process:

- ``fit_cost_model`` on 100k micro-batches with repeats (the sweep case: repeat means are the unit),
- the same without repeats (every micro-batch is a resampling unit: the worst case for the bootstrap),
- the peer: a plain per-replicate loop (index draw + ``np.linalg.lstsq``) on the micro-batch rows, timed on
  fewer replicates and scaled to 1000.

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

from perfmodel.fit import fit_cost_model
from perfmodel.simulate import simulate_sweep

SIZES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _table(records: int, with_repeats: bool):
    per_cell = 100
    repeats = max(2, records // (2 * len(SIZES) * per_cell))
    df = simulate_sweep(sizes=SIZES, repeats=repeats, microbatches=per_cell, rng=np.random.default_rng(0))
    if not with_repeats:
        df["repeat"] = 0
    return df


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


def _naive_loop(df, n_rep: int) -> None:
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
    rep_df = _table(args.records, True)
    row_df = _table(args.records, False)
    t_rep, w_rep = _median_s(lambda: fit_cost_model(rep_df, n_boot=args.resamples), args.reps)
    t_row, w_row = _median_s(lambda: fit_cost_model(row_df, n_boot=args.resamples), args.reps)
    peer_n = 20
    t_peer, w_peer = (
        v * args.resamples / peer_n for v in _median_s(lambda: _naive_loop(row_df, peer_n), args.reps)
    )
    result = {
        "records": len(rep_df),
        "resamples": args.resamples,
        "repeat_unit_cpu_s": round(t_rep, 3),
        "repeat_unit_wall_s": round(w_rep, 3),
        "row_unit_cpu_s": round(t_row, 3),
        "row_unit_wall_s": round(w_row, 3),
        "naive_loop_cpu_s_scaled": round(t_peer, 2),
        "naive_loop_vs_repeat_unit": round(t_peer / t_rep, 1),
        "naive_loop_vs_row_unit": round(t_peer / t_row, 1),
        "goal_s": 5.0,
        "threads": 1,
    }
    print(
        f"{result['records']:,} micro-batches x {args.resamples} resamples, 1 thread, median of {args.reps} "
        "(CPU s / wall s):\n"
        f"  fit_cost_model, repeats as unit      {t_rep:7.3f} / {w_rep:7.3f}\n"
        f"  fit_cost_model, micro-batch as unit  {t_row:7.3f} / {w_row:7.3f}\n"
        f"  peer: per-replicate lstsq loop on micro-batches (scaled from {peer_n}) {t_peer:7.2f} / {w_peer:7.2f}",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
