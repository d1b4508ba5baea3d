"""Loading for the Kernels and Diff pages: the documents of ``mxperf kernels --json`` / ``mxperf diff --json``,
cached on the ingest's files' modification times, once every file they read is found inside RUNS_DIR.

Made by the CLI's functions (``perfmodel.kernels.summary.document``, ``perfmodel.kernels.diff.diff``).

The perfmodel functions read an ingest folder by path (DuckDB over its Parquet tables), so the confinement
``dashboards.data`` gives every other read is checked here first: a file or ``events/`` table that resolves
outside RUNS_DIR (a link) refuses the folder with one message. Their errors (an ingest without
``kernels.parquet``, a metric log without GPU ops) come back as one line naming the folder relative to RUNS_DIR.
Heavy imports (DuckDB, perfmodel) happen when a page first asks, not when the app starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from dashboards import data, ui
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

NO_DEVICE = "(none)"


def ingest_folder(entry: data.OutputEntry) -> Path:
    """The folder of ``entry`` after checking that it and every file in it (and in ``events/``) resolve
    inside RUNS_DIR; a :class:`data.CardError` otherwise."""
    data.check_usable(entry)
    root = ui.runs_dir()
    base = data.resolve_inside(root, entry.rel)
    for sub in (base, base / store.EVENTS_DIR):
        if not sub.is_dir():
            continue
        for p in sorted(sub.iterdir()):
            data.resolve_inside(root, p.relative_to(root.resolve()))
    return base


def _stamp(base: Path) -> tuple[int, ...]:
    """Modification times of the files the documents are made from (cache key: a rewritten ingest is
    read again)."""
    out = []
    for sub in (base, base / store.EVENTS_DIR):
        if sub.is_dir():
            out += [p.stat().st_mtime_ns for p in sorted(sub.iterdir()) if p.is_file()]
    return tuple(out)


def _message(exc: Exception, *folders: tuple[Path, data.OutputEntry]) -> str:
    """The error's line with each folder named relative to RUNS_DIR."""
    text = str(exc)
    for base, entry in folders:
        text = text.replace(str(base), entry.rel)
    return text.replace(str(ui.runs_dir().resolve()) + "/", "")


@st.cache_resource(max_entries=32, show_spinner="Reading the ingest's kernels…")
def _kernels(path: str, top: int, device_id: str | None, stamp: tuple[int, ...]) -> dict[str, Any]:
    del stamp  # cache key only
    from perfmodel.kernels.devices import device
    from perfmodel.kernels.summary import document

    return document(path, top=top, dev=device(device_id) if device_id else None)


def kernels_doc(entry: data.OutputEntry, top: int, device_id: str | None) -> dict[str, Any]:
    """``mxperf kernels OUT --top TOP [--device D] --json``'s document for ``entry`` (schema_version aside)."""
    base = ingest_folder(entry)
    try:
        return _kernels(str(base), top, device_id, _stamp(base))
    except MxperfError as exc:
        raise data.CardError(_message(exc, (base, entry))) from None


@st.cache_resource(max_entries=16, show_spinner="Decomposing the difference…")
def _diff(a: str, b: str, stamps: tuple[tuple[int, ...], tuple[int, ...]]) -> dict[str, Any]:
    del stamps
    from perfmodel.kernels.diff import diff

    return diff(a, b)


def diff_doc(a: data.OutputEntry, b: data.OutputEntry) -> dict[str, Any]:
    """``mxperf diff A B --json``'s document (schema_version aside)."""
    ba, bb = ingest_folder(a), ingest_folder(b)
    try:
        return _diff(str(ba), str(bb), (_stamp(ba), _stamp(bb)))
    except MxperfError as exc:
        raise data.CardError(_message(exc, (ba, a), (bb, b))) from None


def show(frame: Any, name: str, key: str) -> None:
    """A table with its numbers shown rounded (``kernel_tables.number_format``) and CSV / Parquet downloads
    of every digit."""
    from dashboards.kernel_tables import number_format

    config: dict[str, Any] = {
        c: st.column_config.NumberColumn(format=f)
        for c in frame.columns
        if (f := number_format(str(c))) is not None
    }
    for c in frame.columns:  # long names: a narrower column (the whole name on hover) so the numbers show
        if str(c) in ("kernel", "shapes") or str(c).startswith("GEMM shapes"):
            config[c] = st.column_config.TextColumn(width="medium")
    st.dataframe(frame, hide_index=True, column_config=config)
    ui.download_table(frame, name, key)


def device_ids() -> list[str]:
    from perfmodel.kernels.devices import load_devices

    return [d.id for d in load_devices()]


def device_name(device_id: str) -> str:
    if device_id == NO_DEVICE:
        return "(none: no roofline)"
    from perfmodel.kernels.devices import device

    return f"{device(device_id).name} ({device_id})"


def trace_device(entry: data.OutputEntry) -> str | None:
    """The device of ``perfmodel.kernels.devices`` the ingest's traces name (``gpu_names``), as ``mxperf diff --on``
    takes it (``perfmodel.breakeven.whatif.source_device``); None when none maps."""
    base = ingest_folder(entry)
    traces = entry.manifest.get("traces")
    if not isinstance(traces, list) or not all(
        isinstance(t, dict) and isinstance(t.get("gpu_names") or [], list) for t in traces
    ):
        return None  # a manifest of another shape names no device (source_device expects this one)
    from perfmodel.breakeven.whatif import source_device

    dev = source_device(base)
    return dev.id if dev is not None else None


def is_trace_ingest(entry: data.OutputEntry) -> bool:
    """An ingest of GPU traces (not a metric-log import, which has no kernels)."""
    traces = entry.manifest.get("traces")
    items = traces if isinstance(traces, list) else []
    return not (items and all(isinstance(t, dict) and t.get("format") == "metric_log" for t in items))
