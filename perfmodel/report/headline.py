"""The headline of one comparison: one paragraph that never states a number the data cannot support.

Order: what the low precision adds and saves; n* with its interval -- or why there is none (the model is
rejected and no knee model fits: the misfit is named; no interval can be computed: ``undetermined``); the
measured crossing (model-free); the breakeven with host overhead removed (GPU busy time); the per-step cost
difference; the host-stall share. Each clause says where its number came from when that is not the line.
"""

from __future__ import annotations

from typing import Any

from perfmodel.breakeven.crossing import Crossing
from perfmodel.breakeven.hoststall import HostStallShare
from perfmodel.breakeven.paired import PairedBreakeven
from perfmodel.breakeven.solve import Breakeven
from perfmodel.step.overlap import COLOCATED, binding_words, formula
from perfmodel.step.validation import validation_words


def _ms(x: float) -> str:
    """Seconds per micro-batch in ms (in s from 1000 ms on)."""
    return f"{x * 1e3:.3g} ms" if abs(x) < 1.0 else f"{x:.3g} s"


def _us(x: float) -> str:
    """Seconds per token in us/token (in ms/token from 1000 us on)."""
    return f"{x * 1e6:.3g} us/token" if abs(x) < 1e-3 else f"{x * 1e3:.3g} ms/token"


def _tok(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:,.0f}"


def _ci(ci: tuple | list | None) -> str:
    lo, hi = [*list(ci or []), None, None][:2]
    return f"[95 % CI {_tok(lo)} to {_tok(hi)}]"


def _costs(be: Breakeven, low: str, entry: dict[str, Any] | None = None) -> str:
    fixed = f"adds {_ms(be.d_fixed_s)}" if be.d_fixed_s >= 0 else f"removes {_ms(-be.d_fixed_s)}"
    tok = f"saves {_us(be.d_tok_s)}" if be.d_tok_s >= 0 else f"costs {_us(-be.d_tok_s)} more"
    if be.model in (None, "line") or be.model_ok:
        return f"{low} {fixed} fixed per micro-batch and {tok}"
    below, above = _knee_sizes(entry)
    few_small = {p: n for p, n in below.items() if n < 2}
    few_large = {p: n for p, n in above.items() if n < 2}
    fixed_part = (
        f"{low} {fixed} per micro-batch at small sizes"
        if not few_small
        else f"{low}: added cost at small sizes not measured ({_few(few_small, 'below')})"
    )
    tok_part = (
        f"{tok} once GPU-bound"
        if not few_large
        else f"per-token saving once GPU-bound not measured ({_few(few_large, 'above')})"
    )
    sep = " and " if not (few_small or few_large) else "; "
    return f"{fixed_part}{sep}{tok_part} ({be.model} model)"


def _knee_sizes(entry: dict[str, Any] | None) -> tuple[dict[str, int], dict[str, int]]:
    """Per precision: measured sizes below its chosen knee (knee models only), and measured sizes in the
    GPU-bound regime (``gpu_bound_sizes``: host stall under 20 % where a trace says, else above the knee)."""
    below: dict[str, int] = {}
    above: dict[str, int] = {}
    for prec, f in ((entry or {}).get("fits") or {}).items():
        knee = f.get("knee") or {}
        if f.get("model") in ("knee", "parts") and knee.get("chosen") and "sizes_below_knee" in knee:
            below[prec] = knee["sizes_below_knee"]
        if f.get("gpu_bound_sizes") is not None:
            above[prec] = f["gpu_bound_sizes"]
    return below, above


def _few(counts: dict[str, int], side: str) -> str:
    where = "below its knee" if side == "below" else "GPU-bound"
    return ", ".join(f"{p}: {n} measured size{'s' if n != 1 else ''} {where}" for p, n in counts.items())


