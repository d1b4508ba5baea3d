"""One Kineto file decoded by K processes while this one spills, writes and analyses: the same rows.

    decoder i of K:  gunzip -> the reader's batch cuts (``ChromeTraceReader.text_batches``) -> for batch j
                     with j % K == i only: events -> rows with its own name codes (the serial reader's code,
                     batch by batch)
    this process:    batch j's rows from decoder j % K, in file order, names and shapes re-interned -> the
                     stream (spill, event Parquet, GPU ops) while the decoders go on

Every decoder inflates and cuts the whole file -- the cheap part, ~20 % of decoding -- and turns only its
share of the batches into rows, the expensive part; nothing is cut or copied as text between processes
(which made the earlier split, with this process cutting and validating, lose: docs/tracing.md). Batch cuts,
rows, chunk boundaries and name / shape codes are exactly the one-process reader's: the reader takes the
last candidate cut of its window when the text up to it is valid JSON, which the batch's owner checks by
decoding it (anything else fails over, below), and a batch's names new to a decoder are in their order of
first appearance in the batch, so re-interning them in batch order here gives the serial codes. The
speed-up is bounded by each decoder's pass over the whole file and by what this process does after
decoding (the analysis; the event Parquet is written beside it, ``tracing.outputs.background``); measured
figures in docs/tracing.md.

Anything a decoder cannot settle alone -- an error (its message names the event's index in the whole file),
text pids ("Spans": ids by first appearance in the file), a decoder that dies -- raises :class:`Fallback`,
and the caller reads the file in one process: the same tables, or the exact error. Decoders are forked on
Linux (as the local process pool is), spawned elsewhere.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tracing.outputs.background import AVAILABLE as FORK
from tracing.outputs.background import start_with_pipe

MESSAGE_ROWS = 1 << 16  # a decoder sends its batches' rows in messages of about this many rows
_START_METHOD = "fork" if FORK else "spawn"  # macOS frameworks are not fork-safe
_ROWS, _END, _FAIL = "rows", "end", "fail"


class Fallback(Exception):
    """The decoders did not deliver the whole file: read it in one process (same tables, or its exact error)."""


class _Meta:
    """What ``tracing.streamed`` reads from ``decoder.reader``: the file's other top-level keys."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}


