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
``span`` (first op start -> last op end).

One time basis (docs/contracts.md, v2), shared with the micro-batch table: a range's **window** runs from its start to the
later of its end and ``gpu_end_ns``, the end of the last GPU op launched inside it (``window_*`` rule);
``time_ns`` is its length. GPU work launched in a range runs asynchronously, often after the host moved on,
so host wall time alone (``wall_ns``) can be far shorter than the work it caused. Two columns measured
inside the window obey time conservation -- each is at most ``time_ns``, and so is their sum, since stalls
lie in gaps of the busy union::

    host   [== range ==]                  wall_ns
    GPU         |==k1==|    |===k2===|    (launched inside the range)
           [============ window ========] time_ns = max(end, gpu_end) - start

- ``busy_in_window_ns``: the device busy union inside the window;
- ``host_stall_ns``: the device host-stall intervals (launch-end rule, ``metrics.py``) inside the window.

With several devices in one process the per-device intervals are merged first (time *some* device was busy
or stalled). A trace without GPU ops leaves all GPU columns null with ``gpu_reason`` set.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from tracing.analysis import clipped_spill, intervals, metrics, shapes
from tracing.analysis.clipped_spill import SpilledClipped
from tracing.analysis.phases import PhaseMap, default_phase_map
from tracing.ingest.trace import Trace
from tracing.outputs import schema

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
    table = _frame(_range_columns(trace, phase_map), "")
    return table[list(_FRAME_COLUMNS)]


_FRAME_COLUMNS = (
    "source",
    "range_id",
    "parent_id",
    "depth",
    "name",
    "domain",
    "pid",
    "tid",
    "start_ns",
    "end_ns",
    "attrs",
    "wall_ns",
    "phase",
)


