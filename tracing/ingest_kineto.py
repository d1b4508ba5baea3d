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

Memory stays far below the decoded-JSON size: events are parsed one at a time (``jsonstream``) and only
int64 columns (``array('q')``) plus interned names are kept.
"""

from __future__ import annotations

import os
from array import array
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np

from tracing import schema
from tracing.errors import TraceFormatError
from tracing.jsonstream import ChromeTraceReader
from tracing.trace import Trace, events_frame, rank_from_name

# Kineto category -> event kind (older Kineto builds used capitalised names).
CATEGORY_KIND: dict[str, str] = {
    "kernel": schema.KERNEL,
    "Kernel": schema.KERNEL,
    "gpu_memcpy": schema.MEMCPY,
    "Memcpy": schema.MEMCPY,
    "gpu_memset": schema.MEMSET,
    "Memset": schema.MEMSET,
    "cuda_sync": schema.SYNC,
    "cuda_runtime": schema.RUNTIME,
    "Runtime": schema.RUNTIME,
    "cuda_driver": schema.DRIVER,
    "Driver": schema.DRIVER,
    "cpu_op": schema.CPU_OP,
    "Operator": schema.CPU_OP,
    "user_annotation": schema.RANGE,
    "gpu_user_annotation": schema.GPU_RANGE,
    "python_function": schema.PYTHON,
}
_KIND_CODE = {k: i for i, k in enumerate(schema.EVENT_KINDS)}
_GPU_CODES = frozenset(_KIND_CODE[k] for k in (schema.KERNEL, schema.MEMCPY, schema.MEMSET, schema.SYNC, schema.GPU_RANGE))


def us_text_to_ns(value: Any) -> int:
    """Microseconds (int, or the exact decimal text of a float) -> int ns, rounding half-even below 1 ns."""
    if type(value) is int:
        return value * 1000
    if type(value) is not str:
        raise TypeError(f"expected a number, got {type(value).__name__}")
    whole, dot, frac = value.partition(".")
    if dot and len(frac) <= 3 and frac.isdigit() and (whole.isdigit() or (whole[:1] == "-" and whole[1:].isdigit())):
        ns = int(whole.lstrip("-") or "0") * 1000 + int(frac.ljust(3, "0"))
        return -ns if whole.startswith("-") else ns
    try:
        d = Decimal(value)
        if d.is_finite():
            return int((d * 1000).to_integral_value(ROUND_HALF_EVEN))
    except (InvalidOperation, ValueError):
        pass
    raise TypeError(f"not a finite number: {value!r}")


def _as_int(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    if isinstance(value, str):  # a float's text, e.g. "7.0"
        try:
            d = Decimal(value)
            if d.is_finite() and d == d.to_integral_value():
                return int(d)
        except InvalidOperation:
            pass
    raise TypeError(f"expected an integer, got {value!r}")


class _Columns:
    """Growable int64 columns plus interned names: the whole per-event state of the parser."""

    def __init__(self) -> None:
        self.cols: dict[str, array] = {c: array("q") for c in schema.EVENT_COLUMNS if c not in ("name", "kind", "domain")}
        self.name = array("i")
        self.kind = array("b")
        self.names: dict[str, int] = {}
        self.text_ids: dict[str, int] = {}  # non-integer pid/tid values (e.g. "Spans") -> negative ids

    def name_code(self, name: str) -> int:
        code = self.names.get(name)
        if code is None:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise TypeError("name is not valid Unicode (lone surrogate escape)") from None
            code = self.names[name] = len(self.names)
        return code

    def id_of(self, value: Any) -> int:
        if type(value) is int:
            return value
        if isinstance(value, str):
            if value.lstrip("-").isdigit():
                return int(value)
            return self.text_ids.setdefault(value, -2 - len(self.text_ids))
        raise TypeError(f"pid/tid must be an integer or a string, got {type(value).__name__}")


def load_kineto_events(
    path: str | os.PathLike[str], *, rank: int | None = None, include_python: bool = False
) -> Trace:
    """Read one Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    ``rank`` is used when the file has no ``distributedInfo.rank`` and its name has no ``rank-N``.
    Raises :class:`TraceFormatError` naming the file and the problem (offset, event index, field).
    """
    path = Path(path)
    reader = ChromeTraceReader(path)
    c = _Columns()
    skipped = 0
    index = -1
    cols = c.cols
    kind_of = CATEGORY_KIND
    kind_code = _KIND_CODE
    gpu_codes = _GPU_CODES
    python_code = _KIND_CODE[schema.PYTHON]
    a_kind, a_name = c.kind.append, c.name.append
    a_pid, a_tid, a_dev, a_stream = cols["pid"].append, cols["tid"].append, cols["device"].append, cols["stream"].append
    a_start, a_dur, a_corr = cols["start_ns"].append, cols["dur_ns"].append, cols["correlation"].append
    a_ext, a_bytes, a_end_tid = cols["external_id"].append, cols["bytes"].append, cols["end_tid"].append
    names_get = c.names.get
    try:
        for index, ev in enumerate(reader.events()):  # noqa: B007 -- index used in the error message
            if type(ev) is not dict:
                raise TypeError(f"event is a {type(ev).__name__}, not an object")
            if ev.get("ph") != "X":
                continue
            kind = kind_of.get(ev.get("cat"))  # type: ignore[arg-type]
            if kind is None:
                skipped += 1
                continue
            code = kind_code[kind]
            if code == python_code and not include_python:
                skipped += 1
                continue
            ts, dur = ev.get("ts"), ev.get("dur", 0)
            start = ts * 1000 if type(ts) is int else us_text_to_ns(ts)
            dur_ns = dur * 1000 if type(dur) is int else us_text_to_ns(dur)
            if dur_ns < 0:
                raise ValueError(f"negative duration {dur} us")
            args = ev.get("args")
            if args is None:
                args = {}
            elif type(args) is not dict:
                raise TypeError("args is not an object")
            name = ev.get("name")
            if type(name) is not str:
                raise TypeError(f"name is {type(name).__name__}, not a string")
            ncode = names_get(name)
            a_name(ncode if ncode is not None else c.name_code(name))
            a_kind(code)
            pid, tid = ev.get("pid"), ev.get("tid")
            pid = pid if type(pid) is int else c.id_of(pid)
            tid = tid if type(tid) is int else c.id_of(tid)
            if code in gpu_codes:
                dev, stream = args.get("device", pid), args.get("stream", tid)
                a_dev(dev if type(dev) is int else _as_int(dev))
                a_stream(stream if type(stream) is int else _as_int(stream))
                a_pid(schema.NO_ID)
                a_tid(schema.NO_ID)
            else:
                a_dev(schema.NO_ID)
                a_stream(schema.NO_ID)
                a_pid(pid)
                a_tid(tid)
            a_start(start)
            a_dur(dur_ns)
            corr = args.get("correlation", -1)
            a_corr(corr if type(corr) is int else _as_int(corr))
            ext = args.get("External id", -1)
            a_ext(ext if type(ext) is int else _as_int(ext))
            nbytes = args.get("bytes", -1)
            a_bytes(nbytes if type(nbytes) is int else _as_int(nbytes))
            a_end_tid(schema.NO_ID)
    except TraceFormatError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise TraceFormatError(path, f"traceEvents[{index}]: {exc}") from None
    return _finish(path, reader.meta, c, rank, skipped)


def _finish(path: Path, meta: dict[str, Any], c: _Columns, rank: int | None, skipped: int) -> Trace:
    base = meta.get("baseTimeNanoseconds")
    base_ns = 0
    if base is not None:
        try:
            base_ns = _as_int(base)
        except (TypeError, ValueError):
            raise TraceFormatError(path, f"baseTimeNanoseconds is not an integer: {base!r}") from None
    columns: dict[str, Any] = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in c.cols.items()}
    if base_ns:
        columns["start_ns"] = columns["start_ns"] + np.int64(base_ns)
    columns["name"] = np.frombuffer(c.name, dtype=np.int32) if len(c.name) else np.zeros(0, np.int32)
    columns["kind"] = np.frombuffer(c.kind, dtype=np.int8) if len(c.kind) else np.zeros(0, np.int8)
    events = events_frame(columns, list(c.names), list(schema.EVENT_KINDS), [""])
    _assign_gpu_pids(events)
    dist = meta.get("distributedInfo")
    file_rank = dist.get("rank") if isinstance(dist, dict) else None
    if not isinstance(file_rank, int):
        file_rank = None
    resolved = file_rank if file_rank is not None else rank_from_name(path)
    if resolved is None:
        resolved = rank
    props = meta.get("deviceProperties")
    gpu_names = {int(p["id"]): p.get("name") for p in props if isinstance(p, dict) and isinstance(p.get("id"), int)} if isinstance(props, list) else {}
    info = {
        "base_time_ns": base_ns,
        "clock": "epoch_ns" if base_ns else "kineto_us_as_ns",
        "distributed_info": dist if isinstance(dist, dict) else None,
        "gpu_names": gpu_names,
        "skipped_events": skipped,
        "display_time_unit": meta.get("displayTimeUnit"),
    }
    return Trace(str(path), "kineto", events, rank=resolved, meta=info)


def _assign_gpu_pids(events: Any) -> None:
    """Give each GPU row the pid of the process whose runtime/driver call launched it (by correlation)."""
    kind = events["kind"].to_numpy()
    corr = events["correlation"].to_numpy()
    is_launch = np.isin(kind, list(schema.LAUNCH_KINDS)) & (corr >= 0)
    is_gpu = events["device"].to_numpy() >= 0
    if not is_gpu.any():
        return
    pids = events["pid"].to_numpy().copy()
    l_corr, l_pid = corr[is_launch], pids[is_launch]
    order = np.argsort(l_corr, kind="stable")
    l_corr, l_pid = l_corr[order], l_pid[order]
    g_idx = np.flatnonzero(is_gpu)
    pos = np.searchsorted(l_corr, corr[g_idx])
    pos_c = np.minimum(pos, max(len(l_corr) - 1, 0))
    found = (len(l_corr) > 0) & (pos < len(l_corr))
    found &= l_corr[pos_c] == corr[g_idx] if len(l_corr) else found
    fallback = np.bincount(np.unique(l_pid, return_inverse=True)[1]).argmax() if len(l_pid) else None
    default = np.unique(l_pid)[fallback] if fallback is not None else schema.NO_ID
    pids[g_idx] = np.where(found, l_pid[pos_c] if len(l_pid) else schema.NO_ID, default)
    events["pid"] = pids
