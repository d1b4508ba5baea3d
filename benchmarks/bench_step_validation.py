"""The step model against measured steps: sweep + runs of each model in both precisions, then ``mxperf fit``'s
predicted-vs-measured table (fits.json ``step_model[].validation``), per model and overall.

Usage: ``python benchmarks/bench_step_validation.py [--models tiny-dense,tiny-moe] [--steps 8] [--rounds 1]
[--chunks 3] [--keep DIR]``. Each round runs, per model, the sweep (both precisions interleaved per size and
repeat) as ``--chunks`` sweeps with one run per precision (learner and sampler in that precision) between
them, then fits them together. Prints the table (the error of every out-of-sample row: fitted phases and
whole steps; in-sample rows are shown, marked, never counted), the 1-minute load average at the start and end
of each round next to the CPU count, and a final JSON line. No peer: the truth is the runs' own measured steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MXPERF = str(Path(sys.executable).with_name("mxperf"))
# the sweep as a user would measure for these runs: their sequence length (32 sequences of ~8 tokens: a
# 1-2 digit sum and its answer) and micro-batch sizes around theirs (128 tokens, 2-3 micro-batches a step)
SIZES = "32,64,128,256"
SEQ_LEN = "8"
REPEATS = 3  # the sweep's repeats in all, shared out over its chunks


def _run(args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([MXPERF, *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mxperf {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")


def one_model(model: str, steps: int, root: Path, chunks: int = 3) -> dict[str, Any]:
    """Sweeps, two runs and the fit of one model; the validation block of its step model, with timings.

    The sweep's ``REPEATS`` repeats run as ``chunks`` sweeps sharing them, the two runs between them (sweep, run
    bf16, sweep, run mxfp8, sweep, ...): a shared machine drifts by tens of percent over minutes, and the
    prediction and the truth then see the same drift; the fit pools the sweeps (each its own units)."""
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    sweeps: list[str] = []

    def sweep() -> None:
        k = len(sweeps)  # chunk k's share of REPEATS (at least one)
        repeats = max(1, REPEATS // chunks + (k < REPEATS % chunks))
        out = root / f"sweep-{model}-{len(sweeps)}"
        _run(["sweep", "--model", model, "--precisions", "bf16,mxfp8", "--tokens-per-microbatch", SIZES,
              "--seq-len", SEQ_LEN, "--pretrain-steps", "300", "--repeats", str(repeats), "--threads", "1",
              "-o", str(out)])  # fmt: skip
        sweeps.append(str(out))

    runs = []
    for p in ("bf16", "mxfp8"):
        if chunks > len(runs):
            sweep()
        r = root / f"run-{model}-{p}"
        _run(["run", "--model", model, "--learner", p, "--sampler", p, "--steps", str(steps), "-o", str(r)])
        runs.append(str(r))
    while len(sweeps) < chunks:
        sweep()
    fit = root / f"fit-{model}"
    _run(["fit", *sweeps, *runs, "-o", str(fit)])
    doc = json.loads((fit / "fits.json").read_text())
    entries = [e for e in doc.get("step_model") or [] if e.get("model") == model]
    v = entries[0].get("validation") if entries else None
    return {
        "model": model,
        "validation": v or {},
        "seconds": time.monotonic() - t0,
        "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


def _counted(r: dict[str, Any]) -> bool:
    """The rows fits.json's median absolute error counts: fitted phases and whole steps (not in-sample)."""
    return r.get("kind") in ("fitted", "step") and r.get("error_pct") is not None


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| round | model | run | phase | predicted (s) | 95 % band | measured (s) | error | counted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["validation"].get("rows") or []:
            band = r.get("predicted_ci") or [None, None]
            err = r.get("error_pct")
            lines.append(
                f"| {res['round']} | {res['model']} | {Path(str(r.get('run', ''))).name} | {r.get('phase')} | "
                f"{_fmt(r.get('predicted_s'))} | [{_fmt(band[0])}, {_fmt(band[1])}] | {_fmt(r.get('measured_s'))} | "
                f"{_fmt(err, '+.1f')} % | {'yes' if _counted(r) else 'no (' + r['kind'] + ')'} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny-dense,tiny-moe")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--chunks",
        type=int,
        default=3,
        help="sweeps sharing the 3 repeats, the runs between them (1: one sweep first)",
    )
    ap.add_argument(
        "--keep", type=Path, default=None, help="keep the folders here (default: a temporary one)"
    )
    a = ap.parse_args(argv)
    if a.chunks < 1:
        ap.error("--chunks must be >= 1")
    root = a.keep or Path(tempfile.mkdtemp(prefix="mxperf-stepval-"))
    results = []
    for k in range(a.rounds):
        for model in a.models.split(","):
            res = one_model(model, a.steps, root / f"round-{k}", a.chunks)
            res["round"] = k
            results.append(res)
            print(f"round {k} {model}: {res['seconds']:.0f} s, 1-min load {res['load'][0]} -> {res['load'][1]} "
                  f"on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
    print("\n".join(table(results)))
    per = {f"{r['round']}:{r['model']}": r["validation"].get("median_abs_error_pct") for r in results}
    counted = [
        abs(float(r["error_pct"]))
        for res in results
        for r in res["validation"].get("rows") or []
        if _counted(r)
    ]
    summary = {
        "bench": "step_validation",
        "median_abs_error_pct": per,
        "overall_median_abs_error_pct": float(np.median(counted)) if counted else None,
        "rows_counted": len(counted),
        "cpus": os.cpu_count(),
        "load": {f"{r['round']}:{r['model']}": r["load"] for r in results},
        "folders": str(root),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
