"""A range-dense Kineto source: every ``cpu_op`` of a trace also wrapped in a ``user_annotation`` range.

    .venv/bin/python benchmarks/make_range_dense_source.py SRC.json.gz -o /tmp/dense.json.gz
    .venv/bin/python benchmarks/bench_scale.py size --gb 0.5 1 4 --mix range-dense  # builds the source itself

The densest ranges a Kineto trace is likely to have (as if each op ran inside ``record_function``): each range
has its op's pid, tid, start and duration and is named ``<op>, op_id = k`` (k counts the source's ops, so a
repeated source repeats its names, as a real trace's steps do). The default source is hta_sampled_2rank rank 0:
2,329 ranges added to its 4,855 events. Written gzip level 1; prints one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

SRC = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "data"
    / "real"
    / "hta_sampled_2rank"
    / "rank-0.json.gz"
)


def range_dense(src: Path, out: Path) -> dict[str, object]:
    """Write ``src`` with a ``user_annotation`` over each complete ``cpu_op`` event to ``out``."""
    with gzip.open(src, "rt") as fh:
        trace = json.load(fh)
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    ranges = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"{e['name']}, op_id = {k}",
            "pid": e["pid"],
            "tid": e["tid"],
            "ts": e["ts"],
            "dur": e["dur"],
            "args": {},
        }
        for k, e in enumerate(ops)
    ]
    trace["traceEvents"] = events + ranges
    with gzip.open(out, "wt", compresslevel=1) as fh:
        json.dump(trace, fh)
    return {
        "out": str(out),
        "source": str(src),
        "ranges_added": len(ranges),
        "events": len(trace["traceEvents"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, nargs="?", default=SRC)
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    print(json.dumps(range_dense(args.source, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
