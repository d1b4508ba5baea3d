"""Kineto ingest on the real traces: exact ns, joins, streaming parser equivalence, rank resolution."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tracing_helpers import GPU_CATS, load_json

from tracing.ingest import jsonstream
from tracing.ingest.kineto import load_kineto_events, us_text_to_ns
from tracing.outputs import schema

REAL = Path(__file__).parent.parent / "data" / "real"
A100 = REAL / "hta_a100_ddp_rank0_hostbound.json.gz"
RANKS = [REAL / "hta_sampled_2rank" / "rank-0.json.gz", REAL / "hta_sampled_2rank" / "rank-1.json.gz"]


@pytest.fixture(scope="module")
def a100():
    return load_kineto_events(A100)


def test_event_table_follows_the_schema(a100):
    assert list(a100.events.columns) == list(schema.EVENT_COLUMNS)
    for col, dtype in schema.EVENT_COLUMNS.items():
        assert str(a100.events[col].dtype) == dtype, col


def test_counts_match_the_file_and_flows_are_skipped(a100):
    counts = a100.events["kind"].value_counts()
    assert counts["cpu_op"] == 14346
    assert counts["runtime"] == 8740
    assert counts["kernel"] == 2700
    assert counts["memcpy"] == 960
    assert counts["memset"] == 114
    assert counts["range"] == 42
    assert counts["gpu_range"] == 30


def test_timestamps_are_exact_ns_from_base_plus_decimal_us(a100):
    doc = load_json(A100)
    base = int(doc["baseTimeNanoseconds"])
    ref = sorted(base + int(e["ts"] * 1000) for e in doc["traceEvents"] if e.get("cat") == "kernel")
    got = np.sort(a100.events.loc[a100.events["kind"] == "kernel", "start_ns"].to_numpy())
    assert got.tolist() == ref
    assert a100.meta["base_time_ns"] == base


def test_rank_comes_from_distributed_info_then_file_name(a100, tmp_path):
    assert a100.rank == 0
    assert [load_kineto_events(p).rank for p in RANKS] == [0, 1]
    doc = gzip.decompress(RANKS[1].read_bytes()).replace(b'"distributedInfo"', b'"notDistributedInfo"')
    (tmp_path / "trace_rank7.json").write_bytes(doc)
    assert load_kineto_events(tmp_path / "trace_rank7.json").rank == 7
    (tmp_path / "plain.json").write_bytes(doc)
    assert load_kineto_events(tmp_path / "plain.json").rank is None
    assert load_kineto_events(tmp_path / "plain.json", rank=3).rank == 3


def test_gpu_ops_carry_device_stream_and_launching_pid(a100):
    k = a100.events[a100.events["kind"] == "kernel"]
    assert set(k["device"]) == {0}
    assert set(k["stream"]) == {7, 40}
    assert set(k["pid"]) == {2910249}
    assert (k["correlation"] >= 0).all()


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        (7, 7000),
        ("0.001", 1),
        ("4458676522690.655", 4458676522690655),
        ("1.5", 1500),
        ("2e0", 2000),
        ("-1.25", -1250),
        ("1.0005", 1000),
        ("1.0015", 1002),
    ],
)
def test_microsecond_text_converts_to_exact_ns(text, ns):
    assert us_text_to_ns(text) == ns


def _minify(text: str) -> str:
    # Strip whitespace outside strings; keeps every number's text (a real re-serialization, not line based).
    return re.sub(r'("(?:[^"\\]|\\.)*")|\s+', lambda m: m.group(1) or "", text)


@pytest.mark.parametrize("path", [A100, *RANKS], ids=lambda p: p.name)
def test_minified_reserialization_gives_identical_tables(path, tmp_path):
    text = gzip.decompress(path.read_bytes()).decode()
    mini = tmp_path / "mini.json"
    mini.write_text(_minify(text))
    assert mini.stat().st_size < len(text.encode())
    a, b = load_kineto_events(path), load_kineto_events(mini, rank=load_kineto_events(path).rank)
    pd.testing.assert_frame_equal(a.events, b.events)


def test_tiny_read_chunks_give_identical_tables(monkeypatch):
    ref = load_kineto_events(RANKS[0])
    monkeypatch.setattr(jsonstream, "CHUNK_BYTES", 7)
    pd.testing.assert_frame_equal(load_kineto_events(RANKS[0]).events, ref.events)


def test_top_level_array_of_events_is_accepted(tmp_path):
    p = tmp_path / "array.json"
    p.write_text('[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":2,"args":{"stream":7}}]')
    ev = load_kineto_events(p).events
    assert ev["start_ns"].tolist() == [1000] and ev["dur_ns"].tolist() == [2000]


@pytest.mark.parametrize("chunk", [7, jsonstream.CHUNK_BYTES])
@pytest.mark.parametrize("end", ["", ",", ",\n  ", "\n"])
def test_top_level_array_may_end_without_its_bracket(tmp_path, monkeypatch, chunk, end):
    # Chrome's JSON Array Format: "the ] at the end is optional"; a trailing comma is tolerated too
    monkeypatch.setattr(jsonstream, "CHUNK_BYTES", chunk)
    ev = '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":%d,"dur":2,"args":{"stream":7}}'
    p = tmp_path / "open.json"
    p.write_text("[" + ",\n".join(ev % i for i in range(1, 4)) + end)
    assert load_kineto_events(p).events["start_ns"].tolist() == [1000, 2000, 3000]


@pytest.mark.parametrize(
    "text", ['[{"ph":"X","ts":1', '{"traceEvents":[{"ph":"X","ts":1,"dur":2}', '{"traceEvents":[']
)
def test_an_unclosed_trace_events_or_a_cut_event_is_truncation(tmp_path, text):
    p = tmp_path / "cut.json"
    p.write_text(text)
    with pytest.raises(jsonstream.TraceFormatError, match=r"cut\.json: .*(truncated|end of file)"):
        load_kineto_events(p)


def test_python_function_events_are_skipped_unless_asked(tmp_path):
    p = tmp_path / "py.json"
    p.write_text(
        '{"traceEvents":[{"ph":"X","cat":"python_function","name":"f","pid":1,"tid":1,"ts":1,"dur":2}]}'
    )
    assert len(load_kineto_events(p).events) == 0
    assert load_kineto_events(p, include_python=True).events["kind"].tolist() == ["python"]


def test_gpu_categories_reference_count_matches(a100):
    doc = load_json(A100)
    n = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    assert a100.num_gpu_ops == n
