"""Issue #35 item 2 under AppTest: the answer first. Overview (the landing page) and the top of Breakeven show
fits.json's three-line step answer verbatim (the lines ``mxperf fit`` prints first), with the emulated /
measured and extrapolated marks the file gives; an older fits.json shows its per-phase answer lines.

The fit is made by the real ``mxperf fit`` on a copy of ``examples/runs`` (its sweep and both runs), so the
lines are today's CLI's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import answer, data
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"
STEP_FIT = "fit-tiny-dense-step"


def make_answer_runs(root: Path) -> Path:
    """A copy of examples/runs plus ``fit-tiny-dense-step``: today's ``mxperf fit`` over the tiny-dense sweep
    and its BF16 and MXFP8 runs (a whole-step model, so fits.json carries the three-line answer)."""
    shutil.copytree(EXAMPLES, root, symlinks=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mxperf.cli",
            "fit",
            "sweep-tiny-dense",
            "run-tiny-dense-bf16",
            "run-tiny-dense-mxfp8",
            "-o",
            STEP_FIT,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def answer_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (EXAMPLES / "sweep-tiny-dense" / store.MANIFEST).is_file():
        pytest.skip("examples/runs lacks sweep-tiny-dense")
    return make_answer_runs(tmp_path_factory.mktemp("answer") / "runs")


def _open(runs: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()  # the default page: Overview
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _plain(md: str) -> str:
    """Markdown as it reads (the card escapes Markdown's special characters)."""
    return re.sub(r"\\(.)", r"\1", md)


def _markdown(at: AppTest) -> list[str]:
    return [_plain(str(m.value)) for m in at.markdown]


def test_overview_is_the_landing_page_and_shows_the_three_lines_of_fits_json(
    answer_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = json.loads((answer_runs / STEP_FIT / store.FITS).read_text())
    assert len(doc["answer"]) == 3  # what today's mxperf fit writes: gain, breakeven, what to change
    at = _open(answer_runs, "overview", monkeypatch)
    assert at.title[0].value == "Overview"  # the default page, no switch
    assert at.selectbox(key="ov_fit").value == STEP_FIT  # the newest fit first
    shown = _markdown(at)
    for line in doc["answer"]:
        assert line in shown, line  # verbatim: one source, the CLI prints the same
    assert shown.index(doc["answer"][0]) < shown.index(doc["answer"][1]) < shown.index(doc["answer"][2])
    (sm,) = doc["step_model"]
    assert sm["emulated"]  # CPU runs: mxfp8 emulated
    head = next(
        m for m in shown if m.startswith(f"**The answer** · **{sm['model']}: mxfp8 vs bf16 per step**")
    )
    assert ":orange-badge[emulated]" in head and "measured" not in head
    extrapolated = bool(answer._step_extrapolated(sm))
    assert (":violet-badge[extrapolated]" in head) == extrapolated
    assert any(f"{STEP_FIT}/fits.json step_model[0].answer" in str(c.value) for c in at.caption)


def test_breakeven_opens_with_the_answer_of_the_picked_fit(
    answer_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = json.loads((answer_runs / STEP_FIT / store.FITS).read_text())
    at = _open(answer_runs, "breakeven", monkeypatch)
    at.selectbox(key="be_fit").set_value(STEP_FIT).run()
    shown = _markdown(at)
    verdict = next(i for i, m in enumerate(shown) if m.startswith("- tiny-dense/update: mxfp8 vs bf16"))
    for line in doc["answer"]:
        assert line in shown and shown.index(line) < verdict, line  # above the per-phase verdict
    assert next(h.value for h in at.subheader) == "Verdict"  # the answer card comes before every card


def test_an_older_fits_json_shows_its_per_phase_answers_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    if not (EXAMPLES / "fit-verl-sim" / store.FITS).is_file():
        pytest.skip("examples/runs lacks fit-verl-sim")
    doc = json.loads((EXAMPLES / "fit-verl-sim" / store.FITS).read_text())
    if doc.get("step_model"):
        pytest.skip("examples/runs/fit-verl-sim already has a step model")
    at = _open(EXAMPLES, "overview", monkeypatch)
    at.selectbox(key="ov_fit").set_value("fit-verl-sim").run()
    shown = _markdown(at)
    for m in doc["models"]:
        assert m["answer"] in shown
    head = next(m for m in shown if m.startswith("**The answer** · **Per-phase answers**"))
    assert ":green-badge[measured]" in head  # simulated GPU traces: nothing emulated
    assert any("predates the whole-step answer" in str(c.value) for c in at.caption)


def test_marks_follow_the_file() -> None:
    sm = {
        "model": "m",
        "precision": "mxfp8",
        "baseline": "bf16",
        "answer": ["a", "b", "c"],
        "emulated": {},
        "settings": [{"extrapolated": True, "tokens_per_microbatch": 8192}],
        "breakeven": {"extrapolated": False},
        "recommendation": {
            "per_precision": {"mxfp8": {"extrapolated_best": {"tokens_per_microbatch": 16384}}}
        },
    }
    (a,) = answer.answers({"step_model": [sm], "models": []})
    assert a.lines == ("a", "b", "c") and [m.label for m in a.marks] == ["measured", "extrapolated"]
    assert "8,192" in a.marks[1].why and "16,384" in a.marks[1].why
    sm2 = {
        **sm,
        "emulated": {"mxfp8": "emulated on cpu"},
        "settings": [{"extrapolated": False}],
        "recommendation": {},
    }
    (b,) = answer.answers({"step_model": [sm2]})
    assert [m.label for m in b.marks] == ["emulated"] and "emulated on cpu" in b.marks[0].why
    assert answer.answers({"models": [{"phase": "update"}]}) == []
    assert answer.markdown_text("a_b *c* [x](y) $1") == r"a\_b \*c\* \[x\](y) \$1"
