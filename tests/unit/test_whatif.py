"""perfmodel.breakeven.whatif / ``mxperf diff --on``: the same traces on another device, each part scaled by the bounds'
ratio (checked by hand on the simulated verl pair), host and communication kept, the breakeven range."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mxperf.cli import main
from perfmodel.breakeven.whatif import scaled_microbatches, source_device, what_if
from perfmodel.kernels.devices import device

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "runs"
A, B = EX / "ingest-verl-sim-bf16", EX / "ingest-verl-sim-mxfp8"


def test_the_same_device_changes_nothing() -> None:
    b200 = device("b200")
    doc = what_if(A, B, b200, b200)
    upd = next(p for p in doc["phases"] if p["phase"] == "update")
    assert upd["fast"]["tokens"] == pytest.approx(upd["source"]["tokens"])
    assert upd["slow"]["tokens"] == pytest.approx(upd["source"]["tokens"])
    assert upd["range_tokens"][0] == pytest.approx(upd["source"]["tokens"])


def test_each_part_is_scaled_by_its_bound() -> None:
    src, dst = device("b200"), device("gb200")
    r_bf16, r_bw = 2250 / 2500, 8.0 / 7.7
    rows = scaled_microbatches(A, src, dst)  # BF16 side: every GEMM kernel is bf16
    assert rows
    for r in rows:
        kept = r["host_stall_ns"] + r["residual_ns"] + r["communication_ns"]
        other = r["other_ns"] - r["communication_ns"]
        base = r["gemm_ns"] * r_bf16 + r["quantize_ns"] * r_bw + kept
        assert r["wall_fast_ns"] == pytest.approx(base + other * min(r_bf16, r_bw))
        slow = base + other * max(r_bf16, r_bw)  # floored at the host window where the ingest has it
        assert r["wall_slow_ns"] == pytest.approx(slow) or (r["host_window"] and r["wall_slow_ns"] > slow)
        assert (
            r["wall_src_ns"]
            == r["gemm_ns"] + r["quantize_ns"] + r["other_ns"] + r["host_stall_ns"] + r["residual_ns"]
        )
    assert any(r["communication_ns"] > 0 for r in rows)  # the trace's NCCL kernels are kept, not scaled


def test_diff_on_cli(capsys) -> None:
    assert source_device(A).id == "h100-sxm"  # the trace's gpu_names
    # the simulated MXFP8 side runs MX GEMMs, which an H100 has no peak for: refused, never guessed
    assert main(["diff", str(A), str(B), "--on", "gb200"]) == 2
    assert "mxfp8 GEMMs cannot be scaled from h100-sxm" in capsys.readouterr().err
    assert main(["diff", str(A), str(B), "--device", "b200"]) == 2
    capsys.readouterr()
    assert main(["diff", str(A), str(B), "--by", "phase", "--on", "gb200", "--device", "b200"]) == 0
    text = capsys.readouterr().out
    assert "what-if: the same traces on gb200 (measured on b200)" in text
    assert "not scaled (ms per micro-batch, A / B): host stall" in text and "assumption:" in text
    assert main(["diff", str(A), str(B), "--on", "gb200", "--device", "b200", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    w = doc["what_if"]
    assert (w["source"], w["target"]) == ("b200", "gb200")
    upd = next(p for p in w["phases"] if p["phase"] == "update")
    assert upd["source"]["case"] == "faster_above" and upd["range_tokens"][0] <= upd["range_tokens"][1]


def _hc3(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of ``key`` (s) on tokens and its HC3 covariance, by hand."""
    x = np.array([r["tokens"] for r in rows], float)
    y = np.array([r[key] * 1e-9 for r in rows])
    xm = np.stack([np.ones_like(x), x], 1)
    inv = np.linalg.inv(xm.T @ xm)
    beta = inv @ xm.T @ y
    e = y - xm @ beta
    h = np.einsum("ij,jk,ik->i", xm, inv, xm)
    return beta, inv @ (xm.T @ (xm * (e**2 / (1 - h) ** 2)[:, None])) @ inv


