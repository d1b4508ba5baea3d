"""A large JSON value outside ``traceEvents`` (a rocprof or other tool's dump) is read in a bounded number of
scans (the buffer doubles), not one rescan per chunk: refusing a 40 MB non-Kineto file must not take minutes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest

from tracing.ingest import jsonstream
from tracing.ingest.jsonstream import ChromeTraceReader
from tracing.outputs.errors import TraceFormatError

_RAW = msgspec.json.Decoder(msgspec.Raw)


class Counting:
    """Wraps the reader's one-value decoder: counts its calls and the bytes they were handed."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0

    def decode(self, buf: memoryview) -> object:
        self.calls += 1
        self.bytes += len(buf)
        return _RAW.decode(buf)


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


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Counting:
    monkeypatch.setattr(jsonstream, "CHUNK_BYTES", 1 << 18)
    counter = Counting()
    monkeypatch.setattr(jsonstream, "RAW", counter)
    return counter


def test_a_large_value_before_trace_events_is_scanned_a_logarithmic_number_of_times(
    tmp_path: Path, counting: Counting
) -> None:
    path = tmp_path / "dump.json"
    size = _big_value(path, 120_000, with_events=True)  # ~5 MB: about 20 read chunks
    chunks = size / jsonstream.CHUNK_BYTES
    assert chunks > 16
    reader = ChromeTraceReader(path)
    events = [ev for _, _, items in reader.batches(jsonstream.RAWS.decode) for ev in items]
    assert len(events) == 1 and len(reader.meta["rocprof"]) == 120_000
    # the key, then the value: one attempt per doubling of the buffer (+ the event and slack)
    assert counting.calls <= 2 * math.ceil(math.log2(chunks)) + 8, (counting.calls, chunks)
    assert counting.bytes <= 4 * size, (counting.bytes, size)


def test_a_large_non_trace_json_is_refused_after_one_pass(tmp_path: Path, counting: Counting) -> None:
    path = tmp_path / "rocprof.json"
    size = _big_value(path, 120_000, with_events=False)
    with pytest.raises(TraceFormatError, match="no traceEvents array"):
        list(ChromeTraceReader(path).batches(jsonstream.RAWS.decode))
    assert counting.calls < 40
    assert counting.bytes <= 4 * size, (counting.bytes, size)
