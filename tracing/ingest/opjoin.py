"""The GPU-op launch join out of core: every op with its launch record, in bounded memory.

Why: a GPU-heavy trace holds tens of millions of kernels and copies; concatenating them to join them with
their launch calls costs ~100 bytes an op. Both sides are put in (pid, correlation) key order on disk and
merged a chunk at a time, and the joined rows are spilled again to come back in (start_ns, rid) order::

    ops (RowFile, rid order) --(base time, fix, key)--> key runs (correlation >= 0) | output runs (< 0)
    key runs (merged) x launches (merged, first record of each key) --(merge join)--> output runs
    output runs (merged) --> ops in (start_ns, rid) order

Held in memory: one op chunk, one launch chunk, the merge blocks of both run sets, and one output run buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracing.ingest.spill import RowFile, SortedRuns
from tracing.outputs import schema

JOINED_COLUMNS = (
    "start_ns",
    "rid",
    "kind",
    "name",
    "pid",
    "device",
    "stream",
    "dur_ns",
    "correlation",
    "launch_start_ns",
    "launch_end_ns",
    "launch_tid",
)
_KEYED_COLUMNS = ("key", *JOINED_COLUMNS[:9])
# SortedRuns breaks ties of all but its last key by arrival order, which the join (key order) does not keep
# in rid order: rid is named twice so that the runs are lexsorted on (start_ns, rid) itself.
_OUT_KEYS = ("start_ns", "rid", "rid")


def launch_key(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """The (pid, correlation) join key of a GPU op and its launch call (``metrics.gpu_ops``): CUPTI
    correlation ids are uint32 and pids fit 32 bits, so both pack into one sortable uint64."""
    return (pid.astype(np.int64).astype(np.uint64) << np.uint64(32)) | (
        corr.astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    )


@dataclass
class Joined:
    """The joined ops on disk (:func:`joined_ops`) and the largest start - launch start of any of them."""

    runs: SortedRuns
    max_lag: int | None  # None: no op has a launch record

    @property
    def rows(self) -> int:
        return self.runs.rows

    def merged(self, chunk_rows: int) -> Iterator[dict[str, np.ndarray]]:
        return self.runs.merged(chunk_rows)

    def close(self) -> None:
        self.runs.close()


def joined_ops(
    ops: RowFile,
    launches: SortedRuns,
    base_ns: int,
    fix: Callable[[dict[str, np.ndarray]], None],
    directory: Path,
    run_rows: int,
    chunk_rows: int,
) -> Joined:
    """Every GPU op row of `ops` (a RowFile with streamed.OP_COLUMNS, relative times) with base_ns added to
    start_ns, `fix` applied, joined with its first launch record, returned as sorted runs (columns
    JOINED_COLUMNS, keys ("start_ns", "rid"), rid repeated as the tie-breaker) whose merged() gives the ops
    in (start_ns, rid) order, with the largest lag from a launch to its op's start (which bounds how early
    an op still to come in that order was launched: ``tracing.analysis.range_ops``).

    ``launches`` has ``streamed.LAUNCH_COLUMNS`` sorted by ("key", "rid"); an op without a correlation or
    without a launch of its key gets ``schema.NO_ID`` launch columns. Spill files live in ``directory``;
    the intermediate runs are removed here, the returned ones by its ``close()``."""
    out = SortedRuns(directory, JOINED_COLUMNS, _OUT_KEYS, run_rows)
    keyed = SortedRuns(directory, _KEYED_COLUMNS, ("key", "rid"), run_rows)
    lag: int | None = None
    try:
        for block in ops.blocks(chunk_rows):
            block["start_ns"] = block["start_ns"] + np.int64(base_ns)
            fix(block)
            has = block["correlation"] >= 0
            out.add(_unmatched({c: v[~has] for c, v in block.items()}))
            block = {c: v[has] for c, v in block.items()}
            block["key"] = launch_key(block["pid"], block["correlation"]).view(np.int64)
            keyed.add(block)
        first = _first_launches(launches.merged(chunk_rows))
        launch = next(first, None)
        for chunk in keyed.merged(chunk_rows):
            while len(chunk["key"]):
                if launch is None:  # no launch left: no key of these ops has one
                    out.add(_unmatched(chunk))
                    break
                # ops whose key is <= the chunk's last launch key: any launch of theirs is in it (or none is)
                n = int(np.searchsorted(chunk["key"], launch["key"][-1], side="right"))
                if n:
                    joined = _join({c: v[:n] for c, v in chunk.items()}, launch, base_ns)
                    lag = _max_lag(joined, lag)
                    out.add(joined)
                    chunk = {c: v[n:] for c, v in chunk.items()}
                if len(chunk["key"]):
                    launch = next(first, None)
    except BaseException:
        out.close()
        raise
    finally:
        keyed.close()
    return Joined(out, lag)


def _max_lag(ops: dict[str, np.ndarray], lag: int | None) -> int | None:
    launched = ops["launch_start_ns"] != schema.NO_ID
    if not launched.any():
        return lag
    top = int((ops["start_ns"][launched] - ops["launch_start_ns"][launched]).max())
    return top if lag is None else max(lag, top)


def _first_launches(chunks: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """The first launch record of each key (chunks in (key, rid) order), non-empty chunks of unique keys.

    A key's records may straddle chunks: its first is in the earlier chunk, where the join resolves every op
    of that key (ops with keys <= a chunk's last key are joined before the next chunk is read)."""
    last: int | None = None
    for chunk in chunks:
        k = chunk["key"]
        if len(k) == 0:
            continue
        first = np.r_[True, k[1:] != k[:-1]]
        if last is not None:
            first[0] = k[0] != last
        last = int(k[-1])
        if first.any():
            yield {c: chunk[c][first] for c in ("key", "start", "dur", "tid")}


def _join(ops: dict[str, np.ndarray], launch: dict[str, np.ndarray], base_ns: int) -> dict[str, np.ndarray]:
    """Ops (sorted by key, each key <= the launch chunk's last) with the launch columns of their key."""
    lk = launch["key"]
    pos = np.searchsorted(lk, ops["key"])
    pos = np.minimum(pos, len(lk) - 1)
    hit = lk[pos] == ops["key"]
    start = launch["start"][pos] + np.int64(base_ns)
    ops["launch_start_ns"] = np.where(hit, start, schema.NO_ID)
    ops["launch_end_ns"] = np.where(hit, start + launch["dur"][pos], schema.NO_ID)
    ops["launch_tid"] = np.where(hit, launch["tid"][pos], schema.NO_ID)
    return ops


def _unmatched(ops: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = len(ops["rid"])
    for c in ("launch_start_ns", "launch_end_ns", "launch_tid"):
        ops[c] = np.full(n, schema.NO_ID, np.int64)
    return ops
