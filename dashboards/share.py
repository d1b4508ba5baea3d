"""Shareable views: the picked outputs, pair, fit entry (model and phase), basis and knobs in the URL query.

A widget that takes part has a query parameter (:data:`PARAMS`). Before it is drawn, :func:`restore` puts the
URL's value into its session state -- once per session, and only a value the widget offers -- so opening or
reloading a link shows the view it was copied from; after it is drawn, :func:`keep` writes its value back, so
the address bar always holds the view. :func:`link_slot` / :func:`show_link` put the whole link in the
sidebar's *Share this view* popover, in a code box whose copy button copies it ("copy link")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import streamlit as st

# widget key -> query parameter
PARAMS: dict[str, str] = {
    "pair_choice": "pair",
    "pair_base": "base",
    "pair_other": "other",
    "ov_fit": "fit",
    "be_fit": "fit",
    "be_overlay": "overlay",
    "be_entry": "entry",
    "be_basis": "basis",
    "be_N": "N",
    "be_n": "n",
    "be_other": "other_s",
    "be_other_low": "other_low_s",
    "be_scale": "fixed_scale",
    "be_wq": "weight_quant",
    "hs_trace": "trace",
    "hs_other": "trace_other",
    "kn_ingest": "ingest",
    "kn_top": "top",
    "kn_device": "device",
    "df_a": "diff_a",
    "df_b": "diff_b",
    "df_by": "by",
    "tl_trace": "trace",
    "tl_rank": "rank",
    "tl_jump": "jump",
    "tl_window": "window",
}
_SLOT = "_share_link_slot"


def _done(key: str) -> str:
    return f"_share_restored_{key}"


def _parse(raw: str, like: Any) -> Any:
    if isinstance(like, tuple):  # a range: "lo,hi"
        parts = raw.split(",")
        if len(parts) != len(like):
            raise ValueError(raw)
        return tuple(_parse(p, v) for p, v in zip(parts, like, strict=True))
    if isinstance(like, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    if isinstance(like, int):
        return int(float(raw))
    if isinstance(like, float):
        return float(raw)
    return raw


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple | list):  # a range slider's (lo, hi); floats as repr: read back exactly
        return ",".join(_text(v) for v in value)
    return str(value)


def restore(
    key: str,
    options: Iterable[Any] | None = None,
    like: Any = "",
    check: Callable[[Any], bool] | None = None,
    text: Callable[[Any], str] = _text,
    state: str | None = None,
) -> bool:
    """Put the URL's value for widget ``key`` into its state, the first time the widget is drawn in this
    session; ``options`` (or ``check``) say which values the widget offers -- another is ignored. ``like``
    is a value of the widget's type (the URL holds text; a tuple for a range slider); ``text`` writes an
    option as the URL holds it (default: ``str``); ``state`` is the widget's session-state key when it is
    not ``key`` (a widget keyed by what it shows, as Timeline's window per trace and rank). True when a
    value was restored."""
    if st.session_state.get(_done(key)):
        return False
    st.session_state[_done(key)] = True
    raw = st.query_params.get(PARAMS[key])
    if raw is None:
        return False
    value: Any = raw
    if options is None:
        try:
            value = _parse(raw, like)
        except ValueError:
            return False
    else:
        opts = list(options)
        match = next((o for o in opts if text(o) == raw), None)
        if match is None:
            try:
                parsed = _parse(raw, like)
            except ValueError:
                return False
            match = next((o for o in opts if o == parsed), None)
        if match is None:
            return False
        value = match
    if check is not None and not check(value):
        return False
    st.session_state[state or key] = value
    return True


def keep(key: str, text: Callable[[Any], str] = _text, state: str | None = None) -> None:
    """Write widget ``key``'s value (held under ``state`` when given) into the URL query, as ``text`` writes
    it, and the link in the sidebar."""
    held = state or key
    if held in st.session_state:
        value = text(st.session_state[held])
        if st.query_params.get(PARAMS[key]) != value:
            st.query_params[PARAMS[key]] = value
    show_link()


def drop(*keys: str) -> None:
    """Remove widgets that are not on the page this run from the URL (the custom pair's pickers)."""
    for key in keys:
        if PARAMS[key] in st.query_params:
            del st.query_params[PARAMS[key]]


def link(base: str | None = None) -> str:
    """This view's address: the page's URL with the current query."""
    raw = base if base is not None else (getattr(st.context, "url", None) or "")
    parts = urlsplit(raw)
    query = urlencode({k: st.query_params.get(k) for k in st.query_params})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def link_slot() -> None:
    """The place in the sidebar where the link goes (filled by :func:`show_link` as the page sets it): in a
    popover, so the code box's 1.5 MB syntax-highlighter script loads when it is opened, not with every page
    (0.6 s of every page load in headless Chromium on 2 cores; benchmarks/RESULTS.md)."""
    box = st.sidebar.popover("Share this view", icon=":material/link:", width="stretch")
    box.caption(
        "This link holds the picked outputs, fit, phase and knobs (the box's copy button copies it; opening it "
        "restores the view). The address bar holds the same link."
    )
    st.session_state[_SLOT] = box.empty()
    show_link()


def show_link() -> None:
    slot = st.session_state.get(_SLOT)
    if slot is not None:
        slot.code(link(), language=None, wrap_lines=True)
