"""Add a trace: upload a Kineto / Nsight Systems trace (or pick one under the runs directory) and ingest it."""

import streamlit as st

from dashboards import ui, upload
from tracing.outputs import store
from tracing.outputs.errors import MxperfError
from tracing.outputs.precisions import PRECISION_IDS

UPLOAD, PICK = "Upload", "A file under the runs directory"
LAST = "add_last"  # the last successful ingest: its message and warnings stay on the page

st.title("Add a trace")
root = ui.runs_dir()
limit_mb = upload.max_upload_bytes() / (1 << 20)
st.caption(
    "The trace is ingested by `mxperf ingest` itself (same checks, same errors, same tables) into a new folder "
    f"under the runs directory; uploads are kept in `{upload.UPLOADS_DIR}/`. Several files at once are one "
    f"multi-rank trace set. Upload limit {limit_mb:.0f} MB (`mxperf dash --max-upload-mb`); larger traces: copy "
    "them under the runs directory and pick them, or run `mxperf ingest` on the command line."
)

with ui.card("Trace"):
    source = st.radio("Source", [UPLOAD, PICK], horizontal=True, key="add_source")
    files, picked = [], []
    if source == UPLOAD:
        files = st.file_uploader(
            "Kineto .json / .json.gz or Nsight Systems .sqlite",
            type=["json", "gz", "sqlite", "sqlite3", "db"],
            accept_multiple_files=True,
            key="add_upload",
        )
    else:
        found = upload.find_traces(root)
        if not found:
            st.info("No trace files (*.json, *.json.gz, *.sqlite) under the runs directory.")
        picked = st.multiselect("Traces", found, key="add_pick")
    first = (files[0].name if files else picked[0].rsplit("/", 1)[-1] if picked else "trace").split(".")[0]
    default_name = upload.default_output_name(root, first)
    ui.widget_default("add_name", default_name, default_name)  # a new default: the last one is taken now
    name = st.text_input("Output folder (new, directly under the runs directory)", key="add_name")
    st.markdown("**Labels** (optional: needed to fit a breakeven from this trace)")
    c1, c2, c3, c4 = st.columns(4)
    labels = {
        "model": c1.text_input("model", key="add_model", placeholder="qwen3-8b"),
        "precision": c2.selectbox("precision", ["", *PRECISION_IDS], key="add_precision"),
        "tokens_per_microbatch": c3.number_input(
            "tokens per micro-batch", min_value=0, value=0, step=256, key="add_tokens", help="0 = not given"
        ),
        "phase": c4.selectbox("phase", ["", "update", "logprob", "generate"], key="add_phase"),
    }
    hashes = st.session_state.setdefault("add_hashes", {})
    try:
        dups = (
            upload.duplicate_uploads([(f.name, f) for f in files], hashes)
            if source == UPLOAD
            else upload.duplicate_picks(root, picked, hashes)
        )
    except MxperfError as exc:
        st.error(str(exc))
        dups = []
    if dups:
        st.warning(upload.duplicate_message(dups) + ".", icon=":material/content_copy:")
    go = st.button("Ingest", type="primary", key="add_go", disabled=not (files or picked) or bool(dups))

if go:
    try:
        upload.check_output_name(root, name.strip())
        label_arg = upload.label_argument(labels)
        if source == UPLOAD:
            inputs = upload.store_upload(root, [(f.name, f) for f in files])
        else:
            inputs = upload.check_inputs(root, picked)
    except MxperfError as exc:
        st.error(str(exc))
        st.stop()
    cmd = upload.ingest_command(inputs, name.strip(), label_arg)
    with st.status(f"Ingesting {', '.join(inputs)} …", expanded=True) as status:
        st.code(" ".join(["mxperf", *cmd[3:]]), language="bash")
        outcome = upload.run_ingest(root, cmd, on_line=st.text)
        if outcome.ok:
            status.update(label=f"Added `{name.strip()}` ({outcome.message})", state="complete")
        else:
            status.update(label="Ingest failed", state="error")
    if outcome.ok:
        ui.refresh()
        added = ui.by_rel(name.strip())
        try:
            if added is None:
                raise MxperfError("not found under the runs directory")
            said = upload.ingest_warnings(ui.json_file(added, store.MANIFEST))
        except MxperfError as exc:
            said = [f"{name.strip()}/manifest.json could not be read back: {exc}"]
        st.session_state[LAST] = {"name": name.strip(), "message": outcome.message, "warnings": said}
    else:
        st.session_state.pop(LAST, None)
        st.error(outcome.message)
        if source == UPLOAD:
            upload.discard_upload(root, inputs)

last = st.session_state.get(LAST)
if last:
    st.success(
        f"`{last['name']}` is now listed on the Runs page and can be compared in the sidebar ({last['message']})."
    )
    if last["warnings"]:
        st.warning(
            f"The ingest of `{last['name']}` says:\n\n" + "\n".join(f"- {w}" for w in last["warnings"]),
            icon=":material/warning:",
        )
