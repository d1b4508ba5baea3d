"""Scale benchmark (#17): peak RSS and time against trace size and against rank count, next to the gunzip floor.

    .venv/bin/python benchmarks/bench_scale.py size --gb 0.25 1 4 [--in-memory-up-to 1]
    .venv/bin/python benchmarks/bench_scale.py ranks --ranks 16 64 256 [--workers 2] [--ray]
    .venv/bin/python benchmarks/bench_scale.py cores --gb 1 --workers 1 2
    .venv/bin/python benchmarks/bench_scale.py engine --gb 1 [--duckdb-memory 256MB 1GB]
    .venv/bin/python benchmarks/bench_scale.py nsys --copies 1 16 64

``size``: one synthetic Kineto trace per size (``make_synthetic_trace.py``: the A100 trace repeated, built in
``--tmp``, deleted after), each ingested in a fresh process (``ingest_worker.py mxperf-file``: decode,
analysis and the event Parquet) by the streaming path and, up to ``--in-memory-up-to`` GB, the in-memory
path; ``gunzip`` is the decompression floor. The busy time must be exactly (repetitions x the A100 trace's).
``--source`` repeats another trace (e.g. a GPU-heavy rank of hta_sampled_2rank: a quarter of its events are GPU
ops, which the stream holds in memory).
``ranks``: a synthetic N-rank set (the two real ranks of tests/data/real/hta_sampled_2rank, time-shifted and
stretched per rank) ingested by the whole command, serially, with ``--workers`` local processes and (``--ray``)
on a local Ray cluster; the slowest rank of every step (stragglers.parquet) must be the one the stretches give.
``cores``: one synthetic trace decoded by 1, 2, ... processes (``--workers K`` with one input), streaming path
(``--source`` as for ``size``).
``engine``: the design choice: the streaming path's overhead over the in-memory path, against DuckDB running
the out-of-core steps (busy union, launch join, host items in (pid, start) order) over the event Parquet it wrote.
``nsys``: the real nsys export with its event tables repeated 1, 16, 64 times (shifted, ids renumbered; with
``--distinct-op-ids`` each copy's emit_nvtx ranges get their own op_id, so every range name is distinct), read
a block of rows at a time (``stream``) and whole (``memory``), next to a plain SELECT's ``fetchall`` (``sqlite``).

Time = wall seconds of the work; memory = peak RSS minus the RSS after imports (the command's largest pool
child included; Ray's workers are separate processes, reported by the driver only). One thread per process.
Prints a table, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_ingest  # this folder: run as a script
from bench_ingest import ENV, ROOT, summary

MAKE = ROOT / "benchmarks" / "make_synthetic_trace.py"

A100_BUSY_NS = 157_500_014  # tests/data/real/hta_a100_ddp_rank0_hostbound.json.gz (README: busy 157.5 ms)


def run_worker(tool: str, path: Path, env: dict[str, str]) -> dict:
    return bench_ingest.run_worker(tool, path, {**ENV, **env})


def make(args: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, str(MAKE), *args], capture_output=True, text=True, env=ENV, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_runs(tools: dict[str, tuple[str, dict[str, str]]], path: Path, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in tools}
    for _ in range(repeats):  # round-robin: the tools share the machine's load
        for name, (tool, env) in tools.items():
            runs[name].append(run_worker(tool, path, env))
            print(f"  {path.name}: {name} {runs[name][-1]['seconds']:.2f} s", file=sys.stderr)
    return {name: summary(rs) for name, rs in runs.items()}


def check_busy(res: dict, repetitions: int, source_busy_ns: int = A100_BUSY_NS) -> None:
    """Mark each tool's busy time exact or not: a synthetic trace's is (repetitions x its source's)."""
    for r in res.values():
        if "busy_ns" in r["info"]:
            r["busy_exact"] = r["info"]["busy_ns"] == repetitions * source_busy_ns


def source_busy_ns(source: Path | None) -> int:
    """The busy time of the trace a synthetic one repeats (the A100 trace's is known; another's is read)."""
    if source is None:
        return A100_BUSY_NS
    sys.path.insert(0, str(ROOT))
    from tracing.jobs import ingest_file

    return int(ingest_file(str(source), "kineto", None, None, 0, streaming=False).devices["busy_ns"].sum())


def by_size(args: argparse.Namespace) -> dict:
    out = {}
    for gb in args.gb:
        trace = args.tmp / f"mxperf_scale_{gb:g}gb.json.gz"
        made = make(
            ["--gb", str(gb), "-o", str(trace), *(["--source", str(args.source)] if args.source else [])]
        )
        tools = {"stream": ("mxperf-file", {"MXPERF_STREAM": "1", "MXPERF_TMP": str(args.tmp)})}
        if gb <= args.in_memory_up_to:
            tools["in-memory"] = ("mxperf-file", {"MXPERF_STREAM": "0", "MXPERF_TMP": str(args.tmp)})
        tools["gunzip"] = ("gunzip", {})
        try:
            res = median_runs(tools, trace, args.repeats)
        finally:
            trace.unlink(missing_ok=True)  # never left behind: 4 GB of JSON is ~0.5 GB gzipped
        check_busy(res, made["repetitions"], source_busy_ns(args.source))
        out[f"{gb:g}GB"] = {"json_bytes": made["uncompressed_bytes"], "events": made["events"], **res}
    return out


def by_cores(args: argparse.Namespace) -> dict:
    """One file decoded by 1, 2, ... processes (``--workers K`` on one input), streaming path."""
    out = {}
    for gb in args.gb:
        trace = args.tmp / f"mxperf_cores_{gb:g}gb.json.gz"
        made = make(
            ["--gb", str(gb), "-o", str(trace), *(["--source", str(args.source)] if args.source else [])]
        )
        tools = {
            f"decode-{k}": (
                "mxperf-file",
                {"MXPERF_STREAM": "1", "MXPERF_DECODE_WORKERS": str(k), "MXPERF_TMP": str(args.tmp)},
            )
            for k in args.workers
        }
        tools["gunzip"] = ("gunzip", {})
        try:
            res = median_runs(tools, trace, args.repeats)
        finally:
            trace.unlink(missing_ok=True)
        check_busy(res, made["repetitions"], source_busy_ns(args.source))
        out[f"{gb:g}GB"] = {"json_bytes": made["uncompressed_bytes"], **res}
    return out


def by_engine(args: argparse.Namespace) -> dict:
    """The design choice by measurement: the sort-merge streaming path against the in-memory path (its
    overhead) and against DuckDB doing the out-of-core steps over the event Parquet the stream writes."""
    out = {}
    for gb in args.gb:
        trace = args.tmp / f"mxperf_engine_{gb:g}gb.json.gz"
        events = args.tmp / f"mxperf_engine_{gb:g}gb.events.parquet"
        made = make(["--gb", str(gb), "-o", str(trace)])
        tmp = {"MXPERF_TMP": str(args.tmp)}
        tools = {
            "stream": ("mxperf-file", {**tmp, "MXPERF_STREAM": "1", "MXPERF_KEEP_EVENTS": str(events)}),
            "in-memory": ("mxperf-file", {**tmp, "MXPERF_STREAM": "0"}),
            "gunzip": ("gunzip", {}),
        }
        try:
            res = median_runs(tools, trace, args.repeats)
            trace.unlink()
            for limit in args.duckdb_memory:
                env = {**tmp, "MXPERF_DUCKDB_MEMORY": limit}
                res[f"duckdb-{limit}"] = median_runs({"d": ("duckdb", env)}, events, args.repeats)["d"]
        finally:
            trace.unlink(missing_ok=True)
            events.unlink(missing_ok=True)
            shutil.rmtree(args.tmp / "duckdb-spill", ignore_errors=True)
        check_busy(res, made["repetitions"])
        out[f"{gb:g}GB"] = {"json_bytes": made["uncompressed_bytes"], "events": made["events"], **res}
    return out


NSYS = ROOT / "tests" / "data" / "real" / "nsysai_h100x2_mfu_before.sqlite"
NSYS_EVENT_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
)


