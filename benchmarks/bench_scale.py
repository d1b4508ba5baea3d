"""Scale benchmark: whole-process peak RSS and wall time of ``mxperf ingest`` against trace size and rank count.

    .venv/bin/python benchmarks/bench_scale.py size --gb 0.5 1 4 [--mix gpu-heavy|range-dense|a100] [--source F]
    .venv/bin/python benchmarks/bench_scale.py nsys --copies 1 16 64 [--distinct-op-ids]
    .venv/bin/python benchmarks/bench_scale.py ranks --ranks 16 64 256 [--workers 2] [--ray]

Every measurement is the whole command, ``python -m mxperf ingest INPUT -o OUT --no-progress`` run as a child
from a scratch folder with ``PYTHONPATH=--root`` (default: this checkout), start-up and imports included:
wall seconds, CPU seconds and the peak RSS of its process tree (``ingest_worker.measure_command``). The engine's
limits come from the environment as the command reads them (``--memory-limit`` sets ``MXPERF_MEMORY_LIMIT``,
``--threads`` sets ``MXPERF_THREADS``; unset: the command's defaults, 512MB and min(4, cores)).

``size``: one synthetic Kineto trace per size (``make_synthetic_trace.py``: a real trace's events repeated, built
in ``--tmp``, deleted after). ``--mix``: ``gpu-heavy`` = tests/data/real/hta_sampled_2rank/rank-0.json.gz (a
quarter of its events are GPU ops), ``range-dense`` = that trace with every cpu_op wrapped in a user_annotation
(``make_range_dense_source.py``), ``a100`` = the A100 trace; ``--source`` repeats any other. ``gunzip`` (``gzip -dc``
to /dev/null) is the decompression floor. Busy must be exactly (repetitions x the source's busy time).
``nsys``: the real nsys export with its event tables repeated 1, 16, 64 times (shifted, ids renumbered; with
``--distinct-op-ids`` each copy's emit_nvtx ranges get their own op_id, so every range name is distinct), next
to the same SELECTs' ``fetchall`` (``sqlite``, the floor). Busy must be exactly copies x the original's.
``ranks``: a synthetic N-rank set (the two real ranks of tests/data/real/hta_sampled_2rank, time-shifted and
stretched per rank) ingested serially, with ``--workers`` local processes and (``--ray``) on a local Ray cluster;
the slowest rank of every step (stragglers.parquet) must be the one the stretches give, and every cross-rank
table must equal the serial run's.

Repeats run round-robin (the tools share the machine's load); medians are reported with the load average.
Prints a table, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import ingest_worker  # this folder: run as a script

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "data" / "real"
MAKE = ROOT / "benchmarks" / "make_synthetic_trace.py"
MAKE_DENSE = ROOT / "benchmarks" / "make_range_dense_source.py"
WORKER = ROOT / "benchmarks" / "ingest_worker.py"
GPU_HEAVY = REAL / "hta_sampled_2rank" / "rank-0.json.gz"
A100 = REAL / "hta_a100_ddp_rank0_hostbound.json.gz"
NSYS = REAL / "nsysai_h100x2_mfu_before.sqlite"
EXTRA_PATH: list[str] = []  # --extra-path: e.g. a folder Ray was installed into with pip --target
BASE_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
for _var in ("MXPERF_MEMORY_LIMIT", "MXPERF_THREADS", "MXPERF_TEMP_DIR"):
    BASE_ENV.pop(_var, None)  # only what a benchmark sets


def load() -> list[float]:
    """The 1 / 5 / 15-minute load averages (a shared 2-core machine: every timing is read with them)."""
    return [round(x, 2) for x in os.getloadavg()]


def ingest_cmd(
    root: Path,
    inputs: list[Path],
    out: Path,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """``python -m mxperf ingest`` of the tree at ``root`` (run from a scratch folder, so the working directory
    does not shadow ``PYTHONPATH``), and its environment."""
    cmd = [sys.executable, "-m", "mxperf", "ingest", *map(str, inputs), "-o", str(out), "--no-progress"]
    path = os.pathsep.join([str(root), *EXTRA_PATH])
    return [*cmd, *(args or [])], {**BASE_ENV, "PYTHONPATH": path, **(env or {})}


def run_ingest(
    root: Path,
    inputs: list[Path],
    tmp: Path,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    keep: Path | None = None,
) -> dict:
    """One whole ``mxperf ingest`` measured; its output folder read (``keep``: the folder is left there, else
    deleted). Raises with the command's stderr when it fails."""
    scratch = Path(tempfile.mkdtemp(prefix="mxperf-bench-", dir=tmp))
    out = keep or scratch / "out"
    if keep is not None:
        shutil.rmtree(keep, ignore_errors=True)
    try:
        cmd, full_env = ingest_cmd(root, inputs, out, args, env)
        r = ingest_worker.measure_command(cmd, full_env, cwd=str(scratch))
        if r["returncode"] != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {r['returncode']}:\n{r['stderr_tail']}")
        r["info"] = output_info(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    r.pop("stdout", None)
    r.pop("stderr_tail", None)
    return r


def output_info(out: Path) -> dict:
    """What an ingest folder says: busy time, rank count, the slowest rank of each step."""
    import pyarrow.parquet as pq

    devices = pq.read_table(out / "devices.parquet")
    info: dict[str, object] = {
        "busy_ns": int(sum(v or 0 for v in devices["busy_ns"].to_pylist())),
        "ranks": len({r for r in devices["rank"].to_pylist() if r is not None}),
    }
    slow = out / "stragglers.parquet"
    if slow.is_file():
        s = pq.read_table(slow, columns=["step", "slowest_rank"])
        info["slowest_rank_by_step"] = {
            int(k): int(v) for k, v in zip(s["step"].to_pylist(), s["slowest_rank"].to_pylist(), strict=True)
        }
    return info


def run_floor(tool: str, path: Path, tmp: Path) -> dict:
    """A floor measured as a whole process: ``gunzip`` (``gzip -dc`` of a file or every file of a folder, to
    /dev/null) or ``sqlite`` (the nsys SELECTs' fetchall, ``ingest_worker.py sqlite``)."""
    if tool == "gunzip":
        files = sorted(x for x in path.iterdir() if x.is_file()) if path.is_dir() else [path]
        cmd = ["sh", "-c", 'gzip -dc "$@" > /dev/null', "gunzip", *map(str, files)]
    else:
        cmd = [sys.executable, str(WORKER), tool, str(path)]
    r = ingest_worker.measure_command(cmd, BASE_ENV, cwd=str(tmp))
    if r["returncode"] != 0:
        raise SystemExit(f"{tool} on {path} failed:\n{r['stderr_tail']}")
    r.pop("stdout", None)
    r.pop("stderr_tail", None)
    return r


def summary(rs: list[dict]) -> dict:
    """Medians of one tool's runs (seconds, CPU, peak RSS), every run's seconds and peak, the last run's info."""
    out = {
        "seconds": statistics.median(r["seconds"] for r in rs),
        "cpu_s": statistics.median(r["cpu_s"] for r in rs),
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs),
        "max_process_rss_mb": statistics.median(r["max_process_rss_mb"] for r in rs),
        "runs_s": [round(r["seconds"], 3) for r in rs],
        "runs_peak_mb": [round(r["peak_rss_mb"], 1) for r in rs],
        "load": [r["load"] for r in rs],
    }
    if "info" in rs[-1]:
        out["info"] = rs[-1]["info"]
    return out


