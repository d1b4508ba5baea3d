"""Kineto events (``json`` dicts or ``kineto_fast`` records) -> growable int64 columns of the event table.

Three paths give the same columns: batches decoded by msgspec into records (:func:`record_rows`), batches
decoded by ``json`` into dicts (:func:`batch_rows`), and, for any batch either meets something unusual in
(they raise :class:`Slow`), event by event (:func:`event_row`), which names the bad field.
"""

from __future__ import annotations

import json
import re
from array import array
from decimal import Decimal, InvalidOperation
from itertools import compress
from typing import Any

import numpy as np

from tracing.ingest.kineto_time import us_text_to_ns, us_values_to_ns
from tracing.outputs import schema

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
_EMPTY: dict[str, Any] = {}
_KIND_CODE_OF_CAT_NO_PY = {cat: k for cat, k in _KIND_CODE_OF_CAT.items() if k != KIND_CODE[schema.PYTHON]}
_GPU_CODE_LIST = sorted(_GPU_CODES)


def as_int(value: Any) -> int:
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


_PLAIN_DIMS = re.compile(rb"[\[\]0-9, \t\n\r]*")  # Input Dims of non-negative ints: canonical = no whitespace
_WHITESPACE = re.compile(rb"[ \t\n\r]+")


def shape_text(value: Any) -> str:
    """``args["Input Dims"]`` (a decoded JSON value) -> its compact JSON text, the ``shapes`` column value."""
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
        self._raw_shapes: dict[bytes, int] = {b"": 0}  # raw text (msgspec) -> code
        self.text_ids: dict[str, int] = {}  # non-integer pid/tid values (e.g. "Spans") -> negative ids

    def __len__(self) -> int:
        return len(self.kind)

    def forget_names(self) -> None:
        """Drop the name -> code map once the caller holds the names as a list (``tracing.streamed``): ~60
        bytes a distinct name (its slot and its code's int object)."""
        self.names = {}

    def take(self) -> dict[str, np.ndarray]:
        """The rows held so far as int64 / int32 / int8 arrays (``name``, ``kind``, ``shapes`` codes and every
        int column); the arrays are emptied, names and shapes stay interned (codes keep their meaning)."""
        out: dict[str, np.ndarray] = {
            k: np.frombuffer(v, dtype=np.int64).copy() for k, v in self.cols.items()
        }
        out["name"] = np.frombuffer(self.name, dtype=np.int32).copy()
        out["kind"] = np.frombuffer(self.kind, dtype=np.int8).copy()
        out["shapes"] = np.frombuffer(self.shape, dtype=np.int32).copy()
        for v in self.cols.values():
            del v[:]
        del self.name[:], self.kind[:], self.shape[:]
        return out

    def extend(self, rows: dict[str, np.ndarray], names: list[str], shapes: list[str]) -> None:
        """Append rows :meth:`take` gave from another :class:`Columns` whose names / shapes were ``names`` /
        ``shapes``: their codes are re-interned here, in the order they first appear there."""
        name_lut = np.array([self.name_code(n) for n in names] or [0], np.int32)
        shape_lut = np.array([self.shapes.setdefault(t, len(self.shapes)) for t in shapes] or [0], np.int32)
        for k, v in self.cols.items():
            v.frombytes(rows[k].astype(np.int64, copy=False).tobytes())
        self.name.frombytes(name_lut[rows["name"]].tobytes())
        self.kind.frombytes(rows["kind"].astype(np.int8, copy=False).tobytes())
        self.shape.frombytes(shape_lut[rows["shapes"]].tobytes())

    def shape_code(self, value: Any) -> int:
        """Code of a decoded ``Input Dims`` value (None: absent -> 0)."""
        if value is None:
            return 0
        text = shape_text(value)
        return self.shapes.setdefault(text, len(self.shapes))

    def raw_shape_code(self, raw: bytes) -> int:
        """Code of an ``Input Dims`` raw JSON text (msgspec); the same code :meth:`shape_code` gives."""
        code = self._raw_shapes.get(raw)
        if code is None:
            if _PLAIN_DIMS.fullmatch(raw):
                text = _WHITESPACE.sub(b"", raw).decode("ascii")
                code = self.shapes.setdefault(text, len(self.shapes))
            else:
                code = self.shape_code(json.loads(raw, parse_float=str))
            self._raw_shapes[raw] = code
        return code

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
    dur = ev.get("dur", 0)
    dur_ns = _field_ns(ev, "dur", 0)
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
        dev, stream = as_int(args.get("device", pid)), as_int(args.get("stream", tid))
        pid = tid = schema.NO_ID
    else:
        dev = stream = schema.NO_ID
    corr = as_int(args.get("correlation", -1))
    ext = as_int(args.get("External id", -1))
    nbytes = as_int(args.get("bytes", -1))
    shape = c.shape_code(args.get("Input Dims"))
    return (code, c.name_code(name), pid, tid, dev, stream, start, dur_ns, corr, ext, nbytes, shape)


