"""Range overhead vs step time: the cost of instrumenting every phase must stay <= 1 % of a step.

Measures, with one torch thread and side by side in one process:

1. the per-range cost of ``RangeLog.range`` (host log + the NVTX / record_function guards), as the median
   over many empty ranges, and
2. a real RL step of tiny-dense (generate, logprob, update with micro-batches, sync, checks off), counting
   how many ranges it emits,

and reports overhead = ranges_per_step x per_range_cost / median step time. Run:

    .venv/bin/python benchmarks/bench_ranges.py [--steps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def per_range_seconds(n: int = 20000, repeats: int = 5) -> float:
    from tracing.capture.ranges import RangeLog

    samples = []
    for _ in range(repeats):
        log = RangeLog()
        t0 = time.perf_counter()
        for i in range(n):
            with log.range("update/microbatch", step=0, microbatch=i, tokens=128, precision="bf16"):
                pass
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def step_seconds(steps: int) -> tuple[float, float]:
    """(median step seconds, ranges emitted per step) of real tiny-dense RL steps."""
    from pipeline.experiments.loop import RLLoop
    from pipeline.experiments.session import RunConfig, Session

    cfg = RunConfig(steps=steps, prompts_per_step=4, samples_per_prompt=4, tokens_per_microbatch=64)
    session = Session(cfg)
    loop = RLLoop(session, check_sync="off")
    loop.initial_sync()
    times = []
    before = len(session.ranges.records)
    for s in range(steps):
        times.append(loop.step(s).metrics["step_s"])
    per_step = (len(session.ranges.records) - before) / steps
    loop.close()
    return statistics.median(times), per_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    cost = per_range_seconds()
    step, ranges = step_seconds(args.steps)
    overhead = ranges * cost / step
    print(f"per range: {cost * 1e6:.2f} us; ranges per step: {ranges:.0f}; median step: {step * 1e3:.1f} ms")
    print(f"range overhead: {overhead * 100:.4f} % of step time (budget 1 %)")
    if args.json:
        print(
            json.dumps(
                {
                    "per_range_s": cost,
                    "ranges_per_step": ranges,
                    "step_s": step,
                    "overhead_fraction": overhead,
                }
            )
        )


if __name__ == "__main__":
    main()
