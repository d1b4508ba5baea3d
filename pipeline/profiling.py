"""Trace capture for runs and sweeps: ``tracing.capture`` when the tracing package provides it, else
``torch.profiler`` directly (CPU activity, plus CUDA activity when a GPU is present), exported as a
gzipped Chrome/Kineto trace at ``trace/rank-<r>.json.gz`` (SPEC.md run directory layout).

Ranges from :class:`tracing.ranges.RangeLog` appear in the trace as ``user_annotation`` events because the
range helper enters ``record_function`` whenever a profiler is active.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _tracing_capture() -> object | None:
    try:
        mod = importlib.import_module("tracing.capture")
    except ImportError:
        return None
    return getattr(mod, "capture", None)


@contextlib.contextmanager
def capture_trace(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Profile the block and write the trace to ``path`` (``None``: no profiling at all)."""
    if path is None:
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    capture = _tracing_capture()
    if callable(capture):
        with capture(path):  # type: ignore[operator]
            yield
        return
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield
    fd, raw = tempfile.mkstemp(suffix=".json", dir=path.parent)
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(raw, "rb") as src, gzip.open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, path)
    finally:
        Path(raw).unlink(missing_ok=True)
