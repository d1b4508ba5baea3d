"""Streamlit glue shared by the pages: RUNS_DIR, cached loading, the run-pair selector, per-card errors.

Caching uses ``st.cache_resource`` keyed on the file's modification time, so a table is read once and read
again only when its producer rewrites it; it keeps the object itself (no pickling). Cached frames are
treated as read-only: every analysis function in ``dashboards.compare``/``summaries`` returns new frames.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboards import compare, data
from tracing.analysis import steps
from tracing.outputs import store
from tracing.outputs.errors import MxperfError

PAIR_KEY = "mxperf_pair"
CUSTOM = "Choose two runs…"


def runs_dir() -> Path:
    try:
        return data.runs_dir_from_env()
    except MxperfError as exc:
        st.error(str(exc))
        st.stop()
        raise  # unreachable: st.stop raises


@st.cache_resource(ttl=5, show_spinner=False)
def _discover(root: str) -> list[data.OutputEntry]:
    return data.discover_outputs(Path(root))


def entries() -> list[data.OutputEntry]:
    return _discover(str(runs_dir()))


@st.cache_resource(max_entries=256, show_spinner=False)
def _table(
    root: str, rel: str, name: str, stamp: int, required: bool, _entry: data.OutputEntry
) -> pd.DataFrame | None:
    del rel, stamp  # cache key only (the entry itself is not hashed: leading underscore)
    return data.load_table(Path(root), _entry, name, required=required)


def table(entry: data.OutputEntry, name: str, *, required: bool = True) -> pd.DataFrame | None:
    root = runs_dir()
    return _table(str(root), entry.rel, name, data.file_stamp(root, entry, name), required, entry)


@st.cache_resource(max_entries=64, show_spinner=False)
def _json(root: str, rel: str, name: str, stamp: int, _entry: data.OutputEntry) -> dict[str, Any]:
    del rel, stamp
    return data.load_json(Path(root), _entry, name)


def json_file(entry: data.OutputEntry, name: str) -> dict[str, Any]:
    root = runs_dir()
    return _json(str(root), entry.rel, name, data.file_stamp(root, entry, name), entry)


def has(entry: data.OutputEntry, name: str) -> bool:
    return data.has_file(runs_dir(), entry, name)


@contextlib.contextmanager
def card(title: str) -> Iterator[None]:
    """A titled section; a CardError (or bad table) inside shows as a message here, the page goes on."""
    with st.container(border=True):
        st.subheader(title)
        try:
            yield
        except (MxperfError, ValueError, KeyError) as exc:
            st.warning(_message(exc), icon="⚠️")


def _message(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"a table is missing the column {exc}; it may come from an older or newer mxperf"
    return str(exc)


def usable(kind: str | None = None, model: str | None = None) -> list[data.OutputEntry]:
    return [
        e
        for e in entries()
        if e.usable and (kind is None or e.kind == kind) and (model is None or e.model == model)
    ]


def pair_selector() -> compare.RunPair | None:
    """Sidebar: an automatic BF16/low-precision pair per model, or two outputs picked by hand.

    Pairs come from runs, and from ingested traces labelled with model and precision; by hand, any two
    runs or ingested traces (an unlabelled external trace is compared by its ranges' phases)."""
    runs = usable("run")
    ingests = usable("ingest")
    pairs = compare.pair_runs(runs) + compare.pair_runs(ingests, kind="ingest")
    options = [f"{p.model}: {p.baseline.precision_label} vs {p.other.precision_label}" for p in pairs]
    st.sidebar.markdown("**Compare**")
    choice = st.sidebar.selectbox("Run pair", [*options, CUSTOM], key="pair_choice")
    if choice != CUSTOM:
        return pairs[options.index(choice)]
    candidates = runs + ingests
    if len(candidates) < 2:
        st.sidebar.info("Need at least two complete runs (or ingested traces) to compare.")
        return None
    labels = [e.label for e in candidates]
    a = st.sidebar.selectbox("Baseline", labels, key="pair_base")
    b = st.sidebar.selectbox("Compared", labels, index=min(1, len(labels) - 1), key="pair_other")
    base, other = candidates[labels.index(a)], candidates[labels.index(b)]
    return compare.RunPair(model=str(base.model or other.model or "?"), baseline=base, other=other)


def current_pair() -> compare.RunPair | None:
    return st.session_state.get(PAIR_KEY)


def need_pair() -> compare.RunPair:
    """The selected pair, or a message saying how to get one (and the page stops)."""
    pair = current_pair()
    if pair is None:
        st.info(
            "No BF16/low-precision pair of complete runs of one model was found under the runs directory. "
            "Make one with `mxperf run --model tiny-dense --learner bf16 --sampler bf16` and the same with "
            "`--learner mxfp8 --sampler mxfp8`, or pick two runs in the sidebar."
        )
        st.stop()
    return pair


def run_label(entry: data.OutputEntry) -> str:
    return entry.precision_label or entry.rel


def step_table(entry: data.OutputEntry) -> pd.DataFrame:
    """Per-step phase seconds of a run (metrics or range log) or of an ingested trace (``steps.parquet``:
    per step, the slowest process, which is what the job waits for)."""
    if entry.kind == "ingest":
        per_process = table(entry, store.STEPS, required=False)
        if per_process is None or per_process.empty:
            raise ValueError(
                "the trace has no step ranges (ProfilerStep#N, 'step'); per-step phase times need them"
            )
        return steps.one_process(per_process)
    return steps.step_phase_table(
        table(entry, store.METRICS, required=False), table(entry, store.RANGES, required=False)
    )


def files(entry: data.OutputEntry, pattern: str) -> list[str]:
    return data.list_files(runs_dir(), entry, pattern)


def tables_of(outputs: list[data.OutputEntry], name: str) -> dict[data.OutputEntry, pd.DataFrame]:
    """``name`` from each output that has it; an unreadable one gets its own warning, the rest are kept."""
    found: dict[data.OutputEntry, pd.DataFrame] = {}
    for entry in outputs:
        try:
            df = table(entry, name, required=False)
        except MxperfError as exc:
            st.warning(_message(exc), icon="⚠️")
            continue
        if df is not None:
            found[entry] = df
    return found
