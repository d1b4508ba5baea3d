"""A GPU op that starts before its launch call started cannot happen: where a trace has them, its GPU and host
clocks disagree (CUPTI / roctracer clock conversion, pytorch/kineto#1380) and host stall, which compares the
two, is only as good as that disagreement. The ingest says so; traces whose clocks agree say nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxperf.cli import main

A100 = Path(__file__).parent.parent / "data" / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"


def _kineto(path: Path, kernel_ts: list[float]) -> Path:
    events = []
    for i, ts in enumerate(kernel_ts):
        launch = 100.0 + 50 * i
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 8, "ts": launch,
             "dur": 5, "args": {"correlation": i + 1}},
            {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": launch + ts, "dur": 10,
             "args": {"correlation": i + 1, "device": 0, "stream": 7}},
        ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _warnings(tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    out = tmp_path / "out"
    assert main(["ingest", str(trace), "-o", str(out), "--no-progress"]) == 0
    entry = json.loads((out / "manifest.json").read_text())["traces"][0]
    return entry.get("warnings") or [], capsys.readouterr().err


def test_gpu_ops_before_their_launch_say_the_clocks_disagree(tmp_path, capsys):
    # kernel 0 starts 2.5 us before its launch call does; kernel 1 starts 3 us after its launch call
    warnings, err = _warnings(tmp_path, _kineto(tmp_path / "t.json", [-2.5, 3.0]), capsys)
    said = "1 of 2 GPU ops start before their launch call started (up to 2.5 us earlier)"
    assert any(w.startswith(said) for w in warnings) and said in err


@pytest.mark.parametrize("trace", [A100], ids=["a100"])
def test_traces_whose_clocks_agree_say_nothing_of_clocks(tmp_path, capsys, trace):
    warnings, err = _warnings(tmp_path, trace, capsys)
    assert not any("clocks disagree" in w for w in warnings) and "clocks disagree" not in err