def crossing_words(be: Breakeven, short: bool = False) -> str:
    """n* and its interval in words for ``faster_above`` / ``faster_below``, saying what an interval that
    reaches 0 or infinity means (one difference within noise) and where the interval comes from."""
    lo, hi = [*list(be.ci or []), None, None][:2]
    per = " tokens" if short else " tokens per micro-batch"
    extra = " (extrapolated beyond the measured sizes)" if be.extrapolated and not short else ""
    above = be.case == "faster_above"
    if lo is not None and hi is None:  # d_tok within noise: a half-line
        est = f" (point estimate {_tok(be.tokens)})" if be.tokens is not None else ""
        if above:
            return f"not faster below {_tok(lo)}{per} (95 %); above that it may never pay off{est}"
        return f"faster at least below {_tok(lo)}{per} (95 %); above that it may stay faster{est}"
    if lo == 0.0 and hi is not None:  # d_fixed within noise: n* may be 0
        if above:
            return (
                f"pays off above {_tok(be.tokens)}{per} [95 % CI 0 to {_tok(hi)}]{extra}: faster above "
                f"{_tok(hi)}, possibly at every size"
            )
        return (
            f"faster only below {_tok(be.tokens)}{per} [95 % CI 0 to {_tok(hi)}]{extra}: slower above "
            f"{_tok(hi)}, possibly at every size"
        )
    if be.ci_method == "measured":
        way = "pays off above" if above else "faster only below"
        return (
            f"{way} ~{_tok(be.tokens)}{per}, between the measured {_tok(lo)} and {_tok(hi)} (model-free "
            "bracket: linearity untested)"
        )
    way = "pays off above" if above else "faster only below"
    return f"{way} {_tok(be.tokens)}{per} {_ci(be.ci)}{extra}"


def _case(be: Breakeven, cross: Crossing | None) -> str:
    if be.model is None:
        if be.ci_reason and be.ci_reason.startswith("n* withheld: no model fits"):
            return (
                f": n* withheld, the straight lines are rejected and no knee model fits ({be.model_reason})"
            )
        return f": no breakeven, no recommendation ({be.model_reason})"
    within = ""
    if be.case not in ("faster_above", "faster_below") and be.within_measured in ("faster", "slower"):
        lo, hi = be.measured_tokens
        within = f"; within the measured sizes ({lo:,.0f} to {hi:,.0f} tokens) it is significantly {be.within_measured} at every size"
    if be.case == "undetermined":
        est = f" (point estimate {_tok(be.tokens_estimate)} tokens)" if be.tokens_estimate is not None else ""
        return f"; undetermined{est}: {be.ci_reason}{within}"
    if be.model_ok:
        rejected = ""
    elif be.model == "line":
        rejected = f" ({be.model_reason})"
    else:
        rejected = f" (the straight lines are rejected: {be.model_reason})"
    tail = {
        "faster_above": "; " + crossing_words(be),
        "faster_below": "; " + crossing_words(be),
        "always_faster": _one_sided(be, "always_faster"),
        "never_faster": _one_sided(be, "never_faster"),
        "indistinguishable": "; neither difference is significant at 95 % (indistinguishable: more repeats or "
        "sizes would tell)",
    }[be.case]
    if be.case in ("always_faster", "never_faster") and be.within_measured == "mixed":
        within = "; it is not significantly " + ("faster" if be.case == "always_faster" else "slower")
        within += " at every measured size"
    if be.case in ("always_faster", "never_faster") and cross is not None and cross.significant:
        within += "; the measured times change sign significantly (see the crossing): a breakeven the line's "
        within += "intervals do not resolve"
    return tail + rejected + within


def _one_sided(be: Breakeven, case: str) -> str:
    """always_faster / never_faster in words: the case table gives them only when both differences are
    significant that way (one within noise leaves a crossing whose interval reaches 0 or infinity)."""
    if case == "always_faster":
        return "; faster at every micro-batch size (95 %): it saves per token and removes fixed cost"
    return "; never faster at any micro-batch size (95 %): it costs more per token and adds fixed cost"


def _crossing(cross: Crossing | None, low: str) -> str:
    if cross is None:
        return ""
    if not cross.sizes:  # the model-free answer is always stated, also when there is none
        return f". Measured: no model-free crossing ({cross.note})"
    if cross.tokens is None:
        return f". Measured: {cross.note}".replace("low is", f"{low} is")
    lo, hi = cross.tokens
    way = "faster" if cross.direction == "faster_above" else "slower"
    sig = "significant" if cross.significant else "not significant: the difference at one end is within noise"
    return f". Measured: {low} becomes {way} between {lo:,.0f} and {hi:,.0f} tokens ({sig})"


