"""The sweep directory: manifest (kind sweep), ``microbatches.parquet``, ``ranges.parquet``, optional trace.

Separate from :mod:`pipeline.experiments.sweep` (which measures and returns tables) so that measuring stays free of I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from pipeline.experiments.sweep import NO_GPU_REASON, SweepConfig, fill_gpu_columns, run_sweep
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

    ``trace``: capture the whole sweep (:data:`pipeline.experiments.profiling.WHOLE_BLOCK`, optionally with the nsys
    bracket), or None for no trace.
    """
    import torch

    from pipeline.experiments.profiling import capture_trace, manifest_fields

    # A traced sweep names its ranges with their attributes (update/microbatch[step=..,precision=..]) so the
    # trace's micro-batches can be matched to the table's rows (sweep.gpu_columns).
    ranges = RangeLog(encode_attrs=trace is not None)
    if torch.cuda.is_available():
        log(
            "note: mxperf sweep measures the native learner on the CPU (emulated MXFP8); for GPU timings use "
            "benchmarks/gpu_sweep.sh (Hopper FP8) or the Megatron/TE learner (docs/engines.md)"
        )
    config = {**asdict(cfg), **manifest_fields(trace), "num_sequences": cfg.num_sequences}
    with OutputDir(
        out_dir, kind="sweep", command=command, config=config, compute_dtype=cfg.compute_dtype, force=force
    ) as od:
        trace_path = store.trace_path(od.path, 0) if trace is not None else None
        try:
            with capture_trace(od.path, trace):
                df = run_sweep(cfg, ranges=ranges, log=log)
        finally:
            store.write_table(ranges.to_frame(), od.path / store.RANGES)
        if trace is not None and trace.nsys:  # with_nsys only allows it where CUDA is
            reason = (
                "traced under Nsight Systems (--nsys): the GPU activity is in its report; "
                "nsys export --type sqlite, then mxperf ingest it"
            )
        elif trace_path is not None:
            df, reason = fill_gpu_columns(df, str(trace_path))
        elif torch.cuda.is_available():
            reason = "not traced: run with --trace for GPU busy and host stall"
        else:
            reason = NO_GPU_REASON
        store.write_table(df, od.path / store.MICROBATCHES)
        od.update(
            gpu_reason=reason,
            microbatches=len(df),
            mfu_reason="hardware peak FLOP/s unknown",
            learner_device="cpu",  # the native learner (HF model, emulated MXFP8) always runs on the CPU
        )
    return {
        "schema_version": store.SCHEMA_VERSION,
        "run_dir": str(od.path),
        "status": "complete",
        "microbatches": len(df),
        "precisions": list(cfg.precisions),
        "sizes": list(cfg.sizes),
    }
