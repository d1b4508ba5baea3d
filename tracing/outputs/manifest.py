"""manifest.json: what made an output directory, on what machine, and how it ended.

Lifecycle (docs/contracts.md, "Output directories"): the output is built in a hidden sibling folder whose
manifest says ``running``; at the end the manifest is rewritten atomically with ``complete``, ``failed`` (the
error recorded) or ``interrupted`` (Ctrl-C, SIGTERM) and the files it lists, and the folder is put in place
(:mod:`tracing.outputs.placement`). A folder that still says ``running`` is half-written or its writer died.

    with OutputDir(out, kind="run", command=argv, config=cfg, compute_dtype="bfloat16") as od:
        store.write_table(df, od.path / store.METRICS)
        od.update(steps=20)          # extra keys end up in the final manifest
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tracing.outputs import placement, store
from tracing.outputs.errors import InputError, OutputExistsError, OutputWriteError, building, forget, shown
from tracing.outputs.version import __version__

KINDS, STATUSES = placement.KINDS, placement.STATUSES


def _version(dist: str) -> str | None:
    """The installed version of ``dist``: its imported module's ``__version__``, else the version in its one
    ``.dist-info`` folder's name, else ``importlib.metadata``'s (which costs ~15 ms a process)."""
    found = getattr(sys.modules.get(dist), "__version__", None)
    if isinstance(found, str):
        return found
    versions = _dist_info_versions().get(dist.lower().replace("-", "_"), [])
    if len(versions) == 1:
        return versions[0]
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _dist_info_versions() -> dict[str, list[str]]:
    """Normalized distribution name -> versions of its ``.dist-info`` folders on ``sys.path`` (read once)."""
    found: dict[str, list[str]] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem = name[: -len(".dist-info")]
            if name.endswith(".dist-info") and stem.count("-") == 1:
                dist, version = stem.split("-")
                found.setdefault(dist.lower().replace(".", "_"), []).append(version)
    return found


def cpu_name() -> str:
    """The CPU model (/proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU, GPU (or null), core count and library versions. Imports torch only if already imported."""
    gpu = None
    cuda = None
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = torch.version.cuda
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _version("torch"),
        "cuda": cuda,
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "pandas": _version("pandas"),
    }


def git_sha() -> str | None:
    """The commit of the mxperf checkout that is running (null when not a git checkout): from the repository's
    files when they say it plainly (~0.1 ms), else from ``git rev-parse HEAD`` (a process: 5-10 ms)."""
    here = Path(__file__).resolve().parent
    sha = _sha_from_files(here)
    if sha is not None:
        return sha
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _sha_from_files(start: Path) -> str | None:
    """HEAD's commit from the ``.git`` folder above ``start`` (a plain checkout: no worktree, no
    alternate ref storage), or None when that is not simple -- then ``git`` is asked."""
    for folder in (start, *start.parents):
        git = folder / ".git"
        if git.exists():
            break
    else:
        return None
    try:
        if not git.is_dir():
            return None  # a worktree or submodule (``gitdir:`` file): let git resolve it
        head = (git / "HEAD").read_text().strip()
        if _SHA.fullmatch(head):
            return head  # detached
        if not head.startswith("ref: "):
            return None
        ref = head[5:]
        loose = git / ref
        if loose.is_file():
            sha = loose.read_text().strip()
            return sha if _SHA.fullmatch(sha) else None
        packed = git / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                sha, _, name = line.partition(" ")
                if name == ref and _SHA.fullmatch(sha):
                    return sha
    except (OSError, UnicodeDecodeError):
        return None
    return None


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an mxperf output folder; a file, a missing folder or a foreign folder is one clear
    :class:`InputError`."""
    out = Path(out_dir)
    path = out / store.MANIFEST
    if out.is_file():
        raise InputError(
            f"{out_dir}: a file, not an mxperf output folder; pass the folder mxperf run / sweep / ingest / "
            "fit wrote (-o)"
        )
    if not out.exists():
        raise InputError(f"{out_dir}: no such folder")
    if not path.exists():
        raise InputError(
            f"{out_dir}: not an mxperf output directory (no {store.MANIFEST}); pass a folder written by "
            "mxperf run / sweep / ingest / fit"
        )
    data = store.read_json(path)
    for key in ("kind", "status"):
        if key not in data:
            raise InputError(f"{path}: manifest has no '{key}'")
    return data


