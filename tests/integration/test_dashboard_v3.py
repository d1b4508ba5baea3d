"""Issue #35 (dashboard v3) under streamlit.testing.v1.AppTest: every number a page shows for the picked fit
or upload is the one the files say, on the shipped examples and on outputs written by the real writers.

Each test fails on the dashboard before its fix: W1 (Breakeven's widgets kept the previous fit's N and other
phases), W2 (a step-level crossing shown where the fit's case has none), W3 (a per-step cost below zero with
its whole interval used in predictions), W4 (the same trace twice ingested as two ranks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"


def _open(runs: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}.py").run()
    return at


def _texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def _examples() -> None:
    if not all((EXAMPLES / f / store.FITS).is_file() for f in ("fit-tiny-dense", "fit-verl-sim")):
        pytest.skip("examples/runs lacks fit-tiny-dense or fit-verl-sim")


def _fits(runs: Path, rel: str) -> dict:
    return json.loads((runs / rel / store.FITS).read_text())


def _entry(doc: dict, phase: str) -> dict:
    return next(m for m in doc["models"] if m["phase"] == phase)


def _pick_entry(at: AppTest, phase: str) -> AppTest:
    box = at.selectbox(key="be_entry")
    return box.set_value(next(o for o in box.options if f"/ {phase}:" in o)).run()


# --------------------------------------------------------------------------------------------- W1
def test_w1_switching_the_fit_starts_n_and_other_phases_from_the_new_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _examples()
    at = _open(EXAMPLES, "breakeven", monkeypatch)
    seen = []
    for rel in ("fit-tiny-dense", "fit-verl-sim", "fit-tiny-dense"):
        at.selectbox(key="be_fit").set_value(rel).run()
        assert not at.exception, _texts(at, "exception")
        doc = _fits(EXAMPLES, rel)
        entry = next(
            m for m in doc["models"] if f"{m['model']} / {m['phase']}:" in at.selectbox(key="be_entry").value
        )
        other = sum((entry.get("step") or {}).get("other_phases_s", {}).values())
        assert int(at.select_slider(key="be_N").value) == doc["global_batch_tokens"], rel
        assert at.number_input(key="be_other").value == pytest.approx(other, abs=1e-4), rel
        assert int(at.select_slider(key="be_n").value) <= doc["global_batch_tokens"], rel
        seen.append((doc["global_batch_tokens"], round(other, 4)))
    assert seen[0] != seen[1]  # the two fits differ, so a kept value is caught


def test_w1_a_value_the_user_set_stays_while_the_fit_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    _examples()
    at = _open(EXAMPLES, "breakeven", monkeypatch)
    at.selectbox(key="be_fit").set_value("fit-tiny-dense").run()
    at.number_input(key="be_other").set_value(1.5).run()
    at.select_slider(key="be_N").set_value(4096).run()
    assert at.number_input(key="be_other").value == pytest.approx(1.5)
    assert int(at.select_slider(key="be_N").value) == 4096
