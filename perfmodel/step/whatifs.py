"""What-ifs of the whole step, with intervals: what the low precision's step would gain if its added cost changed.

Each what-if moves seconds out of the low precision's fitted micro-batched phases (update, logprob, ...), per
micro-batch ``m`` and per step ``a``; a phase of ``k`` micro-batches then takes ``k m - a`` seconds less::

    weight_cast_once_per_step   m = q, a = q        q: the weights' cast per micro-batch, done once per step
    host_overhead_removed       m = d_stall         the added host stall (CUDA graphs: launches replayed)
    cast_kernels_fused          m = d_gpu - q       the added GPU-side fixed cost beyond the cast-traffic floor

``d_fixed`` = the low precision's added fixed cost (its chosen model's value at n -> 0 minus the baseline's),
``d_stall`` = its added host stall at n -> 0 (:mod:`perfmodel.breakeven.hoststall`), ``d_gpu = d_fixed - d_stall``.
``q`` is the physical floor of the weight cast (:func:`perfmodel.kernels.bounds.floors`: weight bytes read and
written at the device's HBM bandwidth; ``mxperf fit --device D --model-shape S``). Every moved amount is
clipped to [0, d_fixed] per replicate: no what-if removes more than the low precision adds. Without the
floor (device or model unknown) a what-if that needs it is a **range** between its two ends (nothing moved;
all of its part of the added fixed cost moved), each end with its interval. When the fit already finds the
low precision's added cost once per step (its per-step cost significantly above the baseline's), weights are
cast once per step already and the weight-cast what-if moves nothing.

The seconds moved out of the phases reach the step by the comparison's placement
(:func:`perfmodel.step.overlap.reduction`): all of them with a colocated sampler; with a separate one, the
step is recomputed as max(generation, learner) + sync, so a learner that is not the longer side saves nothing.

Intervals: the same bootstrap replicates as the step model (:mod:`perfmodel.step.model`): the fits'
replicates of ``d_fixed`` and ``d_stall`` (one set of draws serves wall and host stall of a precision) move
each replicate of the step; the gain ``1 - step_low' / step_base`` and its percentile interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from perfmodel.breakeven.hoststall import _zero_size, host_stall_share
from perfmodel.fitting.bootstrap import interval as _ci
from perfmodel.kernels.bounds import cast_floor
from perfmodel.step.model import _pack
from perfmodel.step.overlap import COLOCATED, reduction
from perfmodel.step.section import per_step_difference

WHAT_IFS = {
    "weight_cast_once_per_step": "weights cast once per step (not once per micro-batch)",
    "host_overhead_removed": "host overhead removed (CUDA graphs: the added host stall gone)",
    "cast_kernels_fused": "cast kernels fused (the added GPU time beyond the cast-traffic floor gone)",
}


def _phase_parts(base_fit: Any, low_fit: Any, b: int) -> dict[str, Any]:
    """Per phase: d_fixed and d_stall (estimate, (b,) replicates; d_stall None with the reason)."""
    cb, cl = base_fit.wall.curve(), low_fit.wall.curve()
    d_fixed = float(np.atleast_1d(cl.a1)[0] - np.atleast_1d(cb.a1)[0])
    bb, bl = base_fit.wall.boot_curve(), low_fit.wall.boot_curve()
    if bb is None or bl is None:  # --bootstrap 0: no replicates, so no interval on what a what-if moves
        d_fixed_b = np.empty(0)
    else:
        d_fixed_b = np.atleast_1d(bl.a1)[:b] - np.atleast_1d(bb.a1)[:b]
    out: dict[str, Any] = {"d_fixed": d_fixed, "d_fixed_b": d_fixed_b, "d_stall": None, "stall_reason": None}
    share = host_stall_share(base_fit, low_fit)
    if share.share is None:
        out["stall_reason"] = share.reason
        return out
    zb, zl = _zero_size(base_fit), _zero_size(low_fit)
    if isinstance(zb, str) or isinstance(zl, str):
        out["stall_reason"] = zb if isinstance(zb, str) else zl
        return out
    sb, sl = np.asarray(zb[3]), np.asarray(zl[3])
    if min(len(sb), len(sl)) < b:
        out["stall_reason"] = "no host-stall replicates"
        return out
    out["d_stall"], out["d_stall_b"] = float(zl[2] - zb[2]), sl[:b] - sb[:b]
    out["share"] = share.share
    return out


def _clip(x: np.ndarray | float, hi: np.ndarray | float) -> np.ndarray:
    return np.clip(x, 0.0, np.maximum(hi, 0.0))


def _gain(
    sb: float, sl: float, rb: np.ndarray, rl: np.ndarray, saved: float, saved_b: np.ndarray
) -> dict[str, Any]:
    ok = rb > 0
    g = 1.0 - (sl - saved) / sb if sb > 0 else None
    gci = _ci(1.0 - (rl[ok] - saved_b[ok]) / rb[ok]) if len(rb) else None
    return {
        "step_s": sl - saved,
        "step_ci": _ci(rl - saved_b) if len(rl) else None,
        "saved_s": saved,
        "saved_ci": _ci(saved_b) if len(saved_b) else None,
        "gain": g,
        "gain_ci": gci,
        "significant": bool(gci is not None and (gci[0] > 0 or gci[1] < 0)),
    }


def step_what_ifs(
    base: Any,
    low: Any,
    setting: Mapping[str, Any],
    floors_setup: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """The what-ifs at one setting of the step model (a ``compare_at`` result: ``global_tokens``,
    ``tokens_per_microbatch``, ``packing``) for ``base`` / ``low`` (:class:`perfmodel.step.model.PrecisionStep`)."""
    big_n, n = float(setting["global_tokens"]), float(setting["tokens_per_microbatch"])
    packing: Sequence[float] | None = (setting.get("packing") or {}).get("microbatch_tokens")
    out: dict[str, Any] = {
        "global_tokens": int(big_n),
        "tokens_per_microbatch": int(n),
        "gain": setting.get("gain"),
        "gain_ci": setting.get("gain_ci"),
        "what_ifs": [],
        "reason": None,
    }
    b = min(base.replicate_count()[0], low.replicate_count()[0])
    g = setting.get("generated_tokens")  # --at N,n,G: the same generated tokens as the setting's gain
    sb, sl = base.seconds(big_n, n, packing, g), low.seconds(big_n, n, packing, g)
    rb = base.replicates(big_n, n, b, packing, g) if b else np.empty(0)
    per_low = low.phases_replicates(big_n, n, b, packing, g) if b else {}
    rl = low.combine_replicates(per_low, b) if b else np.empty(0)
    pl = low.phase_seconds(big_n, n, packing, g)
    fitted = [ph for ph, t in low.terms.items() if t.fit is not None and base.terms.get(ph) is not None]
    if not fitted:
        out["reason"] = "no micro-batched phase is fitted for both precisions: nothing for a what-if to move"
        return out
    parts, ks, floor, floor_src, already = {}, {}, {}, {}, {}
    for ph in fitted:
        bf, lf = base.terms[ph].fit, low.terms[ph].fit
        parts[ph] = _phase_parts(bf, lf, b)
        pk = _pack(ph, packing)
        ks[ph] = len(pk) if pk else int(np.ceil(big_n / n - 1e-9))
        floor[ph], floor_src[ph] = cast_floor(floors_setup, ph, base.precision, low.precision)
        _, d_ci = per_step_difference(bf.wall, lf.wall)
        already[ph] = bool(d_ci is not None and d_ci[0] > 0)

    def moved(per_phase: Mapping[str, tuple[float, np.ndarray, float, np.ndarray]]) -> dict[str, Any]:
        """per phase (m, m_b, a, a_b) -> the gain with the step's seconds saved."""
        if low.placement == COLOCATED:
            saved = sum(ks[ph] * m - a for ph, (m, _, a, _) in per_phase.items())
            saved_b = sum(ks[ph] * mb - ab for ph, (_, mb, _, ab) in per_phase.items()) * np.ones(b)
        else:
            cuts = {ph: ks[ph] * m - a for ph, (m, _, a, _) in per_phase.items()}
            cuts_b = {ph: ks[ph] * mb - ab for ph, (_, mb, _, ab) in per_phase.items()}
            saved = reduction(pl, cuts, low.placement)
            saved_b = np.zeros(b) + (reduction(per_low, cuts_b, low.placement) if b else 0.0)
        res = _gain(sb, sl, rb, rl, float(saved), saved_b)
        res["moved_per_microbatch_s"] = {ph: float(m) for ph, (m, _, _, _) in per_phase.items()}
        return res

    def entry(name: str, ends: tuple[dict, dict] | None, point: dict | None, source: str) -> dict[str, Any]:
        e: dict[str, Any] = {"name": name, "label": WHAT_IFS[name], "source": source, "kind": None}
        if point is not None:
            e.update(point, kind="estimate", range=None)
        elif ends is not None:
            lo, hi = ends
            e.update(
                kind="range",
                gain=None,
                gain_ci=None,
                significant=None,
                range={"low_end": lo, "high_end": hi, "gain_ci": _span(lo, hi)},
            )
        e["changes_answer"] = changes_answer(setting, e)
        return e

    # weight cast once per step: q = the floor (capped by d_fixed), or the range 0 .. d_fixed
    zero = {ph: (0.0, np.zeros(b), 0.0, np.zeros(b)) for ph in fitted}
    if all(already.values()):
        src = "the fit already finds the added cost once per step (micro-batch 0): weights are cast once per step already"
        out["what_ifs"].append(entry("weight_cast_once_per_step", None, moved(zero), src))
    elif all(floor[ph] is not None for ph in fitted):
        q = {
            ph: (0.0, np.zeros(b))
            if already[ph]
            else (float(_clip(floor[ph], p["d_fixed"])), _clip(floor[ph], p["d_fixed_b"]))
            for ph, p in parts.items()
        }
        src = "; ".join(f"{ph}: {floor_src[ph]}" for ph in fitted)
        out["what_ifs"].append(
            entry(
                "weight_cast_once_per_step",
                None,
                moved({ph: (m, mb, m, mb) for ph, (m, mb) in q.items()}),
                src,
            )
        )
    else:
        hi = {
            ph: (0.0, np.zeros(b), 0.0, np.zeros(b))
            if already[ph]
            else (
                max(p["d_fixed"], 0.0),
                _clip(p["d_fixed_b"], p["d_fixed_b"]),
                max(p["d_fixed"], 0.0),
                _clip(p["d_fixed_b"], p["d_fixed_b"]),
            )
            for ph, p in parts.items()
        }
        why = next(floor_src[ph] for ph in fitted if floor[ph] is None)
        src = f"range: between no cast and all of the added fixed cost being the weight cast ({why})"
        out["what_ifs"].append(entry("weight_cast_once_per_step", (moved(zero), moved(hi)), None, src))

    # host overhead removed: the added host stall at n -> 0
    if all(parts[ph]["d_stall"] is not None for ph in fitted):
        h = {
            ph: (
                float(_clip(p["d_stall"], p["d_fixed"])),
                _clip(p["d_stall_b"], p["d_fixed_b"]),
                0.0,
                np.zeros(b),
            )
            for ph, p in parts.items()
        }
        src = "; ".join(
            f"{ph}: host stall {100 * parts[ph]['share']:.0f} % of the added fixed cost (zero-size intercepts)"
            for ph in fitted
        )
        out["what_ifs"].append(entry("host_overhead_removed", None, moved(h), src))
    else:
        why = next(parts[ph]["stall_reason"] for ph in fitted if parts[ph]["d_stall"] is None)
        out["what_ifs"].append(
            {
                "name": "host_overhead_removed",
                "label": WHAT_IFS["host_overhead_removed"],
                "kind": None,
                "source": None,
                "reason": f"no host-stall share: {why}",
                "changes_answer": False,
            }
        )

    # cast kernels fused: the added GPU-side fixed cost beyond the cast floor
    def gpu_side(ph: str, p: dict[str, Any]) -> tuple[float, np.ndarray]:
        if p["d_stall"] is None:
            return p["d_fixed"], p["d_fixed_b"]
        return p["d_fixed"] - p["d_stall"], p["d_fixed_b"] - p["d_stall_b"]

    stall_known = all(parts[ph]["d_stall"] is not None for ph in fitted)
    floor_known = all(floor[ph] is not None for ph in fitted)
    f = {}
    for ph, p in parts.items():
        g, gb = gpu_side(ph, p)
        q_f = floor[ph] or 0.0
        f[ph] = (float(_clip(g - q_f, p["d_fixed"])), _clip(gb - q_f, p["d_fixed_b"]), 0.0, np.zeros(b))
    if floor_known and stall_known:
        src = (
            "the added GPU-side fixed cost (added fixed minus added host stall) down to the weight-cast floor"
        )
        out["what_ifs"].append(entry("cast_kernels_fused", None, moved(f), src))
    else:
        whys = [floor_src[ph] for ph in fitted if floor[ph] is None][:1]
        whys += [
            f"host stall not known: {parts[ph]['stall_reason']}"
            for ph in fitted
            if parts[ph]["d_stall"] is None
        ][:1]
        what = "GPU-side " if stall_known else ""
        down = " beyond the cast floor" if floor_known else ""
        src = f"range: between unchanged and all of the added {what}fixed cost{down} gone ({'; '.join(whys)})"
        out["what_ifs"].append(entry("cast_kernels_fused", (moved(zero), moved(f)), None, src))
    if not b:
        out["reason"] = "no bootstrap replicates: what-ifs without intervals"
    return out


