"""Pairing outputs and putting two of them side by side: pure functions over finished tables.

What a page says in words comes from here, so it is tested without Streamlit:

* :func:`pair_runs` -- for each model, the newest complete BF16 output (learner ``bf16``) and the newest
  complete low-precision one (learner ``mxfp8`` first, else another precision id) of the same kind;
* :func:`with_sync_checks` -- a run's ``sync`` phase split into the weight transfer and the weight-sync checks
  (``sync_check_s``), which a run times inside its sync;
* :func:`sync_check_cost` -- the sync checks' cost per step, the one number Step time and Weight sync show;
* :func:`phase_stats` -- median, quartiles and the number of steps per phase, the warm-up step left out;
* :func:`step_totals` -- each step's seconds: the logged step time where a table has it (phase ``step``), else
  its phases summed, less the generation an async trainer ran beside the step (:func:`overlapped`);
* :func:`phase_change_words` / :func:`change_table` -- the relative change of each phase's median against
  the baseline, with the spread (IQR) and step counts behind it, flagged when the quartile ranges overlap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dashboards.data import OutputEntry
from tracing.analysis.steps import PHASES, STEP_PHASES
from tracing.ingest.metric_logs import SAMPLER_WAIT

BASELINE = "bf16"
SYNC_CHECKS = "sync checks"
# Phases as the dashboard shows them: the run's sync split into the transfer and its checks; an async
# trainer's wait for its separate sampler (generate_wait, metric-log ingests) after the generation.
SHOWN_PHASES: tuple[str, ...] = (PHASES[0], SAMPLER_WAIT, *PHASES[1:], SYNC_CHECKS, "other")
OVERLAPPED = "generate"  # with a generate_wait phase: the generation that ran beside the step, not in it
OVERLAPPED_LABEL = "generate (overlapped, not in step)"
LOGGED_STEP = "step"  # a phase row holding the step's logged whole-step seconds, where a table has one
_PREFERRED_LOW: tuple[str, ...] = ("mxfp8", "mxfp8-te212", "mxfp8-floor", "fp8-block128", "fp8-rowwise")
WITHIN_SPREAD = "within spread"


@dataclass(frozen=True)
class RunPair:
    """A baseline output and a compared output (any two, or an automatic BF16 / low-precision pair)."""

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
    BF16 vs end-to-end MXFP8). Models without both sides are left out. Callers pass only outputs whose
    tables read (a complete manifest over a corrupt table is not a candidate)."""
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


def with_sync_checks(table: pd.DataFrame, metrics: pd.DataFrame | None) -> pd.DataFrame:
    """Split each step's ``sync`` into ``sync`` (transfer) and ``sync checks`` from ``metrics.sync_check_s``.

    The checks run inside the timed sync, so without this the sync phase silently includes them. The total
    per step is unchanged. Without a ``sync_check_s`` column the table comes back as it is."""
    if metrics is None or "sync_check_s" not in metrics or "step" not in metrics:
        return table
    checks = pd.to_numeric(metrics["sync_check_s"], errors="coerce").fillna(0.0)
    by_step = pd.Series(checks.to_numpy(), index=metrics["step"].astype("int64"))
    sync = table[table["phase"] == "sync"]
    check_s = np.minimum(sync["step"].map(by_step).fillna(0.0).to_numpy(), sync["seconds"].to_numpy())
    out = table.copy()
    out.loc[sync.index, "seconds"] = sync["seconds"].to_numpy() - check_s
    extra = pd.DataFrame({"step": sync["step"].to_numpy(), "phase": SYNC_CHECKS, "seconds": check_s})
    out = pd.concat([out, extra], ignore_index=True)
    order = {p: i for i, p in enumerate(SHOWN_PHASES)}
    return out.sort_values(
        ["step", "phase"], key=lambda c: c.map(order) if c.name == "phase" else c
    ).reset_index(drop=True)


def warmup_step(table: pd.DataFrame) -> int | None:
    """The first step, when there are at least three (it carries one-time costs: allocation, warm-up)."""
    steps = sorted(table["step"].unique())
    return int(steps[0]) if len(steps) >= 3 else None


def phase_stats(table: pd.DataFrame, skip_first: bool = True) -> pd.DataFrame:
    """Per phase (plus ``step``: :func:`step_totals`, else their sum): ``median_s``, ``q1_s``, ``q3_s``, ``n_steps``.

    The warm-up step (:func:`warmup_step`) is left out when ``skip_first``."""
    first = warmup_step(table) if skip_first else None
    if first is not None:
        table = table[table["step"] != first]
    wide = _wide(table)
    wide["step"] = step_totals(table).reindex(wide.index)
    return pd.DataFrame(
        {
            "median_s": wide.median(),
            "q1_s": wide.quantile(0.25),
            "q3_s": wide.quantile(0.75),
            "n_steps": len(wide),
        }
    )


