"""Diff: where the time difference between two ingested traces (B - A, typically MXFP8 - BF16) comes from, per
micro-batch size, per phase and per step.

GEMM kernels, casts / quantize kernels, other kernels, host stall and the residual, with launches added;
kernels found on one side only. Every number is a field of ``mxperf diff A B --json``
(``perfmodel.kernels.diff.diff``, the same function)."""

import streamlit as st

from dashboards import charts_kernels, compare, kernel_load, kernel_tables, share, ui

st.title("Diff")
st.caption(
    "B - A from `perfmodel.kernels.diff.diff`, the function `mxperf diff A B --json` prints (rules in "
    "docs/kernels.md). Per micro-batch, exactly: wall = GEMM + casts / quantize + other kernels + host stall + "
    "residual (the GPU idle time the host did not cause, minus kernel time overlapping other kernels: never "
    "hidden); per phase and per step the measured time (`steps.parquet`) adds the time outside micro-batch "
    "windows. Launches added is a count (GPU ops launched), not a time."
)

ingests = [e for e in ui.usable("ingest") if kernel_load.is_trace_ingest(e)]
if len(ingests) < 2:
    ui.unusable_notes([e for e in ui.entries() if e.kind == "ingest"], "ingest")
    st.info(
        "Need two ingested GPU traces (e.g. the same workload in BF16 and in MXFP8) under the runs directory. "
        "Add them on the Add a trace page or with `mxperf ingest TRACE -o RUNS_DIR/NAME`."
    )
    st.stop()
rels = [e.rel for e in ingests]
pair = ui.current_pair()
pair_key = (pair.baseline.rel, pair.other.rel) if pair else None
if st.session_state.get("df_pair") != pair_key:  # a new pair in the sidebar: start from it
    for key in ("df_a", "df_b"):
        st.session_state.pop(key, None)
    st.session_state["df_pair"] = pair_key
from_pair = pair is not None and pair.baseline.rel in rels and pair.other.rel in rels
if from_pair:
    a_default, b_default = pair.baseline.rel, pair.other.rel
else:  # a BF16 / low-precision pair of traces of one model (precision and model labelled or found), or any two
    found = compare.pair_runs(ingests, kind="ingest")
    a_default, b_default = (found[0].baseline.rel, found[0].other.rel) if found else (rels[0], rels[1])
if pair is not None and not from_pair:
    st.caption(
        f"The sidebar pair (`{pair.baseline.rel}` vs `{pair.other.rel}`) is not two ingested GPU traces: "
        "pick two here."
    )
c1, c2 = st.columns(2)
share.restore("df_a", rels)
a_rel = c1.selectbox(
    "A (baseline)",
    rels,
    index=0 if st.session_state.get("df_a") in rels else rels.index(a_default),
    key="df_a",
)
share.keep("df_a")
b_opts = [r for r in rels if r != a_rel]
share.restore("df_b", b_opts)
b_rel = c2.selectbox(
    "B (compared)",
    b_opts,
    index=0
    if st.session_state.get("df_b") in b_opts
    else (b_opts.index(b_default) if b_default in b_opts else 0),
    key="df_b",
)
share.keep("df_b")
a, b = ingests[rels.index(a_rel)], ingests[rels.index(b_rel)]

with ui.card(f"B - A: {b_rel} - {a_rel}", key="diff-card"):
    doc = kernel_load.diff_doc(a, b)
    st.caption(
        f"A `{a_rel}` ({doc['a']['precision'] or 'precision unknown'}, {doc['a']['microbatches']} micro-batches) · "
        f"B `{b_rel}` ({doc['b']['precision'] or 'precision unknown'}, {doc['b']['microbatches']} micro-batches)"
    )
    for note in doc.get("notes", []):
        st.warning(f"Note: {note}")
    views = list(kernel_tables.VIEWS)
    share.restore("df_by", views)
    view = st.radio("View", views, key="df_by", format_func=lambda v: kernel_tables.VIEWS[v], horizontal=True)
    share.keep("df_by")
    frame = kernel_tables.diff_frame(doc, view)
    if frame.empty:
        st.info(
            {
                "size": "No micro-batch size (phase, tokens) found on both sides: nothing to match.",
                "phase": "No step found on both sides (steps.parquet): no per-phase view.",
                "step": "No step found on both sides (steps.parquet): no per-step view.",
            }[view]
        )
    else:
        labels = [kernel_tables.diff_label(r, view) for r in frame.to_dict("records")]
        ui.chart(
            charts_kernels.diff_figure(frame, labels, f"B - A {kernel_tables.VIEWS[view]}"),
            f"diff-{a_rel}-{b_rel}-{view}",
            f"df_fig_{view}",
        )
        kernel_load.show(frame, f"diff-{a_rel}-{b_rel}-by-{view}", f"df_{view}")
        from perfmodel.kernels.diff import check_closed

        worst = max(abs(check_closed(r)) for r in doc[f"by_{view}"])
        st.caption(
            "Each row: B - A = the parts to its right (largest gap over these rows "
            f"{worst / 1e6:.6f} ms, float rounding; `perfmodel.kernels.diff.check_closed`)."
        )

    for key, side, rel in (("only_a", "A", a_rel), ("only_b", "B", b_rel)):
        rows = doc[key]
        if rows:
            st.markdown(f"**Kernels only in {side}** (`{rel}`): {len(rows)}")
            only = kernel_tables.only_frame(rows)
            kernel_load.show(only, f"kernels-only-in-{rel}", f"df_{key}")
        else:
            st.caption(f"No kernel found only in {side} (`{rel}`).")
