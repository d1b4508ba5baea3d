"""Micro-batch detection over host items streamed in (process, start) order: one detection window at a time.

The same cuts as :func:`tracing.analysis.microbatches.find_microbatches` (same jobs, same
:func:`~tracing.analysis.microbatches.run_job`, same table), but the host items (``cpu_op``, launch calls,
``emit_nvtx`` op ranges) are never all in memory: every cut reads only the host items inside its window
(an explicit range, a phase range, a ``ProfilerStep``, or a whole process that has no ranges), so memory
is bounded by the largest window, not by the trace. GPU launches are read the same way (``opwindows.Launches``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracing.analysis import mbregions, metrics
from tracing.analysis.mbdetect import Finding
from tracing.analysis.mbsignals import Signals, make_process, name_signals
from tracing.analysis.microbatches import (
    MicrobatchResult,
    microbatch_result,
    plan_jobs,
    run_job,
    with_steps,
)
from tracing.analysis.opwindows import LAUNCH_SIGNALS, Launches
from tracing.outputs.labels import Labels

HOST_COLUMNS = ("pid", "start", "rid", "tid", "end", "code", "shape", "is_call")
_PROCESS_HOST_COLUMNS = ("tid", "start", "end", "code", "shape", "is_call")
# a window's host columns that fit smaller types (codes, a flag): 33 bytes an item, not 48
_HOST_DTYPES = {"code": np.dtype(np.int32), "shape": np.dtype(np.int32), "is_call": np.dtype(bool)}


@dataclass
class HostStats:
    """What a pass over a process's host items (code >= 0) keeps for its whole-process region."""

    first_ns: int | None = None
    last_ns: int | None = None
    tids: Counter = field(default_factory=Counter)

    def add(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        if len(start) == 0:
            return
        lo, hi = int(start.min()), int(end.max())
        self.first_ns = lo if self.first_ns is None else min(self.first_ns, lo)
        self.last_ns = hi if self.last_ns is None else max(self.last_ns, hi)
        values, counts = np.unique(tid, return_counts=True)
        self.tids.update(dict(zip(values.tolist(), counts.tolist(), strict=True)))


def find_microbatches_streamed(
    names: list[str],
    shape_cats: list[str],
    host_chunks: Iterable[dict[str, np.ndarray]],
    host_pids: set[int],
    stats: dict[int, HostStats],
    optimizer: dict[int, tuple[np.ndarray, np.ndarray]],
    ranges: pd.DataFrame,
    launches: Launches,
    num_ops: int,
    kernels: pd.DataFrame,
    labels: Labels | None,
    pattern: str | None,
    rank: int | None,
    fmt: str,
    timelines: list[metrics.DeviceTimeline],
) -> MicrobatchResult:
    """The micro-batch table of one trace from its host items in (pid, start, row) order and its launches in
    (pid, launch start, row) order (``launches``, on disk: of the trace's ``num_ops`` GPU ops).

    ``host_pids``: processes with any host item; ``stats``: per process, over its host items with a name;
    ``optimizer``: per process, its optimizer ranges' (start, end) sorted by start."""
    labels = labels or Labels()
    pids = host_pids | launches.pids
    base = name_signals(names, shape_cats)
    no_opt = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def whole(pid: int) -> mbregions.Region | None:
        st = stats.get(pid)
        if st is None or st.first_ns is None:
            return None
        counts = launches.tids.get(pid) or st.tids
        top = max(counts.values())
        tid = min(t for t, k in counts.items() if k == top)  # np.unique + argmax: the smallest of the most
        assert st.last_ns is not None
        return mbregions.Region(pid, int(tid), None, st.first_ns, st.last_ns, -1, "")

    jobs, regions, steps = plan_jobs(pids, whole, ranges, pattern, False)
    findings: list[Finding | None] = [None] * len(jobs)
    # a window's rows carry only what make_process reads (no pid or row id: a whole-process window of an
    # NVTX-heavy export has millions of rows)
    host_window = _Window(iter(host_chunks), _PROCESS_HOST_COLUMNS, "start", _HOST_DTYPES)
    launch_window = _Window(launches.chunks(), LAUNCH_SIGNALS, "l_start")
    todo = sorted(
        (k for k, j in enumerate(jobs) if j.done is None and j.pid in pids),
        key=lambda k: (jobs[k].pid, jobs[k].lo, jobs[k].hi),
    )
    for i, k in enumerate(todo):
        job = jobs[k]
        # where the next window starts: held rows before it are not needed after this one
        after = (jobs[todo[i + 1]].pid, jobs[todo[i + 1]].lo) if i + 1 < len(todo) else _END
        # each window's chunks that no later window reads go as soon as its rows are out, not after the cut
        host = host_window.items(job.pid, job.lo, job.hi, after)
        host_window.release(*after)
        # every launch a cut reads starts inside its region (mbdetect): the window's launches are enough
        mine = launch_window.items(job.pid, job.lo, job.hi, after)
        launch_window.release(*after)
        lau = mine if len(mine["l_start"]) else None
        process = make_process(job.pid, host, lau, *optimizer.get(job.pid, no_opt))
        del host, mine, lau
        findings[k] = run_job(_with(base, {job.pid: process}), job)
        del process
    for k, job in enumerate(jobs):  # a process with no host items and no launches: no signals at all
        if findings[k] is None:
            findings[k] = run_job(base, job)
    done = with_steps([f for f in findings if f is not None], regions, steps)
    return microbatch_result(done, launches.gpu_ends, kernels, num_ops > 0, labels, rank, fmt, timelines)


def _with(base: Signals, processes: dict) -> Signals:
    return Signals(
        base.names,
        base.base,
        base.is_embedding,
        base.gemm_arg,
        base.is_autograd,
        base.is_sync,
        base.shapes,
        processes,
    )


class _Window:
    """Chunks sorted by (pid, ``start``), pulled on demand; what no later window needs is dropped. A window's
    rows come back with ``columns`` only, those in ``dtypes`` in those types (converted as a chunk is pulled)."""

    def __init__(
        self,
        chunks: Iterator[dict[str, np.ndarray]],
        columns: Iterable[str],
        start: str,
        dtypes: dict[str, np.dtype] | None = None,
    ) -> None:
        self._it = chunks
        self._columns = tuple(columns)
        self._start = start
        self._dtypes = dtypes or {}
        self._parts: list[dict[str, np.ndarray]] = []
        self._lasts: list[tuple[int, int]] = []  # each held chunk's last (pid, start)
        self._done = False

    def items(self, pid: int, lo: int, hi: int, after: tuple[int, int] = (0, 0)) -> dict[str, np.ndarray]:
        """Rows of ``pid`` whose start lies in [lo, hi], sorted by (start, row). Held chunks that end before
        ``after`` (where the next window starts) are freed a column at a time as the rows are copied out, so a
        large window is not held twice."""
        while not self._done and (not self._parts or self._lasts[-1] <= (pid, hi)):
            chunk = next(self._it, None)
            if chunk is None:
                self._done = True
            elif len(chunk["pid"]):  # held: the columns a window or the search reads, in their types
                keep = dict.fromkeys(("pid", self._start, *self._columns))
                self._parts.append(
                    {c: chunk[c].astype(self._dtypes.get(c, chunk[c].dtype), copy=False) for c in keep}
                )
                self._lasts.append((int(chunk["pid"][-1]), int(chunk[self._start][-1])))
        self.release(pid, lo)
        pieces = []  # each held chunk's rows of pid in [lo, hi] (a contiguous slice: chunks are sorted)
        for k, p in enumerate(self._parts):
            a, b = np.searchsorted(p["pid"], [pid, pid + 1])
            s = p[self._start][a:b]
            i, j = a + np.searchsorted(s, lo, side="left"), a + np.searchsorted(s, hi, side="right")
            if j > i:
                pieces.append((p, i, j, self._lasts[k] < after))
        if len(pieces) == 1:
            p, i, j, _ = pieces[0]
            return {c: p[c][i:j] for c in self._columns}
        if not pieces:
            return {
                c: np.zeros(0, self._dtypes.get(c, bool if c in _FLAGS else np.int64)) for c in self._columns
            }
        out = {}
        for c in self._columns:
            out[c] = np.concatenate([p[c][i:j] for p, i, j, _ in pieces])
            for p, _, _, spent in pieces:
                if spent and c not in ("pid", self._start):  # kept: release() and the search read them
                    del p[c]
        return out

    def release(self, pid: int, lo: int) -> None:
        """Drop the chunks that end before (pid, lo)."""
        while self._parts and self._lasts[0] < (pid, lo):
            self._parts.pop(0)
            self._lasts.pop(0)


_END = (np.iinfo(np.int64).max, np.iinfo(np.int64).max)
_FLAGS = ("l_kernel", "l_gemm")
