"""``mxperf ingest PATH... -o OUT/``: traces -> event tables, per-device and per-range metrics (docs/contracts.md).

Writes ``OUT/manifest.json`` (kind ingest), ``events/rank-<r>.parquet``, ``devices.parquet``,
``streams.parquet``, ``ranges.parquet``, ``kernels.parquet`` and ``microbatches.parquet`` whenever
micro-batches were found (explicit ranges or detected; labels fill what a trace cannot say).
A human summary goes to stderr; with ``--json`` the last stdout line is the docs/contracts.md ingest JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from mxperf.commands.ingest_args import add_arguments
from tracing.analysis.crossrank import cross_rank_tables
from tracing.analysis.gpu_tables import stall_unmeasured
from tracing.analysis.steps import kahan_sum
from tracing.ingest.detect import expand_inputs
from tracing.ingest.metric_logs import METRIC_LOG, TOKEN_FIELDS
from tracing.ingest.rangelog import is_run_dir, run_config
from tracing.ingest.trace import MAX_RANK, trace_warnings
from tracing.jobs import (
    FileResult,
    combine_microbatches,
    ingest_many,
    number_steps_across_files,
    overlapping_roles,
    share_devices,
)
from tracing.outputs import schema, store
from tracing.outputs.errors import InputError
from tracing.outputs.labels import Labels, parse_labels, sidecar_labels
from tracing.outputs.manifest import OutputDir
from tracing.outputs.precisions import PRECISION_IDS
from tracing.progress import Progress
from tracing.staged import STAGED, phase_seconds, table_parts

if TYPE_CHECKING:
    import pyarrow as pa

STAGING = ".staging"
__all__ = ["add_arguments", "run"]


def _events_name(r: FileResult, taken: set[str], index: int) -> str:
    if r.format == "rangelog":
        base = "rangelog"
    elif r.rank is not None:
        base = str(r.rank)
    else:
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(r.path).name.split(".")[0]) or f"file{index}"
    name = base if base not in taken else f"{base}-{index}"
    taken.add(name)
    return name


def _run_dir_of(r: FileResult) -> Path | None:
    """The mxperf run/sweep directory a result comes from (its range log, or a trace under its trace/)."""
    return _run_dir_of_path(Path(r.path), r.format)


def _run_dir_of_path(p: Path, fmt: str) -> Path | None:
    if fmt == "rangelog":
        return p if p.is_dir() else p.parent
    for parent in (p.parent, p.parent.parent):  # trace/rank-0.json.gz, trace/sampler/<vllm trace>
        if parent.name == store.TRACE_DIR and is_run_dir(parent.parent):
            return parent.parent
    return None


def unfinished_run_notes(items: list[tuple[Path, str]]) -> list[str]:
    """Refuse an mxperf run / sweep folder whose manifest does not say ``complete`` (its tables hold only
    what it finished); a trace file inside one is ingested as it is, with a note that says so."""
    notes = []
    for path, fmt in items:
        run_dir = _run_dir_of_path(path, fmt)
        if run_dir is None or not (run_dir / store.MANIFEST).is_file():
            continue
        manifest = store.read_json(run_dir / store.MANIFEST)
        status, kind = manifest.get("status"), manifest.get("kind", "run")
        if status == "complete":
            continue
        if fmt == "rangelog":
            raise InputError(
                f"{run_dir}: an mxperf {kind} whose manifest says '{status}', not complete (its tables hold "
                f"only what it finished); rerun it, or ingest its trace files alone ({run_dir / store.TRACE_DIR})"
            )
        note = f"{path}: a trace of an mxperf {kind} that ended '{status}'; ingested as it is"
        if note not in notes:
            notes.append(note)
    return notes


def _is_sweep(run_dir: Path | None) -> bool:
    if run_dir is None or not (run_dir / store.MANIFEST).is_file():
        return False
    try:
        return store.read_json(run_dir / store.MANIFEST).get("kind") == "sweep"
    except InputError:
        return False


def _labels_for(r: FileResult | Any, cli: Labels) -> Labels:
    """Labels of one input (anything with ``path`` and ``format``): run config < sidecar < command line."""
    p = Path(r.path)
    run_dir = _run_dir_of(r)
    base = Labels()
    if run_dir is not None:
        cfg = run_config(run_dir)
        model = cfg.get("model") or cfg.get("model_name")
        size = cfg.get("tokens_per_microbatch") or cfg.get("microbatch_tokens")
        prec = cfg.get("precision") or cfg.get("learner")  # a run's learner precision is its trace's
        base = Labels(
            model=str(model) if model else None,
            precision=prec if isinstance(prec, str) and prec in PRECISION_IDS else None,
            tokens_per_microbatch=int(size) if isinstance(size, int) else None,
        )
    return base.merged(sidecar_labels(p, overridden=cli.as_dict())).merged(cli)


def _microbatches(results: list[FileResult]) -> tuple[pa.Table | None, list[str], list[str]]:
    """The ingest's micro-batch table (each file's, found at ingest with its labels), its notes (stderr and
    manifest) and the files it was taken from. A sweep's traces are left out (it holds its own table), and
    so is a run's own trace when its range log is ingested too (the log has every step, with attributes)."""
    picked, notes = [], []
    for r in results:
        if r.format == METRIC_LOG or r.microbatches is None:
            continue  # per-step numbers: no micro-batches
        run_dir = _run_dir_of(r)
        if _is_sweep(run_dir):
            note = f"{run_dir}: a sweep already holds its micro-batch table; fit it directly (mxperf fit {run_dir})"
            if note not in notes:
                notes.append(note)
            continue
        if r.format == "kineto" and run_dir is not None and any(x.format == "rangelog" for x in results):
            continue  # a run's own trace: its micro-batches come from the range log (all steps, with attributes)
        picked.append(r)
        notes += r.microbatches.lines(r.path)
    return combine_microbatches(picked), notes, [r.path for r in picked]


