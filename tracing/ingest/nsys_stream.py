"""An Nsight Systems SQLite export read a block of rows at a time (``nsys.read_parts``), for ``decoded.decode``
to take as it takes a Kineto file's batches.

What only the whole table knows is kept small and applied afterwards: the emit_nvtx shape codes (one per
distinct range name), the number of processes that ran GPU work (for the rank), and the export's metadata.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tracing.ingest import nsys
from tracing.outputs import schema

_RANGE = schema.EVENT_KINDS.index(schema.RANGE)
_GPU_OPS = [schema.EVENT_KINDS.index(k) for k in schema.GPU_OP_KINDS]


class _Rows:
    """The rows read since the last :meth:`take` (the builder's parts) and the interned names."""

    def __init__(self, b: nsys._Builder) -> None:
        self.b = b

    def __len__(self) -> int:
        return sum(len(p["kind"]) for p in self.b.parts)

    @property
    def names(self) -> list[str]:
        return list(self.b.names)

    @property
    def shapes(self) -> list[str]:
        return [""]  # emit_nvtx shapes are known per name only at the end (NsysDecoder.shape_lut)

    def take(self) -> dict[str, np.ndarray]:
        parts, self.b.parts = self.b.parts, []
        if not parts:
            return {c: np.zeros(0, np.int64) for c in schema.EVENT_COLUMNS if c != "shapes"} | {
                "kind": np.zeros(0, np.int8),
                "name": np.zeros(0, np.int32),
                "domain": np.zeros(0, np.int32),
                "shapes": np.zeros(0, np.int32),
            }
        out = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
        out["shapes"] = np.zeros(len(out["kind"]), np.int32)
        return out


class NsysDecoder:
    """``run()`` yields as rows arrive in ``columns``; then ``finish(rank)`` gives the rank and meta, and
    ``shape_names`` / ``shape_lut`` the emit_nvtx shape categories and each name code's shape code."""

    format = "nsys"

    def __init__(
        self,
        path: str | Path,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.progress = progress  # (bytes, file bytes), estimated from the event rows read so far
        self.con: sqlite3.Connection | None = None
        self.rows: Any = None
        self.tables: dict[str, set[str]] = {}
        self.b = nsys._Builder({})
        self.columns = _Rows(self.b)
        self.skipped = 0
        self.shape_names: list[str] = [""]
        self.shape_lut = np.zeros(0, np.int32)
        # per name code (slot code + 1): a range's name; a byte a name, not a set entry (emit_nvtx: all distinct)
        self._range_names = np.zeros(0, bool)
        self._gpu_pids: set[int] = set()

    @property
    def domains(self) -> list[str]:
        return list(self.b.domains)

    def run(self) -> Iterator[None]:
        self.con = nsys.open_readonly(self.path)
        try:
            with nsys.format_errors(self.path):
                self.rows = nsys.open_rows(self.path)
                self.tables = nsys._tables(self.con)
                self.b = nsys.open_builder(self.path, self.con, self.tables)
                self.columns.b = self.b
                parts = nsys.read_parts(self.path, self.con, self.rows, self.tables, self.b)
                size, total, done = self.path.stat().st_size, self._event_rows(), 0
                for _ in parts:
                    part = self.b.parts[-1]
                    done += len(part["kind"])
                    if self.progress is not None:
                        self.progress(min(size * done // max(total, 1), size), size)
                    kind, name = part["kind"], part["name"]
                    if kind[0] == _RANGE:  # a part holds one kind
                        self._range_names = _marked(self._range_names, np.unique(name))
                    elif kind[0] in _GPU_OPS:
                        self._gpu_pids.update(np.unique(part["pid"]).tolist())
                    yield
            names = list(self.b.names)
            range_codes = np.flatnonzero(self._range_names) - 1  # sorted, -1 (no name) first if seen
            self.shape_names, self.shape_lut = nsys.nvtx_shape_lut(range_codes, names)
        except BaseException:
            self.close()
            raise

    def _event_rows(self) -> int:
        """Rows of the tables events come from (NVTX rows include markers and domains: an upper bound)."""
        assert self.con is not None
        tables = [t for _, t, _, _ in nsys._GPU_TABLES]
        tables += ["CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"]
        return sum(
            self.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables if t in self.tables
        )

    def finish(self, rank: int | None) -> tuple[int | None, dict[str, Any]]:
        """The trace's rank and meta (as the in-memory reader gives them); closes the export."""
        assert self.con is not None
        try:
            with nsys.format_errors(self.path):
                return nsys.report_meta(self.path, self.con, self.tables, self.b, rank, len(self._gpu_pids))
        finally:
            self.close()

    def close(self) -> None:
        if self.rows is not None:
            self.rows.close()
            self.rows = None
        if self.con is not None:
            self.con.close()
            self.con = None


def _marked(mask: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``mask`` (slot c + 1 for name code c, slot 0 for -1) with ``codes`` marked, grown as needed."""
    top = int(codes.max()) + 2 if len(codes) else 0
    if top > len(mask):
        mask = np.concatenate([mask, np.zeros(max(top, 2 * len(mask)) - len(mask), bool)])
    mask[codes + 1] = True
    return mask
