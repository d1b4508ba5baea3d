"""Per-device GPU metrics: span, busy, idle, and how much of the idle time the GPU waited for the host.

All functions are pure: event tables in, new tables out. Times are int64 ns.

Busy and idle (per process and device, over [first GPU op start, last GPU op end])::

    stream 7   |==k1==|      |=k3=|
    stream 13      |===k2===|          |=k4=|
    union      |============|  |=====| gap |=|      busy = |union|, idle = span - busy
               ^ first                       ^ last

Only kernels, memcpys and memsets count (not cuda_sync, not gpu_user_annotation); ops that overlap on one
stream (programmatic dependent launch) are counted once by the union.

Host stall, the **launch-end rule** (docs/contracts.md; the default here)::

    host   ..[launch k]......                   L_end(k): the launch call returned
    GPU    ==k-1==|     gap      |==k==
                  g0          g1
    stall = max(0, min(g1, L_end(k)) - g0)

For each gap [g0, g1) of the busy union, k is the op that starts at g1 (the one whose launch ended first,
if several do). The GPU cannot start k before its launch call returns, so the part of the gap before
``L_end(k)`` is time the device waited for the host. A k without a launch record contributes 0 and its gap
counts as ``unattributed``; ``other_idle = idle - host_stall`` (the device waited on something else: a
dependency, a sync, a copy engine). ``host_stall_ambiguous`` is the stalled part of gaps whose launch call had
already *started* before g0: the host was in the launch call when the GPU ran dry.

HTA's per-stream rule (:func:`stream_breakdown`, for comparison with Holistic Trace Analysis)::

    stream s   ==k-1==|        gap       |==k==
    host              ^ prev_end   [launch k]     host_wait   if L_start(k) > prev_end
                                                  kernel_wait elif gap < 30 us
                                                  other       otherwise

HTA looks at one stream at a time, so a stream that sits unused while others work piles up "idle", and it
uses the *start* of the launch call (``rule="start"``); ``rule="end"`` uses its end instead.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracing.analysis.intervals import Intervals
from tracing.ingest.opjoin import launch_key
from tracing.outputs import schema

KERNEL_WAIT_THRESHOLD_NS = 30_000  # HTA's consecutive_kernel_delay (30, in trace units = us)


def kind_mask(events: pd.DataFrame, kinds: tuple[str, ...]) -> np.ndarray:
    """Boolean mask of rows whose ``kind`` is in ``kinds`` (on the category codes: fast)."""
    cats = list(events["kind"].cat.categories)
    codes = [cats.index(k) for k in kinds if k in cats]
    return np.isin(events["kind"].cat.codes.to_numpy(), codes)


def gpu_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Kernel/memcpy/memset rows with their launch call joined by (pid, correlation).

    Adds ``end_ns``, ``launch_start_ns``, ``launch_end_ns``, ``launch_tid`` (-1 when no launch record).
    (``tracing.streamed`` builds the same frame with ``name`` as a categorical: 4 bytes a row instead of a
    string per row; every analysis of ops gives the same result with either.)
    """
    is_op = kind_mask(events, schema.GPU_OP_KINDS)
    cols = ["pid", "device", "stream", "start_ns", "dur_ns", "correlation"]
    # kind: object column of str; name: the str column, taken from the categories by code (no per-row
    # Python strings; code -1 -> missing), equal to converting the categorical row by row.
    kind = events["kind"].array
    kind_names = np.array([str(k) for k in kind.categories] + [np.nan], dtype=object)
    name = events["name"].array
    name_codes = name.codes[is_op]
    names = name.categories.astype(str).array
    data = {
        "kind": pd.Series(kind_names[kind.codes[is_op]], dtype=object, copy=False),
        "name": (
            pd.Series(names.take(name_codes, allow_fill=True), copy=False)
            if (name_codes >= 0).any()
            else name.to_numpy()[is_op]  # no names: let pandas infer as for the rows (object, float)
        ),
    }
    data.update({c: events[c].to_numpy()[is_op] for c in cols})
    ops = pd.DataFrame(data, copy=False)
    ops["end_ns"] = ops["start_ns"] + ops["dur_ns"]
    corr_all = events["correlation"].to_numpy()
    is_launch = kind_mask(events, schema.LAUNCH_KINDS) & (corr_all >= 0)
    l_pid, l_tid = events["pid"].to_numpy()[is_launch], events["tid"].to_numpy()[is_launch]
    l_corr, ls = corr_all[is_launch], events["start_ns"].to_numpy()[is_launch]
    l_dur = events["dur_ns"].to_numpy()[is_launch]
    n = len(ops)
    l_start = np.full(n, schema.NO_ID, np.int64)
    l_end = np.full(n, schema.NO_ID, np.int64)
    tid_out = np.full(n, schema.NO_ID, np.int64)
    if n and len(l_corr):
        key_l = launch_key(l_pid, l_corr)
        order = np.argsort(key_l, kind="stable")  # first launch record wins on duplicate keys
        key_s = key_l[order]
        key_o = launch_key(ops["pid"].to_numpy(), ops["correlation"].to_numpy())
        pos = np.minimum(np.searchsorted(key_s, key_o), len(key_s) - 1)
        hit = (key_s[pos] == key_o) & (ops["correlation"].to_numpy() >= 0)
        src = order[pos[hit]]
        l_start[hit] = ls[src]
        l_end[hit] = ls[src] + l_dur[src]
        tid_out[hit] = l_tid[src]
    ops["launch_start_ns"] = l_start
    ops["launch_end_ns"] = l_end
    ops["launch_tid"] = tid_out
    return ops


