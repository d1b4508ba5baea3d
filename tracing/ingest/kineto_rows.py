"""Kineto file -> growable int64 columns of the event table, batch by batch (:class:`KinetoDecoder`).

One path for every batch: msgspec decodes it into :class:`KinetoEvent` records holding only the keys the table
reads (any JSON value in them), and :func:`record_rows` converts it a column at a time -- the usual values in
bulk, anything else value by value, where a value the table cannot take is an error naming the event and the
field (:class:`BadEvent`).
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Callable, Iterator
from decimal import Decimal, InvalidOperation
from itertools import compress
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from tracing.ingest.jsonstream import ANY, NESTED_TOO_DEEP, ChromeTraceReader
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
_GPU_CODES = frozenset(
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


_VALUE = list | str | int | float | bool | None  # any JSON value but an object (an error where one is needed)


class KinetoArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the event table reads, any JSON value each (checked a column at a time)."""

    device: Any = msgspec.UNSET  # absent: the event's pid (a JSON null is an error)
    stream: Any = msgspec.UNSET  # absent: the event's tid
    correlation: Any = -1
    external_id: Any = msgspec.field(default=-1, name="External id")
    bytes: Any = -1
    # record_shapes=True: kept as raw JSON text, canonicalized once per distinct text
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")


class KinetoEvent(msgspec.Struct, gc=False):
    """One ``traceEvents`` item, reduced to the keys the event table reads (every other key is skipped in C).

    Floats arrive as their exact decimal text (``float_hook=str``), integers of any size as ints; duplicate
    keys keep the last value and escaped key names are unescaped, as in an untyped decode."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = 0
    args: KinetoArgs | _VALUE = None


EVENTS = msgspec.json.Decoder(list[KinetoEvent | _VALUE], float_hook=str)
EVENT = msgspec.json.Decoder(KinetoEvent | _VALUE, float_hook=str)
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
        self.negative_durations = 0  # X events whose dur < 0 (taken as 0 long): see :func:`record_rows`

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

    def raw_shape_code(self, raw: bytes) -> int:
        """Code of an ``Input Dims`` raw JSON text, interned as its compact JSON text (null: 0, none)."""
        code = self._raw_shapes.get(raw)
        if code is None:
            if _PLAIN_DIMS.fullmatch(raw):
                text = _WHITESPACE.sub(b"", raw).decode("ascii")
            else:
                value = ANY.decode(raw)
                text = "" if value is None else msgspec.json.encode(value).decode()
            code = self._raw_shapes[raw] = self.shapes.setdefault(text, len(self.shapes))
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
_INT64 = (-(2**63), 2**63 - 1)


class BadEvent(Exception):
    """An event the table cannot take: its position in the batch and why (the caller names the file)."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index = index


def _convert(key: str, values: list[Any], pos: list[int], convert: Callable[[Any], int]) -> np.ndarray:
    """The ``key`` values as int64: ints in bulk, anything else through :func:`_each`."""
    if all(v.__class__ is int for v in values):
        try:
            return np.array(values, np.int64)
        except OverflowError:  # named by _each
            pass
    return _each(key, values, pos, convert)


def _each(key: str, values: list[Any], pos: list[int], convert: Callable[[Any], int]) -> np.ndarray:
    """Each value through ``convert``; the first it rejects, or that does not fit int64, raises
    :class:`BadEvent` at its position ``pos[i]``."""
    out = []
    for i, v in enumerate(values):
        try:
            x = convert(v)
        except (TypeError, ValueError) as exc:
            raise BadEvent(pos[i], str(exc)) from None
        if not _INT64[0] <= x <= _INT64[1]:
            raise BadEvent(pos[i], f"'{key}': {v!r} does not fit in int64")
        out.append(x)
    return np.array(out, np.int64)


