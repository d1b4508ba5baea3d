"""Breakeven: time per micro-batch vs tokens, fitted lines with 95 % bands, n*, the measured crossing, two fits
overlaid, step-time predictions with their interval, and the fit's prediction against measured runs."""

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, compare, data, fitsview, ui
from perfmodel import model as pm
from perfmodel import results, step, step_interval
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

NONE = "(none)"
_KNOWN = {
    "sources",
    "model",
    "phase",
    "baseline",
    "precision",
    "fits",
    "breakeven",
    "breakeven_gpu_busy",
    "verdict",
    "step",
}

st.title("Breakeven")
st.caption(
    "Each micro-batch costs fixed + per_token x n seconds. A low precision that adds fixed cost but saves "
    "per token pays off above n* = added fixed / per-token saving. Fits come from `mxperf fit`, points from "
    "`mxperf sweep` or ingested traces (micro-batches found by a range or detected) of the same model."
)

all_fits = ui.entries()
fit_dirs = data.newest_first(ui.usable("fit"))
if not fit_dirs:
    ui.unusable_notes([e for e in all_fits if e.kind == "fit" or e.kind is None], "fit")
    st.info(
        "No complete fit output under the runs directory. Make one with `mxperf fit SWEEP_DIR -o RUNS_DIR/fit`."
    )
    st.stop()

rels = [e.rel for e in fit_dirs]
c1, c2 = st.columns(2)
fit_dir = fit_dirs[rels.index(c1.selectbox("Fit output", rels, key="be_fit"))]
overlay_rel = c2.selectbox(
    "Overlay a second fit", [NONE, *rels], key="be_overlay", help="its lines drawn dashed on the same chart"
)

doc: dict = {}
with ui.card("Verdict", fit_dir):
    doc = results.validate_fits(ui.json_file(fit_dir, store.FITS), f"{fit_dir.rel}/{store.FITS}")
    if not doc["models"]:
        raise ValueError(f"{fit_dir.rel}/{store.FITS}: no models fitted")
    for m in doc["models"]:
        st.markdown("- " + fitsview.units(m.get("verdict") or fitsview.breakeven_sentence(m)))
        if isinstance(m.get("breakeven_gpu_busy"), dict):
            st.markdown("- " + fitsview.breakeven_sentence(m, "breakeven_gpu_busy"))
    inputs = doc.get("inputs")
    if inputs:
        st.markdown("**Where each number comes from** (the fit's inputs):")
        st.dataframe(pd.DataFrame(inputs), hide_index=True)
    with st.container(horizontal=True):
        ui.download_file(fit_dir, store.FITS, "⬇ fits.json", "be_fits")
        if ui.has(fit_dir, store.REPORT):
            ui.download_file(fit_dir, store.REPORT, "⬇ report.md", "be_report")
    pngs = ui.files(fit_dir, "*.png")
    if pngs:
        png = st.selectbox("Plot of `mxperf fit` (PNG)", pngs, key="be_png")
        ui.download_file(fit_dir, png, "⬇ PNG", "be_png_dl")
if not doc.get("models"):
    st.stop()

models = doc["models"]
entry_labels = [f"{m['model']} / {m['phase']}: {m['precision']} vs {m['baseline']}" for m in models]
chosen = models[entry_labels.index(st.selectbox("Model, phase and precision", entry_labels, key="be_entry"))]
base_id, low_id = chosen["baseline"], chosen["precision"]
fits = chosen["fits"]
be = chosen.get("breakeven") or {}
points = pd.DataFrame(columns=["precision", "num_tokens", "seconds"])
sizes = [s for p in (base_id, low_id) for s in (fits[p].get("sizes") or [])]
top = max(float(be.get("tokens") or 0) * 1.2, max(sizes or [1024]))

overlay: dict | None = None
if overlay_rel != NONE and overlay_rel != fit_dir.rel:
    with ui.card(f"Overlay: {overlay_rel}", fit_dirs[rels.index(overlay_rel)]):
        other_doc = results.validate_fits(
            ui.json_file(fit_dirs[rels.index(overlay_rel)], store.FITS), f"{overlay_rel}/{store.FITS}"
        )
        same = [
            m
            for m in other_doc["models"]
            if (m["model"], m["phase"], m["precision"]) == (chosen["model"], chosen["phase"], low_id)
        ]
        overlay = same[0] if same else (other_doc["models"][0] if other_doc["models"] else None)
        if overlay is None:
            raise ValueError(f"{overlay_rel}/{store.FITS}: no models fitted")
        st.markdown("- " + fitsview.units(overlay.get("verdict") or fitsview.breakeven_sentence(overlay)))
        if not same:
            st.caption(
                f"No {chosen['model']} / {chosen['phase']} / {low_id} entry there: overlaying its first entry."
            )

basis = fitsview.WALL
if len(fitsview.bases(chosen)) > 1:
    basis = st.radio("Basis", fitsview.bases(chosen), horizontal=True, key="be_basis")
