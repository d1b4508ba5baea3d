"""Runs: every output directory under RUNS_DIR, filterable, and the BF16/low-precision pairs found."""

import streamlit as st

from dashboards import compare, data, ui

st.title("Runs")
st.caption(
    "Every output directory under the runs directory (mxperf run, sweep, ingest and fit). "
    "Pick the two runs to compare in the sidebar; by default each model's newest BF16 run is paired with "
    "its newest MXFP8 run."
)
entries = ui.entries()
if not entries:
    st.info(
        "No output directories (folders with a manifest.json) under this runs directory yet. "
        "Create some with `mxperf run`, `mxperf sweep`, `mxperf ingest` or `mxperf fit`."
    )
    st.stop()

with ui.card("Output directories"):
    table = data.entries_frame(entries)
    c1, c2, c3 = st.columns(3)
    kinds = c1.multiselect("Kind", sorted(table["kind"].dropna().unique()), key="runs_kind")
    models = c2.multiselect("Model", sorted(table["model"].dropna().astype(str).unique()), key="runs_model")
    text = c3.text_input("Path or precision contains", key="runs_text")
    shown = table
    if kinds:
        shown = shown[shown["kind"].isin(kinds)]
    if models:
        shown = shown[shown["model"].astype(str).isin(models)]
    if text:
        hay = shown["path"].fillna("") + " " + shown["precisions"].fillna("")
        shown = shown[hay.str.contains(text, case=False, regex=False)]
    st.dataframe(shown, hide_index=True, width="stretch")
    broken = table[table["status"] != "complete"]
    if len(broken):
        st.warning(
            f"{len(broken)} output(s) are not complete and are left out of the other pages: "
            + "; ".join(f"`{p}`: {why}" for p, why in zip(broken["path"], broken["problem"], strict=True))
        )

with ui.card("BF16 / low-precision pairs"):
    pairs = compare.pair_runs(ui.usable("run")) + compare.pair_runs(ui.usable("ingest"), kind="ingest")
    if not pairs:
        st.info("No model has both a complete BF16 run and a complete low-precision run yet.")
    else:
        st.dataframe(
            [
                {
                    "model": p.model,
                    "baseline": p.baseline.rel,
                    "compared": p.other.rel,
                    "precisions": f"{p.baseline.precision_label} vs {p.other.precision_label}",
                }
                for p in pairs
            ],
            hide_index=True,
            width="stretch",
        )
    pair = ui.current_pair()
    if pair is not None:
        st.success(f"Comparing `{pair.baseline.rel}` (baseline) with `{pair.other.rel}` on the other pages.")
