"""A file's large tables leave its worker as staged files, so the command holds summaries, not every rank's rows.

A worker writes each range, kernel and stream table of :data:`STAGE_ROWS` rows or more beside its staged events
(``.ranges-<i>.arrow``, ...) and keeps what the command prints (range count, seconds per phase); the command
writes each output table a part at a time (:func:`table_parts`). Small tables stay in the result: staging a
100-row table costs more than it saves. Staged files are Arrow IPC streams, cheaper than Parquet for a table
written out again anyway. Same rows, columns, order and dtypes as the concatenation (docs/tracing.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis.metrics import measure
from tracing.outputs import schema, store

if TYPE_CHECKING:
    import pyarrow as pa

    from tracing.jobs import FileResult

# FileResult attribute -> (output table, its columns)
STAGED: dict[str, tuple[str, Mapping[str, str]]] = {
    "ranges": (store.RANGES, schema.RANGE_COLUMNS),
    "kernels": (store.KERNELS, schema.KERNEL_COLUMNS),
    "streams": (store.STREAMS, schema.STREAM_COLUMNS),
}
STAGE_ROWS = 1 << 16  # a table this long leaves its worker as a file; also the rows of one written part


def phase_seconds(ranges: pa.Table) -> dict[str, float]:
    """Wall seconds per phase: the union of the phase's ranges on each process, summed over processes."""
    if not len(ranges) or "phase" not in ranges.column_names:
        return {}
    codes, phases = schema.factorize(ranges, "phase")
    pid = ranges.column("pid").to_numpy()
    start, end = (ranges.column(c).to_numpy().astype(np.int64) for c in ("start_ns", "end_ns"))
    out: dict[str, float] = {}
    named = sorted((str(p), k) for k, p in enumerate(phases) if str(p) != "other")
    for phase, k in named:
        mine = codes == k
        for p in np.unique(pid[mine]).tolist():
            sel = mine & (pid == p)
            out[phase] = out.get(phase, 0.0) + measure(start[sel], end[sel]) / 1e9
    return out


def stage_tables(result: FileResult, stage_dir: str | None, index: int) -> FileResult:
    """Write ``result``'s range, kernel and stream tables of :data:`STAGE_ROWS` rows or more to ``stage_dir`` and
    empty them in ``result``; keep its range count and seconds per phase. Nothing happens without ``stage_dir``."""
    if stage_dir is None:
        return result
    if result.num_ranges is None:
        result.num_ranges = len(result.ranges)
        result.phase_seconds = phase_seconds(result.ranges)
    for attr in STAGED:
        table = getattr(result, attr)
        if len(table) < STAGE_ROWS or attr in result.staged_tables:
            continue
        path = staged_path(stage_dir, attr, index)
        with part_file(path, table.schema) as add:
            add(table)
        result.staged_tables[attr] = str(path)
        setattr(result, attr, table.schema.remove_metadata().empty_table())  # (a slice pickles its rows)
    return result


def staged_path(stage_dir: str, attr: str, index: int) -> Path:
    """Where file ``index``'s table ``attr`` is staged."""
    return Path(stage_dir) / f".{attr}-{index}.arrow"


@contextmanager
def part_file(path: str | Path, table_schema: pa.Schema) -> Iterator[Callable[[pa.Table], None]]:
    """A staged table written a part at a time (``add(part)``; read back a part at a time by
    :func:`read_parts`). The file is removed if the writing fails."""
    import pyarrow as pa

    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table_schema) as writer:
            yield writer.write_table
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise


def read_parts(path: str | Path) -> Iterator[pa.Table]:
    """A staged table's parts, in the order they were written."""
    import pyarrow as pa

    with pa.OSFile(str(path), "rb") as source, pa.ipc.open_stream(source) as reader:
        for batch in reader:
            yield pa.Table.from_batches([batch])


def table_parts(
    results: list[FileResult], attr: str, name: str, cols: Mapping[str, str]
) -> Iterator[pa.Table]:
    """One output table's rows in file order, conformed, a part at a time: the tables the results hold,
    gathered up to :data:`STAGE_ROWS` rows, and each staged table read back on its own. Empty parts are skipped."""
    import pyarrow as pa

    held: list[pa.Table] = []
    rows = 0

    def gathered() -> pa.Table:
        return pa.concat_tables([schema.conform_table(t, cols, name) for t in held])

    for r in results:
        path = r.staged_tables.get(attr)
        if path is None:
            table = getattr(r, attr)
            if len(table):
                held.append(table)
                rows += len(table)
            if rows < STAGE_ROWS:
                continue
        if held:
            yield gathered()
            held, rows = [], 0
        if path is not None:
            for part in read_parts(path):
                if len(part):
                    yield schema.conform_table(part, cols, name)
    if held:
        yield gathered()
