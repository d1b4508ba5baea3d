"""perfmodel.whatif / ``mxperf diff --on``: the same traces on another device, each part scaled by the bounds'
ratio (checked by hand on the simulated verl pair), host and communication kept, the breakeven range."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.devices import device
from perfmodel.whatif import scaled_microbatches, source_device, what_if

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
