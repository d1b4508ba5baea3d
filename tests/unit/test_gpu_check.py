"""The device check (benchmarks/gpu_check.sh + gpu_check.py): its held-out plan and comparison, the archive
the device tool brings back, the GPU mode's refusal on a CPU, and (slow; CI runs the script itself) the whole
check in smoke mode on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check as gc  # noqa: E402

PY = (
    str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
)


def _fits(case: str, tokens: float | None) -> dict:
    fit = {"fixed_s": 0.01, "per_token_s": 2e-6, "per_step_s": None}
    low = {"fixed_s": 0.02, "per_token_s": 0.8e-6, "per_step_s": 0.004}
    return {
        "models": [
            {
                "precision": "fp8-rowwise",
                "baseline": "bf16",
                "fits": {"bf16": fit, "fp8-rowwise": low},
                "breakeven": {"case": case, "tokens": tokens},
            }
        ]
    }


def test_heldout_sizes_bracket_the_predicted_breakeven_on_the_sweeps_grid():
    plans = gc.heldout_plans(_fits("faster_above", 3000.0), [512, 1024, 2048, 4096], 512, 16384)
    assert plans[0]["sizes"] == [
        2048,
        3584,
    ]  # 0.75 n* = 2250 and 1.25 n* = 3750, in whole 512-token sequences
    no_cross = gc.heldout_plans(_fits("never_faster", None), [512, 1024, 2048, 4096], 512, 16384)
    (size,) = no_cross[0]["sizes"]
    assert size == 1536  # sqrt(1024 * 2048) = 1448 tokens, in whole sequences: between two measured sizes
    assert "no crossing" in no_cross[0]["why"]


def test_the_comparison_pairs_repeats_and_says_when_the_sign_is_not_resolved():
    fits = _fits("faster_above", 10_000.0)
    rows = []
    for rep, (base_s, low_s) in enumerate([(0.030, 0.026), (0.031, 0.027), (0.029, 0.0265)]):
        for prec, s in (("bf16", base_s), ("fp8-rowwise", low_s)):
            rows += [
                {
                    "precision": prec,
                    "tokens_per_microbatch": 12_000,
                    "repeat": rep,
                    "microbatch": m,
                    "seconds": s,
                }
                for m in range(2)
            ]
    plan = [{"precision": "fp8-rowwise", "sizes": [12_000]}]
    (out,) = gc.compare(pd.DataFrame(rows), fits, plan)
    # predicted per micro-batch: 0.01 + 2e-6 n vs 0.02 + 0.8e-6 n + 0.004 / 2 (per-step cost over 2 micro-batches)
    assert out["predicted_s"]["bf16"] == pytest.approx(0.034)
    assert out["predicted_s"]["fp8-rowwise"] == pytest.approx(0.0316)
    assert out["resolved"] and out["holds"] and out["measured_difference_s"]["max"] < 0
    assert out["relative_error"]["bf16"] == pytest.approx((0.034 - 0.030) / 0.030)
    noisy = pd.DataFrame(rows)
    noisy.loc[(noisy["repeat"] == 1) & (noisy["precision"] == "fp8-rowwise"), "seconds"] = 0.05
    (out,) = gc.compare(noisy, fits, plan)
    assert not out["resolved"] and not out["holds"]  # one repeat disagrees: the sign is not claimed


def test_the_archive_fits_the_device_tools_limits_and_lists_what_it_left_out(tmp_path):
    root = tmp_path / "check"
    (root / "sweep" / "trace").mkdir(parents=True)
    (root / "fit").mkdir()
    (root / "fit" / "fits.json").write_text("{}")
    (root / "sweep" / "trace" / "rank-0.json.gz").write_bytes(os.urandom(gc.PACK_LIMIT_BYTES))  # too big
    (root / "summary.json").write_text(json.dumps({"schema_version": 1}))
    files = gc.pack(root, tmp_path / "out")
    assert len(files) <= 8 and all(f.stat().st_size < 16 * 2**20 for f in files)
    with tarfile.open(files[0]) as tar:
        names = tar.getnames()
    assert "check/fit/fits.json" in names and not any(n.endswith("rank-0.json.gz") for n in names)
    assert "sweep/trace/rank-0.json.gz" in (tmp_path / "out" / "left_out.txt").read_text()


def test_gpu_mode_on_a_machine_without_cuda_stops_after_the_environment_report(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = dict(os.environ, PYTHON=PY)
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "g")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2 and "no CUDA device here" in out.stderr and "--smoke" in out.stderr
    report = json.loads((tmp_path / "g" / "env.json").read_text())
    assert report["gemm"]["fp8-block128"]["backend"] == "emulated" and report["packages"]["pandas"]


@pytest.mark.slow
def test_smoke_mode_runs_every_stage_of_the_check_on_the_cpu(tmp_path):
    out = tmp_path / "smoke"
    env = dict(os.environ, PYTHON=PY, MXPERF_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke", str(out)],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [s["stage"] for s in stages] == ["env", "run", "sweep", "ingest", "fit", "heldout"]
    assert all(s["rc"] == 0 for s in stages)
    for part in ("run", "sweep", "ingest", "fit"):
        assert json.loads((out / part / "manifest.json").read_text())["status"] == "complete", part
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["checks_failed"] == 0 and summary["run"]["learner_device"] == "cpu"
    assert set(summary["sweep"]["gemm"]) == {"bf16", "fp8-tensor", "fp8-rowwise", "fp8-block128"}
    assert {b["precision"] for b in summary["breakeven"]} == {"fp8-tensor", "fp8-rowwise", "fp8-block128"}
    assert summary["heldout"] and all("relative_error" in h for h in summary["heldout"])
