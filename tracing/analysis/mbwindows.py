"""Micro-batch detection over a streamed trace's host items and launches, kept on disk.

The same cuts as :func:`tracing.analysis.microbatches.find_microbatches` (same jobs, same
:func:`~tracing.analysis.microbatches.run_job`, same :func:`~tracing.analysis.mbdetect.cut_region`, same
table), but the host items (``cpu_op``, launch calls, ``emit_nvtx`` op ranges) and GPU launches are never in
memory: they are written once, per process in start order, to column files (``ingest.columnfiles``), and each
cut reads its region a block at a time and each micro-batch's neighbourhood as it needs it
(:class:`StoredProcess`). What is held is a block and a few values per forward pass and per backward burst
-- not the region, which is a whole process when the trace has no ranges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tracing.analysis import mbregions, metrics
from tracing.analysis.mbsignals import HOST_FIELDS, LAUNCH_FIELDS, Process, name_signals
from tracing.analysis.microbatches import (
    MicrobatchResult,
    microbatch_result,
    plan_jobs,
    run_job,
    with_steps,
)
from tracing.analysis.opwindows import Launches
from tracing.ingest.columnfiles import ColumnFiles
from tracing.outputs.labels import Labels

HOST_COLUMNS = ("pid", "start", "rid", "tid", "end", "code", "shape", "is_call")
# on disk, in the types detection reads them in (codes, a flag): 33 bytes a host item, 34 a launch
_I64, _I32, _BOOL = np.dtype(np.int64), np.dtype(np.int32), np.dtype(bool)
_HOST_DTYPES = dict(zip(HOST_FIELDS, (_I64, _I64, _I64, _I32, _I32, _BOOL), strict=True))
_LAUNCH_DTYPES = dict(zip(LAUNCH_FIELDS, (_I64, _I64, _I64, _I64, _BOOL, _BOOL), strict=True))


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
    folder: Path,
) -> MicrobatchResult:
    """The micro-batch table of one trace from its host items in (pid, start, row) order and its launches in
    (pid, launch start, row) order (``launches``, on disk: of the trace's ``num_ops`` GPU ops); ``folder``: where
    their column files go (removed before this returns).

    ``host_pids``: processes with any host item; ``stats``: per process, over its host items with a name;
    ``optimizer``: per process, its optimizer ranges' (start, end) sorted by start."""
    labels = labels or Labels()
    pids = host_pids | launches.pids
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
    host = ColumnFiles(folder / "host-items", _HOST_DTYPES, "pid", "start")
    lau = ColumnFiles(folder / "launches", _LAUNCH_DTYPES, "pid", "l_start")
    try:
        for c in host_chunks:
            host.append(
                {**c, "shape": np.maximum(c["shape"], 0), "is_launch_call": c["is_call"]}  # as make_process
            )
        for c in launches.chunks():
            lau.append(c)
        host.finish(), lau.finish()
        sig = name_signals(names, shape_cats)
        # a process with no host items and no launches has none here: no signals at all
        sig.processes = {p: StoredProcess(p, host, lau, *optimizer.get(p, no_opt)) for p in pids}
        findings = [run_job(sig, j) for j in jobs]
    finally:
        host.close(), lau.close()
    done = with_steps(findings, regions, steps)
    return microbatch_result(done, launches.gpu_ends, kernels, num_ops > 0, labels, rank, fmt, timelines)


class StoredProcess:
    """One process's host items and launches in column files (``mbsignals.Items``): a region is read a block
    at a time, a window is read into a :class:`~tracing.analysis.mbsignals.Process`."""

    def __init__(
        self, pid: int, host: ColumnFiles, launches: ColumnFiles, opt_start: np.ndarray, opt_end: np.ndarray
    ) -> None:
        self.pid = pid
        self._host, self._launches = host, launches
        self.opt_start, self.opt_end = opt_start, opt_end

    def host_blocks(
        self, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        return self._host.blocks(self._host.find(self.pid, lo, hi), columns, size)

    def launch_blocks(
        self, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        return self._launches.blocks(self._launches.find(self.pid, lo, hi), columns, size)

    def window(self, lo: int, hi: int) -> Process:
        h = self._host.read(self._host.find(self.pid, lo, hi), HOST_FIELDS)
        la = self._launches.read(self._launches.find(self.pid, lo, hi), LAUNCH_FIELDS)
        return Process(self.pid, **h, **la, opt_start=self.opt_start, opt_end=self.opt_end)
