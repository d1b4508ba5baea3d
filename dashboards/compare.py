"""Pairing outputs and putting BF16 and a low precision side by side: pure functions over finished tables.

What a page says in words comes from here, so it is tested without Streamlit:

* :func:`pair_runs` -- for each model, the newest complete BF16 run (learner ``bf16``) and the newest
  complete low-precision run (learner ``mxfp8`` first, else another SPEC id) of the same kind;
* :func:`step_phase_table` -- per step, seconds per phase (generate, logprob, update, sync, other) from a
  run's ``metrics.parquet`` (or, when that lacks phase columns, from its range log);
* :func:`phase_change_words` -- "mxfp8 vs bf16: update -12 %, generate -24 %, step +5 %", the relative change of
  the median per-phase time against the baseline.

"other" is step wall time not inside a named phase (host work between phases, logging, checkpointing);
it is clipped at zero because phases measured on one clock cannot exceed the step measured around them by
more than timer noise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dashboards.data import OutputEntry

BASELINE = "bf16"
PHASES: tuple[str, ...] = ("generate", "logprob", "update", "sync")
STEP_PHASES: tuple[str, ...] = (*PHASES, "other")
# Accepted column spellings for a phase's seconds in metrics.parquet, most specific first.
_PHASE_COLUMN_PATTERNS: tuple[str, ...] = ("{p}_s", "{p}_seconds", "seconds_{p}", "time_{p}_s")
_STEP_COLUMNS: tuple[str, ...] = ("step_s", "step_seconds", "seconds", "wall_s")
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


def _phase_column(columns: Sequence[str], phase: str) -> str | None:
    for pattern in _PHASE_COLUMN_PATTERNS:
        name = pattern.format(p=phase)
        if name in columns:
            return name
    return None


def step_phase_table(metrics: pd.DataFrame | None, ranges: pd.DataFrame | None = None) -> pd.DataFrame:
    """Long table ``step, phase, seconds`` with phases from :data:`STEP_PHASES`.

    Uses the per-phase seconds in ``metrics`` when present; otherwise the range log (``step`` ranges and
    their direct children named after a phase). Raises ValueError when neither has per-phase times.
    """
    if metrics is not None and "step" in metrics.columns:
        cols = {p: _phase_column(list(metrics.columns), p) for p in PHASES}
        if any(cols.values()):
            wide = pd.DataFrame({"step": metrics["step"].astype("int64")})
            for phase, col in cols.items():
                wide[phase] = pd.to_numeric(metrics[col], errors="coerce") if col else 0.0
            step_col = next((c for c in _STEP_COLUMNS if c in metrics.columns), None)
            return _with_other(wide, metrics[step_col] if step_col else None)
    if ranges is not None and len(ranges):
        return _phase_table_from_ranges(ranges)
    raise ValueError("no per-phase times: metrics.parquet has no <phase>_s columns and there is no range log")


def _with_other(wide: pd.DataFrame, step_seconds: pd.Series | None) -> pd.DataFrame:
    wide = wide.fillna({p: 0.0 for p in PHASES})
    phase_sum = wide[list(PHASES)].sum(axis=1)
    if step_seconds is not None:
        wide["other"] = (pd.to_numeric(step_seconds, errors="coerce").to_numpy() - phase_sum).clip(lower=0)
    else:
        wide["other"] = 0.0
    long = wide.melt(id_vars="step", value_vars=list(STEP_PHASES), var_name="phase", value_name="seconds")
    return long.sort_values(["step", "phase"], key=_phase_order, ignore_index=True)


def _phase_order(col: pd.Series) -> pd.Series:
    if col.name == "phase":
        return col.map({p: i for i, p in enumerate(STEP_PHASES)}).fillna(len(STEP_PHASES))
    return col


def _phase_table_from_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    steps = ranges[ranges["name"] == "step"]
    if steps.empty:
        raise ValueError("the range log has no 'step' ranges")
    step_no = steps["attrs"].map(lambda a: json.loads(a).get("step") if isinstance(a, str) and a else None)
    step_no = step_no.where(step_no.notna(), pd.Series(range(len(steps)), index=steps.index))
    step_of = dict(zip(steps["range_id"], step_no.astype("int64"), strict=True))
    children = ranges[ranges["parent_id"].isin(step_of) & ranges["name"].isin(PHASES)]
    wide = pd.DataFrame({"step": sorted(set(step_of.values()))})
    if not children.empty:
        sums = (
            children.assign(step=children["parent_id"].map(step_of), seconds=children["dur_ns"] / 1e9)
            .pivot_table(index="step", columns="name", values="seconds", aggfunc="sum")
            .reindex(columns=list(PHASES))
        )
        wide = wide.merge(sums, left_on="step", right_index=True, how="left")
    for phase in PHASES:
        if phase not in wide:
            wide[phase] = 0.0
    step_total = steps.assign(step=steps["range_id"].map(step_of)).groupby("step")["dur_ns"].sum() / 1e9
    return _with_other(wide, wide["step"].map(step_total))


_STEP_RANGE = r"^(?:ProfilerStep#(\d+)|step)$"


def step_phase_table_from_trace(ranges: pd.DataFrame) -> pd.DataFrame:
    """``step, phase, seconds`` from an ingested trace's ``ranges.parquet`` (``tracing.schema.RANGE_COLUMNS``).

    Steps are ``ProfilerStep#N`` (torch.profiler), mxperf ``step`` ranges or ranges whose canonical phase is
    ``step``; a phase's time in a step is the union of that step's ranges mapped to the phase (the phase map of
    ``tracing``: verl ``update_actor``, NeMo RL ``policy_training``, ... -> ``update``), on the step's process,
    so nested ranges of one phase count once. Raises ValueError when the trace has no step ranges.
    """
    from tracing.metrics import measure

    names = ranges["name"].astype(str)
    found = names.str.extract(_STEP_RANGE)
    is_step = names.str.match(_STEP_RANGE) | (
        ranges.get("phase", pd.Series("", index=ranges.index)) == "step"
    )
    steps = ranges[is_step].assign(step_no=pd.to_numeric(found[0][is_step], errors="coerce"))
    if steps.empty:
        raise ValueError(
            "the trace has no step ranges (ProfilerStep#N, 'step'); per-step phase times need them"
        )
    steps = steps.sort_values("start_ns")
    steps["step_no"] = (
        steps["step_no"].fillna(pd.Series(range(len(steps)), index=steps.index)).astype("int64")
    )
    phased = ranges[ranges["phase"].isin(PHASES)] if "phase" in ranges else ranges.iloc[:0]
    rows = []
    for st in steps.itertuples():
        inside = phased[
            (phased["pid"] == st.pid) & (phased["start_ns"] >= st.start_ns) & (phased["end_ns"] <= st.end_ns)
        ]
        wide = {"step": int(st.step_no)}
        for phase in PHASES:
            sel = inside[inside["phase"] == phase]
            wide[phase] = (
                measure(sel["start_ns"].to_numpy(), sel["end_ns"].to_numpy()) / 1e9 if len(sel) else 0.0
            )
        wide["_wall"] = (st.end_ns - st.start_ns) / 1e9
        rows.append(wide)
    wide = pd.DataFrame(rows).groupby("step", as_index=False).sum()
    return _with_other(wide.drop(columns="_wall"), wide["_wall"])


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
