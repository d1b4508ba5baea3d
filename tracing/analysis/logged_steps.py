"""A framework's metric log -> the per-step tables a trace gives: seconds per (step, phase) in the shape of
``steps.parquet`` (``schema.STEP_COLUMNS``), the logged mismatch metrics and the token counts.

Which timer goes to which phase, ``other``, NaN versus 0 and the async trainers' ``generate_wait``:
docs/tracing.md, "Metric logs". Timers go through the same phase map as trace ranges (verl's timers are its
NVTX ranges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from tracing.analysis.phases import PhaseMap, default_phase_map
from tracing.analysis.steps import PHASES as STEP_PHASE_NAMES
from tracing.analysis.steps import STEP_PHASES
from tracing.ingest.metric_logs import SAMPLER_WAIT, TOKEN_FIELDS, MetricLog, step_tokens
from tracing.outputs import schema

METRIC_LOG_PID = -1  # steps.parquet's pid for rows of a metric log: its timers belong to no one process
_OVERLAP_TOLERANCE = 0.01  # phases may exceed the total by timer jitter before it is called an overlap


@dataclass(frozen=True)
class LoggedSteps:
    """What one metric log gives: tables plus what was read from where, for the summary and the manifest."""

    steps: Any  # STEP_COLUMNS: a pandas frame (logged_step_tables), an Arrow table (logged_tables)
    mismatch: Any  # MISMATCH_COLUMNS, likewise
    phase_keys: dict[str, list[str]]  # step phase -> the logged timer keys summed into it
    notes: tuple[str, ...]
    tokens: Any = None  # STEP_TOKEN_COLUMNS, likewise; no rows when the log gives no count


def logged_step_tables(
    log: MetricLog, phase_map: PhaseMap | None = None, precision: str | None = None
) -> LoggedSteps:
    """Both tables of ``log`` as pandas frames (phase map: the default one); ``precision`` (a label) goes into
    the mismatch rows."""
    got = logged_tables(log, phase_map, precision)
    frames = {k: schema.to_frame(getattr(got, k)) for k in ("steps", "mismatch", "tokens")}
    return replace(got, **frames)


def logged_tables(
    log: MetricLog, phase_map: PhaseMap | None = None, precision: str | None = None
) -> LoggedSteps:
    """:func:`logged_step_tables` with Arrow tables (``mxperf ingest``)."""
    phase_keys, total_key, skipped = _classify_timers(log, phase_map or default_phase_map())
    steps, overlap, unknown = _step_rows(log, phase_keys, total_key)
    notes = list(log.notes)
    if total_key is None and phase_keys:
        notes.append(
            f"no step total ({log.keys.timing_prefix}{log.keys.step_total}): 'other' is unknown (NaN)"
        )
    missing = [p for p in STEP_PHASE_NAMES if not phase_keys.get(p)]
    if phase_keys.get(SAMPLER_WAIT):
        waits = ", ".join(phase_keys[SAMPLER_WAIT])
        gen = ", ".join(phase_keys.get("generate", []))
        said = (
            f"generate ({gen}) runs beside the step" if gen else "no generation time is logged (generate NaN)"
        )
        notes.append(f"{said}; the trainer's wait for the sampler ({waits}) is phase {SAMPLER_WAIT}")
        missing = [p for p in missing if p != "generate"]
    if phase_keys and missing:
        notes.append(f"no timer of phase {', '.join(missing)}: NaN, not 0")
    if skipped:
        notes.append(f"counted in 'other' (not a step phase): {', '.join(sorted(skipped))}")
    if overlap:
        notes.append(
            f"step(s) {_shown(overlap)}: the phases add up to more than the step total (overlapping timers, e.g. "
            f"asynchronous generation); 'other' clipped to 0"
        )
    for phase, at in sorted(unknown.items()):
        notes.append(
            f"step(s) {_shown(at)}: {phase} not logged, or logged as null / NaN / inf, where the other steps log "
            "it: unknown (NaN) there, and so is 'other'"
        )
    tokens, token_notes = _token_rows(log)
    notes += token_notes
    return LoggedSteps(steps, _mismatch_rows(log, precision), phase_keys, tuple(notes), tokens)


def _shown(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps[:5]) + (" ..." if len(steps) > 5 else "")


def _columns(names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Rows -> one list per column (empty lists when there are no rows)."""
    cols = zip(*rows, strict=True) if rows else ([] for _ in names)
    return dict(zip(names, map(list, cols), strict=True))


