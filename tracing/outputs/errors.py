"""The one error family for bad input. The CLI prints ``str(exc)`` on one line and exits 2.

Messages name the file (and byte offset, table or column where known) and say what to change.
"""

from __future__ import annotations

import os
from pathlib import Path

# temp folder -> the output it becomes (messages name the output, never the temp folder)
_BUILDING: dict[str, str] = {}


def building(tmp: Path, target: Path) -> None:
    """Record that ``tmp`` is being built to become ``target`` (see :func:`shown`)."""
    _BUILDING[str(tmp)] = str(target)


def forget(tmp: Path) -> None:
    """Stop naming ``tmp`` as its output (it is left as it is, under its own name)."""
    _BUILDING.pop(str(tmp), None)


def shown(text: str | os.PathLike[str]) -> str:
    """``text`` with every temp folder of an output being built replaced by that output's own path."""
    out = str(text)
    for tmp, target in _BUILDING.items():
        out = out.replace(tmp, target)
    return out


class MxperfError(Exception):
    """Bad input or an impossible request; never a bug in mxperf."""


class InputError(MxperfError, ValueError):
    """A configuration, table or argument that cannot be used as given."""


class TraceFormatError(InputError):
    """A trace file that cannot be read: truncated, corrupt, or of the wrong schema."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[str, str]]:
        # (path, problem), not the message: a pool or Ray worker's error crosses back to the command whole
        return (type(self), (self.path, self.problem))


class OutputExistsError(MxperfError):
    """The output directory already holds results; never overwritten without --force."""


class OutputWriteError(MxperfError, OSError):
    """An output that cannot be written (read-only or full disk, no permission); names the file mxperf meant
    to write, never an internal temp name."""
