"""Issue #35 under AppTest: Breakeven's predicted step time uses each precision's own other phases (fits.json
``step.other_phases_by_precision_s``, as ``mxperf fit``'s step model does) and invents no global batch: with
``global_batch_tokens`` null the step is at the N the user picks, said so (it used to take 65,536 silently)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import test_dashboard_answer as ta
from streamlit.testing.v1 import AppTest

from dashboards import data
from tracing.outputs import store


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ta.EXAMPLES / "sweep-tiny-dense" / store.MANIFEST).is_file():
        pytest.skip("examples/runs lacks sweep-tiny-dense")
    root = ta.make_answer_runs(tmp_path_factory.mktemp("predictor") / "runs")
    # the same fit as mxperf fit writes it when nothing gives a global batch (steplevel._no_global_batch)
    shutil.copytree(root / ta.STEP_FIT, root / "fit-no-global-batch")
    doc = json.loads((root / "fit-no-global-batch" / store.FITS).read_text())
    doc["global_batch_tokens"] = None
    for m in doc["models"]:
        m["step"]["recommendation"] = {
            "global_batch_tokens": None,
            "precision": None,
            "per_precision": {},
            "reason": "no global batch: pass --global-batch N",
        }
        m["step"]["step_breakeven"] = []
    (root / "fit-no-global-batch" / store.FITS).write_text(json.dumps(doc))
    return root


def _breakeven(runs: Path, fit: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(ta.APP), default_timeout=60)
    at.run()
    at.switch_page("views/breakeven.py").run()
    at.selectbox(key="be_fit").set_value(fit).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _step_s(fit: dict, big_n: int, n: int, other: float) -> float:
    return (big_n / n) * fit["fixed_s"] + big_n * fit["per_token_s"] + (fit.get("per_step_s") or 0.0) + other


def test_each_precision_gets_its_own_other_phases(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads((runs / ta.STEP_FIT / store.FITS).read_text())
    (entry,) = doc["models"]
    own = entry["step"]["other_phases_by_precision_s"]
    shared = sum(entry["step"]["other_phases_s"].values())
    expect = {p: shared + sum(own[p].values()) for p in ("bf16", "mxfp8")}
    assert abs(expect["bf16"] - expect["mxfp8"]) > 0.01  # the file's two precisions differ
    at = _breakeven(runs, ta.STEP_FIT, monkeypatch)
    assert at.number_input(key="be_other").value == pytest.approx(expect["bf16"], abs=1e-4)
    assert at.number_input(key="be_other_low").value == pytest.approx(expect["mxfp8"], abs=1e-4)
    big_n, n = int(at.select_slider(key="be_N").value), int(at.select_slider(key="be_n").value)
    assert big_n == doc["global_batch_tokens"]
    shown = {m.label.removesuffix(" step"): float(m.value.removesuffix(" s")) for m in at.metric}
    for p in ("bf16", "mxfp8"):  # the file's line and the precision's own phases, not one shared number
        assert shown[p] == pytest.approx(
            float(f"{_step_s(entry['fits'][p], big_n, n, round(expect[p], 4)):.3g}"), rel=1e-9
        ), p
    assert any("other_phases_by_precision_s" in str(c.value) for c in at.caption)


def test_no_global_batch_is_the_users_pick_never_an_invented_one(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _breakeven(runs, "fit-no-global-batch", monkeypatch)
    info = " ".join(str(i.value) for i in at.info)
    assert "no global batch" in info and "the N you pick, not your run's" in info
    assert "no global batch: pass --global-batch N" in info  # mxperf fit's own reason, quoted
    big_n = int(at.select_slider(key="be_N").value)  # not an invented 65,536: one measured micro-batch a step
    assert big_n != 65536 and f"largest measured micro-batch ({big_n:,} tokens" in info
