"""The trace engine measured: today's DuckDB engine against the hand-written one it replaced, and against HTA.

    .venv/bin/python benchmarks/bench_engine.py engines --old-root /tmp/mxperf-old [--inputs gpu-heavy:1
        range-dense:1 nsys:64] [--limits 64MB 128MB 256MB] [--threads 1 2] [--repeats 3]
    .venv/bin/python benchmarks/bench_engine.py hta --hta-python VENV/bin/python TRACE [TRACE ...] [--pairs 5]
    .venv/bin/python benchmarks/bench_engine.py loc

``engines``: each input (``gpu-heavy:GB`` / ``range-dense:GB``: a synthetic Kineto trace of that many GB of JSON,
``make_synthetic_trace.py`` repeating tests/data/real/hta_sampled_2rank/rank-0.json.gz, or that trace with every
cpu_op wrapped in a range (``make_range_dense_source.py``); ``nsys:N``: the real nsys export's event tables
repeated N times, ``bench_scale.nsys_copies``) is ingested by the whole command ``python -m mxperf ingest IN -o
OUT --no-progress`` of two trees with the same interpreter and packages: the old engine (``--old-root``, a
``git worktree add /tmp/mxperf-old e8dc5f6``: numpy sort-merge joins, spill files, window accumulators; run with
``--stream on``, its bounded-memory path) and the new one (``--new-root``, default this checkout) at every
``MXPERF_MEMORY_LIMIT`` x ``MXPERF_THREADS`` of ``--limits`` x ``--threads``. Repeats run round-robin (every
configuration once per repeat, so all share the machine's load). Reported per configuration: median wall
seconds, CPU seconds and the peak RSS of the whole process tree (``ingest_worker.measure_command``), the load
average before each run, whether busy is exact (repetitions x the source's busy time) and whether
devices.parquet, kernels.parquet and steps.parquet equal the old engine's (Arrow ``Table.equals``: same
columns, types and values in the same order; if not, whether the same rows in another order).

``hta``: whole-process ``mxperf ingest TRACE -o OUT --force --no-progress`` (every table) against Holistic Trace
Analysis 0.5.0 in its own venv (``--hta-python``; HTA's scope: ``TraceAnalysis`` load + idle-time breakdown of
every rank + temporal breakdown), one warm-up each, then ``--pairs`` rounds (HTA, mxperf, the floor, ...):
median of the per-round ratios HTA / mxperf per trace, with min and max; the floor (a process importing the
libraries the ingest imports and opening a DuckDB connection, no work) and HTA / floor, the most any run could
reach; and the cores the machine gave before and after (``bench_startup.side_by_side``: 1.0 = two free cores).

``loc``: lines of Python each engine needs (``wc -l``): the old one = the tracing/ modules commit 0e8ed4f deleted
(at e8dc5f6) plus the lines it removed from the modules it kept (the in-memory twins of the deleted
machinery); the new one = engine.py, gpu_tables.py, range_tables.py, mb_engine.py and decoded.py plus the lines
0e8ed4f added to the modules it kept; and all of tracing/ at e8dc5f6 and at the new tree's HEAD.

Every subcommand prints a table, then one JSON line with every number. Generated inputs live in ``--tmp`` and
are deleted after their case; the new and old trees are compiled first (``compileall``: a first run writes
bytecode on a user's machine; this sandbox sets ``PYTHONDONTWRITEBYTECODE``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import bench_scale  # this folder: run as a script
import ingest_worker
from bench_scale import BASE_ENV, ROOT, load, round_robin

OLD_COMMIT = "e8dc5f6"  # the last tree with the hand-written engine
CUT_COMMIT = "0e8ed4f"  # the commit that replaced it
NEW_MODULES = (
    "tracing/ingest/engine.py",
    "tracing/analysis/gpu_tables.py",
    "tracing/analysis/range_tables.py",
    "tracing/analysis/mb_engine.py",
    "tracing/ingest/decoded.py",
)
COMPARED = ("devices", "kernels", "steps")
# columns a later change (not the engine) made differ from e8dc5f6: compared apart, the rest must be exact
CHANGED_SINCE_OLD = {
    "kernels": ("kernel_class",)
}  # 0d1b88b (#32 item 3): kernel classes from a pattern table


def compile_tree(root: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "mxperf", "tracing"],
        cwd=root,
        env={k: v for k, v in BASE_ENV.items() if k != "PYTHONDONTWRITEBYTECODE"},
        check=True,
        capture_output=True,
    )


# ---------------------------------------------------------------------------------------------- engines


def make_input(spec: str, tmp: Path) -> dict:
    """Build one input (``gpu-heavy:GB``, ``range-dense:GB``, ``nsys:COPIES``) in ``tmp``: its path, the source
    it repeats and how many times."""
    kind, _, size = spec.partition(":")
    if kind == "nsys":
        copies = int(size or 64)
        db = tmp / f"mxperf_engine_nsys_x{copies}.sqlite"
        db.unlink(missing_ok=True)
        rows = bench_scale.nsys_copies(db, copies)
        return {"path": db, "source": bench_scale.NSYS, "repetitions": copies, "event_rows": rows}
    if kind not in ("gpu-heavy", "range-dense"):
        raise SystemExit(f"unknown input {spec!r}: gpu-heavy:GB, range-dense:GB or nsys:COPIES")
    gb = float(size or 1)
    source = bench_scale.mix_source(kind, tmp)
    trace = bench_scale.synthetic_path(tmp, kind, gb)
    made = bench_scale.make(["--gb", str(gb), "-o", str(trace), "--source", str(source)])
    return {
        "path": trace,
        "source": source,
        "repetitions": made["repetitions"],
        "json_bytes": made["uncompressed_bytes"],
        "events": made["events"],
    }


def compare_tables(a: Path, b: Path) -> dict[str, str]:
    """devices / kernels / steps of two ingest folders: ``exact`` (Arrow ``equals``), ``same rows, other order``,
    or what differs."""
    import pyarrow.parquet as pq

    out = {}
    for name in COMPARED:
        ta, tb = pq.read_table(a / f"{name}.parquet"), pq.read_table(b / f"{name}.parquet")
        aside = [c for c in CHANGED_SINCE_OLD.get(name, ()) if c in ta.column_names and c in tb.column_names]
        note = ""
        if aside and not ta.equals(tb):
            differ = [c for c in aside if not ta[c].equals(tb[c])]
            ta, tb = ta.drop_columns(aside), tb.drop_columns(aside)
            note = f" ({', '.join(differ)} aside: reclassified since {OLD_COMMIT})" if differ else ""
        if ta.equals(tb):
            out[name] = "exact" + note
        elif ta.column_names != tb.column_names:
            out[name] = f"columns differ: {sorted(set(ta.column_names) ^ set(tb.column_names))}"
        elif ta.num_rows != tb.num_rows:
            out[name] = f"rows differ: {ta.num_rows} vs {tb.num_rows}"
        elif ta.schema != tb.schema:
            out[name] = f"types differ: {ta.schema} vs {tb.schema}".replace("\n", ", ")
        else:
            keys = [(c, "ascending") for c in ta.column_names]
            same = ta.sort_by(keys).equals(tb.sort_by(keys))
            if same:
                out[name] = "same rows, other order"
            else:
                cols = [c for c in ta.column_names if not ta[c].equals(tb[c])]
                out[name] = f"values differ in {cols}"
    return out


def engine_configs(args: argparse.Namespace) -> dict[str, tuple[Path, list[str], dict[str, str]]]:
    """name -> (tree, extra flags, environment) for the old engine and every new-engine setting."""
    configs = {"old (--stream on)": (args.old_root, ["--stream", "on"], {})}
    settings = (
        [s.split(":") for s in args.settings]
        if args.settings
        else [(limit, str(threads)) for limit in args.limits for threads in args.threads]
    )
    for limit, threads in settings:
        env = {"MXPERF_MEMORY_LIMIT": limit, "MXPERF_THREADS": threads}
        configs[f"new {limit} {threads}T"] = (args.new_root, [], env)
    return configs


def _one_run(root: Path, flags: list[str], env: dict[str, str], path: Path, tmp: Path, keep: Path) -> dict:
    """One ingest of ``path``; the first run of a configuration leaves its output at ``keep`` (compared later)."""
    return bench_scale.run_ingest(root, [path], tmp, flags, env, keep=None if keep.exists() else keep)


def engines(args: argparse.Namespace) -> dict:
    for root in (args.old_root, args.new_root):
        compile_tree(root)
    configs = engine_configs(args)
    cases = {}
    for spec in args.inputs:
        made = make_input(spec, args.tmp)
        path: Path = made["path"]
        keep = {name: args.tmp / f"mxperf_engine_out_{i}" for i, name in enumerate(configs)}
        for k in keep.values():
            shutil.rmtree(k, ignore_errors=True)
        try:
            busy1 = bench_scale.source_busy_ns(args.new_root, made["source"], args.tmp)
            tools = {
                name: partial(_one_run, root, flags, env, path, args.tmp, keep[name])
                for name, (root, flags, env) in configs.items()
            }
            full = {next(iter(configs)), *(f"new {c}T" for c in args.repeated)}
            counts = {name: args.repeats if name in full else args.matrix_repeats for name in configs}
            res = round_robin(tools, counts, spec)
            old = next(iter(configs))
            for name, r in res.items():
                if "failed" in r:
                    continue
                r["busy_exact"] = r["info"]["busy_ns"] == made["repetitions"] * busy1
                r["tables_vs_old"] = (
                    compare_tables(keep[old], keep[name]) if name != old and "failed" not in res[old] else {}
                )
        finally:
            bench_scale.remove_input(path, args.keep_inputs and not spec.startswith("nsys"))
            for k in keep.values():
                shutil.rmtree(k, ignore_errors=True)
        made["path"] = str(path)
        made["source"] = str(made["source"])
        cases[spec] = {**made, "source_busy_ns": busy1, **res}
    return {"cases": cases, "loc": lines_of_code(args.new_root)}


def engines_table(results: dict) -> str:
    lines = [
        f"{'input':<16} {'engine':<20} {'runs':>4} {'median s':>9} {'CPU s':>7} {'peak MB':>8} {'x old s':>7} "
        f"{'x old MB':>8} {'load':>5}  busy  tables vs old"
    ]
    for spec, case in results["cases"].items():
        runs = {k: v for k, v in case.items() if isinstance(v, dict) and ("seconds" in v or "failed" in v)}
        old = next(iter(runs.values()))
        for name, r in runs.items():
            if "failed" in r:
                lines.append(f"{spec:<16} {name:<20} FAILED: {r['failed'].strip().splitlines()[-1][:160]}")
                continue
            tables = r["tables_vs_old"]
            exact = all(v.startswith("exact") for v in tables.values())
            verdict = (
                "-"
                if not tables
                else ("all exact" if exact else "; ".join(f"{k}: {v}" for k, v in tables.items()))
            )
            if tables and exact and any(v != "exact" for v in tables.values()):
                verdict += " (kernel_class aside)"
            vs = (
                f"{r['seconds'] / old['seconds']:>7.2f} {r['peak_rss_mb'] / old['peak_rss_mb']:>8.2f}"
                if "seconds" in old
                else f"{'-':>7} {'-':>8}"
            )
            lines.append(
                f"{spec:<16} {name:<20} {len(r['runs_s']):>4} {r['seconds']:>9.2f} {r['cpu_s']:>7.2f} "
                f"{r['peak_rss_mb']:>8.1f} {vs} {statistics.median(x[0] for x in r['load']):>5.2f}  "
                f"{r['busy_exact']!s:<5} {verdict}"
            )
    return "\n".join(lines)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def _lines_at(root: Path, commit: str, path: str) -> int:
    return _git(root, "show", f"{commit}:{path}").count("\n")


def lines_of_code(root: Path) -> dict:
    """Lines of Python of each engine (see the module docstring); ``root``: the new tree (its git history has
    both commits)."""
    status = _git(root, "diff", "--name-status", OLD_COMMIT, CUT_COMMIT, "--", "tracing")
    deleted = [line.split("\t")[1] for line in status.splitlines() if line.startswith("D")]
    kept = [line.split("\t")[1] for line in status.splitlines() if line.startswith("M")]
    numstat = {
        line.split("\t")[2]: (int(line.split("\t")[0]), int(line.split("\t")[1]))
        for line in _git(root, "diff", "--numstat", OLD_COMMIT, CUT_COMMIT, "--", *kept).splitlines()
    }
    old_modules = {p: _lines_at(root, OLD_COMMIT, p) for p in deleted if p.endswith(".py")}
    new_modules = {p: (root / p).read_text().count("\n") for p in NEW_MODULES if (root / p).exists()}
    removed = sum(d for _, d in numstat.values())
    added = sum(a for a, _ in numstat.values())

    def tracing_total(commit: str) -> int:
        files = [
            p
            for p in _git(root, "ls-tree", "-r", "--name-only", commit, "tracing").split()
            if p.endswith(".py")
        ]
        return sum(_lines_at(root, commit, p) for p in files)

    head = _git(root, "rev-parse", "--short", "HEAD").strip()
    tests = _git(root, "diff", "--numstat", OLD_COMMIT, CUT_COMMIT, "--", "tests").splitlines()
    return {
        "test_lines_removed_by_cut": sum(int(x.split("\t")[1]) for x in tests if x.split("\t")[1] != "-"),
        "test_lines_added_by_cut": sum(int(x.split("\t")[0]) for x in tests if x.split("\t")[0] != "-"),
        "old_modules": old_modules,
        "old_modules_total": sum(old_modules.values()),
        "old_twin_lines_removed_from_kept_modules": removed,
        "old_total": sum(old_modules.values()) + removed,
        "new_modules": new_modules,
        "new_modules_total": sum(new_modules.values()),
        "new_modules_missing": [p for p in NEW_MODULES if p not in new_modules],
        "new_lines_added_to_kept_modules": added,
        "new_total": sum(new_modules.values()) + added,
        "kept_modules_changed": numstat,
        "tracing_lines_old": tracing_total(OLD_COMMIT),
        "tracing_lines_new": tracing_total("HEAD"),
        "new_head": head,
    }


def loc_table(loc: dict) -> str:
    return "\n".join(
        [
            f"old engine ({OLD_COMMIT}): {loc['old_modules_total']} lines in {len(loc['old_modules'])} modules deleted "
            f"by {CUT_COMMIT} + {loc['old_twin_lines_removed_from_kept_modules']} lines it removed from kept "
            f"modules = {loc['old_total']}",
            f"new engine ({loc['new_head']}): {loc['new_modules_total']} lines in {len(loc['new_modules'])} modules "
            f"+ {loc['new_lines_added_to_kept_modules']} lines {CUT_COMMIT} added to kept modules = "
            f"{loc['new_total']}",
            f"tracing/ in all: {loc['tracing_lines_old']} ({OLD_COMMIT}) -> {loc['tracing_lines_new']} "
            f"({loc['new_head']}); tests/: {CUT_COMMIT} removed {loc['test_lines_removed_by_cut']} lines, added "
            f"{loc['test_lines_added_by_cut']}",
        ]
    )


# ---------------------------------------------------------------------------------------------- HTA


def past_deadline() -> bool:
    import time

    return bool(bench_scale.DEADLINE) and time.time() > bench_scale.DEADLINE[0]


def _measured(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    r = ingest_worker.measure_command(cmd, env, cwd=str(cwd))
    if r["returncode"] != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r['returncode']}:\n{r['stderr_tail']}")
    return r


# the libraries every `mxperf ingest` imports, and a DuckDB connection: the whole run's floor with no work
FLOOR_CODE = "import msgspec, numpy, pyarrow, pyarrow.parquet, duckdb; duckdb.connect().close()"


def hta_pairs(args: argparse.Namespace) -> dict:
    import bench_startup

    compile_tree(args.new_root)
    before = bench_startup.side_by_side()
    rows = []
    for trace in args.traces:
        trace = trace.resolve()
        scratch = Path(tempfile.mkdtemp(prefix="mxperf-hta-", dir=args.tmp))
        try:
            hta_dir = scratch / "hta"
            hta_dir.mkdir()
            (hta_dir / trace.name).symlink_to(trace)  # HTA reads a folder of rank files
            ingest, env = bench_scale.ingest_cmd(args.new_root, [trace], scratch / "out", ["--force"])
            hta = [str(args.hta_python), "-c", bench_startup.HTA_CODE, str(hta_dir)]
            floor = [sys.executable, "-c", FLOOR_CODE]

            run = partial(_measured, cwd=scratch)
            if past_deadline():
                print(f"  {trace.name}: not run: past --stop-at", file=sys.stderr, flush=True)
                continue
            run(hta, BASE_ENV), run(ingest, env)  # warm the page cache for both
            pairs = []
            for _ in range(args.pairs):
                if past_deadline():
                    break
                lo = load()
                h, m, f = run(hta, BASE_ENV), run(ingest, env), run(floor, env)
                pairs.append(
                    {
                        "hta_s": h["seconds"],
                        "mxperf_s": m["seconds"],
                        "floor_s": f["seconds"],
                        "hta_mb": h["peak_rss_mb"],
                        "mxperf_mb": m["peak_rss_mb"],
                        "load": lo,
                    }
                )
                print(
                    f"  {trace.name}: HTA {h['seconds']:.2f} s, mxperf {m['seconds']:.2f} s (load {lo[0]})",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not pairs:
            continue
        ratios = [p["hta_s"] / p["mxperf_s"] for p in pairs]
        rows.append(
            {
                "trace": str(trace),
                "gz_bytes": trace.stat().st_size,
                "pairs": len(pairs),
                "hta_median_s": statistics.median(p["hta_s"] for p in pairs),
                "mxperf_median_s": statistics.median(p["mxperf_s"] for p in pairs),
                "floor_median_s": statistics.median(p["floor_s"] for p in pairs),
                # HTA / the floor, pair by pair: the ratio a run doing no work at all would reach
                "ceiling_median": statistics.median(p["hta_s"] / p["floor_s"] for p in pairs),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "hta_peak_mb": statistics.median(p["hta_mb"] for p in pairs),
                "mxperf_peak_mb": statistics.median(p["mxperf_mb"] for p in pairs),
                "load_1min": [p["load"][0] for p in pairs],
                "runs": pairs,
            }
        )
    after = bench_startup.side_by_side()
    medians = [r["ratio_median"] for r in rows]
    return {
        "rows": rows,
        "median_of_trace_medians": statistics.median(medians) if medians else None,
        "lowest_trace_median": min(medians) if medians else None,
        "side_by_side": {"before": round(before, 3), "after": round(after, 3)},
    }


def hta_table(results: dict) -> str:
    lines = [
        f"{'trace':<44} {'MB gz':>6} {'HTA s':>7} {'mxperf s':>9} {'floor s':>8} {'HTA/mxperf':>10} [min, max]  "
        "HTA/floor  load"
    ]
    for r in results["rows"]:
        lines.append(
            f"{Path(r['trace']).name[:44]:<44} {r['gz_bytes'] / 1e6:>6.2f} {r['hta_median_s']:>7.2f} "
            f"{r['mxperf_median_s']:>9.2f} {r['floor_median_s']:>8.3f} {r['ratio_median']:>10.2f} "
            f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]  {r['ceiling_median']:>9.2f}  "
            f"{statistics.median(r['load_1min']):.2f}"
        )
    s = results["side_by_side"]
    if not results["rows"]:
        return "\n".join([*lines, "no trace measured"])
    lines.append(
        f"median of the traces' medians {results['median_of_trace_medians']:.2f}x, lowest "
        f"{results['lowest_trace_median']:.2f}x; two CPU-bound processes side by side / one alone: "
        f"{s['before']:.2f} before, {s['after']:.2f} after (1.0 = two free cores, 2.0 = one)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("engines")
    e.add_argument("--inputs", nargs="+", default=["gpu-heavy:1", "range-dense:1", "nsys:64"])
    e.add_argument(
        "--limits", nargs="+", default=["64MB", "128MB", "256MB"], help="MXPERF_MEMORY_LIMIT values"
    )
    e.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="MXPERF_THREADS values")
    e.add_argument("--settings", nargs="+", help="LIMIT:THREADS pairs instead of --limits x --threads")
    e.add_argument("--repeats", type=int, default=3, help="runs of the old engine and of --repeated settings")
    e.add_argument(
        "--matrix-repeats", type=int, help="runs of every other new-engine setting (default: --repeats)"
    )
    e.add_argument(
        "--repeated",
        nargs="*",
        help="new-engine settings run --repeats times, as LIMIT:THREADS (e.g. 256MB:2); default: all",
    )
    e.add_argument(
        "--old-root", type=Path, default=Path("/tmp/mxperf-old"), help=f"a worktree at {OLD_COMMIT}"
    )
    e.add_argument(
        "--keep-inputs", action="store_true", help="leave generated Kineto traces in --tmp for reuse"
    )
    h = sub.add_parser("hta")
    h.add_argument("traces", type=Path, nargs="+")
    h.add_argument("--hta-python", type=Path, required=True, help="a python with holistictraceanalysis 0.5.0")
    h.add_argument("--pairs", type=int, default=5)
    lo = sub.add_parser("loc")
    for q in (e, h, lo):
        q.add_argument("--stop-at", help="HH:MM UTC: start no run after it (the rest is reported as not run)")
        q.add_argument("--new-root", type=Path, default=ROOT, help="the mxperf checkout to measure")
        q.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where inputs are built")
    args = p.parse_args(argv)
    args.new_root = args.new_root.resolve()
    bench_scale.set_deadline(args.stop_at)
    if args.mode == "engines":
        if args.matrix_repeats is None:
            args.matrix_repeats = args.repeats
        if args.repeated is None:
            args.repeated = args.settings or [f"{limit} {t}" for limit in args.limits for t in args.threads]
        args.repeated = [r.replace(":", " ") for r in args.repeated]
    start = load()
    if args.mode == "engines":
        args.old_root = args.old_root.resolve()
        results = engines(args)
        text = engines_table(results) + "\n" + loc_table(results["loc"])
    elif args.mode == "hta":
        results = hta_pairs(args)
        text = hta_table(results)
    else:
        results = {"loc": lines_of_code(args.new_root)}
        text = loc_table(results["loc"])
    results.update({"new_root": str(args.new_root), "load_start": start, "load_end": load()})
    print(text)
    print(
        json.dumps({"schema_version": 1, "benchmark": f"engine-{args.mode}", "results": results}, default=str)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
