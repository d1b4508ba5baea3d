"""The one error family for bad input. The CLI prints ``str(exc)`` on one line and exits 2.

Messages name the file (and byte offset, table or column where known) and say what to change.
"""

from __future__ import annotations


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


class OutputExistsError(MxperfError):
    """The output directory already holds results; never overwritten without --force."""


class OutputWriteError(MxperfError, OSError):
    """An output that cannot be written (read-only or full disk, no permission); names the file mxperf meant
    to write, never an internal temp name."""
