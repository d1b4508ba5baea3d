"""Read a Chrome-trace JSON file (plain or gzip) in bounded memory, every value decoded by msgspec.

Not one ``decode`` of the file: decoded, a trace costs several times its text in Python objects (HTA's loader
needs ~6 GB for an 800 MB trace). The bytes are read in chunks and ``traceEvents`` handed out a batch of whole
events at a time: the text up to the last candidate cut between two events (``}`` ``,`` ``{``) is decoded as
one JSON array; a cut inside a string or a nested object leaves invalid JSON, and then an earlier one is tried.
A single value (a top-level key's value, an event no cut isolates) is delimited by msgspec itself: decoded as
:class:`msgspec.Raw` from its first byte, it stops with "trailing characters" just past its end. Top-level
keys may come in any order (``baseTimeNanoseconds`` often follows ``traceEvents``); a top-level array is read
as the event list, whose closing ``]`` may be missing (Chrome's JSON Array Format allows it, a trailing
comma too); an unclosed ``traceEvents`` or an event cut short is truncation.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from tracing.outputs.errors import TraceFormatError

_WS = re.compile(rb"[ \t\n\r]*")
_CUT = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*(?=\{)")  # a candidate boundary between two event objects
_AT_BYTE = re.compile(r"^(?:JSON is malformed: )?(.*?)(?: \(byte (\d+)\))?$")  # msgspec's DecodeError text
_TRUNCATED = "Input data was truncated"
_BOM = b"\xef\xbb\xbf"
BATCH_SEARCH_BYTES = 64 << 10  # candidate cuts are looked for in this tail of the buffer
CHUNK_BYTES = 1 << 18
MAX_VALUE_BYTES = 256 << 20  # one JSON value (an event, deviceProperties, ...) never needs more
NESTED_TOO_DEEP = "invalid JSON: arrays / objects nested too deeply to decode: not a Kineto / Chrome trace"

ANY = msgspec.json.Decoder(float_hook=str)  # floats as their exact decimal text
RAW = msgspec.json.Decoder(msgspec.Raw)
RAWS = msgspec.json.Decoder(list[msgspec.Raw])  # a batch's events, each as its exact JSON text


class ChromeTraceReader:
    """:meth:`batches` yields ``traceEvents``; after it is exhausted, ``meta`` holds the other top-level keys
    (decoded, floats as text) and ``meta_raw`` their exact JSON text."""

    def __init__(
        self, path: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
    ) -> None:
        self.path = Path(path)
        self._progress = progress  # called with (file bytes read, file size) after each chunk
        self.meta: dict[str, Any] = {}
        self.meta_raw: dict[str, str] = {}
        self._buf = b""
        self._pos = 0
        self._base = 0  # bytes consumed before _buf[0]
        self._eof = False

    def batches(self, decode: Callable[[bytes], list[Any]]) -> Iterator[tuple[int, bytes, list[Any]]]:
        """Yield ``(index of the first event, text, items)`` per batch: ``text`` is a JSON array of whole
        events, ``items`` is ``decode(text)``, or where that raises a :class:`msgspec.DecodeError`, the events
        as :class:`msgspec.Raw` (the caller decodes them one by one to name the bad one)."""
        self._fh = self._open()
        try:
            first = self._peek()
            if first == b"\xef" and self._buf.startswith(_BOM, self._pos):  # a UTF-8 byte order mark
                self._pos += len(_BOM)  # (RFC 8259 8.1: a parser may ignore it; Windows editors write it)
                first = self._peek()
            if first == b"[":
                yield from self._array(decode, open_end=True)
            elif first == b"{":
                yield from self._object(decode)
            else:
                raise self._not_json(first)
            if self._peek():
                raise self._fail("invalid JSON: extra data after the top-level value", self._pos)
        except RecursionError:  # msgspec's depth limit: arrays / objects nested ~1000 deep
            raise TraceFormatError(self.path, NESTED_TOO_DEEP) from None
        finally:
            self._fh.close()
            self._raw.close()  # a GzipFile does not close the file object it was given

    # -- bytes ------------------------------------------------------------------------------------------
    def _open(self) -> BinaryIO:
        if not self.path.exists():
            raise TraceFormatError(self.path, "no such file")
        if self.path.is_dir():
            raise TraceFormatError(self.path, "is a directory, expected a Kineto .json or .json.gz file")
        fh = self._raw = open(self.path, "rb")  # noqa: SIM115 -- closed in batches()
        self._size = os.fstat(fh.fileno()).st_size
        gz = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        return gzip.GzipFile(fileobj=fh, mode="rb") if gz else fh  # type: ignore[return-value]

    def _fill(self, min_bytes: int = 0) -> bool:
        """Drop what was consumed and append at least one chunk (``min_bytes`` in all); False at EOF."""
        parts: list[bytes] = []
        while not self._eof and (not parts or sum(map(len, parts)) < min_bytes):
            try:
                data = self._fh.read(CHUNK_BYTES)
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                done = self._base + len(self._buf) + sum(map(len, parts))
                raise TraceFormatError(
                    self.path, f"truncated or corrupt gzip stream after {done} decompressed bytes ({exc})"
                ) from None
            if self._progress is not None:
                self._progress(self._raw.tell(), self._size)
            self._eof = not data
            parts.append(data)
        self._buf = self._buf[self._pos :] + b"".join(parts)
        self._base += self._pos
        self._pos = 0
        return any(parts)

    def _fail(self, problem: str, pos: int) -> TraceFormatError:
        return TraceFormatError(self.path, f"{problem} at byte {self._base + pos} of the JSON text")

    def _not_json(self, first: bytes) -> TraceFormatError:
        head = self._buf[self._pos : self._pos + 4096]
        try:
            head.decode()
        except UnicodeDecodeError as exc:
            if exc.start < len(head) - 3:  # not a multi-byte character cut at the end: binary data
                if isinstance(self._fh, gzip.GzipFile):
                    why = (
                        "gzip-compressed, but what it holds is binary data, not JSON text: not a Kineto trace"
                    )
                elif self.path.name.endswith(".gz"):
                    why = "named .gz but not gzip-compressed, and not JSON text (binary data): not a Kineto trace"
                else:
                    why = "binary data, not JSON text: not a Kineto / Chrome trace"
                return TraceFormatError(self.path, why)
        found = repr(first.decode(errors="replace")) if first else "an empty file"
        return self._fail(f"not a Chrome trace: expected a JSON object, found {found}", self._pos)

    def _peek(self) -> bytes:
        """The next non-whitespace byte (b"" at EOF), not consumed."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos : self._pos + 1]
            if not self._fill():
                return b""

    def _expect(self, chars: bytes, where: str) -> bytes:
        got = self._peek()
        if not got or got not in chars:
            want = " or ".join(repr(c) for c in chars.decode())
            found = repr(got.decode(errors="replace")) if got else "end of file"
            raise self._fail(f"invalid JSON: expected {want}{where}, found {found} (truncated?)", self._pos)
        self._pos += 1
        return got

    def _value(self, what: str = "") -> bytes:
        """The exact text of the JSON value at the cursor (reading more as needed); the cursor moves past it."""
        self._peek()
        while True:
            start, size = self._pos, len(self._buf) - self._pos
            try:
                RAW.decode(memoryview(self._buf)[start:])  # the whole rest is this value: read on (a number?)
                end = len(self._buf) if self._eof else -1
            except msgspec.DecodeError as exc:
                problem, at = _AT_BYTE.match(str(exc)).groups()  # type: ignore[union-attr]
                # the buffer may end inside the value (msgspec says "truncated", or "invalid number" near the end)
                cut = not self._eof and (problem == _TRUNCATED or int(at or 0) > size - 8)
                if problem == "trailing characters" and at:  # at: 1 + the offset of the first byte after it
                    end = start + int(at) - 1
                elif cut:
                    end = -1
                elif problem == _TRUNCATED:
                    raise self._fail(
                        f"{what}truncated JSON: the file ends in the value starting", start
                    ) from None
                else:
                    raise self._fail(f"{what}invalid JSON ({problem})", start + int(at or 0)) from None
            if end >= 0:
                self._pos = end
                return self._buf[start:end].rstrip(b" \t\n\r")
            if size > MAX_VALUE_BYTES:
                raise self._fail(f"{what}a JSON value longer than {MAX_VALUE_BYTES >> 20} MB", start)
            self._fill(min_bytes=size)  # double what is held of this value: O(log n) scans of a long one

    def _decoded(self, text: bytes, what: str) -> Any:
        try:
            return ANY.decode(text)
        except msgspec.DecodeError as exc:  # e.g. invalid UTF-8 in a string (Raw does not check it)
            raise self._fail(f"{what}invalid JSON ({exc})", self._pos - len(text)) from None

    # -- structure --------------------------------------------------------------------------------------
    def _object(self, decode: Callable[[bytes], list[Any]]) -> Iterator[tuple[int, bytes, list[Any]]]:
        self._pos += 1
        seen_events = False
        sep = b"," if self._peek() != b"}" else self._expect(b"}", "")
        while sep == b",":
            key = self._decoded(self._value(), "")
            if not isinstance(key, str):
                raise self._fail("invalid JSON: object key is not a string", self._pos)
            self._expect(b":", " after a key")
            if key == "traceEvents":
                if self._peek() != b"[":
                    raise self._fail("traceEvents is not an array", self._pos)
                seen_events = True
                yield from self._array(decode)
            else:
                text = self._value(f"{key}: ")
                self.meta[key] = self._decoded(text, f"{key}: ")
                self.meta_raw[key] = text.decode()
            sep = self._expect(b",}", "")
        if not seen_events:
            raise TraceFormatError(self.path, "no traceEvents array: not a Kineto / Chrome trace")

    def _array(
        self, decode: Callable[[bytes], list[Any]], open_end: bool = False
    ) -> Iterator[tuple[int, bytes, list[Any]]]:
        """``open_end``: the file may end where the closing ``]`` (or the event after a comma) would be."""
        self._pos += 1
        first, sep = 0, b"," if self._peek() != b"]" else self._expect(b"]", "")
        while sep == b"," and not (open_end and not self._peek()):
            batch = self._batch(decode)
            if batch is None:  # no cut found: one event, then its separator
                text = b"[" + self._value(f"traceEvents[{first}]: ") + b"]"
                batch = text, _items(decode, text)
                sep = b"]" if open_end and not self._peek() else self._expect(b",]", " in traceEvents")
            yield first, *batch
            first += len(batch[1])

    def _batch(self, decode: Callable[[bytes], list[Any]]) -> tuple[bytes, list[Any]] | None:
        """The whole events between the cursor and the last candidate cut that gives valid JSON."""
        if len(self._buf) - self._pos < CHUNK_BYTES // 2:
            self._fill()
        buf, pos = self._buf, self._pos
        cuts = list(_CUT.finditer(buf, max(pos, len(buf) - BATCH_SEARCH_BYTES))) or list(
            _CUT.finditer(buf, pos)
        )
        for _ in range(6):
            if not cuts:
                return None
            m = cuts.pop()
            text = b"".join((b"[", memoryview(buf)[pos : m.start() + 1], b"]"))
            try:
                items = _items(decode, text)
            except msgspec.DecodeError as exc:  # the cut (or the data) is bad: try one before the error
                at = _AT_BYTE.match(str(exc)).group(2)  # type: ignore[union-attr]
                cuts = [c for c in cuts if at is None or c.start() < pos + int(at) - 1]
                continue
            self._pos = m.end()
            return text, items
        return None


def _items(decode: Callable[[bytes], list[Any]], text: bytes) -> list[Any]:
    """``decode(text)``, else the events as Raw texts; a DecodeError means ``text`` is not valid JSON."""
    try:
        return decode(text)
    except msgspec.DecodeError:
        return RAWS.decode(text)
