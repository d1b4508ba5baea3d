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

Memory stays far below the decoded-JSON size: events are decoded by msgspec in ~256 KB batches (``jsonstream``)
and only int64 columns (``array('q')``) plus interned names are kept.

    file --(jsonstream: batches)--> kineto_rows (kineto_time: exact ns) --> columns --(_finish)--> Trace

A batch msgspec rejects or that holds anything unusual is redone event by event (:mod:`kineto_rows`), which
gives the same table or an error naming the bad event and field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracing.ingest.kineto_decode import KinetoDecoder
from tracing.ingest.kineto_rows import CATEGORY_KIND, KIND_CODE, Columns, as_int
from tracing.ingest.kineto_time import us_text_to_ns
from tracing.ingest.trace import Trace, events_frame, rank_from_name
from tracing.outputs import schema
from tracing.outputs.errors import TraceFormatError

__all__ = ["CATEGORY_KIND", "load_kineto_events", "us_text_to_ns"]


def load_kineto_events(
    path: str | os.PathLike[str], *, rank: int | None = None, include_python: bool = False
) -> Trace:
    """Read one Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    ``rank`` is used when the file has no ``distributedInfo.rank`` and its name has no ``rank-N``.
    Raises :class:`TraceFormatError` naming the file and the problem (offset, event index, field).
    """
    path = Path(path)
    dec = KinetoDecoder(path, include_python)
    for _ in dec.run():
        pass
    return _finish(path, dec.reader.meta, dec.columns, dec.skipped, rank)


def _finish(path: Path, meta: dict[str, Any], c: Columns, skipped: int, rank: int | None) -> Trace:
    base_ns, resolved, info = trace_info(path, meta, rank, skipped)
    columns: dict[str, Any] = {
        k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in c.cols.items()
    }
    if base_ns:
        columns["start_ns"] = columns["start_ns"] + np.int64(base_ns)
    columns["name"] = np.frombuffer(c.name, dtype=np.int32) if len(c.name) else np.zeros(0, np.int32)
    columns["kind"] = np.frombuffer(c.kind, dtype=np.int8) if len(c.kind) else np.zeros(0, np.int8)
    columns["shapes"] = np.frombuffer(c.shape, dtype=np.int32) if len(c.shape) else np.zeros(0, np.int32)
    events = events_frame(columns, list(c.names), list(schema.EVENT_KINDS), [""], list(c.shapes))
    _assign_gpu_pids(events)
    return Trace(str(path), "kineto", events, rank=resolved, meta=info)


def trace_info(
    path: Path, meta: dict[str, Any], rank: int | None, skipped: int
) -> tuple[int, int | None, dict[str, Any]]:
    """What a Kineto file says about itself: (base time ns, rank, the Trace's meta)."""
    base = meta.get("baseTimeNanoseconds")
    base_ns = 0
    if base is not None:
        try:
            base_ns = as_int(base)
        except (TypeError, ValueError):
            raise TraceFormatError(path, f"baseTimeNanoseconds is not an integer: {base!r}") from None
    dist = meta.get("distributedInfo")
    file_rank = dist.get("rank") if isinstance(dist, dict) else None
    if not isinstance(file_rank, int):
        file_rank = None
    resolved = file_rank if file_rank is not None else rank_from_name(path)
    if resolved is None:
        resolved = rank
    props = meta.get("deviceProperties")
    gpu_names = (
        {int(p["id"]): p.get("name") for p in props if isinstance(p, dict) and isinstance(p.get("id"), int)}
        if isinstance(props, list)
        else {}
    )
    info = {
        "base_time_ns": base_ns,
        "clock": "epoch_ns" if base_ns else "kineto_us_as_ns",
        "distributed_info": dist if isinstance(dist, dict) else None,
        "gpu_names": gpu_names,
        "skipped_events": skipped,
        "display_time_unit": meta.get("displayTimeUnit"),
    }
    return base_ns, resolved, info


def _assign_gpu_pids(events: Any) -> None:
    """Give each GPU row the pid of the process whose runtime/driver call launched it (by correlation).

    Rows without a launch record take the pid that launched most of the other ops on their device (Kineto
    writes one process per file, so this is that process), else the file's most common launching pid.
    """
    kind = events["kind"].cat.codes.to_numpy()
    corr = events["correlation"].to_numpy()
    launch_codes = [KIND_CODE[k] for k in schema.LAUNCH_KINDS]
    is_launch = np.isin(kind, launch_codes) & (corr >= 0)
    g_idx = np.flatnonzero(events["device"].to_numpy() >= 0)
    if len(g_idx) == 0 or not is_launch.any():
        return
    pids = events["pid"].to_numpy().copy()
    l_corr, l_pid = corr[is_launch], pids[is_launch]
    order = np.argsort(l_corr, kind="stable")
    l_corr, l_pid = l_corr[order], l_pid[order]
    pos = np.minimum(np.searchsorted(l_corr, corr[g_idx]), len(l_corr) - 1)
    found = l_corr[pos] == corr[g_idx]
    pids[g_idx] = np.where(found, l_pid[pos], schema.NO_ID)
    if not found.all():
        devices = events["device"].to_numpy()[g_idx]
        matched = pd.Series(pids[g_idx][found]).groupby(devices[found]).agg(lambda s: s.mode().iloc[0])
        overall = pd.Series(l_pid).mode().iloc[0]
        fill = pd.Series(devices[~found]).map(matched).fillna(overall).to_numpy(np.int64)
        pids[g_idx[~found]] = fill
    events["pid"] = pids