def _gpu_busy(be: Breakeven | None) -> str:
    if be is None:
        return ""
    if be.case == "undetermined" or be.model is None:
        return (
            ". With host overhead removed (GPU busy time): no n* ("
            + (be.model_reason if be.model is None and be.model_reason else be.ci_reason or "")
            + ")"
        )
    words = {
        "faster_above": crossing_words(be, short=True),
        "faster_below": crossing_words(be, short=True),
        "always_faster": "faster at every size",
        "never_faster": "never faster",
        "indistinguishable": "indistinguishable",
    }[be.case]
    return f". With host overhead removed (GPU busy time): {words}"


def _per_step(entry: dict[str, Any], low: str) -> str:
    step = entry.get("step") or {}
    d, ci = step.get("per_step_difference_s"), step.get("per_step_difference_ci")
    if not ci or d is None or not (ci[0] > 0 or ci[1] < 0):
        return ""
    word = "more" if d > 0 else "less"
    text = (
        f". {low} also pays {_ms(abs(d))} {word} once per step ({entry['fits'][low].get('per_step_basis')})"
    )
    steps = [_step_case(sb) for sb in step.get("step_breakeven") or []]
    return text + ("; step time, per-step cost included: " + "; ".join(steps) if steps else "")


def _step_case(sb: dict[str, Any]) -> str:
    """One global batch's step-level breakeven in words (``perfmodel.step.recommend.step_breakeven_interval``)."""
    at = f"at a global batch of {sb['global_batch_tokens']:,} tokens: "
    case, n = sb.get("case"), sb.get("tokens")
    if sb.get("within_global_batch"):
        return at + f"{sb['within_global_batch']} at every micro-batch size (the steps cross only above it)"
    if n is not None and case == "faster_above":
        return at + f"pays off above {_tok(n)} tokens per micro-batch {_ci(sb.get('ci'))}"
    if n is not None and case == "faster_below":
        return at + f"faster only below {_tok(n)} tokens per micro-batch {_ci(sb.get('ci'))}"
    words = {
        "always_faster": "faster at every micro-batch size",
        "never_faster": "never faster",
        "indistinguishable": "indistinguishable",
    }
    return at + words.get(str(case), "no step-level answer (" + str(sb.get("reason")) + ")")


def _stall(share: HostStallShare, be: Breakeven) -> str:
    if share.share is None or share.ci[0] is None or be.d_fixed_s <= 0:
        return ""
    lo, hi = share.ci
    where = "" if share.basis == "fitted intercepts" else ", at zero tokens (the knee models' host lines)"
    return f". Host stall is {_pct(share.share)} [{_pct(lo)} to {_pct(hi)}] of the added fixed cost{where}"


def _pct(x: float) -> str:
    """A share in percent: one decimal below 10 %, never '-0%'."""
    v = 100.0 * x
    if abs(v) < 0.05:
        return "0%"
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def verdict(
    entry: dict[str, Any],
    be: Breakeven,
    cross: Crossing | None,
    busy: Breakeven | None,
    share: HostStallShare,
    paired: PairedBreakeven | None = None,
) -> str:
    """'mxfp8 adds X ms fixed per micro-batch and saves Y us/token; pays off above N* tokens [CI]. ...'."""
    low, base = entry["precision"], entry["baseline"]
    head = f"{entry['model']}/{entry['phase']}: {low} vs {base}{emulation_tag(entry)}"
    if be.model is not None:  # a rejected line's coefficients are not stated as facts
        head += f": {_costs(be, low, entry)}"
    pair = ""
    if paired is not None and paired.case != be.case:
        pair = f". Paired by repeat (drift shared by both precisions cancelled): {_paired_words(paired, low)}"
    per_step = _per_step(entry, low) if be.model is not None else ""
    text = head + _case(be, cross) + _crossing(cross, low) + _gpu_busy(busy) + per_step
    text += pair + _stall(share, be) + _outliers(entry)
    return text + "."


