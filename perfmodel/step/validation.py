"""Predicted vs measured step time: the step model (:mod:`perfmodel.step.model`) against the steps of run folders.

For every run folder of the fitted model and every phase it timed (``<phase>_s`` in its ``metrics.parquet``),
the phase's term of the precision it ran in (generate and sync: the sampler's; the others: the learner's) is
evaluated **per step** at that step's own settings:

- a fitted phase (update): the micro-batches the step really ran (``update/microbatch`` ranges: padded
  tokens of each, so the packing and padding loss are the run's own) plus the fit's per-step cost; without
  ranges, ``num_microbatches`` equal micro-batches of ``update_tokens``; for another fitted phase,
  ``ceil(N / n)`` micro-batches of the run's ``tokens_per_microbatch``;
  plus, for the update, the optimizer step (:mod:`perfmodel.step.optimizer`): a median over the run folders'
  own steps, so that part of the update row is in-sample (the row's ``in_sample_part`` says so);
- a measured phase: its median over the run folders' steps; generate fitted on prompt and generated tokens
  (:mod:`perfmodel.step.generation`): at the step's own tokens. When the run compared is one of the folders
  it came from, the row is **in-sample**: shown, never counted in the error;
- a given phase (``--phase``, ``--other-phase``): the value given.

Per (run, phase) and for the whole step (the predicted phases combined by the comparison's placement,
:func:`perfmodel.step.overlap.combine`: their sum, or with a separate sampler the max of generation and the
learner's phases plus sync, per step and per replicate; against the run's ``step_s``, else its measured
phases combined the same way), the median over steps of the predicted and of the measured seconds, the error
``predicted / measured - 1`` and the 95 % band of the predicted median over the step model's replicates (the
fits' bootstrap and the medians' bootstrap; the runs' own step-to-step noise is not in it, so ``inside`` is a
strict test). ``median_abs_error_pct`` is the median of ``|error|`` over the out-of-sample rows (fitted
phases and whole steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from perfmodel.fitting.bootstrap import interval as _ci
from perfmodel.step.generation import run_step_tokens
from perfmodel.step.overlap import COLOCATED, combine

MISS_PCT = 10.0  # a whole-step error beyond this (or a measured median outside the band) is said as a miss


def _step_setting(run: Any, row: Any, phase: str) -> tuple[float, float, tuple[float, ...] | None] | None:
    """(N, n, packing) of one step of ``run`` for a fitted phase; None when the step does not say."""
    big_n = row.get("update_tokens")
    big_n = float(big_n) if big_n is not None and np.isfinite(big_n) else run.global_tokens
    n = run.tokens_per_microbatch
    pack = row.get("microbatch_tokens") if phase == "update" else None
    if pack:
        pack = tuple(float(t) for t in pack)
        return float(sum(pack)), float(n or max(pack)), pack
    k = row.get("num_microbatches")
    if phase == "update" and big_n and k is not None and np.isfinite(k) and k > 0:
        return float(big_n), float(n or big_n / k), tuple([float(big_n) / int(k)] * int(k))
    if big_n and n:
        return float(big_n), float(n), None
    return None


def _tokens(run: Any) -> dict[Any, tuple[float, float]]:
    """step -> (prompt + generated, generated) tokens of a source's steps (a step that several of its logs
    share is left out: its tokens are not one step's)."""
    t = run_step_tokens(run).drop_duplicates("step", keep=False)
    return {
        s: (float(p + g), float(g))
        for s, p, g in zip(t["step"], t["prompt_tokens"], t["generated_tokens"], strict=True)
    }


def _row(run: Any, phase: str, prec: str, kind: str, pred: list, meas: list, reps: list, b: int) -> dict:
    pm, mm = float(np.median(pred)), float(np.median(meas))
    band = _ci(np.median(np.stack(reps), axis=0)) if b and reps else None
    return {
        "run": run.path,
        "phase": phase,
        "precision": prec,
        "kind": kind,
        "steps": len(meas),
        "predicted_s": pm,
        "predicted_ci": band,
        "measured_s": mm,
        "error_pct": 100.0 * (pm / mm - 1.0) if mm > 0 else None,
        "inside": bool(band[0] <= mm <= band[1]) if band else None,
    }


