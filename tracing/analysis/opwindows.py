"""The GPU-op tables a window of ops at a time: device timelines, streams, kernels, range attribution, launches.

The all-at-once functions (``metrics.device_timelines``, ``metrics.stream_breakdown``,
``kernel_classes.kernel_table``, ``attribution.attribute_ranges``, ``mbsignals.launch_signals``) hold every GPU
op and sort them. Here the ops arrive already in (start, row) order, a chunk at a time (``tracing.streamed``
merges them from disk), and each table keeps only what carries from one chunk to the next::

    ops in (start, row) order, cut only between distinct starts (:func:`cut_between_starts`)
      --> per (pid, device): busy blocks, gaps and host stall         carry: running max end
      --> per (pid, device, stream): HTA's idle breakdown             carry: previous op's end, running max end
      --> per (device, kind, name): count, total, max                 merged sums and maxima
      --> per range and rule: ops launched in it, busy, first, last   carry: its ops' running max end,
                                                                      held while an op may still be in it
      --> launches, spilled in (pid, launch start, row) order         read back for the micro-batch signals

A union's measure telescopes in start order (``metrics.measure``): summed window after window from the
carried running max, it is the union of all. Every merged quantity is an exact int64 sum, count, min or max,
so the tables equal the all-at-once functions' byte for byte (tests/unit/test_opwindows.py). What is held:
one chunk and a few counters per device, stream, kernel name and range an op may still be in (``range_ops``).
A device's busy blocks and host stalls are written out as they are found (``tracing.analysis.intervals``: to
files in ``timeline_dir``, read back in start order by every consumer); the launches are spilled for
micro-batch detection.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracing.analysis import attribution, kernel_classes, metrics
from tracing.analysis.intervals import IntervalSink
from tracing.analysis.mbsignals import LAUNCH_FIELDS
from tracing.analysis.range_ops import Counters, RangeOps
from tracing.ingest.spill import SortedRuns
from tracing.outputs import schema

_MIN, _MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
_KIND = {k: schema.EVENT_KINDS.index(k) for k in (schema.KERNEL, schema.MEMCPY, schema.MEMSET)}
LAUNCH_COLUMNS = ("pid", "l_start", "rid", "l_tid", "l_end", "op_end", "kind", "name")
LAUNCH_SIGNALS = LAUNCH_FIELDS  # what micro-batch detection reads of each launch (mbsignals.Process)


def cut_between_starts(chunks: Iterable[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """Chunks of ops in (start, row) order, re-cut so that no start time is split between two chunks (the
    rows with the last start wait for the next chunk): ties at one start are then ordered within a chunk."""
    held: dict[str, np.ndarray] | None = None
    for c in chunks:
        if len(c["start_ns"]) == 0:
            continue
        if held is not None:
            c = {k: np.concatenate([held[k], v]) for k, v in c.items()}
        s = c["start_ns"]
        cut = int(np.searchsorted(s, s[-1], side="left"))
        if cut == 0:
            held = c
            continue
        held = {k: v[cut:] for k, v in c.items()}
        yield {k: v[:cut] for k, v in c.items()}
    if held is not None and len(held["start_ns"]):
        yield held


@dataclass
class _Device:
    """One (pid, device) timeline, built window after window; its busy blocks and stalls go to ``busy`` /
    ``stall`` as they are found (on disk when the windows were given a folder for them)."""

    busy: IntervalSink
    stall: IntervalSink
    first_ns: int | None = None
    run_end: int = _MIN
    open_start: int = 0  # start of the busy block the next gap will end
    busy_ns: int = 0
    host_stall: int = 0
    ambiguous: int = 0
    unattributed: int = 0
    counts: dict[int, int] = field(default_factory=lambda: dict.fromkeys(_KIND.values(), 0))
    streams: set[int] = field(default_factory=set)
    stream_end: dict[int, int] = field(default_factory=dict)  # each stream's last op end (start order)
    overlap: int = 0

    def add(self, c: dict[str, np.ndarray]) -> None:
        start, end, l_start, l_end = c["start_ns"], c["end_ns"], c["launch_start_ns"], c["launch_end_ns"]
        has_launch = l_end != schema.NO_ID
        # by start, ties by earliest launch end (ops without a launch record last), then row
        order = np.lexsort((np.where(has_launch, l_end, _MAX), start))
        s, e = start[order], end[order]
        e[0] = max(int(e[0]), self.run_end)
        run = np.maximum.accumulate(e)
        prev = np.empty_like(run)
        prev[0], prev[1:] = self.run_end, run[:-1]
        gap_at = np.flatnonzero(s > prev)
        if self.first_ns is None:
            self.first_ns = self.open_start = int(s[0])
            gap_at = gap_at[gap_at > 0]
        k = order[gap_at]
        g0, g1 = prev[gap_at], s[gap_at]
        attributed = has_launch[k]
        stall = np.where(attributed, np.clip(np.minimum(g1, l_end[k]) - g0, 0, None), 0)
        self.ambiguous += int(np.where(attributed & (l_start[k] <= g0), stall, 0).sum())
        self.unattributed += int((g1 - g0)[~attributed].sum())
        self.host_stall += int(stall.sum())
        keep = stall > 0
        self.stall.add(g0[keep], (g0 + stall)[keep])
        if len(g1):  # the blocks these gaps end: [open start, g0[0]), [g1[0], g0[1]), ...
            b_start = np.concatenate([[self.open_start], g1[:-1]])
            self.busy.add(b_start, g0)
            self.busy_ns += int((g0 - b_start).sum())
            self.open_start = int(g1[-1])
        self.run_end = int(run[-1])
        kinds = c["kind"]
        for code in self.counts:
            self.counts[code] += int(np.count_nonzero(kinds == code))
        self._stream_overlap(c["stream"], start, end)

    def _stream_overlap(self, stream: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """``metrics._same_stream_overlap`` carried across windows: each stream's pairs of consecutive ops."""
        order = np.lexsort((start, stream))  # by stream, then start, then row
        st, s, e = stream[order], start[order], end[order]
        first = np.r_[True, st[1:] != st[:-1]]
        prev_e = np.empty_like(e)
        prev_e[1:] = e[:-1]
        heads = np.flatnonzero(first)
        has_prev = ~first
        for h in heads.tolist():
            carried = self.stream_end.get(int(st[h]))
            if carried is not None:
                prev_e[h], has_prev[h] = carried, True
        overlap = np.minimum(prev_e, e) - s
        self.overlap += int(np.clip(overlap[has_prev], 0, None).sum())
        last = np.r_[heads[1:] - 1, len(st) - 1]
        self.stream_end.update(zip(st[last].tolist(), e[last].tolist(), strict=True))
        self.streams.update(st[heads].tolist())

    def timeline(self, pid: int, device: int) -> metrics.DeviceTimeline:
        assert self.first_ns is not None
        self.busy.add(np.array([self.open_start], np.int64), np.array([self.run_end], np.int64))
        row = metrics.timeline_row(
            pid,
            device,
            (self.first_ns, self.run_end),
            self.busy_ns + self.run_end - self.open_start,
            (self.host_stall, self.ambiguous, self.unattributed),
            {k: self.counts[code] for k, code in _KIND.items()},
            len(self.streams),
            self.overlap,
        )
        return metrics.DeviceTimeline(pid, device, self.busy.done(), self.stall.done(), row)


