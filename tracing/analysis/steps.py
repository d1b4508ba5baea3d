"""Seconds per step and phase: from a trace's step / phase ranges, or from a run's per-step metrics.

A step is a ``ProfilerStep#N`` range, an mxperf ``step`` range, or a range of phase ``step``. A phase's time in
a step is the union of the step's ranges of that phase on its process (nested ranges count once); ``other`` is
the step's wall time outside them, clipped at zero. Steps are per process, never summed over ranks.

A process whose phase ranges hold two phases or more but which has no step range (verl's torch profiler:
one file per profiled step, no ``ProfilerStep#N``) has its steps inferred from those ranges
(:func:`_inferred_steps`); its step ranges that lie inside one of its phase ranges number mini-batches, not RL
steps (verl steps torch.profiler once per update mini-batch when a profiling schedule is set) and are set aside
(:func:`_minibatch_markers`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis.metrics import measure
from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

STEP_PHASES: tuple[str, ...] = ("generate", "logprob", "update", "sync", "other")
PHASES: tuple[str, ...] = STEP_PHASES[:-1]
# Accepted column spellings (and their scale to seconds) for a phase's time in a run's per-step metrics, the
# first found wins: <p>_s, time_<p>_s, <p>_time_s, the same with _seconds and _ns, seconds_<p>.
_SPELLINGS: tuple[tuple[str, float], ...] = (
    *(
        (f"{pre}{{p}}{mid}{unit}", scale)
        for unit, scale in (("_s", 1.0), ("_seconds", 1.0), ("_ns", 1e-9))
        for pre, mid in (("", ""), ("time_", ""), ("", "_time"))
    ),
    ("seconds_{p}", 1.0),
)
_STEP_ALIASES: tuple[str, ...] = ("seconds", "wall_s")  # a step's wall seconds, besides the spellings above
_STEP_RANGE = r"^(?:ProfilerStep#(\d+)|step)$"
_STEP_RE = re.compile(_STEP_RANGE)


def metric_seconds(metrics: pd.DataFrame, phases: Sequence[str]) -> dict[str, pd.Series]:
    """Seconds per row (step) of each of ``phases`` that a run's per-step metrics (``metrics.parquet``) give a
    column for, NaN where a step does not say; ``step`` is the step's wall time. The one reading of these
    columns: the Step time page and the step model (``perfmodel.inputs``) both call it."""
    import pandas as pd

    out: dict[str, pd.Series] = {}
    columns = set(map(str, metrics.columns))
    for phase in phases:
        found = [(p.format(p=phase), k) for p, k in _SPELLINGS if p.format(p=phase) in columns]
        found += [(a, 1.0) for a in _STEP_ALIASES if phase == "step" and a in columns]
        if found:
            col, scale = found[0]
            out[phase] = pd.to_numeric(metrics[col], errors="coerce") * scale
    return out


def _phase_order(col: pd.Series) -> pd.Series:
    if col.name == "phase":
        return col.map({p: i for i, p in enumerate(STEP_PHASES)}).fillna(len(STEP_PHASES))
    return col


def _with_other(
    wide: pd.DataFrame, step_seconds: pd.Series | np.ndarray | None, keys: Sequence[str]
) -> pd.DataFrame:
    import pandas as pd

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

    Uses the per-phase seconds in ``metrics`` when present; otherwise the range log, read as ``mxperf ingest``
    reads one (:func:`trace_step_phases`). Raises ValueError when neither has per-phase times.
    """
    import pandas as pd

    if metrics is not None and "step" in metrics.columns:
        seconds = metric_seconds(metrics, (*PHASES, "step"))
        if seconds.keys() - {"step"}:
            wide = pd.DataFrame({"step": metrics["step"].astype("int64")})
            for phase in PHASES:
                wide[phase] = seconds.get(phase, 0.0)
            return _with_other(wide, seconds.get("step"), ["step"])
    if ranges is not None and len(ranges):
        return _phase_table_from_range_log(ranges)
    raise ValueError("no per-phase times: metrics.parquet has no <phase>_s columns and there is no range log")