DEADLINE: list[float] = []  # --stop-at: no run starts after this time (seconds since the epoch)


def round_robin(tools: dict, repeats: int | dict[str, int], label: str) -> dict:
    """``tools``: name -> a function returning one measurement. Each repeat runs every tool once, in turn
    (``repeats``: a number, or per tool). A tool that fails (``SystemExit`` from :func:`run_ingest`: the
    command's error) is recorded with its error and not run again; past ``--stop-at`` nothing more starts (a
    tool never run is recorded as such)."""
    import time

    counts = repeats if isinstance(repeats, dict) else dict.fromkeys(tools, repeats)
    runs: dict[str, list[dict]] = {name: [] for name in tools}
    failed: dict[str, str] = {}
    for i in range(max(counts.values(), default=0)):
        for name, fn in tools.items():
            if name in failed or i >= counts.get(name, 0):
                continue
            if DEADLINE and time.time() > DEADLINE[0]:
                print(f"  {label}: {name} not run: past --stop-at", file=sys.stderr, flush=True)
                continue
            before = load()
            try:
                r = fn()
            except SystemExit as exc:
                failed[name] = str(exc)[-1500:]
                print(f"  {label}: {name} FAILED: {failed[name][-300:]}", file=sys.stderr, flush=True)
                continue
            r["load"] = before
            runs[name].append(r)
            print(
                f"  {label}: {name} {r['seconds']:.2f} s {r['peak_rss_mb']:.0f} MB (load {before[0]})",
                file=sys.stderr,
                flush=True,
            )
    out: dict[str, dict] = {}
    for name, rs in runs.items():
        if name in failed:
            out[name] = {"failed": failed[name]}
        elif not rs:
            out[name] = {"failed": "not run: past --stop-at"}
        else:
            out[name] = summary(rs)
    return out


