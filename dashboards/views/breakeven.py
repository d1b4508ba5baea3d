"""Breakeven: micro-batch time vs tokens, fitted lines with 95 % bands, n*, the measured crossing, two fits overlaid,
step-time predictions with their interval, fits.json's predicted-vs-measured step table, micro-batches vs runs."""

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import answer_view, charts_fit, data, fitsview, predictor, share, ui
from perfmodel.fitting import model as pm
from perfmodel.report import results
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
share.restore("be_fit", rels)
fit_dir = fit_dirs[rels.index(c1.selectbox("Fit output", rels, key="be_fit"))]
share.keep("be_fit")
share.restore("be_overlay", [NONE, *rels])
overlay_rel = c2.selectbox(
    "Overlay a second fit", [NONE, *rels], key="be_overlay", help="its lines drawn dashed on the same chart"
)
share.keep("be_overlay")

answer_view.answer_card(fit_dir)
try:  # a prediction the run folders contradict is said up here, not only in the table below
    for miss in fitsview.validation_misses(ui.json_file(fit_dir, store.FITS)):
        st.warning(miss, icon=":material/error:")
except (MxperfError, ValueError, TypeError, AttributeError):  # the Verdict card says what is wrong
    pass
st.caption(
    "Each micro-batch costs fixed + per_token x n seconds. A low precision that adds fixed cost but saves "
    "per token pays off above n* = added fixed / per-token saving. Fits come from `mxperf fit`, points from "
    "`mxperf sweep` or ingested traces (micro-batches found by a range or detected) of the same model."
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
usable_first = next((i for i, m in enumerate(models) if not fitsview.unusable(m)), 0)
share.restore("be_entry", entry_labels)
entry_label = st.selectbox(
    "Model, phase and precision",
    entry_labels,
    index=0 if st.session_state.get("be_entry") in entry_labels else usable_first,
    key="be_entry",
    help="starts at the first entry whose fits can predict (not withheld by mxperf fit)",
)
share.keep("be_entry")
chosen = models[entry_labels.index(entry_label)]
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
    share.restore("be_basis", fitsview.bases(chosen))
    basis = st.radio("Basis", fitsview.bases(chosen), horizontal=True, key="be_basis")
    share.keep("be_basis")
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
        charts_fit.breakeven_figure(
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
    ui.download_table(
        fitsview.fit_numbers(chosen, basis_fits),
        f"fit-{chosen['model']}-{chosen['phase']}-{low_id}-coefficients",
        "be_fit_numbers",
    )
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

predictor.predicted_step_card(doc, chosen, sizes, top, f"{fit_dir.rel}: {entry_label}")
predictor.validation_card(doc, chosen)
predictor.measured_vs_predicted_card(chosen)