def _us_field(key: str, floor: int | None = None) -> Callable[[Any], int]:
    """One ``key`` value (microseconds) in ns, at least ``floor``; an error names the field."""

    def convert(value: Any) -> int:
        if value is None:
            raise ValueError(f"'{key}' is missing (microseconds expected)")
        try:
            ns = us_text_to_ns(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"'{key}': {exc}") from None
        ns = ns if floor is None else max(ns, floor)
        if not _INT64[0] <= ns <= _INT64[1]:
            raise ValueError(f"'{key}': {value!r} us does not fit in int64 ns")
        return ns

    return convert


# a negative duration of any size is kept 0 long and counted (record_rows): -1 stands for it
_TS, _DUR = _us_field("ts"), _us_field("dur", floor=-1)


def _ns(key: str, values: list[Any], pos: list[int], convert: Callable[[Any], int]) -> np.ndarray:
    """Microsecond values -> int64 ns, in bulk where they allow it (:func:`us_values_to_ns`)."""
    try:
        return us_values_to_ns(values)
    except (TypeError, ValueError, OverflowError):
        return _each(key, values, pos, convert)


def _kind_codes(batch: list[Any], lut: dict[str, int]) -> list[int]:
    """Per item: its kind code, -1 for an X event left out (another category), -2 for any other event."""
    try:
        return [lut.get(e.cat, -1) if e.ph == "X" else -2 for e in batch]
    except (AttributeError, TypeError):  # an item that is not an object, or a category that is not text
        pass
    for i, e in enumerate(batch):
        if e.__class__ is not KinetoEvent:
            raise BadEvent(i, f"event is a {type(e).__name__}, not an object")
    return [(lut.get(e.cat, -1) if e.cat.__class__ is str else -1) if e.ph == "X" else -2 for e in batch]


def record_rows(
    batch: list[Any], c: Columns, include_python: bool
) -> tuple[list[int], list[int], list[Any], int, int]:
    """Column values of a batch of records: (kind codes, name codes, ``_ROW_COLUMNS`` + shape codes, X events
    left out, events with a negative duration, taken as 0 long: pytorch/kineto#646).

    Each column is checked in the order an event's fields are (ts, dur, args, name, pid / tid, device / stream,
    correlation, External id, bytes): the first value a column rejects raises :class:`BadEvent`."""
    codes = _kind_codes(batch, _KIND_CODE_OF_CAT if include_python else _KIND_CODE_OF_CAT_NO_PY)
    keep = [k >= 0 for k in codes]
    evs = list(compress(batch, keep))
    pos = list(compress(range(len(batch)), keep))
    kinds = [k for k in codes if k >= 0]
    start = _ns("ts", [e.ts for e in evs], pos, _TS)
    dur = _ns("dur", [e.dur for e in evs], pos, _DUR)
    negative = zero_negative(dur)
    args = [_EMPTY_ARGS if e.args is None else e.args for e in evs]
    for i, a in enumerate(args):
        if a.__class__ is not KinetoArgs:
            raise BadEvent(pos[i], "args is not an object")
    names = [e.name for e in evs]
    for i, n in enumerate(names):
        if n.__class__ is not str:
            raise BadEvent(pos[i], f"name is {type(n).__name__}, not a string")
    pids, tids = _ids(c, [e.pid for e in evs], [e.tid for e in evs], pos)
    no = schema.NO_ID
    dev, stream = np.full(len(evs), no, np.int64), np.full(len(evs), no, np.int64)
    g = [i for i, k in enumerate(kinds) if k in _GPU_CODES]
    if g:  # GPU rows: args.device / args.stream, else pid / tid; their own pid / tid: none
        g_pos, unset = [pos[i] for i in g], msgspec.UNSET
        dev[g] = _convert(
            "device", [pids[i] if args[i].device is unset else args[i].device for i in g], g_pos, as_int
        )
        stream[g] = _convert(
            "stream", [tids[i] if args[i].stream is unset else args[i].stream for i in g], g_pos, as_int
        )
        for i in g:
            pids[i] = tids[i] = no
    pid, tid = _convert("pid", pids, pos, int), _convert("tid", tids, pos, int)
    corr = _convert("correlation", [a.correlation for a in args], pos, as_int)
    ext = _convert("External id", [a.external_id for a in args], pos, as_int)
    nbytes = _convert("bytes", [a.bytes for a in args], pos, as_int)
    raws = [a.input_dims for a in args]
    # record_shapes off (most traces): every Raw is empty -> no per-event work beyond this check
    shape = [c.raw_shape_code(bytes(r)) if len(r) else 0 for r in raws] if any(map(len, raws)) else None
    cols = [pid, tid, dev, stream, start, dur, corr, ext, nbytes, shape]
    return kinds, _name_codes(c, names), cols, codes.count(-1), negative