def set_deadline(stop_at: str | None) -> None:
    """``--stop-at HH:MM`` (UTC, today) as :data:`DEADLINE`."""
    import datetime as dt

    if stop_at:
        hh, mm = map(int, stop_at.split(":"))
        now = dt.datetime.now(dt.UTC)
        DEADLINE[:] = [now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()]


def make(args: list[str]) -> dict:
    """``make_synthetic_trace.py ARGS`` (its JSON line). A trace built before with the same arguments (a
    ``<out>.made.json`` beside it, left by ``--keep-inputs``) is reused."""
    import subprocess

    out = Path(args[args.index("-o") + 1])
    sidecar = out.with_name(out.name + ".made.json")
    if out.exists() and sidecar.exists():
        made = json.loads(sidecar.read_text())
        if made.get("args") == args:
            return made
    proc = subprocess.run(
        [sys.executable, str(MAKE), *args], capture_output=True, text=True, env=BASE_ENV, check=True
    )
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    sidecar.write_text(json.dumps({**made, "args": args}))
    return made


def remove_input(path: Path, keep: bool) -> None:
    """Delete a generated input (a file or a folder) and its sidecar, unless ``keep``."""
    if keep:
        return
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    path.with_name(path.name + ".made.json").unlink(missing_ok=True)


def mix_source(mix: str, tmp: Path) -> Path:
    """The source trace a mix repeats (``range-dense`` is built in ``tmp``)."""
    if mix == "gpu-heavy":
        return GPU_HEAVY
    if mix == "a100":
        return A100
    import subprocess

    dense = tmp / "mxperf_range_dense_source.json.gz"
    if not dense.exists():
        subprocess.run(
            [sys.executable, str(MAKE_DENSE), str(GPU_HEAVY), "-o", str(dense)],
            capture_output=True,
            env=BASE_ENV,
            check=True,
        )
    return dense


def synthetic_path(tmp: Path, kind: str, gb: float) -> Path:
    """Where a synthetic trace of a mix and size is built (shared by bench_scale and bench_engine, so that
    ``--keep-inputs`` lets one reuse the other's)."""
    return tmp / f"mxperf_{kind}_{gb:g}gb.json.gz"


def source_busy_ns(root: Path, source: Path, tmp: Path) -> int:
    """The busy time of the trace a synthetic one repeats, as ``mxperf ingest`` of ``root`` reports it."""
    return int(run_ingest(root, [source], tmp)["info"]["busy_ns"])


