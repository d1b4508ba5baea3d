"""The ``mxperf ingest`` options, importable without pandas, and the early start of a lone Kineto file's decoding.

:func:`start_prefetch` is called by the dispatcher before the command module (and pandas) is imported: when
the command line names one Kineto file that is read in memory, a child decodes it meanwhile
(:mod:`tracing.ingest.prefetch`); the ingest itself is unchanged and decodes in-process whenever it gets
nothing from the child.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from tracing.ingest import STREAM_ABOVE_BYTES, prefetch
from tracing.outputs.placement import FORCE_HELP, OUT_HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="Kineto .json(.gz), nsys .sqlite, mxperf run dir, or a dir of traces",
    )
    p.add_argument("-o", "--out", required=True, type=Path, help=OUT_HELP)
    p.add_argument(
        "--json", action="store_true", help="print the docs/contracts.md ingest JSON as the last stdout line"
    )
    p.add_argument("--label", help="model=M,precision=P,tokens_per_microbatch=N[,phase=update][,repeat=R]")
    p.add_argument(
        "--rank", type=int, help="rank of a single input that names none (no distributedInfo, no rank-N)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="local processes: one file each; a single streamed Kineto file is decoded by that many "
        "(same tables; default 1)",
    )
    p.add_argument(
        "--stream",
        choices=("auto", "on", "off"),
        default="auto",
        help="read Kineto files and nsys exports in bounded memory (same tables; auto: files over 64 MB on disk)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress line on stderr: files done, bytes read (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="map files over a Ray cluster ('local' starts one); needs mxperf[ray]",
    )
    p.add_argument(
        "--microbatch-range",
        metavar="PATTERN",
        help="regex (full match) naming your micro-batch ranges (default: found from the trace's structure)",
    )
    p.add_argument(
        "--colocated",
        action="store_true",
        help="the inputs are processes of one machine sharing GPUs by device index (sampler + learner): "
        "union each device's busy time over all of them",
    )
    p.add_argument(
        "--phase-map", metavar="FILE", help="phase-map TOML replacing tracing/analysis/phase_map.toml"
    )
    p.add_argument(
        "--python-functions",
        action="store_true",
        help="keep Kineto python_function events (with_stack traces) in the event table (skipped by default)",
    )
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


class _Quiet(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def start_prefetch(argv: Sequence[str]) -> bool:
    """Start decoding the one Kineto file ``mxperf ingest ARGV`` reads in memory, if it reads exactly that
    (no Ray, not streamed: a single file read in memory stays in this process whatever ``--workers`` says);
    False when nothing was started (the ingest decodes as usual)."""
    if not prefetch.enabled():
        return False
    parser = _Quiet(add_help=False)
    add_arguments(parser)
    try:
        args, unknown = parser.parse_known_args(list(argv))
    except (ValueError, SystemExit):
        return False
    if unknown or len(args.paths) != 1 or args.ray is not None or args.stream == "on":
        return False
    path = Path(args.paths[0])
    if not path.name.endswith((".json", ".json.gz")) or not path.is_file():
        return False
    try:
        if os.path.getsize(path) > STREAM_ABOVE_BYTES:  # streamed, or (--stream off) too big to hold twice
            return False
        with open(path, "rb") as fh:
            if fh.read(16) == b"SQLite format 3\x00":
                return False
    except OSError:
        return False
    return prefetch.start(path, args.python_functions)
