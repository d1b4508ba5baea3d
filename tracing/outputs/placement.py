"""Where an output directory may go, and how a finished one takes its place: the ``-o`` / ``--force`` rules
and the swap of a sibling temp folder into place (docs/contracts.md, "Output directories").

Rules, checked before any work and again at the swap:
- a new path or an empty folder is always fine;
- a folder that holds an input of the command is never written (not even with ``--force``);
- a non-empty folder is replaced only with ``--force``, only when its ``manifest.json`` says it is an mxperf
  output of the same kind, only when it holds nothing mxperf did not write (the manifest's ``files``), and
  never when mxperf runs inside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import fnmatch
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracing.outputs import store
from tracing.outputs.errors import InputError, OutputExistsError, OutputWriteError

FORCE_HELP = "replace an mxperf output of this kind at -o (kept until the new one is complete)"
OUT_HELP = "output folder: new, empty, or an mxperf output of this kind with --force"
TEMP_SUFFIX = ".mxperf-partial"  # .<name>.<random>.mxperf-partial beside the target while it is built
# What an output written before manifests listed their files may hold (anything else is someone's file).
LEGACY_PATTERNS = (
    store.MANIFEST,
    "*.parquet",
    store.EVENTS_DIR,
    store.TRACE_DIR,
    store.FITS,
    store.REPORT,
    "*.png",
    "tokenizer.json",
    "microbatches.csv",  # benchmarks/gpu_sweep.py, before its Parquet conversion
    "traces",
    ".staging",
    ".*.tmp",
    ".*.tmp.png",
    "sweep",
    "fit",
    "consistency",
)


KINDS = ("run", "sweep", "ingest", "fit", "demo")  # demo: the top folder of `mxperf demo`
STATUSES = ("running", "complete", "failed", "interrupted")


def is_mxperf_manifest(data: Mapping[str, Any]) -> bool:
    """A manifest mxperf wrote: a kind, a known status and the mxperf version."""
    return data.get("kind") in KINDS and data.get("status") in STATUSES and "mxperf_version" in data


def _old_manifest(target: Path) -> dict[str, Any] | None:
    try:
        data = store.read_json(target / store.MANIFEST)
    except (InputError, OSError):
        return None
    return data if is_mxperf_manifest(data) else None


def file_listing(folder: Path) -> list[str]:
    """Every file and link under ``folder`` (relative, sorted), the manifest itself excluded."""
    out = []
    for current, dirs, files in os.walk(folder):
        rel = Path(current).relative_to(folder)
        out += [(rel / f).as_posix() for f in files]
        out += [(rel / d).as_posix() for d in dirs if (Path(current) / d).is_symlink()]
    return sorted(f for f in out if f != store.MANIFEST)


def _foreign(target: Path, manifest: Mapping[str, Any]) -> str | None:
    """The first entry of ``target`` mxperf did not write (None when there is none)."""
    listed = manifest.get("files")
    if isinstance(listed, list):
        known = set(map(str, listed))
        return next((f for f in file_listing(target) if f not in known), None)
    for entry in sorted(os.listdir(target)):  # an older manifest: judge the top level by name
        if not any(fnmatch.fnmatch(entry, pat) for pat in LEGACY_PATTERNS):
            return entry
    return None


def _legacy_demo(folder: Path) -> bool:
    """A demo folder from before the demo had its own manifest: only sweep/, fit/, consistency/, each a
    complete mxperf output holding only what mxperf wrote."""
    entries = sorted(os.listdir(folder))
    if not entries or not set(entries) <= {"sweep", "fit", "consistency"}:
        return False
    for name in entries:
        sub = folder / name
        old = _old_manifest(sub) if sub.is_dir() else None
        if old is None or _foreign(sub, old) is not None:
            return False
    return True


def held_input(target: Path, inputs: Sequence[str | os.PathLike[str]]) -> str | None:
    """The first input that is ``target`` or lies inside it."""
    where = target.resolve()
    for raw in inputs:
        p = Path(raw).resolve()
        if p == where or where in p.parents:
            return str(raw)
    return None


def check_target(
    target: str | os.PathLike[str],
    *,
    kind: str,
    force: bool,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> None:
    """Raise :class:`OutputExistsError` (one line, naming the folder and what to do) unless an output of
    ``kind`` may be written to ``target``; changes nothing on disk."""
    t = Path(target)
    if t.exists() and not t.is_dir():
        raise OutputExistsError(f"{t}: exists and is not a directory; choose another -o")
    blocker = next((p for p in t.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise OutputExistsError(f"{t}: {blocker} is a file, not a folder; choose another -o")
    held = held_input(t, inputs)
    if held is not None:
        what = "is" if Path(held).resolve() == t.resolve() else "holds"
        raise OutputExistsError(
            f"{t}: {what} {held}, an input of this command; write the output to another folder (-o)"
        )
    if not t.is_dir() or not any(t.iterdir()):
        return
    old = _old_manifest(t)
    if old is None and kind == "demo" and _legacy_demo(t):
        old = {"kind": "demo", "status": "complete", "files": file_listing(t)}
    if old is None:
        raise OutputExistsError(
            f"{t}: not empty and not an mxperf output (no mxperf {store.MANIFEST}); --force replaces only "
            "mxperf outputs: choose another -o"
        )
    stranger = _foreign(t, old)
    if stranger is not None:
        raise OutputExistsError(
            f"{t}: holds {stranger}, which mxperf did not write; --force replaces only what mxperf wrote: "
            "move it away or choose another -o"
        )
    if old["kind"] != kind:
        raise OutputExistsError(
            f"{t}: holds an mxperf {old['kind']} output; --force replaces only a {kind} output: choose another -o"
        )
    if not force:
        raise OutputExistsError(
            f"{t}: holds an mxperf {kind} output (status {old['status']}); pass --force to replace it "
            "(kept until the new one is complete) or choose another -o"
        )
    here = Path.cwd()
    if t.resolve() == here or t.resolve() in here.parents:
        raise OutputExistsError(
            f"{t}: mxperf runs inside it, so it cannot be replaced whole; run from another folder or "
            "choose another -o"
        )


def make_temp_sibling(target: Path) -> Path:
    """An empty folder beside ``target`` (same filesystem: the swap is a rename), with the mode ``mkdir``
    would give (mkdtemp's 0700 would make shared result folders unreadable)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent))
    tmp.chmod(0o777 & ~store.umask())
    return tmp


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C / SIGTERM wait until the block is done (a swap is never left half-way)."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - no pthread_sigmask
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def swap_in(tmp: Path, target: Path) -> None:
    """Put the finished folder ``tmp`` at ``target``; an old output there is removed only afterwards."""
    with _signals_held():
        try:
            if target.is_dir() and any(target.iterdir()):
                if not _exchange(tmp, target):
                    old = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.mxperf-old")
                    os.rename(target, old)
                    try:
                        os.rename(tmp, target)
                    except OSError:
                        os.rename(old, target)
                        raise
                    tmp = old
                shutil.rmtree(tmp, ignore_errors=True)  # now the old output
            elif target.is_dir():
                _into_empty(tmp, target)  # the user's own empty folder (its inode, mode, owner) stays
            else:
                os.rename(tmp, target)
        except OSError as exc:
            raise OutputWriteError(
                f"{target}: cannot put the output in place ({exc.strerror or exc}); it is complete in {tmp}"
            ) from None


def _into_empty(tmp: Path, target: Path) -> None:
    """Move the entries into an existing empty folder, the manifest last (a shell may be sitting in it)."""
    for entry in sorted(tmp.iterdir(), key=lambda p: p.name == store.MANIFEST):
        os.rename(entry, target / entry.name)
    tmp.rmdir()


def keep_attempt(tmp: Path, target: Path, status: str) -> Path | None:
    """Where a failed or interrupted attempt goes: nowhere when it holds nothing but its manifest (bad input
    leaves nothing behind); else ``target`` when nothing is there, else (the old output stays) a sibling
    ``<name>.<status>-<time>``. ``status`` "new": a complete output that found ``target`` taken. None: discarded."""
    with _signals_held():
        if status != "new" and not file_listing(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        if not target.exists() or (target.is_dir() and not any(target.iterdir())):
            if target.is_dir():
                _into_empty(tmp, target)
            else:
                os.rename(tmp, target)
            return target
        if not file_listing(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
        aside = target.with_name(f"{target.name}.{status}-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = target.with_name(f"{target.name}.{status}-{stamp}-{n}")
        os.rename(tmp, aside)
        return aside