def by_size(args: argparse.Namespace) -> dict:
    source = args.source or mix_source(args.mix, args.tmp)
    busy1 = source_busy_ns(args.root, source, args.tmp)
    out: dict[str, dict] = {}
    for gb in args.gb:
        trace = synthetic_path(args.tmp, source.name.split(".")[0] if args.source else args.mix, gb)
        made = make(["--gb", str(gb), "-o", str(trace), "--source", str(source)])
        tools = {
            "mxperf": partial(run_ingest, args.root, [trace], args.tmp, env=args.engine_env),
            "gunzip": partial(run_floor, "gunzip", trace, args.tmp),
        }
        gz_bytes = trace.stat().st_size
        try:
            res = round_robin(tools, args.repeats, f"{gb:g}GB")
        finally:
            remove_input(trace, args.keep_inputs)  # else never left behind: 4 GB of JSON is ~0.5 GB gzipped
        if "info" in res["mxperf"]:
            res["mxperf"]["busy_exact"] = res["mxperf"]["info"]["busy_ns"] == made["repetitions"] * busy1
        out[f"{gb:g}GB"] = {
            "json_bytes": made["uncompressed_bytes"],
            "gz_bytes": gz_bytes,
            "events": made["events"],
            "repetitions": made["repetitions"],
            **res,
        }
    return {"source": str(source), "source_busy_ns": busy1, "cases": out}


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
    """nsys exports of 1, 16, 64 copies: the whole command next to the plain SELECTs (``sqlite``)."""
    base_busy = source_busy_ns(args.root, NSYS, args.tmp)
    out: dict[str, dict] = {}
    for copies in sorted(args.copies):
        db = args.tmp / f"mxperf_nsys_x{copies}.sqlite"
        try:
            rows = nsys_copies(db, copies, args.distinct_op_ids)
            size = db.stat().st_size
            tools = {
                "mxperf": partial(run_ingest, args.root, [db], args.tmp, env=args.engine_env),
                "sqlite": partial(run_floor, "sqlite", db, args.tmp),
            }
            res = round_robin(tools, args.repeats, f"nsys x{copies}")
        finally:
            db.unlink(missing_ok=True)
        if "info" in res["mxperf"]:
            res["mxperf"]["busy_exact"] = res["mxperf"]["info"]["busy_ns"] == copies * base_busy
        out[f"x{copies}"] = {"sqlite_bytes": size, "event_rows": rows, **res}
    return {"source": str(NSYS), "source_busy_ns": base_busy, "cases": out}


CROSS_RANK_SKIP = ("events",)  # per-rank event parts: large, and compared through every table made from them


def tables_of(out: Path) -> dict[str, object]:
    """Every top-level Parquet table of an ingest folder (the per-file event parts aside), read whole."""
    import pyarrow.parquet as pq

    return {p.stem: pq.read_table(p) for p in sorted(out.glob("*.parquet")) if p.stem not in CROSS_RANK_SKIP}


def same_tables(a: dict[str, object], b: dict[str, object]) -> list[str]:
    """The names of the tables that differ between two ingest folders' tables (empty: all equal)."""
    differ = sorted(set(a) ^ set(b))
    for name in sorted(set(a) & set(b)):
        ta, tb = a[name], b[name]
        if not ta.equals(tb):  # type: ignore[attr-defined]
            differ.append(name)
    return differ


def by_ranks(args: argparse.Namespace) -> dict:
    out: dict[str, dict] = {}
    for n in args.ranks:
        folder = args.tmp / f"mxperf_ranks_{n}"
        made = make(["--ranks", str(n), "-o", str(folder)])
        truth = slowest_ranks(args.root, n, made["stretch_permille"], args.tmp)
        modes = {"serial": []}
        if args.workers > 1:
            modes[f"pool-{args.workers}"] = ["--workers", str(args.workers)]
        if args.ray:
            modes["ray-local"] = ["--ray", "local"]
        keep = {name: args.tmp / f"mxperf_ranks_{n}_{name}" for name in modes}
        tools = {
            name: partial(
                run_ingest, args.root, [folder], args.tmp, flags, env=args.engine_env, keep=keep[name]
            )
            for name, flags in modes.items()
        }
        tools["gunzip"] = partial(run_floor, "gunzip", folder, args.tmp)
        try:
            res = round_robin(tools, args.repeats, f"{n} ranks")
            serial = tables_of(keep["serial"]) if "info" in res["serial"] else {}
            for name in modes:
                if "info" not in res[name]:
                    continue
                slow = res[name]["info"].get("slowest_rank_by_step")
                res[name]["slowest_rank_exact"] = bool(slow) and slow == truth
                res[name]["tables_differ_from_serial"] = same_tables(serial, tables_of(keep[name]))
        finally:
            remove_input(folder, args.keep_inputs)
            for k in keep.values():
                shutil.rmtree(k, ignore_errors=True)
        out[f"{n}ranks"] = {"json_bytes": made["uncompressed_bytes"], **res}
    return {"cases": out}


