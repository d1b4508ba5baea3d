"""Per-range GPU work: which kernels did a range (NVTX, user annotation, range log) cause, and what did they cost?

A range is a host-side interval [start, end] on one thread. GPU work is attributed through the launch calls,
by correlation id, two ways (never through Kineto's ``gpu_user_annotation``, which is a per-stream span
of the ops whose *innermost* annotation on the *launching thread* is that range):

- ``thread_*``: ops whose launch call started inside the range **on the same thread** (Nsight's
  ``nvtx_gpu_proj_trace`` rule);
- ``window_*``: ops whose launch call started inside the range's time window **on any thread of the
  process** -- autograd runs backward on its own thread, so ``## backward ##`` launches almost nothing
  itself.

For each: the op count, ``busy`` (|union| of the ops' intervals, which may run after the range ended) and
``span`` (first op start -> last op end). Two time-clipped columns obey time conservation -- each is at
most the range's wall time, and so is their sum, since stalls lie in gaps of the busy union:

- ``busy_in_window_ns``: the device busy union inside [start, end];
- ``host_stall_ns``: the device host-stall intervals (launch-end rule, ``metrics.py``) inside [start, end].

With several devices in one process the per-device intervals are merged first (time *some* device was busy
or stalled). A trace without GPU ops leaves all GPU columns null with ``gpu_reason`` set.
"""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pandas as pd

from tracing import metrics, schema
from tracing.phases import PhaseMap, default_phase_map
from tracing.trace import Trace

_ENCODED = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<attrs>[^\[\]]*)\]$")
NO_GPU_REASON = "trace has no GPU ops (kernel/memcpy/memset)"
RANGELOG_REASON = "mxperf range log: host clock only, no GPU activity recorded"


def split_encoded_name(name: str) -> tuple[str, dict[str, object]]:
    """``update/microbatch[step=3,microbatch=1]`` -> ("update/microbatch", {"step": 3, "microbatch": 1}).

    The range helper encodes attributes this way when ``encode_attrs`` is on; numbers are decoded.
    """
    m = _ENCODED.match(name)
    if not m or "=" not in m.group("attrs"):
        return name, {}
    attrs: dict[str, object] = {}
    for part in m.group("attrs").split(","):
        key, sep, value = part.partition("=")
        if not sep:
            return name, {}
        attrs[key.strip()] = _number(value.strip())
    return m.group("name"), attrs


def _number(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def range_frame(trace: Trace, phase_map: PhaseMap | None = None) -> pd.DataFrame:
    """The ranges of a trace with nesting (parent_id, depth) and canonical phase; no GPU columns yet."""
    phase_map = phase_map or default_phase_map()
    if trace.range_log is not None:
        log = trace.range_log
        df = pd.DataFrame(
            {
                "source": "rangelog",
                "range_id": log["range_id"].astype("int64"),
                "parent_id": log["parent_id"].astype("int64"),
                "depth": log["depth"].astype("int64"),
                "name": log["name"].astype(str),
                "domain": "",
                "pid": np.int64(schema.NO_ID),
                "tid": log["tid"].astype("int64"),
                "start_ns": log["start_ns"].astype("int64"),
                "end_ns": log["end_ns"].astype("int64"),
                "attrs": log["attrs"].astype(str),
            }
        )
    else:
        ev = trace.events[metrics.kind_mask(trace.events, (schema.RANGE,))]
        names, attrs = [], []
        for raw in ev["name"].astype(str):
            name, a = split_encoded_name(raw)
            names.append(name)
            attrs.append(json.dumps(a, sort_keys=True))
        df = pd.DataFrame(
            {
                "source": "nvtx" if trace.format == "nsys" else "user_annotation",
                "name": names,
                "domain": ev["domain"].astype(str).to_numpy(),
                "pid": ev["pid"].to_numpy(),
                "tid": ev["tid"].to_numpy(),
                "start_ns": ev["start_ns"].to_numpy(),
                "end_ns": (ev["start_ns"] + ev["dur_ns"]).to_numpy(),
                "attrs": attrs,
            }
        )
        df = df.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable").reset_index(
            drop=True
        )
        df.insert(1, "range_id", np.arange(len(df), dtype=np.int64))
        parent, depth = _nesting(df)
        df.insert(2, "parent_id", parent)
        df.insert(3, "depth", depth)
    df["wall_ns"] = df["end_ns"] - df["start_ns"]
    df["phase"] = [phase_map.phase_of(n) for n in df["name"]]
    return df


