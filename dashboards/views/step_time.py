"""Step time: where each step's seconds go, per phase, baseline vs the compared output; per rank and across ranks."""

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, compare, fitsview, summaries, ui
from dashboards.data import OutputEntry
from tracing.analysis import ranks, step_ranges
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

ALL_RANKS = "all ranks: step = max over ranks"

st.title("Step time")
pair = ui.need_pair()
st.caption(
    f"`{pair.baseline.rel}` (baseline) vs `{pair.other.rel}`. Medians over steps with their interquartile "
    "range [IQR] and the number of steps n; the first step (warm-up) is left out when there are three or more. "
    "For a multi-rank trace a step lasts as long as its slowest rank (what the job waits for), never the sum."
)


def _rank_view(entry: OutputEntry, key: str) -> tuple[pd.DataFrame, str | None]:
    """The step table of one side, for the rank picked (multi-rank traces), and the rank label."""
    table, per_process = ui.step_data(entry)
    procs = ranks.processes(per_process) if per_process is not None else []
    if len(procs) <= 1:
        return table, (procs[0] if procs else None)
    choice = st.selectbox(
        "Rank",
        [ALL_RANKS, *procs],
        key=f"st_rank_{key}",
        help="Each rank's own steps, or per step the slowest rank (the job's step time)",
    )
    if choice == ALL_RANKS:
        return table, None
    return ranks.one_rank(per_process, choice), choice


