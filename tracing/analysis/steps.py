"""Seconds per step and phase: from a trace's step / phase ranges, or from a run's per-step metrics.

A step is a ``ProfilerStep#N`` range (torch.profiler), an mxperf ``step`` range, or a range whose canonical
phase is ``step``. A phase's time in a step is the union of that step's ranges mapped to the phase (the phase
map: verl ``update_actor``, NeMo RL ``policy_training``, ... -> ``update``) on the step's process, so nested
ranges of one phase count once. ``other`` is step wall time outside the named phases (host work between
phases, logging), clipped at zero. Steps are per process: a 2-rank trace set has two rows per step and phase,
never one summed row (what a job waits for is the slowest rank).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tracing.analysis.metrics import measure
from tracing.outputs import schema

STEP_PHASES: tuple[str, ...] = ("generate", "logprob", "update", "sync", "other")
PHASES: tuple[str, ...] = STEP_PHASES[:-1]
# Accepted column spellings for a phase's seconds in a run's metrics.parquet, most specific first.
_PHASE_COLUMN_PATTERNS: tuple[str, ...] = ("{p}_s", "{p}_seconds", "seconds_{p}", "time_{p}_s")
_STEP_COLUMNS: tuple[str, ...] = ("step_s", "step_seconds", "seconds", "wall_s")
_STEP_RANGE = r"^(?:ProfilerStep#(\d+)|step)$"
_STEP_RE = re.compile(_STEP_RANGE)


def _phase_column(columns: Sequence[str], phase: str) -> str | None:
    for pattern in _PHASE_COLUMN_PATTERNS:
        name = pattern.format(p=phase)
        if name in columns:
            return name
    return None


def _phase_order(col: pd.Series) -> pd.Series:
    if col.name == "phase":
        return col.map({p: i for i, p in enumerate(STEP_PHASES)}).fillna(len(STEP_PHASES))
    return col


def _with_other(
    wide: pd.DataFrame, step_seconds: pd.Series | np.ndarray | None, keys: Sequence[str]
) -> pd.DataFrame:
    wide = wide.fillna({p: 0.0 for p in PHASES})
    phase_sum = wide[list(PHASES)].sum(axis=1)
    if step_seconds is not None:
        total = pd.to_numeric(pd.Series(np.asarray(step_seconds)), errors="coerce").to_numpy()
        wide["other"] = (total - phase_sum.to_numpy()).clip(min=0)
    else:
        wide["other"] = 0.0
    long = wide.melt(id_vars=list(keys), value_vars=list(STEP_PHASES), var_name="phase", value_name="seconds")
    return long.sort_values([*keys, "phase"], key=_phase_order, ignore_index=True)


def step_phase_table(metrics: pd.DataFrame | None, ranges: pd.DataFrame | None = None) -> pd.DataFrame:
    """A run's long table ``step, phase, seconds`` (phases from :data:`STEP_PHASES`).

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
            return _with_other(wide, metrics[step_col] if step_col else None, ["step"])
    if ranges is not None and len(ranges):
        return _phase_table_from_range_log(ranges)
    raise ValueError("no per-phase times: metrics.parquet has no <phase>_s columns and there is no range log")


def _phase_table_from_range_log(ranges: pd.DataFrame) -> pd.DataFrame:
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
    return _with_other(wide, wide["step"].map(step_total), ["step"])


def _is_step(ranges: pd.DataFrame) -> np.ndarray:
    """Step ranges: a step-like name (matched once per distinct name: an nsys export has a range per op, no
    str object per row) or the phase ``step``."""
    codes, uniques = pd.factorize(ranges["name"].astype(str))
    matched = np.array([is_step_name(n) for n in uniques.tolist()] + [False])
    step_phase = (ranges["phase"] == "step").to_numpy(bool) if "phase" in ranges else False
    return matched[codes] | step_phase


def is_step_name(name: object) -> bool:
    """A step range name: ``step`` or ``ProfilerStep#N``."""
    return isinstance(name, str) and _STEP_RE.match(name) is not None


def step_rows(ranges: pd.DataFrame) -> np.ndarray:
    """The rows :func:`trace_step_phases` reads: step ranges and ranges of a step phase; the others cannot
    change its table (pass only these and an NVTX-heavy range table is not copied whole)."""
    if ranges.empty:
        return np.zeros(0, bool)
    return _is_step(ranges) | ranges["phase"].isin(PHASES).to_numpy(bool)


