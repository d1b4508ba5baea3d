"""The answer first: the three lines ``mxperf fit`` prints first (fits.json ``step_model[].answer``, the same
lines as its top-level ``answer``, stdout and report.md), with the marks a reader needs before trusting them.

Pure functions over a validated fits.json (no Streamlit): the text is fits.json's, never rebuilt here, so
the dashboard and the CLI cannot say two things. The marks come from the same entry:

* ``emulated`` -- a precision's GEMMs were emulated (``emulated``: precision -> how it is known), else
  ``measured`` (timed with the precisions' own GEMMs);
* ``extrapolated`` -- the gain at the user's settings, the breakeven, or a predicted best size lies outside
  the measured micro-batch sizes (``settings[0].extrapolated``, ``breakeven.extrapolated``,
  ``recommendation.per_precision.<p>.extrapolated_best``).

An older fits.json (no ``step_model``) has only one line per comparison (``models[].answer``): those are
shown, said to be per-phase, with the same marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EMULATED = "emulated"
MEASURED = "measured"
EXTRAPOLATED = "extrapolated"


@dataclass(frozen=True)
class Mark:
    label: str  # EMULATED | MEASURED | EXTRAPOLATED
    why: str  # what in fits.json says so


@dataclass(frozen=True)
class Answer:
    title: str
    lines: tuple[str, ...]
    marks: tuple[Mark, ...]
    source: str  # the fits.json field the lines are
    per_phase: bool = False  # an older fits.json: one line per comparison, no whole-step answer


def _emulation_mark(emulated: dict[str, Any] | None, precisions: tuple[str, ...]) -> Mark:
    em = {p: w for p, w in (emulated or {}).items() if w}
    if em:
        return Mark(EMULATED, "; ".join(f"{p}: {w}" for p, w in em.items()))
    return Mark(
        MEASURED, f"{' and '.join(precisions)} timed with their own GEMMs (fits.json: emulated is empty)"
    )


def _step_extrapolated(sm: dict[str, Any]) -> list[str]:
    why = []
    settings = sm.get("settings") or []
    if settings and settings[0].get("extrapolated"):
        s = settings[0]
        why.append(f"the gain at n = {s.get('tokens_per_microbatch'):,} is outside the measured sizes")
    be = sm.get("breakeven") or {}
    if be.get("extrapolated"):
        why.append("the breakeven is outside the measured sizes")
    rec = sm.get("recommendation") or {}
    cmp = rec.get("comparison") or {}
    if not settings and cmp.get("extrapolated"):
        why.append("the gain at the recommended size is outside the measured sizes")
    for p, e in (rec.get("per_precision") or {}).items():
        best = (e or {}).get("extrapolated_best")
        if best:
            why.append(
                f"{p} is predicted faster at {best.get('tokens_per_microbatch'):,} tokens, beyond the measured sizes"
            )
    return why


def _entry_extrapolated(m: dict[str, Any]) -> list[str]:
    why = []
    if (m.get("breakeven") or {}).get("extrapolated"):
        why.append(f"{m.get('phase')}: n* is outside the measured sizes")
    rec = (m.get("step") or {}).get("recommendation") or {}
    for p, e in (rec.get("per_precision") or {}).items():
        if (e or {}).get("extrapolated"):
            why.append(f"{m.get('phase')}: the recommended size for {p} is extrapolated")
    return why


def answers(doc: dict[str, Any]) -> list[Answer]:
    """One :class:`Answer` per ``step_model`` entry (its three lines); for an older fits.json without it,
    one per-phase :class:`Answer` holding each comparison's ``answer`` line. Empty when neither exists."""
    out = []
    for i, sm in enumerate(doc.get("step_model") or []):
        lines = tuple(str(x) for x in sm.get("answer") or [])
        if not lines:
            continue
        marks = [_emulation_mark(sm.get("emulated"), (sm.get("baseline", "?"), sm.get("precision", "?")))]
        extra = _step_extrapolated(sm)
        if extra:
            marks.append(Mark(EXTRAPOLATED, "; ".join(extra)))
        out.append(
            Answer(
                title=f"{sm.get('model')}: {sm.get('precision')} vs {sm.get('baseline')} per step",
                lines=lines,
                marks=tuple(marks),
                source=f"fits.json step_model[{i}].answer",
            )
        )
    if out:
        return out
    if doc.get("answer"):  # a top-level answer without step_model entries holding it
        return [Answer("Answer", tuple(str(x) for x in doc["answer"]), (), "fits.json answer")]
    entries = [m for m in doc.get("models") or [] if m.get("answer")]
    if not entries:
        return []
    emulated: dict[str, Any] = {}
    for m in entries:
        emulated.update(m.get("emulated") or {})
    precisions = tuple(
        dict.fromkeys(p for m in entries for p in (m.get("baseline"), m.get("precision")) if p)
    )
    marks = [_emulation_mark(emulated, precisions)]
    extra = [w for m in entries for w in _entry_extrapolated(m)]
    if extra:
        marks.append(Mark(EXTRAPOLATED, "; ".join(extra)))
    return [
        Answer(
            title="Per-phase answers",
            lines=tuple(str(m["answer"]) for m in entries),
            marks=tuple(marks),
            source="fits.json models[].answer",
            per_phase=True,
        )
    ]


_MD = str.maketrans({c: "\\" + c for c in "\\`*_[]<>#~$|{}"})


def markdown_text(line: str) -> str:
    """A line of fits.json as Markdown that shows it verbatim (no emphasis, links, LaTeX or HTML)."""
    return line.translate(_MD)
