"""Where a streamed ingest's memory goes: peak RSS of each analysis stage of one Kineto trace or nsys export.

    .venv/bin/python benchmarks/bench_stages.py TRACE [--nsys]

Runs ``tracing.streamed.stream_trace`` in this process with each stage wrapped: before a
stage the peak-RSS counter is reset (``/proc/self/clear_refs``, Linux), after it the stage's peak and the RSS it
leaves are read (``VmHWM`` / ``VmRSS``), all relative to the RSS after imports. "decode" is everything before the
first wrapped stage (reading, spilling). For finding what still grows with the trace (docs/tracing.md, "Large
traces and many ranks"); the stage whose peak minus its "before" grows with the GPU-op count is the one to fix.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracing import jobs, streamed
from tracing.analysis import metrics, steps
from tracing.analysis.opwindows import OpWindows
from tracing.analysis.phases import default_phase_map
from tracing.analysis.range_file import RangeFile
from tracing.outputs.store import use_system_allocator

STAGES: list[tuple[Any, str]] = [
    (RangeFile, "build"),
    (streamed, "joined_ops"),
    (OpWindows, "finish"),
    (streamed, "_staged_ranges"),
    (OpWindows, "launches"),
    (streamed, "find_microbatches_streamed"),
    (metrics, "device_metrics"),
    (steps, "trace_step_phases"),
]


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmHWM", "VmRSS")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _wrapped(fn: Callable[..., Any], name: str, base: int, rows: list[dict[str, Any]]) -> Callable[..., Any]:
    """``fn`` reporting the peak RSS since the previous stage ended (so the work between two wrapped calls,
    e.g. the loop feeding ``OpWindows.add`` before ``finish``, counts in the later stage) and what it leaves."""

    def stage(*args: Any, **kwargs: Any) -> Any:
        if not rows:  # everything so far: decoding and spilling
            now = _status()
            peak, rss = (now["VmHWM"] - base) / 2**20, (now["VmRSS"] - base) / 2**20
            rows.append({"stage": "decode", "before_mb": 0.0, "peak_mb": peak, "after_mb": rss})
            _reset_peak()
        before = rows[-1]["after_mb"]
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds = time.perf_counter() - t0
        st = _status()
        rows.append(
            {
                "stage": name,
                "before_mb": before,
                "peak_mb": (st["VmHWM"] - base) / 2**20,
                "after_mb": (st["VmRSS"] - base) / 2**20,
                "seconds": seconds,
            }
        )
        _reset_peak()
        return result

    return stage


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--nsys", action="store_true", help="the file is an nsys SQLite export")
    args = p.parse_args()
    if not Path("/proc/self/clear_refs").exists():
        print("bench_stages: needs Linux (/proc/self/clear_refs)", file=sys.stderr)
        return 2
    use_system_allocator()  # as the mxperf command does at start-up (Arrow's default pool keeps what it frees)
    base = _status()["VmRSS"]
    rows: list[dict[str, Any]] = []
    for module, name in STAGES:
        setattr(module, name, _wrapped(getattr(module, name), name, base, rows))
    for name in ("metrics", "steps"):  # jobs calls them through modules
        assert getattr(jobs, name) is globals()[name]
    kw = {
        "rank": None,
        "phase_map": default_phase_map(),
        "labels": None,
        "pattern": None,
        "events_path": None,
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as stage:  # as `mxperf ingest`'s staging folder
        fmt = "nsys" if args.nsys else "kineto"
        ranges = str(Path(stage) / ".ranges-0.pkl")  # a large range table leaves in parts, as in the command
        st = streamed.stream_trace(
            str(args.trace), fmt, include_python=False, spill_dir=stage, ranges_path=ranges, **kw
        )
    total = time.perf_counter() - t0
    print(f"{'stage':<28} {'before MB':>10} {'peak MB':>9} {'after MB':>9} {'s':>7}")
    for r in rows:
        after, secs = r.get("after_mb"), r.get("seconds")
        print(
            f"{r['stage']:<28} {r['before_mb']:>10.1f} {r['peak_mb']:>9.1f} "
            f"{'' if after is None else f'{after:.1f}':>9} {'' if secs is None else f'{secs:.2f}':>7}"
        )
    info = {"events": st.num_events, "gpu_ops": st.num_gpu_ops, "seconds": total}
    print(f"{st.num_events} events, {st.num_gpu_ops} GPU ops, {total:.1f} s")
    print(
        json.dumps(
            {"schema_version": 1, "benchmark": "stages", "trace": str(args.trace), **info, "stages": rows}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