def _side(entry: OutputEntry, label: str, key: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    with ui.card(label, entry):
        table, proc = _rank_view(entry, key)
        stats = compare.phase_stats(table)
        step = stats.loc["step"]
        st.metric(
            "median step" + (f" ({proc})" if proc else ""),
            f"{step['median_s']:.3g} s",
            help=f"IQR {step['q1_s']:.3g} – {step['q3_s']:.3g} s over n = {int(step['n_steps'])} steps",
        )
        st.caption(f"IQR {step['q1_s']:.3g} – {step['q3_s']:.3g} s · n = {int(step['n_steps'])} steps")
        if words := compare.step_total_words(table):  # an async trainer's log: what the step total is
            st.caption(words)
        if entry.kind == "run":
            tps = compare.tokens_per_second(ui.table(entry, store.METRICS, required=False))
            if tps and "update_tokens_per_s" in tps:
                st.caption(
                    f"learner: {tps['update_tokens_per_s']:,.0f} tokens/s in update, "
                    f"{tps.get('step_tokens_per_s', float('nan')):,.0f} tokens/s per whole step "
                    f"({tps['tokens_per_step']:,.0f} tokens per step); MFU: not in this output (no FLOPs per step)"
                )
        if entry.kind == "ingest":
            traces = entry.manifest.get("traces") or []
            said = list(
                dict.fromkeys(n for t in traces if isinstance(t, dict) for n in t.get("step_notes") or [])
            )
            for note in said[:3]:  # how the steps were found: inferred, renumbered, timed on the device
                st.caption(f"Steps: {note}")
            if len(said) > 3:
                st.caption(f"Steps: {len(said) - 3} more notes in its manifest (`step_notes`)")
            if not all(isinstance(t, dict) and t.get("format") == "metric_log" for t in traces):
                notes = [
                    *(entry.manifest.get("notes") or []),
                    *(n for t in traces for n in (t.get("notes") or [])),
                ]
                st.caption(
                    summaries.microbatch_words(ui.table(entry, store.MICROBATCHES, required=False), notes)
                )
        return table, stats
    return None


for fit in ui.usable("fit"):  # a step model these runs contradict: said where their steps are shown
    try:
        doc = ui.json_file(fit, store.FITS)
    except (MxperfError, ValueError):
        continue
    for miss in fitsview.validation_misses(doc, (pair.baseline.rel, pair.other.rel)):
        st.warning(f"`{fit.rel}`: {miss}", icon=":material/error:")

sides: dict[str, tuple[OutputEntry, pd.DataFrame, pd.DataFrame]] = {}
cols = st.columns(2)
for col, entry in zip(cols, (pair.baseline, pair.other), strict=True):
    label = ui.run_label(entry)
    if label in sides:
        label = f"{label} ({entry.rel})"
    with col:
        got = _side(entry, label, entry.rel)
    if got is not None:
        sides[label] = (entry, *got)

if len(sides) == 2:
    (base_label, (_, _, base)), (other_label, (_, _, other)) = sides.items()
    with ui.card("Difference"):
        st.markdown(f"### {compare.phase_change_words(base, other, other_label, base_label)}")
        st.caption(
            f"Relative change of the median seconds against {base_label}; negative = faster. 'within spread': the "
            "two quartile ranges overlap, so the steps' own variation covers the change."
            + (
                f" 'sync checks': {compare.SYNC_CHECK_RULE} (Weight sync shows the same number)."
                if any(compare.SYNC_CHECKS in s.index for s in (base, other))
                else ""
            )
        )
        diff = compare.change_table(base, other, base_label, other_label)
        st.dataframe(diff, hide_index=True)
        ui.download_table(  # numbers, not the cells' text
            compare.change_numbers(base, other, base_label, other_label),
            f"step-time-difference-{base_label}-vs-{other_label}",
            "st_diff",
        )
    phases = [p for p in compare.SHOWN_PHASES if any(p in s.index for _, _, s in sides.values())]
    with ui.card("Median step time by phase"):
        ui.chart(
            charts.step_time_median_bars({lbl: s for lbl, (_, _, s) in sides.items()}, phases),
            "median-step-time",
            "st_median",
        )
    with ui.card("Every step"):
        tables = {lbl: t for lbl, (_, t, _) in sides.items()}
        ui.chart(
            charts.step_time_per_step_bars(
                tables, phases, {lbl: compare.warmup_step(t) for lbl, t in tables.items()}
            ),
            "step-time-every-step",
            "st_steps",
        )
        long = pd.concat([t.assign(output=lbl) for lbl, t in tables.items()], ignore_index=True)
        ui.download_table(long, "step-phase-seconds", "st_long")

# Across ranks and by the trace's own range names (ingested traces only).
for label, (entry, table, _) in sides.items():
    if entry.kind != "ingest":
        continue
    _, per_process = ui.step_data(entry)
    if per_process is not None and len(ranks.processes(per_process)) > 1:
        with ui.card(f"{label}: across ranks"):
            slow = ranks.stragglers(per_process)
            ui.chart(
                charts.rank_steps_figure(
                    ranks.step_totals(per_process), f"{entry.rel}: step seconds per rank"
                ),
                f"{entry.rel}-ranks",
                f"st_ranks_{entry.rel}",
            )
            st.markdown("**Per rank** (median step [IQR], n steps, how often it was the slowest)")
            first = compare.warmup_step(table)
            summary = ranks.rank_summary(per_process, skip_steps=(first,) if first is not None else ())
            st.dataframe(summary, hide_index=True)
            st.markdown("**Stragglers**: per step the slowest rank and how far behind the median rank it was")
            st.dataframe(
                slow,
                hide_index=True,
                column_config={"spread_pct": st.column_config.NumberColumn("spread %", format="%.1f")},
            )
            ui.download_table(slow, f"{entry.rel}-stragglers", f"st_slow_{entry.rel}")
    named = table[table["phase"].isin(["generate", "logprob", "update", "sync"])]["seconds"].sum()
    if named == 0:
        with ui.card(f"{label}: by the trace's own range names"):
            st.info(
                "No range in this trace maps to an RL phase (generate, logprob, update, sync), so every phase above "
                "reads 0 and the step is all 'other'. Below: each step split by its own top-level ranges. "
                "To map them, pass `mxperf ingest --phase-map FILE` (see tracing/analysis/phase_map.toml)."
            )
            ranges_df = ui.table(entry, store.RANGES)
            children = step_ranges.step_children(ranges_df)
            if children.empty:
                raise ValueError(f"{entry.rel}: the step ranges have no child ranges to split them by")
            if per_process is not None and len(ranks.processes(per_process)) > 1:
                slowest = ranks.stragglers(per_process)[["step", "slowest"]]
                children = children.assign(process=ranks.process_labels(children)).merge(
                    slowest, left_on=["step", "process"], right_on=["step", "slowest"]
                )
                st.caption("Per step, the slowest rank's ranges.")
            top = step_ranges.top_names(children)
            ui.chart(
                charts.range_name_bars(top, f"{entry.rel}: seconds per step by range name"),
                f"{entry.rel}-range-names",
                f"st_names_{entry.rel}",
            )
            per_name = (
                top.groupby("name")["seconds"].agg(["median", "size"]).sort_values("median", ascending=False)
            )
            per_name = per_name.rename(columns={"median": "median s per step", "size": "steps"}).reset_index()
            per_name["share %"] = np.round(
                100 * per_name["median s per step"] / per_name["median s per step"].sum(), 1
            )
            st.dataframe(per_name, hide_index=True)