def union_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the union of [start, end) (touching intervals merge)."""
    if len(start) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], run_end[last]


_MEASURE_BLOCK = 1 << 18  # ops per step of :func:`measure`


def measure(start: np.ndarray, end: np.ndarray, after: int | None = None) -> int:
    """|union of [start, end)| in ns, equal to the sum of :func:`union_intervals`' lengths.

    In start order with M_j the running max of ends, |union| = sum_j (M_j - max(s_j, M_{j-1})) (each block
    of the union telescopes to its end minus its first start); summed a block of ops at a time, carrying M,
    so it holds the sort order (8 bytes an op) and one block, however many ops a range covers.

    ``after``: the running max end M of earlier intervals, none starting later than these: the result is
    then what these add to their union (summed window after window, the union of all, exactly)."""
    n = len(start)
    if n == 0:
        return 0
    order = np.argsort(start, kind="stable")
    total, carry = 0, np.iinfo(np.int64).min if after is None else after
    for a in range(0, n, _MEASURE_BLOCK):
        idx = order[a : a + _MEASURE_BLOCK]
        s, e = np.asarray(start[idx], np.int64), np.asarray(end[idx], np.int64)
        run = np.maximum.accumulate(np.maximum(e, carry))
        prev = np.empty_like(run)
        prev[0], prev[1:] = carry, run[:-1]
        total += int((run - np.maximum(s, prev)).sum())
        carry = int(run[-1])
    return total


@dataclass(frozen=True)
class DeviceTimeline:
    """The busy union and the host-stall intervals of one (process, device): in memory, or on disk where a
    streamed trace spilled them (``tracing.analysis.intervals``)."""

    pid: int
    device: int
    busy: Intervals
    stall: Intervals  # each lies inside a gap of the busy union, from its start
    row: dict[str, float | int]

    def loaded(self) -> DeviceTimeline:
        """This timeline with its intervals in memory."""
        return DeviceTimeline(self.pid, self.device, self.busy.loaded(), self.stall.loaded(), self.row)


def device_timeline(ops: pd.DataFrame, pid: int, device: int) -> DeviceTimeline:
    """Busy union, gaps and host stall (launch-end rule) for the ops of one (process, device)."""
    return _device_timeline({c: ops[c].to_numpy() for c in _TIMELINE_COLUMNS}, pid, device)


_TIMELINE_COLUMNS = ("kind", "stream", "start_ns", "end_ns", "launch_start_ns", "launch_end_ns")


def _device_timeline(ops: dict[str, np.ndarray], pid: int, device: int) -> DeviceTimeline:
    """:func:`device_timeline` on the ops' columns as arrays (rows in ``gpu_ops`` order)."""
    start, end = ops["start_ns"], ops["end_ns"]
    l_start, l_end = ops["launch_start_ns"], ops["launch_end_ns"]
    has_launch = l_end != schema.NO_ID
    # Sort by start, ties by earliest launch end (ops without a launch record last).
    order = np.lexsort((np.where(has_launch, l_end, np.iinfo(np.int64).max), start))
    s = start[order]
    run_end = np.maximum.accumulate(end[order])
    gap_at = np.flatnonzero(s[1:] > run_end[:-1]) + 1  # index of k, the first op after each gap
    k = order[gap_at]  # the op after each gap (its launch columns are read for these only)
    del order
    g0, g1 = run_end[gap_at - 1], s[gap_at]
    attributed = has_launch[k]
    stall = np.where(attributed, np.clip(np.minimum(g1, l_end[k]) - g0, 0, None), 0)
    ambiguous = np.where(attributed & (l_start[k] <= g0), stall, 0)
    # the busy union's blocks (= union_intervals(s, e): s is sorted, its blocks split at the gaps)
    busy_start = s[np.r_[0, gap_at]]
    busy_end = run_end[np.r_[gap_at - 1, len(s) - 1]]
    first_ns, last_ns = int(s[0]), int(run_end[-1])
    del s, run_end
    host_stall = int(stall.sum())
    keep = stall > 0
    kinds = ops["kind"]
    counts = {k: int((kinds == k).sum()) for k in (schema.KERNEL, schema.MEMCPY, schema.MEMSET)}
    row = timeline_row(
        pid,
        device,
        (first_ns, last_ns),
        int((busy_end - busy_start).sum()),
        (host_stall, int(ambiguous.sum()), int((g1 - g0)[~attributed].sum())),
        counts,
        len(np.unique(ops["stream"])),
        _same_stream_overlap(ops["stream"], start, end),
    )
    busy, stalls = Intervals.of(busy_start, busy_end), Intervals.of(g0[keep], (g0 + stall)[keep])
    return DeviceTimeline(pid, device, busy, stalls, row)