def _phase_table_from_range_log(ranges: pd.DataFrame) -> pd.DataFrame:
    """A run's range log read as ``mxperf ingest`` reads it (:func:`trace_step_phases` over its step and phase
    ranges), the slowest process's phases per step."""
    from tracing.analysis.phases import default_phase_map, range_log_columns

    cols = range_log_columns(schema.from_frame(ranges), default_phase_map())
    keep = ("name", "phase", "pid", "start_ns", "end_ns", "attrs")
    table = schema.make_table({c: cols[c] for c in keep}, {c: schema.RANGE_COLUMNS[c] for c in keep})
    per = schema.to_frame(trace_step_phases(schema.rows_where(table, step_rows(table))))
    if per.empty:
        raise ValueError("the range log has no 'step' ranges")
    return one_process(per)


def _phase_in(t: pa.Table, wanted: tuple[str, ...]) -> np.ndarray:
    """Rows whose phase is one of ``wanted`` (none without a phase column), tested once per distinct phase."""
    if "phase" not in t.column_names:
        return np.zeros(t.num_rows, bool)
    codes, phases = schema.factorize(t, "phase")
    return np.array([p in wanted for p in phases] + [False])[codes]


def _is_step(ranges: pa.Table, step_phase: np.ndarray | None = None) -> np.ndarray:
    """Step ranges: a step-like name (matched once per distinct name: an nsys export has a range per op, no
    str object per row) or the phase ``step`` (``step_phase``: those rows, when the caller has them)."""
    codes, uniques = schema.factorize(ranges, "name")
    step_phase = _phase_in(ranges, ("step",)) if step_phase is None else step_phase
    return np.array([is_step_name(n) for n in uniques] + [False])[codes] | step_phase


def is_step_name(name: object) -> bool:
    """A step range name: ``step`` or ``ProfilerStep#N``."""
    return isinstance(name, str) and _STEP_RE.match(name) is not None


def step_rows(ranges: pd.DataFrame | pa.Table) -> np.ndarray:
    """The rows :func:`trace_step_phases` reads: step ranges and ranges of a step phase; the others cannot
    change its table (pass only these and an NVTX-heavy range table is not copied whole)."""
    t = ranges if schema.is_arrow(ranges) else schema.from_frame(ranges)
    if t.num_rows == 0:
        return np.zeros(0, bool)
    return _is_step(t) | _phase_in(t, PHASES)


def trace_step_phases(
    ranges: pd.DataFrame | pa.Table,
    microbatches: pa.Table | None = None,
    bases: dict[Any, str] | None = None,
    notes: list[str] | None = None,
) -> pd.DataFrame | pa.Table:
    """``STEP_COLUMNS`` rows from an ingested trace's range table (``schema.RANGE_COLUMNS``); a frame gives a
    frame, an Arrow table an Arrow table.

    One row per (trace, rank, process, step, phase); empty without step ranges. A process whose steps mostly
    begin while earlier GPU work still runs is timed on the device (:func:`_device_windows`, docs/contracts.md);
    ``bases`` (when given) gets (trace, pid) -> ``host`` | ``device``. A step with no phase range takes its
    phases from the ``microbatches`` found inside it. ``notes`` (when given) gets a line per process whose
    steps are inferred or whose step ranges are set aside (module docstring).
    """
    if not schema.is_arrow(ranges):
        return schema.to_frame(trace_step_phases(schema.from_frame(ranges), microbatches, bases, notes))
    if ranges.num_rows == 0:
        return schema.empty_table(schema.STEP_COLUMNS)
    has = set(ranges.column_names)
    n = ranges.num_rows

    def values(c: str) -> list[Any]:
        return ranges.column(c).to_pylist() if c in has else [None] * n

    pid, start, end = (ranges.column(c).to_numpy() for c in ("pid", "start_ns", "end_ns"))
    trace, rank = values("trace"), values("rank")
    plan = _step_plan(ranges, trace, pid, start, end)
    steps, step_no, inferred = plan.kept, plan.numbers, plan.inferred
    if notes is not None:
        notes += _step_notes(plan.markers, inferred, trace, pid)
    if not steps and not inferred:
        return schema.empty_table(schema.STEP_COLUMNS)
    phased = np.flatnonzero(plan.phased)  # numpy columns once (masks per step: ~1 ms each)
    lo, hi = _device_windows(ranges, start, end, steps, trace, pid, bases)
    p_pid, p_start, p_end = pid[phased], start[phased], end[phased]
    p_lo, p_hi = lo[phased], hi[phased]
    p_phase = (
        np.array(schema.take(ranges.column("phase"), phased).to_pylist(), dtype=object)
        if len(phased)
        else None
    )
    p_trace = np.array([trace[k] for k in phased.tolist()], dtype=object) if "trace" in has else None
    mbs = _microbatch_windows(microbatches)
    windows = [
        (trace[k], rank[k], int(pid[k]), no, start[k], end[k], lo[k], hi[k])
        for k, no in zip(steps, step_no, strict=True)
    ]
    windows += [(t, rank[first], p, no, s, e, s, e) for (t, p), no, s, e, first in inferred]
    rows = []
    for t, r, p, no, s, e, w_lo, w_hi in windows:
        inside = (p_pid == p) & (p_start >= s) & (p_end <= e)
        if p_trace is not None:
            inside &= p_trace == t
        wide: dict[str, object] = {"trace": t, "rank": r, "pid": p, "step": no}
        for phase in PHASES:
            sel = inside & (p_phase == phase) if p_phase is not None else inside
            wide[phase] = measure(p_lo[sel], p_hi[sel]) / 1e9 if sel.any() else 0.0
        if not inside.any() and mbs is not None:  # no phase range: the micro-batches found inside the step
            in_step = (mbs["pid"] == p) & (mbs["start"] >= s) & (mbs["start"] < e)
            for phase in set(mbs["phase"][in_step].tolist()) & set(PHASES):
                sel = in_step & (mbs["phase"] == phase)
                wide[phase] = measure(mbs["lo"][sel], mbs["hi"][sel]) / 1e9
        wide["_wall"] = (int(w_hi) - int(w_lo)) / 1e9
        rows.append(wide)
    return schema.make_table(_long_table(rows), schema.STEP_COLUMNS, "steps")


