"""`annotate`: overlay tracks sum to the device metrics; the original events survive byte for byte."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from mxperf.cli import main
from tracing.analysis import metrics
from tracing.analysis.annotate import annotate
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.kineto import load_kineto_events

REAL = Path(__file__).parent.parent / "data" / "real"
A100 = REAL / "hta_a100_ddp_rank0_hostbound.json.gz"
NSYS = REAL / "nsysai_h100x2_mfu_before.sqlite"


def _track_sums(path: Path) -> dict[tuple[int, str], int]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    sums: dict[tuple[int, str], int] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "mxperf":
            key = (e["pid"], e["name"])
            sums[key] = sums.get(key, 0) + int(Decimal(e["dur"]) * 1000)
    return sums


@pytest.mark.parametrize("src", [A100, NSYS], ids=["kineto", "nsys"])
def test_overlay_tracks_sum_to_device_metrics(tmp_path, src):
    out = tmp_path / "a.json.gz"
    timelines = annotate(src, out)
    sums = _track_sums(out)
    for i, t in enumerate(timelines):
        pid = 2_000_000_000 + i
        assert sums[(pid, "busy")] == t.row["busy_ns"]
        assert sums.get((pid, "host stall"), 0) == t.row["host_stall_ns"]
        assert sums[(pid, "idle")] == t.row["other_idle_ns"]


def test_annotated_kineto_trace_keeps_every_original_event(tmp_path):
    out = tmp_path / "a.json.gz"
    annotate(A100, out)
    pd.testing.assert_frame_equal(load_kineto_events(out).events, load_kineto_events(A100).events)
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["baseTimeNanoseconds"] == 1711964646000000000


def test_annotated_nsys_trace_reingests_with_the_same_busy_time(tmp_path):
    out = tmp_path / "n.json.gz"
    annotate(NSYS, out)
    again = metrics.device_metrics(load_kineto_events(out).events)
    ref = metrics.device_metrics(load_nsys_events(NSYS).events)
    cols = ["pid", "device", "span_ns", "busy_ns", "host_stall_ns", "num_kernels"]
    pd.testing.assert_frame_equal(again[cols], ref[cols])


def test_annotate_cli_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "a.json.gz"
    out.write_text("keep")
    assert main(["annotate", str(A100), "-o", str(out)]) == 2
    assert out.read_text() == "keep"
    assert main(["annotate", str(A100), "-o", str(out), "--force"]) == 0
    assert "host-stall intervals" in capsys.readouterr().err