def timeline_row(
    pid: int,
    device: int,
    first_last: tuple[int, int],
    busy: int,
    stalls: tuple[int, int, int],
    counts: dict[str, int],
    num_streams: int,
    overlap: int,
) -> dict[str, float | int]:
    """A :class:`DeviceTimeline`'s row (``device_metrics`` columns before the colocated ones) from its
    totals: (first, last) op times, busy, (host stall, ambiguous, unattributed), op counts by kind."""
    first_ns, last_ns = first_last
    host_stall, ambiguous, unattributed = stalls
    span = last_ns - first_ns
    return {
        "pid": pid,
        "device": device,
        "first_ns": first_ns,
        "last_ns": last_ns,
        "span_ns": span,
        "busy_ns": busy,
        "idle_ns": span - busy,
        "host_stall_ns": host_stall,
        "host_stall_ambiguous_ns": ambiguous,
        "unattributed_ns": unattributed,
        "other_idle_ns": span - busy - host_stall,
        "host_stall_fraction": host_stall / span if span else float("nan"),
        "num_kernels": counts[schema.KERNEL],
        "num_memcpy": counts[schema.MEMCPY],
        "num_memset": counts[schema.MEMSET],
        "num_streams": num_streams,
        "same_stream_overlap_ns": overlap,
    }


def _same_stream_overlap(stream: np.ndarray, start: np.ndarray, end: np.ndarray) -> int:
    """Sum over consecutive ops of one stream (in start order) of how far the later one starts before the
    earlier one ends; a block of ops at a time (blocks share their edge op), so it holds the sort order."""
    order = np.lexsort((start, stream))  # stable: by stream, then start, then row order
    total = 0
    for a in range(0, max(len(order) - 1, 0), _MEASURE_BLOCK):
        idx = order[a : a + _MEASURE_BLOCK + 1]
        st, s, e = stream[idx], start[idx], end[idx]
        overlap = np.minimum(e[:-1], e[1:]) - s[1:]
        total += int(np.clip(overlap[st[1:] == st[:-1]], 0, None).sum())
    return total


def device_timelines(events: pd.DataFrame, ops: pd.DataFrame | None = None) -> list[DeviceTimeline]:
    """One :class:`DeviceTimeline` per (process, device) with GPU ops, in (pid, device) order."""
    ops = gpu_ops(events) if ops is None else ops
    cols = {c: ops[c].to_numpy() for c in _TIMELINE_COLUMNS}
    pid, dev = ops["pid"].to_numpy(np.int64), ops["device"].to_numpy(np.int64)
    if len(pid) and not (pid.min() == pid.max() and dev.min() == dev.max()):  # one device: no copies
        order = np.lexsort((dev, pid))  # stable: groups in (pid, device) order, rows in their order
        cols = {c: v[order] for c, v in cols.items()}
        pid, dev = pid[order], dev[order]
    return [
        _device_timeline({c: v[a:b] for c, v in cols.items()}, int(pid[a]), int(dev[a]))
        for a, b in runs(pid, dev)
    ]