def _span(lo: dict[str, Any], hi: dict[str, Any]) -> list[float] | None:
    """The interval of a range: from the lower end's lower bound to the upper end's upper bound."""
    a, c = lo.get("gain_ci"), hi.get("gain_ci")
    if a is None or c is None:
        return None
    return [min(a[0], c[0]), max(a[1], c[1])]


def _state(gain_ci: Sequence[float] | None) -> str | None:
    if gain_ci is None:
        return None
    return "faster" if gain_ci[0] > 0 else "slower" if gain_ci[1] < 0 else "not told apart"


def changes_answer(setting: Mapping[str, Any], e: Mapping[str, Any]) -> bool:
    """Would the what-if change the answer at this setting: the low precision significantly faster, slower
    or not told apart (a range: at its favourable end)."""
    now = _state(setting.get("gain_ci"))
    if now is None:
        return False
    if e.get("kind") == "estimate":
        new = _state(e.get("gain_ci"))
    elif e.get("kind") == "range":
        new = _state((e.get("range") or {}).get("high_end", {}).get("gain_ci"))
    else:
        return False
    return new is not None and new != now


def what_if_words(w: Mapping[str, Any], low: str) -> str:
    """'weights cast once per step: mxfp8 step 12.1 % faster [95 % CI 10.2 to 14.0 %]' (a range: both ends)."""

    def pct(g: float | None, ci: Sequence[float] | None) -> str:
        if g is None:
            return "no gain"
        band = f" [95 % CI {ci[0] * 100:+.1f} to {ci[1] * 100:+.1f} %]" if ci else " (no interval)"
        return f"{g * 100:+.1f} %{band}"

    if w.get("kind") == "estimate":
        return f"{w['label']}: {low} gain {pct(w.get('gain'), w.get('gain_ci'))}"
    if w.get("kind") == "range":
        r = w["range"]
        return (
            f"{w['label']}: {low} gain between {pct(r['low_end']['gain'], r['low_end']['gain_ci'])} and "
            f"{pct(r['high_end']['gain'], r['high_end']['gain_ci'])} ({w['source']})"
        )
    return f"{w['label']}: not estimated ({w.get('reason')})"


