"""Streamlit glue shared by the pages: RUNS_DIR, cached loading, the comparison picker, cards, downloads.

Caching uses ``st.cache_resource`` keyed on each file's modification time, so a table is read once and read
again only when its producer rewrites it; it keeps the object itself (no pickling). Cached frames are
treated as read-only: every analysis function in ``dashboards.compare``/``summaries`` returns new frames.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards import compare, data, downloads, share
from dashboards.provenance import Provenance
from tracing.analysis import steps
from tracing.outputs import schema, store
from tracing.outputs.errors import MxperfError

PAIR_KEY = "mxperf_pair"
CUSTOM = "Choose two outputs…"


def widget_default(
    key: str, source: object, default: object, allowed: object = None, keep: bool = False
) -> None:
    """Put ``default`` into the keyed widget ``key`` when what it is made from (``source``) is not what it
    was made from last time, when the widget has no value yet, or when its value is not in ``allowed``.
    A widget using this passes no ``value=``: a keyed widget keeps its value when its ``value=`` changes,
    and the browser keeps showing the old one unless the state is set (Breakeven kept the previous fit's N
    and other phases; Add a trace kept a taken output name)."""
    tag = f"{key}__source"
    current = st.session_state.get(key)
    if keep and (allowed is None or current in allowed):  # a value just restored from the URL
        st.session_state[tag] = source
        return
    if (
        st.session_state.get(tag) != source
        or key not in st.session_state
        or (allowed is not None and current not in allowed)
    ):
        st.session_state[key] = default
        st.session_state[tag] = source


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


def refresh() -> None:
    """Forget the discovered outputs (a new one was just added)."""
    _discover.clear()


def by_rel(rel: str) -> data.OutputEntry | None:
    return next((e for e in entries() if e.rel == rel), None)


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


def read_bytes(entry: data.OutputEntry, name: str) -> bytes:
    """A file of an output for a download button (confined to RUNS_DIR like every read)."""
    data.check_usable(entry)
    path = data.resolve_inside(runs_dir(), Path(entry.rel) / name)
    if not path.is_file():
        raise data.CardError(f"{entry.rel}: has no {name}")
    return path.read_bytes()


def download_file(entry: data.OutputEntry, name: str, label: str, key: str) -> None:
    """A download button for one file of an output (report.md, a plot PNG), read when clicked."""
    suffix = name.rsplit(".", 1)[-1]
    st.download_button(
        label,
        data=lambda: read_bytes(entry, name),
        file_name=f"{downloads.safe_stem(entry.rel)}-{downloads.safe_stem(name)}",
        mime=downloads.MIME.get(suffix, "image/png" if suffix == "png" else "application/octet-stream"),
        key=f"dl_{key}",
        on_click="ignore",
    )


@contextlib.contextmanager
def card(title: str, entry: data.OutputEntry | None = None, key: str | None = None) -> Iterator[None]:
    """A titled section; a CardError (or bad table) inside shows as a message here, the page goes on.
    With ``entry``, the output's device and low-precision provenance is shown under the title; ``key``
    gives the card the CSS class ``st-key-<key>`` (the browser tests find it by that)."""
    with st.container(border=True, key=key):
        st.subheader(title)
        if entry is not None:
            provenance_caption(entry)
        try:
            yield
        except (MxperfError, ValueError, KeyError) as exc:
            st.warning(_message(exc), icon=":material/warning:")


def _message(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"a table is missing the column {exc}; it may come from an older or newer mxperf"
    return str(exc)


def provenance(entry: data.OutputEntry) -> Provenance:
    return data.entry_provenance(entry, entries())


def source_marks(
    found: Mapping[data.OutputEntry, pd.DataFrame], precisions: Callable[[pd.DataFrame], Any]
) -> None:
    """One caption per source output of a table shown on a card, marked like Breakeven's answer card
    (:orange-badge[emulated] / :green-badge[measured]): device and emulation from its manifest (device,
    learner_device, gemm_backend) for the precisions its table holds (``precisions(table)``)."""
    for entry, table in found.items():
        prov = data.provenance(entry.manifest, [str(p) for p in precisions(table) if p])
        mark = {"emulated": ":orange-badge[emulated]", "native": ":green-badge[measured]"}.get(
            prov.low_precision, ""
        )
        st.caption(f"{mark} `{entry.rel}`: **{prov.badge}** — {prov.note}".strip())


def provenance_caption(entry: data.OutputEntry) -> None:
    prov = provenance(entry)
    st.caption(f"**{prov.badge}** — {prov.note}")


def usable(kind: str | None = None, model: str | None = None) -> list[data.OutputEntry]:
    return [
        e
        for e in entries()
        if e.usable and (kind is None or e.kind == kind) and (model is None or e.model == model)
    ]


def stop_without_trace_ingests(usable: list[data.OutputEntry]) -> None:
    """A page over ingested GPU traces with none to show: say why and how to add one, and stop the page."""
    if usable:
        return
    unusable_notes([e for e in entries() if e.kind == "ingest"], "ingest")
    st.info(
        "No ingested GPU trace under the runs directory. Add one on the Add a trace page or with "
        "`mxperf ingest TRACE -o RUNS_DIR/NAME`."
    )
    st.stop()


def unusable_notes(outputs: list[data.OutputEntry], what: str) -> None:
    """Say which outputs of a kind exist but cannot be used, and why ('No sweep' would be false)."""
    broken = [e for e in outputs if not e.usable]
    if broken:
        st.warning(
            f"{len(broken)} {what} output(s) exist but cannot be read: "
            + "; ".join(f"`{e.rel}`: {e.error or data.status_problem(e)}" for e in broken),
            icon=":material/warning:",
        )


# --------------------------------------------------------------------------------------------- step tables
@st.cache_resource(max_entries=128, show_spinner=False)
def _steps(
    root: str, rel: str, stamps: tuple[int, ...], _entry: data.OutputEntry
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    del root, rel, stamps  # cache key only
    entry = _entry
    if entry.kind == "ingest":
        per_process = table(entry, store.STEPS, required=False)
        if per_process is None or per_process.empty:
            raise ValueError(
                f"{entry.rel}: the trace has no step ranges (ProfilerStep#N, 'step'); per-step phase times need them"
            )
        # a process's files (verl's discrete mode: a file per stage) as the one process they are
        per_process = schema.to_frame(steps.merge_process_files(schema.from_frame(per_process)))
        return steps.one_process(per_process), per_process
    metrics = table(entry, store.METRICS, required=False)
    ranges = table(entry, store.RANGES, required=False)
    try:
        long = steps.step_phase_table(metrics, ranges)
    except ValueError as exc:
        raise ValueError(f"{entry.rel}: {exc}") from None
    return compare.with_sync_checks(long, metrics), None


def step_data(entry: data.OutputEntry) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(``step, phase, seconds`` -- for a multi-rank trace the slowest rank per step --, the per-process
    table of an ingested trace or None). Raises CardError / ValueError with the reason."""
    root = runs_dir()
    names = (store.STEPS,) if entry.kind == "ingest" else (store.METRICS, store.RANGES)
    stamps = tuple(data.file_stamp(root, entry, n) for n in names)
    return _steps(str(root), entry.rel, stamps, entry)


