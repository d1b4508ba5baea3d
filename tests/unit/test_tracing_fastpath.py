"""Kineto batches decoded by msgspec into typed records give exactly the table of the event-by-event path.

Each test loads the same file twice -- as ingest does (typed batches, column at a time) and with every batch
redone event by event (untyped events through ``event_row``, the path that names a bad event) -- and compares
every column, the category order, dtypes and meta; for bad input, the errors must be the same text.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracing.ingest import kineto_rows
from tracing.ingest.jsonstream import ChromeTraceReader
from tracing.ingest.kineto import load_kineto_events
from tracing.ingest.kineto_rows import EVENTS, KinetoEvent, Slow
from tracing.outputs.errors import TraceFormatError

DATA = Path(__file__).parent.parent / "data"
KINETO_FILES = sorted(
    [
        *(DATA / "real").glob("*.json.gz"),
        *(DATA / "real").glob("*/*.json.gz"),
        *(DATA / "quirks").glob("*/*.json"),
    ]
)


def _event_by_event(*_: object) -> None:
    raise Slow


def _load(path: Path, fast: bool) -> object:
    with pytest.MonkeyPatch.context() as mp:
        if not fast:
            mp.setattr(kineto_rows, "record_rows", _event_by_event)
        return load_kineto_events(path)


def _outcome(path: Path, fast: bool) -> tuple[str, object]:
    try:
        return "ok", _load(path, fast)
    except TraceFormatError as exc:
        return "error", str(exc)


def assert_same_outcome(path: Path) -> None:
    fast, exact = _outcome(path, True), _outcome(path, False)
    assert fast[0] == exact[0], (fast, exact)
    if fast[0] == "error":
        assert fast[1] == exact[1]
        return
    a, b = fast[1].events, exact[1].events  # type: ignore[union-attr]
    assert list(a.columns) == list(b.columns)
    assert list(a.dtypes) == list(b.dtypes)
    for col in a.columns:
        if isinstance(a[col].dtype, pd.CategoricalDtype):
            assert list(a[col].cat.categories) == list(b[col].cat.categories), col
            assert np.array_equal(a[col].cat.codes.to_numpy(), b[col].cat.codes.to_numpy()), col
        else:
            assert np.array_equal(a[col].to_numpy(), b[col].to_numpy()), col
    assert fast[1].meta == exact[1].meta  # type: ignore[union-attr]
    assert fast[1].rank == exact[1].rank  # type: ignore[union-attr]


def _record_batches(path: Path) -> int:
    """Batches msgspec decoded into records (the rest came back as Raw texts, to be redone event by event)."""
    reader = ChromeTraceReader(path)
    return sum(items[0].__class__ is KinetoEvent for _, _, items in reader.batches(EVENTS.decode))


@pytest.mark.parametrize("path", KINETO_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fast_decoder_gives_identical_table_on_every_real_and_quirk_trace(path):
    assert_same_outcome(path)


def test_fast_decoder_is_actually_used_on_the_real_trace():
    path = DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
    assert _record_batches(path) >= 5  # the A100 trace decodes almost entirely through msgspec


def test_ns_fractions_are_kept():
    path = DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
    assert int(load_kineto_events(path).events["start_ns"].iloc[0]) % 1000 != 0


def _write_trace(tmp_path: Path, events_text: list[str], name: str = "t.json", gz: bool = False) -> Path:
    text = '{"traceEvents": [' + ", ".join(events_text) + '], "baseTimeNanoseconds": 1000}'
    path = tmp_path / (name + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def _kernel(ts: str | None, dur: str = "1.5", **extra: str) -> str:
    args = extra.pop("args", '{"device": 0, "stream": 7, "correlation": 5, "External id": 3}')
    fields = {
        "ph": '"X"',
        "cat": '"kernel"',
        "name": '"k"',
        "pid": "0",
        "tid": "7",
        "ts": ts,
        "dur": dur,
        "args": args,
        **extra,
    }
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items() if v is not None) + "}"


def _filler(n: int) -> list[str]:
    launch = '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, '
    return [launch + f'"ts": {10 + i}.125, "dur": 2.5, "args": {{"correlation": 5}}}}' for i in range(n)]


@pytest.mark.parametrize(
    "ts",
    [
        "4458676522690.655",  # > 2^42 us: a double can't hold the ns digit
        "9007199254740993.001",  # > 2^53
        "123456789012345678.999",  # 1.2e20 ns: beyond int64, the same error on both paths
        "12.3455",  # 4 decimals: half-even at 0.5 ns
        "12.3465",
        "1.0e3",
        "-0.0",
        "7",
        '"12.345"',  # number as a JSON string
        '"1.000\\n2.000"',  # a string holding a newline: would add a line to the bulk parse
        '" 1.500"',
        '"1_0.500"',
        "1234567890123456.789",  # 16 digits: beyond the bulk parser's bound, still fits int64 ns
        "999999999999999.999",  # the largest the bulk parser takes
        "-5.500",
        "0.000",
    ],
)
def test_timestamps_convert_exactly_like_the_event_by_event_path(tmp_path, ts):
    path = _write_trace(tmp_path, [*_filler(50), _kernel(ts)])
    assert_same_outcome(path)


def test_batch_mixing_integer_and_decimal_timestamps_matches_event_by_event(tmp_path):
    ints = [f.replace(".125", "").replace("2.5", "3") for f in _filler(30)]
    assert_same_outcome(_write_trace(tmp_path, [*_filler(30), *ints, _kernel("7"), _kernel("8.25")]))


@pytest.mark.parametrize("fast", [True, False])
def test_a_negative_duration_is_kept_as_0_long_and_counted(tmp_path, fast):
    # pytorch/kineto#646: an end time of 0 gave events a large negative dur; one such event must not make the
    # whole trace unreadable, nor shorten or lengthen anything else
    path = _write_trace(
        tmp_path, [*_filler(50), _kernel("7.5", "-7.5"), _kernel("9", "-0.001"), _kernel("10")]
    )
    t = _load(path, fast)
    k = t.events[t.events["kind"] == "kernel"]
    assert k["dur_ns"].tolist() == [0, 0, 1500] and k["start_ns"].tolist()[:2] == [1000 + 7500, 1000 + 9000]
    assert t.meta["negative_durations"] == 2
    assert_same_outcome(path)


def test_big_timestamp_keeps_every_ns_digit(tmp_path):
    path = _write_trace(tmp_path, [*_filler(50), _kernel("4458676522690.655", "0.001")])
    ev = load_kineto_events(path).events
    k = ev[ev["kind"] == "kernel"]
    assert int(k["start_ns"].iloc[0]) == 4458676522690655 + 1000
    assert int(k["dur_ns"].iloc[0]) == 1


@pytest.mark.parametrize(
    "event",
    [
        _kernel("1.5", name='"bad \\ud800 name"'),  # lone surrogate: not JSON text
        _kernel("NaN"),  # not JSON
        _kernel("1.5", dur="null"),
        _kernel("1.5", dur="-2.0"),
        _kernel("1.5", args="[1, 2]"),
        _kernel("1.5", args="null"),
        _kernel("1.5", args='{"device": null, "stream": 7}'),
        _kernel("1.5", args='{"correlation": 1.5}'),
        _kernel("1.5", args='{"stream": "7", "device": "0"}'),
        _kernel("1.5", pid='"Spans"', cat='"cpu_op"'),
        _kernel("1.5", name="17"),
        _kernel("1.5", cat='["kernel"]'),
        _kernel(None),  # no ts
        _kernel("1.5", pid=None),  # no pid on a GPU row whose args name the device
        _kernel("1.5", tid="true"),
        _kernel("1.5", args='{"device": 0, "stream": 7, "External id": 12345678901234567890}'),
        '{"ph": "X", "cat": "kernel", "ts": 1, "ts": 2.5, "dur": 1, "dur": 3, "name": "d", "pid": 0, "tid": 1}',
        '{"ph": "X", "cat": "kernel", "\\u0074s": 3.25, "dur": 1, "name": "esc", "pid": 0, "tid": 1}',
        "5",
        "[]",
    ],
)
def test_unusual_events_give_the_same_table_or_the_same_error(tmp_path, event):
    for gz in (False, True):
        assert_same_outcome(_write_trace(tmp_path, [*_filler(40), event, *_filler(40)], gz=gz))


@pytest.mark.parametrize(
    "event",
    [
        '{"ph": "X", "cat": "kernel", "ts": 1, "ts": 2.5, "dur": 1, "name": "d", "pid": 0, "tid": 1}',
        '{"ph": "X", "cat": "kernel", "\\u0074s": 3.25, "dur": 1, "name": "esc", "pid": 0, "tid": 1}',
        _kernel("1.5", args="null"),
    ],
)
def test_duplicate_and_escaped_keys_are_decoded_into_records_as_untyped(tmp_path, event):
    path = _write_trace(tmp_path, [*_filler(40), event, *_filler(40)])
    assert _record_batches(path) >= 1  # the batch holding the event went through msgspec
    assert_same_outcome(path)


def test_a_batch_the_typed_decoder_rejects_is_redone_event_by_event(tmp_path):
    odd = '{"ph": "M", "name": "thread_name", "pid": 9, "tid": 9, "args": {"device": "gpu0"}}'  # not an int
    path = _write_trace(tmp_path, [*_filler(30), odd, *_filler(30)])
    first = next(ChromeTraceReader(path).batches(EVENTS.decode))
    assert first[0] == 0 and len(first[2]) > 31 and first[2][0].__class__ is not KinetoEvent  # Raw texts
    ref = _write_trace(tmp_path, [*_filler(30), *_filler(30)], name="ref.json")
    pd.testing.assert_frame_equal(load_kineto_events(path).events, load_kineto_events(ref).events)


def test_minified_and_pretty_traces_give_the_same_table(tmp_path):
    src = DATA / "real" / "hta_sampled_2rank" / "rank-1.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()), parse_float=str)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(gzip.decompress(src.read_bytes()).decode())
    minified = tmp_path / "min.json"
    minified.write_text(json.dumps(doc, separators=(",", ":")).replace('"ts":"', '"ts":'))
    a, b = load_kineto_events(pretty).events, _load(pretty, fast=False).events  # type: ignore[attr-defined]
    assert a.equals(b)
    assert_same_outcome(minified)


_field = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    st.sampled_from(['"x"', "null", "true", "[]", "{}", '"Spans"', "1e3", "-0.0", '"1.5"']),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ts=_field,
    dur=_field,
    pid=_field,
    device=_field,
    corr=_field,
    cat=st.sampled_from(['"kernel"', '"cpu_op"', '"cuda_runtime"', '"gpu_memcpy"', '"python_function"', "1"]),
)
def test_random_field_values_give_the_same_outcome(tmp_path, ts, dur, pid, device, corr, cat):
    args = f'{{"device": {device}, "correlation": {corr}, "bytes": 64}}'
    event = _kernel(ts, dur, pid=pid, cat=cat, args=args)
    assert_same_outcome(_write_trace(tmp_path, [*_filler(20), event, *_filler(20)]))


def test_text_pids_and_tids_stay_on_the_typed_path_with_the_same_table(tmp_path):
    """Kineto builds of 2021 (the kineto samples' ResNet-50) write every tid as text ("1890023232"); such
    batches are decoded as records, with text ids in event order exactly as one by one."""
    ops = [
        _kernel(f"{20 + i}.5", cat='"cpu_op"', tid='"1890023232"' if i % 2 else '"Spans"', pid='"4242"')
        for i in range(40)
    ]
    path = _write_trace(tmp_path, [*_filler(20), *ops, _kernel("90.5", tid='"7"'), *_filler(20)])
    assert _record_batches(path) >= 1
    with pytest.MonkeyPatch.context() as mp:  # no batch falls back to the event-by-event path
        mp.setattr(kineto_rows, "_slow_batch", _event_by_event)
        fast = load_kineto_events(path).events
    assert set(fast["tid"]) >= {1890023232, -2} and set(fast["pid"]) >= {4242}
    assert_same_outcome(path)
