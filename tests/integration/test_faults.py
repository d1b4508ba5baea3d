"""Fault injection in the real RL loop (tiny-dense / tiny-moe): every fault is caught by its own invariant,
clean runs raise no false alarm, and every fault that lets the run go on silently moves the numbers."""

from __future__ import annotations

import json

import pytest

from mxperf.cli import main
from pipeline.experiments.fault_runs import FaultRunSettings, run_matrix
from pipeline.sync.faults import FAULTS, applicable, get_fault
from tracing.outputs import store


def test_faults_cli_runs_a_fault_live_and_writes_the_matrix(tmp_path, capsys):
    out = tmp_path / "faults"
    rc = main(
        ["faults", "--only", "qkv-order", "--steps", "2", "--pretrain-steps", "0", "--json", "-o", str(out)]
    )
    captured = capsys.readouterr().out
    assert rc == 0
    summary = json.loads(captured.strip().splitlines()[-1])
    assert summary["all_caught"] is True and summary["clean_false_alarms"] == 0
    (row,) = summary["faults"]
    assert row["fault"] == "qkv-order" and row["I3"] is True and row["silent"] is True
    assert row["eval_dlogprob_max"] > 1e-3  # K and V swapped: the sampler's numbers really change
    assert "[X]" in captured
    table = store.read_table(out / store.FAULT_MATRIX)
    assert table.loc[0, "caught"] and set(table.columns) >= {
        "I1",
        "I7",
        "kl_k3_fault",
        "rollout_dlogprob_max",
    }
    checks = store.read_table(out / store.SYNC_CHECKS)
    assert checks["passed"].all()  # the clean reference run


def test_faults_cli_rejects_moe_faults_on_a_dense_model(capsys):
    assert main(["faults", "--only", "dropped-expert", "--pretrain-steps", "0"]) == 2
    assert "MoE" in capsys.readouterr().err


def test_every_invariant_has_a_fault():
    assert {f.invariant for f in FAULTS} == {f"I{i}" for i in range(1, 8)}
    assert all(f.source for f in FAULTS)


def _assert_matrix(outcomes, clean_rows):
    assert not [r for r in clean_rows if not r["passed"]], "false alarm in a clean run"
    for o in outcomes:
        assert o.caught, f"{o.fault} not caught by {o.invariant} (failed: {o.caught_by})"
        if o.silent:
            moved = max(o.eval_dlogprob_max, o.rollout_dlogprob_max)
            assert moved > 1e-4, f"{o.fault} went on silently but did not move the log-probs"


@pytest.mark.slow
def test_fault_matrix_on_tiny_dense():
    settings = FaultRunSettings(model="tiny-dense", steps=3, pretrain_steps=60)
    _assert_matrix(*run_matrix(settings, applicable(is_moe=False)))


@pytest.mark.slow
def test_moe_faults_on_tiny_moe():
    settings = FaultRunSettings(model="tiny-moe", steps=3, pretrain_steps=60)
    faults = [get_fault(n) for n in ("dropped-expert", "quantized-router", "gate-up-swapped")]
    _assert_matrix(*run_matrix(settings, faults))
