"""Finding and reading the output directories under RUNS_DIR: the dashboard's only door to the disk.

The dashboard never computes anything from raw traces; it reads the finished files that ``mxperf run``,
``sweep``, ``ingest`` and ``fit`` write (docs/contracts.md, "Output directories"). This module:

* discovers output directories (any folder under RUNS_DIR holding a ``manifest.json``) and summarises each
  manifest into an :class:`OutputEntry` (kind, model, precisions, steps, date, status) for the Runs table;
* reads their tables through ``tracing.outputs.store`` (Parquet, ``schema_version`` checked; never pickle);
* refuses any path that resolves outside RUNS_DIR (``..``, absolute paths, symlinks pointing out);
* turns every way an output can be unusable -- missing file, ``status: running`` (half-written),
  ``failed``/``interrupted``, corrupt Parquet or JSON -- into one :class:`CardError` whose message a page
  shows on that card while the rest of the page keeps working.

Everything here is plain Python (no Streamlit), so tests call it directly; ``dashboards.ui`` adds caching.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dashboards.provenance import Provenance, combine, provenance
from dashboards.settings import RUNS_DIR_ENV
from tracing.outputs import store
from tracing.outputs.errors import InputError, MxperfError

MAX_DEPTH = 4  # RUNS_DIR/<group>/<sub>/<dir>/manifest.json is as deep as discovery looks
# Folders inside an output directory that hold its own pieces, never another output directory.
_SKIP_DIRS = frozenset({store.EVENTS_DIR, store.TRACE_DIR, "__pycache__", ".git"})


class CardError(MxperfError):
    """An output (or one of its files) that a card cannot show; the message says why and what to do."""


@dataclass(frozen=True)
class OutputEntry:
    """One output directory as the Runs table shows it. ``rel`` is its path relative to RUNS_DIR."""

    rel: str
    kind: str | None
    status: str | None
    model: str | None = None
    learner: str | None = None
    sampler: str | None = None
    precisions: tuple[str, ...] = ()
    steps: int | None = None
    created: str | None = None
    device: str | None = None
    low_precision: str | None = None
    inputs: str | None = None
    error: str | None = None
    manifest: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Ingested traces: where the precision and model came from (``label`` | ``kernels`` | ``embedding``),
    # the kernels' evidence in words, and the disagreement between a label and the kernels, if any.
    precision_from: str | None = None
    model_from: str | None = None
    evidence: str | None = None
    conflict: str | None = None

    @property
    def usable(self) -> bool:
        return self.error is None and self.status == "complete"

    @property
    def precision_label(self) -> str:
        """``learner/sampler`` for runs (``mxfp8/bf16``), else the precisions joined (``bf16, mxfp8``)."""
        if self.learner or self.sampler:
            return f"{self.learner or '?'}/{self.sampler or '?'}"
        return ", ".join(self.precisions)

    @property
    def label(self) -> str:
        parts = [p for p in (self.kind, self.model, self.precision_label, self.inputs) if p]
        return f"{self.rel}  ({' · '.join(parts)})" if parts else self.rel


def runs_dir_from_env(default: str | None = None) -> Path:
    """RUNS_DIR as set by ``mxperf dash`` (environment variable ``MXPERF_RUNS_DIR``)."""
    raw = os.environ.get(RUNS_DIR_ENV, default)
    if not raw:
        raise InputError(f"no runs directory: set {RUNS_DIR_ENV} or start with `mxperf dash RUNS_DIR`")
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise InputError(f"{path}: runs directory does not exist or is not a directory")
    return path


def resolve_inside(runs_dir: Path, rel: str | os.PathLike[str]) -> Path:
    """``runs_dir / rel`` after resolving links; a path that lands outside RUNS_DIR is refused."""
    root = Path(runs_dir).resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        link = " (a link pointing out of it)" if (root / rel).is_symlink() else ""
        raise CardError(
            f"{Path(rel).as_posix()}: outside the runs directory {root}{link}; "
            "the dashboard only reads files under it"
        )
    return target


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key)
        if value not in (None, "", [], {}):
            return value
    return None


def _as_tuple(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, Iterable):
        return tuple(str(v) for v in value)
    return (str(value),)


def summarize_manifest(rel: str, manifest: Mapping[str, Any]) -> OutputEntry:
    """An :class:`OutputEntry` from a manifest; tolerant of the per-kind ``config`` keys producers use."""
    config = manifest.get("config") or {}
    if not isinstance(config, Mapping):
        config = {}
    label = config.get("label") or config.get("labels") or {}
    if not isinstance(label, Mapping):
        label = {}
    learner = _first(config, "learner", "learner_precision")
    sampler = _first(config, "sampler", "sampler_precision")
    precisions = _as_tuple(_first(config, "precisions", "precision") or _first(label, "precision"))
    if not precisions:
        precisions = tuple(p for p in (learner, sampler) if p)
    steps = _first(manifest, "steps_completed", "steps", "num_steps") or _first(config, "steps", "num_steps")
    paths = _as_tuple(_first(config, "paths", "inputs"))
    inputs = None
    if paths and manifest.get("kind") in ("ingest", "fit"):
        inputs = Path(paths[0]).name + (f" +{len(paths) - 1}" if len(paths) > 1 else "")
    model = _first(config, "model", "models") or _first(label, "model")
    facts = trace_precision(manifest, precisions[0] if len(precisions) == 1 else None)
    labelled = bool(precisions)
    if not precisions and facts.precision:
        precisions = (facts.precision,)
    prov = provenance(manifest, precisions) if manifest.get("kind") != "fit" else None
    return OutputEntry(
        rel=rel,
        kind=manifest.get("kind"),
        status=manifest.get("status"),
        model=model,
        learner=learner,
        sampler=sampler,
        precisions=precisions,
        precision_from="label" if labelled else facts.source,
        model_from="label" if model else None,
        evidence=facts.evidence,
        conflict=facts.conflict,
        steps=int(steps) if isinstance(steps, int | float) else None,
        created=manifest.get("created"),
        device=prov.device if prov else None,
        low_precision=prov.low_precision if prov else None,
        inputs=inputs,
        manifest=dict(manifest),
    )


@dataclass(frozen=True)
class TracePrecision:
    """What an ingest's traces say about its precision (``traces[].precision_evidence`` in the manifest)."""

    precision: str | None = None  # the mxperf id the GEMM kernels name (None: no id, or no GPU GEMMs)
    evidence: str | None = None
    conflict: str | None = None
    from_kernels: bool = False

    @property
    def source(self) -> str | None:
        return "kernels" if self.from_kernels else None