def _wide(table: pd.DataFrame) -> pd.DataFrame:
    """Step x shown phase seconds (0 where a step lacks a phase); a generation no step logged is left out."""
    phases = [p for p in SHOWN_PHASES if p in set(table["phase"])] or list(STEP_PHASES)
    if overlapped(table) and table.loc[table["phase"] == OVERLAPPED, "seconds"].isna().all():
        phases = [p for p in phases if p != OVERLAPPED]  # NeMo RL async: no generation time logged
    wide = table.pivot_table(index="step", columns="phase", values="seconds", aggfunc="sum")
    return wide.reindex(columns=phases).fillna(0.0)


def overlapped(table: pd.DataFrame) -> bool:
    """Whether ``table`` (long ``step, phase, seconds``, or a :func:`phase_stats` table) is an async trainer's:
    it has the trainer's wait for its sampler (``generate_wait``), so its ``generate`` ran beside the step."""
    return SAMPLER_WAIT in (set(table["phase"]) if "phase" in table.columns else set(table.index))


def step_totals(table: pd.DataFrame) -> pd.Series:
    """Seconds per step (indexed by step) of a long ``step, phase, seconds`` table, by one rule: the logged
    whole-step time where the table has it (phase ``step``); otherwise the sum of its phases, leaving out the
    generation that ran beside the step (``generate``) when a ``generate_wait`` phase exists. A metric-log
    ingest's ``other`` is its logged step time less the phases in the step, so there the sum is that time."""
    wide = _wide(table)
    total = wide.drop(columns=[OVERLAPPED] if overlapped(table) else [], errors="ignore").sum(axis=1)
    logged = table[table["phase"] == LOGGED_STEP]
    if len(logged):
        by_step = pd.to_numeric(logged.set_index("step")["seconds"], errors="coerce").dropna()
        total = by_step.combine_first(total)
    return total.rename("seconds")


def step_total_words(table: pd.DataFrame) -> str | None:
    """How :func:`step_totals` got ``table``'s step, for a caption; None for a plain (colocated) table."""
    if (table["phase"] == LOGGED_STEP).any():
        return "step = the logged whole-step time."
    if not overlapped(table):
        return None
    other = table.loc[table["phase"] == "other", "seconds"]
    head = (
        "step = the logged step time (the trainer's wait for the sampler, generate_wait, plus the phases in "
        "the step; 'other' is what the log's step time leaves)"
        if other.notna().any()
        else "step = the phases in the step plus the wait for the sampler (generate_wait; the log has no step time)"
    )
    gen = table.loc[table["phase"] == OVERLAPPED, "seconds"]
    tail = (
        "; generate ran beside the step (overlapped with the learner) and is drawn apart, not added."
        if gen.notna().any()
        else "; the log has no generation time."
    )
    return head + tail


SYNC_CHECK_RULE = (
    "per step, the sync-check seconds inside that step's sync (metrics.sync_check_s); the warm-up step left out "
    "when there are three or more (one-time costs), as every phase on Step time; the initial sync before step 0 "
    "is in no step's time and is not counted"
)


def sync_check_cost(table: pd.DataFrame) -> pd.Series | None:
    """The weight-sync checks' cost per step (``median_s``, ``q1_s``, ``q3_s``, ``n_steps``) of a run's step
    table (:func:`with_sync_checks` applied): the ``sync checks`` row of :func:`phase_stats`, so Step time and
    Weight sync show one number (rule: :data:`SYNC_CHECK_RULE`). None when the run does not time its checks."""
    stats = phase_stats(table)
    return stats.loc[SYNC_CHECKS] if SYNC_CHECKS in stats.index else None


def phase_medians(table: pd.DataFrame, skip_first: bool = True) -> pd.Series:
    """Median seconds per phase (plus ``step``) over steps; see :func:`phase_stats`."""
    return phase_stats(table, skip_first)["median_s"]


