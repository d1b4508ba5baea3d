"""The recommendation for a global batch: fastest (precision, micro-batch size) under a memory cap, and the
step-level breakeven per global batch with its interval.

The recommendation uses each precision's chosen model (a line, or the knee curve); when a precision has no
model that fits (or implausible coefficients), it is withheld with the reason -- the same gate as the
micro-batch n*. The step-level breakeven for a global batch ``N`` solves ``step_low(N, n) = step_base(N, n)``,
``(N / n) * (mb_low(n) - mb_base(n)) + d_per_step = 0``: a per-step cost moves the micro-batch n* by
``d_per_step / N`` per token. Its interval: the same root on every bootstrap replicate (curves and per-step
costs drawn together).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from perfmodel.breakeven.curves import crossing_roots, ends, pick_root, replicate_roots
from perfmodel.breakeven.solve import _sign, classify_case
from perfmodel.fitting.bootstrap import percentile_ci
from perfmodel.fitting.fitted import BasisFit
from perfmodel.fitting.model import LEVEL, LineFit
from perfmodel.step.costs import StepCost, step_breakeven


def max_tokens_under_cap(memory: LineFit | None, cap_bytes: float | None) -> float | None:
    """Largest n with predicted peak memory <= cap (None: no cap, no memory data, or memory not growing)."""
    if cap_bytes is None or memory is None or memory.slope <= 0:
        return None
    return float((cap_bytes - memory.intercept) / memory.slope)


def global_batches(mb: pd.DataFrame) -> list[int]:
    """The global batch sizes (tokens per step) the data were measured at: ``global_tokens`` when recorded,
    the tokens of a traced step; none when the data do not say (never a guess)."""
    if "global_tokens" in mb.columns and mb["global_tokens"].notna().any():
        return sorted({int(v) for v in pd.to_numeric(mb["global_tokens"], errors="coerce").dropna()})
    n = default_global_tokens(mb)
    return [n] if n is not None else []


NO_GLOBAL_BATCH = (
    "no global batch known: the inputs record no global_tokens and hold no traced steps; pass "
    "--global-batch N or --at N,n (a sweep's steps are (size, repeat) cells, not your global batch)"
)


def default_global_tokens(mb: pd.DataFrame) -> int | None:
    """Tokens per learner step in the data: the median ``global_tokens`` when recorded, else the median over
    traced steps (micro-batches read from a trace) of their summed ``num_tokens``; None otherwise -- a
    sweep's step is one (size, repeat) cell, not a global batch, and none is invented."""
    if "global_tokens" in mb.columns and mb["global_tokens"].notna().any():
        return int(pd.to_numeric(mb["global_tokens"], errors="coerce").median())
    traced = (
        mb[mb["source"].astype(str).isin(("trace", "range", "detected"))] if "source" in mb.columns else mb
    )
    if traced.empty or ((traced["step"] == 0).all() and (traced["microbatch"] == 0).all()):
        return None
    mb = traced
    keys = ["model", "phase", "precision", *(c for c in ("input", "trace", "rank") if c in mb.columns)]
    keys += ["repeat", "step"]
    first = mb.groupby(keys, sort=False, dropna=False)
    spans_sizes = (first["tokens_per_microbatch"].nunique() > 1).any()
    if not (spans_sizes and not first["microbatch"].apply(lambda m: m.duplicated().any()).any()):
        keys.insert(3, "tokens_per_microbatch")  # a step holds one size (or step ids repeat across sizes)
    per_step = mb.groupby(keys, sort=False, dropna=False)["num_tokens"].sum()
    return int(per_step.median())


