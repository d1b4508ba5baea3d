"""Issue #33 item 2 under AppTest: Breakeven shows fits.json's own predicted-vs-measured step table
(``step_model[].validation``, made by ``perfmodel.step.validation``) -- the rows and numbers ``mxperf fit`` wrote
to fits.json and report.md, with its sentence and median absolute error; a fit without the table says why and
how to get one, and the micro-batch comparison computed on the page stays for such fits.

The fit is today's ``mxperf fit`` over a copy of ``examples/runs`` (its sweep and both runs)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import test_dashboard_answer as ta
from streamlit.testing.v1 import AppTest

from dashboards import data
from perfmodel.step.validation import validation_words
from tracing.outputs import store


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ta.EXAMPLES / "sweep-tiny-dense" / store.MANIFEST).is_file():
        pytest.skip("examples/runs lacks sweep-tiny-dense")
    return ta.make_answer_runs(tmp_path_factory.mktemp("validation") / "runs")


def _breakeven(runs: Path, fit: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(ta.APP), default_timeout=90)
    at.run()
    at.switch_page("views/breakeven.py").run()
    at.selectbox(key="be_fit").set_value(fit).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _table(at: AppTest) -> pd.DataFrame:
    (df,) = [d.value for d in at.dataframe if "95 % band s" in d.value.columns]
    return df


def _report_rows(report: str, model: str) -> list[list[str]]:
    """The cells of report.md's predicted-vs-measured table for ``model`` (its body: header and rule left out)."""
    lines = report.split(f"### {model}: predicted vs measured step (run folders)", 1)[1].splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| run |"))
    body = []
    for line in lines[head + 2 :]:
        if not line.startswith("|"):
            break
        body.append([c.strip() for c in line.strip().strip("|").split("|")])
    return body


def test_breakeven_shows_the_fits_json_table_with_its_numbers(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit = runs / ta.STEP_FIT
    doc = json.loads((fit / store.FITS).read_text())
    (sm,) = doc["step_model"]
    v = sm["validation"]
    assert v and v["rows"], "mxperf fit over the sweep and both runs writes the table"
    at = _breakeven(runs, ta.STEP_FIT, monkeypatch)
    df = _table(at)
    assert len(df) == len(v["rows"])
    for (_, got), want in zip(df.iterrows(), v["rows"], strict=True):
        assert got["run"] == Path(want["run"]).name  # the folder under the runs directory
        assert (runs / got["run"] / store.MANIFEST).is_file()
        assert (got["phase"], got["precision"], got["steps"]) == (
            want["phase"],
            want["precision"],
            want["steps"],
        )
        assert got["predicted s"] == want["predicted_s"]  # the file's numbers, not recomputed
        assert got["measured s"] == want["measured_s"]
        assert got["error %"] == want["error_pct"]
        lo, hi = want["predicted_ci"]
        assert got["95 % band s"] == f"[{lo:.4g}, {hi:.4g}]"
        assert got["inside"] == {True: "yes", False: "no"}[want["inside"]]
    assert {"in-sample", "step"} <= set(df["source"]) and df["source"].str.startswith("fitted").any()

    # the same rows as report.md, cell for cell where the page shows text, to report.md's digits where numbers
    report = _report_rows((fit / store.REPORT).read_text(), sm["model"])
    assert len(report) == len(df)
    for (_, got), cells in zip(df.iterrows(), report, strict=True):
        run, phase, prec, source, steps, pred, band, meas, err, inside = cells
        assert run.strip("`").endswith(got["run"])
        assert [phase, prec, source, steps] == [
            got["phase"],
            got["precision"],
            got["source"],
            str(got["steps"]),
        ]
        assert (pred, meas) == (f"{got['predicted s']:.4g}", f"{got['measured s']:.4g}")
        assert band == got["95 % band s"] and inside == got["inside"]
        assert err == f"{got['error %']:+.1f} %"

    words = validation_words(v)
    assert words and words in [re.sub(r"\\(.)", r"\1", str(m.value)) for m in at.markdown]
    mae = f"median absolute error {v['median_abs_error_pct']:.0f} % over {v['counted_rows']} rows"
    assert mae in words
    caption = next(str(c.value) for c in at.caption if "step_model[].validation" in str(c.value))
    assert "shown but not counted" in caption and "in-sample" in caption


def test_a_fit_without_the_table_says_how_to_get_one_and_keeps_the_micro_batch_card(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/runs/fit-tiny-dense was fitted with the BF16 run only: no step prediction, so no table. The
    card says why and names ``mxperf fit SWEEP RUN...``; the page's own micro-batch comparison (every run of
    the model under the runs directory) still has a row per run, which is why that card stays."""
    doc = json.loads((runs / "fit-tiny-dense" / store.FITS).read_text())
    (sm,) = doc["step_model"]
    assert sm["validation"] is None and sm["reason"]
    at = _breakeven(runs, "fit-tiny-dense", monkeypatch)
    assert not [d for d in at.dataframe if "95 % band s" in d.value.columns]
    (said,) = [str(i.value) for i in at.info if "predicted-vs-measured step table" in str(i.value)]
    assert "`mxperf fit SWEEP RUN...`" in said and sm["reason"][:40] in said
    (mb,) = [d.value for d in at.dataframe if "micro-batches, tokens" in d.value.columns]
    assert {"run-tiny-dense-bf16", "run-tiny-dense-mxfp8"} <= set(mb["run"])
    assert all(not math.isnan(x) for x in mb["measured s"])