@dataclass
class _Stream:
    """One (pid, device, stream) of ``metrics.stream_breakdown`` (launch-start rule), window after window."""

    num_ops: int = 0
    first_ns: int = 0
    max_end: int = _MIN  # also the running max end that carries the busy union
    last_end: int = 0  # the previous op's end, in (start, end, row) order
    busy: int = 0
    idle: int = 0
    host: int = 0
    kernel_wait: int = 0
    other: int = 0
    negative: int = 0

    def add(self, s: np.ndarray, e: np.ndarray, launch: np.ndarray) -> None:
        if self.num_ops == 0:
            self.first_ns = int(s[0])
            prev_e, s_next, launch_next = e[:-1], s[1:], launch[1:]
            self.busy += metrics.measure(s, e)
        else:
            prev_e, s_next, launch_next = np.r_[self.last_end, e[:-1]], s, launch
            self.busy += metrics.measure(s, e, self.max_end)
        gap = s_next - prev_e
        self.negative += int(np.count_nonzero(gap < 0))
        gap = np.clip(gap, 0, None)
        host = (launch_next != schema.NO_ID) & (launch_next > prev_e)
        kwait = ~host & (gap < metrics.KERNEL_WAIT_THRESHOLD_NS)
        self.idle += int(gap.sum())
        self.host += int(gap[host].sum())
        self.kernel_wait += int(gap[kwait].sum())
        self.other += int(gap[~host & ~kwait].sum())
        self.num_ops += len(s)
        self.max_end = max(self.max_end, int(e.max()))
        self.last_end = int(e[-1])

    def row(self, pid: int, device: int, stream: int) -> dict[str, Any]:
        return {
            "pid": pid,
            "device": device,
            "stream": stream,
            "num_ops": self.num_ops,
            "span_ns": self.max_end - self.first_ns,
            "busy_ns": self.busy,
            "idle_ns": self.idle,
            "host_wait_ns": self.host,
            "kernel_wait_ns": self.kernel_wait,
            "other_wait_ns": self.other,
            "host_wait_share": self.host / self.idle if self.idle else float("nan"),
            "negative_gaps": self.negative,
        }