def _nesting(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Parent and depth per range: ranges nest per (pid, tid) by containment (input sorted by start)."""
    parent = np.full(len(df), schema.NO_ID, np.int64)
    depth = np.zeros(len(df), np.int64)
    stacks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, (pid, tid, start, end) in enumerate(
        zip(df["pid"], df["tid"], df["start_ns"], df["end_ns"], strict=True)
    ):
        stack = stacks.setdefault((pid, tid), [])
        while stack and (stack[-1][1] <= start or stack[-1][1] < end):
            stack.pop()
        if stack:
            parent[i] = stack[-1][0]
            depth[i] = len(stack)
        stack.append((i, end))
    return parent, depth


def attribute_ranges(
    trace: Trace,
    phase_map: PhaseMap | None = None,
    *,
    ops: pd.DataFrame | None = None,
    timelines: list[metrics.DeviceTimeline] | None = None,
) -> pd.DataFrame:
    """The range table (``schema.RANGE_COLUMNS`` without trace/rank) with GPU work attributed.

    ``ops`` / ``timelines`` (from ``metrics.gpu_ops`` / ``metrics.device_timelines``) may be passed to reuse them.
    """
    df = range_frame(trace, phase_map)
    gpu_cols = [c for c, t in schema.RANGE_COLUMNS.items() if t == "Int64"]
    for col in gpu_cols:
        df[col] = pd.array([pd.NA] * len(df), dtype="Int64")
    ops = metrics.gpu_ops(trace.events) if ops is None else ops
    if trace.range_log is not None or len(ops) == 0:
        df["gpu_reason"] = RANGELOG_REASON if trace.range_log is not None else NO_GPU_REASON
        return _ordered(df)
    df["gpu_reason"] = ""
    timelines = metrics.device_timelines(trace.events, ops) if timelines is None else timelines
    launched = ops[ops["launch_start_ns"] != schema.NO_ID]
    _attribute(df, launched, by=["pid", "launch_tid"], range_keys=["pid", "tid"], prefix="thread")
    _attribute(df, launched, by=["pid"], range_keys=["pid"], prefix="window")
    for pid, idx in df.groupby("pid").groups.items():
        mine = [t for t in timelines if t.pid == pid]
        lo, hi = df.loc[idx, "start_ns"].to_numpy(), df.loc[idx, "end_ns"].to_numpy()
        busy_s, busy_e = metrics.union_intervals(
            np.concatenate([t.busy_start for t in mine] or [np.zeros(0, np.int64)]),
            np.concatenate([t.busy_end for t in mine] or [np.zeros(0, np.int64)]),
        )
        stall_s, stall_e = metrics.union_intervals(
            np.concatenate([t.stall_start for t in mine] or [np.zeros(0, np.int64)]),
            np.concatenate([t.stall_end for t in mine] or [np.zeros(0, np.int64)]),
        )
        df.loc[idx, "busy_in_window_ns"] = metrics.clipped_measure(busy_s, busy_e, lo, hi)
        df.loc[idx, "host_stall_ns"] = metrics.clipped_measure(stall_s, stall_e, lo, hi)
    return _ordered(df)


def _attribute(
    df: pd.DataFrame, launched: pd.DataFrame, *, by: list[str], range_keys: list[str], prefix: str
) -> None:
    """Ops launched in each range (same ``by`` key, launch start in [start, end]): count, busy, span.

    Vectorized: ops sorted by (group, launch start); each range's ops are one contiguous slice [lo, hi) of
    that order (searchsorted per group); span by ``reduceat`` over the slice bounds; busy by
    :func:`_slice_measures`.
    """
    n = len(df)
    ops_n = np.zeros(n, np.int64)
    busy = np.zeros(n, np.int64)
    span = np.zeros(n, np.int64)
    op_keys = [launched[k].to_numpy(np.int64) for k in by]
    ls = launched["launch_start_ns"].to_numpy(np.int64)
    order = np.lexsort((ls, *reversed(op_keys)))
    ls = ls[order]
    s_all = launched["start_ns"].to_numpy(np.int64)[order]
    e_all = launched["end_ns"].to_numpy(np.int64)[order]
    op_keys = [k[order] for k in op_keys]
    new_group = np.zeros(len(ls), bool)
    if len(ls):
        new_group[0] = True
        for k in op_keys:
            new_group[1:] |= k[1:] != k[:-1]
    bounds = np.append(np.flatnonzero(new_group), len(ls))
    group_of = {tuple(int(k[b]) for k in op_keys): (int(b), int(e)) for b, e in itertools.pairwise(bounds)}
    range_key_cols = [df[k].to_numpy(np.int64) for k in range_keys]
    starts, ends = df["start_ns"].to_numpy(np.int64), df["end_ns"].to_numpy(np.int64)
    lo = np.zeros(n, np.int64)
    hi = np.zeros(n, np.int64)
    keys = zip(*(c.tolist() for c in range_key_cols), strict=True)
    gid = np.array([group_of.get(key, (-1, -1))[0] for key in keys], dtype=np.int64)
    for g0, g1 in group_of.values():
        mine = np.flatnonzero(gid == g0)
        if len(mine):
            lo[mine] = g0 + np.searchsorted(ls[g0:g1], starts[mine], side="left")
            hi[mine] = g0 + np.searchsorted(ls[g0:g1], ends[mine], side="right")
    hit = np.flatnonzero(hi > lo)
    if len(hit):
        ops_n[hit] = hi[hit] - lo[hit]
        span[hit] = _slice_reduce(np.maximum, e_all, lo[hit], hi[hit]) - _slice_reduce(
            np.minimum, s_all, lo[hit], hi[hit]
        )
        busy[hit] = _slice_measures(s_all, e_all, lo[hit], hi[hit])
    df[f"{prefix}_ops"] = pd.array(ops_n, dtype="Int64")
    df[f"{prefix}_busy_ns"] = pd.array(busy, dtype="Int64")
    df[f"{prefix}_span_ns"] = pd.array(span, dtype="Int64")


def _slice_reduce(ufunc: np.ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``ufunc.reduce(values[lo[i]:hi[i]])`` per i (every slice non-empty), in one ``reduceat`` call."""
    padded = np.append(values, values[:1])  # so hi == len(values) is a valid index
    idx = np.empty(2 * len(lo), np.int64)
    idx[0::2], idx[1::2] = lo, hi
    return ufunc.reduceat(padded, idx)[0::2]


_SLICE_CHUNK = 1 << 21  # ops gathered per vectorized step: bounds the memory of nested wide ranges


def _slice_measures(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|union of [start, end)| over each slice [lo[i], hi[i]) (non-empty), equal to ``metrics.measure``.

    Per slice, sorted by start with M_j the running max of ends: |union| = sum_j (M_j - max(s_j, M_{j-1})),
    which telescopes to the sum of (block end - block start) over ``metrics.union_intervals``' blocks.
    The slices are gathered in chunks of ~``_SLICE_CHUNK`` ops; a slice longer than a chunk is measured
    alone with ``metrics.measure``.
    """
    out = np.zeros(len(lo), np.int64)
    lengths = hi - lo
    i = 0
    while i < len(lo):
        if lengths[i] >= _SLICE_CHUNK:
            out[i] = metrics.measure(start[lo[i] : hi[i]], end[lo[i] : hi[i]])
            i += 1
            continue
        j = i + max(1, int(np.searchsorted(np.cumsum(lengths[i:]), _SLICE_CHUNK, side="right")))
        j = min(j, len(lo))
        big = np.flatnonzero(lengths[i:j] >= _SLICE_CHUNK)
        if len(big):
            j = i + int(big[0])
        out[i:j] = _gathered_measures(start, end, lo[i:j], lengths[i:j])
        i = j
    return out


def _gathered_measures(start: np.ndarray, end: np.ndarray, lo: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    seg = np.repeat(np.arange(len(lo)), lengths)
    first = np.cumsum(lengths) - lengths
    idx = np.arange(int(lengths.sum())) - np.repeat(first, lengths) + np.repeat(lo, lengths)
    s, e = start[idx], end[idx]
    order = np.lexsort((s, seg))
    s, e = s[order], e[order]
    # running max of ends that restarts at each slice: shift each slice so it lies above the previous one
    base = np.minimum(s.min(), e.min())
    width = int(np.maximum(s.max(), e.max())) - int(base) + 1
    if width * (len(lo) + 1) >= 2**62:
        return np.array(
            [metrics.measure(s[a : a + n], e[a : a + n]) for a, n in zip(first, lengths, strict=True)],
            dtype=np.int64,
        )
    shift = seg * np.int64(width)
    run = np.maximum.accumulate(e - base + shift) - shift + base
    prev = np.empty_like(run)
    prev[1:] = run[:-1]
    prev[first] = np.iinfo(np.int64).min
    gain = run - np.maximum(s, prev)  # no clamp: telescopes to union_intervals' block sums exactly
    return np.add.reduceat(gain, first)


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in schema.RANGE_COLUMNS if c not in ("trace", "rank")]
    return df.loc[:, cols].astype({c: schema.RANGE_COLUMNS[c] for c in cols})
