"""The device check's Python steps, run in order by ``benchmarks/gpu_check.sh``: the environment report, the
held-out measurement at the predicted breakeven (n* +- 25 %) compared with the fit's prediction, the summary,
and the archive the device tool brings back (at most 8 files).

    python3 benchmarks/gpu_check.py env --out ROOT/env.json
    python3 benchmarks/gpu_check.py heldout --sweep ROOT/sweep --fit ROOT/fit -o ROOT/heldout
    python3 benchmarks/gpu_check.py summary --root ROOT
    python3 benchmarks/gpu_check.py pack --root ROOT --dest $OUT

Runs with the repository on ``PYTHONPATH`` and the machine's own packages (no msgspec, plotly or nvtx needed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

CHECK_PRECISIONS = ("bf16", "fp8-tensor", "fp8-rowwise", "fp8-block128")
OPTIONAL = (
    "pandas",
    "pyarrow",
    "scipy",
    "matplotlib",
    "transformers",
    "tokenizers",
    "safetensors",
    "msgspec",
    "nvtx",
)
PACK_LIMIT_BYTES = 15 * 2**20  # the device tool brings back files of at most 16 MiB


# -- environment --------------------------------------------------------------------------------------------
def _nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    q = "--query-gpu=name,driver_version,memory.total,clocks.max.sm"
    out = subprocess.run(
        ["nvidia-smi", q, "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip() or out.stderr.strip() or None


def env_report() -> dict[str, Any]:
    """Python, torch, CUDA, GPU, driver, the optional packages present, and which real GEMMs run here."""
    import torch

    from pipeline.device import describe_device
    from pipeline.quant.gemm import choose_backend

    device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    gemms = {}
    for p in (*CHECK_PRECISIONS[1:], "mxfp8"):
        backend, why = choose_backend(p, device)
        gemms[p] = {"backend": backend, "reason": why}
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "device": describe_device(),
        "nvidia_smi": _nvidia_smi(),
        "cpu_count": __import__("os").cpu_count(),
        "packages": {name: importlib.util.find_spec(name) is not None for name in OPTIONAL},
        "gemm": gemms,
    }


# -- held-out measurement -----------------------------------------------------------------------------------
def _round_to(n: float, step: int, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, step * round(n / step))))


def heldout_plans(
    fits: dict[str, Any], sizes: list[int], seq_len: int, global_tokens: int
) -> list[dict[str, Any]]:
    """Held-out sizes per low precision: n* x 0.75 and n* x 1.25 where the fit gives a crossing, else one size
    between the two middle measured sizes (a check of the fitted lines where they were not measured)."""
    plans = []
    measured = sorted(set(sizes))
    for entry in fits.get("models", []):
        be = entry.get("breakeven") or {}
        n_star = be.get("tokens")
        case = be.get("case")
        prec = entry["precision"]
        if (
            isinstance(n_star, int | float)
            and math.isfinite(n_star)
            and n_star > 0
            and case
            in (
                "faster_above",
                "faster_below",
            )
        ):
            lo = _round_to(0.75 * n_star, seq_len, seq_len, global_tokens)
            hi = _round_to(1.25 * n_star, seq_len, seq_len, global_tokens)
            if hi == lo:
                hi = min(global_tokens, lo + seq_len)
            chosen = sorted({lo, hi})
            why = f"the fit's n* = {n_star:,.0f} tokens ({case}): 0.75 n* and 1.25 n*"
        else:
            mid = len(measured) // 2
            gm = math.sqrt(measured[max(mid - 1, 0)] * measured[mid])
            size = _round_to(gm, seq_len, seq_len, global_tokens)
            while size in measured and size + seq_len <= global_tokens:
                size += seq_len
            chosen = [size]
            why = f"no crossing to check ({case}); one size between measured ones checks the fitted lines"
        plans.append({"precision": prec, "case": case, "n_star": n_star, "sizes": chosen, "why": why})
    return plans


def _predict(fit: dict[str, Any], n: int, microbatches: float) -> float:
    """Mean micro-batch seconds the fit predicts at size n for a step of ``microbatches`` micro-batches."""
    per_step = fit.get("per_step_s") or 0.0
    return float(fit["fixed_s"]) + float(fit["per_token_s"]) * n + float(per_step) / max(microbatches, 1.0)


def compare(df: Any, fits: dict[str, Any], plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured (held-out sweep ``df``) vs predicted mean micro-batch seconds and the low - baseline difference,
    paired per repeat; ``holds``: the sign the fit predicts is the sign every repeat measured."""
    by_prec = {e["precision"]: e for e in fits.get("models", [])}
    steps = df.groupby(["precision", "tokens_per_microbatch", "repeat"]).agg(
        seconds=("seconds", "mean"), microbatches=("microbatch", "size")
    )
    out = []
    for plan in plans:
        low = plan["precision"]
        entry = by_prec[low]
        base = entry["baseline"]
        for n in plan["sizes"]:
            try:
                b, lo = steps.loc[(base, n)], steps.loc[(low, n)]
            except KeyError:
                continue
            diff = (lo["seconds"] - b["seconds"]).dropna()
            pred_b = _predict(entry["fits"][base], n, float(b["microbatches"].median()))
            pred_l = _predict(entry["fits"][low], n, float(lo["microbatches"].median()))
            pred_diff = pred_l - pred_b
            meas = {"median": float(diff.median()), "min": float(diff.min()), "max": float(diff.max())}
            resolved = meas["min"] > 0 or meas["max"] < 0
            out.append(
                {
                    "precision": low,
                    "baseline": base,
                    "tokens_per_microbatch": n,
                    "repeats": len(diff),
                    "predicted_s": {base: pred_b, low: pred_l},
                    "measured_s": {base: float(b["seconds"].median()), low: float(lo["seconds"].median())},
                    "relative_error": {
                        base: (pred_b - float(b["seconds"].median())) / float(b["seconds"].median()),
                        low: (pred_l - float(lo["seconds"].median())) / float(lo["seconds"].median()),
                    },
                    "predicted_difference_s": pred_diff,
                    "measured_difference_s": meas,
                    "resolved": bool(resolved),
                    "holds": bool(
                        resolved and math.copysign(1, pred_diff) == math.copysign(1, meas["median"])
                    ),
                }
            )
    return out