def trace_step_phases(ranges: pd.DataFrame) -> pd.DataFrame:
    """``STEP_COLUMNS`` rows from an ingested trace's range table (``schema.RANGE_COLUMNS``).

    One row per (trace, rank, process, step, phase); empty when the trace has no step ranges.
    """
    if ranges.empty:
        return schema.empty_frame(schema.STEP_COLUMNS)
    names = ranges["name"].astype(str)
    phase_col = ranges["phase"] if "phase" in ranges else pd.Series("", index=ranges.index)
    is_step = pd.Series(_is_step(ranges), index=ranges.index, dtype=bool)
    steps = ranges[is_step]
    if steps.empty:
        return schema.empty_frame(schema.STEP_COLUMNS)
    found = names[is_step].str.extract(_STEP_RANGE)[0]
    steps = steps.assign(step_no=pd.to_numeric(found, errors="coerce")).sort_values("start_ns")
    keys = ["trace", "rank", "pid"]
    steps = steps.assign(**{k: steps.get(k) for k in ("trace", "rank")})
    # Unnumbered steps count up per process, in time order.
    fallback = steps.groupby(["trace", "pid"], dropna=False).cumcount()
    steps["step_no"] = steps["step_no"].fillna(fallback).astype("int64")
    phased = ranges[phase_col.isin(PHASES)]
    # numpy columns once (pandas masks per step cost ~1 ms each); every phased row has a phase (isin)
    p_pid, p_start, p_end = (phased[c].to_numpy() for c in ("pid", "start_ns", "end_ns"))
    p_phase = phased["phase"].to_numpy(object)
    p_trace = phased["trace"].to_numpy(object) if "trace" in phased else None
    rows = []
    for st in steps[[*keys, "start_ns", "end_ns", "step_no"]].itertuples(index=False):
        inside = (p_pid == st.pid) & (p_start >= st.start_ns) & (p_end <= st.end_ns)
        if p_trace is not None:
            inside &= p_trace == st.trace
        wide: dict[str, object] = {
            "trace": st.trace,
            "rank": st.rank,
            "pid": int(st.pid),
            "step": int(st.step_no),
        }
        for phase in PHASES:
            sel = inside & (p_phase == phase)
            wide[phase] = measure(p_start[sel], p_end[sel]) / 1e9 if sel.any() else 0.0
        wide["_wall"] = (st.end_ns - st.start_ns) / 1e9
        rows.append(wide)
    long = _long_table(rows)
    return schema.conform(long, schema.STEP_COLUMNS, "steps")


def _long_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """The long table of the per-step rows: rows of one (trace, rank, process, step) summed (a Kineto trace
    has each ``ProfilerStep#N`` twice, on the CPU and the GPU timeline), keys ascending (a missing trace or
    rank last), then one row per phase in ``STEP_PHASES`` order, ``other`` = max(step wall - phase sum, 0).

    What pandas' groupby-sum, melt and keyed sort gave, float for float (~20 ms less on a small trace): sums
    in row order with the same compensated (Kahan) addition as its ``group_sum``, phases summed left to right."""
    fields = (*PHASES, "_wall")
    groups: dict[tuple[object, ...], tuple[list[float], list[float]]] = {}
    for r in rows:
        key = (r["trace"], r["rank"], r["pid"], r["step"])
        acc = groups.get(key)
        if acc is None:
            groups[key] = ([0.0 + float(r[f]) for f in fields], [0.0] * len(fields))  # type: ignore[arg-type]
            continue
        total, comp = acc
        for i, f in enumerate(fields):
            y = float(r[f]) - comp[i]  # type: ignore[arg-type]
            t = total[i] + y
            comp[i] = t - total[i] - y
            if comp[i] != comp[i]:  # an infinite value: no compensation (pandas GH#53606)
                comp[i] = 0.0
            total[i] = t

    def order(key: tuple[object, ...]) -> tuple[object, ...]:
        trace, rank = key[0], key[1]
        no_rank = rank is None or rank is pd.NA
        return (trace is None, trace or "", no_rank, 0 if no_rank else rank, key[2], key[3])

    keys = sorted(groups, key=order)
    sums = np.array([groups[k][0] for k in keys], np.float64).reshape(len(keys), len(fields))
    phase_sum = sums[:, 0]
    for i in range(1, len(PHASES)):
        phase_sum = phase_sum + sums[:, i]
    other = (sums[:, len(PHASES)] - phase_sum).clip(min=0)
    seconds = np.column_stack([sums[:, : len(PHASES)], other]).reshape(-1)
    m = len(STEP_PHASES)
    return pd.DataFrame(
        {
            "trace": np.repeat(np.array([k[0] for k in keys], object), m),
            "rank": np.repeat(np.array([k[1] for k in keys], object), m),
            "pid": np.repeat(np.array([k[2] for k in keys], np.int64), m),
            "step": np.repeat(np.array([k[3] for k in keys], np.int64), m),
            "phase": np.tile(np.array(STEP_PHASES, object), len(keys)),
            "seconds": seconds,
        }
    )


def one_process(steps: pd.DataFrame) -> pd.DataFrame:
    """``step, phase, seconds`` for the step time a job waits for: per step, the slowest process's row.

    The slowest process of a step is the one with the longest step (sum over its phases); its phase split
    is kept whole, so the phases still add up to that step.
    """
    if steps.empty:
        return pd.DataFrame({"step": [], "phase": [], "seconds": []})
    keys = [k for k in ("trace", "rank", "pid") if k in steps]
    totals = steps.groupby([*keys, "step"], dropna=False, as_index=False)["seconds"].sum()
    slowest = totals.sort_values("seconds", ascending=False).drop_duplicates("step")
    picked = steps.merge(slowest[[*keys, "step"]], on=[*keys, "step"])
    return picked[["step", "phase", "seconds"]].sort_values(
        ["step", "phase"], key=_phase_order, ignore_index=True
    )
