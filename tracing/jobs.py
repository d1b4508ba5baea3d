"""Ingest jobs: one trace file -> its event table (staged Parquet) and every small table; mapped over files.

    file --(tracing.ingest.detect.load_trace)--> Trace --(tracing.analysis: metrics, attribution, kernels)--> tables

The per-file step (:func:`ingest_file`) is a pure function of one path (plus options) that writes its event
table to a staging name and returns the small tables; it is mapped over files in-process, with a local process
pool (``workers``), or as Ray tasks (``ray_address``; the workers read the paths from a shared filesystem and
write to the shared output directory). The caller (``mxperf ingest``) renames staged files into place only once
every file succeeded, so a bad input never leaves partial Parquet behind.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tracing.analysis import attribution, kernel_classes, metrics, steps
from tracing.analysis.phases import PhaseMap, default_phase_map, load_phase_map
from tracing.ingest.detect import load_trace
from tracing.ingest.trace import Trace, rank_from_name
from tracing.outputs import store
from tracing.outputs.errors import InputError, MxperfError


@dataclass
class FileResult:
    """What one file contributes to the output directory (events are staged on disk, not carried here)."""

    path: str
    format: str
    rank: int | None
    num_events: int
    staged_events: str | None
    devices: pd.DataFrame
    streams: pd.DataFrame
    ranges: pd.DataFrame
    kernels: pd.DataFrame
    steps: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    gpu_reason: str = ""


def analyze(trace: Trace, phase_map: PhaseMap | None = None) -> dict[str, pd.DataFrame]:
    """All per-trace tables: devices, streams, ranges, kernels, steps (pure; no I/O)."""
    ops = metrics.gpu_ops(trace.events)
    timelines = metrics.device_timelines(trace.events, ops)
    ranges = attribution.attribute_ranges(trace, phase_map, ops=ops, timelines=timelines)
    return {
        "devices": metrics.device_metrics(trace.events, timelines),
        "streams": metrics.stream_breakdown(trace.events, ops=ops),
        "ranges": ranges,
        "kernels": kernel_classes.kernel_table(ops),
        "steps": steps.trace_step_phases(_with_trace_cols(ranges, trace)),
    }


def _with_trace_cols(df: pd.DataFrame, trace: Trace, *, fmt: bool = False) -> pd.DataFrame:
    df = df.copy()
    df.insert(0, "trace", trace.path)
    pos = 1
    if fmt:
        df.insert(pos, "format", trace.format)
        pos += 1
    df.insert(pos, "rank", pd.array([trace.rank] * len(df), dtype="Int64"))
    return df


def ingest_file(
    path: str,
    fmt: str,
    rank: int | None,
    stage_dir: str | None,
    index: int,
    phase_map_path: str | None = None,
    include_python: bool = False,
) -> FileResult:
    """Ingest one file; stage its event table as ``stage_dir/.events-<index>.parquet`` when given."""
    phase_map = load_phase_map(phase_map_path) if phase_map_path else default_phase_map()
    trace = load_trace(path, fmt, rank=rank, include_python=include_python)
    tables = analyze(trace, phase_map)
    staged = None
    if stage_dir is not None:
        staged = str(Path(stage_dir) / f".events-{index}.parquet")
        store.write_table(
            trace.events, staged, meta={"trace": trace.path, "format": trace.format, "rank": trace.rank}
        )
    reason = ""
    if trace.format == "rangelog":
        reason = attribution.RANGELOG_REASON
    elif trace.num_gpu_ops == 0:
        reason = attribution.NO_GPU_REASON
    return FileResult(
        path=trace.path,
        format=trace.format,
        rank=trace.rank,
        num_events=len(trace.events),
        staged_events=staged,
        devices=_with_trace_cols(tables["devices"], trace, fmt=True),
        streams=_with_trace_cols(tables["streams"], trace),
        ranges=_with_trace_cols(tables["ranges"], trace),
        kernels=_with_trace_cols(tables["kernels"], trace),
        steps=tables["steps"],
        meta=trace.meta,
        gpu_reason=reason,
    )


def _rank_hint(path: Path, fmt: str, rank: int | None, many: bool) -> int | None:
    # --rank applies to a single input; with many inputs each file's own rank (or name) decides.
    if rank is not None and not many:
        return rank
    return rank_from_name(path) if fmt != "rangelog" else None


def ingest_many(
    items: list[tuple[Path, str]],
    stage_dir: str | None,
    *,
    rank: int | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    phase_map_path: str | None = None,
    include_python: bool = False,
) -> list[FileResult]:
    """Map :func:`ingest_file` over files (in order), serially, with a process pool, or on Ray."""
    many = len(items) > 1
    jobs = [
        (str(p), fmt, _rank_hint(p, fmt, rank, many), stage_dir, i, phase_map_path, include_python)
        for i, (p, fmt) in enumerate(items)
    ]
    if ray_address is not None:
        return _ingest_ray(jobs, ray_address)
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            futures = [pool.submit(ingest_file, *job) for job in jobs]
            return [f.result() for f in futures]
    return [ingest_file(*job) for job in jobs]


def _ingest_ray(jobs: list[tuple[Any, ...]], address: str) -> list[FileResult]:
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray, which is not installed: pip install 'mxperf[ray]'") from None
    if not ray.is_initialized():
        if address == "local":
            ray.init(
                num_cpus=max(2, min(len(jobs), os.cpu_count() or 1)),
                include_dashboard=False,
                log_to_driver=False,
            )
        else:
            ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(ingest_file)
    try:
        return ray.get([remote.remote(*job) for job in jobs])
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, MxperfError):  # bad input on a worker: one line, like a local failure
            raise cause from None
        raise