def nsys_copies(out: Path, copies: int, distinct_op_ids: bool = False) -> int:
    """The real nsys export with its event tables repeated ``copies`` times, each copy shifted by the slice's
    extent + 1 ms (no overlap) and its correlation ids renumbered; returns the event rows written.
    ``distinct_op_ids``: each copy's emit_nvtx ranges get their own ``op_id = N`` (copy k: ``op_id = kN``), as
    in one long capture, so every range name is distinct (else the copies repeat the original's names)."""
    import sqlite3

    shutil.copyfile(NSYS, out)
    con = sqlite3.connect(out)
    lo, hi = con.execute('SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    shift = hi - lo + 1_000_000
    corr = max(
        con.execute(f"SELECT coalesce(max(correlationId), 0) FROM {t}").fetchone()[0]
        for t in NSYS_EVENT_TABLES[:-1]
    )
    rows = 0
    for t in NSYS_EVENT_TABLES:
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
        last = con.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0]
        for k in range(1, copies):
            sel = [
                f'"{c}" + {k * shift}'
                if c in ("start", "end")
                else f'"{c}" + {k * (corr + 1)}'
                if c == "correlationId"
                else f"replace(\"{c}\", ', op_id = ', ', op_id = {k}')"
                if c == "text" and distinct_op_ids
                else f'"{c}"'
                for c in cols
            ]
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(f"INSERT INTO {t} ({names}) SELECT {', '.join(sel)} FROM {t} WHERE rowid <= {last}")
        rows += con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    con.commit()
    con.close()
    return rows


