"""What finding micro-batches adds to an ingest: detection time next to loading and the rest of the analysis.

    .venv/bin/python benchmarks/bench_microbatches.py [--repeats 5] [--steps 10 60]

On simulated verl FSDP traces (``tests/synthetic_traces.py``: 4 layers, 8 micro-batches per step in two
mini-batches, logprob + update, record_shapes on) of each ``--steps``, one thread, side by side in one
process: ``load`` (``load_trace``), ``analysis`` (gpu ops, device timelines, per-range attribution, kernel
table: what ingest did before), ``microbatches`` (``find_microbatches`` reusing those). Medians of
``--repeats``; prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread (numpy's BLAS is not used, but be sure)
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import synthetic_traces as st  # noqa: E402

from tracing.analysis import attribution, kernel_classes, metrics  # noqa: E402
from tracing.analysis.microbatches import find_microbatches  # noqa: E402
from tracing.ingest.detect import load_trace  # noqa: E402


def measure(path: Path, repeats: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {"load": [], "analysis": [], "microbatches": []}
    rows = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        trace = load_trace(path)
        t1 = time.perf_counter()
        ops = metrics.gpu_ops(trace.events)
        timelines = metrics.device_timelines(trace.events, ops)
        ranges = attribution.attribute_ranges(trace, ops=ops, timelines=timelines)
        kernels = kernel_classes.kernel_table(ops)
        t2 = time.perf_counter()
        found = find_microbatches(trace, ranges, ops=ops, timelines=timelines, kernels=kernels)
        t3 = time.perf_counter()
        runs["load"].append(t1 - t0)
        runs["analysis"].append(t2 - t1)
        runs["microbatches"].append(t3 - t2)
        rows = len(found.table)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["rows"] = rows
    out["events"] = len(trace.events)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 60])
    args = ap.parse_args()

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.steps:
            rng = random.Random(n)
            steps = tuple(tuple(rng.choice((512, 1024, 2048, 4096)) for _ in range(8)) for _ in range(n))
            job = st.Job(steps=steps, layers=4, minibatches=2)
            path = st.write_kineto(st.simulate(job), Path(tmp) / f"steps{n}" / "prof_rank-0.json.gz")
            results[n] = measure(path, args.repeats)
    print(
        f"{'steps':>6} {'events':>8} {'micro-batches':>14} {'load s':>8} {'analysis s':>11} {'detect s':>9} {'detect/load':>12}"
    )
    for n, r in results.items():
        print(
            f"{n:>6} {r['events']:>8} {r['rows']:>14} {r['load']:>8.3f} {r['analysis']:>11.3f} "
            f"{r['microbatches']:>9.3f} {r['microbatches'] / r['load']:>12.2f}"
        )
    print(json.dumps({str(k): v for k, v in results.items()}))


if __name__ == "__main__":
    main()
