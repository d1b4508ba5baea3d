"""Kineto file -> :class:`~tracing.ingest.kineto_rows.Columns`, batch by batch; needs numpy, never pandas.

:mod:`tracing.ingest.kineto` turns the columns into a pandas table, :mod:`tracing.ingest.decoded` into Parquet.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from tracing.ingest.jsonstream import ANY, NESTED_TOO_DEEP, RAWS, ChromeTraceReader
from tracing.ingest.kineto_rows import EVENTS, Columns, KinetoEvent, Slow, append_rows, event_row, record_rows
from tracing.outputs.errors import TraceFormatError


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
