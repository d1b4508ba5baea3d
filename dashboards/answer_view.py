"""The answer card (Overview and the top of Breakeven): fits.json's three-line step answer with its marks.

Rendering only; what it says is :func:`dashboards.answer.answers` of the fits.json, verbatim. Kept compact
(no subheader, provenance in the footer) so that it sits above the fold at 1280 x 800."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboards import answer, data, ui
from perfmodel.report import results
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

_BADGE = {answer.EMULATED: "orange", answer.MEASURED: "green", answer.EXTRAPOLATED: "violet"}
CARD_KEY = "answer-card"


def read_fits(fit: data.OutputEntry) -> dict[str, Any]:
    return results.validate_fits(ui.json_file(fit, store.FITS), f"{fit.rel}/{store.FITS}")


def answer_card(fit: data.OutputEntry, key: str = CARD_KEY) -> None:
    """The answer of ``fit`` in a bordered card (CSS class ``st-key-<key>``); a broken fits.json shows its
    reason on the card."""
    with st.container(border=True, key=key):
        try:
            _body(fit)
        except (MxperfError, ValueError, KeyError) as exc:
            st.warning(f"The answer: {exc}", icon=":material/warning:")


def _body(fit: data.OutputEntry) -> None:
    doc = read_fits(fit)
    items = answer.answers(doc)
    prov = ui.provenance(fit)
    if not items:
        st.info(
            f"`{fit.rel}/{store.FITS}` holds no answer lines (made by an older `mxperf fit`): run "
            "`mxperf fit` again for the whole-step answer; the per-phase verdicts are on Breakeven."
        )
        return
    for item in items:
        badges = " ".join(f":{_BADGE[m.label]}-badge[{m.label}]" for m in item.marks)
        st.markdown(f"**The answer** · **{answer.markdown_text(item.title)}** {badges}")
        for line in item.lines:
            st.markdown(answer.markdown_text(line))
        why = " · ".join(f"{m.label}: {m.why}" for m in item.marks if m.label != answer.MEASURED)
        st.caption(
            f"From `{fit.rel}/{item.source}` (the lines `mxperf fit` prints first); ran on **{prov.badge}**."
            + (f" {answer.markdown_text(why)}" if why else "")
            + (
                " This fits.json predates the whole-step answer: one line per fitted phase; run "
                "`mxperf fit` again with the run folders for the gain per step."
                if item.per_phase
                else ""
            )
        )
