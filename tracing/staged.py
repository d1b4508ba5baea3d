"""A file's large tables leave its worker as staged Parquet, so the command holds summaries, not every rank's rows.

``mxperf ingest`` over hundreds of ranks gathered every file's range, kernel and stream tables in the driver
(pickled back from pool and Ray workers) before writing each as one concatenated table: memory grew with the
rank count. Now each worker writes those tables beside its staged events and keeps what the command prints
(the range count, seconds per phase); the command writes each output table one file's part at a time::

    worker:  FileResult --(stage_tables)--> OUT/.staging/.ranges-<i>.parquet, .kernels-<i>, .streams-<i>
                                            result.ranges / .kernels / .streams emptied; num_ranges, phase_seconds
    driver:  table_parts(results, "ranges", ...) --(store.write_table_parts: a row group per file)--> ranges.parquet

Same rows, columns, order and dtypes as the concatenation (``tests/integration/test_staged_tables.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from tracing.analysis.metrics import measure
from tracing.outputs import schema, store

if TYPE_CHECKING:
    from tracing.jobs import FileResult

# FileResult attribute -> (output table, its columns)
STAGED: dict[str, tuple[str, Mapping[str, str]]] = {
    "ranges": (store.RANGES, schema.RANGE_COLUMNS),
    "kernels": (store.KERNELS, schema.KERNEL_COLUMNS),
    "streams": (store.STREAMS, schema.STREAM_COLUMNS),
}


def phase_seconds(ranges: pd.DataFrame) -> dict[str, float]:
    """Wall seconds per phase: the union of the phase's ranges on each process, summed over processes."""
    if not len(ranges) or "phase" not in ranges:
        return {}
    out: dict[str, float] = {}
    named = ranges[ranges["phase"].astype(str) != "other"]
    for (phase, _pid), g in named.groupby([named["phase"].astype(str), named["pid"]], sort=True):
        start, end = g["start_ns"].to_numpy("int64"), g["end_ns"].to_numpy("int64")
        out[phase] = out.get(phase, 0.0) + measure(start, end) / 1e9
    return out


def stage_tables(result: FileResult, stage_dir: str | None, index: int) -> FileResult:
    """Write ``result``'s range, kernel and stream tables (conformed to their schema) to ``stage_dir`` and empty
    them in ``result``, keeping its range count and seconds per phase. Nothing happens without ``stage_dir``."""
    if stage_dir is None:
        return result
    result.num_ranges = len(result.ranges)
    result.phase_seconds = phase_seconds(result.ranges)
    for attr, (name, cols) in STAGED.items():
        df = getattr(result, attr)
        if not len(df):
            continue
        path = Path(stage_dir) / f".{attr}-{index}.parquet"
        store.write_table(schema.conform(df, cols, name), path)
        result.staged_tables[attr] = str(path)
        setattr(result, attr, df.iloc[:0].copy())
    return result


def table_parts(
    results: list[FileResult], attr: str, name: str, cols: Mapping[str, str]
) -> Iterator[pd.DataFrame]:
    """Each file's part of one output table, conformed, in file order: read back from its staged Parquet, or
    the table the result holds (a result that was not staged). Empty parts are skipped."""
    for r in results:
        path = r.staged_tables.get(attr)
        df = store.read_table(path) if path is not None else getattr(r, attr)
        if len(df):
            yield schema.conform(df, cols, name)
