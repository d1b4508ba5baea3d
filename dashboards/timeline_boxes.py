"""The Timeline page's boxes: an events Parquet downsampled on the server for one visible window.

Tracks are one per CPU thread (``pid, tid``: CPU ops, runtime / driver calls, Python functions) and one per
GPU stream (``device, stream``: kernels, memcpys, memsets), plus one host-stall track per GPU (the launch-end
rule of ``tracing.analysis.gpu_tables``, as the ingest computes it).

Two levels. :func:`build` reads a rank's events once through a ``tracing.ingest.engine`` connection (the
project's memory and thread limits; only the numeric columns) and reduces every track to its *islands*: the
union of its ops, each island with its op count and its longest op. :func:`window_boxes` then answers a
window [t0, t1) in milliseconds: islands are clipped to the window (an island is one interval, so a clipped
island is still the exact union of its ops there) and islands closer than a pixel (``(t1 - t0) / (k - 1)``)
share one box, with its count, its extent, its **busy time** (the union of its ops in the window) and the
name of its longest op. Boxes never overlap, consecutive boxes of a track are at least a pixel apart (so a
track has at most ``k``), and a track's busy times add up to the union of its ops in the window exactly.
The browser gets those boxes, never the events. No Streamlit here (the page caches :func:`build`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracing.ingest import engine
from tracing.outputs import schema

DEFAULT_K = 600  # boxes per track: about two pixels each on a 1280 px page
CPU_KINDS = (schema.CPU_OP, schema.RUNTIME, schema.DRIVER, schema.PYTHON)
GPU_KINDS = (schema.KERNEL, schema.MEMCPY, schema.MEMSET)
STALL = "host stall"
BOX_COLUMNS = ["track", "kind", "start_ns", "end_ns", "count", "busy_ns", "name"]


def _kinds(kinds: tuple[str, ...]) -> str:
    return ", ".join(engine.literal(k) for k in kinds)


_IS_GPU = f"kind in ({_kinds(GPU_KINDS)})"
_CODE = f"case when {_IS_GPU} then hash('gpu', device, stream) else hash('cpu', pid, tid) end"
_SELECT = f"(kind in ({_kinds(CPU_KINDS)}) and device < 0 or {_IS_GPU} and device >= 0)"


@dataclass(frozen=True)
class Islands:
    """Disjoint intervals per track, sorted by (track, start): ``n`` ops each, ``row`` = its longest op."""

    track: np.ndarray  # index into Timeline.tracks
    start: np.ndarray
    end: np.ndarray
    n: np.ndarray
    longest: np.ndarray
    row: np.ndarray  # events row of the longest op (-1: none, e.g. host stall)

    @staticmethod
    def of(track: np.ndarray, start: np.ndarray, end: np.ndarray, row: np.ndarray | None = None) -> Islands:
        """Islands of raw intervals (any order, overlapping): the union per track."""
        track, start, end = (np.asarray(a, np.int64) for a in (track, start, end))
        row = np.full(len(start), -1, np.int64) if row is None else np.asarray(row, np.int64)
        keep = end > start
        track, start, end, row = track[keep], start[keep], end[keep], row[keep]
        if not len(start):
            z = np.zeros(0, np.int64)
            return Islands(z, z, z, z, z, z)
        lo = int(start.min())
        order = np.argsort((track << 40) | (start - lo)) if int(start.max()) - lo < 1 << 40 else None
        if order is None:  # a trace longer than 18 minutes: the slower three-key sort
            order = np.lexsort((end, start, track))
        track, start, end, row = track[order], start[order], end[order], row[order]
        new_track = np.ones(len(start), bool)
        new_track[1:] = track[1:] != track[:-1]
        # running max of the end within a track: lift each track's ends above every earlier track's
        base = np.cumsum(new_track) * (int(end.max()) - lo + 1)
        run = np.maximum.accumulate(end - lo + base) - base + lo
        new = new_track.copy()
        new[1:] |= start[1:] > run[:-1]
        idx = np.flatnonzero(new)
        dur = end - start
        return Islands(
            track[idx],
            start[idx],
            np.maximum.reduceat(end, idx),
            np.diff(np.append(idx, len(start))),
            np.maximum.reduceat(dur, idx),
            row[_argmax_per_segment(dur, idx)],
        )


def _argmax_per_segment(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Position of the largest value in each segment ``values[idx[i]:idx[i+1]]`` (the first on ties)."""
    if not len(idx):
        return idx
    top = np.repeat(np.maximum.reduceat(values, idx), np.diff(np.append(idx, len(values))))
    hits = np.flatnonzero(values == top)
    return hits[np.searchsorted(hits, idx)]


@dataclass(frozen=True)
class Timeline:
    """A rank's events reduced to islands per track, plus the names to label boxes with."""

    tracks: pd.DataFrame  # track (label), gpu, pid, tid, device, stream, ops -- CPU threads first
    islands: Islands
    names: pa.DictionaryArray | pa.Array  # the events' name column (indexed by row)
    kinds: pa.DictionaryArray | pa.Array
    first_ns: int
    last_ns: int

    @property
    def ops(self) -> int:
        return int(self.tracks["ops"].sum()) if len(self.tracks) else 0


