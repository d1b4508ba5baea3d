"""Inputs that made `mxperf ingest` print a traceback: each must be one line naming the file, exit 2, no table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxperf.cli import main

NO_GPU = Path(__file__).parent.parent / "data" / "quirks" / "no_gpu_ops" / "trace.json"
DEEP = "[" * 100_000 + "]" * 100_000  # far past msgspec's / json's recursion limit


def _events() -> str:
    return json.dumps(json.loads(NO_GPU.read_text())["traceEvents"])


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("top.json", '{"traceEvents": ' + DEEP + "}", "nested too deeply"),
        (
            "args.json",
            '{"traceEvents": ' + _events()[:-1] + ', {"ph": "X", "cat": "cpu_op", "name": "n", "pid": 1, '
            '"tid": 1, "ts": 1, "dur": 1, "args": {"x": ' + "[" * 3000 + "]" * 3000 + "}}]}",
            "nested too deeply",
        ),
        (
            "meta.json",
            '{"deviceProperties": ' + DEEP + ', "traceEvents": ' + _events() + "}",
            "nested too deeply",
        ),
        ("bare.json", DEEP, "nested too deeply"),
        (
            "m.jsonl",
            '{"step": 1, "data": {"a": 1.0}}\n{"step": 2, "data": ' + DEEP + "}\n",
            "line 2: JSON nested",
        ),
        (  # an integer of more than 4300 digits: a ValueError of json.loads, not a JSONDecodeError
            "big.jsonl",
            '{"step": 1, "data": {"a": 1.0}}\n{"step": 2, "data": {"a": ' + "9" * 5000 + "}}\n",
            "line 2: unreadable JSON",
        ),
        ("tags.json", '{"loss": {"1": ' + "9" * 5000 + "}}", "unreadable JSON"),
    ],
)
def test_json_nested_too_deep_or_with_huge_integers_is_one_line_and_exit_2(
    tmp_path, capsys, name, text, message
):
    bad = tmp_path / name
    bad.write_text(text)
    out = tmp_path / "out"
    assert main(["ingest", str(bad), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and message in err[0], err
    assert not out.exists() or list(out.rglob("*.parquet")) == []


def test_nesting_a_real_trace_can_hold_is_read(tmp_path, capsys):
    ok = tmp_path / "ok.json"
    deep = "[" * 200 + "]" * 200
    ok.write_text(
        '{"traceEvents": ' + _events()[:-1] + ', {"ph": "i", "name": "m", "pid": 1, "tid": 1, "ts": 1, '
        '"args": {"x": ' + deep + "}}]}"
    )
    assert main(["ingest", str(ok), "-o", str(tmp_path / "out"), "--no-progress"]) == 0


@pytest.mark.parametrize("gz", [False, True])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, gz):
    import gzip

    from tracing.ingest.kineto import load_kineto_events

    data = b"\xef\xbb\xbf" + NO_GPU.read_bytes()  # as a Windows editor saves it
    bom = tmp_path / ("bom.json.gz" if gz else "bom.json")
    bom.write_bytes(gzip.compress(data) if gz else data)
    got, want = load_kineto_events(bom).events, load_kineto_events(NO_GPU).events
    assert len(got) == len(want) > 0
    assert got["start_ns"].tolist() == want["start_ns"].tolist()
    assert main(["ingest", str(bom), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
