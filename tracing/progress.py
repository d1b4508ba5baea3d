"""Progress of a long ingest on stderr: bytes read of the file being streamed, and files (ranks) done.

One line, redrawn in place at most every ``interval_s`` (``\\r``), ended with a newline by :meth:`close`.
Only stderr is written, so ``--json`` (the last stdout line) is never touched; off by default when stderr is
not a terminal (a log file or a test then gets no progress lines).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self,
        total_files: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 0.5,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total_files = total_files
        self.files_done = 0
        self.interval_s = interval_s
        self._bytes: tuple[int, int] | None = None
        self._last = 0.0
        self._t0 = time.monotonic()
        self._drawn = False

    def bytes_read(self, done: int, total: int) -> None:
        """The file being streamed: ``done`` of ``total`` bytes read (on disk: compressed bytes for .gz)."""
        self._bytes = (done, total)
        self._draw()

    def file_done(self) -> None:
        self.files_done += 1
        self._bytes = None
        self._draw(force=self.files_done == self.total_files)

    def line(self) -> str:
        parts = [f"ingest: {self.files_done}/{self.total_files} files"]
        if self._bytes is not None:
            done, total = self._bytes
            pct = 100 * done / total if total else 100.0
            parts.append(f"reading {done / 2**20:,.0f}/{total / 2**20:,.0f} MiB ({pct:.0f} %)")
        parts.append(f"{time.monotonic() - self._t0:.0f} s")
        return ", ".join(parts)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.interval_s):
            return
        self._last = now
        self.stream.write("\r" + self.line().ljust(72))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
