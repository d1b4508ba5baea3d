"""Ingest jobs: one trace file -> its event table (staged Parquet) and every small table; mapped over files.

:func:`ingest_file` is a pure function of one path (plus options): it writes the event table to a staging name
and returns the small tables as Arrow (the command imports no pandas; :func:`analyze` gives the notebook
frames). It is mapped in-process, over a process pool or as Ray tasks (paths and output on a shared
filesystem); ``mxperf ingest`` renames staged files into place only once every file succeeded.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing import staged
from tracing.analysis import attribution, gpu_tables, kernel_classes, metrics, range_tables, steps
from tracing.analysis.colocated import shared_device_time
from tracing.analysis.logged_steps import logged_tables
from tracing.analysis.mb_engine import engine_signals
from tracing.analysis.microbatches import EXTRA_COLUMNS, MicrobatchResult, gemm_names, signals_microbatches
from tracing.analysis.phases import PhaseMap, default_phase_map, load_phase_map
from tracing.ingest import engine
from tracing.ingest.decoded import in_engine
from tracing.ingest.metric_logs import METRIC_LOG, load_metric_log
from tracing.ingest.rangelog import read_range_log
from tracing.ingest.trace import Trace, rank_from_name
from tracing.outputs import schema, store
from tracing.outputs.errors import InputError, MxperfError
from tracing.outputs.labels import Labels
from tracing.progress import Progress

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


@dataclass
class FileResult:
    """What one file contributes to the output directory (events are staged on disk, not carried here); its
    tables are Arrow tables of the output schemas (no pandas on the command's path)."""

    path: str
    format: str
    rank: int | None
    num_events: int
    staged_events: str | None
    devices: pa.Table
    streams: pa.Table
    ranges: pa.Table
    kernels: pa.Table
    steps: pa.Table
    meta: dict[str, Any] = field(default_factory=dict)
    gpu_reason: str = ""
    mismatch: pa.Table | None = None  # a metric log's mismatch metrics (schema.MISMATCH_COLUMNS)
    step_tokens: pa.Table | None = None  # a metric log's token counts per step (schema.STEP_TOKEN_COLUMNS)
    microbatches: MicrobatchResult | None = None  # detected / explicit micro-batches and their notes
    timelines: list[metrics.DeviceTimeline] = field(default_factory=list)  # busy / stall intervals
    # set when the worker staged its large tables (tracing.staged): those tables are then empty here
    staged_tables: dict[str, str] = field(default_factory=dict)  # attribute -> staged file
    num_ranges: int | None = None
    phase_seconds: dict[str, float] | None = None
    step_notes: list[str] = field(default_factory=list)  # how its steps were found (stderr, manifest)
    # each step's window, (pid, step, start, end) on its own clock: where roles overlap (overlapping_roles)
    step_spans: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class Analysis:
    """Every per-trace table (Arrow), plus the micro-batch notes and device timelines that go with them."""

    tables: dict[str, pa.Table]
    microbatches: MicrobatchResult
    timelines: list[metrics.DeviceTimeline]
    staged_ranges: tuple[str, int, dict[str, float]] | None = None  # (path, ranges, seconds per phase)
    step_notes: list[str] = field(default_factory=list)
    file_facts: dict[str, Any] = field(default_factory=dict)  # what the events say of the file (its meta)
    step_spans: list[tuple[int, int, int, int]] = field(default_factory=list)


def analyze_trace(
    trace: Trace,
    phase_map: PhaseMap | None = None,
    labels: Labels | None = None,
    pattern: str | None = None,
) -> Analysis:
    """All per-trace tables of a trace held in memory (its event table, a frame or Arrow, goes to the engine as
    Arrow; no I/O)."""
    with engine.session() as con:
        engine.register_frame(con, trace.events)
        return analyze_in(con, trace, phase_map, labels, pattern)


def analyze_in(
    con: Any,
    trace: Trace,
    phase_map: PhaseMap | None = None,
    labels: Labels | None = None,
    pattern: str | None = None,
    ranges_to: Path | None = None,
) -> Analysis:
    """All per-trace tables from the engine's ``events`` view (``trace``: path, format, rank, range log).

    ``ranges_to``: where a range table of ``staged.STAGE_ROWS`` ranges or more goes, written from the engine a
    part at a time (``Analysis.staged_ranges``); the analysis then holds only the rows the other tables read
    (``range_tables.summary_rows``)."""
    phase_map = phase_map or default_phase_map()
    staged_ranges = None
    num_ops = gpu_tables.make_ops(con)
    before = gpu_tables.ops_before_launch(con) if num_ops else {}
    timelines = gpu_tables.device_timelines(con)
    streams = engine.table(gpu_tables.stream_rows(con), schema.STREAM_COLUMNS, "streams")
    kernels = kernel_classes.kernel_groups_table(con)
    if trace.range_log is not None:
        ranges = attribution.range_log_table(trace, phase_map)
    else:
        range_tables.make_ranges(con)
        source = "nvtx" if trace.format == "nsys" else "user_annotation"
        n = range_tables.make_range_rows(con, phase_map, source, num_ops)
        if ranges_to is not None and n >= staged.STAGE_ROWS:
            ranges = engine.table(range_tables.summary_rows(con, pattern), schema.RANGE_COLUMNS, "ranges")
            staged_ranges = (str(ranges_to), n, staged.phase_seconds(ranges))
            _stage_range_parts(con, trace, ranges_to)
        else:
            ranges = engine.table(
                engine.arrow(con, "select * from range_rows order by range_id"),
                schema.RANGE_COLUMNS,
                "ranges",
            )
    sig = engine_signals(con, gemm_names(kernels))
    mb = signals_microbatches(con, sig, trace, ranges, kernels, num_ops, labels, pattern)
    step_input = _step_input(ranges)
    if num_ops and step_input.num_rows:  # with the end of the GPU work queued before each step / phase
        cols = {c: step_input.column(c) for c in step_input.column_names}
        step_input = schema.make_table(
            {**cols, "queued_end_ns": range_tables.queued_ends(con, step_input)},
            {**schema.dtypes_of(step_input), "queued_end_ns": "int64"},
        )
    bases: dict[Any, str] = {}
    step_notes: list[str] = []
    step_table = steps.trace_step_phases(with_trace_cols(step_input, trace), mb.table, bases, step_notes)
    behind = sorted(str(pid) for (_, pid), basis in bases.items() if basis == "device")
    if behind:
        step_notes.append(
            f"pid {', '.join(behind)}: most steps begin while GPU work launched before them still runs (the GPU "
            "behind the host): steps.parquet times its steps and phases on the device (from the later of a "
            "range's start and that work's end to the end of the last GPU op it launched)"
        )
    tables = {
        "devices": metrics.device_table(timelines),
        "streams": streams,
        "ranges": ranges,
        "kernels": kernels,
        "steps": step_table,
        "microbatches": mb.table,
    }
    windows = steps.step_windows(step_input, trace.path) if step_table.num_rows else None
    cols = ("pid", "step", "start_ns", "end_ns")
    spans = [] if windows is None else list(zip(*(windows[c].tolist() for c in cols), strict=True))
    facts = {"ops_before_launch": before} if before else {}
    return Analysis(tables, mb, timelines, staged_ranges, step_notes, facts, spans)


def _stage_range_parts(con: Any, trace: Trace, path: Path) -> None:
    """The whole range table (with its trace columns) to ``path``, from the engine a part at a time."""
    import pyarrow as pa

    parts = (
        with_trace_cols(engine.table(pa.Table.from_batches([b]), schema.RANGE_COLUMNS, "ranges"), trace)
        for b in range_tables.range_parts(con, staged.STAGE_ROWS)
    )
    first = next(parts)
    with staged.part_file(path, first.schema) as add:
        for part in itertools.chain([first], parts):
            add(part)


# what trace_step_phases reads (+ trace, rank)
_STEP_INPUT = ("name", "phase", "pid", "start_ns", "end_ns", "attrs", "gpu_end_ns")


def _step_input(ranges: pa.Table) -> pa.Table:
    cols = ranges.select([c for c in _STEP_INPUT if c in ranges.column_names])
    return schema.rows_where(cols, steps.step_rows(cols))


def analyze(
    trace: Trace, phase_map: PhaseMap | None = None, labels: Labels | None = None
) -> dict[str, pd.DataFrame]:
    """All per-trace tables (:func:`analyze_trace`'s ``tables``), as pandas frames."""
    return {k: schema.to_frame(t) for k, t in analyze_trace(trace, phase_map, labels).tables.items()}


def with_trace_cols(table: pa.Table, trace: Trace, *, fmt: bool = False) -> pa.Table:
    """``table`` with the output tables' ``trace`` (and ``format``) and ``rank`` columns first."""
    cols = {"trace": "string", **({"format": "string"} if fmt else {}), "rank": "Int64"}
    values = {"trace": trace.path, "format": trace.format, "rank": trace.rank}
    own = {c: table.column(c) for c in table.column_names}
    return schema.make_table({**values, **own}, {**cols, **schema.dtypes_of(table)})


def ingest_file(
    path: str,
    fmt: str,
    rank: int | None,
    stage_dir: str | None,
    index: int,
    phase_map_path: str | None = None,
    include_python: bool = False,
    labels: Labels | None = None,
    pattern: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FileResult:
    """Ingest one file, any size: decode it a batch at a time into its event table (staged as
    ``stage_dir/.events-<index>.parquet`` when given), then every table from that file in the engine.

    ``labels`` fill what the trace cannot say about its micro-batches; ``pattern`` names explicit
    micro-batch ranges (``--microbatch-range``). ``progress(bytes_read, file_bytes)`` is called as the file is
    read."""
    phase_map = load_phase_map(phase_map_path) if phase_map_path else default_phase_map()
    if fmt == METRIC_LOG:
        return _ingest_metric_log(path, phase_map)
    staged_events = None if stage_dir is None else str(Path(stage_dir) / f".events-{index}.parquet")
    if fmt == "rangelog":
        trace = read_range_log(path, rank=rank)
        analysis = analyze_trace(trace, phase_map, labels, pattern)
        num_events, reason = trace.events.num_rows, attribution.RANGELOG_REASON
        if staged_events is not None:
            store.write_table(
                trace.events, staged_events, meta={"trace": trace.path, "format": fmt, "rank": trace.rank}
            )
    else:
        with in_engine(
            path,
            fmt,
            rank=rank,
            include_python=include_python,
            progress=progress,
            events_path=staged_events,
            temp_dir=stage_dir,
        ) as (con, d, _):
            num_events = d.rows
            trace = Trace(d.path, d.format, None, rank=d.rank, meta=d.meta)  # its events: in the engine
            ranges_to = None if stage_dir is None else staged.staged_path(stage_dir, "ranges", index)
            analysis = analyze_in(con, trace, phase_map, labels, pattern, ranges_to)
            num_gpu_ops = sum(
                int(t.row["num_kernels"] + t.row["num_memcpy"] + t.row["num_memset"])
                for t in analysis.timelines
            )
            reason = "" if num_gpu_ops else attribution.NO_GPU_REASON
    tables = analysis.tables
    result = FileResult(
        path=trace.path,
        format=trace.format,
        rank=trace.rank,
        num_events=num_events,
        staged_events=staged_events,
        devices=with_trace_cols(tables["devices"], trace, fmt=True),
        streams=with_trace_cols(tables["streams"], trace),
        ranges=with_trace_cols(tables["ranges"], trace),
        kernels=with_trace_cols(tables["kernels"], trace),
        steps=tables["steps"],
        meta={**trace.meta, **analysis.file_facts},
        gpu_reason=reason,
        microbatches=analysis.microbatches,
        timelines=analysis.timelines,
        step_notes=analysis.step_notes,
        step_spans=analysis.step_spans,
    )
    if analysis.staged_ranges is not None:  # written from the engine a part at a time: not in the result
        path, result.num_ranges, result.phase_seconds = analysis.staged_ranges
        result.staged_tables["ranges"] = path
        result.ranges = result.ranges.schema.remove_metadata().empty_table()
    return result


def _ingest_metric_log(path: str, phase_map: PhaseMap) -> FileResult:
    """A verl / NeMo RL metric log: no events; per-step phase seconds, mismatch metrics and token counts."""
    import pyarrow as pa

    log = load_metric_log(path)
    got = logged_tables(log, phase_map)
    none = pa.table({})
    meta = {"framework": log.framework, "layout": log.layout, "steps": len(log.steps)}
    return FileResult(
        path=log.path,
        format=METRIC_LOG,
        rank=None,
        num_events=0,
        staged_events=None,
        devices=none,
        streams=none,
        ranges=none,
        kernels=none,
        steps=got.steps,
        meta={**meta, "phase_keys": got.phase_keys, "notes": list(got.notes)},
        gpu_reason="a metric log: per-step timers, no GPU events",
        mismatch=got.mismatch,
        step_tokens=got.tokens,
    )


def combine_microbatches(results: list[FileResult]) -> pa.Table | None:
    """The micro-batch tables of several files as one (``schema.MICROBATCH_COLUMNS`` + extras + ``trace``),
    None when they hold no rows.

    ``repeat`` becomes one traced step of one rank across the set: a dense index over (trace, rank, process,
    step), so the bootstrap resamples whole steps.
    """
    import pyarrow as pa

    held = [r for r in results if r.microbatches is not None and len(r.microbatches.table)]
    if not held:
        return None
    table = pa.concat_tables([r.microbatches.table for r in held])
    trace = [r.path for r in held for _ in range(len(r.microbatches.table))]
    ranks = [-1 if x is None else x for x in table.column("rank").to_pylist()]
    keys = list(
        zip(trace, ranks, table.column("pid").to_pylist(), table.column("step").to_pylist(), strict=True)
    )
    dense = {k: i for i, k in enumerate(sorted(set(keys)))}
    cols = {**schema.MICROBATCH_COLUMNS, **EXTRA_COLUMNS, **schema.MICROBATCH_TRACE}
    data = {c: table.column(c) for c in table.column_names}
    data.update(trace=trace, repeat=np.array([dense[k] for k in keys], np.int64))
    return schema.make_table(data, cols, "microbatches")


def clock_offset_ns(result: FileResult) -> int | None:
    """Offset that puts a file's times on the Unix epoch (None: its clock cannot be aligned with others')."""
    clock = result.meta.get("clock")
    if clock == "epoch_ns":
        return 0
    if clock == "nsys_session_ns" and result.meta.get("session_start_utc_ns") is not None:
        return int(result.meta["session_start_utc_ns"])
    return None


def first_step_ns(result: FileResult) -> int:
    """The start of a file's first step on its own clock (it orders a rank's files)."""
    return min(start for _, _, start, _ in result.step_spans)


def number_steps_across_files(results: list[FileResult]) -> list[str]:
    """Number on the steps of a process's files when they collide: verl writes a file per profiled step, and each
    numbers its steps from 0 here (no ``ProfilerStep#N``), so rank r would hold "step 0" several times and the
    cross-rank tables would take different steps for one. Such files are put in time order (their first step's
    start on the epoch clock; by name where a clock cannot be aligned: verl's names end with a timestamp) and
    each file's steps, and its micro-batches', continue after the previous file's. A file whose name says which
    RL steps it holds (verl's ``_step<N>_``, NeMo RL's ``_<start>:<stop>_``) and whose steps are numbered
    ``0..n-1`` here takes those numbers instead (a verl file of several steps: N, N + 1, ...). Files are grouped
    by process: rank and pid (a rank's actor and critic workers are two processes, each with a file per step), or
    the pid alone where there is no rank (nsys captures of one verl worker: ``worker_process_<pid>.<k>``).
    Returns a note per process renumbered."""

    by_rank: dict[str, list[FileResult]] = {}  # "rank r (pid p)", else "pid p"
    for r in results:
        if r.format == METRIC_LOG or not len(r.steps) or not r.step_spans:
            continue
        named = (r.meta.get("report_name") or {}).get("profiled_steps") or []
        own = sorted(set(r.steps.column("step").to_pylist()))
        if named and (own == list(range(len(named))) or (len(named) == 1 and own == list(range(len(own))))):
            # the steps its name says it holds (consecutive: a start and a count), or the steps that follow the
            # one it names (verl's profile_continuous_steps: a file from the first of consecutive steps on)
            _renumber(r, named[0])
            continue
        pids = set(r.steps.column("pid").to_pylist())
        if len(pids) == 1:  # a file of one process (a worker writes one a step: same rank, same pid)
            pid = pids.pop()
            by_rank.setdefault(
                f"rank {r.rank} (pid {pid})" if r.rank is not None else f"pid {pid}", []
            ).append(r)
    notes = []
    for who, files in sorted(by_rank.items()):
        numbers = [set(r.steps.column("step").to_pylist()) for r in files]
        if sum(map(len, numbers)) == len(set().union(*numbers)):
            continue  # no step number in two files
        offsets = [clock_offset_ns(r) for r in files]
        aligned = None not in offsets
        files.sort(key=lambda r: (first_step_ns(r) + clock_offset_ns(r), r.path) if aligned else r.path)
        following = 0
        for k, r in enumerate(files):
            step = r.steps.column("step").to_numpy()
            low, high = int(step.min()), int(step.max())
            _renumber(r, following - low)
            r.step_notes.append(
                f"steps {low}-{high} numbered {following}-{following + high - low}: file {k + 1} of "
                f"{len(files)} of {who} in {'time' if aligned else 'file name'} order"
            )
            following += high + 1 - low
        notes.append(
            f"{who}: {len(files)} files number their steps alike (a file per profiled step, as verl writes "
            f"them): numbered on in {'time' if aligned else 'file name'} order, steps 0-{following - 1}"
        )
    return notes


def overlapping_roles(results: list[FileResult], share: float = 0.1) -> list[str]:
    """Say where processes of different roles (``steps.process_roles``: a sampler that only generates beside
    the learner) run one step at the same time -- an async trainer, whose step is not the sum of the roles'
    phases that ``steps.one_process`` takes. Two processes' windows of one step number overlap when they share
    ``share`` of the shorter one (on the epoch clock; a file whose clock cannot be aligned is compared with
    itself only).
    Each such trace gets a step note (:data:`steps.OVERLAP`); returns one note for the ingest."""
    taken = [
        (i, r, clock_offset_ns(r))
        for i, r in enumerate(results)
        if r.format != METRIC_LOG and r.step_spans and len(r.steps)
    ]
    names = ("trace", "rank", "pid", "phase", "seconds")
    cols = {c: [v for _, r, _ in taken for v in r.steps.column(c).to_pylist()] for c in names}
    roles = steps.process_roles(*cols.values())  # over every process of the ingest, as one_process takes them
    spans: list[tuple[int, str, int, int, int]] = []  # (step, role, start, end, result index)
    for i, r, offset in taken:
        role_of = {pid: role for (trace, _, pid), role in roles.items() if trace == r.path}
        shift = offset or 0
        spans += [(st, role_of.get(pid, ""), lo + shift, hi + shift, i) for pid, st, lo, hi in r.step_spans]
    aligned = {i for i, _, offset in taken if offset is not None}
    hit: dict[int, set[int]] = {}  # result index -> steps
    roles_seen: set[tuple[str, str]] = set()
    spans.sort()
    for a, x in enumerate(spans):
        for y in spans[a + 1 :]:
            if y[0] != x[0]:
                break
            if x[1] == y[1] or (x[4] != y[4] and not {x[4], y[4]} <= aligned):
                continue
            inter = min(x[3], y[3]) - max(x[2], y[2])
            if inter > share * min(x[3] - x[2], y[3] - y[2]) and inter > 0:
                hit.setdefault(x[4], set()).add(x[0])
                hit.setdefault(y[4], set()).add(x[0])
                roles_seen.add(tuple(sorted((x[1] or "none", y[1] or "none"))))
    for i, numbers in hit.items():
        shown = ", ".join(map(str, sorted(numbers)[:5])) + (" ..." if len(numbers) > 5 else "")
        results[i].step_notes.append(
            f"steps {shown}: {steps.OVERLAP} with a process of another role (an async trainer): a step's time "
            "is not the sum of the roles' phases that the Step time page and the step model add; a metric log's "
            "step timer (verl timing_s/step) gives it"
        )
    if not hit:
        return []
    pairs = "; ".join(f"{a} / {b}" for a, b in sorted(roles_seen))
    return [
        f"processes of different roles ({pairs}) run the same steps at the same time in {len(hit)} file(s): "
        "an async trainer; step times that add the roles' phases over-state its steps"
    ]


def _renumber(r: FileResult, shift: int) -> None:
    """``shift`` added to every step number of ``r``'s step and micro-batch tables."""
    import pyarrow as pa

    tables = [r.steps] + ([r.microbatches.table] if r.microbatches is not None else [])
    for i, t in enumerate(tables):
        if not len(t):
            continue
        col = t.column_names.index("step")
        moved = t.column("step").to_numpy() + shift
        tables[i] = t.set_column(col, "step", pa.array(moved, t.schema.field(col).type))
    r.steps = tables[0]
    r.step_spans = [(pid, step + shift, lo, hi) for pid, step, lo, hi in r.step_spans]
    if r.microbatches is not None:
        r.microbatches.table = tables[1]


def share_devices(results: list[FileResult]) -> list[str]:
    """Colocated processes across files (``mxperf ingest --colocated``): recompute each device row's
    ``device_*`` columns over every file's processes on that device index, on the epoch clock. Returns notes
    (files whose clock cannot be aligned keep their own view)."""
    entries, notes = [], []
    for k, r in enumerate(results):
        off = clock_offset_ns(r)
        if not r.timelines:
            continue
        if off is None:
            notes.append(
                f"{r.path}: its clock cannot be aligned with other files ({r.meta.get('clock')}); not colocated"
            )
            continue
        entries += [(k, i, t, off) for i, t in enumerate(r.timelines)]
    if len({k for k, *_ in entries}) < 2:
        return notes
    shared = shared_device_time([t for *_, t, _ in entries], [o for *_, o in entries])
    columns: dict[int, dict[str, list[Any]]] = {}
    for (k, i, _, _), cols in zip(entries, shared, strict=True):
        devices = results[k].devices
        held = columns.setdefault(k, {c: devices.column(c).to_pylist() for c in devices.column_names})
        for c, v in cols.items():
            held[c][i] = v
    for k, data in columns.items():
        results[k].devices = schema.make_table(data, schema.dtypes_of(results[k].devices), "devices")
    return notes


def _rank_hint(path: Path, fmt: str, rank: int | None, many: bool) -> int | None:
    # --rank applies to a single input; with many inputs each file's own rank (or name) decides.
    if rank is not None and not many:
        return rank
    return rank_from_name(path) if fmt != "rangelog" else None


def ingest_many(
    items: list[tuple[Path, str]],
    stage_dir: str | None,
    *,
    rank: int | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    phase_map_path: str | None = None,
    include_python: bool = False,
    labels: list[Labels] | None = None,
    pattern: str | None = None,
    progress: Progress | None = None,
) -> list[FileResult]:
    """Map :func:`ingest_file` over files (in order), serially, with a process pool, or on Ray. With a
    ``stage_dir``, each file's range, kernel and stream tables come back staged there (``tracing.staged``), not in
    the result.

    ``labels[i]`` are item i's labels (command line, sidecar, run config). ``progress`` shows files done
    (and, serially, the bytes read of each file) on stderr."""
    many = len(items) > 1
    per_item = labels if labels is not None else [None] * len(items)
    jobs = [
        (
            str(p),
            fmt,
            _rank_hint(p, fmt, rank, many),
            stage_dir,
            i,
            phase_map_path,
            include_python,
            lab,
            pattern,
        )
        for i, ((p, fmt), lab) in enumerate(zip(items, per_item, strict=True))
    ]
    if ray_address is not None:
        return _ingest_ray(jobs, ray_address, progress)
    if workers > 1 and len(jobs) > 1:
        # only for --workers: the pool's modules take ~9 ms to import
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), initializer=_default_sigterm) as pool:
            futures = [pool.submit(_ingest_staged, *job) for job in jobs]
            for _ in as_completed(futures):
                if progress is not None:
                    progress.file_done()
            return [f.result() for f in futures]  # in order: the first failing file's error
    out = []
    for job in jobs:
        out.append(_ingest_staged(*job, progress=progress.bytes_read if progress is not None else None))
        if progress is not None:
            progress.file_done()
    return out


