"""Kineto file -> growable int64 columns of the event table, batch by batch (:class:`KinetoDecoder`).

A batch is decoded by msgspec into :class:`KinetoEvent` records holding only the keys the table reads and
converted a column at a time (:func:`record_rows`). A batch msgspec rejects, or that holds anything unusual
(:class:`Slow`), is redone event by event from its JSON text (:func:`event_row` over each event decoded
untyped), which gives the same rows or an error naming the event and the field.
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from tracing.ingest.jsonstream import ANY, NESTED_TOO_DEEP, RAWS, ChromeTraceReader
from tracing.ingest.kineto_time import us_text_to_ns, us_values_to_ns
from tracing.ingest.trace import zero_negative
from tracing.outputs import schema
from tracing.outputs.errors import TraceFormatError

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
KIND_CODE = {k: i for i, k in enumerate(schema.EVENT_KINDS)}
_GPU_CODES = sorted(
    KIND_CODE[k] for k in (schema.KERNEL, schema.MEMCPY, schema.MEMSET, schema.SYNC, schema.GPU_RANGE)
)
_KIND_CODE_OF_CAT = {cat: KIND_CODE[kind] for cat, kind in CATEGORY_KIND.items()}
_KIND_CODE_OF_CAT_NO_PY = {cat: k for cat, k in _KIND_CODE_OF_CAT.items() if k != KIND_CODE[schema.PYTHON]}


def as_int(value: Any) -> int:
    """An int, or its text (``"7"``, a float's ``"7.0"``), as an int; TypeError / ValueError otherwise."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    if isinstance(value, str):  # a float's text, e.g. "7.0"
        try:
            d = Decimal(value)
        except InvalidOperation:
            d = Decimal("NaN")
        if d.is_finite() and d == d.to_integral_value():
            if d.adjusted() > 18:  # not int64; and "1e999999999" must not become a billion-digit int
                raise ValueError(f"{value!r} does not fit in int64")
            return int(d)
    raise TypeError(f"expected an integer, got {value!r}")


class KinetoArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the event table reads; an absent key gets the default :func:`event_row` uses."""

    device: int = None  # type: ignore[assignment]  # None: absent (use pid); a JSON null fails the batch
    stream: int = None  # type: ignore[assignment]
    correlation: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    bytes: int = -1
    # record_shapes=True: kept as raw JSON text, canonicalized once per distinct text
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")


class KinetoEvent(msgspec.Struct, gc=False):
    """One ``traceEvents`` item, reduced to the keys the event table reads (every other key is skipped in C).

    Floats arrive as their exact decimal text (``float_hook=str``), integers of any size as ints; duplicate
    keys keep the last value and escaped key names are unescaped, as in an untyped decode. A value of another
    type in an integer field fails the batch, which is then redone event by event."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: int | str | None = None  # a text pid ("Spans") or a missing one -> event by event
    tid: int | str | None = None
    ts: Any = None
    dur: Any = 0
    args: KinetoArgs | None = None


EVENTS = msgspec.json.Decoder(list[KinetoEvent], float_hook=str)
_EMPTY_ARGS = KinetoArgs()

_PLAIN_DIMS = re.compile(rb"[\[\]0-9, \t\n\r]*")  # Input Dims of non-negative ints: canonical = no whitespace
_WHITESPACE = re.compile(rb"[ \t\n\r]+")


class Columns:
    """Growable int64 columns plus interned names: the whole per-event state of the parser."""

    def __init__(self) -> None:
        self.cols: dict[str, array] = {
            c: array("q") for c in schema.EVENT_COLUMNS if c not in ("name", "kind", "domain", "shapes")
        }
        self.name = array("i")
        self.kind = array("b")
        self.shape = array("i")
        self.names: dict[str, int] = {}
        self.shapes: dict[str, int] = {"": 0}  # canonical Input Dims text -> code
        self._raw_shapes: dict[bytes, int] = {b"": 0}  # raw text -> code
        self.text_ids: dict[str, int] = {}  # non-integer pid/tid values (e.g. "Spans") -> negative ids
        self.negative_durations = 0  # X events whose dur < 0 (taken as 0 long): see :func:`event_row`

    def __len__(self) -> int:
        return len(self.kind)

    def take(self) -> dict[str, np.ndarray]:
        """The rows held so far as int64 / int32 / int8 arrays (``name``, ``kind``, ``shapes`` codes and every
        int column); the arrays are emptied, names and shapes stay interned (codes keep their meaning)."""
        held = {**self.cols, "name": self.name, "kind": self.kind, "shapes": self.shape}
        out = {k: np.frombuffer(v, dtype=v.typecode).copy() for k, v in held.items()}  # q/i/b: int64/32/8
        for v in held.values():
            del v[:]
        return out

    def shape_code(self, value: Any) -> int:
        """Code of a decoded ``Input Dims`` value (None: absent -> 0), interned as its compact JSON text."""
        if value is None:
            return 0
        return self.shapes.setdefault(msgspec.json.encode(value).decode(), len(self.shapes))

    def raw_shape_code(self, raw: bytes) -> int:
        """Code of an ``Input Dims`` raw JSON text; the same code :meth:`shape_code` gives."""
        code = self._raw_shapes.get(raw)
        if code is None:
            if _PLAIN_DIMS.fullmatch(raw):
                text = _WHITESPACE.sub(b"", raw).decode("ascii")
                code = self.shapes.setdefault(text, len(self.shapes))
            else:
                code = self.shape_code(ANY.decode(raw))
            self._raw_shapes[raw] = code
        return code

    def name_code(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def id_of(self, value: Any) -> int:
        if type(value) is int:
            return value
        if isinstance(value, str):
            if value.lstrip("-").isdigit():
                return int(value)
            return self.text_ids.setdefault(value, -2 - len(self.text_ids))
        raise TypeError(f"pid/tid must be an integer or a string, got {type(value).__name__}")


_ROW_COLUMNS = ("pid", "tid", "device", "stream", "start_ns", "dur_ns", "correlation", "external_id", "bytes")


class Slow(Exception):
    """The fast batch path met something unusual; redo the batch event by event (exact errors)."""


def _field_ns(ev: dict[str, Any], key: str, default: Any) -> int:
    """``ev[key]`` (microseconds) in ns; an error names the field (``'ts' is missing``)."""
    value = ev.get(key, default)
    if value is None:
        raise ValueError(f"'{key}' is missing (microseconds expected)")
    try:
        return us_text_to_ns(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"'{key}': {exc}") from None


def event_row(ev: Any, c: Columns, include_python: bool) -> tuple[int, ...] | None:
    """One event -> (kind, name, pid, tid, device, stream, start, dur, corr, ext, bytes, shape), or None."""
    if type(ev) is not dict:
        raise TypeError(f"event is a {type(ev).__name__}, not an object")
    if ev.get("ph") != "X":
        return None
    kind = CATEGORY_KIND.get(ev.get("cat"))  # type: ignore[arg-type]
    if kind is None or (kind == schema.PYTHON and not include_python):
        return None
    code = KIND_CODE[kind]
    start = _field_ns(ev, "ts", None)
    dur_ns = _field_ns(ev, "dur", 0)
    if dur_ns < 0:  # a profiler bug (an end time of 0, pytorch/kineto#646): kept, 0 long, counted and said
        c.negative_durations += 1
        dur_ns = 0
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
        dev, stream = as_int(args.get("device", pid)), as_int(args.get("stream", tid))
        pid = tid = schema.NO_ID
    else:
        dev = stream = schema.NO_ID
    corr = as_int(args.get("correlation", -1))
    ext = as_int(args.get("External id", -1))
    nbytes = as_int(args.get("bytes", -1))
    shape = c.shape_code(args.get("Input Dims"))
    return (code, c.name_code(name), pid, tid, dev, stream, start, dur_ns, corr, ext, nbytes, shape)


def _ids(c: Columns, pids: list[Any], tids: list[Any]) -> tuple[list[int], list[int]]:
    """pid and tid values as ints: integers as they are, text ids (``"1890023232"``, ``"Spans"``) through
    :meth:`Columns.id_of` in event order (pid then tid, as one by one); an absent one -> the exact path."""
    if all(v.__class__ is int for v in pids) and all(v.__class__ is int for v in tids):
        return pids, tids
    if None in pids or None in tids:
        raise Slow
    pairs = [(c.id_of(p), c.id_of(t)) for p, t in zip(pids, tids, strict=True)]
    return [p for p, _ in pairs], [t for _, t in pairs]


def _name_codes(c: Columns, names: list[str]) -> list[int]:
    """Codes of ``names``; names new to ``c`` are interned in order of first appearance (as one by one)."""
    get = c.names.get
    codes = [get(n) for n in names]
    if None in codes:
        for n in dict.fromkeys(compress(names, [x is None for x in codes])):
            c.name_code(n)
        codes = [get(n) for n in names]
    return codes


def record_rows(
    batch: list[Any], c: Columns, include_python: bool
) -> tuple[list[int], list[int], list[Any], int, int]:
    """Column values of a batch of records: (kind codes, name codes, ``_ROW_COLUMNS`` + shape codes, X events
    left out, events with a negative duration, taken as 0 long); raises :class:`Slow` (or TypeError / ValueError) on anything :func:`event_row` must judge.

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
            raise Slow
    name_codes = _name_codes(c, names)
    pids, tids = _ids(c, [e.pid for e in evs], [e.tid for e in evs])
    start = us_values_to_ns([e.ts for e in evs])
    dur = us_values_to_ns([e.dur for e in evs])
    negative = zero_negative(dur)  # as event_row: 0 long, counted (by the caller, once the batch is in)
    args = [_EMPTY_ARGS if e.args is None else e.args for e in evs]
    n = len(evs)
    gpu = np.isin(np.array(kinds, np.int8), _GPU_CODES)
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
    raws = [a.input_dims for a in args]
    # record_shapes off (most traces): every Raw is empty -> no per-event work beyond this check
    shape = [c.raw_shape_code(bytes(r)) if len(r) else 0 for r in raws] if any(map(len, raws)) else None
    cols = [pid, tid, dev, stream, start, dur, corr, ext, nbytes, shape]
    return kinds, name_codes, cols, codes.count(-1), negative


def append_rows(c: Columns, kinds: list[int], names: list[int], cols: list[Any]) -> None:
    """Append a batch: ``cols`` are the ``_ROW_COLUMNS`` values, then the shape codes (None: all 0)."""
    # OverflowError here leaves the columns untouched
    typed = [array("q", col.tobytes() if isinstance(col, np.ndarray) else col) for col in cols[:-1]]
    c.kind.extend(array("b", kinds))
    c.name.extend(array("i", names))
    for key, col in zip(_ROW_COLUMNS, typed, strict=True):
        c.cols[key].extend(col)
    c.cols["end_tid"].extend(array("q", [schema.NO_ID]) * len(kinds))
    shape = cols[-1]
    c.shape.extend(array("i", [0]) * len(kinds) if shape is None else array("i", shape))


class KinetoDecoder:
    """Decodes a Kineto file batch by batch into ``columns`` (:class:`Columns`); :meth:`run` yields after each
    batch, so a caller may :meth:`Columns.take` the rows so far and keep memory bounded (streaming ingest).
    After the run, ``reader.meta`` holds the other top-level keys and ``skipped`` the X events left out."""

    def __init__(self, path: str | os.PathLike[str], include_python: bool, *, progress: Any = None) -> None:
        self.path = Path(path)
        self.reader = ChromeTraceReader(self.path, progress=progress)
        self.columns = Columns()
        self.include_python = include_python
        self.skipped = 0

    def run(self) -> Iterator[None]:
        items_seen, saw_event = 0, False  # a list of objects none of which has a "ph" is not a trace
        for first, text, items in self.reader.batches(EVENTS.decode):
            items_seen += len(items)
            if items[0].__class__ is KinetoEvent:
                saw_event = saw_event or any(e.ph is not None for e in items)
                try:
                    kinds, names, cols, skipped, negative = record_rows(
                        items, self.columns, self.include_python
                    )
                    append_rows(self.columns, kinds, names, cols)
                    self.columns.negative_durations += negative
                except (Slow, TypeError, ValueError, OverflowError, msgspec.DecodeError):
                    items = RAWS.decode(text)  # redo the batch event by event: same rows or an exact error
                else:
                    self.skipped += skipped
                    yield
                    continue
            events = [_untyped(self.path, first + i, raw) for i, raw in enumerate(items)]
            saw_event = saw_event or any(type(ev) is dict and "ph" in ev for ev in events)
            self.skipped += _slow_batch(self.path, events, first, self.columns, self.include_python)
            yield
        if items_seen and not saw_event:
            raise TraceFormatError(
                self.path,
                f"none of the {items_seen} items in the event list is a trace event (no 'ph'): not a trace",
            )


def _untyped(path: Path, index: int, raw: msgspec.Raw) -> Any:
    try:
        return ANY.decode(raw)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, f"traceEvents[{index}]: invalid JSON ({exc})") from None
    except RecursionError:
        raise TraceFormatError(path, f"traceEvents[{index}]: {NESTED_TOO_DEEP}") from None


def _slow_batch(path: Path, batch: list[Any], first: int, c: Columns, include_python: bool) -> int:
    """Append the rows of a batch of untyped events one by one; an error names ``traceEvents[first + i]``."""
    rows, skipped = [], 0
    for i, ev in enumerate(batch):
        try:
            row = event_row(ev, c, include_python)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TraceFormatError(path, f"traceEvents[{first + i}]: {exc}") from None
        if row is None:
            skipped += 1 if type(ev) is dict and ev.get("ph") == "X" else 0
        else:
            rows.append(row)
    if rows:
        cols = [list(col) for col in zip(*rows, strict=True)]
        try:
            append_rows(c, cols[0], cols[1], cols[2:])
        except OverflowError:
            raise TraceFormatError(
                path, f"traceEvents[{first}..{first + len(batch) - 1}]: a number does not fit in int64"
            ) from None
    return skipped
