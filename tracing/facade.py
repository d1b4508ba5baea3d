"""The notebook facade: ``tracing.open(path)`` -> one object with every table of a trace or an ingest folder.

    t = tracing.open("rank-0.json.gz")   # a Kineto / nsys / range-log file: read once, tables computed lazily
    t = tracing.open("runs/ing")         # an ``mxperf ingest`` folder: its finished Parquet tables
    t.devices(); t.ranges(); t.kernels(); t.steps(); t.microbatches(); t.events()

Like HTA's ``TraceAnalysis`` but with no plotting and no side effects: every method returns a new DataFrame
(the same tables ``mxperf ingest`` writes, with the same columns), nothing is written anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tracing.outputs import schema, store
from tracing.outputs.errors import InputError
from tracing.outputs.labels import Labels


@dataclass
class TraceTables:
    """Tables of one trace file or one ingest folder (see :func:`open`)."""

    path: Path
    labels: Labels = field(default_factory=Labels)
    phase_map: str | None = None
    _tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    _trace: Any = field(default=None, repr=False)

    @property
    def is_folder(self) -> bool:
        """An ``mxperf ingest`` output (a run folder is read as a trace: its range log and traces)."""
        manifest = self.path / store.MANIFEST
        return self.path.is_dir() and manifest.is_file() and store.read_json(manifest).get("kind") == "ingest"

    def _analyzed(self) -> dict[str, pd.DataFrame]:
        if not self._tables:
            from tracing.analysis.phases import default_phase_map, load_phase_map
            from tracing.ingest.detect import load_trace
            from tracing.jobs import analyze

            self._trace = load_trace(self.path)
            pm = load_phase_map(self.phase_map) if self.phase_map else default_phase_map()
            self._tables = analyze(self._trace, pm, self.labels)
        return self._tables

    def _table(self, key: str, name: str, columns: dict[str, str]) -> pd.DataFrame:
        """A folder's ``name`` (empty when it has none), else the trace's analyzed table ``key``."""
        if self.is_folder:
            f = self.path / name
            return store.read_table(f) if f.is_file() else schema.empty_frame(columns)
        return self._analyzed()[key].copy()

    def devices(self) -> pd.DataFrame:
        """Per (process, device): span, busy, idle, host stall (``schema.DEVICE_COLUMNS``)."""
        return self._table("devices", store.DEVICES, schema.DEVICE_COLUMNS)

    def streams(self) -> pd.DataFrame:
        """HTA-style idle breakdown per (device, stream) (``schema.STREAM_COLUMNS``)."""
        return self._table("streams", store.STREAMS, schema.STREAM_COLUMNS)

    def ranges(self) -> pd.DataFrame:
        """Every range with its phase and attributed GPU work (``schema.RANGE_COLUMNS``)."""
        return self._table("ranges", store.RANGES, schema.RANGE_COLUMNS)

    def kernels(self) -> pd.DataFrame:
        """Per kernel name: count, total time, class (``schema.KERNEL_COLUMNS``)."""
        return self._table("kernels", store.KERNELS, schema.KERNEL_COLUMNS)

    def steps(self) -> pd.DataFrame:
        """Seconds per (rank, process, step, phase) (``schema.STEP_COLUMNS``)."""
        return self._table("steps", store.STEPS, schema.STEP_COLUMNS)

    def microbatches(self) -> pd.DataFrame:
        """The micro-batch table (``schema.MICROBATCH_COLUMNS``) the cost model fits: for a trace file, the
        micro-batches found in it (explicit ranges, else detected; ``labels`` fill what it cannot say)."""
        return self._table("microbatches", store.MICROBATCHES, schema.MICROBATCH_COLUMNS)

    def events(self) -> pd.DataFrame:
        """The normalized event table (``schema.EVENT_COLUMNS``); a folder's ranks concatenated."""
        if self.is_folder:
            files = sorted((self.path / store.EVENTS_DIR).glob("*.parquet"))
            if not files:
                return schema.empty_frame(schema.EVENT_COLUMNS)
            return pd.concat([store.read_table(f) for f in files], ignore_index=True)
        self._analyzed()
        return self._trace.events.copy()


def open(
    path: str | os.PathLike[str], *, labels: Labels | None = None, phase_map: str | None = None
) -> TraceTables:
    """A trace file (Kineto JSON, nsys SQLite, mxperf range log / run folder) or an ``mxperf ingest`` folder."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    return TraceTables(path=p, labels=labels or Labels(), phase_map=phase_map)
