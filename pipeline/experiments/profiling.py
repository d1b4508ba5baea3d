"""Trace capture for ``mxperf run`` and ``mxperf sweep``, through :class:`tracing.capture.profiler.Capture`.

One capture implementation: the schedule (which steps are traced), one ``trace/rank-<r>.json.gz`` per rank,
the capture manifest ``trace/capture-rank-<r>.json``, CUDA activity (CUPTI) when a GPU is there and the
Nsight Systems bracket (``--nsys``: cudaProfilerStart/Stop around the traced steps) all live there. Ranges
from :class:`tracing.capture.ranges.RangeLog` appear in the trace as ``user_annotation`` events because the range
helper enters ``record_function`` whenever a profiler is active.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence

from tracing.capture.profiler import Capture, CaptureConfig, Companion
from tracing.outputs.errors import InputError

NSYS_NEEDS_CUDA = (
    "--nsys brackets the traced steps with cudaProfilerStart/Stop for "
    "`nsys profile --capture-range=cudaProfilerApi`; it needs CUDA, which this torch/machine lacks"
)
WHOLE_BLOCK = CaptureConfig(wait=0, warmup=0, active=1)  # one traced "step": the whole block (a sweep)


def parse_trace_steps(text: str | None, steps: int) -> CaptureConfig:
    """``--trace-steps WAIT,WARMUP,ACTIVE`` -> a schedule over ``steps`` RL steps (None: the default window,
    :meth:`CaptureConfig.window`: 2 steps after a skipped and a warm-up step; ``all``: every step)."""
    if text is None:
        return CaptureConfig.window(steps)
    if text.strip() == "all":
        return CaptureConfig(wait=0, warmup=0, active=max(1, steps))
    try:
        wait, warmup, active = (int(x) for x in text.split(","))
        cfg = CaptureConfig(wait=wait, warmup=warmup, active=active)
    except ValueError as exc:
        raise InputError(
            f"--trace-steps wants WAIT,WARMUP,ACTIVE step counts (e.g. 1,1,3) or 'all', got {text!r}: {exc}"
        ) from None
    if cfg.cycle > steps:
        raise InputError(
            f"--trace-steps {text} needs at least {cfg.cycle} steps (wait {wait} + warmup {warmup} + "
            f"active {active}), but --steps is {steps}"
        )
    return cfg


def with_nsys(cfg: CaptureConfig, nsys: bool, cuda_available: bool) -> CaptureConfig:
    """The schedule with the Nsight Systems bracket on; a clear error without CUDA."""
    if not nsys:
        return cfg
    if not cuda_available:
        raise InputError(NSYS_NEEDS_CUDA)
    return dataclasses.replace(cfg, nsys=True)


def manifest_fields(config: CaptureConfig | None) -> dict[str, object]:
    """What a run or sweep manifest records about its trace: whether it was traced, and the schedule."""
    return {"trace": config is not None, "trace_schedule": dataclasses.asdict(config) if config else None}


@contextlib.contextmanager
def capture_trace(
    out_dir: str | os.PathLike[str],
    config: CaptureConfig | None,
    companions: Sequence[Companion] = (),
    log: Callable[[str], None] | None = None,
) -> Iterator[Callable[[], None]]:
    """Profile the block into ``out_dir/trace/``; yields ``step()`` to call after each RL step.

    ``config=None``: no profiling, and ``step()`` does nothing. ``companions``: profilers in other processes
    (the vLLM sampler) started and stopped with the traced steps. ``log``: progress lines (trace writing).
    """
    if config is None:
        yield lambda: None
        return
    with Capture(out_dir, config, rank=0, companions=companions, log=log) as cap:
        yield cap.step
