"""Add mxperf's view as tracks to a trace that opens in Perfetto / chrome://tracing.

For every (process, device) the output gains one process ``mxperf: GPU <d> (pid <p>)`` with three threads:

- ``GPU busy``: the busy union (kernel, memcpy, memset over all streams), one slice per busy interval;
- ``host stall``: the part of each idle gap the GPU waited for the host (launch-end rule, ``metrics.py``);
- ``idle (other)``: the rest of each gap (dependencies, syncs, unattributed launches).

A Kineto input is copied event by event (the exact JSON text of each event, so nothing is lost or rounded)
and the tracks are appended, in the file's own time base (µs relative to ``baseTimeNanoseconds``). An nsys
export becomes a new Chrome trace with its kernels, memory ops, CUDA API calls and NVTX ranges plus the tracks.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tracing.analysis import gpu_tables, metrics
from tracing.ingest.decoded import in_engine
from tracing.ingest.detect import detect_format
from tracing.ingest.engine import batches
from tracing.ingest.jsonstream import RAWS, ChromeTraceReader
from tracing.outputs import schema, store
from tracing.outputs.errors import InputError

OVERLAY_PID_BASE = 2_000_000_000  # far above real pids, so the overlay processes never collide
TRACKS = ("GPU busy", "host stall", "idle (other)")


def _us(ns: int) -> str:
    """ns -> the µs text Kineto writes (3 decimals, exact)."""
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(int(ns)), 1000)
    return f"{sign}{q}.{r:03d}"


def overlay_events(timelines: Iterable[metrics.DeviceTimeline], base_ns: int = 0) -> Iterator[str]:
    """Chrome-trace event texts (JSON objects) for the busy / host stall / other-idle tracks."""
    for i, t in enumerate(timelines):
        pid = OVERLAY_PID_BASE + i
        label = f"mxperf: GPU {t.device} (pid {t.pid})"
        yield json.dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        yield json.dumps(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}}
        )
        for tid, name in enumerate(TRACKS):
            yield json.dumps(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
        (busy_s, busy_e), (stall_s, stall_e) = t.busy.arrays(), t.stall.arrays()
        other_s, other_e = _subtract(busy_e[:-1], busy_s[1:], stall_s, stall_e)
        for tid, (starts, ends, name) in enumerate(
            (
                (busy_s, busy_e, "busy"),
                (stall_s, stall_e, "host stall"),
                (other_s, other_e, "idle"),
            )
        ):
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                yield (
                    f'{{"ph": "X", "cat": "mxperf", "name": "{name}", "pid": {pid}, "tid": {tid}, '
                    f'"ts": {_us(s - base_ns)}, "dur": {_us(e - s)}}}'
                )


def _subtract(
    a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals a minus intervals b, where each b lies inside one a and starts at that a's start."""
    out_s, out_e = [], []
    j = 0
    for s, e in zip(a_s.tolist(), a_e.tolist(), strict=True):
        cut = s
        while j < len(b_s) and b_s[j] < e:
            if b_s[j] >= s:
                cut = max(cut, int(b_e[j]))
            j += 1
        if cut < e:
            out_s.append(cut)
            out_e.append(e)
    return np.asarray(out_s, np.int64), np.asarray(out_e, np.int64)


def _write_trace(dst: Path, events: Iterable[str], meta: dict[str, str]) -> None:
    opener: Any = gzip.open if dst.name.endswith(".gz") else open
    with store.atomic(dst) as tmp, opener(tmp, "wt", encoding="utf-8") as fh:
        fh.write('{"traceEvents": [\n')
        first = True
        for text in events:
            fh.write(text if first else ",\n" + text)
            first = False
        fh.write("\n]")
        for key, text in meta.items():
            fh.write(f",\n{json.dumps(key)}: {text}")
        fh.write("\n}\n")


def _timelines(con: Any) -> list[metrics.DeviceTimeline]:
    gpu_tables.make_ops(con)
    return gpu_tables.device_timelines(con)


