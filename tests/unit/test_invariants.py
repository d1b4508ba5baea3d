"""The seven invariants against a live sampler: a clean sync passes all of them for every pairing, synced
bytes equal the learner's FP8 forward bytes, and each fault (real transformers learner, real sampler) is
caught by its own invariant."""

from __future__ import annotations

import pytest
import torch
from weight_sync_helpers import tiny_learner, tiny_sampler, train_a_little

from pipeline.interfaces import SamplingParams, scale_name
from pipeline.sync.faults import get_fault
from pipeline.sync.invariants import INVARIANTS, SYNC_CHECK_COLUMNS, check_sync, rows_to_frame
from pipeline.sync.weight_sync import WeightSync

PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11]]


def _failed(rows) -> set[str]:
    return {r.invariant for r in rows if not r.passed}


@pytest.mark.parametrize(
    ("learner", "sampler", "fraction", "moe"),
    [
        ("mxfp8", "mxfp8", 1.0, False),
        ("bf16", "bf16", 1.0, False),
        ("mxfp8", "fp8-block128", 0.5, False),
        ("mxfp8", "mxfp8-floor", 1.0, True),
        ("mxfp8", "mxfp8", 1.0, True),
    ],
)
def test_clean_syncs_pass_all_seven(learner, sampler, fraction, moe):
    lrn = tiny_learner(learner, moe=moe)
    engine = tiny_sampler(lrn, sampler, grid_fraction=fraction)
    sync = WeightSync()
    for version in range(2):
        report = sync.sync(lrn, engine, version)
        rollouts = engine.generate(PROMPTS, SamplingParams(max_new_tokens=3, seed=version))
        rows = check_sync(version, lrn, engine, rollouts=rollouts, report=report)
        assert [r.invariant for r in rows] == list(INVARIANTS)
        assert _failed(rows) == set(), [r.detail for r in rows if not r.passed]
        train_a_little(lrn, seed=version)


def test_synced_sampler_bytes_equal_the_learners_fp8_forward_bytes():
    lrn = tiny_learner("mxfp8")
    engine = tiny_sampler(lrn, "mxfp8")
    sync = WeightSync()
    for version in range(2):
        sync.sync(lrn, engine, version)
        live = engine.read_back()
        modules = dict(lrn.model.named_modules())
        for layer in range(2):
            a = f"model.layers.{layer}.self_attn"
            qs = [modules[f"{a}.{x}_proj"].quantized_weight() for x in "qkv"]  # what the learner's fprop uses
            assert torch.equal(live[f"{a}.qkv_proj.weight"], torch.cat([q.data for q in qs]))
            assert torch.equal(live[scale_name(f"{a}.qkv_proj.weight")], torch.cat([q.scale for q in qs]))
        train_a_little(lrn, seed=version)


def _run_fault(name: str, *, moe: bool = False, kv_cache: str = "bf16") -> tuple[set[str], list]:
    lrn = tiny_learner("mxfp8", moe=moe)
    engine = tiny_sampler(lrn, "mxfp8", kv_cache=kv_cache, calibration_prompts=[[3, 4, 5, 6]])
    get_fault(name).apply(engine)
    sync, failed, rows = WeightSync(), set(), []
    for version in range(3):
        report = sync.sync(lrn, engine, version)
        rollouts = engine.generate(PROMPTS, SamplingParams(max_new_tokens=3, seed=0))
        rows = check_sync(version, lrn, engine, rollouts=rollouts, report=report)
        failed |= _failed(rows)
        train_a_little(lrn, seed=version)
    return failed, rows


@pytest.mark.parametrize(
    ("fault", "moe", "kv_cache"),
    [
        ("flipped-scale-byte", False, "bf16"),
        ("floor-requantize", False, "bf16"),
        ("partial-sync", False, "bf16"),
        ("dropped-expert", True, "bf16"),
        ("gate-up-swapped", False, "bf16"),
        ("gate-up-swapped", True, "bf16"),
        ("qkv-order", False, "bf16"),
        ("stale-derived-scales", False, "bf16"),
        ("quantized-lm-head", False, "bf16"),
        ("quantized-router", True, "bf16"),
        ("stale-kv-scale", False, "fp8"),
        ("stale-prefix-cache", False, "bf16"),
    ],
)
def test_each_fault_is_caught_by_its_own_invariant(fault, moe, kv_cache):
    failed, rows = _run_fault(fault, moe=moe, kv_cache=kv_cache)
    assert get_fault(fault).invariant in failed, [r.detail for r in rows]


def test_content_faults_do_not_trip_the_layout_check_and_vice_versa():
    failed, _ = _run_fault("flipped-scale-byte")
    assert "I3" not in failed
    failed, _ = _run_fault("gate-up-swapped")
    assert "I1" not in failed  # same encoded rows, wrong place


def test_request_admitted_mid_sync_decodes_off_its_dispatch_version_and_fails_i7():
    lrn = tiny_learner("mxfp8")
    engine = tiny_sampler(lrn, "mxfp8")
    get_fault("admitted-mid-sync").apply(engine)
    sync = WeightSync()
    sync.sync(lrn, engine, 0)
    train_a_little(lrn)
    try:
        future = engine.submit(PROMPTS, SamplingParams(max_new_tokens=6, seed=1))  # in flight when v1 lands
        report = sync.sync(lrn, engine, 1)
        rollouts = future.result(timeout=60)
    finally:
        engine.close()
    rows = check_sync(1, lrn, engine, rollouts=rollouts, report=report)
    assert any(r.weight_versions != {r.dispatch_version} for r in rollouts)  # decoded on v1, stamped v0
    assert "I7" in _failed(rows)


def test_check_rows_have_the_sync_checks_schema():
    lrn = tiny_learner("bf16")
    engine = tiny_sampler(lrn, "bf16")
    report = WeightSync().sync(lrn, engine, 0)
    df = rows_to_frame(check_sync(0, lrn, engine, report=report))
    assert list(df.columns) == list(SYNC_CHECK_COLUMNS)
    assert len(df) == 7 and df["passed"].all() and (df["check_seconds"] >= 0).all()
    assert df["first_failing_tensor"].isna().all()