basis_fits, basis_be, y_col = fitsview.basis_view(chosen, basis)

with ui.card(f"{chosen['model']} / {chosen['phase']}: time per micro-batch ({basis})"):
    candidates = ui.usable("sweep") + ui.usable("ingest")
    sources = data.inputs_of(fit_dir, candidates)
    if not sources:
        sources = [e for e in candidates if e.model == chosen["model"]]
        if sources:
            st.caption("Points from every sweep or trace of this model: the fit's own inputs are not here.")
    broken_inputs = [e for e in data.inputs_of(fit_dir, ui.entries()) if not e.usable]
    ui.unusable_notes(broken_inputs, "input")
    frames = list(ui.tables_of(sources, store.MICROBATCHES).values())
    if frames:
        points = pd.concat(frames, ignore_index=True)
        points = points[(points["phase"] == chosen["phase"]) & points["precision"].isin([base_id, low_id])]
        if y_col != "seconds":
            points = points.assign(seconds=pd.to_numeric(points.get(y_col), errors="coerce")).dropna(
                subset=["seconds"]
            )
    if len(points):
        top = max(top, float(points["num_tokens"].max()))
    ns = np.linspace(0, top * 1.05, 200)
    lines, no_band, dashed, knees = {}, [], [], []
    drawn = [(basis_fits, "")]
    if overlay:
        drawn.append(
            (
                fitsview.basis_view(overlay, basis)[0] if basis in fitsview.bases(overlay) else {},
                f" ({overlay_rel})",
            )
        )
    for fits_here, suffix in drawn:
        for prec, fit in fits_here.items():
            knee = fitsview.chosen_knee(fit)
            if knee is not None:  # the data chose a knee model: draw it, the band is the line's
                pred, lo, hi = pm.Curve.from_dict(knee)(ns), None, None
                knees.append(fitsview.knee_words(prec + suffix, fit))
            else:
                try:
                    pred, lo, hi = pm.fit_band(fit, ns)
                except ValueError:
                    pred, lo, hi = np.asarray(pm.predict_microbatch_seconds(fit, ns)), None, None
                    no_band.append(prec + suffix)
            lines[prec + suffix] = (ns, pred, lo, hi)
            if suffix:
                dashed.append(prec + suffix)
    ui.chart(
        charts.breakeven_figure(
            points,
            lines,
            basis_be.get("tokens"),
            basis_be.get("ci") or (None, None),
            crossing=basis_be.get("crossing"),
            dashed=dashed,
        ),
        f"breakeven-{chosen['model']}-{chosen['phase']}-{low_id}",
        "be_chart",
    )
    for words in knees:
        st.caption(words)
    st.markdown(
        fitsview.breakeven_sentence(chosen, "breakeven" if basis == fitsview.WALL else "breakeven_gpu_busy")
    )
    st.dataframe(fitsview.breakeven_facts(chosen), hide_index=True)
    if no_band:
        st.caption(f"No 95 % band for {', '.join(no_band)}: this fits.json carries no covariance.")
    if not len(points) and not broken_inputs:
        st.caption(
            "No micro-batch table of this model under the runs directory: only the fitted lines are drawn."
        )
    st.dataframe(fitsview.fit_table(chosen, basis_fits), hide_index=True)
    src = fitsview.sources_table(chosen)
    if src is not None:
        st.markdown("**Where each number comes from**")
        st.dataframe(src, hide_index=True)
    if len(points):
        st.markdown("**Measured points** (mean per size)")
        agg = {"seconds": ("seconds", "mean"), "micro_batches": ("seconds", "size")}
        if "source" in points:
            agg["source"] = ("source", lambda s: ", ".join(sorted(set(map(str, s.dropna())))))
        for col, name, scale in (("achieved_flop_per_s", "TFLOP/s", 1e-12), ("mfu", "MFU %", 100.0)):
            if col in points and pd.to_numeric(points[col], errors="coerce").notna().any():
                agg[name] = (col, lambda s, k=scale: k * pd.to_numeric(s, errors="coerce").mean())
        per_size = points.groupby(["precision", "tokens_per_microbatch"], as_index=False).agg(**agg)
        st.dataframe(per_size, hide_index=True)
        if "MFU %" not in per_size:
            st.caption("MFU: not in this output (the device's peak FLOP/s is unknown, e.g. a CPU).")
        ui.download_table(points, f"microbatches-{chosen['model']}-{chosen['phase']}", "be_points")
    rest = {k: v for k, v in chosen.items() if k not in _KNOWN}
    if rest:
        with st.expander("Other fields of this entry in fits.json (knee, host stall, memory, …)"):
            st.json(rest, expanded=False)

