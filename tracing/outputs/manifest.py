"""manifest.json: what made an output directory, on what machine, and how it ended.

Lifecycle (SPEC.md): written first with ``status: running``; rewritten atomically at the end with
``complete``, ``failed`` (an exception, its message recorded) or ``interrupted`` (Ctrl-C). A reader that
finds ``running`` knows the directory is half-written (or its writer died) and must not present it as
complete. An existing output directory is never overwritten unless the caller passes ``force``.

    with OutputDir(out, kind="run", command=argv, config=cfg, compute_dtype="bfloat16") as od:
        store.write_table(df, od.path / store.METRICS)
        od.update(steps=20)          # extra keys end up in the final manifest
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tracing.outputs import store
from tracing.outputs.errors import InputError, OutputExistsError
from tracing.outputs.version import __version__

KINDS = ("run", "sweep", "ingest", "fit")
STATUSES = ("running", "complete", "failed", "interrupted")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
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
        "cpu": _cpu_name(),
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
    """The commit of the mxperf checkout that is running (null when not a git checkout)."""
    here = Path(__file__).resolve().parent
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(out_dir) / store.MANIFEST
    if Path(out_dir).is_dir() and not path.exists():
        raise InputError(
            f"{out_dir}: not an mxperf output directory (no {store.MANIFEST}); pass a folder written by "
            "mxperf run / sweep / ingest / fit"
        )
    data = store.read_json(path)
    for key in ("kind", "status"):
        if key not in data:
            raise InputError(f"{path}: manifest has no '{key}'")
    return data


class OutputDir:
    """Context manager owning one output directory and its manifest."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        kind: str,
        command: Sequence[str] | str | None = None,
        config: Mapping[str, Any] | None = None,
        compute_dtype: str | None = None,
        force: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.path = Path(path)
        self.kind = kind
        self.force = force
        self._data: dict[str, Any] = {
            "kind": kind,
            "status": "running",
            "created": now_iso(),
            "mxperf_version": __version__,
            "git_sha": git_sha(),
            "command": list(command) if command is not None and not isinstance(command, str) else command,
            "config": dict(config or {}),
            "machine": machine_info(),
            "compute_dtype": compute_dtype,
        }
        if self._data["command"] is None:
            self._data["command"] = ["mxperf", *sys.argv[1:]]

    def _claim(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise OutputExistsError(f"{self.path}: exists and is not a directory")
        if self.path.is_dir() and any(self.path.iterdir()):
            if not self.force:
                raise OutputExistsError(
                    f"{self.path}: output directory is not empty; choose another -o or pass --force"
                )
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

    def update(self, **fields: Any) -> None:
        """Add fields to the manifest (written at the end, or now with :meth:`flush`)."""
        self._data.update(fields)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self._data)

    def flush(self) -> None:
        store.write_json(self._data, self.path / store.MANIFEST)

    def __enter__(self) -> OutputDir:
        self._claim()
        self.flush()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self._data["status"] = "complete"
        elif issubclass(exc_type, KeyboardInterrupt):
            self._data["status"] = "interrupted"
        else:
            self._data["status"] = "failed"
            self._data["error"] = f"{exc_type.__name__}: {exc}"
        self._data["finished"] = now_iso()
        self.flush()
