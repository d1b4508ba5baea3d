"""Host stall: how much of the time the GPU waits for the host -- two traces side by side, per device, on a
timeline, and per micro-batch size and phase where micro-batches carry GPU numbers."""

import pandas as pd
import streamlit as st

from dashboards import charts_gpu, data, share, summaries, timeline, ui
from dashboards.data import OutputEntry
from tracing.analysis import metrics as tm
from tracing.outputs import store

NONE = "(none)"

st.title("Host stall")
st.caption(
    "Host stall = time the GPU sat idle because the next kernel's launch call had not returned yet "
    "(launch-end rule), as a share of the GPU's active span. Only a GPU trace has it: CPU runs never show 0 %."
)

# a metric-log import has step timers but no GPU ops: nothing to say about host stall


def _metric_logs_only(traces: object) -> bool:
    items = traces if isinstance(traces, list) else []
    return bool(items) and all(isinstance(t, dict) and t.get("format") == "metric_log" for t in items)


ingests = [e for e in ui.usable("ingest") if not _metric_logs_only(e.manifest.get("traces"))]
pair = ui.current_pair()
ui.stop_without_trace_ingests(ingests)
rels = [e.rel for e in ingests]
pair_key = (pair.baseline.rel, pair.other.rel) if pair else None
if st.session_state.get("hs_pair") != pair_key:  # a new pair in the sidebar: start from its traces
    for key in ("hs_trace", "hs_other"):
        st.session_state.pop(key, None)
    st.session_state["hs_pair"] = pair_key
defaults = [e.rel for e in (pair.baseline, pair.other) if e.kind == "ingest"] if pair else []
if pair is not None and not defaults:
    st.info(
        f"The pair in the sidebar (`{pair.baseline.rel}` vs `{pair.other.rel}`) has no GPU trace (CPU runs have "
        "no GPU ops, hence no host stall). Pick ingested traces here."
    )
a_default = defaults[0] if defaults else rels[0]
b_default = defaults[1] if len(defaults) > 1 else NONE
c1, c2 = st.columns(2)
share.restore("hs_trace", rels)
a_rel = c1.selectbox(
    "Trace",
    rels,
    index=0 if st.session_state.get("hs_trace") in rels else rels.index(a_default),
    key="hs_trace",
)
share.keep("hs_trace")
b_opts = [NONE, *[r for r in rels if r != a_rel]]
share.restore("hs_other", b_opts)
b_index = b_opts.index(b_default) if b_default in b_opts else 0
b_rel = c2.selectbox(
    "Side by side with",
    b_opts,
    index=0 if st.session_state.get("hs_other") in b_opts else b_index,
    key="hs_other",
)
share.keep("hs_other")
shown = [ingests[rels.index(a_rel)]] + ([ingests[rels.index(b_rel)]] if b_rel != NONE else [])


@st.cache_resource(max_entries=32, show_spinner=False)
def _timelines(root: str, rel: str, name: str, stamp: int, _events: pd.DataFrame) -> list[tm.DeviceTimeline]:
    """A rank's per-device timelines, made once per events file (as ``ui.table`` reads it once): a page
    load in a new session reuses them."""
    del root, rel, name, stamp  # cache key only
    return tm.device_timelines(_events)


