"""The ``step`` section of a fits.json entry: recommendation, step-level breakeven per global batch, what-if.

Each precision's step cost comes from the model the data chose for it (a line, or the knee curve) plus its
fitted per-step cost and the other phases; a precision without a model that fits withholds the
recommendation (:mod:`perfmodel.step.recommend`). The what-if knobs act on the term that holds the cost
(:mod:`perfmodel.step.costs`).

The other phases are added as a sum only where the step's placement is colocated (the placement of the
whole-step comparison, :func:`perfmodel.step.model.comparison_placement`). With a separate sampler the step
is max(generate, learner) + sync (:mod:`perfmodel.step.overlap`), which a sum of constants cannot carry: the
section leaves the other phases out (the fitted phase alone) and its ``note`` says so; ``step_model[]`` has
the whole step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.fitting.bootstrap import percentile_ci
from perfmodel.fitting.fitted import BasisFit, PrecisionFit
from perfmodel.fitting.model import LEVEL, t_quantile
from perfmodel.inputs.load import FitInputs
from perfmodel.kernels.bounds import cast_floor
from perfmodel.step.costs import StepCost, WhatIf, step_breakeven, step_costs, weight_quant_seconds
from perfmodel.step.model import comparison_placement, other_phase_seconds
from perfmodel.step.overlap import SEPARATE, Placement
from perfmodel.step.recommend import (
    NO_GLOBAL_BATCH,
    default_global_tokens,
    global_batches,
    recommend,
    step_breakeven_interval,
)


@dataclass(frozen=True)
class StepLine:
    """What ``perfmodel.step.costs`` reads of one precision: fixed (the curve's value at n -> 0 for a knee model),
    per token (its GPU-bound slope), the fitted per-step cost and whether it exceeds the baseline's."""

    precision: str
    fixed_s: float
    per_token_s: float
    per_step_s: float = 0.0
    per_step_significant: bool = False


def per_step_difference(
    base: BasisFit, low: BasisFit, level: float = LEVEL
) -> tuple[float, tuple[float, float] | None]:
    """Low minus baseline per-step cost and its interval (bootstrap for knee models, t otherwise)."""
    pb, pl = base.per_step(), low.per_step()
    est = (pl[0] if pl else 0.0) - (pb[0] if pb else 0.0)
    if not (pb or pl):
        return 0.0, None
    if base.model in ("knee", "parts") or low.model in ("knee", "parts"):
        bb, bl = base.per_step_boot(), low.per_step_boot()
        n = min(len(bb), len(bl))
        return est, (percentile_ci(bl[:n] - bb[:n], level) if n else None)
    var = 0.0
    dof = np.inf
    for f in (base, low):
        terms = {t: 1.0 for t in ("per_step", "per_step_spread") if f.line.has(t)}
        if terms:
            var += f.line.contrast(terms)[1]
            dof = min(dof, f.line.dof)
    half = t_quantile(level, dof) * np.sqrt(var)
    return est, ((est - half, est + half) if np.isfinite(half) else None)


def _line(f: PrecisionFit, base: PrecisionFit) -> StepLine:
    c = f.wall.curve()
    _, ci = per_step_difference(base.wall, f.wall)
    sig = bool(ci is not None and ci[0] > 0) if f is not base else False
    return StepLine(f.precision, float(c.a1), float(c.b2), f.per_step_s, sig)


def _feasible(n: float | None, global_tokens: int) -> float | None:
    """A step-level crossing is a micro-batch size only when it is at most the global batch."""
    return n if n is not None and n <= global_tokens else None


def _no_global_batch(mem_cap: float | None) -> dict[str, Any]:
    return {
        "global_batch_tokens": None,
        "mem_cap_bytes": mem_cap,
        "precision": None,
        "tokens_per_microbatch": None,
        "step_seconds": None,
        "per_precision": {},
        "reason": NO_GLOBAL_BATCH,
    }


def _cost_entry(c: StepCost) -> dict[str, Any]:
    return {
        "precision": c.precision,
        "per_microbatch_s": c.per_microbatch_s,
        "per_token_s": c.per_token_s,
        "per_step_s": c.per_step_s,
        "moved_s": c.moved_s,
        "curve": c.as_curve().as_dict() if c.curve is not None else None,
    }


def _other_phases(
    placement: Placement, model: str, precisions: list[str], inputs: FitInputs, phase: str
) -> tuple[dict[str, dict[str, float]], dict[str, float], str | None]:
    """The phases added to the fitted one (each precision's own, the shared ``--other-phase``) and a note:
    all of them when colocated, none with a separate sampler (they do not add up as a sum)."""
    if placement.name != SEPARATE:
        own = other_phase_seconds(model, precisions, inputs.runs, {}, inputs.phase_times, phase)
        return own, dict(inputs.other_phases_s), None
    note = (
        f"separate sampler ({placement.source}): the step is max(generate, learner) + sync, not a sum, so "
        f"the other phases are left out here: this section is {phase} alone; step_model[] has the whole step"
    )
    return {p: {} for p in precisions}, {}, note


def step_section(
    group: dict[str, PrecisionFit],
    baseline: str,
    low: str,
    inputs: FitInputs,
    mb: pd.DataFrame,
    global_tokens: int | None,
    mem_cap: float | None,
    knobs: WhatIf | None,
    floors_setup: tuple[Any, Any] | None = None,
    placement: str | None = None,
) -> dict[str, Any]:
    """The section for one fitted phase and low precision; ``placement``: ``--placement`` (None: from the
    inputs, as the whole-step comparison decides it)."""
    knobs = knobs or WhatIf()
    base = group[baseline]
    n_global = int(global_tokens) if global_tokens else default_global_tokens(mb)
    sizes = sorted({s for f in group.values() for s in f.sizes})
    memory = {p: f.memory.line() if f.memory is not None else None for p, f in group.items()}
    lines = {p: _line(f, base) for p, f in group.items()}
    curves = {p: f.wall.curve() for p, f in group.items() if f.wall.model in ("knee", "parts")}
    withheld = {p: f.wall.note for p, f in group.items() if f.wall.model is None}
    model, phase = base.model, base.phase
    chosen, _ = comparison_placement(
        inputs.runs, model, [model], (baseline, low), placement, inputs.separate_sampler
    )
    own, shared, note = _other_phases(chosen, model, list(group), inputs, phase)
    costs = step_costs(lines, baseline, shared, curves=curves, other_by_precision=own)
    d_step, d_step_ci = per_step_difference(base.wall, group[low].wall)
    batches = sorted(set(global_batches(mb)) | ({n_global} if n_global else set()))
    section: dict[str, Any] = {
        "placement": chosen.as_dict(),
        "note": note,
        "other_phases_s": shared,  # the same for every precision (--other-phase)
        "other_phases_by_precision_s": own,
        "recommendation": (
            recommend(costs, memory, n_global, sizes, mem_cap, withheld)
            if n_global or withheld  # a withheld model is said first: it holds at every global batch
            else _no_global_batch(mem_cap)
        ),
        "memory_per_token_bytes": {p: (m.slope if m else None) for p, m in memory.items()},
        "per_step_difference_s": d_step,
        "per_step_difference_ci": d_step_ci,
        "step_breakeven": (
            [
                step_breakeven_interval(base.wall, group[low].wall, costs[baseline], costs[low], n)
                for n in batches
            ]
            if not withheld
            else None
        ),
        "models": {p: (f.wall.model or "none fits") for p, f in group.items()},
    }
    if knobs.active:
        wq, sources = {}, {}
        for p, line in lines.items():
            if p != baseline:
                floor, floor_src = cast_floor(floors_setup, phase, baseline, p)
                wq[p], sources[p] = weight_quant_seconds(
                    lines[baseline], line, knobs, inputs.kernels, inputs.kernel_microbatches, floor, floor_src
                )
        adj = step_costs(lines, baseline, shared, knobs, wq, curves, own)
        section["what_if"] = {
            "knobs": asdict(knobs),
            "weight_quant_s": wq if knobs.weight_quant == "per_step" else None,
            "weight_quant_source": sources if knobs.weight_quant == "per_step" else None,
            "step_breakeven_tokens": {  # null: no crossing at a micro-batch size this global batch allows
                p: (_feasible(step_breakeven(adj[baseline], c, n_global), n_global) if n_global else None)
                for p, c in adj.items()
                if p != baseline
            },
            "recommendation": (
                recommend(adj, memory, n_global, sizes, mem_cap, withheld)
                if n_global or withheld
                else _no_global_batch(mem_cap)
            ),
            "costs": {p: _cost_entry(c) for p, c in adj.items()},
        }
    return section