def _microbatch_manifest(r: FileResult) -> dict[str, Any]:
    """What the manifest adds per trace to its --json entry: per-phase micro-batch notes, precision evidence."""
    if r.microbatches is None:
        return {}
    mb = r.microbatches
    return {
        "microbatch_notes": mb.notes,
        "precision_evidence": mb.precision.as_dict() if mb.precision else None,
        "warnings": mb.warnings,
    }


def _phase_seconds(r: FileResult) -> dict[str, float]:
    """Wall seconds per phase: the union of the phase's ranges on each process, summed over processes."""
    return r.phase_seconds if r.phase_seconds is not None else phase_seconds(r.ranges)


def spec_json(results: list[FileResult], picked: list[str] | None = None) -> dict[str, Any]:
    """The ingest ``--json`` document; ``picked``: the files whose micro-batches went into the table
    (default: all), so ``microbatches`` counts the rows each trace put in ``microbatches.parquet``."""
    traces = []
    keys = ("rank", "pid", "device", "span_ns", "busy_ns", "idle_ns", "host_stall_ns", "num_kernels")
    for r in results:
        devices = [
            {
                **{k: d[k] for k in keys},
                # (v2) false where much of the idle ends at GPU ops without a launch call: host_stall_ns is then
                # only the part measured (gpu_tables.stall_unmeasured, as the summary and devices.parquet say)
                "host_stall_measured": not stall_unmeasured(d["unattributed_ns"], d["idle_ns"], d["span_ns"]),
            }
            for d in r.devices.to_pylist()
        ]
        entry = {"path": r.path, "format": r.format, "devices": devices}
        if r.microbatches is not None:  # (v2) micro-batches found and wall seconds per phase
            taken = picked is None or r.path in picked
            entry["microbatches"] = len(r.microbatches.table) if taken else 0
            entry["phases"] = _phase_seconds(r)
        elif r.format == METRIC_LOG:  # no micro-batches; its timers' seconds per phase over its steps
            sums = _phase_sums(r.steps)
            entry.update(microbatches=0, phases={p: sums[p] for p in sorted(sums)})
        traces.append(entry)
    return {"schema_version": store.SCHEMA_VERSION, "traces": traces}


def _phase_sums(steps: pa.Table) -> dict[str, float]:
    """A metric log's seconds per phase (not ``other``) summed over its steps (NaN skipped, as pandas' groupby
    sum), in order of first appearance; a phase whose timers are all NaN is left out."""
    per: dict[str, list[float]] = {}
    for phase, v in zip(steps.column("phase").to_pylist(), steps.column("seconds").to_pylist(), strict=True):
        if phase != "other":
            per.setdefault(phase, []).append(math.nan if v is None else v)
    return {p: kahan_sum(v) for p, v in per.items() if any(x == x for x in v)}


