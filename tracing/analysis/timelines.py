"""A device timeline: one (process, device)'s busy union and host-stall intervals, and its row of totals."""

from __future__ import annotations

from dataclasses import dataclass

from tracing.analysis.intervals import Intervals
from tracing.outputs import schema

KERNEL_WAIT_THRESHOLD_NS = 30_000  # HTA's consecutive_kernel_delay (30, in trace units = us)


@dataclass(frozen=True)
class DeviceTimeline:
    """The busy union and the host-stall intervals of one (process, device) (rules: ``metrics.py``)."""

    pid: int
    device: int
    busy: Intervals
    stall: Intervals  # each lies inside a gap of the busy union, from its start
    row: dict[str, float | int]

    def loaded(self) -> DeviceTimeline:
        return self


def timeline_row(
    pid: int,
    device: int,
    first_last: tuple[int, int],
    busy: int,
    stalls: tuple[int, int, int],
    counts: dict[str, int],
    num_streams: int,
    overlap: int,
) -> dict[str, float | int]:
    """A :class:`DeviceTimeline`'s row (``device_metrics`` columns before the colocated ones) from its
    totals: (first, last) op times, busy, (host stall, ambiguous, unattributed), op counts by kind."""
    first_ns, last_ns = first_last
    host_stall, ambiguous, unattributed = stalls
    span = last_ns - first_ns
    return {
        "pid": pid,
        "device": device,
        "first_ns": first_ns,
        "last_ns": last_ns,
        "span_ns": span,
        "busy_ns": busy,
        "idle_ns": span - busy,
        "host_stall_ns": host_stall,
        "host_stall_ambiguous_ns": ambiguous,
        "unattributed_ns": unattributed,
        "other_idle_ns": span - busy - host_stall,
        "host_stall_fraction": host_stall / span if span else float("nan"),
        "num_kernels": counts[schema.KERNEL],
        "num_memcpy": counts[schema.MEMCPY],
        "num_memset": counts[schema.MEMSET],
        "num_streams": num_streams,
        "same_stream_overlap_ns": overlap,
    }
