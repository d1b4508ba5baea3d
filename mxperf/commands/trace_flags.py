"""The trace flags of ``mxperf run`` and ``mxperf sweep`` (``--trace``, ``--trace-steps``, ``--nsys``), in one place."""

from __future__ import annotations

import argparse

from pipeline.experiments.profiling import WHOLE_BLOCK, parse_trace_steps, with_nsys
from tracing.capture.profiler import CaptureConfig
from tracing.outputs.errors import InputError


def add_trace_arguments(p: argparse.ArgumentParser, *, what: str, steps: bool) -> None:
    """``--trace`` (+ ``--trace-steps`` when the command has steps) and ``--nsys`` for ``mxperf run`` / ``sweep``."""
    p.add_argument(
        "--trace", action="store_true", help=f"profile the {what}: trace/rank-0.json.gz (CUPTI on a GPU)"
    )
    if steps:
        p.add_argument(
            "--trace-steps",
            metavar="WAIT,WARMUP,ACTIVE",
            help="trace only these steps: skip WAIT, warm the profiler for WARMUP, record ACTIVE (default: all)",
        )
    p.add_argument(
        "--nsys",
        action="store_true",
        help=f"cudaProfilerStart/Stop around the traced {what}, for nsys --capture-range=cudaProfilerApi",
    )


def trace_config(args: argparse.Namespace, steps: int | None, cuda_available: bool) -> CaptureConfig | None:
    """The capture schedule the flags ask for (None: not traced); ``steps=None``: the whole block (a sweep)."""
    trace_steps = getattr(args, "trace_steps", None)
    if (trace_steps or args.nsys) and not args.trace:
        raise InputError("--trace-steps and --nsys shape a trace: add --trace")
    if not args.trace:
        return None
    schedule = WHOLE_BLOCK if steps is None else parse_trace_steps(trace_steps, steps)
    return with_nsys(schedule, args.nsys, cuda_available)
