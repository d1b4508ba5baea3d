"""report.md from a fits.json document: the verdict first, then the numbers behind it. Returns a string."""

from __future__ import annotations

from typing import Any

from perfmodel.results import entry_stem


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
        "| precision | fixed (ms) | 95 % CI (HC3) | bootstrap CI | per token (us) | 95 % CI (HC3) | bootstrap CI "
        "| R^2 | points | micro-batches | hold-out MAPE interp / extrap |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for prec in (e["baseline"], e["precision"]):
        f = e["fits"][prec]
        ho = f.get("holdout") or {}
        lines.append(
            f"| {prec} | {_ms(f['fixed_s'])} | {_ci(f['fixed_ci'], _ms)} | {_ci(f.get('fixed_boot_ci'), _ms)} "
            f"| {_us(f['per_token_s'])} | {_ci(f['per_token_ci'], _us)} | {_ci(f.get('per_token_boot_ci'), _us)} "
            f"| {f['r2']:.4f} | {f['n_points']} | {f.get('n_microbatches', '')} "
            f"| {_pct(ho.get('interpolation_mape'))} / {_pct(ho.get('extrapolation_mape'))} |"
        )
    return lines


def _entry_section(e: dict[str, Any], plots: dict[str, str]) -> list[str]:
    be = e["breakeven"]
    out = [
        f"## {e['model']} / {e['phase']}: {e['precision']} vs {e['baseline']}",
        "",
        f"**{e['verdict']}**",
        "",
    ]
    out += [*_fit_table(e), ""]
    out += [
        f"- Case: `{be['case']}`. d_fixed = {_ms(be.get('d_fixed_s'))} ms {_ci(be.get('d_fixed_ci'), _ms)}, "
        f"d_tok = {_us(be.get('d_tok_s'))} us/token {_ci(be.get('d_tok_ci'), _us)} (95 %, Welch dof "
        f"{be.get('dof') or 0:.0f}).",
        f"- n* = {_tok_or_none(be['tokens'])} (point ratio {_tok(be.get('tokens_estimate'))}); {be['ci_method']} "
        f"interval {_ci(be['ci'])} (shape: {be.get('ci_shape')})"
        + (f"; {be['ci_reason']}" if be.get("ci_reason") else "")
        + ".",
        f"- Bootstrap cross-check (repeats resampled within each size): {_ci(be.get('bootstrap_ci'))}"
        + (f" ({be['bootstrap_reason']})" if be.get("bootstrap_reason") else "")
        + ".",
        f"- Measured sizes {_tok(be['measured_tokens'][0])} to {_tok(be['measured_tokens'][1])} tokens"
        + ("; n* is **extrapolated** beyond them." if be.get("extrapolated") else ".")
        + (
            f" Over that range {e['precision']} is significantly **{be['within_measured']}** at every size."
            if be.get("within_measured") in ("faster", "slower")
            else ""
        ),
    ]
    pb = be.get("paired")
    if pb:
        out.append(
            f"- Paired cross-check ({pb['n_pairs']} (size, repeat) cells run back to back in both precisions; "
            f"fits time_{e['precision']} - time_{e['baseline']} per cell, cancelling shared drift): case "
            f"`{pb['case']}`, d_fixed = {_ms(pb['d_fixed_s'])} ms {_ci(pb['d_fixed_ci'], _ms)}, d_tok = "
            f"{_us(pb['d_tok_s'])} us/token {_ci(pb['d_tok_ci'], _us)}, n* = {_tok_or_none(pb['tokens'])} "
            f"{_ci(pb['ci'])} ({pb['ci_shape']}); {e['precision']} is {pb['within_measured']} over the measured "
            "sizes."
        )
    for prec in (e["baseline"], e["precision"]):
        for msg in e["fits"][prec].get("implausible") or []:
            out.append(f"- {prec}: **implausible coefficients**: {msg}.")
        lof = e["fits"][prec].get("lack_of_fit")
        if lof:
            p = "n/a" if lof["p_value"] is None else f"{lof['p_value']:.3g}"
            flag = "**lack of fit**" if lof["flag"] else "line ok"
            out.append(
                f"- {prec}: {flag} ({lof['test']}, p = {p}, max deviation {lof['max_rel_dev']:.1%}): {lof['note']}."
            )
    hs = e.get("host_stall") or {}
    share = e["host_stall_share_of_added_fixed"]
    if share is None:
        out.append(f"- Host-stall share of the added fixed cost: n/a ({hs.get('reason')}).")
    else:
        out.append(
            f"- Host-stall share of the added fixed cost: {_pct(share)} {_ci(hs.get('share_ci'), _pct)} "
            f"({hs.get('ci_method')}; bootstrap {_ci(hs.get('bootstrap_ci'), _pct)})."
        )
    out += _step_lines(e)
    for title, name in plots.items():
        out += ["", f"![{title}]({name})"]
    return [*out, ""]


def _step_lines(e: dict[str, Any]) -> list[str]:
    step = e.get("step") or {}
    rec = step.get("recommendation") or {}
    out = []
    if rec.get("precision"):
        cap = rec.get("mem_cap_bytes")
        out.append(
            f"- Step level, global batch {rec['global_batch_tokens']:,} tokens"
            + (f", memory cap {cap:,.0f} B" if cap else "")
            + f": use **{rec['precision']} at {rec['tokens_per_microbatch']:,} tokens per micro-batch** "
            f"(predicted {rec['step_seconds']:.4g} s per step)."
        )
        for prec, r in rec["per_precision"].items():
            if r.get("step_seconds") is not None:
                out.append(
                    f"  - {prec}: best {r['tokens_per_microbatch']:,} tokens -> {r['step_seconds']:.4g} s"
                    + (" (extrapolated)" if r.get("extrapolated") else "")
                )
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
        out.append(
            f"- What if ({knobs}): best {wrec.get('precision')} at {wrec.get('tokens_per_microbatch')} "
            f"tokens, {wrec.get('step_seconds') or float('nan'):.4g} s per step; step-level breakeven "
            + ", ".join(
                f"{p}: {_tok(v) + ' tokens' if v is not None else 'none (the step times never cross)'}"
                for p, v in wi["step_breakeven_tokens"].items()
            )
            + "."
        )
        for p, src in (wi.get("weight_quant_source") or {}).items():
            out.append(
                f"  - weight quantization of {p}: {_ms(wi['weight_quant_s'][p])} ms per micro-batch ({src})."
            )
    return out


def render_report(doc: dict[str, Any], plots: dict[str, dict[str, str]] | None = None) -> str:
    """Markdown for a fits.json document; ``plots``: entry stem -> {title: png file name}."""
    plots = plots or {}
    lines = ["# mxperf cost model", ""]
    for e in doc["models"]:
        lines.append(f"- {e['verdict']}")
    lines += [
        "",
        "Model per micro-batch: seconds = fixed + per_token x n (OLS on repeat means, HC3 errors, 95 % t "
        f"intervals; {doc['bootstrap']['resamples']} bootstrap resamples of repeats within each size). "
        f"x = {doc['x_variable']}. Breakeven per SPEC.md (Fieller interval)."
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
    lines.append("")
    for e in doc["models"]:
        lines += _entry_section(e, plots.get(entry_stem(e), {}))
    return "\n".join(lines) + "\n"
