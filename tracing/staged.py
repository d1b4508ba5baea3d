"""A file's large tables leave its worker as staged files, so the command holds summaries, not every rank's rows.

``mxperf ingest`` over many ranks gathered every file's range, kernel and stream tables in the driver (pickled
back from pool and Ray workers) before writing each as one concatenated table: memory grew with the ranks and
their sizes (64 ranks of 100 k ranges each hold ~2 GB of rows there). Now a worker writes each of those tables
that has :data:`STAGE_ROWS` rows or more beside its staged events and keeps what the command prints (the range
count, seconds per phase); the command writes each output table a part at a time::

    worker:  FileResult --(stage_tables)--> OUT/.staging/.ranges-<i>.pkl (.kernels-<i>, .streams-<i>), for tables
                                            of STAGE_ROWS rows or more; num_ranges, phase_seconds kept
             a streamed file's range table of STAGE_ROWS ranges or more goes there as it is made, a part of
             STAGE_ROWS ranges at a time (part_file; tracing.streamed): never whole in the worker either
    driver:  table_parts: small tables gathered up to STAGE_ROWS rows, staged ones read back a part at a time
             --(store.write_table_parts: a row group per part)--> ranges.parquet, kernels.parquet, streams.parquet

Small tables stay in the result (staging a 100-row table costs more than it saves), so a set of small ranks
writes its tables exactly as before, in one part. The staged files are pickles (pandas frames one after another:
written and read back by the same installation, and removed with the staging folder), ~6x cheaper than Parquet
for a table that is written out again anyway. Same rows, columns, order and dtypes as the concatenation
(``tests/integration/test_staged_tables.py``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
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
STAGE_ROWS = 1 << 16  # a table this long leaves its worker as a file; also the rows of one written part


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
    """Write ``result``'s range, kernel and stream tables of :data:`STAGE_ROWS` rows or more to ``stage_dir`` and
    empty them in ``result``; keep its range count and seconds per phase. Nothing happens without ``stage_dir``."""
    if stage_dir is None:
        return result
    if result.num_ranges is None:  # a streamed file's ranges may have left already (staged_path)
        result.num_ranges = len(result.ranges)
        result.phase_seconds = phase_seconds(result.ranges)
    for attr in STAGED:
        df = getattr(result, attr)
        if len(df) < STAGE_ROWS or attr in result.staged_tables:
            continue
        path = staged_path(stage_dir, attr, index)
        with part_file(path) as add:
            add(df)
        result.staged_tables[attr] = str(path)
        setattr(result, attr, df.iloc[:0].copy())
    return result


def staged_path(stage_dir: str, attr: str, index: int) -> Path:
    """Where file ``index``'s table ``attr`` is staged."""
    return Path(stage_dir) / f".{attr}-{index}.pkl"


@contextmanager
def part_file(path: str | Path) -> Iterator[Callable[[pd.DataFrame], None]]:
    """A staged table written a part at a time (``add(part)``; read back a part at a time by
    :func:`table_parts`): the streamed path writes its range table so, never holding all of it. The file is
    removed if the writing fails."""
    with open(path, "wb") as fh:
        try:
            yield lambda df: pickle.dump(df, fh, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            fh.close()
            Path(path).unlink(missing_ok=True)
            raise


def _read_parts(path: str) -> Iterator[pd.DataFrame]:
    with open(path, "rb") as fh:
        while True:
            try:
                yield pickle.load(fh)
            except EOFError:
                return


def table_parts(
    results: list[FileResult], attr: str, name: str, cols: Mapping[str, str]
) -> Iterator[pd.DataFrame]:
    """One output table's rows in file order, conformed, a part at a time: the tables the results hold,
    gathered up to :data:`STAGE_ROWS` rows, and each staged table read back on its own. Empty parts are skipped."""
    held: list[pd.DataFrame] = []
    rows = 0
    for r in results:
        path = r.staged_tables.get(attr)
        if path is None:
            df = getattr(r, attr)
            if len(df):
                held.append(df)
                rows += len(df)
            if rows < STAGE_ROWS:
                continue
        if held:
            yield schema.conform(pd.concat(held, ignore_index=True), cols, name)
            held, rows = [], 0
        if path is not None:
            for part in _read_parts(path):
                yield schema.conform(part, cols, name)
    if held:
        yield schema.conform(pd.concat(held, ignore_index=True), cols, name)