def build(path: str | os.PathLike[str]) -> Timeline:
    """Read a rank's events Parquet once (numeric columns through DuckDB) and reduce it to islands."""
    import pyarrow.parquet as pq

    with engine.session() as con:
        engine.parquet_events(con, path)
        tracks = con.sql(
            f"select {_CODE} as code, {_IS_GPU} as gpu, min(pid) as pid, min(tid) as tid, min(device) as "
            f"device, min(stream) as stream, count(*) as ops from events where {_SELECT} group by all"
        ).df()
        cols = con.sql(
            f"select {_CODE} as code, start_ns, start_ns + dur_ns as end_ns, row from events "
            f"where {_SELECT} and dur_ns > 0"
        ).fetchnumpy()
    tracks = tracks.sort_values(["gpu", "device", "stream", "pid", "tid"], kind="stable").reset_index(
        drop=True
    )
    tracks["track"] = [
        f"GPU {r.device} · stream {r.stream}" if r.gpu else f"CPU pid {r.pid} · thread {r.tid}"
        for r in tracks.itertuples()
    ]
    codes = tracks["code"].to_numpy(np.uint64)
    order = np.argsort(codes)
    pos = order[np.searchsorted(codes[order], np.asarray(cols["code"], np.uint64))]
    islands = Islands.of(pos, cols["start_ns"], cols["end_ns"], cols["row"])
    table = pq.ParquetFile(path).read(columns=["name", "kind"])
    first = int(islands.start.min()) if len(islands.start) else 0
    last = int(islands.end.max()) if len(islands.end) else 0
    return Timeline(
        tracks[["track", "gpu", "pid", "tid", "device", "stream", "ops"]],
        islands,
        table.column("name").combine_chunks(),
        table.column("kind").combine_chunks(),
        first,
        last,
    )


def pixel_ns(t0_ns: int, t1_ns: int, k: int) -> int:
    """The gap below which two islands of a track share a box: at most ``k`` boxes fit in the window."""
    return max(1, math.ceil((t1_ns - t0_ns) / max(k - 1, 1)))


def window_boxes(
    isl: Islands,
    labels: list[str],
    t0_ns: int,
    t1_ns: int,
    k: int = DEFAULT_K,
    names: Any = None,
    kinds: Any = None,
    default_name: str = STALL,
) -> pd.DataFrame:
    """At most ``k`` boxes per track for the window [t0, t1) (``BOX_COLUMNS``), from islands."""
    keep = (isl.start < t1_ns) & (isl.end > t0_ns)
    if t1_ns <= t0_ns or not keep.any():
        return pd.DataFrame(columns=BOX_COLUMNS)
    track, n, longest, row = isl.track[keep], isl.n[keep], isl.longest[keep], isl.row[keep]
    s, e = np.maximum(isl.start[keep], t0_ns), np.minimum(isl.end[keep], t1_ns)
    new = np.ones(len(s), bool)
    new[1:] = (track[1:] != track[:-1]) | (s[1:] - e[:-1] >= pixel_ns(t0_ns, t1_ns, k))
    idx = np.flatnonzero(new)
    top = row[_argmax_per_segment(longest, idx)]
    if names is not None and (top >= 0).all():
        picked = pa.array(top)
        name = names.take(picked).cast(pa.string()).to_numpy(zero_copy_only=False)
        kind = kinds.take(picked).cast(pa.string()).to_numpy(zero_copy_only=False)
    else:
        name = np.full(len(idx), default_name, object)
        kind = np.full(len(idx), default_name, object)
    return pd.DataFrame(
        {
            "track": np.asarray(labels, object)[track[idx]],
            "kind": kind,
            "start_ns": s[idx],
            "end_ns": np.maximum.reduceat(e, idx),
            "count": np.add.reduceat(n, idx),
            "busy_ns": np.add.reduceat(e - s, idx),
            "name": name,
        }
    )


def boxes(tl: Timeline, t0_ns: int, t1_ns: int, k: int = DEFAULT_K) -> pd.DataFrame:
    """CPU-thread and GPU-stream boxes of the window."""
    return window_boxes(tl.islands, list(tl.tracks["track"]), t0_ns, t1_ns, k, tl.names, tl.kinds)


@dataclass(frozen=True)
class Stalls:
    labels: list[str]
    islands: Islands


def host_stalls(path: str | os.PathLike[str]) -> Stalls:
    """Host-stall intervals per GPU of a rank's events (``tracing.analysis.gpu_tables``, the ingest's rule)."""
    from tracing.analysis import gpu_tables

    with engine.session() as con:
        engine.parquet_events(con, path)
        timelines = gpu_tables.device_timelines(con) if gpu_tables.make_ops(con) else []
    pids = {t.pid for t in timelines}
    labels, tr, ss, ee = [], [], [], []
    for i, t in enumerate(timelines):
        labels.append(f"GPU {t.device} · {STALL}" + (f" (pid {t.pid})" if len(pids) > 1 else ""))
        s, e = t.stall.arrays()
        tr.append(np.full(len(s), i, np.int64))
        ss.append(np.asarray(s, np.int64))
        ee.append(np.asarray(e, np.int64))
    if not labels:
        return Stalls([], Islands.of([], [], []))
    return Stalls(labels, Islands.of(np.concatenate(tr), np.concatenate(ss), np.concatenate(ee)))


def stall_boxes(stalls: Stalls, t0_ns: int, t1_ns: int, k: int = DEFAULT_K) -> pd.DataFrame:
    return window_boxes(stalls.islands, stalls.labels, t0_ns, t1_ns, k)


def union_ns(starts: Any, ends: Any) -> int:
    """The length of the union of intervals, computed directly (for checks)."""
    iv = sorted((int(a), int(b)) for a, b in zip(starts, ends, strict=True) if b > a)
    total, cur_s, cur_e = 0, None, None
    for a, b in iv:
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + (cur_e - cur_s if cur_e is not None else 0)