def validate_runs(steps: Mapping[str, Any], runs: Sequence[Any], model: str) -> dict[str, Any] | None:
    """The predicted-vs-measured table of ``runs`` (see the module docstring); None without run folders of
    ``model`` whose precisions are both in ``steps`` (precision -> ``stepmodel.PrecisionStep``)."""
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for run in sorted(runs, key=lambda r: r.path):
        if (run.model or model) != model:
            continue
        if getattr(run, "fit_source", False):
            skipped.append(f"{run.path} (its micro-batches are in the fit: in-sample, not a validation)")
            continue
        precs = {run.learner, run.sampler}
        if not precs <= set(steps):
            skipped.append(
                f"{run.path} (ran {'/'.join(sorted(p or '?' for p in precs))}: not in this comparison)"
            )
            continue
        df = run.steps
        phases = [c[:-2] for c in df.columns if c.endswith("_s") and c != "step_s"]
        counts = [steps[p].replicate_count()[0] for p in precs]
        b = min(counts) if counts else 0
        placement = getattr(steps[run.learner], "placement", COLOCATED)
        per_step_pred: dict[int, dict[str, float]] = {}
        per_step_reps: dict[int, dict[str, np.ndarray]] = {}
        per_step_meas: dict[int, dict[str, float]] = {}
        covered: list[str] = []
        for phase in phases:
            prec = run.precision_of(phase)
            st = steps[prec]
            term = st.terms.get(phase)
            if term is None:
                continue
            covered.append(phase)
            pred, meas, reps = [], [], []
            toks = _tokens(run) if getattr(term, "scaled", False) else {}
            for i, row in df.iterrows():
                m = row.get(f"{phase}_s")
                if m is None or not np.isfinite(m):
                    continue
                gen = None
                if term.fit is not None:
                    setting = _step_setting(run, row, phase)
                    if setting is None:
                        continue
                    big_n, n, pack = setting
                elif toks:  # generation at the step's own prompt and generated tokens
                    if row.get("step") not in toks:
                        continue
                    big_n, gen = toks[row.get("step")]
                    n, pack = 1.0, None
                else:
                    big_n, n, pack = 1.0, 1.0, None
                p = term.point(big_n, n, pack, gen)
                r = st.phase_replicates(phase, big_n, n, b, pack, gen) if b else np.zeros(0)
                pred.append(p)
                meas.append(float(m))
                reps.append(r)
                per_step_pred.setdefault(i, {})[phase] = p
                per_step_reps.setdefault(i, {})[phase] = r
                per_step_meas.setdefault(i, {})[phase] = float(m)
            if not pred:
                continue
            kind = term.kind
            if kind in ("measured", "tokens") and run.path in getattr(term, "runs", ()):
                kind = "in-sample"
            rows.append(_row(run, phase, prec, kind, pred, meas, reps, b))
            outside = getattr(term, "outside", None)
            if outside is not None and outside.seconds is not None and run.path in outside.runs:
                rows[-1]["in_sample_part"] = (
                    f"optimizer step {1e3 * outside.seconds:.1f} ms (this run's median)"
                )
        if not covered:
            continue
        # a step is compared whole only where every phase of the step model was predicted at its settings
        full = [i for i in per_step_pred if set(per_step_pred[i]) >= set(covered)]
        if per_step_pred and not full:
            unknown = sorted(set(covered) - set.union(*(set(v) for v in per_step_pred.values())))
            skipped.append(
                f"{run.path} (whole step: {', '.join(unknown) or 'a phase'} cannot be predicted at its steps' "
                "settings: micro-batch sizes or tokens not recorded)"
            )
        whole = df["step_s"] if "step_s" in df.columns else None
        meas = [
            float(whole[i])
            if whole is not None and np.isfinite(whole[i])
            else float(combine(per_step_meas[i], placement))
            for i in full
        ]
        if full:
            step_prec = run.learner if run.learner == run.sampler else f"{run.learner}/{run.sampler}"
            pred = [float(combine(per_step_pred[i], placement)) for i in full]
            reps = [np.zeros(b) + combine(per_step_reps[i], placement) for i in full]
            row = _row(run, "step", step_prec, "step", pred, meas, reps, b)
            row["not_in_step_model"] = [ph for ph in phases if ph not in covered]
            rows.append(row)
    if not rows:
        return None
    counted = [
        abs(r["error_pct"]) for r in rows if r["kind"] in ("fitted", "step") and r["error_pct"] is not None
    ]
    misses = [
        r
        for r in rows
        if r["kind"] == "step"
        and r["error_pct"] is not None
        and (abs(r["error_pct"]) > MISS_PCT or r["inside"] is False)
    ]
    return {
        "rows": rows,
        "median_abs_error_pct": float(np.median(counted)) if counted else None,
        "counted_rows": len(counted),
        "misses": [
            {"run": r["run"], "precision": r["precision"], "error_pct": r["error_pct"], "inside": r["inside"]}
            for r in misses
        ],
        "skipped": skipped,
        "note": (
            "per step at the step's own micro-batches (update: the padded tokens of each micro-batch the run "
            "ran, plus the optimizer step measured in the run folders: in-sample where it is the same run's); "
            "medians over steps; error = predicted / measured - 1; the band is the prediction's (fits' "
            "and medians' bootstrap), not the runs' step-to-step noise; in-sample rows (a phase measured in "
            "the same run folders) are not counted in the median absolute error"
        ),
    }