def slowest_ranks(root: Path, n: int, stretch: list[int], tmp: Path) -> dict[int, int]:
    """The slowest rank of each step of a generated set: rank r is source r % 2 stretched by (1000 + s_r); a
    source's step seconds are read from its own ingest (steps.parquet, summed over phases)."""
    import pyarrow.parquet as pq

    sources = sorted((REAL / "hta_sampled_2rank").glob("rank-*.json.gz"))
    per_step: list[dict[int, float]] = []
    for src in sources:
        folder = tmp / f"mxperf_rank_source_{src.stem}"
        try:
            run_ingest(root, [src], tmp, keep=folder)
            steps = pq.read_table(folder / "steps.parquet", columns=["step", "seconds"])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        sums: dict[int, float] = {}
        for s, sec in zip(steps["step"].to_pylist(), steps["seconds"].to_pylist(), strict=True):
            sums[int(s)] = sums.get(int(s), 0.0) + sec
        per_step.append(sums)
    return {
        s: max(range(n), key=lambda r: per_step[r % len(sources)][s] * (1000 + stretch[r]))
        for s in sorted(per_step[0])
    }


def table(results: dict) -> str:
    lines = [f"{'case':<12} {'tool':<12} {'median s':>9} {'CPU s':>8} {'peak MB':>9} {'load':>5}  check"]
    for case, tools in results["cases"].items():
        for tool, r in tools.items():
            if not isinstance(r, dict):
                continue
            if "failed" in r:
                lines.append(f"{case:<12} {tool:<12} FAILED: {r['failed'].splitlines()[-1][:200]}")
                continue
            check = r.get("busy_exact", r.get("slowest_rank_exact", ""))
            if r.get("tables_differ_from_serial"):
                check = f"{check} tables differ: {','.join(r['tables_differ_from_serial'])}"
            lines.append(
                f"{case:<12} {tool:<12} {r['seconds']:>9.2f} {r['cpu_s']:>8.2f} {r['peak_rss_mb']:>9.1f} "
                f"{statistics.median(x[0] for x in r['load']):>5.2f}  {check}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("size")
    s.add_argument("--gb", type=float, nargs="+", default=[0.5, 1.0, 4.0])
    s.add_argument("--mix", choices=("gpu-heavy", "range-dense", "a100"), default="gpu-heavy")
    s.add_argument("--source", type=Path, help="the Kineto trace to repeat (instead of --mix)")
    r = sub.add_parser("ranks")
    r.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 256])
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--ray", action="store_true", help="also on a local Ray cluster (needs mxperf[ray])")
    n = sub.add_parser("nsys")
    n.add_argument("--copies", type=int, nargs="+", default=[1, 16, 64])
    n.add_argument(
        "--distinct-op-ids",
        action="store_true",
        help="each copy's emit_nvtx ranges get their own op_id (distinct names)",
    )
    for q in (s, r, n):
        q.add_argument("--repeats", type=int, default=1)
        q.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where traces are built")
        q.add_argument("--root", type=Path, default=ROOT, help="the mxperf checkout to measure")
        q.add_argument("--memory-limit", help="MXPERF_MEMORY_LIMIT for the ingest (default: the command's)")
        q.add_argument("--threads", type=int, help="MXPERF_THREADS for the ingest (default: the command's)")
        q.add_argument(
            "--extra-path", action="append", default=[], help="appended to the ingest's PYTHONPATH"
        )
        q.add_argument("--keep-inputs", action="store_true", help="leave generated traces in --tmp for reuse")
        q.add_argument("--stop-at", help="HH:MM UTC: start no run after it (the rest is reported as not run)")
    args = p.parse_args(argv)
    set_deadline(args.stop_at)
    EXTRA_PATH[:] = [str(x) for x in args.extra_path]
    args.root = args.root.resolve()
    args.engine_env = {}
    if args.memory_limit:
        args.engine_env["MXPERF_MEMORY_LIMIT"] = args.memory_limit
    if args.threads:
        args.engine_env["MXPERF_THREADS"] = str(args.threads)
    modes = {"size": by_size, "ranks": by_ranks, "nsys": by_nsys}
    start = load()
    results = modes[args.mode](args)
    results.update(
        {"root": str(args.root), "engine_env": args.engine_env, "load_start": start, "load_end": load()}
    )
    print(table(results))
    print(json.dumps({"schema_version": 2, "benchmark": f"scale-{args.mode}", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
