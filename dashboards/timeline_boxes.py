"""The Timeline page's boxes: an events Parquet downsampled on the server for one visible window.

Tracks are one per CPU thread (``pid, tid``: CPU ops, runtime / driver calls, Python functions) and one per
GPU stream (``device, stream``: kernels, memcpys, memsets), plus one host-stall track per GPU (the launch-end
rule of ``tracing.analysis.gpu_tables``, as the ingest computes it).

Two levels. :func:`compute` reads a rank's events once, a row group at a time and only the columns it needs
(kind, name, pid, tid, device, stream, start, duration), and reduces every track to its
*islands* (numpy on sorted arrays, no loop per op): the union of its ops, each island with its op count, its
longest op and that op's name and kind; the host-stall spans come from the engine (the ingest's own query).
:func:`load` keeps both on disk in a cache folder (``$MXPERF_DASH_CACHE/timeline``, else the system temp dir; never RUNS_DIR),
keyed by the events file's path, size and modification time, so a new process opens a trace it has seen
without reading its events again. :func:`window_boxes` then answers a window [t0, t1) in milliseconds:
islands are clipped to the window (an island is one interval, so a clipped island is still the exact union
of its ops there) and islands closer than a pixel (``(t1 - t0) / (k - 1)``) share one box, with its count,
its extent, its **busy time** (the union of its ops in the window) and the name of its longest op. Boxes never
overlap, consecutive boxes of a track are at least a pixel apart (so a track has at most ``k``), and a
track's busy times add up to the union of its ops in the window exactly. The browser gets those boxes, never
the events. No Streamlit here (the page caches :func:`load`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tracing.outputs import schema

DEFAULT_K = 600  # boxes per track: about two pixels each on a 1280 px page
CPU_KINDS = (schema.CPU_OP, schema.RUNTIME, schema.DRIVER, schema.PYTHON)
GPU_KINDS = (schema.KERNEL, schema.MEMCPY, schema.MEMSET)
STALL = "host stall"
BOX_COLUMNS = ["track", "kind", "start_ns", "end_ns", "count", "busy_ns", "name"]
CACHE_ENV = "MXPERF_DASH_CACHE"  # the folder the dashboard caches into (the Perfetto download's too)
CACHE_VERSION = 1  # bump when what is cached changes
_READ = ["kind", "name", "pid", "tid", "device", "stream", "start_ns", "dur_ns"]
_ISLAND_COLS = ("track", "start", "end", "n", "longest", "row")
_TRACK_COLS = ["track", "gpu", "pid", "tid", "device", "stream", "ops"]


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
    def of(track: Any, start: Any, end: Any, row: Any = None) -> Islands:
        """Islands of raw intervals (any order, overlapping): the union per track.

        The longest op of an island is the first of its longest in (start, input order): with ``row`` in
        file order, the lowest row."""
        track = np.asarray(track)
        track = track if track.dtype.kind in "iu" else track.astype(np.int64)
        start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
        row = np.full(len(start), -1, np.int64) if row is None else np.asarray(row, np.int64)
        keep = end > start
        if not keep.all():
            track, start, end, row = track[keep], start[keep], end[keep], row[keep]
        if not len(start):
            z = np.zeros(0, np.int64)
            return Islands(z, z, z, z, z, z)
        # stable: ties in (track, start) keep the input order; fast on an events table's sorted runs
        order = np.lexsort((start, track))
        track, start, end = track[order], start[order], end[order]
        new = np.ones(len(start), bool)
        np.not_equal(track[1:], track[:-1], out=new[1:])
        run = _running_max(end, new)
        new[1:] |= start[1:] > run[:-1]
        idx = np.flatnonzero(new)
        dur = end - start
        return Islands(
            track[idx].astype(np.int64),
            start[idx],
            run[np.append(idx[1:], len(start)) - 1],
            np.diff(np.append(idx, len(start))),
            np.maximum.reduceat(dur, idx),
            row[order[_argmax_per_segment(dur, idx)]],
        )


def _running_max(values: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """The running maximum of ``values`` restarting at every True of ``heads`` (a loop per segment, not per value)."""
    out = np.empty_like(values)
    for a, b in itertools.pairwise([*np.flatnonzero(heads).tolist(), len(values)]):
        np.maximum.accumulate(values[a:b], out=out[a:b])
    return out


def _argmax_per_segment(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Position of the largest value in each segment ``values[idx[i]:idx[i+1]]`` (the first on ties)."""
    if not len(idx):
        return idx
    top = np.repeat(np.maximum.reduceat(values, idx), np.diff(np.append(idx, len(values))))
    hits = np.flatnonzero(values == top)
    return hits[np.searchsorted(hits, idx)]