def validation_words(v: dict[str, Any] | None) -> str | None:
    """One sentence for the answer: how far the predicted whole step is from the runs' measured steps."""
    if not v or not v.get("rows"):
        return None
    steps = [r for r in v["rows"] if r["kind"] == "step" and r["error_pct"] is not None]
    if not steps:
        return None
    each = ", ".join(f"{r['precision']} {r['error_pct']:+.0f} %" for r in steps)
    mae = v.get("median_abs_error_pct")
    mae_s = f"; median absolute error {mae:.0f} % over {v['counted_rows']} rows" if mae is not None else ""
    if v.get("misses"):
        return (
            f"Validation: the prediction misses the run folders' measured steps by {each}{mae_s}: the step "
            "times above are not confirmed by these runs (see the predicted-vs-measured table)."
        )
    return f"Validation: predicted vs the run folders' measured steps: {each}{mae_s}."


def _kind(r: dict[str, Any]) -> str:
    return f"{r['kind']}, {r['in_sample_part']} in-sample" if r.get("in_sample_part") else r["kind"]


def validation_table(v: dict[str, Any] | None) -> list[str]:
    """Markdown rows of the predicted-vs-measured table (empty without one)."""
    if not v or not v.get("rows"):
        return []
    out = [
        "| run | phase | precision | source | steps | predicted (s) | 95 % band | measured (s) | error | inside |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in v["rows"]:
        band = f"[{r['predicted_ci'][0]:.4g}, {r['predicted_ci'][1]:.4g}]" if r["predicted_ci"] else "-"
        err = f"{r['error_pct']:+.1f} %" if r["error_pct"] is not None else "-"
        inside = {True: "yes", False: "no", None: "-"}[r["inside"]]
        out.append(
            f"| `{r['run']}` | {r['phase']} | {r['precision']} | {_kind(r)} | {r['steps']} | "
            f"{r['predicted_s']:.4g} | {band} | {r['measured_s']:.4g} | {err} | {inside} |"
        )
    return out


def validation_lines(v: dict[str, Any] | None) -> list[str]:
    """Plain-text rows of the table for stdout: one line per (run, phase) and whole step."""
    if not v or not v.get("rows"):
        return []
    mae = v.get("median_abs_error_pct")
    out = [
        "predicted vs measured (median over steps; "
        + (
            f"median absolute error {mae:.1f} % over {v['counted_rows']} rows"
            if mae is not None
            else "no row counted"
        )
        + "; in-sample rows not counted):"
    ]
    for r in v["rows"]:
        band = f" [{r['predicted_ci'][0]:.3g}, {r['predicted_ci'][1]:.3g}]" if r["predicted_ci"] else ""
        err = f"{r['error_pct']:+.1f} %" if r["error_pct"] is not None else "-"
        out.append(
            f"  {r['run']} {r['phase']:>8} {r['precision']:>6} ({_kind(r)}): predicted {r['predicted_s']:.3g} s"
            f"{band}, measured {r['measured_s']:.3g} s, {err}"
        )
    return out
