"""Optional fast decoding of Kineto event batches with ``msgspec`` (used when it is installed).

Why: Python's C JSON decoder builds a dict for every event and every ``args`` object, and that is about half
of the Kineto ingest time. ``msgspec`` decodes a batch straight into small typed records holding only the
keys the event table needs (``ph cat name pid tid ts dur`` and five ``args`` keys); every other key is
skipped in C (``args["Input Dims"]``, with ``record_shapes=True``, is kept as its raw text and canonicalized
once per distinct text). It is faster on the same text (benchmarks/RESULTS.md) and gives the same values:

- Floats arrive as their exact decimal text (``float_hook=str``), integers of any size as Python ints, so
  microseconds still convert to int64 ns with no float rounding -- no float fast path is needed.
- Duplicate keys keep the last value (as ``json`` does); escaped key names are unescaped.
- Absent keys get the default the exact path uses (``dur`` -> 0, ``args`` -> None, an absent ``args.device``
  -> None, i.e. "use pid"; a JSON ``null`` there fails the batch over to ``json``); an explicit ``null``
  elsewhere stays ``None``.
- Anything ``msgspec`` rejects or decodes differently from ``json`` -- ``NaN``, lone surrogate escapes, an
  event that is not an object, ``args`` that is not an object, an id in ``args`` that is not a JSON
  integer (``"7"``, ``7.0``, ``true``, ``null``) -- makes :func:`decode_batch` return None, and
  the caller decodes that batch with ``json`` (same table or the same exact error as without ``msgspec``).

Without ``msgspec`` (:data:`AVAILABLE` is False), or with ``MXPERF_KINETO_DECODER=json`` in the environment,
ingest uses ``json`` only and gives the same table, just slower.
"""

from __future__ import annotations

import json
import os
from typing import Any

DECODER_ENV = "MXPERF_KINETO_DECODER"

try:
    import msgspec
except ImportError:  # pragma: no cover -- exercised when the optional package is absent
    msgspec = None  # type: ignore[assignment]
if os.environ.get(DECODER_ENV) == "json":  # force the json-only path (benchmarks, debugging)
    msgspec = None  # type: ignore[assignment]

AVAILABLE = msgspec is not None

if msgspec is not None:

    class KinetoArgs(msgspec.Struct, frozen=True, gc=False):
        """The ``args`` keys the event table reads; defaults are what the exact path uses when absent."""

        device: int = None  # type: ignore[assignment]  # None: absent (use pid); a JSON null fails
        stream: int = None  # type: ignore[assignment]
        correlation: int = -1
        external_id: int = msgspec.field(default=-1, name="External id")
        bytes: int = -1
        # record_shapes=True: kept as raw JSON text, decoded only once per distinct text (kineto_rows)
        input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")

    class KinetoEvent(msgspec.Struct, gc=False):
        """One ``traceEvents`` item, reduced to the keys the event table reads.

        Integer fields are typed: a value of another type fails the batch over to ``json``.
        """

        ph: Any = None
        cat: Any = None
        name: Any = None
        pid: int | str | None = None  # a text pid ("Spans") or a missing one -> the exact path
        tid: int | str | None = None
        ts: Any = None
        dur: Any = 0
        args: KinetoArgs | None = None

    EMPTY_ARGS = KinetoArgs()  # an event without ``args``
    _DECODER = msgspec.json.Decoder(list[KinetoEvent], float_hook=str)
    _ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError)
else:  # pragma: no cover
    KinetoEvent = KinetoArgs = EMPTY_ARGS = None  # type: ignore[assignment,misc]
    _DECODER = None
    _ERRORS = ()


def decode_batch(text: str) -> list[Any] | None:
    """``"[{...}, {...}]"`` -> a list of :class:`KinetoEvent`, or None when msgspec can't (or isn't there)."""
    if _DECODER is None:
        return None
    try:
        return _DECODER.decode(text)
    except _ERRORS:
        return None


def is_event_batch(batch: list[Any]) -> bool:
    """True for a batch produced by :func:`decode_batch` (records), False for ``json`` dicts."""
    return KinetoEvent is not None and len(batch) > 0 and batch[0].__class__ is KinetoEvent


def as_dict(ev: Any) -> dict[str, Any]:
    """A record -> the dict the exact path reads (same values for every key it reads)."""
    d = {f: getattr(ev, f) for f in ("ph", "cat", "name", "pid", "tid", "ts", "dur")}
    a = ev.args
    if a is not None:
        args = {"correlation": a.correlation, "External id": a.external_id, "bytes": a.bytes}
        if len(a.input_dims):
            args["Input Dims"] = json.loads(bytes(a.input_dims), parse_float=str)
        if a.device is not None:
            args["device"] = a.device
        if a.stream is not None:
            args["stream"] = a.stream
        d["args"] = args
    else:
        d["args"] = None
    return d
