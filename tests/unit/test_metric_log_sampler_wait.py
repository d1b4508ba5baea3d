"""An async trainer's wait for its separate sampler is kept apart from the generation time, and the phase
sources and the step model take no term from it.

verl one-step-off-policy: ``generate_async`` the generation, ``gen`` the wait; NeMo RL async:
``exposed_generation`` the wait, no generation time.

Fixtures: tests/data/metric_logs/verl_one_step_off_{bf16,mxfp8}.jsonl (README there gives the built truth).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.ingest_steps import phase_sources
from perfmodel.inputs.load import RunFolder
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.step.model import step_models
from tracing.analysis.logged_steps import logged_step_tables
from tracing.ingest.metric_logs import FRAMEWORKS, SAMPLER_WAIT, load_metric_log, step_tokens
from tracing.outputs import schema, store

LOGS = Path(__file__).parents[1] / "data" / "metric_logs"
ONE_STEP_OFF = {p: LOGS / f"verl_one_step_off_{p}.jsonl" for p in ("bf16", "mxfp8")}
PLAIN = LOGS / "verl_grpo_bf16.jsonl"
SIZES = (256, 512, 1024, 2048, 4096)


def _nemo_async(tmp: Path) -> Path:
    """NeMo RL async GRPO metrics (json_dump_tb_logs.py layout): exposed_generation is the only generation
    timer; step = exposed_generation + logprobs + training + weight_sync + 0.1 s host time."""
    tags: dict[str, dict[str, float]] = {}
    for step, wait in ((1, 9.0), (2, 1.0), (3, 1.5)):
        timers = {
            "exposed_generation": wait,
            "policy_and_reference_logprobs": 2.0,
            "policy_training": 4.0,
            "weight_sync": 0.5,
            "idle/refit_bubble": 0.0,
            "total_step_time": wait + 6.6,
        }
        for label, v in timers.items():
            tags.setdefault(f"timing/train/{label}", {})[str(step)] = v
        tags.setdefault("train/token_mult_prob_error", {})[str(step)] = 1.01
    path = tmp / "nemo_async.json"
    path.write_text(json.dumps(tags))
    return path


def test_one_step_off_generate_is_generate_async_and_gen_is_the_wait() -> None:
    got = logged_step_tables(load_metric_log(ONE_STEP_OFF["bf16"]))
    assert got.phase_keys["generate"] == ["timing_s/generate_async"]
    assert got.phase_keys[SAMPLER_WAIT] == ["timing_s/gen"]
    # update_weights runs inside sync_rollout_weights in this trainer: not summed twice
    assert got.phase_keys["sync"] == ["timing_s/sync_rollout_weights"]
    wide = got.steps.pivot(index="step", columns="phase", values="seconds")
    assert wide["generate"].tolist() == [12.5, 13.0, 13.5, 14.0]
    assert wide[SAMPLER_WAIT].tolist() == pytest.approx([12.5, 2.8, 3.3, 3.8])  # step 1 overlaps nothing
    assert wide["sync"].tolist() == [0.8] * 4
    # other = step - (wait + sync + logprob + update): reward 1.0 + adv 0.2 + 0.5 host, the generation beside
    assert wide["other"].tolist() == pytest.approx([1.7] * 4)
    assert not any("add up to more than the step total" in n for n in got.notes)
    assert any("runs beside the step" in n and "timing_s/gen" in n for n in got.notes)
    assert list(got.steps.columns) == list(schema.STEP_COLUMNS)


def test_one_step_off_token_counts_are_the_batch_verl_divided_the_wait_by() -> None:
    counts, notes = step_tokens(load_metric_log(ONE_STEP_OFF["mxfp8"]))
    assert not notes
    assert [c.generated_tokens for c in counts.values()] == [64 * (305.5 + t) for t in (1, 2, 3, 4)]
    assert {(c.prompt_tokens, c.sequences) for c in counts.values()} == {(7712, 64)}


def test_a_plain_verl_log_keeps_gen_as_generate_and_update_weights_as_sync() -> None:
    got = logged_step_tables(load_metric_log(PLAIN))
    assert got.phase_keys["generate"] == ["timing_s/gen"] and SAMPLER_WAIT not in got.phase_keys
    assert got.phase_keys["sync"] == ["timing_s/update_weights"]
    assert SAMPLER_WAIT not in set(got.steps["phase"])


def test_nemo_rl_exposed_generation_is_the_wait_and_generation_is_unknown(tmp_path) -> None:
    got = logged_step_tables(load_metric_log(_nemo_async(tmp_path)))
    assert "generate" not in got.phase_keys
    assert got.phase_keys[SAMPLER_WAIT] == ["timing/train/exposed_generation"]
    wide = got.steps.pivot(index="step", columns="phase", values="seconds")
    assert wide["generate"].isna().all() and wide[SAMPLER_WAIT].tolist() == [9.0, 1.0, 1.5]
    assert wide["other"].tolist() == pytest.approx([0.1] * 3)
    assert any("no generation time is logged" in n for n in got.notes)
    assert not any("no timer of phase generate" in n for n in got.notes)


@pytest.mark.parametrize(
    ("framework", "timers", "waits"),
    [
        ("verl", {"gen", "generate_async"}, {"gen"}),
        ("verl", {"gen"}, set()),  # the on-policy trainers: gen is the generation
        ("verl", {"generate_async"}, set()),
        ("nemo_rl", {"exposed_generation"}, {"exposed_generation"}),
        ("nemo_rl", {"generation"}, set()),
    ],
)
def test_sampler_waits(framework: str, timers: set, waits: set) -> None:
    assert FRAMEWORKS[framework].sampler_waits(timers) == waits


def _ingest_folder(tmp: Path, log: Path, prec: str, phase_keys: dict | None = None) -> Path:
    """An ingest folder of one metric log (its step table and manifest entry, as mxperf ingest writes them);
    ``phase_keys``: the manifest's, to stand for an ingest written otherwise."""
    got = logged_step_tables(load_metric_log(log))
    tmp.mkdir(parents=True, exist_ok=True)
    store.write_table(schema.make_table(got.steps.to_dict("list"), schema.STEP_COLUMNS), tmp / store.STEPS)
    entry = {"path": str(log), "framework": "verl", "phase_keys": phase_keys or got.phase_keys}
    manifest = {
        "kind": "ingest",
        "config": {"labels": {"model": "sim", "precision": prec}},
        "traces": [entry],
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    return tmp


def test_phase_sources_keep_the_wait_and_step_s_is_the_logged_step(tmp_path) -> None:
    folder = _ingest_folder(tmp_path / "ing", ONE_STEP_OFF["bf16"], "bf16")
    (src,), notes = phase_sources(folder, json.loads((folder / "manifest.json").read_text()))
    assert src.phases["generate"] == [12.5, 13.0, 13.5, 14.0]
    assert src.phases[SAMPLER_WAIT] == pytest.approx([12.5, 2.8, 3.3, 3.8])
    # the log's timing_s/step: the wait + sync + the learner, never the generation that ran beside it
    assert np.allclose(src.steps["step_s"], [23.5, 13.8, 14.3, 14.8])
    assert not notes


def test_an_ingest_whose_generate_adds_the_wait_is_read_as_the_wait_only(tmp_path) -> None:
    """A step table whose generate rows sum gen + generate_async (its manifest's phase_keys say so)."""
    folder = _ingest_folder(tmp_path / "ing", ONE_STEP_OFF["bf16"], "bf16")
    table = store.read_table(folder / store.STEPS)
    table = table[table["phase"] != SAMPLER_WAIT]
    store.write_table(schema.make_table(table.to_dict("list"), schema.STEP_COLUMNS), folder / store.STEPS)
    manifest = json.loads((folder / "manifest.json").read_text())
    keys = manifest["traces"][0]["phase_keys"]
    keys["generate"] = ["timing_s/gen", "timing_s/generate_async"]
    del keys[SAMPLER_WAIT]
    (src,), notes = phase_sources(folder, manifest)
    assert "generate" not in src.phases and SAMPLER_WAIT in src.phases
    assert any("ingest the log again" in n and "(timing_s/gen)" in n for n in notes)


def _run(path: str, prec: str, phases: dict[str, float], steps: int = 12) -> RunFolder:
    per = {ph: [v * (1 + 0.01 * ((s % 5) - 2)) for s in range(steps)] for ph, v in phases.items()}
    frame = pd.DataFrame({"step": np.arange(steps, dtype=float), **{f"{p}_s": v for p, v in per.items()}})
    return RunFolder(path, "sim", prec, prec, per, None, None, frame)


@pytest.fixture(scope="module")
def fits() -> dict:
    return fit_cost_model(simulate_sweep(sizes=SIZES, repeats=3), n_boot=100, seed=0)


def _nemo_runs(generation: bool) -> list[RunFolder]:
    """Per precision a NeMo RL async source (wait, logprob, sync), with or without a generation time."""
    out = []
    for prec, wait in (("bf16", 2.0), ("mxfp8", 1.0)):
        phases = {SAMPLER_WAIT: wait, "logprob": 1.0, "sync": 0.3}
        if generation:
            phases["generate"] = 3.0 + wait
        out.append(_run(f"ing-{prec}", prec, phases))
    return out


def test_the_wait_is_no_term_and_a_known_generation_answers_separate(fits) -> None:
    why = {f"ing-{p}": "NeMo RL async GRPO (timer exposed_generation)" for p in ("bf16", "mxfp8")}
    (sm,) = step_models(fits, "bf16", _nemo_runs(True), at=[(65536, 4096)], separate_sampler=why, n_boot=100)
    assert sm["placement"]["name"] == "separate" and sm["reason"] is None
    for p in ("bf16", "mxfp8"):
        ph = sm["settings"][0]["per_precision"][p]["phases_s"]
        assert SAMPLER_WAIT not in ph
        assert sm["settings"][0]["per_precision"][p]["step_s"] == pytest.approx(
            max(ph["generate"], ph["logprob"] + ph["update"]) + ph["sync"]
        )


def test_waits_without_a_generation_time_stop_a_separate_answer_and_name_the_fix(fits) -> None:
    why = {f"ing-{p}": "NeMo RL async GRPO (timer exposed_generation)" for p in ("bf16", "mxfp8")}
    runs = _nemo_runs(False)
    (sm,) = step_models(fits, "bf16", runs, at=[(65536, 4096)], separate_sampler=why, n_boot=100)
    assert sm["settings"] == [] and sm["reason"].startswith("with a separate sampler the step is max(")
    assert "bf16: ing-bf16; mxfp8: ing-mxfp8 log(s) the trainer's wait for the sampler" in sm["reason"]
    assert "--phase bf16:generate=SECONDS, --phase mxfp8:generate=SECONDS" in sm["reason"]
    given = {("bf16", "generate"): 4.0, ("mxfp8", "generate"): 3.0}
    (sm,) = step_models(fits, "bf16", runs, at=[(65536, 4096)], separate_sampler=why, phase_times=given)
    assert sm["reason"] is None
    assert sm["settings"][0]["per_precision"]["bf16"]["step_s"] == pytest.approx(4.0 + 0.3, rel=0.01)


def test_colocated_over_waits_only_leaves_generate_out_and_says_so(fits) -> None:
    (sm,) = step_models(fits, "bf16", _nemo_runs(False), at=[(65536, 4096)], placement="colocated")
    assert sm["reason"] is None and "generate" in sm["not_in_step"]
    assert any(n.startswith("generate is not in the step: ") for n in sm["notes"])
    ph = sm["settings"][0]["per_precision"]["bf16"]["phases_s"]
    assert set(ph) == {"logprob", "update", "sync"}


def test_a_wait_given_as_a_phase_is_not_added(fits) -> None:
    runs = _nemo_runs(True)
    (sm,) = step_models(fits, "bf16", runs, at=[(65536, 4096)], other_phases={SAMPLER_WAIT: 5.0})
    assert all(SAMPLER_WAIT not in s["phases_s"] for s in sm["settings"][0]["per_precision"].values())
    assert any(n.startswith(f"{SAMPLER_WAIT} given but not used") for n in sm["notes"])
    assert not math.isnan(sm["settings"][0]["gain"])
