"""Weight sync: the seven invariants checked against the live sampler after every sync, and the fault matrix."""

import pandas as pd
import streamlit as st

from dashboards import charts, summaries, ui
from tracing.outputs import store

st.title("Weight sync")
st.caption(
    "After each optimizer step the learner's weights are loaded into the sampler and checked against what the "
    "sampler actually holds: " + "; ".join(f"{k} {v}" for k, v in summaries.INVARIANTS.items()) + "."
)

runs = [e for e in ui.usable() if ui.has(e, store.SYNC_CHECKS)]
if not runs:
    st.info("No complete run with sync checks under the runs directory. Make one with `mxperf run`.")
    st.stop()
pair = ui.current_pair()
labels = [e.label for e in runs]
default = labels.index(pair.other.label) if pair is not None and pair.other.label in labels else 0
run = runs[labels.index(st.selectbox("Run", labels, index=default, key="sync_run"))]

with ui.card("Checks per sync"):
    checks = ui.table(run, store.SYNC_CHECKS)
    verdict = summaries.sync_verdict(checks)
    (st.success if verdict.startswith("All") else st.error)(verdict)
    st.plotly_chart(charts.sync_heatmap(summaries.sync_matrix(checks), summaries.INVARIANTS), width="stretch")
    failures = summaries.sync_failures(checks)
    if len(failures):
        st.markdown("Failed checks (first failing tensor named):")
        st.dataframe(failures, hide_index=True)
    if "check_seconds" in checks:
        cost = checks.groupby("step")["check_seconds"].sum()
        st.caption(f"Cost of the checks: median {cost.median() * 1e3:.1f} ms per step.")

with ui.card("Fault matrix"):
    sources = [e for e in ui.usable() if ui.has(e, store.FAULT_MATRIX)]
    if not sources:
        st.info(
            "No fault matrix under the runs directory. `mxperf faults` injects each fault and writes one."
        )
    else:
        fm = pd.concat(
            [ui.table(e, store.FAULT_MATRIX).assign(source=e.rel) for e in sources], ignore_index=True
        )
        st.plotly_chart(charts.fault_matrix_figure(summaries.fault_grid(fm)), width="stretch")
        st.dataframe(fm, hide_index=True)
