"""Traces in, tables out: ingest (Kineto, nsys, range logs) -> events -> device / range / micro-batch tables.

The notebook API is one call, ``tracing.open(path)`` (a trace file or an ``mxperf ingest`` folder), plus the
stage functions below for finer work. Names resolve lazily, so ``import tracing.outputs.errors`` stays cheap::

    t = tracing.open("rank-0.json.gz")         # or tracing.open("runs/ing")
    t.devices(); t.ranges(); t.kernels(); t.microbatches(); t.steps()
"""

from __future__ import annotations

import importlib
from typing import Any

# The one list of the public API: name -> the module that defines it.
_API: dict[str, str] = {
    "open": "tracing.facade",
    "TraceTables": "tracing.facade",
    "Capture": "tracing.capture.profiler",
    "CaptureConfig": "tracing.capture.profiler",
    "Labels": "tracing.outputs.labels",
    "parse_labels": "tracing.outputs.labels",
    "Trace": "tracing.ingest.trace",
    "detect_format": "tracing.ingest.detect",
    "load_trace": "tracing.ingest.detect",
    "load_kineto_events": "tracing.ingest.kineto",
    "load_nsys_events": "tracing.ingest.decoded",
    "load_range_log": "tracing.ingest.rangelog",
    "load_metric_log": "tracing.ingest.metric_logs",
    "device_metrics": "tracing.analysis.metrics",
    "device_timelines": "tracing.analysis.metrics",
    "gpu_ops": "tracing.analysis.metrics",
    "stream_breakdown": "tracing.analysis.metrics",
    "union_intervals": "tracing.analysis.metrics",
    "attribute_ranges": "tracing.analysis.attribution",
    "range_frame": "tracing.analysis.attribution",
    "class_totals": "tracing.analysis.kernel_classes",
    "kernel_table": "tracing.analysis.kernel_classes",
    "with_rules": "tracing.analysis.kernel_classes",
    "microbatch_table": "tracing.analysis.microbatches",
    "find_microbatches": "tracing.analysis.microbatches",
    "detect_precision": "tracing.analysis.precision",
    "load_phase_map": "tracing.analysis.phases",
    "phase_of": "tracing.analysis.phases",
    "step_phase_table": "tracing.analysis.steps",
    "logged_step_tables": "tracing.analysis.logged_steps",
    "annotate": "tracing.analysis.annotate",
    "analyze": "tracing.jobs",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