def summary_lines(results: list[FileResult]) -> list[str]:
    lines = []
    for r in results:
        rank = "?" if r.rank is None else str(r.rank)
        num_ranges = r.num_ranges if r.num_ranges is not None else len(r.ranges)
        lines.append(f"{r.path} [{r.format}, rank {rank}]: {r.num_events} events, {num_ranges} ranges")
        if r.gpu_reason:
            lines.append(f"  no GPU devices: {r.gpu_reason}; GPU metrics are null")
        lines += [f"  {w}" for w in trace_warnings(r.meta)]
        for d in (SimpleNamespace(**row) for row in r.devices.to_pylist()):
            span = d.span_ns or 1
            stall = f"{d.host_stall_ns / 1e6:.1f} ms ({100 * d.host_stall_ns / span:.1f} %)"
            unmeasured = stall_unmeasured(d.unattributed_ns, d.idle_ns, d.span_ns)
            if unmeasured:
                stall = "unknown" if d.host_stall_ns == 0 else f"at least {stall}"
            lines.append(
                f"  pid {d.pid} device {d.device}: span {d.span_ns / 1e6:.1f} ms, busy {d.busy_ns / 1e6:.1f} ms "
                f"({100 * d.busy_ns / span:.1f} %), host stall {stall}, {d.num_kernels} kernels"
            )
            if unmeasured:
                lines.append(
                    f"    {d.unattributed_ns / 1e6:.1f} ms of its {d.idle_ns / 1e6:.1f} ms idle ends at a GPU op "
                    "whose launch call is not in the trace: host stall is not measured there (devices.parquet "
                    "unattributed_ns)"
                )
    return lines


def run(args: argparse.Namespace) -> int:
    cli_labels = parse_labels(args.label)
    if args.microbatch_range is not None:
        try:
            re.compile(args.microbatch_range)
        except re.error as exc:
            raise InputError(
                f"--microbatch-range {args.microbatch_range!r}: not a regular expression ({exc})"
            ) from None
    if args.workers < 1:
        raise InputError(f"--workers {args.workers}: must be >= 1")
    if args.rank is not None and not 0 <= args.rank <= MAX_RANK:
        raise InputError(f"--rank {args.rank}: must be between 0 and {MAX_RANK}")
    items = expand_inputs(args.paths)
    unfinished = unfinished_run_notes(items)
    config = {
        "paths": [str(p) for p in args.paths],
        "labels": cli_labels.as_dict(),
        "rank": args.rank,
        "microbatch_range": args.microbatch_range,
        "phase_map": args.phase_map,
        "python_functions": args.python_functions,
        "colocated": args.colocated,
    }
    inputs = [*args.paths, *([args.phase_map] if args.phase_map else [])]
    with OutputDir(args.out, kind="ingest", config=config, force=args.force, inputs=inputs) as od:
        stage = od.path / STAGING
        stage.mkdir()
        try:
            progress = Progress(len(items), enabled=args.progress)
            try:
                results = ingest_many(
                    items,
                    str(stage),
                    rank=args.rank,
                    workers=args.workers,
                    ray_address=args.ray,
                    phase_map_path=args.phase_map,
                    include_python=args.python_functions,
                    labels=[
                        _labels_for(SimpleNamespace(path=str(p), format=f), cli_labels) for p, f in items
                    ],
                    pattern=args.microbatch_range,
                    progress=progress,
                )
            finally:
                progress.close()
            colocated = share_devices(results) if args.colocated else []
            # how each file's steps were found, said before the notes renumbering and overlaps add
            said = [f"{r.path}: {n}" for r in results for n in r.step_notes]
            renumbered = number_steps_across_files(results)
            overlaps = overlapping_roles(results)
            microbatches, notes, picked = _microbatches(results)
            notes = [*colocated, *said, *renumbered, *overlaps, *notes]
            _write(od.path, results, microbatches)
            log_lines = _write_metric_logs(od.path, results, cli_labels)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            for f in od.path.rglob("*.parquet"):
                f.unlink(missing_ok=True)
            raise
        shutil.rmtree(stage, ignore_errors=True)
        traces = spec_json(results, picked)["traces"]
        for t, r in zip(traces, results, strict=True):  # the machine that made the trace, where it says
            t["gpu_names"] = sorted({str(n) for n in (r.meta.get("gpu_names") or {}).values() if n})
            if r.format == METRIC_LOG:  # which framework, which keys went into which phase, its labels
                t.update(r.meta, labels=_labels_for(r, cli_labels).as_dict())
            t.update(_microbatch_manifest(r), step_notes=r.step_notes)
            if said_of_file := trace_warnings(r.meta):  # what the file's GPU numbers may miss, first
                t["warnings"] = [*said_of_file, *(t.get("warnings") or [])]
        od.update(
            traces=traces, microbatches=0 if microbatches is None else len(microbatches), notes=unfinished
        )
    for line in [*summary_lines(results), *log_lines, *unfinished, *notes]:
        print(line, file=sys.stderr)
    if microbatches is not None:
        print(f"{len(microbatches)} micro-batches -> {od.path / store.MICROBATCHES}", file=sys.stderr)
    if args.json:
        print(json.dumps(spec_json(results, picked), separators=(",", ":")))
    return 0


