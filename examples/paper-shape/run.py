"""The paper's shape, reproduced through the real ``mxperf fit`` CLI (issue 33, must-show 3).

Inputs, as a user would have them (this folder):

- ``phases.csv``: a table of seconds per step of each phase per precision, like the paper's (which figures
  come from the paper and which are assumptions: its ``provenance`` column). Rows with ``input = --phase``
  become ``--phase PRECISION:PHASE=SECONDS`` flags (``mxperf fit`` takes no phase table: a user passes its
  rows as flags); rows with ``input = micro-batches`` are the learner phases, which the fit predicts from
  micro-batch data -- the table's value is what the run measured, the truth the prediction is checked on.
- ``microbatch_truth.json``: each case's settings (``--at N,n``) and the true fixed + per-token cost per
  micro-batch of the learner phases; ``perfmodel.inputs.simulate.simulate_sweep`` draws the micro-batch
  table from it (seeded) into ``OUT/<case>/microbatches.csv``.

For each case it runs ``python -m mxperf fit OUT/<case>/microbatches.csv -o OUT/<case>/fit --at N,n
--phase ... --json`` and prints the predicted step gain with its 95 % interval next to the gain the table
implies, the gain by phase, and the headline's three lines; the last stdout line is one JSON object.

    .venv/bin/python examples/paper-shape/run.py                    # outputs in a temporary folder
    .venv/bin/python examples/paper-shape/run.py --out runs/paper-shape --bootstrap 1000
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PHASES_CSV = HERE / "phases.csv"
TRUTH_JSON = HERE / "microbatch_truth.json"
BASE, LOW = "bf16", "mxfp8"


def load_table(path: Path = PHASES_CSV) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def load_truth(path: Path = TRUTH_JSON) -> dict[str, Any]:
    return json.loads(path.read_text())


def table_phases(rows: Sequence[dict[str, str]], case: str) -> dict[str, dict[str, float]]:
    """precision -> phase -> seconds per step, as the table says."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["case"] == case:
            out.setdefault(r["precision"], {})[r["phase"]] = float(r["seconds_per_step"])
    return out


