"""Stream the ``traceEvents`` array of a Chrome-trace JSON file, one event object at a time.

Why not ``json.load``: a decoded trace costs several times its text size in Python objects (HTA's loader needs
~6 GB for an 800 MB trace). Here the (optionally gzipped) text is read in chunks, decoded incrementally as
UTF-8, and each array item is parsed with the C JSON scanner on its own, so memory holds one chunk plus one
event. Floats are returned as their exact decimal text (``parse_float=str``) so that microsecond timestamps
with a nanosecond fraction convert to int64 ns without float rounding.

This is a real JSON parser, not a line splitter: minified and pretty-printed files give the same events, and
top-level keys may come in any order (``baseTimeNanoseconds`` often follows ``traceEvents``).
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tracing.outputs.errors import TraceFormatError

_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
# A candidate boundary between two event objects: "}" "," "{" (whitespace allowed). A candidate inside a string
# or a nested object makes the batch parse fail, so a batch that parses is made of whole events.
_CUT = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*(?=\{)")
BATCH_SEARCH_CHARS = 64 << 10
CHUNK_BYTES = 1 << 18
MAX_VALUE_CHARS = 256 << 20  # one JSON value (an event, deviceProperties, ...) never needs more


class ChromeTraceReader:
    """Iterate events with :meth:`events`; after exhausting it, ``meta`` holds the other top-level keys.

    With ``raw=True`` the iterator yields ``(event, text)`` where ``text`` is the event's exact JSON text, and
    ``meta_raw`` maps each other top-level key to its JSON text (used to re-emit a trace unchanged).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        raw: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.raw = raw
        self._progress = progress  # called with (file bytes read, file size) after each chunk
        self.meta: dict[str, Any] = {}
        self.meta_raw: dict[str, str] = {}
        self._decoder = json.JSONDecoder(parse_float=str)
        self._scan = self._decoder.scan_once
        self._batch = False
        self._texts = False
        self._fast_decode: Callable[[str], list[Any] | None] | None = None
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self._buf = ""
        self._pos = 0
        self._base = 0  # characters consumed before _buf[0]
        self._bytes_read = 0
        self._eof = False
        self._fh: BinaryIO | None = None

    # -- low level -------------------------------------------------------------------------------------
    def _fail(self, problem: str, offset: int | None = None) -> TraceFormatError:
        where = f" at character {offset} of the JSON text" if offset is not None else ""
        return TraceFormatError(self.path, f"{problem}{where}")

    def _open(self) -> BinaryIO:
        if not self.path.exists():
            raise TraceFormatError(self.path, "no such file")
        if self.path.is_dir():
            raise TraceFormatError(self.path, "is a directory, expected a Kineto .json or .json.gz file")
        fh = self._raw = open(self.path, "rb")  # noqa: SIM115 -- closed in events()
        self._size = os.fstat(fh.fileno()).st_size
        magic = fh.read(2)
        fh.seek(0)
        return gzip.GzipFile(fileobj=fh, mode="rb") if magic == b"\x1f\x8b" else fh  # type: ignore[return-value]

    def _fill(self, min_chars: int = 0) -> bool:
        """Append the next chunk of text to the buffer (dropping what was consumed); False at EOF.

        ``min_chars``: keep reading until at least that much text was added (one join: a value longer than
        a chunk grows the buffer geometrically, so a large value is scanned O(log n) times, not O(n))."""
        if self._eof:
            return False
        parts, added, more = [], 0, True
        while more and (not parts or added < min_chars):
            more = self._read_chunk(parts)
            added += len(parts[-1])
        self._buf = self._buf[self._pos :] + "".join(parts)
        self._base += self._pos
        self._pos = 0
        return more

    def _read_chunk(self, parts: list[str]) -> bool:
        assert self._fh is not None
        try:
            data = self._fh.read(CHUNK_BYTES)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise TraceFormatError(
                self.path,
                f"truncated or corrupt gzip stream after {self._bytes_read} decompressed bytes ({exc})",
            ) from None
        try:
            text = self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            offset = self._bytes_read + exc.start
            if self._bytes_read == 0 and not data[: exc.start].lstrip().startswith((b"{", b"[")):
                raise TraceFormatError(self.path, self._binary_problem()) from None
            raise TraceFormatError(
                self.path, f"not UTF-8 text at byte {offset} of the JSON text (a name with invalid bytes?)"
            ) from None
        self._bytes_read += len(data)
        if self._progress is not None:
            self._progress(self._raw.tell(), self._size)
        if not data:
            self._eof = True
        parts.append(text)
        return bool(data)

    def _binary_problem(self) -> str:
        """What a file that starts with binary data is (not JSON at all, rather than a bad byte in a name)."""
        gzipped = isinstance(self._fh, gzip.GzipFile)
        if gzipped:
            return "gzip-compressed, but what it holds is binary data, not JSON text: not a Kineto trace"
        if self.path.name.endswith(".gz"):
            return "named .gz but not gzip-compressed, and not JSON text (binary data): not a Kineto trace"
        return "binary data, not JSON text: not a Kineto / Chrome trace"

    def _peek(self) -> str:
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _expect(self, ch: str) -> None:
        got = self._peek()
        if got != ch:
            found = repr(got) if got else "end of file"
            raise self._fail(
                f"invalid JSON: expected {ch!r}, found {found} (truncated?)", self._base + self._pos
            )
        self._pos += 1

    def _value(self) -> tuple[Any, str]:
        """Parse one JSON value at the cursor (refilling as needed); returns (value, text or "")."""
        self._peek()
        while True:
            start = self._pos
            try:
                obj, end = self._scan(self._buf, start)
            except StopIteration:
                obj, end, err = None, -1, "invalid JSON: expected a value"
            except json.JSONDecodeError as exc:
                obj, end, err = None, -1, f"invalid JSON ({exc.msg})"
            except RecursionError:
                raise self._fail("JSON nested too deeply", self._base + start) from None
            # A value that ends exactly at the buffer end may be cut (a number): read more and retry.
            if end != -1 and (end < len(self._buf) or self._eof):
                self._pos = end
                return obj, (self._buf[start:end] if self.raw else "")
            if self._eof or len(self._buf) - start > MAX_VALUE_CHARS:
                raise self._fail(err if end == -1 else "truncated JSON", self._base + start)
            self._fill(min_chars=len(self._buf) - start)  # double what is held of this value

    # -- structure -------------------------------------------------------------------------------------
    def events(self) -> Iterator[Any]:
        """Yield each item of ``traceEvents`` (a top-level array is accepted as the event list)."""
        self._fh = self._open()
        try:
            first = self._peek()
            if first == "[":
                yield from self._array_items()
            elif first == "{":
                yield from self._object()
            else:
                found = repr(first) if first else "an empty file"
                raise self._fail(f"not a Chrome trace: expected a JSON object, found {found}", 0)
            if self._peek() != "":
                raise self._fail("invalid JSON: extra data after the top-level value", self._base + self._pos)
        finally:
            self._fh.close()
            self._raw.close()  # a GzipFile does not close the file object it was given

    def batches(self, fast_decode: Callable[[str], list[Any] | None] | None = None) -> Iterator[list[Any]]:
        """Like :meth:`events`, but yields lists of events: runs of whole events are parsed in one C call.

        Much faster than one scanner call per event; memory is bounded by the read chunk. Any batch that does
        not parse cleanly falls back to event-by-event parsing, which reports errors precisely.
        ``fast_decode(text)``, when given, is tried first on each batch's JSON array text; it returns the
        items (of any type the caller understands) or None, and then ``json`` decodes the batch as usual.
        """
        self._batch = True
        self._fast_decode = fast_decode
        return self.events()  # type: ignore[return-value]

    def text_batches(self, validate: Callable[[str], bool] | None = None) -> Iterator[list[str]]:
        """Like :meth:`batches`, but each batch is the JSON array text of whole events, undecoded (for
        decoding elsewhere: another process). ``validate(text)`` may say a batch is valid JSON faster than
        ``json`` decoding it; the cuts are the ones :meth:`batches` makes."""
        self._texts = True
        self.raw = True  # single events keep their text
        return self.batches(None if validate is None else (lambda t: [t] if validate(t) else None))

    def _fast_batch(self) -> list[Any] | None:
        """Parse the whole events between the cursor and the last candidate boundary in the buffer."""
        if len(self._buf) - self._pos < CHUNK_BYTES // 2 and not self._eof:
            self._fill()
        buf, pos = self._buf, self._pos
        window = max(pos, len(buf) - BATCH_SEARCH_CHARS)
        cuts = list(_CUT.finditer(buf, window)) or list(_CUT.finditer(buf, pos))
        for _ in range(6):
            if not cuts:
                return None
            m = cuts.pop()
            end = m.start() + 1
            text = "[" + buf[pos:end] + "]"
            if self._fast_decode is not None:
                items = self._fast_decode(text)
                if items is not None:  # valid JSON for the fast decoder is valid for json: whole events
                    self._pos = m.end()
                    return items
            try:
                items = self._decoder.decode(text)
            except json.JSONDecodeError as exc:
                # Everything before exc.pos parsed: retry with the last boundary before it (this also stops
                # a batch at the end of traceEvents, where "Extra data" follows the closing bracket).
                limit = pos + exc.pos - 1
                cuts = [c for c in cuts if c.start() < limit]
                continue
            except RecursionError:
                return None
            self._pos = m.end()
            return [text] if self._texts else items
        return None

    def _object(self) -> Iterator[Any]:
        self._expect("{")
        seen_events = False
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                key, _ = self._value()
                if not isinstance(key, str):
                    raise self._fail("invalid JSON: object key is not a string", self._base + self._pos)
                self._expect(":")
                if key == "traceEvents":
                    if self._peek() != "[":
                        raise self._fail("traceEvents is not an array", self._base + self._pos)
                    seen_events = True
                    yield from self._array_items()
                else:
                    value, text = self._value()
                    self.meta[key] = value
                    if self.raw:
                        self.meta_raw[key] = text
                sep = self._peek()
                self._pos += 1
                if sep == "}":
                    break
                if sep != ",":
                    found = repr(sep) if sep else "end of file"
                    raise self._fail(
                        f"invalid JSON: expected ',' or '}}', found {found} (truncated?)",
                        self._base + self._pos - 1,
                    )
        if not seen_events:
            raise TraceFormatError(self.path, "no traceEvents array: not a Kineto / Chrome trace")

    def _array_items(self) -> Iterator[Any]:
        self._expect("[")
        if self._peek() == "]":
            self._pos += 1
            return
        raw, batch = self.raw, self._batch
        pause, backoff = 0, 16  # after a failed batch, parse some events one by one (no quadratic retries)
        while True:
            if batch and pause == 0:
                items = self._fast_batch()
                if items is not None:
                    backoff = 16
                    yield items
                    continue
                pause, backoff = backoff, min(backoff * 2, 1 << 16)
            pause = max(pause - 1, 0)
            obj, text = self._value()
            if self._texts:
                yield ["[" + text + "]"]
            else:
                yield [obj] if batch else (obj, text) if raw else obj
            while True:
                m = _SEP.match(self._buf, self._pos)
                if m is not None and (m.end() < len(self._buf) or self._eof):
                    break
                if not self._fill():
                    m = _SEP.match(self._buf, self._pos)
                    break
            if m is None:
                got = self._buf[self._pos : self._pos + 1]
                found = repr(got) if got else "end of file"
                raise self._fail(
                    f"invalid JSON: expected ',' or ']' in traceEvents, found {found} (truncated?)",
                    self._base + self._pos,
                )
            self._pos = m.end()
            if m.group(1) == "]":
                return