def _processes(rows: np.ndarray, trace: list[Any], pid: np.ndarray) -> dict[tuple[Any, int], np.ndarray]:
    """``rows`` grouped by process (trace, pid), each group in row order."""
    groups: dict[tuple[Any, int], list[int]] = {}
    for k in rows.tolist():
        groups.setdefault((trace[k], int(pid[k])), []).append(k)
    return {key: np.asarray(v, np.int64) for key, v in groups.items()}


def _minibatch_markers(
    codes: np.ndarray,
    phased: np.ndarray,
    is_step: np.ndarray,
    trace: list[Any],
    pid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
) -> np.ndarray:
    """Step ranges that number mini-batches, not RL steps: every step range of a process whose phase ranges hold
    two phases or more and one of whose step ranges lies inside one of them (shorter than it). verl, with a
    torch.profiler schedule, calls ``step()`` once per update mini-batch: its ``ProfilerStep#N`` sit inside
    ``update_actor`` (the first and last straddle its ends). A plain training loop (one phase) keeps its steps."""
    out = np.zeros(len(is_step), bool)
    if not is_step.any() or not phased.any():
        return out
    by_phase = _processes(np.flatnonzero(phased), trace, pid)
    for key, rows in _processes(np.flatnonzero(is_step), trace, pid).items():
        p = by_phase.get(key)
        if p is None or len(np.unique(codes[p])) < 2:
            continue
        order = np.argsort(start[p], kind="stable")
        ps, reach = start[p][order].astype(np.int64), np.maximum.accumulate(end[p][order].astype(np.int64))
        s, e = start[rows].astype(np.int64), end[rows].astype(np.int64)
        # inside a longer phase range: one starting at or before it and ending after it, or starting before it
        # and ending at or after it (a phase range equal to the step range is not "inside")
        after = _furthest(reach, np.searchsorted(ps, s, "right")) > e
        if np.any(after | (_furthest(reach, np.searchsorted(ps, s, "left")) >= e)):
            out[rows] = True
    return out


def _furthest(reach: np.ndarray, i: np.ndarray) -> np.ndarray:
    """The latest end among the (start-sorted) ranges before position ``i`` (``reach``: the running max)."""
    return np.where(i > 0, reach[np.maximum(i - 1, 0)], np.iinfo(np.int64).min)