def annotate_kineto(src: Path, dst: Path) -> list[metrics.DeviceTimeline]:
    with in_engine(src, "kineto") as (con, d, _):
        timelines = _timelines(con)
    base = int(d.meta.get("base_time_ns") or 0)
    reader = ChromeTraceReader(src)

    def events() -> Iterator[str]:
        for _, _, raws in reader.batches(RAWS.decode):  # each event's exact JSON text
            yield from (bytes(raw).decode(errors="replace") for raw in raws)
        yield from overlay_events(timelines, base)

    # reader.meta_raw fills up while the events stream; _write_trace reads it only after the last event.
    _write_trace(dst, events(), reader.meta_raw)
    return timelines


# Event kind -> the Kineto category, so the output re-ingests as a Kineto trace with the same numbers.
KINETO_CATEGORY = {
    schema.KERNEL: "kernel",
    schema.MEMCPY: "gpu_memcpy",
    schema.MEMSET: "gpu_memset",
    schema.SYNC: "cuda_sync",
    schema.RUNTIME: "cuda_runtime",
    schema.DRIVER: "cuda_driver",
    schema.RANGE: "user_annotation",
}


_EVENT_COLUMNS = ("pid", "tid", "device", "stream", "start_ns", "dur_ns", "correlation")
# an events table's CPU ops and Python functions too (an ingest's events, not an nsys export's)
ALL_CATEGORIES = {**KINETO_CATEGORY, schema.CPU_OP: "cpu_op", schema.PYTHON: "python_function"}


def kineto_events(
    con: Any, base_ns: int = 0, categories: dict[str, str] = KINETO_CATEGORY, per_process_ids: bool = True
) -> Iterator[str]:
    """The rows of the engine's ``events`` view as Kineto events (JSON text), in table order: GPU rows on
    (device, stream) as Kineto writes them, times relative to ``base_ns``; kinds not in ``categories`` are
    left out. ``per_process_ids``: correlation ids are per process (nsys) and are made unique per file."""
    sql = f"select kind, name, {', '.join(_EVENT_COLUMNS)} from events order by row"
    for batch in batches(con, sql, 1 << 16):
        kinds = batch.column(0).to_pylist()
        names = ["" if n is None else n for n in batch.column(1).to_pylist()]
        cols = {c: batch.column(c).to_numpy() for c in _EVENT_COLUMNS}
        for i in range(batch.num_rows):
            cat = categories.get(kinds[i])
            if cat is None:
                continue
            args: dict[str, int] = {}
            if cols["device"][i] >= 0:  # GPU rows: pid = device, tid = stream, as Kineto writes them
                pid, tid = int(cols["device"][i]), int(cols["stream"][i])
                args = {"device": pid, "stream": tid}
            else:
                pid, tid = int(cols["pid"][i]), int(cols["tid"][i])
            if cols["correlation"][i] >= 0:
                corr = int(cols["correlation"][i])
                args["correlation"] = (int(cols["pid"][i]) << 32) | corr if per_process_ids else corr
            head = json.dumps({"ph": "X", "cat": cat, "name": names[i], "pid": pid, "tid": tid, "args": args})
            start, dur = _us(int(cols["start_ns"][i]) - base_ns), _us(int(cols["dur_ns"][i]))
            yield f'{head[:-1]}, "ts": {start}, "dur": {dur}}}'


def annotate_nsys(src: Path, dst: Path) -> list[metrics.DeviceTimeline]:
    with in_engine(src, "nsys") as (con, _, _):
        timelines = _timelines(con)

        def events() -> Iterator[str]:
            yield from kineto_events(con)
            yield from overlay_events(timelines, 0)

        meta = {"displayTimeUnit": json.dumps("ms"), "mxperf_source": json.dumps(str(src))}
        _write_trace(dst, events(), meta)
    return timelines


def annotate(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[metrics.DeviceTimeline]:
    """Write ``dst`` (.json or .json.gz): ``src`` plus busy / host-stall / other-idle tracks per device."""
    src, dst = Path(src), Path(dst)
    fmt = detect_format(src)
    if fmt == "nsys":
        return annotate_nsys(src, dst)
    if fmt == "kineto":
        return annotate_kineto(src, dst)
    raise InputError(f"{src}: an mxperf range log has no GPU activity to annotate")
