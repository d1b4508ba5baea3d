"""An ingest's step table (traces' step ranges, verl / NeMo RL metric logs) as the step model's phase source:
per precision, the seconds per step of each phase, matched by labels or by the GEMMs the trace shows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.inputs.ingest_steps import phase_sources
from perfmodel.inputs.load import load_inputs
from perfmodel.report.results import analyze
from tracing.outputs import schema, store

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "examples" / "runs"


def _steps_folder(tmp: Path, rows: list[tuple], traces: list[dict], labels: dict | None = None) -> Path:
    """An ingest folder holding only a step table and the manifest's trace entries."""
    tmp.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows, columns=["trace", "rank", "pid", "step", "phase", "seconds"])
    store.write_table(schema.make_table(df.to_dict("list"), schema.STEP_COLUMNS), tmp / store.STEPS)
    manifest = {"kind": "ingest", "status": "complete", "config": {"labels": labels or {}}, "traces": traces}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    return tmp


def test_ranks_of_one_precision_give_the_slowest_rank_per_step_and_uncaptured_phases_are_left_out(tmp_path):
    rows = []
    for step in range(4):
        for rank, upd in ((0, 1.0 + step), (1, 1.5 + step)):
            rows += [
                (f"r{rank}", rank, 10 + rank, step, "update", upd),
                (f"r{rank}", rank, 10 + rank, step, "logprob", 0.5 * (rank + 1)),
                (f"r{rank}", rank, 10 + rank, step, "generate", 0.0),  # the learner's trace: no sampler
            ]
    ev = {"precision": "mxfp8", "reason": "MX block-scaled GEMMs"}
    traces = [{"path": "r0", "precision_evidence": ev}, {"path": "r1", "precision_evidence": ev}]
    folder = _steps_folder(tmp_path / "ing", rows, traces, labels={"model": "m"})
    (src,), notes = phase_sources(folder, json.loads((folder / "manifest.json").read_text()))
    assert (src.learner, src.sampler, src.model) == ("mxfp8", "mxfp8", "m")
    assert src.phases["update"] == [1.5, 2.5, 3.5, 4.5]  # rank 1 is the slower one in every step
    assert src.phases["logprob"] == [1.0] * 4
    assert "generate" not in src.phases and any("generate not captured" in n for n in notes)
    assert np.allclose(src.steps["step_s"], [2.5, 3.5, 4.5, 5.5])
    assert not src.fit_source  # no micro-batch table in the folder


def test_a_trace_of_unknown_precision_is_named_and_left_out_and_labels_win_over_gemms(tmp_path):
    rows = [("a", 0, 1, 0, "update", 2.0), ("b", 0, 2, 0, "update", 3.0)]
    traces = [
        {"path": "a", "labels": {"precision": "bf16"}, "precision_evidence": {"precision": "mxfp8"}},
        {"path": "b"},
    ]
    folder = _steps_folder(tmp_path / "ing", rows, traces)
    (src,), notes = phase_sources(folder, json.loads((folder / "manifest.json").read_text()))
    assert src.learner == "bf16" and src.phases == {"update": [2.0]}
    assert len(notes) == 1 and "steps of b are not a phase source: its precision is unknown" in notes[0]


def test_metric_logs_are_each_precisions_phase_source_in_the_step_answer(tmp_path):
    rng = np.random.default_rng(0)
    rows = [
        {
            "model": "qwen3-8b",
            "precision": prec,
            "phase": "update",
            "tokens_per_microbatch": n,
            "repeat": r,
            "seconds": (f + t * n) * (1 + 0.01 * rng.standard_normal()),
        }
        for prec, (f, t) in {"bf16": (0.010, 4e-6), "mxfp8": (0.013, 3e-6)}.items()
        for n in (1024, 2048, 4096, 8192)
        for r in range(3)
    ]
    csv = tmp_path / "mb.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    inputs = load_inputs([csv, RUNS / "metrics-verl-bf16", RUNS / "metrics-verl-mxfp8"])
    by_prec = {r.learner: r for r in inputs.runs}
    logged = {
        p: pd.read_parquet(RUNS / f"metrics-verl-{p}" / store.STEPS).pivot_table(
            index="step", columns="phase", values="seconds", aggfunc="max"
        )
        for p in ("bf16", "mxfp8")
    }
    for p in ("bf16", "mxfp8"):
        assert by_prec[p].phases["generate"] == pytest.approx(list(logged[p]["generate"]))
        assert by_prec[p].model == "qwen3-8b"
    doc = analyze(inputs, n_boot=200, global_tokens=65536)
    (sm,) = doc["step_model"]
    gen = {p: sm["phases"][p]["generate"] for p in ("bf16", "mxfp8")}
    assert gen["bf16"]["kind"] == "measured" and "metrics-verl-bf16" in gen["bf16"]["source"]
    assert gen["bf16"]["seconds"] == pytest.approx(float(np.median(by_prec["bf16"].phases["generate"])))
    assert gen["mxfp8"]["seconds"] < gen["bf16"]["seconds"]  # the logs' MXFP8 sampler is faster
    assert sm["phases"]["bf16"]["update"]["kind"] == "fitted"
    skipped = sm["validation"]["skipped"]
    assert any("whole step: update cannot be predicted" in s for s in skipped)
    assert not [r for r in sm["validation"]["rows"] if r["kind"] == "step"]  # no partial step compared


def test_a_traced_ingest_pair_adds_its_other_time_and_is_not_its_own_validation(tmp_path):
    pair = []
    for p in ("bf16", "mxfp8"):
        shutil.copytree(RUNS / f"ingest-verl-sim-{p}", tmp_path / p)
        pair.append(tmp_path / p)
    inputs = load_inputs(pair)
    assert sorted(r.learner for r in inputs.runs) == ["bf16", "mxfp8"]
    assert all(r.fit_source and "other" in r.phases and "generate" not in r.phases for r in inputs.runs)
    (sm,) = analyze(inputs, n_boot=200)["step_model"]
    assert sm["phases"]["bf16"]["other"]["kind"] == "measured"
    assert "generate" in sm["not_in_step"] or "generate" in json.dumps(sm["answer"])
    v = sm["validation"] or {}
    assert not v.get("rows") or all(r["kind"] != "step" for r in v["rows"])


def test_a_phase_unknown_in_every_step_is_said_not_logged_not_zero(tmp_path):
    """#33: a metric log without its step total has 'other' NaN in every step: not 'zero in every step'."""
    rows = []
    for step in range(3):
        rows += [("log", None, 0, step, "update", 2.0), ("log", None, 0, step, "other", np.nan)]
        rows += [("log", None, 0, step, "generate", 0.0)]
    folder = _steps_folder(tmp_path / "ing", rows, [{"path": "log"}], labels={"precision": "bf16"})
    (src,), notes = phase_sources(folder, json.loads((folder / "manifest.json").read_text()))
    assert set(src.phases) == {"update"}
    assert any("other not known in any step (not logged)" in n for n in notes)
    assert any("generate not captured (zero in every step)" in n for n in notes)
    assert not any("other not captured" in n for n in notes)
