"""Bad input: a TraceFormatError naming the file and the problem; never a traceback or a crash."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tracing.ingest.detect import load_trace
from tracing.ingest.kineto import load_kineto_events
from tracing.outputs.errors import TraceFormatError

REAL = Path(__file__).parent.parent / "data" / "real"
RANK0 = REAL / "hta_sampled_2rank" / "rank-0.json.gz"
GOOD_EVENT = (
    '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,"args":{"stream":7,"correlation":1}}'
)


def _write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def test_truncated_gzip_names_file_and_offset(tmp_path):
    raw = RANK0.read_bytes()
    p = _write(tmp_path, "cut.json.gz", raw[: len(raw) // 2])
    with pytest.raises(
        TraceFormatError,
        match=r"cut\.json\.gz: truncated or corrupt gzip stream after \d+ decompressed bytes",
    ):
        load_kineto_events(p)


def test_truncated_json_text_is_reported(tmp_path):
    text = gzip.decompress(RANK0.read_bytes())
    p = _write(tmp_path, "cut.json", text[: len(text) // 3])
    with pytest.raises(TraceFormatError, match=r"cut\.json: .*(truncated|invalid JSON).* at byte \d+"):
        load_kineto_events(p)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ('{"traceEvents": [' + GOOD_EVENT + ", garbage]}", "invalid JSON"),
        ('{"traceEvents": [' + GOOD_EVENT + "] ", "expected ',' or '}'"),
        ('{"schemaVersion": 1}', "no traceEvents array"),
        ('{"traceEvents": {"a": 1}}', "traceEvents is not an array"),
        ("", "not a Chrome trace"),
        ("42", "not a Chrome trace"),
        ('{"traceEvents": [' + GOOD_EVENT + "]} trailing", "extra data"),
        ('{"traceEvents": [7]}', r"traceEvents\[0\]: event is a int"),
        (
            '{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":"abc","dur":2}]}',
            r"traceEvents\[0\]: 'ts': not a finite number",
        ),
        (  # NaN / Infinity are not JSON: the event and the byte are named
            '{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":NaN,"dur":2}]}',
            r"traceEvents\[0\]: invalid JSON \(invalid character\) at byte 74 ",
        ),
        (
            '{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":-Infinity}]}',
            r"traceEvents\[0\]: invalid JSON \(invalid character\) at byte 8\d ",
        ),
        (
            '{"traceEvents": [{"ph":"X","cat":"kernel","name":5,"pid":0,"tid":7,"ts":1,"dur":2}]}',
            "name is int",
        ),
        (
            '{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,"args":[]}]}',
            "args is not an object",
        ),
        (
            '{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,"args":{"stream":"x"}}]}',
            "expected an integer",
        ),
        (
            '{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"k","pid":[1],"tid":7,"ts":1,"dur":2}]}',
            "pid/tid must be",
        ),
        (
            '{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"\\ud800","pid":1,"tid":7,"ts":1,"dur":2}]}',
            r"traceEvents\[0\]: invalid JSON \(unexpected end of hex escape\) at byte \d+",  # a lone surrogate
        ),
        ('{"traceEvents": [], "baseTimeNanoseconds": "soon"}', "baseTimeNanoseconds is not an integer"),
    ],
)
def test_malformed_kineto_json_raises_trace_format_error(tmp_path, doc, problem):
    p = _write(tmp_path, "bad.json", doc)
    with pytest.raises(TraceFormatError, match=problem) as info:
        load_kineto_events(p)
    assert str(p) in str(info.value)
    assert "\n" not in str(info.value)


def test_non_utf8_name_reports_the_event(tmp_path):
    doc = (
        '{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"bad\xff","pid":1,"tid":1,"ts":1,"dur":2}]}'
    ).encode("latin-1")
    p = _write(tmp_path, "latin1.json", doc)
    with pytest.raises(
        TraceFormatError, match=r"latin1\.json: traceEvents\[0\]: invalid JSON \(Invalid UTF-8"
    ):
        load_kineto_events(p)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceFormatError, match=r"nope\.json: no such file"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(TraceFormatError, match="is a directory"):
        load_kineto_events(tmp_path)


def test_garbage_sqlite_header_is_not_nsys(tmp_path):
    p = _write(tmp_path, "x.sqlite", b"SQLite format 3\x00" + b"\x00" * 100)
    with pytest.raises(TraceFormatError, match=r"x\.sqlite: (unreadable SQLite|SQLite error|no StringIds)"):
        load_trace(p)
