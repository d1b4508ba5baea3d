"""Consistency: how far the sampler's log-probs are from the learner's, per step and at fixed weights."""

import pandas as pd
import streamlit as st

from dashboards import charts_checks, summaries, ui
from tracing.outputs import store

st.title("Consistency")
st.caption(
    "Per step, on the sampled response tokens: KL k1 = mean(lp_sampler - lp_learner), KL k3 = "
    "mean(exp(r) - r - 1) with r = lp_learner - lp_sampler, token_mult_prob_error = mean(exp(|lp_s - lp_l|)) "
    "(1.0 = identical). Each line is one run, labelled learner/sampler precision. k1 is an unbiased estimate "
    "that can come out negative on a finite sample (sampler and learner nearly identical); k3 is never negative."
)

logs = ui.tables_of([e for e in ui.usable("ingest") if ui.has(e, store.MISMATCH)], store.MISMATCH)
if logs:
    with ui.card("Metric-log imports (verl / NeMo RL): mismatch per step"):
        st.caption(
            "From each framework's own metric log (`mxperf ingest LOG.jsonl --label precision=...`). mxperf's "
            "names where the formula is mxperf's (kl_k1, kl_k3, token_mult_prob_error, prob_abs_diff_*); the "
            "framework's own names otherwise."
        )
        long = pd.concat(
            [
                t.assign(pairing=t["precision"].fillna(e.rel).astype(str) + f" ({e.rel})")
                for e, t in logs.items()
            ],
            ignore_index=True,
        )
        ui.chart(
            charts_checks.consistency_figure(long, summaries.CONSISTENCY_METRICS),
            "metric-log-mismatch",
            "cons_logs",
        )
        wide = long.pivot_table(index=["pairing", "metric"], values="value", aggfunc="median").reset_index()
        st.markdown("Median over steps, every metric the logs carry:")
        st.dataframe(
            wide.pivot(index="metric", columns="pairing", values="value").reset_index(), hide_index=True
        )
        ui.download_table(long, "metric-log-mismatch", "cons_logs_dl")

runs = ui.usable("run")
models = sorted({str(e.model) for e in runs if e.model})
if not models:
    ui.unusable_notes([e for e in ui.entries() if e.kind in ("run", None)], "run")
    (st.caption if logs else st.info)(
        "No complete mxperf run under the runs directory (per-step and fixed-weight consistency come from "
        "`mxperf run` / `mxperf consistency`)."
    )
    st.stop()
pair = ui.current_pair()
default = models.index(pair.model) if pair is not None and pair.model in models else 0
model = st.selectbox("Model", models, index=default, key="cons_model")

with ui.card(f"{model}: per step"):
    metrics = {}
    for e, df in ui.tables_of(ui.usable("run", model), store.METRICS).items():
        label = e.precision_label if e.precision_label not in metrics else f"{e.precision_label} ({e.rel})"
        metrics[label] = df
    long = summaries.consistency_long(metrics)
    if long.empty:
        raise ValueError("these runs' metrics.parquet have no kl_k1 / kl_k3 / token_mult_prob_error columns")
    ui.chart(
        charts_checks.consistency_figure(long, summaries.CONSISTENCY_METRICS),
        f"{model}-consistency",
        "cons_steps",
    )
    st.markdown("Median over steps (n = steps per run):")
    medians = summaries.consistency_medians(long)
    fmt = {c: st.column_config.NumberColumn(c, format="%.4g") for c in summaries.CONSISTENCY_METRICS}
    st.dataframe(medians, hide_index=True, column_config=fmt)
    ui.download_table(long, f"{model}-consistency-per-step", "cons_dl")

with ui.card(f"{model}: every pairing at fixed weights"):
    st.caption(
        "`mxperf consistency`: one set of weights, one fixed evaluation batch, every learner x sampler pairing "
        "scored in one process (no training drift between them)."
    )
    found = ui.tables_of(ui.usable(None, model), store.CONSISTENCY)
    if not found:
        st.info(
            f"No {store.CONSISTENCY} for this model. `mxperf consistency --model {model} -o DIR` makes one."
        )
    else:
        ui.source_marks(found, summaries.pairing_precisions)
        table = pd.concat([t.assign(source=e.rel) for e, t in found.items()], ignore_index=True)
        if {"learner", "sampler", "kl_k3"} <= set(table.columns):
            ui.chart(charts_checks.fixed_weights_figure(table), f"{model}-fixed-weights", "cons_fixed")
        st.dataframe(table, hide_index=True)
        ui.download_table(table, f"{model}-fixed-weights", "cons_fixed_dl")

with ui.card(f"{model}: fixed-weight evaluation inside each run"):
    st.caption("Each run scores its own pairing on the fixed batch before the first step and after the last.")
    found = ui.tables_of(ui.usable("run", model), store.EVAL_FIXED_WEIGHTS)
    if not found:
        st.info(f"No {store.EVAL_FIXED_WEIGHTS} in the runs of this model.")
    else:
        evals = pd.concat([t.assign(run=e.rel) for e, t in found.items()], ignore_index=True)
        st.dataframe(evals, hide_index=True)
        ui.download_table(evals, f"{model}-eval-fixed-weights", "cons_eval_dl")
