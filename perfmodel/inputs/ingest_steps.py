"""An ingest folder's step table (``steps.parquet``: traces' step ranges, verl / NeMo RL metric logs) as phase
sources of the step model: per precision, the seconds per step of each phase, like a run folder's.

Whose precision and model a trace's steps are: its labels (``--label`` at ingest, or the metric log's), else the
precision its GEMM kernels show (``precision_evidence`` in the manifest); a trace with neither is left out, and
said so. Several ranks of one precision: per step the slowest rank's phases (a step waits for it; processes of
different roles, a sampler beside a learner, add theirs: ``steps.one_process``, as the Step time page). A
phase that is zero in every step was not captured (a trace of the learner alone has no ``generate``): it is
left to other sources rather than predicted as free. Steps the ingest inferred from phase ranges (no step range
in the trace) span their phases only; a note says so.

An async trainer's wait for its separate sampler (phase ``generate_wait``,
:mod:`tracing.analysis.logged_steps`) is kept apart from ``generate``: the step model takes no term from it,
and a step's ``step_s`` is its phases but a generation that ran beside it. A log whose ``generate`` holds
such a wait (the ``phase_keys`` of its manifest say so) is read as that wait only, and said so.

A metric log's token counts (``step_tokens.parquet``) go with its own generate seconds, step by step, as the
source's ``generation`` rows (prompt and generated tokens, ``generate_s``) for the generation fit
(:mod:`perfmodel.step.generation`); steps without both counts or without a generate time are left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.inputs.run_folder import RunFolder
from tracing.analysis.steps import INFERRED, OVERLAP, PARTIAL, merge_process_files, one_process
from tracing.ingest.metric_logs import FRAMEWORKS, SAMPLER_WAIT
from tracing.outputs import schema, store

STEP_COLUMNS = ("trace", "step", "phase", "seconds")
GENERATION_COLUMNS = ["step", "prompt_tokens", "generated_tokens", "generate_s"]


def _trace_labels(manifest: dict) -> dict[str, tuple[str | None, str | None, str]]:
    """Per trace path: (precision, model, where the precision comes from)."""
    common = (manifest.get("config") or {}).get("labels") or {}
    out = {}
    for t in manifest.get("traces") or []:
        own = {**common, **(t.get("labels") or {})}
        evidence = t.get("precision_evidence") or {}
        if own.get("precision"):
            prec, why = str(own["precision"]), "label"
        elif evidence.get("precision"):
            prec, why = str(evidence["precision"]), f"its GEMM kernels ({evidence.get('reason', 'found')})"
        else:
            prec, why = None, ""
        out[str(t.get("path"))] = (prec, str(own["model"]) if own.get("model") else None, why)
    return out


def _noting(manifest: dict, marker: str) -> list[str]:
    """The traces of an ingest one of whose step notes says ``marker`` (how its steps were found)."""
    return [
        str(t.get("path"))
        for t in manifest.get("traces") or []
        if any(marker in str(n) for n in t.get("step_notes") or [])
    ]


def phase_sources(path: Path, manifest: dict) -> tuple[list[RunFolder], list[str]]:
    """The ingest's steps as one :class:`RunFolder` per (precision, model) and notes on what was left out."""
    spath = path / store.STEPS
    if not spath.is_file():
        return [], []
    steps = store.read_table(spath)
    if steps.empty or not set(STEP_COLUMNS) <= set(steps.columns):
        return [], []
    notes: list[str] = []
    partial = set(_noting(manifest, PARTIAL))
    if partial:  # its micro-batches are whole and still fit; its step is not
        notes.append(
            f"{path}: {len(partial)} of its traces hold a window of their step only ({PARTIAL}: verl's '_mb<a>-<b>' "
            "or '_part<k>' files): left out of the step times"
        )
        steps = steps[~steps["trace"].astype(str).isin(partial)]
    # a process's files (verl's discrete mode: a file per stage of a step) as the one process they are
    steps = schema.to_frame(merge_process_files(schema.from_frame(steps)))
    labels = _trace_labels(manifest)
    inferred = _noting(manifest, f": {INFERRED}:")
    if inferred:
        whose = f"{inferred[0]}" if len(inferred) == 1 else f"{len(inferred)} of its traces"
        notes.append(
            f"{path}: the steps of {whose} are inferred from phase ranges (no step range in the trace): each "
            "spans its phases only, so time between them (a worker waiting for the driver's reward, say) is in no "
            "phase; a metric log's step timer (verl timing_s/step) gives the whole step"
        )
    overlapped = _noting(manifest, OVERLAP)
    if overlapped:
        notes.append(
            f"{path}: {len(overlapped)} of its traces hold processes of different roles that run the same steps at "
            "the same time (an async trainer): their phases are added, which over-states each step; a metric log's "
            "step timer gives it"
        )
    steps = _waits_apart(path, steps, manifest, notes)
    keyed = []
    for trace, rows in steps.groupby("trace", sort=True):
        prec, model, _ = labels.get(str(trace), (None, None, ""))
        if prec is None:
            notes.append(
                f"{path}: the steps of {trace} are not a phase source: its precision is unknown (no "
                "precision label, no low- or high-precision GEMMs recognised); ingest it with --label "
                "precision=ID"
            )
            continue
        keyed.append(rows.assign(precision=prec, model=model or ""))
    if not keyed:
        return [], notes
    table = pd.concat(keyed, ignore_index=True)
    tokens = _step_tokens(path)
    sources = []
    for (prec, model), rows in table.groupby(["precision", "model"], sort=True):
        job = one_process(rows)  # per step the slowest rank of each role (the Step time page's numbers)
        per_step = (
            job.groupby(["step", "phase"], sort=False)["seconds"]
            .sum(min_count=1)
            .unstack("phase")
            .sort_index()
        )
        per_step = per_step.apply(pd.to_numeric, errors="coerce")
        # a zero wait is measured (the learner was the longer side), not a phase the source did not capture
        seen = [p for p in per_step.columns if p == SAMPLER_WAIT or per_step[p].fillna(0).gt(0).any()]
        missing = sorted(set(per_step.columns) - set(seen))
        unknown = [
            p for p in missing if per_step[p].isna().all()
        ]  # e.g. 'other' of a log without a step total
        zero = [p for p in missing if p not in unknown]
        if zero:
            notes.append(
                f"{path} ({prec}): {', '.join(zero)} not captured (zero in every step): left to other sources"
            )
        if unknown:
            notes.append(
                f"{path} ({prec}): {', '.join(unknown)} not known in any step (not logged): left to other sources"
            )
        phases = {str(p): [float(v) for v in per_step[p].dropna()] for p in seen}
        frame = pd.DataFrame(
            {
                "step": per_step.index.astype(float),
                "microbatch_tokens": [None] * len(per_step),
                "step_s": _step_seconds(per_step, seen),
                "num_microbatches": np.nan,
                "update_tokens": np.nan,
                **{f"{p}_s": per_step[p].to_numpy(float) for p in seen},
            }
        )
        sources.append(
            RunFolder(
                path=f"{path} ({prec})" if table["precision"].nunique() > 1 else str(path),
                model=str(model) or None,
                learner=str(prec),
                sampler=str(prec),
                phases={p: v for p, v in phases.items() if v},
                global_tokens=_tokens_per_step(rows, tokens),
                tokens_per_microbatch=None,
                steps=frame,
                fit_source=(path / store.MICROBATCHES).is_file(),
                generation=_generation_rows(rows, tokens),
            )
        )
    return sources, notes


