"""The device time in each range's window through two sorted spills (tracing.analysis.clipped_spill) equals the
held computation (attribution._Clipped) on every real trace's ranges and device timelines: window ends as the
attribution gives them and stretched at random past later ranges, runs of a few rows (many runs, many merge
rounds), parts and input blocks of any size; the spill files are gone once closed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracing.analysis import attribution, metrics
from tracing.analysis.clipped_spill import SpilledClipped
from tracing.ingest.detect import load_trace

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
REAL_TRACES = [*sorted(REAL.glob("**/*.json.gz")), REAL / "nsysai_h100x2_mfu_before.sqlite"]


@pytest.fixture(scope="module", params=REAL_TRACES, ids=lambda p: p.name)
def real(request):
    trace = load_trace(request.param)
    ops = metrics.gpu_ops(trace.events)
    timelines = metrics.device_timelines(trace.events, ops)
    table = attribution.attribute_ranges(trace, ops=ops, timelines=timelines)
    return table, timelines


@pytest.mark.parametrize(("run_rows", "block", "part"), [(7, 5, 3), (1 << 16, 1 << 20, 1 << 20), (13, 1, 50)])
@pytest.mark.parametrize("stretch", [False, True])
def test_spilled_equals_held(real, run_rows, block, part, stretch, tmp_path):
    table, timelines = real
    pid = table["pid"].to_numpy(np.int64)
    lo = table["start_ns"].to_numpy(np.int64)
    hi = lo + table["time_ns"].to_numpy(np.int64)  # each window's end
    if stretch:  # window ends in another order than the starts: a sort that matters
        hi = hi + np.random.default_rng(0).integers(0, int(hi.max() - lo.min()) + 1, len(hi))
    # at most ~100 parts and blocks and ~50 runs (the nsys export has 19k ranges)
    part, block, run_rows = (
        max(part, len(pid) // 100),
        max(block, len(pid) // 100),
        max(run_rows, len(pid) // 50),
    )
    held = attribution._Clipped(pid, hi, timelines)
    blocks = ((pid[a : a + block], hi[a : a + block]) for a in range(0, len(pid), block))
    spilled = SpilledClipped(blocks, timelines, tmp_path, run_rows=run_rows)
    assert spilled.n == len(pid)
    for a in range(0, len(pid), part):
        want = held.part(a, pid[a : a + part], lo[a : a + part])
        got = spilled.part(a, pid[a : a + part], lo[a : a + part])
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g)
    if not stretch:  # what the range table says
        whole = SpilledClipped([(pid, hi)], timelines, tmp_path)
        busy, stall = whole.part(0, pid, lo)
        whole.close()
        assert np.array_equal(busy, table["busy_in_window_ns"].to_numpy(np.int64))
        assert np.array_equal(stall, table["host_stall_ns"].to_numpy(np.int64))
        assert busy.sum() > 0
    spilled.close()
    assert not list(tmp_path.iterdir())
