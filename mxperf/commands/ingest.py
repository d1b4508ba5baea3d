"""``mxperf ingest PATH... -o OUT/``: traces -> event tables, per-device and per-range metrics (docs/contracts.md).

Writes ``OUT/manifest.json`` (kind ingest), ``events/rank-<r>.parquet``, ``devices.parquet``,
``streams.parquet``, ``ranges.parquet``, ``kernels.parquet`` and, when labelled, ``microbatches.parquet``.
A human summary goes to stderr; with ``--json`` the last stdout line is the docs/contracts.md ingest JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from tracing.analysis.microbatches import microbatch_table
from tracing.ingest.detect import expand_inputs
from tracing.ingest.rangelog import is_run_dir, run_config
from tracing.jobs import FileResult, ingest_many
from tracing.outputs import schema, store
from tracing.outputs.errors import InputError
from tracing.outputs.labels import Labels, parse_labels, sidecar_labels
from tracing.outputs.manifest import OutputDir
from tracing.outputs.placement import FORCE_HELP, OUT_HELP
from tracing.outputs.precisions import PRECISION_IDS

STAGING = ".staging"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="Kineto .json(.gz), nsys .sqlite, mxperf run dir, or a dir of traces",
    )
    p.add_argument("-o", "--out", required=True, type=Path, help=OUT_HELP)
    p.add_argument(
        "--json", action="store_true", help="print the docs/contracts.md ingest JSON as the last stdout line"
    )
    p.add_argument("--label", help="model=M,precision=P,tokens_per_microbatch=N[,phase=update][,repeat=R]")
    p.add_argument(
        "--rank", type=int, help="rank of a single input that names none (no distributedInfo, no rank-N)"
    )
    p.add_argument("--workers", type=int, default=1, help="local processes, one file each (default 1)")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="map files over a Ray cluster ('local' starts one); needs mxperf[ray]",
    )
    p.add_argument(
        "--microbatch-range", metavar="PATTERN", help="regex (full match) naming the micro-batch range"
    )
    p.add_argument(
        "--phase-map", metavar="FILE", help="phase-map TOML replacing tracing/analysis/phase_map.toml"
    )
    p.add_argument(
        "--python-functions",
        action="store_true",
        help="keep Kineto python_function events (with_stack traces) in the event table (skipped by default)",
    )
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


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


def _labels_for(r: FileResult, cli: Labels) -> Labels:
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


def _microbatches(
    results: list[FileResult], cli: Labels, pattern: str | None
) -> tuple[pd.DataFrame | None, list[str]]:
    tables, notes = [], []
    for r in results:
        run_dir = _run_dir_of(r)
        if _is_sweep(run_dir):
            note = f"{run_dir}: a sweep already holds its micro-batch table; fit it directly (mxperf fit {run_dir})"
            if note not in notes:
                notes.append(note)
            continue
        if r.format == "kineto" and run_dir is not None and any(x.format == "rangelog" for x in results):
            continue  # a run's own trace: its micro-batches come from the range log (all steps, with attributes)
        labels = _labels_for(r, cli)
        if not labels.complete:
            if labels.as_dict():
                missing = labels.missing()
                if missing == ["precision"] and (r.format == "rangelog" or run_dir is not None):
                    pass  # mxperf's own range log and traces: the ranges' attributes carry the precision
                else:
                    raise InputError(
                        f"{r.path}: labels incomplete, missing {', '.join(missing)} (--label or {Path(r.path).parent / 'mxperf.toml'})"
                    )
            else:
                continue
        mb = microbatch_table(r.ranges, labels, pattern=pattern)
        if len(mb) == 0:
            notes.append(
                f"{r.path}: labelled, but no micro-batch ranges found (use --microbatch-range PATTERN)"
            )
            continue
        if mb["precision"].isna().any() or mb["model"].isna().any():
            raise InputError(
                f"{r.path}: micro-batches lack a model or precision; pass --label model=...,precision=..."
            )
        tables.append(mb.assign(trace=r.path))  # an extra column: whose kernels are whose (perfmodel.inputs)
    if not tables:
        return None, notes
    return pd.concat(tables, ignore_index=True), notes


def spec_json(results: list[FileResult]) -> dict[str, Any]:
    traces = []
    for r in results:
        devices = [
            {
                "rank": None if pd.isna(d.rank) else int(d.rank),
                "pid": None if pd.isna(d.pid) else int(d.pid),
                "device": int(d.device),
                "span_ns": int(d.span_ns),
                "busy_ns": int(d.busy_ns),
                "idle_ns": int(d.idle_ns),
                "host_stall_ns": int(d.host_stall_ns),
                "num_kernels": int(d.num_kernels),
            }
            for d in r.devices.itertuples(index=False)
        ]
        traces.append({"path": r.path, "format": r.format, "devices": devices})
    return {"schema_version": store.SCHEMA_VERSION, "traces": traces}


def summary_lines(results: list[FileResult]) -> list[str]:
    lines = []
    for r in results:
        rank = "?" if r.rank is None else str(r.rank)
        lines.append(f"{r.path} [{r.format}, rank {rank}]: {r.num_events} events, {len(r.ranges)} ranges")
        if r.gpu_reason:
            lines.append(f"  no GPU devices: {r.gpu_reason}; GPU metrics are null")
        for d in r.devices.itertuples(index=False):
            span = d.span_ns or 1
            lines.append(
                f"  pid {d.pid} device {d.device}: span {d.span_ns / 1e6:.1f} ms, busy {d.busy_ns / 1e6:.1f} ms "
                f"({100 * d.busy_ns / span:.1f} %), host stall {d.host_stall_ns / 1e6:.1f} ms ({100 * d.host_stall_ns / span:.1f} %), "
                f"{d.num_kernels} kernels"
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
    items = expand_inputs(args.paths)
    unfinished = unfinished_run_notes(items)
    config = {
        "paths": [str(p) for p in args.paths],
        "labels": cli_labels.as_dict(),
        "rank": args.rank,
        "microbatch_range": args.microbatch_range,
        "phase_map": args.phase_map,
        "python_functions": args.python_functions,
    }
    inputs = [*args.paths, *([args.phase_map] if args.phase_map else [])]
    with OutputDir(args.out, kind="ingest", config=config, force=args.force, inputs=inputs) as od:
        stage = od.path / STAGING
        stage.mkdir()
        try:
            results = ingest_many(
                items,
                str(stage),
                rank=args.rank,
                workers=args.workers,
                ray_address=args.ray,
                phase_map_path=args.phase_map,
                include_python=args.python_functions,
            )
            microbatches, notes = _microbatches(results, cli_labels, args.microbatch_range)
            _write(od.path, results, microbatches)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            for f in od.path.rglob("*.parquet"):
                f.unlink(missing_ok=True)
            raise
        shutil.rmtree(stage, ignore_errors=True)
        traces = spec_json(results)["traces"]
        for t, r in zip(traces, results, strict=True):  # the machine that made the trace, where it says
            t["gpu_names"] = sorted({str(n) for n in (r.meta.get("gpu_names") or {}).values() if n})
        od.update(
            traces=traces, microbatches=0 if microbatches is None else len(microbatches), notes=unfinished
        )
    for line in [*summary_lines(results), *unfinished, *notes]:
        print(line, file=sys.stderr)
    if microbatches is not None:
        print(f"{len(microbatches)} micro-batches -> {od.path / store.MICROBATCHES}", file=sys.stderr)
    if args.json:
        print(json.dumps(spec_json(results), separators=(",", ":")))
    return 0


def _write(out: Path, results: list[FileResult], microbatches: pd.DataFrame | None) -> None:
    taken: set[str] = set()
    for i, r in enumerate(results):
        if r.staged_events:
            target = store.events_path(out, _events_name(r, taken, i))
            target.parent.mkdir(parents=True, exist_ok=True)
            Path(r.staged_events).replace(target)
    for name, attr, cols in (
        (store.DEVICES, "devices", schema.DEVICE_COLUMNS),
        (store.STREAMS, "streams", schema.STREAM_COLUMNS),
        (store.RANGES, "ranges", schema.RANGE_COLUMNS),
        (store.KERNELS, "kernels", schema.KERNEL_COLUMNS),
        (store.STEPS, "steps", schema.STEP_COLUMNS),
    ):
        frames = [getattr(r, attr) for r in results if len(getattr(r, attr))]
        df = pd.concat(frames, ignore_index=True) if frames else schema.empty_frame(cols)
        store.write_table(schema.conform(df, cols, name), out / name)
    if microbatches is not None:
        store.write_table(microbatches, out / store.MICROBATCHES)
