"""Step time: where each step's seconds go, per phase, baseline vs the compared run."""

import streamlit as st

from dashboards import charts, compare, ui

st.title("Step time")
pair = ui.need_pair()
st.caption(
    f"Model **{pair.model}**: `{pair.baseline.rel}` vs `{pair.other.rel}`. Medians over steps "
    "(the first step, which carries one-time warm-up, is left out when there are three or more)."
)

tables, medians = {}, {}
for entry in (pair.baseline, pair.other):
    label = ui.run_label(entry)
    if label in tables or label in medians:
        label = f"{label} ({entry.rel})"
    with ui.card(f"{label}: {entry.rel}"):
        tables[label] = ui.step_table(entry)
        medians[label] = compare.phase_medians(tables[label])
        st.metric(
            "median step", f"{medians[label]['step']:.3g} s", help="sum of the phases, median over steps"
        )

if len(medians) == 2:
    (base_label, base), (other_label, other) = medians.items()
    with ui.card("Difference"):
        st.markdown(f"### {compare.phase_change_words(base, other, other_label, base_label)}")
        st.caption(f"Relative change of the median seconds against {base_label}; negative = faster.")
        st.dataframe(compare.change_table(base, other, base_label, other_label), hide_index=True)
    with ui.card("Averaged"):
        st.plotly_chart(charts.step_time_mean_bars(medians, compare.STEP_PHASES), width="stretch")
    with ui.card("Per step"):
        st.plotly_chart(charts.step_time_per_step_bars(tables, compare.STEP_PHASES), width="stretch")