def _ids(c: Columns, pids: list[Any], tids: list[Any], pos: list[int]) -> tuple[list[int], list[int]]:
    """pid and tid values as ints: integers as they are, text ids (``"1890023232"``, ``"Spans"``) through
    :meth:`Columns.id_of` in event order (pid then tid), so each text id gets one code whatever the batch."""
    if all(v.__class__ is int for v in pids) and all(v.__class__ is int for v in tids):
        return list(pids), list(tids)
    pairs = []
    for i, (p, t) in enumerate(zip(pids, tids, strict=True)):
        try:
            pairs.append((c.id_of(p), c.id_of(t)))
        except TypeError as exc:
            raise BadEvent(pos[i], str(exc)) from None
    return [p for p, _ in pairs], [t for _, t in pairs]


def _name_codes(c: Columns, names: list[str]) -> list[int]:
    """Codes of ``names``; names new to ``c`` are interned in order of first appearance."""
    get = c.names.get
    codes = [get(n) for n in names]
    if None in codes:
        for n in dict.fromkeys(compress(names, [x is None for x in codes])):
            c.names.setdefault(n, len(c.names))
        codes = [get(n) for n in names]
    return codes


def append_rows(c: Columns, kinds: list[int], names: list[int], cols: list[Any]) -> None:
    """Append a batch: ``cols`` are the ``_ROW_COLUMNS`` int64 arrays, then the shape codes (None: all 0)."""
    c.kind.extend(array("b", kinds))
    c.name.extend(array("i", names))
    for key, col in zip(_ROW_COLUMNS, cols[:-1], strict=True):
        c.cols[key].extend(array("q", col.tobytes()))
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
        for first, _, items in self.reader.batches(EVENTS.decode):
            if items[0].__class__ is msgspec.Raw:  # not valid JSON as a whole: decode the events one by one
                items = [self._event(first + i, raw) for i, raw in enumerate(items)]
            items_seen += len(items)
            saw_event = saw_event or any(e.__class__ is KinetoEvent and e.ph is not None for e in items)
            try:
                kinds, names, cols, skipped, negative = record_rows(items, self.columns, self.include_python)
            except BadEvent as exc:
                bad = self._first_bad(items, exc)
                raise TraceFormatError(self.path, f"traceEvents[{first + bad.index}]: {bad}") from None
            append_rows(self.columns, kinds, names, cols)
            self.columns.negative_durations += negative
            self.skipped += skipped
            yield
        if items_seen and not saw_event:
            raise TraceFormatError(
                self.path,
                f"none of the {items_seen} items in the event list is a trace event (no 'ph'): not a trace",
            )

    def _first_bad(self, items: list[Any], exc: BadEvent) -> BadEvent:
        """The first bad event of a batch (columns are checked one after another: an earlier event may be
        bad in a later column)."""
        while exc.index > 0:
            try:
                record_rows(items[: exc.index], Columns(), self.include_python)
            except BadEvent as earlier:
                exc = earlier
                continue
            break
        return exc

    def _event(self, index: int, raw: msgspec.Raw) -> Any:
        try:
            return EVENT.decode(raw)
        except msgspec.DecodeError as exc:
            raise TraceFormatError(self.path, f"traceEvents[{index}]: invalid JSON ({exc})") from None
        except RecursionError:
            raise TraceFormatError(self.path, f"traceEvents[{index}]: {NESTED_TOO_DEEP}") from None
