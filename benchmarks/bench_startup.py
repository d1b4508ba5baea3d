"""Whole-process timings of the ``mxperf`` command, start-up included, each paired with a peer run in turn.

    .venv/bin/python benchmarks/bench_startup.py [--runs 15] [--trace FILE] [--hta-python PATH]

Pairs (A and B alternate, A B A B ..., so both see the same machine load; the ratio is taken pair by pair and
its median reported, with the medians of A and B):
1. ``mxperf --help`` vs a bare ``python -c pass`` (the start-up floor);
2. ``mxperf --version`` vs the same floor;
3. with ``--hta-python`` (an interpreter with holistictraceanalysis 0.5.0, installed ``--no-deps`` in its own
   venv: it pins other versions of torch's neighbours) and ``--trace``: ``mxperf ingest TRACE -o OUT --force``
   vs a process that runs HTA's ``TraceAnalysis`` + idle-time + temporal breakdown on the same trace (HTA's
   scope; ``mxperf ingest`` also writes every table, ranges and kernels included).
Wall seconds from ``time.perf_counter`` around ``subprocess.run``; one thread (``OMP_NUM_THREADS=1``). Before and
after the pairs, :func:`side_by_side` says how many cores the machine really gave (a shared VM's second vCPU
comes and goes). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
HTA_CODE = (
    "import logging, sys; logging.disable(logging.WARNING)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "ta = TraceAnalysis(trace_dir=sys.argv[1])\n"
    "ta.get_idle_time_breakdown(ranks=ta.t.get_ranks(), visualize=False)\n"
    "ta.get_temporal_breakdown(visualize=False)\n"
)


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, capture_output=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode()[-800:]}")
    return seconds


def paired(name: str, a: list[str], b: list[str], runs: int) -> dict[str, float | str | int]:
    _wall(a), _wall(b)  # warm the page cache for both
    ta, tb = [], []
    for _ in range(runs):
        ta.append(_wall(a))
        tb.append(_wall(b))
    ratios = [x / y for x, y in zip(ta, tb, strict=True)]
    row = {
        "case": name,
        "runs": runs,
        "a_median_s": statistics.median(ta),
        "b_median_s": statistics.median(tb),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(
        f"{name:42s} {row['a_median_s']:8.3f} {row['b_median_s']:8.3f} {row['ratio_median']:7.2f} "
        f"[{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]",
        file=sys.stderr,
        flush=True,
    )
    return row


SPIN = "s = 0\nfor i in range(4_000_000): s += i"  # ~0.3 s of one core, pure Python


def side_by_side() -> float:
    """Two copies of a CPU-bound loop side by side over one alone (1.0: two free cores; 2.0: one). mxperf's
    ingest overlaps two processes and HTA runs in one, so the pairs' ratio is only comparable between runs
    taken at similar values; measured before and after the pairs and printed with them."""
    cmd = [sys.executable, "-c", SPIN]
    alone = min(_wall(cmd) for _ in range(2))
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=ENV) for _ in range(2)]
    for proc in procs:
        proc.wait()
    return (time.perf_counter() - t0) / alone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--trace", type=Path, help="a Kineto trace (.json or .json.gz) for the ingest pair")
    p.add_argument("--hta-python", type=Path, help="a python with holistictraceanalysis 0.5.0")
    args = p.parse_args(argv)
    mxperf = [sys.executable, "-m", "mxperf"]  # what the ``mxperf`` console script runs (mxperf.cli.entry)
    floor = [sys.executable, "-c", "pass"]
    before = side_by_side()
    print(f"{'case (A vs B)':42s} {'A s':>8s} {'B s':>8s} {'A/B':>7s} [min, max]", file=sys.stderr)
    rows = [
        paired("mxperf --help vs python -c pass", [*mxperf, "--help"], floor, args.runs),
        paired("mxperf --version vs python -c pass", [*mxperf, "--version"], floor, args.runs),
    ]
    if args.trace and args.hta_python:
        with tempfile.TemporaryDirectory() as tmp:
            hta_dir = Path(tmp, "hta")
            hta_dir.mkdir()
            (hta_dir / args.trace.name).symlink_to(args.trace.resolve())  # HTA reads a folder of traces
            ingest = [*mxperf, "ingest", str(args.trace), "-o", f"{tmp}/out", "--force"]
            hta = [str(args.hta_python), "-c", HTA_CODE, str(hta_dir)]
            rows.append(paired(f"HTA vs mxperf ingest ({args.trace.name})", hta, ingest, args.runs))
    after = side_by_side()
    print(
        f"two CPU-bound processes side by side / one alone: {before:.2f} before, {after:.2f} after "
        "(1.0 = two free cores, 2.0 = one)",
        file=sys.stderr,
    )
    out = {"schema_version": 1, "python": sys.version.split()[0], "rows": rows}
    out["side_by_side"] = {"before": round(before, 3), "after": round(after, 3)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    raise SystemExit(main())