def _evidence_words(ev: Mapping[str, Any]) -> str:
    said = ev.get("precision") or ev.get("family") or "unknown"
    text = f"{said}: {ev.get('reason') or 'GEMM kernel names'}"
    if ev.get("example"):
        ex = str(ev["example"])
        text += f" (e.g. {ex if len(ex) <= 60 else ex[:57] + '...'})"
    return text


def trace_precision(manifest: Mapping[str, Any], label: str | None) -> TracePrecision:
    """The precision an ingest's GEMM kernels name, the evidence in words, and -- when ``label`` (the
    ``--label precision`` or a run's learner) says otherwise -- the disagreement. A trace whose kernels name
    no precision id (FP32 / TF32, FP8 without a recipe) gives its family as evidence and no precision."""
    if manifest.get("kind") != "ingest":
        return TracePrecision()
    evs = [t["precision_evidence"] for t in manifest.get("traces") or [] if isinstance(t, Mapping)
           and isinstance(t.get("precision_evidence"), Mapping)]  # fmt: skip
    if not evs:
        return TracePrecision()
    ids = sorted({str(e["precision"]) for e in evs if e.get("precision")})
    families = sorted({str(e.get("family")) for e in evs if e.get("family")})
    words = "; ".join(dict.fromkeys(_evidence_words(e) for e in evs))
    conflict = None
    if len(ids) > 1:
        conflict = f"the traces' kernels name different precisions ({', '.join(ids)})"
    elif label and ids and ids[0] != label:
        conflict = f"labelled {label}, but the GEMM kernels say {ids[0]}"
    elif label and not ids and families and not any(label.startswith(f) for f in families):
        conflict = f"labelled {label}, but the GEMMs look {', '.join(families)}"
    found = ids[0] if len(ids) == 1 else None
    return TracePrecision(precision=found, evidence=words, conflict=conflict, from_kernels=found is not None)


def _trace_model(root: Path, rel: str) -> str | None:
    """The model an ingest's micro-batches name (``unlabelled-v<vocab>-h<hidden>`` from the embedding's
    shape when unlabelled): the ``model`` column of its microbatches.parquet, when it holds exactly one."""
    try:
        path = resolve_inside(root, Path(rel) / store.MICROBATCHES)
        if not path.is_file():
            return None
        models = set(store.read_arrow(path, ["model"]).column("model").to_pylist()) - {None, "", "unlabelled"}
    except (MxperfError, KeyError, ValueError):
        return None
    return str(next(iter(models))) if len(models) == 1 else None


def _with_trace_model(root: Path, entry: OutputEntry) -> OutputEntry:
    if entry.kind != "ingest" or entry.model or entry.status != "complete":
        return entry
    from dataclasses import replace

    model = _trace_model(root, entry.rel)
    return replace(entry, model=model, model_from="embedding" if model else None) if model else entry


