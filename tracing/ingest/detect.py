"""Which reader a path needs (Kineto JSON, nsys SQLite, mxperf range log, verl / NeMo RL metric log) and the
one call that reads a trace (:func:`load_trace`).
"""

from __future__ import annotations

import os
from pathlib import Path

from tracing.ingest.metric_logs import METRIC_LOG, is_metric_log, looks_like_metric_lines
from tracing.ingest.rangelog import is_run_dir, load_range_log
from tracing.ingest.trace import Trace
from tracing.outputs import store
from tracing.outputs.errors import InputError, TraceFormatError

FORMATS = ("kineto", "nsys", "rangelog", METRIC_LOG)
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
_TRACE_GLOBS = ("*.json", "*.json.gz", "*.sqlite", "*.nsys-rep")


def detect_format(path: str | os.PathLike[str]) -> str:
    """kineto | nsys | rangelog | metric_log, from what the file is (not only its name)."""
    p = Path(path)
    if is_run_dir(p) or p.name == store.RANGES:
        return "rangelog"
    if not p.exists():
        raise TraceFormatError(p, "no such file")
    if p.suffix in NSYS_REPORT_SUFFIXES or p.suffix in (".sqlite", ".sqlite3", ".db"):
        return "nsys"  # by name too: a .sqlite that is not SQLite gets the nsys reader's error, not Kineto's
    if p.is_file():
        with open(p, "rb") as fh:
            if fh.read(16) == b"SQLite format 3\x00":
                return "nsys"
    if is_metric_log(p):  # verl / NeMo RL per-step metrics (.jsonl, or .json that starts like one)
        return METRIC_LOG
    return "kineto"


def expand_inputs(paths: list[str | os.PathLike[str]]) -> list[tuple[Path, str]]:
    """Paths -> (file, format). A run directory gives its range log plus its traces (``trace/rank-*.json.gz``
    and a sampler process's ``trace/sampler/*.json.gz``); another directory gives the traces in it."""
    out: list[tuple[Path, str]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            refuse_mxperf_output(p)
        if is_run_dir(p):
            out.append((p, "rangelog"))
            traces = sorted((p / store.TRACE_DIR).glob("rank-*.json*"))
            traces += sorted((p / store.TRACE_DIR / store.SAMPLER_TRACE_DIR).glob("*.json*"))
            out.extend((t, "kineto") for t in traces)
        elif p.is_dir():
            found = sorted(
                {f for g in _TRACE_GLOBS for f in p.glob(g) if f.is_file() and f.name != store.MANIFEST}
            )
            # JSON lines with a step (verl's file logger), not other JSON lines (NeMo RL's per-sample dumps)
            found += sorted(f for f in p.glob("*.jsonl") if f.is_file() and looks_like_metric_lines(f))
            if not found:
                raise InputError(
                    f"{p}: directory holds no traces (*.json, *.json.gz, *.sqlite), no metric logs (*.jsonl) and no {store.RANGES}"
                )
            out.extend((f, detect_format(f)) for f in found)
        else:
            out.append((p, detect_format(p)))
    refuse_duplicates([f for f, fmt in out if fmt != "rangelog" or f.is_file()])
    return out


def refuse_duplicates(files: list[Path]) -> None:
    """One file given twice (by two paths, or inside a folder also given) or two files with the same bytes would
    each count as a trace of its own (two ranks of one job): refuse, naming both. Bytes are compared only
    between files of equal size."""
    import hashlib

    seen: dict[Path, Path] = {}
    by_size: dict[int, list[Path]] = {}
    for f in files:
        real = f.resolve()
        if real in seen:
            also = "" if str(seen[real]) == str(f) else f" (also as {seen[real]})"
            raise InputError(f"{f}: given twice{also}; pass each trace once")
        seen[real] = f
        if f.is_file():
            by_size.setdefault(f.stat().st_size, []).append(f)
    for same_size in (fs for fs in by_size.values() if len(fs) > 1):
        digests: dict[bytes, Path] = {}
        for f in same_size:
            with open(f, "rb") as fh:
                digest = hashlib.file_digest(fh, lambda: hashlib.blake2b(digest_size=16)).digest()
            first = digests.setdefault(digest, f)
            if first != f:
                raise InputError(
                    f"{f}: the same bytes as {first} (a copy of one trace would count as two ranks); pass each "
                    "trace once"
                )


_NOT_TRACES = {
    "ingest": "already an ingest output: read it with mxperf ranges {p} or mxperf fit {p}",
    "fit": "a fit output (fits.json, report.md): there is nothing to ingest in it",
    "demo": "a demo folder: its sweep is fitted with mxperf fit {p}/sweep",
}


def refuse_mxperf_output(p: Path) -> None:
    """An mxperf output folder other than a run or sweep (those hold a range log and traces) is not a folder
    of traces: say what it is, rather than reading its tables as a range log or its manifest as a trace."""
    if not (p / store.MANIFEST).is_file():
        return
    try:
        manifest = store.read_json(p / store.MANIFEST)
    except InputError:
        return
    kind = manifest.get("kind")
    if not isinstance(kind, str) or "mxperf_version" not in manifest or kind in ("run", "sweep"):
        return
    what = _NOT_TRACES.get(kind, f"an mxperf {kind} output, not a run, a sweep or a folder of traces")
    raise InputError(f"{p}: {what.format(p=p)}")


def load_trace(
    path: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    rank: int | None = None,
    include_python: bool = False,
) -> Trace:
    """Read any supported trace into a :class:`Trace` (``include_python``: keep Kineto ``python_function``)."""
    fmt = fmt or detect_format(path)
    if fmt == "kineto":  # the whole-file readers (pandas frames) load where a notebook asks for them
        from tracing.ingest.kineto import load_kineto_events

        return load_kineto_events(path, rank=rank, include_python=include_python)
    if fmt == "nsys":
        from tracing.ingest.decoded import load_nsys_events

        return load_nsys_events(path, rank=rank)
    if fmt == "rangelog":
        return load_range_log(path, rank=rank)
    if fmt == METRIC_LOG:
        raise InputError(
            f"{path}: a metric log (per-step numbers), not a trace; ingest it with mxperf ingest"
        )
    raise InputError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
