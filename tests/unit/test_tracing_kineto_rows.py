"""Kineto events with unusual values: the row each gives, or the one-line error naming the event and field.

Every batch goes one way (msgspec records, converted a column at a time); these pin what that way gives for the
values real traces and broken files hold: exact ns from decimal text, text pids, absent and null fields, values
of the wrong kind, numbers beyond int64, items that are not events.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracing.ingest.jsonstream import ChromeTraceReader
from tracing.ingest.kineto import load_kineto_events
from tracing.ingest.kineto_rows import EVENTS, KinetoEvent, as_int
from tracing.ingest.kineto_time import us_text_to_ns
from tracing.outputs.errors import TraceFormatError

DATA = Path(__file__).parent.parent / "data"
BASE_NS = 1000  # the traces below say baseTimeNanoseconds: 1000
ROW = ("name", "pid", "tid", "device", "stream", "start_ns", "dur_ns", "correlation", "external_id")


def _write_trace(tmp_path: Path, events_text: list[str], name: str = "t.json", gz: bool = False) -> Path:
    text = '{"traceEvents": [' + ", ".join(events_text) + '], "baseTimeNanoseconds": 1000}'
    path = tmp_path / (name + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def _kernel(ts: str | None, dur: str = "1.5", **extra: str | None) -> str:
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


def _odd_row(tmp_path: Path, event: str, *, gz: bool = False) -> dict[str, Any] | str:
    """The row of ``event`` (placed between 40 ordinary launches), or the error text after the file name."""
    path = _write_trace(tmp_path, [*_filler(40), event, *_filler(40)], gz=gz)
    try:
        ev = load_kineto_events(path).events
    except TraceFormatError as exc:
        return str(exc).removeprefix(f"{path}: ")
    rows = ev[ev["name"] != "cudaLaunchKernel"]
    assert len(ev) - len(rows) == 80  # the launches around it are all there
    return (
        {c: (str(v) if c == "name" else int(v)) for c, v in rows[list(ROW)].iloc[0].items()}
        if len(rows)
        else {}
    )


def _record_batches(path: Path) -> int:
    """Batches msgspec decoded into records (the rest: not valid JSON as a whole)."""
    reader = ChromeTraceReader(path)
    return sum(items[0].__class__ is KinetoEvent for _, _, items in reader.batches(EVENTS.decode))


def test_the_real_trace_decodes_as_records_with_ns_fractions():
    path = DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
    assert _record_batches(path) >= 5
    assert int(load_kineto_events(path).events["start_ns"].iloc[0]) % 1000 != 0


def _json_value(text: str) -> Any:
    return json.loads(text, parse_float=str)


@pytest.mark.parametrize(
    "ts",
    [
        "4458676522690.655",  # > 2^42 us: a double can't hold the ns digit
        "9007199254740993.001",  # > 2^53
        "12.3455",  # 4 decimals: half-even at 0.5 ns
        "12.3465",
        "1.0e3",
        "-0.0",
        "7",
        '"12.345"',  # number as a JSON string
        '" 1.500"',
        '"1_0.500"',
        "1234567890123456.789",  # 16 digits: beyond the bulk parser's bound, still fits int64 ns
        "999999999999999.999",  # the largest the bulk parser takes
        "-5.500",
        "0.000",
    ],
)
def test_a_timestamp_in_a_batch_converts_exactly_as_alone(tmp_path, ts):
    path = _write_trace(tmp_path, [*_filler(50), _kernel(ts)])
    ev = load_kineto_events(path).events
    assert int(ev[ev["kind"] == "kernel"]["start_ns"].iloc[0]) == BASE_NS + us_text_to_ns(_json_value(ts))


@pytest.mark.parametrize(
    ("ts", "error"),
    [
        (
            "123456789012345678.999",
            "traceEvents[50]: 'ts': '123456789012345678.999' us does not fit in int64 ns",
        ),
        ('"1.000\\n2.000"', "traceEvents[50]: 'ts': not a finite number: '1.000\\n2.000'"),
    ],
)
def test_a_timestamp_that_is_no_int64_ns_is_an_error_naming_the_event(tmp_path, ts, error):
    with pytest.raises(TraceFormatError) as exc:
        load_kineto_events(_write_trace(tmp_path, [*_filler(50), _kernel(ts)]))
    assert str(exc.value).endswith(error)


def test_integer_microseconds_beyond_int64_ns_are_an_error_not_microseconds(tmp_path):
    ints = [f.replace(".125", "").replace("2.5", "3") for f in _filler(30)]
    with pytest.raises(
        TraceFormatError, match=r"traceEvents\[30\]: 'ts': 9300000000000000 us does not fit in int64 ns$"
    ):
        load_kineto_events(_write_trace(tmp_path, [*ints, _kernel("9300000000000000", "1")]))


def test_a_batch_mixing_integer_and_decimal_timestamps(tmp_path):
    ints = [f.replace(".125", "").replace("2.5", "3") for f in _filler(30)]
    ev = load_kineto_events(
        _write_trace(tmp_path, [*_filler(30), *ints, _kernel("7"), _kernel("8.25")])
    ).events
    assert ev["start_ns"].tolist() == [
        BASE_NS + ns for ns in [10_125 + 1000 * i for i in range(30)] + [10_000 + 1000 * i for i in range(30)]
    ] + [BASE_NS + 7000, BASE_NS + 8250]
    assert ev["dur_ns"].tolist() == [2500] * 30 + [3000] * 30 + [1500, 1500]


def test_a_negative_duration_is_kept_as_0_long_and_counted(tmp_path):
    # pytorch/kineto#646: an end time of 0 gave events a large negative dur; one such event must not make the
    # whole trace unreadable, nor shorten or lengthen anything else -- whatever its size
    huge = "-123456789012345678901234"
    path = _write_trace(
        tmp_path,
        [*_filler(50), _kernel("7.5", "-7.5"), _kernel("9", "-0.001"), _kernel("10"), _kernel("11", huge)],
    )
    t = load_kineto_events(path)
    k = t.events[t.events["kind"] == "kernel"]
    assert k["dur_ns"].tolist() == [0, 0, 1500, 0] and k["start_ns"].tolist()[:2] == [
        1000 + 7500,
        1000 + 9000,
    ]
    assert t.meta["negative_durations"] == 3


def test_big_timestamp_keeps_every_ns_digit(tmp_path):
    path = _write_trace(tmp_path, [*_filler(50), _kernel("4458676522690.655", "0.001")])
    ev = load_kineto_events(path).events
    k = ev[ev["kind"] == "kernel"]
    assert int(k["start_ns"].iloc[0]) == 4458676522690655 + 1000
    assert int(k["dur_ns"].iloc[0]) == 1


# a GPU row: no tid; its pid, the launching process's (the launches around it: pid 9, correlation 5)
_K = {"name": "k", "pid": 9, "tid": -1, "device": 0, "stream": 7, "start_ns": 2500, "dur_ns": 1500}


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (_kernel("1.5"), {**_K, "correlation": 5, "external_id": 3}),
        (_kernel("1.5", args="null"), {**_K, "device": 0, "stream": 7, "correlation": -1, "external_id": -1}),
        (_kernel("1.5", args='{"correlation": 1.5}'), "traceEvents[40]: expected an integer, got '1.5'"),
        (
            _kernel("1.5", args='{"correlation": "12", "device": "1.0"}'),
            {**_K, "device": 1, "correlation": 12, "external_id": -1},
        ),
        (_kernel("1.5", args='{"stream": "7", "device": "0"}'), {**_K, "correlation": -1, "external_id": -1}),
        (
            _kernel("1.5", args='{"device": null, "stream": 7}'),
            "traceEvents[40]: expected an integer, got None",
        ),
        (_kernel("1.5", args='{"device": true}'), "traceEvents[40]: expected an integer, got True"),
        (_kernel("1.5", args="[1, 2]"), "traceEvents[40]: args is not an object"),
        (
            _kernel("1.5", args='{"device": 0, "External id": 12345678901234567890}'),
            "traceEvents[40]: 'External id': 12345678901234567890 does not fit in int64",
        ),
        (_kernel("1.5", dur="null"), "traceEvents[40]: 'dur' is missing (microseconds expected)"),
        (_kernel("1.5", dur='"abc"'), "traceEvents[40]: 'dur': not a finite number: 'abc'"),
        (_kernel("1.5", dur="-2.0"), {**_K, "dur_ns": 0, "correlation": 5, "external_id": 3}),
        (_kernel(None), "traceEvents[40]: 'ts' is missing (microseconds expected)"),
        (_kernel("1.5", name="17"), "traceEvents[40]: name is int, not a string"),
        (
            _kernel("1.5", pid='"Spans"', cat='"cpu_op"', args="{}"),
            {**_K, "pid": -2, "tid": 7, "device": -1, "stream": -1, "correlation": -1, "external_id": -1},
        ),
        (
            _kernel("1.5", pid='"4242"', tid='"-3"', cat='"cpu_op"', args="{}"),
            {**_K, "pid": 4242, "tid": -3, "device": -1, "stream": -1, "correlation": -1, "external_id": -1},
        ),
        (
            _kernel("1.5", pid=None, cat='"cpu_op"'),
            "traceEvents[40]: pid/tid must be an integer or a string, got NoneType",
        ),
        (  # even on a GPU row whose args name its device
            _kernel("1.5", pid=None),
            "traceEvents[40]: pid/tid must be an integer or a string, got NoneType",
        ),
        (_kernel("1.5", tid="true"), "traceEvents[40]: pid/tid must be an integer or a string, got bool"),
        (
            _kernel("1.5", pid="123456789012345678901", cat='"cpu_op"'),
            "traceEvents[40]: 'pid': 123456789012345678901 does not fit in int64",
        ),
        (_kernel("1.5", cat='["kernel"]'), {}),  # not a category the table knows: left out
        (_kernel("1.5", ph='"B"'), {}),  # not a complete event
        (_kernel("1.5", cat='"python_function"'), {}),  # left out unless include_python
        (
            '{"ph": "X", "cat": "kernel", "ts": 1, "ts": 2.5, "dur": 1, "dur": 3, "name": "d", "pid": 0, "tid": 1}',
            {
                **_K,
                "name": "d",
                "device": 0,
                "stream": 1,
                "start_ns": 3500,
                "dur_ns": 3000,
                "correlation": -1,
                "external_id": -1,
            },
        ),
        (
            '{"ph": "X", "cat": "kernel", "\\u0074s": 3.25, "dur": 1, "name": "esc", "pid": 0, "tid": 1}',
            {
                **_K,
                "name": "esc",
                "device": 0,
                "stream": 1,
                "start_ns": 4250,
                "dur_ns": 1000,
                "correlation": -1,
                "external_id": -1,
            },
        ),
        (
            '{"ph": "M", "name": "thread_name", "pid": 9, "tid": 9, "args": {"device": "gpu0"}}',
            {},
        ),  # never read
        (_kernel("1.5", name='"bad \\ud800 name"'), "traceEvents[40]: invalid JSON"),
        (_kernel("NaN"), "traceEvents[40]: invalid JSON"),
        ("5", "traceEvents[40]: event is a int, not an object"),
        ("[]", "traceEvents[40]: event is a list, not an object"),
    ],
)
def test_an_unusual_event_gives_its_row_or_an_error_naming_it(tmp_path, event, expected):
    for gz in (False, True):
        got = _odd_row(tmp_path, event, gz=gz)
        if isinstance(expected, str):
            assert isinstance(got, str) and got.startswith(expected), got
        else:
            assert got == expected


def test_an_error_names_the_first_bad_event_of_a_batch(tmp_path):
    # the later event is bad in an earlier column (ts) than the first one (name)
    path = _write_trace(
        tmp_path, [*_filler(10), _kernel("1.5", name="17"), *_filler(5), _kernel(None), *_filler(10)]
    )
    with pytest.raises(TraceFormatError, match=r"traceEvents\[10\]: name is int, not a string$"):
        load_kineto_events(path)


def test_minified_and_pretty_traces_give_the_same_table(tmp_path):
    src = DATA / "real" / "hta_sampled_2rank" / "rank-1.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()), parse_float=str)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(gzip.decompress(src.read_bytes()).decode())
    minified = tmp_path / "min.json"
    minified.write_text(json.dumps(doc, separators=(",", ":")).replace('"ts":"', '"ts":'))
    a, b, c = (load_kineto_events(p).events for p in (pretty, minified, src))
    assert a.equals(b) and a.equals(c)


def test_text_pids_and_tids_get_codes_in_event_order(tmp_path):
    """Kineto builds of 2021 (the kineto samples' ResNet-50) write every tid as text ("1890023232"); a text id
    that is not a number gets a negative code, in order of first appearance (pid before tid)."""
    ops = [
        _kernel(f"{20 + i}.5", cat='"cpu_op"', tid='"1890023232"' if i % 2 else '"Spans"', pid='"4242"')
        for i in range(40)
    ]
    path = _write_trace(
        tmp_path, [*_filler(20), *ops, _kernel("90.5", pid='"Main"', cat='"cpu_op"'), *_filler(20)]
    )
    ev = load_kineto_events(path).events
    cpu = ev[ev["kind"] == "cpu_op"]
    assert cpu["tid"].tolist()[:2] == [-2, 1890023232] and cpu["pid"].tolist() == [4242] * 40 + [-3]


_field = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    st.sampled_from(['"x"', "null", "true", "[]", "{}", '"Spans"', "1e3", "-0.0", '"1.5"', '"12"']),
)


def _expected(ts: str, dur: str, pid: str, device: str, corr: str, cat: str) -> dict[str, Any] | str | None:
    """The row the table should hold, "error" where it should refuse the event, None where it leaves it out."""
    gpu = {'"kernel"': True, '"gpu_memcpy"': True, '"cpu_op"': False, '"cuda_runtime"': False}.get(cat)
    if gpu is None:
        return None
    p, d = _json_value(pid), _json_value(dur)
    try:
        start = us_text_to_ns(_json_value(ts))
        d = None if d is None else max(us_text_to_ns(d), 0)
        dev, c = as_int(_json_value(device)) if gpu else -1, as_int(_json_value(corr))
    except (TypeError, ValueError):
        return "error"
    if d is None or not (type(p) is int or isinstance(p, str)):
        return "error"
    p = int(p) if isinstance(p, str) and p.lstrip("-").isdigit() else (-2 if isinstance(p, str) else p)
    if not all(-(2**63) <= v < 2**63 for v in (start, d, dev, c, *([] if gpu else [p]))):
        return "error"
    row = {"pid": p, "tid": 7, "device": -1, "stream": -1}
    if gpu:  # no pid / tid of its own; the launching process's pid where it names a device
        row = {"pid": 9 if dev >= 0 else -1, "tid": -1, "device": dev, "stream": 7}
    return {"name": "k", **row, "start_ns": BASE_NS + start, "dur_ns": d, "correlation": c, "external_id": -1}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ts=_field,
    dur=_field,
    pid=_field,
    device=_field,
    corr=_field,
    cat=st.sampled_from(['"kernel"', '"cpu_op"', '"cuda_runtime"', '"gpu_memcpy"', '"python_function"', "1"]),
)
def test_random_field_values_give_the_row_or_an_error_naming_the_event(
    tmp_path, ts, dur, pid, device, corr, cat
):
    args = f'{{"device": {device}, "stream": 7, "correlation": {corr}, "bytes": 64}}'
    got = _odd_row(tmp_path, _kernel(ts, dur, pid=pid, cat=cat, args=args))
    want = _expected(ts, dur, pid, device, corr, cat)
    if want == "error":
        assert isinstance(got, str) and got.startswith("traceEvents[40]: "), got
    else:
        assert got == (want or {}), (got, want)
