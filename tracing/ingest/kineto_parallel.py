"""One Kineto file decoded by several processes: this process reads, the others decode; the same rows.

    this process:  gunzip -> UTF-8 -> the reader's cuts (``ChromeTraceReader.text_batches``, validated by a
                   msgspec scan that builds no objects) -> pieces of ~4 MB of JSON text, in order
    workers:       piece -> events (msgspec / json) -> rows (``kineto_rows``), with their own name codes
    this process:  rows re-interned in piece order (names and shapes keep their first-appearance order)

Decoding an event is most of the ingest's time and needs nothing from other events, so it spreads over
processes; reading a gzip stream cannot (one sequential inflate), and bounds the speed-up (module
``tracing.streamed``, docs/tracing.md). Anything unusual in a piece -- an event the exact path would
name in an error, a text pid -- makes :class:`Fallback` propagate, and the caller reads the file serially,
which gives the same table or the exact error.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tracing.ingest import kineto_fast
from tracing.ingest.jsonstream import ChromeTraceReader
from tracing.ingest.kineto_decode import _has_phase, _slow_batch
from tracing.ingest.kineto_rows import Columns, Slow, append_rows, batch_rows
from tracing.outputs.errors import TraceFormatError

PIECE_CHARS = 4 << 20  # JSON text per task: large enough that pickling and IPC stay small against decoding

try:
    import msgspec

    _VALIDATE = msgspec.json.Decoder(list[msgspec.Raw])
except ImportError:  # pragma: no cover
    _VALIDATE = None


class Fallback(Exception):
    """A piece needs the serial reader (its exact error, or ids that depend on the whole file)."""


def _valid(text: str) -> bool:
    """Valid JSON by a scan that builds no event objects (msgspec); False sends the batch to ``json``."""
    if _VALIDATE is None:
        return False
    try:
        _VALIDATE.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def decode_piece(texts: list[str], include_python: bool, fast: bool) -> dict[str, Any] | None:
    """A worker's task: JSON array texts -> rows with local codes; None when the serial reader must do it."""
    c = Columns()
    skipped = items = 0
    saw_event = False
    decoder = json.JSONDecoder(parse_float=str)
    for text in texts:
        batch = kineto_fast.decode_batch(text) if fast else None
        if batch is None:
            batch = decoder.decode(text)
        items += len(batch)
        saw_event = saw_event or any(_has_phase(ev) for ev in batch)
        try:
            kinds, names, cols, n = batch_rows(batch, c, include_python)
            append_rows(c, kinds, names, cols)
            skipped += n
        except (Slow, AttributeError, TypeError, ValueError, OverflowError):
            try:
                skipped += _slow_batch(Path("-"), batch, 0, c, include_python)
            except TraceFormatError:
                return None  # the error names the event's index in the whole file: the serial reader's
    if c.text_ids:
        return None  # text pids ("Spans") get ids by first appearance in the whole file
    return {
        "rows": c.take(),
        "names": list(c.names),
        "shapes": list(c.shapes),
        "skipped": skipped,
        "items": items,
        "saw_event": saw_event,
    }


class ParallelKinetoDecoder:
    """:class:`tracing.ingest.kineto_decode.KinetoDecoder` with the decoding spread over ``workers`` processes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        include_python: bool,
        workers: int,
        *,
        fast: bool = kineto_fast.AVAILABLE,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.reader = ChromeTraceReader(self.path, progress=progress)
        self.columns = Columns()
        self.include_python, self.workers, self.fast = include_python, workers, fast
        self.skipped = 0
        self._items = 0
        self._saw_event = False

    def _merge(self, future: Future) -> None:
        got = future.result()
        if got is None:
            raise Fallback(str(self.path))
        self.columns.extend(got["rows"], got["names"], got["shapes"])
        self.skipped += got["skipped"]
        self._items += got["items"]
        self._saw_event = self._saw_event or got["saw_event"]

    def run(self) -> Iterator[None]:
        """Yields after each piece's rows are appended to ``columns`` (in file order)."""
        with ProcessPoolExecutor(max_workers=self.workers) as pool:
            pending: deque[Future] = deque()
            texts: list[str] = []
            size = 0
            for batch in self.reader.text_batches(_valid):
                texts += batch
                size += sum(map(len, batch))
                if size < PIECE_CHARS:
                    continue
                pending.append(pool.submit(decode_piece, texts, self.include_python, self.fast))
                texts, size = [], 0
                while len(pending) > 2 * self.workers:  # bounded: a few pieces in flight
                    self._merge(pending.popleft())
                    yield
            if texts:
                pending.append(pool.submit(decode_piece, texts, self.include_python, self.fast))
            while pending:
                self._merge(pending.popleft())
                yield
        if self._items and not self._saw_event:
            raise TraceFormatError(
                self.path,
                f"none of the {self._items} items in the event list is a trace event (no 'ph'): not a trace",
            )