with ui.card("Predicted step time"):
    st.caption(
        "step(N, n) = (N / n) x fixed + N x per_token (+ per-step cost) + other phases (perfmodel.step). n can "
        "never exceed N (a step holds at least one micro-batch). The difference carries the fits' 95 % interval; "
        "what-ifs change the low precision only and are scenarios (no interval)."
    )
    other_phases = (chosen.get("step") or {}).get("other_phases_s") or {}
    other_default = float(sum(other_phases.values()))
    pair = ui.current_pair()
    if not other_default and pair is not None and pair.model == chosen["model"]:
        try:
            med = compare.phase_medians(ui.step_table(pair.baseline))
            other_default = float(med.drop(["step", chosen["phase"]], errors="ignore").sum())
        except (ValueError, MxperfError):
            other_default = 0.0
    measured = (min(sizes), max(sizes)) if sizes else None
    n_global_default = int(doc.get("global_batch_tokens") or 65536)
    n_options = fitsview.size_options(
        min(sizes or [64]) / 2, max(4 * max(sizes or [1024]), n_global_default) * 4
    )
    n_options = sorted(set(n_options) | {n_global_default})
    c1, c2 = st.columns(2)
    global_tokens = c1.select_slider(
        "Global batch, tokens per step (N)", n_options, value=n_global_default, key="be_N"
    )
    mb_options = [
        o for o in fitsview.size_options(min(sizes or [64]) / 2, global_tokens) if o <= global_tokens
    ]
    mb_options = sorted(set(mb_options) | {int(s) for s in sizes if s <= global_tokens}) or [
        int(global_tokens)
    ]
    mb_default = fitsview.default_microbatch(mb_options, sizes, int(global_tokens))
    if st.session_state.get("be_n") not in mb_options:
        st.session_state.pop("be_n", None)
    n = c2.select_slider("Tokens per micro-batch (n ≤ N)", mb_options, value=mb_default, key="be_n")
    other_s = c1.number_input(
        "Other phases per step, seconds (generate, sync, …)",
        min_value=0.0,
        value=round(float(other_default), 4),
        help="Phases that do not depend on n: from fits.json, else the baseline run's medians when paired.",
        key="be_other",
    )
    st.markdown("**What if** (the cost model's knobs, applied to the low precision)")
    k1, k2 = st.columns(2)
    knobs = step.WhatIf(
        fixed_scale=k1.slider(
            "fixed_scale: added fixed cost x",
            0.0,
            2.0,
            1.0,
            0.05,
            key="be_scale",
            help="0.5 = half of the fixed cost it adds over the baseline (n* halves)",
        ),
        weight_quant="per_step"
        if k2.toggle(
            "weight_quant=per_step: quantize weights once per step, not per micro-batch", key="be_wq"
        )
        else "per_microbatch",
    )
    lines_fit = fitsview.fit_lines(chosen)
    curves = {p: pm.Curve.from_dict(k) for p in lines_fit if (k := fitsview.chosen_knee(fits[p])) is not None}
    q, q_source = step.weight_quant_seconds(lines_fit[base_id], lines_fit[low_id], knobs)
    costs = step.step_costs(lines_fit, base_id, {"other": other_s}, knobs, {low_id: q}, curves)
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
        diff = step_interval.step_difference(fits[base_id], fits[low_id], global_tokens, n, other_s)
        st.markdown(
            f"At n = {n:,}, N = {global_tokens:,}: " + step_interval.difference_words(diff, low_id, base_id)
        )
    crossing = step.step_breakeven(costs[base_id], costs[low_id], global_tokens)
    st.caption(
        (
            f"With these knobs the step times cross at n = {crossing:,.0f} tokens"
            + (" (more than N: not reachable at this global batch)." if crossing > global_tokens else ".")
            if crossing
            else "With these knobs the step times do not cross at a positive size."
        )
        + (
            f" Weight quantization per micro-batch taken as {q * 1e3:.3g} ms ({q_source})."
            if knobs.weight_quant == "per_step"
            else ""
        )
    )
    rec = (chosen.get("step") or {}).get("recommendation") or {}
    if rec.get("precision"):
        st.caption(
            f"mxperf fit recommends {rec['precision']} at {rec['tokens_per_microbatch']:,} tokens per micro-batch "
            f"for N = {rec.get('global_batch_tokens', 0):,} ({rec['step_seconds']:.3g} s per step)."
        )
    grid = np.geomspace(max(min(mb_options), 1), global_tokens, 200)
    ui.chart(
        charts.step_prediction_figure(
            grid, {p: c.seconds(global_tokens, grid) for p, c in costs.items()}, n, global_tokens, measured
        ),
        "predicted-step-time",
        "be_pred",
    )

with ui.card("Measured vs predicted (runs of this model)"):
    st.caption(
        f"Each run's per-step {chosen['phase']} micro-batch seconds against the fit's prediction for the same number "
        "of micro-batches and tokens (medians over steps). The band is the fitted mean's 95 % interval; a run's "
        "own noise and machine are not in it (fits.json inputs say where the fit was measured)."
    )
    runs = [e for e in ui.usable("run", chosen["model"]) if e.learner in (base_id, low_id)]
    rows = []
    for run in runs:
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
    else:
        st.info(f"No run of {chosen['model']} with learner {base_id} or {low_id} under the runs directory.")
