"""Independent reference computations for tracing tests (plain json + Decimal + Python loops, no mxperf code)."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def load_json(path: Path) -> dict:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw, parse_float=Decimal)


def reference_gpu_intervals(path: Path) -> dict[int, list[tuple[int, int]]]:
    """device -> [(start_ns, end_ns)] of kernels/memcpys/memsets, absolute ns, via Decimal arithmetic."""
    doc = load_json(path)
    base = int(doc.get("baseTimeNanoseconds", 0))
    out: dict[int, list[tuple[int, int]]] = {}
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") in GPU_CATS:
            start = base + int(Decimal(ev["ts"]) * 1000)
            end = start + int(Decimal(ev["dur"]) * 1000)
            out.setdefault(int(ev["args"].get("device", ev["pid"])), []).append((start, end))
    return out


def reference_union(intervals: list[tuple[int, int]]) -> tuple[int, int]:
    """(busy, span) by a plain sweep."""
    busy = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return busy, span
