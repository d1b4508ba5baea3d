"""Machine load around a sweep or run (issue 33 item 7): load average and CPU count at the start and the end.

Written to the manifest's ``load`` field, so that a fit can say when its timings came from a machine busier
than its cores (``perfmodel.inputs.load``: the verdict warns)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any


def load_sample() -> dict[str, Any]:
    """Now: 1, 5 and 15 minute load averages (null where the OS has none), CPU count, usable CPUs."""
    try:
        avg: list[float] | None = [float(x) for x in os.getloadavg()]
    except (OSError, AttributeError):
        avg = None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg": avg,
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
    }


def exceeded(start: dict[str, Any] | None, end: dict[str, Any] | None) -> bool | None:
    """Whether the 1-minute load average exceeded the CPU count at the start or at the end (None: unknown)."""
    seen = [
        s["loadavg"][0] > s["cpu_count"]
        for s in (start, end)
        if s and s.get("loadavg") and s.get("cpu_count")
    ]
    return any(seen) if seen else None


def record(od: Any, when: str, start: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the manifest's ``load`` field: ``when`` is ``start`` or ``end`` (then ``start`` is the first
    sample); returns the sample taken."""
    sample = load_sample()
    if when == "start":
        od.update(load={"start": sample, "end": None, "exceeded_cores": exceeded(sample, None)})
    else:
        od.update(load={"start": start, "end": sample, "exceeded_cores": exceeded(start, sample)})
    return sample
