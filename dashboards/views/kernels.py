"""Kernels: the top kernels and kernel classes of an ingested trace, communication per step and rank, and with a
device the roofline of each GEMM shape.

Time, count, share of GPU busy, per phase and per micro-batch. Every number is a field of ``mxperf kernels
OUT --json`` (the same function makes it)."""

import streamlit as st

from dashboards import charts_kernels, kernel_load, kernel_tables, share, ui
from tracing.outputs.errors import MxperfError

st.title("Kernels")
st.caption(
    "The document `mxperf kernels OUT --top K [--device D] --json` prints, made by the same function "
    "(`perfmodel.kernels.summary.document`: `perfmodel.kernels.summary`, `perfmodel.kernels.roofline`, "
    "`perfmodel.kernels.comm`; rules in docs/kernels.md). Share of GPU busy = a kernel's summed time over the "
    "busy union of the trace's GPUs (`devices.parquet`): kernels on concurrent streams can add up to more than "
    "100 %. Per micro-batch = the time of the phase's micro-batches over their count."
)

ingests = [e for e in ui.usable("ingest") if kernel_load.is_trace_ingest(e)]
ui.stop_without_trace_ingests(ingests)
rels = [e.rel for e in ingests]
pair = ui.current_pair()
default = next((e.rel for e in (pair.baseline, pair.other) if e.rel in rels), rels[0]) if pair else rels[0]
TOPS = [5, 10, 15, 20, 50, 0]
c1, c2, c3 = st.columns([3, 1, 2])
share.restore("kn_ingest", rels)
rel = c1.selectbox(
    "Ingest output",
    rels,
    index=0 if st.session_state.get("kn_ingest") in rels else rels.index(default),
    key="kn_ingest",
)
share.keep("kn_ingest")
entry = ingests[rels.index(rel)]
share.restore("kn_top", TOPS, like=0)
top = c2.selectbox(
    "Top kernels",
    TOPS,
    index=0 if st.session_state.get("kn_top") in TOPS else TOPS.index(15),  # 15: the CLI's default
    key="kn_top",
    format_func=lambda t: "all" if t == 0 else str(t),
    help="`--top`: kernels shown (the classes are always all)",
)
share.keep("kn_top")

dev_opts = [kernel_load.NO_DEVICE, *kernel_load.device_ids()]
try:
    found = kernel_load.trace_device(entry)
except (MxperfError, ValueError, KeyError, OSError):
    found = None  # the card below names what is wrong with the folder
ui.widget_default(
    "kn_device", rel, found or kernel_load.NO_DEVICE, dev_opts, keep=share.restore("kn_device", dev_opts)
)
device_id = c3.selectbox(
    "Device (roofline)",
    dev_opts,
    key="kn_device",
    format_func=kernel_load.device_name,
    help="Peaks and bandwidth from perfmodel/kernels/devices.toml (each with its source). Starts at the GPU the "
    "trace names (gpu_names) when it is a known device.",
)
share.keep("kn_device")
if found is None:
    st.caption(
        "The trace names no device of perfmodel/kernels/devices.toml (`gpu_names`): pick one for the roofline."
    )

doc = None  # stays None when the card below shows why the folder cannot be read
with ui.card(f"{rel}: kernel classes", entry, key="kernels-classes"):
    doc = kernel_load.kernels_doc(entry, top, None if device_id == kernel_load.NO_DEVICE else device_id)
    mbs = doc["microbatches"]
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(
        "GPU busy", f"{doc['busy_ns'] / 1e6:,.1f} ms", help="busy union per GPU, summed (devices.parquet)"
    )
    m2.metric("GPU ops", f"{doc['ops']:,}")
    m3.metric("GPU op time, summed", f"{doc['op_ns'] / 1e6:,.1f} ms")
    m4.metric("Micro-batches", f"{sum(mbs.values()):,}")
    st.caption(
        "Micro-batches per phase: "
        + (", ".join(f"{p} {n}" for p, n in mbs.items()) or "none found")
        + " (per-micro-batch columns: a phase's time in its micro-batches over their count)"
    )
    for note in doc.get("notes", []):
        st.warning(f"Note: {note}")
    classes = kernel_tables.classes_frame(doc)
    kernel_load.show(classes, f"{rel}-kernel-classes", "kn_classes")
    long = kernel_tables.class_phase_frame(doc)
    if len(long):
        ui.chart(
            charts_kernels.class_phase_figure(long, "Kernel time per class and phase"),
            f"{rel}-kernel-classes",
            "kn_classes_fig",
        )

    st.markdown(f"**Top {'kernels' if top == 0 else f'{top} kernels'}** (by total time)")
    kernels = kernel_tables.kernels_frame(doc)
    kernel_load.show(kernels, f"{rel}-kernels", "kn_kernels")

    if "communication" in doc:
        comm = doc["communication"]
        st.markdown("**Communication per step and rank** (collective kernels, `perfmodel.kernels.comm`)")
        st.caption(
            f"Collective kernels {comm['comm_ns'] / 1e6:,.3f} ms in all"
            + (
                f", {comm['unassigned_ns'] / 1e6:,.3f} ms of it before any micro-batch (step -1: no step)"
                if comm["unassigned_ns"]
                else ""
            )
            + ". Overlapped = the part of their busy union during which a compute kernel runs on another "
            "stream; exposed = the rest."
        )
        per_rank, per_step = kernel_tables.comm_frames(comm)
        kernel_load.show(per_rank, f"{rel}-communication-per-rank", "kn_comm_rank")
        if per_step["ranks"].max() > 1:
            kernel_load.show(per_step, f"{rel}-communication-per-step", "kn_comm_step")

if doc is not None and "roofline" in doc:
    with ui.card("GEMM roofline", key="kernels-roofline"):
        roof = doc["roofline"]
        dev = roof["device"]
        st.caption(
            f"On {dev['name']} (peak dense FLOP/s and HBM bandwidth with their sources: perfmodel/kernels/devices.toml). "
            "Per GEMM kernel, launching op and input shapes (top "
            f"{'all' if top == 0 else top} by time): FLOPs = 2BMNK, bytes = each operand read once and the "
            "output written once, achieved = FLOPs / mean duration; compute-bound when FLOP per byte >= "
            "peak / bandwidth; floor = max(FLOPs / peak, bytes / bandwidth)."
        )
        table = kernel_tables.roofline_frame(roof)
        if len(table):
            ui.chart(
                charts_kernels.roofline_figure(
                    table, dev["hbm_bytes_per_s"], f"GEMM roofline on {dev['name']}"
                ),
                f"{rel}-roofline-{dev['id']}",
                "kn_roof_fig",
            )
            kernel_load.show(table, f"{rel}-roofline-{dev['id']}", "kn_roof")
        for note in roof["notes"]:
            st.caption(f"Note: {note}")
