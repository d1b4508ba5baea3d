"""Traces in, tables out: ingest (Kineto, nsys, range logs) -> events -> device / range / micro-batch tables.

The notebook API is one call, ``tracing.open(path)`` (a trace file or an ``mxperf ingest`` folder), plus the
stage functions below for finer work. Names resolve lazily, so ``import tracing.outputs.errors`` stays cheap::

    t = tracing.open("rank-0.json.gz")         # or tracing.open("runs/ing")
    t.devices(); t.ranges(); t.kernels(); t.microbatches(); t.steps()
"""

from __future__ import annotations

import importlib
from typing import Any

# The one list of the public API: module -> the names it defines.
_MODULES: dict[str, tuple[str, ...]] = {
    "tracing.facade": ("open", "TraceTables"),
    "tracing.capture.profiler": ("Capture", "CaptureConfig"),
    "tracing.outputs.labels": ("Labels", "parse_labels"),
    "tracing.ingest.trace": ("Trace",),
    "tracing.ingest.detect": ("detect_format", "load_trace"),
    "tracing.ingest.kineto": ("load_kineto_events",),
    "tracing.ingest.decoded": ("load_nsys_events",),
    "tracing.ingest.rangelog": ("load_range_log",),
    "tracing.ingest.metric_logs": ("load_metric_log",),
    "tracing.analysis.metrics": (
        "device_metrics",
        "device_timelines",
        "gpu_ops",
        "stream_breakdown",
        "union_intervals",
    ),
    "tracing.analysis.attribution": ("attribute_ranges", "range_frame"),
    "tracing.analysis.kernel_classes": ("class_totals", "kernel_table", "with_rules"),
    "tracing.analysis.microbatches": ("microbatch_table", "find_microbatches"),
    "tracing.analysis.precision": ("detect_precision",),
    "tracing.analysis.phases": ("load_phase_map", "phase_of"),
    "tracing.analysis.steps": ("step_phase_table",),
    "tracing.analysis.logged_steps": ("logged_step_tables",),
    "tracing.analysis.annotate": ("annotate",),
    "tracing.jobs": ("analyze",),
}
_API = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
