"""Adding a trace from the dashboard: store an upload under RUNS_DIR and ingest it with ``mxperf ingest``.

No Streamlit here. The ingest is the command line itself (``python -m mxperf.cli ingest ... --json``) run in
a child process with RUNS_DIR as its working directory, so the page gets exactly the CLI's validation, its
one-line errors and its output layout, a large trace neither blocks nor bloats the dashboard server, and a
stuck one can be stopped. Every path is confined to RUNS_DIR: uploads go to ``RUNS_DIR/uploads/<stamp>-
<name>/``, the output to ``RUNS_DIR/<name>`` (new names only, never an existing folder), picked inputs must
resolve inside RUNS_DIR (links included).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dashboards.data import MAX_DEPTH, resolve_inside
from dashboards.settings import DEFAULT_MAX_UPLOAD_MB, MAX_UPLOAD_ENV
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.labels import parse_labels

UPLOADS_DIR = "uploads"
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite3", ".db", ".nsys-rep")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_REPO = Path(__file__).resolve().parents[1]
_CHUNK = 1 << 20
# JSON files mxperf outputs hold that are not traces (never offered as inputs).
_NOT_TRACES = frozenset(
    {store.MANIFEST, store.FITS, "tokenizer.json", "config.json", "tokenizer_config.json"}
)


def max_upload_bytes() -> int:
    """The upload limit (``mxperf dash --max-upload-mb``, passed in the environment)."""
    raw = os.environ.get(MAX_UPLOAD_ENV, str(DEFAULT_MAX_UPLOAD_MB))
    try:
        mb = int(raw)
    except ValueError:
        mb = DEFAULT_MAX_UPLOAD_MB
    return max(mb, 1) * (1 << 20)


def is_trace_name(name: str) -> bool:
    return any(name.lower().endswith(s) for s in TRACE_SUFFIXES)


def safe_upload_name(name: str) -> str:
    """The file name an upload is stored under: its base name with anything but ``A-Za-z0-9._-`` replaced;
    a name that is not a trace (by suffix) is refused."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(name).replace("\\", "/")).name).lstrip(".")
    if not base or not is_trace_name(base):
        raise InputError(
            f"{name!r}: not a trace file name; expected one of {', '.join(TRACE_SUFFIXES)} "
            "(Kineto .json/.json.gz, Nsight Systems .sqlite)"
        )
    return base


