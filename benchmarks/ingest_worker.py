"""One measurement in a fresh process: ``python benchmarks/ingest_worker.py TOOL PATH`` -> one JSON line.

Tools (each imports its libraries first, then records the baseline RSS, then times the work):

- ``mxperf``: ``load_trace`` + ``analyze`` (device metrics, HTA-style stream breakdown, per-range
  attribution, kernel table) -- more than HTA computes below.
- ``mxperf-metrics``: HTA's scope only: load + device metrics (temporal breakdown) + stream breakdown (idle
  breakdown) + kernel-class totals.
- ``hta``: Holistic Trace Analysis 0.5.0 ``TraceAnalysis(trace_dir)`` (default JSON backend) +
  ``get_idle_time_breakdown`` (every rank) + ``get_temporal_breakdown``. PATH is a directory of rank files.
- ``gunzip``: the floor for a .json.gz: stream-decompress it (1 MiB chunks) and discard the bytes.
- ``sqlite``: the floor for an nsys export: the same SELECTs mxperf runs, ``fetchall`` only.
- ``mxperf-file``: ``tracing.jobs.ingest_file`` on one file, event Parquet included (the one engine;
  ``MXPERF_MEMORY_LIMIT`` / ``MXPERF_THREADS`` as the command reads them).
- ``mxperf-cli``: ``mxperf ingest PATH -o TMP/out`` plus ``MXPERF_ARGS`` (e.g. ``--workers 2``, ``--ray local``).

Memory = peak RSS (this process or its largest child, e.g. HTA's parse pool) minus the RSS after imports.
Every tool runs with pyarrow's default memory pool unless the benchmark sets ``ARROW_DEFAULT_MEMORY_POOL``
(its ``hta-system`` case).

:func:`measure_command` is the whole-process measurement the scale and engine benchmarks use instead: a
command run as a child, its wall time, its CPU time and the peak RSS of its whole process tree (sampled every
20 ms, and the kernel's high-water mark of its largest process), imports and start-up included.
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

        base = _rss_bytes()
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mxperf-bench-", dir=os.environ.get("MXPERF_TMP")) as tmp:
            r = ingest_file(str(p), detect_format(p), None, tmp, 0)
            info = {"events": r.num_events, "busy_ns": _busy_ns(r.devices)}
            cpu = _cpu_seconds()
            info.update({k: round(v - cpu0[k], 3) for k, v in cpu.items()})
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
        idle = ta.get_idle_time_breakdown(ranks=ta.t.get_ranks(), visualize=False)[0]
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


def _busy_ns(devices: object) -> int:
    """The summed ``busy_ns`` of a devices table, a pandas frame or an Arrow table."""
    col = devices["busy_ns"]  # type: ignore[index]
    if hasattr(col, "to_pylist"):  # pyarrow
        return int(sum(v or 0 for v in col.to_pylist()))
    return int(col.sum())


def _tree_rss(pid: int, hwm: dict[int, int]) -> int:
    """RSS of ``pid`` and every process below it (``/proc/PID/task/TID/children``), 0 once it has gone; each
    process's high-water RSS (``VmHWM``) is recorded in ``hwm``."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        hwm[p] = max(hwm.get(p, 0), int(line.split()[1]) * 1024)
                    elif line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def measure_command(
    cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None, interval: float = 0.02
) -> dict[str, object]:
    """Run ``cmd`` as a child: wall seconds, CPU seconds (user + system, its reaped children included), the peak
    RSS of its whole process tree (the sum over the tree, sampled every ``interval`` s), the largest high-water
    RSS of one process of it (``VmHWM``, read at each sample: it also catches a peak between samples), stdout
    and the tail of stderr. ``peak_rss_mb`` is the larger of the two. (``wait4``'s ``ru_maxrss`` is not used:
    Linux carries the parent's high-water mark into a child across fork + exec, so it reads at least the
    benchmark process's own RSS.)"""
    import subprocess
    import tempfile
    import threading

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        peak = [0]
        hwm: dict[int, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while True:
                peak[0] = max(peak[0], _tree_rss(proc.pid, hwm))
                if stop.wait(interval):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    largest = max(hwm.values(), default=0)
    return {
        "returncode": proc.returncode,
        "seconds": seconds,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "tree_peak_mb": peak[0] / 2**20,
        "max_process_rss_mb": largest / 2**20,
        "peak_rss_mb": max(peak[0], largest) / 2**20,
        "processes": len(hwm),
        "stdout": stdout,
        "stderr_tail": stderr[-3000:],
    }


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds of this process and of its reaped children (e.g. ``--workers`` decoders)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_main_s": me.ru_utime + me.ru_stime, "cpu_children_s": kids.ru_utime + kids.ru_stime}


def _full_analysis(trace: object) -> int:
    """``tracing.jobs.analyze``: device metrics, stream breakdown, ranges, kernels, steps, micro-batches."""
    from tracing.jobs import analyze

    return _busy_ns(analyze(trace)["devices"])  # type: ignore[arg-type]


def _hta_scope(trace: object) -> int:
    """Exactly HTA's scope: idle breakdown (streams) + temporal breakdown (devices) + kernel-class totals."""
    from tracing.analysis.kernel_classes import class_totals, kernel_table
    from tracing.analysis.metrics import device_metrics, device_timelines, gpu_ops, stream_breakdown

    events = trace.events  # type: ignore[attr-defined]
    ops = gpu_ops(events)
    dev = device_metrics(events, device_timelines(events, ops))
    stream_breakdown(events, ops=ops)
    class_totals(kernel_table(ops))
    return _busy_ns(dev)


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