def _inferred_steps(
    coded: tuple[np.ndarray, list[Any], np.ndarray],
    trace: list[Any],
    pid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    stepped: set[Any],
) -> list[tuple[tuple[Any, int], int, int, int, int]]:
    """Steps of each process with no step range (``stepped``: the processes that have one): in a file whose
    name gives one step, its phase ranges are that step; where its outermost phase ranges hold one phase, each is
    a step when the file name gives as many steps (NeMo RL ``<worker>_3:5_<pid>``: two); else, where they hold
    two phases or more, a step begins at each range of the process's first phase other than
    ``sync`` (weights are synced before or after other phases, or both) that follows a range of another phase
    (generate, logprob, update, generate, ... or logprob, update, logprob, ...; ranges before the first such
    range are step 0's) and spans its first range's start to its last one's end. Rows ``((trace, pid), number,
    start, end, first row)``, numbered from 0 per process."""
    codes, phases, in_phase = coded  # the phase column factorized, and which rows have a step phase
    phased = np.flatnonzero(in_phase)
    if not len(phased):
        return []
    out = []
    for key, rows in _processes(phased, trace, pid).items():
        if key in stepped:
            continue
        rows = rows[np.lexsort((-end[rows].astype(np.int64), start[rows]))]
        outer, reach = [], None
        for k in rows.tolist():
            if reach is not None and end[k] <= reach:  # inside an earlier phase range
                continue
            outer.append(k)
            reach = int(end[k]) if reach is None else max(reach, int(end[k]))
        names = [phases[codes[k]] for k in outer]
        cycles = _cycles(key, outer, names, start, end) if len(set(names)) > 1 else []
        # the one step its file name gives: verl starts a file at each profiled step, or at the first of
        # consecutive ones (profile_continuous_steps), whose phase cycles then count them
        if _one_step_file(key[0]) and len(cycles) < 2:
            out.append((key, 0, int(start[outer].min()), int(end[outer].max()), outer[0]))
            continue
        # one phase: a range a step where the file name counts as many (a NeMo RL sampler: a generate a step)
        if not cycles and len(outer) == _named_steps(key[0]) > 1:
            cycles = [(key, no, int(start[k]), int(end[k]), k) for no, k in enumerate(outer)]
        out += cycles
    return out


def _cycles(
    key: tuple[Any, int], outer: list[int], names: list[Any], start: np.ndarray, end: np.ndarray
) -> list[tuple[tuple[Any, int], int, int, int, int]]:
    """A process's steps from its outermost phase ranges (``outer``, their phases ``names``, two or more): a
    step begins at each range of its first phase other than ``sync`` that follows a range of another phase."""
    head = next((n for n in names if n != "sync"), names[0])  # weights sync on either side of a phase
    out = []
    no, first = 0, outer[0]
    lo, hi = int(start[first]), int(end[first])
    seen_head = names[0] == head
    for j in range(1, len(outer)):
        k = outer[j]
        if names[j] == head and names[j - 1] != head and seen_head:
            out.append((key, no, lo, hi, first))
            no, first, lo, hi = no + 1, k, int(start[k]), int(end[k])
        seen_head = seen_head or names[j] == head
        hi = max(hi, int(end[k]))
    out.append((key, no, lo, hi, first))
    return out


@functools.lru_cache(maxsize=1024)
def _named(trace: Any) -> tuple[int, str | None]:
    """What a trace file's name says of its steps: how many it holds (0: it does not say) and what part of its
    step a verl file holds (``update mini-batches 2-3``; None for a whole one)."""
    from tracing.ingest.trace import report_name

    info = report_name(trace) if isinstance(trace, str) else {}
    return len(info.get("profiled_steps") or ()), info.get("window")


def _window(trace: Any) -> str | None:
    return _named(trace)[1]


def _named_steps(trace: Any) -> int:
    return _named(trace)[0]


def _one_step_file(trace: Any) -> bool:
    """Whether a trace file's name says it holds one RL step (verl's ``..._step<N>_rank<r>...``: a file per
    profiled step, and in verl's discrete mode a file per stage of it)."""
    return _named_steps(trace) == 1


def _step_notes(
    markers: np.ndarray,
    inferred: list[tuple[tuple[Any, int], int, int, int, int]],
    trace: list[Any],
    pid: np.ndarray,
) -> list[str]:
    """What the step table says of processes whose steps are not their step ranges."""
    notes = [
        f"pid {key[1]}: its {len(rows)} step ranges lie inside its phase ranges: they mark mini-batches (as "
        "verl's ProfilerStep#N under a torch.profiler schedule), not RL steps; its steps are inferred instead"
        for key, rows in _processes(np.flatnonzero(markers), trace, pid).items()
    ]
    counts: dict[tuple[Any, int], int] = {}
    for key, *_ in inferred:
        counts[key] = counts.get(key, 0) + 1
    return notes + [_inferred_note(key, n) for key, n in counts.items()]