def _paired_words(paired: PairedBreakeven, low: str) -> str:
    """The paired cross-check's case in words (never its id)."""
    n = _tok(paired.tokens) if paired.tokens is not None else "?"
    if paired.tokens is not None and paired.tokens < 1 and paired.case in ("faster_above", "faster_below"):
        # a crossing at or below zero tokens: no micro-batch size is on its other side
        return f"{low} {'faster' if paired.case == 'faster_above' else 'slower'} at every size (n* <= 0)"
    return {
        "faster_above": f"{low} faster above {n} tokens per micro-batch",
        "faster_below": f"{low} faster below {n} tokens per micro-batch",
        "always_faster": f"{low} faster at every size",
        "never_faster": f"{low} never faster",
        "indistinguishable": "no significant difference",
        "undetermined": "undetermined",
    }.get(str(paired.case), "no case")


def emulation_tag(entry: dict[str, Any]) -> str:
    """' [CPU emulation of mxfp8: ...]' when a precision's GEMMs were emulated; '' otherwise."""
    em = entry.get("emulated") or {}
    if not em:
        return ""
    where = "CPU emulation" if all("cpu" in str(w).lower() for w in em.values()) else "emulation"
    names = " and ".join(em)
    return (
        f" [{where} of {names}: the timings are the emulation's, not what {names} costs with hardware GEMMs]"
    )


def _outliers(entry: dict[str, Any]) -> str:
    counts = {p: len(f.get("outliers") or []) for p, f in (entry.get("fits") or {}).items()}
    counts = {p: n for p, n in counts.items() if n}
    if not counts:
        return ""
    said = ", ".join(f"{p} {n} micro-batch{'es' if n != 1 else ''}" for p, n in counts.items())
    return f". Left out as outliers: {said} (named in the report)"


def answer(entry: dict[str, Any], be: Breakeven) -> str:
    """One line, first in the report: the case and n* with its interval, or why there is none."""
    head = f"{entry['model']}/{entry['phase']}: {entry['precision']} vs {entry['baseline']}{emulation_tag(entry)}"
    if be.model is None:
        if be.ci_reason and be.ci_reason.startswith("n* withheld: no model fits"):
            return f"{head}: n* withheld: no model fits the timings ({be.model_reason}); see the measured crossing"
        return f"{head}: no breakeven ({be.model_reason})"
    if be.case == "undetermined":
        return f"{head}: undetermined: {be.ci_reason}"
    words = {
        "faster_above": crossing_words(be) if be.case == "faster_above" else "",
        "faster_below": crossing_words(be) if be.case == "faster_below" else "",
        "always_faster": "faster at every micro-batch size (95 %)",
        "never_faster": "never faster at any micro-batch size (95 %)",
        "indistinguishable": "neither difference is significant at 95 %: no breakeven can be told",
    }[be.case]
    return f"{head}: {words}"  # the case in words; its id is fits.json's breakeven.case


def _gain_pct(x: float) -> str:
    return f"{abs(x) * 100:.1f} %"


def gain_words(s: dict[str, Any], low: str, base: str) -> str:
    """'mxfp8 step 10.7 % faster [95 % CI 8.1 to 13.0 % faster]' -- or no significant difference, or no
    interval and why; never a bare percentage its interval does not support."""
    g, ci = s.get("gain"), s.get("gain_ci")
    if g is None:
        return f"no gain ({s.get('reason') or 'baseline step time not positive'})"
    word = "faster" if g > 0 else "slower"
    if ci is None:
        return f"{low} step predicted {_gain_pct(g)} {word} than {base}; no interval ({s.get('reason')})"
    band = f"95 % CI {ci[0] * 100:+.1f} to {ci[1] * 100:+.1f} % gain"
    if not s.get("significant"):
        return f"no significant difference between {low} and {base} per step: {g * 100:+.1f} % gain ({band})"
    return f"{low} step {_gain_pct(g)} {word} than {base} ({band})"


