"""The GPU-op tables accumulated a window of ops at a time equal the all-at-once functions' exactly.

Every real and quirk trace in tests/data (Kineto and the nsys export) and simulated multi-process, multi-device
traces: their ``metrics.gpu_ops`` fed to ``tracing.analysis.opwindows.OpWindows`` in (start, row) order, in
windows of a few ops (every carry crosses many window edges) and in one window; the device timelines, stream
breakdown, kernel table, range attribution and launch signals must be equal to ``device_timelines``,
``stream_breakdown``, ``kernel_table``, ``attribute_ranges`` and ``launch_signals`` of the same ops.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracing.analysis import attribution, kernel_classes, metrics, range_ops
from tracing.analysis.mbsignals import launch_signals
from tracing.analysis.opwindows import OpWindows, cut_between_starts
from tracing.ingest.detect import load_trace
from tracing.ingest.trace import Trace
from tracing.outputs import schema

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = [
    *sorted((DATA / "real").glob("**/*.json.gz")),
    *sorted((DATA / "quirks").glob("*/trace.json")),
    DATA / "real" / "nsysai_h100x2_mfu_before.sqlite",
]


def _chunks(ops: pd.DataFrame, sizes: list[int]) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """The ops as opjoin chunks (kind / name as codes), in (start, row) order, cut into ``sizes`` (cycled)."""
    names = sorted({str(n) for n in ops["name"].dropna()})
    code = {n: i for i, n in enumerate(names)}
    cols = {
        "rid": np.arange(len(ops), dtype=np.int64),
        "kind": np.array([schema.EVENT_KINDS.index(k) for k in ops["kind"]], np.int64),
        "name": np.array([code[str(n)] if isinstance(n, str) else -1 for n in ops["name"]], np.int64),
    }
    for c in ("pid", "device", "stream", "start_ns", "dur_ns", "correlation"):
        cols[c] = ops[c].to_numpy(np.int64)
    for c in ("launch_start_ns", "launch_end_ns", "launch_tid"):
        cols[c] = ops[c].to_numpy(np.int64)
    order = np.lexsort((cols["rid"], cols["start_ns"]))
    cols = {k: v[order] for k, v in cols.items()}
    out, a, i = [], 0, 0
    while a < len(order):
        n = sizes[i % len(sizes)]
        out.append({k: v[a : a + n] for k, v in cols.items()})
        a, i = a + n, i + 1
    return out, names


def _windowed(trace: Trace, ops: pd.DataFrame, sizes: list[int], tmp: Path, retire: bool = False):
    chunks, names = _chunks(ops, sizes)
    cols = attribution.range_columns(trace)
    slabs = range_ops.held_slabs(cols, 3 if retire else range_ops.SLAB_ROWS)  # retire: a few at a time
    acc = OpWindows(names, None if trace.range_log is not None else slabs, tmp, run_rows=37)
    if retire:  # the lag the join would give
        launched = ops["launch_start_ns"] != schema.NO_ID
        lag = (ops["start_ns"] - ops["launch_start_ns"])[launched]
        acc.set_lag(int(lag.max()) if len(lag) else None)
    last = None
    for c in cut_between_starts(chunks):
        assert last is None or c["start_ns"][0] > last  # no start time split between two windows
        last = c["start_ns"][-1]
        acc.add(c)
    held = None if acc._ranges is None else acc._ranges.most_live
    out = acc.finish()
    return acc, out, cols, held


def _check(trace: Trace, ops: pd.DataFrame, sizes: list[int], tmp: Path, retire: bool = False) -> None:
    acc, out, cols, held = _windowed(trace, ops, sizes, tmp, retire)
    n_ranges = len(cols["start_ns"])
    if retire and max(sizes) < 100 and n_ranges > 40:  # small windows: most ranges retire before the end
        assert held is not None and held < n_ranges / 2, (held, n_ranges)
    assert out.num_ops == len(ops)
    want = metrics.device_timelines(trace.events, ops)
    assert len(out.timelines) == len(want)
    for a, b in zip(want, out.timelines, strict=True):
        assert (a.pid, a.device) == (b.pid, b.device)
        assert a.row.keys() == b.row.keys()
        for k in a.row:
            assert a.row[k] == b.row[k] or (a.row[k] != a.row[k] and b.row[k] != b.row[k]), k
        for f in ("busy", "stall"):  # starts and ends
            for x, y in zip(getattr(a, f).arrays(), getattr(b, f).arrays(), strict=True):
                assert np.array_equal(x, y), f
                assert x.dtype == y.dtype
    pd.testing.assert_frame_equal(
        metrics.stream_breakdown(trace.events, ops=ops), out.streams, check_exact=True
    )
    kernels = kernel_classes.kernel_table(ops)
    pd.testing.assert_frame_equal(kernels, out.kernels, check_exact=True)
    if len(ops) and trace.range_log is None:
        got = attribution.attributed_frame(cols, out.partials, out.timelines)
        pd.testing.assert_frame_equal(attribution.attribute_ranges(trace, ops=ops), got, check_exact=True)
    launches = acc.launches(kernels)
    want_l, got_l = launch_signals(ops, kernels), launches.per_process()
    assert want_l.keys() == got_l.keys()
    for p in want_l:
        assert want_l[p].keys() == got_l[p].keys()
        for k in want_l[p]:
            assert np.array_equal(want_l[p][k], got_l[p][k]), (p, k)
            assert want_l[p][k].dtype == got_l[p][k].dtype


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def loaded(request):
    trace = load_trace(request.param)
    return trace, metrics.gpu_ops(trace.events)


@pytest.mark.parametrize("sizes", [[5, 1, 17], [1 << 30]], ids=["tiny", "one"])
@pytest.mark.parametrize("retire", [False, True], ids=["held", "retired"])
def test_windows_equal_all_at_once(loaded, sizes, retire, tmp_path):
    trace, ops = loaded
    _check(trace, ops, sizes, tmp_path, retire)


def test_cut_between_starts_keeps_ties_together():
    s = np.array([1, 2, 2, 2, 3, 3, 5], np.int64)
    chunks = [{"start_ns": s[a:b], "rid": np.arange(a, b)} for a, b in ((0, 2), (2, 3), (3, 5), (5, 7))]
    got = list(cut_between_starts(chunks))
    assert [c["start_ns"].tolist() for c in got] == [[1], [2, 2, 2], [3, 3], [5]]
    assert np.concatenate([c["rid"] for c in got]).tolist() == list(range(7))