def _fast() -> Any:
    """:mod:`kineto_fast` (msgspec), imported by the first batch: a process that only builds tables from
    columns decoded elsewhere (``tracing.ingest.prefetch``) never pays for msgspec's import."""
    from tracing.ingest import kineto_fast

    return kineto_fast


def _ints_or_slow(values: list[Any]) -> list[Any]:
    for v in values:
        if v.__class__ is not int:
            raise Slow
    return values


def batch_rows(
    batch: list[Any], c: Columns, include_python: bool
) -> tuple[list[int], list[int], list[list[int]], int]:
    """The fast path: column lists for a batch of events by list comprehensions; raises Slow on anything odd."""
    if _fast().is_event_batch(batch):
        return record_rows(batch, c, include_python)
    phs = [e.get("ph") for e in batch]  # AttributeError on a non-object -> slow path
    xs = [e for e, ph in zip(batch, phs, strict=True) if ph == "X"]
    codes = [_KIND_CODE_OF_CAT.get(e.get("cat"), -1) for e in xs]
    py = KIND_CODE[schema.PYTHON]
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
            raise Slow
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
    dims = [a.get("Input Dims") for a in args]
    cols.append(
        [0 if d is None else c.shape_code(d) for d in dims] if any(d is not None for d in dims) else None
    )
    return kinds, name_codes, cols, skipped


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
) -> tuple[list[int], list[int], list[Any], int]:
    """:func:`batch_rows` for ``kineto_fast`` records: same values, same Slow cases, numpy columns.

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
    pids = _ints_or_slow([e.pid for e in evs])  # text ("Spans") or absent -> the exact path
    tids = _ints_or_slow([e.tid for e in evs])
    start = us_values_to_ns([e.ts for e in evs])
    dur = us_values_to_ns([e.dur for e in evs])
    if len(dur) and dur.min() < 0:
        raise Slow
    empty = _fast().EMPTY_ARGS
    args = [empty if e.args is None else e.args for e in evs]
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
    raws = [a.input_dims for a in args]
    # record_shapes off (most traces): every Raw is empty -> no per-event work beyond this check
    shape = [c.raw_shape_code(bytes(r)) if len(r) else 0 for r in raws] if any(map(len, raws)) else None
    return kinds, name_codes, [pid, tid, dev, stream, start, dur, corr, ext, nbytes, shape], codes.count(-1)


def _convert(
    c: Columns,
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
    """Raw field values of the kept events -> (name codes, int columns); raises Slow on anything odd."""
    for n in names:
        if n.__class__ is not str:
            raise Slow
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
        raise Slow
    if check_ints:  # json values may be bool/str/float; msgspec records hold ints (or None: TypeError below)
        pids, tids, devs, streams = map(_ints_or_slow, (pids, tids, devs, streams))
        corr, ext, nbytes = map(_ints_or_slow, (corr, ext, nbytes))
    no = schema.NO_ID
    pids = [no if g else p for p, g in zip(pids, gpu, strict=True)]
    tids = [no if g else t for t, g in zip(tids, gpu, strict=True)]
    cols = [pids, tids, devs, streams, starts, durs, corr, ext, nbytes]
    return name_codes, cols


def append_rows(c: Columns, kinds: list[int], names: list[int], cols: list[Any]) -> None:
    """Append a batch: ``cols`` are the ``_ROW_COLUMNS`` values, then the shape codes (None: all 0)."""
    typed = [_int64s(col) for col in cols[:-1]]  # OverflowError here leaves the columns untouched
    c.kind.extend(array("b", kinds))
    c.name.extend(array("i", names))
    for key, col in zip(_ROW_COLUMNS, typed, strict=True):
        c.cols[key].extend(col)
    c.cols["end_tid"].extend(array("q", [schema.NO_ID]) * len(kinds))
    shape = cols[-1]
    c.shape.extend(array("i", [0]) * len(kinds) if shape is None else array("i", shape))


def _int64s(col: Any) -> array:
    if isinstance(col, np.ndarray):
        out = array("q")
        out.frombytes(col.astype(np.int64, copy=False).tobytes())
        return out
    return array("q", col)