def relative_change(base: pd.Series, other: pd.Series) -> pd.Series:
    """(other - base) / base per key; NaN where the baseline is zero (no meaningful ratio)."""
    base = base.astype("float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        change = (other.reindex(base.index).astype("float64") - base) / base.where(base > 0)
    return change


def _overlap(base: pd.DataFrame, other: pd.DataFrame, key: str) -> bool:
    if key not in base.index or key not in other.index:
        return False
    b, o = base.loc[key], other.loc[key]
    return bool(b["q1_s"] <= o["q3_s"] and o["q1_s"] <= b["q3_s"])


def phase_change_words(
    base: pd.DataFrame,
    other: pd.DataFrame,
    label: str,
    base_label: str | None = None,
    *,
    min_share: float = 0.01,
    keys: Sequence[str] | None = None,
) -> str:
    """'mxfp8 vs bf16 (medians of 4 vs 4 steps): update -12 %, generate -24 % (within spread), step +5 %'.

    ``base`` / ``other`` are :func:`phase_stats` tables. Phases under ``min_share`` of the baseline step are
    left out (a +300 % on 1 ms says nothing about the step); ``step`` always comes last. A change whose two
    quartile ranges overlap is marked "within spread": the steps' own variation covers it."""
    change = relative_change(base["median_s"], other["median_s"])
    step_base = float(base["median_s"].get("step", np.nan))
    parts = []
    for key in keys or [*SHOWN_PHASES, "step"]:
        if key not in change.index:
            continue
        if key != "step" and not (step_base > 0 and base.loc[key, "median_s"] >= min_share * step_base):
            continue
        value = change[key]
        if not np.isfinite(value):
            parts.append(f"{key} n/a")
            continue
        parts.append(f"{key} {_pct(value)}" + (f" ({WITHIN_SPREAD})" if _overlap(base, other, key) else ""))
    head = f"{label} vs {base_label}" if base_label else label
    n_b, n_o = _steps(base), _steps(other)
    head += f" (medians of {n_o} vs {n_b} steps)"
    return f"{head}: " + ", ".join(parts) if parts else f"{head}: no comparable phases"


def _steps(stats: pd.DataFrame) -> int:
    return int(stats["n_steps"].iloc[0]) if len(stats) else 0


def _pct(x: float) -> str:
    return f"{x * 100:+.0f} %" if abs(x) >= 0.005 else "±0 %"


def _cell(stats: pd.DataFrame, key: str) -> str:
    if key not in stats.index:
        return "n/a"
    r = stats.loc[key]
    return f"{r['median_s']:.4g} [{r['q1_s']:.3g} – {r['q3_s']:.3g}]"


def _change_keys(base: pd.DataFrame, other: pd.DataFrame) -> list[str]:
    def seen(k: str) -> bool:  # a phase neither output spent time in is left out (unmapped traces: all 0)
        return any(k in s.index and s.loc[k, "q3_s"] > 0 for s in (base, other))

    return [
        k
        for k in [*SHOWN_PHASES, "step"]
        if (k in base.index or k in other.index) and (seen(k) or k == "step")
    ]


def change_numbers(
    base: pd.DataFrame, other: pd.DataFrame, base_label: str, other_label: str
) -> pd.DataFrame:
    """The numbers behind :func:`change_table`, one row per phase and output (what a download holds):
    ``phase, output, role, median_s, q1_s, q3_s, n_steps``, then ``change`` (other vs baseline, a fraction;
    NaN without a baseline time) and ``within_spread`` on both rows of a phase."""
    keys = _change_keys(base, other)
    change = relative_change(base["median_s"].reindex(keys), other["median_s"].reindex(keys))
    rows = []
    for k in keys:
        for role, label, stats in (("baseline", base_label, base), ("compared", other_label, other)):
            r = stats.loc[k] if k in stats.index else None
            rows.append(
                {
                    "phase": k,
                    "output": label,
                    "role": role,
                    "median_s": float(r["median_s"]) if r is not None else np.nan,
                    "q1_s": float(r["q1_s"]) if r is not None else np.nan,
                    "q3_s": float(r["q3_s"]) if r is not None else np.nan,
                    "n_steps": _steps(stats),
                    "change": float(change[k]),
                    "within_spread": _overlap(base, other, k),
                }
            )
    return pd.DataFrame(rows)


def change_table(base: pd.DataFrame, other: pd.DataFrame, base_label: str, other_label: str) -> pd.DataFrame:
    """Per phase: both medians with their quartiles (seconds, ``median [q1 – q3]``), the relative change and
    whether the quartile ranges overlap; phases neither output spent time in are left out. ``base`` /
    ``other`` are :func:`phase_stats` tables. Text for the page; :func:`change_numbers` for downloads."""
    keys = _change_keys(base, other)
    change = relative_change(base["median_s"].reindex(keys), other["median_s"].reindex(keys))
    beside = any(overlapped(s) for s in (base, other))
    return pd.DataFrame(
        {
            "phase": [OVERLAPPED_LABEL if beside and k == OVERLAPPED else k for k in keys],
            f"{base_label} s, median [IQR] (n={_steps(base)})": [_cell(base, k) for k in keys],
            f"{other_label} s, median [IQR] (n={_steps(other)})": [_cell(other, k) for k in keys],
            "change": [_pct(change[k]) if np.isfinite(change[k]) else "n/a" for k in keys],
            "spread": [WITHIN_SPREAD if _overlap(base, other, k) else "apart" for k in keys],
        }
    )


def tokens_per_second(metrics: pd.DataFrame | None, skip_first: bool = True) -> dict[str, float] | None:
    """Median learner tokens per second of a run: ``update_tokens / update_s`` and per whole step
    (``update_tokens / step_s``); None when the run does not record its tokens."""
    if metrics is None or not {"update_tokens", "step"} <= set(metrics.columns):
        return None
    m = metrics.sort_values("step")
    if skip_first and len(m) >= 3:
        m = m.iloc[1:]
    tokens = pd.to_numeric(m["update_tokens"], errors="coerce")
    out: dict[str, float] = {"tokens_per_step": float(tokens.median())}
    for col, key in (("update_s", "update_tokens_per_s"), ("step_s", "step_tokens_per_s")):
        if col in m:
            secs = pd.to_numeric(m[col], errors="coerce")
            out[key] = float((tokens / secs.where(secs > 0)).median())
    return out