def check_output_name(runs_dir: Path, name: str) -> Path:
    """``RUNS_DIR/name`` for a new output: a plain folder name (no ``/``, no ``..``, no leading dot) that
    does not exist yet -- the page never replaces anything."""
    if not _NAME.fullmatch(name or "") or ".." in name:
        raise InputError(
            f"output name {name!r}: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    if name == UPLOADS_DIR:
        raise InputError(f"output name {name!r}: reserved for uploaded traces; choose another name")
    target = resolve_inside(runs_dir, name)
    if target.parent != Path(runs_dir).resolve():
        raise InputError(f"output name {name!r}: must be a folder directly under the runs directory")
    if target.exists() or (Path(runs_dir) / name).is_symlink():
        raise InputError(f"{name}: already exists under the runs directory; choose another name")
    return target


def default_output_name(runs_dir: Path, stem: str) -> str:
    """``ingest-<stem>``, or with ``-2``, ``-3`` ... the first that is not taken under RUNS_DIR, so the form's
    default after one ingest is never refused as existing."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:80] or "trace"
    base = f"ingest-{stem}"
    name, k = base, 1
    while (Path(runs_dir) / name).exists() or (Path(runs_dir) / name).is_symlink():
        k += 1
        name = f"{base}-{k}"
    return name


def ingest_warnings(manifest: Mapping[str, object]) -> list[str]:
    """What a finished ingest's manifest says a user must not miss: each trace's warnings (a label the
    kernels contradict) and step notes (steps inferred, renumbered or timed on the device), phases where no
    micro-batch was kept (with why), and the manifest's notes."""
    out: list[str] = []
    traces = manifest.get("traces")
    for t in traces if isinstance(traces, list) else []:
        if not isinstance(t, Mapping):
            continue
        path = t.get("path", "?")
        out += [f"{path}: {w}" for w in [*(t.get("warnings") or []), *(t.get("step_notes") or [])] if w]
        for note in t.get("microbatch_notes") or []:
            if not isinstance(note, Mapping) or note.get("microbatches"):
                continue
            why = "; ".join(str(p) for p in note.get("problems") or []) or f"source {note.get('source', '?')}"
            out.append(
                f"{path}: pid {note.get('pid', '?')} {note.get('phase', '?')}: 0 micro-batches kept ({why})"
            )
    notes = manifest.get("notes")
    out += [str(n) for n in notes if n] if isinstance(notes, list) else []
    return out


def label_argument(labels: Mapping[str, object]) -> str | None:
    """``model=M,precision=P,...`` from the form's fields (empty ones dropped), validated by the same
    parser the CLI uses; None when no label was given."""
    parts = [f"{k}={str(v).strip()}" for k, v in labels.items() if v not in (None, "", 0)]
    for k, v in labels.items():
        if isinstance(v, str) and re.search(r"[,=]", v):
            raise InputError(f"label {k}={v!r}: may not contain ',' or '='")
    if not parts:
        return None
    arg = ",".join(parts)
    parse_labels(arg)  # raises InputError with the CLI's message
    return arg


def content_hash(fh: BinaryIO) -> str:
    """SHA-256 of a file's bytes, read in chunks; a seekable file is left at its start again."""
    digest = hashlib.sha256()
    if hasattr(fh, "seek"):
        fh.seek(0)
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
    if hasattr(fh, "seek"):
        fh.seek(0)
    return digest.hexdigest()


def same_content(
    items: Iterable[tuple[str, int, Callable[[], str]]],
) -> list[tuple[str, str]]:
    """``(first, copy)`` for every item whose bytes equal an earlier one's. ``items``: (name, size in bytes,
    a function giving the content hash); only files of equal size are hashed."""
    by_size: dict[int, list[tuple[str, Callable[[], str]]]] = {}
    for name, size, digest in items:
        by_size.setdefault(int(size), []).append((name, digest))
    out = []
    for group in by_size.values():
        if len(group) < 2:
            continue
        seen: dict[str, str] = {}
        for name, digest in group:
            h = digest()
            if h in seen:
                out.append((seen[h], name))
            else:
                seen[h] = name
    return out


def duplicate_message(pairs: list[tuple[str, str]]) -> str:
    """The refusal for traces picked or uploaded twice (a trace set holds each rank's trace once)."""
    listed = "; ".join(f"{b} is the same file as {a}" for a, b in pairs)
    return (
        f"{listed} (identical content): several files are ingested as one multi-rank set, so a copy would "
        "count as another rank; drop the copy"
    )


def _size(fh: BinaryIO) -> int:
    size = getattr(fh, "size", None)
    if isinstance(size, int):
        return size
    pos = fh.tell()
    fh.seek(0, os.SEEK_END)
    end = fh.tell()
    fh.seek(pos)
    return end


def duplicate_uploads(
    files: Iterable[tuple[str, BinaryIO]], cache: MutableMapping[object, str] | None = None
) -> list[tuple[str, str]]:
    """Uploaded files with the same bytes as an earlier one; ``cache`` (keyed by the upload's ``file_id``
    when it has one) keeps a page from hashing an upload again on every rerun."""
    cache = {} if cache is None else cache

    def digest(fh: BinaryIO) -> Callable[[], str]:
        key = getattr(fh, "file_id", None) or id(fh)
        return lambda: cache[key] if key in cache else cache.setdefault(key, content_hash(fh))

    return same_content((name, _size(fh), digest(fh)) for name, fh in files)


def duplicate_picks(
    runs_dir: Path, rels: Iterable[str], cache: MutableMapping[object, str] | None = None
) -> list[tuple[str, str]]:
    """Picked trace files (relative to RUNS_DIR) with the same bytes as an earlier pick (an upload kept
    under ``uploads/`` and picked again, a copy under another name); hashes cached by path, size and time."""
    cache = {} if cache is None else cache
    items = []
    for rel in rels:
        path = resolve_inside(runs_dir, rel)
        if not path.is_file():
            continue
        st_ = path.stat()
        key = (rel, st_.st_size, st_.st_mtime_ns)

        def digest(path: Path = path, key: tuple = key) -> str:
            if key not in cache:
                with path.open("rb") as fh:
                    cache[key] = content_hash(fh)
            return cache[key]

        items.append((rel, st_.st_size, digest))
    return same_content(items)


def store_upload(
    runs_dir: Path, files: Iterable[tuple[str, BinaryIO]], limit_bytes: int | None = None
) -> list[str]:
    """Write uploaded files to ``RUNS_DIR/uploads/<UTC stamp>-<first name>/`` and return their paths relative
    to RUNS_DIR. Refuses (and leaves nothing behind) when the total passes ``limit_bytes`` or the disk would
    keep less than twice the upload free (the ingest writes about as much again)."""
    limit = max_upload_bytes() if limit_bytes is None else limit_bytes
    named = [(safe_upload_name(n), fh) for n, fh in files]
    if not named:
        raise InputError("no file uploaded")
    if len({n for n, _ in named}) != len(named):
        raise InputError("two uploaded files have the same name; rename one")
    if dups := duplicate_uploads(named):
        raise InputError(duplicate_message(dups))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder_rel = f"{UPLOADS_DIR}/{stamp}-{Path(named[0][0]).name.split('.')[0][:40]}"
    folder = resolve_inside(runs_dir, folder_rel)
    folder.mkdir(parents=True, exist_ok=False)
    total, out = 0, []
    try:
        for name, fh in named:
            fd, tmp = store.atomic_target(folder / name)
            with os.fdopen(fd, "wb") as dst:
                while chunk := fh.read(_CHUNK):
                    total += len(chunk)
                    if total > limit:
                        raise InputError(
                            f"upload larger than the limit of {limit / (1 << 20):.0f} MB (mxperf dash --max-upload-mb); "
                            "copy the trace under the runs directory and pick it instead"
                        )
                    dst.write(chunk)
            if shutil.disk_usage(folder).free < 2 * total:
                raise InputError(f"{folder}: not enough free disk to ingest {total / (1 << 20):.0f} MB")
            os.replace(tmp, folder / name)
            out.append(f"{folder_rel}/{name}")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return out


def find_traces(runs_dir: Path, limit: int = 500) -> list[str]:
    """Trace files under RUNS_DIR (depth <= MAX_DEPTH + 2, links never followed nor offered), relative
    paths sorted; ``events/`` tables and dot-folders are skipped."""
    root = Path(runs_dir).resolve()
    found: list[str] = []
    for current, dirs, names in os.walk(root, followlinks=False):
        depth = len(Path(current).relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != store.EVENTS_DIR)
        if depth >= MAX_DEPTH + 2:
            dirs[:] = []
        for n in sorted(names):
            p = Path(current) / n
            if (
                is_trace_name(n)
                and n not in _NOT_TRACES
                and not n.startswith("capture-")
                and not p.is_symlink()
            ):
                found.append(p.relative_to(root).as_posix())
        if len(found) >= limit:
            break
    return sorted(found)[:limit]


def check_inputs(runs_dir: Path, rels: Iterable[str]) -> list[str]:
    """Picked input paths: each must be a file that resolves inside RUNS_DIR."""
    out = []
    for rel in rels:
        path = resolve_inside(runs_dir, rel)
        if not path.is_file():
            raise InputError(f"{rel}: not a file under the runs directory")
        out.append(Path(rel).as_posix())
    if not out:
        raise InputError("pick at least one trace")
    if dups := duplicate_picks(runs_dir, out):
        raise InputError(duplicate_message(dups))
    return out


def ingest_command(inputs: list[str], out_name: str, label_arg: str | None) -> list[str]:
    """The ``mxperf ingest`` command line (paths relative to RUNS_DIR, the child's working directory)."""
    cmd = [sys.executable, "-m", "mxperf.cli", "ingest", *inputs, "-o", out_name, "--json"]
    return [*cmd, "--label", label_arg] if label_arg else cmd


@dataclass(frozen=True)
class IngestOutcome:
    ok: bool
    message: str  # the CLI's own one-line error on failure; a summary on success
    log: list[str]
    result: dict | None  # the --json line
    seconds: float


def run_ingest(
    runs_dir: Path,
    cmd: list[str],
    on_line: Callable[[str], None] | None = None,
    timeout_s: float = 3600.0,
) -> IngestOutcome:
    """Run the ingest in RUNS_DIR, feeding each stderr line to ``on_line`` as it comes (progress)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH")) if p),
    }
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=runs_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    log: list[str] = []
    try:
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            line = line.rstrip("\n")
            log.append(line)
            if on_line is not None:
                on_line(line)
        stdout = proc.stdout.read()
        rc = proc.wait()
    finally:
        timer.cancel()
    seconds = time.monotonic() - t0
    if rc != 0:
        why = next((ln for ln in reversed(log) if ln.strip()), f"mxperf ingest exited {rc}")
        if rc < 0:
            why = f"stopped after {timeout_s:.0f} s (the dashboard's limit); run `mxperf ingest` on the command line"
        return IngestOutcome(False, why, log, None, seconds)
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    try:
        result = json.loads(last) if last else None
    except json.JSONDecodeError:
        result = None
    return IngestOutcome(True, f"ingested in {seconds:.1f} s", log, result, seconds)


def discard_upload(runs_dir: Path, inputs: list[str]) -> None:
    """Remove the folder an upload was stored in (after a failed ingest); only ever under ``uploads/``."""
    uploads = resolve_inside(runs_dir, UPLOADS_DIR)
    for rel in inputs:
        folder = resolve_inside(runs_dir, rel).parent
        if folder.parent == uploads:
            shutil.rmtree(folder, ignore_errors=True)