def setting_words(sm: dict[str, Any], s: dict[str, Any]) -> str:
    """One (N, n) of the whole-step model in words: both step times with intervals, then the gain."""
    low, base = sm["precision"], sm["baseline"]
    pp = s["per_precision"]

    def secs(p: str) -> str:
        ci = pp[p].get("step_ci")
        return f"{p} {pp[p]['step_s']:.3g} s" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")

    at = f"{s['global_tokens']:,} tokens per step, {s['tokens_per_microbatch']:,} per micro-batch"
    ext = " Extrapolated: n is outside the measured sizes." if s.get("extrapolated") else ""
    return (
        f"{sm['model']} at {at} ({s['source']}): {secs(base)}, {secs(low)}; {gain_words(s, low, base)}.{ext}"
    )


def step_answer(sm: dict[str, Any]) -> list[str]:
    """Three lines, first on stdout and in report.md: the gain per step at the user's settings with its
    interval; the breakeven micro-batch size with its interval or why there is none; what to change."""
    low, base = sm["precision"], sm["baseline"]
    head = f"{sm['model']}: {low} vs {base} per step{emulation_tag(sm)}"
    if sm.get("reason"):
        why = f"no answer: {sm['reason']}"
        return [f"{head}: {why}.", "Breakeven: none (no step model).", "What to change: nothing can be said."]
    cover = f"step = {formula(list(next(iter(sm['phases'].values()))), _placement(sm))}"
    if _placement(sm) != COLOCATED:
        cover += f": separate sampler ({(sm.get('placement') or {}).get('source')})"
    missing = sm.get("not_in_step") or []
    cover += f"; not given: {', '.join(missing)}" if missing else ""
    settings = sm.get("settings") or []
    rec = sm.get("recommendation") or {}
    if settings:
        s = settings[0]
        where = f"at {s['global_tokens']:,} tokens per step, {s['tokens_per_microbatch']:,} per micro-batch ({s['source']})"
    elif rec.get("comparison"):
        s = rec["comparison"]
        where = (
            f"at {s['global_tokens']:,} tokens per step ({sm.get('global_tokens_source')}), "
            f"{s['tokens_per_microbatch']:,} per micro-batch (the fastest measured size; your size is not known: --at N,n)"
        )
    else:
        s = None
    if s is None:
        line1 = f"{head}: no settings known ({rec.get('reason') or 'pass --at N,n'})."
    else:
        pp = s["per_precision"]
        line1 = (
            f"{head} {where}: {gain_words(s, low, base)}; {pp[base]['step_s']:.3g} s vs {pp[low]['step_s']:.3g} s"
            f" [{cover}]"
            + _where_from(s, base, low)
            + (" Extrapolated: n is outside the measured sizes." if s.get("extrapolated") else "")
        )
        if s.get("measured_at_other_global_batch"):
            line1 += f" ({', '.join(s['measured_at_other_global_batch'])} as measured at the runs' global batch, not scaled.)"
        if check := validation_words(sm.get("validation")):
            line1 += " " + check
    return [
        line1,
        _breakeven_line(sm, low) + _next(sm),
        _change_line(sm, low, base) + _what_if_change(sm, low),
    ]


def _next(sm: dict[str, Any]) -> str:
    from perfmodel.breakeven.next_measurements import next_words

    w = next_words(sm)
    return f" {w}" if w else ""


def _what_if_change(sm: dict[str, Any], low: str) -> str:
    """' What would change it: host overhead removed (CUDA graphs ...): mxfp8 gain +12.0 % [...]' -- the
    what-ifs that change the answer at its setting (significance or sign of the gain), '' when none."""
    from perfmodel.step.whatifs import what_if_words

    ws = [w for w in (sm.get("what_ifs") or {}).get("what_ifs") or [] if w.get("changes_answer")]
    if not ws:
        return ""
    return " What would change the answer: " + "; ".join(what_if_words(w, low) for w in ws) + "."


def _placement(sm: dict[str, Any]) -> str:
    return (sm.get("placement") or {}).get("name") or COLOCATED