@dataclass
class OpTables:
    """What the windows add up to (the GPU-op tables of one trace)."""

    num_ops: int
    timelines: list[metrics.DeviceTimeline]
    streams: pd.DataFrame
    kernels: pd.DataFrame
    partials: Counters | None  # per range and rule, its ops (None: no ranges to attribute)


class OpWindows:
    """Feed :meth:`add` the ops (columns of ``tracing.ingest.opjoin.JOINED_COLUMNS``, kind and name as codes
    into ``schema.EVENT_KINDS`` / ``names``) in (start, row) order, cut between distinct starts; then
    :meth:`finish`. ``ranges``: the ranges in table order a slab at a time (``range_ops.RangeOps``), or
    None (a range log: nothing to attribute). Launches are spilled to ``spill_dir`` (:meth:`launches`); the
    device timelines' intervals to files in ``timeline_dir`` that outlive this object (the caller's folder,
    removed by it), or held in memory when it is None."""

    def __init__(
        self,
        names: list[str],
        ranges: Iterator[dict[str, np.ndarray]] | None,
        spill_dir: str | Path,
        run_rows: int = 1 << 18,
        timeline_dir: str | Path | None = None,
    ) -> None:
        self.names = names
        self.num_ops = 0
        self._timeline_dir = timeline_dir
        self._devices: dict[tuple[int, int], _Device] = {}
        self._streams: dict[tuple[int, int, int], _Stream] = {}
        self._kernels: dict[tuple[int, int, int], list[int]] = {}
        self._ranges = None if ranges is None else RangeOps(ranges, spill_dir)
        self._launches = SortedRuns(spill_dir, LAUNCH_COLUMNS, ("pid", "l_start", "rid"), run_rows)
        self._tids: dict[int, Counter] = {}  # per process, launches per launching thread

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        n = len(chunk["start_ns"])
        if n == 0:
            return
        c = dict(chunk)
        c["end_ns"] = c["start_ns"] + c["dur_ns"]
        self.num_ops += n
        pid, dev, stream = c["pid"], c["device"], c["stream"]
        # groups by (pid, device[, stream]), each keeping the chunk's (start, row) order
        order = np.lexsort((stream, dev, pid))  # stable
        gp, gd, gs = pid[order], dev[order], stream[order]
        for a, b in metrics.runs(gp, gd):
            idx = np.sort(order[a:b])  # this device's rows in chunk order
            key = (int(pid[idx[0]]), int(dev[idx[0]]))
            if key not in self._devices:
                self._devices[key] = _Device(self._sink(), self._sink())
            self._devices[key].add({k: v[idx] for k, v in c.items()})
        for a, b in metrics.runs(gp, gd, gs):
            idx = order[a:b]  # chunk order within the stream (stable sort)
            key = (int(gp[a]), int(gd[a]), int(gs[a]))
            s, e = c["start_ns"][idx], c["end_ns"][idx]
            by = np.lexsort((e, s))  # (start, end, row)
            self._streams.setdefault(key, _Stream()).add(s[by], e[by], c["launch_start_ns"][idx][by])
        self._add_kernels(c)
        if self._ranges is not None:
            self._ranges.add(c)
        launched = c["launch_start_ns"] != schema.NO_ID
        lp, lt = pid[launched], c["launch_tid"][launched]
        order = np.lexsort((lt, lp))
        for a, b in metrics.runs(lp[order], lt[order]):
            p, t = int(lp[order[a]]), int(lt[order[a]])
            self._tids.setdefault(p, Counter())[t] += b - a
        self._launches.add(
            {
                "pid": pid[launched],
                "l_start": c["launch_start_ns"][launched],
                "rid": c["rid"][launched],
                "l_tid": c["launch_tid"][launched],
                "l_end": c["launch_end_ns"][launched],
                "op_end": c["end_ns"][launched],
                "kind": c["kind"][launched],
                "name": c["name"][launched],
            }
        )

    def _add_kernels(self, c: dict[str, np.ndarray]) -> None:
        named = np.flatnonzero(c["name"] >= 0)  # like groupby's dropna: an op without a name is left out
        dev, kind, name, dur = (c[k][named] for k in ("device", "kind", "name", "dur_ns"))
        order = np.lexsort((name, kind, dev))
        dev, kind, name, dur = dev[order], kind[order], name[order], dur[order]
        bounds = metrics.runs(dev, kind, name)
        if not bounds:
            return
        first = np.array([a for a, _ in bounds], np.int64)
        count = np.diff(np.r_[first, len(dur)])
        total = np.add.reduceat(dur, first)
        top = np.maximum.reduceat(dur, first)
        keys = zip(dev[first].tolist(), kind[first].tolist(), name[first].tolist(), strict=True)
        for key, k, t, m in zip(keys, count.tolist(), total.tolist(), top.tolist(), strict=True):
            acc = self._kernels.get(key)
            if acc is None:
                self._kernels[key] = [k, t, m]
            else:
                acc[0] += k
                acc[1] += t
                acc[2] = max(acc[2], m)

    def finish(self) -> OpTables:
        timelines = [self._devices[k].timeline(*k) for k in sorted(self._devices)]
        stream_cols = [c for c in schema.STREAM_COLUMNS if c not in ("trace", "rank")]
        rows = [self._streams[k].row(*k) for k in sorted(self._streams)]
        streams = (
            pd.DataFrame(rows, columns=stream_cols)
            if rows
            else schema.empty_frame({c: schema.STREAM_COLUMNS[c] for c in stream_cols})
        )
        partials = None if self._ranges is None else self._ranges.finish()
        self._ranges = None  # the counters live on in ``partials`` only (the caller closes them once used)
        return OpTables(self.num_ops, timelines, streams, self._kernel_table(), partials)

    def _kernel_table(self) -> pd.DataFrame:
        cols = [c for c in schema.KERNEL_COLUMNS if c not in ("trace", "rank")]
        if not self._kernels:
            return schema.empty_frame({c: schema.KERNEL_COLUMNS[c] for c in cols})
        keys = np.array(list(self._kernels), np.int64)
        vals = np.array(list(self._kernels.values()), np.int64)
        kinds = np.array(schema.EVENT_KINDS, dtype=object)[keys[:, 1]]
        names = np.array([self.names[i] for i in keys[:, 2].tolist()], dtype=object)
        # (device, kind, name) in value / code-point order, as kernel_table groups them
        order = np.lexsort((_string_ranks(names), _string_ranks(kinds), keys[:, 0]))
        return kernel_classes.kernel_frame(
            keys[order, 0], kinds[order], names[order], vals[order, 0], vals[order, 1], vals[order, 2]
        )

    def launches(self, kernels: pd.DataFrame) -> Launches:
        """The launches of the ops fed in, on disk (``kernels``: the trace's kernel table, for ``l_gemm``);
        the caller closes them."""
        gemm = set(kernels.loc[kernels["kernel_class"].astype(str) == "gemm", "name"].astype(str))
        gemm_codes = np.array([i for i, n in enumerate(self.names) if n in gemm], np.int64)
        return Launches(self._launches, gemm_codes, self._tids)

    def _sink(self) -> IntervalSink:
        if self._timeline_dir is None:
            return IntervalSink()
        fd, name = tempfile.mkstemp(prefix="timeline-", suffix=".bin", dir=self._timeline_dir)
        os.close(fd)  # unique across the processes that share the folder; the sink rewrites it
        return IntervalSink(name)

    def set_lag(self, lag: int | None) -> None:
        """Every op still to be added starts at most ``lag`` after its launch (``opjoin.Joined.max_lag``):
        ranges no op still to come can have been launched in are retired (``range_ops``)."""
        if self._ranges is not None:
            self._ranges.set_lag(lag)

    def close(self) -> None:
        """Give up (interrupted): the spilled launches, range counters and timeline files are removed."""
        self._launches.close()
        if self._ranges is not None:
            self._ranges.close()
        for d in self._devices.values():
            d.busy.close()
            d.stall.close()


