"""Capture on CPU torch: schedule, one json.gz per rank, ranges in the trace, ingest round trip."""

from __future__ import annotations

import pytest

from tracing.analysis import attribution
from tracing.capture.profiler import Capture, CaptureConfig
from tracing.capture.ranges import RangeLog
from tracing.ingest.kineto import load_kineto_events
from tracing.outputs import store

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


def _bracket(cfg, steps):
    """The cudaProfilerStart/Stop calls a capture makes over ``steps`` steps, as (step, action)."""
    from tracing.capture.profiler import bracket_action

    calls, on = [], False
    for step in range(steps + 1):  # the last check is the one __exit__ closes with
        action = bracket_action(cfg, step, on) if step < steps else ("stop" if on else None)
        if action:
            calls.append((step, action))
            on = action == "start"
    return calls


def test_nsys_bracket_opens_at_the_first_active_step_and_closes_after_the_last():
    assert _bracket(CaptureConfig(wait=1, warmup=1, active=2), 6) == [(2, "start"), (4, "stop")]
    assert _bracket(CaptureConfig(wait=0, warmup=0, active=3), 3) == [(0, "start"), (3, "stop")]
    # a repeating schedule opens one range per cycle
    assert _bracket(CaptureConfig(wait=1, warmup=0, active=1, repeat=2), 5) == [
        (1, "start"),
        (2, "stop"),
        (3, "start"),
        (4, "stop"),
    ]


def test_cuda_activity_asked_for_without_cuda_is_a_clear_error(tmp_path):
    from tracing.outputs.errors import InputError

    with pytest.raises(InputError, match="needs CUDA for CUPTI"), Capture(tmp_path, CaptureConfig(cuda=True)):
        pass


def test_nsys_bracket_without_cuda_is_ignored_with_a_warning(tmp_path):
    cfg = CaptureConfig(wait=0, warmup=0, active=1, nsys=True)
    with pytest.warns(UserWarning, match="nsys=True ignored"), Capture(tmp_path, cfg, rank=0) as cap:
        torch.ones(2).sum()
        cap.step()
    assert store.trace_path(tmp_path, 0).is_file()


def test_run_schedule_parsing():
    from pipeline.experiments.profiling import parse_trace_steps, with_nsys
    from tracing.outputs.errors import InputError

    # the default window: 2 steps after one skipped and one warm-up step, however long the run
    assert parse_trace_steps(None, 7) == CaptureConfig(wait=1, warmup=1, active=2)
    assert parse_trace_steps(None, 200) == CaptureConfig(wait=1, warmup=1, active=2)
    assert parse_trace_steps(None, 3) == CaptureConfig(wait=0, warmup=1, active=2)  # short runs shrink it
    assert parse_trace_steps(None, 1) == CaptureConfig(wait=0, warmup=0, active=1)
    assert parse_trace_steps("all", 7) == CaptureConfig(wait=0, warmup=0, active=7)
    assert CaptureConfig().record_shapes  # shapes on: token counts can be read from mxperf's own traces
    assert parse_trace_steps("2,1,3", 6) == CaptureConfig(wait=2, warmup=1, active=3)
    with pytest.raises(InputError, match="needs at least 6 steps"):
        parse_trace_steps("2,1,3", 5)
    assert with_nsys(CaptureConfig(), True, cuda_available=True).nsys
    with pytest.raises(InputError, match="needs CUDA"):
        with_nsys(CaptureConfig(), True, cuda_available=False)


class _Recorder:
    """A companion profiler (the role the vLLM sampler plays) that records when it is started and stopped."""

    def __init__(self, out_dir, log):
        self.out_dir, self.log = out_dir, log

    def start_profile(self):
        self.log.append("start")

    def stop_profile(self):
        self.log.append("stop")
        path = self.out_dir / "trace" / "sampler" / f"part{self.log.count('stop')}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        return [path]


def test_companions_are_bracketed_with_the_active_steps_and_their_files_listed(tmp_path):
    log = []
    cfg = CaptureConfig(wait=1, warmup=1, active=2)
    with Capture(tmp_path, cfg, rank=0, companions=[_Recorder(tmp_path, log)]) as cap:
        for step in range(5):
            log.append(f"step{step}")
            torch.ones(2).sum()
            cap.step()
    assert log == ["step0", "step1", "start", "step2", "step3", "stop", "step4"]
    manifest = store.read_json(tmp_path / store.TRACE_DIR / "capture-rank-0.json")
    assert manifest["companion_files"] == ["trace/sampler/part1.json.gz"]


def test_a_failing_block_stops_companions_and_keeps_its_own_error(tmp_path):
    log = []
    with (
        pytest.raises(ZeroDivisionError),
        Capture(
            tmp_path, CaptureConfig(wait=0, warmup=0, active=3), rank=0, companions=[_Recorder(tmp_path, log)]
        ),
    ):
        log.append("work")
        1 / 0  # noqa: B018
    assert log == ["start", "work", "stop"]
    assert store.read_json(tmp_path / store.TRACE_DIR / "capture-rank-0.json")["status"] == "failed"


def test_nsys_and_forced_cuda_activity_are_refused_together():
    # both would subscribe to CUPTI, which takes one subscriber (pytorch#117935, TensorRT-LLM#9073)
    with pytest.raises(ValueError, match="leaves CUDA activity to Nsight Systems"):
        CaptureConfig(nsys=True, cuda=True)
    assert CaptureConfig(nsys=True).cuda is None