def status_of(exc_type: type[BaseException] | None) -> str:
    """How a block ended: ``complete``, ``interrupted`` (Ctrl-C, SIGTERM) or ``failed``."""
    if exc_type is None:
        return "complete"
    return "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"


class OutputDir:
    """Context manager owning one output directory and its manifest.

    The output is built in a sibling temp folder (``od.path`` inside the block) and put in place when the
    block ends (``od.path`` is then the folder asked for). An old output there is replaced only when the
    block succeeds; a failed or interrupted attempt goes to the folder when it was free, else beside it
    (``<name>.failed-<time>``, when it holds anything but its manifest). Where the output may go (``force``,
    ``inputs``) is checked when the object is made, before any work: :func:`tracing.outputs.placement.check_target`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        kind: str,
        command: Sequence[str] | str | None = None,
        config: Mapping[str, Any] | None = None,
        compute_dtype: str | None = None,
        force: bool = False,
        inputs: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.target = Path(path)
        self.path = self.target
        self.kind = kind
        self.force = force
        self.inputs = tuple(inputs)
        self.kept_at: Path | None = None  # where a failed / interrupted attempt went (None: discarded)
        placement.check_target(self.target, kind=kind, force=force, inputs=self.inputs)
        self._tmp: Path | None = None
        if command is None:
            command = ["mxperf", *sys.argv[1:]]
        self._data: dict[str, Any] = {
            "kind": kind,
            "status": "running",
            "created": now_iso(),
            "mxperf_version": __version__,
            "git_sha": git_sha(),
            "command": command if isinstance(command, str) else list(command),
            "config": dict(config or {}),
            "machine": machine_info(),
            "compute_dtype": compute_dtype,
        }

    def update(self, **fields: Any) -> None:
        """Add fields to the manifest (written at the end, or now with :meth:`flush`)."""
        self._data.update(fields)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self._data)

    def flush(self) -> None:
        store.write_json(self._data, self.path / store.MANIFEST)

    def __enter__(self) -> OutputDir:
        placement.check_target(self.target, kind=self.kind, force=self.force, inputs=self.inputs)
        try:
            self._tmp = placement.make_temp_sibling(self._where())
        except OSError as exc:
            raise OutputWriteError(
                f"{self.target}: cannot create the output folder ({exc.strerror or exc})"
            ) from None
        building(self._tmp, self.target)
        self.path = self._tmp
        try:
            self.flush()
        except OutputWriteError:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._tmp is not None, "OutputDir.__exit__ without __enter__"
        status = status_of(exc_type)
        self._data["status"] = status
        if status == "failed":
            self._data["error"] = f"{exc_type.__name__}: {exc}" if exc_type else None
        self._data["finished"] = now_iso()
        self._data["files"] = placement.file_listing(self._tmp)
        try:
            self.flush()
        except OutputWriteError as flush_error:
            self._abandon(exc if isinstance(exc, OSError) else flush_error)
        where = self._where()
        if status == "complete":
            try:  # again: the folder may have changed while this ran (another writer, a file put there)
                placement.check_target(self.target, kind=self.kind, force=self.force, inputs=self.inputs)
            except OutputExistsError as exc:
                self.kept_at = placement.keep_attempt(self._tmp, where, "new")
                self.path = self.target
                raise OutputExistsError(f"{exc}; this new output was kept as {self.kept_at}") from None
            placement.swap_in(self._tmp, where)
        else:
            self.kept_at = placement.keep_attempt(self._tmp, where, status)
            if self.kept_at is not None and self.kept_at != where:
                print(
                    f"mxperf: {self.target} is unchanged; this {status} attempt is in {self.kept_at}",
                    file=sys.stderr,
                )
        self.path = self.target

    def _where(self) -> Path:
        """The folder to put in place: through a symlink named by -o, the folder it points to."""
        return self.target.resolve() if self.target.is_symlink() else Path(os.path.abspath(self.target))

    def _abandon(self, error: BaseException) -> None:
        """The attempt cannot even record how it ended (a full or read-only disk): drop it when an old output
        is there (which stays, and the space comes back), else leave it where it is, and say which."""
        assert self._tmp is not None
        message = shown(error)
        if self.target.is_dir() and any(self.target.iterdir()):
            shutil.rmtree(self._tmp, ignore_errors=True)
            fate = f"{self.target} is unchanged"
        else:
            forget(self._tmp)
            fate = f"what was written is in {self._tmp}"
        self.path = self.target
        raise OutputWriteError(f"{message}; {fate}") from None