class Launches:
    """The GPU launches of a trace (``mbsignals.launch_signals``' columns) on disk in (pid, launch start, row)
    order: read a window at a time by micro-batch detection (``mbwindows``), never all at once."""

    def __init__(self, runs: SortedRuns, gemm_codes: np.ndarray, tids: dict[int, Counter]) -> None:
        self._runs = runs
        self._gemm = gemm_codes
        self.tids = tids  # per process, its launches per launching thread
        self.pids = set(tids)

    def chunks(self) -> Iterator[dict[str, np.ndarray]]:
        """Every launch in (pid, launch start, row) order: ``pid`` and :data:`LAUNCH_SIGNALS`."""
        kernel_code = _KIND[schema.KERNEL]
        for c in self._runs.merged():
            kernel = c["kind"] == kernel_code
            out = {k: c[k] for k in ("pid", "l_tid", "l_start", "l_end", "op_end")}
            out.update(l_kernel=kernel, l_gemm=kernel & np.isin(c["name"], self._gemm))
            yield out

    def per_process(self) -> dict[int, dict[str, np.ndarray]]:
        """All launches in memory, per process (``launch_signals``' result; 34 bytes a launch)."""
        parts: dict[int, list[dict[str, np.ndarray]]] = {}
        for c in self.chunks():
            for a, b in metrics.runs(c["pid"]):
                parts.setdefault(int(c["pid"][a]), []).append({k: c[k][a:b] for k in LAUNCH_SIGNALS})
        return {
            p: {k: np.concatenate([q[k] for q in ps]) for k in LAUNCH_SIGNALS}
            for p, ps in sorted(parts.items())
        }

    def gpu_ends(self, pid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per window, the end of the last GPU op its process launched in [lo, hi]; ``lo`` when none (one pass
        over the launches, each window's maximum merged chunk by chunk)."""
        pid, lo, hi = (np.asarray(a, np.int64) for a in (pid, lo, hi))
        best = np.full(len(pid), _MIN, np.int64)
        queries = {p: np.flatnonzero(pid == p) for p in np.unique(pid).tolist()}
        for c in self.chunks():
            for a, b in metrics.runs(c["pid"]):
                q = queries.get(int(c["pid"][a]))
                if q is None:
                    continue
                ls, ends = c["l_start"][a:b], c["op_end"][a:b]
                i, j = np.searchsorted(ls, lo[q], side="left"), np.searchsorted(ls, hi[q], side="right")
                hit = j > i
                if hit.any():
                    top = attribution._slice_reduce(np.maximum, ends, i[hit], j[hit])
                    best[q[hit]] = np.maximum(best[q[hit]], top)
        return np.where(best > _MIN, best, lo)

    def close(self) -> None:
        self._runs.close()


def _string_ranks(values: np.ndarray) -> np.ndarray:
    """Each string's rank in code-point order (equal strings: equal ranks)."""
    rank = {v: i for i, v in enumerate(sorted(set(values.tolist())))}
    return np.array([rank[v] for v in values.tolist()], np.int64)