def _nesting_arrays(
    pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Parent and depth per range (:class:`Nesting`, a block of rows at a time). Held as int32 where the ids
    fit (the table's columns are int64: ``_frame``)."""
    parent = np.full(len(pid), schema.NO_ID, index_dtype(len(pid)))
    depth = np.zeros(len(pid), np.int32)
    nesting = Nesting()
    for a in range(0, len(pid), _NESTING_ROWS):  # Python ints for a block of rows at a time, not all
        b = a + _NESTING_ROWS
        parent[a:b], depth[a:b] = nesting.add(*(np.asarray(x)[a:b] for x in (pid, tid, start, end)))
    return parent, depth


_NESTING_ROWS = 1 << 16


class Nesting:
    """Ranges nest per (pid, tid) by containment: fed in table order (start ascending, end descending) a block at
    a time, each range's parent and depth, the threads' open ranges carried from block to block. A range flagged
    in ``mark`` marks its ancestors (its thread's open ranges): :attr:`marked` lists each ancestor once (one
    marked has its own ancestors marked already, so the walk stops there)."""

    def __init__(self) -> None:
        self.n = 0
        self.marked: list[int] = []
        self._stacks: dict[tuple[int, int], list[list[int]]] = {}  # per thread: [index, end, marked]

    def add(
        self,
        pid: np.ndarray,
        tid: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        mark: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        m = len(pid)
        parent = np.full(m, schema.NO_ID, np.int64)
        depth = np.zeros(m, np.int32)
        marks = itertools.repeat(False) if mark is None else mark.tolist()
        rows = zip(*(np.asarray(x).tolist() for x in (pid, tid, start, end)), marks, strict=False)
        stacks, marked = self._stacks, self.marked
        for i, (p, t, s0, e0, flagged) in enumerate(rows):
            stack = stacks.setdefault((p, t), [])
            while stack and (stack[-1][1] <= s0 or stack[-1][1] < e0):
                stack.pop()
            if stack:
                parent[i] = stack[-1][0]
                depth[i] = len(stack)
                if flagged:
                    for entry in reversed(stack):
                        if entry[2]:
                            break
                        entry[2] = 1
                        marked.append(entry[0])
            stack.append([self.n + i, e0, 0])
        self.n += m
        return parent, depth


def index_dtype(n: int) -> type[np.signedinteger]:
    """The narrowest of int32 / int64 that holds indices and codes below ``n`` (4 bytes a range, not 8)."""
    return np.int32 if n < np.iinfo(np.int32).max else np.int64


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
    cols = _range_columns(trace, phase_map)
    ops = metrics.gpu_ops(trace.events) if ops is None else ops
    if trace.range_log is not None or len(ops) == 0:
        return unattributed_frame(trace, cols)
    timelines = metrics.device_timelines(trace.events, ops) if timelines is None else timelines
    # the ops' columns as views (no per-op copies here: each pass sorts only what it needs)
    launched = {
        c: ops[c].to_numpy(np.int64) for c in ("pid", "launch_tid", "launch_start_ns", "start_ns", "end_ns")
    }
    start, end = cols["start_ns"], cols["end_ns"]
    partials = {
        prefix: _attribute([cols[k] for k in range_keys], start, end, launched, list(op_keys))
        for prefix, op_keys, range_keys in RULES
    }
    return attributed_frame(cols, partials, timelines)


# (prefix, the ops' group key, the range's): ops launched in a range by its own thread / by any thread
RULES = (("thread", ("pid", "launch_tid"), ("pid", "tid")), ("window", ("pid",), ("pid",)))


def range_columns(trace: Trace, phase_map: PhaseMap | None = None) -> dict[str, Any]:
    """The ranges as arrays (sorted by (start, -end), with nesting): what :func:`attributed_frame` completes."""
    return _range_columns(trace, phase_map)


def unattributed_frame(trace: Trace, cols: dict[str, Any]) -> pd.DataFrame:
    """The range table of a trace whose GPU work cannot be attributed (a range log, or no GPU ops)."""
    return _frame(cols, RANGELOG_REASON if trace.range_log is not None else NO_GPU_REASON)


def attributed_frame(
    cols: dict[str, Any],
    partials: Partials | Counters,
    timelines: list[metrics.DeviceTimeline],
) -> pd.DataFrame:
    """The range table from :func:`range_columns` and, per rule of :data:`RULES`, each range's ops: count,
    busy (|union|), first op start and last op end (0 where none) -- from all ops at once
    (:func:`attribute_ranges`) or accumulated a time window of ops at a time (``tracing.analysis.opwindows``)."""
    return next(table_parts(cols, max(len(cols["start_ns"]), 1), partials, timelines))


Partials = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


class Counters(Protocol):
    """Per range counters read back a part at a time (``range_ops.Counters``)."""

    spill_dir: Path

    def parts(self, rows: int) -> Iterator[tuple[int, Partials]]: ...


class RangeSource(Protocol):
    """Range columns read a part at a time, not held (``range_file.RangeFile``)."""

    def __len__(self) -> int: ...

    def ends(self, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(pid, end) of ranges [a, a + rows), a = 0, rows, ..."""
        ...

    def parts(self, rows: int) -> Iterator[dict[str, Any]]:
        """The columns (as :func:`range_columns` has them) of ranges [a, a + rows), a = 0, rows, ...; one
        empty part where there are no ranges."""
        ...


def table_parts(
    cols: dict[str, Any] | RangeSource,
    rows: int,
    partials: Partials | Counters | None = None,
    timelines: list[metrics.DeviceTimeline] | None = None,
) -> Iterator[pd.DataFrame]:
    """:func:`attributed_frame` (with ``partials``: held, or :class:`Counters` read a part at a time) or the
    unattributed table of a trace without GPU ops, as consecutive parts of ``rows`` ranges: the same rows and
    dtypes, never the whole table at once (the streamed path writes each part out before making the next).
    ``cols``: held columns (emptied on the way) or a :class:`RangeSource`.

    Held partials: each window's device time before its end is made for every range at once (16 bytes a
    range, from one pass over the timelines in end order). :class:`Counters`: the window ends go through two
    sorted spills instead (``clipped_spill``), nothing held per range. The rest of the GPU columns is made a
    part at a time."""
    src = _Held(cols) if isinstance(cols, dict) else cols
    n = len(src)
    clipped: _Clipped | SpilledClipped | None = None
    counters: Iterator[tuple[int, Partials]] = iter(())
    if isinstance(partials, dict):
        assert isinstance(src, _Held), "held partials go with held columns"
        held = src.cols
        clipped = _Clipped(held["pid"], _window_end(held["end_ns"], partials["window"]), timelines or [])
    elif partials is not None:
        clipped = SpilledClipped(_window_ends(src, partials), timelines or [], partials.spill_dir)
        counters = partials.parts(rows)
    for a, part in zip(range(0, max(n, 1), rows), src.parts(rows), strict=True):
        if partials is None:
            yield _frame(part, NO_GPU_REASON)
            continue
        assert clipped is not None
        if isinstance(partials, dict):
            mine = {k: tuple(x[a : a + rows] for x in v) for k, v in partials.items()}
        else:
            mine = next(counters, (a, _no_counters()))[1]
        window_end = _complete(part, mine)
        part["time_ns"] = window_end - part["start_ns"]
        part["busy_in_window_ns"], part["host_stall_ns"] = clipped.part(a, part["pid"], part["start_ns"])
        del mine, window_end
        if a + rows >= n:
            if isinstance(clipped, SpilledClipped):
                clipped.close()
            clipped = None  # the last part: what was made for every range goes before this part's table
        yield _frame(part, "")


_ENDS_ROWS = 1 << 16  # window ends made a block of ranges at a time


def _window_ends(src: RangeSource, counters: Counters) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each range's pid and window end (:func:`_window_end`), a block of ranges at a time."""
    blocks = zip(counters.parts(_ENDS_ROWS), src.ends(_ENDS_ROWS), strict=True)
    for (_, mine), (pid, end) in blocks:
        yield pid, _window_end(np.asarray(end, np.int64), mine["window"])


class _Held:
    """Held range columns as a :class:`RangeSource`; a single part is the columns themselves (so that ``_frame``
    frees each as it converts it), and the columns are emptied once every part is made."""

    def __init__(self, cols: dict[str, Any]) -> None:
        self.cols = cols

    def __len__(self) -> int:
        return len(self.cols["start_ns"])

    def ends(self, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        pid, end = self.cols["pid"], self.cols["end_ns"]
        for a in range(0, len(self), rows):
            yield pid[a : a + rows], end[a : a + rows]

    def parts(self, rows: int) -> Iterator[dict[str, Any]]:
        n = len(self)
        for a in range(0, max(n, 1), rows):
            yield self.cols if rows >= n else used_rows(self.cols, a, a + rows)
        self.cols.clear()


def _no_counters() -> Partials:
    """The counters of no range (a streamed table without ranges)."""
    return {prefix: tuple(np.zeros(0, np.int64) for _ in range(4)) for prefix, _, _ in RULES}  # type: ignore[misc]


def used_rows(cols: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """Rows [a, b) of range columns (arrays, :class:`Coded` columns, extension arrays, lists or a ``range``; a
    string is every row's). A coded column keeps only the values its rows use (emit_nvtx names are all
    distinct: ``op_id = N``); columns that share their codes (name, phase, attrs) share the work."""
    out: dict[str, Any] = {}
    recoded: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for c, col in cols.items():
        if isinstance(col, str):
            out[c] = col
        elif isinstance(col, Coded):
            key = id(col.codes)
            if key not in recoded:
                used, codes = np.unique(col.codes[a:b], return_inverse=True)
                recoded[key] = (used, codes.reshape(-1).astype(np.int64))
            used, codes = recoded[key]
            out[c] = Coded([col.values[k] for k in used.tolist()], codes)
        else:
            out[c] = col[a:b]
    return out


def _window_end(end: np.ndarray, window: tuple[np.ndarray, ...]) -> np.ndarray:
    """Each range's window end: the later of its end and the end of the last GPU op launched in it."""
    n_ops, last = window[0], window[3]
    return np.where(n_ops > 0, np.maximum(end, last), end)


def _complete(cols: dict[str, Any], partials: Partials) -> np.ndarray:
    """Add the op columns to ``cols`` (see :func:`attributed_frame`); returns the window ends."""
    end = cols["end_ns"]
    for prefix, (n_ops, busy, first, last) in partials.items():
        cols[f"{prefix}_ops"], cols[f"{prefix}_busy_ns"] = n_ops, busy
        cols[f"{prefix}_span_ns"] = np.where(n_ops > 0, last - first, 0)
    gpu_end = partials["window"][3]
    launched_any = cols["window_ops"] > 0
    window_end = _window_end(end, partials["window"])
    cols["gpu_end_ns"] = pd.array(np.where(launched_any, gpu_end, 0), dtype="Int64")
    cols["gpu_end_ns"][~launched_any] = pd.NA
    return window_end


class _Clipped:
    """Per range, its process's device busy union and host stall inside [start, window end], a part of the
    ranges (in table order) at a time: C(t) = |union ∩ (-inf, t)| (``intervals.Covered``) at every window end
    at once (one pass over each process's timelines, ends sorted), at the starts part by part (a second pass:
    a process's starts never go back in table order); each window's time is C(end) - C(start), as
    ``intervals.clipped`` gives it."""

    def __init__(self, pid: np.ndarray, hi: np.ndarray, timelines: list[metrics.DeviceTimeline]) -> None:
        pid = np.asarray(pid, np.int64)
        pids = np.unique(pid).tolist()
        self.busy_hi = np.zeros(len(pid), np.int64)
        self.stall_hi = np.zeros(len(pid), np.int64)
        covered = {p: clipped_spill.covered(timelines, p) for p in pids}
        # every range in window-end order (each process's own ends ascend in it): one index array, no per-process
        # gathered copies (an emit_nvtx export has millions of ranges)
        for k in _blocks(np.argsort(hi, kind="stable")):
            pk = pid[k]
            for p in np.unique(pk).tolist():
                cov = covered.get(p)
                if cov is not None:
                    mine = k[pk == p]
                    self.busy_hi[mine], self.stall_hi[mine] = cov[0].at(hi[mine]), cov[1].at(hi[mine])
        self._lo = {p: clipped_spill.covered(timelines, p) for p in pids}

    def part(self, a: int, pid: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Busy and stall of ranges [a, a + len(pid)) of the table (their pid and start)."""
        b = a + len(pid)
        return clipped_spill.minus_starts(self.busy_hi[a:b], self.stall_hi[a:b], pid, lo, self._lo.get)


def _blocks(idx: np.ndarray) -> Iterator[np.ndarray]:
    """``idx`` a block of queries at a time (``intervals.BLOCK_ROWS``)."""
    for a in range(0, len(idx), intervals.BLOCK_ROWS):
        yield idx[a : a + intervals.BLOCK_ROWS]


def _range_columns(trace: Trace, phase_map: PhaseMap | None) -> dict[str, Any]:
    """The ranges (events of kind range, or the range log) as arrays, sorted by (start, -end), with nesting."""
    phase_map = phase_map or default_phase_map()
    if trace.range_log is not None:
        return _range_log_columns(trace.range_log, phase_map)
    events = trace.events
    mask = metrics.kind_mask(events, (schema.RANGE,))
    start = events["start_ns"].to_numpy()[mask]
    return coded_range_columns(
        (events["name"].cat.codes.to_numpy()[mask], [*map(str, events["name"].cat.categories)]),
        (events["domain"].cat.codes.to_numpy()[mask], [*map(str, events["domain"].cat.categories)]),
        events["pid"].to_numpy()[mask],
        events["tid"].to_numpy()[mask],
        start,
        start + events["dur_ns"].to_numpy()[mask],
        "nvtx" if trace.format == "nsys" else "user_annotation",
        phase_map,
    )


def coded_range_columns(
    name: tuple[np.ndarray, list[str]],
    domain: tuple[np.ndarray, list[str]],
    pid: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    source: str,
    phase_map: PhaseMap,
) -> dict[str, Any]:
    """Range rows (in the trace's row order; ``name`` / ``domain``: codes into their values, -1 = missing)
    as the range table's columns, sorted by (start, -end), with nesting: the in-memory path's range events
    and the streamed path's range rows alike.

    Names are split, JSON-encoded and mapped to phases once per distinct name (category code), not per row.
    """
    name_codes, name_cats = name[0], [*name[1], ""]  # code -1 (a missing name) -> ""
    dom_codes, dom_cats = domain[0], [*domain[1], ""]
    distinct = np.unique(name_codes)  # sorted; per distinct name (emit_nvtx: one per range), three list slots
    values = NameValues(phase_map)
    for code in distinct.tolist():
        values.add(name_cats[code])
    order = np.lexsort((-end, start))  # start ascending, end descending, stable
    pid, tid = np.asarray(pid, np.int64)[order], np.asarray(tid, np.int64)[order]
    start, end = start[order], end[order]
    codes = np.searchsorted(distinct.astype(np.int64), name_codes[order]).astype(index_dtype(len(distinct)))
    dom = dom_codes[order].astype(index_dtype(len(dom_cats)))
    parent, depth = _nesting_arrays(pid, tid, start, end)
    n = len(codes)
    return {  # nothing per row for what follows from the rest (source, range_id, wall_ns: see _frame)
        "source": source,
        "range_id": range(n),
        "parent_id": parent,
        "depth": depth,
        "name": Coded(values.names, codes),
        "domain": Coded(dom_cats, np.where(dom < 0, len(dom_cats) - 1, dom)),
        "phase": Coded(values.phases, codes),
        "pid": pid,
        "tid": tid,
        "start_ns": start,
        "end_ns": end,
        "attrs": Coded(values.attrs, codes),
    }


class NameValues:
    """Per distinct range name, in the order added: its base name, attributes (JSON) and phase. Names are split,
    JSON-encoded and mapped to phases once per distinct name, phases once per op name (emit_nvtx names differ
    by their suffixes, ``, op_id = 7``, only)."""

    def __init__(self, phase_map: PhaseMap) -> None:
        self.phase_map = phase_map
        self.names: list[str] = []
        self.attrs: list[str] = []
        self.phases: list[str] = []
        self._phase_of_op: dict[str, str] = {}

    def add(self, name: str) -> None:
        base, parsed = split_encoded_name(name)
        op = shapes.base_op_name(base)
        phase = self._phase_of_op.get(op)
        if phase is None:
            phase = self._phase_of_op[op] = self.phase_map.phase_of(op)
        self.names.append(base)
        self.attrs.append(json.dumps(parsed, sort_keys=True) if parsed else "{}")
        self.phases.append(phase)


@dataclass(frozen=True)
class Coded:
    """A string column as its distinct values and one code per row: no Python string object per range (an
    NVTX-heavy export has millions), turned into the table's Arrow-backed strings by :func:`string_array`."""

    values: list[str]
    codes: np.ndarray

    def __len__(self) -> int:
        return len(self.codes)


def string_array(col: Coded | list[str], dtype: str) -> Any:
    """A ``string`` column from a :class:`Coded` column (Arrow ``take``: no per-row Python objects) or a list."""
    if isinstance(col, Coded):
        import pyarrow as pa

        codes = pa.array(np.asarray(col.codes))  # int32 or int64 indices as they are: no int64 copy
        taken = pa.array(col.values, pa.large_string()).take(codes)
        return pd.array(taken, dtype=dtype)
    return pd.array(col, dtype=dtype)


def _range_log_columns(log: pd.DataFrame, phase_map: PhaseMap) -> dict[str, Any]:
    """mxperf's range log as range columns (its own ids, nesting and attributes)."""
    names = log["name"].astype(str).tolist()
    phases = {n: phase_map.phase_of(n) for n in set(names)}
    start = log["start_ns"].to_numpy(np.int64)
    end = log["end_ns"].to_numpy(np.int64)
    return {
        "source": ["rangelog"] * len(log),
        "range_id": log["range_id"].to_numpy(np.int64),
        "parent_id": log["parent_id"].to_numpy(np.int64),
        "depth": log["depth"].to_numpy(np.int64),
        "name": names,
        "domain": [""] * len(log),
        "phase": [phases[n] for n in names],
        "pid": np.full(len(log), schema.NO_ID, np.int64),
        "tid": log["tid"].to_numpy(np.int64),
        "start_ns": start,
        "end_ns": end,
        "wall_ns": end - start,
        "attrs": log["attrs"].astype(str).tolist(),
    }


def _frame(cols: dict[str, Any], gpu_reason: str) -> pd.DataFrame:
    """The range table from its columns, built once with its final dtypes; GPU columns absent -> null.
    ``cols`` is consumed: each column is dropped once converted (lists of str are freed as they go). A column
    may be one string for every row (``source``), a ``range`` (``range_id``); ``wall_ns`` absent is end - start."""
    n = len(cols["start_ns"])
    data = {}
    if isinstance(cols.get("source"), str):
        cols["source"] = Coded([cols["source"]], np.zeros(n, np.int64))
    if "wall_ns" not in cols:
        cols["wall_ns"] = np.asarray(cols["end_ns"], np.int64) - np.asarray(cols["start_ns"], np.int64)
    if "time_ns" not in cols:
        cols["time_ns"] = cols["wall_ns"]
    for c, dtype in schema.RANGE_COLUMNS.items():
        if c in ("trace", "rank"):
            continue
        if c == "gpu_reason":
            data[c] = string_array(Coded([gpu_reason], np.zeros(n, np.int64)), dtype)
        elif c not in cols and dtype == "Int64":  # all null, without a list of n NAs
            data[c] = pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool))
        elif c not in cols:
            data[c] = pd.array([pd.NA] * n, dtype=dtype)
        elif dtype == "int64":
            data[c] = np.asarray(cols.pop(c), np.int64)
        elif dtype == "string":
            data[c] = string_array(cols.pop(c), dtype)
        else:
            data[c] = pd.array(cols.pop(c), dtype=dtype)
    cols.clear()
    return pd.DataFrame(data, copy=False)


def clipped_device_time(
    pid: np.ndarray, start: np.ndarray, end: np.ndarray, timelines: list[metrics.DeviceTimeline]
) -> tuple[np.ndarray, np.ndarray]:
    """Per window [start, end) of process ``pid`` (in any order): its devices' busy union and host stall inside
    it (ns), each process's timelines read once in start order, on disk or not (``tracing.analysis.intervals``;
    the range table, whose starts come in order, uses :class:`_Clipped`)."""
    pid, start, end = np.asarray(pid, np.int64), np.asarray(start), np.asarray(end)
    busy = np.zeros(len(pid), np.int64)
    stall = np.zeros(len(pid), np.int64)
    for p in np.unique(pid).tolist():
        idx = np.flatnonzero(pid == p)
        mine = [t for t in timelines if t.pid == p]
        lo, hi = start[idx], end[idx]
        busy[idx] = intervals.clipped([t.busy.blocks() for t in mine], lo, hi)
        stall[idx] = intervals.clipped([t.stall.blocks() for t in mine], lo, hi)
    return busy, stall


def _attribute(
    range_keys: list[np.ndarray],
    starts: np.ndarray,
    ends: np.ndarray,
    launched: dict[str, np.ndarray],
    by: list[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ops launched in each range (same ``by`` key, launch start in [start, end]): count, busy, first op
    start and last op end (0 where none). Ops without a launch record (launch start -1) are left out.

    Vectorized: ops sorted by (group, launch start); each range's ops are one contiguous slice [lo, hi) of
    that order (searchsorted per group); first/last by ``reduceat`` over the slice bounds; busy by
    :func:`_slice_measures`. Per op this holds the sort order and five sorted columns (~50 bytes).
    """
    n = len(starts)
    ops_n = np.zeros(n, np.int64)
    busy = np.zeros(n, np.int64)
    first = np.zeros(n, np.int64)
    last = np.zeros(n, np.int64)
    ls = launched["launch_start_ns"]
    # stable order by (group, launch start) of the ops with a launch record: those without one (launch
    # start -1) go after all others ("no launch" as the primary key) and are cut off
    order = np.lexsort((ls, *(launched[k] for k in reversed(by)), ls == schema.NO_ID))
    order = order[: len(order) - int(np.count_nonzero(ls == schema.NO_ID))]
    ls = ls[order]
    s_all = launched["start_ns"][order]
    e_all = launched["end_ns"][order]
    op_keys = [launched[k][order] for k in by]
    del order
    new_group = np.zeros(len(ls), bool)
    if len(ls):
        new_group[0] = True
        for k in op_keys:
            new_group[1:] |= k[1:] != k[:-1]
    bounds = np.append(np.flatnonzero(new_group), len(ls))
    group_of = {tuple(int(k[b]) for k in op_keys): (int(b), int(e)) for b, e in itertools.pairwise(bounds)}
    lo = np.zeros(n, np.int64)
    hi = np.zeros(n, np.int64)
    keys = zip(*(np.asarray(c, np.int64).tolist() for c in range_keys), strict=True)
    gid = np.array([group_of.get(key, (-1, -1))[0] for key in keys], dtype=np.int64)
    for g0, g1 in group_of.values():
        mine = np.flatnonzero(gid == g0)
        if len(mine):
            lo[mine] = g0 + np.searchsorted(ls[g0:g1], starts[mine], side="left")
            hi[mine] = g0 + np.searchsorted(ls[g0:g1], ends[mine], side="right")
    hit = np.flatnonzero(hi > lo)
    if len(hit):
        ops_n[hit] = hi[hit] - lo[hit]
        last[hit] = _slice_reduce(np.maximum, e_all, lo[hit], hi[hit])
        first[hit] = _slice_reduce(np.minimum, s_all, lo[hit], hi[hit])
        busy[hit] = _slice_measures(s_all, e_all, lo[hit], hi[hit])
    return ops_n, busy, first, last


def _slice_reduce(ufunc: np.ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``ufunc.reduce(values[lo[i]:hi[i]])`` per i (every slice non-empty), in one ``reduceat`` call."""
    padded = np.append(values, values[:1])  # so hi == len(values) is a valid index
    idx = np.empty(2 * len(lo), np.int64)
    idx[0::2], idx[1::2] = lo, hi
    return ufunc.reduceat(padded, idx)[0::2]


_SLICE_CHUNK = 1 << 18  # ops gathered per vectorized step (~100 bytes each): bounds nested wide ranges


def _slice_measures(
    start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray, after: np.ndarray | None = None
) -> np.ndarray:
    """|union of [start, end)| over each slice [lo[i], hi[i]) (non-empty), equal to ``metrics.measure``
    (with ``after[i]``, the running max end of slice i's earlier ops, when given).

    Per slice, sorted by start with M_j the running max of ends: |union| = sum_j (M_j - max(s_j, M_{j-1})),
    which telescopes to the sum of (block end - block start) over ``metrics.union_intervals``' blocks.
    The slices are gathered in chunks of ~``_SLICE_CHUNK`` ops; a slice longer than a chunk is measured
    alone with ``metrics.measure``.
    """
    out = np.zeros(len(lo), np.int64)
    lengths = hi - lo
    if after is None:
        after = np.full(len(lo), np.iinfo(np.int64).min, np.int64)
    i = 0
    while i < len(lo):
        if lengths[i] >= _SLICE_CHUNK:
            out[i] = metrics.measure(start[lo[i] : hi[i]], end[lo[i] : hi[i]], int(after[i]))
            i += 1
            continue
        j = i + max(1, int(np.searchsorted(np.cumsum(lengths[i:]), _SLICE_CHUNK, side="right")))
        j = min(j, len(lo))
        big = np.flatnonzero(lengths[i:j] >= _SLICE_CHUNK)
        if len(big):
            j = i + int(big[0])
        out[i:j] = _gathered_measures(start, end, lo[i:j], lengths[i:j], after[i:j])
        i = j
    return out


def _gathered_measures(
    start: np.ndarray, end: np.ndarray, lo: np.ndarray, lengths: np.ndarray, after: np.ndarray
) -> np.ndarray:
    seg = np.repeat(np.arange(len(lo)), lengths)
    first = np.cumsum(lengths) - lengths
    idx = np.arange(int(lengths.sum())) - np.repeat(first, lengths) + np.repeat(lo, lengths)
    s, e = start[idx], end[idx]
    order = np.lexsort((s, seg))
    s, e = s[order], e[order]
    e[first] = np.maximum(e[first], after)  # each slice's running max starts from its carry
    # running max of ends that restarts at each slice: shift each slice so it lies above the previous one
    base = np.minimum(s.min(), e.min())
    width = int(np.maximum(s.max(), e.max())) - int(base) + 1
    if width * (len(lo) + 1) >= 2**62:
        return np.array(
            [
                metrics.measure(s[a : a + n], e[a : a + n], int(c))
                for a, n, c in zip(first, lengths, after, strict=True)
            ],
            dtype=np.int64,
        )
    shift = seg * np.int64(width)
    run = np.maximum.accumulate(e - base + shift) - shift + base
    prev = np.empty_like(run)
    prev[1:] = run[:-1]
    prev[first] = after
    gain = run - np.maximum(s, prev)  # no clamp: telescopes to union_intervals' block sums exactly
    return np.add.reduceat(gain, first)
