"""The Breakeven page's step-level cards: predicted step time over (N, n) with its interval and what-ifs, fits.json's
predicted-vs-measured step table (as written), and a fit's micro-batch prediction against its model's runs.

Streamlit rendering only; the numbers come from ``perfmodel`` (``step``, ``step_interval``, ``Curve``) and ``dashboards.fitsview``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts_fit, data, fitsview, share, ui
from perfmodel.fitting import model as pm
from perfmodel.step import costs as step
from perfmodel.step import interval as step_interval
from perfmodel.step.validation import validation_words
from tracing.outputs import store
from tracing.outputs.errors import MxperfError


def predicted_step_card(
    doc: dict[str, Any],
    chosen: dict[str, Any],
    sizes: Sequence[float],
    top: float,
    source: str = "",
) -> None:
    """Step seconds of both precisions for a global batch N split into micro-batches of n <= N tokens.
    ``source`` names the fit and entry (the widgets start again from their defaults when it changes)."""
    base_id, low_id = chosen["baseline"], chosen["precision"]
    fits = chosen["fits"]
    with ui.card("Predicted step time"):
        st.caption(
            "step(N, n) = (N / n) x fixed + N x per_token (+ per-step cost) + other phases (perfmodel.step.costs). n can "
            "never exceed N (a step holds at least one micro-batch). The difference carries the fits' 95 % interval; "
            "what-ifs change the low precision only and are scenarios (no interval)."
        )
        withheld = fitsview.unusable(chosen)
        if withheld:
            st.info(
                "No prediction from this fit: "
                + "; ".join(f"{p}: {why}" for p, why in withheld.items())
                + ". A step time built on such a line would be no measurement's; `mxperf fit` withholds it too."
            )
            return
        n_global_default = doc.get("global_batch_tokens")
        if (
            not n_global_default
        ):  # none invented: the user picks N, starting at one measured micro-batch a step
            why = ((chosen.get("step") or {}).get("recommendation") or {}).get("reason")
            n_global_default = int(max(sizes or [1024]))
            st.info(
                "This fits.json has no global batch (`global_batch_tokens` is empty"
                + (f"; mxperf fit: {why}" if why else "")
                + "), so the step below is at the N you pick, not your run's: it starts at the largest measured "
                f"micro-batch ({n_global_default:,} tokens, one micro-batch a step). `mxperf fit --global-batch N`, "
                "or run folders / traced steps that record it, give yours."
            )
        n_global_default = int(n_global_default)
        others, others_source = other_phase_defaults(chosen)
        pair = ui.current_pair()
        new_format = "other_phases_by_precision_s" in (chosen.get("step") or {})
        if new_format and not any(others.values()):
            others_source = (
                "fits.json, which gives none (no run folders or --phase in the fit): the step holds the fitted "
                "phase only; enter the others here"
            )
        elif not any(others.values()) and pair is not None and pair.model == chosen["model"]:
            try:  # the sidebar pair's own phases, each precision its own, by mxperf fit's rule
                others = pair_other_phases(pair, chosen)
                others_source = (
                    f"the sidebar pair's steps ({pair.baseline.rel}, {pair.other.rel}) by {OTHER_PHASES_RULE}"
                )
            except (ValueError, MxperfError):
                others = {base_id: 0.0, low_id: 0.0}
        measured = (min(sizes), max(sizes)) if sizes else None
        n_options = fitsview.size_options(
            min(sizes or [64]) / 2, max(4 * max(sizes or [1024]), n_global_default) * 4
        )
        n_options = sorted(set(n_options) | {n_global_default})
        c1, c2 = st.columns(2)
        url_n = share.restore("be_N", n_options, 0)
        ui.widget_default("be_N", (source, n_global_default), n_global_default, n_options, keep=url_n)
        global_tokens = c1.select_slider("Global batch, tokens per step (N)", n_options, key="be_N")
        share.keep("be_N")
        mb_options = [
            o for o in fitsview.size_options(min(sizes or [64]) / 2, global_tokens) if o <= global_tokens
        ]
        mb_options = sorted(set(mb_options) | {int(s) for s in sizes if s <= global_tokens}) or [
            int(global_tokens)
        ]
        mb_default = fitsview.default_microbatch(mb_options, sizes, int(global_tokens))
        url_mb = share.restore("be_n", mb_options, 0)
        ui.widget_default("be_n", source, mb_default, mb_options, keep=url_mb)
        n = c2.select_slider("Tokens per micro-batch (n ≤ N)", mb_options, key="be_n")
        share.keep("be_n")
        other_s = {}
        for prec, key, col in ((base_id, "be_other", c1), (low_id, "be_other_low", c2)):
            default = round(float(others[prec]), 4)
            url_other = share.restore(key, like=0.0, check=lambda v: v >= 0)
            ui.widget_default(key, (source, default), default, keep=url_other)
            other_s[prec] = col.number_input(
                f"Other phases per step, {prec}, seconds (generate, sync, …)",
                min_value=0.0,
                format="%.4f",
                help="Phases that do not depend on n, each precision its own: " + others_source + ".",
                key=key,
            )
            share.keep(key)
        st.caption(
            f"Other phases from {others_source}. Which steps: every step, the warm-up step included, as mxperf "
            "fit counts them (a run pays its warm-up step); Step time's per-phase medians leave the warm-up step "
            "out to compare steady steps, so they can differ."
        )
        st.markdown("**What if** (the cost model's knobs, applied to the low precision)")
        k1, k2 = st.columns(2)
        share.restore("be_scale", like=1.0, check=lambda v: 0.0 <= v <= 2.0)
        share.restore("be_wq", like=False)
        st.session_state.setdefault("be_scale", 1.0)
        scale = k1.slider(
            "fixed_scale: added fixed cost x",
            0.0,
            2.0,
            step=0.05,
            key="be_scale",
            help="0.5 = half of the fixed cost it adds over the baseline (n* halves)",
        )
        per_step = k2.toggle(
            "weight_quant=per_step: quantize weights once per step, not per micro-batch", key="be_wq"
        )
        share.keep("be_scale")
        share.keep("be_wq")
        knobs = step.WhatIf(fixed_scale=scale, weight_quant="per_step" if per_step else "per_microbatch")
        lines_fit = fitsview.fit_lines(chosen)
        curves = {
            p: pm.Curve.from_dict(k) for p in lines_fit if (k := fitsview.chosen_knee(fits[p])) is not None
        }
        q, q_source = step.weight_quant_seconds(lines_fit[base_id], lines_fit[low_id], knobs)
        costs = step.step_costs(
            lines_fit,
            base_id,
            None,
            knobs,
            {low_id: q},
            curves,
            {p: {"other": v} for p, v in other_s.items()},
        )
        predicted = {p: float(c.seconds(global_tokens, n)) for p, c in costs.items()}
        m1, m2 = st.columns(2)
        m1.metric(f"{base_id} step", f"{predicted[base_id]:.3g} s")
        m2.metric(f"{low_id} step", f"{predicted[low_id]:.3g} s")
        if curves and not knobs.active:
            st.markdown(
                f"At n = {n:,}: {low_id} {predicted[low_id]:.3g} s vs {base_id} {predicted[base_id]:.3g} s per step "
                f"({100 * (predicted[low_id] / predicted[base_id] - 1):+.1f} %), from the knee model the data chose for "
                f"{', '.join(curves)}; no interval (the interval here is for straight lines)."
            )
        elif knobs.active:
            st.markdown(
                f"What-if: {low_id} {predicted[low_id]:.3g} s vs {base_id} {predicted[base_id]:.3g} s per step at "
                f"n = {n:,} "
                f"({100 * (predicted[low_id] / predicted[base_id] - 1):+.1f} %; a scenario, no interval)."
            )
        else:
            diff = with_other_phases(
                step_interval.step_difference(fits[base_id], fits[low_id], global_tokens, n),
                other_s[base_id],
                other_s[low_id],
            )
            st.markdown(
                f"At n = {n:,}, N = {global_tokens:,}: "
                + step_interval.difference_words(diff, low_id, base_id)
            )
            if other_s[base_id] != other_s[low_id]:
                st.caption(
                    f"The other phases differ by {other_s[low_id] - other_s[base_id]:+.4g} s per step "
                    f"({low_id} - {base_id}): added to the difference as given; the interval is the fits' "
                    "(the whole-step interval with the phases' own spread is fits.json's step_model)."
                )
        crossing = step.step_breakeven(costs[base_id], costs[low_id], global_tokens)
        st.caption(
            fitsview.step_crossing_words(chosen, int(global_tokens), crossing, sizes, scenario=knobs.active)
            + (
                f" Weight quantization per micro-batch taken as {q * 1e3:.3g} ms ({q_source})."
                if knobs.weight_quant == "per_step"
                else ""
            )
        )
        rec = (chosen.get("step") or {}).get("recommendation") or {}
        if rec.get("precision"):
            extrapolated = ((rec.get("per_precision") or {}).get(rec["precision"]) or {}).get("extrapolated")
            st.caption(
                f"mxperf fit recommends {rec['precision']} at {rec['tokens_per_microbatch']:,} tokens per micro-batch "
                f"for N = {rec.get('global_batch_tokens', 0):,} ({rec['step_seconds']:.3g} s per step)"
                + (
                    f" -- extrapolated: above the largest measured size ({max(sizes):,.0f} tokens)."
                    if extrapolated and sizes
                    else "."
                )
            )
        elif rec.get("reason"):
            st.caption(f"mxperf fit withholds its recommendation: {rec['reason']}")
        grid = np.geomspace(max(min(mb_options), 1), global_tokens, 200)
        ui.chart(
            charts_fit.step_prediction_figure(
                grid,
                {p: c.seconds(global_tokens, grid) for p, c in costs.items()},
                n,
                global_tokens,
                measured,
            ),
            "predicted-step-time",
            "be_pred",
        )


OTHER_PHASES_RULE = (
    "mxperf fit's rule (perfmodel.step.model.other_phase_seconds: per phase the median over every step of the "
    "run folders, warm-up step included, summed)"
)


def pair_other_phases(pair: Any, chosen: dict[str, Any]) -> dict[str, float]:
    """Per precision, seconds per step of the phases besides the fitted one in the sidebar pair's run folders,
    computed by the function ``mxperf fit`` uses for its step model (:data:`OTHER_PHASES_RULE`), so the page
    and fits.json never give two numbers for one run. Raises ValueError when a side is not a run folder."""
    from perfmodel.inputs.load import read_run_folder
    from perfmodel.step.model import other_phase_seconds

    base, low = chosen["baseline"], chosen["precision"]
    if any(e.kind != "run" for e in (pair.baseline, pair.other)):
        raise ValueError("other phases are read from run folders (mxperf run's metrics.parquet)")
    root = ui.runs_dir()
    runs = [
        read_run_folder(data.resolve_inside(root, e.rel), e.manifest) for e in (pair.baseline, pair.other)
    ]
    own = other_phase_seconds(chosen["model"], [base, low], runs, {}, {}, exclude=chosen["phase"])
    return {p: float(sum((own.get(p) or {}).values())) for p in (base, low)}


def other_phase_defaults(chosen: dict[str, Any]) -> tuple[dict[str, float], str]:
    """Seconds per step of the phases besides the fitted one, per precision: fits.json's
    ``step.other_phases_by_precision_s`` (each precision's own, as ``mxperf fit`` adds them) plus the shared
    ``step.other_phases_s``; an older fits.json has only the shared ones (the same for both)."""
    base, low = chosen["baseline"], chosen["precision"]
    sec = chosen.get("step") or {}
    shared = float(sum((sec.get("other_phases_s") or {}).values()))
    by = sec.get("other_phases_by_precision_s")
    if isinstance(by, dict) and any(by.get(p) for p in (base, low)):
        return (
            {p: shared + float(sum((by.get(p) or {}).values())) for p in (base, low)},
            "fits.json (step.other_phases_by_precision_s, each precision's own"
            + (", plus step.other_phases_s" if shared else "")
            + ")",
        )
    return {base: shared, low: shared}, "fits.json (step.other_phases_s, the same for both precisions)"


def with_other_phases(
    d: step_interval.StepDifference, base_s: float, low_s: float
) -> step_interval.StepDifference:
    """A step difference with each precision's own other phases added (they no longer cancel)."""
    shift = low_s - base_s
    return dataclasses.replace(
        d,
        base_s=d.base_s + base_s,
        low_s=d.low_s + low_s,
        diff_s=d.diff_s + shift,
        diff_ci=None if d.diff_ci is None else (d.diff_ci[0] + shift, d.diff_ci[1] + shift),
    )


VALIDATION_FORMAT = {
    "predicted s": st.column_config.NumberColumn("predicted s", format="%.4g"),
    "measured s": st.column_config.NumberColumn("measured s", format="%.4g"),
    "error %": st.column_config.NumberColumn("error %", format="%+.1f"),
}


def validation_card(doc: dict[str, Any], chosen: dict[str, Any]) -> None:
    """fits.json's predicted-vs-measured step table for the entry's step comparison (the rows and numbers of
    report.md, ``perfmodel.step.validation``), or why there is none and how to get one."""
    with ui.card(
        f"{chosen['model']}: predicted vs measured step (run folders, fits.json)", key="be_validation"
    ):
        missing = fitsview.no_validation_words(doc, chosen)
        if missing:
            st.info(missing)
            return
        v = (fitsview.step_model_of(doc, chosen) or {}).get("validation") or {}
        words = validation_words(v)
        mae = v.get("median_abs_error_pct")
        st.markdown(
            words
            or (
                f"Median absolute error {mae:.1f} % over {v['counted_rows']} rows."
                if mae is not None
                else "No row counted in the median absolute error (every row is in-sample)."
            )
        )
        st.caption(
            "The table `mxperf fit` wrote (fits.json `step_model[].validation`, the same as report.md): per run "
            "folder given to it, each phase and the whole step, medians over steps of the step model's prediction "
            "at each step's own settings and of the measured seconds; error = predicted / measured - 1. The median "
            "absolute error counts the fitted-phase and whole-step rows only: in-sample rows (a phase predicted "
            "from the same run folder's own steps, so no test of the model) are shown but not counted; a fitted row "
            "says which part of it is in-sample. "
            "The 95 % band is the prediction's (the fits' and medians' bootstrap), not the runs' step-to-step "
            "noise, so `inside` is a strict test."
        )
        root, rels = ui.runs_dir(), [e.rel for e in ui.entries()]
        st.dataframe(
            fitsview.validation_frame(v, root, rels), hide_index=True, column_config=VALIDATION_FORMAT
        )
        ui.download_table(
            fitsview.validation_numbers(v, root, rels),
            f"predicted-vs-measured-step-{chosen['model']}-{chosen['precision']}",
            "be_validation",
        )
        left_out = [
            f"{fitsview.run_label(r['run'], root, rels)} {r['precision']}: {', '.join(r['not_in_step_model'])}"
            for r in v["rows"]
            if r.get("not_in_step_model")
        ]
        if left_out:
            st.caption(
                "Measured in the whole step but in no term of the step model: " + "; ".join(left_out) + "."
            )
        for note in v.get("skipped") or []:
            st.caption(f"Not compared: {note}")


def measured_vs_predicted_card(chosen: dict[str, Any]) -> None:
    """Each run of the model: its per-step micro-batch seconds against the fit's prediction for them."""
    base_id, low_id = chosen["baseline"], chosen["precision"]
    fits = chosen["fits"]
    with ui.card("Measured vs predicted micro-batches (runs of this model)"):
        st.caption(
            f"Each run's per-step {chosen['phase']} micro-batch seconds against the fit's prediction for the same number "
            "of micro-batches and tokens (medians over steps). The band is the fitted mean's 95 % interval; a run's "
            "own noise and machine are not in it (fits.json inputs say where the fit was measured). Computed here "
            "from the fitted lines, for every run of the model under the runs directory, whether or not it was "
            "given to mxperf fit: the micro-batches only (no per-step or optimizer cost, no other phase). The step "
            "model's own comparison, whole phases and steps of the run folders given to mxperf fit, is the "
            "predicted-vs-measured step table above."
        )
        runs = [e for e in ui.usable("run", chosen["model"]) if e.learner in (base_id, low_id)]
        withheld = fitsview.unusable(chosen)
        rows, numbers = [], []
        for run in runs:
            if run.learner in withheld:
                rows.append(
                    {
                        "run": run.rel,
                        "precision": run.learner,
                        "note": f"no prediction: {withheld[run.learner]}",
                    }
                )
                continue
            metrics = ui.table(run, store.METRICS, required=False)
            col = next(
                (
                    c
                    for c in (f"{chosen['phase']}_microbatch_s", f"{chosen['phase']}_s")
                    if metrics is not None and c in metrics
                ),
                None,
            )
            if (
                metrics is None
                or col is None
                or not {"num_microbatches", f"{chosen['phase']}_tokens"} <= set(metrics)
            ):
                rows.append(
                    {
                        "run": run.rel,
                        "precision": run.learner,
                        "note": "no micro-batch counts and tokens per step",
                    }
                )
                continue
            m = metrics.sort_values("step").iloc[1:] if len(metrics) >= 3 else metrics
            res = step_interval.predicted_vs_measured(
                fits[run.learner], m["num_microbatches"], m[f"{chosen['phase']}_tokens"], m[col]
            )
            band = (
                f"{res['predicted_lo_s']:.3g} – {res['predicted_hi_s']:.3g}"
                if res["predicted_lo_s"] is not None
                else "none"
            )
            numbers.append({"run": run.rel, "precision": run.learner, "from": col, **res})
            rows.append(
                {
                    "run": run.rel,
                    "precision": run.learner,
                    "steps": res["steps"],
                    "micro-batches, tokens": f"{res['microbatches_median']:.0f}, {res['tokens_median']:,.0f}",
                    "measured s": round(res["measured_s"], 4),
                    "from": col,
                    "predicted s [95 % band]": f"{res['predicted_s']:.3g} [{band}]",
                    "error %": None if res["error_pct"] is None else round(res["error_pct"], 1),
                    "inside band": res["inside"],
                }
            )
        if rows:
            st.dataframe(pd.DataFrame(rows), hide_index=True)
            if numbers:
                ui.download_table(
                    pd.DataFrame(numbers),
                    f"measured-vs-predicted-{chosen['model']}-{chosen['phase']}",
                    "be_mvp",
                )
        else:
            st.info(
                f"No run of {chosen['model']} with learner {base_id} or {low_id} under the runs directory."
            )