def _inferred_note(key: tuple[Any, int], n: int) -> str:
    """The step note of a process (trace, pid) with ``n`` inferred steps."""
    if not _one_step_file(key[0]) or n > 1:
        rule = "a step begins at each range of its first phase other than sync that follows other phases"
        if _named_steps(key[0]) == n:  # with one phase, its ranges one a step (only so when the name agrees)
            rule = f"as many as its file name gives: with one phase each range is a step, with more {rule}"
        return (
            f"pid {key[1]}: {INFERRED}: {n} step(s) inferred from its phase ranges ({rule}, and spans its phase "
            "ranges; time between steps is in none)"
        )
    note = f"pid {key[1]}: {INFERRED}: its phase ranges are the one step its file name gives (they span that step's "
    window = _window(key[0])
    if window is None:
        return note + "phases only)"
    return (
        note + f"phases only); the file holds {window} of it only ({PARTIAL}): its phases there are partial"
    )


# a window (a step or phase range, a micro-batch) "starts behind the GPU" when work queued before it runs past
# its start by more than this share of it; the fit calls such micro-batch windows overlapped (fit_all)
LAG_SHARE = 0.05
INFERRED = "no step range"  # what a step note of a process whose steps are inferred says (read by perfmodel)
OVERLAP = "runs at the same time"  # what a step note of an async trainer's roles says (read by perfmodel)
PARTIAL = "a torch.profiler schedule window"  # a step note of a file that holds part of its step (perfmodel)


def _ns(column: Any) -> np.ndarray:
    """An int64 ns column with nulls as -1, exact (epoch ns do not fit a float64's 53 bits)."""
    import pyarrow as pa

    filled = schema.fill_null(column, -1)
    if pa.types.is_floating(filled.type):
        return np.nan_to_num(filled.to_numpy(), nan=-1).astype(np.int64)
    return np.asarray(filled.to_numpy(), np.int64)


def _device_windows(
    ranges: pa.Table,
    start: np.ndarray,
    end: np.ndarray,
    steps: list[int],
    trace: list[Any],
    pid: np.ndarray,
    bases: dict[Any, str] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's window: its host [start, end], or on a device-basis process [max(start, queued end), end of
    the last GPU op it launched] (host window where it launched none). A process is on the device basis when
    most of its step ranges start behind the GPU (as the micro-batch rule)."""
    lo, hi = start.astype(np.int64), end.astype(np.int64)
    if "queued_end_ns" not in ranges.column_names or "gpu_end_ns" not in ranges.column_names:
        return lo, hi
    queued, gpu_end = _ns(ranges.column("queued_end_ns")), _ns(ranges.column("gpu_end_ns"))
    behind = queued - start > LAG_SHARE * (end - start)
    device = np.zeros(len(start), bool)
    for key in {(trace[k], int(pid[k])) for k in steps}:
        mine = [k for k in steps if (trace[k], int(pid[k])) == key]
        on_device = 2 * int(behind[mine].sum()) > len(mine)
        if bases is not None:
            bases[key] = "device" if on_device else "host"
        if on_device:
            device |= (pid == key[1]) & np.array([t == key[0] for t in trace], bool)
    d_lo = np.maximum(start, queued)
    use = device & (gpu_end > d_lo)
    return np.where(use, d_lo, lo), np.where(use, gpu_end, hi)


def _microbatch_windows(microbatches: pa.Table | None) -> dict[str, np.ndarray] | None:
    """The micro-batches' (pid, phase, host start, window on their basis: [end - seconds, end])."""
    if microbatches is None or microbatches.num_rows == 0:
        return None
    end = microbatches.column("end_ns").to_numpy(zero_copy_only=False)
    seconds = microbatches.column("seconds").to_numpy(zero_copy_only=False)
    return {
        "pid": microbatches.column("pid").to_numpy(zero_copy_only=False),
        "phase": np.array(microbatches.column("phase").to_pylist(), dtype=object),
        "start": microbatches.column("start_ns").to_numpy(zero_copy_only=False),
        "lo": (end - np.round(seconds * 1e9)).astype(np.int64),
        "hi": end.astype(np.int64),
    }


