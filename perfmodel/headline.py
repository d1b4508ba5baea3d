"""The headline of one comparison: one paragraph that never states a number the data cannot support.

Order: what the low precision adds and saves; n* with its interval -- or why there is none (the model is
rejected and no knee model fits: the misfit is named; no interval can be computed: ``undetermined``); the
measured crossing (model-free); the breakeven with host overhead removed (GPU busy time); the per-step cost
difference; the host-stall share. Each clause says where its number came from when that is not the line.
"""

from __future__ import annotations

from typing import Any

from perfmodel.breakeven import Breakeven
from perfmodel.crossing import Crossing
from perfmodel.hoststall import HostStallShare
from perfmodel.paired import PairedBreakeven


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


def _costs(be: Breakeven, low: str) -> str:
    fixed = f"adds {_ms(be.d_fixed_s)}" if be.d_fixed_s >= 0 else f"removes {_ms(-be.d_fixed_s)}"
    tok = f"saves {_us(be.d_tok_s)}" if be.d_tok_s >= 0 else f"costs {_us(-be.d_tok_s)} more"
    if be.model in (None, "line") or be.model_ok:
        return f"{low} {fixed} fixed per micro-batch and {tok}"
    return f"{low} {fixed} per micro-batch at small sizes and {tok} once GPU-bound ({be.model} model)"


def _case(be: Breakeven, cross: Crossing | None) -> str:
    ci = _ci(be.ci)
    extra = " (extrapolated beyond the measured sizes)" if be.extrapolated else ""
    if be.case == "undetermined":
        est = f" (point estimate {_tok(be.tokens_estimate)} tokens)" if be.tokens_estimate is not None else ""
        return f"; undetermined{est}: {be.ci_reason}"
    if be.model is None:  # the line is rejected and no knee model fits: n* withheld
        return f": n* withheld, the straight lines are rejected and no knee model fits ({be.model_reason})"
    rejected = "" if be.model_ok else f" (the straight lines are rejected: {be.model_reason})"
    tail = {
        "faster_above": f"; pays off above {_tok(be.tokens)} tokens per micro-batch {ci}{extra}",
        "faster_below": f"; faster only below {_tok(be.tokens)} tokens per micro-batch {ci}{extra}",
        "always_faster": _one_sided(be, "always_faster"),
        "never_faster": _one_sided(be, "never_faster"),
        "indistinguishable": "; neither difference is significant at 95 % (indistinguishable: more repeats or "
        "sizes would tell)",
    }[be.case]
    within = ""
    if be.case not in ("faster_above", "faster_below") and be.within_measured in ("faster", "slower"):
        lo, hi = be.measured_tokens
        within = f"; within the measured sizes ({lo:,.0f} to {hi:,.0f} tokens) it is significantly {be.within_measured} at every size"
    elif be.case in ("always_faster", "never_faster") and be.within_measured == "mixed":
        within = "; it is not significantly " + ("faster" if be.case == "always_faster" else "slower")
        within += " at every measured size"
    if be.case in ("always_faster", "never_faster") and cross is not None and cross.significant:
        within += "; the measured times change sign significantly (see the crossing): a breakeven the line's "
        within += "intervals do not resolve"
    return tail + rejected + within


def _significant(be: Breakeven) -> tuple[bool, bool]:
    """(d_fixed, d_tok) significant in the direction of an always_faster / never_faster case."""
    faster = be.case == "always_faster"
    fixed_sig = be.d_fixed_ci[1] < 0 if faster else be.d_fixed_ci[0] > 0
    tok_sig = be.d_tok_ci[0] > 0 if faster else be.d_tok_ci[1] < 0
    return bool(fixed_sig), bool(tok_sig)


def _one_sided(be: Breakeven, case: str) -> str:
    """always_faster / never_faster in words: a claim about every size only when both differences are
    significant (the case table also gives these cases when one difference is within noise)."""
    faster = case == "always_faster"
    fixed_sig, tok_sig = _significant(be)
    if fixed_sig and tok_sig:
        return (
            "; faster at every micro-batch size (95 %)"
            if faster
            else "; never faster at any micro-batch size (95 %)"
        )
    lo, hi = (_ms(v) for v in be.d_fixed_ci)
    if not fixed_sig:
        text = f"; {case} by the case table, but the fixed-cost difference is within noise ({lo} to {hi})"
    else:
        tlo, thi = (_us(v) for v in be.d_tok_ci)
        text = f"; {case} by the case table, but the per-token difference is within noise ({tlo} to {thi})"
    bound = be.ci[1] if be.ci_shape == "bounded" and faster else None
    if bound is not None and bound > 0:
        text += f": any breakeven lies below {_tok(bound)} tokens (95 %)"
    return text


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
            + (be.ci_reason or be.model_reason or "")
            + ")"
        )
    words = {
        "faster_above": f"pays off above {_tok(be.tokens)} tokens {_ci(be.ci)}",
        "faster_below": f"faster only below {_tok(be.tokens)} tokens {_ci(be.ci)}",
        "always_faster": "faster at every size",
        "never_faster": "never faster",
        "indistinguishable": "indistinguishable",
    }[be.case]
    if be.case in ("always_faster", "never_faster") and not all(_significant(be)):
        fixed_sig, _ = _significant(be)
        lo, hi = (_ms(v) for v in be.d_fixed_ci) if not fixed_sig else (_us(v) for v in be.d_tok_ci)
        what = "fixed-cost" if not fixed_sig else "per-token"
        words = f"{be.case} by the case table (the {what} difference is within noise: {lo} to {hi})"
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
    """One global batch's step-level breakeven in words (``perfmodel.recommend.step_breakeven_interval``)."""
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
    where = "" if share.basis == "fitted intercepts" else f", {share.basis}"
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
    head = f"{entry['model']}/{entry['phase']}: {low} vs {base}"
    if be.model is not None:  # a rejected line's coefficients are not stated as facts
        head += f": {_costs(be, low)}"
    pair = ""
    if paired is not None and paired.case != be.case:
        n = f" (n* = {_tok(paired.tokens)})" if paired.tokens is not None else ""
        pair = f". Paired by repeat (drift shared by both precisions cancelled): {paired.case}{n}"
    per_step = _per_step(entry, low) if be.model is not None else ""
    text = head + _case(be, cross) + _crossing(cross, low) + _gpu_busy(busy) + per_step
    text += pair + _stall(share, be)
    return text + "."