def _default_sigterm() -> None:
    """A pool worker ends quietly on SIGTERM (a forked worker inherits the command's handler, which raises)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _ingest_staged(*job: Any, progress: Callable[[int, int], None] | None = None) -> FileResult:
    """:func:`ingest_file`, its large tables staged beside its events (``tracing.staged``); an engine error
    names the file that ran out of the limit."""
    try:
        return staged.stage_tables(ingest_file(*job, progress=progress), job[3], job[4])
    except engine.EngineError as exc:
        raise engine.EngineError(f"{job[0]}: {exc}") from None


def _ingest_ray(
    jobs: list[tuple[Any, ...]], address: str, progress: Progress | None = None
) -> list[FileResult]:
    """One Ray task per file (1 CPU each). Paths and ``stage_dir`` must be on storage every node sees."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray, which is not installed: pip install 'mxperf[ray]'") from None
    if not ray.is_initialized():
        if address == "local":
            ray.init(
                num_cpus=max(2, min(len(jobs), os.cpu_count() or 1)),
                include_dashboard=False,
                log_to_driver=False,
            )
        else:
            ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(_ingest_staged)
    refs = [remote.remote(*job) for job in jobs]
    try:
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=1)
            if progress is not None:
                progress.file_done()
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, MxperfError):  # bad input on a worker: one line, like a local failure
            raise cause from None
        raise
