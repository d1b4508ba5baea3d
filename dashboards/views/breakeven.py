"""Breakeven: time per micro-batch vs tokens, fitted lines with 95 % bands, n*, and step-time what-ifs."""

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, compare, data, summaries, ui
from perfmodel import model as pm
from perfmodel import results, step
from tracing.analysis import steps
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

st.title("Breakeven")
st.caption(
    "Each micro-batch costs fixed + per_token x n seconds. A low precision that adds fixed cost but saves "
    "per token pays off above n* = added fixed / per-token saving. Fits come from `mxperf fit`, points from "
    "`mxperf sweep` (or labelled ingests) of the same model."
)

fit_dirs = data.newest_first(ui.usable("fit"))
if not fit_dirs:
    st.info(
        "No complete fit output under the runs directory. Make one with `mxperf fit SWEEP_DIR -o RUNS_DIR/fit`."
    )
    st.stop()

labels = [e.label for e in fit_dirs]
fit_dir = fit_dirs[labels.index(st.selectbox("Fit output", labels, key="be_fit"))]
doc: dict = {}
with ui.card("Verdict"):
    doc = results.validate_fits(ui.json_file(fit_dir, store.FITS), f"{fit_dir.rel}/{store.FITS}")
    if not doc["models"]:
        raise ValueError(f"{fit_dir.rel}/{store.FITS}: no models fitted")
    for m in doc["models"]:
        st.markdown("- " + (m.get("verdict") or summaries.breakeven_sentence(m)))
if not doc.get("models"):
    st.stop()

models = doc["models"]
entry_labels = [f"{m['model']} / {m['phase']}: {m['precision']} vs {m['baseline']}" for m in models]
chosen = models[entry_labels.index(st.selectbox("Model, phase and precision", entry_labels, key="be_entry"))]
base_id, low_id = chosen["baseline"], chosen["precision"]
fits = chosen["fits"]
be = chosen.get("breakeven") or {}
points = pd.DataFrame(columns=["precision", "num_tokens", "seconds"])
top = max(float(be.get("tokens") or 0) * 1.2, max(fits[base_id].get("sizes") or [1024]))

with ui.card(f"{chosen['model']} / {chosen['phase']}: time per micro-batch"):
    candidates = ui.usable("sweep") + ui.usable("ingest")
    sources = data.inputs_of(fit_dir, candidates)
    if not sources:
        sources = [e for e in candidates if e.model == chosen["model"]]
        if sources:
            st.caption(
                "Points from every sweep of this model: the fit's own inputs are not under the runs directory."
            )
    frames = list(ui.tables_of(sources, store.MICROBATCHES).values())
    if frames:
        points = pd.concat(frames, ignore_index=True)
        points = points[(points["phase"] == chosen["phase"]) & points["precision"].isin([base_id, low_id])]
    if len(points):
        top = max(top, float(points["num_tokens"].max()))
    ns = np.linspace(0, top * 1.05, 200)
    lines, no_band = {}, []
    for prec in (base_id, low_id):
        try:
            pred, lo, hi = pm.fit_band(fits[prec], ns)
        except ValueError:
            pred, lo, hi = np.asarray(pm.predict_microbatch_seconds(fits[prec], ns)), None, None
            no_band.append(prec)
        lines[prec] = (ns, pred, lo, hi)
    st.plotly_chart(
        charts.breakeven_figure(points, lines, be.get("tokens"), be.get("ci") or (None, None)),
        width="stretch",
    )
    st.markdown(summaries.breakeven_sentence(chosen))
    if no_band:
        st.caption(f"No 95 % band for {', '.join(no_band)}: this fits.json carries no covariance.")
    if not len(points):
        st.caption("No sweep of this model under the runs directory: only the fitted lines are drawn.")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "precision": p,
                    "fixed ms": 1e3 * f["fixed_s"],
                    "per-token µs": 1e6 * f["per_token_s"],
                    "R²": f.get("r2"),
                    "points": f.get("n_points"),
                }
                for p, f in fits.items()
            ]
        ),
        hide_index=True,
    )

with ui.card("Predicted step time"):
    st.caption(
        "step(N, n) = (N / n) x fixed + N x per_token + other phases (perfmodel.step). "
        "What-ifs change the low precision only."
    )
    other_phases = (chosen.get("step") or {}).get("other_phases_s") or {}
    other_default = float(sum(other_phases.values()))
    pair = ui.current_pair()
    if not other_default and pair is not None and pair.model == chosen["model"]:
        try:
            med = compare.phase_medians(steps.step_phase_table(ui.table(pair.baseline, store.METRICS)))
            other_default = float(med.drop(["step", chosen["phase"]], errors="ignore").sum())
        except (ValueError, MxperfError):
            other_default = 0.0
    n_max = int(max(2 * top, 1024))
    c1, c2 = st.columns(2)
    n = c1.slider("Tokens per micro-batch (n)", 64, n_max, int(min(max(top / 2, 64), n_max)), step=64)
    n_global_default = int(doc.get("global_batch_tokens") or 65536)
    global_tokens = c2.slider(
        "Global batch, tokens per step (N)", 1024, max(1 << 20, n_global_default), n_global_default, step=1024
    )
    other_s = c1.number_input(
        "Other phases per step, seconds (generate, sync, …)",
        min_value=0.0,
        value=round(float(other_default), 4),
        help="Phases that do not depend on n: from fits.json, else the baseline run's medians when paired.",
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
            help="0.5 = half of the fixed cost it adds over the baseline (n* halves)",
        ),
        weight_quant="per_step"
        if k2.toggle("weight_quant=per_step: quantize weights once per step, not per micro-batch")
        else "per_microbatch",
    )
    lines_fit = summaries.fit_lines(chosen)
    q, q_source = step.weight_quant_seconds(lines_fit[base_id], lines_fit[low_id], knobs)
    costs = step.step_costs(lines_fit, base_id, {"other": other_s}, knobs, {low_id: q})
    predicted = {p: float(c.seconds(global_tokens, n)) for p, c in costs.items()}
    m1, m2 = st.columns(2)
    m1.metric(f"{base_id} step", f"{predicted[base_id]:.3g} s")
    m2.metric(
        f"{low_id} step",
        f"{predicted[low_id]:.3g} s",
        delta=f"{100 * (predicted[low_id] / predicted[base_id] - 1):+.1f} %",
        delta_color="inverse",
    )
    st.markdown(
        summaries.faster_at(predicted[base_id], predicted[low_id], low_id, base_id) + f" at n = {n:,}."
    )
    crossing = step.step_breakeven(costs[base_id], costs[low_id], global_tokens)
    st.caption(
        (
            f"With these knobs the lines cross at n* = {crossing:,.0f} tokens."
            if crossing
            else "With these knobs the lines do not cross at a positive size."
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
    grid = np.linspace(64, n_max, 200)
    st.plotly_chart(
        charts.step_prediction_figure(
            grid, {p: c.seconds(global_tokens, grid) for p, c in costs.items()}, n, global_tokens
        ),
        width="stretch",
    )
