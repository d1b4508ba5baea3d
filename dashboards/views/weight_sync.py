"""Weight sync: the seven invariants checked against the live sampler after every sync, and the fault matrix."""

import pandas as pd
import streamlit as st

from dashboards import charts_checks, compare, summaries, ui
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

st.title("Weight sync")
st.caption(
    "After each optimizer step the learner's weights are loaded into the sampler and checked against what the "
    "sampler actually holds: " + "; ".join(f"{k} {v}" for k, v in summaries.INVARIANTS.items()) + ". "
    "'initial' is the sync before the first step. The checks' own time is part of each run's sync phase "
    "(shown apart as 'sync checks' on the Step time page)."
)

runs = [e for e in ui.usable() if ui.has(e, store.SYNC_CHECKS)]
if not runs:
    ui.unusable_notes([e for e in ui.entries() if e.kind in ("run", None)], "run")
    st.info("No complete run with sync checks under the runs directory. Make one with `mxperf run`.")
    st.stop()
pair = ui.current_pair()
rels = [e.rel for e in runs]
default = rels.index(pair.other.rel) if pair is not None and pair.other.rel in rels else 0
run = runs[rels.index(st.selectbox("Run", rels, index=default, key="sync_run"))]

with ui.card("Checks per sync", run):
    checks = ui.table(run, store.SYNC_CHECKS)
    verdict = summaries.sync_verdict(checks)
    (st.success if verdict.startswith("All") else st.error)(verdict)
    ui.chart(
        charts_checks.sync_heatmap(summaries.sync_matrix(checks), summaries.INVARIANTS),
        f"{run.rel}-sync-checks",
        "sync_map",
    )
    st.caption(
        "Green: passed. Red: failed. Grey: not checked at that sync (`--check-sync first` checks only some)."
    )
    failures = summaries.sync_failures(checks)
    if len(failures):
        st.markdown("Failed checks (first failing tensor named):")
        st.dataframe(failures, hide_index=True)
    try:
        cost = compare.sync_check_cost(ui.step_table(run))
    except (MxperfError, ValueError, KeyError):  # no per-step times: the cost is not said rather than guessed
        cost = None
    if cost is not None:
        st.caption(
            f"Cost of the checks: median {cost['median_s'] * 1e3:.1f} ms per step "
            f"(IQR {cost['q1_s'] * 1e3:.1f} – {cost['q3_s'] * 1e3:.1f} ms, n = {int(cost['n_steps'])} steps), "
            f"the 'sync checks' phase of Step time: {compare.SYNC_CHECK_RULE}."
        )
    ui.download_table(checks, f"{run.rel}-sync-checks", "sync_dl")

with ui.card("Fault matrix"):
    sources = [e for e in ui.usable() if ui.has(e, store.FAULT_MATRIX)]
    if not sources:
        st.info(
            "No fault matrix under the runs directory. `mxperf faults` injects each fault and writes one."
        )
    else:
        found = ui.tables_of(sources, store.FAULT_MATRIX)
        if found:
            ui.source_marks(found, lambda _: summaries.FAULT_PRECISIONS)
            fm = pd.concat([t.assign(source=e.rel) for e, t in found.items()], ignore_index=True)
            ui.chart(
                charts_checks.fault_matrix_figure(summaries.fault_grid(fm)), "fault-matrix", "sync_faults"
            )
            st.caption(
                "Green 'caught': that check failed on the faulted sync. Red 'MISSED': the check the fault targets "
                "did not catch it. Grey: the check was not triggered (it does not look at what this fault breaks)."
            )
            st.dataframe(summaries.fault_table(fm), hide_index=True)
            ui.download_table(fm, "fault-matrix", "sync_fm_dl")