def step_table(entry: data.OutputEntry) -> pd.DataFrame:
    return step_data(entry)[0]


def comparable() -> tuple[list[data.OutputEntry], dict[str, str]]:
    """Outputs that have per-step phase times (runs, ingested traces, metric-log imports), and why each
    other complete run or ingest was left out."""
    ok, left_out = [], {}
    for e in usable("run") + usable("ingest"):
        try:
            step_data(e)
        except (MxperfError, ValueError, KeyError) as exc:
            left_out[e.rel] = _message(exc).removeprefix(f"{e.rel}: ").removeprefix(f"{e.rel}/")
            continue
        ok.append(e)
    return ok, left_out


def _precision(entry: data.OutputEntry) -> str:
    """``mxfp8`` for an end-to-end run, ``mxfp8/bf16`` (learner/sampler) when the two differ."""
    if entry.learner and entry.sampler and entry.learner != entry.sampler:
        return f"{entry.learner}/{entry.sampler}"
    return entry.learner or entry.precision_label or entry.rel


SIDEBAR_CHARS = 30  # what a sidebar picker shows whole at 1280 px; longer names keep their start and end


def _short(entry: data.OutputEntry) -> str:
    rel = entry.rel
    if len(rel) <= SIDEBAR_CHARS:
        return rel
    half = (SIDEBAR_CHARS - 1) // 2
    return f"{rel[:half]}…{rel[-half:]}"