def answer_what_ifs(
    sm: Mapping[str, Any], base: Any, low: Any, floors_setup: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    """The what-ifs at the answer's setting (the first of ``settings``, else the recommendation's size), or
    null ones with the reason (``step_model[].what_ifs``)."""
    if sm.get("reason"):
        return {"what_ifs": [], "reason": f"no step model ({sm['reason']})"}
    settings = sm.get("settings") or []
    s = settings[0] if settings else (sm.get("recommendation") or {}).get("comparison")
    if not s:
        return {"what_ifs": [], "reason": "no settings known (pass --at N,n or a global batch)"}
    out = step_what_ifs(base, low, s, floors_setup)
    out["source"] = s.get("source")
    return out


def what_if_lines(sm: Mapping[str, Any]) -> list[str]:
    """The what-ifs of one step comparison in words (stdout and report.md)."""
    wi = sm.get("what_ifs") or {}
    if not wi.get("what_ifs"):
        return []  # why not: step_model[].what_ifs.reason
    at = f"{wi['global_tokens']:,} tokens per step, {wi['tokens_per_microbatch']:,} per micro-batch"
    g, ci = wi.get("gain"), wi.get("gain_ci")
    now = f"{g * 100:+.1f} %" + (f" [95 % CI {ci[0] * 100:+.1f} to {ci[1] * 100:+.1f} %]" if ci else "")
    out = [f"What-ifs for {sm['model']} at {at} ({sm['precision']} gain now {now}):"]
    for w in wi["what_ifs"]:
        mark = " (changes the answer)" if w.get("changes_answer") else ""
        src = f"; {w['source']}" if w.get("kind") == "estimate" and w.get("source") else ""
        out.append(f"- {what_if_words(w, sm['precision'])}{mark}{src}")
    return out