def _manifest_dirs(root: Path) -> Iterable[Path]:
    """Folders under ``root`` (depth <= MAX_DEPTH, links not followed) that hold a manifest.json."""
    for current, dirs, files in os.walk(root, followlinks=False):
        depth = len(Path(current).relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        if depth >= MAX_DEPTH:
            dirs[:] = []
        if store.MANIFEST in files:
            yield Path(current)


def links_outside(runs_dir: Path) -> list[str]:
    """Folders under RUNS_DIR (as deep as discovery looks) that are links resolving outside it: discovery
    never follows them, so the outputs they point to are skipped; the Runs page names them (paths under
    RUNS_DIR, never the target's)."""
    root = Path(runs_dir).resolve()
    out: list[str] = []
    for current, dirs, _ in os.walk(root, followlinks=False):
        here = Path(current)
        for d in sorted(dirs):
            link = here / d
            if link.is_symlink() and not link.resolve().is_relative_to(root):
                out.append(link.relative_to(root).as_posix())
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")]
        if len(here.relative_to(root).parts) >= MAX_DEPTH:
            dirs[:] = []
    return sorted(out)


def discover_outputs(runs_dir: Path) -> list[OutputEntry]:
    """Every output directory under RUNS_DIR, sorted by path. Unreadable manifests -- and manifests that
    are links leaving RUNS_DIR, which are never read -- become entries with ``error`` set (shown in the
    table), so one broken directory never hides the others."""
    root = Path(runs_dir).resolve()
    entries: list[OutputEntry] = []
    for path in _manifest_dirs(root):
        rel = path.relative_to(root).as_posix() or "."
        try:
            manifest = store.read_json(resolve_inside(root, Path(rel) / store.MANIFEST))
        except (InputError, CardError) as exc:
            entries.append(OutputEntry(rel=rel, kind=None, status=None, error=str(exc)))
            continue
        entry = _with_trace_model(root, summarize_manifest(rel, manifest))
        if entry.kind is None or entry.status is None:
            missing = "kind" if entry.kind is None else "status"
            entry = _with_error(entry, f"{rel}/{store.MANIFEST}: manifest has no '{missing}'")
        entries.append(entry)
    return with_fit_provenance(sorted(entries, key=lambda e: e.rel))


def _with_error(entry: OutputEntry, error: str) -> OutputEntry:
    from dataclasses import replace

    return replace(entry, error=error)


def inputs_of(fit: OutputEntry, candidates: Iterable[OutputEntry]) -> list[OutputEntry]:
    """The outputs among ``candidates`` that a fit read: its manifest's ``config.inputs`` as given on the
    ``mxperf fit`` command line (relative to where it ran, or absolute), matched by their trailing path."""
    config = fit.manifest.get("config") or {}
    raw = _as_tuple(config.get("inputs")) if isinstance(config, Mapping) else ()
    wanted = [Path(p).as_posix().rstrip("/") for p in raw]
    return [c for c in candidates if any(w == c.rel or w.endswith("/" + c.rel) for w in wanted)]


def entry_provenance(entry: OutputEntry, entries: Iterable[OutputEntry] = ()) -> Provenance:
    """Device and emulation of an output; a fit takes them from its inputs found under RUNS_DIR."""
    if entry.kind == "fit":
        return combine(
            provenance(e.manifest, e.precisions) for e in inputs_of(entry, entries) if e.error is None
        )
    return provenance(entry.manifest, entry.precisions)


def with_fit_provenance(entries: list[OutputEntry]) -> list[OutputEntry]:
    """Entries with each fit's device / low-precision columns filled from its inputs."""
    from dataclasses import replace

    out = []
    for e in entries:
        if e.kind == "fit" and e.error is None:
            prov = entry_provenance(e, entries)
            e = replace(e, device=prov.device, low_precision=prov.low_precision)
        out.append(e)
    return out


def newest_first(entries: Iterable[OutputEntry]) -> list[OutputEntry]:
    return sorted(entries, key=lambda e: (e.created or "", e.rel), reverse=True)


def entries_frame(entries: Iterable[OutputEntry]) -> pd.DataFrame:
    """The Runs table: one row per output directory, newest first."""
    rows = [
        {
            "path": e.rel,
            "kind": e.kind,
            "model": e.model,
            "precisions": e.precision_label,
            "inputs": e.inputs,
            "steps": e.steps,
            "device": e.device,
            "low precision": e.low_precision,
            "created": _short_time(e.created),
            "status": e.status if e.error is None else "unreadable",
            "problem": e.error or status_problem(e),
            "found in trace": found_in_trace(e),
            "label vs kernels": e.conflict,
        }
        for e in entries
    ]
    cols = [
        "path",
        "kind",
        "model",
        "precisions",
        "device",
        "low precision",
        "status",
        "steps",
        "created",
        "inputs",
        "found in trace",
        "label vs kernels",
        "problem",
    ]
    df = pd.DataFrame(rows, columns=cols)
    df["steps"] = df["steps"].astype("Int64")
    return df.sort_values(["created", "path"], ascending=[False, True], na_position="last", ignore_index=True)


def found_in_trace(e: OutputEntry) -> str | None:
    """What an ingest's traces said about its precision and model, and whether a label was used instead."""
    parts = []
    if e.evidence:
        used = (
            "used" if e.precision_from == "kernels" else "label used" if e.precision_from == "label" else ""
        )
        parts.append(
            f"precision from GEMM kernels ({used}) -- {e.evidence}"
            if used
            else f"GEMM kernels -- {e.evidence}"
        )
    if e.model_from == "embedding":
        parts.append(f"model {e.model} from the embedding table's shape (microbatches.parquet)")
    return "; ".join(parts) or None


def _short_time(iso: str | None) -> str | None:
    """'2026-11-29T15:24:04+00:00' -> '2026-11-29 15:24 UTC' (sortable, readable in a table)."""
    if not iso:
        return None
    try:
        ts = pd.Timestamp(iso)
    except ValueError:
        return str(iso)
    return ts.tz_convert("UTC").strftime("%Y-%m-%d %H:%M UTC") if ts.tzinfo else ts.strftime("%Y-%m-%d %H:%M")


def status_problem(entry: OutputEntry) -> str | None:
    if entry.status == "complete":
        return None
    if entry.status == "running":
        return "still being written (status: running), or its writer died; shown once it completes"
    reason = entry.manifest.get("error")
    return f"ended {entry.status}" + (f": {reason}" if reason else "")


def check_usable(entry: OutputEntry) -> None:
    """Raise :class:`CardError` unless the directory finished (``status: complete``) and its manifest reads."""
    if entry.error is not None:
        raise CardError(entry.error)
    if entry.status != "complete":
        raise CardError(f"{entry.rel}: {status_problem(entry)}")


def load_table(
    runs_dir: Path, entry: OutputEntry, name: str, *, required: bool = True
) -> pd.DataFrame | None:
    """Read ``name`` (a ``tracing.outputs.store`` file name) from an output directory.

    Missing file: :class:`CardError` (or None when ``required=False``); corrupt file: CardError with the
    reader's message; unfinished directory: CardError saying so.
    """
    check_usable(entry)
    path = resolve_inside(runs_dir, Path(entry.rel) / name)
    if not path.is_file():
        if not required:
            return None
        raise CardError(f"{entry.rel}: has no {name} (this {entry.kind} output does not include it)")
    try:
        return store.read_table(path)
    except InputError as exc:
        raise CardError(f"{entry.rel}/{name}: {_strip_path(exc, path)}") from None


def load_json(runs_dir: Path, entry: OutputEntry, name: str) -> dict[str, Any]:
    check_usable(entry)
    path = resolve_inside(runs_dir, Path(entry.rel) / name)
    if not path.is_file():
        raise CardError(f"{entry.rel}: has no {name}")
    try:
        return store.read_json(path)
    except InputError as exc:
        raise CardError(f"{entry.rel}/{name}: {_strip_path(exc, path)}") from None


def list_files(runs_dir: Path, entry: OutputEntry, pattern: str) -> list[str]:
    """Names (relative to the output directory) matching a glob, e.g. ``events/rank-*.parquet``."""
    check_usable(entry)
    base = resolve_inside(runs_dir, entry.rel)
    found = []
    for p in base.glob(pattern):
        rel = p.relative_to(base)
        try:
            if resolve_inside(runs_dir, Path(entry.rel) / rel).is_file():
                found.append(rel.as_posix())
        except CardError:
            continue  # a link leaving RUNS_DIR is never offered
    return sorted(found)


def has_file(runs_dir: Path, entry: OutputEntry, name: str) -> bool:
    """Whether a usable output holds ``name``; a link leaving RUNS_DIR counts as present, so the page
    that reads it shows the refusal on its card (rather than silently dropping the output)."""
    if not entry.usable:
        return False
    path = Path(runs_dir) / entry.rel / name
    return path.is_symlink() or path.is_file()


def file_stamp(runs_dir: Path, entry: OutputEntry, name: str) -> int:
    """Modification time (ns) of a file, 0 when absent or refused: the cache key that makes reloads see
    new files (the read itself raises the refusal, on its card)."""
    try:
        return resolve_inside(runs_dir, Path(entry.rel) / name).stat().st_mtime_ns
    except (OSError, CardError):
        return 0


def _strip_path(exc: Exception, path: Path) -> str:
    msg = str(exc)
    prefix = f"{path}: "
    return msg[len(prefix) :] if msg.startswith(prefix) else msg