def recommend(
    costs: Mapping[str, StepCost],
    memory: Mapping[str, LineFit | None],
    global_tokens: float | None,
    sizes: list[int],
    cap_bytes: float | None = None,
    withheld: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """Fastest (precision, micro-batch size) for ``global_tokens`` under the memory cap.

    Candidates: the measured sizes up to ``global_tokens`` and the memory cap, plus the largest size under
    the cap when it lies inside the measured range. A size above the largest measured one is never
    recommended; when the model predicts one (up to the limit) faster, it is given as ``extrapolated_best``,
    marked extrapolated.
    ``withheld``: precision -> why its model cannot be used (no model fits, implausible coefficients); then
    no recommendation is made, and ``reason`` says why.
    """
    if withheld or not global_tokens:
        return {
            "global_batch_tokens": int(global_tokens) if global_tokens else None,
            "mem_cap_bytes": cap_bytes,
            "precision": None,
            "tokens_per_microbatch": None,
            "step_seconds": None,
            "per_precision": {},
            "reason": "withheld: " + _by_reason(withheld) if withheld else NO_GLOBAL_BATCH,
        }
    per_precision = {}
    for prec, cost in costs.items():
        n_cap = max_tokens_under_cap(memory.get(prec), cap_bytes)
        limit = min(global_tokens, n_cap) if n_cap is not None else global_tokens
        cap_note = (
            "no peak_mem_bytes measured: --mem-cap-bytes not applied"
            if cap_bytes is not None and memory.get(prec) is None
            else None
        )
        top = float(max(sizes))
        cands = {float(s) for s in sizes if s <= limit}
        if np.floor(limit) <= top:
            cands.add(float(np.floor(limit)))
        cands = {c for c in cands if c >= 1}
        if not cands:
            per_precision[prec] = {
                "tokens_per_microbatch": None,
                "step_seconds": None,
                "reason": f"memory cap allows {n_cap:.0f} tokens per micro-batch",
            }
            continue
        best = min(cands, key=lambda n: float(cost.seconds(global_tokens, n)))
        per_precision[prec] = {
            "tokens_per_microbatch": int(best),
            "step_seconds": float(cost.seconds(global_tokens, best)),
            "memory_limit_tokens": n_cap,
            "memory_note": cap_note,
            "extrapolated": False,
        }
        if limit > top:  # beyond the measured sizes: said, never chosen
            grid = np.unique(np.concatenate([np.geomspace(top, limit, 24), [np.floor(limit)]]))
            ext = float(min(grid, key=lambda n: float(cost.seconds(global_tokens, n))))
            if float(cost.seconds(global_tokens, ext)) < 0.99 * per_precision[prec]["step_seconds"]:
                per_precision[prec]["extrapolated_best"] = {
                    "tokens_per_microbatch": int(ext),
                    "step_seconds": float(cost.seconds(global_tokens, ext)),
                    "extrapolated": True,
                }
    ok = {p: v for p, v in per_precision.items() if v["step_seconds"] is not None}
    if not ok:
        return {
            "precision": None,
            "tokens_per_microbatch": None,
            "per_precision": per_precision,
            "reason": "no precision fits under the memory cap",
        }
    best_prec = min(ok, key=lambda p: ok[p]["step_seconds"])
    return {
        "global_batch_tokens": int(global_tokens),
        "mem_cap_bytes": cap_bytes,
        "precision": best_prec,
        "tokens_per_microbatch": ok[best_prec]["tokens_per_microbatch"],
        "step_seconds": ok[best_prec]["step_seconds"],
        "per_precision": per_precision,
    }


def step_breakeven_interval(
    base: BasisFit,
    low: BasisFit,
    base_cost: StepCost,
    low_cost: StepCost,
    global_tokens: float,
    level: float = LEVEL,
) -> dict[str, object]:
    """Step-level breakeven for one global batch ``N``: the case (the contract's table on the step-time
    difference, per-step costs included: ``d_tok' = d_tok - d_per_step / N``), ``tokens`` (only for
    ``faster_above`` / ``faster_below`` and only when the crossing is a possible micro-batch size, n <= N),
    ``tokens_estimate`` (the crossing even when it is not), the bootstrap interval of the same root (null
    ends where unbounded; None without replicates), ``within_global_batch`` (``faster`` | ``slower`` |
    None: low at every micro-batch size up to N, when the crossing lies above N) and ``reason``."""
    n_est = step_breakeven(base_cost, low_cost, global_tokens)
    out: dict[str, object] = {
        "global_batch_tokens": int(global_tokens),
        "case": "undetermined",
        "tokens": None,
        "tokens_estimate": n_est,
        "ci": None,
        "within_global_batch": None,
        "reason": None,
    }
    if min(base.line.n_units, low.line.n_units) < 2:
        out["reason"] = "one independent unit (step) per precision: nothing to resample, no interval"
        return out
    if "untested" in (base.linearity, low.linearity):
        out["reason"] = (
            "linearity untested (too few sizes): the step-level crossing rests on an untested line"
        )
        return out
    bb, bl = base.boot_curve(), low.boot_curve()
    if bb is None or bl is None:
        out["reason"] = "no bootstrap replicates (--bootstrap 0): the step-level case has no interval"
        return out
    dp = low.per_step_boot() - base.per_step_boot()
    shifted = bl.shifted(dp / global_tokens)
    d0, dtok = ends(shifted, bb)
    case = classify_case(_sign(percentile_ci(dtok, level)), _sign(percentile_ci(d0, level)))
    out["case"] = case
    if case not in ("faster_above", "faster_below"):
        out["reason"] = f"case {case} at this global batch (per-step costs included)"
        return out
    d_step = low_cost.per_step_s - base_cost.per_step_s
    roots, slopes = crossing_roots(low_cost.as_curve().shifted(d_step / global_tokens), base_cost.as_curve())
    root = float(pick_root(roots, slopes, case)[0])
    n_est = root if np.isfinite(root) and root >= 1 else None
    out["tokens_estimate"] = n_est
    r = replicate_roots(shifted, bb, case)
    lo, hi = percentile_ci(r, level)
    out["ci"] = [float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None]
    if n_est is None:
        out["reason"] = "the fitted step times do not cross"
    elif n_est > global_tokens:  # a micro-batch holds at most the whole global batch
        side = "slower" if case == "faster_above" else "faster"
        out["within_global_batch"] = side
        out["reason"] = (
            f"the step times cross at {n_est:,.0f} tokens per micro-batch, above the global batch "
            f"({global_tokens:,.0f}): the low precision is {side} at every micro-batch size of this global batch"
        )
    else:
        out["tokens"] = n_est
    return out


def gate_recommendation(
    rec: dict[str, object],
    case: str,
    ci: tuple[float | None, float | None] | list | None,
    basis: str,
    baseline: str,
    low: str,
    withheld_reason: str | None = None,
) -> dict[str, object]:
    """The recommendation with its case and interval, or withheld with the reason: a precision is named only
    when the breakeven says it is faster at the recommended size at 95 % -- never for ``indistinguishable``
    / ``undetermined`` / a withheld n*, nor at a size inside the breakeven's interval."""
    lo, hi = [*list(ci or []), None, None][:2]
    out = {**rec, "case": case, "breakeven_ci": [lo, hi], "breakeven_basis": basis}
    prec, size = rec.get("precision"), rec.get("tokens_per_microbatch")
    if prec is None or size is None:
        return out
    why = None
    if withheld_reason:
        why = withheld_reason
    elif case in ("indistinguishable", "undetermined"):
        why = f"case {case}: the data do not say which precision is faster"
    elif case == "always_faster" and prec != low:
        why = f"case always_faster says {low}, the step times say {prec}"
    elif case == "never_faster" and prec != baseline:
        why = f"case never_faster says {baseline}, the step times say {prec}"
    elif case in ("faster_above", "faster_below"):
        low_side = (
            (hi is not None and size > hi) if case == "faster_above" else (lo is not None and size < lo)
        )
        base_side = (
            (lo is not None and size < lo) if case == "faster_above" else (hi is not None and size > hi)
        )
        confident = low_side if prec == low else base_side
        if not confident:
            why = (
                f"at {size:,} tokens per micro-batch {prec} is not significantly faster: the breakeven's 95 % "
                f"interval ({case}, {_bound(lo)} to {_bound(hi)} tokens) does not exclude that size"
            )
    if why is None:
        return out
    return {**out, "precision": None, "tokens_per_microbatch": None, "step_seconds": None, "reason": why}


def _by_reason(why: Mapping[str, str]) -> str:
    """'a and b: reason' for precisions that share a reason, '; ' between reasons."""
    groups: dict[str, list[str]] = {}
    for p, r in why.items():
        groups.setdefault(r, []).append(p)
    return "; ".join(f"{' and '.join(ps)}: {r}" for r, ps in groups.items())


def _bound(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:,.0f}"
