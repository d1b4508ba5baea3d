"""Simulations with known truth for `mxperf fit`'s guards: interval coverage and confidently wrong claims.

Per scenario (``perfmodel.simstudy.SCENARIOS``: a clean line, outliers, two sizes, a host/GPU knee, one
unit per precision, overlapping micro-batch windows, heavy-tailed noise, a never-faster precision) it fits
``--seeds`` simulations through ``perfmodel.fit`` (the whole fits.json path) and prints one table row:
the cases reported, how many fits state an interval for n* and the share that covers the true crossing,
how many claims the truth contradicts (``wrong``: always/never faster when it is not, a crossing in the
wrong direction), recommendations made without a case that supports them or of the slower precision, and
where stated the host-stall share's and the knee's "saves X once GPU-bound" coverage. The last stdout line
is the JSON of every row.

    .venv/bin/python benchmarks/fit_simulations.py [--seeds 100] [--bootstrap 300] [--scenario NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from perfmodel.simstudy import SCENARIOS, run, summarize


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--bootstrap", type=int, default=300)
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None)
    args = ap.parse_args(argv)
    rows = []
    for name in args.scenario or list(SCENARIOS):
        t0 = time.perf_counter()
        row = summarize(name, run(name, args.seeds, n_boot=args.bootstrap))
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        cases = ", ".join(f"{k} {v}" for k, v in row["cases"].items())
        print(f"## {name}: {row['about']} (truth {row['truth']})", file=sys.stderr)
        print(
            f"   fits {row['fits']}  cases: {cases}\n"
            f"   interval {row['with_interval']}  coverage {_pct(row['coverage'])}  wrong {row['wrong']}  "
            f"n* without interval {row['n_star_without_interval']}\n"
            f"   recommended {row['recommended']}  unsupported {row['recommendation_unsupported']}  "
            f"wrong {row['recommendation_wrong']}  host-stall share coverage {_pct(row['share_coverage'])} "
            f"({row['share_stated']})  GPU-bound saving coverage {_pct(row['gpu_bound_saving_coverage'])} "
            f"({row['gpu_bound_saving_stated']})"
            + (
                f"  two-size line said to fit {row['two_size_line_said_to_fit']}"
                if "two_size_line_said_to_fit" in row
                else ""
            )
            + f"  [{row['seconds']} s]",
            file=sys.stderr,
        )
    print(json.dumps({"seeds": args.seeds, "bootstrap": args.bootstrap, "scenarios": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
