"""One GPU, several processes (colocated sampler and learner, MPS): the device's view next to each process's.

Per-process metrics (``metrics.device_metrics``) see only their own kernels, so while the sampler runs the
learner's device looks idle, and a learner gap filled by sampler kernels counts as host stall. Here every
process of a trace set that reports the same device (on one clock) is unioned::

    learner   |==k==|         |==k==|          busy_ns (per process)
    sampler          |=g==g=|                  (the other process)
    device    |=====================|          device_busy_ns: |union over processes|
    learner stall    [~~~~~~~~]                host_stall_ns; device_host_stall_ns = the part no one filled

Columns (``schema.DEVICE_COLUMNS``), each inside the process's own [first_ns, last_ns] so they compare with
its ``span_ns``: ``device_processes``, ``device_busy_ns``, ``device_idle_ns`` (span - device busy),
``device_host_stall_ns``. A process alone on its device gets its own numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np

from tracing.analysis.gpu_tables import DeviceTimeline
from tracing.analysis.intervals import Covered

SHARED_COLUMNS: tuple[str, ...] = (
    "device_processes",
    "device_busy_ns",
    "device_idle_ns",
    "device_host_stall_ns",
)


def shared_device_time(
    timelines: Sequence[DeviceTimeline],
    offsets_ns: Sequence[int] | None = None,
    groups: Sequence[Hashable] | None = None,
) -> list[dict[str, int]]:
    """:data:`SHARED_COLUMNS` per timeline, in order.

    Timelines share a device when their ``(group, device)`` match; ``offsets_ns[i]`` moves timeline i onto the
    common clock (0 for one trace file). ``groups`` default to one group (all on one machine and clock).
    """
    n = len(timelines)
    offsets = list(offsets_ns) if offsets_ns is not None else [0] * n
    keys = [(groups[i] if groups is not None else 0, t.device) for i, t in enumerate(timelines)]
    members: dict[tuple[Hashable, int], list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(i)
    out: list[dict[str, int]] = []
    for i, t in enumerate(timelines):
        mine = members[keys[i]]
        row = t.row
        span, busy, stall = int(row["span_ns"]), int(row["busy_ns"]), int(row["host_stall_ns"])
        if len(mine) == 1:
            out.append(_columns(1, busy, span, stall))
            continue
        # the device's busy union (every process on it, on one clock), at this process's first op, each of its
        # stalls' ends and its last op end
        union = Covered([timelines[j].busy for j in mine], [offsets[j] for j in mine])
        off = offsets[i]
        lo, hi = int(row["first_ns"]) + off, int(row["last_ns"]) + off
        c_lo = int(union.at(np.array([lo]))[0])
        c = union.at(np.column_stack([t.stall.start + off, t.stall.end + off]).ravel())
        filled = int(np.clip(c[1::2] - c[::2], 0, None).sum())
        dev_busy = max(int(union.at(np.array([hi]))[0]) - c_lo, 0)
        out.append(_columns(len(mine), dev_busy, span, stall - filled))
    return out


def _columns(processes: int, busy: int, span: int, stall: int) -> dict[str, int]:
    return {
        "device_processes": processes,
        "device_busy_ns": busy,
        "device_idle_ns": span - busy,
        "device_host_stall_ns": stall,
    }
