"""Trace ingest, per-device / per-range metrics and host-stall attribution. Needs no torch.

The notebook API (``load_kineto_events``, ``load_nsys_events``, ``device_metrics``, ``attribute_ranges``,
...) lives in :mod:`tracing.api` and is re-exported here lazily, so ``import tracing.errors`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

# Keep in step with tracing.api.__all__ (a test checks). Listed here so that looking up a submodule name
# (``from tracing import metrics``) never triggers the API import.
API_NAMES = frozenset(
    [
        "Capture",
        "CaptureConfig",
        "Labels",
        "Trace",
        "analyze",
        "annotate",
        "attribute_ranges",
        "class_totals",
        "detect_format",
        "device_metrics",
        "device_timelines",
        "gpu_ops",
        "kernel_table",
        "load_kineto_events",
        "load_nsys_events",
        "load_phase_map",
        "load_range_log",
        "load_trace",
        "microbatch_table",
        "parse_labels",
        "phase_of",
        "range_frame",
        "stream_breakdown",
        "union_intervals",
        "use_system_allocator",
        "with_rules",
    ]
)


def __getattr__(name: str) -> Any:
    if name not in API_NAMES:
        raise AttributeError(f"module 'tracing' has no attribute {name!r}")
    return getattr(importlib.import_module("tracing.api"), name)
