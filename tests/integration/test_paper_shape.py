"""Issue 33, must-show 3: the paper's shape from a table of phase times like its own, through the real CLI.

``examples/paper-shape/run.py`` turns ``phases.csv`` into ``--phase`` flags, draws the learner phases'
micro-batches from ``microbatch_truth.json`` (seeded) and runs ``mxperf fit --at N,n`` on each case. The truth
here is computed from the two input files alone, not from the script's own ``implied`` numbers.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
HERE = REPO / "examples" / "paper-shape"


def _table() -> list[dict[str, str]]:
    with (HERE / "phases.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _truth_json() -> dict:
    return json.loads((HERE / "microbatch_truth.json").read_text())


def _phases(case: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in _table():
        if r["case"] == case:
            out.setdefault(r["precision"], {})[r["phase"]] = float(r["seconds_per_step"])
    return out


def _true_gain(case: str) -> tuple[float, dict[str, float]]:
    ph = _phases(case)
    base, low = ph["bf16"], ph["mxfp8"]
    sb = sum(base.values())
    return 1.0 - sum(low.values()) / sb, {p: (base[p] - low[p]) / sb for p in base}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("paper-shape")
    proc = subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--out", str(out), "--bootstrap", "200"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_inputs_are_the_papers_figures_and_consistent() -> None:
    truth = _truth_json()
    moe, _ = _true_gain("moe-long")
    dense, _ = _true_gain("dense-short")
    assert moe == pytest.approx(0.107, abs=0.002)  # paper: MoE step -10.7 %
    assert dense == pytest.approx(-0.05, abs=0.002)  # paper: short-sequence dense step +5 %
    gen = _phases("moe-long")
    assert gen["mxfp8"]["generate"] / gen["bf16"]["generate"] == pytest.approx(0.76)  # paper: -24 %
    for name, case in truth["cases"].items():
        big_n, n = case["global_tokens"], case["tokens_per_microbatch"]
        k = math.ceil(big_n / n)
        assert k * n == big_n
        table = _phases(name)
        for phase, per_prec in case["truth"].items():
            base, low = per_prec["bf16"], per_prec["mxfp8"]
            n_star = (low["fixed_s"] - base["fixed_s"]) / (base["per_token_s"] - low["per_token_s"])
            assert n_star == pytest.approx(4500)  # the paper's ~4.5k-token breakeven
            for prec, t in per_prec.items():  # the table's learner rows are the truth at N, n
                assert table[prec][phase] == pytest.approx(
                    k * (t["fixed_s"] + t["per_token_s"] * n), rel=1e-9
                )


def test_the_cli_is_given_the_tables_phases_as_flags(result: dict) -> None:
    truth = _truth_json()
    for name, r in result["cases"].items():
        c = truth["cases"][name]
        assert f"--at {c['global_tokens']},{c['tokens_per_microbatch']}" in r["command"]
        flags = {
            f"--phase {row['precision']}:{row['phase']}={float(row['seconds_per_step']):g}"
            for row in _table()
            if row["case"] == name and row["input"] == "--phase"
        }
        assert flags and all(f in r["command"] for f in flags)
        for prec in ("bf16", "mxfp8"):
            kinds = r["phase_sources"][prec]
            assert kinds["update"] == kinds["logprob"] == "fitted"
            assert kinds["generate"] == kinds["sync"] == kinds["other"] == "given"


def test_moe_long_sequences_step_faster_mostly_from_generation(result: dict) -> None:
    r = result["cases"]["moe-long"]
    truth, truth_by = _true_gain("moe-long")
    lo, hi = r["gain_ci"]
    assert r["gain"] > 0 and r["significant"] and lo > 0
    assert r["gain"] == pytest.approx(truth, abs=0.02)
    assert lo <= truth <= hi
    by = r["gain_by_phase"]
    assert max(by, key=by.get) == "generate"
    assert by["update"] > 0 and by["logprob"] > 0  # long micro-batches: above the breakeven
    for phase, share in truth_by.items():
        assert by[phase] == pytest.approx(share, abs=0.005)
    first = r["answer"][0]
    assert "faster than bf16" in first and "gain by phase: generate +" in first
    assert len(r["answer"]) >= 3


def test_dense_short_sequences_step_slower_because_of_the_update(result: dict) -> None:
    r = result["cases"]["dense-short"]
    truth, truth_by = _true_gain("dense-short")
    lo, hi = r["gain_ci"]
    assert r["gain"] < 0 and r["significant"] and hi < 0
    assert r["gain"] == pytest.approx(truth, abs=0.02)
    assert lo <= truth <= hi
    by = r["gain_by_phase"]
    assert min(by, key=by.get) == "update"
    assert by["generate"] > 0  # the small generation gain does not make up for the learner
    for phase, share in truth_by.items():
        assert by[phase] == pytest.approx(share, abs=0.005)
    first = r["answer"][0]
    assert "slower than bf16" in first and "gain by phase: update -" in first
