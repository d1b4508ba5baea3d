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

Memory stays far below the decoded-JSON size: events are parsed in ~1 MB batches (``jsonstream``) and only
int64 columns (``array('q')``) plus interned names are kept.

Three paths give the same table: batches decoded by msgspec into records (``kineto_fast``, when installed;
:func:`_record_rows`), batches decoded by ``json`` into dicts (:func:`_batch_rows`), and, for any batch
either meets something unusual in, event by event (:func:`_event_row`), which names the bad event and field.
"""

from __future__ import annotations

import os
import re
from array import array
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from itertools import compress
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracing import kineto_fast, schema
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
_GPU_CODES = frozenset(
    _KIND_CODE[k] for k in (schema.KERNEL, schema.MEMCPY, schema.MEMSET, schema.SYNC, schema.GPU_RANGE)
)


def us_text_to_ns(value: Any) -> int:
    """Microseconds (int, or the exact decimal text of a float) -> int ns, rounding half-even below 1 ns."""
    if type(value) is int:
        return value * 1000
    if type(value) is not str:
        raise TypeError(f"expected a number, got {type(value).__name__}")
    whole, dot, frac = value.partition(".")
    if (
        dot
        and len(frac) <= 3
        and frac.isdigit()
        and (whole.isdigit() or (whole[:1] == "-" and whole[1:].isdigit()))
    ):
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
        self.cols: dict[str, array] = {
            c: array("q") for c in schema.EVENT_COLUMNS if c not in ("name", "kind", "domain")
        }
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


_ROW_COLUMNS = ("pid", "tid", "device", "stream", "start_ns", "dur_ns", "correlation", "external_id", "bytes")


class _Slow(Exception):
    """The fast batch path met something unusual; redo the batch event by event (exact errors)."""


def _event_row(ev: Any, c: _Columns, include_python: bool) -> tuple[int, ...] | None:
    """One event -> (kind, name, pid, tid, device, stream, start, dur, corr, ext, bytes), or None if skipped."""
    if type(ev) is not dict:
        raise TypeError(f"event is a {type(ev).__name__}, not an object")
    if ev.get("ph") != "X":
        return None
    kind = CATEGORY_KIND.get(ev.get("cat"))  # type: ignore[arg-type]
    if kind is None or (kind == schema.PYTHON and not include_python):
        return None
    code = _KIND_CODE[kind]
    ts, dur = ev.get("ts"), ev.get("dur", 0)
    start = us_text_to_ns(ts)
    dur_ns = us_text_to_ns(dur)
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
    pid, tid = c.id_of(ev.get("pid")), c.id_of(ev.get("tid"))
    if code in _GPU_CODES:
        dev, stream = _as_int(args.get("device", pid)), _as_int(args.get("stream", tid))
        pid = tid = schema.NO_ID
    else:
        dev = stream = schema.NO_ID
    corr = _as_int(args.get("correlation", -1))
    ext = _as_int(args.get("External id", -1))
    nbytes = _as_int(args.get("bytes", -1))
    return (code, c.name_code(name), pid, tid, dev, stream, start, dur_ns, corr, ext, nbytes)


def _ints_or_slow(values: list[Any]) -> list[Any]:
    for v in values:
        if v.__class__ is not int:
            raise _Slow
    return values


def _batch_rows(
    batch: list[Any], c: _Columns, include_python: bool
) -> tuple[list[int], list[int], list[list[int]], int]:
    """The fast path: column lists for a batch of events by list comprehensions; raises _Slow on anything odd."""
    if kineto_fast.is_event_batch(batch):
        return _record_rows(batch, c, include_python)
    phs = [e.get("ph") for e in batch]  # AttributeError on a non-object -> slow path
    xs = [e for e, ph in zip(batch, phs, strict=True) if ph == "X"]
    codes = [_KIND_CODE_OF_CAT.get(e.get("cat"), -1) for e in xs]
    py = _KIND_CODE[schema.PYTHON]
    keep = [(e, k) for e, k in zip(xs, codes, strict=True) if k >= 0 and (k != py or include_python)]
    skipped = len(xs) - len(keep)
    evs = [e for e, _ in keep]
    kinds = [k for _, k in keep]
    names = [e.get("name") for e in evs]
    ts = [e.get("ts") for e in evs]
    du = [e.get("dur", 0) for e in evs]
    args = [e.get("args") for e in evs]
    args = [_EMPTY if a is None else a for a in args]
    for a in args:
        if a.__class__ is not dict:
            raise _Slow
    pids = [e.get("pid") for e in evs]
    tids = [e.get("tid") for e in evs]
    gpu = [k in _GPU_CODES for k in kinds]
    no = schema.NO_ID
    devs = [a.get("device", p) if g else no for a, p, g in zip(args, pids, gpu, strict=True)]
    streams = [a.get("stream", t) if g else no for a, t, g in zip(args, tids, gpu, strict=True)]
    corr = [a.get("correlation", -1) for a in args]
    ext = [a.get("External id", -1) for a in args]
    nbytes = [a.get("bytes", -1) for a in args]
    name_codes, cols = _convert(c, names, ts, du, pids, tids, gpu, devs, streams, corr, ext, nbytes, True)
    return kinds, name_codes, cols, skipped


def _name_codes(c: _Columns, names: list[str]) -> list[int]:
    """Codes of ``names``; names new to ``c`` are interned in order of first appearance (as one by one)."""
    get = c.names.get
    codes = [get(n) for n in names]
    if None in codes:
        for n in dict.fromkeys(compress(names, [x is None for x in codes])):
            c.name_code(n)
        codes = [get(n) for n in names]
    return codes


def _record_rows(
    batch: list[Any], c: _Columns, include_python: bool
) -> tuple[list[int], list[int], list[Any], int]:
    """:func:`_batch_rows` for ``kineto_fast`` records: same values, same _Slow cases, numpy columns.

    msgspec already typed the integer fields (a record holds an int there, or None when the key is absent),
    so only names, ts/dur and absent pids need checks here.
    """
    lut = _KIND_CODE_OF_CAT if include_python else _KIND_CODE_OF_CAT_NO_PY
    codes = [lut.get(e.cat, -1) if e.ph == "X" else -2 for e in batch]  # -1: an X event we skip
    evs = list(compress(batch, [k >= 0 for k in codes]))
    kinds = [k for k in codes if k >= 0]
    names = [e.name for e in evs]
    for n in names:
        if n.__class__ is not str:
            raise _Slow
    name_codes = _name_codes(c, names)
    pids = _ints_or_slow([e.pid for e in evs])  # text ("Spans") or absent -> the exact path
    tids = _ints_or_slow([e.tid for e in evs])
    start = _us_to_ns([e.ts for e in evs])
    dur = _us_to_ns([e.dur for e in evs])
    if len(dur) and dur.min() < 0:
        raise _Slow
    args = [_EMPTY_ARGS if e.args is None else e.args for e in evs]
    n = len(evs)
    gpu = np.isin(np.array(kinds, np.int8), _GPU_CODE_LIST)
    g_idx = np.flatnonzero(gpu).tolist()
    no = schema.NO_ID
    dev, stream = np.full(n, no, np.int64), np.full(n, no, np.int64)
    if g_idx:  # GPU rows: args.device / args.stream, else pid / tid
        g_args = [args[i] for i in g_idx]
        g_pids, g_tids = [pids[i] for i in g_idx], [tids[i] for i in g_idx]
        dev[g_idx] = [p if a.device is None else a.device for a, p in zip(g_args, g_pids, strict=True)]
        stream[g_idx] = [t if a.stream is None else a.stream for a, t in zip(g_args, g_tids, strict=True)]
    pid = np.array(pids, np.int64)
    tid = np.array(tids, np.int64)
    pid[gpu] = no
    tid[gpu] = no
    corr = np.array([a.correlation for a in args], np.int64)
    ext = np.array([a.external_id for a in args], np.int64)
    nbytes = np.array([a.bytes for a in args], np.int64)
    return kinds, name_codes, [pid, tid, dev, stream, start, dur, corr, ext, nbytes], codes.count(-1)


_US_TEXT = [re.compile(rf"(?:-?[0-9]{{1,15}}\.[0-9]{{{d}}}\n)*") for d in range(4)]  # <= 1e15 us: fits
_MAX_US_INT = np.iinfo(np.int64).max // 1000


def _us_to_ns(values: list[Any]) -> np.ndarray:
    """Microsecond values (ints, or float text) -> int64 ns, exactly as :func:`us_text_to_ns` per value.

    The common cases are converted in bulk with no float step: every value a Python int (``* 1000``, when
    all fit), or every value decimal text with the same number (1-3) of decimals as the first -- drop the
    dots, parse the digits as int64 and scale to ns. Anything else goes value by value.
    """
    first = values[0] if values else None
    if first.__class__ is int and all(v.__class__ is int for v in values):  # bool is not int here either
        try:
            arr = np.array(values, np.int64)
        except OverflowError:
            arr = None
        if arr is not None and arr.min() >= -_MAX_US_INT and arr.max() <= _MAX_US_INT:
            return arr * 1000
    elif first.__class__ is str and 1 <= len(first) - first.find(".") - 1 <= 3 and "." in first:
        decimals = len(first) - first.find(".") - 1
        try:
            text = "\n".join(values) + "\n"
        except TypeError:
            text = ""
        if text and _US_TEXT[decimals].fullmatch(text) is not None:
            out = np.fromstring(text.replace(".", ""), dtype=np.int64, sep="\n")
            if len(out) == len(values):  # a value holding a newline would add a line
                return out if decimals == 3 else out * 10 ** (3 - decimals)
    return np.array(
        [
            t * 1000 if t.__class__ is int else int(t[:-4] + t[-3:]) if t[-4:-3] == "." else us_text_to_ns(t)
            for t in values
        ],
        np.int64,
    )


def _convert(
    c: _Columns,
    names: list[Any],
    ts: list[Any],
    du: list[Any],
    pids: list[int],
    tids: list[int],
    gpu: list[bool],
    devs: list[Any],
    streams: list[Any],
    corr: list[Any],
    ext: list[Any],
    nbytes: list[Any],
    check_ints: bool,
) -> tuple[list[int], list[list[int]]]:
    """Raw field values of the kept events -> (name codes, int columns); raises _Slow on anything odd."""
    for n in names:
        if n.__class__ is not str:
            raise _Slow
    name_codes = _name_codes(c, names)
    # "4458676522690.655" -> int("4458676522690" + "655"): exact, and a ValueError (-> slow path) on
    # anything that is not a plain 3-decimal number; other forms go through us_text_to_ns.
    starts = [
        t * 1000 if t.__class__ is int else int(t[:-4] + t[-3:]) if t[-4:-3] == "." else us_text_to_ns(t)
        for t in ts
    ]
    durs = [
        d * 1000 if d.__class__ is int else int(d[:-4] + d[-3:]) if d[-4:-3] == "." else us_text_to_ns(d)
        for d in du
    ]
    if durs and min(durs) < 0:
        raise _Slow
    if check_ints:  # json values may be bool/str/float; msgspec records hold ints (or None: TypeError below)
        pids, tids, devs, streams = map(_ints_or_slow, (pids, tids, devs, streams))
        corr, ext, nbytes = map(_ints_or_slow, (corr, ext, nbytes))
    no = schema.NO_ID
    pids = [no if g else p for p, g in zip(pids, gpu, strict=True)]
    tids = [no if g else t for t, g in zip(tids, gpu, strict=True)]
    cols = [pids, tids, devs, streams, starts, durs, corr, ext, nbytes]
    return name_codes, cols


_KIND_CODE_OF_CAT = {cat: _KIND_CODE[kind] for cat, kind in CATEGORY_KIND.items()}
_EMPTY: dict[str, Any] = {}
_KIND_CODE_OF_CAT_NO_PY = {cat: k for cat, k in _KIND_CODE_OF_CAT.items() if k != _KIND_CODE[schema.PYTHON]}
_GPU_CODE_LIST = sorted(_GPU_CODES)
_EMPTY_ARGS = kineto_fast.KinetoArgs() if kineto_fast.AVAILABLE else None


def _append(c: _Columns, kinds: list[int], names: list[int], cols: list[Any]) -> None:
    typed = [_int64s(col) for col in cols]  # OverflowError here leaves the columns untouched
    c.kind.extend(array("b", kinds))
    c.name.extend(array("i", names))
    for key, col in zip(_ROW_COLUMNS, typed, strict=True):
        c.cols[key].extend(col)
    c.cols["end_tid"].extend(array("q", [schema.NO_ID]) * len(kinds))


def _int64s(col: Any) -> array:
    if isinstance(col, np.ndarray):
        out = array("q")
        out.frombytes(col.astype(np.int64, copy=False).tobytes())
        return out
    return array("q", col)


def load_kineto_events(
    path: str | os.PathLike[str], *, rank: int | None = None, include_python: bool = False
) -> Trace:
    """Read one Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    ``rank`` is used when the file has no ``distributedInfo.rank`` and its name has no ``rank-N``.
    Raises :class:`TraceFormatError` naming the file and the problem (offset, event index, field).
    Batches of events are decoded with list comprehensions; a batch with anything unusual is redone event by
    event, which gives the same table or the exact error (event index and field).
    """
    return _load(Path(path), rank, include_python, fast=kineto_fast.AVAILABLE)


def _load(path: Path, rank: int | None, include_python: bool, *, fast: bool) -> Trace:
    """:func:`load_kineto_events`; ``fast=False`` decodes with ``json`` only (the reference for tests)."""
    reader = ChromeTraceReader(path)
    c = _Columns()
    skipped = 0
    first = 0
    for batch in reader.batches(kineto_fast.decode_batch if fast else None):
        try:
            kinds, names, cols, n_skipped = _batch_rows(batch, c, include_python)
            _append(c, kinds, names, cols)
            skipped += n_skipped
        except (_Slow, AttributeError, TypeError, ValueError, OverflowError):
            skipped += _slow_batch(path, batch, first, c, include_python)
        first += len(batch)
    return _finish(path, reader.meta, c, rank, skipped)


def _slow_batch(path: Path, batch: list[Any], first: int, c: _Columns, include_python: bool) -> int:
    if kineto_fast.is_event_batch(batch):
        batch = [kineto_fast.as_dict(ev) for ev in batch]
    rows, skipped = [], 0
    for i, ev in enumerate(batch):
        try:
            row = _event_row(ev, c, include_python)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TraceFormatError(path, f"traceEvents[{first + i}]: {exc}") from None
        if row is None:
            skipped += 1 if type(ev) is dict and ev.get("ph") == "X" else 0
        else:
            rows.append(row)
    if rows:
        cols = [list(col) for col in zip(*rows, strict=True)]
        try:
            _append(c, cols[0], cols[1], cols[2:])
        except OverflowError:
            raise TraceFormatError(
                path, f"traceEvents[{first}..{first + len(batch) - 1}]: a number does not fit in int64"
            ) from None
    return skipped


def _finish(path: Path, meta: dict[str, Any], c: _Columns, rank: int | None, skipped: int) -> Trace:
    base = meta.get("baseTimeNanoseconds")
    base_ns = 0
    if base is not None:
        try:
            base_ns = _as_int(base)
        except (TypeError, ValueError):
            raise TraceFormatError(path, f"baseTimeNanoseconds is not an integer: {base!r}") from None
    columns: dict[str, Any] = {
        k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in c.cols.items()
    }
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
    return Trace(str(path), "kineto", events, rank=resolved, meta=info)


def _assign_gpu_pids(events: Any) -> None:
    """Give each GPU row the pid of the process whose runtime/driver call launched it (by correlation).

    Rows without a launch record take the pid that launched most of the other ops on their device (Kineto
    writes one process per file, so this is that process), else the file's most common launching pid.
    """
    kind = events["kind"].cat.codes.to_numpy()
    corr = events["correlation"].to_numpy()
    launch_codes = [_KIND_CODE[k] for k in schema.LAUNCH_KINDS]
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
