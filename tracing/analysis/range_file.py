"""A streamed file's range columns on disk in table order, made and read a slab at a time: none held per range.

    pass 1:  range rows --(SortedRuns by (start, -end, row): the table's order)--> sorted runs (disk)
    build:   the runs merged, a slab at a time --> parent and depth (attribution.Nesting: each thread's open
             ranges carried), each name's slot (attribution.NameValues: a distinct name's values made once), the
             rows range_summary keeps (range_summary.Needed) --> one row file (disk, :data:`COLUMNS`)
    read:    slabs (range_ops.RangeOps), pids and ends (window ends), parts of the table (attribution.table_parts)

Held: per distinct name its values and three flags, per process whether its first (user) range came, each
thread's open ranges while building, and the ancestors of micro-batch phase ranges (a few chains).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracing.analysis import attribution, metrics
from tracing.analysis.attribution import Coded, NameValues, Nesting
from tracing.analysis.phases import PhaseMap
from tracing.analysis.range_summary import Needed
from tracing.ingest.spill import RowFile, read_blocks

SPILL_COLUMNS = ("start", "negend", "rid", "name", "domain", "pid", "tid")  # pass 1's range rows
SPILL_KEYS = ("start", "negend", "rid")  # start ascending, end descending, then row order
COLUMNS = ("slot", "domain", "pid", "tid", "start_ns", "end_ns", "parent", "depth", "keep")


def spill_rows(c: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Decoded rows ``rows`` (a mask) of a chunk (``rid``, ``name`` and ``domain`` codes, ``pid``, ``tid``,
    ``start_ns``, ``dur_ns``) as :data:`SPILL_COLUMNS`."""
    start = c["start_ns"][rows]
    return {
        "start": start,
        "negend": -(start + c["dur_ns"][rows]),
        "rid": c["rid"][rows],
        "name": c["name"][rows],
        "domain": c["domain"][rows],
        "pid": c["pid"][rows],
        "tid": c["tid"][rows],
    }


class RangeFile:
    """The range columns of ``n`` ranges in ``path`` (:meth:`build`); an ``attribution.RangeSource``."""

    def __init__(
        self, path: Path, n: int, source: str, values: NameValues, domains: list[str], ancestors: np.ndarray
    ) -> None:
        self.path, self.n, self.source = path, n, source
        self.values, self.domains = values, domains
        self.ancestors = ancestors  # sorted indices of ranges needed as ancestors (range_summary)
        self.part_keep = np.zeros(0, bool)  # the rows of the part last made that range_summary keeps

    @classmethod
    def build(
        cls,
        chunks: Iterator[dict[str, np.ndarray]],
        path: Path,
        base_ns: int,
        names: list[str],
        domains: list[str],
        source: str,
        phase_map: PhaseMap,
        pattern: str | None,
    ) -> RangeFile:
        """From pass 1's range rows (:data:`SPILL_COLUMNS`, relative times) merged in :data:`SPILL_KEYS` order;
        ``names`` / ``domains``: what their codes index (-1: none, as ``attribution.coded_range_columns``)."""
        values = NameValues(phase_map)
        slot_of = np.full(len(names) + 1, -1, attribution.index_dtype(len(names) + 1))  # per code: slot
        domain_values = [*domains, ""]
        needed = Needed(pattern, domain_values)
        nesting = Nesting()
        out = RowFile(path, COLUMNS)
        try:
            for c in chunks:
                code = np.where(c["name"] < 0, len(names), c["name"])
                new = np.unique(code[slot_of[code] < 0])
                if len(new):
                    k = len(values.names)
                    slot_of[new] = np.arange(k, k + len(new))
                    for i in new.tolist():
                        values.add(names[i] if i < len(names) else "")
                    needed.add_names(values.names[k:], values.phases[k:])
                slot = slot_of[code]
                domain = np.where(c["domain"] < 0, len(domains), c["domain"])
                start = c["start"] + np.int64(base_ns)
                end = np.int64(base_ns) - c["negend"]
                keep, mark = needed.block(slot, domain, c["pid"])
                parent, depth = nesting.add(c["pid"], c["tid"], start, end, mark)
                out.add(
                    {
                        "slot": slot,
                        "domain": domain,
                        "pid": c["pid"],
                        "tid": c["tid"],
                        "start_ns": start,
                        "end_ns": end,
                        "parent": parent,
                        "depth": depth,
                        "keep": keep,
                    }
                )
        finally:
            out.close()
        ancestors = np.unique(np.array(nesting.marked, np.int64))
        return cls(out.path, nesting.n, source, values, domain_values, ancestors)

    def __len__(self) -> int:
        return self.n

    def _blocks(self, rows: int) -> Iterator[dict[str, np.ndarray]]:
        return read_blocks(self.path, COLUMNS, rows) if self.n else iter(())

    def slabs(self, rows: int) -> Iterator[dict[str, np.ndarray]]:
        """The ranges' pid, tid, start and end, ``rows`` at a time (``range_ops.RangeOps``)."""
        for b in self._blocks(rows):
            yield {k: b[k] for k in ("pid", "tid", "start_ns", "end_ns")}

    def ends(self, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for b in self._blocks(rows):
            yield b["pid"], b["end_ns"]

    def parts(self, rows: int) -> Iterator[dict[str, Any]]:
        for a, b in zip(itertools.count(0, rows), self._blocks(rows)):
            yield self._part(a, b)
        if not self.n:
            yield self._part(0, {c: np.zeros(0, np.int64) for c in COLUMNS})

    def _part(self, a: int, b: dict[str, np.ndarray]) -> dict[str, Any]:
        """Ranges [a, a + len(b)) as ``attribution.range_columns`` has them; :attr:`part_keep`: which of them
        ``range_summary`` keeps."""
        i, j = np.searchsorted(self.ancestors, [a, a + len(b["keep"])])
        self.part_keep = b["keep"].astype(bool)
        self.part_keep[self.ancestors[i:j] - a] = True
        v, n, slot = self.values, len(b["keep"]), b["slot"]
        cols = {
            "source": self.source,
            "range_id": range(a, a + n),
            "parent_id": b["parent"],
            "depth": b["depth"],
            "name": Coded(v.names, slot),
            "domain": Coded(self.domains, b["domain"]),
            "phase": Coded(v.phases, slot),
            "pid": b["pid"],
            "tid": b["tid"],
            "start_ns": b["start_ns"],
            "end_ns": b["end_ns"],
            "attrs": Coded(v.attrs, slot),
        }
        return attribution.used_rows(cols, 0, n)  # each coded column with the values its rows use

    def table(
        self,
        rows: int,
        partials: attribution.Counters | None,
        timelines: list[metrics.DeviceTimeline],
    ) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
        """The range table (``attribution.table_parts``) a part of ``rows`` ranges at a time, each with the rows
        of it that ``range_summary`` keeps (a mask)."""
        for part in attribution.table_parts(self, rows, partials, timelines):
            yield part, self.part_keep  # table_parts makes a part's table right after reading the part
