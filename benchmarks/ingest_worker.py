"""One measurement in a fresh process: ``python benchmarks/ingest_worker.py TOOL PATH`` -> one JSON line.

Tools (each imports its libraries first, then records the baseline RSS, then times the work):

- ``mxperf``: ``load_trace`` + ``analyze`` (device metrics, HTA-style stream breakdown, per-range
  attribution, kernel table) -- more than HTA computes below.
- ``mxperf-metrics``: HTA's scope only: load + device metrics (temporal breakdown) + stream breakdown (idle
  breakdown) + kernel-class totals.
- ``hta``: Holistic Trace Analysis 0.5.0 ``TraceAnalysis(trace_dir)`` (default JSON backend) +
  ``get_idle_time_breakdown`` + ``get_temporal_breakdown``. PATH is a directory of rank files.
- ``gunzip``: the floor for a .json.gz: stream-decompress it (1 MiB chunks) and discard the bytes.
- ``duckdb``: PATH is an event Parquet (file or folder): the out-of-core steps of the embedded-engine design
  as DuckDB queries (busy union, launch join, host items sorted), one thread, ``MXPERF_DUCKDB_MEMORY`` limit.
- ``sqlite``: the floor for an nsys export: the same SELECTs mxperf runs, ``fetchall`` only.
- ``mxperf-file``: ``tracing.jobs.ingest_file`` on one file, event Parquet included (``MXPERF_STREAM=1`` /
  ``0``: the streaming / in-memory path; unset: chosen by size; ``MXPERF_DECODE_WORKERS=K``: decoded by K
  processes; ``MXPERF_KEEP_EVENTS=FILE``: the event Parquet is kept there).
- ``mxperf-cli``: ``mxperf ingest PATH -o TMP/out`` plus ``MXPERF_ARGS`` (e.g. ``--workers 2``, ``--ray local``).

Memory = peak RSS (this process or its largest child, e.g. HTA's parse pool) minus the RSS after imports.
The mxperf tools choose Arrow's allocator as the ``mxperf`` command does at start-up
(``tracing.outputs.store.use_system_allocator``); HTA runs with pyarrow's default pool unless the benchmark sets
``ARROW_DEFAULT_MEMORY_POOL`` (its ``hta-system`` case).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_bytes() -> int:
    """This process's high-water RSS (``VmHWM``: its own address space; ``ru_maxrss`` would carry the
    parent's peak across fork + exec) or its largest reaped child's, whichever is larger."""
    with open("/proc/self/status") as fh:
        self_kib = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(self_kib, child_kib) * 1024


NSYS_QUERIES = (
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, demangledName, NULL FROM CUPTI_ACTIVITY_KIND_KERNEL',
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, copyKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY',
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, memKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMSET',
    'SELECT start, "end", deviceId, streamId, correlationId, globalPid, syncType, NULL FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION',
    'SELECT start, "end", eventClass, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME',
    'SELECT start, "end", globalTid, endGlobalTid, coalesce(text, ""), textId, coalesce(domainId, 0) FROM NVTX_EVENTS '
    'WHERE eventType IN (59, 60) AND "end" IS NOT NULL',
    "SELECT id, value FROM StringIds",
)


def main(tool: str, path: str) -> dict[str, object]:
    p = Path(path)
    if tool.startswith("mxperf"):
        from tracing.outputs.store import use_system_allocator

        use_system_allocator()
    if tool in ("mxperf", "mxperf-metrics"):  # each file of PATH loaded, then analysed
        import tracing.analysis.kernel_classes
        import tracing.jobs  # noqa: F401 -- imported before the baseline, as every tool does
        from tracing.ingest.detect import load_trace

        analysis = _full_analysis if tool == "mxperf" else _hta_scope
        base = _rss_bytes()
        t0 = time.perf_counter()
        info = {}
        for f in sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]:
            trace = load_trace(f)
            info[f.name] = {"events": len(trace.events), "busy_ns": analysis(trace)}
            del trace
    elif tool == "mxperf-file":  # one file through tracing.jobs.ingest_file, event Parquet included
        import tempfile

        from tracing.ingest.detect import detect_format
        from tracing.jobs import ingest_file

        stream = {"1": True, "0": False}.get(os.environ.get("MXPERF_STREAM", ""))
        base = _rss_bytes()
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mxperf-bench-", dir=os.environ.get("MXPERF_TMP")) as tmp:
            workers = int(os.environ.get("MXPERF_DECODE_WORKERS", "1"))
            r = ingest_file(str(p), detect_format(p), None, tmp, 0, streaming=stream, decode_workers=workers)
            info = {"events": r.num_events, "busy_ns": int(r.devices["busy_ns"].sum()), "streamed": stream}
            cpu = _cpu_seconds()  # load-independent: what K idle cores would overlap
            info.update({k: round(v - cpu0[k], 3) for k, v in cpu.items()})
            if os.environ.get("MXPERF_KEEP_EVENTS"):  # for the duckdb tool (a rename: same disk)
                os.replace(r.staged_events, os.environ["MXPERF_KEEP_EVENTS"])
    elif tool == "mxperf-cli":  # the whole command (MXPERF_ARGS: extra flags), e.g. a rank set
        import shlex
        import tempfile

        from mxperf.cli import main as cli

        base = _rss_bytes()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mxperf-bench-", dir=os.environ.get("MXPERF_TMP")) as tmp:
            out = Path(tmp) / "out"
            args = ["ingest", str(p), "-o", str(out), *shlex.split(os.environ.get("MXPERF_ARGS", ""))]
            if cli(args) != 0:
                raise SystemExit(f"mxperf {' '.join(args)} failed")
            info = _cross_rank_info(out)
    elif tool == "mxperf-load":
        from tracing.ingest.detect import load_trace

        base = _rss_bytes()
        t0 = time.perf_counter()
        info = {"events": len(load_trace(p).events)}
    elif tool == "hta":
        import logging

        from hta.trace_analysis import TraceAnalysis

        logging.disable(logging.WARNING)
        base = _rss_bytes()
        t0 = time.perf_counter()
        ta = TraceAnalysis(trace_dir=str(p))
        idle = ta.get_idle_time_breakdown(visualize=False)[0]
        temporal = ta.get_temporal_breakdown(visualize=False)
        info = {"idle_rows": len(idle), "temporal_rows": len(temporal)}
    elif tool == "gunzip":  # a file, or every file of a directory
        import gzip

        base = _rss_bytes()
        t0 = time.perf_counter()
        n = 0
        for f in sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]:
            with gzip.open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    n += len(chunk)
        info = {"bytes": n}
    elif tool == "duckdb":  # the embedded-engine design: the out-of-core steps over an event Parquet
        import duckdb
        import pyarrow  # noqa: F401 -- the record-batch reader's, imported before the baseline

        con = duckdb.connect()
        base = _rss_bytes()
        t0 = time.perf_counter()
        info = _duckdb_steps(con, p)
    elif tool == "sqlite":
        import sqlite3

        base = _rss_bytes()
        t0 = time.perf_counter()
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        rows = sum(len(con.execute(q).fetchall()) for q in NSYS_QUERIES)
        con.close()
        info = {"rows": rows}
    else:
        raise SystemExit(f"unknown tool {tool!r}")
    seconds = time.perf_counter() - t0
    return {
        "tool": tool,
        "path": path,
        "seconds": seconds,
        "peak_rss_bytes": _peak_bytes() - base,
        "info": info,
    }


DUCKDB_BUSY = """
WITH ops AS (
    SELECT pid, device, start_ns AS s, start_ns + dur_ns AS e FROM read_parquet($p)
    WHERE kind IN ('kernel', 'memcpy', 'memset')),