def runs(*keys: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of equal key tuples in arrays sorted by those keys."""
    n = len(keys[0])
    if n == 0:
        return []
    new = np.zeros(n, bool)
    new[0] = True
    for k in keys:
        new[1:] |= k[1:] != k[:-1]
    bounds = np.append(np.flatnonzero(new), n).tolist()
    return list(itertools.pairwise(bounds))


def device_metrics(events: pd.DataFrame, timelines: list[DeviceTimeline] | None = None) -> pd.DataFrame:
    """Per (process, device): span, busy, idle, host stall (launch-end rule), unattributed, counts, and
    the device seen by every process of the trace (:mod:`tracing.analysis.colocated`).

    A trace without GPU ops gives zero rows (GPU metrics are then null with a reason, never a CPU stand-in).
    """
    from tracing.analysis.colocated import shared_device_time  # it builds on this module

    timelines = device_timelines(events) if timelines is None else timelines
    shared = shared_device_time(timelines)  # processes of this trace that share a device
    rows = [{**t.row, **s} for t, s in zip(timelines, shared, strict=True)]
    cols = [c for c in schema.DEVICE_COLUMNS if c not in ("trace", "format", "rank")]
    if not rows:
        return schema.empty_frame({c: schema.DEVICE_COLUMNS[c] for c in cols})
    return pd.DataFrame(rows, columns=cols)


def stream_breakdown(
    events: pd.DataFrame,
    *,
    rule: str = "start",
    kernel_wait_threshold_ns: int = KERNEL_WAIT_THRESHOLD_NS,
    ops: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """HTA's idle-time breakdown per (process, device, stream): host_wait / kernel_wait / other.

    ``rule="start"`` is HTA's test (launch call *started* after the previous op ended); ``"end"`` tests the
    launch call's end. Gaps between consecutive ops on a stream are taken in start order (as HTA does);
    negative gaps (same-stream overlap) are clamped to 0 and counted in ``negative_gaps``.
    """
    if rule not in ("start", "end"):
        raise ValueError(f"rule must be 'start' or 'end', got {rule!r}")
    ops = gpu_ops(events) if ops is None else ops
    cols = [c for c in schema.STREAM_COLUMNS if c not in ("trace", "rank")]
    rows = []
    pids, devs, streams = (ops[c].to_numpy(np.int64) for c in ("pid", "device", "stream"))
    starts, ends = ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    launches = ops["launch_start_ns" if rule == "start" else "launch_end_ns"].to_numpy()
    # stable: groups in (pid, device, stream) order, each sorted by (start, end), ties in row order
    order = np.lexsort((ends, starts, streams, devs, pids))
    for a, b in runs(
        pids[order], devs[order], streams[order]
    ):  # each stream's columns gathered on their own (no sorted copy of every column)
        idx = order[a:b]
        pid, dev, stream = pids[idx[0]], devs[idx[0]], streams[idx[0]]
        s, e = starts[idx], ends[idx]
        launch = launches[idx[1:]]
        gap = s[1:] - e[:-1]
        negative = gap < 0
        gap = np.clip(gap, 0, None)
        host = (launch != schema.NO_ID) & (launch > e[:-1])
        kwait = ~host & (gap < kernel_wait_threshold_ns)
        idle = int(gap.sum())
        host_ns = int(gap[host].sum())
        rows.append(
            {
                "pid": int(pid),
                "device": int(dev),
                "stream": int(stream),
                "num_ops": b - a,
                "span_ns": int(e.max() - s[0]),
                "busy_ns": measure(s, e),
                "idle_ns": idle,
                "host_wait_ns": host_ns,
                "kernel_wait_ns": int(gap[kwait].sum()),
                "other_wait_ns": int(gap[~host & ~kwait].sum()),
                "host_wait_share": host_ns / idle if idle else float("nan"),
                "negative_gaps": int(negative.sum()),
            }
        )
    if not rows:
        return schema.empty_frame({c: schema.STREAM_COLUMNS[c] for c in cols})
    return pd.DataFrame(rows, columns=cols)
