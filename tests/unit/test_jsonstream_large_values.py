"""A large JSON value outside ``traceEvents`` (a rocprof or other tool's dump) is read in a bounded number of
scans (the buffer doubles), not one rescan per chunk: refusing a 40 MB non-Kineto file must not take minutes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tracing.ingest import jsonstream
from tracing.ingest.jsonstream import ChromeTraceReader
from tracing.outputs.errors import TraceFormatError


class CountingReader(ChromeTraceReader):
    """Counts the scanner calls and the characters they were handed (the work a parse does)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.scans = 0
        scan = self._scan

        def counted(text: str, start: int):  # type: ignore[no-untyped-def]
            self.scans += 1
            return scan(text, start)

        self._scan = counted


def _big_value(path: Path, n_items: int, *, with_events: bool) -> int:
    doc: dict[str, object] = {
        "rocprof": [{"name": f"k{i}", "begin": i, "end": i + 1} for i in range(n_items)]
    }
    if with_events:
        doc["traceEvents"] = [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}
        ]
    text = json.dumps(doc)
    path.write_text(text)
    return len(text)


def test_a_large_value_before_trace_events_is_scanned_a_logarithmic_number_of_times(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    size = _big_value(path, 120_000, with_events=True)  # ~5 MB: about 20 read chunks
    chunks = size / jsonstream.CHUNK_BYTES
    assert chunks > 16
    reader = CountingReader(path)
    events = list(reader.events())
    assert len(events) == 1 and len(reader.meta["rocprof"]) == 120_000
    # one scan of the key, then the value: one attempt per doubling of the buffer (+ the event and slack)
    assert reader.scans <= 2 * math.ceil(math.log2(chunks)) + 8, (reader.scans, chunks)


def test_a_large_non_trace_json_is_refused_after_one_pass(tmp_path: Path) -> None:
    path = tmp_path / "rocprof.json"
    _big_value(path, 120_000, with_events=False)
    reader = CountingReader(path)
    with pytest.raises(TraceFormatError, match="no traceEvents array"):
        list(reader.events())
    assert reader.scans < 40
