"""report.md from a fits.json document: the verdict first, then the numbers behind it and where each came
from. Returns a string."""

from __future__ import annotations

from typing import Any

from perfmodel.fitting.outliers import describe
from perfmodel.report.results import entry_stem
from perfmodel.step.overlap import COLOCATED, DEFAULT_SOURCE, SEPARATE, formula
from perfmodel.step.validation import validation_table, validation_words
from perfmodel.step.whatifs import what_if_lines


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.4g}"


def _us(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e6:.4g}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _tok(x: float | None) -> str:
    return "-inf/+inf" if x is None else f"{x:,.0f}"


def _tok_or_none(x: float | None) -> str:
    return "none" if x is None else f"{x:,.0f}"


def _ci(ci: list | None, fmt=_tok) -> str:
    if not ci:
        return "n/a"
    return f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def _fit_table(e: dict[str, Any]) -> list[str]:
    lines = [
        "| precision | model | fixed (ms) | 95 % CI | per token (us) | 95 % CI | per step (ms) | 95 % CI "
        "| R^2 | units | micro-batches | hold-out MAPE interp / extrap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = set()
    for prec in (e["baseline"], e["precision"]):
        f = e["fits"][prec]
        ho = f.get("holdout") or {}
        fixed, fixed_ci, tok, tok_ci = f["fixed_s"], f["fixed_ci"], f["per_token_s"], f["per_token_ci"]
        model = f.get("model")
        knee = f.get("knee") or {}
        if model in ("knee", "parts") and knee.get(
            "chosen"
        ):  # the chosen curve's ends, not the rejected line
            fixed, fixed_ci = knee["left"]["intercept_s"], knee["left"].get("intercept_ci")
            tok, tok_ci = knee["right"]["slope_s"], knee["right"].get("slope_ci")
            model = f"{model}*"
            notes.add(
                "\\* knee model: fixed = its time at n -> 0 (launch-bound line), per token = its slope above the "
                "knee (GPU-bound), bootstrap intervals; the rejected line is in fits.json `fixed_s` / `per_token_s`."
            )
        elif model is None:
            model = "**none fits** (line shown, rejected)"
        lines.append(
            f"| {prec} | {model} | {_ms(fixed)} | {_ci(fixed_ci, _ms)} "
            f"| {_us(tok)} | {_ci(tok_ci, _us)} | {_ms(f.get('per_step_s'))} "
            f"| {_ci(f.get('per_step_ci'), _ms)} | {f['r2']:.4f} | {f['n_points']} | {f.get('n_microbatches', '')} "
            f"| {_pct(ho.get('interpolation_mape'))} / {_pct(ho.get('extrapolation_mape'))} |"
        )
    return lines + (["", *sorted(notes)] if notes else [])


def _model_lines(prec: str, f: dict[str, Any], what: str = "") -> list[str]:
    out = []
    for msg in f.get("implausible") or []:
        out.append(f"- {prec}{what}: **implausible coefficients**: {msg}.")
    lof = f.get("lack_of_fit")
    if lof:
        p = "n/a" if lof["p_value"] is None else f"{lof['p_value']:.3g}"
        flag = "**lack of fit**" if lof["flag"] else "not rejected"
        out.append(
            f"- {prec}{what}: {flag} ({lof['test']}, p = {p}, max deviation {lof['max_rel_dev']:.1%}): {lof['note']}."
        )
    knee = f.get("knee")
    if knee:
        ci = knee.get("knee_ci")
        used = "chosen" if knee.get("chosen") else "**rejected too**"
        out.append(
            f"- {prec}{what}: {knee['kind']} model ({used}): knee at {_tok_or_none(knee.get('knee_tokens'))} tokens "
            f"{_ci(ci)}; below it {_ms(knee['left']['intercept_s'])} ms + {_us(knee['left']['slope_s'])} us/token, "
            f"above it {_ms(knee['right']['intercept_s'])} ms + {_us(knee['right']['slope_s'])} us/token ({knee['lines']})."
        )
    if f.get("model_note"):
        out.append(f"- {prec}{what}: model: {f['model_note']}.")
    return out


def _breakeven_lines(e: dict[str, Any], be: dict[str, Any], title: str) -> list[str]:
    ok = "yes" if be.get("model_ok") else "**no**"
    out = [
        f"- {title}: case `{be['case']}`; model_ok (straight lines not rejected): {ok}; n* from "
        f"`{be.get('model') or 'none (withheld)'}`.",
        f"  - d_fixed = {_ms(be.get('d_fixed_s'))} ms {_ci(be.get('d_fixed_ci'), _ms)}, d_tok = {_us(be.get('d_tok_s'))} "
        f"us/token {_ci(be.get('d_tok_ci'), _us)}.",
        f"  - n* = {_tok_or_none(be['tokens'])} (point estimate {_tok(be.get('tokens_estimate'))}); {be.get('ci_method')} "
        f"interval {_ci(be['ci'])} (shape: {be.get('ci_shape')})"
        + (f"; {be['ci_reason']}" if be.get("ci_reason") else "")
        + (" **Extrapolated** beyond the measured sizes." if be.get("extrapolated") else "."),
    ]
    if be.get("model_reason"):
        out.append(f"  - Why the line is not used: {be['model_reason']}.")
    if be.get("other_roots"):
        out.append(
            f"  - The fitted curves also cross at {', '.join(_tok(r) for r in be['other_roots'])} tokens."
        )
    if be.get("bootstrap_ci") and be.get("ci_method") == "fieller":
        out.append(f"  - Bootstrap cross-check (independent units resampled): {_ci(be.get('bootstrap_ci'))}.")
    if be.get("within_measured") in ("faster", "slower"):
        lo, hi = be["measured_tokens"]
        out.append(
            f"  - Over the measured sizes ({lo:,.0f} to {hi:,.0f}) {e['precision']} is significantly **{be['within_measured']}** at every size."
        )
    out += _crossing_lines(e, be.get("crossing_detail"))
    return out


def _crossing_lines(e: dict[str, Any], c: dict[str, Any] | None) -> list[str]:
    if not c or not c.get("sizes"):
        return [f"  - Measured crossing: n/a ({(c or {}).get('note', 'not computed')})."]
    if c.get("tokens"):
        lo, hi = c["tokens"]
        sig = (
            "significant"
            if c.get("significant")
            else "not significant: the difference at one end is within noise"
        )
        head = f"  - Measured crossing (model-free): between **{lo:,.0f} and {hi:,.0f}** tokens ({sig})"
    else:
        head = "  - Measured crossing (model-free): none"
    note = f"; {c['note']}" if c.get("note") else ""
    pairs = "paired by repeat" if c.get("paired") else "Welch"
    sizes = ", ".join(
        f"{s:,.0f}: {d * 1e3:+.3g} ms" + (f" (p={p:.2g})" if p is not None else "")
        for s, d, p in zip(c["sizes"], c["diff_s"], c["p_values"], strict=True)
    )
    return [f"{head}{note}. {e['precision']} - {e['baseline']} per {c.get('grouping')} ({pairs}): {sizes}."]


def _entry_section(e: dict[str, Any], plots: dict[str, str]) -> list[str]:
    out = [
        f"## {e['model']} / {e['phase']}: {e['precision']} vs {e['baseline']}",
        "",
        f"**{e.get('answer') or e['verdict']}**",
        "",
        e["verdict"],
        "",
    ]
    for prec, why in (e.get("emulated") or {}).items():
        out += [
            f"**{prec} is emulated**: {why}. Its timings are the emulation's (quantize and dequantize around "
            f"higher-precision GEMMs), not what {prec} costs with hardware GEMMs.",
            "",
        ]
    out += [*_fit_table(e), ""]
    out += _breakeven_lines(e, e["breakeven"], "Breakeven (wall clock)")
    gb = e.get("breakeven_gpu_busy")
    if gb:
        out += _breakeven_lines(e, gb, "Breakeven with host overhead removed (GPU busy time)")
    else:
        out.append(
            f"- Breakeven with host overhead removed (GPU busy time): n/a ({e.get('breakeven_gpu_busy_reason')})."
        )
    pb = e["breakeven"].get("paired")
    if pb:
        out.append(
            f"- Paired cross-check ({pb['n_pairs']} (size, repeat) cells an mxperf sweep ran back to back in both "
            f"precisions; fits time_{e['precision']} - time_{e['baseline']} per cell, cancelling shared drift): "
            f"case `{pb['case']}`, n* = {_tok_or_none(pb['tokens'])} {_ci(pb['ci'])} ({pb['ci_shape']})."
        )
    elif e.get("interleaved") is False:
        out.append(
            "- No paired cross-check: the inputs are not an mxperf sweep, so the precisions did not run back "
            "to back (repeats are indices, not shared moments); the crossing uses Welch's test."
        )
    for prec in (e["baseline"], e["precision"]):
        f = e["fits"][prec]
        if f.get("outliers"):
            out.append(
                f"- {prec}: **{len(f['outliers'])} micro-batch(es) left out as outliers** (more than 6 robust "
                f"standard deviations from the median of their size): {describe(f['outliers'])}."
            )
        if f.get("outlier_note"):
            out.append(f"- {prec}: outlier screen: {f['outlier_note']}.")
        out += _model_lines(prec, f)
        if f.get("gpu_busy"):
            out += _model_lines(prec, f["gpu_busy"], " (GPU busy)")
        if f.get("per_step_reason"):
            out.append(f"- {prec}: per-step cost {f['per_step_reason']}.")
        att = f.get("attention")
        if att:
            out.append(f"- {prec}: attention: {att['note']}.")
    hs = e.get("host_stall") or {}
    share = e["host_stall_share_of_added_fixed"]
    if share is None:
        out.append(f"- Host-stall share of the added fixed cost: n/a ({hs.get('reason')}).")
    else:
        ci = (
            "no bounded interval"
            if hs.get("share_ci", [None])[0] is None
            else f"{_ci(hs.get('share_ci'), _pct)} ({hs.get('ci_method')})"
        )
        out.append(
            f"- Host-stall share of the added fixed cost: {_pct(share)} {ci}; basis: {hs.get('basis')}."
        )
    out += _step_lines(e)
    src = e.get("sources") or {}
    if src:
        out.append(
            "- Where the numbers come from: " + "; ".join(f"{k}: {v}" for k, v in src.items() if v) + "."
        )
    for title, name in plots.items():
        out += ["", f"![{title}]({name})"]
    return [*out, ""]


def _extrapolated_best(r: dict[str, Any]) -> str:
    x = r.get("extrapolated_best")
    if not x:
        return ""
    secs = x.get("step_seconds", x.get("step_s"))
    return (
        f"; {x['tokens_per_microbatch']:,} tokens, beyond the largest measured size, predicted {secs:.4g} s "
        "(**extrapolated**: measure it before relying on it)"
    )


def _step_lines(e: dict[str, Any]) -> list[str]:
    step = e.get("step") or {}
    rec = step.get("recommendation") or {}
    out = []
    if rec.get("precision"):
        cap = rec.get("mem_cap_bytes")
        lo, hi = [*list(rec.get("breakeven_ci") or []), None, None][:2]
        out.append(
            f"- Step level, global batch {rec['global_batch_tokens']:,} tokens"
            + (f", memory cap {cap:,.0f} B" if cap else "")
            + f": use **{rec['precision']} at {rec['tokens_per_microbatch']:,} tokens per micro-batch** "
            f"(predicted {rec['step_seconds']:.4g} s per step; case `{rec.get('case')}`"
            + (
                f", breakeven 95 % CI {_tok(lo)} to {_tok(hi)} tokens"
                if lo is not None or hi is not None
                else ""
            )
            + f", from the {rec.get('breakeven_basis')})."
        )
        for prec, r in rec["per_precision"].items():
            if r.get("step_seconds") is not None:
                out.append(
                    f"  - {prec}: best measured size {r['tokens_per_microbatch']:,} tokens -> {r['step_seconds']:.4g} s"
                    + _extrapolated_best(r)
                )
    elif rec.get("reason"):
        out.append(f"- Step-level recommendation: none ({rec['reason']}).")
        for prec, r in (rec.get("per_precision") or {}).items():
            secs = r.get("step_seconds")
            if secs is not None and secs > 0:
                out.append(
                    f"  - {prec}: fastest size {r['tokens_per_microbatch']:,} tokens -> {secs:.4g} s "
                    "(point estimate)"
                )
            elif secs is not None:
                out.append(
                    f"  - {prec}: a predicted step time below zero ({secs:.4g} s): the fit is not physical"
                )
    for sb in step.get("step_breakeven") or []:
        ci = sb.get("ci")
        n = sb.get("tokens")
        what = f"{n:,.0f} tokens" + (f" {_ci(ci)}" if ci else "") if n is not None else "none"
        out.append(
            f"- Step-level breakeven at a global batch of {sb['global_batch_tokens']:,} tokens (per-step costs "
            f"included): {what} (case `{sb.get('case')}`"
            + (f"; {sb['reason']}" if sb.get("reason") else "")
            + ")."
        )
    if step.get("note"):
        out.append(f"- Step level: {step['note']}.")
    other = step.get("other_phases_s") or {}
    if other:
        out.append(
            "- Other phases per step (from run directories): "
            + ", ".join(f"{k} {v:.4g} s" for k, v in other.items())
            + "."
        )
    wi = step.get("what_if")
    if wi:
        knobs = ", ".join(f"{k}={v}" for k, v in wi["knobs"].items() if v is not None)
        wrec = wi["recommendation"]
        best = (
            f"best {wrec.get('precision')} at {wrec.get('tokens_per_microbatch')} tokens, "
            f"{wrec.get('step_seconds') or float('nan'):.4g} s per step (point estimates under the knobs, no "
            "interval)"
            if wrec.get("precision")
            else f"no recommendation ({wrec.get('reason')})"
        )
        out.append(
            f"- What if ({knobs}): {best}; step-level breakeven "
            + ", ".join(
                f"{p}: {_tok(v) + ' tokens' if v is not None else 'none (no crossing up to the global batch)'}"
                for p, v in wi["step_breakeven_tokens"].items()
            )
            + "."
        )
        for p, src in (wi.get("weight_quant_source") or {}).items():
            out.append(
                f"  - weight quantization of {p}: {_ms(wi['weight_quant_s'][p])} ms per micro-batch ({src})."
            )
    return out


def _placement_line(sm: dict[str, Any], phases: list[str]) -> str:
    """'Placement: separate sampler, step = max(generate, update) + sync (--placement).'"""
    pl = sm.get("placement") or {"name": COLOCATED, "source": DEFAULT_SOURCE}
    who = "separate sampler" if pl["name"] == SEPARATE else "colocated sampler"
    return f"Placement: {who}, step = {formula(phases, pl['name'])} ({pl['source']})."


def _step_table(steps: list[dict[str, Any]]) -> list[str]:
    """Per comparison and setting: each precision's seconds per phase and per step (95 % CI), and the gain."""
    out: list[str] = []
    for sm in steps:
        rows = list(sm.get("settings") or [])
        cmp = (sm.get("recommendation") or {}).get("comparison")
        if cmp and not any(
            (r["global_tokens"], r["tokens_per_microbatch"])
            == (cmp["global_tokens"], cmp["tokens_per_microbatch"])
            for r in rows
        ):
            rows.append(cmp)
        if not rows:
            continue
        phases = list(next(iter(sm["phases"].values())))
        out += [
            f"### {sm['model']}: step time per precision (seconds)",
            "",
            _placement_line(sm, phases),
            "",
            "| N | n | micro-batches | precision | "
            + " | ".join(phases)
            + " | step | 95 % CI | gain | 95 % CI | where from |",
            "|---" * (len(phases) + 9) + "|",
        ]
        for r in rows:
            g, gci = r.get("gain"), r.get("gain_ci")
            for i, p in enumerate((sm["baseline"], sm["precision"])):
                pp = r["per_precision"][p]
                cells = " | ".join(f"{pp['phases_s'][ph]:.4g}" for ph in phases)
                last = i == 1
                out.append(
                    f"| {r['global_tokens']:,} | {r['tokens_per_microbatch']:,}"
                    + (" (extrapolated)" if r.get("extrapolated") else "")
                    + f" | {r['microbatches']} | {p} | {cells} | {pp['step_s']:.4g} | "
                    + _ci(pp.get("step_ci"), lambda x: f"{x:.4g}")
                    + " | "
                    + (f"{g:+.1%}" if last and g is not None else "")
                    + " | "
                    + (_ci(gci, lambda x: f"{x:+.1%}") if last else "")
                    + f" | {r['source'] if last else ''} |"
                )
        for r in rows:
            if r.get("packing"):
                pk = r["packing"]
                out.append(
                    f"\nAt N = {r['global_tokens']:,}: update as the runs packed it, "
                    f"{len(pk['microbatch_tokens'])} micro-batches of "
                    f"{', '.join(str(t) for t in pk['microbatch_tokens'])} padded tokens "
                    f"(ceil(N / n) would say {pk['ceil_microbatches']})."
                )
        out.append("")
        for ph, t in sm["phases"][sm["baseline"]].items():
            lo = sm["phases"][sm["precision"]][ph]
            out.append(
                f"- {ph}: {sm['baseline']} {t['kind']} ({t['source']}); {sm['precision']} {lo['kind']} ({lo['source']})."
            )
        out.append("")
        if table := validation_table(sm.get("validation")):
            v = sm["validation"]
            mae = v.get("median_abs_error_pct")
            out += [
                f"### {sm['model']}: predicted vs measured step (run folders)",
                "",
                (
                    f"Median absolute error {mae:.1f} % over {v['counted_rows']} fitted-phase and whole-step rows"
                    if mae is not None
                    else "No out-of-sample row"
                )
                + f" ({v['note']}).",
                "",
                *table,
                "",
            ]
            if w := validation_words(v):
                out += [w, ""]
    return out


def render_report(doc: dict[str, Any], plots: dict[str, dict[str, str]] | None = None) -> str:
    """Markdown for a fits.json document; ``plots``: entry stem -> {title: png file name}."""
    plots = plots or {}
    lines = ["# mxperf cost model", ""]
    steps = doc.get("step_model") or []
    if steps:  # the three-line answer per step comparison, then the step table; statistics below
        lines += ["## Answer", ""]
        for sm in steps:
            first, *rest = sm.get("answer") or []
            lines += [f"**{first}**", "", *(f"{r}  " for r in rest), ""]
        lines += _step_table(steps)
        wl = [line for sm in steps for line in [*what_if_lines(sm), ""] if what_if_lines(sm)]
        if wl:
            lines += ["## What-ifs (95 % intervals)", "", *wl]
        lines += ["## Per phase (micro-batch fits)", ""]
    for e in doc["models"]:  # the answer first: the case and n* with its interval, or why there is none
        lines.append(f"- **{e.get('answer') or e['verdict']}**")
    lines.append("")
    if steps:
        lines += ["## Statistical details", ""]
    for e in doc["models"]:
        lines.append(f"- {e['verdict']}")
    lines += [
        "",
        "Model per micro-batch: seconds = fixed + per_token x n (+ per-step cost on micro-batch 0, + attention's "
        "quadratic term when sequence lengths are known); where lack of fit rejects the line, a knee model "
        "(host line + GPU line, or a segmented line) chosen by the data. OLS on every micro-batch with "
        "leave-one-unit-out (CR3) covariance over independent units (steps), 95 % t intervals; "
        f"{doc['bootstrap']['resamples']} bootstrap resamples of units. x = {doc['x_variable']}. Breakeven per "
        "the contract's case table (Fieller interval for lines, bootstrap for knee models; docs/cost-model.md)."
        + (
            f" Sizes below {doc['min_tokens']} tokens excluded (--min-tokens)."
            if doc.get("min_tokens")
            else ""
        ),
        "",
        "## Inputs",
        "",
        "| input | kind | micro-batches | gives | cannot give | machine |",
        "|---|---|---|---|---|---|",
    ]
    for s in doc.get("inputs", []):
        lines.append(
            f"| `{s['path']}` | {s['kind']} | {s['rows']} | {s['gives']} | {s['cannot_give']} "
            f"| {s.get('machine', '-')} |"
        )
    machines = sorted({s.get("machine") for s in doc.get("inputs", [])} - {None, "-"})
    if len(machines) > 1:
        lines += [
            "",
            f"**Inputs from {len(machines)} different machines** ({'; '.join(machines)}): a fixed or per-token "
            "difference between precisions measured on different machines is partly the machines'.",
        ]
    for note in doc.get("notes") or []:
        lines += ["", f"Note: {note}."]
    lines.append("")
    for e in doc["models"]:
        lines += _entry_section(e, plots.get(entry_stem(e), {}))
    return "\n".join(lines) + "\n"
