"""The sweep directory: manifest (kind sweep), ``microbatches.parquet``, ``ranges.parquet``, optional trace.

Separate from :mod:`pipeline.experiments.sweep` (which measures and returns tables) so that measuring stays free
of I/O. The micro-batch table is rewritten (atomically) after every measured step, so a sweep stopped by a
timeout or a signal keeps every row it measured; its manifest then says ``interrupted``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import Any

import pandas as pd

from pipeline.experiments.load import record as record_load
from pipeline.experiments.sweep import SweepConfig, make_learners, run_sweep
from pipeline.experiments.sweep_tables import NO_GPU_REASON, gpu_columns, profiler_overhead, to_frame
from tracing.capture.profiler import CaptureConfig
from tracing.capture.ranges import RangeLog
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir


def execute_sweep(
    cfg: SweepConfig,
    out_dir: str | os.PathLike[str],
    *,
    trace: CaptureConfig | None = None,
    force: bool = False,
    command: Sequence[str] | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the sweep into ``out_dir``; returns the ``--json`` summary.

    ``trace``: what the profiler records (CUDA activity, shapes, the nsys bracket); the traced window is the
    last ``cfg.trace_repeats`` repeats after one profiler warm-up step. None: no trace.
    """
    from pipeline.device import device_label
    from pipeline.experiments.profiling import capture_trace, manifest_fields

    # A traced sweep names its ranges with their attributes (update/microbatch[step=..,precision=..]) so the
    # trace's micro-batches can be matched to the table's rows (sweep_tables.gpu_columns).
    ranges = RangeLog(encode_attrs=trace is not None)
    window = _window(cfg, trace)
    config = {**asdict(cfg), **manifest_fields(window), "num_sequences": cfg.num_sequences}
    with OutputDir(
        out_dir, kind="sweep", command=command, config=config, compute_dtype=cfg.compute_dtype, force=force
    ) as od:
        load_start = record_load(od, "start")
        learners = make_learners(cfg, ranges)
        od.update(
            learner_device=device_label(cfg.torch_device),
            sampler_device=None,  # a sweep times the learner alone
            learners={p: learner.describe() for p, learner in learners.items()},
        )

        @contextmanager
        def capture() -> Iterator[Callable[[], None]]:
            with capture_trace(od.path, window, log=log) as step:
                yield step

        table = od.path / store.MICROBATCHES
        df = to_frame([])
        try:
            df = run_sweep(
                cfg,
                ranges=ranges,
                log=log,
                capture=capture if window is not None else None,
                on_rows=lambda rows: store.write_table(rows, table),
                learners=learners,
            )
        finally:
            store.write_table(ranges.to_frame(), od.path / store.RANGES)
            record_load(od, "end", load_start)
        df, reason = _gpu_columns(df, od.path, window, cfg)
        store.write_table(df, table)
        od.update(
            gpu_reason=reason,
            microbatches=len(df),
            mfu_reason="hardware peak FLOP/s unknown",
            profiler_overhead=profiler_overhead(df),
            learners={p: learner.describe() for p, learner in learners.items()},
        )
    return {
        "schema_version": store.SCHEMA_VERSION,
        "run_dir": str(od.path),
        "status": "complete",
        "microbatches": len(df),
        "precisions": list(cfg.precisions),
        "sizes": list(cfg.sizes),
        "global_batches": list(cfg.global_batches),
        "learner_device": device_label(cfg.torch_device),
        "gemm": {p: learner.gemm_backend for p, learner in learners.items()},
    }


def _window(cfg: SweepConfig, trace: CaptureConfig | None) -> CaptureConfig | None:
    """The schedule of the traced window: one profiler warm-up step, then every step of the traced repeats."""
    if trace is None:
        return None
    steps = (
        min(cfg.trace_repeats, cfg.repeats) * len(cfg.sizes) * len(cfg.precisions) * len(cfg.global_batches)
    )
    return replace(trace, wait=0, warmup=1, active=steps, repeat=1)


def _gpu_columns(
    df: pd.DataFrame, out: Any, window: CaptureConfig | None, cfg: SweepConfig
) -> tuple[pd.DataFrame, str]:
    if window is None:
        if cfg.torch_device.type == "cuda":
            return df, "not traced: run with --trace for GPU busy and host stall"
        return df, NO_GPU_REASON
    if window.nsys:  # with_nsys only allows it where CUDA is
        return df, (
            "traced under Nsight Systems (--nsys): the GPU activity is in its report; "
            "nsys export --type sqlite, then mxperf ingest it"
        )
    if cfg.torch_device.type != "cuda":
        return df, NO_GPU_REASON
    from tracing.ingest.detect import load_trace

    return gpu_columns(df, load_trace(str(store.trace_path(out, 0))))