@dataclass(frozen=True)
class Timeline:
    """A rank's events reduced to islands per track, with the name and kind of each island's longest op."""

    tracks: pd.DataFrame  # track (label), gpu, pid, tid, device, stream, ops -- CPU threads first
    islands: Islands
    names: pa.Array  # per island: the name of its longest op
    kinds: pa.Array  # per island: that op's kind
    first_ns: int
    last_ns: int

    @property
    def ops(self) -> int:
        return int(self.tracks["ops"].sum()) if len(self.tracks) else 0


@dataclass(frozen=True)
class Stalls:
    labels: list[str]
    islands: Islands


def _flags(kind: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per row: a CPU-track kind, a GPU-op kind."""
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(kind.type):
        kind = pc.dictionary_encode(kind)
    words = kind.dictionary.cast(pa.string()).to_pylist()
    idx = pc.fill_null(kind.indices, len(words)).to_numpy(zero_copy_only=False).astype(np.intp)
    lut = np.array([[w in CPU_KINDS, w in GPU_KINDS] for w in words] + [[False] * 2], bool)
    return lut[idx, 0], lut[idx, 1]


class _Scan:
    """What one pass over the events keeps: per-track stats, the ops of the tracks, their names and kinds."""

    def __init__(self, rows: int) -> None:
        self.ids: dict[tuple[bool, int, int], int] = {}
        self.stats = np.zeros((0, 5), np.int64)  # ops, min pid, min tid, min device, min stream
        # the tracks' ops (with a duration), filled in place: no copy when the pass is over
        self.track = np.empty(rows, np.int32)
        self.start, self.end, self.row = (np.empty(rows, np.int64) for _ in range(3))
        self.used = 0
        self.parts: dict[str, list[Any]] = {k: [] for k in ("name", "kind")}

    def _ids(self, g: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Global track ids of rows keyed (gpu, a, b): (True, device, stream) or (False, pid, tid)."""
        ka, ua = pd.factorize(a)
        kb, ub = pd.factorize(b)
        comb = (ka.astype(np.int64) * len(ub) + kb) * 2 + g
        if len(ua) * len(ub) * 2 > 1 << 22:  # many threads: number the pairs present instead
            comb, _ = pd.factorize(comb)
            _, first = np.unique(comb, return_index=True)
            keys = [(bool(g[i]), int(a[i]), int(b[i])) for i in first.tolist()]
            present = np.arange(len(first))
        else:
            present = np.flatnonzero(np.bincount(comb))
            keys = [
                (bool(c % 2), int(ua[c // 2 // len(ub)]), int(ub[c // 2 % len(ub)])) for c in present.tolist()
            ]
        lut = np.zeros(int(present.max(initial=-1)) + 1, np.int64)
        for c, key in zip(present.tolist(), keys, strict=True):
            lut[c] = self.ids.setdefault(key, len(self.ids))
        return lut[comb]

    def add(self, t: pa.Table, offset: int) -> None:
        cpu_k, gpu_k = _flags(t.column("kind").combine_chunks())
        col = {c: t.column(c).to_numpy() for c in _READ[2:]}
        dev, start, dur = col["device"], col["start_ns"], col["dur_ns"]
        end = start + dur
        sel_g = gpu_k & (dev >= 0)
        sel = sel_g | (cpu_k & (dev < 0))
        rows = np.flatnonzero(sel)
        g = sel_g[rows]
        gid = self._ids(
            g, np.where(g, dev[rows], col["pid"][rows]), np.where(g, col["stream"][rows], col["tid"][rows])
        )
        if len(self.ids) > len(self.stats):
            grow = np.zeros((len(self.ids) - len(self.stats), 5), np.int64)
            grow[:, 1:] = np.iinfo(np.int64).max
            self.stats = np.vstack([self.stats, grow])
        self.stats[:, 0] += np.bincount(gid, minlength=len(self.stats))
        for j, c in enumerate(("pid", "tid", "device", "stream"), 1):
            np.minimum.at(self.stats[:, j], gid, col[c][rows])
        live = dur[rows] > 0
        at, n = rows[live], int(live.sum())
        span = slice(self.used, self.used + n)
        self.track[span] = gid[live]
        np.take(start, at, out=self.start[span])
        np.take(end, at, out=self.end[span])
        np.add(at, offset, out=self.row[span])
        self.used += n
        self.parts["name"].append(t.column("name"))
        self.parts["kind"].append(t.column("kind"))

    def tracks(self) -> tuple[pd.DataFrame, np.ndarray]:
        """The tracks table in page order (CPU threads, then GPU streams) and each scan id's position in it."""
        keys = list(self.ids)
        tracks = pd.DataFrame(
            {
                "id": np.arange(len(keys)),
                "gpu": np.array([k[0] for k in keys], bool),
                "pid": self.stats[:, 1],
                "tid": self.stats[:, 2],
                "device": self.stats[:, 3],
                "stream": self.stats[:, 4],
                "ops": self.stats[:, 0],
            }
        )
        tracks = tracks.sort_values(["gpu", "device", "stream", "pid", "tid"], kind="stable")
        tracks = tracks.reset_index(drop=True)
        tracks["track"] = [
            f"GPU {r.device} · stream {r.stream}" if r.gpu else f"CPU pid {r.pid} · thread {r.tid}"
            for r in tracks.itertuples()
        ]
        pos = np.empty(len(keys), np.int64)
        pos[tracks["id"].to_numpy()] = np.arange(len(keys))
        return tracks[_TRACK_COLS], pos


def _stalls(path: str | os.PathLike[str]) -> Stalls:
    """Host-stall spans per (pid, device) of a rank's GPU ops, from the engine exactly as the ingest computes
    them (``tracing.analysis.gpu_tables``: the launch-end rule, written once)."""
    from tracing.analysis import gpu_tables
    from tracing.ingest import engine

    with engine.session() as con:
        engine.parquet_events(con, path)
        gpu_tables.make_ops(con)
        groups = engine.arrow(con, "select distinct pid, device from ops order by pid, device").to_pylist()
        spans = engine.arrow(con, gpu_tables.STALL_SQL)
    index = {(g["pid"], g["device"]): i for i, g in enumerate(groups)}
    keys = zip(spans.column("pid").to_pylist(), spans.column("device").to_pylist(), strict=True)
    several = len({g["pid"] for g in groups}) > 1
    labels = [f"GPU {g['device']} · {STALL}" + (f" (pid {g['pid']})" if several else "") for g in groups]
    return Stalls(labels, Islands.of([index[k] for k in keys], spans.column("s"), spans.column("e")))


def compute(path: str | os.PathLike[str]) -> tuple[Timeline, Stalls]:
    """Read a rank's events Parquet once, a row group at a time, and reduce it to islands and host stalls."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    scan, offset = _Scan(pf.metadata.num_rows), 0
    for i in range(pf.num_row_groups):
        t = pf.read_row_group(i, columns=_READ)
        scan.add(t, offset)
        offset += t.num_rows
    tracks, pos = scan.tracks()
    p = scan.parts
    n = scan.used
    islands = Islands.of(pos.astype(np.int32)[scan.track[:n]], scan.start[:n], scan.end[:n], scan.row[:n])
    scan.track = scan.start = scan.end = scan.row = np.zeros(0, np.int64)
    rows = pa.array(islands.row)
    names, kinds = (_take(p[c], rows, pf.schema_arrow.field(c).type) for c in ("name", "kind"))
    first = int(islands.start.min()) if len(islands.start) else 0
    last = int(islands.end.max()) if len(islands.end) else 0
    return Timeline(tracks, islands, names, kinds, first, last), _stalls(path)


def _take(chunks: list[pa.ChunkedArray], rows: pa.Array, typ: pa.DataType) -> pa.Array:
    """The values at ``rows`` (file positions) of a column read a row group at a time."""
    col = pa.chunked_array([c for ch in chunks for c in ch.chunks], typ)
    return col.take(rows).combine_chunks() if len(rows) else pa.array([], pa.string())


def build(path: str | os.PathLike[str]) -> Timeline:
    """A rank's events reduced to islands per track (:func:`compute`, uncached)."""
    return compute(path)[0]


def host_stalls(path: str | os.PathLike[str]) -> Stalls:
    """Host-stall intervals per GPU of a rank's events (``tracing.analysis.gpu_tables``, the ingest's rule)."""
    return compute(path)[1]


def cache_root() -> Path:
    """Where islands are cached: ``$MXPERF_DASH_CACHE/timeline``, else ``<temp>/mxperf-dash-timeline``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) / "timeline" if env else Path(tempfile.gettempdir()) / "mxperf-dash-timeline"


def cache_entry(path: str | os.PathLike[str]) -> Path:
    """The cache folder of an events file: its resolved path's hash, size and modification time (ns)."""
    p = Path(path).resolve()
    st = p.stat()
    digest = hashlib.sha256(str(p).encode()).hexdigest()[:24]
    return cache_root() / f"{digest}-{st.st_size}-{st.st_mtime_ns}-v{CACHE_VERSION}"


def load(path: str | os.PathLike[str]) -> tuple[Timeline, Stalls]:
    """:func:`compute`, through the cache folder: read back when the events file is unchanged, else computed
    and written (older entries of the same file removed). A cache that cannot be read or written is skipped."""
    entry = cache_entry(path)
    with contextlib.suppress(OSError, pa.ArrowInvalid, KeyError, ValueError):
        return _read(entry)
    tl, stalls = compute(path)
    with contextlib.suppress(OSError, pa.ArrowInvalid):
        _write(entry, tl, stalls)
    return tl, stalls


def _islands_table(isl: Islands, **extra: pa.Array) -> pa.Table:
    return pa.table({c: getattr(isl, c) for c in _ISLAND_COLS} | extra)


def _islands_of(t: pa.Table) -> Islands:
    return Islands(*(t.column(c).to_numpy() for c in _ISLAND_COLS))


def _write(entry: Path, tl: Timeline, stalls: Stalls) -> None:
    import pyarrow.feather as feather

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        isl = _islands_table(tl.islands, name=tl.names, kind=tl.kinds)
        meta = {"first_ns": tl.first_ns, "last_ns": tl.last_ns, "stall_labels": stalls.labels}
        feather.write_feather(isl, tmp / "islands.arrow", compression="uncompressed")
        feather.write_feather(
            _islands_table(stalls.islands), tmp / "stalls.arrow", compression="uncompressed"
        )
        feather.write_feather(pa.Table.from_pandas(tl.tracks, preserve_index=False), tmp / "tracks.arrow")
        (tmp / "meta.json").write_text(json.dumps(meta))
        os.rename(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (entry / "meta.json").is_file():
            raise
    stem = entry.name.split("-", 1)[0]
    for old in entry.parent.glob(f"{stem}-*"):  # the same file's older versions
        if old != entry:
            shutil.rmtree(old, ignore_errors=True)


def _read(entry: Path) -> tuple[Timeline, Stalls]:
    import pyarrow.feather as feather

    meta = json.loads((entry / "meta.json").read_text())
    isl = feather.read_table(entry / "islands.arrow", memory_map=True)
    stalls = feather.read_table(entry / "stalls.arrow", memory_map=True)
    tracks = feather.read_table(entry / "tracks.arrow").to_pandas()
    tl = Timeline(
        tracks[_TRACK_COLS],
        _islands_of(isl),
        isl.column("name").combine_chunks(),
        isl.column("kind").combine_chunks(),
        int(meta["first_ns"]),
        int(meta["last_ns"]),
    )
    return tl, Stalls(list(meta["stall_labels"]), _islands_of(stalls))


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
    """At most ``k`` boxes per track for the window [t0, t1) (``BOX_COLUMNS``), from islands; ``names`` /
    ``kinds``: per island, the name and kind of its longest op (else every box is ``default_name``)."""
    keep = (isl.start < t1_ns) & (isl.end > t0_ns)
    if t1_ns <= t0_ns or not keep.any():
        return pd.DataFrame(columns=BOX_COLUMNS)
    at = np.flatnonzero(keep)
    track, n, longest = isl.track[at], isl.n[at], isl.longest[at]
    s, e = np.maximum(isl.start[at], t0_ns), np.minimum(isl.end[at], t1_ns)
    new = np.ones(len(s), bool)
    new[1:] = (track[1:] != track[:-1]) | (s[1:] - e[:-1] >= pixel_ns(t0_ns, t1_ns, k))
    idx = np.flatnonzero(new)
    if names is not None:
        picked = pa.array(at[_argmax_per_segment(longest, idx)])
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
