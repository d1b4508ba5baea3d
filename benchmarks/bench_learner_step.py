"""BF16 vs low-precision learner step time on identical data, measured side by side (one thread, medians).

    .venv/bin/python benchmarks/bench_learner_step.py --model tiny-dense --size 512 --repeats 5

Both learners run the same GEMM calls (the BF16 baseline with unquantized operands), so the ratio is the
cost of quantization on this machine; on a CPU without FP8 tensor cores it can only be >= 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-dense")
    ap.add_argument("--precisions", default="bf16,mxfp8")
    ap.add_argument("--size", type=int, default=512, help="tokens per micro-batch")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from pipeline.experiments.sweep import SweepConfig, fixed_batch, make_learners
    from tracing.capture.ranges import RangeLog

    precisions = tuple(args.precisions.split(","))
    cfg = SweepConfig(model=args.model, precisions=precisions, sizes=(args.size,), repeats=1)
    learners = make_learners(cfg, RangeLog())
    step = fixed_batch(cfg).select(list(range(cfg.sequences(cfg.global_batches[0]))))
    for p in precisions:  # warm-up
        learners[p].train_step(step, args.size)
    times: dict[str, list[float]] = {p: [] for p in precisions}
    for _ in range(args.repeats):  # interleaved, so load changes hit both
        for p in precisions:
            t0 = time.perf_counter()
            learners[p].train_step(step, args.size)
            times[p].append(time.perf_counter() - t0)
    med = {p: statistics.median(v) for p, v in times.items()}
    base = med[precisions[0]]
    print(f"{'precision':<14}{'median step s':>14}{'ratio':>8}")
    for p in precisions:
        print(f"{p:<14}{med[p]:>14.3f}{med[p] / base:>8.2f}")
    print(
        json.dumps(
            {
                "model": args.model,
                "size": args.size,
                "median_s": med,
                "ratio_to_baseline": {p: med[p] / base for p in precisions},
            }
        )
    )


if __name__ == "__main__":
    main()