def _step_seconds(per_step: pd.DataFrame, seen: list[str]) -> np.ndarray | float:
    """Seconds of each step: its phases, but a generation that ran beside it (a log with a wait for it)."""
    beside = SAMPLER_WAIT in per_step.columns
    inside = [p for p in seen if not (beside and p == "generate")]
    return per_step[inside].sum(axis=1, min_count=1).to_numpy(float) if inside else np.nan


def _waits_apart(path: Path, steps: pd.DataFrame, manifest: dict, notes: list[str]) -> pd.DataFrame:
    """``steps`` with the generate rows of a metric log whose generate timers include the trainer's wait
    for the sampler (manifest ``phase_keys``) read as that wait: its generation time is unknown."""
    for t in manifest.get("traces") or []:
        fw = FRAMEWORKS.get(str(t.get("framework")))
        keys = [str(k) for k in ((t.get("phase_keys") or {}).get("generate") or [])]
        if fw is None or not keys:
            continue
        names = {str(fw.timer(k)): k for k in keys}
        waits = fw.sampler_waits(names)
        if not waits:
            continue
        trace = str(t.get("path"))
        hit = (steps["trace"] == trace) & (steps["phase"] == "generate")
        steps = steps.assign(phase=steps["phase"].where(~hit, SAMPLER_WAIT))
        notes.append(
            f"{path}: the generate phase of {trace} ({', '.join(keys)}) holds the trainer's wait for the "
            f"sampler ({', '.join(names[w] for w in sorted(waits))}): read as {SAMPLER_WAIT}, the generation "
            "time unknown; ingest the log again (mxperf ingest keeps the wait apart)"
        )
    return steps


def _step_tokens(path: Path) -> pd.DataFrame | None:
    """The ingest's ``step_tokens.parquet`` (metric logs' token counts), None when it has none."""
    tpath = path / store.STEP_TOKENS
    if not tpath.is_file():
        return None
    tokens = store.read_table(tpath)
    return tokens if len(tokens) else None


def _tokens_per_step(steps: pd.DataFrame, tokens: pd.DataFrame | None) -> float | None:
    """The median prompt + generated tokens per step of ``steps``' logs (their own counts: the learner's
    tokens per step), None when they have none."""
    if tokens is None:
        return None
    keys = steps[["trace", "step"]].drop_duplicates()
    t = tokens.merge(keys, on=["trace", "step"])
    total = pd.to_numeric(t["prompt_tokens"] + t["generated_tokens"], errors="coerce").dropna()
    return float(total.median()) if len(total) else None


def _generation_rows(steps: pd.DataFrame, tokens: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per (log, step) of ``steps``' traces: its prompt and generated tokens and its own generate seconds;
    None when no trace of them has token counts."""
    if tokens is None:
        return None
    gen = steps[steps["phase"] == "generate"].groupby(["trace", "step"], as_index=False)["seconds"].max()
    both = tokens.merge(gen.rename(columns={"seconds": "generate_s"}), on=["trace", "step"])
    both = both.dropna(subset=["prompt_tokens", "generated_tokens", "generate_s"])
    if both.empty:
        return None
    both = both.sort_values(["trace", "step"], kind="stable")
    return both[GENERATION_COLUMNS].astype(float).reset_index(drop=True)