@dataclass(frozen=True)
class _StepPlan:
    """A range table's steps: step-range rows kept and their numbers, mini-batch markers set aside, inferred
    steps, and the rows with a step phase (:data:`PHASES`)."""

    kept: list[int]
    numbers: list[int]
    markers: np.ndarray
    inferred: list[tuple[tuple[Any, int], int, int, int, int]]
    phased: np.ndarray


def _step_plan(
    ranges: pa.Table, trace: list[Any], pid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> _StepPlan:
    """Every rule that finds steps, in one pass over the phase column (factorized once)."""
    if "phase" in ranges.column_names:
        codes, phases = schema.factorize(ranges, "phase")
    else:
        codes, phases = np.full(ranges.num_rows, -1, np.int64), []
    phased = np.array([p in PHASES for p in phases] + [False])[codes]
    is_step = _is_step(ranges, np.array([p == "step" for p in phases] + [False])[codes])
    markers = _minibatch_markers(codes, phased, is_step, trace, pid, start, end)
    rows = np.flatnonzero(is_step & ~markers)
    kept, numbers = _outer_steps(rows[np.argsort(start[rows], kind="stable")], ranges, trace, pid, start, end)
    stepped = {(trace[k], int(pid[k])) for k in kept}
    inferred = _inferred_steps((codes, phases, phased), trace, pid, start, end, stepped)
    return _StepPlan(kept, numbers, markers, inferred, phased)


def _columns(
    ranges: pa.Table, source: str | None = None
) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
    """(trace per row: the ``trace`` column, else ``source``, the file every row is from; pid, start, end)."""
    has = "trace" in ranges.column_names
    trace = ranges.column("trace").to_pylist() if has else [source] * ranges.num_rows
    pid, start, end = (ranges.column(c).to_numpy().astype(np.int64) for c in ("pid", "start_ns", "end_ns"))
    return trace, pid, start, end


def numbered_steps(ranges: pa.Table) -> tuple[list[int], list[int]]:
    """The rows of ``ranges`` that are steps of the step table, in start order, and each one's number
    (:func:`_outer_steps`: a step range inside another of its process is the same step; mini-batch markers,
    :func:`_minibatch_markers`, are not steps)."""
    plan = _step_plan(ranges, *_columns(ranges))
    return plan.kept, plan.numbers


def step_windows(ranges: pa.Table, source: str | None = None) -> dict[str, np.ndarray]:
    """The steps of the step table (step ranges, then :func:`_inferred_steps`) as ``pid``, ``start_ns``,
    ``end_ns`` and ``step`` arrays: what numbers the micro-batches inside them, so both tables name a step
    alike (``source``: the file of a table without a ``trace`` column, whose name may give its step)."""
    if ranges.num_rows == 0:
        return {c: np.zeros(0, np.int64) for c in ("pid", "start_ns", "end_ns", "step")}
    trace, pid, start, end = _columns(ranges, source)
    plan = _step_plan(ranges, trace, pid, start, end)
    rows, inferred = np.asarray(plan.kept, np.int64), plan.inferred
    return {
        "pid": np.concatenate([pid[rows], np.array([key[1] for key, *_ in inferred], np.int64)]),
        "start_ns": np.concatenate([start[rows], np.array([w[2] for w in inferred], np.int64)]),
        "end_ns": np.concatenate([end[rows], np.array([w[3] for w in inferred], np.int64)]),
        "step": np.concatenate(
            [np.asarray(plan.numbers, np.int64), np.array([w[1] for w in inferred], np.int64)]
        ),
    }


def _outer_steps(
    steps: np.ndarray, ranges: pa.Table, trace: list[Any], pid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[list[int], list[int]]:
    """The step ranges (rows ``steps``, in start order) that are not inside another step range of their process,
    and each one's number. A step range inside another is the same step seen twice (an mxperf or framework
    ``step`` range inside torch.profiler's ``ProfilerStep#N``): it is not a step of its own, and its
    ``{"step": N}`` attribute numbers the outer one. Else ``ProfilerStep#N`` gives N, a ``step`` range its
    attribute, and an unnumbered step counts up per process in time order."""
    names = schema.take(ranges.column("name"), steps).to_pylist()
    attrs = schema.take(ranges.column("attrs"), steps).to_pylist() if "attrs" in ranges.column_names else None
    kept: list[int] = []
    number: list[int | None] = []
    open_step: dict[tuple[Any, int], int] = {}  # process -> index in kept of its step range open last
    counted: dict[tuple[Any, int], int] = {}
    for i, k in enumerate(steps.tolist()):
        key = (trace[k], int(pid[k]))
        m = _STEP_RE.match(names[i]) if isinstance(names[i], str) else None
        own = int(m.group(1)) if m is not None and m.group(1) is not None else _attr_step(attrs, i)
        j = open_step.get(key)
        if j is not None and start[k] >= start[kept[j]] and end[k] <= end[kept[j]]:
            if own is not None and _STEP_RE.match(names[i]).group(1) is None:  # type: ignore[union-attr]
                number[j] = own  # the framework's own step number wins over the profiler's count
            continue
        fallback = counted.get(key, 0)
        counted[key] = fallback + 1
        open_step[key] = len(kept)
        kept.append(k)
        number.append(own if own is not None else fallback)
    return kept, [int(n) for n in number]  # type: ignore[arg-type]


def _attr_step(attrs: list[Any] | None, i: int) -> int | None:
    if attrs is None or not isinstance(attrs[i], str) or not attrs[i].startswith("{"):
        return None
    value = json.loads(attrs[i]).get("step")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _long_table(rows: list[dict[str, object]]) -> dict[str, Any]:
    """The long table of the per-step rows: rows of one (trace, rank, process, step) summed (a Kineto trace
    has each ``ProfilerStep#N`` twice, on the CPU and the GPU timeline), keys ascending (a missing trace or
    rank last), then one row per phase in ``STEP_PHASES`` order, ``other`` = max(step wall - phase sum, 0).

    What pandas' groupby-sum, melt and keyed sort gave, float for float (:func:`kahan_sum`; phases summed left
    to right)."""
    fields = (*PHASES, "_wall")
    groups: dict[tuple[object, ...], list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["rank"], r["pid"], r["step"]), []).append(r)

    def order(key: tuple[object, ...]) -> tuple[object, ...]:
        trace, rank = key[0], key[1]
        no_rank = rank is None or type(rank).__name__ == "NAType"  # pandas' NA, from a frame's rows
        return (trace is None, trace or "", no_rank, 0 if no_rank else rank, key[2], key[3])

    keys = sorted(groups, key=order)
    sums = np.array(
        [[kahan_sum([float(r[f]) for r in groups[k]]) for f in fields] for k in keys],  # type: ignore[arg-type]
        np.float64,
    ).reshape(len(keys), len(fields))
    phase_sum = sums[:, 0]
    for i in range(1, len(PHASES)):
        phase_sum = phase_sum + sums[:, i]
    other = (sums[:, len(PHASES)] - phase_sum).clip(min=0)
    seconds = np.column_stack([sums[:, : len(PHASES)], other]).reshape(-1)
    m = len(STEP_PHASES)
    return {
        "trace": [k[0] for k in keys for _ in range(m)],
        "rank": [k[1] for k in keys for _ in range(m)],
        "pid": np.repeat(np.array([k[2] for k in keys], np.int64), m),
        "step": np.repeat(np.array([k[3] for k in keys], np.int64), m),
        "phase": list(STEP_PHASES) * len(keys),
        "seconds": seconds,
    }


def merge_process_files(table: pa.Table) -> pa.Table:
    """The step table with each process whole: a process (rank and pid, pid >= 0) whose rows come from several
    files -- verl's discrete mode writes a file per stage of a step, a scheduled update a file per window of
    mini-batches -- takes its first file's path (in path order) for all of them, and its rows of one (step,
    phase) are summed, so the files count as the one process they are. Anything else stays as it is."""
    import pyarrow as pa

    if not {"trace", "rank", "pid"} <= set(table.column_names) or table.num_rows == 0:
        return table
    trace, rank, pid = (table.column(c).to_pylist() for c in ("trace", "rank", "pid"))
    files: dict[tuple[Any, Any], set[Any]] = {}
    for t, r, p in zip(trace, rank, pid, strict=True):
        if p is not None and p >= 0:
            files.setdefault((r, p), set()).add(t)
    first = {key: min(ts, key=str) for key, ts in files.items() if len(ts) > 1}
    if not first:
        return table
    cols = {c: table.column(c).to_pylist() for c in table.column_names}
    cols["trace"] = [first.get((r, p), t) for t, r, p in zip(trace, rank, pid, strict=True)]
    keys = [c for c in table.column_names if c != "seconds"]
    rows: dict[tuple[Any, ...], list[float]] = {}
    for i, key in enumerate(zip(*(cols[c] for c in keys), strict=True)):
        x = cols["seconds"][i]
        rows.setdefault(key, []).append(float("nan") if x is None else x)
    merged = {c: [k[j] for k in rows] for j, c in enumerate(keys)}
    merged["seconds"] = [kahan_sum(v) if any(x == x for x in v) else float("nan") for v in rows.values()]
    return pa.table({c: merged[c] for c in table.column_names}, schema=table.schema)


def process_roles(
    trace: Sequence[Any],
    rank: Sequence[Any],
    pid: Sequence[Any],
    phase: Sequence[Any],
    seconds: Sequence[Any],
) -> dict[tuple[Any, Any, Any], str]:
    """Each process's (trace, rank, pid) role: the phases it and the processes it shares a phase with spend time
    in, ``sync`` and ``other`` aside ("logprob,update"). Data-parallel ranks share one (rank 0 computing the
    reward too is still a rank of theirs); a sampler that only generates beside the learner ranks has another,
    and only processes of one role are ranks of each other."""
    own: dict[tuple[Any, Any, Any], set[str]] = {}
    for key, ph, sec in zip(zip(trace, rank, pid, strict=True), phase, seconds, strict=True):
        mine = own.setdefault(key, set())
        if ph not in ("sync", "other") and sec is not None and sec == sec and sec > 0:
            mine.add(str(ph))
    groups: list[set[str]] = []  # phase sets that share a phase, merged
    for phases in own.values():
        touching = [g for g in groups if g & phases]
        merged = set(phases).union(*touching)
        groups = [g for g in groups if not g & phases] + ([merged] if merged else [])
    return {k: next((",".join(sorted(g)) for g in groups if g & v), "") for k, v in own.items()}


def objects(frame: pd.DataFrame, column: str) -> list[Any]:
    """A frame's column as Python values, None for a null (NaN, NA); all None where it has no such column."""
    if column not in frame:
        return [None] * len(frame)
    v = frame[column].astype(object)
    return v.where(v.notna(), None).tolist()


def one_process(steps: pd.DataFrame) -> pd.DataFrame:
    """``step, phase, seconds`` for the step time a job waits for: per step and role, the phases of the process
    with the longest step (kept whole, so they add up to that step: the one ``stragglers.parquet`` names where
    every process plays one role); where processes play different roles -- a sampler that only generates beside
    a learner, NeMo RL's vLLM and policy workers -- each phase takes the longest of the roles' (a sync both
    sides take part in counts once).

    A process's role is the set of phases it spends time in, ``sync`` and ``other`` aside: data-parallel ranks
    share one, and only processes of one role are ranks of each other."""
    import pandas as pd

    if steps.empty:
        return pd.DataFrame({"step": [], "phase": [], "seconds": []})
    keys = [k for k in ("trace", "rank", "pid") if k in steps]
    totals = steps.groupby([*keys, "step"], dropna=False, as_index=False)["seconds"].sum()

    role = process_roles(*(objects(steps, k) for k in ("trace", "rank", "pid", "phase", "seconds")))
    idents = zip(*(objects(totals, k) for k in ("trace", "rank", "pid")), strict=True)
    totals["role"] = [role.get(key, "") for key in idents]
    # ties as ranks.straggler_table breaks them: the lowest rank, then pid, then path
    order = ["seconds", *[k for k in ("rank", "pid", "trace") if k in keys]]
    slowest = totals.sort_values(
        order, ascending=[False] + [True] * (len(order) - 1), na_position="last", kind="stable"
    ).drop_duplicates(["step", "role"])
    picked = steps.merge(slowest[[*keys, "step"]], on=[*keys, "step"])
    if slowest["role"].nunique() > 1:
        picked = picked.groupby(["step", "phase"], as_index=False, sort=False)["seconds"].max()
    return picked[["step", "phase", "seconds"]].sort_values(
        ["step", "phase"], key=_phase_order, ignore_index=True
    )


def kahan_sum(values: list[float]) -> float:
    """The sum of ``values`` as pandas' groupby sum gives it: NaN skipped, compensated (Kahan) addition in
    order (0.0 for none)."""
    total = comp = 0.0
    for v in values:
        if v != v:
            continue
        y = v - comp
        t = total + y
        comp = t - total - y
        if comp != comp:  # an infinite value: no compensation (pandas GH#53606)
            comp = 0.0
        total = t
    return total
