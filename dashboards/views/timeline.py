"""Timeline: one ingested rank's CPU threads and GPU streams, zoomable, downsampled on the server, with
step / phase / micro-batch bands and host-stall spans; and the annotated trace to open in Perfetto."""

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboards import charts_gpu, data, downloads, perfetto, share, timeline, timeline_boxes, ui
from tracing.outputs import store

st.title("Timeline")
st.caption(
    "Every CPU thread and GPU stream of one rank, with the steps, phases and micro-batches above and the host "
    "stall (the GPU idle, waiting for a launch) per GPU. Pick a window with the slider (or drag a box on the "
    "chart): the server merges ops closer than a pixel into one box (hover: the longest op, the count and the "
    f"busy time), at most {timeline_boxes.DEFAULT_K} boxes per track, so a trace of any size stays responsive."
)


@st.cache_resource(
    max_entries=8, show_spinner="Reading the events (once per events file; then from the cache)…"
)
def _timeline(path: str, stamp: int) -> tuple[timeline_boxes.Timeline, timeline_boxes.Stalls]:
    del stamp
    return timeline_boxes.load(path)


ingests = [e for e in ui.usable("ingest") if ui.files(e, f"{store.EVENTS_DIR}/rank-*.parquet")]
if not ingests:
    st.info("No ingested trace with events under the runs directory. Add one on the Add a trace page.")
    st.stop()
rels = [e.rel for e in ingests]
pair = ui.current_pair()
default = (
    next((e.rel for e in (pair.baseline, pair.other) if e.kind == "ingest" and e.rel in rels), rels[0])
    if pair
    else rels[0]
)
c1, c2 = st.columns([3, 1])
share.restore("tl_trace", rels)
rel = c1.selectbox(
    "Trace",
    rels,
    index=0 if st.session_state.get("tl_trace") in rels else rels.index(default),
    key="tl_trace",
)
share.keep("tl_trace")
entry = ingests[rels.index(rel)]
rank_files = ui.files(entry, f"{store.EVENTS_DIR}/rank-*.parquet")


def _rank_name(f: str) -> str:
    return f.split("/")[-1].removesuffix(".parquet")


share.restore("tl_rank", rank_files, text=_rank_name)
rank_file = c2.selectbox("Rank", rank_files, format_func=_rank_name, key="tl_rank")
share.keep("tl_rank", text=_rank_name)
path = data.resolve_inside(ui.runs_dir(), Path(entry.rel) / rank_file)
stamp = data.file_stamp(ui.runs_dir(), entry, rank_file)
tl, stalls = _timeline(str(path), stamp)
if not len(tl.tracks):
    st.info("This rank's events hold no CPU or GPU ops with a duration: nothing to draw.")
    st.stop()
stem = rank_file.split("/")[-1].removesuffix(".parquet").removeprefix("rank-")
ranges = ui.table(entry, store.RANGES, required=False)
mb = ui.table(entry, store.MICROBATCHES, required=False)
if stem.isdigit():
    if ranges is not None and "rank" in ranges:
        ranges = ranges[ranges["rank"].astype("Int64") == int(stem)]
    if mb is not None and "rank" in mb:
        mb = mb[mb["rank"].astype("Int64") == int(stem)]

span_ms = (tl.last_ns - tl.first_ns) / 1e6
windows = timeline.window_choices(ranges, tl.first_ns, tl.last_ns)
key = f"tl_window_{rel}_{rank_file}"


def _jump() -> None:
    a, b = windows[st.session_state["tl_jump"]]
    st.session_state[key] = (max(0.0, (a - tl.first_ns) / 1e6), min(span_ms, (b - tl.first_ns) / 1e6))


share.restore("tl_jump", list(windows))
st.selectbox("Jump to (the whole trace, a step, or a slice)", list(windows), key="tl_jump", on_change=_jump)
share.keep("tl_jump")
share.restore("tl_window", like=(0.0, 0.0), check=lambda w: 0.0 <= w[0] < w[1] <= span_ms, state=key)
st.session_state.setdefault(key, (0.0, span_ms))  # no value= below: a restored window draws without a warning
lo_ms, hi_ms = st.slider(
    "Window (ms from the trace's first op)",
    0.0,
    span_ms,
    step=max(span_ms / 2000, 0.001),
    key=key,
)
share.keep("tl_window", state=key)
t0 = tl.first_ns + int(lo_ms * 1e6)
t1 = max(tl.first_ns + int(hi_ms * 1e6), t0 + 1)
boxes = timeline_boxes.boxes(tl, t0, t1)
stall_boxes = timeline_boxes.stall_boxes(stalls, t0, t1)
all_boxes = boxes if stall_boxes.empty else pd.concat([boxes, stall_boxes], ignore_index=True)
shown_bands = timeline.bands(ranges, mb, t0, t1)
fig = charts_gpu.tracks_figure(
    all_boxes, shown_bands, tl.first_ns, f"{rel} · {rank_file}: {lo_ms:,.1f} – {hi_ms:,.1f} ms"
)
event = st.plotly_chart(fig, width="stretch", key="tl_chart", on_select="rerun", selection_mode="box")
box = (event.get("selection") or {}).get("box") if event else None
if box and box[0].get("x") and len(box[0]["x"]) == 2:
    a, b = sorted(float(v) for v in box[0]["x"])
    new = (max(0.0, a), min(span_ms, b))
    if b > a and new != st.session_state.get(key):
        st.session_state[key] = new
        st.rerun()
in_window = int(((tl.islands.start < t1) & (tl.islands.end > t0)).sum())
st.caption(
    f"{len(all_boxes):,} boxes drawn for {len(tl.tracks)} CPU-thread / GPU-stream tracks and "
    f"{len(stalls.labels)} host-stall track(s) ({tl.ops:,} ops in this rank, {in_window:,} busy islands in the "
    f"window); bands: {', '.join(sorted(set(shown_bands['band']))) or 'none in this window'}"
    + ("" if mb is not None else " (no micro-batch table in this output)")
    + ". A box's busy time is the union of its ops in the window; hover a box for its longest op."
)
st.download_button(
    "⬇ figure (HTML)",
    data=lambda: downloads.figure_html(fig),
    file_name=f"{downloads.safe_stem(rel)}-timeline.html",
    mime=downloads.MIME["html"],
    key="dl_tl_html",
    on_click="ignore",
)

with ui.card("Open in Perfetto", entry):
    st.markdown(
        f"The annotated trace of `{rank_file}`: its CPU ops, runtime calls, kernels, memory ops and ranges as a "
        "Kineto trace, plus `mxperf annotate`'s **GPU busy / host stall / idle (other)** tracks per GPU "
        "(made when you click, once per events file; `mxperf ingest` reads it back with the same numbers)."
    )
    st.download_button(
        "⬇ annotated trace (.json.gz) for Perfetto",
        data=lambda: perfetto.annotated_trace(path, f"{rel}/{rank_file}").read_bytes(),
        file_name=f"{downloads.safe_stem(rel)}-{stem}-annotated.json.gz",
        mime="application/gzip",
        key="dl_tl_perfetto",
        on_click="ignore",
    )
    st.markdown("\n".join(f"{i}. {s}" for i, s in enumerate(perfetto.STEPS, 1)))
