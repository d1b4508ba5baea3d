"""Host stall: how much of the time the GPU waits for the host, per micro-batch size, per phase, on a timeline."""

import pandas as pd
import streamlit as st

from dashboards import charts, summaries, ui
from tracing.analysis import metrics as tm
from tracing.outputs import store

st.title("Host stall")
st.caption(
    "Host stall = time the GPU sat idle because the next kernel's launch call had not returned yet "
    "(launch-end rule). It is a share of wall time; it only exists where a GPU trace was recorded."
)

with ui.card("Share per micro-batch size and per phase (sweeps)"):
    frames = list(ui.tables_of(ui.usable("sweep") + ui.usable("ingest"), store.MICROBATCHES).values())
    if not frames:
        st.info("No sweep (microbatches.parquet) under the runs directory. Make one with `mxperf sweep`.")
    else:
        mb = pd.concat(frames, ignore_index=True)
        if not summaries.has_gpu_numbers(mb):
            st.info(f"Host stall per micro-batch: not available, {summaries.NO_GPU_REASON}")
        else:
            by_size = summaries.stall_share(mb, ["model", "precision", "tokens_per_microbatch"])
            for model, grp in by_size.groupby("model"):
                st.plotly_chart(
                    charts.stall_share_figure(
                        grp, "tokens_per_microbatch", f"{model}: host stall per micro-batch size"
                    ),
                    width="stretch",
                )
            by_phase = summaries.stall_share(mb, ["model", "precision", "phase"])
            st.plotly_chart(
                charts.stall_share_figure(by_phase, "phase", "Host stall per phase"), width="stretch"
            )
            st.dataframe(by_size, hide_index=True)

ingests = ui.usable("ingest")
if not ingests:
    st.info("No ingested trace under the runs directory. `mxperf ingest TRACE -o RUNS_DIR/NAME` adds one.")
    st.stop()

src = ingests[
    [e.label for e in ingests].index(
        st.selectbox("Ingested trace", [e.label for e in ingests], key="hs_trace")
    )
]
with ui.card("Per device (whole trace)"):
    devices = ui.table(src, store.DEVICES)
    if devices.empty:
        st.info(
            "This trace has no GPU ops (a CPU-only profile): GPU busy and host stall do not exist for it."
        )
    else:
        st.dataframe(summaries.device_summary(devices), hide_index=True)

with ui.card("Timeline"):
    rank_files = ui.files(src, f"{store.EVENTS_DIR}/rank-*.parquet")
    if not rank_files:
        raise ValueError(f"{src.rel}: no {store.EVENTS_DIR}/rank-*.parquet event tables")
    rank_file = st.selectbox(
        "Rank", rank_files, format_func=lambda f: f.split("/")[-1].removesuffix(".parquet"), key="hs_rank"
    )
    events = ui.table(src, rank_file)
    timelines = tm.device_timelines(events)
    if not timelines:
        st.info(
            "No GPU ops in this rank's trace: nothing to draw (GPU busy and host stall need a GPU trace)."
        )
        st.stop()
    ranges = ui.table(src, store.RANGES, required=False)
    rank_name = rank_file.split("/")[-1].removesuffix(".parquet").removeprefix("rank-")
    if ranges is not None and "rank" in ranges and rank_name.isdigit():
        ranges = ranges[ranges["rank"].astype("Int64") == int(rank_name)]
    first = min(int(t.row["first_ns"]) for t in timelines)
    last = max(int(t.row["last_ns"]) for t in timelines)
    windows = summaries.window_choices(ranges, first, last)
    choice = st.selectbox("Window (the whole trace, or one step)", list(windows), key="hs_window")
    t0, t1 = windows[choice]
    intervals = summaries.timeline_intervals(
        timelines, t0, t1, rank=int(rank_name) if rank_name.isdigit() else None
    )
    shown_ranges = summaries.window_ranges(ranges, t0, t1) if ranges is not None else None
    st.plotly_chart(
        charts.timeline_figure(intervals, shown_ranges, f"{src.rel} rank {rank_name}: {choice}"),
        width="stretch",
    )
    st.dataframe(summaries.window_shares(intervals), hide_index=True)
