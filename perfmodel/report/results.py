"""From a micro-batch table to the ``fits.json`` document (docs/contracts.md shape plus extra keys), and back.

``analyze`` is pure: it fits every (model, phase, precision), compares each low precision with the baseline
on wall time and on GPU busy time (breakeven, measured crossing, host-stall share), predicts step times and
applies what-if knobs, and returns a JSON-ready dict. ``load_fits`` reads and validates a ``fits.json``.

Per entry (one per model, phase, low precision):

- ``fits.<precision>``: the wall line (``fixed_s``, ``per_token_s``, CIs, ``cov``, ``dof``, bootstrap CIs),
  ``per_step_s`` / ``per_step_ci`` / ``per_step_basis`` (null with ``per_step_reason`` when the data cannot
  identify a per-step cost), ``attention`` (the quadratic term when sequence lengths are known), ``model``
  (``line`` | ``knee`` | ``parts`` | null: which model the data chose), ``model_note``, ``knee`` (the knee
  model: knee tokens and interval, host/left and GPU/right lines), ``lack_of_fit``, ``implausible``,
  ``holdout``, ``gpu_busy`` (the same for GPU busy time), ``host_stall`` and ``memory`` lines, size means.
- ``breakeven`` (``basis: wall``) and ``breakeven_gpu_busy`` (``basis: gpu_busy``, "with host overhead
  removed"; null with ``breakeven_gpu_busy_reason`` without GPU data): ``case`` (docs/contracts.md table plus
  ``undetermined``), ``tokens``, ``ci``, ``ci_method``, ``ci_reason``, ``extrapolated``, ``model_ok``,
  ``model``, ``model_reason``, ``crossing`` ([lo, hi] or null) with ``crossing_detail``, and the extras
  below; ``breakeven.step_breakeven``: the step-level breakeven per global batch with its interval.
- ``host_stall_share_of_added_fixed`` with ``host_stall`` (bounded ``share_ci`` or null with ``reason``,
  ``basis``), ``step`` (recommendation, what-if), ``sources`` (which input and column each number came
  from), ``verdict`` (the headline sentence).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.breakeven.crossing import Crossing, measured_crossing
from perfmodel.breakeven.hoststall import host_stall_share
from perfmodel.breakeven.next_measurements import next_measurements
from perfmodel.breakeven.paired import paired_breakeven
from perfmodel.breakeven.solve import Breakeven, find_breakeven
from perfmodel.fitting.bootstrap import covering_ci
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.fitting.fitted import BasisFit, LinearFit, PrecisionFit
from perfmodel.fitting.lof import implausible
from perfmodel.inputs.hardware import hardware_warning
from perfmodel.inputs.load import FitInputs
from perfmodel.report.headline import answer, step_answer, verdict
from perfmodel.step.model import check_runs, memory_cap_tokens, step_models
from perfmodel.step.section import step_section
from perfmodel.step.whatifs import answer_what_ifs
from tracing.outputs import store
from tracing.outputs.errors import InputError

__all__ = [
    "SCHEMA_VERSION",
    "analyze",
    "entries_frame",
    "entry_stem",
    "implausible",
    "load_fits",
    "validate_fits",
]
SCHEMA_VERSION = 1
ATTENTION_MATTERS = 0.02  # share of a typical micro-batch's time above which the quadratic term "matters"


def _num(x: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to None, tuples to lists (recursively)."""
    if isinstance(x, dict):
        return {k: _num(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_num(v) for v in x]
    if isinstance(x, np.ndarray):
        return _num(x.tolist())
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    return x


def _line(fit: LinearFit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    line = fit.line()
    return {
        "intercept": line.intercept,
        "slope": line.slope,
        "intercept_ci": line.ci("intercept"),
        "slope_ci": line.ci("slope"),
        "r2": line.r2,
        "n_points": line.n_points,
        "cov": line.cov,
    }


def _attention(b: BasisFit, f: PrecisionFit) -> dict[str, Any] | None:
    d = f.design
    if not b.line.has("per_sq_token"):
        why = d.dropped.get("per_sq_token")
        return None if why is None or "not known" in why else {"per_sq_token_s": None, "note": why}
    c, (lo, hi) = b.line.coef("per_sq_token"), b.line.ci("per_sq_token")
    ref = d.seq_len_ref or 0.0
    typical = float(np.median(f.size_mean_tokens)) if f.size_mean_tokens else float(np.median(d.tokens))
    share = c * ref * typical / max(b.line2().intercept + b.line2().slope * typical, 1e-30)
    significant = lo > 0 or hi < 0
    matters = bool(significant and abs(share) > ATTENTION_MATTERS)
    note = (
        f"attention's quadratic cost is {share:.1%} of a typical micro-batch ({typical:,.0f} tokens, effective "
        f"sequence length {ref:,.0f})"
        + (
            "; it matters: the per-token cost is given without it"
            if matters
            else "; too small to matter here"
        )
        + ("" if significant else " (not significant)")
    )
    line2 = b.line2()
    return {
        "per_sq_token_s": c,
        "per_sq_token_ci": (lo, hi),
        "seq_len_ref_tokens": ref,
        "per_token_eff_s": line2.slope,
        "cov_eff": line2.cov,
        "share_of_typical": share,
        "matters": matters,
        "note": note,
    }


def _knee(b: BasisFit, f: PrecisionFit | None = None) -> dict[str, Any] | None:
    k = b.knee
    if k is None:
        return None
    out = {"kind": k.kind, **k.curve.as_dict(), "chosen": b.model == k.kind}
    if f is not None:  # a segment resting on fewer than two sizes: its intercept / slope is not measured
        out["sizes_below_knee"], out["sizes_above_knee"] = f.sizes_around(float(k.curve.knee))
    for key, side, field in (
        ("knee_ci", None, "knee"),
        ("intercept_ci", "left", "a1"),
        ("slope_ci", "left", "b1"),
        ("intercept_ci", "right", "a2"),
        ("slope_ci", "right", "b2"),
    ):
        est = float(getattr(k.curve, field))
        ci = covering_ci(np.asarray(getattr(k.boot, field), float), est) if k.boot is not None else None
        (out if side is None else out[side])[key] = ci
    out["lack_of_fit"] = asdict(b.knee_lack_of_fit) if b.knee_lack_of_fit else None
    if k.kind == "parts":
        out["gpu_busy_slope_s"] = k.anchor_slope_s
        out["lines"] = "left: host (launch-bound) line; right: GPU-bound wall (slope from GPU busy time)"
    else:
        out["lines"] = "left and right segments of wall time"
    return out


def _linearity_note(b: BasisFit) -> str:
    """What the data say of a line that is kept: it fits, there is no evidence against it, or nothing tested
    it (two sizes)."""
    if b.linearity == "untested":
        return (
            "linearity untested: too few sizes (or units) for a lack-of-fit test -- a line through two sizes "
            "always fits; a third size would test it"
        )
    return b.lack_of_fit.note if b.lack_of_fit is not None else ""


def basis_entry(b: BasisFit, f: PrecisionFit | None = None) -> dict[str, Any]:
    """The line, per-step cost, chosen model and knee of one basis (wall or GPU busy) of one precision."""
    line = b.line.line()
    fixed_ci, per_token_ci = line.ci("intercept"), line.ci("slope")
    ps = b.per_step()
    return {
        "implausible": list(b.implausible),
        "fixed_s": line.intercept,
        "per_token_s": line.slope,
        "fixed_ci": fixed_ci,
        "per_token_ci": per_token_ci,
        "r2": line.r2,
        "n_points": line.n_points,
        "n_units": b.line.n_units,
        "dof": b.line.dof,
        "cov": line.cov,
        "fixed_boot_ci": b.line.boot_ci("fixed"),
        "per_token_boot_ci": b.line.boot_ci("per_token"),
        "residual_sd_s": line.residual_sd,
        "per_step_s": ps[0] if ps else None,
        "per_step_ci": ps[1] if ps else None,
        "per_step_basis": ps[2] if ps else None,
        "model": b.model,
        "model_note": b.note or _linearity_note(b),
        "line_ok": b.line_ok,
        "linearity": b.linearity,
        "lack_of_fit": asdict(b.lack_of_fit) if b.lack_of_fit else None,
        "knee": _knee(b, f),
    }


GPU_BOUND_STALL_SHARE = 0.2  # a size whose mean host stall is below this share of its time is GPU-bound


def gpu_bound_sizes(f: PrecisionFit) -> int:
    """Measured sizes in the GPU-bound regime: above a chosen knee, and with host stall under 20 % of the
    time where a GPU trace says; a line without a trace: every size (one regime, which is not known)."""
    counts = [len(f.sizes)]
    if f.stall_size_mean_s and f.size_mean_s:
        share = np.asarray(f.stall_size_mean_s, float) / np.asarray(f.size_mean_s, float)
        counts.append(int(np.sum(share < GPU_BOUND_STALL_SHARE)))
    k = f.wall.knee
    if f.wall.model in ("knee", "parts") and k is not None:
        counts.append(f.sizes_around(float(k.curve.knee))[1])
    return min(counts)


def precision_entry(f: PrecisionFit) -> dict[str, Any]:
    """One ``fits[precision]`` object of fits.json (the wall basis at the top level, docs/contracts.md's fields)."""
    d = f.design
    per_step_reason = None
    if not any(f.wall.line.has(t) for t in ("per_step", "per_step_spread")):
        per_step_reason = (
            f"not identified: {d.dropped.get('per_step', '')}; {d.dropped.get('per_step_spread', '')}"
        )
    return {
        **basis_entry(f.wall, f),
        "gpu_bound_sizes": gpu_bound_sizes(f),
        "per_step_reason": per_step_reason,
        "attention": _attention(f.wall, f),
        "n_microbatches": f.n_microbatches,
        "bootstrap_unit": f.boot_unit,
        "sizes": list(f.sizes),
        "size_mean_s": list(f.size_mean_s),
        "size_mean_tokens": list(f.size_mean_tokens),
        "size_count": list(f.size_count),
        "holdout": f.holdout,
        "gpu_busy": basis_entry(f.busy, f) if f.busy is not None else None,
        "busy_size_mean_s": list(f.busy_size_mean_s) if f.busy_size_mean_s else None,
        "size_mean_curve_s": list(f.size_mean_curve_s) if f.size_mean_curve_s else None,
        "busy_size_mean_curve_s": list(f.busy_size_mean_curve_s) if f.busy_size_mean_curve_s else None,
        "host_stall": _line(f.stall),
        "stall_size_mean_s": list(f.stall_size_mean_s) if f.stall_size_mean_s else None,
        "memory": _line(f.memory),
        "outliers": list(f.outliers),
        "outlier_note": f.outlier_note,
    }


def breakeven_entry(be: Breakeven, crossing: Crossing | None) -> dict[str, Any]:
    out = {
        "basis": be.basis,
        "case": be.case,
        "tokens": be.tokens,
        "ci": list(be.ci),
        "ci_method": be.ci_method,
        "ci_reason": be.ci_reason,
        "extrapolated": be.extrapolated,
        "model_ok": be.model_ok,
        "model": be.model,
        "model_reason": be.model_reason,
        "crossing": list(crossing.tokens) if crossing and crossing.tokens else None,
        "crossing_detail": crossing.as_dict() if crossing else None,
    }
    extras = asdict(be)
    for k in ("basis", "case", "tokens", "ci", "ci_method", "ci_reason", "extrapolated", "model_ok", "model"):
        extras.pop(k)
    return {**out, **extras}


def _gpu_busy_reason(base: PrecisionFit, low: PrecisionFit) -> str | None:
    missing = [f.precision for f in (base, low) if f.busy is None]
    if not missing:
        return None
    return f"no GPU busy time for {', '.join(missing)} (needs a GPU trace: sweep with --trace on a GPU, or ingest)"


def _sources(mb: pd.DataFrame, base: PrecisionFit, low: PrecisionFit) -> dict[str, str | None]:
    """Which input (and column) each number of an entry came from."""
    rows = mb[
        mb["precision"].isin([base.precision, low.precision])
        & (mb["model"] == base.model)
        & (mb["phase"] == base.phase)
    ]
    where = ", ".join(sorted(rows["input"].astype(str).unique()))
    ps = low.wall.per_step() or base.wall.per_step()
    busy = base.busy is not None and low.busy is not None
    return {
        "wall": f"seconds of {where}",
        "gpu_busy": f"gpu_busy_seconds of {where}" if busy else None,
        "host_stall": f"host_stall_seconds of {where}"
        if low.stall is not None and base.stall is not None
        else None,
        "per_step": f"{ps[2]} ({where})" if ps else None,
        "attention": f"seq_lens of {where}" if low.wall.line.has("per_sq_token") else None,
        "crossing": "measured mean times per size, both precisions (model-free)",
        "memory": f"peak_mem_bytes of {where}" if low.memory is not None else None,
    }


def interleaved(mb: pd.DataFrame, base: PrecisionFit, low: PrecisionFit) -> bool:
    """Did both precisions run back to back, (size, repeat) by (size, repeat)? Only an ``mxperf sweep`` does;
    repeats of ingested traces or of a user's table are indices, not shared moments."""
    rows = mb[
        mb["precision"].isin([base.precision, low.precision])
        & (mb["model"] == base.model)
        & (mb["phase"] == base.phase)
    ]
    return bool(len(rows)) and bool((rows["source"].astype(str) == "sweep").all())


def _compare(base: PrecisionFit, low: PrecisionFit, mb: pd.DataFrame) -> dict[str, Any]:
    be = find_breakeven(base, low)
    pair = interleaved(mb, base, low)
    cross = measured_crossing(base, low, "wall", pair=pair)
    paired = paired_breakeven(base, low) if be.model_ok and pair else None
    share = host_stall_share(base, low)
    busy_be = busy_cross = None
    if base.busy is not None and low.busy is not None:
        busy_be = find_breakeven(base, low, basis="gpu_busy")
        busy_cross = measured_crossing(base, low, "gpu_busy", pair=pair)
    entry = {
        "model": base.model,
        "phase": base.phase,
        "baseline": base.precision,
        "precision": low.precision,
        "fits": {base.precision: precision_entry(base), low.precision: precision_entry(low)},
        "breakeven": {**breakeven_entry(be, cross), "paired": asdict(paired) if paired else None},
        "breakeven_gpu_busy": breakeven_entry(busy_be, busy_cross) if busy_be else None,
        "breakeven_gpu_busy_reason": _gpu_busy_reason(base, low),
        "host_stall_share_of_added_fixed": share.share,
        "host_stall": {
            "share_ci": list(share.ci),
            "ci_method": share.ci_method,
            "bootstrap_ci": share.bootstrap_ci,
            "d_stall_fixed_s": share.d_stall_fixed_s,
            "reason": share.reason,
            "basis": share.basis,
        },
        "sources": _sources(mb, base, low),
        "interleaved": pair,
    }
    entry["_parts"] = (be, cross, busy_be, share, paired)
    return entry


def _gate(entry: dict[str, Any], baseline: str, low: str) -> None:
    """Name a recommended precision only with a case and an interval that support it at that size: the
    step-level breakeven at the recommendation's global batch when the per-step costs differ significantly,
    else the micro-batch breakeven."""
    from perfmodel.step.recommend import gate_recommendation

    step = entry["step"]
    rec = step.get("recommendation") or {}
    be = entry["breakeven"]
    d_ci = step.get("per_step_difference_ci")
    n_rec = rec.get("global_batch_tokens")
    sb = next((x for x in step.get("step_breakeven") or [] if x["global_batch_tokens"] == n_rec), None)
    if d_ci and (d_ci[0] > 0 or d_ci[1] < 0) and sb is not None:
        case, ci, basis = sb["case"], sb.get("ci"), f"step-level breakeven at {n_rec:,} tokens per step"
    else:
        case, ci, basis = be["case"], be["ci"], "micro-batch breakeven"
    withheld = None
    if be.get("model") is None:
        withheld = f"n* withheld ({be.get('model_reason') or be.get('ci_reason')})"
    step["recommendation"] = gate_recommendation(rec, case, ci, basis, baseline, low, withheld)


def analyze(
    inputs: FitInputs,
    *,
    baseline: str = "bf16",
    min_tokens: int = 0,
    n_boot: int = 1000,
    seed: int = 0,
    global_tokens: int | None = None,
    mem_cap_bytes: float | None = None,
    knobs: Any = None,
    at: list[tuple[int, ...]] | None = None,
    phase_times: dict[tuple[str, str], float] | None = None,
    floors_setup: tuple[Any, Any] | None = None,
    placement: str | None = None,
) -> dict[str, Any]:
    """The fits.json document for validated inputs (see ``perfmodel.inputs.load.check_fittable``). ``at``: the
    user's (tokens per step, tokens per micro-batch[, generated tokens]) settings; ``phase_times``: (precision, phase) -> seconds
    per step (``--phase P:X=S``); ``placement``: ``--placement`` (None: from the inputs, else colocated); all
    for the whole-step model (:mod:`perfmodel.step.model`)."""
    from perfmodel.inputs.columns import FIT_COLUMNS, conform_microbatches
    from perfmodel.step.recommend import default_global_tokens

    mb = inputs.microbatches
    if list(mb.columns) != list(FIT_COLUMNS):
        mb = conform_microbatches(mb, "table", "table", inputs.notes)
    fits = fit_cost_model(mb, min_tokens=min_tokens, n_boot=n_boot, seed=seed)
    check_runs(inputs.runs, sorted({m for m, _, _ in fits}))
    n_global = int(global_tokens) if global_tokens else default_global_tokens(mb)
    entries = []
    for (model, phase), g in mb.groupby(["model", "phase"], sort=True):
        group = {p: f for (m, ph, p), f in fits.items() if m == model and ph == phase}
        for prec in sorted(p for p in group if p != baseline):
            entry = _compare(group[baseline], group[prec], mb)
            entry["emulated"] = {p: inputs.emulated[p] for p in (baseline, prec) if p in inputs.emulated}
            entry["step"] = step_section(
                group, baseline, prec, inputs, g, global_tokens, mem_cap_bytes, knobs, floors_setup, placement
            )
            _gate(entry, baseline, prec)
            parts = entry.pop("_parts")
            entry["answer"] = answer(entry, parts[0])
            entry["verdict"] = verdict(entry, *parts)
            entries.append(entry)
    steps = step_models(
        fits,
        baseline,
        inputs.runs,
        at=at or (),
        global_tokens=global_tokens,
        mem_cap_bytes=mem_cap_bytes,
        phase_times={**inputs.phase_times, **(phase_times or {})},
        other_phases=inputs.other_phases_s,
        microbatches=mb,
        seed=seed,
        n_boot=n_boot,
        placement=placement,
        separate_sampler=inputs.separate_sampler,
    )
    load = "; ".join(inputs.load_warnings)
    hardware = hardware_warning(inputs.fit_hardware, inputs.phase_hardware) if steps else None
    for sm in steps:
        pair = sm.pop("_steps")
        sm["what_ifs"] = answer_what_ifs(sm, *pair, floors_setup)
        caps = [c for c in (memory_cap_tokens(st, mem_cap_bytes)[0] for st in pair) if c is not None]
        sm["next_measurements"] = next_measurements(sm, *pair, min(caps) if caps else None)
        sm["emulated"] = {p: inputs.emulated[p] for p in (baseline, sm["precision"]) if p in inputs.emulated}
        sm["answer"] = step_answer(sm)
        if load:  # timings from a machine busier than its cores: said in the answer's first line
            sm["answer"][0] += f" Warning: {load}."
        if hardware:  # phase times from other (or unrecorded) hardware than the fits'
            sm["answer"][0] += f" Warning: {hardware}."
    if load:
        for entry in entries:
            entry["verdict"] += f" Warning: {load}."
    return _num(
        {
            "schema_version": SCHEMA_VERSION,
            "answer": [line for sm in steps for line in sm["answer"]],
            "models": entries,
            "baseline": baseline,
            "x_variable": "num_tokens (actual tokens per micro-batch; sizes labelled by tokens_per_microbatch)",
            "min_tokens": min_tokens,
            "global_batch_tokens": n_global,
            "bootstrap": {"resamples": n_boot, "seed": seed, "level": 0.95},
            "inputs": [asdict(s) for s in inputs.summaries],
            "notes": list(dict.fromkeys(inputs.notes + [n for st in steps for n in st["notes"]])),
            "step_model": steps,
            "load_warnings": list(inputs.load_warnings),
            "hardware_warning": hardware,
        }
    )


REQUIRED_ENTRY_KEYS = (
    "model",
    "phase",
    "baseline",
    "precision",
    "fits",
    "breakeven",
    "host_stall_share_of_added_fixed",
)


def validate_fits(doc: dict[str, Any], origin: str = "fits.json") -> dict[str, Any]:
    """Check the docs/contracts.md shape; InputError naming the first problem."""
    if int(doc.get("schema_version", 0)) != SCHEMA_VERSION:
        raise InputError(f"{origin}: schema_version {doc.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    if not isinstance(doc.get("models"), list):
        raise InputError(f"{origin}: no 'models' list")
    for i, e in enumerate(doc["models"]):
        missing = [k for k in REQUIRED_ENTRY_KEYS if k not in e]
        if missing:
            raise InputError(f"{origin}: models[{i}] lacks {', '.join(missing)}")
        for prec in (e["baseline"], e["precision"]):
            f = e["fits"].get(prec)
            if f is None or "fixed_s" not in f or "per_token_s" not in f:
                raise InputError(f"{origin}: models[{i}].fits.{prec} lacks fixed_s/per_token_s")
        for k in ("case", "tokens", "ci", "ci_method", "ci_reason"):
            if k not in e["breakeven"]:
                raise InputError(f"{origin}: models[{i}].breakeven lacks '{k}'")
    return doc


def load_fits(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a fits.json written by ``mxperf fit`` (a directory is taken to hold fits.json)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, store.FITS)
    return validate_fits(store.read_json(p), p)


def entry_stem(entry: dict[str, Any]) -> str:
    """A file-name-safe ``model_phase_precision`` stem for one entry (plot file names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{entry['model']}_{entry['phase']}_{entry['precision']}")


def entries_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per (model, phase, precision) comparison: the headline numbers, for tables."""
    rows = []
    for e in doc["models"]:
        be = e["breakeven"]
        gb = e.get("breakeven_gpu_busy") or {}
        rows.append(
            {
                "model": e["model"],
                "phase": e["phase"],
                "precision": e["precision"],
                "case": be["case"],
                "tokens": be["tokens"],
                "ci_lo": be["ci"][0],
                "ci_hi": be["ci"][1],
                "model_ok": be.get("model_ok"),
                "crossing": be.get("crossing"),
                "tokens_gpu_busy": gb.get("tokens"),
                "d_fixed_s": be.get("d_fixed_s"),
                "d_tok_s": be.get("d_tok_s"),
                "host_stall_share": e["host_stall_share_of_added_fixed"],
            }
        )
    return pd.DataFrame(rows)