@pytest.mark.parametrize("end", ["source", "fast", "slow"])
def test_each_end_has_the_fieller_interval_of_its_lines(end: str) -> None:
    src, dst = device("b200"), device("gb200")
    doc = what_if(A, B, dst, src)
    upd = next(p for p in doc["phases"] if p["phase"] == "update")
    e = upd[end]
    assert e["case"] == "faster_above" and e["ci_method"] == "fieller"
    key = {"source": "wall_src_ns", "fast": "wall_fast_ns", "slow": "wall_slow_ns"}[end]
    (fa, ca), (fb, cb) = (
        _hc3([r for r in scaled_microbatches(p, src, dst) if r["phase"] == "update"], key) for p in (A, B)
    )
    a, b = fb[0] - fa[0], fa[1] - fb[1]  # d_fixed, d_tok
    var_a, var_b, cov_ab = ca[0, 0] + cb[0, 0], ca[1, 1] + cb[1, 1], -(ca[0, 1] + cb[0, 1])
    assert e["d_fixed_s"] == pytest.approx(a) and e["d_tok_s"] == pytest.approx(b)
    t = (e["d_fixed_ci"][1] - a) / np.sqrt(var_a)  # the critical value the intervals use
    assert 1.95 < t < 13  # a 95 % t quantile
    assert e["d_tok_ci"] == pytest.approx([b - t * np.sqrt(var_b), b + t * np.sqrt(var_b)])
    lo, hi = e["ci"]
    assert lo < e["tokens"] < hi
    for theta in (lo, hi):  # Fieller's bounds: where the t statistic of d_fixed - theta d_tok reaches t
        stat = (a - theta * b) ** 2 / (var_a - 2 * theta * cov_ab + theta**2 * var_b)
        assert stat == pytest.approx(t * t, rel=1e-6)


def test_the_range_interval_joins_the_ends_and_states_its_assumption(capsys) -> None:
    doc = what_if(A, B, device("gb200"), device("b200"))
    upd = next(p for p in doc["phases"] if p["phase"] == "update")
    ends = (upd["fast"], upd["slow"])
    assert upd["range_ci"] == [min(e["ci"][0] for e in ends), max(e["ci"][1] for e in ends)]
    lo, hi = upd["range_ci"]
    assert lo < upd["range_tokens"][0] <= upd["range_tokens"][1] < hi
    assert any("95 % interval" in a and "Fieller" in a for a in doc["assumptions"])
    same = what_if(A, B, device("b200"), device("b200"))  # the same device: the reference's own interval
    su = next(p for p in same["phases"] if p["phase"] == "update")
    assert su["range_ci"] == pytest.approx(su["source"]["ci"])
    assert main(["diff", str(A), str(B), "--by", "phase", "--on", "gb200", "--device", "b200"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("update    breakeven on b200"))
    assert f"95 % [{lo:,.0f}, {hi:,.0f}]" in line
    assert "assumption: n* from least-squares lines" in text


def test_a_phase_within_noise_gives_no_breakeven_and_says_why() -> None:
    # verl's logprob windows overlap (the host runs ahead): the walls' noise hides the per-token difference
    doc = what_if(A, B, device("gb200"), device("b200"))
    lp = next(p for p in doc["phases"] if p["phase"] == "logprob")
    assert (
        lp["source"]["case"] == "indistinguishable" and lp["range_tokens"] is None and lp["range_ci"] is None
    )
    lo, hi = lp["source"]["d_tok_ci"]
    assert lo < 0 < hi and lp["source"]["ci_reason"]


def test_a_slow_end_that_is_todays_time_is_said(tmp_path) -> None:
    import shutil

    import pandas as pd

    doc = what_if(A, B, device("gb200"), device("b200"))
    # the simulated pair's host windows span each micro-batch: the slow end is the measured time
    for r in scaled_microbatches(A, device("b200"), device("gb200")):
        assert r["host_floor_is_wall"] == (r["wall_slow_ns"] == pytest.approx(r["wall_src_ns"], rel=0.01))
    assert all(p["slow_end_is_today_share"] == 1.0 for p in doc["phases"])
    assert any("the slow end is today's time" in n for n in doc["notes"])
    # host windows of a tenth of the wall: the slow end is the scaled one, and nothing is said
    pair = []
    for src in (A, B):
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        mb = pd.read_parquet(dst / "microbatches.parquet")
        mb["host_seconds"] = mb["seconds"] * 0.1
        mb.to_parquet(dst / "microbatches.parquet")
        pair.append(dst)
    short = what_if(*pair, device("gb200"), device("b200"))
    assert all(p["slow_end_is_today_share"] == 0.0 for p in short["phases"])
    assert not any("the slow end is today's time" in n for n in short["notes"])
