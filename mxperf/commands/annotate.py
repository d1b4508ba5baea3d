"""``mxperf annotate TRACE -o OUT.json.gz``: the trace plus GPU busy / host stall / other-idle tracks per device."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracing.outputs.errors import OutputExistsError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", type=Path, metavar="TRACE", help="Kineto .json(.gz) or nsys .sqlite")
    p.add_argument("-o", "--out", type=Path, required=True, help="output .json or .json.gz")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing file at -o (written whole, then renamed into place)",
    )


def run(args: argparse.Namespace) -> int:
    from tracing.analysis.annotate import annotate

    if args.out.is_dir():
        raise OutputExistsError(
            f"{args.out}: is a folder; give a file name (e.g. {args.out / 'annotated.json.gz'})"
        )
    if args.out.resolve() == args.trace.resolve():
        raise OutputExistsError(f"{args.out}: is the input trace; write the annotated trace elsewhere")
    if args.out.exists() and not args.force:
        raise OutputExistsError(f"{args.out}: exists; choose another -o or pass --force to replace it")
    if not args.out.name.endswith((".json", ".json.gz")):
        raise OutputExistsError(f"{args.out}: the annotated trace is Chrome JSON; name it .json or .json.gz")
    timelines = annotate(args.trace, args.out)
    for t in timelines:
        r = t.row
        print(
            f"pid {r['pid']} GPU {r['device']}: {len(t.busy)} busy intervals, "
            f"{len(t.stall)} host-stall intervals ({r['host_stall_ns'] / 1e6:.1f} ms)",
            file=sys.stderr,
        )
    if not timelines:
        print(f"{args.trace}: no GPU ops; the output is the input unchanged", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