class _Rows:
    """The part of :class:`~tracing.ingest.kineto_rows.Columns` the stream uses: rows not yet taken, and the
    names and shapes interned so far (serial codes)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.shapes: dict[str, int] = {"": 0}
        self._parts: list[dict[str, np.ndarray]] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def forget_names(self) -> None:
        """Drop the name -> code map once the caller holds the names as a list (``tracing.streamed``): ~60
        bytes a distinct name (its slot and its code's int object)."""
        self.names = {}

    def add(self, part: dict[str, np.ndarray]) -> None:
        self._parts.append(part)
        self._rows += len(part["kind"])

    def take(self) -> dict[str, np.ndarray]:
        from tracing.ingest.kineto_rows import Columns

        parts, self._parts, self._rows = self._parts, [], 0
        if not parts:
            return Columns().take()  # no rows: the columns and dtypes of any chunk
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class _Decoder:
    """This process's end of one decoder: its batches in order, with their rows in serial codes."""

    def __init__(
        self,
        ctx: Any,
        target: Callable[..., None],
        args: tuple[Any, ...],
        rows: _Rows,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.proc, self.recv = start_with_pipe(ctx, target, args, "mxperf-decode")
        self.rows, self.progress = rows, progress
        self.name_lut = np.zeros(0, np.int32)  # its codes -> serial codes
        self.shape_lut = np.zeros(1, np.int32)  # shape 0 ("") is 0 on both sides
        self.batches: deque[tuple[int, list[str], list[str]]] = deque()  # (rows, new names, new shapes)
        self.part: dict[str, np.ndarray] = {}
        self.at = 0  # rows of ``part`` already handed on
        self.end: tuple[Any, ...] | None = None

    def _receive(self) -> None:
        try:
            head = pickle.loads(self.recv.recv_bytes())
        except (EOFError, OSError, pickle.UnpicklingError):
            raise Fallback("a decoder process stopped") from None
        if head[0] == _FAIL:
            raise Fallback(head[1])
        if head[0] == _END:
            self.end = head
            return
        _, batches, layout, done = head
        if done is not None and self.progress is not None:
            self.progress(*done)
        self.batches.extend(batches)
        self.part, self.at = {}, 0
        for key, dtype, nbytes in layout:
            buf = bytearray(nbytes)
            if nbytes:
                self.recv.recv_bytes_into(buf)
            self.part[key] = np.frombuffer(buf, dtype=dtype)

    def next_batch(self) -> bool:
        """Hand this decoder's next batch to ``rows``; False once it has none left."""
        while not self.batches:
            if self.end is not None:
                return False
            self._receive()
        n, names, shapes = self.batches.popleft()
        if names:
            serial = self.rows.names
            new = [serial.setdefault(name, len(serial)) for name in names]
            self.name_lut = np.concatenate([self.name_lut, np.array(new, np.int32)])
        if shapes:
            serial = self.rows.shapes
            new = [serial.setdefault(text, len(serial)) for text in shapes]
            self.shape_lut = np.concatenate([self.shape_lut, np.array(new, np.int32)])
        a, self.at = self.at, self.at + n
        part = {k: v[a : self.at] for k, v in self.part.items()}
        part["name"] = self.name_lut[part["name"]]
        part["shapes"] = self.shape_lut[part["shapes"]]
        self.rows.add(part)
        return True

    def close(self) -> None:
        self.recv.close()
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


class ShardedKinetoDecoder:
    """:class:`~tracing.ingest.kineto_decode.KinetoDecoder`'s interface (``run``, ``columns``, ``reader.meta``,
    ``skipped``) with the batches decoded by ``workers`` other processes (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        include_python: bool,
        workers: int,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.include_python, self.workers, self.progress = include_python, max(1, workers), progress
        self.reader = _Meta()
        self.columns = _Rows()
        self.skipped = 0

    def run(self) -> Iterator[None]:
        """Yields after each batch is appended to ``columns`` (in file order, as the serial reader does)."""
        from tracing.ingest.kineto_fast import AVAILABLE

        ctx = multiprocessing.get_context(_START_METHOD)
        decoders: list[_Decoder] = []
        try:
            for i in range(self.workers):
                args = (str(self.path), self.include_python, AVAILABLE, self.workers, i, i == 0)
                decoders.append(_Decoder(ctx, _decode_shard, args, self.columns, self.progress))
        except OSError as exc:  # no process to spare
            for d in decoders:
                d.close()
            raise Fallback(f"{self.path}: no decoder process ({exc})") from None
        try:
            j = 0
            while decoders[j % self.workers].next_batch():
                j += 1
                yield
            for d in decoders:  # every batch handed on: each decoder's closing message, nothing else
                while d.end is None and not d.batches:
                    d._receive()
                if d.batches or d.end[1] != j:  # type: ignore[index]
                    raise Fallback(f"{self.path}: the decoders disagree on the batches")
            ends = [d.end for d in decoders]
            self.reader.meta = ends[0][4]  # type: ignore[index]
            self.skipped = sum(e[2] for e in ends)  # type: ignore[index]
            items, saw_event = sum(e[3][0] for e in ends), any(e[3][1] for e in ends)  # type: ignore[index]
        finally:
            for d in decoders:
                d.close()
        if items and not saw_event:
            from tracing.ingest.kineto_decode import not_a_trace

            raise not_a_trace(self.path, items)


def _decode_shard(
    out: Any, path: str, include_python: bool, fast: bool, workers: int, me: int, reports: bool
) -> None:
    """Decoder ``me`` of ``workers``: every batch cut, its own batches decoded, rows sent in batch order."""
    import signal

    from tracing.ingest import kineto_fast
    from tracing.ingest.jsonstream import ChromeTraceReader
    from tracing.ingest.kineto_decode import add_batch
    from tracing.ingest.kineto_rows import Columns

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's: it stops this process
    c = Columns()
    pending: list[tuple[int, list[str], list[str]]] = []
    sent_names, sent_shapes = 0, 1
    skipped = items = 0
    saw_event = False
    decoder = json.JSONDecoder(parse_float=str)
    done: list[tuple[int, int] | None] = [None]

    def read(at: int, size: int) -> None:
        done[0] = (at, size)

    def send() -> None:
        rows = c.take()
        layout = [(k, v.dtype.str, v.nbytes) for k, v in rows.items()]
        out.send_bytes(pickle.dumps((_ROWS, pending[:], layout, done[0]), pickle.HIGHEST_PROTOCOL))
        for v in rows.values():
            if v.nbytes:
                out.send_bytes(memoryview(v).cast("B"))
        pending.clear()

    try:
        try:
            reader = ChromeTraceReader(Path(path), progress=read if reports else None)
            j = 0
            for texts in reader.text_batches(_accept):
                mine = j % workers == me
                j += 1
                if not mine:
                    continue
                before = len(c)
                for text in texts:
                    batch = kineto_fast.decode_batch(text) if fast else None
                    if batch is None:
                        batch = decoder.decode(text)
                    # an error here names this decoder's own event count: it falls back, and the
                    # one-process reader raises it with the index in the whole file
                    n, events = add_batch(Path(path), batch, items, c, include_python)
                    items += len(batch)
                    skipped += n
                    saw_event = saw_event or events
                if c.text_ids:
                    raise Fallback("text pids: ids by first appearance in the whole file")
                # names / shapes new in this batch (the lists are built only when there are any)
                names = list(c.names)[sent_names:] if len(c.names) > sent_names else []
                shapes = list(c.shapes)[sent_shapes:] if len(c.shapes) > sent_shapes else []
                pending.append((len(c) - before, names, shapes))
                sent_names, sent_shapes = len(c.names), len(c.shapes)
                if len(c) >= MESSAGE_ROWS:
                    send()
            send()
        except Exception as exc:  # the caller reads the file itself: the exact error, or the same rows
            out.send_bytes(pickle.dumps((_FAIL, f"{path}: {type(exc).__name__}: {exc}")))
            return
        meta = reader.meta if reports else None
        out.send_bytes(pickle.dumps((_END, j, skipped, (items, saw_event), meta), pickle.HIGHEST_PROTOCOL))
    except OSError:  # the caller stopped reading (its own error, Ctrl-C)
        return
    finally:
        out.close()


def _accept(text: str) -> bool:
    """Take the reader's first candidate cut without checking it: the batch's owner decodes its text and
    fails the file over to one process when it is not valid JSON -- the only case where the one-process
    reader would have cut elsewhere. Every other decoder only skips past the batch."""
    return True
