"""Pairing outputs and putting BF16 and a low precision side by side: pure functions over finished tables.

What a page says in words comes from here, so it is tested without Streamlit:

* :func:`pair_runs` -- for each model, the newest complete BF16 run (learner ``bf16``) and the newest
  complete low-precision run (learner ``mxfp8`` first, else another precision id) of the same kind;
* :func:`phase_medians` -- median seconds per phase over the per-step tables that ``tracing.analysis.steps``
  builds (a run's metrics, an ingest's ``steps.parquet``);
* :func:`phase_change_words` -- "mxfp8 vs bf16: update -12 %, generate -24 %, step +5 %", the relative change of
  the median per-phase time against the baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dashboards.data import OutputEntry
from tracing.analysis.steps import STEP_PHASES

BASELINE = "bf16"
_PREFERRED_LOW: tuple[str, ...] = ("mxfp8", "mxfp8-te212", "mxfp8-floor", "fp8-block128", "fp8-rowwise")


@dataclass(frozen=True)
class RunPair:
    """A baseline output and a low-precision output of the same model and kind."""

    model: str
    baseline: OutputEntry
    other: OutputEntry

    @property
    def other_precision(self) -> str:
        return _learner_precision(self.other) or "?"


def _learner_precision(entry: OutputEntry) -> str | None:
    if entry.learner:
        return entry.learner
    return entry.precisions[0] if len(entry.precisions) == 1 else None


def _low_rank(precision: str | None) -> int:
    return _PREFERRED_LOW.index(precision) if precision in _PREFERRED_LOW else len(_PREFERRED_LOW)


def pair_runs(entries: Iterable[OutputEntry], kind: str = "run") -> list[RunPair]:
    """Per model, pair the newest BF16 output with the newest low-precision one (MXFP8 preferred).

    A run's precision is its learner's; a run whose sampler matches its learner is preferred (end-to-end
    BF16 vs end-to-end MXFP8). Models without both sides are left out.
    """
    by_model: dict[str, list[OutputEntry]] = {}
    for e in entries:
        if e.usable and e.kind == kind and e.model and _learner_precision(e):
            by_model.setdefault(str(e.model), []).append(e)
    pairs = []
    for model, group in sorted(by_model.items()):

        def matched(e: OutputEntry) -> int:
            return 0 if (e.sampler is None or e.sampler == e.learner) else 1

        base = [e for e in group if _learner_precision(e) == BASELINE]
        low = [e for e in group if _learner_precision(e) != BASELINE]
        if not base or not low:
            continue
        newest = lambda e: e.created or ""  # noqa: E731
        base.sort(key=newest, reverse=True)
        base.sort(key=matched)
        low.sort(key=newest, reverse=True)
        low.sort(key=lambda e: (_low_rank(_learner_precision(e)), matched(e)))
        pairs.append(RunPair(model=model, baseline=base[0], other=low[0]))
    return pairs


def phase_medians(table: pd.DataFrame, skip_first: bool = True) -> pd.Series:
    """Median seconds per phase (plus ``step`` = their sum) over steps.

    The first step carries one-time costs (allocation, tokenizer and kernel warm-up), so it is skipped when
    there are at least three steps.
    """
    steps = sorted(table["step"].unique())
    if skip_first and len(steps) >= 3:
        table = table[table["step"] != steps[0]]
    med = table.groupby("phase")["seconds"].median().reindex(list(STEP_PHASES)).fillna(0.0)
    med["step"] = table.groupby("step")["seconds"].sum().median()
    return med


def relative_change(base: pd.Series, other: pd.Series) -> pd.Series:
    """(other - base) / base per key; NaN where the baseline is zero (no meaningful ratio)."""
    base = base.astype("float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        change = (other.astype("float64") - base) / base.where(base > 0)
    return change


def phase_change_words(
    base: pd.Series,
    other: pd.Series,
    label: str,
    base_label: str | None = None,
    *,
    min_share: float = 0.01,
    keys: Sequence[str] | None = None,
) -> str:
    """'mxfp8 vs bf16: update -12 %, generate -24 %, step +5 %': relative change of each phase's median.

    Phases under ``min_share`` of the baseline step are left out (a +300 % on 1 ms says nothing about the
    step); ``step`` always comes last."""
    change = relative_change(base, other)
    step_base = float(base.get("step", np.nan))
    parts = []
    for key in keys or [*STEP_PHASES, "step"]:
        if key not in change.index:
            continue
        if key != "step" and not (step_base > 0 and base[key] >= min_share * step_base):
            continue
        value = change[key]
        parts.append(f"{key} {_pct(value)}" if np.isfinite(value) else f"{key} n/a")
    head = f"{label} vs {base_label}" if base_label else label
    return f"{head}: " + ", ".join(parts) if parts else f"{head}: no comparable phases"


def _pct(x: float) -> str:
    return f"{x * 100:+.0f} %" if abs(x) >= 0.005 else "±0 %"


def change_table(base: pd.Series, other: pd.Series, base_label: str, other_label: str) -> pd.DataFrame:
    """Per phase: both medians in seconds and the relative change, for the table under the chart."""
    keys = [k for k in [*STEP_PHASES, "step"] if k in base.index]
    change = relative_change(base, other)
    return pd.DataFrame(
        {
            "phase": keys,
            f"{base_label} median s": [float(base[k]) for k in keys],
            f"{other_label} median s": [float(other.get(k, np.nan)) for k in keys],
            "change": [_pct(change[k]) if np.isfinite(change[k]) else "n/a" for k in keys],
        }
    )
