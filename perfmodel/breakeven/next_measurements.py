"""Next measurements: which micro-batch sizes (and how many repeats) would narrow the step answer most.

Printed when the answer is ``indistinguishable`` (the gain's interval at the answer's setting holds zero, or
no whole-step breakeven and not significant everywhere) or the whole-step breakeven's interval is wide (an
open end, or wider than half its value). Computed from each fit's own design (:mod:`perfmodel.fitting.design`):
per (precision, phase) its units (steps) with their mean tokens and micro-batch count; OLS on micro-batches
is WLS on unit means weighted by their micro-batch count, so a (fixed, per-token) line's covariance is the
sandwich ``(X'WX)^-1 X'W S W X (X'WX)^-1`` with ``S_u = (cv * mb(n_u))^2`` (``cv``: the units' relative
residual spread; timing noise scales with the time). Adding ``k`` units at size ``s`` (one new repeat: a step
of each precision at ``s``, every fitted phase) appends rows; the target's variance follows from the
gradient of

- the whole-step breakeven ``n* = N A / D`` (``A`` = the added fixed cost summed over the micro-batched
  phases, ``D = N x saving per token - the per-step and other phases' difference``), or
- the step-time difference at the answer's setting (``k (a_low - a_base) + N (b_low - b_base)`` per phase).

The expected width is today's interval width times ``sqrt(var_new / var_now)`` (both from this model, so its
scale cancels). Candidates: the measured sizes and one step beyond each end (half the smallest, twice the
largest, at most ``N`` and the memory cap). A knee model is approximated by its straight line here. With a
separate sampler each precision's gradient is scaled by how much of a change of its learner's phases reaches
the step there (1 where the learner is the longer side, 0 where generation is, 1/2 at a tie).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

WIDE = 0.5  # a breakeven interval wider than this share of its value asks for more measurements


def _trigger(sm: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """('breakeven' | 'difference', why) or (None, None) when the answer is narrow enough."""
    be = sm.get("breakeven") or {}
    settings = sm.get("settings") or []
    s = settings[0] if settings else (sm.get("recommendation") or {}).get("comparison")
    if be.get("tokens") is not None:
        ci = be.get("ci") or [None, None]
        t = float(be["tokens"])
        if ci[0] is None or ci[1] is None:
            return "breakeven", f"the breakeven's 95 % interval is open ({_tok(ci[0])} to {_tok(ci[1])})"
        if ci[1] - ci[0] > WIDE * t:
            return "breakeven", (
                f"the breakeven's 95 % interval ({ci[0]:,.0f} to {ci[1]:,.0f}) is {100 * (ci[1] - ci[0]) / t:.0f} % "
                "of its value"
            )
    g = (s or {}).get("gain_ci")
    if g is not None and g[0] <= 0 <= g[1]:
        return "difference", "indistinguishable: the gain's 95 % interval at the answer's setting holds zero"
    if be.get("tokens") is None and be.get("significant_everywhere") is False:
        return "difference", "indistinguishable: no breakeven and not significant at every size"
    return None, None


def _tok(x: float | None) -> str:
    return "open" if x is None else f"{x:,.0f}"


class _Line:
    """One (precision, phase) fit's units as weighted rows of [1, n]."""

    def __init__(self, fit: Any) -> None:
        d = fit.design
        line = fit.wall.line
        ok = np.isfinite(line.unit_resid) & np.isfinite(line.unit_fitted) & (line.unit_fitted > 0)
        self.n = np.asarray(d.unit_tokens, float)[ok]
        self.m = np.bincount(d.row_unit, minlength=d.n_units).astype(float)[ok]
        r = line.unit_resid[ok] / line.unit_fitted[ok]
        g, p = len(r), 2
        self.cv2 = float(np.sum(r**2) / max(g - p, 1))
        c = fit.wall.curve()
        self.a, self.b = float(np.atleast_1d(c.a1)[0]), float(np.atleast_1d(c.b2)[0])
        self.m_new = float(np.median(self.m)) if len(self.m) else 1.0

    def cov(self, extra: Mapping[float, int]) -> np.ndarray:
        n = np.concatenate([self.n, [s for s, k in extra.items() for _ in range(k)]])
        m = np.concatenate([self.m, [self.m_new for s, k in extra.items() for _ in range(k)]])
        scale = float(np.median(self.n)) or 1.0
        x = np.stack([np.ones_like(n), n / scale], axis=1)  # per-token scaled: a well-conditioned 2 x 2
        mb = np.maximum(self.a + self.b * n, 1e-12)
        s2 = self.cv2 * mb**2
        bread = np.linalg.pinv(x.T @ (x * m[:, None]))
        meat = x.T @ (x * (m**2 * s2)[:, None])
        v = bread @ meat @ bread
        t = np.diag([1.0, 1.0 / scale])
        return t @ v @ t