def _classify_timers(
    log: MetricLog, phase_map: PhaseMap
) -> tuple[dict[str, list[str]], str | None, set[str]]:
    fw = log.keys
    phase_keys: dict[str, list[str]] = {}
    total_key, skipped = None, set()
    keys = sorted({k for values in log.steps.values() for k in values})
    timers = {t for k in keys if (t := fw.timer(k)) is not None}
    for key in keys:
        name = fw.timer(key)
        if name is None or fw.nested_in(name, timers):
            continue
        if name == fw.step_total:
            total_key = key
            continue
        phase = phase_map.phase_of(name)
        if phase in STEP_PHASE_NAMES:
            phase_keys.setdefault(phase, []).append(key)
        else:
            skipped.add(key)
    generation = {str(fw.timer(k)): k for k in phase_keys.get("generate", [])}
    waits = fw.sampler_waits(generation)
    if waits:
        phase_keys[SAMPLER_WAIT] = [generation[t] for t in sorted(waits)]
        kept = [k for t, k in generation.items() if t not in waits]
        phase_keys.pop("generate")
        if kept:
            phase_keys["generate"] = kept
    return phase_keys, total_key, skipped


def _step_rows(
    log: MetricLog, phase_keys: dict[str, list[str]], total_key: str | None
) -> tuple[Any, list[int], dict[str, list[int]]]:
    rows, overlap, unknown = [], [], {}
    timer_keys = {k for keys in phase_keys.values() for k in keys} | ({total_key} if total_key else set())
    waited = SAMPLER_WAIT in phase_keys  # then generate runs beside the step, the wait inside it
    phases = (*STEP_PHASE_NAMES, SAMPLER_WAIT) if waited else STEP_PHASE_NAMES
    timed = [s for s in sorted(log.steps) if timer_keys & log.steps[s].keys()]
    # A phase logged in most steps and missing at one is a gap in the log (unknown there); one logged in few
    # steps ran only there (verl marks update_weights only when it syncs): 0 where it is missing.
    usual = {
        p: 2 * sum(any(k in log.steps[s] for k in keys) for s in timed) > len(timed)
        for p, keys in phase_keys.items()
    }
    for step in timed:  # (a step that logged no timer: verl's validation before training, at step 0)
        values = log.steps[step]
        seconds: dict[str, float] = {}
        for phase in phases:
            keys = phase_keys.get(phase)
            if not keys:
                seconds[phase] = math.nan  # never logged: not measured
            elif not any(k in values for k in keys):
                seconds[phase] = math.nan if usual[phase] else 0.0
            else:
                seconds[phase] = sum(values.get(k, 0.0) for k in keys)  # NaN when one is logged unknown
            if keys and math.isnan(seconds[phase]):
                unknown.setdefault(phase, []).append(step)
        total = values.get(total_key, math.nan) if total_key else math.nan
        # Time of a phase the log never measures, if it had any, is inside another timer or in "other"; a
        # measured phase unknown at this step leaves "other" unknown too.
        if any(phase_keys.get(p) and math.isnan(v) for p, v in seconds.items()):
            total = math.nan
        inside = [v for p, v in seconds.items() if not math.isnan(v) and not (waited and p == "generate")]
        other = total - sum(inside)
        if not math.isnan(other) and other < -_OVERLAP_TOLERANCE * total:
            overlap.append(step)
        seconds["other"] = max(other, 0.0) if not math.isnan(other) else math.nan
        order = (*STEP_PHASES[:1], SAMPLER_WAIT, *STEP_PHASES[1:]) if waited else STEP_PHASES
        rows += [(log.path, step, phase, seconds[phase]) for phase in order]
    data = {**_columns(("trace", "step", "phase", "seconds"), rows), "rank": None, "pid": METRIC_LOG_PID}
    return schema.make_table(data, schema.STEP_COLUMNS, "steps"), overlap, unknown


def _mismatch_rows(log: MetricLog, precision: str | None) -> Any:
    fw = log.keys
    rows = [
        (log.path, log.framework, precision, step, metric, key, value)
        for step in sorted(log.steps)
        for key, value in sorted(log.steps[step].items())
        if (metric := fw.mismatch_metric(key)) is not None
    ]
    names = ("trace", "framework", "precision", "step", "metric", "key", "value")
    return schema.make_table(_columns(names, rows), schema.MISMATCH_COLUMNS, "mismatch")


def _token_rows(log: MetricLog) -> tuple[Any, tuple[str, ...]]:
    counts, notes = step_tokens(log)
    data: dict[str, Any] = {
        "trace": log.path,
        "framework": log.framework,
        "step": list(counts),
        **{f: [getattr(c, f) for c in counts.values()] for f in TOKEN_FIELDS},
    }
    return schema.make_table(data, schema.STEP_TOKEN_COLUMNS, "step_tokens"), notes