def _where_from(s: dict[str, Any], base: str, low: str) -> str:
    """'; gain by phase: generate +5.0 pts, update -1.2 pts' -- each phase's share of the gain (of the
    baseline step); with a separate sampler, which side is the longer one."""
    g = s.get("gain_by_phase") or {}
    parts = [
        f"{ph} {v * 100:+.1f} pts"
        for ph, v in sorted(g.items(), key=lambda kv: -abs(kv[1]))
        if abs(v) >= 5e-4
    ]
    sides = binding_words(s.get("overlap"), base, low)
    said = f"; gain by phase: {', '.join(parts)}" if parts else ""
    return said + (f" ({sides})." if sides and said else f"; {sides}." if sides else ".")


def _breakeven_line(sm: dict[str, Any], low: str) -> str:
    be = sm.get("breakeven")
    if not be:
        why = (sm.get("recommendation") or {}).get("reason") or "no global batch"
        return f"Breakeven: none ({why})."
    at = f"at {be['global_tokens']:,} tokens per step"
    lo_n, hi_n = be["range"]
    if be.get("reason") and be.get("case") is None:
        return f"Breakeven {at}: none ({be['reason']})."
    if be["tokens"] is None:
        way = "faster" if be["case"] == "faster" else "slower"
        sig = (
            "significantly at every size"
            if be.get("significant_everywhere")
            else "not significantly at every size"
            if be.get("significant_everywhere") is False
            else f"no interval: {be.get('reason')}"
        )
        return f"Breakeven {at}: none between {lo_n:,.0f} and {hi_n:,.0f} tokens per micro-batch: {low} is {way} throughout ({sig})."
    side = "above" if be["case"] == "faster_above" else "below"
    ci = be.get("ci")
    band = f" [95 % CI {_tok(ci[0])} to {_tok(ci[1])}]" if ci else f" (no interval: {be.get('reason')})"
    ext = " Extrapolated: outside the measured sizes." if be.get("extrapolated") else ""
    return f"Breakeven {at}: {low} is faster {side} {be['tokens']:,.0f} tokens per micro-batch{band}.{ext}"


def _change_line(sm: dict[str, Any], low: str, base: str) -> str:
    rec = sm.get("recommendation") or {}
    if rec.get("global_tokens") is None:
        return f"What to change: no recommendation ({rec.get('reason')})."
    cap = f", memory cap {rec['mem_cap_bytes']:,.0f} B" if rec.get("mem_cap_bytes") else ""
    ext = [
        f"{p} at {e['extrapolated_best']['tokens_per_microbatch']:,} tokens is predicted "
        f"{e['extrapolated_best']['step_s']:.3g} s per step (extrapolated beyond the measured sizes: measure it)"
        for p, e in (rec.get("per_precision") or {}).items()
        if e.get("extrapolated_best")
    ]
    tail = ("; " + "; ".join(ext)) if ext else ""
    notes = [e["memory_note"] for e in (rec.get("per_precision") or {}).values() if e.get("memory_note")]
    tail += ("; " + "; ".join(dict.fromkeys(notes))) if notes else ""
    if rec.get("precision"):
        cmp = rec["comparison"]
        g, ci = cmp["gain"], cmp["gain_ci"]  # 1 - t_low / t_base
        if rec["precision"] == low:
            vs = f"{g * 100:.1f} % less than {base} at that size [95 % CI {ci[0] * 100:.1f} to {ci[1] * 100:.1f} %]"
        else:  # the baseline: the low precision's step is -g longer (not "-g less": the base is t_base, not t_low)
            vs = (
                f"{low} takes {-g * 100:.1f} % longer at that size "
                f"[95 % CI {-ci[1] * 100:.1f} to {-ci[0] * 100:.1f} %]"
            )
        return (
            f"What to change: use {rec['precision']} at {rec['tokens_per_microbatch']:,} tokens per micro-batch "
            f"(global batch {rec['global_tokens']:,}{cap}): {rec['step_s']:.3g} s per step, {vs}{tail}."
        )
    n = rec.get("tokens_per_microbatch")
    size = f"; the fastest measured size is {n:,} tokens per micro-batch" if n else ""
    return f"What to change: no precision to recommend ({rec.get('reason')}){size}{tail}."