def run_heldout(args: argparse.Namespace) -> int:
    from pipeline.experiments.sweep import SweepConfig
    from pipeline.experiments.sweep_run import execute_sweep
    from tracing.outputs import store

    sweep_cfg = store.read_json(Path(args.sweep) / store.MANIFEST)["config"]
    fits = store.read_json(Path(args.fit) / "fits.json")
    global_tokens = int(max(sweep_cfg["global_tokens"] or sweep_cfg["sizes"]))
    plans = heldout_plans(fits, list(sweep_cfg["sizes"]), int(sweep_cfg["seq_len"]), global_tokens)
    plans = plans[: args.max_precisions]
    if not plans:
        print("[gpu_check] heldout: the fit has no low-precision entries to check", file=sys.stderr)
        return 1
    sizes = tuple(sorted({n for p in plans for n in p["sizes"]}))
    precisions = ("bf16", *[p["precision"] for p in plans])
    keys = ("model", "seq_len", "device", "gemm", "weight_cast", "compute_dtype", "seed", "warmup")
    cfg = SweepConfig(
        **{k: sweep_cfg[k] for k in keys},
        precisions=precisions,
        sizes=sizes,
        repeats=args.repeats,
        global_tokens=global_tokens,
    )
    print(f"[gpu_check] held-out sizes {sizes} for {precisions}", file=sys.stderr)
    execute_sweep(cfg, args.out, command=sys.argv, log=lambda m: print(m, file=sys.stderr), force=True)
    df = store.read_table(Path(args.out) / store.MICROBATCHES)
    rows = compare(df, fits, plans)
    doc = {"schema_version": 1, "plans": plans, "comparisons": rows}
    store.write_json(doc, Path(args.out) / "comparison.json")
    for r in rows:
        p, b = r["precision"], r["baseline"]
        print(
            f"{p:>13} vs {b} at {r['tokens_per_microbatch']:>6} tokens: predicted diff "
            f"{r['predicted_difference_s'] * 1e3:+8.2f} ms, measured {r['measured_difference_s']['median'] * 1e3:+8.2f} ms "
            f"[{r['measured_difference_s']['min'] * 1e3:+.2f}, {r['measured_difference_s']['max'] * 1e3:+.2f}] "
            f"{'holds' if r['holds'] else 'unresolved' if not r['resolved'] else 'DOES NOT HOLD'}"
        )
    return 0