def pair_selector() -> compare.RunPair | None:
    """Sidebar: an automatic BF16/low-precision pair per model, or any two outputs with step times.

    Only outputs whose step tables read are offered (a complete manifest over a corrupt metrics table is
    not paired); the same output cannot be picked twice."""
    candidates, left_out = comparable()
    pairs = compare.pair_runs(candidates) + compare.pair_runs(candidates, kind="ingest")
    options = [f"{p.model}: {_precision(p.baseline)} vs {_precision(p.other)}" for p in pairs]
    st.sidebar.markdown("**Compare**")
    if len(candidates) < 2:
        st.sidebar.info("Need at least two complete outputs with per-step times (runs or traces) to compare.")
        return None
    share.restore("pair_choice", [*options, CUSTOM])
    choice = st.sidebar.selectbox(
        "Pair",
        [*options, CUSTOM],
        key="pair_choice",
        help="Each model's newest BF16 and low-precision outputs",
    )
    share.keep("pair_choice")
    if choice != CUSTOM:
        pair = pairs[options.index(choice)]
        share.drop("pair_base", "pair_other")
    else:
        rels = [e.rel for e in candidates]
        default = pairs[0] if pairs else compare.RunPair("?", candidates[0], candidates[1])
        share.restore("pair_base", rels)
        a = st.sidebar.selectbox(
            "Baseline",
            rels,
            index=0 if "pair_base" in st.session_state else rels.index(default.baseline.rel),
            key="pair_base",
            format_func=lambda r: _short(candidates[rels.index(r)]),
        )
        share.keep("pair_base")
        others = [r for r in rels if r != a]
        b_default = default.other.rel if default.other.rel in others else others[0]
        share.restore("pair_other", others)
        b = st.sidebar.selectbox(
            "Compared",
            others,
            index=0 if st.session_state.get("pair_other") in others else others.index(b_default),
            key="pair_other",
            format_func=lambda r: _short(candidates[rels.index(r)]),
        )
        share.keep("pair_other")
        base, other = candidates[rels.index(a)], candidates[rels.index(b)]
        pair = compare.RunPair(model=str(base.model or other.model or "?"), baseline=base, other=other)
    st.sidebar.caption(
        f"Baseline `{pair.baseline.rel}` ({run_label(pair.baseline)}) · compared `{pair.other.rel}` "
        f"({run_label(pair.other)})"
    )
    for e in (pair.baseline, pair.other):
        if e.precision_from == "kernels" or e.model_from == "embedding":
            st.sidebar.caption(f"`{e.rel}`: {data.found_in_trace(e)}")
        if e.conflict:
            st.sidebar.warning(f"`{e.rel}`: {e.conflict} (the label is used)", icon=":material/warning:")
    if left_out:
        with st.sidebar.expander(f"{len(left_out)} output(s) not offered"):
            st.markdown("\n".join(f"- `{rel}`: {why}" for rel, why in left_out.items()))
    return pair


def current_pair() -> compare.RunPair | None:
    return st.session_state.get(PAIR_KEY)


def need_pair() -> compare.RunPair:
    """The selected pair, or a message saying how to get one (and the page stops)."""
    pair = current_pair()
    if pair is None:
        st.info(
            "Nothing to compare: fewer than two complete outputs with per-step times under the runs directory. "
            "Make a pair with `mxperf run --model tiny-dense --learner bf16 --sampler bf16` and the same with "
            "`--learner mxfp8 --sampler mxfp8`, or add two traces on the Add a trace page."
        )
        st.stop()
    return pair


def run_label(entry: data.OutputEntry) -> str:
    """``mxfp8`` (end to end), ``mxfp8/bf16`` (learner/sampler) or, without precisions, the folder."""
    return _precision(entry) if (entry.learner or entry.precision_label) else entry.rel


def files(entry: data.OutputEntry, pattern: str) -> list[str]:
    return data.list_files(runs_dir(), entry, pattern)


def tables_of(outputs: list[data.OutputEntry], name: str) -> dict[data.OutputEntry, pd.DataFrame]:
    """``name`` from each output that has it; an unreadable one gets its own warning, the rest are kept."""
    found: dict[data.OutputEntry, pd.DataFrame] = {}
    for entry in outputs:
        try:
            df = table(entry, name, required=False)
        except MxperfError as exc:
            st.warning(_message(exc), icon=":material/warning:")
            continue
        if df is not None:
            found[entry] = df
    return found


# --------------------------------------------------------------------------------------------- downloads
def download_table(df: pd.DataFrame, name: str, key: str) -> None:
    """CSV and Parquet download buttons for a table shown on the page."""
    stem = downloads.safe_stem(name)
    row = st.container(horizontal=True)  # buttons as wide as their labels, side by side
    for fmt in downloads.FORMATS:
        row.download_button(
            f"⬇ {fmt.upper()}",
            data=lambda fmt=fmt: downloads.table_bytes(df, fmt),  # made on click, not on every render
            file_name=f"{stem}.{fmt}",
            mime=downloads.MIME[fmt],
            key=f"dl_{key}_{fmt}",
            on_click="ignore",
        )


def chart(fig: go.Figure, name: str, key: str) -> None:
    """A plotly chart with a download of the figure as a standalone HTML file (a PNG: the chart's camera
    icon). Download bytes are made when clicked, so offering them costs nothing on page load."""
    st.plotly_chart(fig, width="stretch", key=f"chart_{key}")
    st.download_button(
        "⬇ figure (HTML)",
        data=lambda: downloads.figure_html(fig),
        file_name=f"{downloads.safe_stem(name)}.html",
        mime=downloads.MIME["html"],
        key=f"dl_{key}_html",
        on_click="ignore",
    )
