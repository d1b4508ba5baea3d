"""dashboards.fitsview's predicted-vs-measured step table (issue 33 item 2): fits.json's
``step_model[].validation`` rows as the dashboard shows them -- the rows, words and numbers of report.md
(``perfmodel.step.validation.validation_table``), nothing recomputed; run folders named relative to the runs
directory where they can be; a fit without the table says why and how to get one."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from dashboards import fitsview
from perfmodel.step.validation import validation_table

ROOT = Path("/data/runs")


def _row(run: str, phase: str, kind: str, pred: float, meas: float, **extra) -> dict:
    return {
        "run": run,
        "phase": phase,
        "precision": "bf16",
        "kind": kind,
        "steps": 5,
        "predicted_s": pred,
        "predicted_ci": [pred * 0.8, pred * 1.2],
        "measured_s": meas,
        "error_pct": 100.0 * (pred / meas - 1.0) if meas > 0 else None,
        "inside": pred * 0.8 <= meas <= pred * 1.2,
        **extra,
    }


V = {
    "rows": [
        _row(f"{ROOT}/run-bf16", "generate", "in-sample", 0.521365149, 0.521365149),
        _row(
            f"{ROOT}/run-bf16",
            "update",
            "fitted",
            2.3434511690255175,
            3.828038088,
            in_sample_part="optimizer step 60.0 ms (this run's median)",
        ),
        {**_row(f"{ROOT}/run-bf16", "step", "step", 4.528972271025517, 5.949367881), "not_in_step_model": []},
        {
            **_row("elsewhere/run-x", "step", "step", 1.0, 0.0),
            "error_pct": None,
            "predicted_ci": None,
            "inside": None,
        },
    ],
    "median_abs_error_pct": 31.3,
    "counted_rows": 2,
    "misses": [],
    "skipped": [],
}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_frame_holds_fits_json_numbers_unchanged_in_order() -> None:
    df = fitsview.validation_frame(V, ROOT)
    assert list(df.columns) == fitsview.VALIDATION_COLUMNS
    assert len(df) == len(V["rows"])
    for (_, got), want in zip(df.iterrows(), V["rows"], strict=True):
        assert (got["phase"], got["precision"], got["steps"]) == (
            want["phase"],
            want["precision"],
            want["steps"],
        )
        assert got["predicted s"] == want["predicted_s"] and got["measured s"] == want["measured_s"]
        if want["error_pct"] is None:
            assert math.isnan(got["error %"])
        else:
            assert got["error %"] == want["error_pct"]
    assert list(df["run"]) == ["run-bf16", "run-bf16", "run-bf16", "elsewhere/run-x"]


def test_frame_says_what_report_md_says() -> None:
    """Source, band and inside read as report.md's table cells; the numbers round to its cells."""
    report = [_cells(line) for line in validation_table(V)[2:]]
    df = fitsview.validation_frame(V)
    for (_, got), cells in zip(df.iterrows(), report, strict=True):
        run, phase, prec, source, steps, pred, band, meas, err, inside = cells
        assert run == f"`{got['run']}`"  # no runs dir given: the run as fits.json names it
        assert [got["phase"], got["precision"], got["source"], str(got["steps"])] == [
            phase,
            prec,
            source,
            steps,
        ]
        assert (f"{got['predicted s']:.4g}", f"{got['measured s']:.4g}") == (pred, meas)
        assert got["95 % band s"] == (band if band != "-" else "none")
        assert err == ("-" if math.isnan(got["error %"]) else f"{got['error %']:+.1f} %")
        assert {"yes": "yes", "no": "no", "-": "no band"}[inside] == got["inside"]
    assert df["source"].iloc[1] == "fitted, optimizer step 60.0 ms (this run's median) in-sample"


def test_numbers_for_download_keep_the_band_and_fields() -> None:
    df = fitsview.validation_numbers(V, ROOT)
    assert list(df["band_lo_s"][:3]) == [r["predicted_ci"][0] for r in V["rows"][:3]]
    assert list(df["band_hi_s"][:3]) == [r["predicted_ci"][1] for r in V["rows"][:3]]
    assert math.isnan(df["band_lo_s"].iloc[3]) and df["inside"].iloc[3] is None
    assert list(df["run_in_fits_json"]) == [r["run"] for r in V["rows"]]
    assert list(df["predicted_s"]) == [r["predicted_s"] for r in V["rows"]]


def test_empty_without_rows() -> None:
    for v in (None, {}, {"rows": []}):
        df = fitsview.validation_frame(v)
        assert df.empty and list(df.columns) == fitsview.VALIDATION_COLUMNS
        assert isinstance(fitsview.validation_numbers(v), pd.DataFrame)


@pytest.mark.parametrize(
    ("path", "rels", "want"),
    [
        ("/data/runs/run-bf16", (), "run-bf16"),  # absolute inside the runs dir
        ("/data/runs/sub/run-bf16/", (), "sub/run-bf16"),
        ("/other/run-bf16", (), "/other/run-bf16"),  # outside, and no output of that name
        ("examples/runs/run-bf16", ("run-bf16", "x/run-bf16", "bf16"), "run-bf16"),  # as given to mxperf fit
        ("a/x/run-bf16", ("run-bf16", "x/run-bf16"), "x/run-bf16"),  # the longest name that fits
        ("examples/runs/ingest-2 (mxfp8)", ("ingest-2",), "ingest-2 (mxfp8)"),  # an ingest's precision kept
        ("/data/runs/ingest-2 (bf16)", (), "ingest-2 (bf16)"),
        ("run-bf16", ("run-bf16",), "run-bf16"),
        ("myrun-bf16", ("run-bf16",), "myrun-bf16"),  # a name's tail is no match
    ],
)
def test_run_label(path: str, rels: tuple[str, ...], want: str) -> None:
    assert fitsview.run_label(path, ROOT, rels) == want


ENTRY = {"model": "tiny-dense", "phase": "update", "baseline": "bf16", "precision": "mxfp8"}


def _doc(**sm) -> dict:
    return {
        "step_model": [
            {"model": "other", "baseline": "bf16", "precision": "mxfp8", "validation": V},
            {"model": "tiny-dense", "baseline": "bf16", "precision": "mxfp8", **sm},
        ]
    }


def test_step_model_of_matches_model_baseline_and_precision() -> None:
    assert fitsview.step_model_of(_doc(validation=V), ENTRY)["model"] == "tiny-dense"
    assert fitsview.step_model_of(_doc(), {**ENTRY, "precision": "nvfp4"}) is None
    assert fitsview.step_model_of({"models": []}, ENTRY) is None


def test_a_fit_without_the_table_says_why_and_how() -> None:
    assert fitsview.no_validation_words(_doc(validation=V), ENTRY) is None
    how = "`mxperf fit SWEEP RUN...`"
    none = fitsview.no_validation_words(_doc(validation=None, reason=None), ENTRY)
    assert how in none and "given no run folder" in none and "tiny-dense" in none and "bf16 and mxfp8" in none
    why = fitsview.no_validation_words(
        _doc(validation=None, reason="the two steps hold different phases"), ENTRY
    )
    assert how in why and "no step prediction (the two steps hold different phases)" in why
    old = fitsview.no_validation_words({"models": []}, ENTRY)
    assert how in old and "no step model" in old
    other = fitsview.no_validation_words(_doc(validation=V), {**ENTRY, "model": "third"})
    assert how in other and "no comparison for this entry" in other
