"""Capture on CPU torch: schedule, one json.gz per rank, ranges in the trace, ingest round trip."""

from __future__ import annotations

import pytest

from tracing import attribution, store
from tracing.capture import Capture, CaptureConfig
from tracing.ingest_kineto import load_kineto_events
from tracing.ranges import RangeLog

torch = pytest.importorskip("torch")


def test_schedule_traces_only_active_steps():
    cfg = CaptureConfig(wait=1, warmup=1, active=2, repeat=1)
    assert [cfg.is_active(s) for s in range(6)] == [False, False, True, True, False, False]
    with pytest.raises(ValueError, match="active >= 1"):
        CaptureConfig(active=0)


def test_capture_writes_one_trace_per_rank_with_range_names(tmp_path):
    log = RangeLog(emit_nvtx=False)
    model = torch.nn.Linear(8, 8)
    with Capture(tmp_path, CaptureConfig(wait=1, warmup=1, active=2), rank=3) as cap:
        for step in range(5):
            with log.range("update/microbatch", step=step, microbatch=0):
                model(torch.randn(2, 8)).sum().backward()
            cap.step()
    path = store.trace_path(tmp_path, 3)
    assert path.is_file() and cap.files == [str(path)]
    manifest = store.read_json(tmp_path / store.TRACE_DIR / "capture-rank-3.json")
    assert manifest["status"] == "complete" and manifest["cuda_activity"] is False
    trace = load_kineto_events(path)
    assert trace.rank == 3  # from the file name rank-3.json.gz
    ranges = attribution.attribute_ranges(trace)
    mb = ranges[ranges["name"] == "update/microbatch"]
    assert len(mb) == 2  # only the active steps
    assert set(ranges["gpu_reason"]) == {attribution.NO_GPU_REASON}
    assert trace.num_gpu_ops == 0