def by_nsys(args: argparse.Namespace) -> dict:
    """nsys exports read a block of rows at a time (``stream``) and whole (``memory``), next to the plain
    SELECTs (``sqlite``): peak RSS and time against the export's size; busy must be copies x the original's."""
    out = {}
    base_busy = None
    for copies in sorted(args.copies):
        db = args.tmp / f"mxperf_nsys_x{copies}.sqlite"
        try:
            rows = nsys_copies(db, copies, args.distinct_op_ids)
            tmp = {"MXPERF_TMP": str(args.tmp)}
            tools = {
                "stream": ("mxperf-file", {**tmp, "MXPERF_STREAM": "1"}),
                "memory": ("mxperf-file", {**tmp, "MXPERF_STREAM": "0"}),
                "sqlite": ("sqlite", {}),
            }
            res = median_runs(tools, db, args.repeats)
            size = db.stat().st_size
        finally:
            db.unlink(missing_ok=True)
        if copies == 1:
            base_busy = res["memory"]["info"]["busy_ns"]
        for tool in ("stream", "memory"):
            busy = res[tool]["info"]["busy_ns"]
            res[tool]["busy_exact"] = base_busy is not None and busy == copies * base_busy
            res[tool]["bytes_per_row"] = res[tool]["peak_rss_mb"] * 2**20 / rows
        out[f"x{copies}"] = {"sqlite_bytes": size, "event_rows": rows, **res}
    return out


def by_ranks(args: argparse.Namespace) -> dict:
    out = {}
    for n in args.ranks:
        folder = args.tmp / f"mxperf_ranks_{n}"
        made = make(["--ranks", str(n), "-o", str(folder)])
        stretch = made["stretch_permille"]
        tmp = {"MXPERF_TMP": str(args.tmp)}
        tools = {"serial": ("mxperf-cli", {**tmp, "MXPERF_ARGS": "--no-progress"})}
        if args.workers > 1:
            tools[f"pool-{args.workers}"] = (
                "mxperf-cli",
                {**tmp, "MXPERF_ARGS": f"--workers {args.workers} --no-progress"},
            )
        if args.ray:
            tools["ray-local"] = ("mxperf-cli", {**tmp, "MXPERF_ARGS": "--ray local --no-progress"})
        tools["gunzip"] = ("gunzip", {})
        try:
            res = median_runs(tools, folder, args.repeats)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        truth = slowest_ranks(n, stretch)
        for r in res.values():
            slow = r["info"].get("slowest_rank_by_step")
            if slow:
                r["slowest_rank_exact"] = {int(k): int(v) for k, v in slow.items()} == truth
        out[f"{n}ranks"] = {"json_bytes": made["uncompressed_bytes"], **res}
    return out


def slowest_ranks(n: int, stretch: list[int]) -> dict[int, int]:
    """The slowest rank of each step of a generated set: rank r is source r % 2 stretched by (1000 + s_r)."""
    sys.path.insert(0, str(ROOT))
    from tracing.jobs import ingest_file

    sources = sorted((ROOT / "tests" / "data" / "real" / "hta_sampled_2rank").glob("rank-*.json.gz"))
    per_step = [
        ingest_file(str(p), "kineto", None, None, 0).steps.groupby("step")["seconds"].sum() for p in sources
    ]
    return {
        int(s): max(range(n), key=lambda r: per_step[r % len(sources)][s] * (1000 + stretch[r]))
        for s in per_step[0].index
    }


def table(results: dict) -> str:
    lines = [f"{'case':<12} {'tool':<12} {'median s':>9} {'peak MB':>9}  check"]
    for case, tools in results.items():
        for tool, r in tools.items():
            if not isinstance(r, dict):
                continue
            check = r.get("busy_exact", r.get("slowest_rank_exact", ""))
            lines.append(f"{case:<12} {tool:<12} {r['seconds']:>9.2f} {r['peak_rss_mb']:>9.1f}  {check}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("size")
    s.add_argument("--gb", type=float, nargs="+", default=[0.25, 1.0, 4.0])
    s.add_argument("--in-memory-up-to", type=float, default=1.0, help="GB; larger sizes: streaming only")
    s.add_argument("--source", type=Path, help="the Kineto trace to repeat (default: the A100 trace)")
    r = sub.add_parser("ranks")
    r.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 256])
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--ray", action="store_true", help="also on a local Ray cluster (needs mxperf[ray])")
    c = sub.add_parser("cores")
    c.add_argument("--gb", type=float, nargs="+", default=[1.0])
    c.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    c.add_argument("--source", type=Path, help="the Kineto trace to repeat (default: the A100 trace)")
    e = sub.add_parser("engine")
    e.add_argument("--gb", type=float, nargs="+", default=[1.0])
    e.add_argument("--duckdb-memory", nargs="+", default=["1GB"], help="DuckDB memory_limit values")
    n = sub.add_parser("nsys")
    n.add_argument("--copies", type=int, nargs="+", default=[1, 16, 64])
    n.add_argument(
        "--distinct-op-ids",
        action="store_true",
        help="each copy's emit_nvtx ranges get their own op_id (distinct names)",
    )
    for q in (s, r, c, e, n):
        q.add_argument("--repeats", type=int, default=1)
        q.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where traces are built")
    args = p.parse_args()
    modes = {"size": by_size, "ranks": by_ranks, "cores": by_cores, "engine": by_engine, "nsys": by_nsys}
    results = modes[args.mode](args)
    print(table(results))
    print(json.dumps({"schema_version": 1, "benchmark": f"scale-{args.mode}", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
