"""A streamed ingest holds nothing per GPU op, per idle gap (the device timelines are spilled) or per range (the
range columns are on disk): its peak memory grows with the trace only by its distinct names.

The GPU-heavy real rank (a quarter of its events are kernels and copies, about one idle gap per kernel, 73 ranges
per 1,204 GPU ops) repeated 32 and 160 times, each streamed in a fresh process with chunks and runs small enough
(2^14 / 2^15 rows) that the buffers are full at both sizes; the peak RSS above the imports (``VmHWM``, reset
after imports) must grow by under 100 bytes per added GPU op (59 measured; the design that held the ops, joined,
and their per-op temporaries: ~285), and the busy time must be exactly the repetitions times the source's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "data" / "real" / "hta_sampled_2rank" / "rank-0.json.gz"

_MEASURE = """
import json, sys
from tracing import streamed
from tracing.analysis.phases import default_phase_map
streamed.CHUNK_ROWS = 1 << 14
streamed.RUN_ROWS = streamed.OP_RUN_ROWS = 1 << 15
def status():
    with open("/proc/self/status") as fh:
        return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":") for l in fh) if k in ("VmHWM", "VmRSS")}
base = status()["VmRSS"]
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")
st = streamed.stream_trace(sys.argv[1], "kineto", rank=None, include_python=False, phase_map=default_phase_map(),
                           labels=None, pattern=None, events_path=None, spill_dir=sys.argv[2])
busy = int(st.analysis.tables["devices"]["busy_ns"].sum())
ranges = len(st.analysis.tables["ranges"])
print(json.dumps({"peak": status()["VmHWM"] - base, "ops": st.num_gpu_ops, "busy": busy, "events": st.num_events,
                  "ranges": ranges}))
"""


def _repeat(n: int, out: Path, source: Path = SOURCE) -> Path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import make_synthetic_trace as mk
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    mk.repeated(mk.Source(source), out, 0.0, reps=n)
    return out


def _measure(path: Path, tmp: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), str(tmp)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_streamed_peak_memory_does_not_grow_with_gpu_ops(tmp_path):
    one = _measure(_repeat(1, tmp_path / "one.json.gz"), tmp_path)
    small = _measure(_repeat(32, tmp_path / "small.json.gz"), tmp_path)
    big = _measure(_repeat(160, tmp_path / "big.json.gz"), tmp_path)
    assert (small["ops"], big["ops"]) == (32 * one["ops"], 160 * one["ops"])
    assert (small["busy"], big["busy"]) == (32 * one["busy"], 160 * one["busy"])  # exact
    per_op = (big["peak"] - small["peak"]) / (big["ops"] - small["ops"])
    assert per_op < 100, f"{per_op:.0f} bytes of peak memory per added GPU op"


def _without_ranges(out: Path) -> Path:
    """The source with its ``ProfilerStep`` and annotations removed: each process is one detection window."""
    import gzip

    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    trace["traceEvents"] = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") not in ("user_annotation", "gpu_user_annotation")
        and not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    out.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return out


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_a_process_without_ranges_is_cut_without_holding_its_items(tmp_path):
    """No range cuts such a process into detection windows: the whole process is one region. Its host items and
    launches go to column files and the cut reads them a block at a time (a micro-batch's neighbourhood at a
    time), so the peak grows by under 15 bytes per added event: 5 measured (not in the cut, which holds a few
    values per forward pass); 51 when the region was held in small types, 154 before that."""
    source = _without_ranges(tmp_path / "norange.json.gz")
    one = _measure(_repeat(1, tmp_path / "one.json.gz", source), tmp_path)
    small = _measure(_repeat(32, tmp_path / "small.json.gz", source), tmp_path)
    big = _measure(_repeat(160, tmp_path / "big.json.gz", source), tmp_path)
    assert (small["busy"], big["busy"]) == (32 * one["busy"], 160 * one["busy"])  # exact
    per_event = (big["peak"] - small["peak"]) / (big["events"] - small["events"])
    assert per_event < 15, f"{per_event:.0f} bytes of peak memory per added event"


# as the command streams an export: full block sizes, a large range table written to the staging folder
_MEASURE_NSYS = (
    _MEASURE.replace('"kineto"', '"nsys"')
    .replace(
        "streamed.RUN_ROWS = streamed.OP_RUN_ROWS = 1 << 15\n",
        "streamed.RUN_ROWS = streamed.OP_RUN_ROWS = 1 << 15\nstreamed.SLAB_ROWS = 1 << 14\n"
        "import tracing.staged\ntracing.staged.STAGE_ROWS = 1 << 14\n",
    )
    .replace("spill_dir=sys.argv[2])", "spill_dir=sys.argv[2], ranges_path=sys.argv[2] + '/ranges.parts')")
    .replace(
        'ranges = len(st.analysis.tables["ranges"])',
        'ranges = st.staged_ranges.num_ranges if st.staged_ranges else len(st.analysis.tables["ranges"])',
    )
)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_a_streamed_nsys_export_grows_by_its_ranges_only(tmp_path):
    """An NVTX-heavy export (its emit_nvtx op ranges: one per op) holds nothing per range either: the real 2x H100
    export repeated 16 and 32 times (``bench_scale.nsys_copies``), streamed with the range table staged a part
    at a time and blocks small enough (2^14 / 2^15 rows) to be full at both sizes. Under 40 bytes of peak per
    added range (23 measured, 8 from 32 to 64 copies: each sorted run's merge block; 66 when the range columns
    were held, 177 when every range's attribution counters and window-end times were too), busy time exact."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_scale
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    got = {}
    for k in (1, 16, 32):
        bench_scale.nsys_copies(tmp_path / f"x{k}.sqlite", k)
        out = subprocess.run(
            [sys.executable, "-c", _MEASURE_NSYS, str(tmp_path / f"x{k}.sqlite"), str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
        got[k] = json.loads(out.strip().splitlines()[-1])
    assert (got[16]["busy"], got[32]["busy"]) == (16 * got[1]["busy"], 32 * got[1]["busy"])  # exact
    assert (got[16]["ranges"], got[32]["ranges"]) == (16 * got[1]["ranges"], 32 * got[1]["ranges"])
    per_range = (got[32]["peak"] - got[16]["peak"]) / (16 * got[1]["ranges"])
    assert per_range < 40, f"{per_range:.0f} bytes of peak memory per added range"