def next_measurements(
    sm: Mapping[str, Any], base: Any, low: Any, cap_tokens: float | None = None
) -> dict[str, Any]:
    """``step_model[].next_measurements``: whether more measurements are needed, and the sizes and repeats
    that narrow the answer most (expected interval widths), or why none can be said."""
    target, why = _trigger(sm)
    out: dict[str, Any] = {"needed": target is not None, "why": why, "target": target}
    if target is None:
        return out
    phases = [ph for ph, t in low.terms.items() if t.fit is not None and base.terms.get(ph) is not None]
    if not phases:
        out["reason"] = "no micro-batched phase is fitted for both precisions: measure repeats of the runs"
        return out
    lines = {(p.precision, ph): _Line(p.terms[ph].fit) for p in (base, low) for ph in phases}
    be = sm.get("breakeven") or {}
    settings = sm.get("settings") or []
    s = settings[0] if settings else (sm.get("recommendation") or {}).get("comparison") or {}
    big_n = float(be.get("global_tokens") or s.get("global_tokens") or 0)
    if not big_n:
        out["reason"] = "no global batch known: no target to narrow"
        return out
    sign = {base.precision: -1.0, low.precision: 1.0}
    if target == "breakeven":
        n_star = float(be["tokens"])
        d_a = sum(lines[(low.precision, ph)].a - lines[(base.precision, ph)].a for ph in phases)
        d_now = big_n * d_a / n_star  # D = N A / n*
        grad = {k: sign[k[0]] * np.array([big_n / d_now, n_star * big_n / d_now]) for k in lines}
        ci = be.get("ci") or [None, None]
        width_now = (ci[1] - ci[0]) if None not in ci else None
        what = f"the breakeven at {big_n:,.0f} tokens per step ({n_star:,.0f} tokens per micro-batch)"
    else:
        n = float(s.get("tokens_per_microbatch") or 0)
        if not n:
            out["reason"] = "no setting to narrow the gain at"
            return out
        k = np.ceil(big_n / n - 1e-9)
        grad = {key: sign[key[0]] * np.array([k, big_n]) for key in lines}
        ci = s.get("diff_ci")
        width_now = (ci[1] - ci[0]) if ci else None
        what = f"the step-time difference at {big_n:,.0f} tokens per step, {n:,.0f} per micro-batch"
    at_n = n_star if target == "breakeven" else n
    weight = {p.precision: p.learner_weight(big_n, at_n) for p in (base, low)}
    if not any(weight.values()):
        out["reason"] = (
            "generation is the longer side in both precisions there (separate sampler, point estimates): more "
            "micro-batch sizes do not narrow the answer; measure more generation steps"
        )
        return out
    grad = {key: g * weight[key[0]] for key, g in grad.items()}

    def var(extra: Mapping[float, int]) -> float:
        return float(sum(g @ lines[key].cov(extra) @ g for key, g in grad.items()))

    sizes = sorted({float(x) for p in (base, low) for x in p.sizes()})
    limit = min(big_n, cap_tokens) if cap_tokens else big_n
    cands = sorted({x for x in [sizes[0] / 2, *sizes, sizes[-1] * 2] if 1 <= x <= limit})
    reps = int(max(1, round(np.median([len(line.n) / max(len(sizes), 1) for line in lines.values()]))))
    v_now = var({})
    if not (v_now > 0 and np.isfinite(v_now)):
        out["reason"] = "the fits' noise is zero or undefined: no expected width"
        return out

    def expected(extra: Mapping[float, int]) -> dict[str, Any]:
        ratio = float(np.sqrt(var(extra) / v_now))
        return {
            "width_ratio": ratio,
            "expected_width": width_now * ratio if width_now is not None else None,
        }

    single = []
    for c in cands:
        e = expected({c: reps})
        single.append({"tokens_per_microbatch": int(c), "repeats": reps, "measured": c in sizes, **e})
    single.sort(key=lambda r: r["width_ratio"])
    plan: dict[float, int] = {}
    for _ in range(2 * reps):  # greedy: each added repeat where it narrows most
        best = min(cands, key=lambda c: var({**plan, c: plan.get(c, 0) + 1}))
        plan[best] = plan.get(best, 0) + 1
    out.update(
        what=what,
        width_now=width_now,
        candidates=single,  # every candidate, best first
        plan=[{"tokens_per_microbatch": int(c), "repeats": k} for c, k in sorted(plan.items())],
        plan_expected=expected(plan),
        assumptions=(
            "each new repeat: one step of each precision at that size, every fitted phase; noise as in the fits "
            "(relative, scaling with the time); knee models approximated by their straight line; measured "
            "phases' noise (generate, sync) not narrowed by micro-batch sizes"
        ),
    )
    return out


def next_words(sm: Mapping[str, Any]) -> str:
    """'Next measurements (...): e.g. 4 repeats at 16,384 and 4 at 8,192 tokens per micro-batch ...: expected
    ... (which size narrows it most is a rough estimate)' or ''. The ranking is not claimed: measured in
    simulations, it can put the best size last (docs/cost-model.md)."""
    nm = sm.get("next_measurements") or {}
    if not nm.get("needed"):
        return ""
    if not nm.get("plan"):
        return f"Next measurements ({nm.get('why')}): none can be sized ({nm.get('reason')})."
    plan = " and ".join(f"{p['repeats']} repeat(s) at {p['tokens_per_microbatch']:,}" for p in nm["plan"])
    e = nm["plan_expected"]
    width = (
        f"its 95 % interval expected {e['expected_width']:,.3g} wide (now {nm['width_now']:,.3g})"
        if e.get("expected_width") is not None
        else f"its interval's width expected x{e['width_ratio']:.2f}"
    )
    return (
        f"Next measurements ({nm['why']}): e.g. {plan} tokens per micro-batch for {nm['what']}: {width} "
        "(more repeats at any size narrow it; which size narrows it most is a rough estimate)."
    )
