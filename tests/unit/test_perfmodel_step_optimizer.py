"""The update's time outside its micro-batches (optimizer step) as a term of the step model (issue 33): measured
from synthetic range logs whose truth is known, added once per step to the update, absent when no run folder
gives it, withdrawn from both precisions when only one has it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.inputs.load import load_inputs
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.report.markdown import render_report
from perfmodel.report.results import analyze
from perfmodel.step.optimizer import outside_microbatches
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir

# per step: the update's micro-batches (seconds each) and the time outside them (the truth)
MICRO = ((0.05, 0.06), (0.05, 0.05), (0.07, 0.05), (0.05, 0.05), (0.06, 0.05))
OUTSIDE = {"bf16": (0.010, 0.012, 0.011, 0.030, 0.009), "mxfp8": (0.020, 0.021, 0.019, 0.022, 0.050)}


def _ranges(outside: tuple[float, ...]) -> pd.DataFrame:
    """A range log like a run's: per step an ``update`` range holding its micro-batch ranges and, after
    them, ``outside`` seconds of other work (the optimizer step)."""
    rows, t, rid = [], 0, 0
    for step, (mbs, out) in enumerate(zip(MICRO, outside, strict=True)):
        dur = round((sum(mbs) + out) * 1e9)
        parent = rid
        rows.append((rid, "update", t, t + dur, dur, 1, json.dumps({"step": step, "microbatches": len(mbs)})))
        rid += 1
        s = t
        for i, m in enumerate(mbs):
            d = round(m * 1e9)
            rows.append(
                (
                    rid,
                    "update/microbatch",
                    s,
                    s + d,
                    d,
                    2,
                    json.dumps({"step": step, "microbatch": i}),
                    parent,
                )
            )
            rid += 1
            s += d
        t += dur + 1000
    return pd.DataFrame(
        [
            {
                "range_id": r[0],
                "name": r[1],
                "start_ns": r[2],
                "end_ns": r[3],
                "dur_ns": r[4],
                "tid": 1,
                "depth": r[5],
                "parent_id": r[7] if len(r) > 7 else -1,
                "attrs": r[6],
            }
            for r in rows
        ]
    )


def _run(path: Path, prec: str, ranges: bool = True) -> Path:
    k = len(MICRO)
    metrics = pd.DataFrame(
        {
            "step": range(k),
            "generate_s": [1.0] * k,
            "update_s": [sum(m) + o for m, o in zip(MICRO, OUTSIDE[prec], strict=True)],
            "num_microbatches": [2] * k,
            "update_tokens": [2048] * k,
        }
    )
    config = {"model": "sim", "learner": prec, "sampler": prec, "tokens_per_microbatch": 1024}
    with OutputDir(path, kind="run", command=["test"], config=config) as od:
        store.write_table(metrics, od.path / store.METRICS)
        if ranges:
            store.write_table(_ranges(OUTSIDE[prec]), od.path / store.RANGES)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("opt")
    sweep = d / "sweep"
    with OutputDir(sweep, kind="sweep", command=["test"]) as od:
        store.write_table(
            simulate_sweep(sizes=(256, 512, 1024, 2048, 4096), repeats=4), od.path / store.MICROBATCHES
        )
    return {
        "sweep": sweep,
        "bf16": _run(d / "run-bf16", "bf16"),
        "mxfp8": _run(d / "run-mxfp8", "mxfp8"),
        "mxfp8-bare": _run(d / "run-mxfp8-bare", "mxfp8", ranges=False),
        "bf16-bare": _run(d / "run-bf16-bare", "bf16", ranges=False),
    }


def _sm(paths: list[Path]) -> dict:
    doc = analyze(load_inputs([str(p) for p in paths]), n_boot=200)
    return doc


def test_outside_is_the_update_range_minus_its_micro_batches() -> None:
    r = _ranges(OUTSIDE["bf16"])
    got = outside_microbatches(r)
    assert sorted(got) == list(range(len(MICRO)))
    assert [got[s] for s in sorted(got)] == pytest.approx(OUTSIDE["bf16"], abs=1e-9)
    # two ranks with the same range ids (an ingest): matched within each rank, the slower rank's per step
    slow = _ranges(tuple(o + 0.005 for o in OUTSIDE["bf16"]))
    two = pd.concat([r.assign(rank=0), slow.assign(rank=1)], ignore_index=True)
    got = outside_microbatches(two)
    assert [got[s] for s in sorted(got)] == pytest.approx([o + 0.005 for o in OUTSIDE["bf16"]], abs=1e-9)
    # an update range without micro-batch ranges tells nothing apart: left out
    assert outside_microbatches(r[r["name"] == "update"]) == {}
    assert outside_microbatches(r.drop(columns=["parent_id"])) == {}


def test_the_term_is_each_precisions_median_with_an_interval_added_once_per_step(folders) -> None:
    doc = _sm([folders["sweep"], folders["bf16"], folders["mxfp8"]])
    (sm,) = doc["step_model"]
    ref = _sm([folders["sweep"], folders["bf16-bare"], folders["mxfp8-bare"]])["step_model"][0]
    for prec in ("bf16", "mxfp8"):
        o = sm["phases"][prec]["update"]["optimizer_step"]
        truth = float(np.median(OUTSIDE[prec]))
        assert o["seconds"] == pytest.approx(truth, abs=1e-9) and o["steps"] == len(MICRO)
        assert o["ci"][0] <= truth <= o["ci"][1]
        assert o["ci"][0] >= min(OUTSIDE[prec]) - 1e-9 and o["ci"][1] <= max(OUTSIDE[prec]) + 1e-9
        assert o["reason"] is None and o["runs"] == [str(folders[prec])]
        assert "optimizer step" in sm["phases"][prec]["update"]["source"]
        # added once per step, whatever the micro-batch count: the same fits, the update longer by the term
        s, r = sm["settings"][0], ref["settings"][0]
        got = s["per_precision"][prec]["phases_s"]["update"] - r["per_precision"][prec]["phases_s"]["update"]
        assert got == pytest.approx(truth, abs=1e-9)
        ci, ci_ref = s["per_precision"][prec]["step_ci"], r["per_precision"][prec]["step_ci"]
        assert ci[0] > ci_ref[0] and ci[1] > ci_ref[1]
    # the validation's update row carries it: predicted with the term, against the measured update_s
    rows = {(r["run"], r["phase"]): r for r in sm["validation"]["rows"]}
    rows_ref = {(Path(r["run"]).name, r["phase"]): r for r in ref["validation"]["rows"]}
    for prec in ("bf16", "mxfp8"):
        upd = rows[(str(folders[prec]), "update")]
        base = rows_ref[(f"run-{prec}-bare", "update")]
        assert upd["predicted_s"] - base["predicted_s"] == pytest.approx(np.median(OUTSIDE[prec]), abs=1e-9)
    # the report lists it where the update's source is listed
    report = render_report(doc)
    assert report.count("optimizer step") >= 2


def test_no_range_log_no_term_and_the_output_says_so(folders) -> None:
    sm = _sm([folders["sweep"], folders["bf16-bare"], folders["mxfp8-bare"]])["step_model"][0]
    for prec in ("bf16", "mxfp8"):
        o = sm["phases"][prec]["update"]["optimizer_step"]
        assert o["seconds"] is None and o["ci"] is None and o["steps"] == 0
        assert "records update and update/microbatch ranges" in o["reason"]
        assert "no optimizer step" in sm["phases"][prec]["update"]["source"]


def test_a_term_of_one_precision_only_is_left_out_of_both(folders) -> None:
    sm = _sm([folders["sweep"], folders["bf16"], folders["mxfp8-bare"]])["step_model"][0]
    ref = _sm([folders["sweep"], folders["bf16-bare"], folders["mxfp8-bare"]])["step_model"][0]
    for prec in ("bf16", "mxfp8"):
        assert sm["phases"][prec]["update"]["optimizer_step"]["seconds"] is None
        assert "bf16 only" in sm["phases"][prec]["update"]["optimizer_step"]["reason"]
    assert any("bf16 only" in n for n in sm["notes"])
    assert sm["settings"][0]["gain"] == pytest.approx(ref["settings"][0]["gain"])


def test_the_order_of_the_inputs_never_changes_the_term(folders) -> None:
    a = _sm([folders["sweep"], folders["bf16"], folders["mxfp8"]])["step_model"]
    b = _sm([folders["mxfp8"], folders["bf16"], folders["sweep"]])["step_model"]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