# -- summary and archive ------------------------------------------------------------------------------------
def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def summarize(root: Path) -> dict[str, Any]:
    """One JSON document of what the check measured and how each stage ended (read from its outputs)."""
    stages = [json.loads(line) for line in (root / "stages.jsonl").read_text().splitlines() if line.strip()]
    run, sweep = _read(root / "run" / "manifest.json") or {}, _read(root / "sweep" / "manifest.json") or {}
    fits = _read(root / "fit" / "fits.json") or {}
    return {
        "schema_version": 1,
        "env": _read(root / "env.json"),
        "stages": stages,
        "run": {
            k: run.get(k)
            for k in ("status", "learner_device", "sampler_device", "steps_completed", "checks_failed")
        }
        | {"learner": (run.get("engines") or {}).get("learner")},
        "sweep": {
            k: sweep.get(k)
            for k in ("status", "learner_device", "microbatches", "gpu_reason", "profiler_overhead")
        }
        | {"gemm": {p: d.get("gemm_backend") for p, d in (sweep.get("learners") or {}).items()}},
        "breakeven": [
            {
                "precision": m["precision"],
                **{
                    k: (m.get("breakeven") or {}).get(k)
                    for k in ("case", "tokens", "ci", "extrapolated", "model_ok")
                },
            }
            for m in fits.get("models", [])
        ],
        "heldout": (_read(root / "heldout" / "comparison.json") or {}).get("comparisons"),
    }


def pack(root: Path, dest: Path) -> list[Path]:
    """``gpu-check.tar.gz`` of the check (raw sweep traces and event tables left out when they would push the
    archive over the device tool's 16 MiB per file), plus ``summary.json``; returns the files written."""
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    bulky = [p for p in files if (p.suffix == ".gz" and "trace" in p.parts) or "events" in p.parts]
    keep = [p for p in files if p not in bulky]
    budget = PACK_LIMIT_BYTES - sum(p.stat().st_size for p in keep)
    for p in sorted(bulky, key=lambda q: q.stat().st_size):  # the run's small trace first
        if p.stat().st_size < budget * 0.5:
            keep.append(p)
            budget -= p.stat().st_size
    archive = dest / "gpu-check.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for p in keep:
            tar.add(p, arcname=str(p.relative_to(root.parent)))
    left_out = [str(p.relative_to(root)) for p in files if p not in keep]
    (dest / "left_out.txt").write_text("\n".join(left_out) + "\n")
    shutil.copy(root / "summary.json", dest / "summary.json")
    return [archive, dest / "summary.json", dest / "left_out.txt"]


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # a stage's time limit: the output folder is closed as ``interrupted``, rows kept


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env")
    e.add_argument("--out", type=Path, required=True)
    h = sub.add_parser("heldout")
    h.add_argument("--sweep", required=True)
    h.add_argument("--fit", required=True)
    h.add_argument("-o", "--out", required=True)
    h.add_argument("--repeats", type=int, default=3)
    h.add_argument("--max-precisions", type=int, default=3)
    s = sub.add_parser("summary")
    s.add_argument("--root", type=Path, required=True)
    k = sub.add_parser("pack")
    k.add_argument("--root", type=Path, required=True)
    k.add_argument("--dest", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "env":
        doc = env_report()
        args.out.write_text(json.dumps(doc, indent=1))
        print(json.dumps(doc, indent=1))
        return 0
    if args.cmd == "heldout":
        return run_heldout(args)
    if args.cmd == "summary":
        doc = summarize(args.root)
        (args.root / "summary.json").write_text(json.dumps(doc, indent=1, default=str))
        print(json.dumps(doc, default=str))
        return 0
    print("\n".join(str(f) for f in pack(args.root, args.dest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
