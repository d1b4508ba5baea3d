"""The measuring parts of benchmarks/bench_engine.py and bench_scale.py: a whole process tree's peak RSS, the old
engine's tables against the new one's, and (slow) the scale benchmark end to end on a tiny trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_engine  # noqa: E402
import ingest_worker  # noqa: E402

CHILD = "x = bytearray({mb} << 20); import time; time.sleep(0.3)"


def test_measure_command_counts_the_whole_process_tree() -> None:
    # a parent holding 60 MB starts a child holding 120 MB: both alive at once, so the tree holds >= 180 MB,
    # and the largest single process >= 120 MB (wait4's ru_maxrss would read the benchmark's own RSS too)
    code = (
        "import subprocess, sys; x = bytearray(60 << 20)\n"
        f"subprocess.run([sys.executable, '-c', {CHILD.format(mb=120)!r}], check=True)\n"
        "print('done')"
    )
    r = ingest_worker.measure_command([sys.executable, "-c", code])
    assert r["returncode"] == 0 and r["stdout"].strip() == "done"
    assert r["tree_peak_mb"] >= 180
    assert 120 <= r["max_process_rss_mb"] < 180
    assert r["peak_rss_mb"] == max(r["tree_peak_mb"], r["max_process_rss_mb"])
    assert r["seconds"] >= 0.3 and r["cpu_s"] > 0 and r["processes"] >= 2


def test_measure_command_reports_a_failure() -> None:
    r = ingest_worker.measure_command([sys.executable, "-c", "import sys; sys.exit('no such trace')"])
    assert r["returncode"] == 1 and "no such trace" in r["stderr_tail"]


def _write(folder: Path, tables: dict[str, pa.Table]) -> Path:
    folder.mkdir()
    for name, t in tables.items():
        pq.write_table(t, folder / f"{name}.parquet")
    return folder


def test_compare_tables_exact_reordered_and_reclassified(tmp_path: Path) -> None:
    devices = pa.table({"device": [0, 1], "busy_ns": [5, 7]})
    steps = pa.table({"step": [1, 2], "seconds": [0.5, 0.25]})
    kernels = pa.table({"name": ["a", "b"], "kernel_class": ["gemm", "other"], "total_ns": [3, 4]})
    old = _write(tmp_path / "old", {"devices": devices, "steps": steps, "kernels": kernels})
    new = _write(
        tmp_path / "new",
        {
            "devices": devices,
            "steps": steps.take([1, 0]),  # same rows, other order
            "kernels": kernels.set_column(1, "kernel_class", pa.array(["gemm", "elementwise"])),
        },
    )
    got = bench_engine.compare_tables(old, new)
    assert got["devices"] == "exact"
    assert got["steps"] == "same rows, other order"
    assert got["kernels"].startswith("exact (kernel_class aside")
    bad = _write(
        tmp_path / "bad",
        {"devices": devices.set_column(1, "busy_ns", pa.array([5, 8])), "steps": steps, "kernels": kernels},
    )
    assert bench_engine.compare_tables(old, bad)["devices"] == "values differ in ['busy_ns']"


@pytest.mark.slow
def test_bench_scale_size_runs_on_this_tree(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_scale.py"),
            "size",
            "--gb",
            "0.003",
            "--tmp",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    res = json.loads(proc.stdout.strip().splitlines()[-1])["results"]["cases"]["0.003GB"]
    assert res["mxperf"]["busy_exact"] is True
    assert res["mxperf"]["peak_rss_mb"] > res["gunzip"]["peak_rss_mb"]
    assert not list(tmp_path.glob("*.json.gz"))  # generated traces are deleted


def test_hta_table_shows_the_floor_and_the_ratio_it_caps():
    row = {
        "trace": "/x/rank0.json.gz",
        "gz_bytes": 1_500_000,
        "hta_median_s": 1.2,
        "mxperf_median_s": 0.6,
        "floor_median_s": 0.24,
        "ceiling_median": 5.0,
        "ratio_median": 2.0,
        "ratio_min": 1.9,
        "ratio_max": 2.1,
        "load_1min": [0.1, 0.3],
    }
    results = {
        "rows": [row],
        "median_of_trace_medians": 2.0,
        "lowest_trace_median": 2.0,
        "side_by_side": {"before": 1.1, "after": 1.0},
    }
    text = bench_engine.hta_table(results)
    head, line = text.splitlines()[:2]
    assert "floor s" in head and "HTA/floor" in head
    assert line.split()[1:] == ["1.50", "1.20", "0.60", "0.240", "2.00", "[1.90,", "2.10]", "5.00", "0.20"]
