"""One GPU, several processes (colocated sampler and learner, MPS): the device's view next to each process's.

Per-process metrics see only their own kernels, so a learner gap filled by sampler kernels counts as host stall;
here every process reporting the same device (on one clock) is unioned (columns: docs/tracing.md)::

    learner   |==k==|         |==k==|          busy_ns (per process)
    sampler          |=g==g=|                  (the other process)
    device    |=====================|          device_busy_ns: |union over processes|
    learner stall    [~~~~~~~~]                host_stall_ns; device_host_stall_ns = the part no one filled
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from tracing.analysis.gpu_tables import DeviceTimeline
from tracing.analysis.intervals import Covered


def shared_device_time(
    timelines: Sequence[DeviceTimeline], offsets_ns: Sequence[int] | None = None
) -> list[dict[str, int]]:
    """The ``device_*`` columns of ``schema.DEVICE_COLUMNS`` per timeline, in order, each inside the process's
    own [first_ns, last_ns]; a process alone on its device gets its own numbers.

    Timelines share a device when their ``device`` match; ``offsets_ns[i]`` moves timeline i onto the common
    clock (0 for one trace file).
    """
    offsets = list(offsets_ns) if offsets_ns is not None else [0] * len(timelines)
    members: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(timelines):
        members[t.device].append(i)
    out: list[dict[str, int]] = []
    for i, t in enumerate(timelines):
        mine = members[t.device]
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