def _write(out: Path, results: list[FileResult], microbatches: pa.Table | None) -> None:
    import pyarrow as pa

    taken: set[str] = set()
    num_ranks = 0
    for i, r in enumerate(results):
        if r.staged_events:
            target = store.events_path(out, _events_name(r, taken, i))
            target.parent.mkdir(parents=True, exist_ok=True)
            Path(r.staged_events).replace(target)
    for name, attr, cols in (
        (store.DEVICES, "devices", schema.DEVICE_COLUMNS),
        (store.STEPS, "steps", schema.STEP_COLUMNS),
    ):
        held = [schema.conform_table(t, cols, name) for r in results if len(t := getattr(r, attr))]
        table = pa.concat_tables(held) if held else schema.empty_table(cols)
        store.write_table(table, out / name)
        if name == store.DEVICES:
            num_ranks = len({x for x in table.column("rank").to_pylist() if x is not None})
    for attr, (name, cols) in STAGED.items():  # one file's part at a time (staged by the workers)
        parts = table_parts(results, attr, name, cols)
        first = next(parts, None)
        if first is None:
            store.write_table(schema.empty_table(cols), out / name)
        else:
            store.write_table_parts(itertools.chain([first], parts), out / name)
    if microbatches is not None:
        store.write_table(microbatches, out / store.MICROBATCHES)
    if num_ranks < 2:  # cross_rank_tables gives nothing for fewer than two ranks: skip reading back
        return
    devices, steps = (store.read_arrow(out / n) for n in (store.DEVICES, store.STEPS))
    for name, table in cross_rank_tables(devices, steps).items():  # several ranks: across them
        store.write_table(
            table, out / {"stragglers": store.STRAGGLERS, "rank_spread": store.RANK_SPREAD}[name]
        )


def _write_metric_logs(out: Path, results: list[FileResult], cli: Labels) -> list[str]:
    """``mismatch.parquet`` (each row with its log's precision label) and ``step_tokens.parquet`` from the
    metric logs among ``results``; returns summary lines: per log, its framework, seconds per phase over its
    steps, its token counts, and what it cannot say."""
    import pyarrow as pa

    tables, token_tables, lines = [], [], []
    for r in results:
        if r.format != METRIC_LOG:
            continue
        precision = _labels_for(r, cli).precision
        if r.mismatch is not None and len(r.mismatch):
            data = {c: r.mismatch.column(c) for c in r.mismatch.column_names}
            tables.append(schema.make_table({**data, "precision": precision}, schema.MISMATCH_COLUMNS))
        if r.step_tokens is not None and len(r.step_tokens):
            token_tables.append(schema.conform_table(r.step_tokens, schema.STEP_TOKEN_COLUMNS, "step_tokens"))
        per_phase = _phase_sums(r.steps)
        shown = ", ".join(f"{p} {s:.1f} s" for p, s in per_phase.items()) or "no phase timers"
        num_steps = len(set(r.steps.column("step").to_pylist()))
        metrics = sorted(set(r.mismatch.column("metric").to_pylist())) if r.mismatch is not None else []
        lines.append(
            f"{r.path}: {r.meta.get('framework')} metric log ({precision or 'no precision label'}): {num_steps} "
            f"steps with timers ({shown}); mismatch metrics: {', '.join(metrics[:6]) or 'none'}"
            + (" ..." if len(metrics) > 6 else "")
            + f"; {_token_summary(r.step_tokens)}"
        )
        lines += [f"{r.path}: {note}" for note in r.meta.get("notes", [])]
    if tables:
        table = schema.conform_table(pa.concat_tables(tables), schema.MISMATCH_COLUMNS, "mismatch")
        store.write_table(table, out / store.MISMATCH)
    if token_tables:
        store.write_table(pa.concat_tables(token_tables), out / store.STEP_TOKENS)
    return lines


def _token_summary(tokens: pa.Table | None) -> str:
    """How many steps give each token count (``step_tokens.parquet``), or that the log gives none."""
    if tokens is None or not len(tokens):
        return "no token counts"
    given = [
        f"{name.replace('_', ' ')} {len(tokens) - tokens.column(name).null_count}" for name in TOKEN_FIELDS
    ]
    return f"steps with token counts: {', '.join(given)}"
