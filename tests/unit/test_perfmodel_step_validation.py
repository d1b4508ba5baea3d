"""Predicted vs measured step (issue 33 item 2): the table in fits.json, report.md and stdout against the run
folders' own metrics.parquet and ranges.parquet, recomputed here without perfmodel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mxperf.cli import main

EX = Path(__file__).resolve().parents[2] / "examples" / "runs"
RUNS = ("run-tiny-dense-bf16", "run-tiny-dense-mxfp8")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[dict, str, str]:
    out = tmp_path_factory.mktemp("val") / "fit"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(
            [
                "fit",
                str(EX / "sweep-tiny-dense"),
                *(str(EX / r) for r in RUNS),
                "-o",
                str(out),
                "--bootstrap",
                "200",
            ]
        )
    assert rc == 0
    return json.loads((out / "fits.json").read_text()), (out / "report.md").read_text(), buf.getvalue()


def _padded(run: str) -> dict[int, list[int]]:
    r = pd.read_parquet(EX / run / "ranges.parquet")
    out: dict[int, list[tuple[int, int]]] = {}
    for a in r.loc[r["name"] == "update/microbatch", "attrs"]:
        a = json.loads(a)
        out.setdefault(int(a["step"]), []).append((int(a["microbatch"]), int(a["padded_tokens"])))
    return {s: [t for _, t in sorted(v)] for s, v in out.items()}


def _outside(run: str) -> float:
    """Median per step of the update range minus its update/microbatch ranges (the optimizer step)."""
    r = pd.read_parquet(EX / run / "ranges.parquet")
    kids = r[r["name"] == "update/microbatch"].groupby("parent_id")["dur_ns"].sum()
    upd = r[r["name"] == "update"]
    return float(
        np.median([(d - kids[i]) * 1e-9 for i, d in zip(upd["range_id"], upd["dur_ns"], strict=True)])
    )


def _row(v: dict, run: str, phase: str) -> dict:
    (row,) = [r for r in v["rows"] if r["run"].endswith(run) and r["phase"] == phase]
    return row


def test_table_matches_the_run_folders(fitted):
    doc, report, stdout = fitted
    (sm,) = doc["step_model"]
    v = sm["validation"]
    fits = doc["models"][0]["fits"]
    errors = []
    for run, prec in zip(RUNS, ("bf16", "mxfp8"), strict=True):
        m = pd.read_parquet(EX / run / "metrics.parquet")
        f = fits[prec]
        assert f["model"] == "line" and f.get("attention") is None  # the curve below is the fitted line
        packs = _padded(run)
        opt = _outside(run)  # once per step: the run's optimizer step (median over its own steps)
        assert sm["phases"][prec]["update"]["optimizer_step"]["seconds"] == pytest.approx(opt)
        pred_update = [
            sum(f["fixed_s"] + f["per_token_s"] * t for t in packs[int(s)]) + f["per_step_s"] + opt
            for s in m["step"]
        ]
        upd = _row(v, run, "update")
        assert upd["kind"] == "fitted" and upd["steps"] == len(m)
        assert upd["measured_s"] == pytest.approx(float(m["update_s"].median()))
        assert upd["predicted_s"] == pytest.approx(float(np.median(pred_update)))
        # phases measured in the same folder: in-sample, predicted = that folder's median
        for ph in ("generate", "logprob", "sync"):
            r = _row(v, run, ph)
            assert r["kind"] == "in-sample"
            assert r["predicted_s"] == pytest.approx(float(m[f"{ph}_s"].median()))
        other = m["generate_s"].median() + m["logprob_s"].median() + m["sync_s"].median()
        step = _row(v, run, "step")
        assert step["measured_s"] == pytest.approx(float(m["step_s"].median()))
        # whole step per step: its update prediction plus the other phases' medians, then the median over steps
        assert step["predicted_s"] == pytest.approx(float(np.median(np.asarray(pred_update) + other)))
        for r in (upd, step):
            err = 100 * (r["predicted_s"] / r["measured_s"] - 1)
            assert r["error_pct"] == pytest.approx(err)
            errors.append(abs(err))
            lo, hi = r["predicted_ci"]
            assert lo <= r["predicted_s"] <= hi
            assert r["inside"] == (lo <= r["measured_s"] <= hi)
    assert v["median_abs_error_pct"] == pytest.approx(float(np.median(errors)))
    assert v["counted_rows"] == len(errors)
    # every step the runs missed by more than 10 % is said as a miss, in the answer, the report and stdout
    missed = {m["precision"] for m in v["misses"]}
    for run, prec in zip(RUNS, ("bf16", "mxfp8"), strict=True):
        e = _row(v, run, "step")["error_pct"]
        assert (prec in missed) == (abs(e) > 10 or not _row(v, run, "step")["inside"])
        if prec in missed:
            assert f"{prec} {e:+.0f} %" in doc["answer"][0]
            assert "misses" in doc["answer"][0]
    assert f"Median absolute error {v['median_abs_error_pct']:.1f} %" in report
    assert "predicted vs measured" in report and "predicted vs measured" in stdout
    assert f"median absolute error {v['median_abs_error_pct']:.1f} %" in stdout


def test_settings_use_the_runs_packing(fitted):
    """N tokens in whole sequences padded to the longest: the runs' micro-batch count, not ceil(N / n)."""
    doc, _, _ = fitted
    (s,) = doc["step_model"][0]["settings"]
    counts = [len(p) for run in RUNS for p in _padded(run).values()]
    assert s["microbatches"] == int(np.median(counts))
    assert s["packing"]["ceil_microbatches"] == int(np.ceil(s["global_tokens"] / s["tokens_per_microbatch"]))
    assert len(s["packing"]["microbatch_tokens"]) == s["microbatches"]
    f = doc["models"][0]["fits"]["bf16"]
    pk = s["packing"]["microbatch_tokens"]
    update = sum(f["fixed_s"] + f["per_token_s"] * t for t in pk) + f["per_step_s"] + _outside(RUNS[0])
    assert s["per_precision"]["bf16"]["phases_s"]["update"] == pytest.approx(update)