run AS (
    SELECT *, max(e) OVER (PARTITION BY pid, device ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS run_end FROM ops),
prev AS (SELECT *, lag(run_end) OVER (PARTITION BY pid, device ORDER BY s, e) AS prev_end FROM run),
island AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY pid, device ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS k FROM prev)
SELECT sum(hi - lo) FROM (SELECT max(e) AS hi, min(s) AS lo FROM island GROUP BY pid, device, k)
"""
DUCKDB_JOIN = """
SELECT count(*), sum(o.start_ns - l.start_ns) FROM read_parquet($p) o
JOIN read_parquet($p) l ON o.pid = l.pid AND o.correlation = l.correlation
WHERE o.kind IN ('kernel', 'memcpy', 'memset') AND l.kind IN ('runtime', 'driver') AND o.correlation >= 0
"""
DUCKDB_HOST = """
SELECT pid, tid, start_ns, dur_ns, name FROM read_parquet($p)
WHERE kind IN ('cpu_op', 'runtime', 'driver', 'range') ORDER BY pid, start_ns
"""


def _duckdb_steps(con: object, p: Path) -> dict[str, object]:
    """What the sort-merge design does out of core, as DuckDB queries over the written event Parquet (one
    thread, ``MXPERF_DUCKDB_MEMORY`` limit, spilling to ``MXPERF_TMP``): the device busy union (must equal
    mxperf's busy_ns), the GPU-op-to-launch join, and the host items read back in (pid, start) order."""
    con.execute(f"SET threads = 1; SET memory_limit = '{os.environ.get('MXPERF_DUCKDB_MEMORY', '1GB')}'")
    con.execute(f"SET temp_directory = '{os.environ.get('MXPERF_TMP', '/tmp')}/duckdb-spill'")
    files = (str(p / "*.parquet") if p.is_dir() else str(p)).replace("'", "''")
    lit = f"'{files}'"  # a literal: a bound parameter costs DuckDB 1.5 ~2.5 s on its first query
    seconds = {}
    t = time.perf_counter()
    busy = con.execute(DUCKDB_BUSY.replace("$p", lit)).fetchone()[0]
    seconds["busy"], t = time.perf_counter() - t, time.perf_counter()
    joined = con.execute(DUCKDB_JOIN.replace("$p", lit)).fetchone()[0]
    seconds["join"], t = time.perf_counter() - t, time.perf_counter()
    reader = con.execute(DUCKDB_HOST.replace("$p", lit)).to_arrow_reader(1 << 17)
    host = sum(b.num_rows for b in reader)
    seconds["host_sort"] = time.perf_counter() - t
    return {"busy_ns": int(busy or 0), "joined_ops": int(joined), "host_items": host, "seconds": seconds}


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds of this process and of its reaped children (e.g. ``--workers`` decoders)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_main_s": me.ru_utime + me.ru_stime, "cpu_children_s": kids.ru_utime + kids.ru_stime}


def _full_analysis(trace: object) -> int:
    """``tracing.jobs.analyze``: device metrics, stream breakdown, ranges, kernels, steps, micro-batches."""
    from tracing.jobs import analyze

    return int(analyze(trace)["devices"]["busy_ns"].sum())  # type: ignore[arg-type]


def _hta_scope(trace: object) -> int:
    """Exactly HTA's scope: idle breakdown (streams) + temporal breakdown (devices) + kernel-class totals."""
    from tracing.analysis.kernel_classes import class_totals, kernel_table
    from tracing.analysis.metrics import device_metrics, device_timelines, gpu_ops, stream_breakdown

    events = trace.events  # type: ignore[attr-defined]
    ops = gpu_ops(events)
    dev = device_metrics(events, device_timelines(events, ops))
    stream_breakdown(events, ops=ops)
    class_totals(kernel_table(ops))
    return int(dev["busy_ns"].sum())


def _cross_rank_info(out: Path) -> dict[str, object]:
    """What a rank set's ingest folder says across ranks: rank count, and the slowest rank of each step."""
    import pandas as pd

    devices = pd.read_parquet(out / "devices.parquet")
    info: dict[str, object] = {
        "ranks": int(devices["rank"].nunique()),
        "busy_ns": int(devices["busy_ns"].sum()),
    }
    slow = out / "stragglers.parquet"
    if slow.is_file():
        s = pd.read_parquet(slow)
        info["slowest_rank_by_step"] = dict(
            zip(s["step"].astype(int), s["slowest_rank"].astype(int), strict=True)
        )
    return info


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
