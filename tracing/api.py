"""The notebook API: one import for loading traces and computing every table.

    from tracing.api import load_kineto_events, load_nsys_events, device_metrics, attribute_ranges
    t = load_kineto_events("rank-0.json.gz")          # -> Trace(events=DataFrame, rank, meta)
    device_metrics(t.events)                          # span, busy, idle, host stall per (pid, device)
    stream_breakdown(t.events)                        # HTA's per-stream host_wait / kernel_wait / other
    attribute_ranges(t)                               # per-range wall, attributed GPU busy/span, host stall
    kernel_table(gpu_ops(t.events))                   # per-kernel totals with classes; class_totals(...)
    microbatch_table(attribute_ranges(t), Labels(model="m", precision="bf16", tokens_per_microbatch=4096))

Every function is pure (tables in, tables out) except the loaders, which read one file each, and
``use_system_allocator()`` (what the ``mxperf`` command calls first: a smaller Arrow footprint per process).
"""

from __future__ import annotations

from tracing.annotate import annotate
from tracing.attribution import attribute_ranges, range_frame
from tracing.capture import Capture, CaptureConfig
from tracing.ingest import analyze, detect_format, load_trace
from tracing.ingest_kineto import load_kineto_events
from tracing.ingest_nsys import load_nsys_events
from tracing.ingest_rangelog import load_range_log
from tracing.kernel_classes import class_totals, kernel_table, with_rules
from tracing.labels import Labels, parse_labels
from tracing.metrics import device_metrics, device_timelines, gpu_ops, stream_breakdown, union_intervals
from tracing.microbatches import microbatch_table
from tracing.phases import load_phase_map, phase_of
from tracing.store import use_system_allocator
from tracing.trace import Trace

# Written out (not derived from tracing.API_NAMES) so linters and type checkers see the re-exports; a test keeps
# the two equal.
__all__ = [
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
