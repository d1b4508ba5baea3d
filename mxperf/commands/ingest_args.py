"""The ``mxperf ingest`` options, importable without pandas."""

from __future__ import annotations

import argparse
from pathlib import Path

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
        help="local processes, one file each (default 1); the engine's threads: MXPERF_THREADS",
    )
    p.add_argument(
        "--stream",
        choices=("auto", "on", "off"),
        default="auto",
        help="accepted for older scripts; every file is read in bounded memory by one engine "
        "(its memory: MXPERF_MEMORY_LIMIT, default 512MB)",
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
