"""Fuzz: mutated real traces give either a TraceFormatError or a clean, self-consistent result."""

from __future__ import annotations

import contextlib
import gzip
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracing.analysis import attribution, metrics
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.kineto import load_kineto_events
from tracing.outputs.errors import TraceFormatError

REAL = Path(__file__).parent.parent / "data" / "real"
_TEXT = gzip.decompress((REAL / "hta_sampled_2rank" / "rank-0.json.gz").read_bytes())
_CUT = _TEXT.index(b'}, {"ph"', 40_000)
BASE = _TEXT[: _CUT + 1] + b"]}"  # ~300 real events, still a valid trace
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(BASE) - 1), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(BASE) - 1), st.integers(0, 200)),
    st.tuples(st.just("insert"), st.integers(0, len(BASE) - 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.integers(0, len(BASE) - 1), st.just(0)),
)


def _mutate(data: bytes, ops: list[tuple]) -> bytes:
    for kind, pos, arg in ops:
        pos = min(pos, max(len(data) - 1, 0))
        if kind == "flip" and data:
            data = data[:pos] + bytes([data[pos] ^ arg]) + data[pos + 1 :]
        elif kind == "cut":
            data = data[:pos] + data[pos + arg :]
        elif kind == "insert":
            data = data[:pos] + arg + data[pos:]
        else:
            data = data[:pos]
    return data


def _check_clean(trace) -> None:
    dev = metrics.device_metrics(trace.events)
    assert (dev["busy_ns"] <= dev["span_ns"]).all()
    assert (dev["host_stall_ns"] + dev["other_idle_ns"] == dev["idle_ns"]).all()
    assert (dev["host_stall_ns"] >= 0).all()
    ranges = attribution.attribute_ranges(trace)
    gpu = ranges.dropna(subset=["host_stall_ns"])
    assert (gpu["host_stall_ns"] + gpu["busy_in_window_ns"] <= gpu["wall_ns"]).all()


@SETTINGS
@given(ops=st.lists(mutation, min_size=1, max_size=3), compress=st.booleans())
def test_mutated_kineto_trace_errors_cleanly_or_loads(tmp_path, ops, compress):
    data = _mutate(BASE, ops)
    path = tmp_path / ("t.json.gz" if compress else "t.json")
    path.write_bytes(gzip.compress(data) if compress else data)
    try:
        trace = load_kineto_events(path)
    except TraceFormatError as exc:
        assert str(path) in str(exc)
        return
    _check_clean(trace)


@SETTINGS
@given(
    ops=st.lists(
        st.tuples(st.just("flip"), st.integers(0, 1000), st.integers(1, 255)), min_size=1, max_size=2
    )
)
def test_mutated_gzip_stream_errors_cleanly_or_loads(tmp_path, ops):
    packed = gzip.compress(BASE)
    path = tmp_path / "z.json.gz"
    path.write_bytes(_mutate(packed, [(k, min(p, len(packed) - 1), a) for k, p, a in ops]))
    with contextlib.suppress(TraceFormatError):
        _check_clean(load_kineto_events(path))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 2_686_975), st.integers(1, 255)), min_size=1, max_size=20))
def test_mutated_nsys_export_errors_cleanly_or_loads(tmp_path, flips):
    path = tmp_path / "n.sqlite"
    shutil.copyfile(REAL / "nsysai_h100x2_mfu_before.sqlite", path)
    with open(path, "r+b") as fh:
        for pos, x in flips:
            fh.seek(pos)
            b = fh.read(1)
            fh.seek(pos)
            fh.write(bytes([b[0] ^ x]))
    try:
        trace = load_nsys_events(path)
    except TraceFormatError as exc:
        assert str(path) in str(exc)
        return
    dev = metrics.device_metrics(trace.events)
    assert (dev["host_stall_ns"] + dev["other_idle_ns"] == dev["idle_ns"]).all()