def _side(src: OutputEntry, key: str) -> pd.DataFrame | None:
    shares = None
    with ui.card(src.rel, src):
        devices = ui.table(src, store.DEVICES)
        if devices.empty:
            st.info(
                "This trace has no GPU ops (a CPU-only profile): GPU busy and host stall do not exist for it."
            )
            return None
        st.markdown("**Per process and GPU (whole trace)**")
        summary = summaries.device_summary(devices)
        st.dataframe(summary, hide_index=True)
        ui.download_table(summary, f"{src.rel}-devices", f"hs_dev_{key}")
        rank_files = ui.files(src, f"{store.EVENTS_DIR}/rank-*.parquet")
        if not rank_files:
            raise ValueError(f"{src.rel}: no {store.EVENTS_DIR}/rank-*.parquet event tables")

        def _name(f: str) -> str:
            stem = f.split("/")[-1].removesuffix(".parquet").removeprefix("rank-")
            return f"rank {stem}" if stem.isdigit() else f"{stem} (rank not recorded)"

        rank_file = st.selectbox("Rank", rank_files, format_func=_name, key=f"hs_rank_{key}")
        events = ui.table(src, rank_file)
        root = ui.runs_dir()
        timelines = _timelines(str(root), src.rel, rank_file, data.file_stamp(root, src, rank_file), events)
        if not timelines:
            st.info("No GPU ops in this rank's events: nothing to draw.")
            return None
        ranges = ui.table(src, store.RANGES, required=False)
        stem = rank_file.split("/")[-1].removesuffix(".parquet").removeprefix("rank-")
        if ranges is not None and "rank" in ranges and stem.isdigit():
            ranges = ranges[ranges["rank"].astype("Int64") == int(stem)]
        first = min(int(t.row["first_ns"]) for t in timelines)
        last = max(int(t.row["last_ns"]) for t in timelines)
        windows = timeline.window_choices(ranges, first, last)
        choice = st.selectbox(
            "Window (the whole trace, a step, or a slice)", list(windows), key=f"hs_window_{key}"
        )
        t0, t1 = windows[choice]
        intervals = timeline.timeline_intervals(timelines, t0, t1, rank=int(stem) if stem.isdigit() else None)
        shown_ranges = timeline.window_ranges(ranges, t0, t1) if ranges is not None else None
        if shown_ranges is not None:
            shown_ranges = shown_ranges.assign(name=shown_ranges["name"].map(timeline.short_name))
        ui.chart(
            charts_gpu.timeline_figure(intervals, shown_ranges, f"{_name(rank_file)}: {choice}"),
            f"{src.rel}-timeline",
            f"hs_tl_{key}",
        )
        shares = timeline.window_shares(intervals)
        st.dataframe(shares, hide_index=True)
    return shares


cols = st.columns(len(shown))
results = {}
for col, src in zip(cols, shown, strict=True):
    with col:
        results[src.rel] = _side(src, "a" if src.rel == a_rel else "b")
if len(shown) == 2 and all(r is not None for r in results.values()):
    with ui.card("Side by side (the windows chosen above)"):
        both = pd.concat([r.assign(trace=rel) for rel, r in results.items()], ignore_index=True)
        st.dataframe(both[["trace", *[c for c in both.columns if c != "trace"]]], hide_index=True)

frames = ui.tables_of(ui.usable("sweep") + ui.usable("ingest"), store.MICROBATCHES)
mb = pd.concat(list(frames.values()), ignore_index=True) if frames else pd.DataFrame()
if len(mb) and summaries.has_gpu_numbers(mb):
    with ui.card("Share per micro-batch size and per phase"):
        by_size = summaries.stall_share(mb, ["model", "precision", "tokens_per_microbatch"])
        no_gpu = []
        for model, grp in by_size.groupby("model"):
            if not (
                grp["traced"] > 0
            ).any():  # a CPU sweep: no GPU ops, so no host stall -- not an empty chart
                no_gpu.append(str(model))
                continue
            ui.chart(
                charts_gpu.stall_share_figure(
                    grp[grp["traced"] > 0],
                    "tokens_per_microbatch",
                    f"{model}: host stall per micro-batch size",
                ),
                f"{model}-stall-per-size",
                f"hs_size_{model}",
            )
        if no_gpu:
            st.info(
                f"Host stall per micro-batch size is not available for {', '.join(f'`{m}`' for m in no_gpu)}: "
                "its micro-batches ran on a CPU (no GPU ops, so nothing for the GPU to wait on). "
                "A GPU trace of it (a sweep with --trace on a GPU, or mxperf ingest) gives it."
            )
        by_phase = summaries.stall_share(mb, ["model", "precision", "phase"])
        ui.chart(
            charts_gpu.stall_share_figure(by_phase[by_phase["traced"] > 0], "phase", "Host stall per phase"),
            "stall-per-phase",
            "hs_phase",
        )
        st.caption(
            f"Shares in percent of the micro-batches' wall time ({summaries.STALL_PCT}, {summaries.BUSY_PCT}), "
            "as in the per-GPU tables above."
        )
        st.dataframe(by_size, hide_index=True)
        ui.download_table(by_size, "host-stall-per-size", "hs_size_dl")
else:
    st.caption(
        f"Per micro-batch host stall: {len(frames)} micro-batch table(s) here, none with GPU numbers: "
        + summaries.NO_GPU_REASON
    )
