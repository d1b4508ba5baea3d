"""benchmarks/bench_stages.py (where a streamed ingest's memory goes) runs on a real trace and an nsys export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real"


@pytest.mark.parametrize(
    ("trace", "flags"),
    [
        (REAL / "hta_a100_ddp_rank0_hostbound.json.gz", []),
        (REAL / "nsysai_h100x2_mfu_before.sqlite", ["--nsys"]),
    ],
)
def test_every_stage_reports_its_peak(trace, flags):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_stages.py"), str(trace), *flags],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    stages = [r["stage"] for r in got["stages"]]
    assert stages[0] == "decode" and {"build", "joined_ops", "finish", "launches"} <= set(stages)
    assert all(r["peak_mb"] >= r["before_mb"] - 1 for r in got["stages"])  # a peak is never below the start
    assert got["gpu_ops"] > 0 and got["events"] > got["gpu_ops"]
