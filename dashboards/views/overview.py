"""Overview (the landing page): the answer first -- fits.json's three lines for the picked fit, with their
emulated / measured and extrapolated marks -- then where to look next."""

import streamlit as st

from dashboards import answer_view, data, share, ui

st.title("Overview")
fit_dirs = data.newest_first(ui.usable("fit"))
if not fit_dirs:
    ui.unusable_notes([e for e in ui.entries() if e.kind == "fit"], "fit")
    st.info(
        "No complete fit output under the runs directory, so no answer yet. Make one with "
        "`mxperf fit SWEEP_OR_TRACES RUN_FOLDERS -o RUNS_DIR/fit`; the pages on the left show the runs meanwhile."
    )
    st.stop()
rels = [e.rel for e in fit_dirs]
fit = fit_dirs[0]
if len(rels) > 1:
    share.restore("ov_fit", rels)
    pick = st.selectbox("Fit output", rels, key="ov_fit", help="newest first")
    share.keep("ov_fit")
    fit = fit_dirs[rels.index(pick)]
answer_view.answer_card(fit)

pair = ui.current_pair()
if pair is not None:
    st.caption(
        f"Compared in the sidebar: `{pair.baseline.rel}` (baseline) with `{pair.other.rel}`: see Step time."
    )
with st.container(horizontal=True):
    st.page_link(
        "views/breakeven.py", label="Breakeven: fits, n*, predicted step time", icon=":material/show_chart:"
    )
    st.page_link("views/step_time.py", label="Step time: the pair side by side", icon=":material/timer:")
    st.page_link("views/runs.py", label="Runs: every output", icon=":material/table:")
