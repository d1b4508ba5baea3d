"""Issue #35 item 1: the pages speak words, not identifiers: no case id (``faster_below``, ``never_faster``),
``null`` / ``None`` / ``NaN`` or "pid -1" in a sentence on any page of examples/runs, every fit, entry and basis
of Breakeven included (ids may appear in code spans and table columns named for them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_dashboard_apptest as ta

RUNS = Path(__file__).resolve().parents[2] / "examples" / "runs"
RAW = re.compile(
    r"(?<![`\w])(never_faster|always_faster|faster_above|faster_below|null|None|NaN|nan|pid -1)(?![`\w])"
)


def _raw(at: object) -> list[str]:
    plain = re.sub(r"`[^`]*`", "", ta._all_text(at))
    return [line for line in plain.splitlines() if RAW.search(line)]


@pytest.mark.parametrize("page", ta.PAGES)
def test_no_identifier_in_a_sentence_on_any_page(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = ta._open(RUNS, page, monkeypatch)
    assert not at.exception
    assert not _raw(at), _raw(at)


def test_no_identifier_in_any_breakeven_view(monkeypatch: pytest.MonkeyPatch) -> None:
    at = ta._open(RUNS, "breakeven", monkeypatch)
    seen = 0
    for fit in at.selectbox(key="be_fit").options:
        at.selectbox(key="be_fit").set_value(fit).run()
        entry = next(s for s in at.selectbox if s.key and "entry" in s.key)
        for e in entry.options:
            entry.set_value(e).run()
            bases = next((r.options for r in at.radio if r.key == "be_basis"), [None])
            for basis in bases:
                if basis is not None:
                    at.radio(key="be_basis").set_value(basis).run()
                assert not at.exception
                assert not _raw(at), (fit, e, basis, _raw(at))
                seen += 1
    assert seen >= 3  # both example fits, their entries and bases
