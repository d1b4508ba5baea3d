"""Runs: every output directory under RUNS_DIR (with the machine that made it), filterable, and the pairs."""

import streamlit as st

from dashboards import compare, data, ui

st.title("Runs")
st.caption(
    "Every output directory under the runs directory (mxperf run, sweep, ingest, fit and imported metric logs), "
    "with the machine that produced it and whether its low precision was emulated. Pick the two outputs to "
    "compare in the sidebar. Add a trace of your own on the *Add a trace* page."
)
entries = ui.entries()
if not entries:
    st.info(
        "No output directories (folders with a manifest.json) under this runs directory yet. "
        "Create some with `mxperf run`, `mxperf sweep`, `mxperf ingest` or `mxperf fit`, or add a trace "
        "on the Add a trace page."
    )
    st.stop()

skipped = data.links_outside(ui.runs_dir())
if skipped:
    st.warning(
        f"{len(skipped)} output(s) skipped: links outside the runs folder: "
        + ", ".join(f"`{p}`" for p in skipped)
        + ". The dashboard reads only files under the runs folder; copy or move an output into it to see it.",
        icon=":material/link_off:",
    )

table = data.entries_frame(entries)
emulated = table[(table["low precision"] == "emulated") & (table["status"] == "complete")]
if len(emulated):
    st.info(
        f"{len(emulated)} output(s) ran on a CPU with **emulated** low precision "
        f"({', '.join(f'`{p}`' for p in emulated['path'])}): their timings say what the emulation costs "
        "on that CPU, not what MXFP8 or FP8 cost on a GPU. GPU results show the GPU in the device column."
    )

conflicts = table[table["label vs kernels"].notna()]
if len(conflicts):
    st.warning(
        "A label disagrees with the trace's GEMM kernels (the label is used): "
        + "; ".join(
            f"`{p}`: {why}" for p, why in zip(conflicts["path"], conflicts["label vs kernels"], strict=True)
        ),
        icon=":material/warning:",
    )

with ui.card("Output directories"):
    c1, c2, c3 = st.columns(3)
    kinds = c1.multiselect("Kind", sorted(table["kind"].dropna().unique()), key="runs_kind")
    models = c2.multiselect("Model", sorted(table["model"].dropna().astype(str).unique()), key="runs_model")
    text = c3.text_input("Path, precision or device contains", key="runs_text")
    shown = table
    if kinds:
        shown = shown[shown["kind"].isin(kinds)]
    if models:
        shown = shown[shown["model"].astype(str).isin(models)]
    if text:
        hay = (
            shown["path"].fillna("") + " " + shown["precisions"].fillna("") + " " + shown["device"].fillna("")
        )
        shown = shown[hay.str.contains(text, case=False, regex=False)]
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        column_config={
            "low precision": st.column_config.TextColumn(
                "low precision", help="emulated (CPU, or MXFP8 on a GPU without MX GEMMs), native, or n/a"
            ),
            "device": st.column_config.TextColumn(
                "device", help="what ran it; for an ingested trace the GPU named in the trace"
            ),
            "found in trace": st.column_config.TextColumn(
                "found in trace",
                help="an ingest's precision read from its GEMM kernel names (manifest: precision_evidence) and "
                "its model from the embedding table's shape, when no label gave them; used for pairing",
            ),
            "label vs kernels": st.column_config.TextColumn(
                "label vs kernels", help="a --label precision the trace's GEMM kernels contradict"
            ),
        },
    )
    ui.download_table(shown, "runs", "runs")
    broken = table[table["status"] != "complete"]
    if len(broken):
        st.warning(
            f"{len(broken)} output(s) are not complete or not readable and are left out of the other pages: "
            + "; ".join(f"`{p}`: {why}" for p, why in zip(broken["path"], broken["problem"], strict=True))
        )

with ui.card("BF16 / low-precision pairs"):
    candidates, left_out = ui.comparable()
    pairs = compare.pair_runs(candidates) + compare.pair_runs(candidates, kind="ingest")
    if not pairs:
        st.info("No model has both a complete BF16 and a complete low-precision output with step times yet.")
    else:
        st.dataframe(
            [
                {
                    "model": p.model,
                    "baseline": p.baseline.rel,
                    "compared": p.other.rel,
                    "precisions": f"{p.baseline.precision_label} vs {p.other.precision_label}",
                    "precision from": f"{p.baseline.precision_from or 'label'} | {p.other.precision_from or 'label'}",
                    "device": f"{p.baseline.device} | {p.other.device}",
                }
                for p in pairs
            ],
            hide_index=True,
            width="stretch",
        )
    pair = ui.current_pair()
    if pair is not None:
        st.success(f"Comparing `{pair.baseline.rel}` (baseline) with `{pair.other.rel}` on the other pages.")
    if left_out:
        st.caption(
            "Not offered for comparison (no per-step times): "
            + "; ".join(f"`{rel}`: {why}" for rel, why in left_out.items())
        )
