"""The trace flags of ``mxperf run`` and ``mxperf sweep`` (``--trace``, ``--trace-steps`` / ``--trace-repeats``,
``--nsys``), in one place."""

from __future__ import annotations

import argparse
import dataclasses

from pipeline.experiments.profiling import WHOLE_BLOCK, parse_trace_steps, with_nsys
from tracing.capture.profiler import CaptureConfig
from tracing.outputs.errors import InputError


def add_trace_arguments(p: argparse.ArgumentParser, *, what: str, steps: bool) -> None:
    """``--trace`` (+ ``--trace-steps`` when the command has steps) and ``--nsys`` for ``mxperf run`` / ``sweep``."""
    p.add_argument(
        "--trace",
        action="store_true",
        help=f"profile the {what}: trace/rank-0.json.gz (CUPTI on a GPU). Memory: torch.profiler keeps every "
        "recorded op (with its shapes) and turns them into its results when recording stops, ~3.7 KB an op: "
        "tiny-dense records ~340 k CPU ops a step (token-by-token generation), so 2 traced steps peak at "
        "~3.2 GB against ~0.65 GB untraced, all of it after the last traced step; fewer ACTIVE steps "
        "(--trace-steps) lower it",
    )
    if steps:
        p.add_argument(
            "--trace-steps",
            metavar="WAIT,WARMUP,ACTIVE",
            help="trace these steps: skip WAIT, warm the profiler for WARMUP, record ACTIVE, or 'all' (default: "
            "2 steps after one skipped and one warm-up step, so traces stay small)",
        )
    else:
        p.add_argument(
            "--trace-repeats",
            type=int,
            default=1,
            help="trace the last N repeats (after one unrecorded profiler warm-up step); their rows say traced",
        )
    p.add_argument(
        "--nsys",
        action="store_true",
        help=f"cudaProfilerStart/Stop around the traced {what}, for nsys --capture-range=cudaProfilerApi",
    )


def trace_config(args: argparse.Namespace, steps: int | None, cuda: bool) -> CaptureConfig | None:
    """The capture schedule the flags ask for (None: not traced); ``steps=None``: a sweep, whose traced window
    the sweep sets itself. ``cuda``: the run's device is a GPU (CUDA activity and the nsys bracket need one)."""
    trace_steps = getattr(args, "trace_steps", None)
    if (trace_steps or args.nsys) and not args.trace:
        raise InputError("--trace-steps and --nsys shape a trace: add --trace")
    if not args.trace:
        return None
    schedule = WHOLE_BLOCK if steps is None else parse_trace_steps(trace_steps, steps)
    if not cuda:  # a CPU run on a GPU machine: no CUPTI subscriber for work that never reaches the GPU
        schedule = dataclasses.replace(schedule, cuda=False)
    return with_nsys(schedule, args.nsys, cuda)
