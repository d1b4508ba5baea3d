"""Ingest benchmark: mxperf vs Holistic Trace Analysis 0.5.0, and against the I/O floors. One thread.

    .venv/bin/python benchmarks/bench_ingest.py [--repeats 3] [--synthetic-gb 1.0] [--skip-hta]

Cases (each measurement is a fresh subprocess, ``benchmarks/ingest_worker.py``; tools alternate round-robin
within each repeat, so they share the machine's load; medians are reported):

1. the A100 Kineto trace: ``mxperf`` (load + device metrics + HTA-style stream breakdown + per-range
   attribution + kernel classes), ``mxperf-metrics`` (HTA's scope only) vs ``hta`` (TraceAnalysis load + idle-time
   breakdown + temporal breakdown, default JSON backend) vs ``gunzip`` (the decompression floor);
2. the 2-rank sample (a directory of two rank files): ``mxperf``, ``mxperf-metrics`` (both
   serial, one process) vs ``hta`` (its default fork pool, one file per child) and ``hta-system`` (the same
   with Arrow's system allocator);
3. the nsys export: ``mxperf-load`` (load_nsys_events) vs ``sqlite`` (the same SELECTs, fetchall only);
4. with ``--synthetic-gb``: a synthetic Kineto trace of that uncompressed size (built in /tmp by
   ``make_synthetic_trace.py``, never in the repo): ``mxperf`` vs ``gunzip``.

Time = wall seconds of the work; memory = peak RSS minus the RSS after imports (HTA's parse pool child
included). Prints a table, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "data" / "real"
WORKER = ROOT / "benchmarks" / "ingest_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def measure(tool: str, path: Path) -> dict:
    """``tool`` is a worker tool; ``hta-system`` is ``hta`` with Arrow's system allocator."""
    env = ENV
    if tool == "hta-system":  # HTA with the C library's malloc instead of its default pool
        tool, env = "hta", {**ENV, "ARROW_DEFAULT_MEMORY_POOL": "system"}
    return run_worker(tool, path, env)


def run_worker(tool: str, path: Path, env: dict[str, str]) -> dict:
    """One fresh ``ingest_worker.py`` process: its JSON line (seconds, peak_rss_bytes, info)."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), tool, str(path)], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tool} on {path} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(rs: list[dict]) -> dict:
    """Median seconds and peak RSS (MB) of one tool's runs, every run's seconds, the last run's info."""
    return {
        "seconds": statistics.median(r["seconds"] for r in rs),
        "peak_rss_mb": statistics.median(r["peak_rss_bytes"] for r in rs) / 2**20,
        "runs": [round(r["seconds"], 4) for r in rs],
        "info": rs[-1]["info"],
    }


def run_case(name: str, tools: list[tuple[str, Path]], repeats: int) -> dict:
    runs: dict[str, list[dict]] = {t: [] for t, _ in tools}
    for _ in range(repeats):
        for tool, path in tools:
            runs[tool].append(measure(tool, path))
            print(f"  {name}: {tool} {runs[tool][-1]['seconds']:.3f} s", file=sys.stderr)
    return {tool: summary(rs) for tool, rs in runs.items()}


def table(results: dict) -> str:
    lines = [f"{'case':<18} {'tool':<15} {'median s':>9} {'peak MB':>9}"]
    for case, tools in results.items():
        for tool, r in tools.items():
            lines.append(f"{case:<18} {tool:<15} {r['seconds']:>9.3f} {r['peak_rss_mb']:>9.1f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-hta", action="store_true", help="when holistictraceanalysis is not installed")
    p.add_argument(
        "--synthetic-gb", type=float, default=0.0, help="also run the synthetic trace of this size"
    )
    p.add_argument("--synthetic-path", type=Path, help="reuse an existing synthetic trace")
    args = p.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mxperf-bench-") as tmp:
        a100_dir = Path(tmp) / "a100"
        a100_dir.mkdir()
        (a100_dir / "rank-0.json.gz").symlink_to(REAL / "hta_a100_ddp_rank0_hostbound.json.gz")
        hta = [] if args.skip_hta else [("hta", a100_dir)]
        results["a100"] = run_case(
            "a100",
            [
                ("mxperf", a100_dir),
                ("mxperf-metrics", a100_dir),
                *hta,
                ("gunzip", a100_dir / "rank-0.json.gz"),
            ],
            args.repeats,
        )
        hta2 = (
            []
            if args.skip_hta
            else [("hta", REAL / "hta_sampled_2rank"), ("hta-system", REAL / "hta_sampled_2rank")]
        )
        results["sampled_2rank"] = run_case(
            "sampled_2rank",
            [
                ("mxperf", REAL / "hta_sampled_2rank"),
                ("mxperf-metrics", REAL / "hta_sampled_2rank"),
                *hta2,
            ],
            args.repeats,
        )
        nsys = REAL / "nsysai_h100x2_mfu_before.sqlite"
        results["nsys"] = run_case("nsys", [("mxperf-load", nsys), ("sqlite", nsys)], args.repeats)
        if args.synthetic_gb or args.synthetic_path:
            synth = (
                args.synthetic_path
                or Path(tempfile.gettempdir()) / f"mxperf_synth_{args.synthetic_gb:g}gb.json.gz"
            )
            if not synth.exists():
                gen = subprocess.run(
                    [
                        sys.executable,
                        str(ROOT / "benchmarks" / "make_synthetic_trace.py"),
                        "--gb",
                        str(args.synthetic_gb),
                        "-o",
                        str(synth),
                    ],
                    capture_output=True,
                    text=True,
                    env=ENV,
                    check=True,
                )
                print(gen.stdout.strip(), file=sys.stderr)
            results["synthetic"] = run_case(
                "synthetic", [("mxperf", synth), ("gunzip", synth)], max(1, args.repeats // 2)
            )
    summary = {}
    if "hta" in results["a100"]:
        for case in ("a100", "sampled_2rank"):
            m, h = results[case]["mxperf"], results[case]["hta"]
            summary[f"{case}_speedup_vs_hta"] = h["seconds"] / m["seconds"]
            summary[f"{case}_memory_vs_hta"] = m["peak_rss_mb"] / h["peak_rss_mb"]
        summary["sampled_2rank_memory_vs_hta_system_pool"] = (
            results["sampled_2rank"]["mxperf"]["peak_rss_mb"]
            / results["sampled_2rank"]["hta-system"]["peak_rss_mb"]
        )
        summary["sampled_2rank_same_metrics_speedup_vs_hta"] = (
            results["sampled_2rank"]["hta"]["seconds"] / results["sampled_2rank"]["mxperf-metrics"]["seconds"]
        )
        summary["a100_same_metrics_speedup_vs_hta"] = (
            results["a100"]["hta"]["seconds"] / results["a100"]["mxperf-metrics"]["seconds"]
        )
    summary["a100_vs_gunzip_floor"] = (
        results["a100"]["mxperf"]["seconds"] / results["a100"]["gunzip"]["seconds"]
    )
    summary["nsys_vs_sqlite_floor"] = (
        results["nsys"]["mxperf-load"]["seconds"] / results["nsys"]["sqlite"]["seconds"]
    )
    if "synthetic" in results:
        s = results["synthetic"]
        summary["synthetic_vs_gunzip_floor"] = s["mxperf"]["seconds"] / s["gunzip"]["seconds"]
        summary["synthetic_peak_rss_mb"] = s["mxperf"]["peak_rss_mb"]
    print(table(results))
    for k, v in summary.items():
        print(f"{k}: {v:.2f}")
    print(json.dumps({"schema_version": 1, "benchmark": "ingest", "results": results, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
