"""Processes mxperf forks: whether there is a core to give them, and what each does first (die with the
process that started it).

Kept apart from the modules that fork (``tracing.ingest.prefetch``, ``tracing.outputs.background``,
``tracing.ingest.kineto_sharded``) so that a child pays no import for it (a few standard-library names only).
"""

from __future__ import annotations

import os
import sys

# where mxperf forks helpers without exec: Linux (macOS system frameworks are not fork-safe; elsewhere no fork)
FORK = sys.platform.startswith("linux")


def die_with_parent(parent: int) -> None:
    """Make this (forked) process get SIGKILL when ``parent``, the process that started it, dies -- also by
    SIGKILL or the OOM killer, when no exit handler runs -- so no decoder or writer goes on for an ingest that
    is gone (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing: the exit handlers still stop children)."""
    if not FORK:  # PR_SET_PDEATHSIG is Linux's
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request was made: nobody would send the signal
        os._exit(1)


def spare_core() -> bool:
    """Whether this process may use more than one core (its CPU affinity, else the machine's count): with one,
    a forked helper would only take turns with it."""
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) > 1
