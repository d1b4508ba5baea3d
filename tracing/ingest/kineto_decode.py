"""Kineto file -> :class:`~tracing.ingest.kineto_rows.Columns`, batch by batch; needs numpy, never pandas.

Kept free of pandas so that a whole-process ``mxperf ingest`` can decode a trace while pandas is still being
imported (:mod:`tracing.ingest.prefetch`); :mod:`tracing.ingest.kineto` turns the columns into a table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tracing.ingest import kineto_fast
from tracing.ingest.jsonstream import ChromeTraceReader
from tracing.ingest.kineto_rows import Columns, Slow, append_rows, batch_rows, event_row
from tracing.outputs.errors import TraceFormatError


class KinetoDecoder:
    """Decodes a Kineto file batch by batch into ``columns`` (:class:`Columns`); :meth:`run` yields after each
    batch, so a caller may :meth:`Columns.take` the rows so far and keep memory bounded (streaming ingest).
    After the run, ``reader.meta`` holds the other top-level keys and ``skipped`` the X events left out."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        include_python: bool,
        *,
        fast: bool = kineto_fast.AVAILABLE,
        progress: Any = None,
    ) -> None:
        self.path = Path(path)
        self.reader = ChromeTraceReader(self.path, progress=progress)
        self.columns = Columns()
        self.include_python = include_python
        self.fast = fast
        self.skipped = 0

    def run(self) -> Any:
        path, c, include_python = self.path, self.columns, self.include_python
        first = 0
        saw_event = False  # any item with a "ph": a list of other objects is not a trace, not an empty one
        for batch in self.reader.batches(kineto_fast.decode_batch if self.fast else None):
            skipped, events = add_batch(path, batch, first, c, include_python)
            self.skipped += skipped
            saw_event = saw_event or events
            first += len(batch)
            yield
        if first and not saw_event:
            raise not_a_trace(path, first)


def add_batch(path: Path, batch: list[Any], first: int, c: Columns, include_python: bool) -> tuple[int, bool]:
    """Append a decoded batch's rows to ``c`` (the fast path, else event by event with exact errors naming
    ``traceEvents[first + i]``); returns (X events left out, whether any item has a "ph")."""
    saw_event = any(_has_phase(ev) for ev in batch)
    try:
        kinds, names, cols, skipped = batch_rows(batch, c, include_python)
        append_rows(c, kinds, names, cols)
    except (Slow, AttributeError, TypeError, ValueError, OverflowError):
        skipped = _slow_batch(path, batch, first, c, include_python)
    return skipped, saw_event


def not_a_trace(path: Path, items: int) -> TraceFormatError:
    """A list of ``items`` objects none of which has a "ph": not a trace (rather than an empty one)."""
    return TraceFormatError(
        path, f"none of the {items} items in the event list is a trace event (no 'ph'): not a trace"
    )


def _has_phase(ev: Any) -> bool:
    if type(ev) is dict:
        return "ph" in ev
    return getattr(ev, "ph", None) is not None  # a msgspec record; anything else fails the batch anyway


def _slow_batch(path: Path, batch: list[Any], first: int, c: Columns, include_python: bool) -> int:
    if kineto_fast.is_event_batch(batch):
        batch = [kineto_fast.as_dict(ev) for ev in batch]
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