def implied(phases: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The step gain (1 - low / base) and each phase's share of it, from the table alone."""
    base, low = phases[BASE], phases[LOW]
    sb, sl = sum(base.values()), sum(low.values())
    return {
        "step_s": {BASE: sb, LOW: sl},
        "gain": 1.0 - sl / sb,
        "gain_by_phase": {ph: (base[ph] - low[ph]) / sb for ph in base},
    }


def phase_flags(rows: Sequence[dict[str, str]], case: str) -> list[str]:
    """The table's rows that are not fitted from micro-batches, as ``--phase PREC:PHASE=S`` flags."""
    flags: list[str] = []
    for r in rows:
        if r["case"] == case and r["input"] == "--phase":
            flags += ["--phase", f"{r['precision']}:{r['phase']}={float(r['seconds_per_step']):g}"]
    return flags


def microbatches(truth: dict[str, Any], case: str) -> pd.DataFrame:
    """The learner phases' micro-batch table of one case, drawn from its truth (seeded)."""
    from perfmodel.inputs.simulate import Truth, simulate_sweep

    sim, c = truth["simulation"], truth["cases"][case]
    rng = np.random.default_rng(int(c["seed"]))
    parts = []
    for phase in sim["phase_order"]:
        parts.append(
            simulate_sweep(
                {p: Truth(**t) for p, t in c["truth"][phase].items()},
                sizes=sim["sizes"],
                repeats=sim["repeats"],
                microbatches=sim["microbatches"],
                noise=sim["noise"],
                repeat_noise=sim["repeat_noise"],
                model=c["model"],
                phase=phase,
                rng=rng,
            )
        )
    return pd.concat(parts, ignore_index=True)


def run_case(
    case: str, rows: Sequence[dict[str, str]], truth: dict[str, Any], out: Path, bootstrap: int, seed: int
) -> dict[str, Any]:
    c = truth["cases"][case]
    folder = out / case
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / "microbatches.csv"
    microbatches(truth, case).to_csv(table, index=False)
    at = f"{c['global_tokens']},{c['tokens_per_microbatch']}"
    args = ["fit", str(table), "-o", str(folder / "fit"), "--force", "--at", at, *phase_flags(rows, case)]
    args += ["--bootstrap", str(bootstrap), "--seed", str(seed), "--json"]
    cmd = [sys.executable, "-m", "mxperf", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{case}: mxperf fit exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    (sm,) = [s for s in doc["step_model"] if s["precision"] == LOW and s["model"] == c["model"]]
    (setting,) = sm["settings"]
    return {
        "model": c["model"],
        "title": c["title"],
        "command": "mxperf " + shlex.join(a.replace(str(out), "OUT") for a in args),
        "at": [c["global_tokens"], c["tokens_per_microbatch"]],
        "gain": setting["gain"],
        "gain_ci": setting["gain_ci"],
        "significant": setting["significant"],
        "gain_by_phase": setting["gain_by_phase"],
        "phases_s": {p: v["phases_s"] for p, v in setting["per_precision"].items()},
        "step_s": {p: v["step_s"] for p, v in setting["per_precision"].items()},
        "step_ci": {p: v["step_ci"] for p, v in setting["per_precision"].items()},
        "phase_sources": {p: {ph: t["kind"] for ph, t in v.items()} for p, v in sm["phases"].items()},
        "answer": sm["answer"],
        "implied": implied(table_phases(rows, case)),
        "fit_dir": str(folder / "fit"),
    }


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _print_case(name: str, r: dict[str, Any]) -> None:
    imp = r["implied"]
    lo, hi = r["gain_ci"] or (float("nan"), float("nan"))
    print(f"\n== {name}: {r['model']}, {r['title']} (--at {r['at'][0]},{r['at'][1]})")
    print(f"$ {r['command']}")
    print(
        f"step gain (mxfp8 vs bf16): predicted {_pct(r['gain'])} [95 % CI {_pct(lo)} to {_pct(hi)}], "
        f"implied by the table {_pct(imp['gain'])}"
    )
    print(f"{'phase':<10} {'input':<10} {'bf16 s':>9} {'mxfp8 s':>9} {'gain pts':>9} {'table pts':>9}")
    for ph, share in sorted(r["gain_by_phase"].items(), key=lambda kv: -abs(kv[1])):
        kind = r["phase_sources"][LOW].get(ph, "?")
        b, low = r["phases_s"][BASE][ph], r["phases_s"][LOW][ph]
        print(
            f"{ph:<10} {kind:<10} {b:>9.3f} {low:>9.3f} {100 * share:>+9.2f} "
            f"{100 * imp['gain_by_phase'][ph]:>+9.2f}"
        )
    print(
        f"{'step':<10} {'':<10} {r['step_s'][BASE]:>9.3f} {r['step_s'][LOW]:>9.3f} "
        f"{100 * r['gain']:>+9.2f} {100 * imp['gain']:>+9.2f}"
    )
    print("headline:")
    for line in r["answer"]:
        print(f"  {line}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--out", type=Path, help="folder for the micro-batch tables and fits (default: temporary)"
    )
    ap.add_argument("--bootstrap", type=int, default=1000, help="mxperf fit --bootstrap (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="mxperf fit --seed (default 0)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    rows, truth = load_table(), load_truth()
    names = args.cases.split(",") if args.cases else list(truth["cases"])
    with tempfile.TemporaryDirectory(prefix="paper-shape-") as tmp:
        out = (args.out or Path(tmp)).resolve()
        results = {name: run_case(name, rows, truth, out, args.bootstrap, args.seed) for name in names}
        for name, r in results.items():
            _print_case(name, r)
        if args.out is None:
            for r in results.values():
                r["fit_dir"] = None  # removed with the temporary folder
        print(json.dumps({"bootstrap": args.bootstrap, "seed": args.seed, "cases": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
