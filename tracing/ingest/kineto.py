"""Kineto (torch.profiler) Chrome-trace JSON -> the normalized event table. A pure function of one file.

What the format guarantees (pytorch/kineto ``output_json.cpp``):

- ``ts``/``dur`` are **microseconds** with up to 3 decimals (ns resolution) whatever ``displayTimeUnit`` says;
  with ``baseTimeNanoseconds`` they are relative to it: absolute ns = base + ts*1000. They are parsed from
  the number's text, so ``4458676522690.655`` becomes exactly ``...690655`` ns (a double cannot hold it).
- ``ph: "X"`` events carry a ``cat``: kernel / gpu_memcpy / gpu_memset / cuda_sync on GPU rows (``pid`` =
  device, ``tid`` = stream; ``args.device`` / ``args.stream`` win when present); cuda_runtime / cuda_driver
  launch calls; cpu_op; user_annotation (record_function, ``ProfilerStep#N``); gpu_user_annotation.
- A GPU op joins its launch call on ``args.correlation``. ``ac2g`` flow events repeat that and are skipped,
  as are metadata (``M``), instants and ``python_function`` (unless ``include_python``).

In bounded memory: file --(jsonstream)--> kineto_rows (kineto_time: exact ns) --(decoded)--> events.
"""

from __future__ import annotations

import os

from tracing.ingest.decoded import load_events
from tracing.ingest.kineto_time import us_text_to_ns
from tracing.ingest.trace import Trace

__all__ = ["load_kineto_events", "us_text_to_ns"]


def load_kineto_events(
    path: str | os.PathLike[str], *, rank: int | None = None, include_python: bool = False
) -> Trace:
    """Read one Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace` (``decoded.load_events``).

    ``rank`` is used when the file has no ``distributedInfo.rank`` and its name has no ``rank-N``.
    Raises :class:`TraceFormatError` naming the file and the problem (offset, event index, field).
    """
    return load_events(path, "kineto", rank=rank, include_python=include_python)
